"""One timing loop, fsync, and dropping a file from the page cache for cold loads."""

from __future__ import annotations

import collections
import gc
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

_PROBE_SIZE = 4 << 20


def timed(
    run: Callable[[], Any],
    repeat: int,
    budget: float,
    before: Callable[[], Any] = lambda: None,
    warm_up: bool = False,
) -> dict:
    """Time ``run`` up to ``repeat`` times (fewer once ``budget`` seconds are spent, at least
    once), garbage collector off as in ``timeit``; ``before`` runs untimed before each run,
    and with ``warm_up`` one untimed run comes first.

    Returns ``{"min", "median", "max", "runs"}`` in seconds.
    """
    if warm_up:
        before()
        run()
    runs: list[float] = []
    while len(runs) < repeat and (not runs or sum(runs) < budget):
        before()
        gc.disable()
        try:
            start = time.perf_counter()
            result = run()
            runs.append(time.perf_counter() - start)
        finally:
            gc.enable()
        del result  # freed outside the timing
    return {"min": min(runs), "median": statistics.median(runs), "max": max(runs), "runs": runs}


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


def _is_cached(path: str) -> bool | None:
    """Whether the file's first page is in the page cache (None when the OS can't tell)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.preadv(fd, [bytearray(4096)], 0, os.RWF_NOWAIT)
        return True
    except BlockingIOError:
        return False
    except (AttributeError, OSError):
        return None
    finally:
        os.close(fd)


#: Ways to drop a file from the page cache, most targeted first.
_DROPPERS = {"posix_fadvise(DONTNEED)": _fadvise_drop, "/proc/sys/vm/drop_caches": _drop_all_caches}


class CacheDropper:
    """Evicts a file from the page cache before a cold load, checking that it worked.

    Each call tries the ways in order until the file's first page is gone; ``used`` counts
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
            cached = _is_cached(path)
            if not cached:
                self.used[name if cached is False else f"{name} (unverified)"] += 1
                return
        self.used["not possible"] += 1
