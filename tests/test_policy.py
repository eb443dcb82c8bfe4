"""The restricted-loading model: data, not functions. A package pattern admits classes
(created, never called with arguments) and constants; functions run only when named
exactly or vetted (tests/test_registry.py); some never run; every refusal is listed."""

from __future__ import annotations

import collections
import os
import pickle
import struct
import sys

import numpy as np
import pytest
from records import with_pickle_stream

import blpickle
from blpickle.restricted import machine as restricted_machine
from blpickle.restricted.machine import OBJECTS_SLACK

CALLS: list[str] = []


def record_call(tag: str) -> str:
    """A function with a visible side effect."""
    CALLS.append(tag)
    return tag


class Plain:
    """A class whose constructor has a visible side effect."""

    def __init__(self, tag: str = "init") -> None:
        CALLS.append(tag)
        self.tag = tag


class Called:
    """Pickles as a call of its class with an argument."""

    def __init__(self, tag: str) -> None:
        CALLS.append(tag)

    def __reduce__(self):
        return Called, ("constructor ran",)


@pytest.fixture(autouse=True)
def _clear_calls():
    CALLS.clear()


COMMAND = b"cposix\nsystem\n(S'touch blpickle-pwned'\ntR."


@pytest.mark.parametrize("allowed", [[], (), set()])
def test_an_empty_allowlist_is_the_strictest_mode_not_no_restriction(allowed, tmp_path):
    with pytest.raises(blpickle.UnsafeLoadError, match=r"posix\.system"):
        blpickle.loads(COMMAND, allowed=allowed)
    path = tmp_path / "command.pkl"
    path.write_bytes(COMMAND)
    with pytest.raises(blpickle.UnsafeLoadError):
        blpickle.load(path, allowed=allowed)
    record = tmp_path / "record.blp"
    blpickle.dump(Called("x"), record)
    with pytest.raises(blpickle.UnsafeLoadError, match="Called"), blpickle.open(record) as opened:
        opened.load(allowed=allowed)
    assert not os.path.exists("blpickle-pwned")
    assert CALLS == ["x"]  # the dump's own construction only


def _stack_global_call(module: str, name: str, *args: bytes) -> bytes:
    """A protocol 4 pickle calling ``module.name`` with short str arguments."""
    strings = b"".join(b"\x8c" + bytes([len(s)]) + s.encode() for s in (module, name))
    arguments = b"(" + b"".join(b"\x8c" + bytes([len(a)]) + a for a in args) + b"t"
    return b"\x80\x04" + strings + b"\x93" + arguments + b"R."


#: Functions under the documented patterns that run code or touch files (issue 27): a
#: pattern never admits a function.
GADGETS = [
    ("numpy", "savetxt", "numpy.*"),
    ("numpy", "load", "numpy.*"),
    ("pandas", "eval", "pandas.*"),
    ("pandas", "read_pickle", "pandas.*"),
    ("sklearn.utils._testing", "assert_run_python_script_without_output", "sklearn.*"),
    ("numpy", "add", "numpy.*"),  # a ufunc: harmless, but a function all the same
]


@pytest.mark.parametrize(("module", "name", "package"), GADGETS)
def test_a_package_pattern_never_admits_a_function(module, name, package):
    pytest.importorskip(module)
    with pytest.raises(blpickle.UnsafeLoadError, match=r"not functions|even when named") as info:
        blpickle.loads(_stack_global_call(module, name, b"x"), allowed=[package])
    assert f"{module}.{name}" in info.value.refused


#: Functions known to run code or touch files: refused even when named exactly.
DENIED = [
    ("numpy", "load"),
    ("numpy", "savetxt"),
    ("numpy", "memmap"),
    ("pandas", "eval"),
    ("pandas", "read_pickle"),
    ("sklearn.utils._testing", "assert_run_python_script_without_output"),
    ("torch.storage", "_load_from_bytes"),
    ("torch", "load"),
    ("builtins", "eval"),
    ("os", "system"),
    ("subprocess", "Popen"),
    ("importlib", "import_module"),
    ("functools", "partial"),
]


