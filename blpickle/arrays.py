"""How numpy arrays travel out of band.

The pickle stream of a blpickle record rebuilds every array it stores out of band with
`rebuild_ndarray` (records before format 1.4: every array), and an array that views the
memory of one stored before it with `rebuild_view`: their import paths
(``blpickle.arrays.rebuild_ndarray``, ``blpickle.arrays.rebuild_view``) are part of the file
format and never change. Arrays under 64 KiB are stored as numpy reduces them
(`reduce_in_band`).
"""

from __future__ import annotations

import functools
import math
import pickle
from pickle import PickleBuffer
from typing import Any

import numpy as np

from .errors import CorruptError

__all__ = ["pickle_keeps_dtype", "rebuild_ndarray", "rebuild_view", "reduce_in_band", "reduce_ndarray"]


def rebuild_ndarray(buffer: Any, dtype: np.dtype, shape: tuple[int, ...], order: str) -> np.ndarray:
    """Return the array of ``dtype``, ``shape`` and ``order`` ("C" or "F") viewing ``buffer``.

    Raises:
        CorruptError: when the arguments are not a dtype, a shape and an order, or the buffer
            does not hold exactly ``prod(shape) * dtype.itemsize`` bytes.
    """
    # numpy checks the sizes (and refuses object dtypes) by itself, so the usual case runs no
    # Python-level checks: it is paid once per array, and records may hold many small ones.
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


def rebuild_view(
    base: Any, offset: int, dtype: np.dtype, shape: tuple[int, ...], strides: tuple[int, ...]
) -> np.ndarray:
    """Return the array of ``dtype``, ``shape`` and ``strides`` (in bytes) whose first element
    lies ``offset`` bytes into the memory of ``base``, a contiguous array: a view sharing that
    memory, writable if ``base`` is.

    Raises:
        CorruptError: when ``base`` is not a contiguous array without objects, the other
            arguments are not an offset, a dtype without objects, a shape and as many strides,
            or any element would lie outside the memory of ``base``.
    """
    if not (
        isinstance(base, np.ndarray)
        and (base.flags.c_contiguous or base.flags.f_contiguous)
        and not base.dtype.hasobject
        and isinstance(dtype, np.dtype)
        and not dtype.hasobject
        and dtype.itemsize
        and _is_ints(shape, 0)
        and _is_ints(strides, None)
        and len(strides) == len(shape)
        and type(offset) is int
    ):
        raise CorruptError(
            f"cannot rebuild a view of dtype {dtype!r:.80}, shape {shape!r:.80} and strides {strides!r:.80} "
            f"at offset {offset!r:.40} of a {type(base).__name__}"
        )
    low, high = view_extent(offset, dtype.itemsize, shape, strides)
    if low < 0 or high > base.nbytes:
        raise CorruptError(
            f"a view of shape {shape} and strides {strides} at offset {offset} spans bytes {low}:{high}, "
            f"outside the {base.nbytes} bytes of its base"
        )
    memory = base.reshape(-1, order="A").view(np.uint8)  # the base's bytes, in memory order
    try:
        return np.ndarray(shape, dtype, buffer=memory, offset=offset, strides=strides)
    except (ValueError, OverflowError) as exc:  # a shape too large for an array, for instance
        raise CorruptError(f"numpy refuses a view of shape {shape} and strides {strides}: {exc}") from None


def view_extent(offset: int, itemsize: int, shape: tuple[int, ...], strides: tuple[int, ...]) -> tuple[int, int]:
    """Return the bytes ``(start, stop)`` spanned by the elements of an array whose first
    element is at ``offset`` (``(offset, offset)`` when it has none)."""
    if 0 in shape:
        return offset, offset
    low = high = offset
    for n, stride in zip(shape, strides, strict=True):
        if stride < 0:
            low += (n - 1) * stride
        else:
            high += (n - 1) * stride
    return low, high + itemsize


def _is_ints(values: Any, least: int | None) -> bool:
    """Whether ``values`` is a tuple of ints, each at least ``least`` (if given)."""
    return type(values) is tuple and all(type(n) is int and (least is None or n >= least) for n in values)


def reduce_ndarray(array: np.ndarray, buffer: PickleBuffer | bytes | bytearray) -> tuple[Any, tuple[Any, ...]]:
    """Return the reduce value that rebuilds ``array`` from ``buffer``: an out-of-band
    placeholder, or a copy of the data in band (``array.tobytes(order="A")``).

    Any strides are accepted: the data is stored in C order unless the array is Fortran
    contiguous (and not C contiguous).
    """
    order = "F" if array.flags.fnc else "C"  # Fortran and not C contiguous
    return rebuild_ndarray, (buffer, array.dtype, array.shape, order)


#: numpy's own function rebuilding a contiguous array at protocol 5
#: (``numpy._core.numeric._frombuffer``), as its public reduction names it.
_FROMBUFFER = np.zeros(1).__reduce_ex__(5)[0]


def reduce_in_band(array: np.ndarray, buffer: PickleBuffer | None = None) -> Any:
    """Return numpy's own reduce value of ``array`` at protocol 5 with its data in band, as
    ``pickle`` stores it: `_FROMBUFFER` of a copy of its data, a ``bytearray`` (``bytes`` if
    the array is contiguous and read-only), without the `pickle.PickleBuffer` that numpy's
    ``__reduce_ex__`` makes for a ``buffer_callback``; or, given ``buffer`` (a PickleBuffer of
    the contiguous ``array``, which the pickler's ``buffer_callback`` keeps in band), of that
    buffer, written as the same bytes with no copy. For the dtypes numpy reduces otherwise
    (datetime64, timedelta64), its ``__reduce_ex__``. It loads as ``pickle`` gives it back (a
    strided array as a new C-ordered one)."""
    if not reduced_from_buffer(array.dtype):
        return array.__reduce_ex__(5)
    if buffer is not None:
        return _FROMBUFFER, reduce_ndarray(array, buffer)[1]
    flags = array.flags
    data: bytes | bytearray = array.tobytes(order="A")  # "A": the order reduce_ndarray names
    if flags.writeable or not (flags.c_contiguous or flags.f_contiguous):
        data = bytearray(data)
    return _FROMBUFFER, reduce_ndarray(array, data)[1]


@functools.lru_cache(maxsize=512)
def reduced_from_buffer(dtype: np.dtype) -> bool:
    """Whether numpy reduces contiguous arrays of ``dtype`` to `_FROMBUFFER` at protocol 5."""
    return bool(np.zeros(1, dtype).__reduce_ex__(5)[0] is _FROMBUFFER)


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
