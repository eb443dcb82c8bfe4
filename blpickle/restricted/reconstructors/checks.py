"""What a vetted reconstructor is (`Reconstructor`, `Family`), what its check may ask of the
load (`Context`), and the argument checks the reconstructors of every library share."""

from __future__ import annotations

import datetime
import importlib
import sys
from collections.abc import Callable
from typing import Any, NamedTuple

from ...errors import CorruptError
from ..budget import Budget
from ..numpy_state import Pending
from ..shown import shown

__all__ = [
    "STATE_REQUIRED",
    "Check",
    "Context",
    "Family",
    "Reconstructor",
    "awaiting_state",
    "call_member",
    "check_arity",
    "check_types",
    "cython_state",
]


class Context:
    """What a reconstructor's check asks of the load that calls it.

    Args:
        admitted: whether a class is one the load admits (by the policy, whichever name
            the pickle used for it).
        copies: the load's budget of bytes that checks copy (None: unlimited).
        built: records an object built with its state (None: nothing records).
    """

    def __init__(
        self,
        admitted: Callable[[Any], bool],
        copies: Budget | None = None,
        built: Callable[[Any], None] | None = None,
    ) -> None:
        self.admitted = admitted
        self._copies = copies
        self._built = built

    def built(self, obj: Any) -> Any:
        """Return ``obj``, recorded as built: the load refuses to set its state again
        (a BUILD after the checks of what it was built from)."""
        if self._built is not None:
            self._built(obj)
        return obj

    def copying(self, nbytes: int) -> None:
        """Count ``nbytes`` that a check is about to allocate for a copy.

        Raises:
            LimitError: past the load's budget: the same bytes copied again and again.
        """
        if self._copies is not None:
            self._copies.spend(nbytes)

    def subclass(self, cls: Any, base: type, what: str) -> type:
        """Return ``cls`` if it is an admitted subclass of ``base``; raise `CorruptError`."""
        if not (isinstance(cls, type) and issubclass(cls, base) and self.admitted(cls)):
            raise CorruptError(f"{what} builds admitted subclasses of {base.__qualname__}, not {shown(cls)}")
        return cls


#: A reconstructor's check: calls it with ``args`` once they are what its library writes.
Check = Callable[[tuple[Any, ...], Context], Any]


class Reconstructor(NamedTuple):
    """A vetted reconstructor: ``check(args, context)`` calls the function with checked
    arguments; ``package`` is the package pattern the caller must allow (None: always)."""

    check: Check
    package: str | None = None


class Family(NamedTuple):
    """Classes called with arguments that are plain data: every admitted subclass of
    ``base`` (an import path), in ``package``."""

    base: str
    package: str


#: Types of the plain data a `Family` member may be called with (and pandas' NA).
_PLAIN = (int, float, bool, str, bytes, type(None), datetime.timedelta)


def call_member(cls: type, args: tuple[Any, ...]) -> Any:
    """Return ``cls(*args)`` for a member of a `Family`, if ``args`` is plain data; raise."""
    if not all(isinstance(arg, _PLAIN) or _is_na(arg) for arg in args):
        raise CorruptError(f"{cls.__qualname__} is called with plain data in safe mode, not {shown(args, 120)}")
    return cls(*args)


def _is_na(value: Any) -> bool:
    pandas = sys.modules.get("pandas")
    return pandas is not None and value is pandas.NA


def check_arity(args: tuple[Any, ...], low: int, high: int, what: str) -> None:
    """Raise `CorruptError` unless ``args`` holds ``low`` to ``high`` arguments."""
    if not low <= len(args) <= high:
        raise CorruptError(f"{what} takes {low} to {high} arguments in safe mode, the pickle gives {len(args)}")


def check_types(args: tuple[Any, ...], types: tuple[tuple[type, ...], ...], what: str) -> tuple[Any, ...]:
    """Return ``args`` if each is an instance of its ``types`` entry (same count); raise."""
    if len(args) != len(types) or not all(isinstance(a, t) for a, t in zip(args, types, strict=True)):
        raise CorruptError(f"{what} takes {len(types)} arguments of other types in safe mode, not {shown(args, 120)}")
    return args


#: Classes whose objects are broken without a state, by import path: one made without its
#: state waits for ``BUILD`` in a `Pending` (the objects of Cython classes made so all do).
STATE_REQUIRED = frozenset({"uuid.UUID"})


def awaiting_state(obj: Any) -> Any:
    """Return ``obj``, just made without its state; or, if its class is in `STATE_REQUIRED`,
    a `Pending` holding it, which ``BUILD`` gives its state (and a load never giving it one
    is refused)."""
    cls = type(obj)
    return Pending("object", (obj,)) if f"{cls.__module__}.{cls.__qualname__}" in STATE_REQUIRED else obj


def cython_state(base: str, what: str, state_check: Callable[[Any, Context], None] | None = None) -> Check:
    """A Cython ``__pyx_unpickle_<Class>(cls, checksum, state)``: ``cls.__new__(cls)`` and
    the state set into its typed fields (Cython checks their types and the checksum), then
    checked by ``state_check`` (the check `STATE_CHECKS` runs when ``BUILD`` sets it)."""

    def check(args: tuple[Any, ...], context: Context) -> Any:
        module, _, name = base.rpartition(".")
        cls, checksum, state = check_types(args, ((type,), (int,), (tuple, type(None))), what)
        context.subclass(cls, getattr(importlib.import_module(module), name), what)
        made = getattr(importlib.import_module(module), what)(cls, checksum, state)
        if state is None:
            return Pending("object", (made,))  # BUILD sets its state next: unusable until then
        if state_check is not None:
            state_check(made, context)
        return context.built(made)

    return check
