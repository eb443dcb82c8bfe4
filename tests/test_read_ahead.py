"""Buffers read ahead of the unpickler (`RecordReader.buffers`): chunks of many arrays checked
and decompressed in the pool at once, loaded as reading in order loads them, and damage
reported as reading in order reports it, with nothing left running."""

from __future__ import annotations

import io
import threading

import numpy as np
import pytest

import blpickle
from blpickle.engine import jobs
from blpickle.engine.ahead import AHEAD_SIZE
from blpickle.engine.jobs import SHARED_LIMIT, SLAB_SIZE
from blpickle.engine.reader import RecordReader
from blpickle.errors import ChecksumError, CorruptError, TruncatedError
from blpickle.format import ALIGNMENT
from blpickle.io.sources import MemorySource, PendingRead


def _arrays() -> dict[str, object]:
    """Raw and compressed arrays, many chunks and one chunk, one larger than `AHEAD_SIZE`
    (read in order, its chunks in flight), and a large bytes splice between them."""
    rng = np.random.default_rng(0)
    arrays: dict[str, object] = {f"noise{i}": rng.random(25_000) for i in range(12)}  # 200 KB, raw
    arrays.update({f"ramp{i}": np.arange(i, 300_000 + i) for i in range(6)})  # compressed, several chunks
    arrays["splice"] = bytes(range(256)) * 8192  # 2 MiB of bytes: a splice stream
    arrays["big"] = np.arange(AHEAD_SIZE // 8 + 1000, dtype=np.float64)
    arrays["after"] = rng.random(20_000).astype(np.float32)
    return arrays


def _same(expected: dict[str, object], actual: dict[str, object]) -> bool:
    return expected.keys() == actual.keys() and all(
        np.array_equal(v, actual[k]) if isinstance(v, np.ndarray) else v == actual[k] for k, v in expected.items()
    )


def _chunks(record: bytes) -> tuple[list[int], list[int], list[int]]:
    """Where each chunk of ``record`` is stored, its stored size, and the number of each
    stream's first chunk."""
    reader = RecordReader(MemorySource(record), 1)
    for _ in reader.header.streams:
        reader.skip_stream()
    firsts = np.cumsum([0] + [s.nchunks for s in reader.header.streams]).tolist()
    index = reader.finish()
    return index.offsets, index.csizes, firsts


@pytest.mark.parametrize("nthreads", [1, 2, 4])
def test_many_arrays_load_from_memory_plain_files_and_streams(nthreads, tmp_path):
    arrays = _arrays()
    record = blpickle.dumps(arrays, chunk_size=1 << 20)
    assert _same(arrays, blpickle.loads(record, nthreads=nthreads))
    path = tmp_path / "arrays.blp"
    path.write_bytes(record + record)
    with open(path, "rb") as file:  # a plain file: raw payloads read by the pool's threads
        assert _same(arrays, blpickle.load(file, nthreads=nthreads))
        assert file.tell() == len(record)  # left just after the record
        assert _same(arrays, blpickle.load(file, nthreads=nthreads))
    assert _same(arrays, blpickle.load(io.BufferedReader(io.BytesIO(record)), nthreads=nthreads))  # type: ignore[arg-type]


@pytest.mark.parametrize("nthreads", [1, 2])
def test_out_of_band_arrays_load_aligned_to_64_bytes(nthreads, tmp_path):
    """As raw payloads are in the record: the kernel copies a page-aligned payload slowly to
    an address 16 bytes past a page, where numpy's large allocations start."""
    arrays = {"first": np.arange(300_000), **_arrays()}  # out of band first: none stays in the pickle
    path = tmp_path / "arrays.blp"
    path.write_bytes(blpickle.dumps(arrays, chunk_size=1 << 20))
    with open(path, "rb") as file:
        loaded = blpickle.load(file, nthreads=nthreads)
    assert _same(arrays, loaded)
    addresses = {name: value.ctypes.data for name, value in loaded.items() if isinstance(value, np.ndarray)}
    assert len(addresses) == len(arrays) - 1 and all(address % 64 == 0 for address in addresses.values()), addresses


def _damaged_chunk(record: bytes, buffer: int) -> bytes:
    offsets, csizes, firsts = _chunks(record)
    chunk = firsts[buffer + 1]
    damaged = bytearray(record)
    damaged[offsets[chunk] + 8 + csizes[chunk] - 1] ^= 0x40  # its last byte: only the checksum tells
    return bytes(damaged)


def _counting(monkeypatch) -> dict[str, int]:
    """Count the read-ahead jobs started and finished (in any thread), and those of each kind."""
    counts = {"started": 0, "finished": 0}
    lock = threading.Lock()

    def counted(function):
        def run(*arguments):
            with lock:
                counts["started"] += 1
                counts[function.__name__] = counts.get(function.__name__, 0) + 1
            try:
                return function(*arguments)
            finally:
                with lock:
                    counts["finished"] += 1

        return run

    monkeypatch.setattr(jobs, "unpack", counted(jobs.unpack))
    monkeypatch.setattr(jobs, "fill_raw", counted(jobs.fill_raw))
    monkeypatch.setattr(jobs.RawRun, "_fill", counted(jobs.RawRun._fill))
    return counts


@pytest.mark.parametrize("buffer", [3, 15])  # a raw array's chunk, a compressed array's chunk
def test_a_damaged_chunk_among_arrays_in_flight_names_its_buffer_and_leaves_nothing_running(
    buffer, monkeypatch, tmp_path
):
    arrays = _arrays()
    record = _damaged_chunk(blpickle.dumps(arrays, chunk_size=1 << 20), buffer)
    counts = _counting(monkeypatch)
    path = tmp_path / "damaged.blp"
    path.write_bytes(record)
    for load in (lambda: blpickle.loads(record), lambda: blpickle.load(str(path))):
        with pytest.raises(ChecksumError, match=f"chunk 0 of buffer {buffer} "):
            load()
        assert counts["started"] == counts["finished"] > 0  # no job still running


@pytest.mark.parametrize("where", ["memory", "file"])
def test_a_record_cut_short_raises_where_reading_in_order_would(where, monkeypatch, tmp_path):
    arrays = {f"a{i}": np.random.default_rng(i).random(25_000) for i in range(20)}
    record = blpickle.dumps(arrays)
    offsets, _, firsts = _chunks(record)
    counts = _counting(monkeypatch)
    short = record[: offsets[firsts[10]] + 1000]
    path = tmp_path / "short.blp"
    path.write_bytes(short)
    with pytest.raises(TruncatedError, match="buffer 9"):
        blpickle.loads(short) if where == "memory" else blpickle.load(str(path))  # read ahead of the unpickler
    assert counts["started"] == counts["finished"]


def _raw_record() -> tuple[dict[str, np.ndarray], bytes]:
    """A record of raw arrays out of band (after a compressed one, so that none stays in the
    pickle stream), read ahead from a plain file in runs (`blpickle.engine.jobs.RawRun`)."""
    rng = np.random.default_rng(0)
    arrays = {"ramp": np.arange(300_000), **{f"noise{i}": rng.random(12_500 + 7 * i) for i in range(30)}}
    return arrays, blpickle.dumps(arrays)


def test_raw_arrays_read_in_runs_from_a_file_load_and_leave_the_file_after_the_record(monkeypatch, tmp_path):
    arrays, record = _raw_record()
    counts = _counting(monkeypatch)
    path = tmp_path / "raw.blp"
    path.write_bytes(record + b"after")
    with open(path, "rb") as file:
        assert _same(arrays, blpickle.load(file, nthreads=2))
        assert file.read() == b"after"
    assert counts["started"] == counts["finished"] and counts["_fill"] >= 1


@pytest.mark.parametrize("part", ["padding", "size field", "payload", "checksum field"])
def test_a_damaged_raw_chunk_in_a_run_names_its_buffer_and_leaves_nothing_running(part, monkeypatch, tmp_path):
    _, record = _raw_record()
    offsets, csizes, firsts = _chunks(record)
    chunk = next(c for c in firsts[6:] if offsets[c] > offsets[c - 1] + 16 + csizes[c - 1])  # one with padding
    buffer = firsts.index(chunk) - 1
    at = {
        "padding": offsets[chunk] - 1,
        "size field": offsets[chunk],
        "payload": offsets[chunk] + 8 + csizes[chunk] // 2,
        "checksum field": offsets[chunk] + 8 + csizes[chunk],
    }[part]
    damaged = bytearray(record)
    damaged[at] ^= 0x10
    error, message = {
        "padding": (CorruptError, f"the padding before chunk 0 of buffer {buffer} "),
        "size field": (CorruptError, f"chunk 0 of buffer {buffer} at offset {offsets[chunk]} declares"),
    }.get(part, (ChecksumError, f"chunk 0 of buffer {buffer} "))
    counts = _counting(monkeypatch)
    path = tmp_path / "damaged.blp"
    path.write_bytes(damaged)
    for load in (lambda: blpickle.loads(bytes(damaged)), lambda: blpickle.load(str(path), nthreads=2)):
        with pytest.raises(error, match=message):
            load()
        assert counts["started"] == counts["finished"] > 0  # no job still running


def test_buffers_the_pickle_does_not_take_are_settled(monkeypatch):
    record = blpickle.dumps([np.arange(200_000) + i for i in range(10)])
    reader = RecordReader(MemorySource(record), 4)
    counts = _counting(monkeypatch)
    buffers = reader.buffers()
    reader.read_chunks()
    first = next(buffers)  # the others are read ahead, in the pool
    assert np.array_equal(first.view(np.int64), np.arange(200_000))
    with pytest.raises(CorruptError, match="the pickle used 1 out-of-band streams, the record holds 10"):
        reader.finish()
    assert counts["started"] == counts["finished"]


def _allocation(array: np.ndarray) -> np.ndarray:
    """The array whose memory ``array`` views (itself, if it owns its memory)."""
    while isinstance(array.base, np.ndarray):
        array = array.base
    return array


def test_arrays_read_ahead_share_allocations_of_up_to_a_slab_and_stay_independent():
    rng = np.random.default_rng(0)
    arrays = [np.arange(i, 200_000 + i) for i in range(4)]  # 1.6 MB each, compressed
    arrays += [rng.random(12_500) for _ in range(40)]  # 100 KB each, raw: 4 MB together
    arrays.append(np.arange(SHARED_LIMIT // 8, dtype=np.float64))  # 4 MiB: an allocation of its own
    loaded = blpickle.loads(blpickle.dumps(arrays), nthreads=2)
    assert all(np.array_equal(a, b) and b.flags.writeable for a, b in zip(arrays, loaded, strict=True))
    allocations = [_allocation(array) for array in loaded]
    assert len({id(a) for a in allocations[:-1]}) == 1 and allocations[0].nbytes <= SLAB_SIZE + ALIGNMENT
    assert allocations[-1].nbytes - SHARED_LIMIT in range(ALIGNMENT + 1)  # its own, aligned
    for number, array in enumerate(loaded):  # each array's bytes are its own
        array[...] = -1
        assert all(np.array_equal(a, b) for a, b in zip(arrays[number + 1 :], loaded[number + 1 :], strict=True))
    one = blpickle.loads(blpickle.dumps([arrays[0]]), nthreads=2)[0]  # under SHARED_LIMIT in all
    assert _allocation(one).nbytes - one.nbytes in range(ALIGNMENT + 1)


def test_a_failed_read_of_raw_arrays_in_flight_raises_it(monkeypatch, tmp_path):
    """An I/O error of the device is raised as it is, with nothing left running."""
    _, record = _raw_record()
    path = tmp_path / "raw.blp"
    path.write_bytes(record)

    def failing(self, parts):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(PendingRead, "read_parts", failing)
    counts = _counting(monkeypatch)
    with pytest.raises(OSError, match="Input/output error"):
        blpickle.load(str(path), nthreads=2)
    assert counts["started"] == counts["finished"]