@pytest.mark.parametrize(("module", "name"), DENIED)
def test_functions_that_run_code_are_refused_even_when_named_exactly(module, name):
    path = f"{module}.{name}"
    with pytest.raises(blpickle.UnsafeLoadError, match="even when named exactly") as info:
        blpickle.loads(_stack_global_call(module, name, b"x"), allowed=[path])
    assert "allowed=[" not in str(info.value)  # no advice to allow it
    if module == "torch.storage":  # refused by its name, before anything imports torch
        assert "torch" not in sys.modules or path in info.value.refused


def test_a_pattern_creates_classes_without_calling_them_with_arguments():
    plain = pickle.dumps(Plain("dump"), 4)  # NEWOBJ and BUILD: no constructor runs on load
    CALLS.clear()
    loaded = blpickle.loads(plain, allowed=["test_policy.*"])
    assert (type(loaded), loaded.tag, CALLS) == (Plain, "dump", [])
    called = pickle.dumps(Called("dump"))
    CALLS.clear()
    with pytest.raises(blpickle.UnsafeLoadError, match="calls it with arguments"):
        blpickle.loads(called, allowed=["test_policy.*"])
    assert CALLS == []
    # the exact name trusts the constructor
    assert type(blpickle.loads(called, allowed=["test_policy.Called"])) is Called
    assert CALLS == ["constructor ran"]


def test_exact_names_run_from_a_frame_that_exposes_nothing():
    def caller_globals():
        return sorted(sys._getframe(1).f_globals)

    module = sys.modules[__name__]
    module.caller_globals = caller_globals  # importable as test_policy.caller_globals
    caller_globals.__qualname__ = "caller_globals"
    try:
        found = blpickle.loads(_stack_global_call("test_policy", "caller_globals"), allowed=[caller_globals])
    finally:
        del module.caller_globals
    assert found == ["__builtins__"]


def test_a_refusal_lists_every_global_the_policy_refuses_and_runs_nothing_after_it():
    obj = [Plain("a"), record_call, collections.Counter("ab"), Called("b")]
    data = blpickle.dumps(obj)
    CALLS.clear()
    with pytest.raises(blpickle.UnsafeLoadError) as info:
        blpickle.loads(data, safe=True)
    assert set(info.value.refused) == {"test_policy.Plain", "test_policy.record_call", "test_policy.Called"}
    assert "test_policy.record_call" in str(info.value) and "test_policy.Called" in str(info.value)
    assert CALLS == []
    assert blpickle.untrusted_globals(data) == info.value.refused
    assert set(blpickle.untrusted_globals(data, allowed=["test_policy.*"])) == {"test_policy.record_call"}
    assert blpickle.untrusted_globals(pickle.dumps(obj), allowed=["test_policy.*", record_call]) == {}


