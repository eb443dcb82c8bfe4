"""Round trips through dump/dumps/load/loads and the Pickler/Unpickler classes."""

from __future__ import annotations

import copyreg
import gc
import io
import mmap
import os
import pickle
import weakref
from typing import ClassVar

import numpy as np
import psutil
import pytest
from conftest import NonSeekable, assert_same_array, roundtrip

import blpickle
import blpickle.engine.policy
import blpickle.engine.writer
import blpickle.io.files
from blpickle.engine.reader import RecordReader
from blpickle.io.sources import MemorySource

DTYPES = [
    "?",
    "i1",
    "u1",
    "i2",
    "u2",
    "i4",
    "u4",
    "i8",
    "u8",
    "f2",
    "f4",
    "f8",
    "g",
    "c8",
    "c16",
    "M8[s]",
    "M8[ns]",
    "m8[D]",
    "m8[us]",
    "S7",
    "U5",
    ">i4",
    ">f8",
    "<f8",
    ">c16",
    ">U3",
    [("a", "<i4"), ("b", ">f8"), ("c", "S3")],
    [("p", "<f4", (3,)), ("q", [("r", "<i2"), ("s", ">u8")])],
]


def _sample(dtype, shape=(7, 5)) -> np.ndarray:
    dtype = np.dtype(dtype)
    raw = np.random.default_rng(0).integers(0, 256, size=int(np.prod(shape)) * dtype.itemsize, dtype=np.uint8)
    array = raw.view(dtype).reshape(shape)
    if dtype.kind == "f" or dtype.kind == "c":
        array = np.arange(np.prod(shape)).astype(dtype).reshape(shape) / 3
    elif dtype.kind == "b":
        array = raw[: array.size].reshape(shape) % 2 == 1
    elif dtype.kind == "U":
        array = np.array([chr(65 + i % 26) * (i % 4) for i in range(np.prod(shape))], dtype=dtype).reshape(shape)
    return array


def _layouts(array: np.ndarray) -> dict[str, np.ndarray]:
    """The array as C, Fortran, transposed, strided, negative-stride, 0-d and empty."""
    return {
        "C": array,
        "F": np.asfortranarray(array),
        "T": array.T,
        "strided": array[::2, 1::2],
        "negative": array[::-1, ::-2],
        "0-d view": array[2, 3, ...],
        "0-d": np.array(array[1, 1], dtype=array.dtype),
        "empty": array[:0],
        "empty-2": array[:, :0].T,
    }


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_dtype_and_layout_round_trips_as_with_pickle(dtype):
    for array in _layouts(_sample(dtype)).values():
        assert_same_array(pickle.loads(pickle.dumps(array, protocol=5)), roundtrip(array))


@pytest.mark.parametrize("dtype", ["f8", "i2", [("a", "<i4"), ("b", ">f8")], "U4"], ids=str)
def test_strided_views_go_out_of_band_in_many_chunks(dtype, small_chunks):
    dtype = np.dtype(dtype)
    base = np.zeros(1_000_000, dtype=dtype)
    if dtype.fields is not None:
        base["a"] = np.arange(base.size)
    else:
        base[:] = np.arange(base.size).astype(dtype)
    view = base.reshape(1000, 1000)[::-3, 1::2]
    data = blpickle.dumps(view, **small_chunks)
    reader = RecordReader(MemorySource(data), nthreads=1)
    (buffer,) = reader.header.streams[1:]
    assert buffer.nbytes == view.nbytes
    assert buffer.nchunks > 1
    assert_same_array(view, blpickle.loads(data))


def test_typesize_follows_the_element_size():
    for dtype, typesize in [("f4", 4), ("i2", 2), ("f8", 8), ("U3", 4), ("S5", 5), ("c16", 16)]:
        reader = RecordReader(MemorySource(blpickle.dumps(np.zeros(100_000, dtype))), nthreads=1)
        assert reader.header.streams[1].itemsize == typesize, dtype


def test_float32_and_int16_get_the_shuffle_of_their_element_size():
    t = np.linspace(0, 100, 1_000_000)
    for array in ((np.sin(t) * 1000).astype("f4"), (np.sin(t) * 30000).astype("i2"), np.sin(t) * 1000):
        shuffled = array.nbytes / len(blpickle.dumps(array))
        unshuffled = array.nbytes / len(blpickle.dumps(array, shuffle="noshuffle"))
        as_bytes = array.nbytes / len(blpickle.dumps(array.view(np.uint8)))  # typesize 1
        assert shuffled > 1.3 * max(unshuffled, as_bytes), (array.dtype, shuffled, unshuffled, as_bytes)


def test_object_arrays_keep_their_inner_buffers_out_of_band():
    inner = np.arange(10_000, dtype=np.float64)
    outer = np.empty(3, dtype=object)
    outer[:] = [inner, "text", {"k": inner}]
    data = blpickle.dumps(outer)
    reader = RecordReader(MemorySource(data), nthreads=1)
    assert [s.nbytes for s in reader.header.streams[1:]] == [inner.nbytes]
    loaded = blpickle.loads(data)
    assert loaded.dtype == object
    assert_same_array(inner, loaded[0])
    assert loaded[1] == "text"
    assert loaded[2]["k"] is loaded[0]


