"""The peer tests that do not pass with blpickle as ``pickle``, by name, each with its reason.

Names are pytest node ids relative to ``site-packages``; a name without ``[...]`` stands for
every parametrization of the test. Kinds:

- ``skip``: cannot hold for any container format (the test searches the pickle bytes for a
  name, or hands them to plain pickle), or cannot run from the installed wheel: skipped;
- ``xfail``: a known blpickle defect, with its issue: ``xfail(strict=True)``, so the run
  fails once it is fixed, and the entry goes;
- ``may-skip``: the suite itself skips the test in some environments; where it runs, it
  must pass.

Every other test of the suites run by ``run.py`` must pass.
"""

from __future__ import annotations

from typing import Literal, NamedTuple


class Expectation(NamedTuple):
    kind: Literal["skip", "xfail", "may-skip"]
    reason: str


def _cannot_hold(reason: str) -> Expectation:
    return Expectation("skip", f"cannot hold for any container format: {reason}")


_DTYPE_TEXT = _cannot_hold("asserts b'dtype' in the pickle bytes, which blpickle compresses")
_MODULE_TEXT = _cannot_hold(
    "asserts numpy's module names in the pickle bytes, which blpickle compresses "
    "(and at protocol 5 an array's reduce names blpickle.arrays.rebuild_ndarray)"
)
_JOBLIB_OBJECT_ARRAYS = _cannot_hold(
    "joblib writes arrays of objects with pickle.dump and reads them back with its own "
    "pure-Python pickle._Unpickler, which reads nothing but plain pickle opcodes"
)
_HAND_MADE_PICKLE = _cannot_hold(
    "builds a pickle by hand around the bytes of pickle.dumps(args, protocol=0) and loads it "
    "with pandas' pure-Python unpickler"
)
_LEGACY_DATA = Expectation("skip", "reads pandas/tests/io/data/legacy_pickle, which the pandas wheel does not ship")

EXPECTED: dict[str, Expectation] = {
    # numpy/_core/tests
    "numpy/_core/tests/test_dtype.py::TestPickling::test_structured": _DTYPE_TEXT,
    "numpy/_core/tests/test_dtype.py::TestPickling::test_structured_aligned": _DTYPE_TEXT,
    "numpy/_core/tests/test_dtype.py::TestPickling::test_structured_unaligned": _DTYPE_TEXT,
    "numpy/_core/tests/test_dtype.py::TestPickling::test_structured_padded": _DTYPE_TEXT,
    "numpy/_core/tests/test_dtype.py::TestPickling::test_structured_titles": _DTYPE_TEXT,
    "numpy/_core/tests/test_dtype.py::TestPickling::test_datetime": _DTYPE_TEXT,
    "numpy/_core/tests/test_regression.py::TestRegression::test_pickle_module": _MODULE_TEXT,
    "numpy/_core/tests/test_multiarray.py::TestPickling::test_correct_protocol5_error_message": Expectation(
        "may-skip", "numpy runs it only where pickle has no protocol 5"
    ),
    # pandas/tests/io/test_pickle.py
    "pandas/tests/io/test_pickle.py::test_pickles": _LEGACY_DATA,
    "pandas/tests/io/test_pickle.py::test_pickle_frame_v124_unpickle_130": _LEGACY_DATA,
    "pandas/tests/io/test_pickle.py::test_unpickle_legacy_fixture_keeps_name_on_copy": _LEGACY_DATA,
    "pandas/tests/io/test_pickle.py::test_unpickle_legacy_timestamp_keeps_tz": _HAND_MADE_PICKLE,
    "pandas/tests/io/test_pickle.py::test_unpickle_legacy_timestamp_naive": _HAND_MADE_PICKLE,
    "pandas/tests/io/test_pickle.py::test_unpickle_legacy_timestamp_aware_input": _HAND_MADE_PICKLE,
    "pandas/tests/io/test_pickle.py::test_unpickle_timestamp_by_component": _HAND_MADE_PICKLE,
    "pandas/tests/io/test_pickle.py::test_read_pickle_legacy_timestamp_keeps_tz": _HAND_MADE_PICKLE,
    # joblib/test/test_numpy_pickle.py
    "joblib/test/test_numpy_pickle.py::test_numpy_persistence": _JOBLIB_OBJECT_ARRAYS,
    "joblib/test/test_numpy_pickle.py::test_memmap_persistence": _JOBLIB_OBJECT_ARRAYS,
    "joblib/test/test_numpy_pickle.py::test_memmap_persistence_mixed_dtypes": _JOBLIB_OBJECT_ARRAYS,
    "joblib/test/test_numpy_pickle.py::test_object_array_inner_stream_uses_caller_find_class": _JOBLIB_OBJECT_ARRAYS,
    "joblib/test/test_numpy_pickle.py::test_memory_usage": _JOBLIB_OBJECT_ARRAYS,
    "joblib/test/test_numpy_pickle.py::test_compressed_pickle_dump_and_load": _JOBLIB_OBJECT_ARRAYS,
    "joblib/test/test_numpy_pickle.py::test_lz4_compression_without_lz4": Expectation(
        "may-skip", "joblib runs it only where lz4 is not installed"
    ),
}
