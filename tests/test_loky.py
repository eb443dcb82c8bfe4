"""blpickle.integrations.loky: blpickle as loky's pickler, for joblib.Parallel."""

from __future__ import annotations

import io
import os
import pickle
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from conftest import assert_same_array
from test_multiprocessing import check_objects, sample_objects

pytest.importorskip("joblib")

from joblib import Parallel, delayed
from joblib.externals.loky.backend import reduction as loky_reduction

import blpickle
from blpickle.integrations import loky as bl_loky

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture
def enabled():
    before = loky_reduction.get_loky_pickler_name()
    bl_loky.enable()
    yield
    loky_reduction.set_loky_pickler(before)


@pytest.mark.parametrize("compress", ["auto", True, False])
def test_pickler_writes_a_plain_pickle(compress):
    bl_loky.configure(compress=compress, nthreads=2)
    try:
        objects = sample_objects()
        out = io.BytesIO()
        bl_loky.Pickler(out).dump(objects)
        check_objects(objects, pickle.loads(out.getvalue()))
    finally:
        bl_loky.configure()
        os.environ.pop(bl_loky.ENV_OPTIONS, None)


def test_an_object_without_big_buffers_is_its_own_plain_pickle():
    obj = {"a": [1, 2.5], "small": np.arange(10), "f": inspect_argument}
    out = io.BytesIO()
    bl_loky.Pickler(out).dump(obj)
    assert b"_open" not in out.getvalue()  # no envelope
    loaded = pickle.loads(out.getvalue())
    assert loaded["a"] == [1, 2.5] and loaded["f"] is inspect_argument
    assert_same_array(obj["small"], loaded["small"])


def test_lambdas_fall_back_to_cloudpickle():
    out = io.BytesIO()
    offset = 3
    bl_loky.Pickler(out).dump([lambda x: x + offset, np.arange(200_000)])
    loaded = pickle.loads(out.getvalue())
    assert loaded[0](1) == 4
    assert_same_array(np.arange(200_000), loaded[1])


def test_a_damaged_envelope_is_a_clear_error():
    head = bl_loky._HEAD.pack(bl_loky._VERSION, 1) + bl_loky._DESC.pack(100, 0)
    with pytest.raises(blpickle.CorruptError, match="version 99"):
        bl_loky._open(bl_loky._HEAD.pack(99, 0), b"")
    with pytest.raises(blpickle.CorruptError, match="damaged head"):
        bl_loky._open(head[:-1], b"")
    with pytest.raises(blpickle.CorruptError, match="fewer parts"):
        bl_loky._open(head, pickle.dumps(None))
    with pytest.raises(blpickle.CorruptError, match="arrived as 3 bytes"):
        bl_loky._open(head, pickle.dumps(None), bytearray(3))


def test_one_pickler_dumps_several_objects():
    out = io.BytesIO()
    pickler = bl_loky.Pickler(out)
    shared = np.arange(200_000)
    pickler.dump([shared, "x"])
    pickler.dump([shared, "y"])  # no memo reference to the first pickle
    out.seek(0)
    first, second = pickle.load(out), pickle.load(out)
    assert first[1] == "x" and second[1] == "y"
    assert_same_array(shared, second[0])


def test_through_loky_dumps_with_custom_reducers(enabled):
    class Point:
        def __init__(self, x):
            self.x = x

    def reduce_point(point):
        return Point, (point.x * 10,)

    data = loky_reduction.dumps(
        {"p": Point(1), "a": np.arange(1_000_000), "f": lambda: 5}, reducers={Point: reduce_point}
    )
    back = pickle.loads(data)
    assert back["p"].x == 10 and back["f"]() == 5
    assert_same_array(np.arange(1_000_000), back["a"])


def inspect_argument(array):
    from joblib.externals.loky.backend.reduction import get_loky_pickler_name

    return type(array).__name__, bool(array.flags.writeable), get_loky_pickler_name()


def double(array):
    return array * 2


def test_parallel_keeps_auto_memmapping_and_returns_writable_arrays(enabled):
    big = np.arange(500_000, dtype=np.float64)  # 4 MB > max_nbytes
    small = np.arange(50_000, dtype=np.float64)  # 400 kB < max_nbytes
    with Parallel(n_jobs=2, max_nbytes="1M") as parallel:
        described = parallel(delayed(inspect_argument)(a) for a in [big, small])
        assert described[0] == ("memmap", False, bl_loky.NAME)  # joblib still memory-maps it
        assert described[1] == ("ndarray", True, bl_loky.NAME)  # blpickle carried this one
        results = parallel(delayed(double)(a) for a in [big, small, np.random.default_rng(0).random(400_000)])
        assert_same_array(big * 2, results[0])
        assert_same_array(small * 2, results[1])
        assert parallel(delayed(lambda x: x + 1)(i) for i in range(3)) == [1, 2, 3]


def test_disable_restores_cloudpickle(enabled):
    bl_loky.disable()
    assert loky_reduction.get_loky_pickler_name() == "cloudpickle"


def test_loky_pickler_environment_variable(tmp_path):
    """``LOKY_PICKLER=blpickle.integrations.loky`` selects this pickler when loky is imported
    (workers started by that process inherit the variable)."""
    script = tmp_path / "script.py"
    script.write_text(
        textwrap.dedent(
            """
            import pickle
            import numpy as np
            from joblib.externals.loky.backend import reduction

            data = reduction.dumps({"a": np.arange(1_000_000), "f": lambda: 2})
            back = pickle.loads(data)
            assert len(data) < 100_000 and (back["a"] == np.arange(1_000_000)).all() and back["f"]() == 2
            print(reduction.get_loky_pickler_name())
            """
        )
    )
    env = {**os.environ, "LOKY_PICKLER": bl_loky.NAME, "PYTHONPATH": os.getcwd()}
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [bl_loky.NAME]
