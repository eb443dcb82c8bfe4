"""The state of the restricted unpickler (`blpickle.restricted.unpickler`): its pickle machine
of stack, marks and memo over the input, the budgets a decompressed stream pays for, and the
helpers its opcode handlers share, those of a load and those of the listing of refusals
(`blpickle.restricted.listing`) alike."""

from __future__ import annotations

import _compat_pickle
import importlib
from collections import defaultdict, deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np

from ..errors import CorruptError, UnsafeLoadError
from .budget import Budget
from .input import PickleInput
from .numpy_state import Pending
from .policy import Admitted, Policy
from .registry import Context
from .shown import shown

__all__ = [
    "COPIES_PER_BYTE",
    "COPIES_SLACK",
    "OBJECTS_PER_BYTE",
    "OBJECTS_SLACK",
    "OPCODES_PER_BYTE",
    "OPCODES_SLACK",
    "UNKNOWN",
    "Handler",
    "Machine",
    "Refusal",
]

#: The deepest nesting loaded of tuples, frozensets, deques, defaultdicts and arrays of objects
#: (Python's own recursion limit): hashing a tuple or frozenset recurses in C without a limit,
#: and so does freeing the others (a dict key, a deque or an array of objects a million deep
#: crashes the process, when it is hashed or freed).
_MAX_NESTING = 1000
#: The nests that a pickle fills after making them (their C code frees them without
#: CPython's trashcan, which bounds the recursion of freeing lists, dicts and instances).
_FILLED_NESTS = (deque, defaultdict)
#: The nests that a call may make.
_MADE_NESTS = (tuple, frozenset, *_FILLED_NESTS)
#: What nests, if an array holds objects.
_NESTS = (*_MADE_NESTS, np.ndarray)
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
#: ... and its reconstructors copy at most ``COPIES_SLACK + COPIES_PER_BYTE * n`` bytes, n the
#: bytes of the pickle stream and of the out-of-band buffers taken so far: a bytes literal
#: named again and again from the memo cannot be copied again and again.
COPIES_SLACK = 64 << 20
COPIES_PER_BYTE = 2


class Refusal(Exception):
    """Raised inside the interpreter at the first refusal: the rest of the pickle is then
    read to list every other global the policy refuses, running nothing more."""

    def __init__(self, error: UnsafeLoadError) -> None:
        super().__init__()
        self.error = error


class _Unknown:
    """What an operation that was not run gives, once the load lists refusals."""

    __slots__ = ()


UNKNOWN = _Unknown()