def test_small_buffers_stay_in_band():
    small = {
        "b": bytearray(b"x" * 1000),
        "f": np.asfortranarray(np.ones((10, 20))),
        "v": np.arange(500)[::3],
    }
    data = blpickle.dumps(small)
    info = blpickle.inspect(data)
    assert info.buffers == ()
    # reduced as pickle reduces them, with no rebuilder of blpickle's
    assert [name for name in info.globals if "blpickle" in name or "frombuffer" in name] == [
        "numpy._core.numeric._frombuffer"
    ]
    loaded = blpickle.loads(data)
    assert loaded.pop("b") == small.pop("b")
    for key, array in small.items():
        assert_same_array(array, loaded[key])
    limit = blpickle.pickler.INBAND_LIMIT
    sizes = [
        b.nbytes for b in blpickle.inspect(blpickle.dumps([np.zeros(limit - 1, "u1"), np.zeros(limit, "u1")])).buffers
    ]
    assert sizes == [limit]


def test_shared_and_recursive_references_keep_identity():
    array = np.arange(10_000.0)
    obj = {"a": array, "b": array, "list": []}
    obj["list"].append(obj)
    loaded = roundtrip(obj)
    assert loaded["a"] is loaded["b"]
    assert loaded["list"][0] is loaded
    reader = RecordReader(MemorySource(blpickle.dumps(obj)), nthreads=1)
    assert len(reader.header.streams) == 2  # the array is stored once


def test_memmap_loads_as_a_plain_array(tmp_path):
    path = tmp_path / "m.dat"
    mapped = np.memmap(path, dtype="f4", mode="w+", shape=(100, 30))
    mapped[:] = np.arange(3000).reshape(100, 30)
    loaded = roundtrip(mapped)
    assert type(loaded) is np.ndarray
    assert_same_array(np.asarray(mapped), loaded)
    assert_same_array(np.asarray(mapped)[::3].T, roundtrip(mapped[::3].T))


class Exporter:
    """An object that pickles its payload as a PickleBuffer (like pandas or Arrow)."""

    def __init__(self, payload: bytearray) -> None:
        self.payload = payload

    def __reduce_ex__(self, protocol):
        if protocol >= 5:
            return type(self)._rebuild, (pickle.PickleBuffer(self.payload),)
        return type(self), (self.payload,)

    @classmethod
    def _rebuild(cls, buffer):
        return cls(bytearray(buffer))


def test_picklebuffer_exporters_and_bytearrays_round_trip():
    payload = bytearray(os.urandom(100_000))
    data = blpickle.dumps({"exporter": Exporter(payload), "bytearray": bytearray(b"abc" * 1000)})
    reader = RecordReader(MemorySource(data), nthreads=1)
    assert [s.nbytes for s in reader.header.streams[1:]] == [len(payload)]
    loaded = blpickle.loads(data)
    assert loaded["exporter"].payload == payload
    assert loaded["bytearray"] == bytearray(b"abc" * 1000)


def test_pandas_and_sklearn_objects_round_trip():
    pd = pytest.importorskip("pandas")
    ensemble = pytest.importorskip("sklearn.ensemble")
    frame = pd.DataFrame({"x": np.arange(1000.0), "y": np.arange(1000) % 7, "s": ["a", "b"] * 500})
    frame["c"] = frame["s"].astype("category")
    frame.index = pd.date_range("2026-01-01", periods=1000, freq="min")
    pd.testing.assert_frame_equal(roundtrip(frame), frame)
    X = np.random.default_rng(0).random((200, 4))
    y = (X[:, 0] > 0.5).astype(int)
    model = ensemble.RandomForestClassifier(n_estimators=5, random_state=0).fit(X, y)
    loaded = roundtrip(model)
    np.testing.assert_array_equal(loaded.predict_proba(X), model.predict_proba(X))


@pytest.mark.parametrize("protocol", [4, 5])
def test_large_bytes_bytearray_and_str_are_spliced_out_of_the_pickle(protocol):
    blob = bytes(range(256)) * 8192  # 2 MiB
    obj = {
        "bytes": blob,
        "bytearray": bytearray(blob),
        "str": "é" * (1 << 20),
        "small": b"x" * 1000,
        "tuple": (blob, blob),
    }
    data = blpickle.dumps(obj, protocol, chunk_size=1 << 16)
    info = blpickle.inspect(data)
    assert sorted(b.nbytes for b in info.buffers if b.splice is not None) == sorted([len(blob)] * 2 + [1 << 21])
    assert info.pickle_nbytes < 10_000  # the payloads are not in the pickle stream
    loaded = blpickle.loads(data)
    assert loaded == obj
    assert type(loaded["bytearray"]) is bytearray
    assert loaded["tuple"][0] is loaded["tuple"][1] is loaded["bytes"]
    stream = NonSeekable(data, max_read=1000)
    assert blpickle.load(stream) == obj


