"""What a restricted load admits: data, not functions.

- ``safe=True`` admits builtin containers and scalars, numpy and ml_dtypes classes and
  constants (arrays, dtypes, scalar types, random generators), a few standard data types
  (`collections`, `datetime`, `decimal`, `fractions`, `uuid`, `zoneinfo`), and calls only the
  vetted reconstructors of `blpickle.restricted.registry` whose package is ``None``.
- A package pattern (``"pkg.*"``) admits the **classes** and constants defined in that package:
  a class is created the way pickle creates plain instances (``cls.__new__``, then its state),
  never called with arguments from the file; the package's vetted reconstructors are called
  too. A pattern never admits a function.
- An exact name (``"pkg.mod.name"``, or the object itself) admits that one object, which may
  be called as pickle calls it: the caller trusts it.
- `DENIED` names what runs code or touches files: refused even when named exactly.
"""

from __future__ import annotations

import _compat_pickle
import functools
import importlib
import inspect
import sys
from collections.abc import Iterable
from types import FunctionType, ModuleType
from typing import Any, NamedTuple

from ..errors import UnsafeLoadError
from .registry import FAMILIES, REGISTRY, Reconstructor

__all__ = [
    "DENIED",
    "SAFE_CLASSES",
    "SAFE_GLOBALS",
    "SAFE_PACKAGES",
    "TEST_MODULES",
    "UNCHECKED",
    "Admitted",
    "Policy",
]

_OUTSIDE = "outside the allowed packages"
#: How a refusal of `DENIED` ends.
_ALWAYS = "refused even when named exactly"

#: Packages whose classes and constants ``safe=True`` admits.
SAFE_PACKAGES = ("numpy", "ml_dtypes")
#: Further classes ``safe=True`` admits, as ``module.name`` (the vetted reconstructors that
#: are classes are admitted too).
SAFE_CLASSES = frozenset(
    {
        *(f"builtins.{name}" for name in ("list", "dict", "tuple", "int", "float", "str", "bool", "object")),
        "uuid.UUID",
        "zoneinfo.ZoneInfo",
    }
)
#: The reconstructors ``safe=True`` calls, as ``module.name``.
SAFE_GLOBALS = frozenset(path for path, entry in REGISTRY.items() if entry.package is None)

