"""Moving objects between processes: shared by the multiprocessing, loky and dask integrations.

An object travels as a protocol-5 pickle (the *graph*) plus its big buffers out of band. The
graph is written by the C pickler with the host's reducers; what it cannot pickle (lambdas,
closures, local classes) is pickled again by cloudpickle. An object with no out-of-band
buffer is just that pickle: it costs what the host's own pickling costs. Each out-of-band
buffer travels raw (zero copy on the sending side) or as independently compressed Blosc2
chunks, as `blpickle.engine.policy.plan_transfer` decides; `blpickle.engine.chunks` compresses and
decompresses them. The transports (pipes, loky's byte strings, dask's frames) only differ in how
they carry the graph, the buffer layout and the parts: see `.multiprocessing`, `.loky` and
`.dask`; all of them receive with `receive_buffers`.

Nothing here is part of the file format of `blpickle.format`: these messages are never
stored, only sent to a peer running the same version of blpickle.
"""

from __future__ import annotations

import copyreg
import dataclasses
import functools
import io
import pickle
import re
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pickle import PickleBuffer
from typing import Any, NamedTuple, Protocol, cast

import cloudpickle
import numpy as np

from ..arrays import reduce_ndarray
from ..engine.buffers import Payload, shuffle_typesize
from ..engine.chunks import compress_chunks, decompress_chunks
from ..engine.policy import ChunkPlan, plan_raw, plan_transfer
from ..errors import CorruptError, LimitError, OptionsError
from ..options import Options, resolve_options

__all__ = [
    "ReceivedParts",
    "Transfer",
    "WireOptions",
    "pickle_graph",
    "plan_buffers",
    "receive_buffers",
    "unpickle_graph",
    "wire_options",
]

KiB = 1 << 10
MiB = 1 << 20

#: The options of a transfer when none are given: a fast codec, chunks small enough to keep
#: both processes busy, and cloudpickle for what the C pickler cannot pickle (lambdas...).
TRANSFER_DEFAULTS = Options(codec="lz4", clevel=5, chunk_size=4 * MiB, pickler="cloudpickle")

#: Blosc2 adds at most this many bytes to a chunk.
_BLOSC2_MAX_OVERHEAD = 32
_COMPRESS_CHOICES = ("auto", True, False)
#: What a pickle that refers to ``__main__`` holds (searched without copying the pickle).
_MAIN = re.compile(re.escape(b"__main__"))
#: The largest buffer and chunk a peer may announce.
_MAX_NBYTES = 1 << 62
_MAX_CHUNK_SIZE = 1 << 31
#: Receiving decompresses ahead at most this many bytes (but one chunk, whatever its size).
READ_AHEAD = 64 << 20
#: Bytes of a raw buffer or chunk a peer announces that are read before its whole size is
#: allocated: a message cannot make the receiver allocate more than it sent plus this.
FIRST_READ = 8 << 20


