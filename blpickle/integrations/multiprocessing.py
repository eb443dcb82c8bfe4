"""multiprocessing and concurrent.futures that send objects with blpickle.

One line:

```python
ctx = blpickle.integrations.multiprocessing.get_context("spawn")   # or "fork", "forkserver"
with ctx.Pool(2) as pool: ...
with concurrent.futures.ProcessPoolExecutor(2, mp_context=ctx) as ex: ...
q = ctx.Queue(); r, w = ctx.Pipe()
```

Objects then travel as a small cloudpickle (protocol 5, so lambdas and functions defined in
``__main__`` travel too) followed by each big buffer on its own: a raw buffer goes from the
array's memory straight into the pipe (``os.writev``) and is read straight into the memory of
the received array (``os.readv``), with no pickle-sized byte string on either side; a buffer
that a sample shows to be compressible goes as Blosc2 chunks, compressed in threads while
earlier chunks are written, decompressed in threads while later ones are read. Received arrays
are writable. Each part is one ``Connection`` message (the standard length prefix), so a plain
pickle sent by the standard library can still be received.

Why a context rather than ``ctx.reducer = ...``: ``multiprocessing`` binds its pickler into
``connection`` and ``queues`` when they are imported, and pickles everything into one bytes
object before writing it. A `BlpickleContext` instead hands out its own
`Connection` (``send``/``recv`` overridden), and queues built on it; nothing global
changes.
``concurrent.futures.ProcessPoolExecutor`` builds its call queue itself, from the standard
``Queue`` class; the context's ``Process`` upgrades that (still unused) queue in place when
the executor passes it to its first worker, so arguments travel with blpickle too.

Unix only (``os.writev``/``os.readv`` on the pipe's file descriptor).
"""

from __future__ import annotations

import collections
import copyreg
import io
import multiprocessing
import os
import pickle
import socket
import struct
import sys
import time
from multiprocessing import connection as _connection
from multiprocessing import context as _context
from multiprocessing import queues as _queues
from multiprocessing import reduction as _reduction
from queue import Empty, Full
from typing import Any

import numpy as np

from ..errors import CorruptError
from . import _host_internals, _wire
from ._wire import WireOptions, wire_options

__all__ = [
    "BlpickleContext",
    "Connection",
    "JoinableQueue",
    "Pipe",
    "Queue",
    "SimpleQueue",
    "WireOptions",
    "get_context",
    "install",
    "uninstall",
]

_MAGIC = b"\xb1BLW"
_VERSION = 1
_HEAD = struct.Struct("<4sBBHI")  # magic, version, flags, reserved, number of buffers
_DESC = struct.Struct("<QQ")  # nbytes, chunk size (0: raw)
_SIZE = struct.Struct("!i")  # multiprocessing's message length prefix ...
_BIG_SIZE = struct.Struct("!Q")  # ... after -1 for messages over 2 GiB - 1
_IOV_MAX = 1024
#: multiprocessing's Connection can't carry more than this in one message length
_MAX_SMALL = 0x7FFFFFFF
#: small first messages are read into a bytearray, bigger ones into uninitialised memory
_SMALL_READ = 1 << 20

if sys.platform == "win32":  # pragma: no cover - the pipes here are Unix file descriptors
    raise ImportError("blpickle.integrations.multiprocessing needs Unix pipes (os.writev/os.readv)")


# --- the connection --------------------------------------------------------------------------


class _Message:
    """An encoded object: the first message (head and pickle) and the planned buffers."""

    __slots__ = ("buffers", "graph", "head")

    def __init__(self, head: bytes, graph: memoryview, buffers: list[_wire.Buffer]) -> None:
        self.head = head
        self.graph = graph
        self.buffers = buffers


def _size_prefix(size: int) -> bytes:
    if size > _MAX_SMALL:
        return _SIZE.pack(-1) + _BIG_SIZE.pack(size)
    return _SIZE.pack(size)


def _write_all(fd: int, parts: list[Any]) -> None:
    """Write every part with as few ``writev`` calls as the kernel allows."""
    views = [memoryview(part).cast("B") for part in parts]
    views = [view for view in views if view.nbytes]
    while views:
        written = os.writev(fd, views[:_IOV_MAX])
        while written:
            first = views[0]
            if written >= first.nbytes:
                written -= first.nbytes
                views.pop(0)
            else:
                views[0] = first[written:]
                written = 0


