"""Property-based round trips over dtypes, shapes, memory layouts and options."""

from __future__ import annotations

import io
import pickle

import numpy as np
from conftest import NonSeekable, assert_same_array
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import blpickle

dtypes = st.one_of(
    hnp.boolean_dtypes(),
    hnp.integer_dtypes(endianness="="),
    hnp.unsigned_integer_dtypes(endianness=">"),
    hnp.floating_dtypes(endianness="?"),
    hnp.complex_number_dtypes(endianness="?"),
    hnp.datetime64_dtypes(endianness="?"),
    hnp.timedelta64_dtypes(),
    hnp.byte_string_dtypes(max_len=9),
    hnp.unicode_string_dtypes(max_len=5),
    hnp.array_dtypes(hnp.scalar_dtypes(), min_size=1, max_size=3),
)

options = st.fixed_dictionaries(
    {},
    optional={
        "codec": st.sampled_from(["zstd", "lz4", "lz4hc", "blosclz", "zlib", None]),
        "clevel": st.integers(0, 9),
        "shuffle": st.sampled_from(["shuffle", "bitshuffle", "noshuffle"]),
        "bytedelta": st.booleans(),
        "chunk_size": st.sampled_from([4096, 5000, 65536]),
        "nthreads": st.integers(1, 3),
        "protocol": st.integers(2, 5),
    },
)


@st.composite
def layouts(draw, array: np.ndarray) -> np.ndarray:
    """The array as drawn, or Fortran ordered, transposed, or sliced with any steps."""
    kind = draw(st.sampled_from(["C", "F", "T", "sliced"]))
    if kind == "F":
        return np.asfortranarray(array)
    if kind == "T":
        return array.T
    if kind == "sliced" and array.ndim:
        index = tuple(
            slice(draw(st.integers(0, 2)), None, draw(st.sampled_from([1, 2, 3, -1, -2]))) for _ in range(array.ndim)
        )
        return array[index]
    return array


@settings(max_examples=150, deadline=None)
@given(
    data=st.data(), dtype=dtypes, shape=hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=40), opts=options
)
def test_arrays_round_trip_bit_for_bit(data, dtype, shape, opts):
    array = data.draw(layouts(data.draw(hnp.arrays(dtype, shape))))
    record = blpickle.dumps({"x": array, "again": array}, **opts)
    loaded = blpickle.loads(record)
    assert loaded["x"] is loaded["again"]
    if opts.get("protocol", 5) >= 5:  # as pickle gives it back (numpy's reduce may change the dtype)
        assert_same_array(pickle.loads(pickle.dumps(array, protocol=5)), loaded["x"])
    else:
        _assert_same_values(array, loaded["x"], opts["protocol"])


def _assert_same_values(expected: np.ndarray, actual: np.ndarray, protocol: int) -> None:
    """Same shape and values; below protocol 5 numpy pickles arrays in band itself and gives
    them the native byte order."""
    assert actual.shape == expected.shape
    if protocol >= 5:  # the dtype pickle gives back
        assert actual.dtype == pickle.loads(pickle.dumps(expected, protocol=5)).dtype
    else:
        assert actual.dtype.newbyteorder("=") == expected.dtype.newbyteorder("=")
    assert actual.astype(expected.dtype).tobytes() == expected.tobytes()


@settings(max_examples=40, deadline=None)
@given(
    arrays=st.lists(hnp.arrays(hnp.scalar_dtypes(), hnp.array_shapes(max_dims=2, max_side=300)), max_size=5),
    opts=options,
    max_read=st.integers(1, 5000),
)
def test_graphs_of_arrays_stream_through_non_seekable_files(arrays, opts, max_read):
    out = io.BytesIO()
    blpickle.dump(arrays, out, **opts)
    loaded = blpickle.load(NonSeekable(out.getvalue(), max_read=max_read))
    assert len(loaded) == len(arrays)
    for expected, actual in zip(arrays, loaded, strict=True):
        _assert_same_values(expected, actual, opts.get("protocol", 5))
