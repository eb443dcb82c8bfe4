"""The header of a record: what it holds (docs/format.md, "Header"), decoded and validated."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any, NamedTuple

import msgpack

from ..errors import CorruptError, LimitError, LoadError
from .documents import Parsing, Reader, get, integers, small_document, small_values
from .preamble import MAX_CHUNK_SIZE, MAX_CONTAINERS, MAX_HEADER_KEYS, MAX_ITEMS, MAX_NDIM, MAX_STREAM_SIZE, MAX_STREAMS


class StreamInfo(NamedTuple):
    """One stream of a record: the pickle (stream 0), an out-of-band buffer, or a splice.

    Attributes:
        nbytes: decompressed size.
        chunk_size: decompressed bytes per chunk (the last one may be shorter).
        itemsize: element size given to the shuffle filter.
        raw: stored uncompressed as one aligned raw chunk instead of compressed Blosc2 chunks.
        dtype: numpy dtype string of the array it holds, if any (informational).
        shape: shape of that array (informational).
        splice: for a large bytes, bytearray or str payload the pickler wrote in band: the
            offset in the pickle stream where its bytes belong. None for out-of-band buffers.
        codec: the Blosc2 codec its chunks were compressed with (informational).
        order: "C" or "F": the memory order of the array's bytes (with dtype and shape).
        name: the path to the array in the dumped object (``"model.coef_"``), if found.
        tensor: the type the array was dumped as when not a numpy array (``"torch.bfloat16"``,
            ``"jax.float32"``, ``"cupy.float32"``: the library and its dtype's name), with
            dtype and shape.
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
        """Number of chunks the stream is stored in."""
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
        `Reader`).

        Raises:
            CorruptError: for anything that is not a valid header.
            LimitError: for sizes over the limits.
        """
        doc = _small_header(data)
        if doc is None:
            doc = _header_fields(data)
        options = get(doc, "options", dict, "header")
        protocol = get(doc, "protocol", int, "header")
        if not 0 <= protocol <= 5:
            raise CorruptError(f"header: pickle protocol {protocol} is not 0 to 5")
        streams = get(doc, "streams", tuple, "header")
        external = get(doc, "external", tuple, "header")
        splices = [s.splice for s in streams[1:] if s.splice is not None]
        if streams[0].splice is not None or splices != sorted(splices) or any(p > streams[0].nbytes for p in splices):
            raise CorruptError("header: splice offsets must be ascending and within the pickle stream")
        _check_names(streams)
        return cls(options, protocol, streams, external)


def _check_names(streams: tuple[StreamInfo, ...]) -> None:
    """Refuse two buffers of one name: a name finds one array (`blpickle.open`).

    Raises:
        CorruptError: naming the name and both buffers.
    """
    seen: dict[str, int] = {}
    for number, stream in enumerate(streams[1:]):
        if stream.name is None:
            continue
        if stream.name in seen:
            raise CorruptError(f"header: buffers {seen[stream.name]} and {number} are both named {stream.name!r:.200}")
        seen[stream.name] = number


def _decode_stream(doc: Any, index: int) -> StreamInfo:
    """Return the stream map ``doc`` (stream ``index``) as a `StreamInfo`.

    Raises:
        CorruptError, LimitError: saying which field is wrong.
    """
    if type(doc) is dict:  # as blpickle writes it: checked in one expression
        field = doc.get
        stream = StreamInfo._make(map(field, StreamInfo._fields))
        nbytes, chunk_size, itemsize, raw, _, shape, splice, _, order, _, _ = stream
        if (
            type(nbytes) is int
            and type(chunk_size) is int
            and type(itemsize) is int
            and type(raw) is bool
            and 0 <= nbytes <= MAX_STREAM_SIZE
            and 1 <= chunk_size <= (MAX_STREAM_SIZE if raw else MAX_CHUNK_SIZE)
            and 1 <= itemsize <= 255
            and type(stream.dtype) in _TEXT
            and type(stream.codec) in _TEXT
            and type(stream.name) in _TEXT
            and type(stream.tensor) in _TEXT
            and order in (None, "C", "F")
            and (splice is None or (type(splice) is int and splice >= 0))
            and (shape is None or (type(shape) is tuple and all(map(_is_size, shape))))
        ):
            return stream
    where = f"header stream {index}"
    if not isinstance(doc, dict):
        raise CorruptError(f"{where}: expected a map, found {type(doc).__name__}")
    nbytes = get(doc, "nbytes", int, where)
    chunk_size = get(doc, "chunk_size", int, where)
    itemsize = get(doc, "itemsize", int, where)
    raw = get(doc, "raw", bool, where)
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
        not isinstance(shape, tuple)
        or any(not isinstance(n, int) or isinstance(n, bool) or not 0 <= n <= MAX_STREAM_SIZE for n in shape)
    ):
        raise CorruptError(f"{where}: shape must be a list of at most {MAX_NDIM} sizes of 0 to {MAX_STREAM_SIZE}")
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


def _read_streams(reader: Reader) -> tuple[StreamInfo, ...]:
    """Read the header's ``streams`` array a run of stream maps at a time (`Reader.runs`):
    the tuple grows only with the maps that are there, whatever count the array declares.
    A run of maps as blpickle writes them is decoded in one call; any other is read a map at
    a time, within `Reader`'s limits, which says what is wrong with it."""
    with Parsing("header field 'streams'"):
        count = reader.unpacker.read_array_header()
    if not 1 <= count <= MAX_STREAMS:
        raise LimitError(f"header: {count} streams, expected 1 to {MAX_STREAMS}")
    streams: list[StreamInfo] = []
    for first, data, number in reader.runs(count, "header stream {}"):
        run = _known_streams(small_values(data, number), first)
        if run is None:
            maps = Reader(data, "header")
            run = tuple(
                _decode_stream(maps.value(f"header stream {i}", containers=MAX_CONTAINERS, items=MAX_ITEMS), i)
                for i in range(first, first + number)
            )
        streams += run
    return tuple(streams)


