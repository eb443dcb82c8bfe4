"""One parser of a record's index (format/trailer.parse_index): `blpickle.open` reads the
record `blpickle.load` reads, whatever is appended to it, and refuses an index that breaks the
format's rules; forged files have every checksum right (they are made with the format's own
helpers), as an attacker would make them."""

from __future__ import annotations

import operator
import tracemalloc

import blosc2
import msgpack
import numpy as np
import pytest
from records import join, split

import blpickle
from blpickle import format as fmt
from blpickle.engine.reader import RecordReader
from blpickle.io.sources import MemorySource


def _append_trailer(record: bytes, chunks: list[tuple[bytes | None, int, bool]]) -> bytes:
    """Return ``record`` followed by chunks and a trailer listing them, seeded with the
    record's header checksum: ``(payload, frame, raw)`` appends ``payload`` as chunk
    ``frame``; ``(None, frame, _)`` lists the record's own chunk ``frame`` again."""
    header_size = fmt.decode_preamble(record[: fmt.PREAMBLE.size])[2]
    header_checksum = fmt.checksum(record[: fmt.PREAMBLE.size + header_size])
    own = split(record)
    offsets = _chunks(record)[0]
    out = bytearray(record)
    index = fmt.ChunkIndex()
    for payload, frame, raw in chunks:
        if payload is None:
            payload = own.payloads[frame]
            index.add(offsets[frame], len(payload), fmt.checksum(payload, fmt.chunk_seed(header_checksum, frame)))
            continue
        if raw:
            out += bytes(fmt.raw_padding(len(out)))
        checksum = fmt.checksum(payload, fmt.chunk_seed(header_checksum, frame))
        index.add(len(out), len(payload), checksum)
        out += fmt.U64.pack(len(payload)) + payload + fmt.U64.pack(checksum)
    trailer = index.encode()
    out += fmt.U64.pack(len(trailer)) + trailer
    out += fmt.FOOTER.pack(len(trailer), fmt.checksum(trailer, header_checksum), fmt.END_MAGIC)
    return bytes(out)


def _chunks(record: bytes) -> tuple[list[int], list[int]]:
    """Return where each chunk of ``record`` is, and the number of each stream's first chunk,
    as loading reads them."""
    reader = RecordReader(MemorySource(record), 1)
    for _ in reader.header.streams:
        reader.skip_stream()
    firsts = np.cumsum([0] + [s.nchunks for s in reader.header.streams]).tolist()
    return reader.finish().offsets, firsts


def test_an_appended_trailer_cannot_show_open_another_pickle():
    record = blpickle.dumps({"f": operator.add, "w": np.arange(20_000.0)}, codec=None)
    parts = split(record)
    assert parts.raw == [True, True] and parts.payloads[0].count(b"add") == 1
    harmless = parts.payloads[0].replace(b"add", b"sub")
    forged = _append_trailer(record, [(harmless, 0, True), (parts.payloads[1], 1, True)])
    assert blpickle.loads(forged)["f"] is operator.add  # what loading runs
    with blpickle.open(forged) as rec:
        assert "_operator.add" in rec.info.globals and "_operator.sub" not in rec.info.globals
        assert rec.info.globals == blpickle.inspect(forged).globals
        assert rec.load()["f"] is operator.add


def test_an_appended_trailer_cannot_show_open_other_array_data():
    key = b"k" * 32
    weights = np.arange(20_000.0)
    record = blpickle.dumps({"weights": weights}, codec=None, key=key)
    other = np.ones(20_000).tobytes()
    forged = _append_trailer(record, [(None, 0, True), (other, 1, True)])
    assert np.array_equal(blpickle.loads(forged, key=key)["weights"], weights)
    with blpickle.open(forged) as rec:
        assert np.array_equal(rec["weights"], weights)
        assert np.array_equal(rec.lazy("weights")[:3], weights[:3])


def test_a_chunk_before_the_one_read_must_be_where_the_index_says():
    record = blpickle.dumps([np.arange(300_000.0), np.arange(300_000)], chunk_size=1 << 20)
    offsets, firsts = _chunks(record)
    offset = offsets[firsts[1]]  # buffer 0's first chunk
    damaged = bytearray(record)
    damaged[offset] ^= 0x01  # its size field: load stops there
    with pytest.raises(blpickle.CorruptError):
        blpickle.loads(bytes(damaged))
    with blpickle.open(bytes(damaged)) as rec, pytest.raises(blpickle.CorruptError, match="chunk 0 of buffer 0"):
        rec.array(1)  # buffer 1 is only found by stepping over buffer 0


