"""Timing one call, fsync, and evicting a file from the page cache for cold loads."""

from __future__ import annotations

import collections
import ctypes
import functools
import gc
import mmap
import os
import statistics
import time
from collections.abc import Callable, Mapping
from typing import Any

_PROBE_SIZE = 4 << 20


def timed(run: Callable[[], Any]) -> tuple[float, Any]:
    """Call ``run`` once with the garbage collector off, as ``timeit`` does; return the
    seconds it took and its result."""
    gc.disable()
    try:
        start = time.perf_counter()
        result = run()
        return time.perf_counter() - start, result
    finally:
        gc.enable()


def spread(runs: list[float]) -> dict:
    """``{"min", "median", "max", "runs"}`` of some timings, in seconds."""
    return {"min": min(runs), "median": statistics.median(runs), "max": max(runs), "runs": runs}


def _loops(call: Callable[[], Any], seconds: float) -> int:
    """How many calls make a sample of at least ``seconds``."""
    number = 1
    while True:
        elapsed = timed(functools.partial(_repeat, call, number))[0]
        if elapsed >= seconds or number >= 1 << 20:
            return number
        number *= max(2, min(10, int(seconds / max(elapsed, 1e-9)) + 1))


def _repeat(call: Callable[[], Any], number: int) -> None:
    for _ in range(number):
        call()


def interleaved(calls: Mapping[str, Callable[[], Any]], rounds: int, seconds: float) -> dict[str, dict]:
    """Per-call seconds (`spread`) of each call, over rounds that run every call once as a
    timed loop, each round starting with the next call."""
    numbers = {label: _loops(call, seconds) for label, call in calls.items()}
    runs: dict[str, list[float]] = {label: [] for label in calls}
    labels = list(calls)
    for round_ in range(rounds):
        first = round_ % len(labels)
        for label in labels[first:] + labels[:first]:
            number = numbers[label]
            runs[label].append(timed(functools.partial(_repeat, calls[label], number))[0] / number)
    return {label: spread(times) for label, times in runs.items()}


def compare(workload: str, op: str, times: dict[str, dict], reference: str, count: int = 1) -> dict:
    """A row comparing ``times["blpickle"]`` with ``times[reference]`` (`spread` of samples
    of ``count`` calls or tasks): both spreads, the reference's name, and blpickle's speed
    relative to the reference's (its time over blpickle's) of the best and median samples."""
    ours, theirs = times["blpickle"], times[reference]
    return {
        "workload": workload,
        "op": op,
        "count": count,
        "reference_name": reference,
        "blpickle": ours,
        "reference": theirs,
        "speed_best": theirs["min"] / ours["min"],
        "speed_median": theirs["median"] / ours["median"],
    }


def fsync(path: str) -> None:
    """Flush a written file to the storage device."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fadvise_drop(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _drop_all_caches(path: str) -> None:
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as file:
        file.write("1")


def _resident_pages(path: str) -> int | None:
    """How many of the file's pages are in the page cache, by ``mincore`` on a mapping that
    is never touched (reading, even with ``RWF_NOWAIT``, would start a readahead); None when
    the OS can't tell."""
    size = os.path.getsize(path)
    if not size:
        return 0
    try:
        mincore = ctypes.CDLL(None, use_errno=True).mincore
    except (AttributeError, OSError):
        return None
    pages = -(-size // mmap.PAGESIZE)
    flags = (ctypes.c_ubyte * pages)()
    with (
        open(path, "rb") as file,
        mmap.mmap(file.fileno(), size, access=mmap.ACCESS_COPY) as mapped,
    ):
        start = ctypes.c_char.from_buffer(mapped)  # ACCESS_COPY is writable, so it has an address
        failed = mincore(ctypes.c_void_p(ctypes.addressof(start)), ctypes.c_size_t(size), flags)
        del start
    return None if failed else sum(flag & 1 for flag in flags)


#: Ways to drop a file from the page cache, most targeted first.
_DROPPERS = {"posix_fadvise(DONTNEED)": _fadvise_drop, "/proc/sys/vm/drop_caches": _drop_all_caches}


class CacheDropper:
    """Evicts a file from the page cache before a cold load, checking that it worked.

    Each call tries the ways in order until no page of the file is cached; ``used`` counts
    which way worked (suffixed "unverified" when the OS cannot report residency, or
    "not possible"). ``possible`` says whether a probe file could be evicted.
    """

    def __init__(self, directory: str) -> None:
        self.used: collections.Counter[str] = collections.Counter()
        probe = os.path.join(directory, "cache-probe.bin")
        with open(probe, "wb") as file:
            file.write(os.urandom(_PROBE_SIZE))
        fsync(probe)
        self(probe)
        os.unlink(probe)
        self.possible = "not possible" not in self.used

    def __call__(self, path: str) -> None:
        gc.collect()  # a file still mapped by an unreachable object cannot be evicted
        for name, drop in _DROPPERS.items():
            try:
                drop(path)
            except (AttributeError, OSError):
                continue
            resident = _resident_pages(path)
            if not resident:
                self.used[name if resident == 0 else f"{name} (unverified)"] += 1
                return
        self.used["not possible"] += 1
