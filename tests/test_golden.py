"""Golden files: records written by released format versions load forever."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
from conftest import assert_same_array
from golden.objects import (
    GOLDEN_FILES,
    cupy_golden_arrays,
    golden_object,
    inband_golden_object,
    small_golden_object,
    tensors_golden_object,
    views_golden_object,
)

import blpickle

GOLDEN_DIR = os.path.join(os.path.dirname(__file__), "golden")


def _assert_same(expected: object, actual: object) -> None:
    if isinstance(expected, np.ndarray) and expected.dtype != object:
        assert_same_array(expected, actual)
    elif isinstance(expected, np.ndarray):
        assert actual.dtype == object and len(actual) == len(expected)
        for e, a in zip(expected, actual, strict=True):
            _assert_same(e, a)
    elif isinstance(expected, dict):
        assert actual.keys() == expected.keys()
        for key in expected:
            _assert_same(expected[key], actual[key])
    elif isinstance(expected, (list, tuple)):
        assert type(actual) is type(expected) and len(actual) == len(expected)
        for e, a in zip(expected, actual, strict=True):
            _assert_same(e, a)
    else:
        assert actual == expected and type(actual) is type(expected)


@pytest.mark.parametrize("name", sorted(GOLDEN_FILES))
def test_golden_file_loads_the_golden_object(name):
    path = os.path.join(GOLDEN_DIR, name)
    arguments = GOLDEN_FILES[name]
    if arguments.get("tensors"):
        _assert_tensors(path)
        return
    if arguments.get("cupy"):
        _assert_cupy(path)
        return
    if arguments.get("inband"):
        _assert_inband(path)
        return
    loaded = blpickle.load(path, key=arguments.get("key"))
    if arguments.get("small"):
        _assert_same(small_golden_object(), loaded)
        assert loaded["nested"]["shared"] is loaded["ramp"]
        return
    if arguments.get("views"):
        _assert_views(views_golden_object(), loaded)
        return
    expected = golden_object(blob=arguments.get("blob", False))
    if arguments.get("protocol", 5) < 5:  # numpy pickles in band: native byte order
        expected["big_endian"] = expected["big_endian"].astype("=i4")
        expected["strided"] = np.ascontiguousarray(expected["strided"])
    _assert_same(expected, loaded)
    assert loaded["nested"]["shared"] is loaded["ramp"]


def _assert_tensors(path: str) -> None:
    """The tensors golden object: every tensor bit for bit, one storage for the weights and
    their views, the parameter a parameter, loaded safely; a tensor read by its name."""
    torch = pytest.importorskip("torch")
    expected = tensors_golden_object()
    loaded = blpickle.load(path, safe=True)
    pairs = [*zip(expected["model"].values(), loaded["model"].values(), strict=True)]
    pairs += [(expected[key], loaded[key]) for key in ("rows", "flat", "parameter")]
    for want, got in pairs:
        assert type(got) is type(want) and got.dtype == want.dtype and got.stride() == want.stride()
        assert torch.equal(got.detach().reshape(-1).view(torch.uint8), want.detach().reshape(-1).view(torch.uint8))
    weights = loaded["model"]["layers.0.weight"].untyped_storage().data_ptr()
    assert loaded["rows"].untyped_storage().data_ptr() == weights == loaded["flat"].untyped_storage().data_ptr()
    with blpickle.open(path) as rec:
        assert torch.equal(rec["model.layers.1.weight"], expected["model"]["layers.1.weight"])


def _assert_cupy(path: str) -> None:
    """The cupy golden object, read without cupy: numpy arrays on the host, loaded safely too,
    and each one read by its name."""
    expected = cupy_golden_arrays()
    expected["columns"] = expected["weights"][:, ::3]
    for loaded in (blpickle.load(path), blpickle.load(path, safe=True)):
        _assert_same(expected, loaded)
    with blpickle.open(path) as rec:
        assert rec.names == ("weights", "ids", "columns")  # the mask is under 64 KiB
        assert [a.tensor for a in rec.arrays] == ["cupy.float32", "cupy.int64", "cupy.float32"]
        _assert_same(expected["weights"], rec["weights"])


def _assert_inband(path: str) -> None:
    """The 1.4 in-band golden object, loaded and loaded safely: small arrays as pickle gives
    them back (read-only kept, a row of another a copy), the small view of an array out of
    band a view of it."""
    expected = inband_golden_object()
    info = blpickle.inspect(path)
    assert [b.nbytes for b in info.buffers] == [expected["ramp"].nbytes]
    assert "numpy._core.numeric._frombuffer" in info.globals
    frozen = expected.pop("frozen")
    for loaded in (blpickle.load(path), blpickle.load(path, safe=True)):
        assert not loaded["frozen"].flags.writeable and loaded.pop("frozen").tobytes() == frozen.tobytes()
        _assert_same(expected, loaded)
        assert loaded["shared"] is loaded["grid"] and loaded["fortran"].flags.f_contiguous
        assert not np.shares_memory(loaded["row"], loaded["grid"])
        assert np.shares_memory(loaded["slice"], loaded["ramp"])


def _assert_views(expected: dict, loaded: dict) -> None:
    """The views golden object: its arrays, and its views sharing their memory."""
    _assert_same(expected["ramp"], loaded["ramp"])
    _assert_same(expected["model"]["grid"], loaded["model"]["grid"])
    for view, actual in zip(expected["views"], loaded["views"], strict=True):
        assert actual.dtype == view.dtype and actual.strides == view.strides
        np.testing.assert_array_equal(actual, view)
        assert np.shares_memory(actual, loaded["ramp"]) or np.shares_memory(actual, loaded["model"]["grid"])


def test_the_full_1_1_golden_file_names_its_arrays_and_their_order():
    path = os.path.join(GOLDEN_DIR, "v1.1-full-views.blp")
    with blpickle.open(path) as rec:
        assert rec.names == ("ramp", "model.grid")
        assert [a.order for a in rec.arrays] == ["C", "F"]
        _assert_same(views_golden_object()["model"]["grid"], rec["model.grid"])
        assert "blpickle.arrays.rebuild_view" in rec.info.globals
    _assert_views(views_golden_object(), blpickle.load(path, safe=True))


def test_every_golden_file_is_committed_and_of_its_version():
    for name, arguments in GOLDEN_FILES.items():
        info = blpickle.inspect(os.path.join(GOLDEN_DIR, name), key=arguments.get("key"))
        assert name.startswith(f"v{info.version}-")
        assert info.signed == ("key" in arguments)
        assert any(b.splice is not None for b in info.buffers) == arguments.get("blob", False)
        assert (not info.buffers and not info.options) == bool(arguments.get("small"))


def test_a_tensor_read_by_name_without_its_library_says_how_to_read_its_bytes(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch raises ImportError
    with blpickle.open(os.path.join(GOLDEN_DIR, "v1.2-tensors.blp")) as rec:
        with pytest.raises(ImportError) as caught:
            rec["model.layers.1.weight"]
        assert "Record.read_bytes" in "".join(getattr(caught.value, "__notes__", []))