def test_untrusted_globals_reads_paths_and_signed_records(tmp_path):
    key = b"k" * 32
    path = tmp_path / "signed.blp"
    blpickle.dump({"f": record_call}, path, key=key)
    assert set(blpickle.untrusted_globals(path, key=key)) == {"test_policy.record_call"}
    with pytest.raises(blpickle.SignatureError):
        blpickle.untrusted_globals(path, key=b"x" * 32)


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_numpy_types_ml_dtypes_and_standard_containers_load_with_safe_alone(protocol):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    import datetime
    import decimal
    import fractions
    import uuid

    obj = {
        "types": [np.float64, np.dtype("f8").type, np.int8],
        "bf16": np.arange(6, dtype=ml_dtypes.bfloat16).reshape(2, 3),
        "f8": np.ones(4, dtype=ml_dtypes.float8_e4m3fn),
        "dtype": np.dtype(ml_dtypes.bfloat16),
        "ordered": collections.OrderedDict(a=1, b=[2]),
        "default": collections.defaultdict(list, a=[1]),
        "nested": collections.defaultdict(collections.OrderedDict),
        "counter": collections.Counter("abca"),
        "deque": collections.deque([1, 2], maxlen=5),
        "when": datetime.datetime(2026, 1, 2, 3, tzinfo=datetime.timezone(datetime.timedelta(hours=1), "X")),
        "day": datetime.date(2026, 1, 2),
        "decimal": decimal.Decimal("1.25"),
        "fraction": fractions.Fraction(1, 3),
        "uuid": uuid.UUID(int=7),
        "generator": np.random.default_rng(3),
        "legacy": np.random.RandomState(4),
    }
    for data in (blpickle.dumps(obj, protocol), pickle.dumps(obj, protocol)):
        loaded = blpickle.loads(data, safe=True)
        assert loaded["types"] == obj["types"]
        assert loaded["bf16"].dtype == obj["bf16"].dtype
        np.testing.assert_array_equal(loaded["bf16"].astype(float), obj["bf16"].astype(float))
        assert loaded["dtype"] == obj["dtype"]
        for key in ("ordered", "counter", "deque", "when", "day", "decimal", "fraction", "uuid"):
            assert loaded[key] == obj[key] and type(loaded[key]) is type(obj[key]), key
        assert loaded["default"]["missing"] == [] and type(loaded["nested"]["x"]) is collections.OrderedDict
        assert loaded["generator"].random() == np.random.default_rng(3).random()
        assert loaded["legacy"].rand() == np.random.RandomState(4).rand()


def test_a_defaultdict_makes_values_only_with_builtin_types():
    data = pickle.dumps(collections.defaultdict(Plain), 2)
    with pytest.raises(blpickle.LoadError, match="defaultdict"):
        blpickle.loads(data, allowed=["test_policy.*"])
    assert CALLS == []


def _framed(body: bytes) -> bytes:
    return b"\x80\x04\x95" + struct.pack("<Q", len(body)) + body


def test_a_decompression_bomb_of_containers_is_refused_within_its_budget():
    # 4 MiB of EMPTY_LIST + MEMOIZE in one frame, stored in a few hundred bytes: two million objects
    forged = with_pickle_stream(blpickle.dumps([np.ones(100_000, "u1")]), _framed(b"]\x94" * (2 << 20) + b"."))
    assert len(forged) < 4096
    with pytest.raises(blpickle.LimitError, match="objects from"):
        blpickle.loads(forged, safe=True)
    # the same objects from a stream stored as it is (no expansion) are paid for by its bytes
    assert len(blpickle.loads(b"\x80\x04]" + b"]\x94a" * (OBJECTS_SLACK + 10) + b".", safe=True)) == OBJECTS_SLACK + 10


def test_a_decompression_bomb_of_opcodes_is_refused_within_its_budget(monkeypatch):
    monkeypatch.setattr(restricted_machine, "OPCODES_SLACK", 1 << 12)
    monkeypatch.setattr(restricted_machine, "OPCODES_PER_BYTE", 64)
    record = blpickle.dumps([np.ones(100_000, "u1")])
    # opcodes that make nothing (NONE, POP), in a frame
    with pytest.raises(blpickle.LimitError, match="opcodes from"):
        blpickle.loads(with_pickle_stream(record, _framed(b"N0" * (1 << 17) + b"N.")), safe=True)
    # and outside frames, each read checked against the layout
    with pytest.raises(blpickle.LimitError, match="outside its frames"):
        blpickle.loads(with_pickle_stream(record, b"\x80\x04" + b"N0" * (1 << 17) + b"N."), safe=True)
    # a plain pickle of the same opcodes costs its own bytes: no budget
    assert blpickle.loads(b"\x80\x04" + b"N0" * (1 << 17) + b"N.", safe=True) is None