class _Fails:
    def __reduce__(self):
        raise ValueError("cannot pickle this")


class _CountsCompressedChunks:
    """Records, when pickled, how many chunks had been compressed by then."""

    def __init__(self, calls: list[int]) -> None:
        self.calls = calls  # one entry per chunk compressed
        self.seen = -1

    def __reduce__(self):
        self.seen = len(self.calls)
        return int, (0,)


def test_the_pickle_stream_is_compressed_in_chunks_while_it_is_written(monkeypatch):
    graph = [(i, str(i), float(i)) for i in range(100_000)]  # a pickle of ~1.6 MB
    calls: list[int] = []
    compress = blpickle.engine.writer.compress_chunk
    monkeypatch.setattr(blpickle.engine.writer, "compress_chunk", lambda *args: calls.append(1) or compress(*args))
    last = _CountsCompressedChunks(calls)
    data = blpickle.dumps([graph, last], nthreads=1)
    assert last.seen >= 5  # the chunks before it were compressed already
    header = RecordReader(MemorySource(data), nthreads=1).header
    stream = header.streams[0]
    assert (stream.chunk_size, stream.codec) == (blpickle.engine.policy.GRAPH_CHUNK_SIZE, "zstd")
    assert stream.nchunks == len(calls) >= 6
    for nthreads in (1, 2):
        assert blpickle.loads(blpickle.dumps(graph, nthreads=nthreads), nthreads=nthreads) == graph
        assert blpickle.loads(data, nthreads=nthreads)[0] == graph


def test_a_failed_dump_leaves_the_pickler_ready_for_the_next():
    graph = [str(i) * 10 for i in range(100_000)]  # over a megabyte of pickle before the failure
    out = io.BytesIO()
    pickler = blpickle.Pickler(out)
    with pytest.raises(ValueError, match="cannot pickle this"):
        pickler.dump([graph, _Fails()])
    assert out.getvalue() == b""
    pickler.dump({"after": graph[:10]})
    assert blpickle.loads(out.getvalue()) == {"after": graph[:10]}


def test_a_damaged_late_chunk_of_the_pickle_stream_is_caught():
    data = bytearray(blpickle.dumps([str(i) for i in range(200_000)]))
    reader = RecordReader(MemorySource(bytes(data)), nthreads=1)
    reader.read_stream()
    data[reader.index.offsets[-1] + 100] ^= 0x04  # in the last chunk of the pickle stream
    for nthreads in (1, 2):
        with pytest.raises(blpickle.ChecksumError, match=f"chunk {len(reader.index) - 1} of the pickle stream"):
            blpickle.loads(bytes(data), nthreads=nthreads)


def test_splices_and_out_of_band_buffers_interleave():
    blob = os.urandom(1 << 20)
    obj = [np.arange(100_000), blob, np.arange(200_000.0)[::2], bytearray(blob), np.ones((300, 300)).T]
    for options in ({}, {"codec": None}, {"key": b"k"}):
        loaded = blpickle.loads(blpickle.dumps(obj, **options), key=options.get("key"))
        assert loaded[1] == blob and loaded[3] == blob
        for i in (0, 2, 4):
            assert_same_array(obj[i], loaded[i])


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_every_protocol_round_trips_arrays(protocol):
    obj = {"a": np.arange(10_000).reshape(100, 100)[::2], "t": (1, "x", 2.5)}
    loaded = roundtrip(obj, protocol=protocol)
    assert_same_array(obj["a"], loaded["a"])
    assert loaded["t"] == obj["t"]


def test_caller_buffer_callback_keeps_stdlib_semantics():
    arrays = [np.arange(100.0), np.arange(50, dtype="i2"), np.arange(30.0)[::2]]
    kept = []
    data = blpickle.dumps(arrays, buffer_callback=kept.append)
    # the two contiguous arrays are given to the caller; the strided view stays in the record
    assert [bytes(b.raw()) for b in kept] == [arrays[0].tobytes(), arrays[1].tobytes()]
    with pytest.raises(blpickle.LoadError, match="buffers="):
        blpickle.loads(data)
    loaded = blpickle.loads(data, buffers=[b.raw() for b in kept])
    for expected, actual in zip(arrays, loaded, strict=True):
        np.testing.assert_array_equal(expected, actual)
    # a true return value keeps the buffer in band
    in_band = blpickle.dumps(arrays, buffer_callback=lambda b: True)
    for expected, actual in zip(arrays, blpickle.loads(in_band), strict=True):
        np.testing.assert_array_equal(expected, actual)


def test_cloudpickle_flavour_saves_lambdas_and_closures():
    scale = np.arange(5.0)

    def make(factor):
        return lambda x: x * factor + scale

    fn = make(3)
    loaded = roundtrip({"f": fn, "arr": scale}, pickler="cloudpickle")
    np.testing.assert_array_equal(loaded["f"](2), fn(2))
    with pytest.raises((pickle.PicklingError, AttributeError), match="local object"):
        blpickle.dumps(fn)  # the C pickler cannot save a local lambda


