"""The restricted unpickler of safe mode (``safe=True``, ``allowed=``).

A pure-Python interpreter of the pickle opcodes of protocols 0-5. Every global goes through
a `Policy`. Where the C unpickler would hand attacker data to native
code that does not check it, this one rebuilds the object from validated parts with numpy's
public constructors:

- ``numpy.dtype`` + ``BUILD``: the dtype is built from its checked state (byte order,
  subarray, fields with offsets inside the item size, datetime unit, metadata), never by
  ``dtype.__setstate__``;
- ``numpy._core.multiarray._reconstruct`` + ``BUILD``: the array is built from its checked
  state (shape, dtype, order, data of exactly the size the shape needs);
- ``numpy._core.multiarray.scalar``, ``_frombuffer`` and the builtins that safe mode allows are
  called only with arguments of the types and sizes they expect.

``BUILD`` sets the state of objects of the types the caller allowed as pickle does; it sets
none of builtin or numpy objects. Opcodes that Python 3 never writes or that reach outside
the pickle (``INST``, ``OBJ``, ``PERSID``, ``BINPERSID``, ``EXT1/2/4``) are refused.

Malformed input raises `CorruptError` (or `TruncatedError`,
`UnsafeLoadError`); errors raised by the callables and ``__setstate__`` of types the
caller allowed pass through unchanged.
"""

from __future__ import annotations

import _compat_pickle
import ast
import importlib
import io
import math
import pickle
import struct
import sys
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Literal

import numpy as np

from .arrays import rebuild_ndarray
from .errors import CorruptError, TruncatedError, UnsafeLoadError
from .layout import PickleFile
from .safe import Policy

__all__ = ["RestrictedUnpickler"]

#: Data longer than this is read from a file in pieces of this size, so that a declared size
#: is never allocated before the data is there (but from a record's pickle stream or a BytesIO,
#: which check a read's size against the data they hold first, and then read it whole).
_READ_PIECE = 16 << 20
#: The longest text line (protocol 0 arguments) read.
_MAX_LINE = 1 << 20
#: The longest type code accepted for ``numpy.dtype(code, align, copy)``.
_MAX_CODE = 64
#: The deepest nesting of tuples and frozensets loaded (Python's own recursion limit).
_MAX_NESTING = 1000
#: The ``flags`` bit of a dtype state that marks an aligned struct (numpy's NPY_ALIGNED_STRUCT).
_ALIGNED_STRUCT = 0x80
_DATETIME_UNITS = frozenset({"Y", "M", "W", "D", "h", "m", "s", "ms", "us", "ns", "ps", "fs", "as", "generic"})
_NATIVE = "<" if sys.byteorder == "little" else ">"
_BYTE_ORDERS = frozenset({"<", ">", "=", "|"})
# numpy's reconstructors, as the names SAFE_GLOBALS allows for them resolve
_RECONSTRUCT = importlib.import_module("numpy._core.multiarray")._reconstruct
_SCALAR = importlib.import_module("numpy._core.multiarray").scalar
_FROMBUFFER = importlib.import_module("numpy._core.numeric")._frombuffer
#: The packages of the types whose state safe mode never sets and whose collections it fills
#: only if they are lists, dicts or sets.
_BUILTIN_MODULES = ("builtins", "numpy")


class _Pending:
    """A dtype or array made by ``REDUCE``, waiting for its state (``BUILD``)."""

    __slots__ = ("args", "keys", "kind")

    def __init__(self, kind: str, args: tuple[Any, ...]) -> None:
        self.kind, self.args = kind, args
        self.keys: list[int] = []  # the memo keys that hold it


class _CallerError(Exception):
    """Carries an exception raised by the code of a type the caller allowed."""

    def __init__(self, error: BaseException) -> None:
        super().__init__()
        self.error = error


