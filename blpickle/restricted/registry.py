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

import datetime
import importlib
import re
import sys
from collections import Counter, OrderedDict, defaultdict, deque
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from .. import tensors
from ..arrays import rebuild_ndarray, rebuild_view
from ..errors import CorruptError, UnsafeLoadError
from .numpy_state import Pending

__all__ = ["FAMILIES", "REGISTRY", "STATE_CHECKS", "Context", "Family", "Reconstructor", "call_member", "load_callable"]

#: The longest type code accepted for ``numpy.dtype(code, align, copy)``.
_MAX_CODE = 64
#: Builtin types a ``defaultdict`` may make its missing values with.
_FACTORIES = (list, dict, set, frozenset, tuple, int, float, complex, str, bytes, bool, OrderedDict, Counter)
#: An IANA time zone key, as `zoneinfo` accepts them (no path traversal).
_ZONE_KEY = re.compile(r"[A-Za-z0-9_+-]+(/[A-Za-z0-9_+-]+)*\Z")


class Context:
    """What a reconstructor's check asks of the load that calls it.

    Args:
        admitted: whether a class is one the load admits (by the policy, whichever name
            the pickle used for it).
    """

    def __init__(self, admitted: Callable[[Any], bool]) -> None:
        self.admitted = admitted

    def subclass(self, cls: Any, base: type, what: str) -> type:
        """Return ``cls`` if it is an admitted subclass of ``base``; raise `CorruptError`."""
        if not (isinstance(cls, type) and issubclass(cls, base) and self.admitted(cls)):
            raise CorruptError(f"{what} builds admitted subclasses of {base.__qualname__}, not {cls!r:.80}")
        return cls


class Reconstructor(NamedTuple):
    """A vetted reconstructor: ``check(args, context)`` calls the function with checked
    arguments; ``package`` is the package pattern the caller must allow (None: always)."""

    check: Callable[[tuple[Any, ...], Context], Any]
    package: str | None = None


def _arity(args: tuple[Any, ...], low: int, high: int, what: str) -> None:
    if not low <= len(args) <= high:
        raise CorruptError(f"{what} takes {low} to {high} arguments in safe mode, the pickle gives {len(args)}")


def _types(args: tuple[Any, ...], types: tuple[tuple[type, ...], ...], what: str) -> tuple[Any, ...]:
    """Return ``args`` if each is an instance of its ``types`` entry (same count); raise."""
    if len(args) != len(types) or not all(isinstance(a, t) for a, t in zip(args, types, strict=True)):
        raise CorruptError(f"{what} takes {len(types)} arguments of other types in safe mode, not {args!r:.120}")
    return args


# -- builtins -----------------------------------------------------------------------------


def _collection(cls: type) -> Callable[[tuple[Any, ...], Context], Any]:
    def check(args: tuple[Any, ...], context: Context) -> Any:
        _arity(args, 0, 1, cls.__name__)
        if args and not isinstance(args[0], (list, tuple, set, frozenset, dict)):
            raise CorruptError(f"{cls.__name__}() takes a list in safe mode, not {type(args[0]).__name__}")
        return cls(*args)

    return check


def _bytearray(args: tuple[Any, ...], context: Context) -> bytearray:
    _arity(args, 0, 2, "bytearray")
    if len(args) == 2:
        return bytearray(_latin1(args, context))
    if args and type(args[0]) not in (bytes, bytearray):
        raise CorruptError(f"bytearray() takes bytes in safe mode, not {type(args[0]).__name__}")
    return bytearray(*args)


def _bytes(args: tuple[Any, ...], context: Context) -> bytes:
    _arity(args, 0, 1, "bytes")
    if args and not isinstance(args[0], (bytes, bytearray)):
        raise CorruptError(f"bytes() takes bytes in safe mode, not {type(args[0]).__name__}")
    return bytes(*args)


def _latin1(args: tuple[Any, ...], context: Context) -> bytes:
    """``str.encode`` of ``(text, "latin1")``, the way protocols 0-2 write bytes."""
    _arity(args, 2, 2, "encode")
    text, encoding = args
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise CorruptError(f"bytes are encoded from a str as latin1 in safe mode, not {args!r:.80}")
    return text.encode("latin-1")