@dataclasses.dataclass(frozen=True)
class WireOptions:
    """How objects travel to another process.

    Attributes:
        options: the `blpickle.Options` used for the pickler and for Blosc2 (``codec``,
            ``clevel``, ``shuffle``, ``bytedelta``, ``chunk_size``, ``nthreads``, ``pickler``).
        compress: ``"auto"`` compresses a buffer when a sample of it shrinks by ``min_ratio``;
            ``True`` compresses every buffer of ``min_size`` bytes or more, ``False`` none.
        min_size: buffers smaller than this are never compressed.
        min_ratio: the sample compression ratio from which "auto" compresses.
        inband_size: buffers smaller than this travel inside the pickle (a separate message
            costs more than the copy).
    """

    options: Options = TRANSFER_DEFAULTS
    compress: Any = "auto"
    min_size: int = 512 * KiB
    min_ratio: float = 2.0
    inband_size: int = 64 * KiB

    def __post_init__(self) -> None:
        if not isinstance(self.options, Options):
            raise OptionsError(f"options must be a blpickle.Options, not {type(self.options).__name__}")
        if self.compress not in _COMPRESS_CHOICES or (
            isinstance(self.compress, int) and not isinstance(self.compress, bool)
        ):
            raise OptionsError(f"compress must be 'auto', True or False, not {self.compress!r}")
        for name in ("min_size", "inband_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise OptionsError(f"{name} must be a non-negative integer, not {value!r}")
        if isinstance(self.min_ratio, bool) or not isinstance(self.min_ratio, (int, float)) or not self.min_ratio >= 1:
            raise OptionsError(f"min_ratio must be a number >= 1, not {self.min_ratio!r}")

    @property
    def compresses(self) -> bool:
        """Whether any buffer may be compressed."""
        return self.options.codec is not None and self.compress is not False


def wire_options(
    preset: str | Options | WireOptions | None = None,
    *,
    compress: Any = None,
    min_size: int | None = None,
    min_ratio: float | None = None,
    inband_size: int | None = None,
    defaults: WireOptions | None = None,
    **options: Any,
) -> WireOptions:
    """Build `WireOptions` from a preset and keyword options.

    ``preset`` is a `blpickle.PRESETS` name, an `blpickle.Options` or a
    `WireOptions`; ``options`` are `blpickle.Options` fields. Without a preset the
    transfer defaults apply (``codec="lz4", clevel=5, chunk_size=4 MiB``); ``pickler`` is
    ``"cloudpickle"`` unless given.

    Raises:
        blpickle.OptionsError: for an unknown option or an invalid value.
    """
    base = defaults or WireOptions()
    if isinstance(preset, WireOptions):
        base, preset = preset, None
        blosc = base.options.replace(**options) if options else base.options
    elif preset is None:
        blosc = base.options.replace(**options) if options else base.options
    else:
        blosc = resolve_options(preset, **{"pickler": "cloudpickle", **options})
    changes: dict[str, Any] = {
        key: value
        for key, value in (
            ("compress", compress),
            ("min_size", min_size),
            ("min_ratio", min_ratio),
            ("inband_size", inband_size),
        )
        if value is not None
    }
    return dataclasses.replace(base, options=blosc, **changes)


# --- pickling --------------------------------------------------------------------------------


class Transfer(NamedTuple):
    """One out-of-band buffer of a message, and how it travels.

    Attributes:
        payload: its bytes, contiguous (the `Payload` a record stores an out-of-band buffer as).
        plan: raw or compressed, in which chunks (`plan_buffers`).
    """

    payload: Payload
    plan: ChunkPlan

    @property
    def nbytes(self) -> int:
        return self.payload.nbytes

    @property
    def chunk_size(self) -> int:
        """Bytes per compressed chunk, or 0 when it travels raw."""
        return 0 if self.plan.raw else self.plan.chunk_size


class _MessageBuffers:
    """Reduces the numpy arrays of one pickling for another process and collects the
    out-of-band buffers of its message, each a contiguous `Payload`.

    Unlike a record's buffers (the pickler's ``_OutOfBand``), these are never stored: every
    array arrives writable, as pickle gives arrays back; a strided view is copied here into a
    contiguous array (no view of another array is kept); buffers under ``inband_size`` bytes
    stay in band; no name, alias or tensor type is kept for a header."""

    __slots__ = ("_inband_size", "_out_of_band", "_readonly", "buffers")

    def __init__(self, inband_size: int, out_of_band: bool = True) -> None:
        self._out_of_band = out_of_band
        self.reset(inband_size)

    def reset(self, inband_size: int) -> None:
        """Start a new pickling, keeping buffers under ``inband_size`` bytes in band."""
        self.buffers: list[Payload] = []
        self._inband_size = inband_size
        self._readonly: dict[int, tuple[PickleBuffer, Payload]] = {}  # placeholder id -> its array's bytes

    def reduce_array(self, array: np.ndarray) -> Any:
        """The dispatch-table reducer of numpy arrays: `blpickle.arrays.reduce_ndarray` around
        a `PickleBuffer` of the array's bytes, whatever the dtype (numpy refuses a buffer for
        datetimes) and the strides (strided views are copied once, here, not by pickle).

        The buffer's item size is the typesize its compression uses. A read-only array is
        represented by an empty writable placeholder and always goes out of band (or, when
        nothing goes out of band, is copied in band), so that it arrives writable, as arrays
        pickled by the standard library do."""
        if type(array) is not np.ndarray:
            array = array.view(np.ndarray)  # np.memmap and friends arrive as plain arrays
        dtype = array.dtype
        if dtype.hasobject or array.size == 0 or dtype.itemsize == 0:
            return array.__reduce_ex__(5)
        if not (array.flags.c_contiguous or array.flags.f_contiguous):
            array = np.ascontiguousarray(array)
        typesize = shuffle_typesize(dtype.itemsize, dtype)
        flat = array.reshape(-1, order="A").view(np.uint8)
        if flat.flags.writeable:
            return reduce_ndarray(array, PickleBuffer(cast(Any, flat.view(np.dtype((np.void, typesize))))))
        if not self._out_of_band:
            return reduce_ndarray(array, bytearray(cast(Any, flat)))
        placeholder = PickleBuffer(bytearray())
        self._readonly[id(placeholder)] = (placeholder, Payload.from_array(array))
        return reduce_ndarray(array, placeholder)

    def take(self, buffer: PickleBuffer) -> bool:
        """The pickler's ``buffer_callback``: return True to keep ``buffer`` in band (a small one)."""
        readonly = self._readonly.pop(id(buffer), None)
        if readonly is not None:
            self.buffers.append(readonly[1])
            return False
        try:
            view = buffer.raw()
        except BufferError:  # not contiguous: let pickle copy it in band
            return True
        if view.nbytes < self._inband_size:
            return True
        self.buffers.append(Payload.from_picklebuffer(buffer))
        return False


@functools.cache
def _cloudpickle_reducers() -> dict:
    """cloudpickle's own reducers (its dispatch table without copyreg's, which hosts' tables
    hold), as a dict: fast to merge."""
    return {
        cls: reducer
        for cls, reducer in cloudpickle.Pickler.dispatch_table.items()
        if copyreg.dispatch_table.get(cls) is not reducer
    }


class _CloudGraphPickler(cloudpickle.Pickler):
    """cloudpickle for what the C pickler cannot pickle, with the same reducers."""

    def __init__(self, file: Any, table: dict[Any, Any], buffer_callback: Any) -> None:
        self.dispatch_table = table  # read by __init__
        super().__init__(file, protocol=5, buffer_callback=buffer_callback)


#: A reducer of numpy arrays, as a dispatch table holds it.
ArrayReducer = Callable[[np.ndarray], Any]
#: A host's reducers: dispatch tables merged in order (a later one's reducer wins), once per
#: pickling, so that each is read as it is then (copyreg's first, as a rule).
Tables = tuple[Mapping[Any, Any], ...]


def pickle_graph(
    obj: Any,
    wire: WireOptions,
    tables: Tables,
    *,
    main_by_value: bool = False,
    wrap_arrays: Callable[[ArrayReducer], ArrayReducer] | None = None,
) -> tuple[memoryview, list[Payload]]:
    """Pickle ``obj`` at protocol 5: return the pickle and its out-of-band buffers.

    ``tables`` are the host's reducers (numpy arrays are added). The C pickler runs
    first; with ``pickler="cloudpickle"`` cloudpickle pickles again what it cannot pickle,
    and, with ``main_by_value``, what it pickled mentioning ``__main__`` (as dask does), so
    that functions and classes of ``__main__`` travel by value to a process that does not
    have them. ``wrap_arrays``, if given, makes the array reducer of the table from this
    module's (to leave some arrays to a reducer of the host's).

    Raises:
        pickle.PicklingError (or whatever the object's reducers raise).
    """
    idle = _IDLE.__dict__
    kept = idle.pop("pickler", None) or _KeptPickler()  # taken while in use: a nested call makes its own
    arrays = kept.arrays
    arrays.reset(wire.inband_size)
    kept.pickler.dispatch_table = _with_arrays(tables, arrays.reduce_array, wrap_arrays)
    try:
        kept.pickler.dump(obj)
    except Exception:  # the pickler is not kept
        if wire.options.pickler != "cloudpickle":
            raise
    else:
        graph, buffers = memoryview(kept.written()), arrays.buffers
        arrays.reset(0)  # the kept pickler holds on to nothing of this object
        idle["pickler"] = kept
        if not (main_by_value and _MAIN.search(graph)):
            return graph, buffers
    return _cloudpickle(obj, wire.inband_size, tables, True, wrap_arrays)


class _KeptPickler:
    """A thread's C pickler for `pickle_graph`, kept from one pickling to the next (making one
    costs a third of a small task's pickling), writing to a `_Pieces`. Nothing refers back to
    it: one dropped after a failed pickling is freed at once, with what it held."""

    __slots__ = ("arrays", "pickler", "pieces")

    def __init__(self) -> None:
        self.pieces = _Pieces()
        self.arrays = _MessageBuffers(0)
        self.pickler = pickle.Pickler(self.pieces, 5, buffer_callback=self.arrays.take)

    def written(self) -> bytes:
        """Return the last pickling's bytes, and forget them and its memo."""
        self.pickler.clear_memo()
        return self.pieces.take()


class _Pieces:
    """A pickler's file that keeps what is written to it."""

    __slots__ = ("_parts",)

    def __init__(self) -> None:
        self._parts: list[bytes] = []

    def write(self, data: Any) -> None:
        """Keep ``data``: as it is if ``bytes`` (the pickler hands over its own buffers), else
        a copy (a large payload is handed over as the object itself, which may change)."""
        self._parts.append(data if type(data) is bytes else bytes(data))

    def take(self) -> bytes:
        """Return what was written, and forget it."""
        parts, self._parts = self._parts, []
        return parts[0] if len(parts) == 1 else b"".join(parts)


#: Each thread's idle `_KeptPickler`.
_IDLE = threading.local()


def cloudpickle_in_band(obj: Any, tables: Tables) -> memoryview:
    """Pickle ``obj`` with cloudpickle and ``tables``, every buffer in band (objects whose
    reducers must run once, such as a process's arguments that hold connections)."""
    return _cloudpickle(obj, 0, tables, False, None)[0]


def _with_arrays(tables: Tables, reducer: ArrayReducer, wrap: Callable[[ArrayReducer], ArrayReducer] | None) -> dict:
    """Return the dispatch table of one pickling: ``tables`` merged (one pass over each: a
    host's table may hold hundreds of reducers, as copyreg's does once distributed is
    imported), with ``reducer`` (wrapped by ``wrap``) for numpy arrays."""
    if wrap is not None:
        reducer = wrap(reducer)
    merged: dict[Any, Any] = {}
    for table in tables:
        merged.update(table)
    merged[np.ndarray] = merged[np.memmap] = reducer
    return merged


def _cloudpickle(
    obj: Any,
    inband_size: int,
    tables: Tables,
    out_of_band: bool,
    wrap_arrays: Callable[[ArrayReducer], ArrayReducer] | None,
) -> tuple[memoryview, list[Payload]]:
    arrays = _MessageBuffers(inband_size, out_of_band)
    file = io.BytesIO()
    callback = arrays.take if out_of_band else None
    table = _with_arrays((_cloudpickle_reducers(), *tables), arrays.reduce_array, wrap_arrays)
    _CloudGraphPickler(file, table, callback).dump(obj)
    return file.getbuffer(), arrays.buffers


def unpickle_graph(graph: Any, buffers: Iterable[Any]) -> Any:
    """Load a pickle made by `pickle_graph` with its received buffers."""
    return pickle.loads(graph, buffers=buffers)


# --- sending ---------------------------------------------------------------------------------


def plan_buffers(buffers: Sequence[Payload], wire: WireOptions) -> list[Transfer]:
    """Return how each buffer travels: raw or compressed (`blpickle.engine.policy.plan_transfer`)."""
    if not wire.compresses:
        return [Transfer(buffer, plan_raw(buffer.nbytes, buffer.itemsize)) for buffer in buffers]
    return [
        Transfer(
            buffer,
            plan_transfer(wire.options, buffer.whole(), buffer.itemsize, wire.compress, wire.min_size, wire.min_ratio),
        )
        for buffer in buffers
    ]


def layout(transfers: Sequence[Transfer]) -> list[tuple[int, int]]:
    """``(nbytes, chunk_size)`` of each buffer: what the receiver needs to know of them."""
    return [(transfer.nbytes, transfer.chunk_size) for transfer in transfers]


def compressed_chunks(transfer: Transfer, nthreads: int) -> Iterator[bytes]:
    """Yield the compressed chunks of a buffer planned compressed in order, compressing ahead
    in threads."""
    payload, plan = transfer
    return compress_chunks(payload.chunks(plan.chunk_size), plan.cparams, plan.nchunks(payload.nbytes), nthreads)


# --- receiving -------------------------------------------------------------------------------


class MessageParts(Protocol):
    """Where `receive_buffers` takes the parts of a message from, in order."""

    def raw(self, nbytes: int) -> Any:
        """Return the next part, a raw buffer of ``nbytes`` bytes, writable.

        Raises:
            CorruptError: when it has another size or is missing.
        """

    def chunk(self, limit: int) -> Any:
        """Return the next part, a compressed chunk of at most ``limit`` bytes.

        Raises:
            CorruptError: when it is bigger or missing.
        """


def check_layout(nbytes: int, chunk_size: int) -> None:
    """Refuse a buffer layout no sender writes (the peer is trusted, but a bug should not
    become a huge allocation or a Blosc2 overflow).

    Raises:
        CorruptError.
    """
    if not 0 <= nbytes < _MAX_NBYTES or not 0 <= chunk_size <= _MAX_CHUNK_SIZE:
        raise CorruptError(f"a buffer of {nbytes} bytes in chunks of {chunk_size} is not a valid transfer")


def max_compressed_size(chunk_size: int) -> int:
    """The largest compressed chunk a chunk of ``chunk_size`` bytes can become."""
    return chunk_size + _BLOSC2_MAX_OVERHEAD


def allocate(nbytes: int, what: str) -> np.ndarray:
    """Return a new uint8 array of ``nbytes`` for ``what``.

    Raises:
        LimitError: when it cannot be allocated (a size a peer announced).
    """
    try:
        return np.empty(nbytes, np.uint8)
    except MemoryError:
        raise LimitError(f"{what} announces {nbytes} bytes, more than can be allocated") from None


def receive_buffers(layout: Iterable[tuple[int, int]], parts: MessageParts, nthreads: int) -> list[Any]:
    """Receive the out-of-band buffers of a message, laid out as `layout` says: a raw one
    as its part, a compressed one decompressed into a new array, allocated once its first
    chunk has arrived, several chunks at once but no more than ``READ_AHEAD`` bytes of them
    (or one chunk) ahead (``parts`` may read them as they are needed).

    Raises:
        CorruptError: for an invalid layout, or a part that does not fit it.
        LimitError: for a buffer that cannot be allocated.
    """
    buffers = []
    for index, (nbytes, chunk_size) in enumerate(layout):
        check_layout(nbytes, chunk_size)
        if not chunk_size:
            buffers.append(parts.raw(nbytes))
            continue
        limit = max_compressed_size(chunk_size)
        starts = range(0, nbytes, chunk_size)
        first = parts.chunk(limit) if nbytes else None
        out = allocate(nbytes, f"buffer {index}")
        view = memoryview(cast(Any, out))
        jobs = (
            (
                first if number == 0 else parts.chunk(limit),
                view[start : start + chunk_size],
                f"chunk {number} of buffer {index}",
            )
            for number, start in enumerate(starts)
        )
        decompress_chunks(jobs, len(starts), max(1, min(nthreads, READ_AHEAD // chunk_size - 1)))
        buffers.append(out)
    return buffers


class ReceivedParts:
    """`MessageParts` already received, as a sequence (loky's envelope, dask's frames)."""

    def __init__(self, parts: Iterable[Any], what: str) -> None:
        self._parts = iter(parts)
        self._what = what

    def _next(self) -> Any:
        try:
            return next(self._parts)
        except StopIteration:
            raise CorruptError(f"{self._what} with fewer parts than its layout lists") from None

    def raw(self, nbytes: int) -> Any:
        part = self._next()
        size = memoryview(part).nbytes
        if size != nbytes:
            raise CorruptError(f"{self._what}: a raw buffer of {nbytes} bytes arrived as {size} bytes")
        return writable(part)

    def chunk(self, limit: int) -> Any:
        part = self._next()
        size = memoryview(part).nbytes
        if size > limit:
            raise CorruptError(f"{self._what}: a compressed chunk of {size} bytes, at most {limit} expected")
        return part


def writable(buffer: Any) -> Any:
    """Return ``buffer`` if it is writable, the writable memory it views (a received
    ``bytearray`` or array seen through a read-only view), or else a writable copy."""
    view = memoryview(buffer)
    if not view.readonly:
        return buffer
    owner = view.obj
    if (
        isinstance(owner, np.ndarray)
        and owner.flags.writeable
        and owner.flags.c_contiguous
        and owner.dtype == np.uint8
        and owner.nbytes == view.nbytes
    ) or (isinstance(owner, bytearray) and len(owner) == view.nbytes):
        return owner
    return bytearray(view)
