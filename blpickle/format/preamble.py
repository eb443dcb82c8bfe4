"""The fixed parts of a record (docs/format.md): magic numbers, versions, the preamble, the
checksum fields and the footer, the compact record, the format's limits and its checksums.
"""

from __future__ import annotations

import hashlib
import hmac
import pickletools
import struct
from collections.abc import Sequence
from typing import Any

import xxhash

from ..errors import BadMagicError, LimitError, UnsupportedVersionError

MAGIC = b"\xb1BLPK\r\n\x1a"
#: The bytes pickle data starts with, one of its opcodes (the magic's first byte is none).
PICKLE_OPCODES = frozenset(op.code.encode("latin-1") for op in pickletools.opcodes)
END_MAGIC = b"\x1a\n\rKPLB\xb1"
VERSION_MAJOR = 1
VERSION_MINOR = 4
#: The first 8 bytes of a stream written by the ``"blosc"`` joblib compressor
#: (`blpickle.engine.joblib_stream`): here, with the record's, so that every reader (the
#: command line included) recognises such files without importing joblib.
JOBLIB_MAGIC = b"\xb2BLJB\r\n\x1a"

PREAMBLE = struct.Struct("<8sBBHI")  # magic, major, minor, flags, header size
U64 = struct.Struct("<Q")
FOOTER = struct.Struct("<QQ8s")  # trailer size, trailer checksum, END_MAGIC

#: Preamble flag: the trailer holds an HMAC-SHA256 signature of the record.
FLAG_SIGNED = 1
#: Preamble flag (from version 1.1): a compact record, whose "header" is the pickle itself,
#: with no chunks and no trailer after its checksum.
FLAG_COMPACT = 2
#: The bytes a compact record adds to its pickle: the preamble and the checksum.
COMPACT_OVERHEAD = 16 + 8
#: The preamble of every compact record up to its size field.
_COMPACT_PREFIX = struct.pack("<8sBBH", MAGIC, VERSION_MAJOR, VERSION_MINOR, FLAG_COMPACT)
#: The preambles of the compact records blpickle wrote: from 1.1, which introduced them.
_COMPACT_PREFIXES = frozenset(
    struct.pack("<8sBBH", MAGIC, VERSION_MAJOR, minor, FLAG_COMPACT) for minor in range(1, VERSION_MINOR + 1)
)
#: A compact record's preamble: that prefix and the pickle's size.
_COMPACT_START = struct.Struct("<12sI")
# Bound once: the compact record's functions run for every small object.
_pack_compact_start, _unpack_compact_start = _COMPACT_START.pack, _COMPACT_START.unpack_from
_pack_u64, _unpack_u64 = U64.pack, U64.unpack_from
_xxh3 = xxhash.xxh3_64_intdigest
_xxh3_hasher = xxhash.xxh3_64
_PREAMBLE_SIZE, _U64_SIZE = PREAMBLE.size, U64.size

#: Data this large is hashed with the GIL released (`checksum`); smaller data costs less than
#: the release.
RELEASE_GIL_SIZE = 64 << 10
#: Raw (uncompressed) payloads start at a multiple of this, counted from the record start.
ALIGNMENT = 64
#: Blosc2 adds at most this many bytes to a chunk (BLOSC2_MAX_OVERHEAD).
BLOSC2_MAX_OVERHEAD = 32
#: Smallest valid Blosc2 chunk: its extended header.
BLOSC2_MIN_CHUNK = 32
#: Where a Blosc2 chunk's header keeps its sizes: bytes 4-7 its decompressed size, bytes 12-15
#: its own (compressed) size, both little-endian (c-blosc2's README_CHUNK_FORMAT).
BLOSC2_SIZES = struct.Struct("<4xI4xI")

MAX_HEADER_SIZE = 64 << 20
MAX_TRAILER_SIZE = 64 << 20
MAX_STREAMS = 1 << 22
MAX_STREAM_SIZE = 1 << 62
MAX_CHUNK_SIZE = 1 << 30
#: The pickle stream decompresses to at most this many times its stored size (its chunks,
#: 256 KiB of opcodes each, are never under 32 bytes): a reader refuses more before allocating.
MAX_GRAPH_RATIO = 1 << 16
MAX_NDIM = 64
#: How a header may be built besides its size (docs/format.md, "Limits"): at most this many
#: keys in the header's (or the trailer's) map, ...
MAX_HEADER_KEYS = 64
#: ... at most this many items in any map or array of ``options`` or of a stream map, ...
MAX_ITEMS = MAX_NDIM
#: ... and at most this many maps and arrays in ``options`` or in one stream map, itself
#: included. Decoding a header of n bytes then allocates at most HEADER_COST * n + 1 MiB.
MAX_CONTAINERS = 16
HEADER_COST = 16
#: A header or trailer of at most this many bytes is decoded in one call (see `_small_document`).
SMALL_DOCUMENT_SIZE = 8 << 10
_MASK64 = (1 << 64) - 1


