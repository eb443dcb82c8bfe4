"""What a restricted load lets a pickle do to objects: call the globals it may import, make
instances, set their state, fill collections.

The globals safe mode allows by default are called through `CHECKED_CALLS`, with their
arguments checked (numpy's dtype and array reconstructors give a `Pending` object, built from
its checked state when ``BUILD`` comes: `blpickle.restricted.numpy_state`). The code of types the
caller allowed runs as pickle runs it; what it raises comes out wrapped in a `CallerError`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import numpy as np

from ..arrays import rebuild_ndarray, rebuild_view
from ..errors import CorruptError, UnsafeLoadError

__all__ = [
    "CHECKED_CALLS",
    "CallerError",
    "Pending",
    "add_items",
    "call",
    "extend",
    "is_builtin",
    "new_object",
    "pairs",
    "set_items",
    "set_state",
]

#: The longest type code accepted for ``numpy.dtype(code, align, copy)``.
_MAX_CODE = 64
# numpy's reconstructors, as the names SAFE_GLOBALS allows for them resolve
_RECONSTRUCT = importlib.import_module("numpy._core.multiarray")._reconstruct
_SCALAR = importlib.import_module("numpy._core.multiarray").scalar
_FROMBUFFER = importlib.import_module("numpy._core.numeric")._frombuffer
#: The packages of the types whose state safe mode never sets and whose collections it fills
#: only if they are lists, dicts or sets.
_BUILTIN_MODULES = ("builtins", "numpy")


class Pending:
    """A dtype or array made by ``REDUCE``, waiting for its state (``BUILD``)."""

    __slots__ = ("args", "keys", "kind")

    def __init__(self, kind: str, args: tuple[Any, ...]) -> None:
        self.kind, self.args = kind, args
        self.keys: list[int] = []  # the memo keys that hold it


class CallerError(Exception):
    """Carries an exception raised by the code of a type the caller allowed."""

    def __init__(self, error: BaseException) -> None:
        super().__init__()
        self.error = error


def call(func: Any, args: Any, kwargs: Any = None) -> Any:
    """Return ``func(*args, **kwargs)``: checked for what safe mode allows by default,
    as is for what the caller allowed.

    Raises:
        CorruptError: for arguments that are not a tuple (and a dict), a checked call's bad
            arguments, or something not callable.
        CallerError: carrying what the caller's code raised.
    """
    if not isinstance(args, tuple) or not (kwargs is None or isinstance(kwargs, dict)):
        raise CorruptError(f"a call's arguments must be a tuple (and a dict), not {args!r}")
    checked = CHECKED_CALLS.get(func) if _hashable(func) else None
    if checked is not None:
        if kwargs:
            raise CorruptError(f"{_name(func)} takes no keyword arguments in safe mode")
        return checked(args)
    if not callable(func):
        raise CorruptError(f"the pickle calls a {type(func).__name__}, which is not callable")
    try:
        return func(*args, **(kwargs or {}))
    except Exception as exc:
        raise CallerError(exc) from exc


def new_object(cls: Any, args: Any, kwargs: Any = None) -> Any:
    """Return ``cls.__new__(cls, *args, **kwargs)`` (``NEWOBJ``, ``NEWOBJ_EX``)."""
    if not isinstance(cls, type):
        raise CorruptError(f"NEWOBJ needs a class, not {cls!r}")
    if cls in CHECKED_CALLS:
        return call(cls, args, kwargs)  # cls.__new__(cls, *args) is cls(*args) for these
    if not isinstance(args, tuple) or not (kwargs is None or isinstance(kwargs, dict)):
        raise CorruptError(f"NEWOBJ's arguments must be a tuple (and a dict), not {args!r}")
    try:
        return cls.__new__(cls, *args, **(kwargs or {}))
    except Exception as exc:
        raise CallerError(exc) from exc


def set_state(obj: Any, state: Any) -> None:
    """Set the state of an object of a type the caller allowed, as pickle's ``BUILD`` does.

    Raises:
        CorruptError: for a builtin or numpy object.
        CallerError: carrying what the object's ``__setstate__`` raised.
    """
    if is_builtin(type(obj)):
        raise CorruptError(f"safe mode sets the state of no {type(obj).__module__}.{type(obj).__qualname__} object")
    try:
        _apply_state(obj, state)
    except Exception as exc:
        raise CallerError(exc) from exc


def extend(target: Any, items: list[Any]) -> None:
    """Append ``items`` to ``target`` (``APPEND``, ``APPENDS``)."""
    if type(target) is list:
        target.extend(items)
    elif is_builtin(type(target)):
        raise CorruptError(f"APPEND(S) on a {type(target).__name__}")
    else:
        try:
            extend = getattr(target, "extend", None)
            if extend is not None:
                extend(items)
            else:
                for item in items:
                    target.append(item)
        except Exception as exc:
            raise CallerError(exc) from exc


def set_items(target: Any, items: list[Any]) -> None:
    """Set ``target[key] = value`` for the key/value pairs ``items`` lists (``SETITEM(S)``)."""
    if type(target) is dict:
        pairs(items, target)
    elif is_builtin(type(target)):
        raise CorruptError(f"SETITEM(S) on a {type(target).__name__}")
    else:
        try:
            for i in range(0, len(items) - 1, 2):
                target[items[i]] = items[i + 1]
        except Exception as exc:
            raise CallerError(exc) from exc


def add_items(target: Any, items: list[Any]) -> None:
    """Add ``items`` to the set ``target`` (``ADDITEMS``)."""
    if type(target) is set:
        target.update(items)
    elif is_builtin(type(target)):
        raise CorruptError(f"ADDITEMS on a {type(target).__name__}")
    else:
        try:
            for item in items:
                target.add(item)
        except Exception as exc:
            raise CallerError(exc) from exc


def pairs(items: list[Any], target: dict[Any, Any]) -> dict[Any, Any]:
    """Set ``target[key] = value`` for the (key, value) pairs ``items`` lists; return it."""
    if len(items) % 2:
        raise CorruptError("a dict's items come in key/value pairs: one is missing")
    for i in range(0, len(items), 2):
        target[items[i]] = items[i + 1]
    return target


def _apply_state(obj: Any, state: Any) -> None:
    """Set the state of an object of a type the caller allowed, as pickle's BUILD does."""
    setstate = getattr(obj, "__setstate__", None)
    if setstate is not None:
        setstate(state)
        return
    slotstate = None
    if isinstance(state, tuple) and len(state) == 2:
        state, slotstate = state
    if state:
        inst_dict = obj.__dict__
        for key, value in state.items():
            inst_dict[key] = value
    if slotstate:
        for key, value in slotstate.items():
            setattr(obj, key, value)


