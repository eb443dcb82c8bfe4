"""Reading a pickle's opcodes without running them: the globals it would import.

`scan_globals` reads a pickle stream from an iterator of pieces (a record's decompressed
chunks, one at a time) and keeps only the current piece and a model of the unpickler's
state whose size has fixed limits, so its memory does not grow with the stream's size:

- strings (the only values a global's name can be made of) are kept up to ``MAX_NAME``
  bytes; longer data is skipped over as it streams by, never held;
- the stack is modelled as the unpickler keeps it (values and marks, `POP` taking a mark
  off the top as CPython does), at most ``MAX_STACK`` entries deep: deeper, its bottom half
  is forgotten and reads as unknown values;
- the memo keeps strings up to ``MAX_MEMO_BYTES`` in all, and tracks which indices are set
  (``MEMOIZE`` stores at their count) while that takes at most ``MAX_MEMO_INDICES`` entries;
  past either limit, what it no longer knows reads as unknown.

What is not known is never guessed: a ``STACK_GLOBAL`` whose operands are not both known
strings is reported as ``<computed>``. Every name that is known is reported, until the
names take ``MAX_GLOBALS_BYTES`` (then `LimitError`).

Its work is bounded by the input it reads, not by what that decompresses to: opcodes are
read one at a time at most ``MAX_OPS_PER_BYTE`` times the bytes of input read so far (then
`LimitError`), and a long run of opcodes that only push and pop unknown values (``NONE``,
``BININT1``, ``MARK``, ``APPENDS``...) is read at once by a regular expression,
the model's stack forgotten after it (what pickles hold most, and zstd stores thousands of
times smaller).

A record's pickle stream (protocol 4 and up) is read along its `blpickle.format.layout.Layout`,
the parser the loader follows too: the opcodes outside the frames are the layout's tokens,
spliced payloads are not in the stream (their values are unknown), and an opcode may not
run past the end of its frame.
"""

from __future__ import annotations

import codecs
import copyreg
import io
import pickle
import pickletools
import re
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from ..errors import CorruptError, LimitError
from .layout import ARGUMENT, COUNT_WIDTHS, DATA, END, FRAME, OPCODE, SPLICE, Layout

__all__ = [
    "MAX_GLOBALS_BYTES",
    "MAX_MEMO_BYTES",
    "MAX_MEMO_INDICES",
    "MAX_NAME",
    "MAX_OPS_PER_BYTE",
    "MAX_STACK",
    "scan_globals",
]

#: Strings (and lines) longer than this are skipped, not kept: their value is unknown.
MAX_NAME = 1024
#: Entries of the modelled stack; deeper, its bottom half reads as unknown.
MAX_STACK = 4096
#: Bytes of strings kept in the modelled memo (each counted with ``_ENTRY_COST``).
MAX_MEMO_BYTES = 8 << 20
#: Memo indices tracked out of order (beyond the contiguous ones from 0).
MAX_MEMO_INDICES = 1 << 16
#: Bytes of the names reported (each counted with ``_ENTRY_COST``).
MAX_GLOBALS_BYTES = 8 << 20
_ENTRY_COST = 100
#: Opcodes read one at a time (and runs, at ``_RUN_BYTE_COST`` per byte) per byte of input
#: read so far: blpickle's writer stores the densest pickles (a tuple of a million ``None``)
#: about 3,600 times smaller, but those are runs; a protocol 0 list of zeros, 1,800 opcodes
#: (lines, read one at a time) per byte.
MAX_OPS_PER_BYTE = 4096
#: After this many opcodes in a row that may form a run, the rest of the run is read at once ...
RUN_START = 32
#: ... in steps of at most this many bytes (matching a repeated group, the regular expression
#: engine keeps about 128 bytes per repetition).
RUN_WINDOW = 4 << 10

COMPUTED = "<computed>"


class _Mark:
    """The mark an opcode such as ``MARK`` pushes (a value no opcode can push)."""


