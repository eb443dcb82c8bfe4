"""A ``"blpickle"`` serialization family for dask.distributed.

`register` registers the family in this process (importing this module registers
nothing). Workers need it too: register `WorkerPlugin` (it registers the family on every
worker, now and later) before sending data:

```python
from blpickle.integrations import dask as bldask
bldask.register()
client = Client(
    cluster,
    serializers=bldask.SERIALIZERS,
    deserializers=bldask.DESERIALIZERS,
)
client.register_plugin(bldask.WorkerPlugin())
```

Data wrapped for serialization then travels as blpickle frames: what the client scatters, what
it gathers (workers answer with the client's ``deserializers``) and, with the plugin's default
``peers=True``, what workers fetch from each other. Task graphs themselves are pickled by
dask (``ToPickle``), as before.

An object becomes ``[graph, frames of buffer 0, frames of buffer 1, ...]``: ``graph`` is a
protocol-5 pickle (by the C pickler, or cloudpickle where it cannot and for what names
``__main__``, as dask's own pickle family does); a buffer is one zero-copy frame (a
memoryview of the array) when a sample shows it does not compress, else one frame per
compressed Blosc2 chunk. The header lists the buffers' sizes and chunk sizes and marks every
buffer frame ``compression=False``: dask neither compresses them again nor splits them into
shards. dask's TCP comm then reads each raw buffer into (aligned) memory of its own, which the
array is rebuilt around without a copy; a buffer split into shards read into separate pieces
would have to be copied back together, and one read into the same memory as the headers could
be misaligned. Compressed chunks are decompressed in threads straight into the arrays.
"""

from __future__ import annotations

import copyreg
from typing import Any

from distributed.diagnostics.plugin import WorkerPlugin as _WorkerPlugin
from distributed.protocol.serialize import register_serialization_family

from ..errors import CorruptError
from . import transport
from .transport import WireOptions, wire_options

__all__ = [
    "DESERIALIZERS",
    "FAMILY",
    "SERIALIZERS",
    "WorkerPlugin",
    "configure",
    "deserialize",
    "register",
    "serialize",
]

FAMILY = "blpickle"
SERIALIZERS = [FAMILY, "dask", "pickle", "msgpack"]
"""``Client(serializers=...)``: blpickle first, dask's families after it."""
DESERIALIZERS = [*SERIALIZERS, "error"]
"""``Client(deserializers=...)``; workers answer with this list, so blpickle comes first."""

_VERSION = 1
#: Networks are slower than pipes: compress from a smaller gain than between local processes
#: (dask's own ``maybe_compress`` wants 0.7 of the size, a ratio of 1.43).
DASK_DEFAULTS = WireOptions(min_size=64 << 10, min_ratio=1.4)

_WIRE = DASK_DEFAULTS


def configure(preset: Any = None, **options: Any) -> WireOptions:
    """Set how this process serializes (``codec=``, ``clevel=``, ..., ``compress=``,
    ``min_size=``, ``min_ratio=``); give the same to `WorkerPlugin` for workers."""
    global _WIRE
    _WIRE = wire_options(preset, defaults=DASK_DEFAULTS, **options)
    return _WIRE


def serialize(obj: Any, context: dict | None = None) -> tuple[dict, list]:
    """The family's ``dumps``: ``(header, frames)``.

    Raises:
        NotImplementedError: when the object cannot be pickled, so that dask tries the next
            family (whose error it reports if none can).
    """
    wire = _WIRE
    try:
        graph, buffers = transport.pickle_graph(obj, wire, (copyreg.dispatch_table,), main_by_value=True)
    except Exception as exc:
        raise NotImplementedError(f"blpickle cannot pickle {type(obj).__name__}: {exc}") from exc
    transfers = transport.plan_buffers(buffers, wire)
    # The graph is not in a ``bytes`` object: dask's TCP comm reads whatever follows the first
    # frame outside one into separate memory (aligned), and the raw buffers come after it.
    frames: list[Any] = [memoryview(bytearray(graph))]
    compression: list[Any] = [None]
    for transfer in transfers:
        if not transfer.chunk_size:
            frames.append(transfer.payload.whole())
            compression.append(False)
            continue
        chunks = list(transport.compressed_chunks(transfer, wire.options.threads))
        frames.extend(chunks)
        compression.extend([False] * len(chunks))
    header = {"blpickle": [_VERSION, transport.layout(transfers)], "compression": tuple(compression)}
    return header, frames


def deserialize(header: dict, frames: list) -> Any:
    """The family's ``loads``.

    Raises:
        blpickle.CorruptError: for a header that does not match the frames.
    """
    try:
        version, layout = header["blpickle"]
        layout = [(int(nbytes), int(chunk_size)) for nbytes, chunk_size in layout]
    except (KeyError, TypeError, ValueError):
        raise CorruptError("a dask message without a valid blpickle header") from None
    if version != _VERSION:
        raise CorruptError(
            f"a dask message of blpickle transfer version {version}; this blpickle reads version {_VERSION}"
        )
    if not frames:
        raise CorruptError("a dask message without frames")
    received = transport.ReceivedParts(frames[1:], "a dask message")
    return transport.unpickle_graph(frames[0], transport.receive_buffers(layout, received, _WIRE.options.threads))


def register() -> None:
    """Register the ``"blpickle"`` serialization family with dask.distributed in this process.

    Idempotent.
    """
    register_serialization_family(FAMILY, serialize, deserialize)


class WorkerPlugin(_WorkerPlugin):
    """Registers the ``"blpickle"`` family on every worker and applies the options.

    Args:
        preset: as `configure`.
        peers: also use blpickle for data workers fetch from each other.
        **options: as `configure`.
    """

    name = "blpickle"

    def __init__(self, preset: Any = None, *, peers: bool = True, **options: Any) -> None:
        self.wire = wire_options(preset, defaults=DASK_DEFAULTS, **options)
        self.peers = peers

    def setup(self, worker: Any) -> None:
        global _WIRE
        register()
        _WIRE = self.wire
        if self.peers:
            _use_for_peers(worker)


def _use_for_peers(worker: Any) -> None:
    """Make ``worker`` fetch data from other workers with blpickle."""
    worker.rpc.serializers = list(SERIALIZERS)
    worker.rpc.deserializers = list(DESERIALIZERS)


def dask_setup(server: Any) -> None:
    """Run by ``dask worker --preload blpickle.integrations.dask``: registers the family; a
    worker also fetches data from its peers with it."""
    from distributed import Worker

    register()
    if isinstance(server, Worker):
        _use_for_peers(server)