def test_cloudpickle_flavour_keeps_arrays_out_of_band():
    array = np.arange(100_000.0)
    data = blpickle.dumps([array, lambda: 1], pickler="cloudpickle")
    reader = RecordReader(MemorySource(data), nthreads=1)
    assert [s.nbytes for s in reader.header.streams[1:]] == [array.nbytes]
    assert reader.header.options["pickler"] == "cloudpickle"
    with pytest.raises(blpickle.OptionsError, match="CloudPickler"):
        blpickle.Pickler(io.BytesIO(), pickler="cloudpickle")


def test_several_records_in_one_file_and_plain_pickles_between_them():
    out = io.BytesIO()
    blpickle.dump(np.arange(10), out)
    pickle.dump("plain", out)
    blpickle.dump({"x": np.ones(5)}, out, codec=None)
    out.seek(0)
    assert_same_array(np.arange(10), blpickle.load(out))
    assert blpickle.load(out) == "plain"
    assert_same_array(np.ones(5), blpickle.load(out)["x"])
    with pytest.raises(EOFError):
        blpickle.load(out)


def test_pickler_and_unpickler_classes_stream_many_objects():
    out = io.BytesIO()
    pickler = blpickle.Pickler(out, codec="lz4")
    for i in range(3):
        pickler.dump(np.full(1000, i))
    out.seek(0)
    unpickler = blpickle.Unpickler(out)
    for i in range(3):
        assert_same_array(np.full(1000, i), unpickler.load())


def test_load_reads_plain_pickle_files_and_non_seekable_streams(tmp_path):
    path = tmp_path / "plain.pkl"
    obj = {"a": np.arange(100), "b": [1, 2, 3]}
    with open(path, "wb") as f:
        pickle.dump(obj, f, protocol=2)
    assert blpickle.load(path)["b"] == [1, 2, 3]
    assert blpickle.load(NonSeekable(pickle.dumps(obj, protocol=0)))["b"] == [1, 2, 3]
    loaded = blpickle.load(io.BufferedReader(NonSeekable(blpickle.dumps(obj, chunk_size=4096))))
    assert_same_array(obj["a"], loaded["a"])


def test_non_seekable_stream_with_short_reads(small_chunks):
    obj = [np.random.default_rng(1).random(20_000), np.arange(30_000)]
    loaded = blpickle.load(NonSeekable(blpickle.dumps(obj, **small_chunks), max_read=777))
    for expected, actual in zip(obj, loaded, strict=True):
        assert_same_array(expected, actual)


def test_write_to_a_pipe_and_read_from_it():
    read_fd, write_fd = os.pipe()
    obj = {"x": np.arange(300_000), "y": np.random.default_rng(2).random(50_000)}
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        os.close(read_fd)
        with os.fdopen(write_fd, "wb") as pipe:
            blpickle.dump(obj, pipe, chunk_size=65536)
        os._exit(0)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as pipe:
        loaded = blpickle.load(pipe)
        assert pipe.read() == b""
    _, status = os.waitpid(pid, 0)
    assert status == 0
    assert_same_array(obj["x"], loaded["x"])
    assert_same_array(obj["y"], loaded["y"])


def test_fsspec_files_round_trip():
    fsspec = pytest.importorskip("fsspec")
    fs = fsspec.filesystem("memory")
    obj = {"a": np.arange(100_000).reshape(1000, 100).T}
    with fs.open("/blp/test.blp", "wb") as f:
        blpickle.dump(obj, f, chunk_size=8192)
    with fs.open("/blp/test.blp", "rb") as f:
        assert_same_array(obj["a"], blpickle.load(f)["a"])


def test_dump_to_a_path_is_atomic(tmp_file):
    blpickle.dump({"good": np.arange(10)}, tmp_file)
    os.chmod(tmp_file, 0o640)

    class Unpicklable:
        def __reduce__(self):
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        blpickle.dump([np.arange(1000), Unpicklable()], tmp_file)
    assert_same_array(np.arange(10), blpickle.load(tmp_file)["good"])
    assert sorted(os.listdir(os.path.dirname(tmp_file))) == ["data.blp"]
    blpickle.dump({"new": 1}, tmp_file)
    assert blpickle.load(tmp_file) == {"new": 1}
    assert os.stat(tmp_file).st_mode & 0o777 == 0o640


@pytest.mark.skipif(blpickle.io.files._sync_file_range is None, reason="sync_file_range is Linux's")
def test_durable_dump_to_a_path_starts_writing_out_as_it_goes(tmp_path, monkeypatch):
    calls = []
    sync = blpickle.io.files._sync_file_range
    monkeypatch.setattr(blpickle.io.files, "WRITEBACK_STEP", 1 << 20)
    monkeypatch.setattr(blpickle.io.files, "_sync_file_range", lambda *args: calls.append(args[1:]) or sync(*args))
    array = np.random.default_rng(0).random(1_000_000)  # 8 MB that do not compress
    blpickle.dump(array, tmp_path / "y.blp", chunk_size=1 << 20)
    assert not calls  # without durable=True nothing is forced out
    blpickle.dump(array, tmp_path / "x.blp", chunk_size=1 << 20, durable=True)
    assert_same_array(array, blpickle.load(tmp_path / "x.blp"))
    assert len(calls) >= 3  # one each time a MiB or more was written
    ends = [start + length for start, length, _ in calls]
    assert [start for start, _, _ in calls] == [0, *ends[:-1]]  # consecutive ranges from the start
    assert ends[-1] <= os.path.getsize(tmp_path / "x.blp")