#: What runs code, imports it, or reads or writes files: refused even when named exactly, with
#: the reason. A key names a module (and everything in it) or one object.
DENIED: dict[str, str] = {
    **dict.fromkeys(
        (
            "builtins.eval",
            "builtins.exec",
            "builtins.compile",
            "builtins.__import__",
            "builtins.breakpoint",
            "builtins.input",
            "builtins.help",
            "builtins.exit",
            "builtins.quit",
            "code",
            "codeop",
            "runpy",
            "pdb",
            "bdb",
            "timeit",
            "cProfile",
            "profile",
            "trace",
            "types.FunctionType",
            "types.CodeType",
            "types.LambdaType",
            "numpy.testing",
            "numpy.f2py",
            "numpy.distutils",
            "pandas.eval",
            "pandas.core.computation",
            "pandas.testing",
            "pandas.util",
            "sklearn.utils._testing",
            "sklearn.utils.fixes",
            "torch.jit",
            "torch.utils.cpp_extension",
            "torch.package",
        ),
        "it runs code",
    ),
    "scipy.stats._distn_infrastructure.rv_generic": "its __setstate__ runs code from its state (exec)",
    **dict.fromkeys(
        ("sklearn.callback._scoring_monitor", "sklearn.callback._transport", "sklearn.callback._progressbar"),
        "its __setstate__ connects to an address or starts threads from its state",
    ),
    "pandas._config": "it sets pandas' global options, whose checks import modules",
    "xarray.ufuncs": "it calls the numpy function whose name its state holds",
    **dict.fromkeys(
        ("xarray.coding.common._ElementwiseFunctionArray", "xarray.coding.variables._ElementwiseFunctionArray"),
        "its values are what the callable its state holds returns",
    ),
    **dict.fromkeys(
        (
            "builtins.getattr",
            "builtins.setattr",
            "builtins.delattr",
            "builtins.globals",
            "builtins.locals",
            "builtins.vars",
            "operator.attrgetter",
            "operator.methodcaller",
            "functools.partial",
            "functools.reduce",
            "inspect",
            "gc",
            "ctypes",
            "_ctypes",
            "numpy.ctypeslib",
            "sys",
        ),
        "it reaches any object from the ones it is given",
    ),
    **dict.fromkeys(
        (
            "os",
            "posix",
            "nt",
            "posixpath",
            "ntpath",
            "subprocess",
            "_posixsubprocess",
            "pty",
            "signal",
            "multiprocessing",
            "concurrent",
            "threading",
            "_thread",
            "asyncio",
            "socket",
            "_socket",
            "ssl",
            "select",
            "selectors",
            "webbrowser",
            "urllib",
            "http",
            "ftplib",
            "smtplib",
            "xmlrpc",
        ),
        "it runs programs or reaches the system",
    ),
    **dict.fromkeys(
        (
            "importlib",
            "pkgutil",
            "zipimport",
            "site",
            "builtins.open",
            "io.open",
            "io.FileIO",
            "_io",
            "pathlib",
            "shutil",
            "tempfile",
            "glob",
            "fileinput",
            "linecache",
            "shelve",
            "dbm",
            "sqlite3",
            "zipfile",
            "tarfile",
            "marshal",
            "pickle",
            "_pickle",
            "copyreg",
            "cloudpickle",
            "dill",
            "joblib",
            "blpickle.unpickler",
            "numpy.load",
            "numpy.loadtxt",
            "numpy.genfromtxt",
            "numpy.fromfile",
            "numpy.fromregex",
            "numpy.save",
            "numpy.savez",
            "numpy.savez_compressed",
            "numpy.savetxt",
            "numpy.memmap",
            "numpy.lib.format",
            "numpy.lib.npyio",
            "numpy.lib._npyio_impl",
            "numpy.lib._datasource",
            "numpy.DataSource",
            "pandas.io",
            "pandas.read_pickle",
            "pandas.to_pickle",
            "scipy.io",
            "sklearn.datasets",
            "xarray.backends",
            "xarray.tutorial",
            "xarray.open_dataset",
            "xarray.open_dataarray",
            "xarray.open_mfdataset",
            "xarray.open_zarr",
            "xarray.load_dataset",
            "xarray.load_dataarray",
            "torch.load",
            "torch.save",
            "torch.serialization",
            "torch.storage._load_from_bytes",
            "torch.hub",
        ),
        "it imports code, or reads or writes files (some of which it unpickles)",
    ),
}


class Admitted(NamedTuple):
    """A global the policy admits, and how: ``"class"`` (created, never called with
    arguments), ``"constant"`` (used as it is), ``"exact"`` (named by the caller: called as
    pickle calls it) or ``"vetted"`` (a reconstructor: called through ``reconstructor``)."""

    obj: Any
    how: str
    reconstructor: Reconstructor | None = None


def _import_path(entry: str | Any) -> str:
    if isinstance(entry, str):
        return entry
    module, qualname = getattr(entry, "__module__", None), getattr(entry, "__qualname__", None)
    if not module or not qualname:
        raise TypeError(f"allowed entries are import paths or importable types/functions, not {entry!r}")
    return f"{module}.{qualname}"


def _within(path: str, prefix: str) -> bool:
    return path == prefix or path.startswith(prefix + ".")


#: Modules of a package's own tests and examples, refused under any package unless named
#: exactly: importing one runs it (numpy's ``conftest`` imports pytest and hypothesis and sets their state,
#: ``numpy.random._examples.cffi.extending`` loads a C library through cffi).
TEST_MODULES = frozenset({"tests", "testing", "conftest", "_examples"})

#: Classes whose compiled code follows the indices of their state unchecked, refused under a
#: package pattern (named exactly, they are trusted), with the reason; a key names a module
#: (and everything in it) or one class, where its code is. A forged state made them read
#: outside memory when used.
UNCHECKED: dict[str, str] = {
    "scipy.spatial._ckdtree": "its queries follow the tree's indices unchecked",
    "scipy.spatial._kdtree": "its queries follow the tree's indices unchecked",
    "scipy.spatial._qhull": "its compiled routines follow the simplices' indices unchecked",
    "scipy.interpolate._interpnd": "its compiled routines follow the triangulation's indices unchecked",
    "scipy.interpolate._fitpack2": "its Fortran routines trust the knots and degree of its state",
    "scipy.optimize._highspy": "its C++ objects exist only once their constructor ran",
}


def denied(path: str) -> str | None:
    """Return why ``path`` (``module.name``) is always refused, or None."""
    for prefix, reason in DENIED.items():
        if _within(path, prefix):
            return f"{reason}: {_ALWAYS}"
    return None