def _numbers(cls: type) -> Callable[[tuple[Any, ...], Context], Any]:
    def check(args: tuple[Any, ...], context: Context) -> Any:
        _arity(args, 0, 3, cls.__name__)
        if not all(arg is None or type(arg) in (int, float, bool) for arg in args):
            raise CorruptError(f"{cls.__name__}() takes numbers in safe mode, not {args!r:.80}")
        if cls is complex and (len(args) > 2 or None in args):
            raise CorruptError(f"complex() takes two numbers, not {args!r:.80}")
        return cls(*args)

    return check


# -- collections, datetime, decimal, fractions, zoneinfo -------------------------------------


def _ordered_dict(args: tuple[Any, ...], context: Context) -> OrderedDict[Any, Any]:
    _arity(args, 0, 1, "OrderedDict")
    if args and not isinstance(args[0], (list, dict)):
        raise CorruptError(f"OrderedDict() takes a list of pairs in safe mode, not {type(args[0]).__name__}")
    return OrderedDict(*args)


def _defaultdict(args: tuple[Any, ...], context: Context) -> defaultdict[Any, Any]:
    _arity(args, 0, 2, "defaultdict")
    if args and not (args[0] is None or args[0] in _FACTORIES):
        raise CorruptError(
            f"a defaultdict makes its values with a builtin container or number type in safe mode, not {args[0]!r:.80}"
        )
    if len(args) == 2 and not isinstance(args[1], dict):
        raise CorruptError(f"defaultdict()'s items must be a dict, not {type(args[1]).__name__}")
    return defaultdict(*args)


def _counter(args: tuple[Any, ...], context: Context) -> Counter[Any]:
    _arity(args, 0, 1, "Counter")
    if args and not isinstance(args[0], dict):
        raise CorruptError(f"Counter() takes a dict in safe mode, not {type(args[0]).__name__}")
    return Counter(*args)


def _deque(args: tuple[Any, ...], context: Context) -> deque[Any]:
    _arity(args, 0, 2, "deque")
    if args and not isinstance(args[0], (list, tuple)):
        raise CorruptError(f"deque() takes a list in safe mode, not {type(args[0]).__name__}")
    if len(args) == 2 and not (args[1] is None or type(args[1]) is int):
        raise CorruptError(f"a deque's maxlen is an int, not {args[1]!r:.80}")
    return deque(*args)


def _datetime(cls: type, sizes: tuple[int, ...]) -> Callable[[tuple[Any, ...], Context], Any]:
    """``datetime``, ``date`` and ``time`` from their pickled bytes (and a tzinfo)."""

    def check(args: tuple[Any, ...], context: Context) -> Any:
        _arity(args, 1, 2, cls.__name__)
        data, tz = args[0], (args[1] if len(args) == 2 else None)
        if type(data) is not bytes or len(data) not in sizes or not (tz is None or isinstance(tz, datetime.tzinfo)):
            raise CorruptError(f"datetime.{cls.__name__} takes its pickled bytes in safe mode, not {args!r:.80}")
        return cls(data, tz) if len(args) == 2 else cls(data)

    return check


def _timedelta(args: tuple[Any, ...], context: Context) -> datetime.timedelta:
    _arity(args, 0, 3, "timedelta")
    if not all(type(arg) is int for arg in args):
        raise CorruptError(f"datetime.timedelta takes days, seconds and microseconds, not {args!r:.80}")
    return datetime.timedelta(*args)


def _timezone(args: tuple[Any, ...], context: Context) -> datetime.timezone:
    _arity(args, 1, 2, "timezone")
    if not isinstance(args[0], datetime.timedelta) or (len(args) == 2 and type(args[1]) is not str):
        raise CorruptError(f"datetime.timezone takes an offset and a name, not {args!r:.80}")
    return datetime.timezone(*args)