def _hashable(obj: Any) -> bool:
    return type(obj).__hash__ is not None


def is_builtin(cls: type) -> bool:
    """Whether ``cls`` is a builtin or numpy type (whose native state safe mode never sets),
    or the placeholder of a numpy object waiting for its state."""
    if cls is Pending:
        return True
    module = getattr(cls, "__module__", "")
    return isinstance(module, str) and module.split(".")[0] in _BUILTIN_MODULES


def _name(func: Any) -> str:
    return f"{getattr(func, '__module__', '?')}.{getattr(func, '__qualname__', repr(func))}"


# -- the calls safe mode allows by default, with their arguments checked -----------------------


def _arity(args: tuple[Any, ...], low: int, high: int, what: str) -> None:
    if not low <= len(args) <= high:
        raise CorruptError(f"{what} takes {low} to {high} arguments in safe mode, the pickle gives {len(args)}")


def _call_collection(cls: type) -> Callable[[tuple[Any, ...]], Any]:
    def call(args: tuple[Any, ...]) -> Any:
        _arity(args, 0, 1, cls.__name__)
        if args and not isinstance(args[0], (list, tuple, set, frozenset, dict)):
            raise CorruptError(f"{cls.__name__}() takes a list in safe mode, not {type(args[0]).__name__}")
        return cls(*args)

    return call


def _call_bytearray(args: tuple[Any, ...]) -> bytearray:
    _arity(args, 0, 2, "bytearray")
    if len(args) == 2:
        return bytearray(_latin1(args))
    if args and isinstance(args[0], (int, str)):
        raise CorruptError(f"bytearray() takes bytes in safe mode, not {type(args[0]).__name__}")
    return bytearray(*args)


def _call_bytes(args: tuple[Any, ...]) -> bytes:
    _arity(args, 0, 1, "bytes")
    if args and not isinstance(args[0], (bytes, bytearray)):
        raise CorruptError(f"bytes() takes bytes in safe mode, not {type(args[0]).__name__}")
    return bytes(*args)


def _latin1(args: tuple[Any, ...]) -> bytes:
    """``str.encode`` of ``(text, "latin1")``, the way protocols 0-2 write bytes."""
    _arity(args, 2, 2, "encode")
    text, encoding = args
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise CorruptError(f"bytes are encoded from a str as latin1 in safe mode, not {args!r:.80}")
    return text.encode("latin-1")


