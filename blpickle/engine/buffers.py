"""Out-of-band payloads: the memory of one buffer, cut into chunks without copying it whole,
as records store it (`blpickle.engine.writer`) and processes send it
(`blpickle.integrations.transport`)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pickle import PickleBuffer
from typing import Any

import numpy as np

__all__ = ["Payload", "shuffle_typesize", "spread_sample"]

#: Blosc2's largest typesize.
_MAX_TYPESIZE = 255


def shuffle_typesize(itemsize: int, dtype: np.dtype | None = None) -> int:
    """Return the element size the shuffle filter should use for this data.

    Unicode arrays shuffle by code point (4 bytes); elements over Blosc2's limit of 255 bytes
    (wide structured dtypes) use the largest power of two up to 8 that divides them.
    """
    if dtype is not None and dtype.kind == "U":
        return 4
    if itemsize <= _MAX_TYPESIZE:
        return max(itemsize, 1)
    return math.gcd(itemsize, 8)


class Payload:
    """The bytes of one out-of-band buffer, contiguous or a strided numpy view.

    Attributes:
        nbytes: size of the data in bytes (C order for strided views).
        itemsize: element size for the shuffle filter.
        dtype, shape, order: the numpy array it holds, if it is one (recorded in the header;
            order "C" or "F": how its bytes are laid out).
        name: the array's path in the pickled object, if known (recorded in the header).
        tensor: the type it was dumped as when not a numpy array: ``"torch.<dtype>"``,
            ``"jax.<dtype>"`` or ``"cupy.<dtype>"`` (recorded in the header;
            `blpickle.tensor_reducers`).
    """

    def __init__(
        self,
        data: memoryview | np.ndarray,
        itemsize: int,
        dtype: np.dtype | None = None,
        shape: tuple[int, ...] | None = None,
        order: str | None = None,
    ) -> None:
        """``data``: a contiguous ``"B"`` memoryview, or a strided array (copied a chunk at a
        time when read)."""
        self._contiguous = data if isinstance(data, memoryview) else None
        self._strided = data if isinstance(data, np.ndarray) else None
        self.nbytes = data.nbytes
        self.itemsize = shuffle_typesize(itemsize, dtype)
        self.dtype = dtype
        self.shape = shape
        self.order = order
        self.name: str | None = None
        self.tensor: str | None = None

    @classmethod
    def from_array(cls, array: np.ndarray) -> Payload:
        """Wrap a numpy array (any order, any strides; not an object array) without copying."""
        if array.flags.c_contiguous or array.flags.f_contiguous:
            flat = array.reshape(-1, order="A").view(np.uint8)
            return cls(flat.data, array.itemsize, array.dtype, array.shape, "F" if array.flags.fnc else "C")
        return cls(array, array.itemsize, array.dtype, array.shape, "C")

    @classmethod
    def from_picklebuffer(cls, buffer: PickleBuffer) -> Payload:
        """Wrap a contiguous PickleBuffer; its format gives the element size."""
        return cls(buffer.raw(), memoryview(buffer).itemsize)

    def sample(self, size: int) -> Any:
        """Return about ``size`` bytes of the data for choosing how to compress it (see
        `spread_sample`; for a strided view, its first ``size`` bytes)."""
        if self._contiguous is not None:
            return spread_sample(self._contiguous, size, self.itemsize)
        return next(self.chunks(max(size - size % self.chunk_multiple, self.chunk_multiple)), b"")

    def whole(self) -> memoryview:
        """Return the data as one contiguous ``"B"`` memoryview, not copied.

        Raises:
            BufferError: for a strided view, whose bytes only `chunks` gives (copied).
        """
        if self._contiguous is None:
            raise BufferError("a strided payload has no contiguous memory: read it by chunks")
        return self._contiguous

    @property
    def chunk_multiple(self) -> int:
        """Chunks of strided data must hold whole elements."""
        return 1 if self._strided is None else self._strided.itemsize

    def chunks(self, chunk_size: int) -> Iterator[memoryview]:
        """Yield the data in pieces of ``chunk_size`` bytes (a multiple of ``chunk_multiple``).

        Contiguous data is sliced without copying; strided data is copied one piece at a time.
        """
        if self._contiguous is not None:
            for start in range(0, self.nbytes, chunk_size):
                yield self._contiguous[start : start + chunk_size]
            return
        array = self._strided
        assert array is not None  # one of the two is set
        step = chunk_size // array.itemsize
        for start in range(0, array.size, step):
            piece = np.empty(min(step, array.size - start), dtype=array.dtype)
            _copy_flat_range(array, start, start + piece.size, piece)
            yield piece.view(np.uint8).data


def spread_sample(data: Any, size: int, align: int = 1, pieces: int = 4) -> Any:
    """Return about ``size`` bytes of ``data`` to try compressors on: all of it if it is that
    small, else ``pieces`` pieces spread from its start to its end, each starting at a
    multiple of ``align`` (the element size, so that a shuffle sees whole elements)."""
    view = memoryview(data).cast("B")
    piece = max(size // pieces // align * align, align)
    if view.nbytes <= pieces * piece:
        return view
    last = (view.nbytes - piece) // align
    starts = [last * i // (pieces - 1) * align for i in range(pieces)]
    return b"".join(view[start : start + piece] for start in starts)


def _copy_flat_range(array: np.ndarray, start: int, stop: int, out: np.ndarray) -> None:
    """Copy elements ``start:stop`` of ``array`` in C order into the 1-D array ``out``.

    Works on any strides with a few block copies per dimension, never a full-size temporary.
    """
    if array.ndim <= 1:
        out[...] = array.reshape(-1)[start:stop]
        return
    inner = math.prod(array.shape[1:])
    first, first_offset = divmod(start, inner)
    last, last_offset = divmod(stop, inner)
    if first == last:
        _copy_flat_range(array[first], first_offset, last_offset, out)
        return
    pos = 0
    if first_offset:
        pos = inner - first_offset
        _copy_flat_range(array[first], first_offset, inner, out[:pos])
        first += 1
    if last > first:
        count = (last - first) * inner
        out[pos : pos + count].reshape((last - first, *array.shape[1:]))[...] = array[first:last]
        pos += count
    if last_offset:
        _copy_flat_range(array[last], 0, last_offset, out[pos:])