def _string_number(cls: type, text: re.Pattern[str]) -> Callable[[tuple[Any, ...], Context], Any]:
    """``Decimal(text)`` and ``Fraction(numerator, denominator)``: whole numbers, or text that
    ``text`` matches (no exponent for a Fraction: ``"1e1000000000"`` would compute 10**10**9)."""

    def check(args: tuple[Any, ...], context: Context) -> Any:
        _arity(args, 1, 2, cls.__name__)
        if not all(type(arg) is int or (type(arg) is str and len(arg) < 10_000 and text.match(arg)) for arg in args):
            raise CorruptError(f"{cls.__name__} takes text or whole numbers in safe mode, not {args!r:.80}")
        return cls(*args)

    return check


def _zone_key(key: Any) -> None:
    """Refuse anything but an IANA time zone key (``Europe/Paris``): no path traversal."""
    if type(key) is not str or len(key) > 255 or not _ZONE_KEY.match(key):
        raise CorruptError(f"{key!r:.80} is not a time zone key")


def _zone(args: tuple[Any, ...], context: Context) -> Any:
    """``ZoneInfo._unpickle(key, from_cache)``: a time zone of the system's database."""
    key, from_cache = _types(args, ((str,), (int,)), "ZoneInfo._unpickle")
    _zone_key(key)
    zoneinfo = importlib.import_module("zoneinfo")
    return zoneinfo.ZoneInfo._unpickle(key, from_cache)


def _pytz(args: tuple[Any, ...], context: Context) -> Any:
    """``pytz._p(zone, utcoffset, dstoffset, tzname)``: a time zone of pytz's database."""
    _arity(args, 1, 4, "pytz._p")
    zone, rest = args[0], args[1:]
    _zone_key(zone)
    if not all(type(arg) in (int, str) or arg is None for arg in rest):
        raise CorruptError(f"a pytz time zone takes offsets in seconds and a name, not {rest!r:.80}")
    return importlib.import_module("pytz")._p(*args)


def _pytz_utc(args: tuple[Any, ...], context: Context) -> Any:
    _arity(args, 0, 0, "pytz._UTC")
    return importlib.import_module("pytz").utc


#: ``getattr(cls, name)`` is called only for these pairs, and gives what they map to: a
#: reconstructor reached as an attribute of a class (pickle's spelling of a class method).
_ATTRIBUTES: dict[tuple[str, str], Callable[[tuple[Any, ...], Context], Any]] = {
    ("zoneinfo.ZoneInfo", "_unpickle"): _zone,
}


class _Bound:
    """A reconstructor that `getattr` gave: calling it calls its check."""

    __slots__ = ("check",)

    def __init__(self, check: Callable[[tuple[Any, ...], Context], Any]) -> None:
        self.check = check


def _getattr(args: tuple[Any, ...], context: Context) -> _Bound:
    _arity(args, 2, 2, "getattr")
    cls, name = args
    key = (f"{getattr(cls, '__module__', '?')}.{getattr(cls, '__qualname__', '?')}", name)
    if not isinstance(cls, type) or not context.admitted(cls) or key not in _ATTRIBUTES:
        raise UnsafeLoadError("builtins", "getattr", f"safe mode reads no attribute {name!r:.80} of {cls!r:.80}")
    return _Bound(_ATTRIBUTES[key])


def load_callable(func: Any) -> Callable[[tuple[Any, ...], Context], Any] | None:
    """Return the check of a reconstructor that `getattr` gave (None for anything else)."""
    return func.check if type(func) is _Bound else None


def _reconstructor(args: tuple[Any, ...], context: Context) -> Any:
    """``copyreg._reconstructor(cls, base, state)``: how protocols 0 and 1 make instances of
    an admitted class, from ``object`` or from a builtin container or scalar type."""
    cls, base, state = _types(args, ((type,), (type,), (object,)), "copyreg._reconstructor")
    from_base = (base is object and state is None) or (base in _RECONSTRUCTOR_BASES and isinstance(state, base))
    if from_base and context.admitted(cls) and issubclass(cls, base):
        return importlib.import_module("copyreg")._reconstructor(cls, base, state)
    raise CorruptError(
        f"copyreg._reconstructor makes admitted classes from object or a builtin type, not {args!r:.120}"
    )


#: The builtin bases `copyreg._reconstructor` may make instances from, with a state of that type.
_RECONSTRUCTOR_BASES = (list, dict, set, frozenset, tuple, int, float, complex, str, bytes)


