"""Moving objects between processes: shared by the multiprocessing, loky and dask integrations.

An object travels as a small protocol-5 pickle (the *graph*) plus its big buffers out of band.
Each buffer travels on its own, either raw (zero copy on the sending side) or as a sequence of
independently compressed Blosc2 chunks; which one is decided per buffer by compressing a small
sample (as dask's ``maybe_compress`` does), so incompressible data costs no compression time.
The transports (pipes, loky's byte strings, dask frames) only differ in how they carry the
graph, the buffer descriptors and the chunks: see `.multiprocessing`, `.loky` and
`.dask`.

Nothing here is part of the file format of `blpickle.format`: these messages are never
stored, only sent to a peer running the same version of blpickle.
"""

from __future__ import annotations

import dataclasses
import io
import math
import pickle
from collections.abc import Iterable, Iterator, Mapping
from pickle import PickleBuffer
from typing import Any

import blosc2
import cloudpickle
import numpy as np

from ..buffers import shuffle_typesize, spread_sample
from ..chunks import compress_chunk
from ..errors import CorruptError, OptionsError
from ..options import Options, resolve_options
from ..policy import choose_codec
from ..pool import map_ordered

__all__ = ["Buffer", "WireOptions", "pickle_graph", "unpickle_graph", "wire_options"]

KiB = 1 << 10
MiB = 1 << 20

#: The options of a transfer when none are given: a fast codec, chunks small enough to keep
#: both processes busy, and cloudpickle so that lambdas and ``__main__`` functions travel.
TRANSFER_DEFAULTS = Options(codec="lz4", clevel=5, chunk_size=4 * MiB, pickler="cloudpickle")

