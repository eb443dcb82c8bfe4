"""Sources: reads left to the thread that uses them (`FileSource.read_later`)."""

from __future__ import annotations

import io
import os

import numpy as np
import pytest

import blpickle
from blpickle.errors import TruncatedError
from blpickle.io.sources import LATER_READ_SIZE, FileSource, MemorySource, PendingRead


def test_a_later_read_gives_the_bytes_and_moves_past_them(tmp_path):
    data = os.urandom(3 * LATER_READ_SIZE + 5)
    path = tmp_path / "data"
    path.write_bytes(data)
    with open(path, "rb") as file:
        source = FileSource(file)
        assert bytes(source.read(5, "head")) == data[:5]
        first = source.read_later(LATER_READ_SIZE, "first")
        second = source.read_later(LATER_READ_SIZE + 1, "second")
        assert source.pos == 2 * LATER_READ_SIZE + 6
        assert bytes(source.read(4, "after")) == data[source.pos - 4 : source.pos]
        assert isinstance(first, PendingRead) and isinstance(second, PendingRead)
        # one thread's reads share its buffer: each is valid until the next
        assert bytes(second.read()) == data[LATER_READ_SIZE + 5 : 2 * LATER_READ_SIZE + 6]
        assert bytes(first.read()) == data[5 : LATER_READ_SIZE + 5]


def test_later_reads_are_refused_where_they_cannot_be_made(tmp_path):
    path = tmp_path / "data"
    path.write_bytes(bytes(2 * LATER_READ_SIZE))
    with open(path, "rb") as file:
        source = FileSource(file)
        assert source.read_later(LATER_READ_SIZE - 1, "small") is None
        source.read(LATER_READ_SIZE + 1, "most")
        assert source.read_later(LATER_READ_SIZE, "past the end") is None  # read now: TruncatedError
        assert source.pos == LATER_READ_SIZE + 1
    assert MemorySource(bytes(2 * LATER_READ_SIZE)).read_later(LATER_READ_SIZE, "memory") is None


def test_a_file_that_shrinks_before_a_later_read_raises_truncated_error(tmp_path):
    path = tmp_path / "data"
    path.write_bytes(bytes(2 * LATER_READ_SIZE))
    with open(path, "rb") as file:
        pending = FileSource(file).read_later(2 * LATER_READ_SIZE, "the chunk")
        assert pending is not None
        os.truncate(path, LATER_READ_SIZE)
        with pytest.raises(TruncatedError, match="the chunk"):
            pending.read()


@pytest.mark.parametrize("nthreads", [1, 2])
@pytest.mark.parametrize("key", [None, b"key"])
def test_records_load_from_files_with_later_reads(tmp_path, nthreads, key):
    rng = np.random.default_rng(0)
    obj = {"noise": rng.random(1_500_000), "ramp": np.arange(2_000_000), "small": rng.random(10)}
    path = tmp_path / "record.blp"
    with open(path, "wb") as file:
        blpickle.dump(obj, file, key=key, chunk_size=1 << 20)
        blpickle.dump("second", file)
    with open(path, "rb") as file:
        loaded = blpickle.load(file, nthreads=nthreads, key=key)
        assert blpickle.load(file) == "second"
    assert all(np.array_equal(loaded[name], obj[name]) for name in obj)


def test_only_reads_from_a_file_on_disk_are_system_reads(tmp_path):
    path = tmp_path / "data"
    path.write_bytes(b"x" * 10)
    with open(path, "rb") as file:
        assert FileSource(file).system_reads
    assert not FileSource(io.BytesIO(b"x" * 10)).system_reads
    assert not MemorySource(b"x" * 10).system_reads
