"""Damaged input: every flipped byte and every truncation of a record raises a LoadError
(or, where it hit no payload, loads the right object) — never a crash, a hang or wrong data."""

from __future__ import annotations

import errno
import io
import struct
import time

import numpy as np
import pytest
from bombs import bomb, peak_allocated
from conftest import NonSeekable
from records import join, split

import blpickle
from blpickle import format as fmt
from blpickle.engine import reader, writer
from blpickle.engine.chunk_hash import ChunkHash
from blpickle.io.sources import FileSource


def _object() -> dict:
    rng = np.random.default_rng(7)
    return {
        "smooth": np.cumsum(rng.integers(-3, 4, 1200)).astype("i8"),
        "noisy": rng.random(600).astype("f4")[::-2],
        "text": ["a", "b" * 50],
    }


def _same(expected: dict, actual: object) -> bool:
    return (
        isinstance(actual, dict)
        and actual.keys() == expected.keys()
        and all(np.array_equal(expected[k], actual[k]) for k in ("smooth", "noisy"))
        and actual["text"] == expected["text"]
    )


RECORDS = {
    "compressed": blpickle.dumps(_object(), chunk_size=4096, nthreads=2),
    "raw": blpickle.dumps(_object(), codec=None),
}


def _load_or_error(data: bytes, where: str) -> None:
    """Load damaged data: it must raise a LoadError or give back the original object."""
    try:
        loaded = blpickle.loads(data)
    except blpickle.LoadError as exc:  # a pickle.UnpicklingError
        message = str(exc)
    else:
        assert _same(_object(), loaded), f"wrong data loaded after {where}"
        return
    assert message, where


@pytest.mark.parametrize("kind", sorted(RECORDS))
def test_every_flipped_byte_is_caught(kind):
    data = RECORDS[kind]
    for offset in range(len(data)):
        for mask in (0x01, 0x80, 0xFF):
            damaged = bytearray(data)
            damaged[offset] ^= mask
            _load_or_error(bytes(damaged), f"flipping byte {offset} with {mask:#x}")


@pytest.mark.parametrize("kind", sorted(RECORDS))
def test_every_truncation_is_caught(kind):
    data = RECORDS[kind]
    for size in range(1, len(data)):
        with pytest.raises(blpickle.TruncatedError) as info:
            blpickle.loads(data[:size])
        assert isinstance(info.value, EOFError)
    with pytest.raises(EOFError):
        blpickle.loads(b"")


