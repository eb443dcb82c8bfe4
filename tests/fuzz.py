"""A structure-aware fuzzer for blpickle's readers.

Each case takes a valid record of one of several kinds (:data:`KINDS`), mutates it as an
attacker who knows the format would (header fields, preamble flags, streams and their sizes,
splice offsets, the pickle opcodes of stream 0, Blosc2 chunk headers and bytes, frames,
trailer fields), then recomputes every checksum, and the signature of a signed record when
the attacker holds the key. The result goes to ``loads``, ``loads(safe=True)``,
``loads(key=...)``, ``inspect``, ``inspect(verify=False)`` and the CLI's ``info`` and
``verify``.

The targets fall in two classes, reported apart:

- **guaranteed**: ``loads(safe=True)``, ``inspect``, ``inspect(verify=False)``, ``cli info``,
  ``cli verify`` and ``loads(key=...)`` when the attacker has no key. These are what
  blpickle promises to be safe on any input: a case fails when one of them raises an
  exception outside blpickle's tree (:class:`blpickle.LoadError`), crashes the process,
  runs longer than :data:`TIME_BOUND`, raises the process's peak RSS more than its memory
  bound (:func:`memory_bound`), when ``loads(key=...)`` accepts a record altered without
  the key, or when the unrestricted ``loads`` imports a global that ``inspect`` (which
  succeeded on the same record) did not list, while it listed no ``<computed>`` one: what
  inspect reports must be what load runs.
- **unrestricted**: ``loads``, and ``loads(key=...)`` of a record the attacker signed with
  the key, run whatever the attacker's pickle names, as ``pickle.loads`` does, which is
  documented as unsafe on untrusted data (numpy's ``__setstate__`` can crash on crafted
  state, a memo index allocates what it names). What they do is counted and listed, not
  a failure: exceptions out of the tree (but those that ``find_class`` and Python code
  outside blpickle that the pickle calls raise, as ``pickle.loads`` raises them), crashes,
  hangs and memory over the bound.

Cases run in batches in worker subprocesses, each case in a child forked from its clean
worker, so that a crash or a hang costs one case and what an unrestricted load leaves behind
(a heap corrupted by numpy's reconstructors) cannot crash the next case; each case is
reproducible from its seed and number::

    python tests/fuzz.py --cases 100000             # the long run (docs/security.md)
    python tests/fuzz.py --seed 0 --case 1234       # one case, in this process, with tracebacks
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import functools
import gc
import io
import json
import os
import pickletools
import queue
import random
import resource
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import blosc2
import msgpack
import numpy as np
import records

import blpickle
from blpickle import cli
from blpickle import format as fmt
from blpickle.restricted.machine import COPIES_PER_BYTE, COPIES_SLACK

KEY = b"fuzz key"
#: The targets that run any global the pickle names (``loads(key=...)`` on a record the
#: attacker signed).
UNRESTRICTED = ("loads", "loads(key=..., signed by the attacker)")
#: A target may raise the process's peak RSS by at most this many bytes, plus what it
#: legitimately holds (see `memory_bound`).
MEMORY_BOUND = 256 << 20
#: A worker may map at most this many bytes more than it had mapped before its first case.
ADDRESS_SPACE_BOUND = 3 << 30
#: The largest stream of zeros the mutator writes (a decompression bomb).
BOMB_SIZE = 512 << 20
#: A target may run at most this many seconds on a case (else it hangs).
TIME_BOUND = 60.0
#: Globals the opcode mutator writes into pickles: harmless to call with any arguments (the
#: unrestricted ``loads`` runs them); ``safe=True`` allows OrderedDict and the last three.
INJECTED_GLOBALS = [
    ("builtins", "len"),
    ("builtins", "getattr"),
    ("os", "getpid"),
    ("collections", "OrderedDict"),
    ("numpy", "testing"),
    ("numpy", "ndarray.__class__"),
    ("nosuchmodule", "x"),
    ("blpickle.arrays", "nosuchname"),
    ("numpy", "dtype"),
    ("builtins", "set"),
    ("blpickle.arrays", "rebuild_ndarray"),
]
INTERESTING = [0, 1, 2, 7, 31, 32, 33, 63, 64, 255, 256, 4095, 4096, 65535, 65536, 2**20, 2**30, 2**31 - 1,
               2**31, 2**32 - 1, 2**32, 2**40, 2**62, 2**63 - 1, 2**63, 2**64 - 1]  # fmt: skip


def _payload(big: bool, splice: str | None) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "small": np.arange(100, dtype=np.int16),
        "fortran": np.asfortranarray(np.arange(12.0).reshape(3, 4)),
        "structured": np.zeros(3, dtype=[("a", "<i4"), ("b", "<f8", (2,))]),
        "objects": np.array([1, "a", None], dtype=object),
        "scalar": np.float32(1.5),
        "dtype": np.dtype(">u2"),
        "nested": [1, 2.5, None, True, (3, "x"), {4, 5}, frozenset({6}), complex(1, 2), bytearray(b"ba"), "caf\u00e9"],
        "bytes": b"\x00\x01" * 10,
    }
    if big:
        obj["big"] = np.arange(40_000, dtype=np.float64)  # out of band, several chunks
        obj["shared"] = [obj["big"][::2], obj["big"]]
    if splice:  # 1 MiB and more, at protocol 4 and 5: spliced out of the pickle stream
        obj[splice] = {"bytes": bytes(range(256)) * 4097, "str": "ab" * (1 << 19) + "\u00e9",
                       "bytearray": bytearray(b"xyz" * 350_000)}[splice]  # fmt: skip
    return obj


@dataclasses.dataclass(frozen=True)
class Kind:
    name: str
    big: bool
    splice: str | None  # the type of the spliced payload, if any
    options: dict[str, Any]

    @property
    def signed(self) -> bool:
        return "key" in self.options

    def record(self) -> bytes:
        return blpickle.dumps(_payload(self.big, self.splice), **self.options)


KINDS = [
    Kind("default", True, "bytes", {"chunk_size": 65536}),
    Kind("small", False, None, {}),
    Kind("raw", True, "bytearray", {"codec": None}),
    Kind("signed", True, "str", {"key": KEY, "chunk_size": 65536}),
    Kind("signed-raw", True, None, {"key": KEY, "codec": None}),
    Kind("protocol-2", True, None, {"protocol": 2, "chunk_size": 65536}),
    Kind("protocol-4", False, "str", {"protocol": 4, "codec": "lz4", "chunk_size": 65536}),
    Kind("small-chunks", True, None, {"chunk_size": 4096, "codec": "blosclz", "shuffle": "bitshuffle"}),
]


@dataclasses.dataclass
class Stream:
    """One stream of a record under mutation, decompressed."""

    data: bytes
    raw: bool
    chunk_size: int
    frames: list[tuple[bytes, bool]]  # (payload, raw) of its frames as they were written
    dirty: bool = False  # frames must be rebuilt from data


@dataclasses.dataclass
class Case:
    """A record taken apart, to be mutated and put together again."""

    kind: Kind
    number: int
    parts: records.Parts
    streams: list[Stream]
    frames: list[tuple[bytes, bool]] | None = None  # (payload, raw) per frame, once encoded
    trailer: dict[str, Any] | None = None  # a forged trailer, else rebuilt from the frames
    has_key: bool = False  # the attacker signs the result
    log: list[str] = dataclasses.field(default_factory=list)

    @classmethod
    def from_record(cls, kind: Kind, data: bytes) -> Case:
        parts = records.split(data)
        streams, frame = [], 0
        for info in parts.header["streams"]:
            nchunks = fmt.StreamInfo(info["nbytes"], info["chunk_size"], raw=info["raw"]).nchunks
            payloads = parts.payloads[frame : frame + nchunks]
            frame += nchunks
            data = b"".join(payloads) if info["raw"] else b"".join(blosc2.decompress2(p) for p in payloads)
            streams.append(Stream(data, info["raw"], info["chunk_size"], [(p, info["raw"]) for p in payloads]))
        return cls(kind, -1, parts, streams)

    def encode_frames(self) -> None:
        """Build the frames from the streams (rebuilding those that changed) and set the
        header's size of each stream that changed."""
        frames: list[tuple[bytes, bool]] = []
        for number, stream in enumerate(self.streams):
            if not stream.dirty:
                frames += stream.frames
            elif stream.raw:
                frames += [(stream.data, True)] if stream.data else []
            else:
                frames += [(_compress(stream.data[i : i + stream.chunk_size]), False)
                           for i in range(0, len(stream.data), stream.chunk_size)]  # fmt: skip
            infos = self.parts.header.get("streams")
            if stream.dirty and isinstance(infos, list) and number < len(infos) and isinstance(infos[number], dict):
                infos[number]["nbytes"] = len(stream.data)
        self.frames = frames

    def to_bytes(self) -> bytes:
        """Return the record with every checksum right (and its signature, when the
        attacker holds the key)."""
        parts = dataclasses.replace(
            self.parts,
            payloads=[p for p, _ in self.frames],
            raw=[r for _, r in self.frames],
            trailer=dict(self.parts.trailer),
        )
        if self.has_key:
            header_bytes = msgpack.packb(parts.header)
            head = fmt.encode_preamble(len(header_bytes), parts.flags) + header_bytes
            parts.trailer["signature"] = fmt.signature(KEY, head, [fmt.chunk_digest(p) for p in parts.payloads])
        return records.join(parts, self.trailer)


