"""What a record holds, read without unpickling anything."""

from __future__ import annotations

import copyreg
import dataclasses
import io
import itertools
import pickletools
from collections import deque
from collections.abc import Iterable
from contextlib import ExitStack
from typing import Any, BinaryIO

from . import format as fmt
from .errors import CorruptError
from .files import expand, is_path, naming_errors
from .layout import OPCODE, SPLICE, splices_of, tokens
from .options import available_threads
from .reader import RecordReader
from .sources import FileSource, MemorySource, Source

__all__ = ["BufferInfo", "RecordInfo", "inspect", "pickle_globals"]


@dataclasses.dataclass(frozen=True)
class BufferInfo:
    """One out-of-band buffer of a record (``splice`` is set for a large bytes, bytearray or
    str payload stored apart from the pickle: its offset in the pickle; ``codec`` is the
    Blosc2 codec its chunks were compressed with)."""

    nbytes: int
    stored: int
    nchunks: int
    itemsize: int
    raw: bool
    dtype: str | None
    shape: tuple[int, ...] | None
    splice: int | None = None
    codec: str | None = None

    @property
    def ratio(self) -> float:
        """Compression ratio (decompressed / stored bytes)."""
        return self.nbytes / self.stored if self.stored else 1.0


@dataclasses.dataclass(frozen=True)
class RecordInfo:
    """What `inspect` found in a record.

    Attributes:
        version: format version, "major.minor".
        signed: the record carries an HMAC signature.
        options: the options it was written with.
        protocol: pickle protocol of the object graph.
        pickle_nbytes, pickle_stored: size of the object graph's pickle, raw and stored.
        buffers: the out-of-band buffers, in order.
        external: how many out-of-band buffers the caller kept (``buffer_callback``).
        globals: every ``module.name`` the pickle would import, in order of first use.
        size: bytes of the whole record.
    """

    version: str
    signed: bool
    options: dict[str, Any]
    protocol: int
    pickle_nbytes: int
    pickle_stored: int
    buffers: tuple[BufferInfo, ...]
    external: int
    globals: tuple[str, ...]
    size: int

    @property
    def nbytes(self) -> int:
        """Decompressed size of the pickle and every buffer."""
        return self.pickle_nbytes + sum(b.nbytes for b in self.buffers)

    @property
    def ratio(self) -> float:
        """Compression ratio of the whole record."""
        return self.nbytes / self.size if self.size else 1.0

    def to_dict(self) -> dict[str, Any]:
        """Return the information as JSON-compatible types."""
        out = dataclasses.asdict(self)
        out["buffers"] = [dict(dataclasses.asdict(b), ratio=b.ratio) for b in self.buffers]
        out["globals"] = list(self.globals)
        out["nbytes"], out["ratio"] = self.nbytes, self.ratio
        return out


def inspect(
    file: BinaryIO | str | bytes | Any, *, verify: bool = True, key: bytes | None = None, nthreads: int | None = None
) -> RecordInfo:
    """Describe the record in ``file`` (a path, a binary file object or a bytes-like object)
    without unpickling it. Only the object graph's pickle is decompressed.

    With ``verify`` (the default) every checksum of the record, and its signature when a
    ``key`` is given, is checked on the way. ``verify=False`` reads only the header, the
    pickle and the trailer (found from the end of a file or bytes object), however large
    the buffers are; it falls back to reading the record through on a stream.

    Raises:
        blpickle.BadMagicError: when the input is not a blpickle record.
        blpickle.SignatureError: with a key, for an unsigned or altered record.
        blpickle.LoadError: for a damaged or truncated record (the message names the first
            damaged chunk and its offset).
    """
    with ExitStack() as stack:
        source = _open(file, stack)
        reader = RecordReader(source, nthreads or available_threads(), key=key)
        graph = reader.read_stream()
        index = None if verify or key is not None else reader.index_from_end()
        if index is None:
            for _ in reader.header.streams[1:]:
                reader.skip_stream()
            index = reader.finish()
        header = reader.header
        stored = _stored_sizes(header.streams, index.csizes)
        buffers = tuple(
            BufferInfo(s.nbytes, size, s.nchunks, s.itemsize, s.raw, s.dtype, s.shape, s.splice, s.codec)
            for s, size in zip(header.streams[1:], stored[1:], strict=True)
        )
        return RecordInfo(
            version=f"{fmt.VERSION_MAJOR}.{reader.minor}",
            signed=reader.signed,
            options=header.options,
            protocol=header.protocol,
            pickle_nbytes=header.streams[0].nbytes,
            pickle_stored=stored[0],
            buffers=buffers,
            external=len(header.external),
            globals=pickle_globals(graph, header),
            size=source.pos,
        )


