"""What a restricted load may spend on a decompressed pickle stream: work bounded by the
input read, not by what it decompresses to."""

from __future__ import annotations

from collections.abc import Callable

from ..errors import LimitError

__all__ = ["Budget"]

#: Units spent between two looks at the input read so far.
_STEP = 4096


class Budget:
    """At most ``slack + per_byte * n`` units of something (opcodes, objects, reads), n the
    bytes of input read so far, as ``stored`` gives them; no limit without ``stored`` (a
    stream read as it is stored pays a byte of input for each unit).

    Args:
        what: what is counted, with a ``{}`` for the limit (``"makes over {} objects"``).
    """

    def __init__(self, what: str, slack: int, per_byte: int, stored: Callable[[], int] | None) -> None:
        self._what, self._slack, self._per_byte, self._stored = what, slack, per_byte, stored
        self._spent = 0
        self._look = _STEP

    def spend(self, units: int = 1) -> None:
        """Count ``units``.

        Raises:
            LimitError: past the limit that the input read so far allows.
        """
        self._spent += units
        if self._spent < self._look or self._stored is None:
            return
        self._look = self._spent + _STEP
        read = self._stored()
        limit = self._slack + self._per_byte * read
        if self._spent > limit:
            raise LimitError(
                f"the pickle {self._what.format(limit)} from {read} bytes of input: a restricted load allows "
                f"{self._slack} + {self._per_byte} per byte read (a decompression bomb?)"
            )