class _Input:
    """Reads the pickle stream: a frame at a time (held in memory), the rest from the file."""

    def __init__(self, file: Any) -> None:
        self._file = file
        self._piece = sys.maxsize if isinstance(file, (PickleFile, io.BytesIO)) else _READ_PIECE
        self._frame = b""
        self._pos = 0  # in the frame
        self._end = 0  # the frame's size
        self.offset = 0  # of the frame's start (or of the file's position) in the stream

    def read(self, n: int) -> bytes:
        pos = self._pos
        end = pos + n
        if end <= self._end:
            self._pos = end
            return self._frame[pos:end]
        frame = self._frame
        if pos < len(frame):
            raise CorruptError(
                f"the pickle reads {n} bytes at offset {self.offset + pos}, past the end of its frame "
                f"at offset {self.offset + len(frame)}"
            )
        return self._read_file(n)

    def readline(self) -> bytes:
        frame, pos = self._frame, self._pos
        if pos < len(frame):
            end = frame.find(b"\n", pos, pos + _MAX_LINE)
            if end < 0:
                raise CorruptError(f"the pickle's line at offset {self.offset + pos} has no end within its frame")
            self._pos = end + 1
            return frame[pos : end + 1]
        self._leave_frame()
        line = self._file.readline(_MAX_LINE)
        self.offset += len(line)
        if not line.endswith(b"\n"):
            raise CorruptError(f"the pickle's line at offset {self.offset - len(line)} has no end")
        return line

    def start_frame(self, n: int) -> None:
        """Read a frame of ``n`` bytes, from which the next opcodes come."""
        if self._pos < len(self._frame):
            raise CorruptError(f"a frame starts at offset {self.offset + self._pos}, inside the previous frame")
        self._leave_frame()
        self._frame = self._read_file(n)
        self._pos, self._end = 0, n
        self.offset -= n

    def _leave_frame(self) -> None:
        self.offset += len(self._frame)
        self._frame, self._pos, self._end = b"", 0, 0

    def _read_file(self, n: int) -> bytes:
        """Read ``n`` bytes from the file, in pieces (files may return short reads, and a
        size the pickle declares is not allocated before the data is there).

        Raises:
            TruncatedError: when the file ends first.
        """
        self._leave_frame()
        data = self._file.read(min(n, self._piece))
        if data is None:
            data = b""
        if len(data) < n:
            pieces = [data]
            left = n - len(data)
            while left:
                piece = self._file.read(min(left, self._piece))
                if not piece:
                    raise TruncatedError("the pickle stream", self.offset, n, n - left)
                pieces.append(piece)
                left -= len(piece)
            data = b"".join(pieces)
        self.offset += n
        return bytes(data)


