"""Restricted loading (safe=True, allowed=...), signing and the known bypasses."""

from __future__ import annotations

import copyreg
import importlib
import io
import os
import pickle

import numpy as np
import pytest
import records
from conftest import assert_same_array

import blpickle
from blpickle import cli
from blpickle.arrays import rebuild_ndarray

CALLS: list[str] = []


def record_call(tag: str) -> str:
    """A reconstructor with a visible side effect."""
    CALLS.append(tag)
    return tag


class SideEffect:
    def __reduce__(self):
        return record_call, ("ran",)


@pytest.fixture(autouse=True)
def _clear_calls():
    CALLS.clear()


SAFE_OBJECT = {
    "array": np.arange(12.0).reshape(3, 4).T,
    "strided": np.arange(100)[::-7],
    "structured": np.zeros(3, dtype=[("a", "<i4"), ("b", ">f8")]),
    "datetimes": np.arange(3).astype("M8[D]"),
    "scalars": (np.float32(1.5), np.int64(-3), np.bool_(True), np.str_("s"), np.datetime64("2026-01-01")),
    "dtypes": [np.dtype("U3"), np.dtype([("x", "f4", (2,))])],
    "containers": ({1, 2}, frozenset({3}), bytearray(b"ab"), b"cd", 1 + 2j, slice(1, 9, 2), range(4), [None, True]),
    "objects": np.array([1, "two", np.arange(3)], dtype=object),
}


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_safe_load_builds_builtins_and_numpy(protocol):
    data = blpickle.dumps(SAFE_OBJECT, protocol)
    loaded = blpickle.loads(data, safe=True)
    assert loaded["containers"] == SAFE_OBJECT["containers"]
    assert loaded["scalars"] == SAFE_OBJECT["scalars"]
    np.testing.assert_array_equal(loaded["array"], SAFE_OBJECT["array"])
    np.testing.assert_array_equal(loaded["objects"][2], np.arange(3))
    # the same data as plain pickle, read by blpickle
    assert blpickle.loads(pickle.dumps(SAFE_OBJECT, protocol), safe=True)["dtypes"] == SAFE_OBJECT["dtypes"]


def _stack_global(module: str, name: str) -> bytes:
    """A protocol 4 pickle of just ``module.name``, imported with STACK_GLOBAL."""
    strings = b"".join(b"\x8c" + bytes([len(s)]) + s.encode() for s in (module, name))
    return b"\x80\x04" + strings + b"\x93."


#: Hand-made pickles that would run code: each must be refused before anything runs.
ATTACKS = {
    "GLOBAL os.system": b"cos\nsystem\n(S'echo pwned'\ntR.",
    "INST os.system": b"(S'echo pwned'\nios\nsystem\n.",
    "STACK_GLOBAL builtins.eval": _stack_global("builtins", "eval")[:-1] + b"\x8c\x031+1\x85R.",
    "python 2 name for eval": b"c__builtin__\neval\n(S'1+1'\ntR.",
    "getattr": b"cbuiltins\ngetattr\n(cbuiltins\nset\nS'__init__'\ntR.",
    "dunder traversal from an allowed class": _stack_global("numpy", "ndarray.__class__.__subclasses__"),
    "dunder traversal from builtins": _stack_global("builtins", "set.__init__.__globals__"),
    "functools.partial": b"cfunctools\npartial\n(cos\nsystem\nS'echo pwned'\ntR.",
    "operator.attrgetter": b"coperator\nattrgetter\n(S'system'\ntR.",
    "copyreg._reconstructor": b"ccopyreg\n_reconstructor\n(ctest_safe\nSideEffect\ncbuiltins\nobject\nNtR.",
    "side effect in this module": b"ctest_safe\nrecord_call\n(S'ran'\ntR.",
}


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_known_attacks_are_refused_before_running(name):
    with pytest.raises(blpickle.UnsafeLoadError) as info:
        blpickle.loads(ATTACKS[name], safe=True)
    assert "refused to import" in str(info.value)
    assert isinstance(info.value, pickle.UnpicklingError)
    assert CALLS == []


def test_dunder_traversal_is_refused_even_inside_an_allowed_package():
    with pytest.raises(blpickle.UnsafeLoadError, match="dunder"):
        blpickle.loads(ATTACKS["dunder traversal from an allowed class"], allowed=["numpy.*"])