def _compress(data: bytes) -> bytes:
    return blosc2.compress2(data, typesize=1, clevel=5, codec=blosc2.Codec.ZSTD, nthreads=1)


# --------------------------------------------------------------------------------------------
# Mutations of the record's logical content: pickle opcodes, splices, stream data.


def _pickle_ops(case: Case) -> list[tuple[int, pickletools.OpcodeInfo, Any, int]]:
    """Return ``(position, opcode, argument, length)`` of every opcode of stream 0, with
    positions in stream 0 (spliced payloads not counted)."""
    header = case.parts.header["streams"]
    splices = [(h["splice"], case.streams[i].data) for i, h in enumerate(header) if "splice" in h]
    full, inserted, last = bytearray(), [], 0
    stream0 = case.streams[0].data
    for offset, data in splices:
        full += stream0[last:offset]
        inserted.append((len(full), len(data)))
        full += data
        last = offset
    full += stream0[last:]
    ops = []
    try:
        for op, arg, pos in pickletools.genops(bytes(full)):
            start = pos - sum(size for at, size in inserted if at < pos)
            ops.append((start, op, arg, 0))
    except Exception:  # a pickle mutated before: keep the opcodes read so far
        pass
    with_length = []
    for n, (start, op, arg, _) in enumerate(ops):
        end = ops[n + 1][0] if n + 1 < len(ops) else len(stream0)
        with_length.append((start, op, arg, end - start))
    return with_length


def _replace(case: Case, start: int, length: int, new: bytes, fix_frames: bool) -> None:
    """Replace ``length`` bytes at ``start`` of stream 0 by ``new``, moving the splice
    offsets after it (and the size of the FRAME holding it, with ``fix_frames``)."""
    stream = case.streams[0]
    data = bytearray(stream.data)
    delta = len(new) - length
    if fix_frames and delta:
        frame_starts = [(p, a) for p, op, a, _ in _pickle_ops(case) if op.name == "FRAME" and p < start]
        if frame_starts:
            at, size = frame_starts[-1]
            if at + 9 + size > start:
                data[at + 1 : at + 9] = (size + delta).to_bytes(8, "little")
    data[start : start + length] = new
    stream.data, stream.dirty = bytes(data), True
    for info in case.parts.header["streams"][1:]:
        if isinstance(info.get("splice"), int) and info["splice"] > start:
            info["splice"] = max(info["splice"] + delta, start)


