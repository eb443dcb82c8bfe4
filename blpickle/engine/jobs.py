"""Work on the chunks of a stream: the buffer they fill (for streams read ahead, part of a
slab that several share), and the check and decompression (or copy) of each, run in the
shared pool or, when the pool has not started it, by the thread that needs it
(`blpickle.engine.reader`)."""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Executor, Future, wait
from typing import Any, NamedTuple

import numpy as np

from .. import format as fmt
from ..errors import ChecksumError, CorruptError, LimitError, LoadError
from ..io.sources import PendingRead
from .chunks import unpack_chunk

__all__ = [
    "SHARED_LIMIT",
    "SLAB_SIZE",
    "Ahead",
    "Job",
    "RawChunk",
    "RawRun",
    "Slabs",
    "allocate_stream",
    "byte_view",
    "check_raw_fields",
    "complete",
    "decompressed",
    "fill_raw",
    "stop",
    "submit",
    "unpack",
]


class Job(NamedTuple):
    """A check and decompression (or copy) of one chunk read ahead: run by the pool (its
    ``future``) or, if the pool has not started it, by the thread that needs it."""

    function: Callable[..., object]
    arguments: tuple
    future: Future[object] | None = None


class Ahead(NamedTuple):
    """A stream read ahead (`blpickle.engine.ahead.ReadAhead._read_ahead`): its array, the
    jobs that fill it, the error that stopped the reading in it, and its size; or, for a raw
    stream read with others, the `RawRun` that fills it and its place there."""

    out: Any
    jobs: list[Job]
    error: LoadError | None
    nbytes: int
    run: RawRun | None = None
    place: int = 0


class RawChunk(NamedTuple):
    """A raw chunk of a `RawRun`: where its payload goes (``out``, a uint8 array), the zero
    padding before it, the seed of its checksum, its name and offset for errors, and its
    entry in the record's chunk index."""

    out: np.ndarray
    padding: int
    seed: int
    what: str
    offset: int
    entry: int


class RawRun:
    """The raw chunks of consecutive streams, read ahead together: one positional read of
    their bytes (each chunk's padding, size field, payload and checksum field) into their
    arrays, then each chunk checked in order; in the pool, or by the thread that needs one
    of them first.
    """

    def __init__(self, pending: PendingRead, chunks: Sequence[RawChunk]) -> None:
        self._pending: PendingRead | None = pending
        self._chunks = chunks
        self._errors: list[Exception | None] = [None] * len(chunks)
        self._stored = [0] * len(chunks)  # each chunk's stored checksum, once checked
        self._future: Future[None] | None = None

    def start(self, pool: Executor) -> None:
        """Hand the reading to ``pool``."""
        self._future = pool.submit(self._fill)

    def check(self, place: int) -> tuple[int, int]:
        """Wait for the chunks to be read and checked (or do it, if the pool has not started);
        return the index entry and stored checksum of the chunk at ``place``.

        Raises:
            LoadError subclasses: the first damaged chunk's error (or the read's), for it and
                every chunk after it.
        """
        if self._future is None or self._future.cancel():
            self._future = None
            self._fill()
        else:
            self._future.result()
        error = self._errors[place]
        if error is not None:
            raise error
        return self._chunks[place].entry, self._stored[place]

    def stop(self) -> None:
        """Drop the reading if the pool has not started it, else wait for it (it writes into
        arrays whose memory the caller may free)."""
        if self._future is not None:
            self._future.cancel()
            wait([self._future])

    def _fill(self) -> None:
        pending, self._pending = self._pending, None
        if pending is None:  # read already
            return
        parts, fields = [], []
        for chunk in self._chunks:
            padding, size, stored = bytearray(chunk.padding), bytearray(fmt.U64.size), bytearray(fmt.U64.size)
            parts += [memoryview(padding), memoryview(size), chunk.out.data, memoryview(stored)]
            fields.append((padding, size, stored))
        place = 0
        try:
            pending.read_parts(parts)
            for place, (chunk, (padding, size, stored)) in enumerate(zip(self._chunks, fields, strict=True)):
                self._stored[place] = _checked_raw(chunk, padding, size, stored)
        except Exception as exc:  # kept for each chunk from the first it concerns, raised by `check`
            self._errors[place:] = [exc] * (len(self._chunks) - place)