def _known_streams(maps: tuple[Any, ...] | None, first: int) -> tuple[StreamInfo, ...] | None:
    """Return the stream maps ``maps`` (the first one stream ``first``) as `StreamInfo`, when
    each is a map of known keys only and valid; else None."""
    if maps is None or any(type(stream) is not dict or not stream.keys() <= _STREAM_KEYS for stream in maps):
        return None
    try:
        return tuple(_decode_stream(stream, number) for number, stream in enumerate(maps, first))
    except LoadError:
        return None


def _small_header(data: bytes) -> dict[str, Any] | None:
    """Return the fields of a small header as blpickle writes it (see `small_document`), read
    in one call: ``protocol`` an integer, ``options`` a map of scalars, each stream map of known
    keys only (so each field is within the limits `Reader` applies to it); ``streams`` come as
    `StreamInfo`, ``external`` checked. Return None for any other header: `Reader` reads it
    piece by piece, or says what is wrong with it."""
    doc = small_document(data, MAX_HEADER_KEYS)
    if doc is None:
        return None
    options, streams, external = doc.get("options"), doc.get("streams"), doc.get("external", ())
    if (
        type(doc.get("protocol")) is not int
        or type(options) is not dict
        or any(type(value) not in _SCALARS for value in options.values())
        or type(streams) is not tuple
        or not streams
        or type(external) is not tuple
        or (external and not integers(external, -1))
    ):
        return None
    doc["streams"] = _known_streams(streams, 0)
    return None if doc["streams"] is None else doc


def _header_fields(data: bytes) -> dict[str, Any]:
    """Return the fields of any header, read piece by piece (`Reader`): ``streams`` as
    `StreamInfo`, ``external`` checked, unknown keys skipped.

    Raises:
        CorruptError, LimitError: for a header that breaks the format or its limits.
    """
    reader = Reader(data, "header")
    doc: dict[str, Any] = {}
    for key in reader.keys("header", doc):
        if key == "streams":
            doc[key] = _read_streams(reader)
        elif key == "external":
            doc[key] = tuple(reader.integers(key, ascending=True))
        elif key in ("options", "protocol"):
            doc[key] = reader.value(f"header field {key!r}", containers=MAX_CONTAINERS, items=MAX_ITEMS)
        else:
            reader.skip("header")
    reader.end()
    return doc


_TEXT = frozenset({type(None), str})


def _is_size(value: Any) -> bool:
    return type(value) is int and 0 <= value <= MAX_STREAM_SIZE


_SCALARS = frozenset({type(None), bool, int, float, str, bytes})
_STREAM_KEYS = frozenset(StreamInfo._fields)
