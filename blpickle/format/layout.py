"""The layout of a record's pickle stream: its frames, the opcodes between them, and where
the spliced payloads go.

One parser, `Layout`, decides this, and both readers of the pickle stream follow it:
loading (`PickleFile`, which serves the unpickler) and inspecting (`blpickle.format.scan`, which
drives it as it reads the stream chunk by chunk). So a record whose splices are not where
the parser puts them is refused by both, and both see the same opcodes.

At protocol 4 and up the C pickler writes PROTO, then FRAMEs, and writes each large bytes,
bytearray or str payload outside the frames (the opcode and its size, then the payload); a
few small opcodes may sit between frames too (a frame of under 4 bytes gets no header). The
parser walks that level only, skipping frames and payloads whole, so its cost grows with the
number of frames, not of opcodes. A splice belongs exactly where the parser finds the data of
a payload opcode outside the frames (``BINBYTES``, ``BINBYTES8``, ``BINUNICODE``,
``BINUNICODE8``, ``BYTEARRAY8``) whose size is the spliced stream's; anywhere else, and in a
pickle of protocol 0-3 (which has no frames), it is a `CorruptError`.

The unpickler must read along the same tokens, or it would parse the bytes otherwise than the
parser did (an opcode running past the end of its frame, say): `PickleFile` refuses a
read that starts inside an opcode or argument, or that would run past the end of a token.
"""

from __future__ import annotations

import io
import pickle
import pickletools
from collections import deque
from collections.abc import Iterable, Iterator
from typing import Any

from ..engine.reader import RecordReader, byte_view
from ..errors import CorruptError, LoadError
from . import Header

__all__ = [
    "ARGUMENT",
    "DATA",
    "END",
    "FRAME",
    "OPCODE",
    "SPLICE",
    "Layout",
    "PickleFile",
    "open_pickle",
    "splices_of",
    "tokens",
]

#: The kinds of token: an opcode outside the frames, its argument, a frame's contents, the
#: data of an opcode with a size (payload opcodes and short strings), a splice (that data,
#: read from a stream of its own: it takes no room in the pickle stream), the end (after STOP).
OPCODE, ARGUMENT, FRAME, DATA, SPLICE, END = "opcode", "argument", "frame", "data", "splice", "end"

_FRAME = pickle.FRAME[0]
_PROTO = pickle.PROTO[0]
#: Where the frame of a stream that is one frame starts: after PROTO, FRAME and their arguments.
_ONE_FRAME_START = 11
_STOP = pickle.STOP[0]
_PAYLOADS = frozenset(
    op[0] for op in (pickle.BINBYTES, pickle.BINBYTES8, pickle.BINUNICODE, pickle.BINUNICODE8, pickle.BYTEARRAY8)
)
#: pickletools' argument kinds whose fixed bytes count the data that follows -> their width.
COUNT_WIDTHS = {
    pickletools.TAKEN_FROM_ARGUMENT1: 1,
    pickletools.TAKEN_FROM_ARGUMENT4: 4,
    pickletools.TAKEN_FROM_ARGUMENT4U: 4,
    pickletools.TAKEN_FROM_ARGUMENT8U: 8,
}


def _arguments() -> dict[int, tuple[int, bool]]:
    """Opcode -> (argument size, whether the argument counts data that follows), for every
    opcode whose argument has a size known up front (not those ending at a newline)."""
    table = {}
    for op in pickletools.opcodes:
        n = 0 if op.arg is None else op.arg.n
        if n >= 0:
            table[ord(op.code)] = (n, False)
        elif n in COUNT_WIDTHS:
            table[ord(op.code)] = (COUNT_WIDTHS[n], True)
    table[_FRAME] = (8, True)
    return table


_ARGUMENTS = _arguments()
#: An opcode with its argument is at most 9 bytes: the unpickler reads a frame, a payload or
#: data in pieces of at least this many bytes (but the last), so never as opcodes.
_MIN_BULK_READ = 9


