"""The private names of joblib and concurrent.futures that blpickle relies on: none has a public API.

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

joblib is imported by the functions that need it, not by this module.
"""

from __future__ import annotations

import concurrent.futures.process
import dataclasses
import sys
from collections.abc import Callable
from typing import Any

__all__ = [
    "CallQueue",
    "JoblibMemmapping",
    "give_call_queue_class",
    "is_unused_call_queue",
    "joblib_memmapping",
    "joblib_store_classes",
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

    forward: type
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
    return type(queue) is CallQueue and queue._thread is None and not queue._buffer and not queue._reader.poll()


def give_call_queue_class(queue: Any, cls: type) -> None:
    """Make an unused call queue (see `is_unused_call_queue`) an instance of ``cls``, a
    subclass of `CallQueue` that adds methods and no slots."""
    queue.__class__ = cls
