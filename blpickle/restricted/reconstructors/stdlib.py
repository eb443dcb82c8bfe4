"""The vetted reconstructors of the standard library: the builtins and ``copyreg`` names that
pickle protocols 0-5 write for containers, scalars and instances; collections, datetime,
decimal, fractions and time zones (``zoneinfo``, and pytz's, which pandas 2 writes)."""

from __future__ import annotations

import datetime
import importlib
import re
from collections import Counter, OrderedDict, defaultdict, deque
from collections.abc import Callable
from typing import Any

from ...errors import CorruptError, UnsafeLoadError
from ..shown import shown
from .checks import Check, Context, Reconstructor, awaiting_state, check_arity, check_types

__all__ = ["RECONSTRUCTORS", "STATE_CHECKS", "load_callable"]

#: Builtin types a ``defaultdict`` may make its missing values with.
_FACTORIES = (list, dict, set, frozenset, tuple, int, float, complex, str, bytes, bool, OrderedDict, Counter)
#: An IANA time zone key, as `zoneinfo` accepts them (no path traversal).
_ZONE_KEY = re.compile(r"[A-Za-z0-9_+-]+(/[A-Za-z0-9_+-]+)*\Z")
#: The text of a Decimal (its exponent costs nothing: a Decimal stores it) and of a Fraction.
_DECIMAL = re.compile(r"[-+]?(\d+\.?\d*(E[-+]?\d+)?|\.\d+(E[-+]?\d+)?|Infinity|s?NaN\d*)\Z", re.IGNORECASE)
_FRACTION = re.compile(r"[-+]?\d+(/\d+)?\Z")
#: The builtin bases `copyreg._reconstructor` may make instances from, with a state of that type.
_RECONSTRUCTOR_BASES = (list, dict, set, frozenset, tuple, int, float, complex, str, bytes)


# -- builtins -----------------------------------------------------------------------------


def _copying_items(args: tuple[Any, ...], context: Context, position: int = 0, size: int = 32) -> None:
    """Count the copy of the items of the container ``args[position]``, if given, at ``size``
    bytes each (a hash table's slots; a pointer in a sequence; a str's or bytes' own bytes at
    one each): the same list named again and again from the memo is not copied each time."""
    if len(args) > position and isinstance(args[position], (list, tuple, set, frozenset, dict)):
        context.copying(size * len(args[position]))
    elif len(args) > position and isinstance(args[position], (str, bytes)):
        context.copying(len(args[position]))


def _collection(cls: type) -> Check:
    def check(args: tuple[Any, ...], context: Context) -> Any:
        check_arity(args, 0, 1, cls.__name__)
        if args and not isinstance(args[0], (list, tuple, set, frozenset, dict)):
            raise CorruptError(f"{cls.__name__}() takes a list in safe mode, not {type(args[0]).__name__}")
        _copying_items(args, context)
        return cls(*args)

    return check


def _bytearray(args: tuple[Any, ...], context: Context) -> bytearray:
    check_arity(args, 0, 2, "bytearray")
    if len(args) == 2:
        args = (_latin1(args, context),)
    if args and type(args[0]) not in (bytes, bytearray):
        raise CorruptError(f"bytearray() takes bytes in safe mode, not {type(args[0]).__name__}")
    if args:
        context.copying(len(args[0]))
    return bytearray(*args)


def _bytes(args: tuple[Any, ...], context: Context) -> bytes:
    check_arity(args, 0, 1, "bytes")
    if args and not isinstance(args[0], (bytes, bytearray)):
        raise CorruptError(f"bytes() takes bytes in safe mode, not {type(args[0]).__name__}")
    if args and type(args[0]) is not bytes:  # bytes(b) of bytes is b itself
        context.copying(len(args[0]))
    return bytes(*args)


def _latin1(args: tuple[Any, ...], context: Context) -> bytes:
    """``str.encode`` of ``(text, "latin1")``, the way protocols 0-2 write bytes."""
    check_arity(args, 2, 2, "encode")
    text, encoding = args
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise CorruptError(f"bytes are encoded from a str as latin1 in safe mode, not {shown(args)}")
    context.copying(len(text))
    return text.encode("latin-1")


def _numbers(cls: type) -> Check:
    def check(args: tuple[Any, ...], context: Context) -> Any:
        check_arity(args, 0, 3, cls.__name__)
        if not all(arg is None or type(arg) in (int, float, bool) for arg in args):
            raise CorruptError(f"{cls.__name__}() takes numbers in safe mode, not {shown(args)}")
        if cls is complex and (len(args) > 2 or None in args):
            raise CorruptError(f"complex() takes two numbers, not {shown(args)}")
        return cls(*args)

    return check


