"""Where `blpickle.load` reads records from, in order: bytes in memory, memory maps and files
(seekable or not), behind one interface. A source that can seek also offers the record's
bytes through the one byte-range contract, `blpickle.io.ranges.Ranges`, for the reads it
makes out of order."""

from __future__ import annotations

import mmap
import os
import threading
from typing import Any, BinaryIO

import numpy as np

from .. import format as fmt
from ..errors import TruncatedError
from .ranges import FileRanges, MemoryRanges, Ranges, plain_fileno, read_upto, readinto_of, readinto_whole

__all__ = [
    "FileSource",
    "MemorySource",
    "PendingRead",
    "RecordingSource",
    "Source",
    "map_file",
]

#: Large reads from files are made in pieces of this size.
READ_SIZE = 8 << 20
#: Reads of at least this many bytes from a plain file can be left to the thread that uses
#: them (`FileSource.read_later`) ...
LATER_READ_SIZE = 256 << 10
#: ... which reads them into a buffer of its own, kept between reads up to this size.
KEPT_BUFFER_SIZE = 16 << 20


class Source:
    """Where a record is read from, in order; ``pos`` counts bytes since the record start.

    Attributes:
        system_reads: reads are system calls, which release the GIL (a file on disk), so
            work on the data read so far can run in the pool beside them.
    """

    pos: int
    system_reads = False

    def read(self, size: int, what: str) -> Any:
        """Return exactly ``size`` bytes (bytes-like) or raise `TruncatedError` naming ``what``."""
        raise NotImplementedError

    def readinto(self, dst: memoryview, what: str) -> None:
        """Fill ``dst`` completely or raise `TruncatedError`."""
        raise NotImplementedError

    def map(self, size: int, what: str) -> np.ndarray | None:
        """Return the next ``size`` bytes as an array sharing a memory map, or None (then
        nothing is read)."""
        return None

    def read_later(self, size: int, what: str, least: int = LATER_READ_SIZE) -> PendingRead | None:
        """Move past the next ``size`` bytes and return how to read them later, from any
        thread; or None (then nothing is read), as for fewer than ``least`` bytes."""
        return None

    def size(self, least: int = 0) -> int | None:
        """Bytes from the record start to the end of the data, if known: a file is measured
        again only when it held fewer than ``least`` when last measured."""
        return None

    def random_access(self) -> Ranges | None:
        """Return the bytes of this record by range (offsets from the record start), or None
        when the source reads in order only."""
        return None

    def seek(self, pos: int) -> None:
        """Go to ``pos``, for a source with `random_access`."""
        raise NotImplementedError


class MemorySource(Source):
    """Reads from an in-memory bytes-like object (or a memory map) without copying.

    Args:
        data: the bytes; the record starts at ``offset``.
        pos: bytes of the record already consumed.
        mapped: ``map()`` returns views of ``data`` (which is a memory-mapped file).
    """

    def __init__(self, data: Any, pos: int = 0, *, offset: int = 0, mapped: bool = False) -> None:
        self._view = memoryview(data).cast("B")[offset:]
        self.pos = pos
        self._mapped = mapped

    def read(self, size: int, what: str) -> memoryview:
        end = self.pos + size
        if end > len(self._view):
            raise TruncatedError(what, self.pos, size, max(len(self._view) - self.pos, 0))
        view = self._view[self.pos : end]
        self.pos = end
        return view

    def readinto(self, dst: memoryview, what: str) -> None:
        dst[:] = self.read(dst.nbytes, what)

    def map(self, size: int, what: str) -> np.ndarray | None:
        """Return a view of the next ``size`` bytes of a memory-mapped file, or None (then
        nothing is read) when they do not start at a multiple of ``ALIGNMENT`` in memory: a
        record that does not start at such a multiple in its file gives copies, never
        misaligned arrays."""
        if not self._mapped:
            return None
        array = np.frombuffer(self._view[self.pos : self.pos + size], dtype=np.uint8)
        if array.ctypes.data % fmt.ALIGNMENT:
            return None
        return np.frombuffer(self.read(size, what), dtype=np.uint8)

    def size(self, least: int = 0) -> int:
        return len(self._view)

    def random_access(self) -> MemoryRanges:
        return MemoryRanges(self._view)

    def seek(self, pos: int) -> None:
        self.pos = pos

    def replay(self) -> MemorySource:
        """Return a new source of the same data, at the record start."""
        return MemorySource(self._view, mapped=self._mapped)


