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
from typing import Any, TypeGuard, TypeVar, overload

import blosc2

__all__ = ["map_ordered", "shared_pool"]

T = TypeVar("T")
R = TypeVar("R")
S = TypeVar("S")

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


@overload
def map_ordered(fn: Callable[[T], R], items: Iterable[T], count: int, nthreads: int) -> Iterator[R]: ...


@overload
def map_ordered(
    fn: Callable[[T], R], items: Iterable[T | S], count: int, nthreads: int, skip: Callable[[object], TypeGuard[S]]
) -> Iterator[R | S]: ...


def map_ordered(
    fn: Callable[[Any], Any],
    items: Iterable[Any],
    count: int,
    nthreads: int,
    skip: Callable[[object], bool] | None = None,
) -> Iterator[Any]:
    """Yield ``fn(item)`` in order, running up to ``nthreads`` calls at once in a shared pool;
    items for which ``skip(item)`` is true are yielded as they are, in their place (for the
    caller to handle while the pool works on the items after them).

    At most ``nthreads + 1`` calls are in flight, so memory stays bounded. ``count`` is the
    number of calls expected (any large number when unknown): a single call, or a single
    thread, runs inline. On an error, or when the iterator is closed early, calls already
    running finish before it returns (their memory may be in use).
    """
    if nthreads == 1 or count <= 1:
        for item in items:
            yield item if skip is not None and skip(item) else fn(item)
        return
    pool = shared_pool(nthreads)
    pending: deque[tuple[Future[Any] | None, Any]] = deque()
    running = 0
    try:
        for item in items:
            if skip is not None and skip(item):
                pending.append((None, item))
                continue
            pending.append((pool.submit(fn, item), item))
            running += 1
            # hand back in order: a call once too many run, a skipped item once the pool is busy
            while pending and (running > nthreads or (pending[0][0] is None and running >= nthreads)):
                future, done = pending.popleft()
                if future is None:
                    yield done
                else:
                    running -= 1
                    yield future.result()
        while pending:
            future, done = pending.popleft()
            yield done if future is None else future.result()
    finally:
        futures = [future for future, _ in pending if future is not None]
        for future in futures:
            future.cancel()
        wait(futures)
