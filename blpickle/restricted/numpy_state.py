"""numpy dtypes and arrays rebuilt from the states their pickles hold (what ``BUILD`` gives
``dtype.__setstate__`` and ``ndarray.__setstate__``), with numpy's public constructors from
checked parts: a restricted load never hands such a state to numpy's own ``__setstate__``,
which trusts it.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from typing import Any, Literal

import numpy as np

from ..errors import CorruptError, LimitError
from .shown import shown

__all__ = ["STRING_ITEMS", "Pending", "array_from_state", "dtype_from_state"]

#: The ``flags`` bit of a dtype state that marks an aligned struct (numpy's NPY_ALIGNED_STRUCT).
_ALIGNED_STRUCT = 0x80
_DATETIME_UNITS = frozenset({"Y", "M", "W", "D", "h", "m", "s", "ms", "us", "ns", "ps", "fs", "as", "generic"})
_NATIVE = "<" if sys.byteorder == "little" else ">"
_BYTE_ORDERS = frozenset({"<", ">", "=", "|"})
#: The most dimensions of an array or subarray shape (numpy 2's limit), each under 2**63.
_MAX_DIMS = 64


def _is_shape(shape: Any) -> bool:
    """Whether ``shape`` is a tuple of at most `_MAX_DIMS` sizes that numpy can hold: checked
    before any arithmetic on them, which would be slow on ints of millions of bits."""
    return type(shape) is tuple and len(shape) <= _MAX_DIMS and all(type(n) is int and 0 <= n < 1 << 63 for n in shape)


class Pending:
    """What ``REDUCE`` or ``NEWOBJ`` made, waiting for its state (``BUILD``): a numpy dtype
    or array (``kind`` "dtype" or "array", built from its state and ``args``) or an object
    that is broken without its state (kind "object", ``args`` holding it), unreachable
    until then."""

    __slots__ = ("args", "keys", "kind")

    def __init__(self, kind: str, args: tuple[Any, ...]) -> None:
        self.kind, self.args = kind, args
        self.keys: list[int] = []  # the memo keys that hold it


def dtype_from_state(args: tuple[Any, ...], state: Any) -> np.dtype:
    """Return the dtype that ``np.dtype(*args)`` and ``state`` (``dtype.__reduce__``) describe,
    built by numpy's constructor from checked parts.

    Raises:
        CorruptError: for a state that is not one numpy writes, or that numpy's constructor refuses.
    """
    if not isinstance(state, tuple) or len(state) not in (8, 9) or state[0] not in (3, 4):
        raise CorruptError(
            f"a numpy dtype's state must be a tuple of 8 or 9 items of version 3 or 4, not {shown(state, 120)}"
        )
    endian, subarray, names, fields, elsize, _alignment, flags = state[1:8]
    extra = state[8] if len(state) == 9 else None
    base = np.dtype(args[0])
    if endian not in _BYTE_ORDERS or type(elsize) is not int or type(flags) is not int:
        raise CorruptError(f"a numpy dtype's state has a bad byte order, item size or flags: {shown(state, 120)}")
    metadata, datetime = extra, None
    if base.kind in "mM":
        if not (isinstance(extra, tuple) and len(extra) == 2):
            raise CorruptError(f"a numpy datetime dtype's state must hold its unit, not {shown(extra, 120)}")
        metadata, datetime = extra
    if metadata is not None and type(metadata) is not dict:
        raise CorruptError(f"a numpy dtype's metadata must be a dict, not {type(metadata).__name__}")
    try:
        if names is not None:
            dtype = _structured(base, names, fields, elsize, bool(flags & _ALIGNED_STRUCT))
        elif subarray is not None:
            dtype = _subarray(subarray, elsize)
        elif datetime is not None:
            dtype = _datetime(base, datetime)
        elif base.kind in "SUV" and elsize != base.itemsize:
            unit = 4 if base.kind == "U" else 1
            if elsize < 0 or elsize % unit:
                raise CorruptError(f"a numpy {base.kind} dtype cannot have an item size of {elsize}")
            dtype = np.dtype(f"{base.kind}{elsize // unit}")
        else:
            dtype = base
        if endian in "<>=" and names is None and subarray is None:
            dtype = dtype.newbyteorder("=" if endian == _NATIVE else endian)
        if metadata is not None:
            dtype = np.dtype(dtype, metadata=metadata)
    except CorruptError:
        raise
    except Exception as exc:
        raise CorruptError(f"numpy refuses the dtype state {shown(state, 120)}: {exc}") from None
    return dtype


def _structured(base: np.dtype, names: Any, fields: Any, elsize: int, aligned: bool) -> np.dtype:
    """A structured dtype from the names and fields of a dtype state."""
    if base.kind != "V" or type(names) is not tuple or type(fields) is not dict or elsize < 0:
        raise CorruptError("a structured numpy dtype's state must hold a tuple of names and a dict of fields")
    formats, offsets, titles = [], [], []
    for name in names:
        field = fields.get(name) if isinstance(name, str) else None
        if not (type(field) is tuple and len(field) in (2, 3)):
            raise CorruptError(f"the field {shown(name)} of a numpy dtype has no (dtype, offset[, title]) entry")
        dtype, offset = field[:2]
        title = field[2] if len(field) == 3 else None
        if not isinstance(dtype, np.dtype) or type(offset) is not int or not 0 <= offset <= elsize - dtype.itemsize:
            raise CorruptError(
                f"the field {shown(name)} of a numpy dtype of {elsize} bytes must be a dtype at an offset "
                f"inside it, not {shown(field, 120)}"
            )
        if title is not None and not (isinstance(title, str) and fields.get(title) == field):
            raise CorruptError(f"the field {shown(name)} of a numpy dtype has a bad title {shown(title)}")
        formats.append(dtype)
        offsets.append(offset)
        titles.append(title)
    if len(fields) != len(names) + sum(title is not None for title in titles):
        raise CorruptError("a structured numpy dtype's state lists fields that are not in its names")
    return np.dtype(
        {"names": list(names), "formats": formats, "offsets": offsets, "titles": titles, "itemsize": elsize},
        align=aligned,
    )


def _subarray(subarray: Any, elsize: int) -> np.dtype:
    """A subarray dtype from the ``(base, shape)`` of a dtype state."""
    if not (type(subarray) is tuple and len(subarray) == 2 and isinstance(subarray[0], np.dtype)):
        raise CorruptError(f"a numpy subarray dtype's state must hold (dtype, shape), not {shown(subarray, 120)}")
    base, shape = subarray
    shape = (shape,) if type(shape) is int else shape
    if not _is_shape(shape):
        raise CorruptError(f"a numpy subarray dtype's shape must be a tuple of sizes, not {shown(shape)}")
    if base.hasobject or (not base.itemsize and math.prod(shape) > 1):  # items from no data
        raise CorruptError(f"safe mode loads no subarray dtype of objects or of empty items ({base}, shape {shape})")
    if math.prod(shape) * base.itemsize != elsize:
        raise CorruptError(f"a numpy subarray dtype of shape {shape} and base {base} cannot hold {elsize} bytes")
    return np.dtype((base, shape))


def _datetime(base: np.dtype, datetime: Any) -> np.dtype:
    """A datetime64 or timedelta64 dtype from the ``(unit, count, 1, 1)`` of a dtype state."""
    if not (type(datetime) is tuple and len(datetime) == 4 and type(datetime[0]) is bytes):
        raise CorruptError(f"a numpy datetime dtype's unit must be (unit, count, 1, 1), not {shown(datetime)}")
    unit, count = datetime[0].decode("ascii", "replace"), datetime[1]
    if unit not in _DATETIME_UNITS or type(count) is not int or not 1 <= count < 1 << 31:
        raise CorruptError(f"a numpy datetime dtype cannot have the unit {shown(datetime)}")
    return np.dtype(f"{base.char}8" if unit == "generic" else f"{base.char}8[{count}{unit}]")


def array_from_state(state: Any, copying: Callable[[int], None]) -> np.ndarray:
    """Return the array that an ndarray state ``(version, shape, dtype, fortran, data)``
    describes, built with numpy's constructors from checked parts; ``copying(nbytes)`` is
    called before each copy of the data (it raises to refuse one).

    Raises:
        CorruptError: for a state that is not one numpy writes, or whose data does not match
            its shape and dtype.
    """
    if isinstance(state, tuple) and len(state) == 5 and state[0] == 1:
        state = state[1:]
    if not (isinstance(state, tuple) and len(state) == 4):
        raise CorruptError(f"a numpy array's state must be (1, shape, dtype, fortran, data), not {shown(state, 120)}")
    shape, dtype, fortran, data = state
    if not _is_shape(shape):
        raise CorruptError(f"a numpy array's shape must be a tuple of sizes, not {shown(shape)}")
    if not isinstance(dtype, np.dtype) or type(fortran) not in (bool, int):
        raise CorruptError(f"a numpy array's state must hold a dtype and a flag, not {shown(dtype)}, {shown(fortran)}")
    order: Literal["C", "F"] = "F" if fortran else "C"
    count = math.prod(shape)
    native = dtype.newbyteorder("=") if dtype.byteorder in "<>" and not dtype.isnative else dtype
    try:
        if dtype.hasobject:
            return _object_array(shape, dtype, order, data, count, copying)
        nbytes = count * dtype.itemsize
        try:
            view = memoryview(data).cast("B")
        except TypeError:
            raise CorruptError(f"a numpy array's data must be bytes-like, not {type(data).__name__}") from None
        if view.nbytes != nbytes:
            raise CorruptError(
                f"an array of shape {shape} and dtype {dtype} needs {nbytes} bytes, its data holds {view.nbytes}"
            )
        if not nbytes:  # items of no size: numpy loops over them all the same
            copying(count)
            return np.empty(shape, native, order)
        array = np.frombuffer(view, dtype=dtype).reshape(shape, order=order)
        if native is dtype and not view.readonly:
            return array
        copying(nbytes)
        if native is not dtype:  # numpy's __setstate__ swaps the data to native byte order
            return array.astype(native, order="K")
        return array.copy(order="K")
    except (CorruptError, LimitError):
        raise
    except Exception as exc:
        raise CorruptError(f"numpy refuses the array of shape {shape} and dtype {dtype}: {exc}") from None


#: The types of the items (and of the missing value) of an array of numpy's StringDType in
#: safe mode: its conversion of each to str runs builtin code only.
STRING_ITEMS = (str, float, type(None))


def _object_array(
    shape: tuple[int, ...],
    dtype: np.dtype,
    order: Literal["C", "F"],
    items: Any,
    count: int,
    copying: Callable[[int], None],
) -> np.ndarray:
    """An array of a dtype that holds objects, from the list of its items in C order."""
    if type(items) is not list or len(items) != count:
        raise CorruptError(f"an object array of shape {shape} needs a list of {count} items")
    copying(count * dtype.itemsize)
    if dtype.kind == "T":  # numpy's StringDType copies each string into the array
        for item in items:
            if type(item) not in STRING_ITEMS:
                raise CorruptError(f"an array of {dtype} holds str, float or None items, not {shown(item)}")
            if type(item) is str:
                copying(len(item.encode("utf-8", "surrogatepass")))
    flat = np.empty(count, dtype)
    for i, item in enumerate(items):
        flat[i] = item
    array = flat.reshape(shape)
    return np.asfortranarray(array) if order == "F" else array
