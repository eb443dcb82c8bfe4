"""The restricted unpickler of safe mode (``safe=True``, ``allowed=``).

A pure-Python interpreter of the pickle opcodes of protocols 0-5: the stack, the marks and
the memo. Every global goes through a `Policy`; what the pickle then does with objects
(calls, ``NEWOBJ``, ``BUILD``, filling collections) goes through
`blpickle.restricted.objects`, where the calls safe mode allows by default are made only
with arguments of the types and sizes they expect, and numpy dtypes and arrays are rebuilt
from their checked states (`blpickle.restricted.numpy_state`), never by numpy's own
``__setstate__``. ``BUILD`` sets the state of objects of the types the caller allowed as
pickle does, and of no builtin or numpy object. Opcodes that Python 3 never writes or that
reach outside the pickle (``INST``, ``OBJ``, ``PERSID``, ``BINPERSID``, ``EXT1/2/4``) are
refused.

Malformed input raises `CorruptError` (or `TruncatedError`, `UnsafeLoadError`); errors
raised by the callables and ``__setstate__`` of types the caller allowed pass through
unchanged.
"""

from __future__ import annotations

import codecs
import pickle
import struct
from collections.abc import Callable
from typing import Any

from ..errors import CorruptError, LimitError, TruncatedError, UnsafeLoadError
from .listing import LISTING_HANDLERS
from .machine import UNKNOWN, Machine, Refusal
from .numpy_state import Pending, array_from_state, dtype_from_state
from .objects import (
    CallerError,
    add_items,
    call,
    extend,
    new_object,
    pairs,
    set_items,
    set_state,
)

__all__ = ["RestrictedUnpickler"]

#: Opcodes read between two countings against the budget.
_BUDGET_STEP = 4096


