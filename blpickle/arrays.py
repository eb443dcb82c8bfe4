"""How numpy arrays travel out of band.

The pickle stream of a blpickle record rebuilds every out-of-band array with
`rebuild_ndarray`: its import path ``blpickle.arrays.rebuild_ndarray`` is part of the
file format and never changes.
"""

from __future__ import annotations

import functools
import math
import pickle
from pickle import PickleBuffer
from typing import Any

import numpy as np

from .errors import CorruptError

__all__ = ["pickle_keeps_dtype", "rebuild_ndarray", "reduce_ndarray"]


def rebuild_ndarray(buffer: Any, dtype: np.dtype, shape: tuple[int, ...], order: str) -> np.ndarray:
    """Return the array of ``dtype``, ``shape`` and ``order`` ("C" or "F") viewing ``buffer``.

    Raises:
        CorruptError: when the arguments are not a dtype, a shape and an order, or the buffer
            does not hold exactly ``prod(shape) * dtype.itemsize`` bytes.
    """
    # numpy checks the sizes (and refuses object dtypes) by itself, so the usual case runs no
    # Python-level checks: a forest of 400 small arrays loads ~10% faster.
    if isinstance(dtype, np.dtype) and order in ("C", "F"):
        try:
            array = np.frombuffer(buffer, dtype=dtype).reshape(shape, order="F" if order == "F" else "C")
        except (TypeError, ValueError):
            pass
        else:
            if array.shape == shape:  # reshape would also take -1 for "whatever is left"
                return array
    raise CorruptError(_mismatch(buffer, dtype, shape, order))


def _mismatch(buffer: Any, dtype: Any, shape: Any, order: Any) -> str:
    """Say why `rebuild_ndarray` refused its arguments."""
    valid_shape = type(shape) is tuple and all(type(n) is int and n >= 0 for n in shape)
    valid_dtype = isinstance(dtype, np.dtype) and not dtype.hasobject and dtype.itemsize
    if not valid_dtype or order not in ("C", "F") or not valid_shape:
        return f"cannot rebuild an array of dtype {dtype!r}, shape {shape!r} in order {order!r}"
    try:
        nbytes = memoryview(buffer).nbytes
    except TypeError:
        return f"an array's buffer must be bytes-like, not {type(buffer).__name__}"
    needed = math.prod(shape) * dtype.itemsize
    return f"an array of shape {shape} and dtype {dtype} needs {needed} bytes, its buffer holds {nbytes}"


def reduce_ndarray(array: np.ndarray, buffer: PickleBuffer | bytes | bytearray) -> tuple[Any, tuple[Any, ...]]:
    """Return the reduce value that rebuilds ``array`` from ``buffer``: an out-of-band
    placeholder, or a copy of the data in band (``array.tobytes(order="A")``).

    Any strides are accepted: the data is stored in C order unless the array is Fortran
    contiguous (and not C contiguous).
    """
    order = "F" if array.flags.fnc else "C"  # Fortran and not C contiguous
    return rebuild_ndarray, (buffer, array.dtype, array.shape, order)


#: The C pickle module's own functions, kept even where ``pickle.dumps``/``loads`` are swapped
#: for blpickle's (``import blpickle as pickle`` done by monkeypatching, as the peer suites do).
_plain_dumps, _plain_loads = pickle.dumps, pickle.loads


@functools.lru_cache(maxsize=512)
def pickle_keeps_dtype(dtype: np.dtype, contiguous: bool) -> bool:
    """Return whether ``pickle`` gives arrays of ``dtype`` back with that very dtype (byte
    order included), for contiguous arrays or strided ones. numpy's own reduce decides: it
    gives byte-swapped datetime64 and timedelta64 arrays back in native byte order, and
    byte-swapped strided arrays of most dtypes, for instance.
    """
    sample = np.zeros(1, dtype) if contiguous else np.zeros(3, dtype)[::2]
    loaded = _plain_loads(_plain_dumps(sample, protocol=5)).dtype
    return loaded == dtype and loaded.descr == dtype.descr
