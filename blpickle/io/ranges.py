"""The one byte-range contract: `Ranges` reads the bytes at any offset of one record, whatever
holds it: a bytes-like object or a memory map (`MemoryRanges`), a seekable file
(`FileRanges`), a URL (`UrlRanges`, through fsspec: `blpickle.io.remote`). `blpickle.open`
reads records through it, and load's sources in order (`blpickle.io.sources`) offer it for
the reads they make out of order.

Offsets are counted from the record's start, which is where the input stood when opened.
"""

from __future__ import annotations

import functools
import io
import os
import stat
import threading
from collections.abc import Callable, Sequence
from typing import Any, BinaryIO

from ..errors import LoadError, TruncatedError
from .remote import filesystem

__all__ = [
    "FileRanges",
    "MemoryRanges",
    "Ranges",
    "UrlRanges",
    "has_readinto",
    "plain_fileno",
    "read_some",
    "read_upto",
    "readinto_of",
    "readinto_whole",
]


class Ranges:
    """Reads byte ranges of one record.

    Attributes:
        size: bytes from the record's start to the end of the input.
        batch: how many chunks a reader asks `read_many` for at once.
    """

    size: int
    batch = 4

    def read(self, offset: int, size: int, what: str) -> Any:
        """Return the ``size`` bytes at ``offset`` (a bytes-like object).

        Raises:
            TruncatedError: when the input ends before.
        """
        out = bytearray(size)
        self.readinto(offset, memoryview(out), what)
        return out

    def read_many(self, spans: Sequence[tuple[int, int]], what: str) -> list[Any]:
        """Return the bytes of each ``(offset, size)`` span, in order (concurrently where the
        input allows it).

        Raises:
            TruncatedError: when the input ends before one of them.
        """
        return [self.read(offset, size, what) for offset, size in spans]

    def readinto(self, offset: int, dst: memoryview, what: str) -> None:
        """Fill ``dst`` with the bytes at ``offset``.

        Raises:
            TruncatedError: when the input ends before.
        """
        raise NotImplementedError

    def loadable(self) -> Any:
        """Return what `blpickle.load` reads the record from: a file object standing at the
        record, a URL, or (a record in memory) a memoryview for `blpickle.loads`."""
        raise NotImplementedError

    def close(self) -> None:
        """Release the input (a file opened for the record)."""

    def _check(self, offset: int, size: int, what: str) -> None:
        if offset + size > self.size:
            raise TruncatedError(what, offset, size, max(self.size - offset, 0))


class MemoryRanges(Ranges):
    """A record in a bytes-like object or a memory map (read in place, never copied whole)."""

    def __init__(self, data: Any) -> None:
        self._view = memoryview(data).cast("B")
        self.size = len(self._view)

    def read(self, offset: int, size: int, what: str) -> Any:
        self._check(offset, size, what)
        return self._view[offset : offset + size]

    def readinto(self, offset: int, dst: memoryview, what: str) -> None:
        dst = dst.cast("B")
        dst[:] = self.read(offset, len(dst), what)

    def loadable(self) -> memoryview:
        return self._view


class FileRanges(Ranges):
    """A record in a seekable binary file: a file on disk is read with ``os.pread`` (the file's
    position never moves), anything else with seek and read (one thread at a time).

    Args:
        file: the file.
        owned: close the file with `close`.
        start: where the record starts in the file (None: the file's current position).

    Raises:
        ValueError: when the file cannot seek.
    """

    def __init__(self, file: BinaryIO, owned: bool = False, start: int | None = None) -> None:
        if not _seekable(file):
            raise ValueError(
                "blpickle.open needs random access: a path, a URL, a seekable file or a bytes-like object "
                "(blpickle.load reads records from streams)"
            )
        self._file = file
        self._owned = owned
        here = file.tell()
        self._start = here if start is None else start
        self._fileno = plain_fileno(file)
        self._lock = threading.Lock()
        self._readinto = readinto_of(file)
        end = os.fstat(self._fileno).st_size if self._fileno is not None else file.seek(0, io.SEEK_END)
        if self._fileno is None:
            file.seek(here)
        self.size = max(end - self._start, 0)

    def readinto(self, offset: int, dst: memoryview, what: str) -> None:
        dst = dst.cast("B")
        self._check(offset, len(dst), what)
        done = 0
        while done < len(dst):
            if self._fileno is not None:
                count = os.preadv(self._fileno, [dst[done:]], self._start + offset + done)
            else:
                with self._lock:
                    self._file.seek(self._start + offset + done)
                    count = self._readinto(dst[done:])
            if not count:
                raise TruncatedError(what, offset, len(dst), done)
            done += count

    def loadable(self) -> BinaryIO:
        self._file.seek(self._start)
        return self._file

    def close(self) -> None:
        if self._owned:
            self._file.close()


def plain_fileno(file: Any) -> int | None:
    """Return the descriptor of ``file`` when its bytes are the bytes of a regular file on
    disk: a ``FileIO``, or a buffered reader over one, seekable. Return None for anything
    else, such as ``gzip``/``bz2``/``lzma`` files (whose ``fileno()`` is the compressed file
    underneath), pipes, sockets and in-memory files."""
    raw = file.raw if isinstance(file, (io.BufferedReader, io.BufferedRandom)) else file
    if not isinstance(raw, io.FileIO):
        return None
    try:
        fileno = raw.fileno()
        if not raw.seekable() or not stat.S_ISREG(os.fstat(fileno).st_mode):
            return None
    except (OSError, ValueError):  # a closed file
        return None
    return fileno