class RestrictedUnpickler(Machine):
    """Loads one pickle from ``file`` in safe mode (arguments: see `Machine`)."""

    def load(self) -> Any:
        """Return the object the pickle holds.

        Raises:
            CorruptError, TruncatedError: for a malformed pickle.
            UnsafeLoadError: for a global the policy refuses, or an opcode safe mode refuses:
                it lists every global of the pickle the policy refuses.
            LimitError: for a pickle that makes more objects than its input pays for, or that
                needs more memory than there is.
        """
        try:
            try:
                return self._run(_DISPATCH)
            except Refusal as refusal:
                self._refuse(refusal.error)
                self._stack.append(UNKNOWN)  # in place of what the refused opcode would give
                self._list_refusals()
        except CallerError as wrapped:
            raise wrapped.error from None
        except (CorruptError, TruncatedError, UnsafeLoadError, LimitError):
            raise
        except (ImportError, AttributeError) as exc:
            raise CorruptError(f"the pickle names a global that cannot be imported: {exc}") from exc
        except MemoryError as exc:
            raise LimitError(f"the pickle needs more memory than there is, near offset {self._input.offset}") from exc
        except Exception as exc:  # what a check or a vetted reconstructor's library refused
            raise CorruptError(
                f"the pickle is malformed near offset {self._input.offset}: {type(exc).__name__}: {exc}"
            ) from exc

    def _list_refusals(self) -> None:
        """Read the rest of the pickle after a refusal, running nothing (calls, creations,
        states and fillings give `UNKNOWN`), and raise one `UnsafeLoadError` naming every
        global the policy refuses."""
        error: Exception | None = None
        try:
            self._run(_LISTING)
        except (CorruptError, TruncatedError, LimitError) as exc:
            error = exc
        except Refusal as refusal:  # never raised while listing
            error = refusal.error
        except Exception as exc:  # a malformed pickle, past the first refusal
            error = exc
        refused = UnsafeLoadError.of(self._refused)
        raise refused from error

    def _run(self, table: list[Callable[[RestrictedUnpickler], None] | None]) -> Any:
        read, stop, step = self._read, pickle.STOP[0], _BUDGET_STEP
        count = step
        while True:
            count -= 1
            if not count:
                count = step
                self._opcodes.spend(step)
            code = read(1)
            if not code:
                raise TruncatedError("the pickle stream", self._input.offset, 1, 0)
            if code[0] == stop:
                return UNKNOWN if table is _LISTING else self._stop()
            handler = table[code[0]]
            if handler is None:
                raise CorruptError(
                    f"opcode {code!r} at offset {self._input.offset - 1} is not a pickle opcode safe mode loads"
                )
            handler(self)

    def _stop(self) -> Any:
        if not self._stack:
            raise CorruptError("the pickle stops with nothing on its stack")
        if self._pending:
            raise CorruptError("the pickle stops before every dtype, array and object it made got its state")
        value = self._stack.pop()
        if isinstance(value, Pending):
            raise CorruptError("the pickle returns a numpy object that never got its state")
        return value

    # -- opcodes ----------------------------------------------------------------------

    def _proto_op(self) -> None:
        proto = self._read(1)[0]
        if proto > pickle.HIGHEST_PROTOCOL:
            raise CorruptError(f"unsupported pickle protocol: {proto}")
        self._proto = proto

    def _frame(self) -> None:
        self._input.start_frame(self._size(8))

    def _mark(self) -> None:
        self._count()
        self._marks.append(self._stack)
        self._stack = []

    def _pop(self) -> None:
        if self._stack:
            self._stack.pop()
        else:
            self._pop_mark()

    def _pop_mark_op(self) -> None:
        self._pop_mark()

    def _dup(self) -> None:
        value = self._stack[-1]
        if type(value) is Pending:
            raise CorruptError("the pickle copies a dtype, array or object before its state is set")
        self._stack.append(value)

    def _int(self) -> None:
        data = self._line()
        if data == b"00":
            value: Any = False
        elif data == b"01":
            value = True
        else:
            value = int(data, 0)
        self._stack.append(value)

    def _binint(self) -> None:
        self._stack.append(int.from_bytes(self._read(4), "little", signed=True))

    def _binint1(self) -> None:
        self._stack.append(self._read(1)[0])

    def _binint2(self) -> None:
        self._stack.append(int.from_bytes(self._read(2), "little"))

    def _long(self) -> None:
        data = self._line()
        self._stack.append(int(data[:-1] if data.endswith(b"L") else data, 0))

    def _long1(self) -> None:
        self._stack.append(int.from_bytes(self._read(self._read(1)[0]), "little", signed=True))

    def _long4(self) -> None:
        self._stack.append(int.from_bytes(self._read(self._size(4, signed=True)), "little", signed=True))

    def _float(self) -> None:
        self._stack.append(float(self._line()))

    def _binfloat(self) -> None:
        self._stack.append(struct.unpack(">d", self._read(8))[0])

    def _string(self) -> None:
        data = self._line()
        if len(data) < 2 or data[0] != data[-1] or data[:1] not in (b'"', b"'"):
            raise CorruptError("the pickle's STRING argument must be quoted")
        try:  # as pickle reads it: escapes only, no expression parsed
            value = codecs.escape_decode(data[1:-1])[0]
        except ValueError as exc:
            raise CorruptError(f"the pickle's STRING argument is not a string literal: {exc}") from None
        self._stack.append(self._decode(value))

    def _binstring(self) -> None:
        self._stack.append(self._decode(self._read(self._size(4, signed=True))))

    def _short_binstring(self) -> None:
        self._stack.append(self._decode(self._read(self._read(1)[0])))

    def _binbytes(self) -> None:
        self._stack.append(self._read(self._size(4)))

    def _short_binbytes(self) -> None:
        self._stack.append(self._read(self._read(1)[0]))

    def _binbytes8(self) -> None:
        self._stack.append(self._read(self._size(8)))

    def _bytearray8(self) -> None:
        self._stack.append(bytearray(self._read(self._size(8))))

    def _unicode(self) -> None:
        self._stack.append(str(self._line(), "raw-unicode-escape"))

    def _binunicode(self) -> None:
        self._stack.append(str(self._read(self._size(4)), "utf-8", "surrogatepass"))

    def _short_binunicode(self) -> None:
        self._stack.append(str(self._read(self._read(1)[0]), "utf-8", "surrogatepass"))

    def _binunicode8(self) -> None:
        self._stack.append(str(self._read(self._size(8)), "utf-8", "surrogatepass"))

    def _next_buffer(self) -> None:
        if self._buffers is None:
            raise CorruptError("the pickle refers to out-of-band data but no buffers were given")
        try:
            buffer = next(self._buffers)
        except StopIteration:
            raise CorruptError("the pickle refers to more out-of-band buffers than were given") from None
        try:
            with memoryview(buffer) as view:
                self._buffer_bytes += view.nbytes
        except TypeError:  # a caller's object that is not a buffer: pickle passes it on as it is
            pass
        self._stack.append(buffer)

    def _readonly_buffer(self) -> None:
        with memoryview(self._stack[-1]) as view:
            if not view.readonly:
                self._stack[-1] = view.toreadonly()

    def _empty_tuple(self) -> None:
        self._stack.append(())

    def _list(self) -> None:
        items = self._pop_mark()
        self._stack.append(items)

    def _dict(self) -> None:
        self._count()
        items = self._pop_mark()
        self._stack.append(pairs(items, {}))

    def _append(self) -> None:
        items = [self._stack.pop()]
        extend(*self._filled(items), items)

    def _appends(self) -> None:
        items = self._pop_mark()
        extend(*self._filled(items), items)

    def _setitem(self) -> None:
        value = self._stack.pop()
        items = [self._stack.pop(), value]
        set_items(*self._filled(items), items)

    def _setitems(self) -> None:
        items = self._pop_mark()
        set_items(*self._filled(items), items)

    def _additems(self) -> None:
        items = self._pop_mark()
        add_items(*self._filled(items), items)

    def _get(self) -> None:
        self._memo_get(int(self._line()))

    def _binget(self) -> None:
        self._memo_get(self._read(1)[0])

    def _long_binget(self) -> None:
        self._memo_get(int.from_bytes(self._read(4), "little"))

    def _put(self) -> None:
        key = int(self._line())
        if key < 0:
            raise CorruptError(f"negative memo key {key}")
        self._memo_put(key)

    def _binput(self) -> None:
        self._memo_put(self._read(1)[0])

    def _long_binput(self) -> None:
        self._memo_put(int.from_bytes(self._read(4), "little"))

    def _memoize(self) -> None:
        self._count()
        value = self._stack[-1]
        if type(value) is Pending:
            value.keys.append(len(self._memo))
        self._memo[len(self._memo)] = value

    def _global(self) -> None:
        module = self._line().decode("utf-8")
        name = self._line().decode("utf-8")
        self._stack.append(self._find_class(module, name))

    def _stack_global(self) -> None:
        name = self._stack.pop()
        module = self._stack.pop()
        self._stack.append(self._find_class(module, name))

    def _reduce(self) -> None:
        args = self._stack.pop()
        func = self._stack.pop()
        try:
            result = call(func, args, self._grant(func), self._policy, self._context)
        except UnsafeLoadError as exc:
            raise Refusal(exc) from None
        self._stack.append(self._made(result))

    def _newobj(self) -> None:
        args = self._stack.pop()
        cls = self._stack.pop()
        self._stack.append(self._made(self._new(cls, args, None)))

    def _newobj_ex(self) -> None:
        kwargs = self._stack.pop()
        args = self._stack.pop()
        cls = self._stack.pop()
        if type(kwargs) is not dict:
            raise CorruptError(f"NEWOBJ_EX's keyword arguments must be a dict, not {type(kwargs).__name__}")
        self._stack.append(self._made(self._new(cls, args, kwargs)))

    def _new(self, cls: Any, args: Any, kwargs: Any) -> Any:
        try:
            return new_object(cls, args, self._grant(cls), self._policy, self._context, kwargs)
        except UnsafeLoadError as exc:
            raise Refusal(exc) from None

    def _build(self) -> None:
        state = self._stack.pop()
        obj = self._stack[-1]
        if not isinstance(obj, Pending):
            if id(obj) in self._built:
                raise CorruptError(
                    f"the pickle sets the state of a {type(obj).__qualname__} that has its state already: "
                    "safe mode sets an object's state once, where it is made"
                )
            self._give_state(self._changed(obj), state)
            return
        built: Any
        if obj.kind == "dtype":
            built = dtype_from_state(obj.args, state)
        elif obj.kind == "array":
            built = array_from_state(state, self._context.copying)
            if built.dtype.hasobject:
                self._track(built, state[-1])
        else:  # an object that is broken without its state
            built = obj.args[0]
            self._give_state(built, state)
        self._pending -= 1
        self._stack[-1] = built
        for key in obj.keys:
            self._memo[key] = built

    def _give_state(self, obj: Any, state: Any) -> None:
        """Set the state of ``obj`` (`set_state`), recorded as built."""
        set_state(obj, state, self._context, self._named(type(obj)))
        self._mark_built(obj)

    def _inst(self) -> None:
        module = self._line().decode("utf-8")
        name = self._line().decode("utf-8")
        self._find_class(module, name)
        raise Refusal(
            UnsafeLoadError(module, name, "safe mode does not load the INST opcode (Python 3 never writes it)")
        )

    def _obj(self) -> None:
        items = self._pop_mark()
        cls = items[0] if items else None
        module = getattr(cls, "__module__", "?")
        name = getattr(cls, "__qualname__", repr(cls))
        raise Refusal(
            UnsafeLoadError(str(module), str(name), "safe mode does not load the OBJ opcode (Python 3 never writes it)")
        )

    def _persid(self) -> None:
        raise CorruptError("safe mode does not load persistent IDs (PERSID, BINPERSID)")


