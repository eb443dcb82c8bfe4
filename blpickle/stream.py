"""Writing and reading records over any binary file object, chunk by chunk.

Compression and decompression run in a small shared thread pool (Blosc2 releases the GIL)
while the calling thread does the I/O; at most ``nthreads + 1`` chunks are in flight, so memory
stays bounded whatever the buffer sizes. Blosc2 itself runs single-threaded (no Blosc2 thread
pool to hang a forked child) and a forked child starts new pools.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import io
import mmap
import os
import stat
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any, BinaryIO, TypeVar

import blosc2
import numpy as np
import xxhash

from . import format as fmt
from .buffers import Payload
from .errors import (
    ChecksumError,
    CorruptError,
    DumpError,
    LimitError,
    SignatureError,
    TruncatedError,
    UnsupportedVersionError,
)
from .options import Options, choose_codec, compress_chunk

__all__ = [
    "CountingWriter",
    "FileSource",
    "MemorySource",
    "PackedStream",
    "RecordReader",
    "Source",
    "map_file",
    "map_ordered",
    "plain_fileno",
    "unpack_chunk",
    "write_record",
]

T = TypeVar("T")
R = TypeVar("R")

#: Raw payloads are read and hashed in pieces of this size.
_RAW_READ_SIZE = 8 << 20
#: Bytes of each stream compressed twice to choose its codec, with codec "auto": at most this,
#: and at most an eighth of the stream (whose compression the sampling must not rival).
_SAMPLE_SIZE = 192 << 10
_SAMPLE_FRACTION = 8


_POOLS: dict[int, ThreadPoolExecutor] = {}
_POOLS_LOCK = threading.Lock()
_POOLS_PREPARED = False


def _forget_pools() -> None:
    """In a forked child the pools' threads do not exist: start afresh."""
    global _POOLS_LOCK
    _POOLS.clear()
    _POOLS_LOCK = threading.Lock()


def _pool(nthreads: int) -> ThreadPoolExecutor:
    """Return the shared pool of ``nthreads`` threads. Before the first pool, Blosc2 is told to
    release the GIL (so that the pool's threads compress in parallel) and a forked child to
    forget the pools: process-wide settings, made when they are first needed, not on import."""
    global _POOLS_PREPARED
    with _POOLS_LOCK:
        if not _POOLS_PREPARED:
            blosc2.set_releasegil(True)
            os.register_at_fork(after_in_child=_forget_pools)
            _POOLS_PREPARED = True
        if nthreads not in _POOLS:
            _POOLS[nthreads] = ThreadPoolExecutor(nthreads, thread_name_prefix=f"blpickle-{nthreads}")
        return _POOLS[nthreads]


def map_ordered(fn: Callable[[T], R], items: Iterable[T], count: int, nthreads: int) -> Iterator[R]:
    """Yield ``fn(item)`` in order, running up to ``nthreads`` calls at once in a shared pool.

    At most ``nthreads + 1`` items are in flight, so memory stays bounded. ``count`` is the
    number of items expected: a single item, or a single thread, runs inline.
    """
    if nthreads == 1 or count <= 1:
        yield from map(fn, items)
        return
    pool = _pool(nthreads)
    pending: deque[Future[R]] = deque()
    try:
        for item in items:
            pending.append(pool.submit(fn, item))
            if len(pending) > nthreads:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:
        for future in pending:  # on error: let running calls finish before their memory goes
            future.cancel()
        wait(pending)


#: The pickle stream is compressed in chunks of this size as the pickler writes it, each one
#: Blosc2 block: compressing overlaps pickling, and zstd stores a fitted random forest's
#: pickle 4.2x smaller (3.8x in Blosc2's automatic blocks).
GRAPH_CHUNK_SIZE = 256 << 10
#: The codec "auto" gives the pickle stream: on pickle opcodes and small arrays zstd stores
#: 0.45-0.65 of what lz4 stores (no sample needed).
GRAPH_CODEC = "zstd"


