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

import _compat_pickle
import ast
import importlib
import pickle
import struct
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from ..errors import CorruptError, LimitError, TruncatedError, UnsafeLoadError
from .budget import Budget
from .input import PickleInput
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
from .policy import Admitted, Policy

__all__ = ["OBJECTS_PER_BYTE", "OBJECTS_SLACK", "OPCODES_PER_BYTE", "OPCODES_SLACK", "RestrictedUnpickler"]

#: The deepest nesting of tuples and frozensets loaded (Python's own recursion limit).
_MAX_NESTING = 1000
#: A restricted load of a decompressed pickle stream makes at most ``OBJECTS_SLACK +
#: OBJECTS_PER_BYTE * n`` containers, objects and memo entries, n the bytes of the input read
#: so far: a few stored bytes that decompress to millions of one-byte opcodes cannot make
#: millions of objects.
OBJECTS_SLACK = 1 << 17
OBJECTS_PER_BYTE = 64
#: ... and reads at most ``OPCODES_SLACK + OPCODES_PER_BYTE * n`` opcodes (the limit of
#: `blpickle.format.scan`, which reads the same stream for inspect and verify).
OPCODES_SLACK = 1 << 20
OPCODES_PER_BYTE = 4096
#: Opcodes read between two countings against the budget.
_BUDGET_STEP = 4096


class _Refusal(Exception):
    """Raised inside the interpreter at the first refusal: the rest of the pickle is then
    read to list every other global the policy refuses, running nothing more."""

    def __init__(self, error: UnsafeLoadError) -> None:
        super().__init__()
        self.error = error


class _Unknown:
    """What an operation that was not run gives, once the load lists refusals."""

    __slots__ = ()


_UNKNOWN = _Unknown()