# -- collections, datetime, decimal, fractions, zoneinfo -------------------------------------


def _ordered_dict(args: tuple[Any, ...], context: Context) -> OrderedDict[Any, Any]:
    check_arity(args, 0, 1, "OrderedDict")
    if args and not isinstance(args[0], (list, dict)):
        raise CorruptError(f"OrderedDict() takes a list of pairs in safe mode, not {type(args[0]).__name__}")
    _copying_items(args, context)
    return OrderedDict(*args)


def _defaultdict(args: tuple[Any, ...], context: Context) -> defaultdict[Any, Any]:
    check_arity(args, 0, 2, "defaultdict")
    if args and not (args[0] is None or args[0] in _FACTORIES):
        raise CorruptError(
            f"a defaultdict makes its values with a builtin container or number type in safe mode, not {shown(args[0])}"
        )
    if len(args) == 2 and not isinstance(args[1], dict):
        raise CorruptError(f"defaultdict()'s items must be a dict, not {type(args[1]).__name__}")
    _copying_items(args, context, 1)
    return defaultdict(*args)


def _counter(args: tuple[Any, ...], context: Context) -> Counter[Any]:
    check_arity(args, 0, 1, "Counter")
    if args and not isinstance(args[0], dict):
        raise CorruptError(f"Counter() takes a dict in safe mode, not {type(args[0]).__name__}")
    _copying_items(args, context)
    return Counter(*args)


def _deque(args: tuple[Any, ...], context: Context) -> deque[Any]:
    check_arity(args, 0, 2, "deque")
    if args and not isinstance(args[0], (list, tuple)):
        raise CorruptError(f"deque() takes a list in safe mode, not {type(args[0]).__name__}")
    if len(args) == 2 and not (args[1] is None or type(args[1]) is int):
        raise CorruptError(f"a deque's maxlen is an int, not {shown(args[1])}")
    _copying_items(args, context, size=8)
    return deque(*args)


def _datetime(cls: type, sizes: tuple[int, ...]) -> Check:
    """``datetime``, ``date`` and ``time`` from their pickled bytes (and a tzinfo)."""

    def check(args: tuple[Any, ...], context: Context) -> Any:
        check_arity(args, 1, 2, cls.__name__)
        data, tz = args[0], (args[1] if len(args) == 2 else None)
        if type(data) is not bytes or len(data) not in sizes or not (tz is None or isinstance(tz, datetime.tzinfo)):
            raise CorruptError(f"datetime.{cls.__name__} takes its pickled bytes in safe mode, not {shown(args)}")
        return cls(data, tz) if len(args) == 2 else cls(data)

    return check


def _timedelta(args: tuple[Any, ...], context: Context) -> datetime.timedelta:
    check_arity(args, 0, 3, "timedelta")
    if not all(type(arg) is int for arg in args):
        raise CorruptError(f"datetime.timedelta takes days, seconds and microseconds, not {shown(args)}")
    return datetime.timedelta(*args)


def _timezone(args: tuple[Any, ...], context: Context) -> datetime.timezone:
    check_arity(args, 1, 2, "timezone")
    if not isinstance(args[0], datetime.timedelta) or (len(args) == 2 and type(args[1]) is not str):
        raise CorruptError(f"datetime.timezone takes an offset and a name, not {shown(args)}")
    return datetime.timezone(*args)


#: The most bits of a whole number given to ``Decimal`` or ``Fraction`` (whose conversion
#: of a number of n bits takes time in n squared).
_MAX_BITS = 1 << 16


def _string_number(cls: type, text: re.Pattern[str]) -> Check:
    """``Decimal(text)`` and ``Fraction(numerator, denominator)``: whole numbers, or text that
    ``text`` matches (no exponent for a Fraction: ``"1e1000000000"`` would compute 10**10**9)."""

    def check(args: tuple[Any, ...], context: Context) -> Any:
        check_arity(args, 1, 2, cls.__name__)
        if not all(
            (type(arg) is int and arg.bit_length() <= _MAX_BITS)
            or (type(arg) is str and len(arg) < 10_000 and text.match(arg))
            for arg in args
        ):
            raise CorruptError(
                f"{cls.__name__} takes text or whole numbers of at most {_MAX_BITS} bits in safe mode, "
                f"not {[type(arg).__name__ for arg in args]}"
            )
        return cls(*args)

    return check


