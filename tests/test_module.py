"""The blpickle module as a drop-in for the ``pickle`` module: its exported names, and code
written against ``pickle`` run with ``import blpickle as pickle``."""

from __future__ import annotations

import io
import pickle as stdlib_pickle

import numpy as np
import pytest

import blpickle

EXPORTED = [
    "DEFAULT_PROTOCOL",
    "HIGHEST_PROTOCOL",
    "PRESETS",
    "ArrayInfo",
    "BadMagicError",
    "BlpickleError",
    "BlpickleWarning",
    "BufferInfo",
    "ChecksumError",
    "CloudPickler",
    "CorruptError",
    "DumpError",
    "LazyArray",
    "LimitError",
    "LoadError",
    "Options",
    "OptionsError",
    "PickleBuffer",
    "PickleError",
    "Pickler",
    "PicklingError",
    "Record",
    "RecordInfo",
    "SignatureError",
    "TruncatedError",
    "Unpickler",
    "UnpicklingError",
    "UnsafeLoadError",
    "UnsupportedVersionError",
    "__version__",
    "dump",
    "dumps",
    "inspect",
    "load",
    "loads",
    "open",
    "untrusted_globals",
]

#: Module-level, so that pickle looks it up by name, and fails: ``<lambda>`` is no attribute.
UNPICKLABLE = lambda: None  # noqa: E731


def test_the_exported_names():
    assert blpickle.__all__ == EXPORTED
    for name in EXPORTED:
        assert hasattr(blpickle, name), name


@pytest.mark.parametrize(
    "name", ["PickleError", "PicklingError", "UnpicklingError", "PickleBuffer", "HIGHEST_PROTOCOL"]
)
def test_pickle_names_are_the_pickle_modules_own_objects(name):
    assert getattr(blpickle, name) is getattr(stdlib_pickle, name)


def test_errors_are_caught_by_the_pickle_modules_except_clauses():
    assert issubclass(blpickle.LoadError, blpickle.UnpicklingError)
    assert issubclass(blpickle.DumpError, blpickle.PicklingError)
    assert issubclass(blpickle.UnpicklingError, blpickle.PickleError)


def test_code_written_for_the_pickle_module_runs_with_blpickle(tmp_path):
    import blpickle as pickle

    state = {"weights": np.arange(100_000.0), "step": 3}
    path = tmp_path / "state.pkl"
    with open(path, "wb") as f:
        pickle.dump(state, f, protocol=pickle.HIGHEST_PROTOCOL)
    with open(path, "rb") as f:
        loaded = pickle.load(f)
    np.testing.assert_array_equal(loaded["weights"], state["weights"])
    assert pickle.loads(pickle.dumps(state["step"], pickle.DEFAULT_PROTOCOL)) == 3
    assert pickle.DEFAULT_PROTOCOL <= pickle.HIGHEST_PROTOCOL

    out = io.BytesIO()
    pickler = pickle.Pickler(out, pickle.HIGHEST_PROTOCOL)
    pickler.dump("first")
    pickler.dump(["second"])
    out.seek(0)
    unpickler = pickle.Unpickler(out)
    assert (unpickler.load(), unpickler.load()) == ("first", ["second"])

    buffers = []
    data = pickle.dumps(pickle.PickleBuffer(bytearray(b"abc")), protocol=5, buffer_callback=buffers.append)
    assert bytes(pickle.loads(data, buffers=buffers)) == b"abc"

    caught = []
    for damaged in (b"not a pickle", pickle.dumps(state)[:-9]):
        try:
            pickle.loads(damaged)
        except pickle.UnpicklingError as exc:
            caught.append(type(exc))
    try:
        pickle.dumps(UNPICKLABLE)
    except pickle.PicklingError as exc:
        caught.append(type(exc))
    assert caught == [stdlib_pickle.UnpicklingError, blpickle.TruncatedError, stdlib_pickle.PicklingError]