class RestrictedUnpickler:
    """Loads one pickle from ``file`` in safe mode.

    Args:
        file: a binary file with ``read`` and ``readline``.
        policy: which globals may be imported.
        fix_imports: map Python 2 names to Python 3 ones (protocols 0-2), as pickle does.
        encoding: how Python 2 ``str`` objects are decoded (``"bytes"``: kept as bytes).
        errors: the error handler of that decoding.
        buffers: the out-of-band buffers, in the order the pickle uses them.
        stored: for a decompressed pickle stream, a function giving how many bytes of input
            have been read so far, which bounds the objects it may make (see
            `OBJECTS_PER_BYTE`); None for a stream read as it is stored (each object then
            costs at least a byte of input).
    """

    def __init__(
        self,
        file: Any,
        policy: Policy,
        *,
        fix_imports: bool = True,
        encoding: str = "ASCII",
        errors: str = "strict",
        buffers: Iterable[Any] | None = None,
        stored: Callable[[], int] | None = None,
    ) -> None:
        self._input = PickleInput(file, stored)
        self._read = self._input.read
        self._policy = policy
        self._fix_imports = fix_imports
        self._encoding, self._errors = encoding, errors
        self._buffers: Iterator[Any] | None = None if buffers is None else iter(buffers)
        self._stack: list[Any] = []
        self._marks: list[list[Any]] = []
        self._memo: dict[int, Any] = {}
        self._pending = 0  # how many dtypes and arrays wait for their state
        self._depths: dict[int, tuple[Any, int]] = {}  # id -> (tuple or frozenset, nesting depth > 1)
        self._proto = 0
        self._grants: dict[int, Admitted] = {}  # id -> how each imported global was admitted
        self._refused: dict[str, str] = {}  # module.name -> why, once the load lists refusals
        self._objects = Budget("makes over {} objects", OBJECTS_SLACK, OBJECTS_PER_BYTE, stored)
        self._opcodes = Budget("runs over {} opcodes", OPCODES_SLACK, OPCODES_PER_BYTE, stored)

    def load(self) -> Any:
        """Return the object the pickle holds.

        Raises:
            CorruptError, TruncatedError: for a malformed pickle.
            UnsafeLoadError: for a global the policy refuses, or an opcode safe mode refuses:
                it lists every global of the pickle the policy refuses.
            LimitError: for a pickle that makes more objects than its input pays for.
        """
        try:
            try:
                return self._run(_DISPATCH)
            except _Refusal as refusal:
                self._refuse(refusal.error)
                self._stack.append(_UNKNOWN)  # in place of what the refused opcode would give
                self._list_refusals()
        except CallerError as wrapped:
            raise wrapped.error from None
        except (CorruptError, TruncatedError, UnsafeLoadError, LimitError):
            raise
        except (ImportError, AttributeError) as exc:
            raise CorruptError(f"the pickle names a global that cannot be imported: {exc}") from exc
        except (
            pickle.UnpicklingError,
            EOFError,
            TypeError,
            ValueError,
            IndexError,
            KeyError,
            OverflowError,
            struct.error,
        ) as exc:
            raise CorruptError(
                f"the pickle is malformed near offset {self._input.offset}: {type(exc).__name__}: {exc}"
            ) from exc

    def _list_refusals(self) -> None:
        """Read the rest of the pickle after a refusal, running nothing (calls, creations,
        states and fillings give `_UNKNOWN`), and raise one `UnsafeLoadError` naming every
        global the policy refuses."""
        error: Exception | None = None
        try:
            self._run(_LISTING)
        except (CorruptError, TruncatedError, LimitError) as exc:
            error = exc
        except _Refusal as refusal:  # never raised while listing
            error = refusal.error
        except Exception as exc:  # a malformed pickle, past the first refusal
            error = exc
        refused = UnsafeLoadError.of(self._refused)
        raise refused from error

    def _refuse(self, error: UnsafeLoadError) -> None:
        self._refused.setdefault(f"{error.module}.{error.name}", error.reason)

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
                return _UNKNOWN if table is _LISTING else self._stop()
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
            raise CorruptError("the pickle stops before every numpy dtype and array it made got its state")
        value = self._stack.pop()
        if isinstance(value, Pending):
            raise CorruptError("the pickle returns a numpy object that never got its state")
        return value

    # -- helpers ------------------------------------------------------------------------

    def _pop_mark(self) -> list[Any]:
        if not self._marks:
            raise CorruptError(f"the pickle has no MARK before offset {self._input.offset}")
        items = self._stack
        self._stack = self._marks.pop()
        return items

    def _size(self, width: int, signed: bool = False) -> int:
        size = int.from_bytes(self._read(width), "little", signed=signed)
        if size < 0:
            raise CorruptError(f"negative size {size} near offset {self._input.offset}")
        return size

    def _line(self) -> bytes:
        return self._input.readline()[:-1]

    def _decode(self, value: bytes) -> Any:
        """Decode a Python 2 ``str`` as pickle does (``encoding="bytes"`` keeps bytes)."""
        if self._encoding == "bytes":
            return value
        return value.decode(self._encoding, self._errors)

    def _memo_get(self, key: int) -> Any:
        try:
            value = self._memo[key]
        except KeyError:
            raise CorruptError(f"the pickle refers to memo entry {key}, which it never stored") from None
        if isinstance(value, Pending):
            raise CorruptError(
                "the pickle refers to a numpy dtype or array inside its own state (a recursive numpy "
                "object): safe mode does not load those"
            )
        self._stack.append(value)

    def _memo_put(self, key: int) -> None:
        if not self._stack:
            raise CorruptError("the pickle memoizes from an empty stack")
        self._count()
        value = self._stack[-1]
        if isinstance(value, Pending):
            value.keys.append(key)
        self._memo[key] = value

    def _track(self, obj: Any) -> None:
        """Record how deeply tuples and frozensets nest in ``obj``, one made of objects the
        pickle built; refuse it nested deeper than ``_MAX_NESTING`` (hashing it recurses in C
        without a limit: a dict key a million tuples deep crashes the process)."""
        depth = 1
        depths = self._depths
        for item in obj:
            if isinstance(item, (tuple, frozenset)):
                entry = depths.get(id(item))
                depth = max(depth, 2 if entry is None else entry[1] + 1)
        if depth > 1:
            if depth > _MAX_NESTING:
                raise CorruptError(f"the pickle nests tuples or frozensets more than {_MAX_NESTING} deep")
            depths[id(obj)] = (obj, depth)

    def _made(self, obj: Any) -> Any:
        """Return ``obj``, made by a call, its nesting recorded if it is a tuple or frozenset."""
        self._count()
        if isinstance(obj, (tuple, frozenset)):
            self._track(obj)
        return obj

    def _count(self) -> None:
        """Count one object (a container, a call's result, a memo entry) against the budget
        that the input read so far pays for."""
        self._objects.spend()

    def _find_class(self, module: Any, name: Any) -> Any:
        if not isinstance(module, str) or not isinstance(name, str):
            raise CorruptError(f"a global's module and name must be strings, not {module!r} and {name!r}")
        if self._proto < 4 and "." in name:  # pickle looks dotted names up from protocol 4 on
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        python2 = (module, name) in _compat_pickle.NAME_MAPPING or module in _compat_pickle.IMPORT_MAPPING
        if python2 and not self._fix_imports and self._proto < 3:
            importlib.import_module(module)  # pickle imports the Python 2 name as it is: fails
        try:
            admitted = self._policy.admit(module, name)
        except UnsafeLoadError as exc:
            raise _Refusal(exc) from None
        self._grants[id(admitted.obj)] = admitted
        return admitted.obj

    def _changed(self, target: Any) -> Any:
        """Return ``target``, an object the pickle sets the state of or fills, unless it is one
        a module holds (a global: a class, a constant): a load changes only what it makes."""
        if self._grant(target) is not None:
            raise CorruptError(
                f"the pickle changes {type(target).__name__} {_describe(target)}, which a module holds: "
                "safe mode changes only the objects a load makes"
            )
        return target

    def _grant(self, obj: Any) -> Admitted | None:
        """How the policy admitted ``obj``, a global this load imported (None: it did not)."""
        grant = self._grants.get(id(obj))
        return grant if grant is not None and grant.obj is obj else None

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
            raise CorruptError("the pickle copies a numpy dtype or array before its state is set")
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
        try:
            value = ast.literal_eval("b" + data.decode("ascii"))
        except (SyntaxError, ValueError, UnicodeDecodeError) as exc:
            raise CorruptError(f"the pickle's STRING argument is not a string literal: {exc}") from None
        if not isinstance(value, bytes):
            raise CorruptError("the pickle's STRING argument is not a string literal")
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
            self._stack.append(next(self._buffers))
        except StopIteration:
            raise CorruptError("the pickle refers to more out-of-band buffers than were given") from None

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
        value = self._stack.pop()
        extend(self._changed(self._stack[-1]), [value])

    def _appends(self) -> None:
        items = self._pop_mark()
        extend(self._changed(self._stack[-1]), items)

    def _setitem(self) -> None:
        value = self._stack.pop()
        key = self._stack.pop()
        set_items(self._changed(self._stack[-1]), [key, value])

    def _setitems(self) -> None:
        items = self._pop_mark()
        set_items(self._changed(self._stack[-1]), items)

    def _additems(self) -> None:
        items = self._pop_mark()
        add_items(self._changed(self._stack[-1]), items)

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
            result = call(func, args, self._grant(func), self._policy)
        except UnsafeLoadError as exc:
            raise _Refusal(exc) from None
        if isinstance(result, Pending):
            self._pending += 1
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
            return new_object(cls, args, self._grant(cls), self._policy, kwargs)
        except UnsafeLoadError as exc:
            raise _Refusal(exc) from None

    def _build(self) -> None:
        state = self._stack.pop()
        obj = self._stack[-1]
        if not isinstance(obj, Pending):
            set_state(self._changed(obj), state)
            return
        built = dtype_from_state(obj.args, state) if obj.kind == "dtype" else array_from_state(state)
        self._pending -= 1
        self._stack[-1] = built
        for key in obj.keys:
            self._memo[key] = built

    def _inst(self) -> None:
        module = self._line().decode("utf-8")
        name = self._line().decode("utf-8")
        self._find_class(module, name)
        raise _Refusal(
            UnsafeLoadError(module, name, "safe mode does not load the INST opcode (Python 3 never writes it)")
        )

    def _obj(self) -> None:
        items = self._pop_mark()
        cls = items[0] if items else None
        module = getattr(cls, "__module__", "?")
        name = getattr(cls, "__qualname__", repr(cls))
        raise _Refusal(
            UnsafeLoadError(str(module), str(name), "safe mode does not load the OBJ opcode (Python 3 never writes it)")
        )

    def _persid(self) -> None:
        raise CorruptError("safe mode does not load persistent IDs (PERSID, BINPERSID)")