OPCODE_TEMPLATES = [
    b".", b"0", b"1", b"2", b"(", b"t", b")", b"R", b"b", b"s", b"u", b"a", b"e", b"l", b"]", b"}", b"d",
    b"N", b"\x88", b"\x89", b"\x81", b"\x92", b"\x90", b"\x91", b"\x8f", b"\x93", b"\x94", b"\x97", b"\x98",
    b"\x85", b"\x86", b"\x87", b"h\x00", b"h\xff", b"j\xff\xff\xff\x7f", b"q\x00", b"K\x05", b"J\xff\xff\xff\xff",
    b"\x8a\x09" + b"\xff" * 9, b"\x8c\x00", b"\x8c\x05numpy", b"C\x03abc", b"B\xff\xff\xff\x7f",
    b"\x8e" + (2**40).to_bytes(8, "little"), b"\x8d" + (2**62).to_bytes(8, "little"),
    b"\x96" + (2**61).to_bytes(8, "little"), b"X\x05\x00\x00\x00\xff\xfe\xfd\xfc\xfb",
    b"\x95" + (2**50).to_bytes(8, "little"), b"\x80\x05", b"\x80\x09", b"\x82\x01", b"\x84\xff\xff\xff\xff",
    b"I01\n", b"L99999999999999999999\n", b"F1e999\n", b"S'x'\n", b"V\\u00\n", b"p0\n", b"g0\n", b"P\n",
]  # fmt: skip
SIZE_OPCODES = {"BINBYTES", "BINBYTES8", "BINUNICODE", "BINUNICODE8", "BYTEARRAY8", "FRAME", "LONG4",
                "BINSTRING", "SHORT_BINBYTES", "SHORT_BINUNICODE", "SHORT_BINSTRING", "LONG1"}  # fmt: skip


def mutate_opcodes(case: Case, rng: random.Random) -> None:
    ops = [op for op in _pickle_ops(case) if op[3] > 0]
    if not ops:
        return
    start, op, arg, length = rng.choice(ops)
    data = case.streams[0].data
    fix = rng.random() < 0.7
    choice = rng.randrange(8)
    if choice == 0:  # another opcode byte, same arguments
        new = bytes([rng.choice([o.code.encode("latin-1")[0] for o in pickletools.opcodes] + [rng.randrange(256)])])
        _replace(case, start, 1, new, fix)
        case.log.append(f"opcode {op.name} at {start} -> {new!r}")
    elif choice == 1:  # delete it
        _replace(case, start, length, b"", fix)
        case.log.append(f"delete {op.name} at {start}")
    elif choice == 2:  # insert an opcode before it
        new = rng.choice(OPCODE_TEMPLATES)
        _replace(case, start, 0, new, fix)
        case.log.append(f"insert {new[:12]!r} at {start}")
    elif choice == 3:  # duplicate it
        _replace(case, start, 0, data[start : start + length], fix)
        case.log.append(f"duplicate {op.name} at {start}")
    elif choice == 4 and op.arg is not None and op.arg.n > 0 and op.arg.n <= 8:  # a fixed-size argument
        width = op.arg.n
        value = rng.choice([*INTERESTING, arg + 1 if isinstance(arg, int) else 1, rng.randrange(256**width)])
        field = (value % 256**width).to_bytes(width, "little")
        _replace(case, start + 1, width, field, fix)
        case.log.append(f"argument of {op.name} at {start} -> {value}")
    elif choice == 5 and op.name in SIZE_OPCODES:  # a size field, the payload left as is
        width = {"BINBYTES8": 8, "BINUNICODE8": 8, "BYTEARRAY8": 8, "FRAME": 8}.get(op.name, 4)
        width = 1 if op.name.startswith("SHORT_") or op.name == "LONG1" else width
        value = rng.choice(INTERESTING) % 256**width
        _replace(case, start + 1, width, value.to_bytes(width, "little"), fix)
        case.log.append(f"size of {op.name} at {start} -> {value}")
    elif choice == 6:  # a global the pickle names
        module, name = rng.choice(INJECTED_GLOBALS)
        new = _short_unicode(module) + _short_unicode(name) + b"\x93"
        if op.name in ("GLOBAL", "STACK_GLOBAL") and rng.random() < 0.5:
            new = f"c{module}\n{name}\n".encode()
            _replace(case, start, length, new, fix)
        else:
            _replace(case, start, 0, new, fix)
        case.log.append(f"global {module}.{name} at {start}")
    else:  # swap it with the next opcode
        following = [o for o in ops if o[0] == start + length]
        if following:
            _, op2, _, length2 = following[0]
            swapped = data[start + length : start + length + length2] + data[start : start + length]
            _replace(case, start, length + length2, swapped, False)
            case.log.append(f"swap {op.name} and {op2.name} at {start}")


def _short_unicode(text: str) -> bytes:
    raw = text.encode()
    return b"\x8c" + bytes([len(raw)]) + raw