# -- numpy ----------------------------------------------------------------------------------


def _dtype(args: tuple[Any, ...], context: Context) -> Any:
    _arity(args, 1, 3, "numpy.dtype")
    code = args[0]
    if isinstance(code, type):
        if not (issubclass(code, np.generic) and context.admitted(code)):
            raise CorruptError(f"numpy.dtype takes an admitted numpy scalar type in safe mode, not {code!r:.80}")
    elif not isinstance(code, str) or len(code) > _MAX_CODE:
        raise CorruptError(f"numpy.dtype takes a type code or scalar type and two flags in safe mode, not {args!r:.80}")
    if not all(type(flag) in (bool, int) for flag in args[1:]):
        raise CorruptError(f"numpy.dtype takes a type code or scalar type and two flags in safe mode, not {args!r:.80}")
    try:
        np.dtype(code)  # check it now
    except Exception as exc:  # numpy raises TypeError, ValueError, even SyntaxError for some codes
        raise CorruptError(f"numpy.dtype refuses the type code {code!r}: {exc}") from None
    return Pending("dtype", args)


def _reconstruct(args: tuple[Any, ...], context: Context) -> Any:
    _arity(args, 3, 3, "numpy _reconstruct")
    if args[0] is np.ndarray:
        return Pending("array", args)
    raise CorruptError(f"numpy _reconstruct rebuilds numpy.ndarray in safe mode, not {args[0]!r:.80}")


def _scalar(args: tuple[Any, ...], context: Context) -> Any:
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


def _rebuild(what: str) -> Callable[[tuple[Any, ...], Context], np.ndarray]:
    """The check of an array reconstructor taking (buffer, dtype, shape, order), which
    `rebuild_ndarray` checks (numpy's ``_frombuffer`` takes the same arguments)."""

    def check(args: tuple[Any, ...], context: Context) -> np.ndarray:
        _arity(args, 4, 4, what)
        return rebuild_ndarray(*args)

    return check


def _rebuild_view(args: tuple[Any, ...], context: Context) -> np.ndarray:
    """`rebuild_view` (base, offset, dtype, shape, strides) checks that the view lies inside
    its base, a contiguous array without objects."""
    _arity(args, 5, 5, "blpickle rebuild_view")
    return rebuild_view(*args)


def _tensors(name: str, arity: int) -> Callable[[tuple[Any, ...], Context], Any]:
    """A rebuild function of `blpickle.tensors`, which checks every argument itself."""

    def check(args: tuple[Any, ...], context: Context) -> Any:
        _arity(args, arity, arity, f"blpickle {name}")
        return getattr(tensors, name)(*args)

    return check


def _refuse_ndarray(args: tuple[Any, ...], context: Context) -> None:
    raise UnsafeLoadError("numpy", "ndarray", "safe mode builds arrays only through their reconstructors")


def _bit_generators() -> dict[str, type]:
    return dict(importlib.import_module("numpy.random._pickle").BitGenerators)


def _bit_generator(args: tuple[Any, ...], context: Context) -> Any:
    """``__bit_generator_ctor(cls_or_name)``: a new bit generator of one of numpy's kinds."""
    _arity(args, 0, 1, "numpy __bit_generator_ctor")
    kinds = _bit_generators()
    kind = args[0] if args else "MT19937"
    cls = kinds.get(kind) if isinstance(kind, str) else kind
    if cls is None or cls not in kinds.values():
        raise CorruptError(f"numpy's bit generators are {sorted(kinds)}, not {kind!r:.80}")
    return cls()


def _generator(cls_name: str) -> Callable[[tuple[Any, ...], Context], Any]:
    """``__generator_ctor`` / ``__randomstate_ctor``: a Generator or RandomState over a bit
    generator the pickle built, or named (never a bit generator maker of the pickle's)."""

    def check(args: tuple[Any, ...], context: Context) -> Any:
        random = importlib.import_module("numpy.random")
        _arity(args, 0, 1, f"numpy {cls_name} constructor")
        bits = args[0] if args else "MT19937"
        if isinstance(bits, str):
            bits = _bit_generator((bits,), context)
        if not isinstance(bits, random.BitGenerator):
            raise CorruptError(f"a numpy {cls_name} takes a bit generator, not {bits!r:.80}")
        return getattr(random, cls_name)(bits)

    return check


