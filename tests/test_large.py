"""Buffers over 2 and 4 GiB, and large bytearrays: they round trip, and dump/load add only a
few chunks of memory.

Each step runs in a fresh subprocess; its peak RSS (``VmHWM``) is reset just before the step.
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

def reset_peak():
    with open("/proc/self/clear_refs", "w") as f:  # Linux: resets VmHWM, the peak RSS
        f.write("5")

def peak_mib():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 1024

def pattern(start, stop):
    return (np.arange(start, stop, dtype=np.int64) % 251).astype(np.uint8)

step, kind, path, nbytes = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
n = nbytes // 8
if step == "dump":
    if kind == "array":
        big = np.arange(n, dtype=np.int64)
        big[::4097] = -big[::4097]  # not a pure ramp
    elif kind in ("random", "raw"):  # incompressible: the file is as large as the array
        big = np.empty(n)
        rng = np.random.default_rng(7)
        for start in range(0, n, 1 << 24):
            big[start : start + (1 << 24)] = rng.random(min(1 << 24, n - start))
    else:  # a bytearray: the pickler writes it in band, blpickle splices it out
        big = bytearray(nbytes)
        view = np.frombuffer(big, np.uint8)
        for start in range(0, nbytes, 1 << 24):
            view[start : start + (1 << 24)] = pattern(start, min(start + (1 << 24), nbytes))
        del view
    reset_peak()
    before = rss_mib()
    blpickle.dump({"big": big, "small": [1, 2, 3]}, path, **({"codec": None} if kind == "raw" else {}))
    print(json.dumps({"extra_mib": peak_mib() - before}))
else:
    reset_peak()
    before = rss_mib()
    obj = blpickle.load(path)
    extra = peak_mib() - before - nbytes / 2**20
    big = obj["big"]
    ok = obj["small"] == [1, 2, 3]
    step_size = 1 << 24
    if kind == "array":
        ok = ok and big.shape == (n,) and big.dtype == np.int64 and big.flags.writeable
        for start in range(0, n, step_size):
            expected = np.arange(start, min(start + step_size, n), dtype=np.int64)
            expected[(-start) % 4097 :: 4097] *= -1
            ok = ok and np.array_equal(big[start : start + step_size], expected)
    elif kind in ("random", "raw"):  # raw: read through a memory map of the file
        rng = np.random.default_rng(7)
        ok = ok and big.shape == (n,) and big.flags.writeable
        for start in range(0, n, 1 << 24):
            ok = ok and np.array_equal(big[start : start + (1 << 24)], rng.random(min(1 << 24, n - start)))
    else:
        ok = ok and type(big) is bytearray and len(big) == nbytes
        view = np.frombuffer(big, np.uint8)
        for start in range(0, nbytes, step_size):
            ok = ok and np.array_equal(view[start : start + step_size], pattern(start, min(start + step_size, nbytes)))
    print(json.dumps({"extra_mib": extra, "equal": bool(ok)}))
"""


def _run(step: str, kind: str, path: str, nbytes: int) -> dict:
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, step, kind, path, str(nbytes)],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    return json.loads(result.stdout)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("kind", "nbytes"), [("array", NBYTES), ("bytearray", 3 * 2**29), ("random", 2**30), ("raw", 2**30)]
)
def test_big_buffers_round_trip_in_bounded_memory(tmp_path, kind, nbytes):
    path = str(tmp_path / "big.blp")
    dumped = _run("dump", kind, path, nbytes)
    assert dumped["extra_mib"] < LIMIT_MIB, dumped
    loaded = _run("load", kind, path, nbytes)
    assert loaded["equal"]
    assert loaded["extra_mib"] < LIMIT_MIB, loaded
