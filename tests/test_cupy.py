"""cupy arrays through blpickle: stored as typed numpy arrays copied from the GPU, rebuilt as
numpy arrays on the host unless `map_location` names a CUDA device. The reducer and the
rebuild function are checked everywhere against a stand-in ``cupy`` module; a machine with
cupy and a CUDA device runs them on real arrays."""

from __future__ import annotations

import contextlib
import sys
import types

import numpy as np
import pytest

import blpickle
from blpickle.arrays import rebuild_view
from blpickle.errors import CorruptError
from blpickle.tensors import map_location, rebuild_cupy_array, stored_array


class _FakeArray:
    """What blpickle uses of a ``cupy.ndarray``: its dtype and ``get()``, a host copy."""

    def __init__(self, data: np.ndarray) -> None:
        self._data = data
        self.dtype = data.dtype

    def get(self) -> np.ndarray:
        return self._data.copy()


@pytest.fixture
def fake_cupy(monkeypatch):
    """A ``cupy`` module whose arrays are `_FakeArray` and whose device arrays record the
    device they were made on."""
    made: list[tuple[int | None, np.ndarray]] = []
    device: list[int | None] = [None]

    @contextlib.contextmanager
    def on_device(index=None):
        device.append(index)
        yield
        device.pop()

    module = types.ModuleType("cupy")
    module.ndarray = _FakeArray  # type: ignore[attr-defined]
    module.cuda = types.SimpleNamespace(Device=on_device)  # type: ignore[attr-defined]
    module.asarray = lambda data: made.append((device[-1], data)) or ("on the GPU", data)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "cupy", module)
    return made


def test_cupy_arrays_are_stored_typed_and_named_and_load_as_numpy_arrays(fake_cupy):
    weights = np.linspace(-1, 1, 300 * 300, dtype=np.float32).reshape(300, 300)
    obj = {"weights": _FakeArray(weights), "ids": _FakeArray(np.arange(20_000)), "mask": _FakeArray(np.ones(4, bool))}
    data = blpickle.dumps(obj)
    with blpickle.open(data) as rec:
        assert rec.names == ("weights", "ids")
        assert [(a.tensor, a.dtype.itemsize) for a in rec.arrays] == [("cupy.float32", 4), ("cupy.int64", 8)]
        np.testing.assert_array_equal(rec["weights"], weights)
    for loaded in (blpickle.loads(data), blpickle.loads(data, safe=True)):
        assert all(type(loaded[key]) is np.ndarray for key in obj)
        np.testing.assert_array_equal(loaded["weights"], weights)
        np.testing.assert_array_equal(loaded["mask"], np.ones(4, bool))
    assert fake_cupy == []  # nothing went to a GPU


def test_map_location_puts_cupy_arrays_on_the_cuda_device_it_names(fake_cupy, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # map_location reads device strings itself
    data = blpickle.dumps({"a": _FakeArray(np.arange(20_000, dtype=np.int32))})
    with map_location("cuda:1"):
        loaded = blpickle.loads(data)
    assert loaded["a"][0] == "on the GPU" and fake_cupy[0][0] == 1
    with map_location("cuda"), blpickle.open(data) as rec:
        assert rec["a"][0] == "on the GPU" and fake_cupy[1][0] is None  # cupy's current device
    with map_location("cpu"):
        assert type(blpickle.loads(data)["a"]) is np.ndarray
    with pytest.raises(ValueError, match="'cpu', 'cuda' or 'cuda:<n>'"), map_location("gpu"):
        pass


def test_cupy_arrays_of_other_dtypes_keep_cupys_own_reduction(fake_cupy):
    class Own(_FakeArray):
        def __reduce__(self):
            return (np.asarray, (self._data,))

    fake_cupy_module = sys.modules["cupy"]
    fake_cupy_module.ndarray = Own  # type: ignore[attr-defined]
    records = Own(np.zeros(3, dtype=[("x", "i4")]))
    assert "rebuild_cupy_array" not in str(blpickle.inspect(blpickle.dumps(records)).globals)


@pytest.mark.parametrize(
    "data",
    [
        np.zeros(3, dtype=object),
        np.zeros(3, dtype="U3"),
        np.zeros(3, dtype=[("x", "i4")]),
        np.zeros(3, dtype=np.longdouble),
        np.zeros(3, dtype=">f8"),
        np.zeros((4, 4))[:, ::2],
        b"bytes",
        [1, 2],
    ],
)
def test_rebuild_cupy_array_refuses_what_is_not_a_contiguous_array_of_numbers(data):
    with pytest.raises(CorruptError, match="cupy array"):
        rebuild_cupy_array(data)


class _Repeated:
    """Pickles as a view repeating one float 10**9 times (4 GB of elements in a few bytes)."""

    def __reduce__(self):
        return rebuild_view, (np.zeros(1, np.float32), 0, np.dtype(np.float32), (10**9,), (0,))


class _ForgedCupy:
    def __reduce__(self):
        return rebuild_cupy_array, (_Repeated(),)


def test_a_forged_record_cannot_make_a_gpu_copy_of_a_repeated_element(fake_cupy):
    data = blpickle.dumps(_ForgedCupy())
    with map_location("cuda"), pytest.raises(CorruptError, match="contiguous numpy array"):
        blpickle.loads(data)
    with map_location("cuda"), pytest.raises(blpickle.LimitError, match="overlap"):  # refused at the view
        blpickle.loads(data, safe=True)
    assert fake_cupy == []


def test_a_cupy_label_must_match_the_stored_dtype():
    with pytest.raises(CorruptError, match="cupy array of dtype 'float32'"):
        stored_array("cupy.float32", np.zeros(3, np.int64))
    assert stored_array("cupy.int64", np.arange(3)).dtype == np.int64


def _cuda_cupy():
    """cupy, when it is installed and sees a CUDA device; else None."""
    try:
        import cupy

        return cupy if cupy.cuda.runtime.getDeviceCount() > 0 else None
    except Exception:  # not installed, or no driver or device
        return None


@pytest.mark.skipif(_cuda_cupy() is None, reason="needs cupy and a CUDA device")
def test_real_cupy_arrays_load_on_the_host_unless_a_device_is_asked_for():
    cupy = _cuda_cupy()
    host = {
        "weights": np.random.default_rng(0).standard_normal((512, 512)).astype(np.float32),
        "ids": np.arange(100_000) % 11,
        "half": np.linspace(0, 1, 70_000, dtype=np.float16),
    }
    obj = {key: cupy.asarray(value) for key, value in host.items()}
    obj["view"] = obj["weights"][::2, 1:]
    data = blpickle.dumps(obj)
    for loaded in (blpickle.loads(data), blpickle.loads(data, safe=True)):
        for key, value in obj.items():
            assert type(loaded[key]) is np.ndarray
            np.testing.assert_array_equal(loaded[key], value.get())
    with map_location("cuda"):
        gpu = blpickle.loads(data)
        with blpickle.open(data) as rec:
            assert isinstance(rec["ids"], cupy.ndarray)
    for key, value in obj.items():
        assert isinstance(gpu[key], cupy.ndarray) and bool((gpu[key] == value).all())
    with blpickle.open(data) as rec:
        assert [(a.name, a.tensor) for a in rec.arrays][:3] == [
            ("weights", "cupy.float32"),
            ("ids", "cupy.int64"),
            ("half", "cupy.float16"),
        ]