class FileSource(Source):
    """Reads from a binary file object (seekable or not). Reads never ask the file for much
    more than it holds: a large read is made in pieces, so a size declared by a damaged or
    forged record allocates only what the file really has.

    For a plain file on disk (see `plain_fileno`) it also offers random access (`FileRanges`),
    measured from where the record starts.
    """

    def __init__(self, file: BinaryIO, pos: int = 0) -> None:
        self._file = file
        self.pos = pos
        self._fileno = plain_fileno(file)
        self._start = 0 if self._fileno is None else file.tell() - pos
        self.system_reads = self._fileno is not None
        self._measured = -1  # the file's size when last measured (-1: never)
        self._readinto = readinto_of(file)

    def read(self, size: int, what: str) -> bytes | memoryview | bytearray:
        data: bytes | memoryview | bytearray
        if size <= READ_SIZE:
            data = self._file.read(size)
            if type(data) is not bytes or len(data) != size:  # not whole at once: checked, gathered
                data = read_upto(self._file, size, first=data)
        else:
            data = read_upto(self._file, size, READ_SIZE)
        if len(data) < size:
            raise TruncatedError(what, self.pos, size, len(data))
        self.pos += size
        return data

    def read_later(self, size: int, what: str, least: int = LATER_READ_SIZE) -> PendingRead | None:
        """For a plain file holding them, of at least ``least`` bytes: see
        `Source.read_later`."""
        if self._fileno is None or size < least:
            return None
        start = self._start + self.pos
        if self._file_size(self._fileno, start + size) < start + size:
            return None  # read now, to raise TruncatedError
        self._file.seek(start + size)
        pending = PendingRead(self._fileno, start, size, what, self.pos)
        self.pos += size
        return pending

    def readinto(self, dst: memoryview, what: str) -> None:
        dst = dst.cast("B")
        done = readinto_whole(self._readinto, dst)
        self.pos += done
        if done < len(dst):
            raise TruncatedError(what, self.pos, len(dst), done)

    def size(self, least: int = 0) -> int | None:
        if self._fileno is None:
            return None
        return self._file_size(self._fileno, self._start + least) - self._start

    def _file_size(self, fileno: int, least: int) -> int:
        """The size of the file ``fileno`` (ours): as last measured, measured again when that
        was under ``least`` (one system call less for each stream read from a plain file)."""
        if self._measured < least:
            self._measured = os.fstat(fileno).st_size
        return self._measured

    def random_access(self) -> FileRanges | None:
        return None if self._fileno is None else FileRanges(self._file, start=self._start)

    def seek(self, pos: int) -> None:
        self._file.seek(self._start + pos)
        self.pos = pos


class PendingRead:
    """Bytes of a plain file to be read by the thread that uses them: each thread reads into a
    buffer of its own, reused from one read to the next (so nothing is allocated, and the bytes
    stay in that core's cache for their checksum and decompression), and the threads read in
    parallel.

    Args:
        fileno: the file's descriptor.
        offset: where the bytes are in the file.
        size: how many.
        what, pos: what they are and their offset in the record, for errors.
    """

    _buffers = threading.local()

    def __init__(self, fileno: int, offset: int, size: int, what: str, pos: int) -> None:
        self._fileno, self._offset, self.size, self._what, self._pos = fileno, offset, size, what, pos

    def __len__(self) -> int:
        return self.size

    def read(self) -> memoryview:
        """Return the bytes, in this thread's buffer: valid until this thread's next `read`.

        Raises:
            TruncatedError: when the file no longer holds them all.
        """
        kept: np.ndarray | None = getattr(self._buffers, "buffer", None)
        if kept is None or kept.nbytes < self.size:
            kept = np.empty(self.size, dtype=np.uint8)
            if self.size <= KEPT_BUFFER_SIZE:
                self._buffers.buffer = kept
        view = kept.data[: self.size]
        self.readinto(view)
        return view

    def readinto(self, dst: memoryview) -> None:
        """Fill ``dst`` (of ``size`` bytes) with the bytes.

        Raises:
            TruncatedError: when the file no longer holds them all.
        """
        self.read_parts([dst])

    def read_parts(self, parts: list[memoryview]) -> None:
        """Fill ``parts`` (byte buffers of ``size`` bytes together) with the bytes, in order,
        with one positional read where the file gives them all at once.

        Raises:
            TruncatedError: when the file no longer holds them all.
        """
        done = 0
        parts = [part for part in parts if len(part)]
        while parts:
            count = os.preadv(self._fileno, parts, self._offset + done)
            if not count:
                raise TruncatedError(self._what, self._pos, self.size, done)
            done += count
            while parts and count >= len(parts[0]):  # drop the parts filled
                count -= len(parts[0])
                parts = parts[1:]
            if count:
                parts = [parts[0][count:], *parts[1:]]


class RecordingSource(Source):
    """A source that keeps a copy of the record's bytes (``head``, then every byte read)."""

    def __init__(self, source: Source, head: bytes) -> None:
        self._source = source
        self._data = bytearray(head)
        self.pos = source.pos

    def read(self, size: int, what: str) -> Any:
        data = self._source.read(size, what)
        self._data += data
        self.pos = self._source.pos
        return data

    def readinto(self, dst: memoryview, what: str) -> None:
        self._source.readinto(dst, what)
        self._data += dst
        self.pos = self._source.pos

    def size(self, least: int = 0) -> int | None:
        return self._source.size(least)

    def replay(self) -> MemorySource:
        """Return a source of the bytes kept, at the record start."""
        return MemorySource(self._data)


_MMAP_ACCESS = {"r": mmap.ACCESS_READ, "r+": mmap.ACCESS_WRITE, "c": mmap.ACCESS_COPY}


def map_file(file: BinaryIO, mmap_mode: str) -> mmap.mmap | None:
    """Map a regular file whole (see `plain_fileno`): read-only for ``mmap_mode``
    "r", shared read-write for "r+", copy-on-write for "c". Return None when ``file`` is
    not a plain file or is empty.

    Arrays viewing the map read the file as they are used: if another program truncates the
    file meanwhile, touching them raises SIGBUS, as with ``numpy.memmap``.
    """
    fileno = plain_fileno(file)
    if fileno is None:
        return None
    size = os.fstat(fileno).st_size
    return mmap.mmap(fileno, size, access=_MMAP_ACCESS[mmap_mode]) if size else None