def _read_exact(fd: int, view: memoryview, at_start: bool = False) -> None:
    """Fill ``view`` from ``fd``; EOFError when the peer closed before a message."""
    done, size = 0, view.nbytes
    while done < size:
        count = os.readv(fd, [view[done:]])
        if not count:
            if at_start and done == 0:
                raise EOFError
            raise OSError("got end of file during message")
        done += count


def _read_size(fd: int, at_start: bool = False) -> int:
    prefix = bytearray(_SIZE.size)
    _read_exact(fd, memoryview(prefix), at_start)
    (size,) = _SIZE.unpack(prefix)
    if size == -1:
        big = bytearray(_BIG_SIZE.size)
        _read_exact(fd, memoryview(big))
        (size,) = _BIG_SIZE.unpack(big)
    elif size < 0:
        raise CorruptError(f"a message announces {size} bytes")
    return size


class Connection(_connection.Connection):
    """A multiprocessing ``Connection`` whose ``send``/``recv`` move objects with blpickle.

    ``send_bytes``, ``recv_bytes``, ``recv_bytes_into`` and ``poll`` are unchanged. Pickled to
    a child process (or through a queue), it stays a blpickle connection with the same
    options.

    Args:
        handle: the file descriptor.
        options: a `WireOptions` (see `get_context`).
    """

    def __init__(
        self,
        handle: int,
        readable: bool = True,
        writable: bool = True,
        *,
        options: WireOptions | None = None,
    ) -> None:
        super().__init__(handle, readable, writable)
        self._wire = options if options is not None else WireOptions()

    @property
    def options(self) -> WireOptions:
        """The `WireOptions` of this connection."""
        return self._wire

    def send(self, obj: Any) -> None:
        """Send a picklable object (lambdas and ``__main__`` functions included)."""
        self._check_closed()
        self._check_writable()
        self._transmit(self._encode(obj))

    def recv(self) -> Any:
        """Receive an object sent by `send` (or a plain multiprocessing message)."""
        self._check_closed()
        self._check_readable()
        return self._receive()

    def _encode(self, obj: Any) -> _Message:
        """Pickle ``obj`` and decide how each buffer travels; nothing is written yet, so a
        pickling error leaves the connection usable."""
        graph, buffers = _wire.pickle_graph(obj, self._wire, _forking_reducers())
        _wire.plan(buffers, self._wire)
        head = [_HEAD.pack(_MAGIC, _VERSION, 0, 0, len(buffers))]
        head.extend(_DESC.pack(buffer.nbytes, buffer.chunk_size) for buffer in buffers)
        return _Message(b"".join(head), graph, buffers)

    def _transmit(self, message: _Message) -> None:
        fd = self._handle
        _write_all(
            fd,
            [_size_prefix(len(message.head) + message.graph.nbytes), message.head, message.graph],
        )
        for buffer in message.buffers:
            if not buffer.chunk_size:
                _write_all(fd, [_size_prefix(buffer.nbytes), buffer.view])
                continue
            for packed in _wire.compressed_chunks(buffer, self._wire.options):
                _write_all(fd, [_size_prefix(len(packed)), packed])

    def _receive(self) -> Any:
        fd = self._handle
        size = _read_size(fd, at_start=True)
        first: Any = bytearray(size) if size <= _SMALL_READ else np.empty(size, np.uint8)
        _read_exact(fd, memoryview(first))
        if size < _HEAD.size or bytes(first[: len(_MAGIC)]) != _MAGIC:
            return pickle.loads(first)  # a plain multiprocessing message
        _magic, version, _flags, _reserved, count = _HEAD.unpack_from(first)
        if version != _VERSION:
            raise CorruptError(
                f"a message of blpickle transfer version {version}; this blpickle reads version {_VERSION}"
            )
        graph_start = _HEAD.size + count * _DESC.size
        if graph_start > size:
            raise CorruptError(f"a message announces {count} buffers in {size} bytes")
        buffers = []
        for index in range(count):
            nbytes, chunk_size = _DESC.unpack_from(first, _HEAD.size + index * _DESC.size)
            _wire.check_layout(nbytes, chunk_size)
            buffers.append(self._receive_buffer(fd, nbytes, chunk_size))
        return _wire.unpickle_graph(memoryview(first)[graph_start:], buffers)

    def _receive_buffer(self, fd: int, nbytes: int, chunk_size: int) -> np.ndarray:
        out = np.empty(nbytes, np.uint8)
        if not chunk_size:
            size = _read_size(fd)
            if size != nbytes:
                raise CorruptError(f"a raw buffer of {nbytes} bytes arrived as {size} bytes")
            _read_exact(fd, memoryview(out))
            return out
        limit = _wire.max_chunk_frame(chunk_size)

        def chunks() -> Any:
            for _ in range(-(-nbytes // chunk_size)):
                size = _read_size(fd)
                if size > limit:
                    raise CorruptError(f"a compressed chunk of {size} bytes for chunks of {chunk_size}")
                packed = np.empty(size, np.uint8)
                _read_exact(fd, memoryview(packed))
                yield packed

        _wire.decompress_into(out, chunk_size, chunks(), self._wire.options.threads)
        return out

    def __reduce__(self) -> Any:
        """Pickled for a child process (with multiprocessing's pickler, as a process argument or
        through a queue), the connection arrives as a duplicate of its file descriptor."""
        return _rebuild_connection, (_reduction.DupFd(self.fileno()), self.readable, self.writable, self._wire)


def _rebuild_connection(df: Any, readable: bool, writable: bool, options: WireOptions) -> Connection:
    return Connection(df.detach(), readable, writable, options=options)


def _forking_reducers() -> dict[Any, Any]:
    """The reducers multiprocessing's pickler adds to copyreg's (connections, sockets, ...)."""
    table = _reduction.ForkingPickler(io.BytesIO()).dispatch_table
    return {cls: reducer for cls, reducer in table.items() if copyreg.dispatch_table.get(cls) is not reducer}


def Pipe(duplex: bool = True, *, options: WireOptions | None = None) -> tuple[Connection, Connection]:
    """Like ``multiprocessing.Pipe``, with blpickle connections."""
    if duplex:
        left, right = socket.socketpair()
        left.setblocking(True)
        right.setblocking(True)
        return Connection(left.detach(), options=options), Connection(right.detach(), options=options)
    read_fd, write_fd = os.pipe()
    return Connection(read_fd, writable=False, options=options), Connection(write_fd, readable=False, options=options)


# --- queues ----------------------------------------------------------------------------------


def _context_options(ctx: Any) -> WireOptions:
    return ctx.wire_options if isinstance(ctx, BlpickleContext) else WireOptions()


def _feeder_sender(writer: Connection, pending: collections.deque, sem: Any, onerror: Any) -> Any:
    """What a queue's feeder thread calls as ``send_bytes``: it ignores the (tiny) pickle of
    the placeholder it is given and sends the object queued next to it instead.

    Pickling errors are reported like the standard feeder does (``onerror(exc, obj)`` with the
    object itself, which is what ``concurrent.futures`` needs to fail the right future).
    """

    def send(placeholder: memoryview) -> None:
        # Released at once: a pickling error's traceback keeps this frame, and a buffer still
        # exported when the garbage collector finalises its BytesIO makes close() fail.
        placeholder.release()
        obj = pending.popleft()
        try:
            message = writer._encode(obj)
        except Exception as exc:
            sem.release()
            onerror(exc, obj)
            return
        writer._transmit(message)

    return send


class _QueueMixin:
    """Turns a ``multiprocessing.queues.Queue`` (or a subclass) into a blpickle queue.

    The standard feeder thread pickles each buffered item with the global ForkingPickler and
    hands the bytes to ``self._send_bytes``: here the buffer only holds ``None`` placeholders
    (free to pickle) while the objects wait in ``self._pending``, and ``_send_bytes`` sends the
    object with the blpickle connection. ``get`` receives with the connection.
    """

    _reader: Connection
    _writer: Connection

    def _use_pipe(self, options: WireOptions) -> None:
        old = (self._reader, self._writer)
        self._reader, self._writer = Pipe(duplex=False, options=options)
        for conn in old:
            conn.close()
        self._reset()

    def _reset(self, after_fork: bool = False) -> None:
        super()._reset(after_fork)  # type: ignore[misc]
        self._pending: collections.deque = collections.deque()
        if isinstance(self._writer, Connection):
            self._send_bytes = _feeder_sender(self._writer, self._pending, self._sem, self._on_queue_feeder_error)

    def put(self, obj: Any, block: bool = True, timeout: float | None = None) -> None:
        if self._closed:
            raise ValueError(f"Queue {self!r} is closed")
        if not self._sem.acquire(block, timeout):
            raise Full
        with self._notempty:
            if self._thread is None:
                self._start_thread()
            self._pending.append(obj)
            self._buffer.append(None)
            self._notempty.notify()

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        if self._closed:
            raise ValueError(f"Queue {self!r} is closed")
        if block and timeout is None:
            with self._rlock:
                obj = self._reader.recv()
            self._sem.release()
            return obj
        if block:
            deadline = time.monotonic() + timeout
        if not self._rlock.acquire(block, timeout):
            raise Empty
        try:
            if block:
                if not self._poll(deadline - time.monotonic()):
                    raise Empty
            elif not self._poll():
                raise Empty
            obj = self._reader.recv()
            self._sem.release()
        finally:
            self._rlock.release()
        return obj


class Queue(_QueueMixin, _queues.Queue):
    """``multiprocessing.Queue`` with blpickle transfers; build it with ``ctx.Queue()``."""

    def __init__(self, maxsize: int = 0, *, ctx: Any) -> None:
        super().__init__(maxsize, ctx=ctx)
        self._use_pipe(_context_options(ctx))


class JoinableQueue(_QueueMixin, _queues.JoinableQueue):
    """``multiprocessing.JoinableQueue`` with blpickle transfers (``ctx.JoinableQueue()``)."""

    def __init__(self, maxsize: int = 0, *, ctx: Any) -> None:
        super().__init__(maxsize, ctx=ctx)
        self._use_pipe(_context_options(ctx))

    def put(self, obj: Any, block: bool = True, timeout: float | None = None) -> None:
        if self._closed:
            raise ValueError(f"Queue {self!r} is closed")
        if not self._sem.acquire(block, timeout):
            raise Full
        with self._notempty, self._cond:
            if self._thread is None:
                self._start_thread()
            self._pending.append(obj)
            self._buffer.append(None)
            self._unfinished_tasks.release()
            self._notempty.notify()


class SimpleQueue(_queues.SimpleQueue):
    """``multiprocessing.SimpleQueue`` with blpickle transfers (``ctx.SimpleQueue()``).

    ``multiprocessing.Pool`` is built on two of these (and writes to them with
    ``Connection.send`` directly).
    """

    _reader: Connection
    _writer: Connection

    def __init__(self, *, ctx: Any) -> None:
        super().__init__(ctx=ctx)
        old = (self._reader, self._writer)
        self._reader, self._writer = Pipe(duplex=False, options=_context_options(ctx))
        for conn in old:
            conn.close()
        self._poll = self._reader.poll

    def get(self) -> Any:
        with self._rlock:
            return self._reader.recv()

    def put(self, obj: Any) -> None:
        message = self._writer._encode(obj)  # pickle before taking the lock
        if self._wlock is None:
            self._writer._transmit(message)
        else:
            with self._wlock:
                self._writer._transmit(message)


class _CallQueue(_QueueMixin, _host_internals.CallQueue):
    """What a ``concurrent.futures`` call queue becomes in a blpickle context."""


def _upgrade_call_queue(queue: Any, options: WireOptions) -> None:
    """Turn the call queue of a ``ProcessPoolExecutor`` into a blpickle queue, in place.

    Only a queue of exactly the standard type that was never used (no feeder thread yet, as
    when the executor starts its first worker) is changed; anything else is left alone and
    keeps working with standard pickling.
    """
    if _host_internals.is_unused_call_queue(queue):
        _host_internals.give_call_queue_class(queue, _CallQueue)
        queue._use_pipe(options)


# --- processes -------------------------------------------------------------------------------


class _CloudTarget:
    """Spawned and forkserver children get their target and arguments through cloudpickle,
    so a lambda or a function defined in ``__main__`` can be a ``Process`` target or a pool
    initializer, as with loky."""

    _target: Any
    _args: Any
    _kwargs: Any

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        call = (state.pop("_target", None), state.pop("_args", ()), state.pop("_kwargs", {}))
        options = WireOptions(options=_wire.TRANSFER_DEFAULTS)
        graph, _ = _wire.pickle_graph(call, options, _forking_reducers(), out_of_band=False)
        state["_blpickle_call"] = bytes(graph)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        call = state.pop("_blpickle_call", None)
        self.__dict__.update(state)
        if call is not None:
            self._target, self._args, self._kwargs = pickle.loads(call)


class ForkProcess(_context.ForkProcess):
    """A forked process (nothing is pickled on the way)."""


class SpawnProcess(_CloudTarget, _context.SpawnProcess):
    """A spawned process whose target and arguments travel with cloudpickle."""


class ForkServerProcess(_CloudTarget, _context.ForkServerProcess):
    """A forkserver process whose target and arguments travel with cloudpickle."""


_PROCESSES = {"fork": ForkProcess, "spawn": SpawnProcess, "forkserver": ForkServerProcess}


# --- the context -----------------------------------------------------------------------------


class BlpickleContext(_context.BaseContext):
    """A multiprocessing context (start method ``fork``, ``spawn`` or ``forkserver``) whose
    ``Pipe``, ``Queue``, ``JoinableQueue``, ``SimpleQueue`` and ``Pool`` send objects with
    blpickle, and whose ``Process`` can be given to ``ProcessPoolExecutor(mp_context=...)``.

    Locks, events, managers and shared memory are the standard ones.
    """

    def __init__(self, method: str | None = None, options: WireOptions | None = None) -> None:
        if method is None:
            method = multiprocessing.get_start_method(allow_none=True) or multiprocessing.get_all_start_methods()[0]
        base = multiprocessing.get_context(method)  # validates the name and availability
        self._name = base.get_start_method()
        self._base = base
        self._process_class = _PROCESSES[self._name]
        self.wire_options = options if options is not None else WireOptions()

    def __repr__(self) -> str:
        return f"<BlpickleContext {self._name!r} {self.wire_options}>"

    def __reduce__(self) -> Any:
        return BlpickleContext, (self._name, self.wire_options)

    def get_context(self, method: str | None = None) -> BlpickleContext:
        if method is None or method == self._name:
            return self
        return BlpickleContext(method, self.wire_options)

    def get_start_method(self, allow_none: bool = False) -> str:
        return self._name

    def set_start_method(self, method: str | None, force: bool = False) -> None:
        raise ValueError("cannot set the start method of a blpickle context: make another with get_context(method)")

    def get_all_start_methods(self) -> list[str]:
        return multiprocessing.get_all_start_methods()

    def _check_available(self) -> None:
        self._base._check_available()

    def Process(
        self,
        group: Any = None,
        target: Any = None,
        name: Any = None,
        args: Any = (),
        kwargs: Any = None,
        *,
        daemon: Any = None,
    ) -> Any:
        """A process of this context's start method.

        A ``concurrent.futures`` call queue among ``args`` (the executor starting a worker) is
        switched to blpickle first.
        """
        for arg in args:
            _upgrade_call_queue(arg, self.wire_options)
        return self._process_class(group, target, name, args, kwargs or {}, daemon=daemon)

    def Pipe(self, duplex: bool = True) -> tuple[Connection, Connection]:
        """A pair of blpickle `Connection` objects."""
        return Pipe(duplex, options=self.wire_options)

    def Queue(self, maxsize: int = 0) -> Queue:
        return Queue(maxsize, ctx=self)

    def JoinableQueue(self, maxsize: int = 0) -> JoinableQueue:
        return JoinableQueue(maxsize, ctx=self)

    def SimpleQueue(self) -> SimpleQueue:
        return SimpleQueue(ctx=self)


def get_context(method: str | None = None, preset: Any = None, **options: Any) -> BlpickleContext:
    """Return a multiprocessing context that sends objects with blpickle.

    Args:
        method: ``"fork"``, ``"spawn"``, ``"forkserver"`` or None (the current default).
        preset: a `blpickle.PRESETS` name or `blpickle.Options` for Blosc2.
        options: `blpickle.Options` fields (``codec=``, ``clevel=``, ``shuffle=``,
            ``bytedelta=``, ``chunk_size=``, ``nthreads=``, ``pickler=``) and
            `WireOptions` fields: ``compress=`` ("auto", True, False), ``min_size=``,
            ``min_ratio=``, ``inband_size=``. ``codec=None`` never compresses.

    Raises:
        ValueError: for an unknown or unavailable start method.
        blpickle.OptionsError: for an invalid option.
    """
    return BlpickleContext(method, wire_options(preset, **options))


_SAVED: dict[str, Any] = {}
_FACTORIES = ("Pipe", "Queue", "JoinableQueue", "SimpleQueue", "Pool")


def install(method: str | None = None, preset: Any = None, **options: Any) -> BlpickleContext:
    """Make ``multiprocessing.Pipe/Queue/JoinableQueue/SimpleQueue/Pool`` those of a blpickle
    context; return the context (give it to ``ProcessPoolExecutor(mp_context=...)``).

    Only the attributes of the ``multiprocessing`` module change: names imported before
    (``from multiprocessing import Pool``) keep the standard behaviour. Undo with
    `uninstall`.
    """
    ctx = get_context(method, preset, **options)
    if not _SAVED:
        _SAVED.update({name: getattr(multiprocessing, name) for name in _FACTORIES})
    for name in _FACTORIES:
        setattr(multiprocessing, name, getattr(ctx, name))
    return ctx


def uninstall() -> None:
    """Restore what `install` replaced."""
    for name, value in _SAVED.items():
        setattr(multiprocessing, name, value)
    _SAVED.clear()