def mutate_splices(case: Case, rng: random.Random) -> None:
    infos = case.parts.header["streams"]
    spliced = [i for i, h in enumerate(infos) if "splice" in h]
    if not spliced:
        return mutate_opcodes(case, rng)
    number = rng.choice(spliced)
    info = infos[number]
    choice = rng.randrange(5)
    if choice == 0:  # move the offset a little, or anywhere in the pickle
        delta = rng.choice([-9, -8, -5, -4, -1, 1, 4, 8, 9, rng.randrange(-1000, 1000)])
        info["splice"] = max(0, info["splice"] + delta)
        if rng.random() < 0.3:
            info["splice"] = rng.randrange(len(case.streams[0].data) + 1)
        case.log.append(f"splice {number} offset -> {info['splice']}")
    elif choice == 1:  # the payload resized (its opcode's size field left as is)
        size = rng.choice([0, 1, len(case.streams[number].data) - 1, len(case.streams[number].data) + 1])
        stream = case.streams[number]
        stream.data, stream.dirty = (stream.data * 2)[:size], True
        case.log.append(f"splice {number} size -> {size}")
    elif choice == 2:  # an out-of-band buffer becomes a splice, or the other way round
        other = rng.randrange(1, len(infos))
        if "splice" in infos[other]:
            del infos[other]["splice"]
        else:
            infos[other]["splice"] = info["splice"]
        case.log.append(f"stream {other} splice toggled")
    elif choice == 3:  # a splice in the middle of a bytes literal that looks like a payload opcode
        fake = b"C\x11\x8e" + len(case.streams[number].data).to_bytes(8, "little") + b"\x8cposix"[:6]
        at = info["splice"] - 9 - rng.randrange(0, 3)
        if at > 0:
            _replace(case, at, 0, fake, True)
            case.log.append(f"fake payload opcode inserted at {at}")
    else:  # the payload's contents become pickle opcodes
        stream = case.streams[number]
        stream.data = (b"\x8c\x02os\x8c\x06getpid\x93)R0" + stream.data)[: len(stream.data)]
        stream.dirty = True
        case.log.append(f"splice {number} holds opcodes")
    return None


