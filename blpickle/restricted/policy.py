"""Restricted loading: only builtin containers and scalars, numpy arrays, dtypes and scalars,
and what the caller allows.

A safe load runs the restricted unpickler (`blpickle.restricted`), whichever path the data
takes (records, plain pickle data, object arrays, nested containers): every global it imports
is checked there by a `Policy`, before anything it names is imported or called.
"""

from __future__ import annotations

import _compat_pickle
import importlib
from collections.abc import Iterable
from types import ModuleType
from typing import Any

from ..errors import UnsafeLoadError

__all__ = ["SAFE_GLOBALS", "Policy"]

_OUTSIDE = "outside the allowed packages"

#: The scalar types of ml_dtypes (0.6): numpy dtypes of their own.
_ML_DTYPES = (
    "bcomplex32",
    "bfloat16",
    "complex32",
    "float4_e2m1fn",
    "float6_e2m3fn",
    "float6_e3m2fn",
    "float8_e3m4",
    "float8_e4m3",
    "float8_e4m3b11fnuz",
    "float8_e4m3fn",
    "float8_e4m3fnuz",
    "float8_e5m2",
    "float8_e5m2fnuz",
    "float8_e8m0fnu",
    "int1",
    "int2",
    "int4",
    "uint1",
    "uint2",
    "uint4",
)
#: The globals ``safe=True`` allows, as ``module.name``.
SAFE_GLOBALS = frozenset(
    {
        # builtins that pickle protocols 0-5 use for containers and scalars
        "builtins.set",
        "builtins.frozenset",
        "builtins.bytes",  # empty bytes at protocols 0-2
        "builtins.bytearray",
        "builtins.complex",
        "builtins.slice",
        "builtins.range",
        "_codecs.encode",  # bytes at protocols 0-2
        # numpy arrays, dtypes and scalars (numpy 2 and numpy 1 spellings)
        "numpy.ndarray",
        "numpy.dtype",
        "numpy._core.multiarray._reconstruct",
        "numpy.core.multiarray._reconstruct",
        "numpy._core.multiarray.scalar",
        "numpy.core.multiarray.scalar",
        "numpy._core.numeric._frombuffer",
        "numpy.core.numeric._frombuffer",
        # how blpickle records rebuild arrays (checks sizes, refuses object dtypes) and views
        # of them (checks that the view lies inside its base)
        "blpickle.arrays.rebuild_ndarray",
        "blpickle.arrays.rebuild_view",
        # how blpickle records rebuild torch storages, tensors and parameters and jax arrays
        # (each checks every argument: blpickle.tensors)
        "blpickle.tensors.rebuild_storage",
        "blpickle.tensors.rebuild_tensor",
        "blpickle.tensors.rebuild_parameter",
        "blpickle.tensors.rebuild_jax_array",
        # torch's state dicts
        "collections.OrderedDict",
        # the scalar types of ml_dtypes, which numpy's dtype reduction names (numpy.dtype(type, False, True))
        *(f"ml_dtypes.{name}" for name in _ML_DTYPES),
    }
)


def _import_path(entry: str | Any) -> str:
    if isinstance(entry, str):
        return entry
    module, qualname = getattr(entry, "__module__", None), getattr(entry, "__qualname__", None)
    if not module or not qualname:
        raise TypeError(f"allowed entries are import paths or importable types/functions, not {entry!r}")
    return f"{module}.{qualname}"


class Policy:
    """Which globals a restricted load may import.

    Args:
        allowed: extra import paths (``"package.module.Name"``, or ``"package.*"`` for a whole
            package) or the types and functions themselves, on top of `SAFE_GLOBALS`.

    Raises:
        TypeError: for an entry that is neither a string nor an importable object.
    """

    def __init__(self, allowed: Iterable[str | Any] = ()) -> None:
        paths = {_import_path(entry) for entry in allowed}
        self._exact = SAFE_GLOBALS | {p for p in paths if not p.endswith(".*")}
        self._packages = tuple(p[:-2] for p in paths if p.endswith(".*"))

    def check(self, module: str, name: str) -> None:
        """Return if ``module.name`` may be imported; raise `UnsafeLoadError` if not.

        The name must be allowed: an exact name, or inside an allowed package. Names reaching
        through dunder attributes (``Class.__init__.__globals__``) are always refused: they
        lead from an allowed object to anything. Then what the name resolves to is judged
        (``find_class`` follows dotted names through attributes, so a name inside a package
        can reach any module the package imports): it may not be a module, and for a package
        the modules the name passes through, and the module the object is defined in (its
        ``__module__``, else the module holding it), must lie inside an allowed package.
        """
        if (module, name) in _compat_pickle.NAME_MAPPING:  # Python 2 names, as find_class maps them
            module, name = _compat_pickle.NAME_MAPPING[(module, name)]
        elif module in _compat_pickle.IMPORT_MAPPING:
            module = _compat_pickle.IMPORT_MAPPING[module]
        if any(part.startswith("__") for part in name.split(".")):
            raise UnsafeLoadError(module, name, "it reaches through a dunder attribute")
        exact = f"{module}.{name}" in self._exact
        if not exact and not self._inside(module):
            raise UnsafeLoadError(module, name)
        try:
            holder = obj = importlib.import_module(module)
            for part in name.split("."):
                obj = getattr(obj, part)
                if isinstance(obj, ModuleType):
                    if not exact and not self._inside(obj.__name__):
                        raise UnsafeLoadError(module, name, f"it reaches through module {obj.__name__}, {_OUTSIDE}")
                    holder = obj
        except (ImportError, AttributeError):
            return  # find_class raises the same error, having returned nothing
        if isinstance(obj, ModuleType):
            raise UnsafeLoadError(module, name, "it is a module")
        home = getattr(obj, "__module__", None)
        home = home if isinstance(home, str) else holder.__name__
        if not exact and not self._inside(home):
            raise UnsafeLoadError(module, name, f"it is defined in {home}, {_OUTSIDE}")

    def _inside(self, module: str) -> bool:
        """Whether ``module`` lies in an allowed package."""
        return any(module == package or module.startswith(package + ".") for package in self._packages)