def _cython_state(base: str, what: str) -> Callable[[tuple[Any, ...], Context], Any]:
    """A Cython ``__pyx_unpickle_<Class>(cls, checksum, state)``: ``cls.__new__(cls)`` and
    the state set into its typed fields (Cython checks their types and the checksum)."""

    def check(args: tuple[Any, ...], context: Context) -> Any:
        module, _, name = base.rpartition(".")
        cls, checksum, state = _types(args, ((type,), (int,), (tuple, type(None))), what)
        context.subclass(cls, getattr(importlib.import_module(module), name), what)
        return getattr(importlib.import_module(module), what)(cls, checksum, state)

    return check


# -- pandas ---------------------------------------------------------------------------------


def _pandas_index(function: str) -> Callable[[tuple[Any, ...], Context], Any]:
    """``_new_Index(cls, d)`` and ``_new_DatetimeIndex(cls, d)``: ``cls(**d)`` for an
    admitted index class and a dict of str keys."""

    def check(args: tuple[Any, ...], context: Context) -> Any:
        pandas = importlib.import_module("pandas")
        cls, fields = _types(args, ((type,), (dict,)), function)
        context.subclass(cls, pandas.Index, function)
        if not all(type(key) is str for key in fields):
            raise CorruptError(f"{function} takes a dict of str keys, not {list(fields)!r:.80}")
        data = fields.get("data")
        if data is not None and not isinstance(data, (np.ndarray, pandas.api.extensions.ExtensionArray, pandas.Index)):
            raise CorruptError(f"{function} takes its data as an array, not a {type(data).__name__}")
        module = "pandas.core.indexes.datetimes" if "Datetime" in function else "pandas.core.indexes.base"
        return getattr(importlib.import_module(module), function)(cls, fields)

    return check


def _pandas_block(args: tuple[Any, ...], context: Context) -> Any:
    """``_unpickle_block(values, placement, ndim)``: a block of a frame's columns."""
    pandas = importlib.import_module("pandas")
    internals = importlib.import_module("pandas._libs.internals")
    values, placement, ndim = _types(
        args,
        ((np.ndarray, pandas.api.extensions.ExtensionArray), (slice, np.ndarray, internals.BlockPlacement), (int,)),
        "pandas _unpickle_block",
    )
    if ndim not in (1, 2):
        raise CorruptError(f"a pandas block has 1 or 2 dimensions, not {ndim}")
    return internals._unpickle_block(values, placement, ndim)


def _pandas_manager(args: tuple[Any, ...], context: Context) -> Any:
    """``BlockManager(blocks, axes)``: a frame's blocks and its axes."""
    pandas = importlib.import_module("pandas")
    internals = importlib.import_module("pandas._libs.internals")
    blocks, axes = _types(args, ((tuple,), (list,)), "pandas BlockManager")
    if not all(isinstance(block, internals.Block) for block in blocks) or not all(
        isinstance(axis, pandas.Index) for axis in axes
    ):
        raise CorruptError(f"a pandas BlockManager takes blocks and indexes, not {args!r:.120}")
    if len(axes) != 2:
        raise CorruptError(f"a pandas BlockManager has two axes, not {len(axes)}")
    placed = np.concatenate([block.mgr_locs.as_array for block in blocks]) if blocks else np.zeros(0, np.intp)
    if not np.array_equal(np.sort(placed), np.arange(len(axes[0]))):
        raise CorruptError(f"a pandas BlockManager's blocks must place each of its {len(axes[0])} columns once")
    for block in blocks:
        if block.shape != (len(block.mgr_locs), len(axes[1])):
            raise CorruptError(f"a pandas block of shape {block.shape} does not fit its frame")
    return importlib.import_module("pandas.core.internals.managers").BlockManager(blocks, axes)


