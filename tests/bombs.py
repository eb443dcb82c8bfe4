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


def value_chunk(value: int, nbytes: int) -> bytes:
    """A 33-byte Blosc2 chunk that decompresses to ``nbytes`` bytes of ``value`` (a chunk of
    Blosc2's "special value" kind)."""
    chunk = bytearray(zeros_chunk(nbytes))
    chunk[3] = 1  # typesize: the value is one byte
    chunk[31] = (chunk[31] & 0x8F) | (3 << 4)  # special value (3), instead of zeros (1)
    struct.pack_into("<i", chunk, 12, 33)  # cbytes
    return bytes(chunk) + bytes([value])


def opcode_bomb(opcode: bytes, nchunks: int, chunk: int = 2 << 20) -> bytes:
    """A record of a few hundred bytes whose protocol 1 pickle stream is ``nchunks`` chunks
    of ``chunk`` copies of the one-byte ``opcode`` (each stored in 33 bytes, within the
    2**16 ratio a pickle stream may have), then STOP; every checksum right."""
    parts = split(blpickle.dumps([np.ones(100_000, "u1")], codec="lz4"))
    count = -(-parts.header["streams"][0]["nbytes"] // parts.header["streams"][0]["chunk_size"])
    parts.header["protocol"] = 1
    parts.header["streams"][0].update(nbytes=nchunks * chunk + 1, chunk_size=chunk, raw=False, codec="zstd")
    parts.payloads[0:count] = [value_chunk(opcode[0], chunk)] * nchunks + [blosc2.compress2(b".", typesize=1)]
    parts.raw[0:count] = [False] * (nchunks + 1)
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
