"""blpickle.format.scan: the globals a pickle would import, read in pieces with bounded state."""

from __future__ import annotations

import collections
import datetime
import decimal
import fractions
import io
import pickle

import numpy as np
import pytest
from bombs import peak_allocated

import blpickle
from blpickle.format import scan
from blpickle.format.scan import COMPUTED, scan_globals


def _found_by_the_unpickler(data: bytes) -> tuple[str, ...]:
    """The names CPython's unpickler asks find_class for, in order of first use."""
    names: dict[str, None] = {}

    class Recording(pickle.Unpickler):
        def find_class(self, module, name):
            names[f"{module}.{name}"] = None
            return super().find_class(module, name)

    Recording(io.BytesIO(data)).load()
    return tuple(names)


OBJECTS = [
    {"a": [1, 2.5, "x", b"y", None, True], "b": (1, (2, (3,)))},
    [np.arange(5), np.dtype([("a", "<i4"), ("b", "<f8", (2,))]), np.float32(1.5)],
    [collections.OrderedDict(a=1), collections.Counter("abc"), decimal.Decimal("1.5"), fractions.Fraction(1, 3)],
    [datetime.datetime(2020, 1, 2, 3, 4, 5), datetime.timedelta(3), {1, 2}, frozenset({3}), bytearray(b"ab")],
    [collections.OrderedDict] * 3 + [collections.Counter, np.ndarray, np.float64(2.0)] * 2,
]


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
@pytest.mark.parametrize("number", range(len(OBJECTS)))
def test_the_names_are_those_the_unpickler_imports(protocol, number):
    data = pickle.dumps(OBJECTS[number], protocol)
    assert scan_globals([data]) == _found_by_the_unpickler(data)


@pytest.mark.parametrize("size", [1, 2, 3, 7, 64])
def test_the_pieces_may_cut_the_stream_anywhere(size):
    data = pickle.dumps(OBJECTS[2] + ["z" * 300], 5)
    pieces = [data[i : i + size] for i in range(0, len(data), size)]
    assert scan_globals(pieces) == scan_globals([data])


def _stack_global(module: bytes, name: bytes) -> bytes:
    return b"\x8c" + bytes([len(module)]) + module + b"\x8c" + bytes([len(name)]) + name + b"\x93"


STACK = {
    # what the unpickler's stack holds under STACK_GLOBAL, whatever was pushed last
    "POP of a value": (b"\x80\x05\x8c\x02os\x8c\x06system\x8c\x01x0\x93.", "os.system"),
    "POP_MARK": (b"\x80\x05\x8c\x02os(\x8c\x01a\x8c\x01b1\x8c\x06system\x93.", "os.system"),
    "POP of a mark": (b"\x80\x05\x8c\x02os\x8c\x06system(0\x93.", "os.system"),
    "DUP": (b"\x80\x05\x8c\x03abc2\x93.", "abc.abc"),
    "MEMOIZE and BINGET": (b"\x80\x05\x8c\x02os\x94\x8c\x06system\x94\x93h\x00h\x01\x93.", "os.system"),
    "PUT out of order, then MEMOIZE": (b"\x80\x05\x8c\x02osq\x05\x8c\x03sys\x94h\x01h\x05\x93.", "sys.os"),
    "a mark between the operands": (b"\x80\x05\x8c\x02os(\x8c\x06system\x93.", COMPUTED),
    "bytes operands": (b"\x80\x05C\x02osC\x06system\x93.", COMPUTED),
    "a computed operand": (b"\x80\x05\x8c\x02os\x8c\x02os\x85R\x93.", COMPUTED),
    "a name longer than MAX_NAME": (
        b"\x80\x05X" + (2000).to_bytes(4, "little") + b"m" * 2000 + b"\x8c\x01x\x93.",
        COMPUTED,
    ),
}


@pytest.mark.parametrize(("pickled", "name"), STACK.values(), ids=STACK.keys())
def test_stack_global_reads_the_operands_the_unpickler_would(pickled, name):
    assert scan_globals([pickled]) == (name,)


def test_a_stack_deeper_than_the_model_is_forgotten_from_the_bottom():
    deep = b"\x80\x05" + b"(" * (3 * scan.MAX_STACK) + _stack_global(b"os", b"system") + b"."
    assert scan_globals([deep]) == ("os.system",)
    below = b"\x80\x05\x8c\x02os" + b"N" * (2 * scan.MAX_STACK) + b"0" * (2 * scan.MAX_STACK) + b"\x8c\x01x\x93."
    assert scan_globals([below]) == (COMPUTED,)  # "os" was forgotten: not guessed