def _pandas_timestamp(args: tuple[Any, ...], context: Context) -> Any:
    """``_unpickle_timestamp(value, freq, tz, reso)``."""
    _arity(args, 3, 4, "pandas _unpickle_timestamp")
    value, freq, tz = args[:3]
    if type(value) is not int or not (tz is None or isinstance(tz, datetime.tzinfo)):
        raise CorruptError(f"a pandas Timestamp is an int and a time zone, not {args!r:.80}")
    if freq is not None or (len(args) == 4 and type(args[3]) is not int):
        raise CorruptError(f"a pandas Timestamp's freq is None and its resolution an int, not {args!r:.80}")
    timestamps = importlib.import_module("pandas._libs.tslibs.timestamps")
    return timestamps._unpickle_timestamp(*args)


def _pandas_timedelta(args: tuple[Any, ...], context: Context) -> Any:
    """``_timedelta_unpickle(value, reso)``."""
    _types(args, ((int,), (int,)), "pandas _timedelta_unpickle")
    return importlib.import_module("pandas._libs.tslibs.timedeltas")._timedelta_unpickle(*args)


def _pandas_nat(args: tuple[Any, ...], context: Context) -> Any:
    """``_nat_unpickle(None)``: pandas' NaT."""
    _arity(args, 0, 1, "pandas _nat_unpickle")
    if args and args[0] is not None:
        raise CorruptError(f"pandas _nat_unpickle takes None, not {args[0]!r:.80}")
    return importlib.import_module("pandas").NaT


# -- scikit-learn ---------------------------------------------------------------------------


def _sklearn_tree(args: tuple[Any, ...], context: Context) -> Any:
    """``Tree(n_features, n_classes, n_outputs)``: its state comes with ``BUILD``, which
    sklearn checks (node dtype and count)."""
    n_features, n_classes, n_outputs = _types(args, ((int,), (np.ndarray,), (int,)), "sklearn Tree")
    if n_classes.dtype.kind not in "iu" or n_classes.ndim != 1 or len(n_classes) != n_outputs or n_features < 0:
        raise CorruptError(f"a sklearn Tree takes a count of features, classes and outputs, not {args!r:.120}")
    return importlib.import_module("sklearn.tree._tree").Tree(n_features, n_classes, n_outputs)


def _sklearn_new(module: str, base: str) -> Callable[[tuple[Any, ...], Context], Any]:
    """sklearn's Cython ``newObj(cls)``: ``cls.__new__(cls)`` for an admitted subclass of
    ``base`` (a binary tree, a distance metric)."""

    def check(args: tuple[Any, ...], context: Context) -> Any:
        (cls,) = _types(args, ((type,),), f"{module}.newObj")
        context.subclass(cls, getattr(importlib.import_module(module), base), f"{module}.newObj")
        return cls.__new__(cls)

    return check


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
        raise CorruptError(f"{cls.__qualname__} is called with plain data in safe mode, not {args!r:.120}")
    return cls(*args)


def _is_na(value: Any) -> bool:
    pandas = sys.modules.get("pandas")
    return pandas is not None and value is pandas.NA


#: Families of classes that pickle calls with arguments.
FAMILIES = (
    # pandas date offsets: (n, normalize, and a weekday, holidays, ...)
    Family("pandas._libs.tslibs.offsets.BaseOffset", "pandas"),
    # pandas extension dtypes: StringDtype(storage, na_value)
    Family("pandas.core.dtypes.base.ExtensionDtype", "pandas"),
)


def _random_state(obj: Any) -> None:
    """Check the state numpy accepted for a bit generator, a RandomState or a Generator: numpy
    checks its types only, and a position out of range crashes the next draw."""
    random = importlib.import_module("numpy.random")
    if isinstance(obj, random.RandomState):
        bits = obj._bit_generator
    else:
        bits = obj.bit_generator if isinstance(obj, random.Generator) else obj
    state = bits.state
    inner = state.get("state", {})
    if "pos" in inner and not (0 <= inner["pos"] <= 624 and np.shape(inner.get("key")) == (624,)):
        raise CorruptError(f"an MT19937 state must have a position within its 624 words, not {inner['pos']!r:.40}")
    if "buffer_pos" in state and not 0 <= state["buffer_pos"] <= np.size(state.get("buffer", ())):
        raise CorruptError(f"a Philox state must have a buffer position within its buffer, not {state['buffer_pos']}")
    if state.get("has_uint32", 0) not in (0, 1):
        raise CorruptError("a bit generator's has_uint32 must be 0 or 1")


