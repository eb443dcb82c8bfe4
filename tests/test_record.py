"""blpickle.open: one array of a record without unpickling or reading the rest."""

from __future__ import annotations

import io
import os
import pickle

import numpy as np
import pytest
from conftest import NonSeekable, assert_same_array
from golden.objects import GOLDEN_FILES
from test_safe import CALLS, SideEffect

import blpickle
from blpickle import format as fmt
from blpickle.engine.names import MAX_DEPTH

GOLDEN_DIR = os.path.join(os.path.dirname(__file__), "golden")


class Model:
    def __init__(self) -> None:
        self.coef_ = np.arange(30_000, dtype=np.float64).reshape(300, 100)
        self.classes_ = ["a", "b"]


def _object() -> dict:
    rng = np.random.default_rng(3)
    return {
        "weights": rng.random(200_000),
        "model": Model(),
        "layers": [np.zeros(10), np.asfortranarray(rng.random((40, 500))), (np.arange(100_000, dtype="i4")[::2],)],
        "odd key": np.ones(20_000, dtype=">f8"),
        7: np.arange(9_000, dtype="u8"),
        "side": SideEffect(),
    }


class Counting(io.BytesIO):
    """A seekable file that remembers the byte ranges read from it."""

    def __init__(self, data: bytes) -> None:
        super().__init__(data)
        self.spans: list[tuple[int, int]] = []

    def readinto(self, buffer) -> int:  # type: ignore[override]
        start = self.tell()
        count = super().readinto(buffer)
        self.spans.append((start, start + count))
        return count

    def read(self, size: int | None = -1) -> bytes:
        start = self.tell()
        data = super().read(size)
        self.spans.append((start, start + len(data)))
        return data

    def bytes_read(self) -> int:
        return sum(stop - start for start, stop in self.spans)


@pytest.fixture(scope="module")
def record() -> bytes:
    return blpickle.dumps(_object(), chunk_size=1 << 16)


def test_open_describes_every_array_by_name_without_unpickling(record):
    CALLS.clear()
    obj = _object()
    with blpickle.open(record) as rec:
        assert CALLS == []
        assert rec.names == ("weights", "model.coef_", "layers[1]", "layers[2][0]", "['odd key']", "[7]")
        for name, expected in [
            ("weights", obj["weights"]),
            ("model.coef_", obj["model"].coef_),
            ("layers[1]", obj["layers"][1]),
            ("layers[2][0]", obj["layers"][2][0]),
            ("['odd key']", obj["odd key"]),
            ("[7]", obj[7]),
        ]:
            info = rec.arrays[rec.names.index(name)]
            assert (info.name, info.dtype, info.shape, info.nbytes) == (
                name,
                expected.dtype,
                expected.shape,
                expected.nbytes,
            )
            assert info.order == ("F" if name == "layers[1]" else "C")
            assert_same_array(np.ascontiguousarray(expected) if name == "layers[2][0]" else expected, rec[name])
        assert "model.coef_" in rec and "layers[0]" not in rec  # small arrays stay in the pickle
        assert sum(a.stored for a in rec.arrays) < rec.size
        assert CALLS == []
        assert rec.info.globals == blpickle.inspect(record).globals
        assert rec.info.buffers == blpickle.inspect(record).buffers
        assert CALLS == []


def test_array_reads_its_own_chunks_and_the_heads_of_those_before(record):
    file = Counting(record)
    with blpickle.open(file) as rec:
        opened = file.bytes_read()
        assert opened <= 2 * 65536  # its first and last 64 KiB: the header and the trailer
        info = rec.arrays[rec.names.index("[7]")]
        streams = rec.header.streams[: info.position + 2]
        # each chunk up to the array's last: its size field (and a compressed one's Blosc2 sizes)
        heads = sum(s.nchunks * (8 + (0 if s.raw else 16)) for s in streams)
        before = file.bytes_read()
        rec["[7]"]
        assert file.bytes_read() - before == info.stored + 16 * info.nchunks + heads
        before = file.bytes_read()
        rec["[7]"]  # the heads are checked once
        assert file.bytes_read() - before == info.stored + 16 * info.nchunks


def test_load_unpickles_as_load_does(record, tmp_path):
    path = tmp_path / "r.blp"
    path.write_bytes(record)
    for source in (record, path, str(path)):
        with blpickle.open(source) as rec:
            CALLS.clear()
            loaded = rec.load()
            assert CALLS == ["ran"]
            assert np.array_equal(loaded["model"].coef_, Model().coef_)
            with pytest.raises(blpickle.UnsafeLoadError):
                rec.load(safe=True)


