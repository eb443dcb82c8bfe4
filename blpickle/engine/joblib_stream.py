"""The ``"blosc"`` stream of the joblib compressor: a byte stream cut into checksummed Blosc2 chunks.

joblib hands a compressor an opaque byte stream (pickle opcodes, then each array's raw bytes).
`BloscFile` cuts it into chunks, asks `blpickle.engine.policy.plan_stream_chunk` how to compress each
one (element size and filters probed on a sample) and compresses and decompresses them with
`blpickle.engine.chunks` in the shared thread pool. The layout is specified in ``docs/format.md``
("The joblib "blosc" stream"). This module does not import joblib.
"""

from __future__ import annotations

import io
import os
import struct
from collections import deque
from collections.abc import Generator, Iterator
from concurrent.futures import Future
from typing import Any, BinaryIO, cast

import numpy as np

from .. import format as fmt
from ..errors import (
    BadMagicError,
    ChecksumError,
    CorruptError,
    DumpError,
    LimitError,
    OptionsError,
    UnsupportedVersionError,
)
from ..io.sources import READ_SIZE, FileSource
from ..options import MAX_CHUNK_SIZE, MIN_CHUNK_SIZE, Options
from .chunks import compress_chunk, unpack_chunk
from .policy import plan_stream_chunk
from .pool import map_ordered, shared_pool
from .writer import CountingWriter

__all__ = ["CHUNK_SIZES", "END", "HEADER", "MAGIC", "STREAM_OPTIONS", "BloscFile", "StreamMagicError"]

#: The first 8 bytes of a stream.
MAGIC = fmt.JOBLIB_MAGIC
VERSION_MAJOR = 1
VERSION_MINOR = 0
HEADER = struct.Struct("<8sBBHI")  # magic, major, minor, flags, chunk size (then its u64 checksum)
CHUNK_SIZES = struct.Struct("<QQ")  # decompressed size, stored size (0, 0: the end record follows)
END = struct.Struct("<QQ")  # number of chunks, total decompressed size (then its u64 checksum)
#: Chunk sizes are multiples of this, so that array elements (which joblib aligns to 16 bytes
#: in its stream) start at the same phase in every chunk.
CHUNK_MULTIPLE = 64
STREAM_OPTIONS = Options()
"""The default options: blpickle's (codec "auto", shuffle, 4 MiB chunks)."""
#: ``count`` for `blpickle.engine.pool.map_ordered`: the number of chunks is not known ahead.
_UNKNOWN_COUNT = 1 << 62
_WRITE, _READ = "wb", "rb"
#: Chunk buffers kept for reuse (already paged in), in each direction.
_SPARE_BUFFERS = 2
#: Reading decompresses ahead at most this many bytes (but one chunk, whatever its size):
#: fewer threads read a stream of larger chunks.
READ_AHEAD = 64 << 20


class StreamMagicError(BadMagicError):
    """The input does not start with the magic bytes of the ``"blosc"`` joblib stream."""

    def __init__(self, found: bytes) -> None:
        super().__init__(found)
        self.args = (f"not a blpickle joblib stream: expected the magic bytes {MAGIC!r} at offset 0, found {found!r}",)