def _checked_raw(chunk: RawChunk, padding: bytearray, size: bytearray, stored: bytearray) -> int:
    """Return the stored checksum of a raw chunk read with its padding and fields.

    Raises:
        CorruptError: as `check_raw_fields`.
        ChecksumError: for a payload that does not match its checksum.
    """
    check_raw_fields(padding, size, chunk.out.nbytes, chunk.what, chunk.offset)
    expected: int = fmt.U64.unpack(stored)[0]
    fill_raw(None, chunk.out, expected, chunk.seed, chunk.what, chunk.offset)
    return expected


def check_raw_fields(padding: Any, size: Any, nbytes: int, what: str, offset: int) -> None:
    """Check the fields before a raw chunk's payload of ``nbytes``: the zero ``padding``, then
    the ``size`` field, which is at ``offset``.

    Raises:
        CorruptError: for padding that is not zero, or a size that is not the header's.
    """
    if any(padding):
        raise CorruptError(f"the padding before {what} at offset {offset - len(padding)} is not zero")
    declared = fmt.U64.unpack(size)[0]
    if declared != nbytes:
        raise CorruptError(f"{what} at offset {offset} declares {declared} bytes, the header {nbytes}")


def submit(pending: list[Job], pool: Executor) -> list[Job]:
    """Return ``pending`` with each job handed to ``pool``."""
    return [job._replace(future=pool.submit(job.function, *job.arguments)) for job in pending]


def complete(pending: list[Job]) -> None:
    """Run the jobs of ``pending`` that the pool has not started here, and wait for the others
    (all of them stopped when one fails).

    Raises:
        the first error of the jobs, in order.
    """
    try:
        for job in pending:
            if job.future is None or job.future.cancel():  # not started: run it here rather than wait
                job.function(*job.arguments)
            else:
                job.future.result()
    finally:
        stop(pending)


def stop(jobs: list[Job]) -> None:
    """Drop the jobs the pool has not started; wait for those it runs (they write into memory
    their caller may free)."""
    futures = [job.future for job in jobs if job.future is not None]
    if futures:
        for future in futures:
            future.cancel()
        wait(futures)


def fill_raw(payload: Any, out: Any, stored: int, seed: int, what: str, offset: int) -> None:
    """Copy a raw chunk's ``payload`` into ``out`` (a uint8 array; a `PendingRead` reads it
    there; None: it is there already), then check the chunk's checksum.

    Raises:
        TruncatedError, ChecksumError.
    """
    if isinstance(payload, PendingRead):
        payload.readinto(out.data)
    elif payload is not None:
        np.copyto(out, np.frombuffer(payload, dtype=np.uint8))  # releases the GIL, as the checksum does
    computed = fmt.checksum(out, seed)
    if computed != stored:
        raise ChecksumError(what, offset, stored, computed)


def decompressed(chunks: list[tuple], futures: list[Future[None] | None] | None = None) -> Iterator[memoryview]:
    """Yield where each chunk (a `unpack_chunk` argument tuple) is decompressed to, in
    order: once its future is done, or after decompressing it here when it has none. Closed
    early (the unpickler failed), it cancels the chunks not started yet.

    Raises:
        LoadError subclasses: the error of a damaged chunk, when the iteration reaches it.
    """
    try:
        for number, chunk in enumerate(chunks):
            future = None if futures is None else futures[number]
            if future is None:
                unpack_chunk(*chunk)
            else:
                future.result()
            yield chunk[4]
    finally:
        for future in futures or ():
            if future is not None:
                future.cancel()