class Layout:
    """The parser: walks a record's pickle stream a token at a time, outside its frames.

    Args:
        protocol: the record's pickle protocol.
        splices: ``(offset, size)`` of each splice, in stream order.
        nbytes: the size of the pickle stream (without its splices).

    Attributes:
        kind: the current token: OPCODE, ARGUMENT, FRAME, DATA, SPLICE or END.
        start: its offset in the pickle stream.
        size: its size in bytes.

    Raises:
        CorruptError: for splices in a pickle of protocol 0-3.
    """

    def __init__(self, protocol: int, splices: Iterable[tuple[int, int]], nbytes: int) -> None:
        self._splices = deque(splices)
        if self._splices and protocol < 4:
            raise CorruptError(f"the record splices payloads into a protocol {protocol} pickle (only 4 and up)")
        self._nbytes = nbytes
        self._opcode = 0
        self._set(OPCODE, 0, 1)

    def advance(self, data: Any = b"") -> None:
        """Move to the next token. ``data`` holds the current one's bytes when it is an opcode
        or an argument (their values say what comes next).

        Raises:
            CorruptError: for an opcode that cannot stand outside a frame, a token that runs
                past the end of the stream, or a splice that lies anywhere but at the data of
                a payload opcode of its size.
        """
        end = self.start if self.kind == SPLICE else self.start + self.size
        if self.kind == OPCODE:
            self._opcode = data[0]
            if self._opcode == _STOP:
                self._set(END, end, 0)
                return
            if self._opcode not in _ARGUMENTS:
                raise CorruptError(
                    f"opcode {bytes(data)!r} at offset {self.start} of the pickle stream cannot stand outside a frame"
                )
            width = _ARGUMENTS[self._opcode][0]
            if width:
                self._set(ARGUMENT, end, width)
            else:
                self._set(OPCODE, end, 1)
        elif self.kind == ARGUMENT and _ARGUMENTS[self._opcode][1]:
            size = int.from_bytes(data, "little")
            if self._opcode in _PAYLOADS and self._splices and self._splices[0][0] == end:
                offset, nbytes = self._splices.popleft()
                if nbytes != size:
                    raise CorruptError(
                        f"the splice at offset {offset} of the pickle stream holds {nbytes} bytes, "
                        f"its opcode at offset {self.start - 1} declares {size}"
                    )
                self._set(SPLICE, end, size)
            else:
                self._set(FRAME if self._opcode == _FRAME else DATA, end, size)
        else:
            self._set(OPCODE, end, 1)

    def describe(self) -> str:
        """Name the current token, for error messages."""
        return {
            OPCODE: "an opcode",
            ARGUMENT: "an opcode's argument",
            FRAME: "a frame",
            DATA: "an opcode's data",
            SPLICE: "a splice",
        }.get(self.kind, "nothing (the pickle stopped)")

    def _set(self, kind: str, start: int, size: int) -> None:
        if kind == OPCODE and start == self._nbytes:
            kind, size = END, 0  # the stream ends between two opcodes
        self.kind, self.start, self.size = kind, start, size
        if kind != SPLICE and start + size > self._nbytes:
            raise CorruptError(
                f"the pickle stream ends at offset {self._nbytes}, inside {self.describe()} "
                f"of {size} bytes at offset {start}"
            )
        if kind == END:
            self._check_splices(float("inf"))
        elif kind != SPLICE:
            self._check_splices(start + size)

    def _check_splices(self, end: float) -> None:
        """Refuse a splice whose offset is before ``end`` (the current token's end): not at a
        payload's data (those were taken off already)."""
        if self._splices and self._splices[0][0] < end:
            offset = self._splices[0][0]
            where = "after the pickle's end" if self.kind == END else f"in {self.describe()} at offset {self.start}"
            raise CorruptError(
                f"the record splices a payload in at offset {offset} of the pickle stream, {where}: "
                "a splice must follow the size of a payload opcode outside the frames"
            )


def splices_of(header: Header) -> list[tuple[int, int]]:
    """Return the ``(offset, size)`` of every splice of a record, in stream order."""
    return [(s.splice, s.nbytes) for s in header.streams[1:] if s.splice is not None]


def tokens(data: Any, protocol: int, splices: Iterable[tuple[int, int]]) -> Iterator[tuple[str, int, int]]:
    """Yield ``(kind, start, size)`` for every token of a whole pickle stream (of a protocol
    4 or later record; protocol 0-3 ones have none, only their splices are refused).

    Raises:
        CorruptError: as `Layout` does.
    """
    view = memoryview(data).cast("B")
    layout = Layout(protocol, splices, len(view))
    if protocol < 4:
        return
    while layout.kind != END:
        yield layout.kind, layout.start, layout.size
        small = layout.kind in (OPCODE, ARGUMENT)
        layout.advance(view[layout.start : layout.start + layout.size] if small else b"")


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
            if self._layout.kind == END:  # past the pickle's end: no size is checked
                return b""
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
        self._served += count
        if self._served == layout.size:
            self._served = 0
            self._pending = memoryview(b"")
            layout.advance(out[:count] if layout.kind in (OPCODE, ARGUMENT) else b"")
        return count

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
        return io.BytesIO(whole) if _one_frame(whole) else PickleFile(iter([whole]), reader)
    Layout(header.protocol, splices_of(header), header.streams[0].nbytes)
    file = io.BytesIO()
    # copied in, never decompressed into the BytesIO's own buffer: a failed read would free
    # that buffer while pool threads may still write to views of it
    for piece in reader.read_pieces() if header.streams[0].raw else reader.read_chunks():
        file.write(piece)
    file.seek(0)
    return file


def _one_frame(data: memoryview) -> bool:
    """True for a pickle stream that is PROTO, then one frame to its very end. The layout of
    such a stream is the frame: the unpickler can read nothing outside it, so it may read it
    from memory as it likes."""
    return (
        len(data) > _ONE_FRAME_START
        and data[0] == _PROTO
        and data[2] == _FRAME
        and int.from_bytes(data[3:_ONE_FRAME_START], "little") == len(data) - _ONE_FRAME_START
    )