def _tree_state(tree: Any) -> None:
    """Check a sklearn Tree's nodes: children are nodes of the tree (or -1, a leaf) and
    features are features it has (or -2): sklearn's ``__setstate__`` checks neither, and
    prediction follows them through memory."""
    state = tree.__getstate__()
    nodes, count = state["nodes"], state["node_count"]
    for side in ("left_child", "right_child"):
        if len(nodes) and not ((nodes[side] >= -1) & (nodes[side] < count)).all():
            raise CorruptError(f"a sklearn Tree's {side} must name nodes of the tree")
    if len(nodes) and not ((nodes["feature"] >= -2) & (nodes["feature"] < tree.n_features)).all():
        raise CorruptError("a sklearn Tree's nodes must split on features it has")


#: Checks of an object's state after ``BUILD`` set it, by the import path of its class (or a
#: base): for states whose library checks their types but not their values.
STATE_CHECKS: dict[str, Callable[[Any], None]] = {
    "numpy.random.bit_generator.BitGenerator": _random_state,
    "numpy.random.mtrand.RandomState": _random_state,
    "numpy.random._generator.Generator": _random_state,
    "sklearn.tree._tree.Tree": _tree_state,
}

#: The text of a Decimal (its exponent costs nothing: a Decimal stores it).
_DECIMAL = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)(E[-+]?\d+)?\Z|[-+]?(Infinity|s?NaN\d*)\Z", re.IGNORECASE)

_np = "numpy._core"
_SCALAR = importlib.import_module(f"{_np}.multiarray").scalar
_PANDAS = "pandas"
_SKLEARN = "sklearn"