class PackedStream:
    """A stream compressed while it is still being written, for the pickle stream: each chunk
    given to `add` is compressed in the shared pool at once, so that compressing the
    pickle overlaps pickling the rest of it.

    Attributes:
        codec: the Blosc2 codec of its chunks.
        chunk_size: the size of every chunk but the last.
        nbytes: bytes added so far.
    """

    itemsize = 1

    def __init__(self, options: Options) -> None:
        self.codec = GRAPH_CODEC if options.codec == "auto" else options.codec
        self.chunk_size = min(options.chunk_size, GRAPH_CHUNK_SIZE)
        self._cparams = {**options.blosc2_cparams(self.itemsize, self.codec), "blocksize": self.chunk_size}
        self._pool = _pool(options.threads) if options.threads > 1 else None
        self._chunks: list[Future[bytes]] = []
        self.nbytes = 0

    def add(self, chunk: bytes, *, last: bool = False) -> None:
        """Start compressing the next chunk (``chunk_size`` bytes, or fewer for the ``last``).
        The last one is compressed in this thread, which would only wait for the pool."""
        self.nbytes += len(chunk)
        if self._pool is None or last:
            future: Future[bytes] = Future()
            future.set_result(self._compress(chunk))
            self._chunks.append(future)
            return
        started = threading.Event()
        self._chunks.append(self._pool.submit(self._compress, chunk, started))
        # Wait until a thread runs it: the pickler holds the GIL, which a waiting thread would
        # otherwise get only at the next switch interval (5 ms), so after pickling is over.
        started.wait()

    def _compress(self, chunk: bytes, started: threading.Event | None = None) -> bytes:
        if started is not None:
            started.set()
        try:
            return compress_chunk(chunk, self._cparams)
        except Exception as exc:
            raise DumpError(f"Blosc2 could not compress a chunk of {len(chunk)} bytes: {exc}") from exc

    def packed(self) -> Iterator[bytes]:
        """Yield the compressed chunks in order, waiting for each.

        Raises:
            DumpError: when Blosc2 could not compress a chunk.
        """
        for future in self._chunks:
            yield future.result()

    def cancel(self) -> None:
        """Drop the chunks not compressed yet (the dump failed)."""
        for future in self._chunks:
            future.cancel()


class CountingWriter:
    """A binary file wrapper that writes everything it is given (looping over short writes
    of raw streams) and counts the bytes written since it was created, in ``pos``."""

    def __init__(self, file: BinaryIO) -> None:
        self._write = file.write
        self.pos = 0

    def write(self, data: Any) -> None:
        size = memoryview(data).nbytes
        written = self._write(data)
        # Raw (unbuffered) streams may write less than asked.
        while written is not None and written < size:
            rest = memoryview(data).cast("B")[written:]
            more = self._write(rest)
            written += more or 0
        self.pos += size


def write_record(
    file: BinaryIO,
    header: fmt.Header,
    payloads: Sequence[Payload | PackedStream],
    options: Options,
    key: bytes | None = None,
) -> None:
    """Write one record: preamble and header, the frames of every stream, then the trailer.

    ``payloads`` holds the data of ``header.streams`` in the same order (a PackedStream is
    compressed already, with the codec its stream names). With a ``key`` the
    record is signed (HMAC-SHA256 of the header and of a BLAKE2b digest of every frame).

    Raises:
        DumpError: when the header is over ``MAX_HEADER_SIZE`` (nothing is written then), or
            when Blosc2 cannot compress a chunk.
    """
    out = CountingWriter(file)
    header = _choose_codecs(header, payloads, options)
    header_bytes = header.encode()
    if len(header_bytes) > fmt.MAX_HEADER_SIZE:
        raise DumpError(
            f"the record's header takes {len(header_bytes)} bytes ({len(header.streams)} streams), over the "
            f"{fmt.MAX_HEADER_SIZE} bytes readers accept: write fewer out-of-band buffers per record"
        )
    head = fmt.encode_preamble(len(header_bytes), 0 if key is None else fmt.FLAG_SIGNED) + header_bytes
    header_checksum = fmt.checksum(head)
    out.write(head + fmt.U64.pack(header_checksum))
    index = fmt.FrameIndex()
    digests: list[bytes] = []
    sign = key is not None
    threads = options.threads
    cparams_cache: dict[tuple[str, int], dict] = {}

    def compress(job: tuple[int, Any, dict]) -> tuple[bytes, int, bytes | None]:
        frame, piece, cparams = job
        try:
            packed = compress_chunk(piece, cparams)
        except Exception as exc:
            raise DumpError(f"Blosc2 could not compress a chunk of {len(piece)} bytes: {exc}") from exc
        return (
            packed,
            fmt.checksum(packed, fmt.frame_seed(header_checksum, frame)),
            fmt.frame_digest(packed) if sign else None,
        )

    for info, payload in zip(header.streams, payloads, strict=True):
        if isinstance(payload, PackedStream):
            frames = _write_packed_stream(out, payload, header_checksum, len(index), sign)
        elif info.raw:
            frames = (
                [_write_raw_frame(out, payload, fmt.frame_seed(header_checksum, len(index)), sign)]
                if info.nbytes
                else []
            )
        else:
            if (info.codec, info.itemsize) not in cparams_cache:
                cparams_cache[info.codec, info.itemsize] = options.blosc2_cparams(info.itemsize, info.codec)
            cparams = cparams_cache[info.codec, info.itemsize]
            jobs = (
                (frame, piece, cparams) for frame, piece in enumerate(payload.chunks(info.chunk_size), start=len(index))
            )
            frames = (
                _write_frame(out, packed, checksum, digest)
                for packed, checksum, digest in map_ordered(compress, jobs, info.nchunks, threads)
            )
        for offset, csize, checksum, digest in frames:
            index.add(offset, csize, checksum)
            if digest is not None:
                digests.append(digest)
    if key is not None:
        index.signature = fmt.signature(key, head, digests)
    trailer = index.encode()
    footer = fmt.FOOTER.pack(len(trailer), fmt.checksum(trailer, header_checksum), fmt.END_MAGIC)
    out.write(fmt.U64.pack(len(trailer)) + trailer + footer)


