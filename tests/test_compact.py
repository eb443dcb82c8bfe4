"""Compact records (format 1.1): written for small pickles with nothing out of band, read by
every reader: loads/load (plain, safe, allowed, mmap_mode, streams), Unpickler, inspect and
the command line."""

from __future__ import annotations

import copyreg
import io
import os
import pickle
import subprocess
import sys
import threading

import numpy as np
import pytest

import blpickle
from blpickle import format as fmt
from blpickle.engine import policy
from blpickle.engine.policy import COMPACT_GRAPH_LIMIT, COMPACT_LIMIT
from blpickle.engine.reader import RecordReader
from blpickle.io.sources import MemorySource

SMALL = {"a": 1, "text": "γ", "array": np.arange(10, dtype=np.int16), "nested": [1.5, None, (2, 3)]}  # noqa: RUF001


def _same(expected: dict, actual: dict) -> None:
    assert actual.keys() == expected.keys()
    for key, value in expected.items():
        if isinstance(value, np.ndarray):
            assert actual[key].dtype == value.dtype and np.array_equal(actual[key], value)
        else:
            assert actual[key] == value


def test_a_small_object_is_a_compact_record_24_bytes_over_its_pickle():
    for obj in ({"a": 1}, list(range(1000)), [{"id": i} for i in range(100)], None):
        data = blpickle.dumps(obj)
        plain = pickle.dumps(obj, protocol=5)
        assert len(data) == len(plain) + fmt.COMPACT_OVERHEAD == len(plain) + 24
        magic, major, minor, flags, size = fmt.PREAMBLE.unpack_from(data)
        assert (magic, major, minor, flags, size) == (fmt.MAGIC, 1, fmt.VERSION_MINOR, fmt.FLAG_COMPACT, len(plain))
        assert data[16:-8] == plain
        assert fmt.U64.unpack(data[-8:])[0] == fmt.checksum(data[:-8])
        assert blpickle.loads(data) == obj


def test_compact_records_load_through_every_loader(tmp_path):
    data = blpickle.dumps(SMALL)
    _same(SMALL, blpickle.loads(data))
    _same(SMALL, blpickle.loads(bytearray(data)))
    _same(SMALL, blpickle.loads(memoryview(data)))
    _same(SMALL, blpickle.loads(data, safe=True))
    _same(SMALL, blpickle.loads(data, allowed=["builtins.dict"]))
    _same(SMALL, blpickle.load(io.BytesIO(data)))
    _same(SMALL, blpickle.Unpickler(io.BytesIO(data)).load())
    path = tmp_path / "small.blp"
    blpickle.dump(SMALL, path)
    assert path.read_bytes() == data
    for mode in (None, "r", "c"):
        _same(SMALL, blpickle.load(path, mmap_mode=mode))
    _same(SMALL, blpickle.load(path, safe=True))


def test_compact_and_full_records_follow_each_other_in_one_file(tmp_path):
    path = tmp_path / "several.blp"
    big = np.arange(100_000)
    with open(path, "wb") as file:
        for obj in ({"first": 1}, big, "last"):
            blpickle.dump(obj, file)
    for mode in (None, "r"):
        with open(path, "rb") as file:
            assert blpickle.load(file, mmap_mode=mode) == {"first": 1}
            assert np.array_equal(blpickle.load(file, mmap_mode=mode), big)
            assert blpickle.load(file, mmap_mode=mode) == "last"
            assert file.read() == b""


def test_a_compact_record_loads_from_a_stream_that_cannot_seek():
    read, write = os.pipe()
    data = blpickle.dumps({"piped": True}) + blpickle.dumps([1, 2])
    os.write(write, data)
    os.close(write)
    with os.fdopen(read, "rb", buffering=0) as pipe:
        assert blpickle.load(pipe) == {"piped": True}
        assert blpickle.load(pipe) == [1, 2]


