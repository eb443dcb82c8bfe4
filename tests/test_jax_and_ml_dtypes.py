"""jax arrays and numpy arrays of ml_dtypes' dtypes through blpickle: typed, compressed, loaded
safely, read back by name."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

import blpickle
from blpickle.errors import CorruptError
from blpickle.tensors import rebuild_jax_array

ml_dtypes = pytest.importorskip("ml_dtypes")


def weights(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    return (0.02 * np.random.default_rng(seed).standard_normal(shape)).astype(np.float32)


@pytest.mark.parametrize("name", ["bfloat16", "float8_e4m3fn", "float8_e5m2", "int4", "float4_e2m1fn"])
def test_ml_dtypes_arrays_round_trip_typed_and_load_safely(name):
    array = weights((512, 300)).astype(getattr(ml_dtypes, name))
    data = blpickle.dumps({"w": array, "rows": array[10:20]})
    for loaded in (blpickle.loads(data), blpickle.loads(data, safe=True)):
        assert loaded["w"].dtype == array.dtype and loaded["w"].tobytes() == array.tobytes()
        assert np.shares_memory(loaded["w"], loaded["rows"])  # a view stays a view
    with blpickle.open(data) as rec:
        assert [b.itemsize for b in rec.info.buffers] == [array.itemsize]  # the view is not stored
        assert rec["w"].dtype == array.dtype and rec["w"].tobytes() == array.tobytes()


def test_bfloat16_weights_are_compressed_as_their_format_allows():
    array = weights((1024, 1024)).astype(ml_dtypes.bfloat16)
    with blpickle.open(blpickle.dumps({"w": array})) as rec:
        (info,) = rec.arrays
        assert info.codec == "zstd" and info.nbytes / info.stored > 1.4


def test_a_dtype_of_ml_dtypes_needs_an_ml_dtypes_type_in_safe_mode():
    plain = pickle.dumps(np.zeros(3, np.dtype(ml_dtypes.bfloat16)), protocol=5)
    assert blpickle.loads(plain, safe=True).dtype == np.dtype(ml_dtypes.bfloat16)
    forged = plain.replace(b"ml_dtypes", b"blpickles")  # the same name in another package
    with pytest.raises(blpickle.UnsafeLoadError, match=r"blpickles\.bfloat16"):
        blpickle.loads(forged, safe=True)


def test_jax_arrays_round_trip_as_jax_arrays_typed_and_load_safely():
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    obj = {"f32": jnp.asarray(weights((512, 512))), "bf16": jnp.asarray(weights((512, 512), 1), dtype=jnp.bfloat16)}
    data = blpickle.dumps(obj)
    for loaded in (blpickle.loads(data), blpickle.loads(data, safe=True)):
        for key, array in obj.items():
            assert isinstance(loaded[key], jax.Array) and loaded[key].dtype == array.dtype
            assert np.asarray(loaded[key]).tobytes() == np.asarray(array).tobytes()
    with blpickle.open(data) as rec:
        assert [(a.name, a.tensor) for a in rec.arrays] == [("f32", "jax.float32"), ("bf16", "jax.bfloat16")]
        assert [b.itemsize for b in rec.info.buffers] == [4, 2]
        assert sum(a.nbytes for a in rec.arrays) / sum(a.stored for a in rec.arrays) > 1.2
        bf16 = rec["bf16"]
        assert isinstance(bf16, jax.Array) and bool((bf16 == obj["bf16"]).all())


@pytest.mark.parametrize(
    "data",
    [
        np.zeros(3, object),
        np.zeros(3, "U2"),
        np.zeros(3, "V4"),
        b"\0\0",
        [1.0],
        # a view repeating one element 10**9 times: jax would allocate all of them
        np.lib.stride_tricks.as_strided(np.zeros(1, np.float32), (10**9,), (0,)),
    ],
)
def test_rebuild_jax_array_takes_only_numbers(data):
    with pytest.raises(CorruptError, match="a jax array is rebuilt from a numpy array of numbers"):
        rebuild_jax_array(data)
