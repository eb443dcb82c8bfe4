"""Round trips through dump/dumps/load/loads and the Pickler/Unpickler classes."""

from __future__ import annotations

import io
import mmap
import os
import pickle
import sys
import threading

import numpy as np
import pytest
from conftest import NonSeekable, assert_same_array, roundtrip

import blpickle
import blpickle.files
import blpickle.stream
from blpickle.stream import MemorySource, RecordReader

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
def test_every_dtype_and_layout_round_trips(dtype):
    for array in _layouts(_sample(dtype)).values():
        assert_same_array(array, roundtrip(array))


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


def test_small_buffers_stay_in_band_and_load_writable():
    small = {
        "ro": np.frombuffer(b"x" * 1000, np.uint8),
        "f": np.asfortranarray(np.ones((10, 20))),
        "v": np.arange(500)[::3],
    }
    data = blpickle.dumps(small)
    assert blpickle.inspect(data).buffers == ()
    for key, array in small.items():
        assert_same_array(array, blpickle.loads(data)[key])
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
    compress = blpickle.stream.compress_chunk
    monkeypatch.setattr(blpickle.stream, "compress_chunk", lambda *args: calls.append(1) or compress(*args))
    last = _CountsCompressedChunks(calls)
    data = blpickle.dumps([graph, last], nthreads=1)
    assert last.seen >= 5  # the chunks before it were compressed already
    header = RecordReader(MemorySource(data), nthreads=1).header
    stream = header.streams[0]
    assert (stream.chunk_size, stream.codec) == (blpickle.stream.GRAPH_CHUNK_SIZE, "zstd")
    assert stream.nchunks == len(calls) >= 6
    for nthreads in (1, 2):
        assert blpickle.loads(blpickle.dumps(graph, nthreads=nthreads), nthreads=nthreads) == graph
        assert blpickle.loads(data, nthreads=nthreads)[0] == graph


def test_the_last_chunk_of_the_pickle_stream_is_compressed_by_the_caller(monkeypatch):
    threads: list[int] = []
    compress = blpickle.stream.compress_chunk
    monkeypatch.setattr(
        blpickle.stream, "compress_chunk", lambda *args: threads.append(threading.get_ident()) or compress(*args)
    )
    graph = [(i, str(i)) for i in range(100_000)]  # several chunks
    for obj in ({"small": 1}, graph):
        threads.clear()
        assert blpickle.loads(blpickle.dumps(obj, nthreads=2)) == obj
        assert threads[-1] == threading.get_ident()  # no round trip through the pool to wait for
    assert len(threads) > 1 and set(threads[:-1]) != {threading.get_ident()}  # the others in the pool


def test_the_first_chunk_of_the_pickle_stream_is_decompressed_by_the_caller(monkeypatch):
    graph = [(i, str(i)) for i in range(100_000)]  # several chunks
    data = blpickle.dumps(graph)
    threads: dict[str, int] = {}
    unpack = blpickle.stream.unpack_chunk
    monkeypatch.setattr(
        blpickle.stream, "unpack_chunk", lambda *args: threads.update({args[5]: threading.get_ident()}) or unpack(*args)
    )
    assert blpickle.loads(data, nthreads=2) == graph
    first = threads.pop("chunk 0 of the pickle stream")
    assert first == threading.get_ident()  # no round trip through the pool to wait for
    assert threads and threading.get_ident() not in threads.values()  # the others in the pool


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


def test_readonly_arrays_load_writable():
    array = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)
    assert not array.flags.writeable
    loaded = roundtrip(array)
    assert loaded.flags.writeable
    loaded[0] = 1


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


@pytest.mark.skipif(blpickle.files._sync_file_range is None, reason="sync_file_range is Linux's")
def test_dump_to_a_path_starts_writing_out_as_it_goes(tmp_path, monkeypatch):
    calls = []
    sync = blpickle.files._sync_file_range
    monkeypatch.setattr(blpickle.files, "WRITEBACK_STEP", 1 << 20)
    monkeypatch.setattr(blpickle.files, "_sync_file_range", lambda *args: calls.append(args[1:]) or sync(*args))
    array = np.random.default_rng(0).random(1_000_000)  # 8 MB that do not compress
    blpickle.dump(array, tmp_path / "x.blp", chunk_size=1 << 20)
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
    for _ in range(sys.getrecursionlimit() * 2):
        nested = [nested]
    with pytest.raises(RecursionError):
        blpickle.dumps(nested)
