"""The private names of joblib, multiprocessing and concurrent.futures that blpickle relies on:
none has a public API.

blpickle reaches them through this module only, and ``tests/test_host_internals.py`` checks that
each still holds, so that a joblib or Python release that changes one fails that test by name
rather than an integration at run time:

- joblib's ``FileSystemStoreBackend`` and ``CacheWarning``: ``joblib.register_store_backend``
  is public, but the file-system store it expects a subclass of is not exported.
- joblib's auto-memmapping reducers (``joblib._memmapping_reducer``): the loky pickler leaves
  to joblib the arrays that joblib memory-maps and takes the others.
- ``concurrent.futures.process._SafeQueue``: ``ProcessPoolExecutor`` builds its call queue from
  it and takes no other queue, so a blpickle context gives that queue a blpickle subclass
  before its first use.
- The pipe of multiprocessing's queues: they build it themselves (``connection.Pipe``, not
  their context's), and ``multiprocessing.Pool`` reads and writes a ``SimpleQueue``'s pipe
  ends directly, so a blpickle queue puts its own pipe in their place. (Its queues also
  override ``Queue._on_queue_feeder_error``, the hook the standard library keeps for
  ``concurrent.futures``; the test checks the feeder calls it with the object.)

joblib is imported by the functions that need it, not by this module.
"""

from __future__ import annotations

import concurrent.futures.process
import dataclasses
import sys
from collections.abc import Callable
from multiprocessing import queues
from typing import Any

__all__ = [
    "CallQueue",
    "JoblibMemmapping",
    "give_call_queue_class",
    "is_unused_call_queue",
    "joblib_memmapping",
    "joblib_store_classes",
    "queue_writer",
    "replace_queue_pipe",
]


def joblib_store_classes() -> tuple[type, type[Warning]]:
    """Return joblib's ``(FileSystemStoreBackend, CacheWarning)``."""
    from joblib._store_backends import CacheWarning, FileSystemStoreBackend

    return FileSystemStoreBackend, CacheWarning


@dataclasses.dataclass(frozen=True)
class JoblibMemmapping:
    """joblib's auto-memmapping, as far as the loky pickler needs to know it.

    Attributes:
        forward: the class of the reducer of arrays sent to workers.
        backward: the reducer of arrays sent back by workers.
        backing_memmap: ``array -> numpy.memmap or None``, the memmap an array views.
        temporary_files: the names of the files joblib memory-mapped for its workers.
    """

    forward: type[Any]
    backward: Callable[[Any], Any]
    backing_memmap: Callable[[Any], Any]
    temporary_files: set[str]

    @staticmethod
    def max_nbytes(reducer: Any) -> int | None:
        """The size over which a ``forward`` reducer dumps an array to a shared file."""
        return reducer._max_nbytes


def joblib_memmapping() -> JoblibMemmapping | None:
    """Return joblib's auto-memmapping, or None when joblib's parallel machinery is not loaded
    (then no reducer of it can be in a pickler's table)."""
    module = sys.modules.get("joblib._memmapping_reducer")
    if module is None:
        return None
    return JoblibMemmapping(
        module.ArrayMemmapForwardReducer,
        module.reduce_array_memmap_backward,
        module._get_backing_memmap,
        module.JOBLIB_MMAPS,
    )


#: The class of the call queue of ``concurrent.futures.ProcessPoolExecutor``.
CallQueue: type = concurrent.futures.process._SafeQueue


def is_unused_call_queue(queue: Any) -> bool:
    """True for a call queue of exactly `CallQueue` that nothing went through yet (no
    feeder thread, nothing buffered, nothing in its pipe), as when the executor starts its
    first worker."""
    if type(queue) is not CallQueue:
        return False
    state: Any = queue  # the private attributes of multiprocessing's Queue
    return state._thread is None and not state._buffer and not state._reader.poll()


def give_call_queue_class(queue: Any, cls: type) -> None:
    """Make an unused call queue (see `is_unused_call_queue`) an instance of ``cls``, a
    subclass of `CallQueue` that adds methods and no slots."""
    queue.__class__ = cls


def replace_queue_pipe(queue: queues.Queue | queues.SimpleQueue, reader: Any, writer: Any) -> None:
    """Make an unused multiprocessing queue (``Queue``, ``JoinableQueue``, ``SimpleQueue`` or
    a subclass) read from ``reader`` (``recv_bytes``, and ``recv`` for ``Pool``) and write to
    ``writer`` (``send_bytes``, and ``send`` for ``Pool``), closing its own pipe."""
    old = (queue._reader, queue._writer)  # type: ignore[union-attr]
    queue._reader, queue._writer = reader, writer  # type: ignore[union-attr]
    for conn in old:
        conn.close()
    if isinstance(queue, queues.SimpleQueue):
        queue._poll = reader.poll  # type: ignore[attr-defined]
    else:
        queue._reset()  # type: ignore[attr-defined]


def queue_writer(queue: Any) -> Any:
    """The connection a multiprocessing queue writes to (see `replace_queue_pipe`)."""
    return queue._writer


def simple_queue_write_lock(queue: queues.SimpleQueue) -> Any:
    """The lock a ``SimpleQueue``'s ``put`` holds while it writes (None on Windows)."""
    return queue._wlock  # type: ignore[attr-defined]
