"""What a restricted load lets a pickle do to objects: call what the policy admits to be
called, make instances of admitted classes, set their state, fill collections.

Vetted reconstructors are called through their checks (`blpickle.restricted.registry`;
numpy's dtype and array reconstructors give a `Pending` object, built from its checked state
when ``BUILD`` comes: `blpickle.restricted.numpy_state`). Admitted classes are created with
``cls.__new__``; only names the caller gave exactly are called as pickle calls them. The
code of admitted types runs from a stack frame whose globals are empty (nothing a callee could
reach through the stack): what the code of a name the caller gave exactly raises comes out
wrapped in a `CallerError` (and is raised as it is), what other code raises as a `CorruptError`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ..errors import CorruptError, UnsafeLoadError
from .numpy_state import Pending
from .policy import SAFE_PACKAGES, Admitted, Policy
from .registry import STATE_CHECKS, STATE_GUARDS, Context, awaiting_state, call_member, load_callable
from .shown import shown

__all__ = [
    "CallerError",
    "add_items",
    "call",
    "extend",
    "is_builtin",
    "new_object",
    "pairs",
    "set_items",
    "set_state",
]

#: Calls ``f(*a, **k)`` from a stack frame whose globals are empty: a callee that looks up its
#: caller's stack frame (``pandas.eval`` does) finds nothing there.
_INVOKE = eval("lambda f, a, k: f(*a, **k)", {"__builtins__": {}})
#: The numpy objects whose state safe mode sets (numpy checks it), and the types of that
#: state: random bit generators (a dict, and a seed sequence), seed sequences, RandomState
#: and Generator.
_NUMPY_STATES: dict[type, tuple[type, ...]] = {
    np.random.BitGenerator: (tuple, dict),
    np.random.SeedSequence: (tuple,),
    np.random.RandomState: (dict,),
    np.random.Generator: (dict,),  # the state of its bit generator, as numpy 1.x wrote it
}
#: ``type.__flags__`` of a class made at run time (a Python class), not compiled.
_HEAP_TYPE = 1 << 9
#: The packages of the types whose state safe mode never sets and whose collections it fills
#: only if they are lists, dicts or sets.
_BUILTIN_MODULES = ("builtins", "numpy")


class CallerError(Exception):
    """Carries an exception raised by the code of a type the caller allowed."""

    def __init__(self, error: BaseException) -> None:
        super().__init__()
        self.error = error


def _arguments(args: Any, kwargs: Any, what: str) -> None:
    if not isinstance(args, tuple) or not (kwargs is None or isinstance(kwargs, dict)):
        raise CorruptError(f"{what}'s arguments must be a tuple (and a dict), not {shown(args)}")


def call(func: Any, args: Any, grant: Admitted | None, policy: Policy, context: Context) -> Any:
    """Return what ``REDUCE`` of ``func`` and ``args`` gives: a vetted reconstructor through
    its check, an exact name as pickle calls it, an admitted class created with
    ``cls.__new__(cls)`` (no arguments), or a member of a registry family called with plain
    data. ``grant`` is how the policy admitted ``func`` (None: never); ``context`` is what a
    reconstructor's check may ask of the load.

    Raises:
        UnsafeLoadError: for a call the policy does not admit.
        CorruptError: for arguments that are not a tuple, or that a check or an admitted
            class refuses.
        CallerError: carrying what the code of an exact name raised.
    """
    _arguments(args, None, "a call")
    bound = load_callable(func)
    if bound is not None:
        return bound(args, context)
    if grant is None:
        if not callable(func):
            raise CorruptError(f"the pickle calls a {type(func).__name__}, which is not callable")
        raise UnsafeLoadError(*_names(func), "the pickle calls an object that it did not import as a global")
    if grant.reconstructor is not None:
        return grant.reconstructor.check(args, context)
    if grant.how == "exact":
        return _run(func, func, args, exact=True)
    if grant.how == "class":
        if not args:
            return _bare(func)
        if policy.family(func):
            return context.built(call_member(func, args))
    raise UnsafeLoadError(
        *_names(func),
        "the pickle calls it with arguments, and only names given exactly are called: "
        "a package pattern admits classes as data, created without their constructor",
    )


def new_object(
    cls: Any, args: Any, grant: Admitted | None, policy: Policy, context: Context, kwargs: Any = None
) -> Any:
    """Return ``cls.__new__(cls, *args, **kwargs)`` (``NEWOBJ``, ``NEWOBJ_EX``) for an
    admitted class: with arguments only for an exact name, or through a vetted
    reconstructor.

    Raises:
        UnsafeLoadError: for a class the policy did not admit.
        CorruptError: for bad arguments, or what ``__new__`` raised unless named exactly.
        CallerError: carrying what ``__new__`` of an exact name raised.
    """
    if not isinstance(cls, type):
        raise CorruptError(f"NEWOBJ needs a class, not {shown(cls)}")
    _arguments(args, kwargs, "NEWOBJ")
    if grant is None:
        raise UnsafeLoadError(*_names(cls), "the pickle creates a class that it did not import as a global")
    if grant.reconstructor is not None:
        if kwargs:
            raise CorruptError(f"{'.'.join(_names(cls))} takes no keyword arguments in safe mode")
        return grant.reconstructor.check(args, context)  # cls.__new__(cls, *args) is cls(*args)
    if grant.how == "exact":
        return _run(cls, cls.__new__, (cls, *args), kwargs, exact=True)
    if args or kwargs:
        raise UnsafeLoadError(
            *_names(cls),
            "the pickle creates it with arguments to its __new__: a package pattern admits classes "
            "created without arguments; name it exactly to trust its constructor",
        )
    return _bare(cls)


def _bare(cls: type) -> Any:
    """Return ``cls.__new__(cls)`` for a class admitted as data.

    Raises:
        CorruptError: for a compiled class of numpy or ml_dtypes, which its reconstructors
            make: ``__new__`` alone leaves unset what its ``__init__`` sets up (a PCG64 bit
            generator's state pointer, which its next use follows), or what ``__new__`` raised.
    """
    if not cls.__flags__ & _HEAP_TYPE and cls.__module__.split(".")[0] in SAFE_PACKAGES:
        raise CorruptError(
            f"safe mode makes {cls.__module__}.{cls.__qualname__} objects through their reconstructors, "
            "not with __new__ alone"
        )
    return awaiting_state(_run(cls, cls.__new__, (cls,)))


def _run(owner: Any, func: Any, args: tuple[Any, ...], kwargs: Any = None, *, exact: bool = False) -> Any:
    """Call admitted code through `_INVOKE`: ``func``, of ``owner`` (a class or function).

    Raises:
        CallerError: carrying what it raised, for code the caller named exactly (its errors
            are the caller's, as pickle's are).
        CorruptError: for what other code raised (a class admitted as data, by safe mode or a
            package pattern, refused what the pickle gave it), the error as its cause.
    """
    try:
        return _INVOKE(func, args, kwargs or {})
    except Exception as exc:
        if exact:
            raise CallerError(exc) from exc
        raise CorruptError(
            f"{'.'.join(_names(owner))} refuses what the pickle gives it: {type(exc).__name__}: {exc}"
        ) from exc


def _names(obj: Any) -> tuple[str, str]:
    return str(getattr(obj, "__module__", "?")), str(getattr(obj, "__qualname__", type(obj).__name__))


def set_state(obj: Any, state: Any, context: Context, exact: bool) -> None:
    """Set the state of an object of a type the caller allowed, as pickle's ``BUILD`` does;
    ``exact``: the caller named its class exactly.

    Raises:
        CorruptError: for a builtin or numpy object, or what its ``__setstate__`` raised
            unless ``exact``.
        CallerError: carrying what its ``__setstate__`` raised, if ``exact``.
    """
    kinds = next((kinds for cls, kinds in _NUMPY_STATES.items() if isinstance(obj, cls)), None)
    if is_builtin(type(obj)) and kinds is None:
        raise CorruptError(f"safe mode sets the state of no {type(obj).__module__}.{type(obj).__qualname__} object")
    if kinds is not None and type(state) not in kinds:
        raise CorruptError(f"a {type(obj).__qualname__}'s state is not a {type(state).__name__}")
    if not exact:
        _refuse_dunder_names(obj, state)
    paths = [f"{cls.__module__}.{cls.__qualname__}" for cls in type(obj).__mro__]
    for path in paths:
        guard = STATE_GUARDS.get(path)
        if guard is not None:
            guard(obj, state)
    if kinds is None:
        cls = type(obj)
        _run(cls, _apply_state, (obj, state), exact=exact)
        if type(obj) is not cls:  # a __setstate__ that assigned __class__: unchecked
            raise CorruptError(f"the state of a {cls.__qualname__} changed its class to {type(obj).__qualname__}")
    else:  # numpy's own state, set through numpy's checks: what they refuse is a damaged pickle
        try:
            _apply_state(obj, state)
        except Exception as exc:
            raise CorruptError(f"numpy refuses the state of a {type(obj).__qualname__}: {exc}") from None
    for path in paths:
        check = STATE_CHECKS.get(path)
        if check is not None:
            check(obj, context)


def _refuse_dunder_names(obj: Any, state: Any) -> None:
    """Refuse a state that sets a dunder attribute (``__name__``, ``__class__``) of an
    object whose class the caller did not name exactly: data sets no such attribute, and
    code reads them (xarray's ``_unary_ufunc`` calls the numpy function its ``__name__``
    names: ``fromfile`` read any file). A mapping in a state is a dict, as pickle writes it:
    another one (a ``UserDict``, xarray's ``Frozen``) would hide its keys from this check
    and still be copied into the object's attributes.

    Raises:
        CorruptError: naming the attribute, or the mapping.
    """
    parts = state if isinstance(state, tuple) and len(state) == 2 else (state,)  # as `_apply_state` splits it
    for part in parts:
        if isinstance(part, dict):
            for key in part:
                if isinstance(key, str) and key.startswith("__"):
                    raise CorruptError(
                        f"the state of a {type(obj).__qualname__} sets {shown(key)}: "
                        "safe mode sets no dunder attribute of a class admitted as data"
                    )
        elif isinstance(part, Mapping) or hasattr(part, "keys"):
            raise CorruptError(
                f"the state of a {type(obj).__qualname__} holds a {type(part).__qualname__} where pickle writes a dict"
            )


def extend(target: Any, trusted: bool, items: list[Any]) -> None:
    """Append ``items`` to ``target`` (``APPEND``, ``APPENDS``); see `_fill` for ``trusted``."""
    _fill(
        target,
        (list, deque),
        trusted,
        "APPEND(S)",
        lambda found: found.extend(items),
        lambda found: _extend(found, items),
    )


def set_items(target: Any, trusted: bool, items: list[Any]) -> None:
    """Set ``target[key] = value`` for the key/value pairs ``items`` lists (``SETITEM(S)``);
    see `_fill` for ``trusted``."""
    _fill(
        target,
        (dict,),
        trusted,
        "SETITEM(S)",
        lambda found: pairs(items, found),
        lambda found: _set_items(found, items),
    )


def add_items(target: Any, trusted: bool, items: list[Any]) -> None:
    """Add ``items`` to the set ``target`` (``ADDITEMS``); see `_fill` for ``trusted``."""
    _fill(
        target, (set,), trusted, "ADDITEMS", lambda found: found.update(items), lambda found: _add_items(found, items)
    )


def _fill(
    target: Any,
    containers: tuple[type, ...],
    trusted: bool,
    what: str,
    builtin: Callable[[Any], Any],
    other: Callable[[Any], Any],
) -> None:
    """Fill ``target``: the first of ``containers`` by ``builtin``; an object of an admitted
    class by its own methods (``other``, run as admitted code) if it is an instance of
    ``containers`` (what pickle fills: the items of list, deque, dict and set subclasses)
    or if the caller named its class exactly (``trusted``: pickle fills any object whose
    reduction gives items).

    Raises:
        CorruptError: for a builtin or numpy object, or another object of a class admitted as
            data (an array, a frame: its ``__setitem__`` would write into memory whose
            contents were checked), or what its methods raised unless ``trusted``.
        CallerError: carrying what the methods of a ``trusted`` class raised.
    """
    if type(target) is containers[0]:
        builtin(target)
    elif is_builtin(type(target)) or not (trusted or isinstance(target, containers)):
        raise CorruptError(
            f"{what} on a {type(target).__qualname__}: safe mode fills {', '.join(c.__name__ for c in containers)} "
            "objects, their subclasses, and objects of classes the caller names exactly"
        )
    else:
        _run(type(target), other, (target,), exact=trusted)


def _extend(target: Any, items: list[Any]) -> None:
    extend = getattr(target, "extend", None)
    if extend is not None:
        extend(items)
    else:
        for item in items:
            target.append(item)


def _set_items(target: Any, items: list[Any]) -> None:
    for i in range(0, len(items) - 1, 2):
        target[items[i]] = items[i + 1]


def _add_items(target: Any, items: list[Any]) -> None:
    for item in items:
        target.add(item)


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
    if not isinstance(state, (dict, type(None))) or not isinstance(slotstate, (dict, type(None))):
        raise TypeError("a state and its slot state are dicts, as pickle's BUILD requires")
    if state:
        inst_dict = obj.__dict__
        for key, value in state.items():
            inst_dict[key] = value
    if slotstate:
        for key, value in slotstate.items():
            setattr(obj, key, value)


def is_builtin(cls: type) -> bool:
    """Whether ``cls`` is a builtin or numpy type (whose native state safe mode never sets),
    or the placeholder of a numpy object waiting for its state."""
    if cls is Pending:
        return True
    module = getattr(cls, "__module__", "")
    return isinstance(module, str) and module.split(".")[0] in _BUILTIN_MODULES