def test_globals_hidden_in_object_arrays_and_nested_containers_are_refused():
    inner = np.empty(2, dtype=object)
    inner[:] = [1, SideEffect()]
    outer = np.array([None, {"deep": [inner]}], dtype=object)
    for obj in (inner, outer, {"x": [(SideEffect(),)]}):
        with pytest.raises(blpickle.UnsafeLoadError, match="record_call"):
            blpickle.loads(blpickle.dumps(obj), safe=True)
    assert CALLS == []


def test_extension_codes_go_through_the_policy():
    copyreg.add_extension("test_safe", "record_call", 0xBEEF)
    try:
        data = blpickle.dumps(SideEffect(), 2)
    finally:
        copyreg.remove_extension("test_safe", "record_call", 0xBEEF)
    copyreg.add_extension("test_safe", "record_call", 0xBEEF)
    try:
        with pytest.raises(blpickle.UnsafeLoadError):
            blpickle.loads(data, safe=True)
    finally:
        copyreg.remove_extension("test_safe", "record_call", 0xBEEF)
    assert CALLS == []


def test_cloudpickled_functions_need_to_be_allowed():
    data = blpickle.dumps(lambda x: x + 1, pickler="cloudpickle")
    with pytest.raises(blpickle.UnsafeLoadError, match="cloudpickle"):
        blpickle.loads(data, safe=True)


def test_allowed_by_path_by_type_and_by_package():
    linear = pytest.importorskip("sklearn.linear_model")
    model = linear.LinearRegression().fit(np.arange(10.0).reshape(5, 2), np.arange(5.0))
    data = blpickle.dumps(model)
    with pytest.raises(blpickle.UnsafeLoadError, match="LinearRegression"):
        blpickle.loads(data, safe=True)
    for allowed in (["sklearn.linear_model._base.LinearRegression"], [linear.LinearRegression], ["sklearn.*"]):
        loaded = blpickle.loads(data, allowed=allowed)
        np.testing.assert_array_equal(loaded.coef_, model.coef_)
    assert blpickle.loads(blpickle.dumps(SideEffect()), allowed=[record_call]) == "ran"
    with pytest.raises(TypeError):
        blpickle.loads(data, allowed=[42])


def test_declared_array_sizes_must_match_their_buffers():
    with pytest.raises(blpickle.CorruptError, match="needs 40 bytes"):
        rebuild_ndarray(bytearray(10), np.dtype("f8"), (5,), "C")
    with pytest.raises(blpickle.CorruptError):
        rebuild_ndarray(bytearray(8), np.dtype(object), (1,), "C")
    for shape in [(-1,), (-2,), (2, -1), [1], ("a",)]:  # numpy's reshape takes the first three
        with pytest.raises(blpickle.CorruptError, match="cannot rebuild"):
            rebuild_ndarray(bytearray(16), np.dtype("f8"), shape, "C")
    with pytest.raises(blpickle.CorruptError, match="must be bytes-like, not object"):
        rebuild_ndarray(object(), np.dtype("f8"), (1,), "C")
    with pytest.raises(blpickle.CorruptError):
        rebuild_ndarray(bytearray(8), np.dtype("f8"), (1,), "K")
    assert rebuild_ndarray(bytearray(16), np.dtype("f8"), (1, 2), "F").flags.f_contiguous
    crafted = pickle.dumps(Crafted(), protocol=5)
    with pytest.raises(blpickle.CorruptError, match="needs"):
        blpickle.loads(crafted, safe=True)


class Crafted:
    """Pickles as rebuild_ndarray with a shape larger than its buffer."""

    def __reduce__(self):
        return rebuild_ndarray, (bytearray(16), np.dtype("f8"), (1000, 1000), "C")


def test_signed_records_round_trip_and_check_the_key(tmp_path):
    key = os.urandom(32)
    obj = {"a": np.arange(100_000), "b": np.random.default_rng(0).random(1000)}
    for options in ({}, {"codec": None}, {"chunk_size": 4096}):
        data = blpickle.dumps(obj, key=key, **options)
        assert blpickle.inspect(data).signed
        assert_same_array(obj["a"], blpickle.loads(data, key=key)["a"])
        assert_same_array(obj["a"], blpickle.loads(data)["a"])  # a signature does not stop keyless loads
        with pytest.raises(blpickle.SignatureError, match="does not match"):
            blpickle.loads(data, key=b"another key")
    path = tmp_path / "signed.blp"
    blpickle.dump(obj, path, key=key, codec=None)
    loaded = blpickle.load(path, key=key, mmap_mode="r")
    np.testing.assert_array_equal(loaded["a"], obj["a"])
    with pytest.raises(blpickle.SignatureError):
        blpickle.load(path, key=b"wrong", mmap_mode="r")