#: The vetted reconstructors, by import path (pickle's ``module.name``).
REGISTRY: dict[str, Reconstructor] = {
    # builtins that pickle protocols 0-5 use for containers and scalars
    "builtins.set": Reconstructor(_collection(set)),
    "builtins.frozenset": Reconstructor(_collection(frozenset)),
    "builtins.bytes": Reconstructor(_bytes),  # empty bytes at protocols 0-2
    "builtins.bytearray": Reconstructor(_bytearray),
    "builtins.complex": Reconstructor(_numbers(complex)),
    "builtins.slice": Reconstructor(_numbers(slice)),
    "builtins.range": Reconstructor(_numbers(range)),
    "builtins.getattr": Reconstructor(_getattr),  # only the pairs of _ATTRIBUTES
    "_codecs.encode": Reconstructor(_latin1),  # bytes at protocols 0-2
    "copyreg._reconstructor": Reconstructor(_reconstructor),  # instances at protocols 0-1
    "collections.OrderedDict": Reconstructor(_ordered_dict),
    "collections.defaultdict": Reconstructor(_defaultdict),
    "collections.Counter": Reconstructor(_counter),
    "collections.deque": Reconstructor(_deque),
    "datetime.datetime": Reconstructor(_datetime(datetime.datetime, (10,))),
    "datetime.date": Reconstructor(_datetime(datetime.date, (4,))),
    "datetime.time": Reconstructor(_datetime(datetime.time, (6,))),
    "datetime.timedelta": Reconstructor(_timedelta),
    "datetime.timezone": Reconstructor(_timezone),
    "decimal.Decimal": Reconstructor(
        _string_number(
            importlib.import_module("decimal").Decimal,
            re.compile(r"[-+]?(\d+\.?\d*(E[-+]?\d+)?|\.\d+(E[-+]?\d+)?|Infinity|s?NaN\d*)\Z", re.I),
        )
    ),
    "pytz._p": Reconstructor(_pytz),  # the time zones of pandas 2
    "pytz._UTC": Reconstructor(_pytz_utc),
    "fractions.Fraction": Reconstructor(
        _string_number(importlib.import_module("fractions").Fraction, re.compile(r"[-+]?\d+(/\d+)?\Z"))
    ),
    # numpy arrays, dtypes, scalars and random generators (numpy 2 and numpy 1 spellings)
    "numpy.dtype": Reconstructor(_dtype),
    "numpy.ndarray": Reconstructor(_refuse_ndarray),
    **{f"{core}.multiarray._reconstruct": Reconstructor(_reconstruct) for core in (_np, "numpy.core")},
    **{f"{core}.multiarray.scalar": Reconstructor(_scalar) for core in (_np, "numpy.core")},
    **{f"{core}.numeric._frombuffer": Reconstructor(_rebuild("numpy _frombuffer")) for core in (_np, "numpy.core")},
    "numpy.random._pickle.__bit_generator_ctor": Reconstructor(_bit_generator),
    "numpy.random._pickle.__generator_ctor": Reconstructor(_generator("Generator")),
    "numpy.random._pickle.__randomstate_ctor": Reconstructor(_generator("RandomState")),
    "numpy.random.bit_generator.__pyx_unpickle_SeedSequence": Reconstructor(
        _cython_state("numpy.random.bit_generator.SeedSequence", "__pyx_unpickle_SeedSequence")
    ),
    # how blpickle records rebuild arrays (checks sizes, refuses object dtypes) and views
    # of them (checks that the view lies inside its base)
    "blpickle.arrays.rebuild_ndarray": Reconstructor(_rebuild("blpickle rebuild_ndarray")),
    "blpickle.arrays.rebuild_view": Reconstructor(_rebuild_view),
    # how blpickle records rebuild torch storages, tensors and parameters and jax arrays
    "blpickle.tensors.rebuild_storage": Reconstructor(_tensors("rebuild_storage", 1)),
    "blpickle.tensors.rebuild_tensor": Reconstructor(_tensors("rebuild_tensor", 6)),
    "blpickle.tensors.rebuild_parameter": Reconstructor(_tensors("rebuild_parameter", 2)),
    "blpickle.tensors.rebuild_jax_array": Reconstructor(_tensors("rebuild_jax_array", 1)),
    # pandas: datetime, categorical, period, interval and extension columns, indexes, blocks
    "pandas._libs.arrays.__pyx_unpickle_NDArrayBacked": Reconstructor(
        _cython_state("pandas._libs.arrays.NDArrayBacked", "__pyx_unpickle_NDArrayBacked"), _PANDAS
    ),
    "pandas._libs.interval.__pyx_unpickle_IntervalMixin": Reconstructor(
        _cython_state("pandas._libs.interval.IntervalMixin", "__pyx_unpickle_IntervalMixin"), _PANDAS
    ),
    "pandas._libs.internals._unpickle_block": Reconstructor(_pandas_block, _PANDAS),
    "pandas.core.internals.managers.BlockManager": Reconstructor(_pandas_manager, _PANDAS),
    "pandas.core.indexes.base._new_Index": Reconstructor(_pandas_index("_new_Index"), _PANDAS),
    "pandas.core.indexes.datetimes._new_DatetimeIndex": Reconstructor(_pandas_index("_new_DatetimeIndex"), _PANDAS),
    "pandas._libs.tslibs.timestamps._unpickle_timestamp": Reconstructor(_pandas_timestamp, _PANDAS),
    "pandas._libs.tslibs.timedeltas._timedelta_unpickle": Reconstructor(_pandas_timedelta, _PANDAS),
    **{
        f"pandas._libs.tslibs.nattype.{name}": Reconstructor(_pandas_nat, _PANDAS)
        for name in ("_nat_unpickle", "__nat_unpickle")  # pandas 3, pandas 2
    },
    # scikit-learn: trees, neighbours' binary trees and distance metrics
    "sklearn.tree._tree.Tree": Reconstructor(_sklearn_tree, _SKLEARN),
    "sklearn.neighbors._kd_tree.newObj": Reconstructor(
        _sklearn_new("sklearn.neighbors._kd_tree", "BinaryTree64"), _SKLEARN
    ),
    "sklearn.neighbors._ball_tree.newObj": Reconstructor(
        _sklearn_new("sklearn.neighbors._ball_tree", "BinaryTree64"), _SKLEARN
    ),
    "sklearn.metrics._dist_metrics.newObj": Reconstructor(
        _sklearn_new("sklearn.metrics._dist_metrics", "DistanceMetric"), _SKLEARN
    ),
}