def _push(value: Any) -> Callable[[RestrictedUnpickler], None]:
    """The handler of an opcode that pushes ``value``."""

    def push(self: RestrictedUnpickler) -> None:
        self._stack.append(value)

    return push


def _empty(kind: type) -> Callable[[RestrictedUnpickler], None]:
    """The handler of EMPTY_LIST, EMPTY_DICT or EMPTY_SET."""

    def empty(self: RestrictedUnpickler) -> None:
        self._count()
        self._stack.append(kind())

    return empty


def _collected(kind: type[tuple[Any, ...]] | type[frozenset[Any]]) -> Callable[[RestrictedUnpickler], None]:
    """The handler of TUPLE or FROZENSET: the items since the last MARK."""

    def collect(self: RestrictedUnpickler) -> None:
        self._count()
        items = kind(self._pop_mark())
        self._track(items)
        self._stack.append(items)

    return collect


def _tuple_n(n: int) -> Callable[[RestrictedUnpickler], None]:
    """The handler of TUPLE1, TUPLE2 or TUPLE3."""

    def tuple_n(self: RestrictedUnpickler) -> None:
        stack = self._stack
        if len(stack) < n:
            raise CorruptError(f"TUPLE{n} needs {n} items on the stack, it has {len(stack)}")
        self._count()
        items = tuple(stack[len(stack) - n :])
        del stack[len(stack) - n :]
        self._track(items)
        stack.append(items)

    return tuple_n


