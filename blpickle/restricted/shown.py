"""What an error message of a restricted load shows of a value the pickle made: a short text
built in time and memory bounded by its width, never by the value's own ``repr`` (a list
naming itself twice at each of 40 levels, a few hundred bytes, has a repr of 2^40 items; an
object without its state may crash in its ``repr``)."""

from __future__ import annotations

import itertools
import reprlib
from collections.abc import Iterable
from typing import Any

import numpy as np

__all__ = ["shown"]

#: Types whose repr the text shows, cut short: builtin scalars and containers, numpy dtypes.
_SHOWN = frozenset({type(None), bool, int, float, complex, str, bytes, bytearray, tuple, list, dict, set, frozenset})
#: Ints of more bits are shown by their size (the repr of a huge int takes quadratic time).
_INT_BITS = 256


class _Short(reprlib.Repr):
    """`reprlib.Repr` limited to a few items and levels, showing other objects by type."""

    def __init__(self) -> None:
        super().__init__()
        self.maxlevel = 3
        self.maxtuple = self.maxlist = self.maxdict = self.maxset = self.maxfrozenset = 6
        self.maxstring = self.maxother = self.maxlong = 60

    def repr1(self, x: Any, level: int) -> str:
        kind = type(x)
        if kind is int and x.bit_length() > _INT_BITS:
            return f"<an int of {x.bit_length()} bits>"
        if kind in (bytes, bytearray):
            return repr(x[: self.maxstring]) + ("..." if len(x) > self.maxstring else "")
        if kind in _SHOWN:
            return super().repr1(x, level)
        if isinstance(x, np.dtype):
            return repr(str(x)[: self.maxother])
        if isinstance(x, type):
            return f"<class {_name(x)}>"
        return f"<a {_name(kind)}>"

    def repr_dict(self, x: dict[Any, Any], level: int) -> str:
        pairs = (f"{self.repr1(key, level - 1)}: {self.repr1(value, level - 1)}" for key, value in x.items())
        return self._items("{", pairs, len(x), self.maxdict, "}", level)

    def repr_set(self, x: set[Any], level: int) -> str:
        return self._items("{", (self.repr1(item, level - 1) for item in x), len(x), self.maxset, "}", level)

    def repr_frozenset(self, x: frozenset[Any], level: int) -> str:
        items = (self.repr1(item, level - 1) for item in x)
        return self._items("frozenset({", items, len(x), self.maxfrozenset, "})", level)

    @staticmethod
    def _items(left: str, items: Iterable[str], count: int, most: int, right: str, level: int) -> str:
        """The first ``most`` of ``items`` (of ``count``), unsorted: sorting keys runs their code."""
        if not count:
            return left + right
        if level <= 0:
            return left + "..." + right
        return left + ", ".join(itertools.islice(items, most)) + (", ..." if count > most else "") + right


def _name(cls: type) -> str:
    module, name = getattr(cls, "__module__", None), getattr(cls, "__qualname__", None)
    return f"{module}.{name}" if isinstance(module, str) and isinstance(name, str) else "class"


_SHORT = _Short()


def shown(value: Any, width: int = 80) -> str:
    """Return a text of at most about ``width`` characters that shows ``value``."""
    text = _SHORT.repr(value)
    return text if len(text) <= width else text[: width - 3] + "..."