def test_unsigned_and_plain_pickle_data_are_refused_with_a_key():
    with pytest.raises(blpickle.SignatureError, match="not signed"):
        blpickle.loads(blpickle.dumps(1), key=b"k")
    with pytest.raises(blpickle.SignatureError, match="not a blpickle record"):
        blpickle.loads(pickle.dumps(1), key=b"k")
    for bad in ("text", b""):
        with pytest.raises(blpickle.OptionsError, match="key"):
            blpickle.dumps(1, key=bad)


def test_tampering_that_fixes_the_checksums_is_caught_by_the_signature():
    key = b"secret"
    obj = [SideEffect(), np.random.default_rng(0).random(50_000)]
    parts = records.split(blpickle.dumps(obj, key=key, codec="lz4", clevel=0))
    chunk = bytearray(parts.payloads[1])
    chunk[-1] ^= 0x01  # the last byte of the array's data
    parts.payloads[1] = bytes(chunk)
    forged = records.join(parts)
    assert blpickle.loads(forged)[1].shape == (50_000,)  # every checksum passes: only the signature can tell
    CALLS.clear()
    with pytest.raises(blpickle.SignatureError):
        blpickle.loads(forged, key=key)
    assert CALLS == []  # checked before anything was unpickled
    del parts.trailer["signature"]
    with pytest.raises(blpickle.SignatureError):
        blpickle.loads(records.join(parts), key=key)


def test_unpickler_class_takes_the_same_restrictions():
    with pytest.raises(blpickle.UnsafeLoadError):
        blpickle.Unpickler(io.BytesIO(blpickle.dumps(SideEffect())), safe=True).load()
    assert (
        blpickle.Unpickler(io.BytesIO(blpickle.dumps(SideEffect())), allowed=["test_safe.record_call"]).load() == "ran"
    )


#: Names inside an allowed package that reach, through attributes, what lies outside it.
ESCAPES = [
    ("numpy", "testing._private.utils.os.system", "numpy.*"),
    ("numpy", "testing._private.utils.os", "numpy.*"),  # a module itself
    ("numpy.testing._private.utils", "os.system", "numpy.*"),
    ("numpy", "lib._npyio_impl.functools.partial", "numpy.*"),  # a module of another package
    ("numpy.testing._private.utils", "wraps", "numpy.*"),  # a function it imported from functools
    ("numpy", "testing", "numpy.*"),  # modules are never allowed, even inside the package
    ("joblib", "numpy_pickle.os.system", "joblib.*"),
    ("joblib.numpy_pickle", "os.system", "joblib.*"),
]


@pytest.mark.parametrize(("module", "name", "package"), ESCAPES)
def test_names_are_judged_by_the_object_they_resolve_to(module, name, package, tmp_path, capsys):
    pytest.importorskip(package[:-2])
    data = _stack_global(module, name)
    with pytest.raises(blpickle.UnsafeLoadError, match=r"module|defined in|even when named"):
        blpickle.loads(data, allowed=[package])
    if package == "numpy.*":  # (the CLI reads pickles that name joblib as joblib files)
        path = tmp_path / "escape.pkl"
        path.write_bytes(data)
        assert cli.main(["convert", os.fspath(path), os.fspath(tmp_path / "out.blp"), "--allow", package]) == 1
        assert "UnsafeLoadError" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("module", "name", "package"),
    [
        ("numpy", "float64", "numpy.*"),  # defined in numpy, re-exported at its top
        ("numpy", "random.mtrand.RandomState", "numpy.*"),  # through modules of the package
        ("numpy.random", "Generator", "numpy.*"),  # defined in numpy.random._generator
        ("numpy", "inf", "numpy.*"),  # a constant
        ("pandas", "NA", "pandas.*"),  # a constant of a class defined in pandas._libs
        ("sklearn.linear_model", "LinearRegression", "sklearn.*"),
    ],
)
def test_names_defined_inside_an_allowed_package_pass(module, name, package):
    pytest.importorskip(package[:-2])
    found = blpickle.loads(_stack_global(module, name), allowed=[package])
    expected = importlib.import_module(module)
    for part in name.split("."):
        expected = getattr(expected, part)
    assert found is expected