def test_dump_to_a_new_path_uses_the_umask(tmp_path):
    old = os.umask(0o027)
    try:
        blpickle.dump(1, tmp_path / "new.blp")
    finally:
        os.umask(old)
    assert os.stat(tmp_path / "new.blp").st_mode & 0o777 == 0o640


def _maps_the_file(array: np.ndarray) -> bool:
    while isinstance(array, np.ndarray):
        array = array.base
    return isinstance(array, memoryview) and isinstance(array.obj, mmap.mmap)


def test_raw_records_are_aligned_and_memory_mappable(tmp_file):
    obj = {"a": np.arange(10_001, dtype="i8"), "b": np.asfortranarray(np.ones((30, 7), "f4")), "c": "x"}
    blpickle.dump(obj, tmp_file, codec=None)
    with open(tmp_file, "rb") as f:
        data = f.read()
    reader = RecordReader(MemorySource(data), nthreads=1)
    for _ in reader.header.streams:
        reader.read_stream()
    reader.finish()
    assert all(offset % 64 == 56 for offset in reader.index.offsets)  # payload after the size
    for mode in ("r", "c"):
        loaded = blpickle.load(tmp_file, mmap_mode=mode)
        assert _maps_the_file(loaded["a"])
        np.testing.assert_array_equal(loaded["a"], obj["a"])
        assert_same_array(obj["b"], np.array(loaded["b"], order="K"))
        assert loaded["a"].flags.writeable == (mode == "c")
    loaded = blpickle.load(tmp_file)
    assert_same_array(obj["a"], loaded["a"])


def test_mmap_mode_r_plus_writes_through_to_the_file(tmp_file):
    blpickle.dump({"a": np.zeros(100_000)}, tmp_file, codec=None)
    loaded = blpickle.load(tmp_file, mmap_mode="r+")
    loaded["a"][:] = 7
    del loaded
    np.testing.assert_array_equal(blpickle.load(tmp_file, mmap_mode="r")["a"], np.full(100_000, 7.0))
    # the data no longer matches the checksum written with it: a verifying load says so
    with pytest.raises(blpickle.ChecksumError):
        blpickle.load(tmp_file)


def test_records_in_a_regular_file_load_one_after_the_other(tmp_file):
    with open(tmp_file, "wb") as f:
        f.write(b"junk")
        blpickle.dump(np.arange(10), f)
        pickle.dump("plain", f)
        blpickle.dump(np.arange(50_000.0), f, codec=None)
        f.write(b"tail")
    with open(tmp_file, "rb") as f:
        assert f.read(4) == b"junk"
        assert_same_array(np.arange(10), blpickle.load(f))
        assert blpickle.load(f) == "plain"
        loaded = blpickle.load(f, mmap_mode="r")  # not at a multiple of 64 in the file: copied
        assert loaded.flags.aligned and not _maps_the_file(loaded)
        np.testing.assert_array_equal(loaded, np.arange(50_000.0))
        assert f.read() == b"tail"


def test_mmap_mode_on_compressed_records_decompresses(tmp_file):
    blpickle.dump(np.arange(1000), tmp_file)
    assert_same_array(np.arange(1000), blpickle.load(tmp_file, mmap_mode="r"))


def test_mmap_mode_maps_no_buffer_of_a_compressed_record(tmp_file):
    """Only records written with codec None are mapped: the small buffers "auto" leaves raw
    are read and checked, as its compressed ones are. (The noise comes after an array out of
    band: else it would be pickled in band.)"""
    obj = {"ramp": np.arange(100_000), "noise": np.random.default_rng(0).standard_normal(10_000)}
    blpickle.dump(obj, tmp_file)
    with open(tmp_file, "rb") as file:
        streams = RecordReader(MemorySource(file.read()), nthreads=1).header.streams
    assert [s.raw for s in streams[1:]] == [False, True]
    for mode in ("r", "c", "r+"):
        loaded = blpickle.load(tmp_file, mmap_mode=mode)
        for key, array in obj.items():
            assert not _maps_the_file(loaded[key])
            assert_same_array(array, loaded[key])


def test_options_are_validated_before_anything_is_written(tmp_file):
    for bad in (
        {"codec": "gzip"},
        {"clevel": 10},
        {"chunk_size": 10},
        {"nthreads": 0},
        {"preset": "nope"},
        {"colour": 1},
    ):
        with pytest.raises(blpickle.OptionsError):
            blpickle.dump(1, tmp_file, **bad)
    assert not os.path.exists(tmp_file)
    with pytest.raises(blpickle.OptionsError):
        blpickle.load(io.BytesIO(blpickle.dumps(1)), mmap_mode="w")