def _zone_key(key: Any) -> None:
    """Refuse anything but an IANA time zone key (``Europe/Paris``): no path traversal."""
    if type(key) is not str or len(key) > 255 or not _ZONE_KEY.match(key):
        raise CorruptError(f"{shown(key)} is not a time zone key")


def _zone(args: tuple[Any, ...], context: Context) -> Any:
    """``ZoneInfo._unpickle(key, from_cache)``: a time zone of the system's database."""
    key, from_cache = check_types(args, ((str,), (int,)), "ZoneInfo._unpickle")
    _zone_key(key)
    zoneinfo = importlib.import_module("zoneinfo")
    return zoneinfo.ZoneInfo._unpickle(key, from_cache)


def _pytz(args: tuple[Any, ...], context: Context) -> Any:
    """``pytz._p(zone, utcoffset, dstoffset, tzname)``: a time zone of pytz's database."""
    check_arity(args, 1, 4, "pytz._p")
    zone, rest = args[0], args[1:]
    _zone_key(zone)
    if not all(type(arg) in (int, str) or arg is None for arg in rest):
        raise CorruptError(f"a pytz time zone takes offsets in seconds and a name, not {shown(rest)}")
    return context.built(importlib.import_module("pytz")._p(*args))  # pytz's own, shared: no BUILD changes it


def _pytz_utc(args: tuple[Any, ...], context: Context) -> Any:
    check_arity(args, 0, 0, "pytz._UTC")
    return context.built(importlib.import_module("pytz").utc)


#: ``getattr(cls, name)`` is called only for these pairs, and gives what they map to: a
#: reconstructor reached as an attribute of a class (pickle's spelling of a class method).
_ATTRIBUTES: dict[tuple[str, str], Check] = {
    ("zoneinfo.ZoneInfo", "_unpickle"): _zone,
}


class _Bound:
    """A reconstructor that `getattr` gave: calling it calls its check."""

    __slots__ = ("check",)

    def __init__(self, check: Check) -> None:
        self.check = check


def _getattr(args: tuple[Any, ...], context: Context) -> _Bound:
    check_arity(args, 2, 2, "getattr")
    cls, name = args
    key = (f"{getattr(cls, '__module__', '?')}.{getattr(cls, '__qualname__', '?')}", name)
    if not isinstance(cls, type) or not context.admitted(cls) or key not in _ATTRIBUTES:
        raise UnsafeLoadError("builtins", "getattr", f"safe mode reads no attribute {shown(name)} of {shown(cls)}")
    return _Bound(_ATTRIBUTES[key])


def load_callable(func: Any) -> Check | None:
    """Return the check of a reconstructor that `getattr` gave (None for anything else)."""
    return func.check if type(func) is _Bound else None


def _reconstructor(args: tuple[Any, ...], context: Context) -> Any:
    """``copyreg._reconstructor(cls, base, state)``: how protocols 0 and 1 make instances of
    an admitted class, from ``object`` or from a builtin container or scalar type."""
    cls, base, state = check_types(args, ((type,), (type,), (object,)), "copyreg._reconstructor")
    from_base = (base is object and state is None) or (base in _RECONSTRUCTOR_BASES and isinstance(state, base))
    if from_base and context.admitted(cls) and issubclass(cls, base):
        _copying_items(args, context, 2)
        return awaiting_state(importlib.import_module("copyreg")._reconstructor(cls, base, state))
    raise CorruptError(
        f"copyreg._reconstructor makes admitted classes from object or a builtin type, not {shown(args, 120)}"
    )


#: The reconstructors of the standard library, by import path (pickle's ``module.name``).
RECONSTRUCTORS: dict[str, Reconstructor] = {
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
    "decimal.Decimal": Reconstructor(_string_number(importlib.import_module("decimal").Decimal, _DECIMAL)),
    "pytz._p": Reconstructor(_pytz),  # the time zones of pandas 2
    "pytz._UTC": Reconstructor(_pytz_utc),
    "fractions.Fraction": Reconstructor(_string_number(importlib.import_module("fractions").Fraction, _FRACTION)),
}


def _uuid_state(obj: Any, context: Context) -> None:
    """A UUID's number is an int of 128 bits (its ``__setstate__`` takes any object)."""
    value = getattr(obj, "int", None)
    if type(value) is not int or not 0 <= value < 1 << 128:
        raise CorruptError(f"a UUID's number is an int of 128 bits, not {shown(value)}")


#: Checks of an object's state after ``BUILD`` set it, by the import path of its class.
STATE_CHECKS: dict[str, Callable[[Any, Context], None]] = {"uuid.UUID": _uuid_state}
