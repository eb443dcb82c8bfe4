"""Compression options: one frozen, validated object with a JSON round-trip and named presets."""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Mapping
from typing import Any, Literal, get_args

import blosc2

from .errors import OptionsError

__all__ = ["PRESETS", "Codec", "Options", "PicklerKind", "Shuffle", "choose_codec", "compress_chunk", "resolve_options"]

Codec = Literal["auto", "zstd", "lz4", "lz4hc", "blosclz", "zlib"]
Shuffle = Literal["shuffle", "bitshuffle", "noshuffle"]
PicklerKind = Literal["pickle", "cloudpickle"]

KiB = 1 << 10
MiB = 1 << 20
MIN_CHUNK_SIZE = 4 * KiB
#: Blosc2 refuses chunks near 2 GiB and silently truncates inputs over 4 GiB: stay well below.
MAX_CHUNK_SIZE = 1 << 30
MAX_THREADS = 256

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


def _parse_choice(name: str, value: Any, choices: tuple[Any, ...]) -> Any:
    if value not in choices:
        raise OptionsError(f"{name} must be one of {', '.join(map(repr, choices))}, not {value!r}")
    return value


def _parse_int(name: str, value: Any, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise OptionsError(f"{name} must be an integer from {low} to {high}, not {value!r}")
    return value


def _parse_bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise OptionsError(f"{name} must be True or False, not {value!r}")
    return value


@functools.cache
def available_threads() -> int:
    """Return the number of CPUs this process may run on (read once)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


@dataclasses.dataclass(frozen=True)
class Options:
    """How blpickle compresses buffers.

    Attributes:
        codec: Blosc2 codec; ``"auto"`` picks zstd or lz4 for each buffer from a sample
            (`choose_codec`); ``None`` stores buffers raw and 64-byte aligned (so
            ``load(path, mmap_mode="r")`` can map them).
        clevel: compression level, 0 (no compression) to 9 (slowest, smallest).
        shuffle: byte (``"shuffle"``) or bit (``"bitshuffle"``) transposition by element size
            before compression, or ``"noshuffle"``.
        bytedelta: add Blosc2's bytedelta filter after the shuffle (helps integers and smooth
            floating-point data, costs decompression speed).
        chunk_size: bytes per compressed chunk; memory overhead is a few chunks.
        nthreads: compression/decompression threads; ``None`` means every available CPU.
        pickler: ``"pickle"`` (the C pickler) or ``"cloudpickle"`` (also saves lambdas,
            closures and classes defined in ``__main__``).

    Raises:
        OptionsError: when a value is out of range or of the wrong type.
    """

    codec: Codec | None = "auto"
    clevel: int = 1
    shuffle: Shuffle = "shuffle"
    bytedelta: bool = False
    chunk_size: int = 4 * MiB
    nthreads: int | None = None
    pickler: PicklerKind = "pickle"

    def __post_init__(self) -> None:
        if self.codec is not None:
            _parse_choice("codec", self.codec, (*get_args(Codec), None))
        _parse_int("clevel", self.clevel, 0, 9)
        _parse_choice("shuffle", self.shuffle, get_args(Shuffle))
        _parse_bool("bytedelta", self.bytedelta)
        _parse_int("chunk_size", self.chunk_size, MIN_CHUNK_SIZE, MAX_CHUNK_SIZE)
        if self.nthreads is not None:
            _parse_int("nthreads", self.nthreads, 1, MAX_THREADS)
        _parse_choice("pickler", self.pickler, get_args(PicklerKind))

    def to_dict(self) -> dict[str, Any]:
        """Return the options as a JSON-compatible dict."""
        return {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Options:
        """Build options from `to_dict` output; unknown keys raise `OptionsError`."""
        unknown = set(data) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise OptionsError(f"unknown option(s): {', '.join(sorted(unknown))}")
        return cls(**data)

    def replace(self, **changes: Any) -> Options:
        """Return a copy with some fields changed (validated)."""
        unknown = set(changes) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise OptionsError(f"unknown option(s): {', '.join(sorted(unknown))}")
        return dataclasses.replace(self, **changes)

    @property
    def threads(self) -> int:
        """The number of threads to use: ``nthreads``, or every available CPU."""
        return self.nthreads or available_threads()

    def chunk_size_for(self, nbytes: int, multiple: int = 1) -> int:
        """Return the chunk size for ``nbytes`` of data: ``chunk_size``, or less for data of a
        few chunks, so that every thread gets one (but not under `PARALLEL_CHUNK_SIZE`,
        where Blosc2 calls cost more per byte); always a multiple of ``multiple``."""
        size = min(self.chunk_size, max(-(-nbytes // self.threads), PARALLEL_CHUNK_SIZE))
        return max(size - size % multiple, multiple)

    def blosc2_cparams(self, typesize: int, codec: str | None = None) -> dict[str, Any]:
        """Return ``blosc2.compress2`` keyword arguments for elements of ``typesize`` bytes,
        with ``codec`` (default: the options' own, which must not be "auto" then).

        Blosc2 itself runs single-threaded: blpickle parallelises over chunks.
        """
        codec = codec or self.codec
        assert codec not in (None, "auto"), "choose a codec first"
        # A byte shuffle of 1-byte elements changes nothing, but makes Blosc2 (4.14) compress
        # and decompress 2-4x slower: it is left out (bitshuffle does move bits then).
        shuffle = "noshuffle" if typesize == 1 and self.shuffle == "shuffle" else self.shuffle
        filters = [_BLOSC2_SHUFFLES[shuffle]]
        if self.bytedelta:
            filters.append(blosc2.Filter.BYTEDELTA)
        params = {
            "codec": _BLOSC2_CODECS[codec],
            "clevel": self.clevel,
            "typesize": typesize,
            "nthreads": 1,
            "filters": filters,
            "filters_meta": [0] * len(filters),
        }
        if codec == "zstd":  # a multiple of the element size (see compress_chunk)
            params["blocksize"] = max(ZSTD_BLOCKSIZE // typesize * typesize, typesize)
        return params


#: The smallest chunks data is cut into to share it among threads.
PARALLEL_CHUNK_SIZE = 1 << 20
#: zstd's ratio grows with Blosc2's block size (an int64 ramp: 450x with the automatic 256 KiB
#: blocks, 780x with 1 MiB) for a few percent of speed; other codecs keep the automatic size.
ZSTD_BLOCKSIZE = 1 << 20
#: With codec "auto", zstd is chosen where a sample shows it storing at most this fraction of
#: what lz4 stores; elsewhere (noisy data) lz4, which decompresses about twice as fast.
AUTO_ZSTD_GAIN = 2 / 3
#: Streams smaller than this are compressed with zstd without sampling.
AUTO_MIN_SAMPLE = 64 << 10


def compress_chunk(data: Any, cparams: dict[str, Any]) -> bytes:
    """Compress ``data`` with ``blosc2.compress2`` and `Options.blosc2_cparams`.

    An explicit block size larger than the data shrinks to the data's whole elements: with a
    block larger than the data, or not a multiple of the element size, Blosc2 (4.14) writes
    chunks that decompress wrong, without an error (``tests/test_options.py`` holds it to this).
    Data that ends in a partial element is compressed without bytedelta, which the Blosc2
    releases before 4.11 (all those for Python 3.10) apply wrongly to that partial element.
    """
    nbytes = memoryview(data).nbytes
    if cparams.get("blocksize", 0) > nbytes:
        cparams = {**cparams, "blocksize": nbytes - nbytes % cparams["typesize"]}
    if nbytes % cparams["typesize"] and blosc2.Filter.BYTEDELTA in cparams["filters"]:
        filters = [f for f in cparams["filters"] if f != blosc2.Filter.BYTEDELTA]
        cparams = {**cparams, "filters": filters, "filters_meta": [0] * len(filters)}
    return blosc2.compress2(data, **cparams)


def choose_codec(options: Options, sample: Any, typesize: int) -> str:
    """Return the codec to compress data like ``sample`` with: the options' own, or for
    "auto", zstd if it stores at most `AUTO_ZSTD_GAIN` of what lz4 stores, else lz4."""
    if options.codec != "auto":
        return options.codec
    if memoryview(sample).nbytes < AUTO_MIN_SAMPLE:
        return "zstd"
    sizes = {codec: len(compress_chunk(sample, options.blosc2_cparams(typesize, codec))) for codec in ("lz4", "zstd")}
    return "zstd" if sizes["zstd"] <= AUTO_ZSTD_GAIN * sizes["lz4"] else "lz4"


PRESETS: dict[str, Options] = {
    "default": Options(),
    "fast": Options(codec="lz4", clevel=1),
    "balanced": Options(codec="zstd", clevel=1),
    "small": Options(codec="zstd", clevel=5, bytedelta=True),
    "raw": Options(codec=None),
}


def resolve_options(preset: str | Options | None = None, **overrides: Any) -> Options:
    """Return the options named by ``preset`` (a name in `PRESETS` or an
    `Options`), with ``overrides`` applied.

    Raises:
        OptionsError: for an unknown preset or option, or an invalid value.
    """
    if preset is None:
        base = PRESETS["default"]
    elif isinstance(preset, Options):
        base = preset
    elif isinstance(preset, str) and preset in PRESETS:
        base = PRESETS[preset]
    else:
        raise OptionsError(f"preset must be an Options or one of {', '.join(PRESETS)}, not {preset!r}")
    return base.replace(**overrides) if overrides else base
