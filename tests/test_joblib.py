"""joblib integration: the "blosc" compressor (``joblib.dump(..., compress="blosc")``) and the
"blpickle" store backend (``joblib.Memory(location, backend="blpickle")``).

Parts of joblib's own test suites run too: ``test_numpy_pickle`` with "blosc" registered (its
tests parametrized over every compressor then cover it) and ``test_memory`` /
``test_store_backends`` with blpickle's backend in place of joblib's file-system store.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import mmap
import os
import pathlib
import pickle
import pickletools
import re
import socket
import struct
import subprocess
import sys
import textwrap
import threading
import tracemalloc

import joblib
import numpy as np
import pytest
from bombs import peak_allocated, zeros_chunk
from conftest import JOBLIB_PREFIXES
from hypothesis import given, settings
from hypothesis import strategies as st
from joblib import Memory, Parallel, delayed
from joblib.compressor import _COMPRESSORS
from joblib.numpy_pickle_utils import _detect_compressor

import blpickle
from blpickle import format as fmt
from blpickle.engine import joblib_stream, policy
from blpickle.integrations import JOBLIB_MAGIC
from blpickle.integrations import joblib as bj
from blpickle.integrations.joblib import store as joblib_store


@pytest.fixture(autouse=True)
def _registered():
    """Every test here runs with blpickle registered with joblib."""
    bj.register()


def _detect(path) -> str:
    with open(path, "rb") as file:
        return _detect_compressor(file)


def _dumps(obj, compress="blosc") -> bytes:
    out = io.BytesIO()
    joblib.dump(obj, out, compress=compress)
    return out.getvalue()


def _loads(data: bytes):
    return joblib.load(io.BytesIO(data))


def _stream(data: bytes, try_bitshuffle: bool = True, **options) -> bytes:
    """A raw BloscFile stream holding ``data`` (written in pieces of 1000 bytes)."""
    out = io.BytesIO()
    options = blpickle.Options(**options)
    with bj.BloscFile(out, "wb", options=options, try_bitshuffle=try_bitshuffle) as file:
        for start in range(0, len(data), 1000):
            file.write(data[start : start + 1000])
    return out.getvalue()


def _frames(stream: bytes) -> list[tuple[int, bytes]]:
    """Walk a stream (docs/joblib.md): return ``(nbytes, blosc2 chunk)`` of every frame."""
    pos = joblib_stream.HEADER.size + 8
    frames = []
    while True:
        nbytes, csize = joblib_stream.CHUNK_SIZES.unpack_from(stream, pos)
        if nbytes == 0:
            return frames
        frames.append((nbytes, stream[pos + 16 : pos + 16 + csize]))
        pos += 16 + csize + 8


def _signal(dtype, n=1 << 20, seed=0) -> np.ndarray:
    """A smooth signal with noise, the typical content of a numeric array."""
    rng = np.random.default_rng(seed)
    x = np.sin(np.linspace(0, 60, n)) + rng.normal(0, 0.01, n)
    if np.dtype(dtype).kind == "i":
        return (x * 3000).astype(dtype)
    return x.astype(dtype)


# --------------------------------------------------------------------------------------------
# Registration


def test_register_registers_the_compressor_and_the_store_backend(tmp_path):
    bj.register()  # idempotent: a second call changes nothing
    assert _dumps([1, 2]).startswith(bj.MAGIC)
    memory = Memory(tmp_path, backend="blpickle", verbose=0)
    assert isinstance(memory.store_backend, bj.BlpickleStoreBackend)
    assert bj.MAGIC == JOBLIB_MAGIC


def _in_a_fresh_process(code: str) -> list[str]:
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout.split()


@pytest.mark.parametrize("joblib_first", [True, False])
def test_joblib_loads_a_blosc_file_in_a_fresh_process_after_register(tmp_path, joblib_first):
    path = tmp_path / "a.blosc"
    joblib.dump({"x": np.arange(100_000)}, path, compress="blosc")
    imports = ["import joblib", "import blpickle.integrations.joblib"]
    code = "\n".join(imports if joblib_first else imports[::-1])
    code += f"""
try:
    joblib.load({os.fspath(path)!r})
except Exception:  # joblib reads it as a pickle: an unknown opcode
    print("not-registered")
blpickle.integrations.joblib.register()
print(int(joblib.load({os.fspath(path)!r})["x"].sum()))
"""
    assert _in_a_fresh_process(code) == ["not-registered", str(np.arange(100_000).sum())]


_REGISTER = "import blpickle.integrations.joblib; blpickle.integrations.joblib.register()"


@pytest.mark.parametrize(
    "order",
    [
        ["import joblib", "import blpickle", _REGISTER],
        ["import blpickle", "import joblib", _REGISTER],
        ["import blpickle", _REGISTER, "import joblib"],
    ],
    ids=["joblib-blpickle-register", "blpickle-joblib-register", "blpickle-register-joblib"],
)
def test_joblib_dumps_with_blosc_in_a_fresh_process_whatever_the_import_order(tmp_path, order):
    path = tmp_path / "a.blosc"
    code = "\n".join(order)
    code += f"""
