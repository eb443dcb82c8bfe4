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

import pickle
import pickletools
from collections import deque
from collections.abc import Iterable, Iterator
from typing import Any

from ..errors import CorruptError
from . import Header

__all__ = [
    "ARGUMENT",
    "DATA",
    "END",
    "FRAME",
    "OPCODE",
    "SPLICE",
    "Layout",
    "one_frame",
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


def one_frame(data: memoryview) -> bool:
    """True for a pickle stream that is PROTO, then one frame to its very end. The layout of
    such a stream is the frame: the unpickler can read nothing outside it, so it may read it
    from memory as it likes."""
    return (
        len(data) > _ONE_FRAME_START
        and data[0] == _PROTO
        and data[2] == _FRAME
        and int.from_bytes(data[3:_ONE_FRAME_START], "little") == len(data) - _ONE_FRAME_START
    )
