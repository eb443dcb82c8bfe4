"""How every buffer is compressed: codec, level, filters, element size, block and chunk size.

The one module that decides it, for every kind of buffer blpickle writes: the out-of-band
buffers of a record (`plan_buffer`), its pickle stream (`plan_graph` as it is written,
`plan_pickle` once it is whole; a small one is stored raw), the chunks of the
joblib ``"blosc"`` stream (`pick_filters`), and buffers sent to another process, which
travel raw when compressing them does not pay (`plan_transfer`). Each answer is a
`ChunkPlan`; `blpickle.engine.chunks` carries it out.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import blosc2

from .buffers import spread_sample
from .chunks import compress_chunk

if TYPE_CHECKING:
    from ..options import Options

__all__ = [
    "COMPACT_GRAPH_LIMIT",
    "COMPACT_LIMIT",
    "ChunkPlan",
    "blosc2_cparams",
    "choose_codec",
    "chunk_size_for",
    "fits_compact",
    "pick_filters",
    "plan_buffer",
    "plan_graph",
    "plan_pickle",
    "plan_raw",
    "plan_stream_chunk",
    "plan_transfer",
    "stays_raw",
]

#: The smallest chunks data is cut into to share it among threads.
PARALLEL_CHUNK_SIZE = 1 << 20
#: zstd's ratio grows with Blosc2's block size for a few percent of speed: zstd gets blocks of
#: this size, other codecs keep Blosc2's automatic size.
ZSTD_BLOCKSIZE = 1 << 20
#: With codec "auto", zstd is chosen where a sample shows it storing at most this fraction of
#: what lz4 stores, ...
AUTO_ZSTD_GAIN = 2 / 3
#: ... or saving at least this fraction of the sample's raw bytes over lz4: data whose bytes
#: repeat little but are unevenly spread, which zstd's entropy coder shrinks and lz4 does not
#: (float weights: about 10% of fp32 and 20% of bf16 data; docs/guide.md). Elsewhere (noisy
#: data: 3-4% on the float64 arrays of the benchmark's study) lz4, which decompresses about
#: twice as fast.
AUTO_ZSTD_SAVING = 0.08
#: Samples smaller than this choose zstd without compressing anything.
AUTO_MIN_SAMPLE = 64 << 10
#: Bytes of each record buffer compressed twice to choose its codec, with codec "auto": at
#: most this, and at most an eighth of the buffer (whose compression the sampling must not
#: rival).
RECORD_SAMPLE_SIZE = 192 << 10
RECORD_SAMPLE_FRACTION = 8
#: With codec "auto", a record buffer this small (its sample under `AUTO_MIN_SAMPLE`) is
#: stored raw unless lz4 shrinks its sample at least this many times (`stays_raw`):
#: compressing it would cost more than pickling it (zstd: about 100 µs for 80 KB of noisy
#: floats) to save a few percent. Such an array goes into the pickle stream of a record that
#: stays compact. (Larger buffers choose their codec from a sample: bf16 weights, which lz4
#: barely shrinks, get 1.47x from zstd.)
SMALL_BUFFER_LIMIT = AUTO_MIN_SAMPLE * RECORD_SAMPLE_FRACTION
SMALL_BUFFER_MIN_RATIO = 1.25

#: The pickle stream is compressed in chunks of this size as the pickler writes it, each one
#: Blosc2 block: compressing overlaps pickling, and zstd's ratio on pickle opcodes grows with
#: the block.
GRAPH_CHUNK_SIZE = 256 << 10
#: The codec "auto" gives the pickle stream: on pickle opcodes and small arrays zstd stores
#: about half of what lz4 stores (no sample needed).
GRAPH_CODEC = "zstd"
#: A whole pickle stream smaller than this (that of a record holding a few big buffers) is
#: stored raw: setting Blosc2 up to compress it (about 25 µs for zstd) would cost more than
#: the few KB it could save.
GRAPH_RAW_LIMIT = 4 << 10
#: A record with no out-of-band buffer whose pickle is smaller than this ...
COMPACT_LIMIT = 1 << 20
#: ... and smaller than this without the arrays in it that `stays_raw` (an object graph that
#: would be compressed) is written in the compact kind (docs/format.md): the pickle stored as
#: is, with no header to encode and nothing to compress. No larger than `GRAPH_CHUNK_SIZE`,
#: so that the pickler has not started compressing the pickle when it finds the record compact.
COMPACT_GRAPH_LIMIT = GRAPH_CHUNK_SIZE

#: joblib's ``"blosc"`` stream: element sizes tried for the shuffle filter on a sample of each
#: chunk (16: complex128), ...
STREAM_TYPESIZES = (1, 2, 4, 8, 16)
#: ... the sample: this many pieces of this many bytes spread over the chunk, ...
STREAM_SAMPLE_PIECES = 4
STREAM_SAMPLE_PIECE_SIZE = 16 << 10
#: ... and an alternative filter (bit shuffle) is used only if it makes the compressed sample
#: at least 3% smaller and saves at least 0.5% of the raw sample (on data that compresses
#: hundreds of times, a few bytes more or less in the sample say nothing about the chunk).
ALTERNATIVE_GAIN = 0.97
ALTERNATIVE_SAVING = 0.005

#: Transfers to another process: "auto" compression samples this many pieces of a buffer ...
TRANSFER_SAMPLES = 4
#: ... of this many bytes each.
TRANSFER_SAMPLE_SIZE = 64 << 10

assert COMPACT_GRAPH_LIMIT <= GRAPH_CHUNK_SIZE <= COMPACT_LIMIT

_BLOSC2_CODECS = {
    "zstd": blosc2.Codec.ZSTD,
    "lz4": blosc2.Codec.LZ4,
    "lz4hc": blosc2.Codec.LZ4HC,
    "blosclz": blosc2.Codec.BLOSCLZ,
    "zlib": blosc2.Codec.ZLIB,
}
_BLOSC2_SHUFFLES = {
    "shuffle": blosc2.Filter.SHUFFLE,
    "bitshuffle": blosc2.Filter.BITSHUFFLE,
    "noshuffle": blosc2.Filter.NOFILTER,
}


@dataclasses.dataclass(frozen=True)
class ChunkPlan:
    """How one buffer is stored or sent.

    Attributes:
        codec: the Blosc2 codec of its chunks, or None: raw, one piece, uncompressed.
        typesize: the element size given to the shuffle filter.
        chunk_size: bytes per chunk (the last may be shorter).
        cparams: the ``blosc2.compress2`` keyword arguments (`blosc2_cparams`); empty when raw.
    """

    codec: str | None
    typesize: int
    chunk_size: int
    cparams: Mapping[str, Any] = dataclasses.field(default_factory=dict, compare=False, repr=False)

    @property
    def raw(self) -> bool:
        """Stored or sent uncompressed."""
        return self.codec is None

    def nchunks(self, nbytes: int) -> int:
        """The number of chunks ``nbytes`` of data are cut into (a raw buffer is one)."""
        if self.raw:
            return 1 if nbytes else 0
        return -(-nbytes // self.chunk_size)


def blosc2_cparams(options: Options, typesize: int, codec: str | None = None) -> dict[str, Any]:
    """Return ``blosc2.compress2`` keyword arguments for elements of ``typesize`` bytes with
    ``codec`` (default: the options' own, which must not be "auto" then).

    Blosc2 itself runs single-threaded: blpickle parallelises over chunks. A byte shuffle of
    1-byte elements changes nothing but makes Blosc2 several times slower: it is left out (a
    bit shuffle does move bits then). zstd gets blocks of `ZSTD_BLOCKSIZE` (a multiple of
    the element size).
    """
    codec = codec or options.codec
    if codec is None or codec == "auto":
        raise ValueError("blosc2_cparams needs a codec: choose one first")
    shuffle = "noshuffle" if typesize == 1 and options.shuffle == "shuffle" else options.shuffle
    filters = [_BLOSC2_SHUFFLES[shuffle]]
    if options.bytedelta:
        filters.append(blosc2.Filter.BYTEDELTA)
    params: dict[str, Any] = {
        "codec": _BLOSC2_CODECS[codec],
        "clevel": options.clevel,
        "typesize": typesize,
        "nthreads": 1,
        "filters": filters,
        "filters_meta": [0] * len(filters),
    }
    if codec == "zstd":
        params["blocksize"] = max(ZSTD_BLOCKSIZE // typesize * typesize, typesize)
    return params


def chunk_size_for(options: Options, nbytes: int, multiple: int = 1) -> int:
    """Return the chunk size for ``nbytes`` of data: ``options.chunk_size``, or less for data
    of a few chunks, so that every thread gets one (but not under `PARALLEL_CHUNK_SIZE`,
    where Blosc2 calls cost more per byte); always a multiple of ``multiple``."""
    size = min(options.chunk_size, max(-(-nbytes // options.threads), PARALLEL_CHUNK_SIZE))
    return max(size - size % multiple, multiple)


def choose_codec(options: Options, sample: Any, typesize: int) -> str:
    """Return the codec to compress data like ``sample`` with: the options' own, or for
    "auto", zstd if it stores at most `AUTO_ZSTD_GAIN` of what lz4 stores or saves
    `AUTO_ZSTD_SAVING` of the sample over it, else lz4 (zstd without trying for samples
    under `AUTO_MIN_SAMPLE`)."""
    if options.codec != "auto":
        if options.codec is None:
            raise ValueError("choose_codec needs options with a codec")
        return options.codec
    nbytes = memoryview(sample).nbytes
    if nbytes < AUTO_MIN_SAMPLE:
        return "zstd"
    lz4, zstd = (len(compress_chunk(sample, blosc2_cparams(options, typesize, codec))) for codec in ("lz4", "zstd"))
    return "zstd" if zstd <= AUTO_ZSTD_GAIN * lz4 or lz4 - zstd >= AUTO_ZSTD_SAVING * nbytes else "lz4"


def fits_compact(
    pickle_nbytes: int, raw_nbytes: int, nbuffers: int, external: Sequence[int], key: bytes | None
) -> bool:
    """Whether a pickle of ``pickle_nbytes``, ``raw_nbytes`` of them arrays that `stays_raw`,
    with ``nbuffers`` out-of-band buffers (and splices) and the ``external`` ones of the caller
    is written as a compact record: an unsigned one (no ``key``), with no buffer of any kind
    and a pickle under `COMPACT_LIMIT`, under `COMPACT_GRAPH_LIMIT` without those arrays."""
    small = pickle_nbytes < COMPACT_LIMIT and pickle_nbytes - raw_nbytes < COMPACT_GRAPH_LIMIT
    return small and key is None and not nbuffers and not external


def plan_raw(nbytes: int, typesize: int = 1) -> ChunkPlan:
    """The plan of a buffer stored or sent uncompressed, in one piece."""
    return ChunkPlan(None, typesize, max(nbytes, 1))


def plan_buffer(
    options: Options, nbytes: int, typesize: int, sample: Callable[[int], Any], multiple: int = 1
) -> ChunkPlan:
    """Return the plan of an out-of-band buffer (or splice) of a record: raw with codec None,
    or with codec "auto" for one under `SMALL_BUFFER_LIMIT` that lz4 does not shrink
    `SMALL_BUFFER_MIN_RATIO` times; else the codec (`choose_codec` on ``sample(size)``,
    about ``size`` bytes of it) and chunks of `chunk_size_for` (a multiple of ``multiple``
    bytes)."""
    if options.codec is None:
        return plan_raw(nbytes, typesize)
    if options.codec == "auto":
        some = _record_sample(nbytes, sample)
        if _small_incompressible(options, nbytes, typesize, some):
            return plan_raw(nbytes, typesize)
        codec = choose_codec(options, some, typesize)
    else:
        codec = options.codec
    return _compressed_plan(options, codec, typesize, chunk_size_for(options, nbytes, multiple))


def stays_raw(options: Options, nbytes: int, typesize: int, sample: Callable[[int], Any]) -> bool:
    """Whether `plan_buffer` stores a buffer of ``nbytes`` raw for its codec: codec None,
    or "auto" for one under `SMALL_BUFFER_LIMIT` that lz4 does not shrink
    `SMALL_BUFFER_MIN_RATIO` times (``sample(size)`` gives about ``size`` bytes of it)."""
    if options.codec is None:
        return True
    if options.codec != "auto" or nbytes >= SMALL_BUFFER_LIMIT:
        return False
    return _small_incompressible(options, nbytes, typesize, _record_sample(nbytes, sample))


def _record_sample(nbytes: int, sample: Callable[[int], Any]) -> Any:
    """The sample of a record buffer of ``nbytes`` its plan is chosen on."""
    return sample(min(RECORD_SAMPLE_SIZE, nbytes // RECORD_SAMPLE_FRACTION))


def _small_incompressible(options: Options, nbytes: int, typesize: int, sample: Any) -> bool:
    """Whether a record buffer of ``nbytes`` is under `SMALL_BUFFER_LIMIT` and lz4 shrinks
    its ``sample`` less than `SMALL_BUFFER_MIN_RATIO` times."""
    cparams = blosc2_cparams(options, typesize, "lz4")
    return nbytes < SMALL_BUFFER_LIMIT and not _shrinks(sample, cparams, SMALL_BUFFER_MIN_RATIO)


@functools.lru_cache(maxsize=64)
def plan_graph(options: Options) -> ChunkPlan:
    """Return the plan of a record's pickle stream: raw with codec None; else `GRAPH_CODEC`
    for "auto", chunks of at most `GRAPH_CHUNK_SIZE`, each one Blosc2 block."""
    if options.codec is None:
        return plan_raw(0)
    codec = GRAPH_CODEC if options.codec == "auto" else options.codec
    chunk_size = min(options.chunk_size, GRAPH_CHUNK_SIZE)
    cparams = {**blosc2_cparams(options, 1, codec), "blocksize": chunk_size}
    return ChunkPlan(codec, 1, chunk_size, cparams)


def plan_pickle(options: Options, nbytes: int, raw_nbytes: int = 0) -> ChunkPlan:
    """Return the plan of a record's pickle stream of ``nbytes`` held whole in memory (never
    cut into chunks of `plan_graph`), ``raw_nbytes`` of them arrays that `stays_raw`: raw
    under `GRAPH_RAW_LIMIT` or when those arrays are half of it or more, else `plan_graph`'s."""
    plan = plan_graph(options)
    return plan_raw(nbytes) if plan.raw or nbytes < GRAPH_RAW_LIMIT or 2 * raw_nbytes >= nbytes else plan