def test_bytes_between_chunks_are_refused():
    parts = split(blpickle.dumps([np.arange(300_000.0), np.arange(300_000)], chunk_size=1 << 20))
    record = join(parts)
    offsets, firsts = _chunks(record)
    gap_at = offsets[firsts[2]]  # buffer 1's first chunk
    trailer = dict(parts.trailer)
    # move buffer 1's chunks 64 bytes on, the trailer saying so, every checksum right
    gapped = bytearray(record[:gap_at]) + bytes(64) + record[gap_at:]
    header_size = fmt.decode_preamble(record[: fmt.PREAMBLE.size])[2]
    header_checksum = fmt.checksum(record[: fmt.PREAMBLE.size + header_size])
    trailer["offsets"] = [o + 64 if o >= gap_at else o for o in trailer["offsets"]]
    body = msgpack.packb(trailer)
    end = len(gapped) - fmt.FOOTER.size - fmt.FOOTER.unpack(record[-fmt.FOOTER.size :])[0] - fmt.U64.size
    forged = bytes(gapped[:end]) + fmt.U64.pack(len(body)) + body
    forged += fmt.FOOTER.pack(len(body), fmt.checksum(body, header_checksum), fmt.END_MAGIC)
    with pytest.raises(blpickle.CorruptError):
        blpickle.loads(forged)
    with pytest.raises(blpickle.CorruptError, match="chunk 0 of buffer 1"):
        blpickle.open(forged)


def test_two_arrays_of_one_name_are_refused():
    parts = split(blpickle.dumps({"a": np.arange(100_000.0), "b": np.arange(100_000)}))
    parts.header["streams"][2]["name"] = parts.header["streams"][1]["name"]
    forged = join(parts)
    with pytest.raises(blpickle.CorruptError, match="both named 'a'"):
        blpickle.open(forged)
    with pytest.raises(blpickle.CorruptError, match="both named 'a'"):
        blpickle.loads(forged)


@pytest.mark.parametrize(("dtype", "shape"), [("f8,(", [20_000]), ("(2,)f8", [10_000]), ("x" * 5000, [20_000])])
def test_a_dtype_numpy_cannot_view_describes_bytes(dtype, shape):
    parts = split(blpickle.dumps({"w": np.arange(20_000.0)}))
    parts.header["streams"][1].update(dtype=dtype, shape=shape)  # "(2,)f8": 16 bytes an item
    with blpickle.open(join(parts)) as rec:
        assert rec.arrays[0].dtype is None
        assert np.array_equal(rec["w"], np.arange(20_000.0).view(np.uint8))
        with pytest.raises(TypeError, match="not a described numpy array"):
            rec.lazy("w")


def test_a_shape_over_the_limits_is_corrupt():
    parts = split(blpickle.dumps({"e": np.empty((5, 0))}, codec=None))
    assert parts.header["streams"][1]["shape"] == [5, 0]
    parts.header["streams"][1]["shape"] = [2**64 - 1, 0]
    with pytest.raises(blpickle.CorruptError, match="shape"):
        blpickle.open(join(parts))


def test_a_url_of_unknown_size_raises_a_load_error(monkeypatch):
    fsspec = pytest.importorskip("fsspec")
    blpickle.dump({"w": np.arange(10.0)}, "memory://blpickle-index/x.blp")
    fs = fsspec.filesystem("memory")
    monkeypatch.setattr(type(fs), "size", lambda self, path: None)  # a server without Content-Length
    with pytest.raises(blpickle.LoadError, match="size"):
        blpickle.open("memory://blpickle-index/x.blp")
    monkeypatch.undo()
    assert np.array_equal(blpickle.load("memory://blpickle-index/x.blp")["w"], np.arange(10.0))


def _bomb() -> bytes:
    """A record under 1 KiB declaring a 4 GiB array in four 1 GiB chunks, each a valid Blosc2
    chunk of 1,000 bytes: every checksum right, the sizes a lie."""
    parts = split(blpickle.dumps({"x": np.zeros(200_000)}, chunk_size=1 << 20, nthreads=1))
    stream = parts.header["streams"][1]
    stream.update(nbytes=4 << 30, chunk_size=1 << 30, shape=[1 << 29], dtype="float64", order="C")
    small = blosc2.compress2(bytes(1000))
    parts.payloads = parts.payloads[:1] + [small] * 4
    parts.raw = parts.raw[:1] + [False] * 4
    return join(parts)


def test_a_forged_size_allocates_nothing_before_it_is_refused():
    bomb = _bomb()
    assert len(bomb) < 1024
    with blpickle.open(bomb) as rec:
        for read in (lambda: rec["x"], lambda: rec.lazy("x")[0]):
            tracemalloc.start()
            try:
                with pytest.raises(blpickle.CorruptError, match="Blosc2 header"):
                    read()
                peak = tracemalloc.get_traced_memory()[1]
            finally:
                tracemalloc.stop()
            assert peak < 1 << 20
