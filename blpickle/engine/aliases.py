"""Arrays that share memory, as one pickling meets them: which array already reduced holds
the memory of the one met now.

The pickler places every array it reduces itself (`Aliases.place`). A contiguous array is
remembered, grouped with the others whose memory the same object owns (the end of their
chains of numpy bases); an array whose elements all lie in the memory of one remembered
before it is reduced to `blpickle.arrays.rebuild_view` of that one instead, so that the
memory is stored once and the loaded arrays share it as the dumped ones did. Arrays that
merely hold equal bytes never share. Addresses are read only once arrays of one owner
overlap, or are many: an array alone in owning its memory, the usual case, costs a dict
entry, and a few disjoint ones (a scikit-learn tree's arrays) a comparison of their bounds.
"""

from __future__ import annotations

import bisect
from typing import Any

import numpy as np

from ..arrays import rebuild_view, view_extent

__all__ = ["Aliases"]


class Aliases:
    """The contiguous arrays reduced so far in one pickle stream, by the memory they hold.

    They are kept alive until `clear`, so that no id or address of theirs is reused meanwhile.
    """

    def __init__(self) -> None:
        #: id of an owner of memory -> its arrays so far (as met, as a plain ndarray) while
        #: they are few and none overlaps another (addresses not read), then their group
        self._groups: dict[int, list[tuple[Any, np.ndarray]] | _Group] = {}

    def __bool__(self) -> bool:
        return bool(self._groups)

    def clear(self) -> None:
        """Forget every array (when the pickle stream is done, with the pickler's memo)."""
        self._groups.clear()

    def place(self, met: Any, array: np.ndarray, contiguous: bool) -> tuple[Any, tuple[Any, ...]] | None:
        """Return the reduce value of ``array`` as a view of an array reduced before it
        (``met``, as the pickler met it, is what the pickler memoized), or None when its
        memory lies in none of theirs with the same writability; then remember it if it is
        ``contiguous``. ``array`` is a numpy array with elements (``met`` itself, or its
        plain ndarray view)."""
        owner = met
        while isinstance(owner, np.ndarray) and owner.base is not None:
            owner = owner.base
        group = self._groups.get(id(owner))
        if group is None:
            if contiguous:
                self._groups[id(owner)] = [(met, array)]
            return None
        if isinstance(group, list):
            if len(group) < _FEW and not any(np.may_share_memory(array, other) for _, other in group):
                if contiguous:
                    group.append((met, array))
                return None
            group = self._groups[id(owner)] = _Group(group)
        start, stop = _span(array)
        found = group.find(start, stop)
        if found is None:
            if contiguous:
                group.add(met, start, stop)
            return None
        base, base_start = found
        if base is met or base.flags.writeable != array.flags.writeable:
            return None  # the same object unmemoized (a "fast" pickler), or a read-only view
        offset = array.ctypes.data - base_start
        return rebuild_view, (base, offset, array.dtype, array.shape, array.strides)


class _Group:
    """The contiguous arrays remembered whose memory one object owns, by address: their
    spans sorted by start, none inside another (so that ends are sorted too)."""

    __slots__ = ("_spans", "_starts")

    def __init__(self, disjoint: list[tuple[Any, np.ndarray]]) -> None:
        self._starts: list[int] = []
        self._spans: list[tuple[int, int, Any]] = []
        for met, array in disjoint:
            self.add(met, *_span(array))

    def find(self, start: int, stop: int) -> tuple[Any, int] | None:
        """Return the array whose memory holds bytes ``start:stop`` and where its memory
        starts, or None."""
        i = bisect.bisect_right(self._starts, start) - 1
        if i >= 0 and stop <= self._spans[i][1]:
            return self._spans[i][2], self._spans[i][0]
        return None

    def add(self, met: Any, start: int, stop: int) -> None:
        """Remember a contiguous array holding bytes ``start:stop``, in none of the others:
        those inside it are forgotten (what views them also views it)."""
        i = bisect.bisect_left(self._starts, start)
        end = i
        while end < len(self._spans) and self._spans[end][1] <= stop:
            end += 1
        self._starts[i:end] = [start]
        self._spans[i:end] = [(start, stop, met)]


#: The most arrays of one owner checked pairwise for overlap (`numpy.may_share_memory`, which
#: compares bounds), before their addresses are read and sorted.
_FEW = 8


def _span(array: np.ndarray) -> tuple[int, int]:
    """The addresses ``(start, stop)`` of the bytes an array with elements spans."""
    # ``ctypes.data``: ``__array_interface__`` builds a description of the dtype first, which
    # takes several microseconds for a structured one (a scikit-learn tree's nodes)
    return view_extent(array.ctypes.data, array.itemsize, array.shape, array.strides)
