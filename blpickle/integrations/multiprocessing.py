"""multiprocessing and concurrent.futures that send objects with blpickle.

One line:

```python
ctx = blpickle.integrations.multiprocessing.get_context("spawn")   # or "fork", "forkserver"
with ctx.Pool(2) as pool: ...
with concurrent.futures.ProcessPoolExecutor(2, mp_context=ctx) as ex: ...
q = ctx.Queue(); r, w = ctx.Pipe()
```

Objects then travel as a protocol-5 pickle, written by the C pickler with multiprocessing's
reducers, or by cloudpickle where it cannot (lambdas, closures; under spawn and forkserver
also what names ``__main__``, which those children may not define). An object with no big
buffer is one standard message holding that pickle: what the standard library sends, at its
cost. Otherwise the message holds a head and the pickle, and each big buffer follows: a raw
buffer goes from the array's memory straight into the pipe (``os.writev``) and is read
straight into the memory of the received array (``os.readv``), with no pickle-sized byte
string on either side; a buffer that a sample shows to be compressible goes as Blosc2
chunks, compressed in threads while earlier chunks are written, decompressed in threads while
later ones are read. Received arrays are writable. A plain pickle sent by the standard library
can still be received.

Why a context rather than ``ctx.reducer = ...``: ``multiprocessing`` binds its pickler into
``connection`` and ``queues`` when they are imported, and pickles everything into one bytes
object before writing it. A `BlpickleContext` instead hands out its own
`Connection` (``send``/``recv`` overridden), and queues built on it; nothing global
changes.
The queues keep the standard ``put``/``get`` and feeder thread, on a pipe of blpickle
connections. ``concurrent.futures.ProcessPoolExecutor`` builds its call queue itself, from
the standard ``Queue`` class; the context's ``Process`` upgrades that (still unused) queue in
place when the executor passes it to its first worker, so arguments travel with blpickle too.
The private names of multiprocessing this takes are in `._host_internals`.

Unix only (``os.writev``/``os.readv`` on the pipe's file descriptor).
"""

from __future__ import annotations

import copyreg
import functools
import io
import multiprocessing
import os
import pickle
import socket
import struct
import sys
import threading
from multiprocessing import connection as _connection
from multiprocessing import context as _context
from multiprocessing import queues as _queues
from multiprocessing import reduction as _reduction
from typing import Any, TypeVar, cast

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
_VERSION = 2
_HEAD = struct.Struct("<4sBBHI")  # magic, version, flags, reserved, number of buffers
_DESC = struct.Struct("<QQ")  # nbytes, chunk size (0: raw)
_CHUNK = struct.Struct("<Q")  # the size of a compressed chunk, before it
_IOV_MAX = 1024

if sys.platform == "win32":  # pragma: no cover - the pipes here are Unix file descriptors
    raise ImportError("blpickle.integrations.multiprocessing needs Unix pipes (os.writev/os.readv)")


# --- the connection --------------------------------------------------------------------------


@functools.cache
def _forking_reducers() -> dict[Any, Any]:
    """The reducers multiprocessing's pickler adds to copyreg's (connections, sockets, ...),
    read once, at the first message: register reducers with ``ForkingPickler.register``
    before sending (copyreg's are read at each message)."""
    table = _reduction.ForkingPickler(io.BytesIO()).dispatch_table
    return {cls: reducer for cls, reducer in table.items() if copyreg.dispatch_table.get(cls) is not reducer}


def _dispatch_table() -> dict[Any, Any]:
    """The reducers of a message: copyreg's (as they are now) and multiprocessing's."""
    return {**copyreg.dispatch_table, **_forking_reducers()}


class _Message:
    """An encoded object: the first message (a plain pickle, or head and pickle) and the
    planned out-of-band buffers."""

    __slots__ = ("buffers", "first")

    def __init__(self, first: Any, buffers: list[_wire.Buffer]) -> None:
        self.first = first
        self.buffers = buffers


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


def _read_exact(fd: int, view: memoryview) -> None:
    """Fill ``view`` from ``fd``."""
    done, size = 0, view.nbytes
    while done < size:
        count = os.readv(fd, [view[done:]])
        if not count:
            raise OSError("got end of file during message")
        done += count