def mutate_stream_data(case: Case, rng: random.Random) -> None:
    """Resize or rewrite a stream, its header size following (a consistent forgery)."""
    number = rng.randrange(len(case.streams))
    stream = case.streams[number]
    choice = rng.randrange(4)
    if choice == 0:
        size = rng.choice(
            [0, 1, len(stream.data) // 2, len(stream.data) - 1, len(stream.data) + 1, len(stream.data) * 2]
        )
        stream.data = (stream.data * 3)[:size] if stream.data else bytes(size)
    elif choice == 1:
        data = bytearray(stream.data)
        for _ in range(rng.randint(1, 8)):
            if data:
                data[rng.randrange(len(data))] ^= rng.randrange(1, 256)
        stream.data = bytes(data)
    elif choice == 2 and number == 0 and rng.random() < 0.1:  # a decompression bomb: the pickle, then zeros
        stream.data = stream.data + bytes(rng.choice([1 << 20, 16 << 20, 64 << 20, BOMB_SIZE]))
        stream.chunk_size = fmt.MAX_CHUNK_SIZE if rng.random() < 0.5 else stream.chunk_size
        case.parts.header["streams"][0]["chunk_size"] = stream.chunk_size
    else:
        stream.chunk_size = rng.choice([4096, 65536, 1 << 20])
        case.parts.header["streams"][number]["chunk_size"] = stream.chunk_size
    stream.dirty = True
    case.log.append(f"stream {number} rewritten ({choice}), {len(stream.data)} bytes")


# --------------------------------------------------------------------------------------------
# Mutations of the encoded record: header fields, frames, Blosc2 chunks, trailer.


def _any_value(rng: random.Random, like: Any = None) -> Any:
    choices: list[Any] = [
        rng.choice(INTERESTING),
        -1,
        -(2**63),
        rng.choice([True, False, None, 1.5, float("nan"), "", "x" * 3, "\u00e9" * 64, b"\x00\x01", [], {}, [1, 2]]),
        [rng.choice(INTERESTING)] * rng.randint(0, 4),
        {"a": 1},
    ]
    if isinstance(like, int) and not isinstance(like, bool):
        choices += [like + rng.choice([-1, 1, -64, 64]), like * 2, like // 2]
    value = rng.choice(choices)
    return value if not isinstance(value, int) or -(2**63) <= value < 2**64 else 2**64 - 1  # msgpack's range


STREAM_FIELDS = ["nbytes", "chunk_size", "itemsize", "raw", "dtype", "shape", "splice", "codec", "unknown"]


def mutate_header(case: Case, rng: random.Random) -> None:
    header = case.parts.header
    streams = header["streams"]
    choice = rng.randrange(6)
    if choice <= 1:
        info = streams[rng.randrange(len(streams))]
        field = rng.choice(STREAM_FIELDS)
        if rng.random() < 0.15:
            info.pop(field, None)
            case.log.append(f"header stream field {field} dropped")
        else:
            info[field] = _any_value(rng, info.get(field))
            case.log.append(f"header stream field {field} -> {info[field]!r:.40}")
    elif choice == 2:
        field = rng.choice(["protocol", "external", "options", "streams", "other"])
        header[field] = rng.choice([_any_value(rng, header.get(field)), [0], [0, 0], [1, 0], list(range(5))])
        case.log.append(f"header {field} -> {header[field]!r:.40}")
    elif choice == 3:  # streams dropped, repeated or reordered (with their data)
        i, j = rng.randrange(len(streams)), rng.randrange(len(streams))
        how = rng.choice(["drop", "repeat", "swap"])
        if how == "drop" and len(streams) > 1:
            del streams[i], case.streams[i]
        elif how == "repeat":
            streams.insert(j, copy.deepcopy(streams[i]))
            case.streams.insert(j, dataclasses.replace(case.streams[i], dirty=True))
        else:
            streams[i], streams[j] = streams[j], streams[i]
            case.streams[i], case.streams[j] = case.streams[j], case.streams[i]
            case.streams[i].dirty = case.streams[j].dirty = True
        case.log.append(f"header streams {how} {i} {j}")
        case.frames = None  # rebuilt from the streams
    elif choice == 4:
        case.parts.flags = rng.choice([0, 1, 2, 3, 0xFFFF, case.parts.flags ^ fmt.FLAG_SIGNED])
        case.log.append(f"flags -> {case.parts.flags}")
    else:
        header["bomb"] = [[0] * 1000] * rng.choice([1, 10, 100])
        case.log.append("header padded")


def mutate_frames(case: Case, rng: random.Random) -> None:
    frames = case.frames
    if not frames:
        return
    number = rng.randrange(len(frames))
    payload, raw = frames[number]
    choice = rng.randrange(6)
    if choice == 0 and not raw and len(payload) >= 32:  # a field of the Blosc2 chunk header
        data = bytearray(payload)
        at = rng.choice([0, 1, 2, 3, 4, 8, 12, 16, 22, 23, 24, 31, rng.randrange(32)])
        width = 4 if at in (4, 8, 12) else 1
        value = rng.choice([0, 1, 2**31 - 1, 2**32 - 1, len(payload), rng.randrange(256**width)]) % 256**width
        data[at : at + width] = value.to_bytes(width, "little")
        frames[number] = (bytes(data), raw)
        case.log.append(f"frame {number} chunk header byte {at} -> {value}")
    elif choice == 1:  # bytes of the chunk
        data = bytearray(payload)
        for _ in range(rng.randint(1, 8)):
            if data:
                data[rng.randrange(len(data))] ^= rng.randrange(1, 256)
        frames[number] = (bytes(data), raw)
        case.log.append(f"frame {number} bytes flipped")
    elif choice == 2:  # resized
        size = rng.choice([0, 31, 32, len(payload) - 1, len(payload) + 1, len(payload) * 2])
        frames[number] = ((payload * 3)[:size], raw)
        case.log.append(f"frame {number} resized to {size}")
    elif choice == 3:  # swapped, repeated or dropped
        other = rng.randrange(len(frames))
        how = rng.choice(["swap", "repeat", "drop"])
        if how == "swap":
            frames[number], frames[other] = frames[other], frames[number]
        elif how == "repeat":
            frames.insert(other, frames[number])
        else:
            del frames[number]
        case.log.append(f"frame {number} {how} {other}")
    elif choice == 4:  # another chunk of the same size, compressed from other data
        size = blosc2.get_cbuffer_sizes(payload)[0] if not raw and len(payload) >= 32 else len(payload)
        size = min(size, 4 << 20)  # what an earlier mutation of the chunk header declares, within reason
        pattern = rng.choice([b"\x00", b"\xff", b"\x8c\x02os\x8c\x06getpid\x93)R."])
        filler = (pattern * (size // len(pattern) + 1))[:size]
        frames[number] = (filler if raw else _compress(filler), raw)
        case.log.append(f"frame {number} replaced by other data")
    else:  # raw and compressed frames mixed up
        frames[number] = (payload, not raw)
        case.log.append(f"frame {number} raw -> {not raw}")


def mutate_trailer(case: Case, rng: random.Random) -> None:
    trailer = msgpack.unpackb(_trailer_bytes(case.to_bytes()))
    choice = rng.randrange(5)
    if choice <= 1:
        field = rng.choice(["offsets", "csizes", "checksums"])
        column = trailer[field]
        if column and rng.random() < 0.7:
            column[rng.randrange(len(column))] = _any_value(rng, column[0])
        else:
            trailer[field] = rng.choice([column[:-1], [*column, 0], _any_value(rng)])
        case.log.append(f"trailer {field} changed")
    elif choice == 2:
        trailer["signature"] = rng.choice(
            ["\u00e9" * 64, "g" * 64, "0" * 63, "0" * 65, "0" * 64, "A" * 64, b"0" * 64, 64, None, "\x00" * 64]
        )
        case.log.append(f"trailer signature -> {trailer['signature']!r:.20}")
    elif choice == 3:
        trailer.pop(rng.choice(["offsets", "csizes", "checksums", "signature"]), None)
        case.log.append("trailer field dropped")
    else:
        trailer[rng.choice(["extra", "offsets"])] = _any_value(rng)
        case.log.append("trailer field added")
    case.trailer = trailer


def _trailer_bytes(data: bytes) -> bytes:
    size = fmt.FOOTER.unpack(data[-fmt.FOOTER.size :])[0]
    return data[len(data) - fmt.FOOTER.size - size : len(data) - fmt.FOOTER.size]


LOGICAL = [mutate_opcodes, mutate_opcodes, mutate_splices, mutate_stream_data]
ENCODED = [mutate_header, mutate_header, mutate_frames, mutate_trailer]


# --------------------------------------------------------------------------------------------
# Cases and their targets


_BASES: dict[str, tuple[bytes, Case]] = {}


def _base(kind: Kind) -> tuple[bytes, Case]:
    """Return the valid record of a kind and its parts (made once per process)."""
    if kind.name not in _BASES:
        record = kind.record()
        _BASES[kind.name] = (record, Case.from_record(kind, record))
    return _BASES[kind.name]


def _apply(mutation: Callable[[Case, random.Random], None], case: Case, rng: random.Random) -> None:
    """Apply a mutation, unless an earlier one left nothing it can work on (a header field
    of the wrong type, say)."""
    try:
        mutation(case, rng)
    except (TypeError, AttributeError, KeyError, IndexError, ValueError, OverflowError) as exc:
        case.log.append(f"{mutation.__name__} skipped ({type(exc).__name__})")


def make_case(seed: int, number: int) -> tuple[Case, bytes]:
    """Return case ``number`` of run ``seed``: the mutated case and its record."""
    rng = random.Random(f"{seed}:{number}")
    kind = rng.choice(KINDS)
    case = copy.deepcopy(_base(kind)[1])
    case.number = number
    case.has_key = kind.signed and rng.random() < 0.5
    for _ in range(rng.choice([0, 1, 1, 1, 2, 3])):
        _apply(rng.choice(LOGICAL), case, rng)
    case.encode_frames()
    for _ in range(rng.choice([0, 0, 1, 1, 2])):
        if case.frames is None:
            case.encode_frames()
        _apply(rng.choice(ENCODED), case, rng)
    if case.frames is None:
        case.encode_frames()
    data = case.to_bytes()
    if rng.random() < 0.05:  # an accident after the checksums were made
        data = bytearray(data)
        data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        data = bytes(data)
        case.log.append("one bit flipped after the checksums")
    return case, data


@dataclasses.dataclass
class Failure:
    case: int
    kind: str
    target: str
    error: str
    mutations: list[str]


def _targets(
    path: str, signed: bool, has_key: bool
) -> list[tuple[str, Callable[[bytes], Any], tuple[type[BaseException], ...]]]:
    quiet = contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO())

    def run_cli(command: str) -> Callable[[bytes], Any]:
        def run(data: bytes) -> int:
            with open(path, "wb") as file:
                file.write(data)
            with quiet[0], quiet[1]:
                status = cli.main([command, "--json", path] + (["--key-env", "BLPICKLE_FUZZ_KEY"] if signed else []))
            if status not in (0, 1):
                raise AssertionError(f"exit status {status}")
            return status

        return run

    os.environ["BLPICKLE_FUZZ_KEY"] = KEY.decode()
    tree = (blpickle.LoadError,)
    signed_load = UNRESTRICTED[1] if has_key else "loads(key=...)"
    return [  # the unrestricted ones last: numpy's own reconstructors can crash them
        ("loads(safe=True)", lambda d: blpickle.loads(d, safe=True), tree),
        ("inspect", blpickle.inspect, tree),
        ("inspect(verify=False)", lambda d: blpickle.inspect(d, verify=False), tree),
        ("cli info", run_cli("info"), ()),
        ("cli verify", run_cli("verify"), ()),
        *([(signed_load, lambda d: blpickle.loads(d, key=KEY), tree)] if signed else []),
        ("loads", blpickle.loads, tree),
    ]


def _status(field: str) -> int:
    """Return a size field of /proc/self/status (Linux), in bytes."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def _peak_rss() -> int:
    """Return the process's peak RSS in bytes since the last :func:`_reset_peak_rss`."""
    return _status("VmHWM")


def _reset_peak_rss() -> int:
    """Reset the peak RSS to the current RSS (Linux); return it."""
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")
    return _peak_rss()


def memory_bound(case: Case, target: str) -> int:
    """Return how many bytes ``target`` may raise the peak RSS by on ``case``:
    `MEMORY_BOUND` (the header's and trailer's limits of 64 MiB each, decoded, and the
    interpreter's own allocations), plus

    - for ``inspect``, ``info`` and ``verify``: one chunk of the pickle stream, as its
      header declares it (they hold one decompressed chunk at a time, and a writer may
      choose chunks of up to 1 GiB), whatever the stream's size;
    - for a load: the budget of copies of a restricted load (`COPIES_SLACK` and
      `COPIES_PER_BYTE` per byte of its decompressed streams) and those streams once: it holds
      them while it builds the objects, which may copy them (a bytes literal of the pickle
      stream, an array of a buffer), as ``pickle.loads`` holds its input and what it builds.
    """
    if target.startswith("loads"):
        return MEMORY_BOUND + COPIES_SLACK + (1 + COPIES_PER_BYTE) * sum(len(s.data) for s in case.streams)
    try:
        info = case.parts.header["streams"][0]
        return MEMORY_BOUND + max(0, min(int(info["chunk_size"]), int(info["nbytes"]), fmt.MAX_CHUNK_SIZE))
    except (KeyError, IndexError, TypeError, ValueError):  # a mutated header: read no further than it
        return MEMORY_BOUND


def run_case(
    case: Case, data: bytes, path: str, verbose: bool = False, starting: Callable[[str], None] | None = None
) -> tuple[list[Failure], dict[str, int]]:
    """Run a case against every target (calling ``starting`` with the name of each first);
    return its failures and the growth of the peak RSS each target caused."""
    failures, peaks = [], {}
    failed = functools.partial(Failure, case.number, case.kind.name, mutations=case.log)
    listed: tuple[str, ...] | None = None  # what inspect listed
    for name, target, allowed in _targets(path, case.kind.signed, case.has_key):
        if starting is not None:
            starting(name)
        IMPORTED.clear()
        before = _reset_peak_rss()
        try:
            result = target(data)
        except allowed:
            result = None
        except Exception as exc:  # what the fuzzer looks for
            result = None
            if name not in UNRESTRICTED or not _raised_by_called_code(exc):
                if verbose:
                    traceback.print_exc()
                failures.append(failed(name, f"{type(exc).__name__}: {exc}"[:300]))
        grown = peaks[name] = _peak_rss() - before
        if grown > memory_bound(case, name):
            failures.append(failed(name, f"MemoryBound: the peak RSS grew by {grown >> 20} MiB"))
        if name == "loads(key=...)" and result is not None and _altered(case, data):
            failures.append(failed(name, "Forgery: a record altered without the key loaded"))
        if name == "inspect" and result is not None:
            listed = result.globals
        if name == "loads" and listed is not None and _unlisted(IMPORTED, listed):
            error = f"Unlisted: loads imported {_unlisted(IMPORTED, listed)[:3]}, inspect listed {list(listed)[:5]}"
            failures.append(failed("inspect", error[:300]))
        result = None
        gc.collect()  # a heap the target damaged faults here, while it is still the target running
    return failures, peaks


#: ``module.name`` of every global the unpickler asked `blpickle.Unpickler.find_class` for
#: (recorded by `record_imports`).
IMPORTED: list[str] = []
_FIND_CLASS = blpickle.Unpickler.find_class


def record_imports() -> None:
    """Record in `IMPORTED` every global an unrestricted load imports (in this process)."""

    def find_class(self: blpickle.Unpickler, module: str, name: str) -> Any:
        IMPORTED.append(f"{module}.{name}")
        return _FIND_CLASS(self, module, name)

    blpickle.Unpickler.find_class = find_class  # type: ignore[method-assign]


def _unlisted(imported: list[str], listed: tuple[str, ...]) -> list[str]:
    """The globals a load imported that inspect did not list (none when it listed a
    global it could not name)."""
    return [] if "<computed>" in listed else [name for name in imported if name not in listed]


def _raised_by_called_code(exc: BaseException) -> bool:
    """True for an error raised in Python code outside blpickle that the pickle called, or
    by ``find_class`` (a missing module or name)."""
    *_, (frame, _) = traceback.walk_tb(exc.__traceback__)
    code = frame.f_code
    if isinstance(exc, Exception) and blpickle.unpickler._raised_by_find_class(exc):
        return True  # the C unpickler's find_class, on a compact record's fast path: no frame of its own
    return code is _FIND_CLASS.__code__ or not code.co_filename.startswith(_PACKAGE)


_PACKAGE = os.path.dirname(blpickle.__file__)


def _altered(case: Case, data: bytes) -> bool:
    """True when the record's header or frames differ from the unaltered record's."""
    original = _base(case.kind)[0]
    try:
        mutated = records.split(data)
    except Exception:  # not even readable: surely altered
        return True
    base = records.split(original)
    return (mutated.flags, mutated.header, mutated.payloads) != (base.flags, base.header, base.payloads)


# --------------------------------------------------------------------------------------------
# Workers (one subprocess per batch) and the run


def _announce(out: io.TextIOBase, number: int, target: str) -> None:
    out.write(json.dumps({"start": number, "target": target}) + "\n")


def worker(seed: int, start: int, stop: int) -> None:
    """Run cases ``start`` to ``stop``, reporting on the original stdout as JSON lines
    (the library's own output, and the CLI's, goes to /dev/null)."""
    for kind in KINDS:
        _base(kind)
    record_imports()
    gc.freeze()  # the worker's objects: the collections after each target skip them
    # A case that allocates without bound gets a MemoryError, not the machine's memory.
    address_space = _status("VmSize") + ADDRESS_SPACE_BOUND
    resource.setrlimit(resource.RLIMIT_AS, (address_space, resource.getrlimit(resource.RLIMIT_AS)[1]))
    out = os.fdopen(os.dup(1), "w", buffering=1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "case.blp")
        for number in range(start, stop):
            _run_forked(out, seed, number, path)


def _run_forked(out: io.TextIOBase, seed: int, number: int, path: str) -> None:
    """Run case ``number`` in a forked child of the worker and report it on ``out``; a child
    that dies is reported as a crash of the target it was running. Each case thus starts
    from the same clean worker: an unrestricted load may leave the heap corrupted without
    crashing (pickle's own unsafety), and the next case would crash for it."""
    started_read, started_write = os.pipe()
    child = os.fork()
    if child == 0:
        status = 1  # an exception of the fuzzer's own: a crash of what was running
        try:
            os.close(started_read)

            def announce(target: str) -> None:
                _announce(out, number, target)
                os.write(started_write, target.encode() + b"\n")

            announce("the mutator")  # a bug of the fuzzer's own is not the library's crash
            case, data = make_case(seed, number)
            began = time.perf_counter()
            failures, peaks = run_case(case, data, path, starting=announce)
            doc = {
                "done": number,
                "rss": peaks,
                "seconds": time.perf_counter() - began,
                "failures": [dataclasses.asdict(f) for f in failures],
            }
            out.write(json.dumps(doc) + "\n")
            out.flush()
            status = 0
        finally:  # never back into the worker's code (its temporary directory is the worker's)
            os._exit(status)
    os.close(started_write)
    _, status = os.waitpid(child, 0)
    with os.fdopen(started_read, "rb") as started:
        targets = started.read().decode().splitlines()
    if status:
        code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        target = targets[-1] if targets else "the mutator"
        out.write(json.dumps({"crash": f"{number}: {target} ({code})", "done": number}) + "\n")


def _target_of(event: str) -> str:
    """The target of a crash ("case: target (exit status)") or a hang ("case: target")."""
    target = event.split(": ", 1)[1]
    return target.rsplit(" (", 1)[0] if target.endswith(")") and " (" in target else target


CLASSES = {
    False: "guaranteed (safe mode, inspect, info, verify, loads with a key the attacker lacks)",
    True: "unrestricted loads of attacker-made pickles (pickle's own unsafety: listed, not failures)",
}


@dataclasses.dataclass
class Report:
    cases: int = 0
    failures: list[Failure] = dataclasses.field(default_factory=list)
    crashes: list[str] = dataclasses.field(default_factory=list)  # "case: target (exit status)"
    hangs: list[str] = dataclasses.field(default_factory=list)  # "case: target"
    peaks: dict[str, int] = dataclasses.field(default_factory=dict)  # target: largest growth of the peak RSS
    slowest: float = 0.0
    seconds: float = 0.0

    def of_class(self, unrestricted: bool) -> tuple[list[Failure], list[str], list[str]]:
        """Return the failures, crashes and hangs of the unrestricted or the guaranteed targets."""
        return (
            [f for f in self.failures if (f.target in UNRESTRICTED) == unrestricted],
            [c for c in self.crashes if (_target_of(c) in UNRESTRICTED) == unrestricted],
            [h for h in self.hangs if (_target_of(h) in UNRESTRICTED) == unrestricted],
        )

    @property
    def guaranteed_held(self) -> bool:
        """True when no guaranteed target failed, crashed or hung."""
        return not any(self.of_class(False))

    def summary(self) -> str:
        peaks = ", ".join(f"{target} {peak / 2**20:.1f}" for target, peak in sorted(self.peaks.items()))
        lines = [
            f"{self.cases} cases in {self.seconds:.0f} s, slowest case {self.slowest:.2f} s",
            f"largest peak RSS growth by target (MiB): {peaks}",
        ]
        for unrestricted, title in CLASSES.items():
            failures, crashes, hangs = self.of_class(unrestricted)
            kinds: dict[tuple[str, str], list[int]] = {}
            for failure in failures:
                kinds.setdefault((failure.target, failure.error.split(":")[0]), []).append(failure.case)
            lines += [
                f"{title}: {len(crashes)} crashes, {len(hangs)} hangs, {len(failures)} failures",
                *(f"  {len(cases):6d}  {target}: {error} (cases {', '.join(map(str, cases[:10]))}"
                  f"{', ...' if len(cases) > 10 else ''})" for (target, error), cases in sorted(kinds.items())),
            ]  # fmt: skip
            if crashes:
                lines.append(f"  crashes: {', '.join(crashes[:20])}")
            if hangs:
                lines.append(f"  hangs: {', '.join(hangs[:20])}")
        return "\n".join(lines)


#: Workers import the blpickle this process imported.
_WORKER_ENV = {
    **os.environ,
    "PYTHONPATH": os.pathsep.join([os.path.dirname(_PACKAGE), os.environ.get("PYTHONPATH", "")]),
}


def _batches(seed: int, start: int, stop: int, timeout: float) -> Iterator[dict[str, Any]]:
    """Run cases ``start`` to ``stop`` in worker subprocesses; yield their reports (a case
    whose forked child died: ``{"crash": "case: target (exit status)"}``), and a crash or
    ``{"hang": "case: target"}`` for a case that killed or stalled its worker (the next
    worker goes on after it)."""
    while start < stop:
        command = [sys.executable, os.path.abspath(__file__), "--worker", "--seed", str(seed),
                   "--start", str(start), "--cases", str(stop - start)]  # fmt: skip
        process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, env=_WORKER_ENV, start_new_session=True
        )
        current, target = start, ""
        try:
            while True:
                ready, _, _ = select.select([process.stdout], [], [], timeout)
                if not ready:
                    yield {"hang": f"{current}: {target}"}
                    os.killpg(process.pid, signal.SIGKILL)  # the worker and the case's child
                    break
                line = process.stdout.readline()
                if not line:
                    if process.wait() != 0:
                        yield {"crash": f"{current}: {target} ({process.returncode})"}
                    break
                doc = json.loads(line)
                if "start" in doc:
                    current, target = doc["start"], doc["target"]
                else:
                    current = doc["done"] + 1
                    yield doc
        finally:
            process.stdout.close()
            process.wait()
        start = current + 1 if current < stop and process.returncode != 0 else stop


def run(cases: int, seed: int = 0, jobs: int = 1, timeout: float = TIME_BOUND, first: int = 0,
        progress: bool = False) -> Report:  # fmt: skip
    """Run ``cases`` cases from ``first`` in ``jobs`` parallel workers; return the report."""
    report = Report()
    began = time.perf_counter()
    per_job = -(-cases // jobs)
    docs: queue.Queue[dict[str, Any] | None] = queue.Queue()

    def work(start: int) -> None:
        try:
            for doc in _batches(seed, start, min(start + per_job, first + cases), timeout):
                docs.put(doc)
        finally:
            docs.put(None)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(first, first + cases, per_job)]
    for thread in threads:
        thread.start()
    running = len(threads)
    while running:
        doc = docs.get()
        if doc is None:
            running -= 1
            continue
        report.cases += 1
        if "crash" in doc:
            report.crashes.append(doc["crash"])
        elif "hang" in doc:
            report.hangs.append(doc["hang"])
        else:
            for target, grown in doc["rss"].items():
                report.peaks[target] = max(report.peaks.get(target, 0), grown)
            report.slowest = max(report.slowest, doc["seconds"])
            report.failures += [Failure(**f) for f in doc["failures"]]
        if progress and report.cases % 1000 == 0:
            report.seconds = time.perf_counter() - began
            print(f"{time.perf_counter() - began:.0f} s: " + report.summary(), file=sys.stderr, flush=True)
    for thread in threads:
        thread.join()
    report.seconds = time.perf_counter() - began
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=1000, help="number of cases (default 1000)")
    parser.add_argument("--seed", type=int, default=0, help="run seed (default 0)")
    parser.add_argument("--start", type=int, default=0, help="number of the first case")
    parser.add_argument("--jobs", type=int, default=1, help="worker processes at once (default 1)")
    parser.add_argument("--timeout", type=float, default=TIME_BOUND, help="seconds a target may take on a case")
    parser.add_argument("--case", type=int, help="run this one case here, printing tracebacks")
    parser.add_argument("-v", "--verbose", action="store_true", help="list every failure")
    parser.add_argument("--json", help="write the failures to this file")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.seed, args.start, args.start + args.cases)
        return 0
    if args.case is not None:
        record_imports()
        case, data = make_case(args.seed, args.case)
        print(f"case {args.case}: kind {case.kind.name}, " + "; ".join(case.log))
        with tempfile.TemporaryDirectory() as tmp:
            failures, peaks = run_case(case, data, os.path.join(tmp, "case.blp"), verbose=True)
        print("peak RSS growth by target (MiB): " + ", ".join(f"{t} {p / 2**20:.1f}" for t, p in peaks.items()))
        for failure in failures:
            print(f"{failure.target}: {failure.error}" + (" (unrestricted)" if failure.target in UNRESTRICTED else ""))
        return 1 if any(f.target not in UNRESTRICTED for f in failures) else 0
    report = run(args.cases, args.seed, args.jobs, args.timeout, args.start, progress=True)
    print(f"seed {args.seed}, cases {args.start} to {args.start + args.cases - 1}, {args.jobs} jobs")
    print(report.summary())
    if args.verbose:
        for failure in report.failures:
            mutations = "; ".join(failure.mutations)
            print(f"case {failure.case} ({failure.kind}) {failure.target}: {failure.error} <- {mutations}")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(dataclasses.asdict(report), out, indent=1)
    return 0 if report.guaranteed_held else 1


if __name__ == "__main__":
    sys.exit(main())