_MARK = _Mark()
_NEWLINE = re.compile(b"\n")
_STRING_KINDS = {
    "SHORT_BINUNICODE": "utf-8",
    "BINUNICODE": "utf-8",
    "BINUNICODE8": "utf-8",
    "SHORT_BINSTRING": "latin-1",
    "BINSTRING": "latin-1",
}
_LINE_STRINGS = {"UNICODE", "STRING"}
#: What an opcode does to the model, beyond popping and pushing unknown values.
_ACTIONS = {
    **dict.fromkeys(("PROTO", "FRAME", "STOP"), "nothing"),
    **dict.fromkeys(("PUT", "BINPUT", "LONG_BINPUT"), "put"),
    **dict.fromkeys(("GET", "BINGET", "LONG_BINGET"), "get"),
    **dict.fromkeys(("GLOBAL", "INST"), "global"),
    **dict.fromkeys(("EXT1", "EXT2", "EXT4"), "extension"),
    **dict.fromkeys((*_STRING_KINDS, *_LINE_STRINGS), "string"),
    "MEMOIZE": "memoize",
    "MARK": "mark",
    "DUP": "dup",
    "STACK_GLOBAL": "stack_global",
}
#: Opcodes whose fixed-size argument is needed (not only skipped).
_DECODED = {"BINGET", "LONG_BINGET", "BINPUT", "LONG_BINPUT", "EXT1", "EXT2", "EXT4"}


class _Op:
    """What the scanner needs of an opcode: its argument's shape and its stack effect."""

    def __init__(self, info: pickletools.OpcodeInfo) -> None:
        self.name = info.name
        self.code = ord(info.code)
        n = 0 if info.arg is None else info.arg.n
        self.width = n if n >= 0 else COUNT_WIDTHS.get(n, 0)  # fixed bytes
        self.counted = n in COUNT_WIDTHS  # the fixed bytes count the data that follows
        self.signed = n == pickletools.TAKEN_FROM_ARGUMENT4
        pair = info.arg is not None and info.arg.name == "stringnl_noescape_pair"
        self.lines = 0 if n != pickletools.UP_TO_NEWLINE else 2 if pair else 1
        self.reader: Any = None if info.arg is None else info.arg.reader
        before = info.stack_before
        self.to_mark = pickletools.markobject in before
        self.pops = before.index(pickletools.markobject) if self.to_mark else len(before)
        self.pushes = len(info.stack_after)
        self.action = _ACTIONS.get(self.name, "")
        self.decoded = self.name in _DECODED
        self.plain = not (n or self.action)  # no argument, pops and pushes unknown values


_OPS = {op.code: op for op in map(_Op, pickletools.opcodes)}
#: Opcodes that only push values the model forgets (and marks, and memo values) and pop values,
#: with no argument or one of fixed size: a run of them is read at once.
_RUN_OPS = {op.code: op for op in _OPS.values() if op.action in ("", "mark", "get") and not op.counted and not op.lines}


def _tokens(memoize: bool, get: bool) -> bytes:
    """The regular expression of one opcode of a run with its argument: those of ``_RUN_OPS``
    (the memo's ``get`` ones only with ``get``), and ``MEMOIZE`` (as a group) with ``memoize``."""
    ops = [op for op in _RUN_OPS.values() if get or op.action != "get"]
    tokens = [re.escape(bytes([op.code])) + b"." * op.width for op in ops]
    if memoize:
        tokens.append(b"(" + re.escape(pickle.MEMOIZE) + b")")
    return b"(?:" + b"|".join(tokens) + b")"


#: One opcode of a run, with ``MEMOIZE`` (read in a run only while the memo's indices are
#: those from 0 up: each then stores at a fresh index, its value forgotten).
_RUN_TOKEN = re.compile(_tokens(True, True), re.DOTALL)
#: A run, without and with ``MEMOIZE``. It never ends with a ``get`` opcode: the value a get
#: pushes last (a module's name, for ``STACK_GLOBAL``) is read one opcode at a time.
_RUN = {
    memoize: re.compile(_tokens(memoize, True) + b"*" + _tokens(memoize, False), re.DOTALL) for memoize in (False, True)
}
#: A run's bytes count as this many opcodes read one at a time.
_RUN_BYTE_COST = 1 / 16