class _PipeFrames:
    """The `_wire.Frames` that follow a message's first part on a pipe, read as needed:
    raw buffers straight into the memory of their arrays."""

    def __init__(self, fd: int) -> None:
        self._fd = fd

    def raw(self, nbytes: int) -> np.ndarray:
        out = np.empty(nbytes, np.uint8)
        _read_exact(self._fd, memoryview(cast(Any, out)))
        return out

    def chunk(self, limit: int) -> np.ndarray:
        prefix = bytearray(_CHUNK.size)
        _read_exact(self._fd, memoryview(prefix))
        (size,) = _CHUNK.unpack(prefix)
        if size > limit:
            raise CorruptError(f"a compressed chunk of {size} bytes, at most {limit} expected")
        packed = np.empty(size, np.uint8)
        _read_exact(self._fd, memoryview(cast(Any, packed)))
        return packed


class Connection(_connection.Connection):
    """A multiprocessing ``Connection`` whose ``send``/``recv`` move objects with blpickle.

    An object with no big buffer is one standard message holding its pickle (what
    ``multiprocessing`` itself sends); otherwise the message holds a head listing the buffers
    and the pickle, and the buffers follow, raw or in compressed chunks. ``send_bytes``,
    ``recv_bytes``, ``recv_bytes_into`` and ``poll`` are unchanged. Pickled to a child
    process (or through a queue), it stays a blpickle connection with the same options.

    Args:
        handle: the file descriptor.
        options: a `WireOptions` (see `get_context`).
        main_by_value: send functions and classes of ``__main__`` by value (a spawned or
            forkserver child does not have those defined under ``if __name__ == ...``).
    """

    def __init__(
        self,
        handle: int,
        readable: bool = True,
        writable: bool = True,
        *,
        options: WireOptions | None = None,
        main_by_value: bool = False,
    ) -> None:
        super().__init__(handle, readable, writable)
        self._wire = options if options is not None else WireOptions()
        self._main_by_value = main_by_value

    @property
    def options(self) -> WireOptions:
        """The `WireOptions` of this connection."""
        return self._wire

    def send(self, obj: Any) -> None:
        """Send a picklable object (lambdas and ``__main__`` functions included)."""
        self._transmit(self._encode(obj))

    def recv(self) -> Any:
        """Receive an object sent by `send` (or a plain multiprocessing message)."""
        return self._decode(self.recv_bytes())

    def _encode(self, obj: Any) -> _Message:
        """Pickle ``obj`` and decide how each buffer travels; nothing is written yet, so a
        pickling error leaves the connection usable."""
        graph, buffers = _wire.pickle_graph(obj, self._wire, _dispatch_table(), main_by_value=self._main_by_value)
        if not buffers:
            return _Message(graph, buffers)
        _wire.plan_buffers(buffers, self._wire)
        head = [_HEAD.pack(_MAGIC, _VERSION, 0, 0, len(buffers))]
        head.extend(_DESC.pack(nbytes, chunk_size) for nbytes, chunk_size in _wire.layout(buffers))
        return _Message(b"".join([*head, graph]), buffers)

    def _transmit(self, message: _Message) -> None:
        _connection.Connection.send_bytes(self, message.first)  # not a queue pipe's override
        if not message.buffers:
            return
        fd = self.fileno()
        for buffer in message.buffers:
            if not buffer.chunk_size:
                _write_all(fd, [buffer.view])
                continue
            for packed in _wire.compressed_chunks(buffer, self._wire.options.threads):
                _write_all(fd, [_CHUNK.pack(len(packed)), packed])

    def _decode(self, first: bytes) -> Any:
        """Return the object of a message whose first part is ``first``, receiving its
        buffers."""
        if first[: len(_MAGIC)] != _MAGIC:
            return pickle.loads(first)  # a plain pickle: no buffer follows
        if len(first) < _HEAD.size:
            raise CorruptError(f"a blpickle message of {len(first)} bytes has no complete head")
        _magic, version, _flags, _reserved, count = _HEAD.unpack_from(first)
        if version != _VERSION:
            raise CorruptError(
                f"a message of blpickle transfer version {version}; this blpickle reads version {_VERSION}"
            )
        graph_start = _HEAD.size + count * _DESC.size
        if graph_start > len(first):
            raise CorruptError(f"a message announces {count} buffers in {len(first)} bytes")
        layout = [_DESC.unpack_from(first, _HEAD.size + index * _DESC.size) for index in range(count)]
        buffers = _wire.receive_buffers(layout, _PipeFrames(self.fileno()), self._wire.options.threads)
        return _wire.unpickle_graph(memoryview(first)[graph_start:], buffers)

    def __reduce__(self) -> Any:
        """Pickled for a child process (with multiprocessing's pickler, as a process argument or
        through a queue), the connection arrives as a duplicate of its file descriptor."""
        return _rebuild_connection, (
            type(self),
            _reduction.DupFd(self.fileno()),
            self.readable,
            self.writable,
            self._wire,
            self._main_by_value,
        )


