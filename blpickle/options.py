"""Compression options: one frozen, validated object with a JSON round-trip and named presets."""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Mapping
from typing import Any, Literal, get_args

from .errors import OptionsError

__all__ = ["PRESETS", "Codec", "Options", "PicklerKind", "Shuffle", "check_key", "resolve_options"]

Codec = Literal["auto", "zstd", "lz4", "lz4hc", "blosclz", "zlib"]
Shuffle = Literal["shuffle", "bitshuffle", "noshuffle"]
PicklerKind = Literal["pickle", "cloudpickle"]

KiB = 1 << 10
MiB = 1 << 20
MIN_CHUNK_SIZE = 4 * KiB
#: Blosc2 refuses chunks near 2 GiB and silently truncates inputs over 4 GiB: stay well below.
MAX_CHUNK_SIZE = 1 << 30
MAX_THREADS = 256


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
            (`blpickle.engine.policy.choose_codec`); ``None`` stores buffers raw and 64-byte aligned (so
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


PRESETS: dict[str, Options] = {
    "default": Options(),
    "fast": Options(codec="lz4", clevel=1),
    "balanced": Options(codec="zstd", clevel=1),
    "dense": Options(codec="zstd", clevel=5),
    "small": Options(codec="zstd", clevel=5, bytedelta=True),
    "raw": Options(codec=None),
}
"""Named options: "default" (zstd or lz4 per buffer), "fast" (lz4), "balanced" (zstd level 1),
"dense" (zstd level 5 with shuffle, the codec, level and filters of ``blosc2.save_tensor``'s
defaults), "small" (zstd level 5 with bytedelta) and "raw" (uncompressed, mappable)."""


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


def check_key(key: Any) -> bytes | None:
    """Return a signing key as bytes (None stays None).

    Raises:
        OptionsError: for anything but a non-empty bytes-like key.
    """
    if key is not None and (not isinstance(key, (bytes, bytearray)) or not key):
        raise OptionsError("key must be a non-empty bytes object")
    return None if key is None else bytes(key)