class Policy:
    """Which globals a restricted load admits, and how each may be used.

    Args:
        allowed: import paths (``"package.module.Name"``, or ``"package.*"`` for the classes
            and constants of a whole package) or the objects themselves, on top of what
            ``safe=True`` admits. Empty: ``safe=True`` alone.

    Raises:
        TypeError: for an entry that is neither a string nor an importable object.
    """

    def __init__(self, allowed: Iterable[str | Any] = ()) -> None:
        paths = {_import_path(entry) for entry in allowed}
        self._exact = frozenset(p for p in paths if not p.endswith(".*"))
        self._packages = (*SAFE_PACKAGES, *(p[:-2] for p in paths if p.endswith(".*")))
        self._classes: dict[int, Any] = {}  # id -> class admitted so far (kept alive)

    def admit(self, module: str, name: str) -> Admitted:
        """Return what ``module.name`` is and how the load may use it.

        Python 2 names are mapped first, as pickle maps them. A dotted name is followed
        through attributes, as pickle does from protocol 4 on: it may pass through no dunder
        attribute (``Class.__init__.__globals__``) and, unless named exactly, through no
        module outside the allowed packages; what it resolves to may not be a module, and
        must be defined inside an allowed package unless named exactly or vetted.

        Raises:
            UnsafeLoadError: naming the global and why it is refused; nothing of it ran.
        """
        if (module, name) in _compat_pickle.NAME_MAPPING:
            module, name = _compat_pickle.NAME_MAPPING[(module, name)]
        elif module in _compat_pickle.IMPORT_MAPPING:
            module = _compat_pickle.IMPORT_MAPPING[module]
        path = f"{module}.{name}"
        parts = name.split(".")
        vetted = REGISTRY.get(path)
        reason = None if vetted is not None else denied(path)
        if reason:
            raise UnsafeLoadError(module, name, reason)
        if len(parts) > 1 and any(part.startswith("__") for part in parts):
            raise UnsafeLoadError(module, name, "it reaches through a dunder attribute")
        if vetted is not None and not (vetted.package is None or self._inside(vetted.package) or path in self._exact):
            raise UnsafeLoadError(module, name, f"a reconstructor of {vetted.package}: allow '{vetted.package}.*'")
        trusted = vetted is not None or path in self._exact or path in SAFE_CLASSES
        if not trusted and not self._inside(module):
            raise UnsafeLoadError(module, name, "it lies outside the allowed packages and names")
        if not trusted and not TEST_MODULES.isdisjoint(path.split(".")):
            raise UnsafeLoadError(module, name, "it is a package's test or example code, which runs as it is imported")
        if not trusted and parts[0].startswith("__"):
            raise UnsafeLoadError(module, name, "a package pattern admits no dunder name: name it exactly")
        obj, holder = self._resolve(module, name, trusted)
        if isinstance(obj, ModuleType):
            raise UnsafeLoadError(module, name, "it is a module")
        home = _home(obj)
        if vetted is None and home in REGISTRY:  # another name of a vetted reconstructor
            return self.admit(*home.rsplit(".", 1))
        homes = _homes(obj) if vetted is None else []
        for where in homes:
            reason = denied(where)
            if reason:
                raise UnsafeLoadError(module, name, f"it is {where}: {reason}")
        if vetted is not None:
            how = "vetted"
        elif path in self._exact:
            how = "exact"
        elif isinstance(obj, type):
            how = "class"
        elif callable(obj):
            raise UnsafeLoadError(
                module, name, f"a package pattern admits classes and data, not functions: name {path!r} exactly"
            )
        else:
            how = "constant"
        if path not in self._exact and vetted is None and path not in SAFE_CLASSES:
            defined = getattr(obj, "__module__", None) if how == "class" else holder
            if not isinstance(defined, str) or not self._inside(defined):
                raise UnsafeLoadError(module, name, f"it is defined in {defined}, {_OUTSIDE}")
            unchecked = next((UNCHECKED[p] for p in UNCHECKED for where in homes if _within(where, p)), None)
            if unchecked:
                raise UnsafeLoadError(
                    module, name, f"{unchecked}: a package pattern does not admit it, name it exactly"
                )
        if isinstance(obj, type):
            self._classes[id(obj)] = obj
        return Admitted(obj, how, vetted)

    def admitted(self, cls: Any) -> bool:
        """Whether the class ``cls`` was admitted by this load (as a global it imported)."""
        return self._classes.get(id(cls)) is cls

    def family(self, cls: type) -> bool:
        """Whether ``cls`` belongs to a `registry.FAMILIES` entry whose package is allowed:
        then it may be called with plain data."""
        for family in FAMILIES:
            module, _, name = family.base.rpartition(".")
            if not self._inside(family.package):
                continue
            try:
                base = getattr(importlib.import_module(module), name)
            except (ImportError, AttributeError):
                continue
            if issubclass(cls, base):
                return True
        return False

    def refusal(self, module: str, name: str) -> str | None:
        """Return why ``module.name`` would be refused, or None if it would be admitted (it
        may still be refused for how the pickle uses it)."""
        try:
            self.admit(module, name)
        except UnsafeLoadError as exc:
            return exc.reason
        except (ImportError, AttributeError) as exc:
            return f"{module}.{name} cannot be imported: {exc}"
        return None

    def _resolve(self, module: str, name: str, trusted: bool) -> tuple[Any, str]:
        """Import ``module`` and follow ``name`` through its attributes; return the object and
        the name of the last module passed through. Unless ``trusted``, refuse to pass through
        a module outside the allowed packages, or through an object that is neither a module
        nor a class (whose attributes would be read, and could be changed through what they
        give: a bit generator of numpy's global random state)."""
        obj = holder = importlib.import_module(module)
        parts = name.split(".")
        for i, part in enumerate(parts):
            if i and not trusted and not isinstance(obj, (type, ModuleType)):
                raise UnsafeLoadError(
                    module,
                    name,
                    f"it reaches through {'.'.join(parts[:i])}, a {type(obj).__name__}: a module's "
                    "object (numpy's global random state) is reached only through modules and classes",
                )
            obj = getattr(obj, part)
            if isinstance(obj, ModuleType):
                if not trusted and not self._inside(obj.__name__):
                    raise UnsafeLoadError(module, name, f"it reaches through module {obj.__name__}, {_OUTSIDE}")
                holder = obj
        return obj, holder.__name__

    def _inside(self, module: str) -> bool:
        """Whether ``module`` lies in an allowed package: by its name, or by the name of the
        module imported under it (scikit-learn 1.7's Cython module ``sklearn._loss._loss`` is
        also ``_loss`` in ``sys.modules``, and its classes say ``__module__ == "_loss"``)."""
        imported = sys.modules.get(module)
        names = (module, imported.__name__) if isinstance(imported, ModuleType) else (module,)
        return any(_within(name, package) for name in names for package in self._packages)