class BloscFile(io.RawIOBase):
    """A binary file that writes or reads the ``"blosc"`` stream; not seekable.

    Args:
        file: a path, or a binary file object (left open on `close`).
        mode: ``"wb"`` or ``"rb"``.
        compresslevel: Blosc2 level 0 to 9 (``None``: the level of ``options``).
        options: codec, filters, chunk size and threads (default: `STREAM_OPTIONS`).
        try_bitshuffle: with ``shuffle="shuffle"``, let each chunk use bit shuffle where its
            sample compresses clearly better with it.

    Writing compresses each full chunk in the shared pool while the caller goes on writing; at
    most ``threads + 2`` chunks are in flight, and `close` writes the last chunk and the end
    record. Reading decompresses ahead in the same way; every chunk's checksum and sizes are
    verified before Blosc2 sees it, and the end record before the last byte is returned.

    Raises:
        blpickle.LoadError subclasses on reading damaged or truncated input;
        blpickle.DumpError when Blosc2 cannot compress; ValueError for a bad mode or level.
    """

    def __init__(
        self,
        file: str | os.PathLike[str] | BinaryIO,
        mode: str = "rb",
        compresslevel: int | None = None,
        *,
        options: Options | None = None,
        try_bitshuffle: bool = True,
    ) -> None:
        super().__init__()
        self._mode: str | None = None
        self._close_file = False
        if mode not in (_WRITE, _READ):
            raise ValueError(f"Invalid mode: {mode!r}, expected 'rb' or 'wb'")
        options = STREAM_OPTIONS if options is None else options
        if compresslevel is not None:
            options = options.replace(clevel=compresslevel)
        if options.codec is None:
            raise OptionsError("the joblib 'blosc' compressor needs a codec; codec=None stores nothing compressed")
        self._options = options
        bitshuffle = try_bitshuffle and options.shuffle == "shuffle"
        self._alternatives = (options.replace(shuffle="bitshuffle"),) if bitshuffle else ()
        self._threads = options.threads
        self._pos = 0
        if isinstance(file, (str, os.PathLike)):
            self._file: Any = open(file, mode)  # noqa: SIM115 -- closed by close()
            self._close_file = True
        elif hasattr(file, "read") or hasattr(file, "write"):
            self._file = file
        else:
            raise TypeError("filename must be a str or bytes object, or a file")
        self._mode = mode
        try:
            self._start_writing() if mode == _WRITE else self._start_reading()
        except BaseException:
            self._mode = None
            self.close()
            raise

    def readable(self) -> bool:
        self._check_open()
        return self._mode == _READ

    def writable(self) -> bool:
        self._check_open()
        return self._mode == _WRITE

    def seekable(self) -> bool:
        return False

    def tell(self) -> int:
        """Return the position in the decompressed stream."""
        self._check_open()
        return self._pos

    def fileno(self) -> int:
        self._check_open()
        return int(self._file.fileno())

    def close(self) -> None:
        """Finish the stream (writing: the last chunk and the end record), then close."""
        if self.closed:
            return
        try:
            if self._mode == _WRITE:
                self._finish_writing()
            elif self._mode == _READ:
                self._results.close()  # waits for decompressions still running
        finally:
            try:
                if self._close_file:
                    self._file.close()
            finally:
                self._mode = None
                super().close()

    def _check_open(self) -> None:
        if self.closed:
            raise ValueError("I/O operation on closed file.")

    def _bytes_of(self, data: Any, mode: str) -> memoryview:
        """Return ``data`` as bytes, for a file open in ``mode``."""
        self._check_open()
        if self._mode != mode:
            raise io.UnsupportedOperation(f"File not open for {'writing' if mode == _WRITE else 'reading'}")
        return memoryview(data).cast("B")

    # -- writing ------------------------------------------------------------------------------

    def _start_writing(self) -> None:
        self._chunk_size = self._options.chunk_size - self._options.chunk_size % CHUNK_MULTIPLE
        head = HEADER.pack(MAGIC, VERSION_MAJOR, VERSION_MINOR, 0, self._chunk_size)
        self._header_checksum = fmt.checksum(head)
        self._out = CountingWriter(self._file)
        self._out.write(head + fmt.U64.pack(self._header_checksum))
        self._fill = np.empty(0, dtype=np.uint8)
        self._filled = 0
        self._nchunks = 0
        self._pending: deque[Future[tuple[np.ndarray, bytes, int]]] = deque()
        self._spare: list[np.ndarray] = []
        self._failed = False

    def write(self, data: Any) -> int:
        """Append ``data`` (any bytes-like object) to the stream; return its size."""
        view = self._bytes_of(data, _WRITE)
        done = 0
        try:
            while done < len(view):
                if not self._fill.size:
                    self._fill = self._spare.pop() if self._spare else np.empty(self._chunk_size, dtype=np.uint8)
                take = min(self._chunk_size - self._filled, len(view) - done)
                self._fill.data[self._filled : self._filled + take] = view[done : done + take]
                self._filled += take
                done += take
                if self._filled == self._chunk_size:
                    self._submit(self._fill)
                    self._fill, self._filled = np.empty(0, dtype=np.uint8), 0
        except BaseException:
            self._failed = True
            raise
        self._pos += len(view)
        return len(view)

    def _submit(self, chunk: np.ndarray) -> None:
        """Start compressing a full chunk; write the oldest chunks while too many are in flight."""
        index = self._nchunks
        self._nchunks += 1
        if self._threads == 1:
            self._write_chunk(*self._compress(index, chunk))
            return
        self._pending.append(shared_pool(self._threads).submit(self._compress, index, chunk))
        while len(self._pending) > self._threads + 1:  # one queued: no thread waits for the caller
            self._write_chunk(*self._pending.popleft().result())

    def _compress(self, index: int, chunk: np.ndarray) -> tuple[np.ndarray, bytes, int]:
        """Return the chunk, its Blosc2 chunk and that one's checksum (in a pool thread)."""
        try:
            packed = compress_chunk(chunk, plan_stream_chunk(chunk, self._options, self._alternatives).cparams)
        except Exception as exc:
            raise DumpError(f"the joblib stream could not compress chunk {index} ({len(chunk)} bytes): {exc}") from exc
        return chunk, packed, fmt.checksum(packed, fmt.chunk_seed(self._header_checksum, index))

    def _write_chunk(self, chunk: np.ndarray, packed: bytes, digest: int) -> None:
        self._out.write(CHUNK_SIZES.pack(len(chunk), len(packed)))
        self._out.write(packed)
        self._out.write(fmt.U64.pack(digest))
        if len(chunk) == self._chunk_size and len(self._spare) < _SPARE_BUFFERS:
            self._spare.append(chunk)

    def _finish_writing(self) -> None:
        try:
            if self._failed:  # a write failed: leave the stream unterminated
                return
            while self._pending:
                self._write_chunk(*self._pending.popleft().result())
            if self._filled:
                self._write_chunk(*self._compress(self._nchunks, self._fill[: self._filled]))
                self._nchunks += 1
            end = CHUNK_SIZES.pack(0, 0) + END.pack(self._nchunks, self._pos)
            digest = fmt.checksum(end, fmt.chunk_seed(self._header_checksum, self._nchunks))
            self._out.write(end + fmt.U64.pack(digest))
        finally:
            for future in self._pending:  # after an error: let running compressions finish
                future.cancel()
                if not future.cancelled():
                    future.exception()
            self._pending.clear()

    # -- reading ------------------------------------------------------------------------------

    def _start_reading(self) -> None:
        self._source = FileSource(self._file)
        magic = bytes(self._source.read(len(MAGIC), "the magic bytes"))
        if magic != MAGIC:
            raise StreamMagicError(magic)
        head = magic + self._source.read(HEADER.size - len(MAGIC), "the stream header")
        _, major, minor, _flags, chunk_size = HEADER.unpack(head)  # no flags are defined yet
        if major != VERSION_MAJOR:  # before anything else: a new major may change the rest
            raise UnsupportedVersionError(major, minor, VERSION_MAJOR)
        stored = fmt.U64.unpack(self._source.read(fmt.U64.size, "the checksum of the stream header"))[0]
        self._header_checksum = fmt.checksum(head)
        if stored != self._header_checksum:
            raise ChecksumError("the stream header", 0, stored, self._header_checksum)
        if not MIN_CHUNK_SIZE <= chunk_size <= MAX_CHUNK_SIZE or chunk_size % CHUNK_MULTIPLE:
            raise LimitError(
                f"the stream header sets chunks of {chunk_size} bytes; a stream's chunks are a multiple "
                f"of {CHUNK_MULTIPLE} bytes from {MIN_CHUNK_SIZE} to {MAX_CHUNK_SIZE}"
            )
        self._chunk_size = chunk_size
        self._packed_size = chunk_size + fmt.BLOSC2_MAX_OVERHEAD
        self._current = memoryview(b"")
        self._offset = 0
        self._eof = False
        self._spare_chunks: list[np.ndarray] = []
        self._spare_packed: list[np.ndarray] = []
        threads = max(1, min(self._threads, READ_AHEAD // chunk_size - 1))  # threads + 1 chunks in flight
        results = map_ordered(self._decompress, self._chunks_in(), _UNKNOWN_COUNT, threads)
        self._results = cast(Generator[tuple[np.ndarray, memoryview], None, None], results)  # closed by close()

    def _chunks_in(self) -> Iterator[tuple]:
        """Read the chunks in order (in the reading thread), yielding decompression jobs."""
        source = self._source
        index = total = 0
        while True:
            offset = source.pos
            what = f"chunk {index} of the stream"
            nbytes, csize = CHUNK_SIZES.unpack(source.read(CHUNK_SIZES.size, f"the sizes of {what}"))
            if nbytes == csize == 0:
                self._check_end(offset, index, total)
                return
            if total % self._chunk_size:
                raise CorruptError(f"{what} at offset {offset} comes after a short chunk, which must be the last")
            if (
                not 1 <= nbytes <= self._chunk_size
                or not fmt.BLOSC2_MIN_CHUNK <= csize <= nbytes + fmt.BLOSC2_MAX_OVERHEAD
            ):
                raise CorruptError(
                    f"{what} at offset {offset} is sized {nbytes} bytes stored in {csize}: a chunk holds "
                    f"1 to {self._chunk_size} bytes in {fmt.BLOSC2_MIN_CHUNK} to {fmt.BLOSC2_MAX_OVERHEAD} more"
                )
            if self._packed_size <= READ_SIZE:  # a reused buffer, of at most 8 MiB before its bytes arrive
                packed = self._spare_packed.pop() if self._spare_packed else np.empty(self._packed_size, np.uint8)
                source.readinto(packed.data[:csize], what)
            else:  # read as it arrives: a declared size allocates no more than the input holds
                packed = np.frombuffer(source.read(csize, what), np.uint8)
            stored = fmt.U64.unpack(source.read(fmt.U64.size, f"the checksum of {what}"))[0]
            full = nbytes == self._chunk_size and self._spare_chunks
            dst = self._spare_chunks.pop() if full else np.empty(nbytes, dtype=np.uint8)
            seed = fmt.chunk_seed(self._header_checksum, index)
            yield packed, (packed.data[:csize], stored, seed, nbytes, dst.data, what, offset)
            index += 1
            total += nbytes

    @staticmethod
    def _decompress(job: tuple) -> tuple[np.ndarray, memoryview]:
        packed, chunk = job
        unpack_chunk(*chunk)  # checksum, then the chunk's declared sizes, then Blosc2
        return packed, chunk[4]

    def _check_end(self, offset: int, nchunks: int, total: int) -> None:
        rest = self._source.read(END.size, "the end record")
        stored = fmt.U64.unpack(self._source.read(fmt.U64.size, "the checksum of the end record"))[0]
        computed = fmt.checksum(CHUNK_SIZES.pack(0, 0) + rest, fmt.chunk_seed(self._header_checksum, nchunks))
        if stored != computed:
            raise ChecksumError("the end record", offset, stored, computed)
        if END.unpack(rest) != (nchunks, total):
            declared_chunks, declared_total = END.unpack(rest)
            raise CorruptError(
                f"the end record at offset {offset} counts {declared_chunks} chunks of {declared_total} bytes; "
                f"{nchunks} chunks of {total} bytes precede it"
            )

    def _next_chunk(self) -> bool:
        """Move to the next decompressed chunk, recycling the one read; False at the end."""
        done = self._current.obj
        if isinstance(done, np.ndarray) and done.size == self._chunk_size and len(self._spare_chunks) < _SPARE_BUFFERS:
            self._spare_chunks.append(done)
        try:
            packed, self._current = next(self._results)
        except StopIteration:
            self._eof = True
            self._current = memoryview(b"")
        else:
            if packed.size == self._packed_size <= READ_SIZE and len(self._spare_packed) < _SPARE_BUFFERS:
                self._spare_packed.append(packed)
        self._offset = 0
        return not self._eof

    def readinto(self, buffer: Any) -> int:
        """Fill ``buffer`` from the decompressed stream; return the byte count (0 at the end)."""
        view = self._bytes_of(buffer, _READ)
        done = 0
        while done < len(view) and not self._eof:
            if self._offset == len(self._current) and not self._next_chunk():
                break
            take = min(len(view) - done, len(self._current) - self._offset)
            view[done : done + take] = self._current[self._offset : self._offset + take]
            done += take
            self._offset += take
        if self._offset == len(self._current) and not self._eof:
            self._next_chunk()  # the end record is checked before the last byte is returned
        self._pos += done
        return done
