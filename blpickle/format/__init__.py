"""The byte layout of a blpickle record, specified in ``docs/format.md``: pure encoding and
decoding with validation, no I/O (reading and writing records lives in `blpickle.engine`).

A record is:

```text
preamble | header | header checksum | chunks of stream 0 .. n-1 | trailer block
```

or, for the compact kind (a small pickle and no out-of-band buffer):

```text
preamble (flag compact) | pickle | checksum
```

Modules: `.preamble` (magic numbers, versions, fixed-size fields, the compact record, limits,
checksums), `.header`, `.trailer` (and the record index every reader checks), `.documents`
(msgpack within limits), `.dtypes` (an array's dtype as text), `.layout` and `.scan` (the
pickle stream's layout and its opcodes). The names below are the ones readers and writers use.
"""

from __future__ import annotations

from .header import Header, StreamInfo, compact_header
from .preamble import (
    ALIGNMENT,
    BLOSC2_MAX_OVERHEAD,
    BLOSC2_MIN_CHUNK,
    BLOSC2_SIZES,
    COMPACT_OVERHEAD,
    END_MAGIC,
    FLAG_COMPACT,
    FLAG_SIGNED,
    FOOTER,
    HEADER_COST,
    JOBLIB_MAGIC,
    MAGIC,
    MAX_CHUNK_SIZE,
    MAX_CONTAINERS,
    MAX_GRAPH_RATIO,
    MAX_HEADER_KEYS,
    MAX_HEADER_SIZE,
    MAX_ITEMS,
    MAX_NDIM,
    MAX_STREAM_SIZE,
    MAX_STREAMS,
    MAX_TRAILER_SIZE,
    PICKLE_OPCODES,
    PREAMBLE,
    SMALL_DOCUMENT_SIZE,
    U64,
    VERSION_MAJOR,
    VERSION_MINOR,
    check_header_size,
    checked_compact_pickle,
    checksum,
    chunk_digest,
    chunk_seed,
    compact_ends,
    compact_size,
    damaged_magic,
    decode_preamble,
    encode_compact,
    encode_preamble,
    raw_padding,
    signature,
)
from .trailer import ChunkIndex, total_chunks

__all__ = [
    "ALIGNMENT",
    "BLOSC2_MAX_OVERHEAD",
    "BLOSC2_MIN_CHUNK",
    "BLOSC2_SIZES",
    "COMPACT_OVERHEAD",
    "END_MAGIC",
    "FLAG_COMPACT",
    "FLAG_SIGNED",
    "FOOTER",
    "HEADER_COST",
    "JOBLIB_MAGIC",
    "MAGIC",
    "MAX_CHUNK_SIZE",
    "MAX_CONTAINERS",
    "MAX_GRAPH_RATIO",
    "MAX_HEADER_KEYS",
    "MAX_HEADER_SIZE",
    "MAX_ITEMS",
    "MAX_NDIM",
    "MAX_STREAMS",
    "MAX_STREAM_SIZE",
    "MAX_TRAILER_SIZE",
    "PICKLE_OPCODES",
    "PREAMBLE",
    "SMALL_DOCUMENT_SIZE",
    "U64",
    "VERSION_MAJOR",
    "VERSION_MINOR",
    "ChunkIndex",
    "Header",
    "StreamInfo",
    "check_header_size",
    "checked_compact_pickle",
    "checksum",
    "chunk_digest",
    "chunk_seed",
    "compact_ends",
    "compact_header",
    "compact_size",
    "damaged_magic",
    "decode_preamble",
    "encode_compact",
    "encode_preamble",
    "raw_padding",
    "signature",
    "total_chunks",
]