def _describe(obj: Any) -> str:
    name = getattr(obj, "__qualname__", None)
    return f"{getattr(obj, '__module__', '')}.{name}" if isinstance(name, str) else ""


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
        raise _Refusal(
            UnsafeLoadError(
                "copyreg", f"extension code {code:#x}", "safe mode does not load extension codes (EXT1, EXT2, EXT4)"
            )
        )

    return ext


def _opcode(name: str) -> int:
    return getattr(pickle, name)[0]


_HANDLERS: dict[int, Callable[[RestrictedUnpickler], None]] = {
    _opcode(name): handler
    for name, handler in {
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
    }.items()
}
#: The handler of each opcode byte (None: not an opcode safe mode loads).
_DISPATCH: list[Callable[[RestrictedUnpickler], None] | None] = [_HANDLERS.get(code) for code in range(256)]


# -- listing the refusals: the rest of the pickle read, nothing run ---------------------------


def _listed(self: RestrictedUnpickler, module: Any, name: Any) -> None:
    """Record whether the policy refuses ``module.name``, importing nothing it refuses."""
    if not isinstance(module, str) or not isinstance(name, str):
        self._refused.setdefault("<computed>", "a name the pickle computes, which cannot be judged before it runs")
        return
    reason = self._policy.refusal(module, name)
    if reason is not None:
        self._refused.setdefault(f"{module}.{name}", reason)