class _Cursor:
    """The bytes of a stream given in pieces, read forward; only the current piece is held."""

    def __init__(self, pieces: Iterable[Any]) -> None:
        self._pieces = iter(pieces)
        self._piece = memoryview(b"")
        self._at = 0  # offset in the current piece
        self.pos = 0  # offset in the stream

    def _fill(self) -> bool:
        while self._at == len(self._piece):
            piece = next(self._pieces, None)
            if piece is None:
                return False
            self._piece, self._at = memoryview(piece).cast("B"), 0
        return True

    def at_end(self) -> bool:
        """True when the stream has no more bytes."""
        return self._at == len(self._piece) and not self._fill()

    def byte(self, end: float) -> int:
        """Return the next byte (an opcode).

        Raises:
            CorruptError: when the stream, or ``end``, comes first.
        """
        at = self._at
        if at < len(self._piece) and self.pos < end:
            self._at = at + 1
            self.pos += 1
            return self._piece[at]
        return self.read(1, end)[0]

    def read(self, size: int, end: float) -> bytes:
        """Return the next ``size`` bytes (a small size: they are copied).

        Raises:
            CorruptError: when the stream, or ``end``, comes first.
        """
        self._check_end(size, end)
        at = self._at
        if at + size <= len(self._piece):  # the common case: within the piece
            self._at = at + size
            self.pos += size
            return bytes(self._piece[at : at + size])
        out = bytearray()
        while len(out) < size:
            if not self._fill():
                raise CorruptError(f"the pickle stream ends at offset {self.pos}, inside an opcode")
            take = min(size - len(out), len(self._piece) - self._at)
            out += self._piece[self._at : self._at + take]
            self._at += take
            self.pos += take
        return bytes(out)

    def data(self, size: int, end: float) -> bytes | None:
        """Return the next ``size`` bytes when they are at most ``MAX_NAME``, else skip
        them and return None."""
        if size <= MAX_NAME:
            return self.read(size, end)
        self._check_end(size, end)
        left = size
        while left:
            if not self._fill():
                raise CorruptError(f"the pickle stream ends at offset {self.pos}, inside an opcode's data")
            take = min(left, len(self._piece) - self._at)
            self._at += take
            self.pos += take
            left -= take
        return None

    def line(self, end: float) -> bytes | None:
        """Return the next line, newline included, when it is at most ``MAX_NAME`` bytes;
        else skip it and return None.

        Raises:
            CorruptError: when the stream, or ``end``, comes before the newline.
        """
        kept = bytearray()
        length = 0
        while True:
            if not self._fill():
                raise CorruptError(f"the pickle stream ends at offset {self.pos}, inside a line")
            stop = len(self._piece)
            found = _NEWLINE.search(self._piece, self._at, stop)
            take = (found.end() if found else stop) - self._at
            if self.pos + take > end:
                self._check_end(take, end)
            if length + take <= MAX_NAME:
                kept += self._piece[self._at : self._at + take]
            length += take
            self._at += take
            self.pos += take
            if found:
                return bytes(kept) if length <= MAX_NAME else None

    def run(self, pattern: re.Pattern[bytes], end: float) -> memoryview:
        """Read the longest match of ``pattern`` here, within the current piece, ``end`` and
        ``RUN_WINDOW`` bytes; return its bytes (a view of the piece)."""
        at = self._at
        stop = min(len(self._piece), at + RUN_WINDOW)
        if end != float("inf"):
            stop = min(stop, at + int(end) - self.pos)
        found = pattern.match(self._piece, at, stop)
        if found is None:
            return memoryview(b"")
        self._at = found.end()
        self.pos += found.end() - at
        return self._piece[at : found.end()]

    def _check_end(self, size: int, end: float) -> None:
        if self.pos + size > end:
            raise CorruptError(f"an opcode of the pickle stream runs past its frame's end ({int(end)})")


