"""The byte layout of a blpickle record (specified in ``docs/format.md``).

A record is::

    preamble | header | header checksum | frames of stream 0 .. n-1 | trailer block

Everything here is pure encoding and decoding with validation; reading and writing the
frames lives in :mod:`blpickle.stream`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import struct
from collections.abc import Iterator, Sequence
from typing import Any

import msgpack
import xxhash

from .errors import BadMagicError, CorruptError, LimitError, UnsupportedVersionError

MAGIC = b"\xb1BLPK\r\n\x1a"
END_MAGIC = b"\x1a\n\rKPLB\xb1"
#: The start of a stream written by blpickle's ``"blosc"`` joblib compressor
#: (:mod:`blpickle.integrations.joblib`): not a record, but blpickle knows it by sight.
JOBLIB_MAGIC = b"\xb2BLJB\r\n\x1a"
VERSION_MAJOR = 1
VERSION_MINOR = 0

PREAMBLE = struct.Struct("<8sBBHI")  # magic, major, minor, flags, header size
U64 = struct.Struct("<Q")
FOOTER = struct.Struct("<QQ8s")  # trailer size, trailer checksum, END_MAGIC

#: Preamble flag: the trailer holds an HMAC-SHA256 signature of the record.
FLAG_SIGNED = 1

#: Raw (uncompressed) payloads start at a multiple of this, counted from the record start.
ALIGNMENT = 64
#: Blosc2 adds at most this many bytes to a chunk (BLOSC2_MAX_OVERHEAD).
BLOSC2_MAX_OVERHEAD = 32
#: Smallest valid Blosc2 chunk: its extended header.
BLOSC2_MIN_CHUNK = 32

MAX_HEADER_SIZE = 64 << 20
MAX_TRAILER_SIZE = 64 << 20
MAX_STREAMS = 1 << 22
MAX_STREAM_SIZE = 1 << 62
MAX_CHUNK_SIZE = 1 << 30
MAX_NDIM = 64
_MASK64 = (1 << 64) - 1
_HEX_DIGITS = frozenset("0123456789abcdef")


def damaged_magic(head: bytes) -> bool:
    """True for input that starts almost like a record: a damaged record, not pickle data."""
    return sum(a == b for a, b in zip(head, MAGIC, strict=False)) >= len(MAGIC) // 2


def checksum(data: Any, seed: int = 0) -> int:
    """Return the 64-bit XXH3 checksum of a bytes-like object."""
    return xxhash.xxh3_64_intdigest(data, seed)


def frame_digest(data: Any) -> bytes:
    """Return the BLAKE2b-256 digest of a frame's payload (signed records only)."""
    return hashlib.blake2b(data, digest_size=32).digest()


def signature(key: bytes, head: bytes, digests: Sequence[bytes]) -> str:
    """Return the hex HMAC-SHA256 of a record: its preamble and header, then the BLAKE2b-256
    digest of every frame's payload in order."""
    mac = hmac.new(key, head, "sha256")
    for digest in digests:
        mac.update(digest)
    return mac.hexdigest()


def frame_seed(header_checksum: int, frame_index: int) -> int:
    """Return the checksum seed of a frame: it ties each frame to its record and position."""
    return (header_checksum + frame_index + 1) & _MASK64


def raw_padding(offset: int) -> int:
    """Return the zero bytes to write at ``offset`` so that a raw frame's payload is aligned."""
    return -(offset + U64.size) % ALIGNMENT


def encode_preamble(header_size: int, flags: int = 0) -> bytes:
    """Return the 16-byte preamble for a header of ``header_size`` bytes."""
    return PREAMBLE.pack(MAGIC, VERSION_MAJOR, VERSION_MINOR, flags, header_size)


def decode_preamble(data: bytes) -> tuple[int, int, int]:
    """Check a 16-byte preamble; return ``(minor, flags, header_size)``. Unknown flags are
    ignored (later minor versions may set them).

    Raises:
        BadMagicError, UnsupportedVersionError, LimitError.
    """
    magic, major, minor, flags, header_size = PREAMBLE.unpack(data)
    if magic != MAGIC:
        raise BadMagicError(magic)
    if major != VERSION_MAJOR:
        raise UnsupportedVersionError(major, minor, VERSION_MAJOR)
    if header_size > MAX_HEADER_SIZE:
        raise LimitError(f"header size {header_size} is over the limit of {MAX_HEADER_SIZE} bytes")
    return minor, flags, header_size