def test_truncated_non_seekable_stream_is_caught():
    data = RECORDS["compressed"]
    for size in (10, len(data) // 2, len(data) - 1):
        with pytest.raises(blpickle.TruncatedError, match="offset"):
            blpickle.load(NonSeekable(data[:size], max_read=100))


def test_checksum_errors_say_which_chunk_and_where():
    data = bytearray(RECORDS["compressed"])
    data[len(data) // 2] ^= 0x10
    with pytest.raises(blpickle.LoadError) as info:
        blpickle.loads(bytes(data))
    if isinstance(info.value, blpickle.ChecksumError):
        assert "chunk" in str(info.value) and "offset" in str(info.value)
        assert info.value.expected != info.value.found


def test_damaged_magic_is_not_read_as_pickle():
    data = bytearray(RECORDS["compressed"])
    data[0] = ord("(")  # a pickle opcode
    with pytest.raises(blpickle.BadMagicError, match="magic"):
        blpickle.loads(bytes(data))


def test_swapped_chunks_are_caught():
    """Each chunk's checksum is seeded with its position: moving chunks around is caught."""
    obj = np.arange(100_000)
    data = blpickle.dumps(obj, chunk_size=4096, codec=None)
    other = blpickle.dumps(obj + 1, chunk_size=4096, codec=None)
    assert len(data) == len(other)
    half = len(data) // 2
    with pytest.raises(blpickle.ChecksumError):
        blpickle.loads(data[:half] + other[half:])


def test_trailing_garbage_after_a_record_is_left_unread():
    out = io.BytesIO(RECORDS["compressed"] + b"garbage")
    assert _same(_object(), blpickle.load(out))
    assert out.read() == b"garbage"


@pytest.mark.parametrize("stream", [0, 1])
def test_small_records_declaring_huge_streams_of_zeros_allocate_little(stream):
    """A pickle stream may declare at most MAX_GRAPH_RATIO times its stored size; inspect never
    decompresses buffers."""
    data = bomb(stream)  # 6 chunks of 64 MiB of zeros, 32 bytes each
    assert len(data) < 1000
    calls = [lambda: blpickle.inspect(data), lambda: blpickle.inspect(data, verify=False)]
    if stream == 0:
        calls.append(lambda: blpickle.loads(data))
    for call in calls:

        def run(call=call):
            if stream == 0:
                with pytest.raises(blpickle.LimitError, match="times its stored size"):
                    call()
            else:
                call()

        assert peak_allocated(run) < 4 << 20


def test_raw_streams_declaring_more_than_the_input_holds_allocate_nothing():
    nbytes = 800_000
    parts = split(blpickle.dumps([np.ones(nbytes // 8)], codec=None))
    parts.header["streams"][1]["nbytes"] = parts.header["streams"][1]["chunk_size"] = 1 << 34
    data = bytearray(join(parts))
    size_field = data.index(struct.pack("<Q", nbytes), len(data) - nbytes - 200)  # the raw frame's size
    struct.pack_into("<Q", data, size_field, 1 << 34)

    def load():
        with pytest.raises(blpickle.TruncatedError, match="buffer 0"):
            blpickle.loads(bytes(data))

    assert peak_allocated(load) < 4 << 20


def test_a_damaged_version_is_not_reported_as_a_newer_one():
    data = bytearray(RECORDS["compressed"])
    data[8] = 7  # the major version
    with pytest.raises(blpickle.ChecksumError, match="header"):
        blpickle.loads(bytes(data))
    parts = split(RECORDS["compressed"])
    newer = bytearray(join(parts))
    newer[8] = 2
    header_size = struct.unpack_from("<I", newer, 12)[0]
    struct.pack_into("<Q", newer, 16 + header_size, fmt.checksum(bytes(newer[: 16 + header_size])))
    with pytest.raises(blpickle.UnsupportedVersionError, match="upgrade"):
        blpickle.loads(bytes(newer))


@pytest.mark.parametrize("nthreads", [1, 2])
def test_a_raw_buffer_written_and_read_in_pieces_is_checked_whole(tmp_path, monkeypatch, nthreads):
    # pieces of 4 KiB: the checksum takes ~100 of them, each hashed (with two threads: in the
    # pool) while the next is written or read
    monkeypatch.setattr(reader, "READ_SIZE", 4096)
    monkeypatch.setattr(writer, "RAW_PIECE_SIZE", 4096)
    array = np.arange(50_000, dtype=np.int64)
    path = tmp_path / "raw.blp"
    blpickle.dump(array, path, codec=None, nthreads=nthreads)
    for threads in (1, 2):  # each written checksum checked inline and in the pool
        assert np.array_equal(blpickle.load(path, nthreads=threads), array)
    in_memory = blpickle.dumps(array, codec=None, nthreads=nthreads)  # hashed inline: a copy holds the GIL
    assert np.array_equal(blpickle.loads(in_memory, nthreads=nthreads), array)
    data = bytearray(path.read_bytes())
    data[data.find(array.tobytes()) + 40_000 * 8] ^= 1  # a byte of a late piece
    path.write_bytes(data)
    with pytest.raises(blpickle.ChecksumError, match="chunk 0 of buffer 0"):
        blpickle.load(path, nthreads=nthreads)


@pytest.fixture
def slow_hashing(monkeypatch):
    """A function that makes raw pieces 4 KiB, each hashed slowly enough to outlast a dump or
    load that does not wait for it, and returns the pieces given to be hashed and not hashed
    yet, as a list."""

    def start() -> list[int]:
        monkeypatch.setattr(reader, "READ_SIZE", 4096)
        monkeypatch.setattr(writer, "RAW_PIECE_SIZE", 4096)
        pending: list[int] = []
        add, update = ChunkHash.add, ChunkHash._update

        def counted_add(self, piece):
            pending.append(1)
            add(self, piece)

        def slow_update(self, piece):
            time.sleep(0.05)
            update(self, piece)
            pending.pop()

        monkeypatch.setattr(ChunkHash, "add", counted_add)
        monkeypatch.setattr(ChunkHash, "_update", slow_update)
        return pending

    return start


def test_a_raw_write_that_fails_leaves_no_piece_being_hashed(tmp_path, slow_hashing):
    class FullDisk(io.FileIO):
        def write(self, data):
            if self.tell() > 3 * 4096:
                raise OSError(errno.ENOSPC, "No space left on device")
            return super().write(data)

    data = np.arange(50_000, dtype=np.int64)
    pending = slow_hashing()
    with FullDisk(tmp_path / "full.blp", "w") as file, pytest.raises(OSError, match="No space"):
        blpickle.dump(data, file, codec=None, nthreads=2)
    assert not pending  # the caller's array is not read after dump returns


def test_a_raw_read_that_fails_leaves_no_piece_being_hashed(tmp_path, monkeypatch, slow_hashing):
    path = tmp_path / "raw.blp"
    blpickle.dump(np.arange(50_000, dtype=np.int64), path, codec=None)
    pending = slow_hashing()
    readinto = FileSource.readinto

    def failing_readinto(self, dst, what):
        if self.pos > 6 * 4096:
            raise OSError(errno.EIO, "Input/output error")
        readinto(self, dst, what)

    monkeypatch.setattr(FileSource, "readinto", failing_readinto)
    with pytest.raises(OSError, match="Input/output"):
        blpickle.load(path, nthreads=2)
    assert not pending  # the buffer read into may be freed once load returns