def test_inspect_and_the_command_line_describe_a_compact_record(tmp_path):
    data = blpickle.dumps({"a": 1, "d": np.float64(2.0)})
    for verify in (True, False):
        info = blpickle.inspect(data, verify=verify)
        assert (info.version, info.signed, info.options, info.buffers) == ("1.4", False, {}, ())
        assert info.protocol == 5 and info.pickle_nbytes == info.pickle_stored == len(data) - 24
        assert info.size == len(data)
        assert "numpy.dtype" in info.globals
    path = tmp_path / "small.blp"
    path.write_bytes(data)
    for command in ("info", "verify"):
        result = subprocess.run([sys.executable, "-m", "blpickle", command, str(path)], capture_output=True, text=True)
        assert result.returncode == 0, result.stderr
    assert (
        "format version 1.4"
        in subprocess.run([sys.executable, "-m", "blpickle", "info", str(path)], capture_output=True, text=True).stdout
    )


def test_what_does_not_fit_a_compact_record_is_a_full_one():
    full = {
        "big pickle": list(range(COMPACT_LIMIT // 2)),
        "out-of-band buffer": np.arange(100_000),
        "spliced payload": b"x" * (2 << 20),
    }
    for name, obj in full.items():
        assert RecordReader(MemorySource(blpickle.dumps(obj)), nthreads=1).compact is False, name
    assert RecordReader(MemorySource(blpickle.dumps([1], key=b"k")), nthreads=1).compact is False
    assert RecordReader(MemorySource(blpickle.dumps(np.arange(3), codec=None)), nthreads=1).compact is False
    kept = []
    data = blpickle.dumps(np.arange(100_000), buffer_callback=lambda b: kept.append(b) and False)
    assert RecordReader(MemorySource(data), nthreads=1).compact is False
    for protocol in (0, 2, 4):
        data = blpickle.dumps({"p": protocol}, protocol=protocol)
        assert RecordReader(MemorySource(data), nthreads=1).compact
        assert blpickle.loads(data) == {"p": protocol}
        assert blpickle.inspect(data).protocol == (0 if protocol < 2 else protocol)


def _noise(nbytes: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(nbytes // 8)


def _streams(data: bytes) -> tuple:
    return RecordReader(MemorySource(data), nthreads=1).header.streams


def test_an_array_that_would_be_stored_raw_is_pickled_in_a_compact_record(tmp_path):
    """Arrays over 64 KiB that compressing would not shrink go into the pickle stream, as
    pickle stores them, while the record stays compact: read-only ones stay read-only,
    Fortran-ordered ones keep their order."""
    cases = {
        "80 KB": _noise(80_000),
        "400 KB": _noise(400_000),
        "read-only": _noise(200_000),
        "Fortran": np.asfortranarray(_noise(160_000).reshape(100, 200)),
        "with objects": {"x": _noise(400_000), "rows": [{"id": i} for i in range(2000)]},
    }
    cases["read-only"].flags.writeable = False
    for name, obj in cases.items():
        data = blpickle.dumps(obj)
        assert fmt.checked_compact_pickle(data) is not None, name
        assert len(data) == len(pickle.dumps(obj, protocol=5)) + fmt.COMPACT_OVERHEAD, name
        for loaded in (blpickle.loads(data), blpickle.load(io.BytesIO(data)), blpickle.loads(data, safe=True)):
            array, expected = (loaded["x"], obj["x"]) if name == "with objects" else (loaded, obj)
            assert np.array_equal(array, expected) and array.dtype == expected.dtype, name
            assert array.flags.writeable == expected.flags.writeable, name
            assert array.flags.f_contiguous == expected.flags.f_contiguous, name
        path = tmp_path / "record.blp"
        blpickle.dump(obj, path)
        assert path.read_bytes() == data, name


def test_small_arrays_are_pickled_as_pickle_pickles_them():
    """Contiguous arrays under 64 KiB are left to numpy's own reduction: the record holds
    pickle's bytes, whatever their order, writability or dtype. (A strided one is copied in
    C order: `test_views_of_an_array_in_band_load_as_pickle_loads_them`.)"""
    readonly = np.arange(100.0)
    readonly.flags.writeable = False
    obj = {
        "c": np.arange(1000),
        "fortran": np.asfortranarray(np.arange(600.0).reshape(20, 30)),
        "readonly": readonly,
        "structured": np.zeros(50, dtype=[("a", "<i4"), ("b", ">f8")]),
        "datetime": np.arange(10).astype("datetime64[s]"),
        "big-endian": np.arange(10, dtype=">i8"),
        "empty": np.empty((0, 3)),
    }
    data = blpickle.dumps(obj)
    assert data[fmt.PREAMBLE.size : -fmt.U64.size] == pickle.dumps(obj, protocol=5)
    loaded = blpickle.loads(data)
    for name, array in obj.items():
        assert np.array_equal(loaded[name], array) and loaded[name].dtype == array.dtype, name
        assert loaded[name].flags.writeable == array.flags.writeable, name


class _Trickle:
    """A file that gives at most 1000 bytes a call, by ``read`` (and ``readinto`` if asked)."""

    def __init__(self, data: bytes, readinto: bool) -> None:
        self._file = io.BytesIO(data)
        if readinto:
            self.readinto = lambda buffer: self._file.readinto(memoryview(buffer)[:1000])

    def read(self, size: int = -1) -> bytes:
        return self._file.read(1000 if size < 0 else min(size, 1000))

    def readline(self, size: int = -1) -> bytes:
        return self._file.readline(size)


def test_a_compact_record_loads_from_a_file_that_gives_little_at_a_time():
    obj = {"x": _noise(400_000), "n": 1}
    data = blpickle.dumps(obj) + blpickle.dumps("next")
    for readinto in (False, True):
        file = _Trickle(data, readinto)
        loaded = blpickle.load(file)
        assert np.array_equal(loaded["x"], obj["x"]) and loaded["n"] == 1
        assert blpickle.load(file) == "next"
        with pytest.raises(blpickle.TruncatedError):
            blpickle.load(_Trickle(data[:300_000], readinto))


def test_what_compresses_or_does_not_fit_stays_out_of_band():
    ramp = np.arange(100_000)  # 800 KB that shrink
    assert [s.raw for s in _streams(blpickle.dumps(ramp))[1:]] == [False]
    big = _noise(policy.SMALL_BUFFER_LIMIT)  # big enough to choose a codec: compressed
    assert [s.raw for s in _streams(blpickle.dumps(big))[1:]] == [False]
    # two noises fill the compact record's room: the third gets a raw stream, and the
    # pickle stream, mostly the first two, is stored raw too
    noises = [_noise(400_000, seed) for seed in range(3)]
    data = blpickle.dumps(noises)
    streams = _streams(data)
    assert [(s.nbytes > 800_000, s.raw) for s in streams] == [(True, True), (False, True)]
    loaded = blpickle.loads(data)
    assert all(np.array_equal(a, b) for a, b in zip(noises, loaded, strict=True))
    # once an array is out of band, the next noise follows it there (the record is full)
    streams = _streams(blpickle.dumps([ramp, _noise(100_000)]))
    assert [s.raw for s in streams[1:]] == [False, True]
    # an object graph over the compact limit but for its raw arrays makes a full record whose
    # pickle stream is compressed
    big = {"x": _noise(200_000), "rows": list(range(COMPACT_GRAPH_LIMIT // 2))}
    data = blpickle.dumps(big)
    assert fmt.checked_compact_pickle(data) is None and not _streams(data)[0].raw
    assert blpickle.loads(data)["rows"] == big["rows"]
    # without codec "auto", arrays stay out of band (codec None: mappable; lz4: compressed)
    for options in ({"codec": None}, {"codec": "lz4"}):
        assert len(_streams(blpickle.dumps(_noise(100_000), **options))) == 2, options


def test_a_pickle_stream_that_waited_for_raw_arrays_is_cut_into_its_chunks():
    """A stream that held raw arrays uncompressed, hoping for a compact record, is still
    written in chunks of the record's chunk size when the record turns out full."""
    rng = np.random.default_rng(0)
    rows = list(range(60_000))
    cases = {
        "graph past the limit": ([rng.random(56_000), rng.random(56_000), list(range(250_000))], {}),
        "signed": ([rng.random(12_800), rows], {"key": b"k"}),
        "a buffer out of band after": ([rng.random(12_800), rows, np.zeros(1 << 17)], {}),
        "small chunks": ([rng.random(56_000), rng.random(56_000), list(range(250_000))], {"chunk_size": 64 << 10}),
    }
    for name, (obj, options) in cases.items():
        data = blpickle.dumps(obj, **options)
        streams = _streams(data)
        assert streams[0].raw or streams[0].nchunks == -(-streams[0].nbytes // streams[0].chunk_size), name
        loaded = blpickle.loads(data, key=options.get("key"))
        assert all(np.array_equal(a, b) for a, b in zip(obj, loaded, strict=True)), name


def test_dumps_keeps_nothing_of_the_raw_arrays_of_its_last_call():
    text = [f"row {i} of a compressible table" for i in range(25_000)]
    out = io.BytesIO()
    blpickle.Pickler(out).dump(text)
    fresh = len(out.getvalue())
    noise = _noise(100_000)
    for _ in range(8):
        assert fmt.checked_compact_pickle(blpickle.dumps(noise)) is not None
    assert len(blpickle.dumps(text)) == fresh  # compressed, as by a new pickler


def test_views_of_an_array_kept_in_band_raw_stay_views():
    base = _noise(100_000)
    data = blpickle.dumps([base, base[:], base[100:], base[::2]])
    assert fmt.checked_compact_pickle(data) is not None and len(data) < 1.1 * base.nbytes
    for loaded in (blpickle.loads(data), blpickle.loads(data, safe=True)):
        assert all(np.shares_memory(loaded[0], view) for view in loaded[1:])
        assert all(np.array_equal(a, b) for a, b in zip([base, base[:], base[100:], base[::2]], loaded, strict=True))


def test_a_dispatch_table_entry_for_arrays_is_overridden_for_every_array():
    table = {**copyreg.dispatch_table, np.ndarray: lambda a: (list, (a.tolist(),))}
    for obj in ([np.ones(3)], [np.zeros(1 << 17), np.ones(3)]):
        out = io.BytesIO()
        pickler = blpickle.Pickler(out)
        pickler.dispatch_table = table
        pickler.dump(obj)
        assert all(type(a) is np.ndarray for a in blpickle.loads(out.getvalue()))


def test_a_pickle_stream_mostly_made_of_raw_arrays_is_stored_raw():
    options = blpickle.Options()
    assert policy.plan_pickle(options, 100_000, 50_000).raw
    assert not policy.plan_pickle(options, 100_000, 49_999).raw
    assert policy.plan_pickle(options, 1000, 0).raw  # under GRAPH_RAW_LIMIT
    assert policy.fits_compact(COMPACT_LIMIT - 1, COMPACT_LIMIT - COMPACT_GRAPH_LIMIT, 0, (), None)
    assert not policy.fits_compact(COMPACT_LIMIT - 1, COMPACT_LIMIT - COMPACT_GRAPH_LIMIT - 1, 0, (), None)
    assert not policy.fits_compact(COMPACT_LIMIT, COMPACT_LIMIT, 0, (), None)


def test_a_key_refuses_a_compact_record_and_signed_dumps_are_full():
    with pytest.raises(blpickle.SignatureError, match="not signed"):
        blpickle.loads(blpickle.dumps({"a": 1}), key=b"k")
    signed = blpickle.dumps({"a": 1}, key=b"k")
    assert blpickle.loads(signed, key=b"k") == {"a": 1}
    assert fmt.decode_preamble(signed[: fmt.PREAMBLE.size])[1] == fmt.FLAG_SIGNED  # full, not compact


def _compact(pickled: bytes, flags: int = fmt.FLAG_COMPACT) -> bytes:
    head = fmt.PREAMBLE.pack(fmt.MAGIC, 1, 1, flags, len(pickled)) + pickled
    return head + fmt.U64.pack(fmt.checksum(head))


def test_damaged_compact_records_raise_typed_errors():
    data = blpickle.dumps({"a": 1, "b": "x" * 50})
    flipped = bytearray(data)
    flipped[30] ^= 0x10
    with pytest.raises(blpickle.ChecksumError, match="the header"):
        blpickle.loads(bytes(flipped))
    for cut in (10, 20, len(data) - 1):
        with pytest.raises(blpickle.TruncatedError):
            blpickle.loads(data[:cut])
    with pytest.raises(blpickle.CorruptError, match="compact records are never signed"):
        blpickle.loads(_compact(pickle.dumps(1), fmt.FLAG_COMPACT | fmt.FLAG_SIGNED))
    with pytest.raises(blpickle.CorruptError, match="protocol 6"):
        blpickle.loads(_compact(b"\x80\x06N."))
    buffered = pickle.dumps(pickle.PickleBuffer(b"abc"), protocol=5, buffer_callback=lambda b: False)
    for safe in (False, True):
        with pytest.raises(blpickle.CorruptError):
            blpickle.loads(_compact(buffered), safe=safe)
    with pytest.raises(blpickle.CorruptError):
        blpickle.loads(_compact(pickle.dumps([1, 2])[:-1]))  # no STOP


def test_errors_of_code_the_pickle_calls_pass_through_as_for_full_records():
    missing = _compact(pickle.dumps(os.path.join, protocol=5).replace(b"posixpath", b"nosuchmod"))
    with pytest.raises(ModuleNotFoundError):
        blpickle.loads(missing)
    with pytest.raises(blpickle.UnsafeLoadError):
        blpickle.loads(missing, safe=True)


CALLS: list[int] = []


def _fail_once_called(value: int) -> None:
    CALLS.append(value)
    raise RuntimeError("refused by the class")


class _FailsToLoad:
    def __reduce__(self):
        return _fail_once_called, (1,)


def test_a_failing_compact_record_runs_its_code_once(tmp_path):
    path = tmp_path / "x.blp"
    blpickle.dump(_FailsToLoad(), path)
    data = path.read_bytes()
    for load in (lambda: blpickle.loads(data), lambda: blpickle.load(path), lambda: blpickle.load(io.BytesIO(data))):
        CALLS.clear()
        with pytest.raises(RuntimeError, match="refused by the class"):
            load()
        assert CALLS == [1]


def _counted(value: int) -> int:
    CALLS.append(value)
    return value


class _Counts:
    def __reduce__(self):
        return _counted, (2,)


def test_a_damaged_compact_record_runs_its_calls_once():
    """The pickle calls a function, then is damaged (an unknown opcode before STOP): the
    error is reported from a scan, never from a second unpickling that would call it again."""
    body = pickle.dumps([_Counts()], protocol=5)
    assert body.endswith(b".")
    data = _compact(body[:-1] + b"\xff.")
    for load in (lambda: blpickle.loads(data), lambda: blpickle.load(io.BytesIO(data))):
        CALLS.clear()
        with pytest.raises(blpickle.CorruptError, match="unknown opcode 0xff"):
            load()
        assert CALLS == [2]


def test_a_1_0_reader_refuses_a_compact_pickle_as_a_header():
    """The compact kind is a new minor version: a 1.0 reader would decode the pickle as a
    msgpack header, which never succeeds, at any protocol."""
    for protocol in range(6):
        with pytest.raises(blpickle.CorruptError):
            fmt.Header.decode(pickle.dumps({"a": [1, 2.5]}, protocol=protocol))


class _DumpsInside:
    """Pickles as the blpickle record of something else: a dumps nested in a dumps."""

    def __reduce__(self):
        return blpickle.loads, (blpickle.dumps({"inner": 1}),)


def test_dumps_nests_and_runs_in_several_threads():
    assert blpickle.loads(blpickle.dumps([_DumpsInside(), 2])) == [{"inner": 1}, 2]
    results: dict[int, bool] = {}

    def work(number: int) -> None:
        results[number] = all(blpickle.loads(blpickle.dumps({"n": number, "i": i})) == {"n": number, "i": i}
                               for i in range(2000))  # fmt: skip

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == dict.fromkeys(range(4), True)


def test_a_failed_dumps_leaves_the_next_one_right():
    class Fails:
        def __reduce__(self):
            raise ValueError("no")

    with pytest.raises(ValueError, match="no"):
        blpickle.dumps([1, Fails()])
    assert blpickle.loads(blpickle.dumps({"after": 1})) == {"after": 1}


def test_the_kept_pickler_writes_compact_and_full_records_in_turn():
    shared = ["shared"]
    big = {"array": np.arange(100_000), "text": b"x" * (COMPACT_LIMIT + 1)}
    for _ in range(3):
        small = blpickle.dumps([shared, shared])
        assert small[: len(fmt.MAGIC)] == fmt.MAGIC and fmt.checked_compact_pickle(small) is not None
        assert small == blpickle.dumps([shared, shared])  # nothing of the last pickling is remembered
        loaded = blpickle.loads(small)
        assert loaded == [shared, shared] and loaded[0] is loaded[1]
        full = blpickle.dumps(big)
        assert fmt.checked_compact_pickle(full) is None
        again = blpickle.loads(full)
        assert np.array_equal(again["array"], big["array"]) and again["text"] == big["text"]


def test_a_compact_record_in_a_file_is_checked_as_in_memory(tmp_path):
    data = blpickle.dumps({"a": 1, "b": "x" * 50})
    flipped = bytearray(data)
    flipped[30] ^= 0x10
    with pytest.raises(blpickle.ChecksumError, match="the header"):
        blpickle.load(io.BytesIO(bytes(flipped)))
    for cut in (10, 20, len(data) - 1):
        with pytest.raises(blpickle.TruncatedError):
            blpickle.load(io.BytesIO(data[:cut]))
    with pytest.raises(blpickle.CorruptError, match="protocol 6"):
        blpickle.load(io.BytesIO(_compact(b"\x80\x06N.")))
    missing = _compact(pickle.dumps(os.path.join, protocol=5).replace(b"posixpath", b"nosuchmod"))
    with pytest.raises(ModuleNotFoundError):
        blpickle.load(io.BytesIO(missing))
    path = tmp_path / "damaged.blp"
    path.write_bytes(bytes(flipped))
    with pytest.raises(blpickle.ChecksumError) as raised:
        blpickle.load(path)
    assert str(path) in "".join(getattr(raised.value, "__notes__", []))


def test_a_compact_record_over_the_compact_limit_loads_from_a_file():
    body = pickle.dumps(b"y" * COMPACT_LIMIT, protocol=5)  # written by another writer: over the limit
    stream = io.BytesIO(_compact(body) + blpickle.dumps("next"))
    assert blpickle.load(stream) == b"y" * COMPACT_LIMIT
    assert blpickle.load(stream) == "next"


def test_the_kept_pickler_follows_a_changed_default_preset(monkeypatch):
    blpickle.dumps([1])  # this thread now keeps a pickler with the default options
    monkeypatch.setitem(blpickle.PRESETS, "default", blpickle.Options(codec=None))
    info = blpickle.inspect(blpickle.dumps(np.zeros(100_000)))
    assert [buffer.codec for buffer in info.buffers] == [None]