class Machine:
    """The pickle machine of one restricted load: its input, stack, marks and memo, what the
    policy admitted and refused, and the budgets of objects and opcodes.

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
        self._pending = 0  # how many dtypes, arrays and objects wait for their state (`Pending`)
        #: id -> (nest, its nesting depth), for every filled nest the load made and every nest of depth > 1
        self._depths: dict[int, tuple[Any, int]] = {}
        self._held: set[int] = set()  # ids of the filled nests that a nest holds
        self._proto = 0
        self._grants: dict[int, Admitted] = {}  # id -> how each imported global was admitted
        self._refused: dict[str, str] = {}  # module.name -> why, once the load lists refusals
        self._objects = Budget("makes over {} objects", OBJECTS_SLACK, OBJECTS_PER_BYTE, stored)
        self._opcodes = Budget("runs over {} opcodes", OPCODES_SLACK, OPCODES_PER_BYTE, stored)
        self._buffer_bytes = 0  # of the out-of-band buffers taken so far
        #: id -> each object whose state is set (by BUILD, or by the reconstructor that made
        #: it), kept alive so that no other object gets its id during the load
        self._built: dict[int, Any] = {}
        copies = Budget("copies over {} bytes", COPIES_SLACK, COPIES_PER_BYTE, self._consumed)
        self._context = Context(policy.admitted, copies, self._mark_built)

    def _mark_built(self, obj: Any) -> None:
        """Record that ``obj`` has its state: a BUILD of it would change what was checked."""
        self._built[id(obj)] = obj

    def _consumed(self) -> int:
        """The bytes of input taken so far: of the pickle stream and of out-of-band buffers."""
        return self._input.consumed + self._buffer_bytes

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
                "the pickle refers to a dtype, array or object before it gets its state (inside its own "
                "state: a recursive numpy object): safe mode does not load those"
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

    def _track(self, obj: Any, items: Iterable[Any] | None = None) -> None:
        """Record how deeply nests (tuples, frozensets, deques, defaultdicts, arrays of objects)
        nest in ``obj``, a nest the pickle made or filled with ``items`` (default: its own).

        Raises:
            CorruptError: for ``obj`` nested deeper than ``_MAX_NESTING``, or a deque or
                defaultdict that a nest holds filled with a nest (the depth of what holds it
                would be wrong).
        """
        depth = 1
        depths = self._depths
        held = []
        for item in obj if items is None else items:
            if isinstance(item, _NESTS):
                entry = depths.get(id(item))
                if entry is not None:
                    depth = max(depth, entry[1] + 1)
                    if isinstance(item, _FILLED_NESTS):
                        held.append(id(item))
                elif not isinstance(item, np.ndarray) or item.dtype.hasobject:
                    depth = max(depth, 2)
        if depth == 1:  # nothing nests in it: nothing changes
            return
        entry = depths.get(id(obj))
        if entry is None or depth > entry[1]:
            if entry is not None and id(obj) in self._held:
                raise CorruptError(
                    f"the pickle fills a {type(obj).__name__} that a tuple, deque, defaultdict or array already "
                    "holds with one of those: safe mode loads one filled before something holds it"
                )
            if depth > _MAX_NESTING:
                raise CorruptError(
                    "the pickle nests tuples, frozensets, deques, defaultdicts or arrays of objects more than "
                    f"{_MAX_NESTING} deep"
                )
            depths[id(obj)] = (obj, depth)
        self._held.update(held)

    def _made(self, obj: Any) -> Any:
        """Return ``obj``, made by a call, its nesting recorded if it nests."""
        self._count()
        if isinstance(obj, _MADE_NESTS):
            if isinstance(obj, _FILLED_NESTS):  # recorded, to be found when it is filled or held
                self._depths[id(obj)] = (obj, 1)
            self._track(obj)
        elif isinstance(obj, Pending):
            self._pending += 1
        return obj

    def _count(self) -> None:
        """Count one object (a container, a call's result, a memo entry) against the budget
        that the input read so far pays for."""
        self._objects.spend()

    def _find_class(self, module: Any, name: Any) -> Any:
        if not isinstance(module, str) or not isinstance(name, str):
            raise CorruptError(f"a global's module and name must be strings, not {shown(module)} and {shown(name)}")
        if self._proto < 4 and "." in name:  # pickle looks dotted names up from protocol 4 on
            raise AttributeError(f"module {shown(module)} has no attribute {shown(name)}")
        python2 = (module, name) in _compat_pickle.NAME_MAPPING or module in _compat_pickle.IMPORT_MAPPING
        if python2 and not self._fix_imports and self._proto < 3:
            importlib.import_module(module)  # pickle imports the Python 2 name as it is: fails
        try:
            admitted = self._policy.admit(module, name)
        except UnsafeLoadError as exc:
            raise Refusal(exc) from None
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

    def _filled(self, items: list[Any]) -> tuple[Any, bool]:
        """Return the object on top of the stack, which the pickle fills with ``items``
        (`_changed`; its nesting tracked if it nests), and whether the caller named its class
        exactly."""
        target = self._changed(self._stack[-1])
        if isinstance(target, _FILLED_NESTS):
            self._track(target, items)
        return target, self._named(type(target))

    def _named(self, cls: type) -> bool:
        """Whether the caller named ``cls`` exactly (then its code's errors are the caller's)."""
        grant = self._grant(cls)
        return grant is not None and grant.how == "exact"

    def _grant(self, obj: Any) -> Admitted | None:
        """How the policy admitted ``obj``, a global this load imported (None: it did not)."""
        grant = self._grants.get(id(obj))
        return grant if grant is not None and grant.obj is obj else None

    def _refuse(self, error: UnsafeLoadError) -> None:
        """Record a refusal, to be listed with the others."""
        self._refused.setdefault(f"{error.module}.{error.name}", error.reason)


def _describe(obj: Any) -> str:
    name = getattr(obj, "__qualname__", None)
    return f"{getattr(obj, '__module__', '')}.{name}" if isinstance(name, str) else ""


#: An opcode's handler: reads its arguments and changes the machine.
Handler = Callable[[Machine], None]