def _ext(width: int) -> Callable[[RestrictedUnpickler], None]:
    """The handler of EXT1, EXT2 or EXT4: refuses the extension code."""

    def ext(self: RestrictedUnpickler) -> None:
        code = int.from_bytes(self._read(width), "little")
        raise Refusal(
            UnsafeLoadError(
                "copyreg", f"extension code {code:#x}", "safe mode does not load extension codes (EXT1, EXT2, EXT4)"
            )
        )

    return ext


#: The handler of each opcode a load runs, by opcode name.
_HANDLERS: dict[str, Callable[[RestrictedUnpickler], None]] = {
    "PROTO": RestrictedUnpickler._proto_op,
    "FRAME": RestrictedUnpickler._frame,
    "MARK": RestrictedUnpickler._mark,
    "POP": RestrictedUnpickler._pop,
    "POP_MARK": RestrictedUnpickler._pop_mark_op,
    "DUP": RestrictedUnpickler._dup,
    "NONE": _push(None),
    "NEWTRUE": _push(True),
    "NEWFALSE": _push(False),
    "INT": RestrictedUnpickler._int,
    "BININT": RestrictedUnpickler._binint,
    "BININT1": RestrictedUnpickler._binint1,
    "BININT2": RestrictedUnpickler._binint2,
    "LONG": RestrictedUnpickler._long,
    "LONG1": RestrictedUnpickler._long1,
    "LONG4": RestrictedUnpickler._long4,
    "FLOAT": RestrictedUnpickler._float,
    "BINFLOAT": RestrictedUnpickler._binfloat,
    "STRING": RestrictedUnpickler._string,
    "BINSTRING": RestrictedUnpickler._binstring,
    "SHORT_BINSTRING": RestrictedUnpickler._short_binstring,
    "BINBYTES": RestrictedUnpickler._binbytes,
    "SHORT_BINBYTES": RestrictedUnpickler._short_binbytes,
    "BINBYTES8": RestrictedUnpickler._binbytes8,
    "BYTEARRAY8": RestrictedUnpickler._bytearray8,
    "UNICODE": RestrictedUnpickler._unicode,
    "BINUNICODE": RestrictedUnpickler._binunicode,
    "SHORT_BINUNICODE": RestrictedUnpickler._short_binunicode,
    "BINUNICODE8": RestrictedUnpickler._binunicode8,
    "NEXT_BUFFER": RestrictedUnpickler._next_buffer,
    "READONLY_BUFFER": RestrictedUnpickler._readonly_buffer,
    "TUPLE": _collected(tuple),
    "EMPTY_TUPLE": RestrictedUnpickler._empty_tuple,
    "TUPLE1": _tuple_n(1),
    "TUPLE2": _tuple_n(2),
    "TUPLE3": _tuple_n(3),
    "EMPTY_LIST": _empty(list),
    "LIST": RestrictedUnpickler._list,
    "EMPTY_DICT": _empty(dict),
    "DICT": RestrictedUnpickler._dict,
    "EMPTY_SET": _empty(set),
    "FROZENSET": _collected(frozenset),
    "APPEND": RestrictedUnpickler._append,
    "APPENDS": RestrictedUnpickler._appends,
    "SETITEM": RestrictedUnpickler._setitem,
    "SETITEMS": RestrictedUnpickler._setitems,
    "ADDITEMS": RestrictedUnpickler._additems,
    "GET": RestrictedUnpickler._get,
    "BINGET": RestrictedUnpickler._binget,
    "LONG_BINGET": RestrictedUnpickler._long_binget,
    "PUT": RestrictedUnpickler._put,
    "BINPUT": RestrictedUnpickler._binput,
    "LONG_BINPUT": RestrictedUnpickler._long_binput,
    "MEMOIZE": RestrictedUnpickler._memoize,
    "GLOBAL": RestrictedUnpickler._global,
    "STACK_GLOBAL": RestrictedUnpickler._stack_global,
    "REDUCE": RestrictedUnpickler._reduce,
    "NEWOBJ": RestrictedUnpickler._newobj,
    "NEWOBJ_EX": RestrictedUnpickler._newobj_ex,
    "BUILD": RestrictedUnpickler._build,
    "INST": RestrictedUnpickler._inst,
    "OBJ": RestrictedUnpickler._obj,
    "EXT1": _ext(1),
    "EXT2": _ext(2),
    "EXT4": _ext(4),
    "PERSID": RestrictedUnpickler._persid,
    "BINPERSID": RestrictedUnpickler._persid,
}


def _table(
    handlers: dict[str, Callable[[RestrictedUnpickler], None]],
) -> list[Callable[[RestrictedUnpickler], None] | None]:
    """Return the handler of each opcode byte (None: not an opcode safe mode loads)."""
    by_code = {getattr(pickle, name)[0]: handler for name, handler in handlers.items()}
    return [by_code.get(code) for code in range(256)]


#: The handlers of a load.
_DISPATCH = _table(_HANDLERS)
#: The handlers of the listing: every opcode that would run code, import, set or fill runs nothing.
_LISTING = _table({**_HANDLERS, **LISTING_HANDLERS})