import numpy as np
joblib.dump({{"x": np.arange(100_000)}}, {os.fspath(path)!r}, compress="blosc")
print(int(joblib.load({os.fspath(path)!r})["x"].sum()))
"""
    assert _in_a_fresh_process(code) == [str(np.arange(100_000).sum())]
    assert path.read_bytes().startswith(bj.MAGIC)
    code = f"import blpickle, joblib\n{_REGISTER}\nprint(int(joblib.load({os.fspath(path)!r})['x'].sum()))"
    assert _in_a_fresh_process(code) == [str(np.arange(100_000).sum())]


def test_prefix_is_unique_and_not_a_pickle_opcode():
    prefix = _COMPRESSORS["blosc"].prefix
    assert prefix == bj.PREFIX == bj.MAGIC[:1]
    others = [*JOBLIB_PREFIXES, fmt.MAGIC] + [c.prefix for n, c in _COMPRESSORS.items() if n != "blosc"]
    for other in others:
        assert not other.startswith(prefix), other
        assert not prefix.startswith(other), other
    assert not bj.MAGIC.startswith(fmt.MAGIC[:1])  # blpickle's own records are told apart at byte 0
    assert bj.MAGIC[0] not in {op.code.encode("latin-1")[0] for op in pickletools.opcodes}


def test_extension_is_unique_and_only_selects_its_own_files(tmp_path):
    extension = _COMPRESSORS["blosc"].extension
    assert extension == ".blosc"
    for name, compressor in _COMPRESSORS.items():
        if name != "blosc":
            assert not extension.endswith(compressor.extension)
            assert not compressor.extension.endswith(extension)
    joblib.dump([1, 2], tmp_path / "a.blosc")
    assert _detect(tmp_path / "a.blosc") == "blosc"
    for name in ("a.pkl", "a.joblib", "a"):  # an empty extension would hijack these
        joblib.dump([1, 2], tmp_path / name)
        assert _detect(tmp_path / name) == "not-compressed"
    joblib.dump([1, 2], tmp_path / "a.z")
    assert _detect(tmp_path / "a.z") == "zlib"


def test_register_replaces_another_blosc_compressor():
    from joblib.compressor import ZlibCompressorWrapper

    joblib.register_compressor("blosc", ZlibCompressorWrapper(), force=True)
    assert _dumps([1, 2]).startswith(b"\x78")  # zlib's
    bj.register()
    assert _dumps([1, 2]).startswith(bj.MAGIC)


def test_the_integration_needs_joblib_and_blpickle_does_not():
    code = """
    import sys
    sys.modules["joblib"] = None  # as if joblib were not installed
    import blpickle, blpickle.integrations
    print(blpickle.loads(blpickle.dumps(3)), blpickle.integrations.JOBLIB_MAGIC.hex())
    import blpickle.engine.joblib_stream  # the stream itself needs no joblib
    try:
        import blpickle.integrations.joblib
    except ImportError as exc:
        print(exc.name)
    """
    assert _in_a_fresh_process(code) == ["3", JOBLIB_MAGIC.hex(), "joblib"]


def test_the_blosc_constant_registers_where_it_is_unpickled():
    assert bj.BLOSC == "blosc"
    assert isinstance(bj.BLOSC, str)
    code = textwrap.dedent(
        """
        import io, pickle, sys
        import joblib

        def dumps_with(name):
            try:
                joblib.dump(1, io.BytesIO(), compress=name)
            except ValueError:  # "Non valid compression method given"
                return False
            return True

        assert not dumps_with("blosc")
        name = pickle.loads(sys.stdin.buffer.read())
        print(name, dumps_with(name))
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", code], input=pickle.dumps(bj.BLOSC), capture_output=True, timeout=120
    )
    assert result.returncode == 0, result.stderr.decode()
    assert result.stdout.split() == [b"blosc", b"True"]


# --------------------------------------------------------------------------------------------
# joblib.dump(..., compress="blosc")

DTYPES = [
    "?", "i1", "u1", "<i2", ">i2", "u2", "<i4", ">i4", "u4", "<i8", ">i8", "u8",
    "<f2", "<f4", ">f4", "<f8", ">f8", "g", "<c8", "<c16", ">c16", "G",
    "M8[ns]", "m8[s]", "U7", "S5", "V3", [("a", "<i4"), ("b", "<f8"), ("c", "S3")],
]  # fmt: skip


def _array(dtype, shape=(37, 11), seed=0) -> np.ndarray:
    dtype = np.dtype(dtype)
    raw = np.random.default_rng(seed).integers(0, 256, int(np.prod(shape)) * dtype.itemsize, dtype=np.uint8)
    if dtype.kind == "b":
        raw = raw % 2
    return raw.view(dtype).reshape(shape)


def _native_bytes(array: np.ndarray) -> bytes:
    """The array's values as native-order C bytes (joblib.load returns native byte order)."""
    dtype = array.dtype
    native = dtype.newbyteorder("=") if dtype.byteorder not in "|=" else dtype
    if dtype.fields:
        native = np.dtype([(name, field[0].newbyteorder("=")) for name, field in dtype.fields.items()])
    data = np.ascontiguousarray(array.astype(native))
    if native.type in (np.longdouble, np.clongdouble) and np.finfo(np.longdouble).nmant == 63:
        # x87 80-bit values stored in 16 bytes: copies leave the 6 padding bytes of each as
        # they find them in fresh memory, so only the first 10 bytes of each are the value
        return data.view(np.uint8).reshape(-1, 16)[:, :10].tobytes()
    return data.tobytes()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("target", ["path", "file object"])
def test_every_dtype_and_layout_round_trips(tmp_path, dtype, target):
    base = _array(dtype)
    arrays = [
        base,
        base.T,
        base[::3, 1::2],
        base[:0],
        np.asfortranarray(base),
        base[5, 7].copy().reshape(()),
    ]
    obj = {"arrays": arrays, "text": "é", "n": 3}
    if target == "path":
        joblib.dump(obj, tmp_path / "x.pkl", compress="blosc")
        assert _detect(tmp_path / "x.pkl") == "blosc"
        loaded = joblib.load(tmp_path / "x.pkl")
    else:
        data = _dumps(obj)
        assert data.startswith(bj.MAGIC)
        loaded = _loads(data)
    assert loaded["text"] == "é"
    assert loaded["n"] == 3
    for expected, actual in zip(arrays, loaded["arrays"], strict=True):
        assert actual.shape == expected.shape
        assert actual.dtype == expected.dtype or actual.dtype == expected.dtype.newbyteorder("=")
        assert _native_bytes(actual) == _native_bytes(expected)


def test_object_arrays_and_plain_objects_round_trip():
    obj = [
        np.array([1, "abc", {"a": 1}], dtype=object),
        {"k": (1, 2.5, None)},
        b"\x00" * 100,
        range(5),
    ]
    loaded = _loads(_dumps(obj))
    assert list(loaded[0]) == list(obj[0])
    assert loaded[1:] == obj[1:]


@pytest.mark.parametrize("level", range(10))
def test_compress_levels(tmp_path, level):
    obj = {"a": _signal("<f8", 1 << 16), "b": list(range(100))}
    path = tmp_path / "x.pkl"
    joblib.dump(obj, path, compress=("blosc", level))
    # level 0 means no compression to joblib: it writes a plain pickle and never calls us
    assert _detect(path) == ("not-compressed" if level == 0 else "blosc")
    loaded = joblib.load(path)
    np.testing.assert_array_equal(loaded["a"], obj["a"])
    assert loaded["b"] == obj["b"]