def _call_numbers(cls: type) -> Callable[[tuple[Any, ...]], Any]:
    def call(args: tuple[Any, ...]) -> Any:
        _arity(args, 0, 3, cls.__name__)
        if not all(arg is None or type(arg) in (int, float, bool) for arg in args):
            raise CorruptError(f"{cls.__name__}() takes numbers in safe mode, not {args!r:.80}")
        if cls is complex and (len(args) > 2 or None in args):
            raise CorruptError(f"complex() takes two numbers, not {args!r:.80}")
        return cls(*args)

    return call


def _call_dtype(args: tuple[Any, ...]) -> Pending:
    _arity(args, 1, 3, "numpy.dtype")
    code = args[0]
    flags = all(type(flag) in (bool, int) for flag in args[1:])
    if _is_ml_dtype(code) and flags:  # numpy names the dtypes of ml_dtypes by their scalar type
        return Pending("dtype", args)
    if not isinstance(code, str) or len(code) > _MAX_CODE or not flags:
        raise CorruptError(f"numpy.dtype takes a type code and two flags in safe mode, not {args!r:.80}")
    try:
        np.dtype(code)  # check it now
    except Exception as exc:  # numpy raises TypeError, ValueError, even SyntaxError for some codes
        raise CorruptError(f"numpy.dtype refuses the type code {code!r}: {exc}") from None
    return Pending("dtype", args)


def _is_ml_dtype(code: Any) -> bool:
    """Whether ``code`` is a scalar type of ml_dtypes (``ml_dtypes.bfloat16``)."""
    return isinstance(code, type) and issubclass(code, np.generic) and code.__module__ == "ml_dtypes"


def _call_reconstruct(args: tuple[Any, ...]) -> Any:
    _arity(args, 3, 3, "numpy _reconstruct")
    cls = args[0]
    if cls is np.ndarray:
        return Pending("array", args)
    raise CorruptError(f"numpy _reconstruct rebuilds numpy.ndarray in safe mode, not {cls!r:.80}")


def _call_scalar(args: tuple[Any, ...]) -> Any:
    _arity(args, 1, 2, "numpy scalar")
    dtype = args[0]
    if not isinstance(dtype, np.dtype):
        raise CorruptError(f"numpy scalar needs a dtype, not {dtype!r:.80}")
    if dtype == np.dtype(object):
        return args[1] if len(args) == 2 else None
    data = args[1] if len(args) == 2 else b""
    if dtype.hasobject or type(data) is not bytes or len(data) != dtype.itemsize:
        raise CorruptError(f"a numpy scalar of dtype {dtype} needs {dtype.itemsize} bytes, not {data!r:.80}")
    try:
        return _SCALAR(dtype, data)
    except Exception as exc:
        raise CorruptError(f"numpy refuses a scalar of dtype {dtype}: {exc}") from None


def _call_rebuild(what: str) -> Callable[[tuple[Any, ...]], np.ndarray]:
    """Return the call of an array reconstructor taking (buffer, dtype, shape, order), which
    `rebuild_ndarray` checks (numpy's ``_frombuffer`` takes the same arguments)."""

    def call(args: tuple[Any, ...]) -> np.ndarray:
        _arity(args, 4, 4, what)
        return rebuild_ndarray(*args)

    return call


def _call_rebuild_view(args: tuple[Any, ...]) -> np.ndarray:
    """The call of `rebuild_view` (base, offset, dtype, shape, strides), which checks that
    the view lies inside its base, a contiguous array without objects."""
    _arity(args, 5, 5, "blpickle rebuild_view")
    return rebuild_view(*args)


def _refuse_ndarray(args: tuple[Any, ...]) -> None:
    raise UnsafeLoadError("numpy", "ndarray", "safe mode builds arrays only through their reconstructors")


CHECKED_CALLS: dict[Any, Callable[[tuple[Any, ...]], Any]] = {
    set: _call_collection(set),
    frozenset: _call_collection(frozenset),
    bytes: _call_bytes,
    bytearray: _call_bytearray,
    complex: _call_numbers(complex),
    slice: _call_numbers(slice),
    range: _call_numbers(range),
    importlib.import_module("_codecs").encode: _latin1,
    np.dtype: _call_dtype,
    _RECONSTRUCT: _call_reconstruct,
    _SCALAR: _call_scalar,
    _FROMBUFFER: _call_rebuild("numpy _frombuffer"),
    rebuild_ndarray: _call_rebuild("blpickle rebuild_ndarray"),
    rebuild_view: _call_rebuild_view,
    np.ndarray: _refuse_ndarray,
}
