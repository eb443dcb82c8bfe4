"""The byte layout of a blpickle record (specified in ``docs/format.md``).

A record is:

```text
preamble | header | header checksum | frames of stream 0 .. n-1 | trailer block
```

or, for the compact kind (a small pickle and no out-of-band buffer):

```text
preamble (flag compact) | pickle | checksum
```

Everything here is pure encoding and decoding with validation; writing and reading the
frames lives in `blpickle.writer` and `blpickle.reader`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import io
import itertools
import operator
import struct
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

import msgpack
import xxhash

from .errors import BadMagicError, CorruptError, LimitError, LoadError, UnsupportedVersionError

MAGIC = b"\xb1BLPK\r\n\x1a"
END_MAGIC = b"\x1a\n\rKPLB\xb1"
VERSION_MAJOR = 1
VERSION_MINOR = 2

PREAMBLE = struct.Struct("<8sBBHI")  # magic, major, minor, flags, header size
U64 = struct.Struct("<Q")
FOOTER = struct.Struct("<QQ8s")  # trailer size, trailer checksum, END_MAGIC

#: Preamble flag: the trailer holds an HMAC-SHA256 signature of the record.
FLAG_SIGNED = 1
#: Preamble flag (from version 1.1): a compact record, whose "header" is the pickle itself,
#: with no frames and no trailer after its checksum.
FLAG_COMPACT = 2
#: The bytes a compact record adds to its pickle: the preamble and the checksum.
COMPACT_OVERHEAD = 16 + 8
#: The preamble of every compact record up to its size field.
_COMPACT_PREFIX = struct.pack("<8sBBH", MAGIC, VERSION_MAJOR, VERSION_MINOR, FLAG_COMPACT)
#: A compact record's preamble: that prefix and the pickle's size.
_COMPACT_START = struct.Struct("<12sI")
# Bound once: the compact record's functions run for every small object.
_pack_compact_start, _unpack_compact_start = _COMPACT_START.pack, _COMPACT_START.unpack_from
_pack_u64, _unpack_u64 = U64.pack, U64.unpack_from
_xxh3 = xxhash.xxh3_64_intdigest
_PREAMBLE_SIZE, _U64_SIZE = PREAMBLE.size, U64.size

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
    check_header_size(header_size)
    return minor, flags, header_size


def check_header_size(header_size: int) -> None:
    """Raise `LimitError` for a header over `MAX_HEADER_SIZE`, before it is read."""
    if header_size > MAX_HEADER_SIZE:
        raise LimitError(f"header size {header_size} is over the limit of {MAX_HEADER_SIZE} bytes")


def encode_compact(pickle: Any) -> bytes:
    """Return the compact record of a pickle: preamble (version 1.1, flag compact, the
    pickle's size), the pickle, then XXH3-64 of both (seed 0)."""
    head = _pack_compact_start(_COMPACT_PREFIX, len(pickle)) + pickle
    return head + _pack_u64(_xxh3(head))


def compact_size(preamble: bytes) -> int | None:
    """Return the pickle size a compact record's 16-byte preamble gives, when it is the one
    blpickle writes (1.1, flags compact only); None for any other 16 bytes."""
    if len(preamble) != PREAMBLE.size:
        return None
    prefix, size = _unpack_compact_start(preamble)
    return size if prefix == _COMPACT_PREFIX else None


def checked_compact_pickle(data: Any) -> Any:
    """Return the pickle (bytes-like) of the compact record ``data`` holds from its start,
    once its preamble is the one blpickle writes (1.1, flags compact only) and its checksum is
    right; None for anything else (a full record, damaged input, plain pickle data), which the
    record reader reads or reports in full."""
    if type(data) is not bytes:
        data = memoryview(data).cast("B")
    if len(data) < COMPACT_OVERHEAD:
        return None
    prefix, size = _unpack_compact_start(data)
    end = _PREAMBLE_SIZE + size
    if prefix != _COMPACT_PREFIX or len(data) < end + _U64_SIZE or _xxh3(data[:end]) != _unpack_u64(data, end)[0]:
        return None
    return data[_PREAMBLE_SIZE:end]


def compact_header(pickle: Any) -> Header:
    """Return the header a compact record stands for: its pickle as one raw stream, with the
    protocol of its PROTO opcode (0 without one).

    Raises:
        CorruptError: for a protocol over 5.
    """
    view = memoryview(pickle)
    protocol = view[1] if len(view) >= 2 and view[0] == 0x80 else 0
    if protocol > 5:
        raise CorruptError(f"the compact record's pickle declares protocol {protocol}, not 0 to 5")
    return Header({}, protocol, (StreamInfo(len(view), max(len(view), 1), raw=True),))


class StreamInfo(NamedTuple):
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
        order: "C" or "F": the memory order of the array's bytes (with dtype and shape).
        name: the path to the array in the dumped object (``"model.coef_"``), if found.
        tensor: the type the array was dumped as when not a numpy array (``"torch.bfloat16"``,
            ``"jax.float32"``: the library and its dtype's name), with dtype and shape.
    """

    nbytes: int
    chunk_size: int
    itemsize: int = 1
    raw: bool = False
    dtype: str | None = None
    shape: tuple[int, ...] | None = None
    splice: int | None = None
    codec: str | None = None
    order: str | None = None
    name: str | None = None
    tensor: str | None = None

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
        out: dict[str, Any] = {
            "nbytes": self.nbytes,
            "chunk_size": self.chunk_size,
            "itemsize": self.itemsize,
            "raw": self.raw,
        }
        if self.dtype is not None:
            out["dtype"] = self.dtype
        if self.shape is not None:
            out["shape"] = list(self.shape)
        if self.splice is not None:
            out["splice"] = self.splice
        if self.codec is not None:
            out["codec"] = self.codec
        if self.order is not None:
            out["order"] = self.order
        if self.name is not None:
            out["name"] = self.name
        if self.tensor is not None:
            out["tensor"] = self.tensor
        return out


@dataclasses.dataclass(frozen=True)
class Header:
    """What a record holds, written before any data.

    Attributes:
        options: the writer's options (`blpickle.Options.to_dict`), informational.
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

    @property
    def uncompressed(self) -> bool:
        """Whether the writer's options say codec None: every buffer is raw, to be mapped.
        Readers map raw buffers, or read parts of them unchecked, only then (another codec
        leaves only small buffers raw, read and checked whole)."""
        return self.options.get("codec", "") is None

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
        """Decode and validate a header, allocating at most a few times its size (see
        `_Reader`).

        Raises:
            CorruptError: for anything that is not a valid header.
            LimitError: for sizes over the limits.
        """
        doc = _small_header(data)
        if doc is None:
            doc = _header_fields(data)
        options = _get(doc, "options", dict, "header")
        protocol = _get(doc, "protocol", int, "header")
        if not 0 <= protocol <= 5:
            raise CorruptError(f"header: pickle protocol {protocol} is not 0 to 5")
        streams = _get(doc, "streams", tuple, "header")
        external = _get(doc, "external", tuple, "header")
        splices = [s.splice for s in streams[1:] if s.splice is not None]
        if streams[0].splice is not None or splices != sorted(splices) or any(p > streams[0].nbytes for p in splices):
            raise CorruptError("header: splice offsets must be ascending and within the pickle stream")
        return cls(options, protocol, streams, external)


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
    if shape is not None and (
        not isinstance(shape, tuple) or any(not isinstance(n, int) or isinstance(n, bool) or n < 0 for n in shape)
    ):
        raise CorruptError(f"{where}: shape must be a list of at most {MAX_NDIM} sizes")
    splice = doc.get("splice")
    if splice is not None and (not isinstance(splice, int) or isinstance(splice, bool) or splice < 0):
        raise CorruptError(f"{where}: splice must be a non-negative offset")
    codec = doc.get("codec")
    if codec is not None and not isinstance(codec, str):
        raise CorruptError(f"{where}: codec must be a string")
    order = doc.get("order")
    if order is not None and order not in ("C", "F"):
        raise CorruptError(f"{where}: order must be 'C' or 'F'")
    name = doc.get("name")
    if name is not None and not isinstance(name, str):
        raise CorruptError(f"{where}: name must be a string")
    tensor = doc.get("tensor")
    if tensor is not None and not isinstance(tensor, str):
        raise CorruptError(f"{where}: tensor must be a string")
    return StreamInfo(nbytes, chunk_size, itemsize, raw, dtype, shape, splice, codec, order, name, tensor)


@dataclasses.dataclass
class FrameIndex:
    """The trailer: where each frame of the record is and its checksum."""

    offsets: list[int] = dataclasses.field(default_factory=list)
    csizes: list[int] = dataclasses.field(default_factory=list)
    checksums: list[int] = dataclasses.field(default_factory=list)
    #: hex HMAC-SHA256 of the record (see `signature`), for signed records
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
    def decode(cls, data: bytes, nframes: int, *, authenticated: bool = False) -> FrameIndex:
        """Decode a trailer that must list ``nframes`` frames, allocating a few times its size
        at most (see `_Reader`). With ``authenticated`` (its signature is checked),
        refuse keys of any other meaning: the signature covers none.

        Raises:
            CorruptError: for anything that is not a valid trailer.
        """
        doc = _small_trailer(data, nframes, authenticated)
        if doc is None:
            doc = _trailer_fields(data, nframes, authenticated)
        lists = [_get(doc, key, list, "trailer") for key in _FRAME_FIELDS]
        signed = doc.get("signature")
        if signed is not None and (not isinstance(signed, str) or len(signed) != 64 or not set(signed) <= _HEX_DIGITS):
            raise CorruptError(f"trailer: 'signature' must be 64 lowercase hex digits, found {signed!r:.80}")
        offsets, csizes, checksums = lists
        return cls(offsets, csizes, checksums, signature=signed)


def total_frames(streams: Sequence[StreamInfo]) -> int:
    """Return the number of frames a record with these streams holds."""
    return sum(s.nchunks for s in streams)


#: msgpack array 16 and array 32, map 16 and map 32: the size of their headers.
_ARRAY_HEADERS = {0xDC: 3, 0xDD: 5}
_MAP_HEADERS = {0xDE: 3, 0xDF: 5}


class _Parsing:
    """A block of msgpack parsing: its errors, of the several unrelated types msgpack raises
    for bad input, become a `CorruptError` naming ``where`` (a class rather than a generator
    context manager: a header is parsed in a few dozen such blocks)."""

    __slots__ = ("_where",)

    def __init__(self, where: str) -> None:
        self._where = where

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, traceback: Any) -> None:
        if isinstance(exc, Exception) and not isinstance(exc, LoadError):
            raise CorruptError(f"{self._where} is not valid msgpack within the limits: {exc}") from None


class _Reader:
    """Reads a msgpack document piece by piece: its outer map and the ``streams`` array are
    walked (each stream map is decoded and validated on its own), and each value is
    materialised only within limits on its maps, arrays and items, so that no count it
    declares allocates more than the bytes that hold it, a few times over."""

    def __init__(self, data: bytes, what: str) -> None:
        self._view = memoryview(data)
        self._what = what
        self._unpacker = msgpack.Unpacker(io.BytesIO(data), max_buffer_size=max(len(data), 1))

    def keys(self, where: str, seen: dict[str, Any]) -> Iterator[str]:
        """Yield the keys of the top-level map, whose values the caller reads in between;
        refuse more than `MAX_HEADER_KEYS` keys, keys that are not strings, and a key
        already in ``seen``."""
        with _Parsing(where):
            count = self._unpacker.read_map_header()
        if count > MAX_HEADER_KEYS:
            raise CorruptError(f"{where}: a map of {count} keys, at most {MAX_HEADER_KEYS} allowed")
        for _ in range(count):
            key = self.value(f"{where} key", containers=0, items=0)
            if not isinstance(key, str):
                raise CorruptError(f"{where}: keys must be strings, found {type(key).__name__}")
            if key in seen:
                raise CorruptError(f"{where}: key {key!r} appears twice")
            yield key

    def streams(self) -> tuple[StreamInfo, ...]:
        """Read the header's ``streams`` array a stream map at a time: the tuple grows only
        with the maps that are there, whatever count the array declares."""
        with _Parsing("header field 'streams'"):
            count = self._unpacker.read_array_header()
        if not 1 <= count <= MAX_STREAMS:
            raise LimitError(f"header: {count} streams, expected 1 to {MAX_STREAMS}")
        return tuple(
            _decode_stream(self.value(f"header stream {i}", containers=MAX_CONTAINERS, items=MAX_ITEMS), i)
            for i in range(count)
        )

    def integers(self, field: str, *, count: int | None = None, ascending: bool = False) -> list[int]:
        """Read an array of non-negative integers (``count`` of them, if given) 65536 at a
        time, each block checked (ascending without repeats, if asked) before the next is
        decoded: only a valid array costs memory, a few times its size."""
        rule = "ascending non-negative integers without repeats" if ascending else "64-bit unsigned integers"
        with _Parsing(f"{self._what} field {field!r}"):
            start = self._unpacker.tell()
            self._unpacker.skip()
            data = self._view[start : self._unpacker.tell()]
            if data[0] >> 4 == 0x9:  # fixarray
                found, body = data[0] & 0xF, 1
            elif data[0] in _ARRAY_HEADERS:
                found, body = int.from_bytes(data[1 : _ARRAY_HEADERS[data[0]]], "big"), _ARRAY_HEADERS[data[0]]
            else:
                raise CorruptError(f"{self._what}: field {field!r} must be an array, found msgpack type {data[0]:#04x}")
            if count is not None and found != count:
                raise CorruptError(f"{self._what}: {field!r} lists {found} frames, the header implies {count}")
            limits = dict.fromkeys(("max_str_len", "max_bin_len", "max_array_len", "max_map_len", "max_ext_len"), 0)
            items = msgpack.Unpacker(io.BytesIO(data[body:]), max_buffer_size=max(len(data) - body, 1), **limits)
            values: list[int] = []
            while len(values) < found:
                block = tuple(itertools.islice(items, min(found - len(values), 1 << 16)))
                after = (values[-1] if values else -1) if ascending else None
                if not _integers(block, after):
                    raise CorruptError(f"{self._what}: {field!r} must list {rule}")
                values.extend(block)
        return values

    def value(self, where: str, *, containers: int, items: int) -> Any:
        """Decode the next value: at most ``containers`` maps and arrays (lists come as
        tuples), each of at most ``items`` items."""
        left = containers

        def count(container: Any) -> Any:
            nonlocal left
            left -= 1
            if left < 0:
                raise CorruptError(f"{where}: more than {containers} maps and arrays")
            return container

        with _Parsing(where):
            start = self._unpacker.tell()
            self._unpacker.skip()
            return _unpackb(self._view[start : self._unpacker.tell()], items, object_hook=count, list_hook=count)

    def skip(self, where: str) -> None:
        """Pass over the next value without decoding it (msgpack's parser allocates nothing)."""
        with _Parsing(where):
            self._unpacker.skip()

    def end(self) -> None:
        """Check that the document ends here."""
        if self._unpacker.tell() != len(self._view):
            raise CorruptError(f"{self._what}: {len(self._view) - self._unpacker.tell()} bytes after its end")


def _unpackb(data: Any, items: int, **hooks: Any) -> Any:
    """Decode one msgpack value as a header's values are: arrays as tuples, map keys strings
    or bytes, no extension types, at most ``items`` items in any map or array.

    Raises:
        msgpack's errors, ValueError and TypeError for anything else.
    """
    return msgpack.unpackb(
        data,
        raw=False,
        strict_map_key=True,
        use_list=False,
        max_array_len=items,
        max_map_len=items,
        max_ext_len=0,
        **hooks,
    )


def _small_document(data: bytes, limit: int) -> dict[str, Any] | None:
    """Return the map a header or trailer of at most `SMALL_DOCUMENT_SIZE` bytes holds,
    decoded in one call, when no map or array in it has over `MAX_ITEMS` items and its at most
    ``limit`` keys are strings, none twice; else None.

    Decoding allocates less than ``HEADER_COST * len(data) + 1 MiB``: each byte can be a map
    (about 64 bytes), and a map or array is allocated for the items it declares, at most
    `MAX_ITEMS`, as it starts, in at most 1024 levels (under 600 KiB). Larger documents are
    read piece by piece (`_Reader`)."""
    if len(data) > SMALL_DOCUMENT_SIZE:
        return None
    try:
        doc = _unpackb(data, MAX_ITEMS)
    except Exception:  # any document not within these bounds: `_Reader` reads it or says what is wrong
        return None
    first = data[0]
    declared = first & 0x0F if first >> 4 == 0x8 else int.from_bytes(data[1 : _MAP_HEADERS.get(first, 1)], "big")
    if type(doc) is not dict or len(doc) != declared or len(doc) > limit or any(type(key) is not str for key in doc):
        return None
    return doc


def _small_header(data: bytes) -> dict[str, Any] | None:
    """Return the fields of a small header as blpickle writes it (see `_small_document`), read
    in one call: ``protocol`` an integer, ``options`` a map of scalars, each stream map of known
    keys only (so each field is within the limits `_Reader` applies to it); ``streams`` come as
    `StreamInfo`, ``external`` checked. Return None for any other header: `_Reader` reads it
    piece by piece, or says what is wrong with it."""
    doc = _small_document(data, MAX_HEADER_KEYS)
    if doc is None:
        return None
    options, streams, external = doc.get("options"), doc.get("streams"), doc.get("external", ())
    if (
        type(doc.get("protocol")) is not int
        or type(options) is not dict
        or any(type(value) not in _SCALARS for value in options.values())
        or type(streams) is not tuple
        or not streams
        or any(type(stream) is not dict or not stream.keys() <= _STREAM_KEYS for stream in streams)
        or type(external) is not tuple
        or (external and not _integers(external, -1))
    ):
        return None
    try:
        doc["streams"] = tuple(_decode_stream(stream, i) for i, stream in enumerate(streams))
    except LoadError:
        return None
    return doc


def _header_fields(data: bytes) -> dict[str, Any]:
    """Return the fields of any header, read piece by piece (`_Reader`): ``streams`` as
    `StreamInfo`, ``external`` checked, unknown keys skipped.

    Raises:
        CorruptError, LimitError: for a header that breaks the format or its limits.
    """
    reader = _Reader(data, "header")
    doc: dict[str, Any] = {}
    for key in reader.keys("header", doc):
        if key == "streams":
            doc[key] = reader.streams()
        elif key == "external":
            doc[key] = tuple(reader.integers(key, ascending=True))
        elif key in ("options", "protocol"):
            doc[key] = reader.value(f"header field {key!r}", containers=MAX_CONTAINERS, items=MAX_ITEMS)
        else:
            reader.skip("header")
    reader.end()
    return doc


def _trailer_fields(data: bytes, nframes: int, authenticated: bool) -> dict[str, Any]:
    """Return the fields of any trailer, read piece by piece (`_Reader`), each frame list of
    ``nframes`` checked; unknown keys skipped, or refused when ``authenticated``.

    Raises:
        CorruptError: for a trailer that breaks the format or its limits.
    """
    reader = _Reader(data, "trailer")
    doc: dict[str, Any] = {}
    for key in reader.keys("trailer", doc):
        if key in _FRAME_FIELDS:
            doc[key] = reader.integers(key, count=nframes)
        elif key == "signature":
            doc[key] = reader.value("trailer field 'signature'", containers=0, items=0)
        elif authenticated:
            raise CorruptError(f"trailer: key {key!r} is outside the signature in a signed record")
        else:
            reader.skip("trailer")
    reader.end()
    return doc


def _small_trailer(data: bytes, nframes: int, authenticated: bool) -> dict[str, Any] | None:
    """Return the fields of a small trailer as blpickle writes it, read in one call, its frame
    lists checked; None for any other trailer (see `_small_header`)."""
    doc = _small_document(data, MAX_HEADER_KEYS)
    if (
        doc is None
        or type(doc.get("signature")) not in (str, type(None))
        or (authenticated and not doc.keys() <= _TRAILER_KEYS)
    ):
        return None
    for key in _FRAME_FIELDS:
        values = doc.get(key)
        if type(values) is not tuple or len(values) != nframes or (values and not _integers(values, None)):
            return None
        doc[key] = list(values)
    return doc


def _integers(block: tuple[Any, ...], after: int | None) -> bool:
    """True when ``block`` holds non-negative integers only, at least one, and with ``after``
    given, in ascending order without repeats, all over ``after``."""
    return (
        set(map(type, block)) == {int}
        and min(block) >= 0
        and (after is None or (block[0] > after and all(map(operator.lt, block, block[1:]))))
    )


_SCALARS = frozenset({type(None), bool, int, float, str, bytes})
_STREAM_KEYS = frozenset(StreamInfo._fields)
_FRAME_FIELDS = ("offsets", "csizes", "checksums")
_TRAILER_KEYS = frozenset({*_FRAME_FIELDS, "signature"})


def _get(doc: dict[str, Any], key: str, kind: type, where: str) -> Any:
    if key not in doc:
        raise CorruptError(f"{where}: field {key!r} is missing")
    value = doc[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise CorruptError(f"{where}: field {key!r} must be {kind.__name__}, found {type(value).__name__}")
    return value