def _choose_codecs(header: fmt.Header, payloads: Sequence[Payload | PackedStream], options: Options) -> fmt.Header:
    """Return the header with the codec of each compressed stream set (see ``choose_codec``)."""
    streams = tuple(
        info
        if info.raw or info.codec is not None
        else dataclasses.replace(
            info,
            codec=choose_codec(
                options, payload.sample(min(_SAMPLE_SIZE, payload.nbytes // _SAMPLE_FRACTION)), info.itemsize
            ),
        )
        for info, payload in zip(header.streams, payloads, strict=True)
    )
    return dataclasses.replace(header, streams=streams)


Frame = tuple[int, int, int, "bytes | None"]  # offset, stored size, checksum, digest


def _write_frame(out: CountingWriter, packed: bytes, checksum: int, digest: bytes | None) -> Frame:
    offset = out.pos
    out.write(fmt.U64.pack(len(packed)))
    out.write(packed)
    out.write(fmt.U64.pack(checksum))
    return offset, len(packed), checksum, digest


def _write_packed_stream(
    out: CountingWriter, stream: PackedStream, header_checksum: int, first_frame: int, sign: bool
) -> list[Frame]:
    """Write the frames of a PackedStream (the pickle stream, compressed by now) in one write,
    so that an unbuffered file sees one system call for them, not three per chunk."""
    frames: list[Frame] = []
    parts: list[bytes] = []
    offset = out.pos
    for frame, packed in enumerate(stream.packed(), start=first_frame):
        checksum = fmt.checksum(packed, fmt.frame_seed(header_checksum, frame))
        parts += [fmt.U64.pack(len(packed)), packed, fmt.U64.pack(checksum)]
        frames.append((offset, len(packed), checksum, fmt.frame_digest(packed) if sign else None))
        offset += len(packed) + 2 * fmt.U64.size
    out.write(b"".join(parts))
    return frames


def _write_raw_frame(out: CountingWriter, payload: Payload, seed: int, sign: bool) -> Frame:
    out.write(bytes(fmt.raw_padding(out.pos)))
    offset = out.pos
    out.write(fmt.U64.pack(payload.nbytes))
    hasher = xxhash.xxh3_64(seed=seed)
    signer = hashlib.blake2b(digest_size=32) if sign else None
    for piece in payload.chunks(_RAW_READ_SIZE - _RAW_READ_SIZE % payload.chunk_multiple or payload.chunk_multiple):
        hasher.update(piece)
        if signer is not None:
            signer.update(piece)
        out.write(piece)
    checksum = hasher.intdigest()
    out.write(fmt.U64.pack(checksum))
    return offset, payload.nbytes, checksum, None if signer is None else signer.digest()


class Source:
    """Where a record is read from; ``pos`` counts bytes since the record start."""

    pos: int

    def read(self, size: int, what: str) -> Any:
        """Return exactly ``size`` bytes (bytes-like) or raise `TruncatedError`."""
        raise NotImplementedError

    def readinto(self, dst: memoryview, what: str) -> None:
        """Fill ``dst`` completely or raise `TruncatedError`."""
        raise NotImplementedError

    def map(self, size: int, what: str) -> np.ndarray | None:
        """Return the next ``size`` bytes as an array sharing a memory map, or None (then
        nothing is read)."""
        return None

    def size(self) -> int | None:
        """Bytes from the record start to the end of the data, if known (random access:
        then `read_at` and `seek` work too)."""
        return None

    def read_at(self, offset: int, size: int) -> Any:
        """Return up to ``size`` bytes at ``offset`` (from the record start) without moving."""
        raise NotImplementedError

    def seek(self, pos: int) -> None:
        """Go to ``pos`` (from the record start)."""
        raise NotImplementedError


class MemorySource(Source):
    """Reads from an in-memory bytes-like object (or a memory map) without copying.

    Args:
        data: the bytes; the record starts at ``offset``.
        pos: bytes of the record already consumed.
        mapped: ``map()`` returns views of ``data`` (which is a memory-mapped file).
    """

    def __init__(self, data: Any, pos: int = 0, *, offset: int = 0, mapped: bool = False) -> None:
        self._view = memoryview(data).cast("B")[offset:]
        self.pos = pos
        self._mapped = mapped

    def read(self, size: int, what: str) -> memoryview:
        end = self.pos + size
        if end > len(self._view):
            raise TruncatedError(what, self.pos, size, max(len(self._view) - self.pos, 0))
        view = self._view[self.pos : end]
        self.pos = end
        return view

    def readinto(self, dst: memoryview, what: str) -> None:
        dst[:] = self.read(dst.nbytes, what)

    def map(self, size: int, what: str) -> np.ndarray | None:
        """Return a view of the next ``size`` bytes of a memory-mapped file, or None (then
        nothing is read) when they do not start at a multiple of ``ALIGNMENT`` in memory: a
        record that does not start at such a multiple in its file gives copies, never
        misaligned arrays."""
        if not self._mapped:
            return None
        array = np.frombuffer(self._view[self.pos : self.pos + size], dtype=np.uint8)
        if array.ctypes.data % fmt.ALIGNMENT:
            return None
        return np.frombuffer(self.read(size, what), dtype=np.uint8)

    def size(self) -> int:
        return len(self._view)

    def read_at(self, offset: int, size: int) -> memoryview:
        return self._view[offset : offset + size]

    def seek(self, pos: int) -> None:
        self.pos = pos

    def restart(self) -> MemorySource:
        """Return a new source of the same data, at the record start."""
        return MemorySource(self._view, mapped=self._mapped)


class FileSource(Source):
    """Reads from a binary file object (seekable or not). Reads never ask the file for much
    more than it holds: a large read is made in pieces, so a size declared by a damaged or
    forged record allocates only what the file really has.

    For a plain file on disk (see `plain_fileno`) it also offers random access
    (`size`, `read_at`, `seek`), measured from where the record starts.
    """

    def __init__(self, file: BinaryIO, pos: int = 0) -> None:
        self._file = file
        self.pos = pos
        self._fileno = plain_fileno(file)
        self._start = None if self._fileno is None else file.tell() - pos

    def read(self, size: int, what: str) -> bytes | bytearray:
        data = self._file.read(min(size, _RAW_READ_SIZE)) or b""
        if len(data) < size:
            parts = bytearray(data)
            while len(parts) < size:
                more = self._file.read(min(size - len(parts), _RAW_READ_SIZE))
                if not more:
                    raise TruncatedError(what, self.pos, size, len(parts))
                parts += more
            data = parts
        self.pos += size
        return data

    def readinto(self, dst: memoryview, what: str) -> None:
        readinto = getattr(self._file, "readinto", None)
        if readinto is None:
            dst[:] = self.read(dst.nbytes, what)
            return
        dst = dst.cast("B")
        done = 0
        while done < len(dst):
            count = readinto(dst[done:])
            if not count:
                raise TruncatedError(what, self.pos, len(dst), done)
            done += count
            self.pos += count

    def size(self) -> int | None:
        if self._fileno is None:
            return None
        return os.fstat(self._fileno).st_size - self._start

    def read_at(self, offset: int, size: int) -> bytes:
        """Return up to ``size`` bytes at ``offset`` (from the record start) without moving."""
        self._file.seek(self._start + offset)
        try:
            return self._file.read(size)
        finally:
            self._file.seek(self._start + self.pos)

    def seek(self, pos: int) -> None:
        """Go to ``pos`` (from the record start)."""
        self._file.seek(self._start + pos)
        self.pos = pos


class _Recording(Source):
    """A source that keeps a copy of the record's bytes (``head``, then every byte read)."""

    def __init__(self, source: Source, head: bytes) -> None:
        self._source = source
        self._data = bytearray(head)
        self.pos = source.pos

    def read(self, size: int, what: str) -> Any:
        data = self._source.read(size, what)
        self._data += data
        self.pos = self._source.pos
        return data

    def readinto(self, dst: memoryview, what: str) -> None:
        self._source.readinto(dst, what)
        self._data += dst
        self.pos = self._source.pos

    def replay(self) -> MemorySource:
        """Return a source of the bytes kept, at the record start."""
        return MemorySource(self._data)


def plain_fileno(file: Any) -> int | None:
    """Return the descriptor of ``file`` when its bytes are the bytes of a regular file on
    disk: a ``FileIO``, or a buffered reader over one, seekable. Return None for anything
    else, such as ``gzip``/``bz2``/``lzma`` files (whose ``fileno()`` is the compressed file
    underneath), pipes, sockets and in-memory files."""
    raw = file.raw if isinstance(file, (io.BufferedReader, io.BufferedRandom)) else file
    if not isinstance(raw, io.FileIO):
        return None
    try:
        fileno = raw.fileno()
        if not raw.seekable() or not stat.S_ISREG(os.fstat(fileno).st_mode):
            return None
    except (OSError, ValueError):  # a closed file
        return None
    return fileno


_MMAP_ACCESS = {"r": mmap.ACCESS_READ, "r+": mmap.ACCESS_WRITE, "c": mmap.ACCESS_COPY}


def map_file(file: BinaryIO, mmap_mode: str) -> mmap.mmap | None:
    """Map a regular file whole (see `plain_fileno`): read-only for ``mmap_mode``
    "r", shared read-write for "r+", copy-on-write for "c". Return None when ``file`` is
    not a plain file or is empty.

    Arrays viewing the map read the file as they are used: if another program truncates the
    file meanwhile, touching them raises SIGBUS, as with ``numpy.memmap``.
    """
    fileno = plain_fileno(file)
    if fileno is None:
        return None
    size = os.fstat(fileno).st_size
    return mmap.mmap(fileno, size, access=_MMAP_ACCESS[mmap_mode]) if size else None


class RecordReader:
    """Reads one record sequentially: header, then streams in order, then the trailer.

    Args:
        source: where to read; positioned just after the magic bytes when ``magic`` is given.
        nthreads: decompression threads.
        magic: the first bytes already read from the source (the caller peeked at them).
        key: read the whole record and verify its signature with this key before anything
            is decompressed.

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
        if key is not None and not self.signed:
            raise SignatureError("the record is not signed, and a key was given: refusing to load it")
        header_bytes = self._read_head(preamble, header_size)
        self._head = preamble + header_bytes
        self._header_checksum = fmt.checksum(self._head)
        self.header = fmt.Header.decode(header_bytes)
        self._nthreads = nthreads
        self._key = key
        self._digests: list[bytes] = []
        self._authenticated: deque[bytes] | None = None  # digests a second reading must match
        self._next_stream = 0
        self.index = fmt.FrameIndex()
        if key is not None:
            self._authenticate()

    def _authenticate(self) -> None:
        """Read the rest of the record, checking every checksum and, last, the signature,
        without decompressing anything; then stand after the header again, to read the
        record as it was checked.

        A record in memory (or memory-mapped) is read again in place. A plain file on disk is
        read again too, each frame checked against the BLAKE2b digest the signature covered
        before it is used, so that a file changed meanwhile raises `SignatureError`; any
        other file is kept in memory as stored (compressed) meanwhile. Either way, what is
        decompressed is exactly what was authenticated.

        Raises:
            LoadError subclasses for damaged input; SignatureError when the signature does not
            match.
        """
        source, start = self._source, self._source.pos
        rereadable = isinstance(source, FileSource) and source.size() is not None
        if not isinstance(source, MemorySource) and not rereadable:
            self._source = _Recording(source, self._head + fmt.U64.pack(self._header_checksum))
        for _ in self.header.streams:
            self.skip_stream()
        self.finish()
        if rereadable:
            self._authenticated = deque(self._digests)
        else:
            self._source = self._source.replay() if isinstance(self._source, _Recording) else source.restart()
        self._source.seek(start)
        self._digests = []
        self._key = None  # authenticated: the second reading checks the checksums only
        self._next_stream = 0
        self.index = fmt.FrameIndex()

    def _read_head(self, preamble: bytes, header_size: int) -> bytes:
        """Read the header and its checksum; return the header once the checksum over the
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
        return header_bytes

    def read_stream(self, into: memoryview | None = None) -> np.ndarray | memoryview:
        """Read the next stream into ``into`` (of its exact size) or into a new writable uint8
        array, and return that.

        Raises:
            LoadError subclasses when a frame is damaged, truncated or inconsistent.
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
        if info.raw:
            # with mmap_mode only out-of-band buffers are mapped: the object graph is read
            mappable = into is None and number > 0 and info.splice is None
            return self._read_raw(info, number, keep=True, into=into, mappable=mappable)
        if number == 0:
            out, frames = self._read_graph(info)
        else:
            out = _allocate(info.nbytes, number) if into is None else into
            frames = self._read_frames(info, number, out)
        self._run(info, frames)
        return out

    def read_chunks(self, allocate: Callable[[int], Any] | None = None) -> Iterator[memoryview]:
        """Read the pickle stream's frames (call it first) and start decompressing all but
        the first in the pool; return an iterator over its decompressed chunks, in order, so
        that unpickling can start with the first chunk while the others decompress. The first one is
        decompressed by the iterator itself (its caller would only wait for the pool). (A raw
        pickle stream comes whole, as from `read_stream`.) ``allocate(nbytes)`` returns the
        writable buffer the stream is decompressed to, once its size is checked (default: a new
        array).

        Raises:
            LoadError subclasses when a frame is damaged, truncated or inconsistent (for a
            damaged chunk: when the iterator reaches it).
        """
        info = self.header.streams[0]
        if info.raw:
            return iter([memoryview(self.read_stream()).cast("B")])
        self._next()
        _, chunks = self._read_graph(info, allocate)
        if self._nthreads == 1 or len(chunks) == 1:
            return _decompressed(chunks)
        pool = _pool(self._nthreads)
        return _decompressed(chunks, [None, *(pool.submit(unpack_chunk, *chunk) for chunk in chunks[1:])])

    def read_pieces(self) -> Iterator[memoryview]:
        """Read the pickle stream (call it first) a piece at a time, without holding it:
        yield its decompressed chunks in order, each in one buffer that the next reuses (a
        raw stream: pieces of up to ``_RAW_READ_SIZE`` bytes, its checksum checked after the
        last one).

        A chunk is checked before it is decompressed, and no more is decompressed than
        ``MAX_GRAPH_RATIO`` times the bytes stored so far: frames are read ahead (kept as
        stored) while the next chunk would pass that, and a stream whose whole passes it
        raises the `LimitError` that `read_stream` raises, once its frames are read.

        Raises:
            LoadError subclasses when a frame is damaged, truncated or inconsistent.
        """
        number, info = self._next()
        if info.raw:
            if info.nbytes:
                yield from self._raw_pieces(*self._raw_prologue(info, number), info.nbytes, None, number)
            return
        ahead: deque[tuple] = deque()
        buffer = None
        stored = decompressed = 0
        for frame in self._read_frames(info, number, None):
            ahead.append(frame)
            stored += len(frame[0])
            while ahead and decompressed + ahead[0][3] <= stored * fmt.MAX_GRAPH_RATIO:
                packed, checksum, seed, nbytes, _, what, offset = ahead.popleft()
                if buffer is None:
                    buffer = memoryview(_allocate(min(info.chunk_size, info.nbytes), number))
                unpack_chunk(packed, checksum, seed, nbytes, buffer[:nbytes], what, offset)
                decompressed += nbytes
                yield buffer[:nbytes]
        if ahead:
            raise _ratio_error(info.nbytes, stored)

    def skip_stream(self) -> None:
        """Read the next stream and check its checksums, without decompressing it."""
        number, info = self._next()
        if info.raw:
            self._read_raw(info, number, keep=False)
        else:
            self._run(info, self._read_frames(info, number, None))

    def next_stream(self) -> fmt.StreamInfo | None:
        """Return the stream to be read next, or None after the last one."""
        streams = self.header.streams
        return streams[self._next_stream] if self._next_stream < len(streams) else None

    def buffers(self) -> Iterator[np.ndarray]:
        """Yield the out-of-band buffers lazily, in order (splices are read by
        `blpickle.layout.PickleFile` where the pickle reaches them)."""
        while (info := self.next_stream()) is not None:
            if info.splice is not None:
                raise CorruptError(
                    f"stream {self._next_stream} is a splice where the pickle expects an out-of-band buffer"
                )
            yield self.read_stream()

    def finish(self) -> fmt.FrameIndex:
        """Read and check the trailer (and the signature, with a key); every stream must have
        been read. Return the trailer.

        Raises:
            CorruptError, ChecksumError, TruncatedError, LimitError, SignatureError.
        """
        if self._next_stream < len(self.header.streams):
            raise CorruptError(
                f"the pickle used {self._next_stream - 1} out-of-band streams, "
                f"the record holds {len(self.header.streams) - 1}"
            )
        source = self._source
        size = fmt.U64.unpack(source.read(fmt.U64.size, "the trailer size"))[0]
        if size > fmt.MAX_TRAILER_SIZE:
            raise LimitError(f"trailer size {size} is over the limit of {fmt.MAX_TRAILER_SIZE} bytes")
        offset = source.pos
        trailer = bytes(source.read(size, "the trailer"))
        footer_size, stored, end_magic = fmt.FOOTER.unpack(source.read(fmt.FOOTER.size, "the footer"))
        computed = fmt.checksum(trailer, self._header_checksum)
        if stored != computed:
            raise ChecksumError("the trailer", offset, stored, computed)
        if footer_size != size or end_magic != fmt.END_MAGIC:
            raise CorruptError(f"the footer at offset {source.pos - fmt.FOOTER.size} does not match the trailer")
        index = fmt.FrameIndex.decode(trailer, len(self.index), authenticated=self._key is not None)
        if (index.offsets, index.csizes, index.checksums) != (
            self.index.offsets,
            self.index.csizes,
            self.index.checksums,
        ):
            raise CorruptError("the trailer's frame index does not match the frames read")
        if self._key is not None:
            expected = fmt.signature(self._key, self._head, self._digests)
            if index.signature is None or not hmac.compare_digest(index.signature, expected):
                raise SignatureError("the record's signature does not match: wrong key, or the record was altered")
        return index

    def index_from_end(self) -> fmt.FrameIndex | None:
        """Return the record's frame index read from the end of the source, without reading
        the frames (random access), then stand after the record. Return None when the source
        cannot seek, or when what ends it is not this record's footer and trailer.

        Raises:
            LimitError, CorruptError: for a footer of this record with bad contents.
        """
        end = self._source.size()
        if end is None or end - self._source.pos < fmt.U64.size + fmt.FOOTER.size:
            return None
        size, stored, end_magic = fmt.FOOTER.unpack(self._source.read_at(end - fmt.FOOTER.size, fmt.FOOTER.size))
        start = end - fmt.FOOTER.size - size
        if end_magic != fmt.END_MAGIC or size > fmt.MAX_TRAILER_SIZE or start - fmt.U64.size < self._source.pos:
            return None
        trailer = bytes(self._source.read_at(start, size))
        if fmt.checksum(trailer, self._header_checksum) != stored:
            return None  # another record's footer (the checksum is seeded with our header's)
        index = fmt.FrameIndex.decode(trailer, fmt.total_frames(self.header.streams))
        self._source.seek(end)
        return index

    def _next(self) -> tuple[int, fmt.StreamInfo]:
        number = self._next_stream
        self._next_stream += 1
        return number, self.header.streams[number]

    def _frame_name(self, number: int, chunk: int) -> str:
        stream = "the pickle stream" if number == 0 else f"buffer {number - 1}"
        return f"chunk {chunk} of {stream}"

    def _run(self, info: fmt.StreamInfo, frames: Iterable[tuple]) -> None:
        """Check (and decompress) the frames of a compressed stream in the pool."""
        sign = self._key is not None
        jobs = ((*frame, sign) for frame in frames)
        for digest in map_ordered(_unpack_frame, jobs, info.nchunks, self._nthreads):
            if sign:
                self._digests.append(digest)

    def _read_graph(
        self, info: fmt.StreamInfo, allocate: Callable[[int], Any] | None = None
    ) -> tuple[np.ndarray, list[tuple]]:
        """Read every frame of the compressed pickle stream, then allocate where it
        decompresses to; return that and the frames (`unpack_chunk` arguments).

        Raises:
            LimitError: when the stream declares more than ``MAX_GRAPH_RATIO`` times its
                stored size (before anything is allocated for it).
        """
        frames = list(self._read_frames(info, 0, None))
        stored = sum(len(packed) for packed, *_ in frames)
        if info.nbytes > stored * fmt.MAX_GRAPH_RATIO:
            raise _ratio_error(info.nbytes, stored)
        out = _allocate(info.nbytes, 0, allocate)
        view = memoryview(out).cast("B")
        spans = zip(frames, info.chunk_spans(), strict=True)
        return out, [(*frame[:4], view[start:stop], *frame[5:]) for frame, (start, stop) in spans]

    def _read_frames(self, info: fmt.StreamInfo, number: int, out: np.ndarray | None) -> Iterator[tuple]:
        source = self._source
        for chunk, (start, stop) in enumerate(info.chunk_spans()):
            what = self._frame_name(number, chunk)
            offset = source.pos
            csize = fmt.U64.unpack(source.read(fmt.U64.size, f"the size of {what}"))[0]
            if not fmt.BLOSC2_MIN_CHUNK <= csize <= stop - start + fmt.BLOSC2_MAX_OVERHEAD:
                raise CorruptError(
                    f"{what} at offset {offset} declares {csize} compressed bytes for {stop - start} bytes of data"
                )
            packed = source.read(csize, what)
            if self._authenticated is not None:
                self._check_authenticated(fmt.frame_digest(packed), what, offset)
            stored = fmt.U64.unpack(source.read(fmt.U64.size, f"the checksum of {what}"))[0]
            seed = fmt.frame_seed(self._header_checksum, len(self.index))
            self.index.add(offset, csize, stored)
            dst = None if out is None else memoryview(out).cast("B")[start:stop]
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
        out = source.map(info.nbytes, what) if mappable else None
        if out is not None:
            self.index.add(offset, info.nbytes, fmt.U64.unpack(source.read(fmt.U64.size, f"the checksum of {what}"))[0])
            return out
        out = into if into is not None else _allocate(info.nbytes, number) if keep else None
        for _ in self._raw_pieces(what, offset, info.nbytes, out, number):
            pass
        return out

    def _raw_prologue(self, info: fmt.StreamInfo, number: int) -> tuple[str, int]:
        """Read the padding and size field of a raw stream's frame; return its name and offset.

        Raises:
            CorruptError, TruncatedError: for padding that is not zero, a size that is not
                the header's, or more than the file holds (before anything is allocated).
        """
        source = self._source
        what = self._frame_name(number, 0)
        padding = source.read(fmt.raw_padding(source.pos), f"the padding before {what}")
        if any(padding):
            raise CorruptError(f"the padding before {what} at offset {source.pos - len(padding)} is not zero")
        offset = source.pos
        size = fmt.U64.unpack(source.read(fmt.U64.size, f"the size of {what}"))[0]
        if size != info.nbytes:
            raise CorruptError(f"{what} at offset {offset} declares {size} bytes, the header {info.nbytes}")
        end = source.size()
        if end is not None and size > end - source.pos:
            raise TruncatedError(what, source.pos, size, end - source.pos)
        return what, offset

    def _raw_pieces(
        self, what: str, offset: int, size: int, out: np.ndarray | memoryview | None, number: int
    ) -> Iterator[memoryview]:
        """Read a raw frame's ``size`` bytes into ``out`` (or, if None, into one reused buffer
        of at most ``_RAW_READ_SIZE`` bytes), yielding each piece as it is read; then check
        the frame's checksum.

        Raises:
            TruncatedError, ChecksumError: after the last piece, for a damaged frame.
        """
        source = self._source
        seed = fmt.frame_seed(self._header_checksum, len(self.index))
        signed = self._key is not None or self._authenticated is not None
        signer = hashlib.blake2b(digest_size=32) if signed else None
        hasher = xxhash.xxh3_64(seed=seed)
        whole = None if out is None else memoryview(out).cast("B")
        scratch = _allocate(min(size, _RAW_READ_SIZE), number) if whole is None else None
        for start in range(0, size, _RAW_READ_SIZE):
            count = min(_RAW_READ_SIZE, size - start)
            piece = whole[start : start + count] if whole is not None else memoryview(scratch)[:count]
            source.readinto(piece, what)
            hasher.update(piece)
            if signer is not None:
                signer.update(piece)
            yield piece
        stored = fmt.U64.unpack(source.read(fmt.U64.size, f"the checksum of {what}"))[0]
        self.index.add(offset, size, stored)
        if signer is not None and self._key is None:
            self._check_authenticated(signer.digest(), what, offset)
        if stored != hasher.intdigest():
            raise ChecksumError(what, offset, stored, hasher.intdigest())
        if signer is not None and self._key is not None:
            self._digests.append(signer.digest())

    def _check_authenticated(self, digest: bytes, what: str, offset: int) -> None:
        """Refuse a frame read again after the signature was checked that is not the frame
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


def _decompressed(chunks: list[tuple], futures: list[Future[None] | None] | None = None) -> Iterator[memoryview]:
    """Yield where each chunk (a `unpack_chunk` argument tuple) is decompressed to, in
    order: once its future is done, or after decompressing it here when it has none. Closed
    early (the unpickler failed), it cancels the chunks not started yet.

    Raises:
        LoadError subclasses: the error of a damaged chunk, when the iteration reaches it.
    """
    try:
        for number, chunk in enumerate(chunks):
            future = None if futures is None else futures[number]
            if future is None:
                unpack_chunk(*chunk)
            else:
                future.result()
            yield chunk[4]
    finally:
        for future in futures or ():
            if future is not None:
                future.cancel()


def _ratio_error(nbytes: int, stored: int) -> LimitError:
    return LimitError(
        f"the pickle stream declares {nbytes} bytes stored in {stored}: "
        f"over {fmt.MAX_GRAPH_RATIO} times its stored size"
    )


def _allocate(nbytes: int, number: int, allocate: Callable[[int], Any] | None = None) -> Any:
    """Return a writable buffer for stream ``number``: ``allocate(nbytes)``, by default an
    uninitialised array (no zero-fill)."""
    try:
        return np.empty(nbytes, dtype=np.uint8) if allocate is None else allocate(nbytes)
    except MemoryError:
        raise LimitError(f"stream {number} declares {nbytes} bytes, more than can be allocated") from None


def unpack_chunk(
    packed: Any, stored: int, seed: int, nbytes: int, dst: memoryview | None, what: str, offset: int
) -> None:
    """Check one stored Blosc2 chunk, then decompress it into ``dst`` (unless None).

    In this order: its checksum (before anything reaches Blosc2), then that the chunk header
    declares ``nbytes`` decompressed and ``len(packed)`` compressed bytes (``decompress2``
    trusts the header, not the size of ``dst``).

    Raises:
        ChecksumError, CorruptError: naming ``what`` and its ``offset``.
    """
    computed = fmt.checksum(packed, seed)
    if computed != stored:
        raise ChecksumError(what, offset, stored, computed)
    declared, cbytes, _ = blosc2.get_cbuffer_sizes(packed)
    if declared != nbytes or cbytes != len(packed):
        raise CorruptError(
            f"{what} at offset {offset} holds {declared} bytes in {cbytes}, expected {nbytes} in {len(packed)}"
        )
    if dst is not None:
        try:
            blosc2.decompress2(packed, dst=dst, nthreads=1)  # the default spawns a thread pool per call
        except Exception as exc:
            raise CorruptError(f"Blosc2 could not decompress {what} at offset {offset}: {exc}") from None


def _unpack_frame(job: tuple) -> bytes | None:
    """Run `unpack_chunk` on a frame; return its BLAKE2b digest if the record is signed."""
    *chunk, sign = job
    unpack_chunk(*chunk)
    return fmt.frame_digest(chunk[0]) if sign else None
