"""The vetted reconstructors: the only functions (and classes called with arguments) that a
restricted load calls without the caller naming them exactly.

Each entry names a function by its import path, the package whose pattern must be allowed
for it to be called (``None``: ``safe=True`` alone calls it), and a check of its arguments
that raises `CorruptError` for anything its library never writes: a class argument must be a
class the load admits, of the kind the function builds; a callable argument is never
accepted. `tests/test_registry.py` tests each entry with what its library writes and with
hostile arguments.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .reconstructors import numpy, pandas, scipy, sklearn, stdlib
from .reconstructors.checks import Context, Family, Reconstructor, awaiting_state, call_member
from .reconstructors.stdlib import load_callable

__all__ = [
    "FAMILIES",
    "REGISTRY",
    "STATE_CHECKS",
    "STATE_GUARDS",
    "Context",
    "Family",
    "Reconstructor",
    "awaiting_state",
    "call_member",
    "load_callable",
]

#: The vetted reconstructors, by import path (pickle's ``module.name``).
REGISTRY: dict[str, Reconstructor] = {
    **stdlib.RECONSTRUCTORS,
    **numpy.RECONSTRUCTORS,
    **pandas.RECONSTRUCTORS,
    **sklearn.RECONSTRUCTORS,
}
#: Families of classes that pickle calls with arguments.
FAMILIES: tuple[Family, ...] = pandas.FAMILIES
#: Checks of an object's state after ``BUILD`` set it, by the import path of its class (or a
#: base): for states whose library checks their types but not their values.
STATE_CHECKS: dict[str, Callable[[Any, Context], None]] = {
    **stdlib.STATE_CHECKS,
    **numpy.STATE_CHECKS,
    **pandas.STATE_CHECKS,
    **scipy.STATE_CHECKS,
    **sklearn.STATE_CHECKS,
}
#: Checks of a state before ``BUILD`` sets it, by the import path of the object's class (or a
#: base): for states that a library acts on as it sets them.
STATE_GUARDS: dict[str, Callable[[Any, Any], None]] = {**pandas.STATE_GUARDS, **sklearn.STATE_GUARDS}