class RestrictedUnpickler:
    """Loads one pickle from ``file`` in safe mode.

    Args:
        file: a binary file with ``read`` and ``readline``.
        policy: which globals may be imported.
        fix_imports: map Python 2 names to Python 3 ones (protocols 0-2), as pickle does.
        encoding: how Python 2 ``str`` objects are decoded (``"bytes"``: kept as bytes).
        errors: the error handler of that decoding.
        buffers: the out-of-band buffers, in the order the pickle uses them.
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
    ) -> None:
        self._input = _Input(file)
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

    def load(self) -> Any:
        """Return the object the pickle holds.

        Raises:
            CorruptError, TruncatedError: for a malformed pickle.
            UnsafeLoadError: for a global the policy refuses, or an opcode safe mode refuses.
        """
        try:
            return self._run()
        except _CallerError as wrapped:
            raise wrapped.error from None
        except (CorruptError, TruncatedError, UnsafeLoadError):
            raise
        except (ImportError, AttributeError):
            raise  # a name the policy allows but that does not exist, as pickle reports it
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

    def _run(self) -> Any:
        read, table, stop = self._read, _DISPATCH, pickle.STOP[0]
        while True:
            code = read(1)
            if not code:
                raise TruncatedError("the pickle stream", self._input.offset, 1, 0)
            if code[0] == stop:
                return self._stop()
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
        if isinstance(value, _Pending):
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
        if isinstance(value, _Pending):
            raise CorruptError(
                "the pickle refers to a numpy dtype or array inside its own state (a recursive numpy "
                "object): safe mode does not load those"
            )
        self._stack.append(value)

    def _memo_put(self, key: int) -> None:
        if not self._stack:
            raise CorruptError("the pickle memoizes from an empty stack")
        value = self._stack[-1]
        if isinstance(value, _Pending):
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
        if isinstance(obj, (tuple, frozenset)):
            self._track(obj)
        return obj

    def _find_class(self, module: Any, name: Any) -> Any:
        if not isinstance(module, str) or not isinstance(name, str):
            raise CorruptError(f"a global's module and name must be strings, not {module!r} and {name!r}")
        self._policy.check(module, name)
        if self._proto < 3 and self._fix_imports:
            if (module, name) in _compat_pickle.NAME_MAPPING:
                module, name = _compat_pickle.NAME_MAPPING[(module, name)]
            elif module in _compat_pickle.IMPORT_MAPPING:
                module = _compat_pickle.IMPORT_MAPPING[module]
        obj = importlib.import_module(module)
        for part in name.split(".") if self._proto >= 4 else [name]:
            obj = getattr(obj, part)
        return obj

    def _call(self, func: Any, args: Any, kwargs: Any = None) -> Any:
        """Return ``func(*args, **kwargs)``: checked for what safe mode allows by default,
        as is for what the caller allowed."""
        if not isinstance(args, tuple) or not (kwargs is None or isinstance(kwargs, dict)):
            raise CorruptError(f"a call's arguments must be a tuple (and a dict), not {args!r}")
        checked = _CHECKED_CALLS.get(func) if _hashable(func) else None
        if checked is not None:
            if kwargs:
                raise CorruptError(f"{_name(func)} takes no keyword arguments in safe mode")
            result = checked(args)
            if isinstance(result, _Pending):
                self._pending += 1
            return result
        if not callable(func):
            raise CorruptError(f"the pickle calls a {type(func).__name__}, which is not callable")
        try:
            return func(*args, **(kwargs or {}))
        except Exception as exc:
            raise _CallerError(exc) from exc

    def _newobj(self, cls: Any, args: Any, kwargs: Any = None) -> Any:
        if not isinstance(cls, type):
            raise CorruptError(f"NEWOBJ needs a class, not {cls!r}")
        if cls in _CHECKED_CALLS:
            return self._call(cls, args, kwargs)  # cls.__new__(cls, *args) is cls(*args) for these
        if not isinstance(args, tuple) or not (kwargs is None or isinstance(kwargs, dict)):
            raise CorruptError(f"NEWOBJ's arguments must be a tuple (and a dict), not {args!r}")
        try:
            return cls.__new__(cls, *args, **(kwargs or {}))
        except Exception as exc:
            raise _CallerError(exc) from exc

    def _build(self) -> None:
        state = self._stack.pop()
        obj = self._stack[-1]
        if isinstance(obj, _Pending):
            built = _rebuild_dtype(obj.args, state) if obj.kind == "dtype" else _rebuild_array(state)
            self._pending -= 1
            self._stack[-1] = built
            for key in obj.keys:
                self._memo[key] = built
            return
        if _builtin(type(obj)):
            raise CorruptError(f"safe mode sets the state of no {type(obj).__module__}.{type(obj).__qualname__} object")
        try:
            _set_state(obj, state)
        except Exception as exc:
            raise _CallerError(exc) from exc

    # -- opcodes ----------------------------------------------------------------------

    def _proto_op(self) -> None:
        proto = self._read(1)[0]
        if proto > pickle.HIGHEST_PROTOCOL:
            raise CorruptError(f"unsupported pickle protocol: {proto}")
        self._proto = proto

    def _frame(self) -> None:
        self._input.start_frame(self._size(8))

    def _mark(self) -> None:
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
        if type(value) is _Pending:
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

    def _tuple(self) -> None:
        items = tuple(self._pop_mark())
        self._track(items)
        self._stack.append(items)

    def _empty_list(self) -> None:
        self._stack.append([])

    def _empty_dict(self) -> None:
        self._stack.append({})

    def _empty_set(self) -> None:
        self._stack.append(set())

    def _empty_tuple(self) -> None:
        self._stack.append(())

    def _list(self) -> None:
        items = self._pop_mark()
        self._stack.append(items)

    def _dict(self) -> None:
        items = self._pop_mark()
        self._stack.append(_pairs(items, {}))

    def _frozenset(self) -> None:
        items = frozenset(self._pop_mark())
        self._track(items)
        self._stack.append(items)

    def _append(self) -> None:
        value = self._stack.pop()
        self._extend(self._stack[-1], [value])

    def _appends(self) -> None:
        items = self._pop_mark()
        self._extend(self._stack[-1], items)

    def _extend(self, target: Any, items: list[Any]) -> None:
        if type(target) is list:
            target.extend(items)
        elif _builtin(type(target)):
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
                raise _CallerError(exc) from exc

    def _setitem(self) -> None:
        value = self._stack.pop()
        key = self._stack.pop()
        self._setitems(self._stack[-1], [key, value])

    def _setitems_op(self) -> None:
        items = self._pop_mark()
        self._setitems(self._stack[-1], items)

    def _setitems(self, target: Any, items: list[Any]) -> None:
        if type(target) is dict:
            _pairs(items, target)
        elif _builtin(type(target)):
            raise CorruptError(f"SETITEM(S) on a {type(target).__name__}")
        else:
            try:
                for i in range(0, len(items) - 1, 2):
                    target[items[i]] = items[i + 1]
            except Exception as exc:
                raise _CallerError(exc) from exc

    def _additems(self) -> None:
        items = self._pop_mark()
        target = self._stack[-1]
        if type(target) is set:
            target.update(items)
        elif _builtin(type(target)):
            raise CorruptError(f"ADDITEMS on a {type(target).__name__}")
        else:
            try:
                for item in items:
                    target.add(item)
            except Exception as exc:
                raise _CallerError(exc) from exc

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
        value = self._stack[-1]
        if type(value) is _Pending:
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
        self._stack.append(self._made(self._call(func, args)))

    def _newobj_op(self) -> None:
        args = self._stack.pop()
        cls = self._stack.pop()
        self._stack.append(self._made(self._newobj(cls, args)))

    def _newobj_ex(self) -> None:
        kwargs = self._stack.pop()
        args = self._stack.pop()
        cls = self._stack.pop()
        if type(kwargs) is not dict:
            raise CorruptError(f"NEWOBJ_EX's keyword arguments must be a dict, not {type(kwargs).__name__}")
        self._stack.append(self._made(self._newobj(cls, args, kwargs)))

    def _build_op(self) -> None:
        self._build()

    def _inst(self) -> None:
        module = self._line().decode("utf-8")
        name = self._line().decode("utf-8")
        self._policy.check(module, name)
        raise UnsafeLoadError(module, name, "safe mode does not load the INST opcode (Python 3 never writes it)")

    def _obj(self) -> None:
        items = self._pop_mark()
        cls = items[0] if items else None
        module = getattr(cls, "__module__", "?")
        name = getattr(cls, "__qualname__", repr(cls))
        raise UnsafeLoadError(
            str(module), str(name), "safe mode does not load the OBJ opcode (Python 3 never writes it)"
        )

    def _persid(self) -> None:
        raise CorruptError("safe mode does not load persistent IDs (PERSID, BINPERSID)")


def _push(value: Any) -> Callable[[RestrictedUnpickler], None]:
    """The handler of an opcode that pushes ``value``."""

    def push(self: RestrictedUnpickler) -> None:
        self._stack.append(value)

    return push


def _tuple_n(n: int) -> Callable[[RestrictedUnpickler], None]:
    """The handler of TUPLE1, TUPLE2 or TUPLE3."""

    def tuple_n(self: RestrictedUnpickler) -> None:
        stack = self._stack
        if len(stack) < n:
            raise CorruptError(f"TUPLE{n} needs {n} items on the stack, it has {len(stack)}")
        items = tuple(stack[len(stack) - n :])
        del stack[len(stack) - n :]
        self._track(items)
        stack.append(items)

    return tuple_n


def _ext(width: int) -> Callable[[RestrictedUnpickler], None]:
    """The handler of EXT1, EXT2 or EXT4: refuses the extension code."""

    def ext(self: RestrictedUnpickler) -> None:
        code = int.from_bytes(self._read(width), "little")
        raise UnsafeLoadError(
            "copyreg", f"extension code {code:#x}", "safe mode does not load extension codes (EXT1, EXT2, EXT4)"
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
        "TUPLE": RestrictedUnpickler._tuple,
        "EMPTY_TUPLE": RestrictedUnpickler._empty_tuple,
        "TUPLE1": _tuple_n(1),
        "TUPLE2": _tuple_n(2),
        "TUPLE3": _tuple_n(3),
        "EMPTY_LIST": RestrictedUnpickler._empty_list,
        "LIST": RestrictedUnpickler._list,
        "EMPTY_DICT": RestrictedUnpickler._empty_dict,
        "DICT": RestrictedUnpickler._dict,
        "EMPTY_SET": RestrictedUnpickler._empty_set,
        "FROZENSET": RestrictedUnpickler._frozenset,
        "APPEND": RestrictedUnpickler._append,
        "APPENDS": RestrictedUnpickler._appends,
        "SETITEM": RestrictedUnpickler._setitem,
        "SETITEMS": RestrictedUnpickler._setitems_op,
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
        "NEWOBJ": RestrictedUnpickler._newobj_op,
        "NEWOBJ_EX": RestrictedUnpickler._newobj_ex,
        "BUILD": RestrictedUnpickler._build_op,
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


def _pairs(items: list[Any], target: dict[Any, Any]) -> dict[Any, Any]:
    """Set ``target[key] = value`` for the (key, value) pairs ``items`` lists; return it."""
    if len(items) % 2:
        raise CorruptError("a dict's items come in key/value pairs: one is missing")
    for i in range(0, len(items), 2):
        target[items[i]] = items[i + 1]
    return target


def _set_state(obj: Any, state: Any) -> None:
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


def _builtin(cls: type) -> bool:
    """Whether ``cls`` is a builtin or numpy type (whose native state safe mode never sets),
    or the placeholder of a numpy object waiting for its state."""
    if cls is _Pending:
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


def _call_dtype(args: tuple[Any, ...]) -> _Pending:
    _arity(args, 1, 3, "numpy.dtype")
    code = args[0]
    if not isinstance(code, str) or len(code) > _MAX_CODE or not all(type(flag) in (bool, int) for flag in args[1:]):
        raise CorruptError(f"numpy.dtype takes a type code and two flags in safe mode, not {args!r:.80}")
    try:
        np.dtype(code)  # check it now
    except Exception as exc:  # numpy raises TypeError, ValueError, even SyntaxError for some codes
        raise CorruptError(f"numpy.dtype refuses the type code {code!r}: {exc}") from None
    return _Pending("dtype", args)


def _call_reconstruct(args: tuple[Any, ...]) -> Any:
    _arity(args, 3, 3, "numpy _reconstruct")
    cls = args[0]
    if cls is np.ndarray:
        return _Pending("array", args)
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


def _refuse_ndarray(args: tuple[Any, ...]) -> None:
    raise UnsafeLoadError("numpy", "ndarray", "safe mode builds arrays only through their reconstructors")


_CHECKED_CALLS: dict[Any, Callable[[tuple[Any, ...]], Any]] = {
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
    np.ndarray: _refuse_ndarray,
}


# -- dtypes and arrays from their states ------------------------------------------------------


def _rebuild_dtype(args: tuple[Any, ...], state: Any) -> np.dtype:
    """Return the dtype that ``np.dtype(*args)`` and ``state`` (``dtype.__reduce__``) describe,
    built by numpy's constructor from checked parts.

    Raises:
        CorruptError: for a state that is not one numpy writes, or that numpy's constructor refuses.
    """
    if not isinstance(state, tuple) or len(state) not in (8, 9) or state[0] not in (3, 4):
        raise CorruptError(
            f"a numpy dtype's state must be a tuple of 8 or 9 items of version 3 or 4, not {state!r:.120}"
        )
    endian, subarray, names, fields, elsize, _alignment, flags = state[1:8]
    extra = state[8] if len(state) == 9 else None
    base = np.dtype(args[0])
    if endian not in _BYTE_ORDERS or type(elsize) is not int or type(flags) is not int:
        raise CorruptError(f"a numpy dtype's state has a bad byte order, item size or flags: {state!r:.120}")
    metadata, datetime = extra, None
    if base.kind in "mM":
        if not (isinstance(extra, tuple) and len(extra) == 2):
            raise CorruptError(f"a numpy datetime dtype's state must hold its unit, not {extra!r:.120}")
        metadata, datetime = extra
    if metadata is not None and type(metadata) is not dict:
        raise CorruptError(f"a numpy dtype's metadata must be a dict, not {type(metadata).__name__}")
    try:
        if names is not None:
            dtype = _structured(base, names, fields, elsize, bool(flags & _ALIGNED_STRUCT))
        elif subarray is not None:
            dtype = _subarray(subarray, elsize)
        elif datetime is not None:
            dtype = _datetime(base, datetime)
        elif base.kind in "SUV" and elsize != base.itemsize:
            unit = 4 if base.kind == "U" else 1
            if elsize < 0 or elsize % unit:
                raise CorruptError(f"a numpy {base.kind} dtype cannot have an item size of {elsize}")
            dtype = np.dtype(f"{base.kind}{elsize // unit}")
        else:
            dtype = base
        if endian in "<>=" and names is None and subarray is None:
            dtype = dtype.newbyteorder("=" if endian == _NATIVE else endian)
        if metadata is not None:
            dtype = np.dtype(dtype, metadata=metadata)
    except CorruptError:
        raise
    except Exception as exc:
        raise CorruptError(f"numpy refuses the dtype state {state!r:.120}: {exc}") from None
    return dtype


def _structured(base: np.dtype, names: Any, fields: Any, elsize: int, aligned: bool) -> np.dtype:
    """A structured dtype from the names and fields of a dtype state."""
    if base.kind != "V" or type(names) is not tuple or type(fields) is not dict or elsize < 0:
        raise CorruptError("a structured numpy dtype's state must hold a tuple of names and a dict of fields")
    formats, offsets, titles = [], [], []
    for name in names:
        field = fields.get(name) if isinstance(name, str) else None
        if not (type(field) is tuple and len(field) in (2, 3)):
            raise CorruptError(f"the field {name!r:.80} of a numpy dtype has no (dtype, offset[, title]) entry")
        dtype, offset = field[:2]
        title = field[2] if len(field) == 3 else None
        if not isinstance(dtype, np.dtype) or type(offset) is not int or not 0 <= offset <= elsize - dtype.itemsize:
            raise CorruptError(
                f"the field {name!r:.80} of a numpy dtype of {elsize} bytes must be a dtype at an offset "
                f"inside it, not {field!r:.120}"
            )
        if title is not None and not (isinstance(title, str) and fields.get(title) == field):
            raise CorruptError(f"the field {name!r:.80} of a numpy dtype has a bad title {title!r:.80}")
        formats.append(dtype)
        offsets.append(offset)
        titles.append(title)
    if len(fields) != len(names) + sum(title is not None for title in titles):
        raise CorruptError("a structured numpy dtype's state lists fields that are not in its names")
    return np.dtype(
        {"names": list(names), "formats": formats, "offsets": offsets, "titles": titles, "itemsize": elsize},
        align=aligned,
    )


def _subarray(subarray: Any, elsize: int) -> np.dtype:
    """A subarray dtype from the ``(base, shape)`` of a dtype state."""
    if not (type(subarray) is tuple and len(subarray) == 2 and isinstance(subarray[0], np.dtype)):
        raise CorruptError(f"a numpy subarray dtype's state must hold (dtype, shape), not {subarray!r:.120}")
    base, shape = subarray
    shape = (shape,) if type(shape) is int else shape
    if type(shape) is not tuple or not all(type(n) is int and n >= 0 for n in shape):
        raise CorruptError(f"a numpy subarray dtype's shape must be a tuple of sizes, not {shape!r:.80}")
    if math.prod(shape) * base.itemsize != elsize:
        raise CorruptError(f"a numpy subarray dtype of shape {shape} and base {base} cannot hold {elsize} bytes")
    return np.dtype((base, shape))


def _datetime(base: np.dtype, datetime: Any) -> np.dtype:
    """A datetime64 or timedelta64 dtype from the ``(unit, count, 1, 1)`` of a dtype state."""
    if not (type(datetime) is tuple and len(datetime) == 4 and type(datetime[0]) is bytes):
        raise CorruptError(f"a numpy datetime dtype's unit must be (unit, count, 1, 1), not {datetime!r:.80}")
    unit, count = datetime[0].decode("ascii", "replace"), datetime[1]
    if unit not in _DATETIME_UNITS or type(count) is not int or not 1 <= count < 1 << 31:
        raise CorruptError(f"a numpy datetime dtype cannot have the unit {datetime!r:.80}")
    return np.dtype(f"{base.char}8" if unit == "generic" else f"{base.char}8[{count}{unit}]")


def _rebuild_array(state: Any) -> np.ndarray:
    """Return the array that an ndarray state ``(version, shape, dtype, fortran, data)``
    describes, built with numpy's constructors from checked parts.

    Raises:
        CorruptError: for a state that is not one numpy writes, or whose data does not match
            its shape and dtype.
    """
    if isinstance(state, tuple) and len(state) == 5 and state[0] == 1:
        state = state[1:]
    if not (isinstance(state, tuple) and len(state) == 4):
        raise CorruptError(f"a numpy array's state must be (1, shape, dtype, fortran, data), not {state!r:.120}")
    shape, dtype, fortran, data = state
    if type(shape) is not tuple or not all(type(n) is int and n >= 0 for n in shape):
        raise CorruptError(f"a numpy array's shape must be a tuple of sizes, not {shape!r:.80}")
    if not isinstance(dtype, np.dtype) or type(fortran) not in (bool, int):
        raise CorruptError(f"a numpy array's state must hold a dtype and a flag, not {dtype!r:.80}, {fortran!r:.80}")
    order: Literal["C", "F"] = "F" if fortran else "C"
    count = math.prod(shape)
    native = dtype.newbyteorder("=") if dtype.byteorder in "<>" and not dtype.isnative else dtype
    try:
        if dtype.hasobject:
            return _object_array(shape, dtype, order, data, count)
        nbytes = count * dtype.itemsize
        try:
            view = memoryview(data).cast("B")
        except TypeError:
            raise CorruptError(f"a numpy array's data must be bytes-like, not {type(data).__name__}") from None
        if view.nbytes != nbytes:
            raise CorruptError(
                f"an array of shape {shape} and dtype {dtype} needs {nbytes} bytes, its data holds {view.nbytes}"
            )
        if not nbytes:
            return np.empty(shape, native, order)
        array = np.frombuffer(view, dtype=dtype).reshape(shape, order=order)
        if native is not dtype:  # numpy's __setstate__ swaps the data to native byte order
            return array.astype(native, order="K")
        return array if not view.readonly else array.copy(order="K")
    except CorruptError:
        raise
    except Exception as exc:
        raise CorruptError(f"numpy refuses the array of shape {shape} and dtype {dtype}: {exc}") from None


def _object_array(
    shape: tuple[int, ...], dtype: np.dtype, order: Literal["C", "F"], items: Any, count: int
) -> np.ndarray:
    """An array of a dtype that holds objects, from the list of its items in C order."""
    if type(items) is not list or len(items) != count:
        raise CorruptError(f"an object array of shape {shape} needs a list of {count} items")
    flat = np.empty(count, dtype)
    for i, item in enumerate(items):
        flat[i] = item
    array = flat.reshape(shape)
    return np.asfortranarray(array) if order == "F" else array
