"""The unpickler's view of a record's pickle stream: `PickleFile` serves the chunks the
`RecordReader` decompresses, along the tokens of the stream's layout (`blpickle.format.layout`),
and puts the spliced payloads back where the layout finds them."""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import Any

from ..errors import CorruptError, LoadError
from ..format.layout import ARGUMENT, END, OPCODE, SPLICE, Layout, one_frame, splices_of
from .jobs import byte_view
from .reader import RecordReader

__all__ = ["PickleFile", "open_pickle"]

#: An opcode with its argument is at most 9 bytes: the unpickler reads a frame, a payload or
#: data in pieces of at least this many bytes (but the last), so never as opcodes.
_MIN_BULK_READ = 9


class PickleFile(io.RawIOBase):
    """A record's pickle stream (protocol 4 and up) as a read-only file, read chunk by chunk
    as the chunks are decompressed, with its spliced payloads put back where its
    `Layout` says.

    The payloads of large bytes, bytearray and str objects are stored as streams of their
    own; the unpickler reads each one with ``readinto`` into the object it builds, so they
    are decompressed in place, with no copy of the whole pickle in memory.

    Attributes:
        error: the LoadError a read raised, if any (the unpickler reports a failed read of
            an opcode as ``EOFError``, losing it).
    """

    def __init__(self, chunks: Iterator[memoryview], reader: RecordReader) -> None:
        self._chunks = chunks
        self._chunk = memoryview(b"")  # the part of the current chunk not read yet
        self._reader = reader
        header = reader.header
        self._layout = Layout(header.protocol, splices_of(header), header.streams[0].nbytes)
        self._served = 0  # bytes of the current token read so far
        self._pending = memoryview(b"")  # a splice read in parts
        self.error: LoadError | None = None

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        if size < 0:
            return super().read(size)  # to the end, with readinto
        try:
            self._check(size)  # before a buffer of that size is allocated
            kind = self._layout.kind
            if kind == END:  # past the pickle's end: no size is checked
                return b""
            if kind != SPLICE and 0 < size <= len(self._chunk):  # in the current chunk: one copy
                data = bytes(self._chunk[:size])
                self._chunk = self._chunk[size:]
                self._account(data)
                return data
            out = bytearray(size)
            count = self._serve(memoryview(out)) if size else 0
        except LoadError as exc:
            self.error = exc
            raise
        if count < size:
            del out[count:]
        return bytes(out)

    def readinto(self, buffer: Any) -> int:
        out = memoryview(buffer).cast("B")
        try:
            self._check(len(out))
            return self._serve(out) if len(out) and self._layout.kind != END else 0
        except LoadError as exc:
            self.error = exc
            raise

    def check_rest(self) -> None:
        """Once the unpickler has stopped, wait for the chunks it did not read (those after
        the pickle's STOP, ignored as pickle ignores them) to be checked and decompressed.

        Raises:
            LoadError subclasses: for a damaged chunk.
        """
        for _ in self._chunks:
            pass

    def _check(self, size: int) -> None:
        """Refuse a read of ``size`` bytes that does not follow the layout: an opcode or an
        argument is read whole, the rest in pieces of at least 9 bytes (but the last)."""
        layout = self._layout
        while layout.size == 0 and layout.kind != END:  # empty data or splice: the unpickler reads nothing
            self._serve(memoryview(b""))
        if layout.kind == END or size == 0:
            return
        left = layout.size - self._served
        small = layout.kind in (OPCODE, ARGUMENT)
        if (small and self._served) or not min(left, left if small else _MIN_BULK_READ) <= size <= left:
            raise CorruptError(
                f"the unpickler reads {size} bytes at offset {layout.start + self._served} of the pickle "
                f"stream, where {left} bytes of {layout.describe()} remain: it does not follow the "
                "stream's layout (an opcode runs past the end of its frame?)"
            )

    def _serve(self, out: memoryview) -> int:
        """Fill ``out`` (at most the rest of the current token) and move on past the token
        once it is complete; return how many bytes were filled (fewer at the stream's end)."""
        layout = self._layout
        if layout.kind == SPLICE:
            if not self._served:
                info = self._reader.next_stream()
                if info is None or info.splice != layout.start:
                    raise CorruptError(
                        f"the pickle reaches a splice at offset {layout.start}, the next stream is not that splice"
                    )
                if len(out) < layout.size:
                    self._pending = byte_view(self._reader.read_stream())
                else:
                    self._reader.read_stream(out)
            if self._pending:
                out[:] = self._pending[self._served : self._served + len(out)]
            count = len(out)
        else:
            count = self._copy(out)
        self._account(out[:count])
        return count

    def _account(self, data: Any) -> None:
        """Count the bytes ``data`` holds as served of the current token, and move on past
        the token once it is complete."""
        layout = self._layout
        self._served += len(data)
        if self._served == layout.size:
            self._served = 0
            self._pending = memoryview(b"")
            layout.advance(data if layout.kind in (OPCODE, ARGUMENT) else b"")

    def _copy(self, out: memoryview) -> int:
        """Copy the next bytes of the pickle stream into ``out``; return how many there were."""
        done = 0
        while done < len(out):
            if not self._chunk:
                chunk = next(self._chunks, None)
                if chunk is None:
                    break
                self._chunk = chunk
                continue
            count = min(len(self._chunk), len(out) - done)
            out[done : done + count] = self._chunk[:count]
            self._chunk = self._chunk[count:]
            done += count
        return done


def open_pickle(reader: RecordReader) -> io.RawIOBase | io.BytesIO:
    """Return the pickle stream of the record ``reader`` stands at, as a file for the
    unpickler: a `PickleFile` from protocol 4 on (read a frame at a time, as the
    chunks are decompressed), else the whole stream in a BytesIO (the unpickler reads an
    unframed pickle an opcode at a time), copied in chunk by chunk. A stream in one chunk,
    without splices, that is one frame to its end (a small object's) comes in a BytesIO too.

    Raises:
        CorruptError: for splices in a protocol 0-3 record.
        LoadError subclasses: when the pickle stream is damaged (for a PickleFile: when read).
    """
    header = reader.header
    if header.protocol >= 4:
        chunks = reader.read_chunks()
        if header.streams[0].nchunks != 1 or splices_of(header):
            return PickleFile(chunks, reader)
        whole = next(chunks)
        return io.BytesIO(whole) if one_frame(whole) else PickleFile(iter([whole]), reader)
    Layout(header.protocol, splices_of(header), header.streams[0].nbytes)
    file = io.BytesIO()
    # copied in, never decompressed into the BytesIO's own buffer: a failed read would free
    # that buffer while pool threads may still write to views of it
    for piece in reader.read_pieces() if header.streams[0].raw else reader.read_chunks():
        file.write(piece)
    file.seek(0)
    return file