def plan_transfer(
    options: Options, view: Any, typesize: int, compress: Any, min_size: int, min_ratio: float
) -> ChunkPlan:
    """Return the plan of a buffer sent to another process: raw when ``compress`` is False,
    the options have no codec, or it is under ``min_size`` bytes; with ``compress="auto"``
    also raw when a sample of it does not shrink ``min_ratio`` times; else compressed in
    chunks of `chunk_size_for` (a multiple of ``typesize``)."""
    nbytes = memoryview(view).nbytes
    if options.codec is None or compress is False or nbytes < max(min_size, 1):
        return plan_raw(nbytes, typesize)
    sample = spread_sample(view, TRANSFER_SAMPLES * TRANSFER_SAMPLE_SIZE, typesize, TRANSFER_SAMPLES)
    codec = choose_codec(options, sample, typesize)
    plan = _compressed_plan(options, codec, typesize, chunk_size_for(options, nbytes, typesize))
    if compress == "auto" and not _shrinks(sample, plan.cparams, min_ratio):
        return plan_raw(nbytes, typesize)
    return plan


def pick_filters(chunk: Any, options: Options, alternatives: Sequence[Options] = ()) -> tuple[Options, int]:
    """Return the options and element size that compress a sample of ``chunk`` (of the joblib
    ``"blosc"`` stream, whose element size is unknown) best.

    The element size is the one of `STREAM_TYPESIZES` that compresses the sample best with
    ``options``' filters and the fast lz4 codec (ties go to the smaller size; without shuffle
    or bytedelta it changes nothing: 1). Then ``options`` and each of ``alternatives`` (other
    filters) compress the sample at that size with their own codec: an alternative is used
    only if it gives less than `ALTERNATIVE_GAIN` times the size of ``options`` and saves
    `ALTERNATIVE_SAVING` of the raw sample (bit shuffle is often slower to compress, so it
    must win clearly). The sample is `STREAM_SAMPLE_PIECES` pieces of
    `STREAM_SAMPLE_PIECE_SIZE` bytes spread over the chunk, each starting at a multiple of
    16 bytes from the chunk start.
    """
    sample = spread_sample(chunk, STREAM_SAMPLE_PIECES * STREAM_SAMPLE_PIECE_SIZE, 16, STREAM_SAMPLE_PIECES)

    def size(candidate: Options, typesize: int) -> int:
        return len(compress_chunk(sample, blosc2_cparams(candidate, typesize)))

    if options.shuffle == "noshuffle" and not options.bytedelta:
        typesize = 1  # the element size changes nothing
    else:  # ranked with fast lz4 (zstd spends much longer setting up each call on a small sample)
        probe = options.replace(codec="lz4", clevel=1)
        sizes = [size(probe, t) for t in STREAM_TYPESIZES]
        typesize = STREAM_TYPESIZES[sizes.index(min(sizes))]
    if options.codec == "auto":
        options = options.replace(codec=choose_codec(options, sample, typesize))
    if not alternatives:
        return options, typesize
    best, best_size = options, size(options, typesize)
    for candidate in alternatives:
        if candidate.codec == "auto":
            candidate = candidate.replace(codec=options.codec)
        candidate_size = size(candidate, typesize)
        saved = best_size - candidate_size
        if saved > best_size * (1 - ALTERNATIVE_GAIN) and saved > memoryview(sample).nbytes * ALTERNATIVE_SAVING:
            best, best_size = candidate, candidate_size
    return best, typesize


def plan_stream_chunk(chunk: Any, options: Options, alternatives: Sequence[Options] = ()) -> ChunkPlan:
    """Return the plan of one chunk of the joblib ``"blosc"`` stream (see `pick_filters`)."""
    chosen, typesize = pick_filters(chunk, options, alternatives)
    if chosen.codec is None or chosen.codec == "auto":
        raise ValueError("the joblib stream needs options with a codec")
    return _compressed_plan(chosen, chosen.codec, typesize, max(memoryview(chunk).nbytes, 1))


def _shrinks(sample: Any, cparams: Mapping[str, Any], ratio: float) -> bool:
    """Whether compressing ``sample`` with ``cparams`` shrinks it at least ``ratio`` times."""
    return len(compress_chunk(sample, cparams)) * ratio <= memoryview(sample).nbytes


def _compressed_plan(options: Options, codec: str, typesize: int, chunk_size: int) -> ChunkPlan:
    return ChunkPlan(codec, typesize, chunk_size, blosc2_cparams(options, typesize, codec))