def test_higher_levels_are_not_larger():
    obj = _signal("<i4", 1 << 18)
    assert len(_dumps(obj, ("blosc", 9))) <= len(_dumps(obj, ("blosc", 1))) < obj.nbytes


@pytest.mark.parametrize("compress", [True, 3, "blosc", ("blosc", 5), bj.BLOSC])
def test_ways_to_ask_for_blosc(tmp_path, compress):
    path = tmp_path / "x.blosc"  # a plain level uses the extension's compressor
    joblib.dump({"a": np.arange(1000)}, path, compress=compress)
    assert _detect(path) == "blosc"
    np.testing.assert_array_equal(joblib.load(path)["a"], np.arange(1000))


def test_invalid_level_is_refused_by_blosc_file():
    with pytest.raises(ValueError, match="clevel"):
        bj.BloscFile(io.BytesIO(), "wb", compresslevel=10)
    with pytest.raises(ValueError, match="Invalid mode"):
        bj.BloscFile(io.BytesIO(), "ab")
    with pytest.raises(TypeError, match="filename must be"):
        bj.BloscFile(3, "wb")
    with pytest.raises(blpickle.OptionsError, match="needs a codec"):
        bj.BloscFile(io.BytesIO(), "wb", options=blpickle.Options(codec=None))


def test_mmap_mode_is_ignored_for_compressed_files_with_joblibs_warning(tmp_path):
    path = tmp_path / "x.pkl"
    joblib.dump(np.arange(100), path, compress="blosc")
    with pytest.warns(UserWarning, match="not compatible with compressed file"):
        loaded = joblib.load(path, mmap_mode="r")
    np.testing.assert_array_equal(loaded, np.arange(100))


class _NonSeekableWriter(io.RawIOBase):
    """A pipe-like sink: not seekable, writes at most 1000 bytes per call."""

    def __init__(self) -> None:
        self.data = bytearray()

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        piece = bytes(memoryview(data).cast("B")[:1000])
        self.data += piece
        return len(piece)


class _NonSeekableReader(io.RawIOBase):
    """A pipe-like source: not seekable, short reads."""

    def __init__(self, data: bytes) -> None:
        self._data = memoryview(data)
        self._pos = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        size = min(len(buffer), 777, len(self._data) - self._pos)
        buffer[:size] = self._data[self._pos : self._pos + size]
        self._pos += size
        return size


def test_non_seekable_streams_with_short_reads_and_writes():
    obj = {"a": _signal("<f4", 100_000), "b": "x" * 5000}
    sink = _NonSeekableWriter()
    joblib.dump(obj, sink, compress="blosc")
    # joblib needs peek() (or seek) to detect the compressor: a BufferedReader over the pipe
    loaded = joblib.load(io.BufferedReader(_NonSeekableReader(bytes(sink.data))))
    np.testing.assert_array_equal(loaded["a"], obj["a"])
    assert loaded["b"] == obj["b"]
    assert bytes(sink.data) == _dumps(obj)  # the stream does not depend on the file


def test_dump_and_load_through_a_socket():  # joblib's test_pickle_in_socket, with "blosc"
    array = _signal("<f8", 300_000)
    with socket.socket() as listener:
        listener.bind(("localhost", 0))
        listener.listen(1)
        with socket.create_connection(listener.getsockname()) as client:
            server, _ = listener.accept()
            with server:
                sender = threading.Thread(target=lambda: _send(server, array))
                sender.start()
                with client.makefile("rb") as reader:
                    loaded = joblib.load(reader)
                sender.join(timeout=60)
    np.testing.assert_array_equal(loaded, array)


def _send(server: socket.socket, array: np.ndarray) -> None:
    with server.makefile("wb") as writer:
        joblib.dump(array, writer, compress="blosc")


def test_several_objects_in_one_file_object():
    out = io.BytesIO()
    for i in range(3):
        joblib.dump({"i": i, "a": np.full(1000, i)}, out, compress="blosc")
    out.seek(0)
    reader = io.BufferedReader(out)  # joblib peeks at the prefix (without peek() it seeks to 0)
    for i in range(3):
        loaded = joblib.load(reader)
        assert loaded["i"] == i
        assert (loaded["a"] == i).all()


# --------------------------------------------------------------------------------------------
# Typesize recovery and compression ratio


@pytest.mark.parametrize(("dtype", "expected"), [("<f8", 8), ("<f4", 4), ("<i2", 2), ("<c16", 16)])
def test_the_element_size_is_recovered_from_the_bytes(dtype, expected):
    if dtype == "<c16":  # a real and an imaginary part of different scales
        array = _signal("<f8", 1 << 18) + 1j * _signal("<f8", 1 << 18, seed=1) * 1e6
    else:
        array = _signal(dtype, 1 << 18)
    options = blpickle.Options()
    assert policy.pick_filters(array.view(np.uint8), options)[1] == expected
    assert policy.pick_filters(array.view(np.uint8), options.replace(shuffle="noshuffle"))[1] == 1
    stream = _stream(array.tobytes(), try_bitshuffle=False, chunk_size=1 << 16)
    frames = _frames(stream)
    assert len(frames) == array.nbytes // (1 << 16)
    typesizes = {chunk[3] for _, chunk in frames}  # byte 3 of a Blosc2 chunk: typesize
    # a complex128 is two float64: shuffling by 8 bytes is as right as by 16
    assert typesizes <= {8, 16} if dtype == "<c16" else typesizes == {expected}
    assert _filters(stream) == {1}  # byte shuffle


def _filters(stream: bytes) -> set[int]:
    """The first filter of every chunk (Blosc2 extended header byte 16: 1 shuffle, 2 bitshuffle)."""
    return {chunk[16] for _, chunk in _frames(stream)}


def test_bit_shuffle_is_used_where_it_wins_clearly():
    n, rng = 1 << 20, np.random.default_rng(0)
    signal = np.sin(np.arange(n) * (2 * np.pi / 1000)) + rng.normal(0, 0.1, n)
    int16 = (signal * 3000).astype("<i2").tobytes()  # bit shuffle: 6% smaller, faster
    float64 = signal.astype("<f8").tobytes()  # bit shuffle: larger and slower
    zstd = {"codec": "zstd", "chunk_size": 1 << 18}  # the figures above are zstd's
    assert _filters(_stream(int16, **zstd)) == {2}
    assert _filters(_stream(float64, **zstd)) == {1}
    byte_shuffled = _stream(int16, try_bitshuffle=False, **zstd)
    assert _filters(byte_shuffled) == {1}
    assert len(byte_shuffled) > len(_stream(int16, **zstd)) * 1.03
    bits = blpickle.Options(shuffle="bitshuffle", chunk_size=1 << 18)
    assert _filters(_stream(float64, **bits.to_dict())) == {2}  # as asked, never byte shuffle