def test_loads_rejects_text_and_accepts_buffers():
    with pytest.raises(TypeError):
        blpickle.loads("text")
    data = blpickle.dumps(np.arange(5))
    for wrapped in (bytearray(data), memoryview(data), np.frombuffer(data, np.uint8)):
        assert_same_array(np.arange(5), blpickle.loads(wrapped))


def test_unpicklers_find_class_is_used_for_records():
    class Refusing(blpickle.Unpickler):
        def find_class(self, module, name):
            raise pickle.UnpicklingError(f"refused {module}.{name}")

    with pytest.raises(pickle.UnpicklingError, match="refused"):
        Refusing(io.BytesIO(blpickle.dumps(np.arange(3)))).load()


def test_deep_recursion_error_is_clean():
    nested: list = []
    for _ in range(100_000):  # deeper than Python's limit and, from 3.13, the C pickler's own
        nested = [nested]
    with pytest.raises(RecursionError):
        blpickle.dumps(nested)


class _Held:
    """An object a weak reference can follow, holding arrays big and small (a full record),
    or two small ones (a compact record: both are copied in band)."""

    def __init__(self, big: bool = True) -> None:
        self.big = np.arange(100_000.0 if big else 10.0)
        self.small = np.arange(10)


@pytest.fixture
def gc_disabled():
    """Only reference counting frees objects: anything kept by a reference cycle stays."""
    gc.collect()
    gc.disable()
    yield
    gc.enable()


def _dumps_with_a_pickler(cls, obj, fails=False):
    """Dump ``obj`` with a pickler of ``cls`` and return the pickler, still alive."""
    pickler = cls(io.BytesIO())
    try:
        pickler.dump([obj, _Fails()] if fails else obj)
    except ValueError:
        assert fails
    return pickler


DUMPERS = {
    "dumps": lambda obj, path: blpickle.dumps(obj),
    "dump to a path": lambda obj, path: blpickle.dump(obj, path),
    "dumps, cloudpickle": lambda obj, path: blpickle.dumps(obj, pickler="cloudpickle"),
    "Pickler": lambda obj, path: _dumps_with_a_pickler(blpickle.Pickler, obj),
    "CloudPickler": lambda obj, path: _dumps_with_a_pickler(blpickle.CloudPickler, obj),
    "Pickler, failed dump": lambda obj, path: _dumps_with_a_pickler(blpickle.Pickler, obj, fails=True),
    "CloudPickler, failed dump": lambda obj, path: _dumps_with_a_pickler(blpickle.CloudPickler, obj, fails=True),
}


@pytest.mark.parametrize("big", [True, False], ids=["full record", "compact record"])
@pytest.mark.parametrize("how", DUMPERS)
def test_a_dumped_object_is_freed_as_soon_as_it_is_dropped(how, big, tmp_file, gc_disabled):
    obj = _Held(big)
    refs = [weakref.ref(obj), weakref.ref(obj.big), weakref.ref(obj.small)]
    kept = DUMPERS[how](obj, tmp_file)  # a pickler stays alive: its memo must not hold obj
    del obj
    assert [ref() for ref in refs] == [None, None, None]
    del kept