def test_the_memo_keeps_strings_up_to_its_budget_then_reads_unknown(monkeypatch):
    monkeypatch.setattr(scan, "MAX_MEMO_BYTES", 2 * (scan._ENTRY_COST + 8))
    pickled = b"\x80\x05\x8c\x02os\x94\x8c\x06system\x94\x8c\x04path\x94" + b"h\x00h\x01\x93" + b"h\x00h\x02\x93."
    assert scan_globals([pickled]) == ("os.system", COMPUTED)


def test_a_memoize_at_an_index_no_longer_known_forgets_the_memo(monkeypatch):
    monkeypatch.setattr(scan, "MAX_MEMO_INDICES", 2)
    puts = b"".join(b"N" + b"r" + (1000 + i).to_bytes(4, "little") for i in range(3))
    pickled = b"\x80\x05\x8c\x02os\x94" + puts + b"\x8c\x01x\x94" + b"h\x00h\x00\x93."
    assert scan_globals([pickled]) == (COMPUTED,)  # the MEMOIZE may have replaced "os"


def test_names_over_the_budget_are_a_limit_error(monkeypatch):
    monkeypatch.setattr(scan, "MAX_GLOBALS_BYTES", 10 * scan._ENTRY_COST)
    pickled = b"\x80\x05" + b"".join(_stack_global(b"m", str(i).encode()) + b"0" for i in range(20)) + b"N."
    with pytest.raises(blpickle.LimitError, match="globals of over"):
        scan_globals([pickled])


def test_the_state_stays_bounded_on_a_hostile_pickle():
    """Many distinct memoized strings, memo indices far apart, a deep stack of marks, and
    long data: what is kept stays within the limits."""
    strings = b"".join(b"\x8c\x08" + f"{i:08x}".encode() + b"\x94" for i in range(60_000))
    puts = b"".join(b"Nr" + (i * 7919).to_bytes(4, "little") for i in range(60_000))
    data = b"\x80\x05" + strings + puts + b"(" * 200_000 + b"B" + (8 << 20).to_bytes(4, "little")
    pickled = data + bytes(8 << 20) + _stack_global(b"os", b"getpid") + b"."
    pieces = [pickled[i : i + (1 << 20)] for i in range(0, len(pickled), 1 << 20)]
    found = []
    peak = peak_allocated(lambda: found.append(scan_globals(iter(pieces))))
    assert found == [("os.getpid",)]
    assert peak < scan.MAX_MEMO_BYTES + 16 * scan.MAX_STACK + (8 << 20)


@pytest.mark.parametrize(
    ("pickled", "error"),
    [
        (b"\x80\x05N", "without a STOP"),
        (b"\x80\x05\xff.", "unknown opcode 0xff at offset 2"),
        (b"\x80\x05T\xff\xff\xff\xff.", "declares -1 bytes"),
        (b"\x80\x05X\x02\x00\x00\x00\xff\xfe.", "BINUNICODE"),
        (b"\x80\x02cos\nsystem", "inside a line"),
        (b"\x80\x02Ixyz\n.", "INT"),
    ],
)
def test_a_malformed_pickle_is_corrupt(pickled, error):
    with pytest.raises(blpickle.CorruptError, match=error):
        scan_globals([pickled])


def test_extension_codes_are_named_from_copyreg_registry():
    """EXT opcodes name what `copyreg.add_extension` registered (read through
    `scan.extension_name`, the one place that touches copyreg's private registry: this fails
    loudly if CPython renames it), and a code nobody registered by its number."""
    import copyreg

    copyreg.add_extension("fractions", "Fraction", 0xBEEF)
    try:
        data = pickle.dumps(fractions.Fraction, protocol=2)
        assert b"\x83" in data  # EXT2
        assert scan.extension_name(0xBEEF) == "fractions.Fraction"
        assert scan_globals(iter([memoryview(data)])) == ("fractions.Fraction",)
    finally:
        copyreg.remove_extension("fractions", "Fraction", 0xBEEF)
    assert scan.extension_name(0xBEEF) == f"<extension>.{0xBEEF}"