class _Machine:
    """The bounded model of the unpickler's state: stack, memo, globals found."""

    def __init__(self) -> None:
        self.stack: list[Any] = []  # str (known), None (unknown) or _MARK; below it, unknown
        self.memo: dict[int, str] = {}  # the known strings of the memo
        self.memo_bytes = 0
        self.memo_count = 0  # indices 0 .. memo_count - 1 are set
        self.memo_extra: set[int] | None = set()  # other indices set; None: no longer known
        self.found: dict[str, None] = {}
        self.found_bytes = 0

    def push(self, value: Any) -> None:
        self.stack.append(value)
        if len(self.stack) > MAX_STACK:
            del self.stack[: MAX_STACK // 2]

    def pop(self, count: int, to_mark: bool) -> list[Any]:
        """Pop up to the topmost mark (and the mark) when ``to_mark``, then ``count``
        entries; return those ``count`` (unknown ones where the stack had none)."""
        stack = self.stack
        if not to_mark and count <= len(stack):
            if not count:
                return []
            taken = stack[-count:]
            del stack[-count:]
            return taken
        if to_mark:
            at = len(stack) - 1
            while at >= 0 and stack[at] is not _MARK:
                at -= 1
            del stack[max(at, 0) :]
        taken = stack[len(stack) - count :] if count else []
        del stack[len(stack) - len(taken) :]
        return [None] * (count - len(taken)) + taken

    def top(self) -> Any:
        return self.stack[-1] if self.stack else None

    def memo_set(self, index: int, value: Any) -> None:
        """Store the top of the stack (``value``) at ``index`` of the memo."""
        if index >= self.memo_count and self.memo_extra is not None and index not in self.memo_extra:
            if index == self.memo_count:
                self.memo_count += 1
                while self.memo_count in self.memo_extra:
                    self.memo_extra.discard(self.memo_count)
                    self.memo_count += 1
            elif len(self.memo_extra) < MAX_MEMO_INDICES:
                self.memo_extra.add(index)
            else:
                self.memo_extra = None
        old = self.memo.pop(index, None)
        if old is not None:
            self.memo_bytes -= len(old) + _ENTRY_COST
        if isinstance(value, str) and self.memo_bytes + len(value) + _ENTRY_COST <= MAX_MEMO_BYTES:
            self.memo[index] = value
            self.memo_bytes += len(value) + _ENTRY_COST

    def memoize(self, value: Any) -> None:
        """``MEMOIZE``: store at the count of indices set, when it is known."""
        if self.memo_extra is None:  # the index is not known: any string stored may be replaced
            self.memo.clear()
            self.memo_bytes = 0
        else:
            self.memo_set(self.memo_count + len(self.memo_extra), value)

    def name(self, name: str) -> None:
        if name not in self.found:
            self.found_bytes += len(name) + _ENTRY_COST
            if self.found_bytes > MAX_GLOBALS_BYTES:
                raise LimitError(f"the pickle names globals of over {MAX_GLOBALS_BYTES} bytes in all")
            self.found[name] = None

    def apply(self, op: _Op, arg: Any) -> None:
        """Apply an opcode (with its decoded argument, None when unknown) to the model."""
        action = op.action
        if not action or action == "string":
            self.pop(op.pops, op.to_mark)
            value = arg if isinstance(arg, str) else None
            for _ in range(op.pushes):
                self.push(value)
        elif action == "put":
            if arg is None:  # an index too long to keep
                self.memo_extra = None
                self.memoize(None)
            else:
                self.memo_set(int(arg), self.top())
        elif action == "get":
            self.push(None if arg is None else self.memo.get(int(arg)))
        elif action == "memoize":
            self.memoize(self.top())
        elif action == "mark":
            self.push(_MARK)
        elif action == "dup":
            self.push(self.top())
        elif action == "global":
            self.pop(op.pops, op.to_mark)
            self.name(COMPUTED if arg is None else arg.replace(" ", ".", 1))
            self.push(None)
        elif action == "stack_global":
            module, qualname = self.pop(2, False)
            known = isinstance(module, str) and isinstance(qualname, str)
            self.name(f"{module}.{qualname}" if known else COMPUTED)
            self.push(None)
        elif action == "extension":
            self.name(extension_name(arg))
            self.push(None)


def extension_name(code: int) -> str:
    """Return the ``module.name`` that `copyreg.add_extension` registered for extension
    ``code``, or ``<extension>.code`` when none is. The standard library has no public lookup
    for it: this reads ``copyreg._inverted_registry``, as `pickle` does (tests/test_scan.py
    fails if that name disappears)."""
    registry: dict[int, tuple[str, str]] = copyreg._inverted_registry  # type: ignore[attr-defined]
    module, qualname = registry.get(code, ("<extension>", str(code)))
    return f"{module}.{qualname}"


def _decode(op: _Op, raw: bytes) -> Any:
    """Decode a kept argument with pickletools' reader (which checks it).

    Raises:
        CorruptError: for an argument pickletools refuses.
    """
    try:
        return op.reader(io.BytesIO(raw))
    except (ValueError, UnicodeDecodeError) as exc:
        raise CorruptError(f"the object graph is not a valid pickle: {op.name}: {exc}") from None


class _Scanner:
    def __init__(self, pieces: Iterable[Any], layout: Layout | None, read: Callable[[], int] | None) -> None:
        self.cursor = _Cursor(pieces)
        self.layout = layout
        self.frame_end: float | None = None  # inside a frame: where it ends
        self.end = float("inf")  # where the current opcode must end: the frame's end, if any
        self.machine = _Machine()
        self.read = read  # bytes of input read so far
        self.ops = 0.0  # opcodes read one at a time, and runs at their cost
        self.allowed = 0.0  # how many they may be, as far as checked
        self.streak = 0  # opcodes in a row that may form a run

    def run(self) -> tuple[str, ...]:
        cursor, layout = self.cursor, self.layout
        while True:
            if layout is not None and self.frame_end is None:
                if layout.kind == END:
                    raise CorruptError(f"the pickle stream ends at offset {cursor.pos} without a STOP opcode")
                if layout.kind == FRAME:
                    self._enter_frame()
                    continue
            start = cursor.pos
            if layout is None and cursor.at_end():
                raise CorruptError(f"the pickle stream ends at offset {start} without a STOP opcode")
            code = cursor.byte(self.end)
            op = _OPS.get(code)
            if op is None:
                raise CorruptError(
                    f"the object graph is not a valid pickle: unknown opcode {code:#04x} at offset {start}"
                )
            if layout is not None and self.frame_end is None:
                layout.advance(bytes([code]))
            if op.name == "STOP":
                break
            if op.plain:
                self.machine.pop(op.pops, op.to_mark)
                for _ in range(op.pushes):
                    self.machine.push(None)
            else:
                self.machine.apply(op, self._argument(op))
            self.ops += 1
            if self.ops > self.allowed:
                self._check_work()
            self.streak = self.streak + 1 if code in _RUN_OPS or code == pickle.MEMOIZE[0] else 0
            if self.streak >= RUN_START and (layout is None or self.frame_end is not None):
                self._read_run()
            if cursor.pos == self.end:
                self._leave_frame()
        self._finish_layout()
        return tuple(self.machine.found)

    def _check_work(self) -> None:
        """Refuse more than ``MAX_OPS_PER_BYTE`` opcodes read one at a time per byte of input."""
        if self.read is None:  # the input is the stream itself
            self.allowed = float("inf")
            return
        self.allowed = MAX_OPS_PER_BYTE * self.read()
        if self.ops > self.allowed:
            raise LimitError(
                f"the pickle stream holds over {MAX_OPS_PER_BYTE} opcodes per byte of its record "
                f"(at offset {self.cursor.pos}, after {self.read()} bytes of input): refused, to bound "
                "the time reading it takes"
            )

    def _read_run(self) -> None:
        """Read at once the rest of a run of opcodes that only push and pop unknown values (and,
        while the memo is filled from 0 up, ``MEMOIZE``): the stack is forgotten after it (it
        reads as unknown), and each ``MEMOIZE`` counts an index set."""
        self.streak = 0
        machine = self.machine
        memoize = machine.memo_extra is not None and not machine.memo_extra
        while run := self.cursor.run(_RUN[memoize], self.end):
            machine.stack.clear()
            if memoize and pickle.MEMOIZE in run.tobytes():
                machine.memo_count += _RUN_TOKEN.findall(run).count(pickle.MEMOIZE)
            self.ops += len(run) * _RUN_BYTE_COST
        if self.ops > self.allowed:
            self._check_work()

    def _enter_frame(self) -> None:
        layout = self.layout
        assert layout is not None
        self.frame_end = self.end = layout.start + layout.size
        self._leave_frame()

    def _leave_frame(self) -> None:
        """Move the layout past a frame whose end the opcodes reached."""
        if self.frame_end is not None and self.cursor.pos == self.frame_end:
            self.frame_end, self.end = None, float("inf")
            assert self.layout is not None
            self.layout.advance()

    def _argument(self, op: _Op) -> Any:
        """Read an opcode's argument (and its data); return its value, None when unknown."""
        cursor, layout, end = self.cursor, self.layout, self.end
        outside = layout is not None and self.frame_end is None
        if op.lines:
            lines = [cursor.line(end) for _ in range(op.lines)]
            if any(line is None for line in lines):
                return None
            return _decode(op, b"".join(lines))  # type: ignore[arg-type]
        if not op.width:
            return None
        fixed = cursor.read(op.width, end)
        if outside:
            assert layout is not None
            layout.advance(fixed)
        if not op.counted:
            return _decode(op, fixed) if op.decoded else None
        size = int.from_bytes(fixed, "little", signed=op.signed)
        if size < 0:
            raise CorruptError(f"the object graph is not a valid pickle: {op.name} declares {size} bytes")
        if outside:
            assert layout is not None
            if layout.kind == SPLICE:  # not in the stream
                layout.advance()
                return None
            data = cursor.data(size, end)
            layout.advance()
        else:
            data = cursor.data(size, end)
        if data is None or op.name not in _STRING_KINDS:
            return None
        try:
            return codecs.decode(data, _STRING_KINDS[op.name], "surrogatepass")
        except UnicodeDecodeError as exc:
            raise CorruptError(f"the object graph is not a valid pickle: {op.name}: {exc}") from None

    def _finish_layout(self) -> None:
        """After STOP, walk the rest of the layout to its end (its splices are checked
        there), skipping what the pickle does not read."""
        layout, cursor = self.layout, self.cursor
        if layout is None:
            return
        if self.frame_end is not None:
            cursor.data(int(self.frame_end) - cursor.pos, self.frame_end)
            self.frame_end, self.end = None, float("inf")
            layout.advance()
        while layout.kind != END:
            if layout.kind in (OPCODE, ARGUMENT):
                layout.advance(cursor.read(layout.size, float("inf")))
            else:
                if layout.kind in (FRAME, DATA):
                    cursor.data(layout.size, float("inf"))
                layout.advance()


def scan_globals(
    pieces: Iterable[Any],
    protocol: int | None = None,
    splices: Iterable[tuple[int, int]] = (),
    nbytes: int = 0,
    read: Callable[[], int] | None = None,
) -> tuple[str, ...]:
    """Return every ``module.name`` the pickle in ``pieces`` would import, in order of first
    use, without running it. With the ``protocol`` of a record (4 and up), read the stream
    (``nbytes`` long, its payloads at ``splices`` stored apart) along its layout. ``read``
    says how many bytes of input the pieces come from so far (a record's, which decompress to
    more); without it, the pieces are the input.

    Raises:
        CorruptError: when the data is not a valid pickle, or not one the loader would read
            the same way (a splice anywhere but at a payload, an opcode across a frame's end).
        LimitError: when the names it imports take over ``MAX_GLOBALS_BYTES``, or it holds
            over ``MAX_OPS_PER_BYTE`` opcodes (read one at a time) per byte of ``read``.
    """
    layout = None
    if protocol is not None:
        layout = Layout(protocol, splices, nbytes)
        if protocol < 4:
            layout = None
    return _Scanner(pieces, layout, read).run()


def chunks_of(data: Any, size: int = 1 << 20) -> Iterator[memoryview]:
    """Yield ``data`` in pieces of ``size`` bytes (views, not copies)."""
    view = memoryview(data).cast("B")
    for start in range(0, len(view), size):
        yield view[start : start + size]
