"""A record's array read on demand: slicing its leading axis reads and decompresses only the
chunks that hold the rows asked for (writers cut C-order arrays into chunks of whole rows,
where a row fits in a chunk)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from .tensors import stored_array

if TYPE_CHECKING:
    from .record import ArrayInfo, Record

__all__ = ["LazyArray"]

#: Bytes of rows read at a time when iterating an uncompressed array (stored in one piece).
RAW_BLOCK = 4 << 20


class LazyArray:
    """A read-only array-like over one array of an open `blpickle.Record`.

    Indexing returns numpy arrays (for an array dumped as a torch tensor, a jax array or a
    cupy array, that type, as `Record.array` returns it: see ``tensor``). An integer, a
    slice (any step) or a tuple starting with one reads only the rows of the leading axis it
    spans, in a C-order array; any other index (a list, a mask, an array of indices), and any
    index of a Fortran-order array, reads the whole array first. Iterating yields the rows of
    the leading axis, as iterating the numpy array does, reading the rows of one chunk at a
    time (a Fortran-order array is read whole first). ``numpy.asarray(lazy)`` reads it
    whole, its chunks decompressed in parallel, as a numpy array of ``dtype``. Every read
    checks the checksums of the chunks it decompresses (a part of an uncompressed buffer is
    read unchecked).

    Attributes:
        shape: the array's shape.
        dtype: the array's numpy dtype (a tensor's as stored: a torch bfloat16 tensor's is
            uint16).
        tensor: ``"torch.<dtype>"``, ``"jax.<dtype>"`` or ``"cupy.<dtype>"`` for an array
            dumped as a tensor (what indexing returns), else None.
        ndim: the array's number of dimensions.
        size: the array's number of elements.
        nbytes: the array's size in bytes.
        name: its name in the record, or None.
    """

    def __init__(self, record: Record, info: ArrayInfo) -> None:
        if info.dtype is None or info.shape is None:
            raise TypeError(f"buffer {info.position} of the record is not a described numpy array: read it as bytes")
        self._record = record
        self._info = info
        self.dtype: np.dtype = info.dtype
        self.shape: tuple[int, ...] = info.shape
        self.name = info.name
        self.tensor = info.tensor
        self.ndim = len(self.shape)
        self.size = math.prod(self.shape)
        self.nbytes = info.nbytes

    def __repr__(self) -> str:
        label = f"{self.name!r}, " if self.name else ""
        return f"<blpickle.LazyArray {label}shape={self.shape}, dtype={self.dtype}>"

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d array")
        return self.shape[0]

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        data = self._record.read_bytes(self._info.position, 0, self.nbytes)
        array = data.view(self.dtype).reshape(self.shape, order="F" if self._info.order == "F" else "C")
        return array if dtype is None else array.astype(dtype, copy=False)

    def __getitem__(self, key: Any) -> Any:
        return self._stored(self._select(key))

    def __iter__(self) -> Iterator[Any]:
        if not self.shape:
            raise TypeError("iteration over a 0-d array")
        rows = iter(np.asarray(self)) if self._info.order == "F" else self._blocks()
        return rows if self.tensor is None else map(self._stored, rows)

    def _select(self, key: Any) -> np.ndarray:
        """``key`` of the array, read from the chunks that hold it (see the class)."""
        first, rest = (key[0], key[1:]) if isinstance(key, tuple) and key else (key, ())
        if self.ndim == 0 or self._info.order == "F" or not _basic(first):
            return np.asarray(self)[key]
        rows = range(self.shape[0])[first]  # IndexError for a row out of range, as numpy
        if isinstance(rows, int):
            return self._rows(rows, rows + 1)[_index(0, rest)]
        if not rows:
            return self._rows(0, 0)[_index(slice(None), rest)]
        low, high = min(rows[0], rows[-1]), max(rows[0], rows[-1]) + 1
        within = slice(0, high - low, rows.step) if rows.step > 0 else slice(high - 1 - low, None, rows.step)
        return self._rows(low, high)[_index(within, rest)]

    def _stored(self, array: Any) -> Any:
        """``array`` (read from this array) as the type the array was dumped as."""
        return array if self.tensor is None else stored_array(self.tensor, np.asarray(array))

    @property
    def _row_bytes(self) -> int:
        """The bytes of one row of the leading axis (0 when it has none)."""
        return self.nbytes // self.shape[0] if self.shape[0] else 0

    def _blocks(self) -> Iterator[Any]:
        """Yield the rows of a C-order array, read the rows of one chunk at a time (at least
        one row; `RAW_BLOCK` bytes of rows for an uncompressed array)."""
        block = self._info.chunk_size if self._info.codec is not None else RAW_BLOCK
        step = max(block // self._row_bytes, 1) if self._row_bytes else max(self.shape[0], 1)
        for start in range(0, self.shape[0], step):
            yield from self._rows(start, min(start + step, self.shape[0]))

    def _rows(self, start: int, stop: int) -> np.ndarray:
        """Read rows ``start:stop`` of the leading axis (only the chunks holding them)."""
        data = self._record.read_bytes(self._info.position, start * self._row_bytes, stop * self._row_bytes)
        return data.view(self.dtype).reshape((stop - start, *self.shape[1:]))


def _basic(index: Any) -> bool:
    """True for an index of the leading axis that picks a range of rows."""
    return isinstance(index, (int, np.integer, slice)) and not isinstance(index, bool)


def _index(first: Any, rest: tuple[Any, ...]) -> tuple[Any, ...]:
    """The index ``first, *rest`` (a tuple display mypy reads on Python 3.10 too)."""
    return (first, *rest)
