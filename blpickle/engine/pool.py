"""The shared thread pools that compress and decompress chunks, and ordered mapping over them.

Blosc2 releases the GIL, so chunks compress in parallel in these threads while the calling
thread does the I/O. The pools are started when first needed, never on import; a forked
child forgets its parent's pools (their threads do not exist there) and starts new ones.
"""

from __future__ import annotations

import os
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import TypeVar

import blosc2

__all__ = ["map_ordered", "shared_pool"]

T = TypeVar("T")
R = TypeVar("R")

_POOLS: dict[int, ThreadPoolExecutor] = {}
_POOLS_LOCK = threading.Lock()
_POOLS_PREPARED = False


def _forget_pools() -> None:
    """In a forked child the pools' threads do not exist: start afresh."""
    global _POOLS_LOCK
    _POOLS.clear()
    _POOLS_LOCK = threading.Lock()


def shared_pool(nthreads: int) -> ThreadPoolExecutor:
    """Return the shared pool of ``nthreads`` threads. Before the first pool, Blosc2 is told to
    release the GIL (so that the pool's threads compress in parallel) and a forked child to
    forget the pools: process-wide settings, made when they are first needed, not on import."""
    global _POOLS_PREPARED
    with _POOLS_LOCK:
        if not _POOLS_PREPARED:
            blosc2.set_releasegil(True)
            os.register_at_fork(after_in_child=_forget_pools)
            _POOLS_PREPARED = True
        if nthreads not in _POOLS:
            _POOLS[nthreads] = ThreadPoolExecutor(nthreads, thread_name_prefix=f"blpickle-{nthreads}")
        return _POOLS[nthreads]


def map_ordered(fn: Callable[[T], R], items: Iterable[T], count: int, nthreads: int) -> Iterator[R]:
    """Yield ``fn(item)`` in order, running up to ``nthreads`` calls at once in a shared pool.

    At most ``nthreads + 1`` items are in flight, so memory stays bounded. ``count`` is the
    number of items expected (any large number when unknown): a single item, or a single
    thread, runs inline. On an error, or when the iterator is closed early, calls already
    running finish before it returns (their memory may be in use).
    """
    if nthreads == 1 or count <= 1:
        yield from map(fn, items)
        return
    pool = shared_pool(nthreads)
    pending: deque[Future[R]] = deque()
    try:
        for item in items:
            pending.append(pool.submit(fn, item))
            if len(pending) > nthreads:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:
        for future in pending:
            future.cancel()
        wait(pending)