def _homes(obj: Any) -> list[str]:
    """Where ``obj`` is defined, and for a class where each of its bases is: a class whose
    base is denied (a subclass of scipy's ``rv_generic``) is denied too. Each by the name it
    gives (``__module__``) and by the module whose code defines it, which a library may
    hide: pandas names ``HDFStore``'s module "pandas", its code is in ``pandas.io``."""
    owners = obj.__mro__ if isinstance(obj, type) else (obj,)
    homes = [_home(owner) for owner in owners]
    homes += [f"{module}.{owner.__qualname__}" for owner in owners if (module := _code_module(owner)) is not None]
    return [home for home in homes if home]


def _code_module(obj: Any) -> str | None:
    """The module whose code defines ``obj``: the globals of a Python function, or of the
    first method written in a class's body; None for anything else (a builtin, a compiled
    class, a constant)."""
    if isinstance(obj, type):
        return _class_code_module(obj)
    return _function_module(obj) if isinstance(obj, FunctionType) else None


@functools.lru_cache(maxsize=1024)
def _class_code_module(cls: type) -> str | None:
    """The module of the first method written in ``cls``'s body, or None."""
    for value in vars(cls).values():
        function = value.__func__ if isinstance(value, (staticmethod, classmethod)) else value
        if isinstance(function, FunctionType) and function.__qualname__.startswith(f"{cls.__qualname__}."):
            module = _function_module(function)
            if module is not None:
                return module
    return None


def _function_module(function: FunctionType) -> str | None:
    """The module of ``function``'s code, decorations (``functools.wraps``) unwrapped."""
    module = getattr(inspect.unwrap(function), "__globals__", {}).get("__name__")
    return module if isinstance(module, str) else None


def _home(obj: Any) -> str:
    """``module.qualname`` where ``obj`` is defined ("" when it does not say: a constant)."""
    if isinstance(obj, type) or callable(obj):
        module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
        if isinstance(module, str) and isinstance(qualname, str):
            return f"{module}.{qualname}"
        if isinstance(module, str):
            return f"{module}.?"
    return ""
