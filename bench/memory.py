"""Peak memory of one dump or load, measured in a fresh process (RSS high-water mark)."""

from __future__ import annotations

import os
import resource
import subprocess
import sys

import numpy as np

from .contenders import by_name
from .timing import fsync

MiB = 1 << 20


def _peak_rss() -> int:
    """This process's RSS high-water mark in bytes.

    Linux's ``ru_maxrss`` survives ``exec`` (a child starts with its parent's peak), so read
    the per-address-space ``VmHWM`` there.
    """
    try:
        with open("/proc/self/status") as status:
            line = next(line for line in status if line.startswith("VmHWM:"))
        return int(line.split()[1]) * 1024
    except OSError:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024


def _measure(name: str, op: str, source: str, path: str) -> float:
    """Dump the array saved in ``source`` to ``path``, or load ``path``; return the peak RSS
    beyond the array itself, in MiB. Runs in a fresh process."""
    contender = by_name()[name]
    warm_up = path + ".warm-up" + contender.suffix
    contender.dump(np.arange(1000), warm_up)  # lazy imports and library set-up
    contender.load(warm_up)
    os.unlink(warm_up)
    if op == "dump":
        array = np.load(source)
        before = _peak_rss()
        contender.dump(array, path)
        fsync(path)
        return (_peak_rss() - before) / MiB
    before = _peak_rss()
    array = contender.load(path)
    return (_peak_rss() - before - array.nbytes) / MiB


def extra_peak_mib(name: str, op: str, source: str, path: str) -> float:
    """Extra peak memory (MiB beyond the array) of contender ``name`` dumping the array in the
    ``.npy`` file ``source`` to ``path`` (``op="dump"``) or loading it back (``op="load"``)."""
    command = [sys.executable, "-m", "bench.memory", name, op, source, path]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{name} {op} failed in a subprocess:\n{done.stderr}")
    return float(done.stdout)


if __name__ == "__main__":
    print(_measure(*sys.argv[1:]))
