"""Reading records: the header, then each stream in order, then the trailer.

Chunks are checked (checksum, then declared sizes) and decompressed in the shared pool
(`blpickle.engine.chunks`) while the calling thread reads the next ones; memory stays bounded
whatever the buffer sizes.
"""

from __future__ import annotations

import hmac
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np

from .. import format as fmt
from ..errors import (
    ChecksumError,
    CorruptError,
    LimitError,
    SignatureError,
    TruncatedError,
    UnsupportedVersionError,
)
from ..format.trailer import check_footer, check_trailer_size, chunk_name, parse_index
from ..io.sources import LATER_READ_SIZE, READ_SIZE, MemorySource, RecordingSource, Source
from . import jobs
from .ahead import ReadAhead
from .chunk_hash import ChunkHash
from .chunks import unpack_chunk
from .jobs import allocate_stream, byte_view
from .pool import map_ordered, shared_pool

__all__ = ["RecordReader"]


class RecordReader(ReadAhead):
    """Reads one record sequentially: header, then streams in order, then the trailer.

    Args:
        source: where to read; positioned just after the magic bytes when ``magic`` is given.
        nthreads: decompression threads.
        magic: the first bytes already read from the source (the caller peeked at them).
        key: read the whole record and verify its signature with this key before anything
            is decompressed.

    A compact record (version 1.1) reads as a record of one raw stream, its pickle, with
    ``compact`` true: its "header" is the pickle, checked by the header checksum, and it has
    no chunks and no trailer.

    Raises:
        LoadError subclasses for any damaged or truncated input; SignatureError for an
        unsigned record or a signature that does not match, when a key is given.
    """

    def __init__(self, source: Source, nthreads: int, magic: bytes = b"", key: bytes | None = None) -> None:
        self._source = source
        rest = source.read(fmt.PREAMBLE.size - len(magic), "the preamble")
        preamble = magic + bytes(rest)
        try:
            self.minor, flags, header_size = fmt.decode_preamble(preamble)
        except UnsupportedVersionError:
            self._read_head(preamble, fmt.PREAMBLE.unpack(preamble)[-1])  # damaged, or truly newer?
            raise
        self.signed = bool(flags & fmt.FLAG_SIGNED)
        self.compact = bool(flags & fmt.FLAG_COMPACT)
        if key is not None and not self.signed:
            raise SignatureError("the record is not signed, and a key was given: refusing to load it")
        if self.compact and self.signed:
            raise CorruptError("the preamble flags a compact record as signed: compact records are never signed")
        header_bytes, stored = self._read_head(preamble, header_size)
        self._head = preamble + header_bytes
        self._data_start = len(self._head) + fmt.U64.size
        self._header_checksum = stored
        self._nthreads = nthreads
        self._key = key
        self._digests: list[bytes] = []
        self._authenticated: deque[bytes] | None = None  # digests a second reading must match
        self._next_stream = 0  # the next stream the caller reads (those read ahead are past it)
        self._ahead: deque[jobs.Ahead] = deque()  # streams read ahead, in order (see `buffers`)
        self._ahead_bytes = 0
        self.index = fmt.ChunkIndex()
        self._compact_pickle: bytes | None = None
        if self.compact:
            self.header = fmt.compact_header(header_bytes)
            self._compact_pickle = header_bytes
            if header_bytes:
                self.index.add(fmt.PREAMBLE.size, len(header_bytes), stored)
            return
        self.header = fmt.Header.decode(header_bytes)
        if key is not None:
            self._authenticate()

    def _authenticate(self) -> None:
        """Read the rest of the record, checking every checksum and, last, the signature,
        without decompressing anything; then stand after the header again, to read the
        record as it was checked.

        A record in memory (or memory-mapped) is read again in place. A source with random
        access (a plain file on disk) is read again too, each chunk checked against the BLAKE2b
        digest the signature covered before it is used, so that a file changed meanwhile
        raises `SignatureError`; any other source is kept in memory as stored (compressed)
        meanwhile. Either way, what is decompressed is exactly what was authenticated.

        Raises:
            LoadError subclasses for damaged input; SignatureError when the signature does not
            match.
        """
        source, start = self._source, self._source.pos
        reread = not isinstance(source, MemorySource) and source.random_access() is not None
        kept: MemorySource | RecordingSource | None = source if isinstance(source, MemorySource) else None
        if kept is None and not reread:
            kept = self._source = RecordingSource(source, self._head + fmt.U64.pack(self._header_checksum))
        for _ in self.header.streams:
            self.skip_stream()
        self.finish()
        if kept is not None:
            self._source = kept.replay()
            self._source.seek(start)
        else:
            self._authenticated = deque(self._digests)
            source.seek(start)
        self._digests = []
        self._key = None  # authenticated: the second reading checks the checksums only
        self._next_stream = 0
        self.index = fmt.ChunkIndex()

    def _read_head(self, preamble: bytes, header_size: int) -> tuple[bytes, int]:
        """Read the header and its checksum; return both once the checksum over the
        preamble and header matches. (The preamble and this checksum have the same layout in
        every major version: a record of an unknown version is told from damaged input by
        it.)

        Raises:
            LimitError, TruncatedError, ChecksumError.
        """
        fmt.check_header_size(header_size)
        header_bytes = bytes(self._source.read(header_size, "the header"))
        stored = fmt.U64.unpack(self._source.read(fmt.U64.size, "the header checksum"))[0]
        computed = fmt.checksum(preamble + header_bytes)
        if stored != computed:
            raise ChecksumError("the header", fmt.PREAMBLE.size, stored, computed)
        return header_bytes, stored

    def read_stream(self, into: memoryview | None = None) -> np.ndarray | memoryview:
        """Read the next stream into ``into`` (of its exact size) or into a new writable uint8
        array, and return that.

        Raises:
            LoadError subclasses when a chunk is damaged, truncated or inconsistent.
        """
        info = self.next_stream()
        if info is None:
            raise CorruptError(
                f"the pickle asks for more out-of-band data than the record's {len(self.header.streams) - 1} streams"
            )
        if into is not None and into.nbytes != info.nbytes:
            raise CorruptError(
                f"stream {self._next_stream} holds {info.nbytes} bytes, the pickle expects {into.nbytes} there"
            )
        number, info = self._next()
        if self._compact_pickle is not None:
            return memoryview(self._compact_pickle)
        if info.raw:
            # with mmap_mode only the out-of-band buffers of a record written with codec None
            # are mapped: the object graph is read, and so are the small buffers another
            # codec left raw, which are checked as its compressed ones are
            mappable = into is None and number > 0 and info.splice is None and self.header.uncompressed
            return self._read_raw(info, number, keep=True, into=into, mappable=mappable)
        out: np.ndarray | memoryview
        chunks: Iterable[tuple]
        if number == 0:
            out, chunks = self._read_graph(info)
        else:
            out = allocate_stream(info.nbytes, number) if into is None else into
            chunks = self._read_chunks(info, number, out)
        self._run(info, chunks)
        return out

    def read_chunks(self, allocate: Callable[[int], Any] | None = None) -> Iterator[memoryview]:
        """Read the pickle stream's chunks (call it first) and start decompressing all but
        the first in the pool; return an iterator over its decompressed chunks, in order, so
        that unpickling can start with the first chunk while the others decompress. The first one is
        decompressed by the iterator itself (its caller would only wait for the pool). (A raw
        pickle stream comes whole, as from `read_stream`.) ``allocate(nbytes)`` returns the
        writable buffer the stream is decompressed to, once its size is checked (default: a new
        array).

        Raises:
            LoadError subclasses when a chunk is damaged, truncated or inconsistent (for a
            damaged chunk: when the iterator reaches it).
        """
        info = self.header.streams[0]
        if info.raw:
            return iter([byte_view(self.read_stream())])
        self._next()
        _, chunks = self._read_graph(info, allocate)
        if self._nthreads == 1 or len(chunks) == 1:
            return jobs.decompressed(chunks)
        pool = shared_pool(self._nthreads)
        return jobs.decompressed(chunks, [None, *(pool.submit(unpack_chunk, *chunk) for chunk in chunks[1:])])

    def read_pieces(self) -> Iterator[memoryview]:
        """Read the pickle stream (call it first) a piece at a time, without holding it:
        yield its decompressed chunks in order, each in one buffer that the next reuses (a
        raw stream: pieces of up to ``READ_SIZE`` bytes, its checksum checked after the last
        one; a compact record's pickle: in one piece, checked with the header).

        A chunk is checked before it is decompressed, and no more is decompressed than
        ``MAX_GRAPH_RATIO`` times the bytes stored so far: chunks are read ahead (kept as
        stored) while the next chunk would pass that, and a stream whose whole passes it
        raises the `LimitError` that `read_stream` raises, once its chunks are read.

        Raises:
            LoadError subclasses when a chunk is damaged, truncated or inconsistent.
        """
        number, info = self._next()
        if self._compact_pickle is not None:
            if self._compact_pickle:
                yield memoryview(self._compact_pickle)
            return
        if info.raw:
            if info.nbytes:
                yield from self._raw_pieces(*self._raw_prologue(info, number), info.nbytes, None, number)
            return
        ahead: deque[tuple] = deque()
        buffer = None
        stored = decompressed = 0
        for chunk in self._read_chunks(info, number, None):
            ahead.append(chunk)
            stored += len(chunk[0])
            while ahead and decompressed + ahead[0][3] <= stored * fmt.MAX_GRAPH_RATIO:
                packed, checksum, seed, nbytes, _, what, offset = ahead.popleft()
                if buffer is None:
                    buffer = memoryview(allocate_stream(min(info.chunk_size, info.nbytes), number))
                unpack_chunk(packed, checksum, seed, nbytes, buffer[:nbytes], what, offset)
                decompressed += nbytes
                yield buffer[:nbytes]
        if ahead:
            raise _ratio_error(info.nbytes, stored)

    def skip_stream(self) -> None:
        """Read the next stream and check its checksums, without decompressing it."""
        number, info = self._next()
        if self._compact_pickle is not None:
            return
        if info.raw:
            self._read_raw(info, number, keep=False)
        else:
            self._run(info, self._read_chunks(info, number, None))

    def next_stream(self) -> fmt.StreamInfo | None:
        """Return the stream to be read next, or None after the last one."""
        streams = self.header.streams
        return streams[self._next_stream] if self._next_stream < len(streams) else None

    def buffers(self) -> Iterator[np.ndarray | memoryview]:
        """Yield the out-of-band buffers lazily, in order (splices are read by
        `blpickle.engine.pickle_file.PickleFile` where the pickle reaches them).

        With more than one thread, the streams after the one asked for are read ahead
        (`blpickle.engine.ahead`), and their chunks checked and decompressed in the shared
        pool into their arrays. Call `settle` when the unpickler stops early.
        """
        pipelined = self._nthreads > 1 and self._key is None and self._authenticated is None
        pipelined = pipelined and self._compact_pickle is None and not self.header.uncompressed
        while (info := self.next_stream()) is not None:
            if info.splice is not None:
                raise CorruptError(
                    f"stream {self._next_stream} is a splice where the pickle expects an out-of-band buffer"
                )
            if pipelined:
                self._read_ahead()
            yield self._take() if self._ahead else self.read_stream()

    def finish(self) -> fmt.ChunkIndex:
        """Read and check the trailer (and the signature, with a key); every stream must have
        been read. Return the trailer.

        Raises:
            CorruptError, ChecksumError, TruncatedError, LimitError, SignatureError.
        """
        self.settle()
        if self._next_stream < len(self.header.streams):
            raise CorruptError(
                f"the pickle used {self._next_stream - 1} out-of-band streams, "
                f"the record holds {len(self.header.streams) - 1}"
            )
        if self._compact_pickle is not None:
            return self.index
        source = self._source
        end = source.pos
        size = fmt.U64.unpack(source.read(fmt.U64.size, "the trailer size"))[0]
        check_trailer_size(size)
        offset = source.pos
        trailer = bytes(source.read(size, "the trailer"))
        check_footer(trailer, source.read(fmt.FOOTER.size, "the footer"), self._header_checksum, offset)
        index = parse_index(self.header, trailer, self._data_start, end, authenticated=self._key is not None).chunks
        if (index.offsets, index.csizes, index.checksums) != (
            self.index.offsets,
            self.index.csizes,
            self.index.checksums,
        ):
            raise CorruptError("the trailer's chunk index does not match the chunks read")
        if self._key is not None:
            expected = fmt.signature(self._key, self._head, self._digests)
            if index.signature is None or not hmac.compare_digest(index.signature, expected):
                raise SignatureError("the record's signature does not match: wrong key, or the record was altered")
        return index

    def index_from_end(self) -> fmt.ChunkIndex | None:
        """Return the record's chunk index read from the end of the source, without reading
        the chunks (random access), then stand after the record. Return None when the source
        cannot seek, or when what ends it is not this record's footer and trailer.

        Raises:
            LimitError, CorruptError: for a footer of this record with bad contents.
        """
        if self._compact_pickle is not None:
            self._next_stream = len(self.header.streams)
            return self.index  # the source stands after the record already
        ranges = self._source.random_access()
        if ranges is None or ranges.size - self._source.pos < fmt.U64.size + fmt.FOOTER.size:
            return None
        end = ranges.size
        size, stored, end_magic = fmt.FOOTER.unpack(ranges.read(end - fmt.FOOTER.size, fmt.FOOTER.size, "the footer"))
        start = end - fmt.FOOTER.size - size
        if end_magic != fmt.END_MAGIC or size > fmt.MAX_TRAILER_SIZE or start - fmt.U64.size < self._source.pos:
            return None
        trailer = bytes(ranges.read(start, size, "the trailer"))
        if fmt.checksum(trailer, self._header_checksum) != stored:
            return None  # another record's footer (the checksum is seeded with our header's)
        try:
            index = parse_index(self.header, trailer, self._data_start, start - fmt.U64.size).chunks
        except CorruptError:
            return None  # not this record's chunks: its own trailer is found by reading through
        read = len(self.index)
        if (index.offsets[:read], index.csizes[:read], index.checksums[:read]) != (
            self.index.offsets,
            self.index.csizes,
            self.index.checksums,
        ):
            return None
        self._source.seek(end)
        return index

    def _next(self) -> tuple[int, fmt.StreamInfo]:
        number = self._next_stream
        self._next_stream += 1
        return number, self.header.streams[number]

    def _run(self, info: fmt.StreamInfo, chunks: Iterable[tuple]) -> None:
        """Check (and decompress) the chunks of a compressed stream in the pool."""
        sign = self._key is not None
        work = ((*chunk, sign) for chunk in chunks)
        for digest in map_ordered(jobs.unpack, work, info.nchunks, self._nthreads):
            if digest is not None:
                self._digests.append(digest)

    def _read_graph(
        self, info: fmt.StreamInfo, allocate: Callable[[int], Any] | None = None
    ) -> tuple[Any, list[tuple]]:
        """Read every chunk of the compressed pickle stream, then allocate where it
        decompresses to; return that and the chunks (`unpack_chunk` arguments).

        Raises:
            LimitError: when the stream declares more than ``MAX_GRAPH_RATIO`` times its
                stored size (before anything is allocated for it).
        """
        chunks = list(self._read_chunks(info, 0, None))
        stored = sum(len(packed) for packed, *_ in chunks)
        if info.nbytes > stored * fmt.MAX_GRAPH_RATIO:
            raise _ratio_error(info.nbytes, stored)
        out = allocate_stream(info.nbytes, 0, allocate)
        view = memoryview(out).cast("B")
        spans = zip(chunks, info.chunk_spans(), strict=True)
        return out, [(*chunk[:4], view[start:stop], *chunk[5:]) for chunk, (start, stop) in spans]

    def _read_chunks(self, info: fmt.StreamInfo, number: int, out: np.ndarray | memoryview | None) -> Iterator[tuple]:
        source = self._source
        for chunk, (start, stop) in enumerate(info.chunk_spans()):
            what = chunk_name(number, chunk)
            offset = source.pos
            csize = fmt.U64.unpack(source.read(fmt.U64.size, f"the size of {what}"))[0]
            if not fmt.BLOSC2_MIN_CHUNK <= csize <= stop - start + fmt.BLOSC2_MAX_OVERHEAD:
                raise CorruptError(
                    f"{what} at offset {offset} declares {csize} compressed bytes for {stop - start} bytes of data"
                )
            # a chunk read again after the signature check is matched to its digest here, before use
            later = out is not None and number > 0 and self._authenticated is None
            packed = (later and source.read_later(csize, what)) or source.read(csize, what)
            if self._authenticated is not None:
                self._check_authenticated(fmt.chunk_digest(packed), what, offset)
            stored, seed = self._read_checksum(what, offset, csize)
            dst = None if out is None else byte_view(out)[start:stop]
            yield packed, stored, seed, stop - start, dst, what, offset

    def _read_raw(
        self, info: fmt.StreamInfo, number: int, keep: bool, into: memoryview | None = None, mappable: bool = False
    ) -> Any:
        """Read a raw stream into ``into``, or a new array (``keep``), or nowhere (to check it).
        With ``mappable``, from a memory-mapped source, return a view of the map instead,
        unchecked."""
        source = self._source
        if not info.nbytes:
            return np.empty(0, dtype=np.uint8) if into is None else into
        what, offset = self._raw_prologue(info, number)
        mapped = source.map(info.nbytes, what) if mappable else None
        if mapped is not None:
            self._read_checksum(what, offset, info.nbytes)
            return mapped
        out = into if into is not None else allocate_stream(info.nbytes, number) if keep else None
        if out is not None and info.nbytes <= LATER_READ_SIZE and self._key is None and self._authenticated is None:
            source.readinto(byte_view(out), what)  # small: read and hashed at once, nothing to overlap
            stored, seed = self._read_checksum(what, offset, info.nbytes)
            jobs.fill_raw(None, out, stored, seed, what, offset)
            return out
        for _ in self._raw_pieces(what, offset, info.nbytes, out, number):
            pass
        return out

    def _read_checksum(self, what: str, offset: int, nbytes: int) -> tuple[int, int]:
        """Read a chunk's checksum field and add the chunk (stored at ``offset``, ``nbytes``
        long) to the index; return the stored checksum and the seed its data is hashed with."""
        stored = fmt.U64.unpack(self._source.read(fmt.U64.size, f"the checksum of {what}"))[0]
        seed = fmt.chunk_seed(self._header_checksum, len(self.index))
        self.index.add(offset, nbytes, stored)
        return stored, seed

    def _raw_prologue(self, info: fmt.StreamInfo, number: int) -> tuple[str, int]:
        """Read the padding and size field of a raw stream's chunk; return its name and offset.

        Raises:
            CorruptError, TruncatedError: for padding that is not zero, a size that is not
                the header's, or more than the source holds (before anything is allocated).
        """
        source = self._source
        what = chunk_name(number, 0)
        padding = source.read(fmt.raw_padding(source.pos), f"the padding before {what}")
        offset = source.pos
        jobs.check_raw_fields(padding, source.read(fmt.U64.size, f"the size of {what}"), info.nbytes, what, offset)
        size = info.nbytes
        end = source.size(source.pos + size)
        if end is not None and size > end - source.pos:
            raise TruncatedError(what, source.pos, size, end - source.pos)
        return what, offset

    def _raw_pieces(
        self, what: str, offset: int, size: int, out: np.ndarray | memoryview | None, number: int
    ) -> Iterator[memoryview]:
        """Read a raw chunk's ``size`` bytes into ``out`` (or, if None, into one reused buffer
        of at most ``READ_SIZE`` bytes), yielding each piece as it is read; then check the
        chunk's checksum (and, on a second reading of a signed record, its digest).

        Raises:
            TruncatedError: for a chunk that ends early.
            ChecksumError, SignatureError: after the last piece, for a damaged or changed
                chunk.
        """
        source = self._source
        seed = fmt.chunk_seed(self._header_checksum, len(self.index))
        signed = self._key is not None or self._authenticated is not None
        # pieces of ``out`` read from disk are hashed while the next one is read (a copy from
        # memory holds the GIL, and a reused buffer would change under the hashing)
        beside = out is not None and size > READ_SIZE and source.system_reads
        chunk_hash = ChunkHash(seed, signed, self._nthreads if beside else 1)
        whole = None if out is None else byte_view(out)
        if whole is None:
            whole = byte_view(allocate_stream(min(size, READ_SIZE), number))
        try:
            for start in range(0, size, READ_SIZE):
                count = min(READ_SIZE, size - start)
                piece = whole[start : start + count] if out is not None else whole[:count]
                source.readinto(piece, what)
                chunk_hash.add(piece)
                yield piece
        finally:  # ``out`` may be the unpickler's buffer, freed once a read fails
            chunk_hash.settle()
        stored, _ = self._read_checksum(what, offset, size)
        digest = chunk_hash.digest()
        if digest is not None and self._key is None:
            self._check_authenticated(digest, what, offset)
        computed = chunk_hash.checksum()
        if stored != computed:
            raise ChecksumError(what, offset, stored, computed)
        if digest is not None and self._key is not None:
            self._digests.append(digest)

    def _check_authenticated(self, digest: bytes, what: str, offset: int) -> None:
        """Refuse a chunk, read again after the signature was checked, that is not the chunk
        the signature covered.

        Raises:
            SignatureError: when its digest is not the next one authenticated.
        """
        assert self._authenticated is not None
        if not self._authenticated or self._authenticated.popleft() != digest:
            raise SignatureError(
                f"{what} at offset {offset} is not what the signature was checked on: "
                "the file changed while it was read"
            )


def _ratio_error(nbytes: int, stored: int) -> LimitError:
    """Return the error for a pickle stream declaring over ``MAX_GRAPH_RATIO`` times its stored size."""
    return LimitError(
        f"the pickle stream declares {nbytes} bytes stored in {stored}: "
        f"over {fmt.MAX_GRAPH_RATIO} times its stored size"
    )