def byte_view(buffer: np.ndarray | memoryview) -> memoryview:
    """Return a buffer (an array or a memoryview) as a memoryview of its bytes."""
    return buffer.data.cast("B") if isinstance(buffer, np.ndarray) else buffer.cast("B")


#: Streams read ahead that are smaller than `SHARED_LIMIT` are placed one after the other
#: (64-byte aligned) in allocations of up to `SLAB_SIZE` bytes: numpy asks the kernel to back
#: allocations of 4 MiB and more with huge pages, through which fresh memory fills about
#: three times faster here than through 4 KiB pages (page faults); larger streams get
#: allocations of their own, backed so already. An array keeps its whole slab alive.
SLAB_SIZE = 16 << 20
SHARED_LIMIT = 4 << 20


class Slabs:
    """Allocates the arrays of the streams a `RecordReader` reads ahead, of a record whose
    streams are ``streams``."""

    def __init__(self, streams: Sequence[fmt.StreamInfo]) -> None:
        self._streams = streams
        self._slab: np.ndarray | None = None
        self._used = 0

    @functools.cached_property
    def _shared_after(self) -> list[int]:
        """For each stream number, the bytes that it and the streams after it under
        `SHARED_LIMIT` take in slabs."""
        sizes = [_aligned(s.nbytes) if s.nbytes < SHARED_LIMIT else 0 for s in reversed(self._streams)]
        return [*itertools.accumulate(sizes)][::-1]

    def place(self, nbytes: int, number: int) -> np.ndarray:
        """Return a new writable uint8 array of ``nbytes`` for stream ``number``: a part of
        the current slab (a new one when it is full: `SLAB_SIZE` bytes, or what the rest of
        the record's streams under `SHARED_LIMIT` need) under `SHARED_LIMIT`, else, or when
        those streams need less than `SHARED_LIMIT` together, an allocation of its own.

        Raises:
            LimitError: when it cannot be allocated.
        """
        if nbytes >= SHARED_LIMIT:
            return allocate_stream(nbytes, number)
        if self._slab is None or self._used + nbytes > len(self._slab):
            rest = self._shared_after[number]
            if rest < SHARED_LIMIT:
                return allocate_stream(nbytes, number)
            self._slab, self._used = allocate_stream(min(rest, SLAB_SIZE), number), 0
        start = self._used
        self._used += _aligned(nbytes)
        return self._slab[start : start + nbytes]


def _aligned(nbytes: int) -> int:
    """``nbytes`` rounded up to a multiple of 64 (where the next stream of a slab starts)."""
    return -(-nbytes // 64) * 64


def allocate_stream(nbytes: int, number: int, allocate: Callable[[int], Any] | None = None) -> Any:
    """Return a writable buffer for stream ``number``: ``allocate(nbytes)``, by default an
    uninitialised array (no zero-fill) aligned to `ALIGNMENT` bytes, as raw payloads are in
    the record: the kernel copies a page-aligned part of a file to an address 16 bytes past
    it (where numpy's large allocations start) about 2.2 times slower than to one aligned
    alike (a 100 MB raw array: `bench/alignment.py`).

    Raises:
        LimitError: when it cannot be allocated.
    """
    try:
        if allocate is not None:
            return allocate(nbytes)
        block = np.empty(nbytes + fmt.ALIGNMENT, dtype=np.uint8)
        start = -block.ctypes.data % fmt.ALIGNMENT
        return block[start : start + nbytes]
    except (MemoryError, ValueError):
        raise LimitError(f"stream {number} declares {nbytes} bytes, more than can be allocated") from None


def unpack(job: tuple) -> bytes | None:
    """Run `unpack_chunk` on a chunk (reading its payload first if it is a `PendingRead`);
    return its BLAKE2b digest if the record is signed."""
    packed, *chunk, sign = job
    if isinstance(packed, PendingRead):
        packed = packed.read()
    unpack_chunk(packed, *chunk)
    return fmt.chunk_digest(packed) if sign else None