def _list_global(self: RestrictedUnpickler) -> None:
    module = self._line().decode("utf-8")
    name = self._line().decode("utf-8")
    _listed(self, module, name)
    self._stack.append(_UNKNOWN)


def _list_stack_global(self: RestrictedUnpickler) -> None:
    name = self._stack.pop()
    module = self._stack.pop()
    _listed(self, module, name)
    self._stack.append(_UNKNOWN)


def _list_inst(self: RestrictedUnpickler) -> None:
    _list_global(self)
    self._stack.pop()
    self._pop_mark()
    self._stack.append(_UNKNOWN)


def _list_obj(self: RestrictedUnpickler) -> None:
    self._pop_mark()
    self._stack.append(_UNKNOWN)


def _skip(popped: int, mark: bool = False, result: bool = True) -> Callable[[RestrictedUnpickler], None]:
    """A handler that pops ``popped`` items (then a mark) and pushes `_UNKNOWN`, running nothing."""

    def skip(self: RestrictedUnpickler) -> None:
        for _ in range(popped):
            self._stack.pop()
        if mark:
            self._pop_mark()
        if result:
            self._stack.append(_UNKNOWN)

    return skip


def _list_ext(width: int) -> Callable[[RestrictedUnpickler], None]:
    def ext(self: RestrictedUnpickler) -> None:
        code = int.from_bytes(self._read(width), "little")
        self._refused.setdefault(f"copyreg.extension code {code:#x}", "safe mode does not load extension codes")
        self._stack.append(_UNKNOWN)

    return ext


def _list_persid(self: RestrictedUnpickler) -> None:
    self._line()
    self._stack.append(_UNKNOWN)


_LISTING_HANDLERS: dict[int, Callable[[RestrictedUnpickler], None]] = {
    **_HANDLERS,
    **{
        _opcode(name): handler
        for name, handler in {
            "GLOBAL": _list_global,
            "STACK_GLOBAL": _list_stack_global,
            "INST": _list_inst,
            "OBJ": _list_obj,
            "REDUCE": _skip(2),
            "NEWOBJ": _skip(2),
            "NEWOBJ_EX": _skip(3),
            "BUILD": _skip(1, result=False),
            "APPEND": _skip(1, result=False),
            "APPENDS": _skip(0, mark=True, result=False),
            "SETITEM": _skip(2, result=False),
            "SETITEMS": _skip(0, mark=True, result=False),
            "ADDITEMS": _skip(0, mark=True, result=False),
            "NEXT_BUFFER": _push(_UNKNOWN),
            "READONLY_BUFFER": lambda self: None,
            "EXT1": _list_ext(1),
            "EXT2": _list_ext(2),
            "EXT4": _list_ext(4),
            "PERSID": _list_persid,
            "BINPERSID": _skip(1),
        }.items()
    },
}
#: The handlers of the listing: every opcode that would run code, import, set or fill runs nothing.
_LISTING: list[Callable[[RestrictedUnpickler], None] | None] = [_LISTING_HANDLERS.get(code) for code in range(256)]