def test_a_path_is_closed_with_the_record(record, tmp_path):
    path = tmp_path / "r.blp"
    path.write_bytes(record)
    with blpickle.open(path) as rec:
        file = rec._ranges._file
        assert not file.closed
    assert file.closed


def test_names_reach_attributes_keys_and_indices_a_few_levels_deep():
    big = np.arange(10_000, dtype=np.float64)
    deep: object = big + 3
    for _ in range(MAX_DEPTH + 1):
        deep = [deep]
    obj = {"a": {"b": [None, (big + 1,)]}, 3: {"x y": big + 2}, "deep": deep, "again": big}
    with blpickle.open(blpickle.dumps(obj)) as rec:
        assert rec.names == ("a.b[1][0]", "[3]['x y']", "again")
        assert [a.name for a in rec.arrays] == ["a.b[1][0]", "[3]['x y']", None, "again"]
        assert np.array_equal(rec.array(2), big + 3)  # the one too deep: by position
        assert np.array_equal(rec["[3]['x y']"], big + 2)
    with blpickle.open(blpickle.dumps(big)) as rec:  # the root has no name
        assert rec.names == () and np.array_equal(rec[0], big)


def test_shared_arrays_are_named_by_their_shortest_path():
    big = np.arange(10_000, dtype=np.float64)
    with blpickle.open(blpickle.dumps({"z": [[big]], "a": big})) as rec:
        assert rec.names == ("a",)


def test_unknown_names_and_positions_are_clear_errors(record):
    with blpickle.open(record) as rec:
        with pytest.raises(KeyError) as raised:
            rec["nope"]
        assert "no array named 'nope'" in raised.value.args[0] and "'weights'" in raised.value.args[0]
        with pytest.raises(IndexError, match="has 6 buffers"):
            rec.array(6)


def test_buffers_that_are_not_arrays_read_as_bytes():
    data = bytes(range(256)) * 4096
    obj = {"blob": data, "buffer": blpickle.PickleBuffer(bytearray(data))}
    with blpickle.open(blpickle.dumps(obj)) as rec:
        assert [a.dtype for a in rec.arrays] == [None, None]
        assert all(rec.array(i).tobytes() == data for i in range(2))
        with pytest.raises(TypeError, match="not a described numpy array"):
            rec.lazy(0)


def test_structured_datetime_and_unicode_dtypes_come_back():
    structured = np.zeros(5000, dtype=[("id", "<i4"), ("pos", ">f8", (2,)), ("name", "S4")])
    structured["id"] = np.arange(5000)
    obj = {
        "s": structured,
        "t": np.datetime64("2026-01-01", "s") + np.arange(10_000).astype("m8[s]"),
        "u": np.array(["γάμμα"] * 5000, dtype="U6"),
    }
    with blpickle.open(blpickle.dumps(obj)) as rec:
        for name, expected in obj.items():
            assert_same_array(expected, rec[name])


@pytest.mark.parametrize(
    "name",
    sorted(n for n, arguments in GOLDEN_FILES.items() if not {"views", "tensors", "cupy", "inband"} & arguments.keys()),
)
def test_records_of_format_1_0_open(name):
    """Their arrays have no names and no order: those whose order matters read as bytes."""
    path = os.path.join(GOLDEN_DIR, name)
    loaded = blpickle.load(path, key=GOLDEN_FILES[name].get("key"))
    arrays = [v for v in loaded.values() if isinstance(v, np.ndarray)] + [loaded.get("objects", [0, 0, 0])[2]]
    with blpickle.open(path) as rec:
        assert rec.version == name[1:4] and rec.names == ()
        for info in rec.arrays:
            data = rec.array(info.position)
            if info.dtype is None:
                assert data.dtype == np.uint8
                continue
            assert any(a.dtype == data.dtype and a.shape == data.shape and np.array_equal(a, data) for a in arrays)
        if GOLDEN_FILES[name].get("codec", "") is None:  # every array out of band
            described = {a.shape for a in rec.arrays if a.dtype is not None}
            assert (20_000,) in described and (100, 200) not in described  # floats_f: order unknown


