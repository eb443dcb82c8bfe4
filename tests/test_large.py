"""Buffers over 2 and 4 GiB: they round trip, and dump/load add only a few chunks of memory.

Each step runs in a fresh subprocess so that its peak RSS (``ru_maxrss``) is its own.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

#: 4.5 GiB: over Blosc2's 2 GiB chunk limit and over the 4 GiB size it silently truncates.
NBYTES = 9 * 2**29
LIMIT_MIB = 256

SCRIPT = r"""
import json, resource, sys
import numpy as np
import blpickle

def rss_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20

def peak_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

step, path, nbytes = sys.argv[1], sys.argv[2], int(sys.argv[3])
n = nbytes // 8
if step == "dump":
    array = np.arange(n, dtype=np.int64)
    array[::4097] = -array[::4097]  # not a pure ramp
    before = rss_mib()
    blpickle.dump({"big": array, "small": [1, 2, 3]}, path)
    print(json.dumps({"extra_mib": peak_mib() - before}))
else:
    before = rss_mib()
    obj = blpickle.load(path)
    extra = peak_mib() - before - nbytes / 2**20
    big = obj["big"]
    ok = big.shape == (n,) and big.dtype == np.int64 and big.flags.writeable and obj["small"] == [1, 2, 3]
    step_size = 1 << 24
    for start in range(0, n, step_size):
        expected = np.arange(start, min(start + step_size, n), dtype=np.int64)
        expected[(-start) % 4097 :: 4097] *= -1
        ok = ok and np.array_equal(big[start : start + step_size], expected)
    print(json.dumps({"extra_mib": extra, "equal": bool(ok)}))
"""


def _run(step: str, path: str) -> dict:
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, step, path, str(NBYTES)], capture_output=True, text=True, timeout=600, check=True
    )
    return json.loads(result.stdout)


@pytest.mark.slow
def test_buffer_over_4_gib_round_trips_in_bounded_memory(tmp_path):
    path = str(tmp_path / "big.blp")
    dumped = _run("dump", path)
    assert dumped["extra_mib"] < LIMIT_MIB, dumped
    loaded = _run("load", path)
    assert loaded["equal"]
    assert loaded["extra_mib"] < LIMIT_MIB, loaded
