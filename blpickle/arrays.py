"""How numpy arrays travel out of band.

The pickle stream of a blpickle record rebuilds every out-of-band array with
:func:`rebuild_ndarray`: its import path ``blpickle.arrays.rebuild_ndarray`` is part of the
file format and never changes.
"""

from __future__ import annotations

import math
from pickle import PickleBuffer
from typing import Any

import numpy as np

from .errors import CorruptError

__all__ = ["rebuild_ndarray", "reduce_ndarray"]


def rebuild_ndarray(buffer: Any, dtype: np.dtype, shape: tuple[int, ...], order: str) -> np.ndarray:
    """Return the array of ``dtype``, ``shape`` and ``order`` ("C" or "F") viewing ``buffer``.

    Raises:
        CorruptError: when the arguments are not a dtype, a shape and an order, or the buffer
            does not hold exactly ``prod(shape) * dtype.itemsize`` bytes.
    """
    if not isinstance(dtype, np.dtype) or dtype.hasobject or order not in ("C", "F") or type(shape) is not tuple:
        raise CorruptError(f"cannot rebuild an array of dtype {dtype!r}, shape {shape!r} in order {order!r}")
    count = math.prod(shape)
    nbytes = memoryview(buffer).nbytes
    if nbytes != count * dtype.itemsize or count < 0:
        raise CorruptError(
            f"an array of shape {shape} and dtype {dtype} needs {count * dtype.itemsize} bytes, "
            f"its buffer holds {nbytes}"
        )
    return np.frombuffer(buffer, dtype=dtype).reshape(shape, order=order)


def reduce_ndarray(array: np.ndarray, buffer: PickleBuffer | bytearray) -> tuple[Any, tuple[Any, ...]]:
    """Return the reduce value that rebuilds ``array`` from ``buffer``: an out-of-band
    placeholder, or a copy of the data in band (``array.tobytes(order="A")``).

    Any strides are accepted: the data is stored in C order unless the array is Fortran
    contiguous (and not C contiguous).
    """
    order = "F" if array.flags.fnc else "C"  # Fortran and not C contiguous
    return rebuild_ndarray, (buffer, array.dtype, array.shape, order)