def test_damaged_frames_raise_naming_the_frame_and_leave_the_rest_readable(record):
    with blpickle.open(record) as rec:
        target = rec.names.index("model.coef_")
        frame = rec._index.first[target + 1] + 1
        offset = rec._index.chunks.offsets[frame] + 8 + 40  # inside the chunk
    damaged = bytearray(record)
    damaged[offset] ^= 0xFF
    with blpickle.open(bytes(damaged)) as rec:
        with pytest.raises(blpickle.ChecksumError, match=f"chunk 1 of buffer {target}"):
            rec["model.coef_"]
        with pytest.raises(blpickle.ChecksumError, match=f"chunk 1 of buffer {target}"):
            rec.lazy("model.coef_")[150:160]
        assert np.array_equal(rec.lazy("model.coef_")[:10], Model().coef_[:10])  # chunk 0
        assert np.array_equal(rec["weights"], _object()["weights"])


def test_a_frame_that_disagrees_with_the_trailer_is_corrupt(record):
    with blpickle.open(record) as rec:
        offset = rec._index.chunks.offsets[rec._index.first[1]]
    damaged = bytearray(record)
    damaged[offset] ^= 0x01  # the csize field of buffer 0's first frame
    with blpickle.open(bytes(damaged)) as rec, pytest.raises(blpickle.CorruptError, match="chunk 0 of buffer 0"):
        rec.array(0)


