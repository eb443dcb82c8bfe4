"""The blpickle multiprocessing ``Connection``: how one object travels over a pipe.

An object with no big buffer is one standard message holding its pickle. Otherwise the first
message holds a head (magic, version, the number of buffers and each one's size and chunk
size) and the pickle; each buffer follows, raw, or as compressed chunks each preceded by its
size. See `blpickle.integrations.multiprocessing` for the contexts and queues built on it.
"""

from __future__ import annotations

import copyreg
import functools
import io
import os
import pickle
import socket
import struct
import sys
from multiprocessing import connection as _connection
from multiprocessing import reduction as _reduction
from typing import Any, TypeVar, cast

import numpy as np

from ..errors import CorruptError
from . import transport
from .transport import WireOptions

__all__ = ["DESC", "HEAD", "MAGIC", "Connection", "Message", "Pipe", "dispatch_tables", "make_pipe"]

MAGIC = b"\xb1BLW"
_VERSION = 2
HEAD = struct.Struct("<4sBBHI")  # magic, version, flags, reserved, number of buffers
DESC = struct.Struct("<QQ")  # nbytes, chunk size (0: raw)
_CHUNK = struct.Struct("<Q")  # the size of a compressed chunk, before it
_IOV_MAX = 1024

ConnectionT = TypeVar("ConnectionT", bound="Connection")

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


def dispatch_tables() -> transport.Tables:
    """The reducers of a message: copyreg's (as they are now) and multiprocessing's."""
    return (copyreg.dispatch_table, _forking_reducers())


class Message:
    """An encoded object: the first message (a plain pickle, or head and pickle) and the
    planned out-of-band buffers."""

    __slots__ = ("first", "transfers")

    def __init__(self, first: Any, transfers: list[transport.Transfer]) -> None:
        self.first = first
        self.transfers = transfers


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


def _receive(fd: int, nbytes: int, what: str) -> np.ndarray:
    """Read ``nbytes`` from ``fd`` into a new array, allocated once its first ``transport.FIRST_READ``
    bytes (or all of them) have arrived: a size the peer announced allocates no more than 8
    MiB before its bytes come. (Past those, the array's pages fill as its bytes arrive.)

    Raises:
        LimitError: when the array cannot be allocated.
        OSError: when the pipe ends first.
    """
    first = np.empty(min(nbytes, transport.FIRST_READ), np.uint8)
    _read_exact(fd, memoryview(cast(Any, first)))
    if nbytes == first.size:
        return first
    out = transport.allocate(nbytes, what)
    out[: first.size] = first
    _read_exact(fd, memoryview(cast(Any, out))[first.size :])
    return out


class _PipeParts:
    """The `transport.MessageParts` that follow a message's first part on a pipe, read as needed:
    raw buffers straight into the memory of their arrays (see `_receive`)."""

    def __init__(self, fd: int) -> None:
        self._fd = fd

    def raw(self, nbytes: int) -> np.ndarray:
        return _receive(self._fd, nbytes, "a raw buffer")

    def chunk(self, limit: int) -> np.ndarray:
        prefix = bytearray(_CHUNK.size)
        _read_exact(self._fd, memoryview(prefix))
        (size,) = _CHUNK.unpack(prefix)
        if size > limit:
            raise CorruptError(f"a compressed chunk of {size} bytes, at most {limit} expected")
        return _receive(self._fd, size, "a compressed chunk")


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

    def _encode(self, obj: Any) -> Message:
        """Pickle ``obj`` and decide how each buffer travels; nothing is written yet, so a
        pickling error leaves the connection usable."""
        graph, buffers = transport.pickle_graph(obj, self._wire, dispatch_tables(), main_by_value=self._main_by_value)
        if not buffers:
            return Message(graph, [])
        transfers = transport.plan_buffers(buffers, self._wire)
        head = [HEAD.pack(MAGIC, _VERSION, 0, 0, len(transfers))]
        head.extend(DESC.pack(nbytes, chunk_size) for nbytes, chunk_size in transport.layout(transfers))
        return Message(b"".join([*head, graph]), transfers)

    def _transmit(self, message: Message) -> None:
        _connection.Connection.send_bytes(self, message.first)  # not a queue pipe's override
        if not message.transfers:
            return
        fd = self.fileno()
        for transfer in message.transfers:
            if not transfer.chunk_size:
                _write_all(fd, [transfer.payload.whole()])
                continue
            for packed in transport.compressed_chunks(transfer, self._wire.options.threads):
                _write_all(fd, [_CHUNK.pack(len(packed)), packed])

    def _decode(self, first: bytes) -> Any:
        """Return the object of a message whose first part is ``first``, receiving its
        buffers."""
        if not first.startswith(MAGIC):
            return pickle.loads(first)  # a plain pickle: no buffer follows
        if len(first) < HEAD.size:
            raise CorruptError(f"a blpickle message of {len(first)} bytes has no complete head")
        _magic, version, _flags, _reserved, count = HEAD.unpack_from(first)
        if version != _VERSION:
            raise CorruptError(
                f"a message of blpickle transfer version {version}; this blpickle reads version {_VERSION}"
            )
        graph_start = HEAD.size + count * DESC.size
        if graph_start > len(first):
            raise CorruptError(f"a message announces {count} buffers in {len(first)} bytes")
        layout = [DESC.unpack_from(first, HEAD.size + index * DESC.size) for index in range(count)]
        buffers = transport.receive_buffers(layout, _PipeParts(self.fileno()), self._wire.options.threads)
        return transport.unpickle_graph(memoryview(first)[graph_start:], buffers)

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
    return make_pipe(Connection, duplex, options, main_by_value)


def make_pipe(
    cls: type[ConnectionT], duplex: bool, options: WireOptions | None, main_by_value: bool
) -> tuple[ConnectionT, ConnectionT]:
    """Return the two ends of a new pipe (a socket pair when ``duplex``) as ``cls`` objects."""
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
