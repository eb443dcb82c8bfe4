"""multiprocessing and concurrent.futures that send objects with blpickle.

One line:

```python
# or "fork", "forkserver"
ctx = blpickle.integrations.multiprocessing.get_context("spawn")
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

Linux and macOS (``os.writev``/``os.readv`` on the pipe's file descriptor).
"""

from __future__ import annotations

import itertools
import multiprocessing
import pickle
import threading
from multiprocessing import context as _context
from multiprocessing import queues as _queues
from typing import Any

from . import _host_internals, transport
from ._mp_connection import MAGIC, Connection, Pipe, dispatch_tables, make_pipe
from .transport import WireOptions, wire_options

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

# --- queues ----------------------------------------------------------------------------------

#: The object this thread received last (see `_QueueConnection.recv_bytes`).
_passing = threading.local()


class _Unpicklable(Exception):
    """Raised in a queue's feeder thread for an object blpickle could not pickle (the cause);
    the queue reports that error with the object to its feeder-error hook."""

    def __init__(self, obj: Any) -> None:
        super().__init__("could not pickle a queued object")
        self.obj = obj


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
    """The pipe of a blpickle queue. The standard queue code puts a token (a small int) in
    place of each object, pickles it with ``ForkingPickler`` and sends the bytes with
    ``send_bytes``: here the token's object is sent with blpickle instead. It loads with
    ``pickle.loads`` what ``recv_bytes`` returns: the pickle of a message without buffers,
    or `_RECEIVED`, which gives the object this thread just received with its buffers."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._parked: dict[int, Any] = {}
        self._tokens = itertools.count()

    def park(self, obj: Any) -> int:
        """Keep ``obj`` until its token is sent; return the token."""
        token = next(self._tokens)
        self._parked[token] = obj
        return token

    def unpark(self, token: int) -> None:
        """Forget the object of a token that will not be sent."""
        self._parked.pop(token, None)

    def send_bytes(self, buf: Any, offset: int = 0, size: int | None = None) -> None:
        if self._parked:
            token = pickle.loads(buf)
            if type(token) is int and token in self._parked:
                obj = self._parked.pop(token)
                # buf views the caller's BytesIO: a failure's traceback keeps this stack frame, and
                # a BytesIO still viewed when cyclic garbage finalizes it raises BufferError
                del buf
                try:
                    message = self._encode(obj)
                except Exception as exc:
                    raise _Unpicklable(obj) from exc
                self._transmit(message)
                return
        super().send_bytes(buf, offset, size)

    def recv_bytes(self, maxlength: int | None = None) -> bytes:
        first = super().recv_bytes(maxlength)
        if not first.startswith(MAGIC):
            return first
        _passing.received = self._decode(first)
        return _RECEIVED

    def recv(self) -> Any:
        return self._decode(super().recv_bytes())


def _queue_pipe(ctx: Any) -> tuple[_QueueConnection, _QueueConnection]:
    if isinstance(ctx, BlpickleContext):
        return make_pipe(_QueueConnection, False, ctx.wire_options, ctx.main_by_value)
    return make_pipe(_QueueConnection, False, None, False)


class _TokenPutter:
    """Puts tokens of objects in a standard ``Queue`` (or subclass), and reports an object
    that could not be pickled to its feeder-error hook as itself."""

    def put(self, obj: Any, block: bool = True, timeout: float | None = None) -> None:
        writer = _host_internals.queue_writer(self)
        token = writer.park(obj)
        try:
            super().put(token, block, timeout)  # type: ignore[misc]
        except BaseException:
            writer.unpark(token)
            raise

    def _on_queue_feeder_error(self, e: Exception, obj: Any) -> None:
        if isinstance(e, _Unpicklable) and isinstance(e.__cause__, Exception):
            super()._on_queue_feeder_error(e.__cause__, e.obj)  # type: ignore[misc]
        else:
            super()._on_queue_feeder_error(e, obj)  # type: ignore[misc]


class Queue(_TokenPutter, _queues.Queue):
    """``multiprocessing.Queue`` with blpickle transfers; build it with ``ctx.Queue()``."""

    def __init__(self, maxsize: int = 0, *, ctx: Any) -> None:
        super().__init__(maxsize, ctx=ctx)
        _host_internals.replace_queue_pipe(self, *_queue_pipe(ctx))


class JoinableQueue(_TokenPutter, _queues.JoinableQueue):
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


class _CallQueue(_TokenPutter, _host_internals.CallQueue):
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
        state["_blpickle_call"] = bytes(transport.cloudpickle_in_band(call, dispatch_tables()))
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