def has_readinto(file: Any) -> bool:
    """Whether ``file`` has a ``readinto`` of its own: not the one `io.RawIOBase` leaves to
    its subclasses, which raises `NotImplementedError` in one that implements ``read`` only,
    nor `io.BufferedIOBase`'s, which calls ``read`` without the checks of `read_some`."""
    readinto = getattr(type(file), "readinto", None)
    return readinto is not None and readinto not in (io.RawIOBase.readinto, io.BufferedIOBase.readinto)


def readinto_of(file: Any) -> Callable[[memoryview], int]:
    """Return how to fill the start of a buffer from ``file``: a function that returns the
    byte count, 0 at the file's end. It calls the file's own ``readinto`` (`has_readinto`),
    else one `read_some` of at most `READ_PIECE` bytes copied into the buffer.

    The function raises `LoadError` for a file that breaks the protocol: a ``readinto``
    count that is not 0 to the buffer's size (a negative one would read backwards forever).
    """
    if has_readinto(file):
        return functools.partial(_checked_readinto, file.readinto)
    return functools.partial(_read_into, file)


def readinto_whole(readinto: Callable[[memoryview], int], view: memoryview) -> int:
    """Fill ``view`` (bytes) with calls of ``readinto`` (from `readinto_of`) until it is full
    or the file ends; return the bytes filled."""
    done = 0
    while done < len(view):
        count = readinto(view[done:])
        if not count:
            break
        done += count
    return done


#: Files without a ``readinto`` of their own are read in pieces of at most this size.
READ_PIECE = 8 << 20


def read_some(file: Any, size: int) -> bytes:
    """Return what one ``file.read(size)`` returns (empty at its end): as is when it is
    bytes, else a copy of its bytes (the file may reuse the buffer it returned).

    Raises:
        LoadError: when ``read`` returns something other than bytes, or more than ``size``.
    """
    return _checked_read(file.read(size), size)


#: `read_upto`'s ``first`` when the caller read nothing yet.
_UNREAD: Any = object()


def _checked_read(data: Any, size: int) -> bytes:
    """Return ``data``, what a file's ``read(size)`` returned, as `read_some` does.

    Raises:
        LoadError: when it is something other than bytes, or more than ``size`` bytes.
    """
    if data is None:  # a raw file with no bytes ready: as at its end
        return b""
    if type(data) is not bytes:
        try:
            view = memoryview(data)
            if view.format == "O":  # object pointers are not bytes of the file
                raise TypeError
            data = view.cast("B").tobytes()
        except (TypeError, ValueError, BufferError):
            raise LoadError(f"the file's read returned {type(data).__name__}, not bytes") from None
    if len(data) > size:
        raise LoadError(f"the file's read returned {len(data)} bytes where {size} were asked")
    return data


def read_upto(file: Any, size: int, piece: int | None = None, first: Any = _UNREAD) -> bytes | bytearray:
    """Return ``size`` bytes read from ``file`` with `read_some` (fewer only at its end),
    asking for at most ``piece`` bytes at a time (None: all that is missing): as the file
    returns them when they come in one read, as they mostly do. ``first``: what the
    caller's own first ``read`` of ``min(size, piece)`` bytes returned, if it made one.

    Raises:
        LoadError: as `read_some` does.
    """
    asked = size if piece is None else min(size, piece)
    data: bytes | bytearray = read_some(file, asked) if first is _UNREAD else _checked_read(first, asked)
    if len(data) == size or not data:
        return data
    parts = bytearray(data)
    while len(parts) < size:
        missing = size - len(parts)
        more = read_some(file, missing if piece is None else min(missing, piece))
        if not more:
            break
        parts += more
    return parts


def _checked_readinto(readinto: Callable[[memoryview], Any], dst: memoryview) -> int:
    count = readinto(dst)
    if count is None:  # a raw file with no bytes ready: as at its end
        return 0
    if not isinstance(count, int) or not 0 <= count <= len(dst):
        raise LoadError(f"the file's readinto returned {count!r} for a buffer of {len(dst)} bytes")
    return count


def _read_into(file: Any, dst: memoryview) -> int:
    data = read_some(file, min(len(dst), READ_PIECE))
    dst[: len(data)] = data
    return len(data)


def _seekable(file: Any) -> bool:
    try:
        return bool(file.seekable()) and hasattr(file, "read")
    except (AttributeError, OSError, ValueError):
        return False


class UrlRanges(Ranges):
    """A record at a URL (the whole object), read in byte ranges: a batch of chunks at once
    with ``cat_ranges``, which file systems such as s3fs fetch concurrently.

    Raises:
        blpickle.LoadError: when the file system gives no size for the URL.
    """

    batch = 16

    def __init__(self, url: str) -> None:
        self._url = url
        self._fs, self._path = filesystem(url)
        size = self._fs.size(self._path)
        if not isinstance(size, int):
            raise LoadError(
                f"the server gives no size for {url} (no Content-Length): blpickle.open reads byte "
                "ranges and needs it; blpickle.load reads the record as a stream"
            )
        self.size = size

    def read(self, offset: int, size: int, what: str) -> Any:
        return self.read_many([(offset, size)], what)[0]

    def read_many(self, spans: Sequence[tuple[int, int]], what: str) -> list[Any]:
        for offset, size in spans:
            self._check(offset, size, what)
        paths = [self._path] * len(spans)
        starts = [offset for offset, _ in spans]
        ends = [offset + size for offset, size in spans]
        found = self._fs.cat_ranges(paths, starts, ends, on_error="raise")
        for (offset, size), data in zip(spans, found, strict=True):
            if len(data) != size:
                raise TruncatedError(what, offset, size, len(data))
        return found

    def readinto(self, offset: int, dst: memoryview, what: str) -> None:
        dst = dst.cast("B")
        dst[:] = self.read(offset, len(dst), what)

    def loadable(self) -> str:
        return self._url