def test_damaged_or_missing_trailer_and_header(record):
    damaged = bytearray(record)
    damaged[-30] ^= 0xFF  # in the trailer
    with pytest.raises(blpickle.LoadError):
        blpickle.open(bytes(damaged))
    damaged = bytearray(record)
    damaged[20] ^= 0xFF  # in the header
    with pytest.raises(blpickle.ChecksumError, match="the header"):
        blpickle.open(bytes(damaged))
    with pytest.raises(blpickle.TruncatedError):
        blpickle.open(record[: len(record) // 2])
    for not_a_record in (pickle.dumps(list(range(100))), pickle.dumps({"a": 1}), b"hello", b"\x93NUMPY\x01\x00v\x00"):
        with pytest.raises(blpickle.BadMagicError):
            blpickle.open(not_a_record)
    with pytest.raises(blpickle.TruncatedError):
        blpickle.open(record[:5])
    with pytest.raises(blpickle.TruncatedError):
        blpickle.open(b"")


def test_a_forged_trailer_cannot_point_outside_the_frames(record):
    from records import join, split

    parts = split(record)
    trailer = dict(parts.trailer)
    trailer["offsets"] = list(trailer["offsets"])
    trailer["offsets"][3] = trailer["offsets"][2]  # two frames at one offset
    with pytest.raises(blpickle.CorruptError, match="the trailer places chunk"):
        blpickle.open(join(parts, trailer))


def test_records_one_after_another(record):
    other = blpickle.dumps({"w": np.arange(50_000.0)})
    file = io.BytesIO(record + other + record)  # the last trailer at the end is the first's too
    with blpickle.open(file) as rec:  # its trailer is not at the end: found frame by frame
        assert rec.size == len(record)
        assert np.array_equal(rec["weights"], _object()["weights"])
    file.seek(len(record))
    with blpickle.open(file) as rec:
        assert np.array_equal(rec["w"], np.arange(50_000.0))
        assert rec.load()["w"].shape == (50_000,)


def test_streams_are_refused_with_a_clear_error(record):
    with pytest.raises(ValueError, match="needs random access"):
        blpickle.open(NonSeekable(record))


def test_uncompressed_records(tmp_path):
    obj = _object()
    path = tmp_path / "raw.blp"
    blpickle.dump(obj, path, codec=None)
    with blpickle.open(path) as rec:
        assert_same_array(obj["weights"], rec["weights"])
        assert np.array_equal(rec.lazy("model.coef_")[10:20], obj["model"].coef_[10:20])


@pytest.mark.parametrize("codec", [None, "auto"])
def test_a_part_of_a_raw_buffer_is_read_unchecked_only_with_codec_none(codec):
    noise = np.random.default_rng(0).standard_normal(10_000)  # 80 KB that "auto" leaves raw
    # after an array out of band (else "auto" keeps it in the pickle stream)
    data = bytearray(blpickle.dumps({"ramp": np.arange(100_000), "noise": noise}, codec=codec))
    with blpickle.open(bytes(data)) as rec:
        assert rec.arrays[1].codec is None  # stored raw either way
    data[data.index(noise[-1].tobytes())] ^= 1  # damage the last element, outside the slice
    with blpickle.open(bytes(data)) as rec:
        if codec is None:
            assert np.array_equal(rec.lazy("noise")[:10], noise[:10])
        else:
            with pytest.raises(blpickle.ChecksumError):
                rec.lazy("noise")[:10]
        with pytest.raises(blpickle.ChecksumError):
            rec["noise"]


def test_chunks_hold_whole_rows():
    array = np.arange(3 * 1000 * 7, dtype=np.float32).reshape(3000, 7)  # rows of 28 bytes
    with blpickle.open(blpickle.dumps({"a": array}, chunk_size=1 << 16)) as rec:
        info = rec.arrays[0]
        assert info.chunk_size % 28 == 0 and info.nchunks > 1


@pytest.mark.parametrize(
    "key",
    [
        3,
        -1,
        np.int64(5),
        slice(10, 20),
        slice(None, None, -3),
        slice(250, 5, -7),
        slice(2000, 3000),
        slice(5, 5),
        (slice(5, 290, 7), 3),
        (7, slice(2, 9)),
        (slice(1, 3), Ellipsis),
        [1, 5],
        np.arange(300) % 2 == 0,
        (Ellipsis, 4),
    ],
)
def test_lazy_indexing_gives_what_numpy_gives(record, key):
    expected = Model().coef_
    with blpickle.open(record) as rec:
        lazy = rec.lazy("model.coef_")
        assert (lazy.shape, lazy.dtype, len(lazy), lazy.ndim) == ((300, 100), np.float64, 300, 2)
        assert_same_array(np.ascontiguousarray(expected[key]), np.ascontiguousarray(lazy[key]))


def test_lazy_rows_read_only_the_chunks_that_hold_them(record):
    file = Counting(record)
    with blpickle.open(file) as rec:
        lazy = rec.lazy("model.coef_")
        info = rec.arrays[rec.names.index("model.coef_")]
        row = 800
        assert info.chunk_size % row == 0 and info.nchunks >= 4
        per_chunk = info.chunk_size // row
        rec.lazy("model.coef_")[0]  # the heads of the chunks up to chunk 1 are checked
        before = file.bytes_read()
        rows = lazy[per_chunk + 1 : 2 * per_chunk - 1]  # inside chunk 1
        first = rec._index.first[info.position + 1]
        heads = 8 + 16  # chunk 1's size field and Blosc2 sizes, checked before it is read
        assert file.bytes_read() - before == rec._index.chunks.csizes[first + 1] + 16 + heads
        assert np.array_equal(rows, Model().coef_[per_chunk + 1 : 2 * per_chunk - 1])
        assert np.array_equal(np.asarray(lazy), Model().coef_)
        assert_same_array(_object()["layers"][1], np.asarray(rec.lazy("layers[1]")))  # Fortran order
        assert np.array_equal(rec.lazy("layers[1]")[3:5], _object()["layers"][1][3:5])


def test_out_of_range_rows_raise_as_numpy(record):
    with blpickle.open(record) as rec, pytest.raises(IndexError):
        rec.lazy("model.coef_")[300]


def test_header_keys_are_validated():
    for key, value in (("order", "X"), ("name", 3)):
        info = {"nbytes": 8, "chunk_size": 8, "itemsize": 1, "raw": False, key: value}
        with pytest.raises(blpickle.CorruptError, match=key):
            fmt.header._decode_stream(info, 1)


def test_a_forged_size_is_refused_before_anything_is_allocated():
    from records import join, split

    parts = split(blpickle.dumps({"w": np.arange(50_000.0)}, codec=None))
    stream = parts.header["streams"][1]
    stream["nbytes"] = stream["chunk_size"] = 1 << 61
    stream["shape"] = [1 << 58]
    with pytest.raises(blpickle.CorruptError, match="chunk 0 of buffer 0"):
        blpickle.open(join(parts))


def test_a_signed_record_opens_and_its_load_checks_the_key():
    data = blpickle.dumps({"w": np.arange(50_000.0)}, key=b"k")
    with blpickle.open(data) as rec:
        assert rec.signed and np.array_equal(rec["w"], np.arange(50_000.0))
        assert rec.load(key=b"k")["w"].shape == (50_000,)
        with pytest.raises(blpickle.SignatureError):
            rec.load(key=b"other")


def test_a_closed_record_refuses_reads_and_open_checks_nthreads(tmp_path):
    path = tmp_path / "x.blp"
    blpickle.dump({"w": np.arange(100_000.0)}, path)
    rec = blpickle.open(path)
    rec.close()
    with pytest.raises(ValueError, match="closed record"):
        rec["w"]
    for nthreads in (-1, 2.5, "2"):
        with pytest.raises(blpickle.OptionsError):
            blpickle.open(path, nthreads=nthreads)