def damaged_magic(head: bytes) -> bool:
    """True for input that starts almost like a record: a damaged record, not pickle data."""
    return sum(a == b for a, b in zip(head, MAGIC, strict=False)) >= len(MAGIC) // 2


def checksum(data: Any, seed: int = 0) -> int:
    """Return the 64-bit XXH3 checksum of a bytes-like object. From `RELEASE_GIL_SIZE` bytes
    on it is computed by xxhash's hasher object, which releases the GIL (its one-shot function
    does not), so that chunks hashed in the pool's threads are hashed in parallel."""
    if len(data) < RELEASE_GIL_SIZE:
        return _xxh3(data, seed)
    return _xxh3_hasher(data, seed=seed).intdigest()


def chunk_digest(data: Any) -> bytes:
    """Return the BLAKE2b-256 digest of a chunk's stored data (signed records only)."""
    return hashlib.blake2b(data, digest_size=32).digest()


def signature(key: bytes, head: bytes, digests: Sequence[bytes]) -> str:
    """Return the hex HMAC-SHA256 of a record: its preamble and header, then the BLAKE2b-256
    digest of every chunk's stored data in order."""
    mac = hmac.new(key, head, "sha256")
    for digest in digests:
        mac.update(digest)
    return mac.hexdigest()


def chunk_seed(header_checksum: int, index: int) -> int:
    """Return the checksum seed of a chunk: it ties each chunk to its record and position."""
    return (header_checksum + index + 1) & _MASK64


def raw_padding(offset: int) -> int:
    """Return the zero bytes to write at ``offset`` so that a raw chunk's data is aligned."""
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
    check_header_size(header_size)
    return minor, flags, header_size


def check_header_size(header_size: int) -> None:
    """Raise `LimitError` for a header over `MAX_HEADER_SIZE`, before it is read."""
    if header_size > MAX_HEADER_SIZE:
        raise LimitError(f"header size {header_size} is over the limit of {MAX_HEADER_SIZE} bytes")


def encode_compact(pickle: Any) -> bytes:
    """Return the compact record of a pickle: preamble (version 1.1, flag compact, the
    pickle's size), the pickle, then XXH3-64 of both (seed 0)."""
    start, end = compact_ends(pickle)
    return b"".join((start, pickle, end))


def compact_ends(pickle: Any) -> tuple[bytes, bytes]:
    """Return what comes before and after ``pickle`` in its compact record (`encode_compact`):
    the preamble, and the checksum."""
    start = _pack_compact_start(_COMPACT_PREFIX, len(pickle))
    return start, _pack_u64(_compact_checksum(start, pickle))


def _compact_checksum(start: Any, pickle: Any) -> int:
    """Return a compact record's checksum: XXH3-64 of its preamble ``start`` then ``pickle``."""
    hasher = _xxh3_hasher(start)
    hasher.update(pickle)
    return hasher.intdigest()


def compact_size(preamble: bytes) -> int | None:
    """Return the pickle size a compact record's 16-byte preamble gives, when it is the one
    blpickle writes (1.1 or later, flags compact only); None for any other 16 bytes."""
    if len(preamble) != PREAMBLE.size:
        return None
    prefix, size = _unpack_compact_start(preamble)
    return size if prefix in _COMPACT_PREFIXES else None


def checked_compact_pickle(data: Any, preamble: bytes | None = None) -> Any:
    """Return the pickle (bytes-like) of the compact record ``data`` holds from its start (or
    that ``preamble`` starts and ``data`` goes on with), once its preamble is one blpickle
    writes (1.1 or later, flags compact only) and its checksum is right; None for anything
    else (a full record, damaged input, plain pickle data), which the record reader reads or
    reports in full."""
    data = memoryview(data).cast("B")  # slices of it are not copies
    start = data if preamble is None else preamble
    if len(start) < _PREAMBLE_SIZE:
        return None
    prefix, size = _unpack_compact_start(start)
    offset = _PREAMBLE_SIZE if preamble is None else 0  # where the pickle starts in data
    end = offset + size
    if prefix not in _COMPACT_PREFIXES or len(data) < end + _U64_SIZE:
        return None
    body = data[offset:end]
    found = _xxh3(data[:end]) if preamble is None else _compact_checksum(preamble, body)
    return body if found == _unpack_u64(data, end)[0] else None
