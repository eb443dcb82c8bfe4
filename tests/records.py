"""Take records apart and put them back together with valid checksums (for tests that damage
or forge records in ways the checksums alone would catch)."""

from __future__ import annotations

import dataclasses
from typing import Any

import blosc2
import msgpack

from blpickle import format as fmt
from blpickle.engine.reader import RecordReader
from blpickle.io.sources import MemorySource


@dataclasses.dataclass
class Parts:
    flags: int
    header: dict[str, Any]
    payloads: list[bytes]  # one per frame: the Blosc2 chunk or the raw payload
    raw: list[bool]  # the frame is a raw (aligned) frame
    trailer: dict[str, Any]


def split(data: bytes) -> Parts:
    """Return the parts of a valid record. A compact record comes as the one raw stream of
    its pickle (with its flags), under the header it stands for."""
    reader = RecordReader(MemorySource(data), nthreads=1)
    if reader.compact:
        header = reader.header
        return Parts(fmt.FLAG_COMPACT, {"options": {}, "protocol": header.protocol,
                     "streams": [header.streams[0].to_dict()], "external": []},
                     [bytes(reader.read_stream())], [True], {})  # fmt: skip
    for _ in reader.header.streams:
        reader.skip_stream()
    index = reader.finish()
    flags = fmt.decode_preamble(data[: fmt.PREAMBLE.size])[1]
    header_size = fmt.decode_preamble(data[: fmt.PREAMBLE.size])[2]
    header = msgpack.unpackb(data[fmt.PREAMBLE.size : fmt.PREAMBLE.size + header_size])
    raw = [s.raw for s in reader.header.streams for _ in range(s.nchunks)]
    payloads = [data[o + 8 : o + 8 + c] for o, c in zip(index.offsets, index.csizes, strict=True)]
    trailer_start = len(data) - fmt.FOOTER.size - fmt.FOOTER.unpack(data[-fmt.FOOTER.size :])[0]
    return Parts(flags, header, payloads, raw, msgpack.unpackb(data[trailer_start : len(data) - fmt.FOOTER.size]))


def join(parts: Parts, trailer: dict[str, Any] | None = None) -> bytes:
    """Return a record with every checksum (not the signature) right for ``parts``; the
    trailer is rebuilt from the frames unless one is given. Parts flagged compact make a
    compact record of the first payload (the header and trailer are not part of it)."""
    if parts.flags & fmt.FLAG_COMPACT:
        return fmt.encode_compact(parts.payloads[0] if parts.payloads else b"")
    header_bytes = msgpack.packb(parts.header)
    head = fmt.encode_preamble(len(header_bytes), parts.flags) + header_bytes
    header_checksum = fmt.checksum(head)
    out = bytearray(head + fmt.U64.pack(header_checksum))
    index = fmt.ChunkIndex(signature=parts.trailer.get("signature"))
    for number, (payload, raw) in enumerate(zip(parts.payloads, parts.raw, strict=True)):
        if raw:
            out += bytes(fmt.raw_padding(len(out)))
        checksum = fmt.checksum(payload, fmt.chunk_seed(header_checksum, number))
        index.add(len(out), len(payload), checksum)
        out += fmt.U64.pack(len(payload)) + payload + fmt.U64.pack(checksum)
    trailer_bytes = msgpack.packb(trailer) if trailer is not None else index.encode()
    out += fmt.U64.pack(len(trailer_bytes)) + trailer_bytes
    out += fmt.FOOTER.pack(len(trailer_bytes), fmt.checksum(trailer_bytes, header_checksum), fmt.END_MAGIC)
    return bytes(out)


def with_pickle_stream(record: bytes, stream: bytes) -> bytes:
    """``record`` (one that holds one buffer) with its pickle stream replaced by ``stream``,
    compressed with zstd in one chunk, every checksum right: the out-of-band buffer is
    dropped from the header and the frames."""
    parts = split(record)
    chunk = blosc2.compress2(stream, cparams={"codec": blosc2.Codec.ZSTD, "typesize": 1, "clevel": 9})
    parts.header["streams"] = [
        {"nbytes": len(stream), "chunk_size": len(stream), "itemsize": 1, "raw": False, "codec": "zstd"}
    ]
    parts.payloads, parts.raw = [bytes(chunk)], [False]
    return join(parts)