@pytest.mark.slow
def test_a_loop_of_dumps_of_big_arrays_runs_in_constant_memory(tmp_file, gc_disabled):
    process = psutil.Process()
    size = 64 << 20
    pickler = blpickle.Pickler(io.BytesIO())
    baseline = process.memory_info().rss
    growth = []
    for i in range(8):
        array = np.full(size // 8, i, dtype=np.int64)  # touched: all of it is resident
        [blpickle.dumps, lambda a: blpickle.dump(a, tmp_file), pickler.dump][i % 3]({"a": array})
        del array
        growth.append(process.memory_info().rss - baseline)
    assert max(growth) < 2 * size, [g >> 20 for g in growth]  # 8 arrays kept would be 8 * size


class Point:
    def __init__(self, x: int) -> None:
        self.x = x


def _reduce_point_times_ten(point: Point):
    return Point, (point.x * 10,)


def _assert_table_used_and_array_out_of_band(data: bytes, array: np.ndarray) -> None:
    loaded = blpickle.loads(data)
    assert loaded[0].x == 10  # the dispatch table's reducer ran
    assert_same_array(array, loaded[1])
    assert [b.nbytes for b in blpickle.inspect(data).buffers] == [array.nbytes]


@pytest.mark.parametrize("base", [blpickle.Pickler, blpickle.CloudPickler])
def test_a_dispatch_table_class_attribute_is_honoured(base):
    class WithTable(base):
        dispatch_table: ClassVar[dict] = {**copyreg.dispatch_table, Point: _reduce_point_times_ten}

    array = np.arange(100_000.0)
    out = io.BytesIO()
    WithTable(out).dump([Point(1), array])
    _assert_table_used_and_array_out_of_band(out.getvalue(), array)


def test_a_dispatch_table_set_on_the_instance_is_honoured():
    array = np.arange(100_000.0)
    out = io.BytesIO()
    pickler = blpickle.Pickler(out)
    pickler.dispatch_table = {Point: _reduce_point_times_ten}
    pickler.dump([Point(1), array])
    _assert_table_used_and_array_out_of_band(out.getvalue(), array)


def test_the_pickler_keeps_the_dispatch_table_its_caller_set():
    pickler = blpickle.Pickler(io.BytesIO())
    with pytest.raises(AttributeError):  # as with pickle.Pickler: none set
        pickler.dispatch_table  # noqa: B018
    pickler.dump(np.arange(10))
    with pytest.raises(AttributeError):
        pickler.dispatch_table  # noqa: B018
    table = {Point: _reduce_point_times_ten}
    pickler.dispatch_table = table
    pickler.dump([Point(1)])
    assert pickler.dispatch_table is table


@pytest.mark.parametrize("dump", [blpickle.dumps, lambda obj: _dump_with(blpickle.Pickler, obj)])
def test_copyreg_registrations_made_between_dumps_are_used(dump, monkeypatch):
    assert blpickle.loads(dump([Point(1), Point(2)]))[1].x == 2  # each type is looked up once a dump
    monkeypatch.setitem(copyreg.dispatch_table, Point, _reduce_point_times_ten)
    assert [p.x for p in blpickle.loads(dump([Point(1), Point(2)]))] == [10, 20]
    monkeypatch.delitem(copyreg.dispatch_table, Point)
    assert blpickle.loads(dump([Point(1)]))[0].x == 1


def _dump_with(cls, obj) -> bytes:
    out = io.BytesIO()
    cls(out).dump(obj)
    return out.getvalue()


@pytest.mark.parametrize("cls", [blpickle.Pickler, blpickle.CloudPickler])
def test_every_kind_of_object_reduces_as_pickle_reduces_it(cls):
    import abc
    import collections
    import enum

    class Color(enum.Enum):
        RED = 1

    obj = [
        Point(3),
        complex(1, 2),  # copyreg's reducer
        range(5),  # its own __reduce_ex__
        collections.OrderedDict(a=1),
        abc.ABC,  # a class whose type is a metaclass: saved by name
        collections.abc.Sequence,
        np.float64(2.5),
        np.dtype(">i4"),
        np.arange(3),
    ]
    loaded = blpickle.loads(_dump_with(cls, obj))
    assert loaded[0].x == 3 and loaded[1:4] == obj[1:4] and loaded[4] is abc.ABC
    assert loaded[5] is collections.abc.Sequence and loaded[6] == obj[6] and loaded[7] == obj[7]
    assert_same_array(obj[8], loaded[8])
    if cls is blpickle.CloudPickler:  # classes of the test module travel by value
        assert blpickle.loads(_dump_with(cls, Color.RED)).value == 1


def test_cloudpickler_needs_no_pickler_option():
    for options in ({}, {"pickler": "cloudpickle"}, {"preset": "fast"}, {"codec": None}):
        out = io.BytesIO()
        blpickle.CloudPickler(out, **options).dump((lambda: 7, np.arange(100_000)))  # a full record
        assert blpickle.loads(out.getvalue())[0]() == 7
        assert blpickle.inspect(out.getvalue()).options["pickler"] == "cloudpickle"
    blpickle.Pickler(io.BytesIO(), pickler="pickle").dump(1)
    with pytest.raises(blpickle.OptionsError, match=r"pickler='pickle' contradicts blpickle\.CloudPickler"):
        blpickle.CloudPickler(io.BytesIO(), pickler="pickle")
    with pytest.raises(blpickle.OptionsError, match=r"pickler='cloudpickle' contradicts blpickle\.Pickler"):
        blpickle.Pickler(io.BytesIO(), preset=blpickle.Options(pickler="cloudpickle"))


#: dtypes numpy's own reduce may treat specially: byte orders, datetime units, structured
#: dtypes with such fields, subarrays, alignment, metadata.
PICKLE_DTYPES = [
    ">M8[ns]",
    "<M8[ns]",
    ">M8[D]",
    ">M8[3ms]",
    ">M8",
    ">m8[us]",
    "<m8[ps]",
    ">m8",
    ">i4",
    ">f8",
    ">c8",
    ">U3",
    "S4",
    "?",
    [("t", ">M8[us]"), ("d", "<m8[s]")],
    [("a", ">i2", (2, 3)), ("b", ">M8[s]", (2,))],
    np.dtype([("x", "<f4"), ("y", ">M8[h]")], align=True),
    np.dtype(">M8[s]", metadata={"unit": "wall clock"}),
    np.dtype("<M8[s]", metadata={"unit": "wall clock"}),
    np.dtype({"names": ["a", "b"], "formats": ["<i4", "<M8[D]"], "titles": ["A", None]}),
    np.dtype((np.record, [("a", "<i4"), ("b", "<m8[s]")])),
]


def _same_bits(actual: np.ndarray, expected: np.ndarray) -> bool:
    """Whether two arrays hold the same bits, field by field (padding is not data)."""
    if expected.dtype.names:
        return all(_same_bits(actual[name], expected[name]) for name in expected.dtype.names)
    return actual.tobytes() == expected.tobytes()


def _random_array(dtype, size: int) -> np.ndarray:
    dtype = np.dtype(dtype)
    raw = np.random.default_rng(1).integers(0, 256, size=size * dtype.itemsize, dtype=np.uint8)
    return raw.view(dtype).reshape(-1, 4)


@pytest.mark.parametrize("dtype", PICKLE_DTYPES, ids=str)
def test_arrays_load_with_the_dtype_and_values_pickle_gives(dtype):
    for size in (64, 40_000):  # copied in band, out of band
        for array in (_random_array(dtype, size), _random_array(dtype, size).T, _random_array(dtype, size)[::2]):
            expected = pickle.loads(pickle.dumps(array, protocol=5))
            for options in ({}, {"codec": None}, {"pickler": "cloudpickle"}):
                loaded = roundtrip(array, **options)
                assert loaded.dtype == expected.dtype, (loaded.dtype, expected.dtype)
                assert loaded.dtype.descr == expected.dtype.descr  # byte order too
                assert loaded.dtype.metadata == expected.dtype.metadata
                assert loaded.shape == expected.shape
                assert _same_bits(loaded, expected)


def _loads_every_way(array: np.ndarray, path: str) -> dict:
    """The array loaded through each path of blpickle, with what pickle gives for it."""
    pickled = pickle.loads(pickle.dumps(array, protocol=5))
    kept: list = []
    their_kept: list = []
    with_callback = blpickle.dumps(array, buffer_callback=kept.append)
    their_callback = pickle.dumps(array, protocol=5, buffer_callback=their_kept.append)
    ways = {
        "default": (roundtrip(array), pickled),
        "cloudpickle": (roundtrip(array, pickler="cloudpickle"), pickled),
        "codec None": (roundtrip(array, codec=None), pickled),
        "buffer_callback": (
            blpickle.loads(with_callback, buffers=kept),
            pickle.loads(their_callback, buffers=their_kept),
        ),
    }
    blpickle.dump(array, path, codec=None)
    for mode in ("r+", "c"):
        ways[f"mmap_mode {mode}"] = (blpickle.load(path, mmap_mode=mode), pickled)
    return ways


@pytest.mark.parametrize("size", [1000, 100_000], ids=["in band", "out of band"])
@pytest.mark.parametrize("layout", ["C", "F", "strided", "0-d"])
@pytest.mark.parametrize("writeable", [True, False], ids=["writable", "read-only"])
def test_arrays_keep_their_writeable_flag_as_pickle_does(size, layout, writeable, tmp_file):
    array = np.arange(size, dtype=np.float64).reshape(-1, 10)
    array = {"C": array, "F": array.T, "strided": array[::2], "0-d": array[0, 0, ...]}[layout]
    array.flags.writeable = writeable
    for way, (loaded, expected) in _loads_every_way(array, tmp_file).items():
        assert loaded.flags.writeable == expected.flags.writeable, way
        if layout != "strided":  # numpy copies strided views into new, writable arrays
            assert loaded.flags.writeable == writeable, way
        np.testing.assert_array_equal(loaded, array)
    assert not blpickle.load(tmp_file, mmap_mode="r").flags.writeable


@pytest.mark.parametrize("dtype", ["M8[s]", "m8[D]", ">M8[ns]", "f8", "U2"])
def test_small_read_only_arrays_load_writable_where_pickle_gives_them_writable(dtype):
    array = np.zeros(10, dtype)
    array.flags.writeable = False
    expected = pickle.loads(pickle.dumps(array, protocol=5))  # numpy reduces datetimes to a copy
    for loaded in (roundtrip(array), blpickle.loads(blpickle.dumps(array), safe=True)):
        assert loaded.flags.writeable == expected.flags.writeable
        assert loaded.dtype.descr == expected.dtype.descr


def _pickled_to(size: int) -> dict:
    """A dict whose protocol 5 pickle is ``size`` bytes long."""
    for length in range(size - 100, size):
        obj = {"log": "a" * length, "step": 7}
        if len(pickle.dumps(obj, protocol=5)) == size:
            return obj
    raise AssertionError(f"no pickle of {size} bytes")


@pytest.mark.parametrize(
    ("size", "options"),
    [
        (blpickle.engine.policy.GRAPH_CHUNK_SIZE, {}),
        (2 * blpickle.engine.policy.GRAPH_CHUNK_SIZE, {}),
        (2 * 4096, {"chunk_size": 4096}),
        (3 * 4096, {"chunk_size": 4096, "codec": "lz4"}),
    ],
)
def test_a_pickle_stream_of_whole_chunks_loads(size, options, tmp_path):
    obj = _pickled_to(size)
    data = blpickle.dumps(obj, **options)
    graph = RecordReader(MemorySource(data), nthreads=1).header.streams[0]
    assert graph.nbytes == size and graph.nchunks == size // graph.chunk_size
    assert blpickle.loads(data) == obj
    with open(tmp_path / "r.blp", "wb") as file:
        blpickle.Pickler(file, **options).dump(obj)
    assert blpickle.load(tmp_path / "r.blp") == obj