def _rebuild_connection(
    cls: type[Connection], df: Any, readable: bool, writable: bool, options: WireOptions, main_by_value: bool
) -> Connection:
    return cls(df.detach(), readable, writable, options=options, main_by_value=main_by_value)


def Pipe(
    duplex: bool = True, *, options: WireOptions | None = None, main_by_value: bool = False
) -> tuple[Connection, Connection]:
    """Like ``multiprocessing.Pipe``, with blpickle connections."""
    return _pipe(Connection, duplex, options, main_by_value)


def _pipe(
    cls: type[ConnectionT], duplex: bool, options: WireOptions | None, main_by_value: bool
) -> tuple[ConnectionT, ConnectionT]:
    if duplex:
        left, right = socket.socketpair()
        left.setblocking(True)
        right.setblocking(True)
        return (
            cls(left.detach(), options=options, main_by_value=main_by_value),
            cls(right.detach(), options=options, main_by_value=main_by_value),
        )
    read_fd, write_fd = os.pipe()
    return (
        cls(read_fd, writable=False, options=options, main_by_value=main_by_value),
        cls(write_fd, readable=False, options=options, main_by_value=main_by_value),
    )


ConnectionT = TypeVar("ConnectionT", bound=Connection)


# --- queues ----------------------------------------------------------------------------------

#: The parcel being sent by this thread (see `_Parcel`) and the object it received last.
_passing = threading.local()


class _Parcel:
    """What a blpickle queue puts in the standard queue machinery in place of an object.

    The standard queues pickle what they send with ``ForkingPickler`` and hand the bytes to
    their pipe's ``send_bytes``. Pickling a parcel encodes its object with blpickle (so that
    an error is reported as the standard queues report pickling errors) and pickles to
    nothing, noting itself as what this thread sends next: the pipe's
    `_QueueConnection.send_bytes` then transmits that message instead.
    """

    __slots__ = ("message", "obj", "writer")

    def __init__(self, obj: Any, writer: Connection) -> None:
        self.obj = obj
        self.writer = writer
        self.message: _Message | None = None

    def __reduce__(self) -> Any:
        self.message = self.writer._encode(self.obj)
        _passing.parcel = self
        return type(None), ()


def _unwrap(obj: Any) -> Any:
    """The object of a parcel (what a queue's feeder-error hook should see)."""
    return obj.obj if isinstance(obj, _Parcel) else obj


def _take_received() -> Any:
    """Called by ``pickle.loads`` of `_RECEIVED`: the object this thread received last."""
    obj, _passing.received = _passing.received, None
    return obj


class _Received:
    def __reduce__(self) -> Any:
        return _take_received, ()


#: What `_QueueConnection.recv_bytes` returns for an object received with its buffers.
_RECEIVED = pickle.dumps(_Received(), protocol=5)


class _QueueConnection(Connection):
    """The pipe of a blpickle queue: the standard queue code sends with ``send_bytes`` what
    ``ForkingPickler`` made of a `_Parcel` (its object is sent with blpickle instead), and
    loads with ``pickle.loads`` what ``recv_bytes`` returns: the pickle of a message without
    buffers, or `_RECEIVED` that gives the object this thread just received."""

    def send_bytes(self, buf: Any, offset: int = 0, size: int | None = None) -> None:
        parcel = getattr(_passing, "parcel", None)
        if parcel is None:
            super().send_bytes(buf, offset, size)
            return
        _passing.parcel = None
        self._transmit(parcel.message)

    def recv_bytes(self, maxlength: int | None = None) -> bytes:
        first = super().recv_bytes(maxlength)
        if first[: len(_MAGIC)] != _MAGIC:
            return first
        _passing.received = self._decode(first)
        return _RECEIVED

    def recv(self) -> Any:
        return self._decode(super().recv_bytes())


def _queue_pipe(ctx: Any) -> tuple[_QueueConnection, _QueueConnection]:
    if isinstance(ctx, BlpickleContext):
        return _pipe(_QueueConnection, False, ctx.wire_options, ctx.main_by_value)
    return _pipe(_QueueConnection, False, None, False)