@dataclasses.dataclass(frozen=True)
class StreamInfo:
    """One stream of a record: the pickle (stream 0), an out-of-band buffer, or a splice.

    Attributes:
        nbytes: decompressed size.
        chunk_size: decompressed bytes per chunk (the last one may be shorter).
        itemsize: element size given to the shuffle filter.
        raw: stored uncompressed as one aligned frame instead of Blosc2 chunks.
        dtype: numpy dtype string of the array it holds, if any (informational).
        shape: shape of that array (informational).
        splice: for a large bytes, bytearray or str payload the pickler wrote in band: the
            offset in the pickle stream where its bytes belong. None for out-of-band buffers.
        codec: the Blosc2 codec its chunks were compressed with (informational).
    """

    nbytes: int
    chunk_size: int
    itemsize: int = 1
    raw: bool = False
    dtype: str | None = None
    shape: tuple[int, ...] | None = None
    splice: int | None = None
    codec: str | None = None

    @property
    def nchunks(self) -> int:
        """Number of frames the stream is stored in."""
        if self.raw:
            return 1 if self.nbytes else 0
        return -(-self.nbytes // self.chunk_size)

    def chunk_spans(self) -> Iterator[tuple[int, int]]:
        """Yield ``(start, stop)`` byte offsets of each chunk in the decompressed stream."""
        step = self.nbytes if self.raw else self.chunk_size
        for start in range(0, self.nbytes, max(step, 1)):
            yield start, min(start + step, self.nbytes)

    def to_dict(self) -> dict[str, Any]:
        out = {"nbytes": self.nbytes, "chunk_size": self.chunk_size, "itemsize": self.itemsize, "raw": self.raw}
        if self.dtype is not None:
            out["dtype"] = self.dtype
        if self.shape is not None:
            out["shape"] = list(self.shape)
        if self.splice is not None:
            out["splice"] = self.splice
        if self.codec is not None:
            out["codec"] = self.codec
        return out


@dataclasses.dataclass(frozen=True)
class Header:
    """What a record holds, written before any data.

    Attributes:
        options: the writer's options (:meth:`blpickle.Options.to_dict`), informational.
        protocol: pickle protocol of stream 0.
        streams: stream 0 is the pickle, the others are out-of-band buffers in the order the
            pickle uses them.
        external: positions (among all out-of-band buffers the pickle uses) of the buffers that
            are not in the record: the caller passes them as ``buffers=`` on load.
    """

    options: dict[str, Any]
    protocol: int
    streams: tuple[StreamInfo, ...]
    external: tuple[int, ...] = ()

    def encode(self) -> bytes:
        return msgpack.packb(
            {
                "options": self.options,
                "protocol": self.protocol,
                "streams": [s.to_dict() for s in self.streams],
                "external": list(self.external),
            }
        )

    @classmethod
    def decode(cls, data: bytes) -> Header:
        """Decode and validate a header.

        Raises:
            CorruptError: for anything that is not a valid header.
            LimitError: for sizes over the limits.
        """
        doc = _unpack(data, "header")
        options = _get(doc, "options", dict, "header")
        protocol = _get(doc, "protocol", int, "header")
        if not 0 <= protocol <= 5:
            raise CorruptError(f"header: pickle protocol {protocol} is not 0 to 5")
        streams = _get(doc, "streams", list, "header")
        if not 1 <= len(streams) <= MAX_STREAMS:
            raise LimitError(f"header: {len(streams)} streams, expected 1 to {MAX_STREAMS}")
        external = _get(doc, "external", list, "header")
        if any(not isinstance(e, int) or isinstance(e, bool) or e < 0 for e in external):
            raise CorruptError("header: 'external' must list non-negative integers")
        if sorted(set(external)) != external:
            raise CorruptError("header: 'external' must be sorted and without repeats")
        decoded = tuple(_decode_stream(s, i) for i, s in enumerate(streams))
        splices = [s.splice for s in decoded[1:] if s.splice is not None]
        if decoded[0].splice is not None or splices != sorted(splices) or any(p > decoded[0].nbytes for p in splices):
            raise CorruptError("header: splice offsets must be ascending and within the pickle stream")
        return cls(options, protocol, decoded, tuple(external))


def _decode_stream(doc: Any, index: int) -> StreamInfo:
    where = f"header stream {index}"
    if not isinstance(doc, dict):
        raise CorruptError(f"{where}: expected a map, found {type(doc).__name__}")
    nbytes = _get(doc, "nbytes", int, where)
    chunk_size = _get(doc, "chunk_size", int, where)
    itemsize = _get(doc, "itemsize", int, where)
    raw = _get(doc, "raw", bool, where)
    if not 0 <= nbytes <= MAX_STREAM_SIZE:
        raise LimitError(f"{where}: size {nbytes} is not 0 to {MAX_STREAM_SIZE}")
    if not 1 <= chunk_size <= (MAX_STREAM_SIZE if raw else MAX_CHUNK_SIZE):
        raise LimitError(f"{where}: chunk size {chunk_size} is out of range")
    if not 1 <= itemsize <= 255:
        raise CorruptError(f"{where}: itemsize {itemsize} is not 1 to 255")
    dtype = doc.get("dtype")
    if dtype is not None and not isinstance(dtype, str):
        raise CorruptError(f"{where}: dtype must be a string")
    shape = doc.get("shape")
    if shape is not None:
        if (
            not isinstance(shape, list)
            or len(shape) > MAX_NDIM
            or any(not isinstance(n, int) or isinstance(n, bool) or n < 0 for n in shape)
        ):
            raise CorruptError(f"{where}: shape must be a list of at most {MAX_NDIM} sizes")
        shape = tuple(shape)
    splice = doc.get("splice")
    if splice is not None and (not isinstance(splice, int) or isinstance(splice, bool) or splice < 0):
        raise CorruptError(f"{where}: splice must be a non-negative offset")
    codec = doc.get("codec")
    if codec is not None and not isinstance(codec, str):
        raise CorruptError(f"{where}: codec must be a string")
    return StreamInfo(nbytes, chunk_size, itemsize, raw, dtype, shape, splice, codec)


@dataclasses.dataclass
class FrameIndex:
    """The trailer: where each frame of the record is and its checksum."""

    offsets: list[int] = dataclasses.field(default_factory=list)
    csizes: list[int] = dataclasses.field(default_factory=list)
    checksums: list[int] = dataclasses.field(default_factory=list)
    #: hex HMAC-SHA256 of the record (see :func:`signature`), for signed records
    signature: str | None = None

    def add(self, offset: int, csize: int, digest: int) -> None:
        self.offsets.append(offset)
        self.csizes.append(csize)
        self.checksums.append(digest)

    def __len__(self) -> int:
        return len(self.offsets)

    def encode(self) -> bytes:
        doc: dict[str, Any] = {"offsets": self.offsets, "csizes": self.csizes, "checksums": self.checksums}
        if self.signature is not None:
            doc["signature"] = self.signature
        return msgpack.packb(doc)

    @classmethod
    def decode(cls, data: bytes, nframes: int) -> FrameIndex:
        """Decode a trailer that must list ``nframes`` frames.

        Raises:
            CorruptError: for anything that is not a valid trailer.
        """
        doc = _unpack(data, "trailer")
        lists = [_get(doc, key, list, "trailer") for key in ("offsets", "csizes", "checksums")]
        for key, values in zip(("offsets", "csizes", "checksums"), lists, strict=True):
            if len(values) != nframes:
                raise CorruptError(f"trailer: '{key}' lists {len(values)} frames, the header implies {nframes}")
            if any(not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= _MASK64 for v in values):
                raise CorruptError(f"trailer: '{key}' must list 64-bit unsigned integers")
        signed = doc.get("signature")
        if signed is not None and (not isinstance(signed, str) or len(signed) != 64 or not set(signed) <= _HEX_DIGITS):
            raise CorruptError(f"trailer: 'signature' must be 64 lowercase hex digits, found {signed!r:.80}")
        return cls(*lists, signature=signed)


def total_frames(streams: Sequence[StreamInfo]) -> int:
    """Return the number of frames a record with these streams holds."""
    return sum(s.nchunks for s in streams)


def _unpack(data: bytes, what: str) -> dict[str, Any]:
    try:
        doc = msgpack.unpackb(data, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several unrelated types for bad input
        raise CorruptError(f"{what} is not valid msgpack: {exc}") from None
    if not isinstance(doc, dict):
        raise CorruptError(f"{what}: expected a map, found {type(doc).__name__}")
    return doc


def _get(doc: dict[str, Any], key: str, kind: type, where: str) -> Any:
    if key not in doc:
        raise CorruptError(f"{where}: field {key!r} is missing")
    value = doc[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise CorruptError(f"{where}: field {key!r} must be {kind.__name__}, found {type(value).__name__}")
    return value