@pytest.mark.parametrize("dtype", ["<f4", "<f8", "<i2"])
def test_ratio_is_close_to_blpickle_dump(dtype):
    array = _signal(dtype, 2_000_000)
    joblib_size = len(_dumps(array))
    blpickle_size = len(blpickle.dumps(array))
    assert joblib_size < 0.9 * array.nbytes  # it does compress
    assert blpickle_size / joblib_size >= 0.9


# --------------------------------------------------------------------------------------------
# BloscFile itself


@settings(max_examples=40, deadline=None)
@given(
    data=st.binary(max_size=30_000),
    cuts=st.lists(st.integers(0, 30_000), max_size=8),
    nthreads=st.sampled_from([1, 2]),
    read_size=st.sampled_from([1, 333, 4096, 1 << 20]),
)
def test_any_writes_read_back(data, cuts, nthreads, read_size):
    options = blpickle.Options(chunk_size=4096, nthreads=nthreads)
    out = io.BytesIO()
    with bj.BloscFile(out, "wb", options=options) as file:
        assert file.writable()
        assert not file.readable()
        assert not file.seekable()
        edges = sorted({0, len(data), *(c for c in cuts if c < len(data))})
        for start, stop in itertools.pairwise(edges):
            assert file.write(memoryview(data)[start:stop]) == stop - start
        assert file.tell() == len(data)
    assert not out.closed  # a file object is left open
    stream = out.getvalue()
    assert sum(n for n, _ in _frames(stream)) == len(data)
    with bj.BloscFile(io.BytesIO(stream), "rb", options=options) as file:
        assert file.readable()
        assert not file.writable()
        pieces = []
        while piece := file.read(read_size):
            pieces.append(piece)
        assert b"".join(pieces) == data
        assert file.tell() == len(data)
        assert file.read() == b""


def test_paths_are_opened_and_closed(tmp_path):
    path = tmp_path / "s.blosc"
    with bj.BloscFile(path, "wb") as file:
        file.write(b"abc" * 1000)
    with bj.BloscFile(os.fspath(path), "rb") as file:
        assert file.read() == b"abc" * 1000
    assert file.closed
    with pytest.raises(ValueError, match="closed file"):
        file.read()


def test_wrong_direction_is_refused():
    with bj.BloscFile(io.BytesIO(), "wb") as file, pytest.raises(io.UnsupportedOperation):
        file.read(1)
    with (
        bj.BloscFile(io.BytesIO(_stream(b"x")), "rb") as file,
        pytest.raises(io.UnsupportedOperation),
    ):
        file.write(b"x")


def test_write_errors_surface_and_nothing_hangs():
    class Full(io.RawIOBase):
        def __init__(self) -> None:
            self.size = 0

        def writable(self) -> bool:
            return True

        def write(self, data) -> int:
            self.size += len(memoryview(data).cast("B"))
            if self.size > 200_000:
                raise OSError(28, "No space left on device")
            return len(memoryview(data).cast("B"))

    outcome: list[BaseException | None] = []

    def dump() -> None:
        try:
            joblib.dump(np.random.default_rng(0).random(2_000_000), Full(), compress="blosc")
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    worker = threading.Thread(target=dump)
    worker.start()
    worker.join(timeout=60)
    assert not worker.is_alive(), "joblib.dump hung after a write error"
    assert isinstance(outcome[0], OSError)
    assert outcome[0].errno == 28


def test_compression_errors_surface(monkeypatch):
    def broken(chunk, options, alternatives):
        raise RuntimeError("boom")

    monkeypatch.setattr(joblib_stream, "plan_stream_chunk", broken)
    with pytest.raises(blpickle.DumpError, match="could not compress chunk"):
        _dumps(np.zeros(3_000_000))


def _traced_peak(fn) -> int:
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


class _CountingSink(io.RawIOBase):
    def __init__(self) -> None:
        self.size = 0

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        self.size += memoryview(data).nbytes
        return memoryview(data).nbytes


