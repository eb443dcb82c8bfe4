"""Small records that declare huge data: decompression bombs, forged as an attacker would
(every checksum right), and a way to measure what reading them allocates."""

from __future__ import annotations

import struct
import tracemalloc

import blosc2
import numpy as np
from records import join, split

import blpickle


def zeros_chunk(nbytes: int) -> bytes:
    """A 32-byte Blosc2 chunk that decompresses to ``nbytes`` zeros."""
    chunk = bytearray(blosc2.compress2(bytes(1 << 20)))
    assert len(chunk) == 32
    struct.pack_into("<ii", chunk, 4, nbytes, min(nbytes, 1 << 20))  # nbytes, blocksize
    return bytes(chunk)


def bomb(stream: int, *, key: bytes | None = None, nchunks: int = 6, chunk: int = 64 << 20) -> bytes:
    """A record of a few hundred bytes whose stream ``stream`` (0: the pickle, 1: a buffer)
    declares ``nchunks`` chunks of ``chunk`` zeros, each stored in 32 bytes, with every
    checksum right; with a ``key``, signed-looking with a made-up signature."""
    parts = split(blpickle.dumps([np.ones(100_000, "u1")], key=key, codec="lz4"))
    streams = parts.header["streams"]
    first = sum(-(-s["nbytes"] // s["chunk_size"]) for s in streams[:stream])
    count = -(-streams[stream]["nbytes"] // streams[stream]["chunk_size"])
    streams[stream].update(nbytes=nchunks * chunk, chunk_size=chunk, raw=False, codec="lz4")  # a small pickle is raw
    parts.payloads[first : first + count] = [zeros_chunk(chunk)] * nchunks
    parts.raw[first : first + count] = [False] * nchunks
    if key is not None:
        parts.trailer["signature"] = "0" * 64
    return join(parts)


def peak_allocated(call) -> int:
    """Run ``call``; return the peak of memory allocated meanwhile (tracemalloc)."""
    tracemalloc.start()
    try:
        call()
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return peak