class _ParcelPutter:
    """Puts parcels in a standard ``Queue`` (or subclass) and reports an object that could not
    be pickled to its feeder-error hook as itself."""

    def put(self, obj: Any, block: bool = True, timeout: float | None = None) -> None:
        super().put(_Parcel(obj, _host_internals.queue_writer(self)), block, timeout)  # type: ignore[misc]

    def _on_queue_feeder_error(self, e: Exception, obj: Any) -> None:
        super()._on_queue_feeder_error(e, _unwrap(obj))  # type: ignore[misc]


class Queue(_ParcelPutter, _queues.Queue):
    """``multiprocessing.Queue`` with blpickle transfers; build it with ``ctx.Queue()``."""

    def __init__(self, maxsize: int = 0, *, ctx: Any) -> None:
        super().__init__(maxsize, ctx=ctx)
        _host_internals.replace_queue_pipe(self, *_queue_pipe(ctx))


class JoinableQueue(_ParcelPutter, _queues.JoinableQueue):
    """``multiprocessing.JoinableQueue`` with blpickle transfers (``ctx.JoinableQueue()``)."""

    def __init__(self, maxsize: int = 0, *, ctx: Any) -> None:
        super().__init__(maxsize, ctx=ctx)
        _host_internals.replace_queue_pipe(self, *_queue_pipe(ctx))


class SimpleQueue(_queues.SimpleQueue):
    """``multiprocessing.SimpleQueue`` with blpickle transfers (``ctx.SimpleQueue()``).

    ``multiprocessing.Pool`` is built on two of these (and writes to them with
    ``Connection.send`` directly).
    """

    def __init__(self, *, ctx: Any) -> None:
        super().__init__(ctx=ctx)
        _host_internals.replace_queue_pipe(self, *_queue_pipe(ctx))

    def put(self, obj: Any) -> None:
        writer = _host_internals.queue_writer(self)
        message = writer._encode(obj)  # before taking the lock, as the standard put does
        lock = _host_internals.simple_queue_write_lock(self)
        if lock is None:
            writer._transmit(message)
            return
        with lock:
            writer._transmit(message)


class _CallQueue(_ParcelPutter, _host_internals.CallQueue):
    """What a ``concurrent.futures`` call queue becomes in a blpickle context (the executor
    fails the future of a call item that could not be pickled, as usual)."""


def _upgrade_call_queue(queue: Any, ctx: BlpickleContext) -> None:
    """Turn the call queue of a ``ProcessPoolExecutor`` into a blpickle queue, in place.

    Only a queue of exactly the standard type that was never used (as when the executor
    starts its first worker) is changed; anything else is left alone and keeps working with
    standard pickling.
    """
    if _host_internals.is_unused_call_queue(queue):
        _host_internals.give_call_queue_class(queue, _CallQueue)
        _host_internals.replace_queue_pipe(queue, *_queue_pipe(ctx))


# --- processes -------------------------------------------------------------------------------


class _CloudTarget:
    """Spawned and forkserver children get their target and arguments through cloudpickle
    (once per process), so a lambda or a function defined in ``__main__`` can be a
    ``Process`` target or a pool initializer, as with loky."""

    _target: Any
    _args: Any
    _kwargs: Any

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        call = (state.pop("_target", None), state.pop("_args", ()), state.pop("_kwargs", {}))
        state["_blpickle_call"] = bytes(_wire.cloudpickle_in_band(call, _dispatch_table()))
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
        #: A forked child has everything ``__main__`` defined; other children only what the
        #: script defines outside ``if __name__ == "__main__":``.
        self.main_by_value = self._name != "fork"

    def __repr__(self) -> str:
        return f"<BlpickleContext {self._name!r} {self.wire_options}>"

    def __reduce__(self) -> Any:
        return BlpickleContext, (self._name, self.wire_options)

    def get_context(self, method: str | None = None) -> BlpickleContext:  # type: ignore[override]
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
            _upgrade_call_queue(arg, self)
        return self._process_class(group, target, name, args, kwargs or {}, daemon=daemon)

    def Pipe(self, duplex: bool = True) -> tuple[Connection, Connection]:
        """A pair of blpickle `Connection` objects."""
        return Pipe(duplex, options=self.wire_options, main_by_value=self.main_by_value)

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
