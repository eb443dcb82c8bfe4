"""The pickle stream of a restricted load, read a frame at a time (held in memory) and the rest
from the file through a `FileSource`, which never allocates a size the pickle declares before
the data is there."""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any

from ..errors import CorruptError
from ..io.sources import FileSource
from .budget import Budget

__all__ = ["READS_PER_BYTE", "READS_SLACK", "PickleInput"]

#: The longest text line (protocol 0 arguments) read.
_MAX_LINE = 1 << 20
#: Reads outside frames of a decompressed pickle stream of protocol 4 or later, each checked
#: against the stream's layout, are at most ``READS_SLACK + READS_PER_BYTE * n``, n the bytes
#: of input read so far: a pickle writes its opcodes in frames, but a forged one may write
#: millions outside them.
READS_SLACK = 1 << 14
READS_PER_BYTE = 16


class PickleInput:
    """Reads the pickle stream: a frame at a time (held in memory), the rest from the file."""

    def __init__(self, file: Any, stored: Callable[[], int] | None = None) -> None:
        self._file = file
        self._source = FileSource(file)
        # a stream held in memory (protocols 0-3) is read outside frames as it is written
        held = isinstance(file, io.BytesIO)
        self._reads = Budget(
            "reads over {} times outside its frames", READS_SLACK, READS_PER_BYTE, None if held else stored
        )
        self._frame = b""
        self._pos = 0  # in the frame
        self._end = 0  # the frame's size

    @property
    def consumed(self) -> int:
        """The bytes of the stream read so far (the current frame's included)."""
        return self._source.pos

    @property
    def offset(self) -> int:
        """The offset in the stream of the current frame's start, or of the file's position."""
        return self._source.pos - len(self._frame)

    def read(self, n: int) -> bytes:
        pos = self._pos
        end = pos + n
        if end <= self._end:
            self._pos = end
            return self._frame[pos:end]
        frame = self._frame
        if pos < len(frame):
            raise CorruptError(
                f"the pickle reads {n} bytes at offset {self.offset + pos}, past the end of its frame "
                f"at offset {self.offset + len(frame)}"
            )
        return self._read_file(n)

    def readline(self) -> bytes:
        frame, pos = self._frame, self._pos
        if pos < len(frame):
            end = frame.find(b"\n", pos, pos + _MAX_LINE)
            if end < 0:
                raise CorruptError(f"the pickle's line at offset {self.offset + pos} has no end within its frame")
            self._pos = end + 1
            return frame[pos : end + 1]
        self._leave_frame()
        self._reads.spend()
        line = self._file.readline(_MAX_LINE)
        self._source.pos += len(line)  # read past the source: it counts every byte of the stream
        if not line.endswith(b"\n"):
            raise CorruptError(f"the pickle's line at offset {self.offset - len(line)} has no end")
        return line

    def start_frame(self, n: int) -> None:
        """Read a frame of ``n`` bytes, from which the next opcodes come."""
        if self._pos < len(self._frame):
            raise CorruptError(f"a frame starts at offset {self.offset + self._pos}, inside the previous frame")
        self._frame = self._read_file(n)
        self._pos, self._end = 0, n

    def _leave_frame(self) -> None:
        self._frame, self._pos, self._end = b"", 0, 0

    def _read_file(self, n: int) -> bytes:
        """Read ``n`` bytes from the file.

        Raises:
            TruncatedError: when the file ends first.
        """
        self._leave_frame()
        self._reads.spend()
        return bytes(self._source.read(n, "the pickle stream"))
