"""The trailer of a record: where each chunk is stored and its checksum (docs/format.md,
"Trailer")."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import msgpack

from ..errors import ChecksumError, CorruptError, LimitError
from .documents import Reader, get, integers, small_document
from .header import Header, StreamInfo
from .preamble import (
    BLOSC2_MAX_OVERHEAD,
    BLOSC2_MIN_CHUNK,
    END_MAGIC,
    FOOTER,
    MAX_HEADER_KEYS,
    MAX_TRAILER_SIZE,
    U64,
    checksum,
    raw_padding,
)

_HEX_DIGITS = frozenset("0123456789abcdef")


@dataclasses.dataclass
class ChunkIndex:
    """The trailer: where each chunk of the record is and its checksum."""

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
    def decode(cls, data: bytes, nchunks: int, *, authenticated: bool = False) -> ChunkIndex:
        """Decode a trailer that must list ``nchunks`` chunks, allocating a few times its size
        at most (see `Reader`). With ``authenticated`` (its signature is checked),
        refuse keys of any other meaning: the signature covers none.

        Raises:
            CorruptError: for anything that is not a valid trailer.
        """
        doc = _small_trailer(data, nchunks, authenticated)
        if doc is None:
            doc = _trailer_fields(data, nchunks, authenticated)
        lists = [get(doc, key, list, "trailer") for key in _CHUNK_FIELDS]
        signed = doc.get("signature")
        if signed is not None and (not isinstance(signed, str) or len(signed) != 64 or not set(signed) <= _HEX_DIGITS):
            raise CorruptError(f"trailer: 'signature' must be 64 lowercase hex digits, found {signed!r:.80}")
        offsets, csizes, checksums = lists
        return cls(offsets, csizes, checksums, signature=signed)


def total_chunks(streams: Sequence[StreamInfo]) -> int:
    """Return the number of chunks a record with these streams holds."""
    return sum(s.nchunks for s in streams)


def _trailer_fields(data: bytes, nchunks: int, authenticated: bool) -> dict[str, Any]:
    """Return the fields of any trailer, read piece by piece (`Reader`), each chunk list of
    ``nchunks`` checked; unknown keys skipped, or refused when ``authenticated``.

    Raises:
        CorruptError: for a trailer that breaks the format or its limits.
    """
    reader = Reader(data, "trailer")
    doc: dict[str, Any] = {}
    for key in reader.keys("trailer", doc):
        if key in _CHUNK_FIELDS:
            doc[key] = reader.integers(key, count=nchunks)
        elif key == "signature":
            doc[key] = reader.value("trailer field 'signature'", containers=0, items=0)
        elif authenticated:
            raise CorruptError(f"trailer: key {key!r} is outside the signature in a signed record")
        else:
            reader.skip("trailer")
    reader.end()
    return doc


def _small_trailer(data: bytes, nchunks: int, authenticated: bool) -> dict[str, Any] | None:
    """Return the fields of a small trailer as blpickle writes it, read in one call, its chunk
    lists checked; None for any other trailer (see `_small_header`)."""
    doc = small_document(data, MAX_HEADER_KEYS)
    if (
        doc is None
        or type(doc.get("signature")) not in (str, type(None))
        or (authenticated and not doc.keys() <= _TRAILER_KEYS)
    ):
        return None
    for key in _CHUNK_FIELDS:
        values = doc.get(key)
        if type(values) is not tuple or len(values) != nchunks or (values and not integers(values, None)):
            return None
        doc[key] = list(values)
    return doc


_CHUNK_FIELDS = ("offsets", "csizes", "checksums")
_TRAILER_KEYS = frozenset({*_CHUNK_FIELDS, "signature"})


def chunk_name(number: int, chunk: int) -> str:
    """Return how errors name chunk ``chunk`` of stream ``number``."""
    stream = "the pickle stream" if number == 0 else f"buffer {number - 1}"
    return f"chunk {chunk} of {stream}"


def check_trailer_size(size: int) -> None:
    """Raise `LimitError` for a trailer over `MAX_TRAILER_SIZE`, before it is read."""
    if size > MAX_TRAILER_SIZE:
        raise LimitError(f"trailer size {size} is over the limit of {MAX_TRAILER_SIZE} bytes")


def check_footer(trailer: Any, footer: Any, header_checksum: int, offset: int) -> None:
    """Check the footer that follows the trailer starting at ``offset``: its checksum (seeded
    with the header's), its size field and its magic.

    Raises:
        ChecksumError: for a trailer that does not match its checksum.
        CorruptError: for a footer that does not match the trailer.
    """
    size, stored, end_magic = FOOTER.unpack(footer)
    computed = checksum(trailer, header_checksum)
    if stored != computed:
        raise ChecksumError("the trailer", offset, stored, computed)
    if size != len(trailer) or end_magic != END_MAGIC:
        raise CorruptError(f"the footer at offset {offset + len(trailer)} does not match the trailer")


@dataclasses.dataclass(frozen=True)
class RecordIndex:
    """A record's trailer, checked against its header: where every chunk is stored.

    Attributes:
        chunks: the trailer's lists (offsets, stored sizes, checksums) and signature.
        first: the number of each stream's first chunk.
        stored: the bytes each stream's chunks store.
        end: where the chunks end: the offset of the trailer's size field.
    """

    chunks: ChunkIndex
    first: tuple[int, ...]
    stored: tuple[int, ...]
    end: int


def parse_index(
    header: Header, trailer: bytes, data_start: int, end: int, *, authenticated: bool = False
) -> RecordIndex:
    """Decode the trailer of a record whose header is ``header``, whose first chunk starts at
    ``data_start`` and whose trailer's size field is at ``end``, and check that its chunks are
    the record's (docs/format.md, "The record index"): each stream's chunks in order, every
    chunk right after the one before (a raw chunk after the zero padding that aligns it), a
    compressed chunk storing `BLOSC2_MIN_CHUNK` to its data + `BLOSC2_MAX_OVERHEAD` bytes,
    a raw one its stream's size, and the last one ending at ``end``. The one parser of a
    record's index: loading, `blpickle.open`, `blpickle.inspect` and ``verify`` read it here.

    Raises:
        CorruptError: for a trailer that is not valid or lists other chunks, naming the first
            one that is not where or of the size the rules allow.
    """
    index = ChunkIndex.decode(trailer, total_chunks(header.streams), authenticated=authenticated)
    pos, entry = data_start, 0
    first, stored = [], []
    for number, info in enumerate(header.streams):
        first.append(entry)
        first_entry = entry
        for chunk, (low, high) in enumerate(info.chunk_spans()):
            offset, csize = index.offsets[entry], index.csizes[entry]
            expected = pos + raw_padding(pos) if info.raw else pos
            valid = csize == info.nbytes if info.raw else BLOSC2_MIN_CHUNK <= csize <= high - low + BLOSC2_MAX_OVERHEAD
            if offset != expected or not valid:
                rule = "its stream's size" if info.raw else f"{BLOSC2_MIN_CHUNK} to {high - low + BLOSC2_MAX_OVERHEAD}"
                raise CorruptError(
                    f"the trailer places {chunk_name(number, chunk)} at offset {offset} with {csize} stored bytes: "
                    f"it must start at offset {expected} and store {rule} bytes"
                )
            pos = offset + 2 * U64.size + csize
            entry += 1
        stored.append(sum(index.csizes[first_entry:entry]))
    if pos != end:
        raise CorruptError(f"the chunks the trailer lists end at offset {pos}, its trailer starts at offset {end}")
    return RecordIndex(index, tuple(first), tuple(stored), end)
