"""What a record holds, read without unpickling anything."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from typing import Any, BinaryIO

from . import format as fmt
from .engine.reader import RecordReader
from .errors import LoadError
from .format.layout import splices_of
from .format.scan import chunks_of, scan_globals
from .io.files import open_input
from .io.sources import FileSource, MemorySource, Source
from .options import available_threads

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
        pickle_nbytes: size of the object graph's pickle, decompressed.
        pickle_stored: size of the object graph's pickle as stored.
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
    without unpickling it. Only the object graph's pickle is decompressed, a chunk at a
    time, each read by `blpickle.format.scan` and dropped: memory stays bounded whatever its size.

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
        found = graph_globals(reader.read_pieces(), reader.header, lambda: source.pos)
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
            globals=found,
            size=source.pos,
        )


def _open(file: Any, stack: ExitStack) -> Source:
    file = stack.enter_context(open_input(file))
    return FileSource(file) if hasattr(file, "read") else MemorySource(file)


def _stored_sizes(streams: tuple[fmt.StreamInfo, ...], csizes: list[int]) -> list[int]:
    sizes, first = [], 0
    for stream in streams:
        sizes.append(sum(csizes[first : first + stream.nchunks]))
        first += stream.nchunks
    return sizes


def pickle_globals(data: Any, header: fmt.Header | None = None) -> tuple[str, ...]:
    """Return every ``module.name`` a pickle would import, in order of first use, read from
    its opcodes without running it (`blpickle.format.scan`). With the ``header`` of the record
    whose pickle stream ``data`` is, the stream is read as the loader reads it
    (`blpickle.format.layout`): spliced payloads, which are not in ``data``, are unknown values,
    and the opcodes must follow the stream's layout.

    Raises:
        CorruptError: when the data is not a valid pickle, or not one the loader would read
            the same way (a splice anywhere but at a payload, an opcode across a frame's end).
        LimitError: when the names take over ``blpickle.format.scan.MAX_GLOBALS_BYTES``.
    """
    if header is None:
        return scan_globals(chunks_of(data))
    return scan_globals(chunks_of(data), header.protocol, splices_of(header), memoryview(data).nbytes)


def graph_globals(pieces: Iterator[Any], header: fmt.Header, read: Callable[[], int]) -> tuple[str, ...]:
    """Return the globals of a record's pickle stream read in ``pieces`` (its chunks, each
    dropped once read; ``read``: how many bytes of the record were read so far), then read
    the rest of the stream (so every chunk is checked). A stream found damaged by the scan
    is read to its end too, so that a checksum error (which a raw stream meets after its
    last piece) is reported rather than what the damage made of the opcodes."""
    try:
        found = scan_globals(pieces, header.protocol, splices_of(header), header.streams[0].nbytes, read)
    except LoadError:
        for _ in pieces:
            pass
        raise
    for _ in pieces:
        pass
    return found
