"""A process forked after blpickle used its threads can dump and load without hanging."""

from __future__ import annotations

import multiprocessing
import warnings

import numpy as np
import pytest
from conftest import assert_same_array

import blpickle

OBJ = {"a": np.arange(2_000_000), "b": np.random.default_rng(0).random(500_000)}


def _child(queue) -> None:
    data = blpickle.dumps(OBJ, chunk_size=1 << 16, nthreads=2)
    loaded = blpickle.loads(data, nthreads=2)
    queue.put(bool(np.array_equal(loaded["a"], OBJ["a"]) and np.array_equal(loaded["b"], OBJ["b"])))


@pytest.mark.parametrize("method", ["fork", "forkserver", "spawn"])
def test_child_after_threaded_dump_and_load_does_not_hang(method):
    data = blpickle.dumps(OBJ, chunk_size=1 << 16, nthreads=2)  # the parent's pool is running now
    assert_same_array(OBJ["a"], blpickle.loads(data, nthreads=2)["a"])
    context = multiprocessing.get_context(method)
    queue = context.Queue()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # Python >= 3.12 warns on fork with threads
        process = context.Process(target=_child, args=(queue,))
        process.start()
    process.join(timeout=120)
    if process.is_alive():
        process.kill()
        pytest.fail(f"the {method} child hung")
    assert process.exitcode == 0
    assert queue.get(timeout=10) is True
