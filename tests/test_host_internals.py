"""The private names of joblib, multiprocessing and concurrent.futures that blpickle relies on
still hold.

Each test fails by name when a joblib or Python release changes what
``blpickle/integrations/_host_internals.py`` assumes; the integration tests then fail too, but
less clearly.
"""

from __future__ import annotations

import concurrent.futures
import importlib
import multiprocessing
import multiprocessing.connection
import multiprocessing.queues
import os
import threading

import numpy as np
import pytest

from blpickle.integrations import _host_internals


def test_joblib_file_system_store_is_a_store_backend_with_the_methods_blpickle_overrides(tmp_path):
    store, cache_warning = _host_internals.joblib_store_classes()
    assert issubclass(cache_warning, Warning)
    backend = store()
    backend.configure(str(tmp_path), verbose=0, backend_options={"compress": False})
    for name in ("configure", "dump_item", "load_item", "_item_exists", "create_location"):
        assert callable(getattr(backend, name)), name
    assert backend.compress is False
    assert backend.mmap_mode is None
    assert backend.location == str(tmp_path)


def test_joblib_memmapping_reducers(tmp_path):
    importlib.import_module("joblib._memmapping_reducer")  # as joblib.Parallel does

    found = _host_internals.joblib_memmapping()
    assert found is not None
    reducer = found.forward(
        max_nbytes=123, temp_folder_resolver=lambda: str(tmp_path), mmap_mode="r", unlink_on_gc_collect=False
    )
    assert found.max_nbytes(reducer) == 123
    assert isinstance(found.temporary_files, set)
    path = tmp_path / "a.npy"
    np.save(path, np.arange(10))
    mapped = np.load(path, mmap_mode="r")
    assert isinstance(found.backing_memmap(mapped[2:]), np.memmap)
    assert found.backing_memmap(np.arange(3)) is None
    assert callable(found.backward)


def test_process_pool_executor_builds_its_call_queue_from_the_call_queue_class():
    with concurrent.futures.ProcessPoolExecutor(1) as executor:
        assert type(executor._call_queue) is _host_internals.CallQueue
        assert executor.submit(abs, -1).result(timeout=60) == 1


def test_an_unused_call_queue_is_recognised_and_can_change_class():
    queue = _host_internals.CallQueue(
        1,
        ctx=multiprocessing.get_context("fork"),
        pending_work_items={},
        shutdown_lock=threading.Lock(),
        thread_wakeup=None,
    )
    assert _host_internals.is_unused_call_queue(queue)

    class Marked(_host_internals.CallQueue):
        pass

    _host_internals.give_call_queue_class(queue, Marked)
    assert type(queue) is Marked
    assert not _host_internals.is_unused_call_queue(queue)  # no longer exactly the standard class
    queue.put(1)
    assert queue.get(timeout=60) == 1
    queue.close()
    queue.join_thread()


def test_a_used_call_queue_is_left_alone():
    queue = _host_internals.CallQueue(
        1,
        ctx=multiprocessing.get_context("fork"),
        pending_work_items={},
        shutdown_lock=threading.Lock(),
        thread_wakeup=None,
    )
    queue.put(1)
    assert not _host_internals.is_unused_call_queue(queue)
    assert queue.get(timeout=60) == 1
    queue.close()
    queue.join_thread()


_USED: list[str] = []


class _Recording(multiprocessing.connection.Connection):
    """A pipe end that notes in `_USED` which of its methods the queue used."""

    def send_bytes(self, buf, offset=0, size=None):
        _USED.append("send_bytes")
        super().send_bytes(buf, offset, size)

    def recv_bytes(self, maxlength=None):
        _USED.append("recv_bytes")
        return super().recv_bytes(maxlength)


def _recording_pipe():
    read_fd, write_fd = os.pipe()
    return _Recording(read_fd, writable=False), _Recording(write_fd, readable=False)


@pytest.mark.parametrize("kind", ["Queue", "JoinableQueue", "SimpleQueue"])
def test_a_queue_reads_and_writes_through_the_pipe_put_in_its_place(kind):
    ctx = multiprocessing.get_context("fork")
    queue = getattr(ctx, kind)()
    reader, writer = _recording_pipe()
    _USED.clear()
    _host_internals.replace_queue_pipe(queue, reader, writer)
    assert _host_internals.queue_writer(queue) is writer
    queue.put({"x": 1})
    assert (queue.get(timeout=60) if kind != "SimpleQueue" else queue.get()) == {"x": 1}
    assert _USED == ["send_bytes", "recv_bytes"]
    if kind == "SimpleQueue":
        lock = _host_internals.simple_queue_write_lock(queue)
        assert lock.acquire(timeout=1)
        lock.release()
        queue.close()
    else:
        queue.close()
        queue.join_thread()


def test_pool_uses_the_pipe_ends_of_its_simple_queues():
    """``Pool`` sends tasks with ``_inqueue._writer.send`` and receives results with
    ``_outqueue._reader.recv``: a blpickle context gives those queues blpickle pipes."""
    import inspect
    from multiprocessing import pool

    source = inspect.getsource(pool.Pool._setup_queues)
    assert "self._inqueue._writer.send" in source and "self._outqueue._reader.recv" in source


def test_the_feeder_reports_a_pickling_error_to_the_queue_hook_with_the_object():
    reported = []

    class Hooked(multiprocessing.queues.Queue):
        def _on_queue_feeder_error(self, e, obj):
            reported.append((type(e), obj))

    queue = Hooked(ctx=multiprocessing.get_context("fork"))
    unpicklable = threading.Lock()
    queue.put(unpicklable)
    queue.put("after")
    assert queue.get(timeout=60) == "after"
    assert reported == [(TypeError, unpicklable)]
    queue.close()
    queue.join_thread()