def _open(file: Any, stack: ExitStack) -> Source:
    if is_path(file):
        path = expand(file)
        stack.enter_context(naming_errors(path))
        file = stack.enter_context(open(path, "rb"))  # noqa: SIM115 - closed by the caller's stack
    return FileSource(file) if hasattr(file, "read") else MemorySource(file)


def _stored_sizes(streams: tuple[fmt.StreamInfo, ...], csizes: list[int]) -> list[int]:
    sizes, first = [], 0
    for stream in streams:
        sizes.append(sum(csizes[first : first + stream.nchunks]))
        first += stream.nchunks
    return sizes


_STRING_OPS = {"SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE", "SHORT_BINSTRING", "BINSTRING", "STRING"}
_GET_OPS = {"GET", "BINGET", "LONG_BINGET"}
_PUT_OPS = {"PUT", "BINPUT", "LONG_BINPUT"}
_EXT_OPS = {"EXT1", "EXT2", "EXT4"}
_NO_PUSH_OPS = {"FRAME", "PROTO", "MEMOIZE", *_PUT_OPS}


def pickle_globals(data: Any, header: fmt.Header | None = None) -> tuple[str, ...]:
    """Return every ``module.name`` a pickle would import, in order of first use, read from
    its opcodes without running it. With the ``header`` of the record whose pickle stream
    ``data`` is, the stream is read as the loader reads it (`blpickle.layout`): spliced
    payloads, which are not in ``data``, are read as empty, and the opcodes must follow the
    stream's layout.

    Raises:
        CorruptError: when the data is not a valid pickle, or not one the loader would read
            the same way (a splice anywhere but at a payload, an opcode across a frame's end).
    """
    unframed: list[int] | None = None
    if header is not None:
        found = list(tokens(data, header.protocol, splices_of(header)))
        if header.protocol >= 4:
            unframed = [start for kind, start, _ in found if kind == OPCODE]
        if any(kind == SPLICE for kind, _, _ in found):
            data = bytearray(data)  # the size fields of spliced payloads set to 0: their data is not here
            for before, token in itertools.pairwise(found):
                if token[0] == SPLICE:
                    data[before[1] : before[1] + before[2]] = bytes(before[2])
    try:
        return _globals(pickletools.genops(io.BytesIO(data)), unframed)
    except ValueError as exc:
        raise CorruptError(f"the object graph is not a valid pickle: {exc}") from None


def _globals(ops: Iterable[tuple[Any, Any, int | None]], unframed: list[int] | None) -> tuple[str, ...]:
    """Return the globals the opcodes ``ops`` import. With ``unframed`` (the offsets of the
    opcodes outside frames that `blpickle.layout.tokens` found), check that they are
    exactly the opcodes outside frames here, and that no opcode runs past its frame's end."""
    found: dict[str, None] = {}
    memo: dict[int, Any] = {}
    pushed: deque[Any] = deque([None, None], maxlen=2)  # the last two values pushed
    outside: list[int] = []  # offsets of the opcodes outside frames
    frame_end = None  # the end of the frame the opcodes are in
    for op, arg, pos in ops:
        name = op.name
        if unframed is not None:
            if frame_end is not None and pos >= frame_end:
                if pos > frame_end:
                    raise CorruptError(f"an opcode of the pickle stream runs past its frame's end ({frame_end})")
                frame_end = None
            if frame_end is None:
                outside.append(pos)
                if name == "FRAME":
                    frame_end = pos + 9 + arg
        if name in ("GLOBAL", "INST"):
            found[arg.replace(" ", ".", 1)] = None
        elif name == "STACK_GLOBAL":
            module, qualname = pushed
            qualified = f"{module}.{qualname}" if isinstance(module, str) and isinstance(qualname, str) else None
            found[qualified or "<computed>"] = None
        elif name in _EXT_OPS:
            module, qualname = copyreg._inverted_registry.get(arg, ("<extension>", str(arg)))
            found[f"{module}.{qualname}"] = None
        if name == "MEMOIZE":
            memo[len(memo)] = pushed[-1]
        elif name in _PUT_OPS:
            memo[arg] = pushed[-1]
        if name in _NO_PUSH_OPS:
            continue
        pushed.append(arg if name in _STRING_OPS else memo.get(arg) if name in _GET_OPS else None)
    if unframed is not None and outside != unframed[: len(outside)]:
        raise CorruptError("the opcodes outside the frames of the pickle stream are not where its layout puts them")
    return tuple(found)
