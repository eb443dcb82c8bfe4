"""Iterating a LazyArray: the rows numpy gives, read one chunk's rows at a time."""

from __future__ import annotations

import numpy as np
import pytest

import blpickle
from blpickle import lazy as lazy_module

CHUNK = 4096  # the smallest chunk size: arrays of a few hundred KiB span many chunks


def _assert_same_rows(expected: np.ndarray, lazy: blpickle.LazyArray) -> None:
    """Assert that iterating ``lazy`` gives what iterating ``expected`` gives: rows of the
    same type, dtype, shape and bytes (numpy scalars for a 1-d array)."""
    rows = list(lazy)
    wanted = list(expected)
    assert len(rows) == len(wanted)
    for row, want in zip(rows, wanted, strict=True):
        assert type(row) is type(want)
        assert (row.dtype, row.shape) == (want.dtype, want.shape)
        assert row.tobytes() == want.tobytes()


def _ramp(shape: tuple[int, ...], dtype: str) -> np.ndarray:
    return (np.arange(np.prod(shape)) % 251).astype(dtype).reshape(shape)


@pytest.mark.parametrize(
    ("shape", "dtype"),
    [
        ((20_000,), "f8"),
        ((30_000,), "i4"),
        ((100_000,), "?"),
        ((3_000, 7), "i4"),  # rows of 28 bytes: a chunk holds 146 of them
        ((9_000, 3), ">f8"),
        ((50, 30, 20), "f4"),
        ((20, 40, 30), "c16"),
        ((12, 2_000), "f8"),  # rows of 16,000 bytes, over a chunk: read one at a time
        ((4_000, 4), "u2,f4"),
    ],
)
def test_iteration_gives_numpy_rows_across_chunks(shape, dtype):
    array = _ramp(shape, dtype)
    with blpickle.open(blpickle.dumps({"a": array}, chunk_size=CHUNK)) as rec:
        assert rec.arrays[0].nchunks > 4
        _assert_same_rows(array, rec.lazy("a"))


def test_iteration_of_fortran_order_and_uncompressed_arrays():
    fortran = np.asfortranarray(_ramp((300, 200), "f8"))
    with blpickle.open(blpickle.dumps({"a": fortran}, chunk_size=CHUNK)) as rec:
        assert rec.arrays[0].order == "F"
        _assert_same_rows(fortran, rec.lazy("a"))
    plain = _ramp((500, 30), "i8")
    with blpickle.open(blpickle.dumps({"a": plain}, codec=None)) as rec:
        _assert_same_rows(plain, rec.lazy("a"))


@pytest.mark.parametrize("shape", [(0,), (0, 7), (4, 0), (0, 3, 2)])
def test_iteration_of_empty_arrays(shape):
    array = np.zeros(shape)
    with blpickle.open(blpickle.dumps({"a": array}, codec=None)) as rec:  # small arrays stay out of band
        lazy = rec.lazy("a")
        assert lazy.shape == shape
        _assert_same_rows(array, lazy)


def test_iterating_a_0d_array_raises_as_numpy():
    with blpickle.open(blpickle.dumps({"a": np.array(2.5)}, codec=None)) as rec:
        lazy = rec.lazy("a")
        assert lazy.shape == ()
        with pytest.raises(TypeError, match="iteration over a 0-d array"):
            iter(lazy)
    with pytest.raises(TypeError, match="iteration over a 0-d array"):
        iter(np.array(2.5))


def _reads(monkeypatch, rec: blpickle.Record) -> list[tuple[int, int]]:
    """Record the ``(start, stop)`` of every `Record.read_bytes` call on ``rec``."""
    spans: list[tuple[int, int]] = []
    read_bytes = rec.read_bytes

    def counting(position: int, start: int, stop: int) -> np.ndarray:
        spans.append((start, stop))
        return read_bytes(position, start, stop)

    monkeypatch.setattr(rec, "read_bytes", counting)
    return spans


@pytest.mark.parametrize(("shape", "dtype"), [((20_000,), "f8"), ((3_000, 7), "i4"), ((50, 30, 20), "f4")])
def test_iteration_reads_one_chunk_of_rows_at_a_time(monkeypatch, shape, dtype):
    array = _ramp(shape, dtype)
    with blpickle.open(blpickle.dumps({"a": array}, chunk_size=CHUNK)) as rec:
        info = rec.arrays[0]
        spans = _reads(monkeypatch, rec)
        rows = iter(rec.lazy("a"))
        first = next(rows)
        assert spans == [(0, info.chunk_size)]  # the first row read only the first chunk
        assert np.array_equal(first, array[0])
        assert len(list(rows)) == shape[0] - 1
    assert len(spans) == info.nchunks > 4
    assert all(start == i * info.chunk_size for i, (start, _) in enumerate(spans))  # chunk by chunk
    assert all(stop - start <= info.chunk_size for start, stop in spans)
    assert spans[-1][1] == array.nbytes


def test_iteration_reads_a_row_at_a_time_where_a_row_is_over_a_chunk(monkeypatch):
    array = _ramp((12, 2_000), "f8")
    with blpickle.open(blpickle.dumps({"a": array}, chunk_size=CHUNK)) as rec:
        spans = _reads(monkeypatch, rec)
        assert len(list(rec.lazy("a"))) == 12
    assert spans == [(i * 16_000, (i + 1) * 16_000) for i in range(12)]


def test_iterating_an_uncompressed_array_reads_bounded_blocks(monkeypatch):
    array = _ramp((1_000, 10), "f8")  # rows of 80 bytes
    monkeypatch.setattr(lazy_module, "RAW_BLOCK", 4_000)
    with blpickle.open(blpickle.dumps({"a": array}, codec=None)) as rec:
        spans = _reads(monkeypatch, rec)
        _assert_same_rows(array, rec.lazy("a"))
    assert spans == [(i * 4_000, (i + 1) * 4_000) for i in range(20)]


def test_a_damaged_chunk_raises_when_iteration_reaches_it():
    array = _ramp((3_000, 7), "i4")
    record = blpickle.dumps({"a": array}, chunk_size=CHUNK)
    with blpickle.open(record) as rec:
        info = rec.arrays[0]
        frame = rec._index.first[info.position + 1] + 2
        offset = rec._index.chunks.offsets[frame] + 8 + 40  # inside chunk 2
    damaged = bytearray(record)
    damaged[offset] ^= 0xFF
    per_chunk = info.chunk_size // 28
    with blpickle.open(bytes(damaged)) as rec:
        rows = iter(rec.lazy("a"))
        for i in range(2 * per_chunk):  # chunks 0 and 1 are intact
            assert np.array_equal(next(rows), array[i])
        with pytest.raises(blpickle.ChecksumError, match=f"chunk 2 of buffer {info.position}"):
            next(rows)