#: "auto" compression looks at this many pieces of the buffer ...
_SAMPLES = 4
#: ... of this many bytes each.
_SAMPLE_SIZE = 64 * KiB
#: Blosc2 adds at most this many bytes to a chunk.
_BLOSC2_MAX_OVERHEAD = 32
_COMPRESS_CHOICES = ("auto", True, False)


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
    changes = {
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


def _rebuild_array(buffer: Any, dtype: np.dtype, shape: tuple[int, ...], order: str) -> np.ndarray:
    """Rebuild an array sent by `_Collector` around ``buffer`` without copying it.

    The result is always writable, as with plain pickle: the receiving side owns the memory it
    received into, so a read-only view of it (an array that was read-only when sent) is
    replaced by the writable memory underneath; anything else read-only is copied.
    """
    data = _writable(buffer)
    count = math.prod(shape)
    if memoryview(data).nbytes != count * dtype.itemsize:
        raise CorruptError(
            f"an array of shape {shape} and dtype {dtype} received a buffer of {memoryview(data).nbytes} bytes"
        )
    return np.frombuffer(data, dtype=dtype, count=count).reshape(shape, order=order)


def _writable(buffer: Any) -> Any:
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


class Buffer:
    """One out-of-band buffer of a message and how it travels.

    Attributes:
        view: its bytes (a contiguous ``"B"`` memoryview, not copied).
        typesize: the element size for the shuffle filter.
        chunk_size: bytes per compressed chunk, or 0 to send it raw.
        codec: the Blosc2 codec its chunks are compressed with.
    """

    __slots__ = ("chunk_size", "codec", "typesize", "view")

    def __init__(self, view: memoryview, typesize: int, chunk_size: int = 0) -> None:
        self.view = view
        self.typesize = typesize
        self.chunk_size = chunk_size
        self.codec: str | None = None

    @property
    def nbytes(self) -> int:
        return self.view.nbytes

    @property
    def nchunks(self) -> int:
        return -(-self.nbytes // self.chunk_size) if self.chunk_size else 1


class _Collector:
    """Reduces numpy arrays out of band and collects the buffers of one pickling."""

    def __init__(self, wire: WireOptions) -> None:
        self.buffers: list[Buffer] = []
        self._inband_size = wire.inband_size
        self._typesizes: dict[int, tuple[PickleBuffer, int]] = {}

    def reduce_array(self, array: np.ndarray) -> Any:
        """Out of band as raw bytes whatever the dtype (numpy refuses a buffer for datetimes),
        contiguous whatever the strides (numpy would copy strided views in band)."""
        if type(array) is not np.ndarray:
            array = array.view(np.ndarray)  # np.memmap and friends arrive as plain arrays
        if array.dtype.hasobject or array.size == 0 or array.dtype.itemsize == 0:
            return array.__reduce_ex__(5)
        if not (array.flags.c_contiguous or array.flags.f_contiguous):
            array = np.ascontiguousarray(array)
        order = "F" if array.flags.f_contiguous and not array.flags.c_contiguous else "C"
        buffer = PickleBuffer(array.reshape(-1, order="A").view(np.uint8))
        self._typesizes[id(buffer)] = (buffer, shuffle_typesize(array.itemsize, array.dtype))
        return _rebuild_array, (buffer, array.dtype, array.shape, order)

    def take(self, buffer: PickleBuffer) -> bool:
        """The pickler's ``buffer_callback``: True keeps a (small) buffer in band."""
        known = self._typesizes.pop(id(buffer), None)
        try:
            view = buffer.raw()
        except BufferError:  # not contiguous: let pickle copy it in band
            return True
        if view.nbytes < self._inband_size:
            return True
        typesize = known[1] if known is not None else shuffle_typesize(memoryview(buffer).itemsize)
        self.buffers.append(Buffer(view, typesize))
        return False


class _CloudGraphPickler(cloudpickle.Pickler):
    def __init__(self, file: Any, table: Mapping, callback: Any) -> None:
        self.dispatch_table = table  # before the C pickler reads it in __init__
        super().__init__(file, protocol=5, buffer_callback=callback)


class _PlainGraphPickler(pickle.Pickler):
    def __init__(self, file: Any, table: Mapping, callback: Any) -> None:
        self.dispatch_table = table
        super().__init__(file, protocol=5, buffer_callback=callback)


def base_dispatch_table(kind: str) -> dict:
    """The reducers of ``"pickle"`` (copyreg's) or ``"cloudpickle"``, as a fresh dict."""
    if kind == "cloudpickle":
        return dict(cloudpickle.Pickler.dispatch_table)
    import copyreg

    return dict(copyreg.dispatch_table)


def pickle_graph(
    obj: Any, wire: WireOptions, extra_reducers: Mapping | None = None, out_of_band: bool = True
) -> tuple[memoryview, list[Buffer]]:
    """Pickle ``obj`` at protocol 5: return the pickle and the out-of-band buffers.

    ``extra_reducers`` are added to the dispatch table (multiprocessing's for connections and
    sockets, for instance). With ``out_of_band=False`` every buffer is copied in band.

    Raises:
        pickle.PicklingError (or whatever the object's reducers raise).
    """
    collector = _Collector(wire)
    table = base_dispatch_table(wire.options.pickler)
    if extra_reducers:
        table.update(extra_reducers)
    table[np.ndarray] = table[np.memmap] = collector.reduce_array
    graph = io.BytesIO()
    cls = _CloudGraphPickler if wire.options.pickler == "cloudpickle" else _PlainGraphPickler
    cls(graph, table, collector.take if out_of_band else None).dump(obj)
    return graph.getbuffer(), collector.buffers


def unpickle_graph(graph: Any, buffers: Iterable[Any]) -> Any:
    """Load a pickle made by `pickle_graph` with its received buffers."""
    return pickle.loads(graph, buffers=buffers)


# --- compression -----------------------------------------------------------------------------


def plan(buffers: list[Buffer], wire: WireOptions) -> None:
    """Decide, per buffer, whether it travels raw or compressed, and with which codec (sets
    ``chunk_size`` and ``codec``)."""
    if not wire.compresses:
        return
    for buffer in buffers:
        if buffer.nbytes < max(wire.min_size, 1):
            continue
        sample = spread_sample(buffer.view, _SAMPLES * _SAMPLE_SIZE, buffer.typesize, _SAMPLES)
        codec = choose_codec(wire.options, sample, buffer.typesize)
        if wire.compress == "auto":
            packed = compress_chunk(sample, wire.options.blosc2_cparams(buffer.typesize, codec))
            if len(packed) * wire.min_ratio > memoryview(sample).nbytes:
                continue  # compression does not pay: send it raw
        buffer.codec = codec
        buffer.chunk_size = wire.options.chunk_size_for(buffer.nbytes, buffer.typesize)


def compressed_chunks(buffer: Buffer, options: Options) -> Iterator[bytes]:
    """Yield the compressed chunks of a planned buffer in order, compressing ahead in threads."""
    cparams = options.blosc2_cparams(buffer.typesize, buffer.codec)
    view, size = buffer.view, buffer.chunk_size
    pieces = (view[start : start + size] for start in range(0, view.nbytes, size))

    def compress(piece: memoryview) -> bytes:
        return compress_chunk(piece, cparams)

    yield from map_ordered(compress, pieces, buffer.nchunks, options.threads)


def chunk_spans(nbytes: int, chunk_size: int) -> list[tuple[int, int]]:
    """``(start, stop)`` of each chunk of a buffer of ``nbytes`` cut in ``chunk_size`` pieces."""
    return [(start, min(start + chunk_size, nbytes)) for start in range(0, nbytes, chunk_size)]


def check_layout(nbytes: int, chunk_size: int) -> None:
    """Refuse descriptors that cannot come from `plan` (the peer is trusted, but a bug
    should not become a huge allocation or a Blosc2 overflow).

    Raises:
        CorruptError.
    """
    if not 0 <= nbytes < 1 << 62 or not 0 <= chunk_size <= 1 << 31:
        raise CorruptError(f"a buffer of {nbytes} bytes in chunks of {chunk_size} is not a valid transfer")


def decompress_into(out: np.ndarray, chunk_size: int, chunks: Iterable[Any], nthreads: int) -> None:
    """Decompress the chunks of one buffer (an iterable, possibly reading them as it goes)
    straight into ``out``, several at a time.

    Raises:
        CorruptError: when a chunk does not hold the bytes its slot expects.
    """
    spans = chunk_spans(out.nbytes, chunk_size)
    view = memoryview(out).cast("B")
    jobs = ((packed, view[start:stop]) for packed, (start, stop) in zip(chunks, spans, strict=True))
    for _ in map_ordered(_unpack, jobs, len(spans), nthreads):
        pass


def _unpack(job: tuple[Any, memoryview]) -> None:
    packed, dst = job
    nbytes, cbytes, _ = blosc2.get_cbuffer_sizes(packed)
    if nbytes != dst.nbytes or cbytes != memoryview(packed).nbytes:
        raise CorruptError(
            f"a chunk holds {nbytes} bytes in {cbytes}, expected {dst.nbytes} in {memoryview(packed).nbytes}"
        )
    blosc2.decompress2(packed, dst=dst, nthreads=1)


def max_chunk_frame(chunk_size: int) -> int:
    """The largest compressed chunk a chunk of ``chunk_size`` bytes can become."""
    return chunk_size + _BLOSC2_MAX_OVERHEAD