def test_memory_stays_within_a_few_chunks():
    chunk = 1 << 20
    data = np.random.default_rng(0).random(64 * chunk // 8)  # 64 chunks, incompressible-ish
    view = memoryview(data).cast("B")
    options = blpickle.Options(chunk_size=chunk, nthreads=2)
    sink = _CountingSink()

    def write() -> None:
        with bj.BloscFile(sink, "wb", options=options) as file:
            for start in range(0, len(view), 4 * chunk):
                file.write(view[start : start + 4 * chunk])

    assert _traced_peak(write) < 16 * chunk
    assert sink.size > data.nbytes // 2

    source = io.BytesIO(_stream(view[: 16 * chunk], chunk_size=chunk))
    target = bytearray(chunk)

    def read() -> None:
        with bj.BloscFile(source, "rb", options=options) as file:
            while file.readinto(target):
                pass

    assert _traced_peak(read) < 16 * chunk


def test_joblib_dump_and_load_memory_does_not_grow_with_the_array():
    peaks = {}
    for mb in (64, 256):
        array = np.random.default_rng(0).random(mb * (1 << 20) // 8)
        dump_peak = _traced_peak(lambda array=array: joblib.dump(array, _CountingSink(), compress="blosc"))
        data = _dumps(array)
        loaded = []
        load_peak = _traced_peak(lambda data=data, loaded=loaded: loaded.append(_loads(data)))
        assert np.array_equal(loaded.pop(), array)
        peaks[mb] = (dump_peak, load_peak - array.nbytes)
        del array, data
    (dump_64, load_64), (dump_256, load_256) = peaks[64], peaks[256]
    assert dump_256 < 80 << 20  # joblib's 16 MiB pieces plus a few 4 MiB chunks
    assert load_256 < 48 << 20
    assert dump_256 < dump_64 + (8 << 20)
    assert load_256 < load_64 + (8 << 20)


# --------------------------------------------------------------------------------------------
# Damaged input


def _small_object() -> dict:
    rng = np.random.default_rng(3)
    return {
        "a": np.cumsum(rng.integers(-3, 4, 2000)).astype("<i4"),
        "b": rng.random(300).astype("<f4"),
        "s": "text",
    }


def _small_stream() -> bytes:
    """A joblib pickle of ``_small_object()`` in a stream of 4 KiB chunks (several frames)."""
    out = io.BytesIO()
    with bj.BloscFile(out, "wb", options=blpickle.Options(chunk_size=4096, nthreads=2)) as file:
        joblib.dump(_small_object(), file)  # joblib writes plain pickle data into our file
    return out.getvalue()


def _same_small_object(loaded) -> bool:
    expected = _small_object()
    return (
        isinstance(loaded, dict)
        and loaded.keys() == expected.keys()
        and np.array_equal(loaded["a"], expected["a"])
        and np.array_equal(loaded["b"], expected["b"])
        and loaded["s"] == expected["s"]
    )


def test_the_damage_test_stream_is_what_it_should_be():
    stream = _small_stream()
    assert len(_frames(stream)) >= 3
    assert _same_small_object(_loads(stream))


def test_a_stream_written_by_version_1_0_still_loads():
    """tests/golden/joblib-v1.0.blosc: `_small_stream()` as the first release wrote it."""
    golden = (pathlib.Path(__file__).parent / "golden" / "joblib-v1.0.blosc").read_bytes()
    assert golden.startswith(bj.MAGIC + bytes([1, 0]))
    assert len(_frames(golden)) >= 3
    assert _same_small_object(_loads(golden))


def test_the_reader_printed_in_the_format_spec_reads_what_blosc_file_writes():
    text = (pathlib.Path(__file__).parent.parent / "docs" / "format.md").read_text()
    section = text[text.index('## The joblib "blosc" stream') :]
    code = section[section.index("```python\n") + len("```python\n") :]
    namespace: dict = {}
    exec(code[: code.index("```")], namespace)
    for stream in (_small_stream(), _stream(b""), _dumps(_signal("<f8", 1 << 20))):
        with bj.BloscFile(io.BytesIO(stream), "rb") as file:
            expected = file.read()
        assert b"".join(namespace["read_blosc_stream"](io.BytesIO(stream))) == expected


def test_every_truncation_raises_truncated_error():
    stream = _small_stream()
    for size in range(1, len(stream)):
        with pytest.raises(blpickle.TruncatedError):
            _loads(stream[:size])


def test_every_flipped_byte_raises_a_load_error():
    stream = _small_stream()
    for offset in range(len(stream)):
        for mask in (0x01, 0xFF):
            damaged = bytearray(stream)
            damaged[offset] ^= mask
            if offset == 0:  # joblib no longer sees a "blosc" stream and reads pickle data
                with pytest.raises((pickle.UnpicklingError, EOFError, KeyError)):  # pickle's own
                    _loads(bytes(damaged))
                with pytest.raises(blpickle.BadMagicError, match="not a blpickle joblib stream"):
                    bj.BloscFile(io.BytesIO(bytes(damaged)), "rb")
                continue
            try:
                loaded = _loads(bytes(damaged))
            except blpickle.LoadError as exc:  # a pickle.UnpicklingError with a message
                assert isinstance(exc, pickle.UnpicklingError)  # noqa: PT017
                assert str(exc)  # noqa: PT017
            else:
                what = "the right" if _same_small_object(loaded) else "wrong"
                pytest.fail(f"flipping byte {offset} with {mask:#x} loaded {what} data")


def test_specific_damage_gives_specific_errors():
    stream = bytearray(_small_stream())
    first = joblib_stream.HEADER.size + 8  # the first frame
    _nbytes, csize = joblib_stream.CHUNK_SIZES.unpack_from(stream, first)
    with pytest.raises(blpickle.ChecksumError, match="the stream header"):
        _loads(bytes(stream[:9]) + b"\x07" + bytes(stream[10:]))  # the minor version byte
    with pytest.raises(blpickle.UnsupportedVersionError):
        _loads(bytes(stream[:8]) + b"\x07" + bytes(stream[9:]))  # the major version byte
    cases = {
        "payload": (first + 16 + csize // 2, blpickle.ChecksumError, "chunk 0 of the stream"),
        "checksum": (first + 16 + csize, blpickle.ChecksumError, "chunk 0 of the stream"),
        "size": (first + 7, blpickle.CorruptError, "chunk 0 of the stream at offset 24 is sized"),
    }
    for offset, error, match in cases.values():
        damaged = bytearray(stream)
        damaged[offset] ^= 0x40
        with pytest.raises(error, match=match):
            _loads(bytes(damaged))
    header = joblib_stream.HEADER.pack(bj.MAGIC, 2, 0, 0, 4096)
    future = header + struct.pack("<Q", fmt.checksum(header)) + bytes(stream[24:])
    with pytest.raises(blpickle.UnsupportedVersionError):
        _loads(future)


def test_a_lying_chunk_header_never_reaches_blosc2():
    """A chunk whose Blosc2 header declares more bytes than the frame, with a valid checksum:
    the sizes are checked before decompress2 (which would overflow the destination)."""
    stream = bytearray(_stream(bytes(range(256)) * 64, chunk_size=4096))
    pos = joblib_stream.HEADER.size + 8
    nbytes, csize = joblib_stream.CHUNK_SIZES.unpack_from(stream, pos)
    chunk = bytearray(stream[pos + 16 : pos + 16 + csize])
    struct.pack_into("<I", chunk, 4, nbytes * 4)  # Blosc2 header: nbytes at offset 4
    header_checksum = fmt.checksum(bytes(stream[: joblib_stream.HEADER.size]))
    digest = fmt.checksum(bytes(chunk), fmt.chunk_seed(header_checksum, 0))
    stream[pos + 16 : pos + 16 + csize] = chunk
    struct.pack_into("<Q", stream, pos + 16 + csize, digest)
    with (
        bj.BloscFile(io.BytesIO(bytes(stream)), "rb") as file,
        pytest.raises(blpickle.CorruptError, match="holds"),
    ):
        file.read()


def _zeros_stream(nframes: int, chunk_size: int) -> bytes:
    """A stream of ``nframes`` frames of ``chunk_size`` zeros, each a 32-byte Blosc2 chunk,
    every checksum right (what an attacker writes in a few hundred bytes)."""
    head = joblib_stream.HEADER.pack(bj.MAGIC, 1, 0, 0, chunk_size)
    header_checksum = fmt.checksum(head)
    out = bytearray(head + fmt.U64.pack(header_checksum))
    for index in range(nframes):
        chunk = zeros_chunk(chunk_size)
        digest = fmt.checksum(chunk, fmt.chunk_seed(header_checksum, index))
        out += joblib_stream.CHUNK_SIZES.pack(chunk_size, len(chunk)) + chunk + fmt.U64.pack(digest)
    end = joblib_stream.CHUNK_SIZES.pack(0, 0) + joblib_stream.END.pack(nframes, nframes * chunk_size)
    return bytes(out + end + fmt.U64.pack(fmt.checksum(end, fmt.chunk_seed(header_checksum, nframes))))


def test_a_forged_stream_of_zeros_reads_ahead_within_a_bound_and_is_no_pickle():
    """8 frames of 64 MiB of zeros in 512 bytes: reading decompresses ahead at most
    READ_AHEAD bytes (or one chunk) and allocates no chunk-sized buffer for the 32 bytes of a
    stored chunk; joblib.load then raises a CorruptError naming the first byte (its unpickler
    would raise a bare KeyError)."""
    chunk_size = 64 << 20
    stream = _zeros_stream(8, chunk_size)
    assert len(stream) == 512
    errors = []

    def load():
        with pytest.raises(
            blpickle.CorruptError, match="does not hold a pickle: it decompresses to byte 0x00"
        ) as caught:
            _loads(stream)
        errors.append(caught.value)

    peak = peak_allocated(load)
    assert errors
    assert peak < max(joblib_stream.READ_AHEAD, chunk_size) + (8 << 20)


# --------------------------------------------------------------------------------------------
# joblib.Memory(location, backend="blpickle")

CALLS: list = []


def _make_arrays(n: int) -> dict:
    return {
        "x": np.arange(n, dtype="<f8") * 0.5,
        "y": np.ones((n, 3), dtype="<i2", order="F"),
        "n": n,
    }


def _counted(n: int) -> dict:
    CALLS.append(n)
    return _make_arrays(n)


def _check_arrays(result: dict, n: int) -> None:
    expected = _make_arrays(n)
    np.testing.assert_array_equal(result["x"], expected["x"])
    np.testing.assert_array_equal(result["y"], expected["y"])
    assert result["y"].flags.f_contiguous
    assert result["n"] == n


def _output_files(memory: Memory) -> list[str]:
    paths = [os.path.join(item.path, "output.pkl") for item in memory.store_backend.get_items()]
    return [path for path in paths if os.path.exists(path)]


def _stored_options(path: str) -> dict:
    with open(path, "rb") as file:
        _, _, size = fmt.decode_preamble(file.read(fmt.PREAMBLE.size))
        return fmt.Header.decode(file.read(size)).options


def test_memory_caches_with_blpickle(tmp_path):
    CALLS.clear()
    memory = Memory(tmp_path, backend="blpickle", verbose=0)
    cached = memory.cache(_counted)
    _check_arrays(cached(1000), 1000)
    _check_arrays(cached(1000), 1000)
    _check_arrays(cached(10), 10)
    assert CALLS == [1000, 10]
    files = _output_files(memory)
    assert len(files) == 2
    for path in files:
        with open(path, "rb") as file:
            assert file.read(len(fmt.MAGIC)) == fmt.MAGIC
        assert _stored_options(path)["codec"] is None  # compress=False: raw, mappable
    assert not [f for item in memory.store_backend.get_items() for f in os.listdir(item.path) if "tmp" in f]


@pytest.mark.parametrize("n", [10, 200_000])  # read whole (up to 1 MiB) or streamed from the file
def test_memory_hits_load_small_and_large_results(tmp_path, n):
    CALLS.clear()
    memory = Memory(tmp_path, backend="blpickle", verbose=0)
    cached = memory.cache(_counted)
    for _ in range(2):
        result = cached(n)
        _check_arrays(result, n)
        assert result["x"].flags.writeable
    assert len(CALLS) == 1  # computed once
    (path,) = _output_files(memory)
    assert (os.path.getsize(path) > 1 << 20) == (n == 200_000)


def test_memory_verbose_output_is_joblibs(tmp_path, capsys):
    outputs = []
    for backend in ("local", "blpickle"):
        memory = Memory(tmp_path / backend, backend=backend, verbose=11)
        cached = memory.cache(_make_arrays)
        cached(5)
        cached.call_and_shelve(5).get()
        text = capsys.readouterr().out.replace(os.fspath(tmp_path / backend), "<loc>")
        outputs.append(re.sub(r"\d+\.\d+s, \d+\.\d+min *", "<time>", text))
    assert "Persisting in <loc>" in outputs[1]
    assert "[Memory]<time>: Loading _make_arrays(n=5) from <loc>" in outputs[1]
    assert outputs[1] == outputs[0]


@pytest.mark.parametrize(
    ("compress", "codec", "clevel"),
    [
        (False, None, None),
        (0, None, None),
        (True, "auto", 1),
        (4, "auto", 4),
        ("blosc", "auto", 1),
        (("blosc", 6), "auto", 6),
        (bj.BLOSC, "auto", 1),
        ("zlib", "zlib", 3),
        (("gzip", 7), "zlib", 7),
        ("lz4", "lz4", 1),
        (("lz4", 3), "lz4", 3),
        (("xz", 2), "zstd", 2),
        ("bz2", "zstd", 5),
        (("zlib", 0), None, None),
    ],
)
def test_memory_compress_values_map_to_blpickle_options(tmp_path, compress, codec, clevel):
    memory = Memory(tmp_path, backend="blpickle", compress=compress, verbose=0)
    assert memory.store_backend.options.codec == codec
    if clevel is not None:
        assert memory.store_backend.options.clevel == clevel
    cached = memory.cache(_make_arrays)
    _check_arrays(cached(20_000), 20_000)  # buffers out of band: a full record, with its options
    _check_arrays(cached(20_000), 20_000)
    (path,) = _output_files(memory)
    assert _stored_options(path)["codec"] == codec


def test_memory_backend_options_override_compress(tmp_path):
    memory = Memory(
        tmp_path,
        backend="blpickle",
        compress=True,
        verbose=0,
        backend_options={"codec": "lz4", "clevel": 5},
    )
    assert (memory.store_backend.options.codec, memory.store_backend.options.clevel) == ("lz4", 5)
    memory = Memory(tmp_path, backend="blpickle", verbose=0, backend_options={"preset": "small"})
    assert memory.store_backend.options == blpickle.PRESETS["small"]
    with pytest.raises(blpickle.OptionsError):
        Memory(tmp_path, backend="blpickle", compress="nonsense")
    with pytest.raises(blpickle.OptionsError):
        Memory(tmp_path, backend="blpickle", backend_options={"clevel": 12})


@pytest.mark.parametrize("mmap_mode", ["r", "c", "r+", "w+"])
def test_memory_mmap_mode_maps_raw_results(tmp_path, mmap_mode):
    n = 20_000  # arrays of 160 and 120 KB: out of band (blpickle keeps tiny buffers in band)
    memory = Memory(tmp_path, backend="blpickle", mmap_mode=mmap_mode, verbose=0)
    cached = memory.cache(_make_arrays)
    for result in (cached(n), cached(n)):  # joblib maps the result at the first call too
        _check_arrays(result, n)
        for name in ("x", "y"):
            array = result[name]
            assert isinstance(array, np.memmap)
            assert array.mode == ("r+" if mmap_mode == "w+" else mmap_mode)
            assert array.filename == os.path.abspath(_output_files(memory)[0])
            assert array.offset % 64 == 0  # raw buffers are 64-byte aligned in the file
            assert array.flags.writeable == (mmap_mode != "r")
        assert isinstance(result["x"].base, mmap.mmap)
        assert result["x"].base is result["y"].base  # one map of the file per load
    if mmap_mode != "r":
        result["x"][1] = 42.0
    del result, array
    reloaded = cached(n)["x"][1]
    assert reloaded == (42.0 if mmap_mode in ("r+", "w+") else 0.5)


def test_results_written_without_mmap_mode_are_mapped_when_read_with_it(tmp_path):
    # joblib's contract (its test_memorized_result_forwards_mmap_mode): whoever wrote a
    # result, a store read with mmap_mode maps its arrays, however small
    Memory(tmp_path, backend="blpickle", verbose=0).cache(_make_arrays)(100)
    result = Memory(tmp_path, backend="blpickle", mmap_mode="r", verbose=0).cache(_make_arrays)(100)
    _check_arrays(result, 100)
    assert isinstance(result["x"], np.memmap) and isinstance(result["y"], np.memmap)


def test_a_mapped_result_maps_the_file_being_loaded_even_once_replaced(tmp_path):
    path = tmp_path / "output.pkl"
    blpickle.dump({"x": np.zeros(20_000)}, path, codec=None)
    with open(path, "rb") as file:
        unpickler = joblib_store._MemmapUnpickler(file, mmap_mode="r", nthreads=1)
        blpickle.dump({"x": np.ones(20_000)}, path, codec=None)  # a new file renamed over the name
        loaded = unpickler.load()
    assert isinstance(loaded["x"], np.memmap)
    assert not loaded["x"].any()  # the zeros of the file that was opened


def test_memory_mmap_mode_with_a_codec_warns(tmp_path):
    with pytest.warns(blpickle.BlpickleWarning, match="cannot be memory-mapped"):
        memory = Memory(
            tmp_path,
            backend="blpickle",
            mmap_mode="r",
            backend_options={"codec": "zstd"},
            verbose=0,
        )
    result = memory.cache(_make_arrays)(100)
    _check_arrays(result, 100)
    assert not isinstance(result["x"], np.memmap)


def test_call_and_shelve_clear_and_reduce_size(tmp_path):
    memory = Memory(tmp_path, backend="blpickle", verbose=0)
    cached = memory.cache(_make_arrays)
    shelved = cached.call_and_shelve(300)
    _check_arrays(shelved.get(), 300)
    shelved.clear()
    with pytest.raises(KeyError):
        shelved.get()
    for n in (10, 20, 30):
        cached(n)
    assert len(memory.store_backend.get_items()) == 3
    memory.reduce_size(items_limit=1)
    assert len(memory.store_backend.get_items()) == 1
    memory.reduce_size(bytes_limit=1)
    assert memory.store_backend.get_items() == []
    cached(10)
    memory.clear(warn=False)
    assert memory.store_backend.get_items() == []


def test_a_damaged_result_is_recomputed_or_reported(tmp_path, monkeypatch):
    CALLS.clear()
    memory = Memory(tmp_path, backend="blpickle", verbose=0)
    cached = memory.cache(_counted)
    cached(1000)
    (path,) = _output_files(memory)
    with open(path, "r+b") as file:
        file.seek(os.path.getsize(path) // 2)
        byte = file.read(1)[0]
        file.seek(-1, os.SEEK_CUR)
        file.write(bytes([byte ^ 0xFF]))
    with pytest.raises(KeyError, match="corrupted") as info:
        cached.call_and_shelve(1000).get()
    assert isinstance(info.value.__cause__, bj.CorruptItemError)
    assert isinstance(info.value.__cause__.__cause__, blpickle.ChecksumError)
    warned = []
    monkeypatch.setattr(cached, "warn", warned.append)
    _check_arrays(cached(1000), 1000)  # recomputed
    assert CALLS == [1000, 1000]
    assert "Exception while loading results" in warned[0]
    assert "ChecksumError" in warned[0]
    _check_arrays(cached(1000), 1000)
    assert CALLS == [1000, 1000]


def test_results_of_joblibs_own_store_are_read(tmp_path):
    CALLS.clear()
    cached = Memory(tmp_path, verbose=0).cache(_counted)
    _check_arrays(cached(70), 70)
    cached = Memory(tmp_path, backend="blpickle", verbose=0).cache(_counted)
    _check_arrays(cached(70), 70)
    assert CALLS == [70]


def _closure(n: int):
    CALLS.append(n)
    return lambda: n


def test_backend_options_pickler_cloudpickle_caches_closures(tmp_path):
    CALLS.clear()
    memory = Memory(tmp_path, backend="blpickle", verbose=0, backend_options={"pickler": "cloudpickle"})
    cached = memory.cache(_closure)
    assert cached(3)() == 3
    assert cached(3)() == 3
    assert CALLS == [3]
    assert len(_output_files(memory)) == 1


def _unpicklable(n: int):
    CALLS.append(n)
    return lambda: n


def test_an_unpicklable_result_is_not_cached(tmp_path):
    CALLS.clear()
    memory = Memory(tmp_path, backend="blpickle", verbose=0)
    cached = memory.cache(_unpicklable)
    with pytest.warns(FutureWarning, match="Unable to cache to disk"):
        assert cached(1)() == 1
    assert _output_files(memory) == []
    with pytest.warns(FutureWarning):
        cached(1)
    assert CALLS == [1, 1]


# -- several processes ------------------------------------------------------------------------


def _marked(n: int, marks: str) -> dict:
    """A cached computation that leaves one file per call in ``marks``."""
    with open(os.path.join(marks, f"{n}-{os.getpid()}-{threading.get_ident()}-{os.urandom(4).hex()}"), "w"):
        pass
    return _make_arrays(200_000 + n)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["backend", "compressor"])
def test_a_cache_shared_by_parallel_workers(tmp_path, kind):
    marks = tmp_path / "marks"
    marks.mkdir()
    if kind == "backend":
        memory = Memory(tmp_path / "cache", backend="blpickle", verbose=0)
    else:  # joblib's own store, results compressed by the "blosc" compressor in the workers
        memory = Memory(tmp_path / "cache", compress=bj.BLOSC, verbose=0)
    cached = memory.cache(_marked, ignore=["marks"])
    # joblib writes func_code.py only from a process that has not yet checked the function's code
    # (in any store): loky workers kept from an earlier test skip it, and this process would then
    # take its first call for a miss (no func_code.py: it writes one and recomputes). Checking
    # here first writes it.
    assert not cached.check_call_in_cache(0, os.fspath(marks))
    for _ in range(2):
        results = Parallel(n_jobs=2)(delayed(cached)(n, os.fspath(marks)) for n in range(4))
        for n, result in enumerate(results):
            _check_arrays(result, 200_000 + n)
    calls = sorted(int(name.split("-")[0]) for name in os.listdir(marks))
    assert calls == [0, 1, 2, 3]  # the second round only read the cache
    files = _output_files(memory)
    assert len(files) == 4
    for path in files:
        with open(path, "rb") as file:
            head = file.read(8)
        assert head.startswith(fmt.MAGIC if kind == "backend" else bj.MAGIC)
    for n in range(4):  # this process reads what the workers wrote
        _check_arrays(cached(n, os.fspath(marks)), 200_000 + n)
    assert len(os.listdir(marks)) == 4


def _write_and_read(location: str, rounds: int) -> int:
    backend = bj.BlpickleStoreBackend()
    backend.configure(location, verbose=0, backend_options={"compress": True})
    call_id = ["func", "args"]
    good = 0
    for i in range(rounds):
        if i % 2 == 0:
            backend.dump_item(call_id, _make_arrays(300_000), verbose=0)
        with contextlib.suppress(KeyError):  # not written yet by anyone
            _check_arrays(backend.load_item(call_id, verbose=0), 300_000)
            good += 1
    return good


@pytest.mark.slow
def test_concurrent_writers_of_one_result_never_leave_a_damaged_file(tmp_path):
    location = os.fspath(tmp_path / "cache")
    counts = Parallel(n_jobs=2)(delayed(_write_and_read)(location, 12) for _ in range(4))
    assert counts == [12] * 4  # every load succeeded, while other processes were writing
    directory = os.path.join(location, "func", "args")
    assert os.listdir(directory) == ["output.pkl"]  # no temporary files left behind
    backend = bj.BlpickleStoreBackend()
    backend.configure(location, verbose=0)
    _check_arrays(backend.load_item(["func", "args"], verbose=0), 300_000)


# -- joblib's own test suites -----------------------------------------------------------------

_PLUGIN = """
import joblib
import blpickle.integrations.joblib as bj

bj.register()
CALLS = {"dump_item": 0, "load_item": 0}
if SWAP_STORE:
    joblib.register_store_backend("local", bj.BlpickleStoreBackend)
    for _name in CALLS:
        def _counting(self, *args, _method=getattr(bj.BlpickleStoreBackend, _name), _key=_name,
                      **kwargs):
            CALLS[_key] += 1
            return _method(self, *args, **kwargs)
        setattr(bj.BlpickleStoreBackend, _name, _counting)


def pytest_terminal_summary(terminalreporter):
    terminalreporter.write_line(f"BLPICKLE-CALLS {CALLS['dump_item']} {CALLS['load_item']}")
"""


def _run_joblib_tests(tmp_path, modules: list[str], swap_store: bool, *args: str) -> str:
    (tmp_path / "blpickle_joblib_plugin.py").write_text(f"SWAP_STORE = {swap_store}\n{_PLUGIN}")
    (tmp_path / "pytest.ini").write_text("[pytest]\n")  # not blpickle's settings
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.fspath(tmp_path), *sys.path])}
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-p",
        "blpickle_joblib_plugin",
        "-p",
        "no:cacheprovider",
    ]
    command += [
        "-q",
        "-W",
        "ignore",
        "--rootdir",
        os.fspath(tmp_path),
        "-c",
        os.fspath(tmp_path / "pytest.ini"),
    ]
    command += ["--pyargs", *modules, *args]
    result = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=900)
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-3000:]
    return result.stdout


@pytest.mark.slow
def test_joblibs_numpy_pickle_tests_pass_with_blosc_registered(tmp_path):
    output = _run_joblib_tests(tmp_path, ["joblib.test.test_numpy_pickle"], False, "-rA")
    ran = [line for line in output.splitlines() if line.startswith("PASSED") and "blosc" in line]
    assert len(ran) == 3, output[-3000:]  # test_joblib_compression_formats[blosc-1/3/6]


@pytest.mark.slow
def test_joblibs_memory_tests_pass_with_the_blpickle_store(tmp_path):
    modules = ["joblib.test.test_memory", "joblib.test.test_store_backends"]
    output = _run_joblib_tests(tmp_path, modules, True)
    counts = next(line for line in output.splitlines() if line.startswith("BLPICKLE-CALLS")).split()
    assert int(counts[1]) > 50, counts  # the tests went through our store
    assert int(counts[2]) > 20, counts
