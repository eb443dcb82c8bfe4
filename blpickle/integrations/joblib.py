"""blpickle for joblib users: the ``"blosc"`` compressor and the ``"blpickle"`` store backend.

`register` registers with joblib (importing this module registers nothing):

- the compressor ``"blosc"``: ``joblib.dump(obj, f, compress="blosc")`` or
  ``compress=("blosc", level)``, files named ``*.blosc``, ``joblib.Memory(..., compress="blosc")``;
  ``joblib.load`` recognises the files by their first byte. joblib hands a compressor an opaque
  byte stream, so `BloscFile` cuts it into chunks, picks the shuffle element size of each
  chunk (1, 2, 4, 8 or 16 bytes) and byte or bit shuffle by compressing a sample, and
  compresses the chunks with Blosc2 in a thread pool while another thread writes. Every chunk
  carries a checksum checked before Blosc2 sees it. The byte layout is in ``docs/joblib.md``.
- the store backend ``"blpickle"``: ``joblib.Memory(location, backend="blpickle")`` writes cached
  results with `blpickle.dump` (array-aware, checksummed, atomic) and reads them with
  `blpickle.load`; with ``compress=False`` (joblib's default) buffers are stored raw and
  ``mmap_mode="r"`` maps them.

The compressor must be registered in every process that writes or loads such files. In worker
processes, pass ``compress=blpickle.integrations.joblib.BLOSC`` (a ``"blosc"`` string that
registers the compressor where it is unpickled) or call `register` in the worker's code.
"""

from __future__ import annotations

import contextlib
import functools
import io
import mmap
import os
import queue
import struct
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from pickle import PicklingError
from typing import Any, BinaryIO

import joblib
import numpy as np
from joblib.compressor import CompressorWrapper
from joblib.logger import format_time

from .. import format as fmt
from ..arrays import rebuild_ndarray
from ..buffers import spread_sample
from ..chunks import compress_chunk, unpack_chunk
from ..errors import (
    BadMagicError,
    BlpickleWarning,
    ChecksumError,
    CorruptError,
    DumpError,
    LimitError,
    LoadError,
    OptionsError,
    UnsupportedVersionError,
)
from ..files import is_path
from ..options import MAX_CHUNK_SIZE, MIN_CHUNK_SIZE, Options, resolve_options
from ..pickler import dump as blpickle_dump
from ..policy import choose_codec
from ..pool import map_ordered
from ..sources import FileSource
from ..unpickler import Unpickler
from ..unpickler import load as blpickle_load
from ..writer import CountingWriter
from . import JOBLIB_MAGIC
from ._host_internals import joblib_store_classes

__all__ = [
    "BLOSC",
    "EXTENSION",
    "MAGIC",
    "PREFIX",
    "STREAM_OPTIONS",
    "BloscCompressorWrapper",
    "BloscFile",
    "BlpickleStoreBackend",
    "CorruptItemError",
    "options_for_compress",
    "pick_filters",
    "pick_typesize",
    "register",
]

#: The first 8 bytes of a stream written by the ``"blosc"`` compressor.
MAGIC = JOBLIB_MAGIC
#: What joblib matches to recognise the stream: the magic's first byte, which is neither a pickle
#: opcode nor the first byte of another joblib format, so a file cut inside the magic still comes
#: to `BloscFile` and is reported as truncated.
PREFIX = MAGIC[:1]
#: ``joblib.dump(obj, "name.blosc")`` compresses with ``"blosc"``.
EXTENSION = ".blosc"
NAME = "blosc"
BACKEND_NAME = "blpickle"
VERSION_MAJOR = 1
VERSION_MINOR = 0

HEADER = struct.Struct("<8sBBHI")  # magic, major, minor, flags, chunk size (+ u64 checksum)
FRAME = struct.Struct("<QQ")  # decompressed size, compressed size (0, 0: the end record)
END = struct.Struct("<QQ")  # number of chunks, total decompressed size (+ u64 checksum)
U64 = fmt.U64

#: Chunk sizes are multiples of this, so array elements (which joblib aligns to 16 bytes in
#: the stream) start at the same phase in every chunk.
CHUNK_MULTIPLE = 64
#: Element sizes tried for the shuffle filter, on a sample of each chunk (16: complex128).
TYPESIZES = (1, 2, 4, 8, 16)
SAMPLE_PIECES = 4
SAMPLE_PIECE_SIZE = 16 << 10
#: An alternative filter (bit shuffle) is used only if it makes the compressed sample at least
#: 3% smaller and saves at least 0.5% of the raw sample (on data that compresses hundreds of
#: times, a few bytes more or less in the sample say nothing about the chunk).
ALTERNATIVE_GAIN = 0.97
ALTERNATIVE_SAVING = 0.005
#: The compressor's default: blpickle's default options (codec "auto", shuffle, 4 MiB chunks;
#: joblib writes 16 MiB at a time, cut into four chunks).
STREAM_OPTIONS = Options()
#: ``count`` for `blpickle.pool.map_ordered`: the number of chunks is not known.
_UNKNOWN_COUNT = 1 << 62

_WRITE, _READ = "wb", "rb"


# --------------------------------------------------------------------------------------------
# The compressed stream


def pick_filters(chunk: Any, options: Options, alternatives: Sequence[Options] = ()) -> tuple[Options, int]:
    """Return the options and element size that compress a sample of ``chunk`` best.

    The element size is the one of `TYPESIZES` that compresses the sample best with
    ``options``' filters and the fast lz4 codec (ties go to the smaller size; without shuffle
    or bytedelta it changes nothing: 1). Then ``options`` and each of ``alternatives`` (other
    filters) compress the sample at that size with their own codec: an alternative is used
    only if it gives less than `ALTERNATIVE_GAIN` times the size of ``options`` and
    saves `ALTERNATIVE_SAVING` of the raw sample (bit shuffle is often slower to
    compress, so it must win clearly). The sample is
    `SAMPLE_PIECES` pieces of `SAMPLE_PIECE_SIZE` bytes spread over the chunk, each
    starting at a multiple of 16 bytes from the chunk start.
    """
    sample = spread_sample(chunk, SAMPLE_PIECES * SAMPLE_PIECE_SIZE, 16, SAMPLE_PIECES)

    def size(candidate: Options, typesize: int) -> int:
        return len(compress_chunk(sample, candidate.blosc2_cparams(typesize)))

    if options.shuffle == "noshuffle" and not options.bytedelta:
        typesize = 1  # the element size changes nothing
    else:  # ranked with fast lz4 (zstd spends ~40 us setting up each call on a small sample)
        probe = options.replace(codec="lz4", clevel=1)
        sizes = [size(probe, t) for t in TYPESIZES]
        typesize = TYPESIZES[sizes.index(min(sizes))]
    if options.codec == "auto":
        options = options.replace(codec=choose_codec(options, sample, typesize))
    if not alternatives:
        return options, typesize
    best, best_size = options, size(options, typesize)
    for candidate in alternatives:
        if candidate.codec == "auto":
            candidate = candidate.replace(codec=options.codec)
        candidate_size = size(candidate, typesize)
        saved = best_size - candidate_size
        if saved > best_size * (1 - ALTERNATIVE_GAIN) and saved > memoryview(sample).nbytes * ALTERNATIVE_SAVING:
            best, best_size = candidate, candidate_size
    return best, typesize


def pick_typesize(chunk: Any, options: Options) -> int:
    """Return the element size of `TYPESIZES` that compresses a sample of ``chunk`` best
    with ``options`` (see `pick_filters`)."""
    return pick_filters(chunk, options)[1]


class StreamMagicError(BadMagicError):
    """The input does not start with the magic bytes of the ``"blosc"`` joblib stream."""

    def __init__(self, found: bytes) -> None:
        super().__init__(found)
        self.args = (f"not a blpickle joblib stream: expected the magic bytes {MAGIC!r} at offset 0, found {found!r}",)


class BloscFile(io.RawIOBase):
    """A binary file that writes or reads the chunked Blosc2 stream of the ``"blosc"`` compressor.

    Args:
        file: a path, or a binary file object (left open on `close`).
        mode: ``"wb"`` or ``"rb"``.
        compresslevel: Blosc2 level 0 to 9 (``None``: the level of ``options``).
        options: codec, filters, chunk size and threads (default: `STREAM_OPTIONS`).
        try_bitshuffle: with ``shuffle="shuffle"``, also try bit shuffle on each chunk's
            sample and use it where it compresses better (small integers: int16 samples
            compress to 1.37 instead of 1.29, and twice as fast with zstd).

    Writing cuts the stream into chunks of ``options.chunk_size`` bytes (rounded down to a
    multiple of 64); a background thread feeds them to a thread pool that compresses them and
    writes the frames in order, so at most a few chunks are in memory. `close` writes the
    end record. Reading decompresses ahead in the same pool; every chunk's checksum and sizes are
    verified before Blosc2 sees it, and the end record is checked as soon as the last byte is
    read. Not seekable.

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
        self._file: Any = None
        self._close_file = False
        self._thread: threading.Thread | None = None
        self._results: Iterator[memoryview] | None = None
        if mode not in (_WRITE, _READ):
            raise ValueError(f"Invalid mode: {mode!r}, expected 'rb' or 'wb'")
        options = STREAM_OPTIONS if options is None else options
        if compresslevel is not None:
            options = options.replace(clevel=compresslevel)
        if options.codec is None:
            raise OptionsError("the joblib 'blosc' compressor needs a codec; codec=None stores nothing compressed")
        self._options = options
        # byte shuffle (the default) or, chunk by chunk where it compresses better, bit shuffle
        self._alternatives = (
            (options.replace(shuffle="bitshuffle"),) if try_bitshuffle and options.shuffle == "shuffle" else ()
        )
        self._threads = options.threads
        self._pos = 0
        if is_path(file):
            self._file = open(file, mode)  # noqa: SIM115 -- closed by close()
            self._close_file = True
        elif hasattr(file, "read") or hasattr(file, "write"):
            self._file = file
        else:
            raise TypeError("filename must be a str or bytes object, or a file")
        self._mode = mode
        try:
            if mode == _WRITE:
                self._start_writing()
            else:
                self._start_reading()
        except BaseException:
            self._mode = None
            self.close()
            raise

    # -- common -------------------------------------------------------------------------------

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
        return self._file.fileno()

    def close(self) -> None:
        """Finish the stream (writing: the last chunk and the end record), then close."""
        if self.closed:
            return
        try:
            if self._mode == _WRITE:
                self._finish_writing()
            elif self._mode == _READ:
                self._finish_reading()
        finally:
            try:
                if self._close_file and self._file is not None:
                    self._file.close()
            finally:
                self._mode = None
                super().close()

    def _check_open(self) -> None:
        if self.closed:
            raise ValueError("I/O operation on closed file.")

    # -- writing ------------------------------------------------------------------------------

    def _start_writing(self) -> None:
        chunk_size = self._options.chunk_size - self._options.chunk_size % CHUNK_MULTIPLE
        self._chunk_size = chunk_size
        self._out = CountingWriter(self._file)
        head = HEADER.pack(MAGIC, VERSION_MAJOR, VERSION_MINOR, 0, chunk_size)
        self._header_checksum = fmt.checksum(head)
        self._out.write(head + U64.pack(self._header_checksum))
        self._fill: np.ndarray | None = None
        self._filled = 0
        self._nchunks = 0
        self._held: tuple[int, np.ndarray] | None = None  # the first chunk: no thread for one chunk
        self._queue: queue.Queue[tuple[int, Any] | None] = queue.Queue(maxsize=1)
        self._spare: queue.Queue[np.ndarray] = queue.Queue(maxsize=2)  # written chunks, for reuse
        self._jobs_done = False
        self._error: BaseException | None = None
        self._error_raised = False

    def write(self, data: Any) -> int:
        """Append ``data`` (any bytes-like object) to the stream; return its size."""
        self._check_open()
        if self._mode != _WRITE:
            raise io.UnsupportedOperation("File not open for writing")
        self._raise_writer_error()
        view = memoryview(data).cast("B")
        size = len(view)
        done = 0
        while done < size:
            if self._fill is None:
                self._fill = self._new_buffer()
                self._filled = 0
            take = min(self._chunk_size - self._filled, size - done)
            memoryview(self._fill)[self._filled : self._filled + take] = view[done : done + take]
            self._filled += take
            done += take
            if self._filled == self._chunk_size:
                chunk, self._fill, self._filled = self._fill, None, 0
                self._submit(chunk)
        self._pos += size
        return size

    def _new_buffer(self) -> np.ndarray:
        """Return a chunk buffer: a recycled one (already paged in) or a new one."""
        try:
            return self._spare.get_nowait()
        except queue.Empty:
            return np.empty(self._chunk_size, dtype=np.uint8)

    def _recycle(self, chunk: Any) -> None:
        if isinstance(chunk, np.ndarray) and chunk.size == self._chunk_size:
            with contextlib.suppress(queue.Full):
                self._spare.put_nowait(chunk)

    def _submit(self, chunk: np.ndarray) -> None:
        job = (self._nchunks, chunk)
        self._nchunks += 1
        if self._thread is None:
            if self._held is None:
                self._held = job
                return
            self._thread = threading.Thread(target=self._write_frames, name="blpickle-joblib-writer", daemon=True)
            self._thread.start()
            self._put(self._held)
            self._held = None
        self._put(job)

    def _put(self, job: tuple[int, Any] | None) -> None:
        self._raise_writer_error()
        self._queue.put(job)

    def _raise_writer_error(self) -> None:
        if self._error is not None and not self._error_raised:
            self._error_raised = True
            raise self._error

    def _jobs(self) -> Iterator[tuple[int, Any]]:
        while True:
            job = self._queue.get()
            if job is None:
                self._jobs_done = True
                return
            yield job

    def _write_frames(self) -> None:
        """The writer thread: compress queued chunks in the pool, write the frames in order."""
        frames = map_ordered(self._compress, self._jobs(), _UNKNOWN_COUNT, self._threads)
        try:
            for frame in frames:
                self._write_frame(*frame)
        except BaseException as exc:  # handed to the producer by write() or close()
            self._error = exc
            frames.close()
            while not self._jobs_done:  # keep the producer from blocking on a full queue
                if self._queue.get() is None:
                    self._jobs_done = True

    def _compress(self, job: tuple[int, Any]) -> tuple[int, bytes, int]:
        index, chunk = job
        try:
            options, typesize = pick_filters(chunk, self._options, self._alternatives)
            packed = compress_chunk(chunk, options.blosc2_cparams(typesize))
        except Exception as exc:
            raise DumpError(f"Blosc2 could not compress chunk {index} ({len(chunk)} bytes): {exc}") from exc
        self._recycle(chunk)
        return (
            len(chunk),
            packed,
            fmt.checksum(packed, fmt.frame_seed(self._header_checksum, index)),
        )

    def _write_frame(self, nbytes: int, packed: bytes, digest: int) -> None:
        self._out.write(FRAME.pack(nbytes, len(packed)))
        self._out.write(packed)
        self._out.write(U64.pack(digest))

    def _finish_writing(self) -> None:
        try:
            if self._filled:
                chunk, self._fill = self._fill[: self._filled], None
                self._filled = 0
                self._submit(chunk)
            if self._thread is None:
                if self._held is not None:
                    self._write_frame(*self._compress(self._held))
                    self._held = None
            else:
                self._queue.put(None)
                self._thread.join()
                self._thread = None
                self._raise_writer_error()
                if self._error is not None:
                    return  # raised by an earlier write(): leave the stream unterminated
            end = FRAME.pack(0, 0) + END.pack(self._nchunks, self._pos)
            digest = fmt.checksum(end, fmt.frame_seed(self._header_checksum, self._nchunks))
            self._out.write(end + U64.pack(digest))
        finally:
            if self._thread is not None:  # an error above: stop the writer thread
                if not self._jobs_done:
                    self._queue.put(None)
                self._thread.join()
                self._thread = None

    # -- reading ------------------------------------------------------------------------------

    def _start_reading(self) -> None:
        self._source = FileSource(self._file)
        magic = self._source.read(len(MAGIC), "the magic bytes")
        if magic != MAGIC:
            raise StreamMagicError(magic)
        head = magic + self._source.read(HEADER.size - len(MAGIC), "the stream header")
        _, major, minor, _flags, chunk_size = HEADER.unpack(head)  # no flags are defined yet
        if major != VERSION_MAJOR:  # before anything else: a new major may change the rest
            raise UnsupportedVersionError(major, minor, VERSION_MAJOR)
        stored = U64.unpack(self._source.read(U64.size, "the header checksum"))[0]
        computed = fmt.checksum(head)
        if stored != computed:
            raise ChecksumError("the stream header", 0, stored, computed)
        if not MIN_CHUNK_SIZE <= chunk_size <= MAX_CHUNK_SIZE or chunk_size % CHUNK_MULTIPLE:
            raise LimitError(
                f"the stream header declares chunks of {chunk_size} bytes, expected a multiple of "
                f"{CHUNK_MULTIPLE} from {MIN_CHUNK_SIZE} to {MAX_CHUNK_SIZE}"
            )
        self._chunk_size = chunk_size
        self._header_checksum = computed
        self._current = memoryview(b"")
        self._offset = 0
        self._eof = False
        self._spare_chunks: list[np.ndarray] = []  # read chunks, already paged in, for reuse
        self._spare_packed: queue.Queue[np.ndarray] = queue.Queue(maxsize=2)  # compressed ones
        self._results = map_ordered(self._decompress, self._frames(), _UNKNOWN_COUNT, self._threads)

    def _frames(self) -> Iterator[tuple]:
        """Read the frames in order (in the reading thread), yielding jobs for the pool."""
        source = self._source
        index = total = 0
        short = False
        while True:
            offset = source.pos
            what = f"chunk {index}"
            nbytes, csize = FRAME.unpack(source.read(FRAME.size, f"the sizes of {what}"))
            if nbytes == 0 and csize == 0:
                self._check_end(offset, index, total)
                return
            if not 1 <= nbytes <= self._chunk_size:
                raise CorruptError(
                    f"{what} at offset {offset} declares {nbytes} bytes; chunks hold 1 to {self._chunk_size}"
                )
            if short:
                raise CorruptError(
                    f"{what} at offset {offset} follows a chunk of fewer than "
                    f"{self._chunk_size} bytes, which must be the last"
                )
            if not fmt.BLOSC2_MIN_CHUNK <= csize <= nbytes + fmt.BLOSC2_MAX_OVERHEAD:
                raise CorruptError(
                    f"{what} at offset {offset} declares {csize} compressed bytes for {nbytes} bytes of data"
                )
            packed = self._packed_buffer()
            source.readinto(memoryview(packed)[:csize], what)
            stored = U64.unpack(source.read(U64.size, f"the checksum of {what}"))[0]
            seed = fmt.frame_seed(self._header_checksum, index)
            dst = (
                self._spare_chunks.pop()
                if nbytes == self._chunk_size and self._spare_chunks
                else np.empty(nbytes, dtype=np.uint8)
            )
            yield (
                packed,
                memoryview(packed)[:csize],
                stored,
                seed,
                nbytes,
                memoryview(dst),
                what,
                offset,
            )
            index += 1
            total += nbytes
            short = nbytes < self._chunk_size

    def _check_end(self, offset: int, nchunks: int, total: int) -> None:
        rest = self._source.read(END.size, "the end record")
        stored = U64.unpack(self._source.read(U64.size, "the checksum of the end record"))[0]
        computed = fmt.checksum(FRAME.pack(0, 0) + rest, fmt.frame_seed(self._header_checksum, nchunks))
        if stored != computed:
            raise ChecksumError("the end record", offset, stored, computed)
        declared_chunks, declared_total = END.unpack(rest)
        if (declared_chunks, declared_total) != (nchunks, total):
            raise CorruptError(
                f"the end record at offset {offset} declares {declared_chunks} chunks and "
                f"{declared_total} bytes; the stream holds {nchunks} chunks and {total} bytes"
            )

    def _packed_buffer(self) -> np.ndarray:
        """Return a buffer for a compressed chunk: a recycled one (paged in) or a new one."""
        try:
            return self._spare_packed.get_nowait()
        except queue.Empty:
            return np.empty(self._chunk_size + fmt.BLOSC2_MAX_OVERHEAD, dtype=np.uint8)

    def _decompress(self, job: tuple) -> memoryview:
        buffer, *chunk = job
        unpack_chunk(*chunk)  # checksum, then the sizes in the chunk header, then decompress2
        with contextlib.suppress(queue.Full):
            self._spare_packed.put_nowait(buffer)
        return chunk[4]

    def _next_chunk(self) -> bool:
        done = self._current.obj
        if isinstance(done, np.ndarray) and done.size == self._chunk_size and len(self._spare_chunks) < 2:
            self._spare_chunks.append(done)  # fully read: decompress a later chunk into it
        try:
            self._current = next(self._results)
        except StopIteration:
            self._eof = True
            self._current = memoryview(b"")
        self._offset = 0
        return not self._eof

    def readinto(self, buffer: Any) -> int:
        """Fill ``buffer`` from the decompressed stream; return the byte count (0 at the end)."""
        self._check_open()
        if self._mode != _READ:
            raise io.UnsupportedOperation("File not open for reading")
        view = memoryview(buffer).cast("B")
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

    def _finish_reading(self) -> None:
        if self._results is not None:
            self._results.close()  # waits for decompressions still running
            self._results = None


# --------------------------------------------------------------------------------------------
# The joblib compressor


class BloscCompressorWrapper(CompressorWrapper):
    """The joblib compressor: `BloscFile` streams with the given options.

    Register another name for other defaults, with its own extension (the prefix can stay:
    any ``"blosc"`` wrapper reads every stream):

    ```python
    joblib.register_compressor("blosc-lz4", BloscCompressorWrapper("fast", extension=".blz4"))
    ```
    """

    def __init__(
        self,
        options: Options | str | None = None,
        *,
        prefix: bytes = PREFIX,
        extension: str = EXTENSION,
        try_bitshuffle: bool = True,
    ) -> None:
        super().__init__(obj=BloscFile, prefix=prefix, extension=extension)
        self.options = STREAM_OPTIONS if options is None else resolve_options(options)
        self.try_bitshuffle = try_bitshuffle

    def compressor_file(self, fileobj: Any, compresslevel: int | None = None) -> BloscFile:
        return BloscFile(fileobj, _WRITE, compresslevel, options=self.options, try_bitshuffle=self.try_bitshuffle)

    def decompressor_file(self, fileobj: Any) -> BloscFile:
        return BloscFile(fileobj, _READ, options=self.options)


class _RegisteringName(str):
    """A compressor name that registers blpickle with joblib in the process that unpickles it."""

    def __reduce__(self) -> tuple[Callable[[str], str], tuple[str]]:
        return _registered_name, (str(self),)


def _registered_name(name: str) -> str:
    register()
    return _RegisteringName(name)


#: ``"blosc"``, and it registers the compressor in worker processes that unpickle it:
#: ``Memory(location, compress=BLOSC)`` works in ``joblib.Parallel`` workers.
BLOSC = _RegisteringName(NAME)


# --------------------------------------------------------------------------------------------
# The Memory store backend

FileSystemStoreBackend, CacheWarning = joblib_store_classes()

#: joblib compressor names -> blpickle codec and level when ``compress`` names no level.
_CODECS = {
    "blosc": (None, None),  # blpickle's default codec and level
    "zlib": ("zlib", 3),
    "gzip": ("zlib", 3),
    "lz4": ("lz4", 1),
    "bz2": ("zstd", 5),
    "lzma": ("zstd", 5),
    "xz": ("zstd", 5),
}
_OPTION_NAMES = {
    "codec",
    "clevel",
    "shuffle",
    "bytedelta",
    "chunk_size",
    "nthreads",
    "pickler",
    "preset",
}


def options_for_compress(compress: Any) -> Options:
    """Return the blpickle options that match a joblib ``compress`` value.

    ``False``/``0``/``None`` store buffers raw (mappable with ``mmap_mode``), ``True`` is
    blpickle's default (codec "auto", level 1, shuffle), an integer 1-9 is that level of the default
    codec; a name or a ``(name, level)`` pair picks the Blosc2 codec closest to that joblib
    compressor (``"zlib"``/``"gzip"`` -> zlib, ``"lz4"`` -> lz4, ``"bz2"``/``"lzma"``/``"xz"`` ->
    zstd, ``"blosc"`` -> the default), level 0 meaning raw. An `Options` or a preset name
    of `blpickle.PRESETS` is used as is.

    Raises:
        OptionsError: for a value joblib would not accept either.
    """
    if isinstance(compress, Options):
        return compress
    if compress is None or compress is False or (isinstance(compress, int) and compress == 0):
        return resolve_options("raw")
    if compress is True:
        return Options()
    if isinstance(compress, int):
        return Options(clevel=compress)
    if isinstance(compress, str):
        if compress not in _CODECS:
            return resolve_options(compress)  # a preset name, or OptionsError
        compress = (compress, None)
    if not isinstance(compress, tuple) or len(compress) != 2 or compress[0] not in _CODECS:
        raise OptionsError(
            f"compress must be a bool, a level 0-9, a compressor name or a (name, level) pair, not {compress!r}"
        )
    name, level = compress
    codec, default_level = _CODECS[name]
    if level == 0:
        return resolve_options("raw")
    options = Options() if codec is None else Options(codec=codec, clevel=default_level)
    return options if level is None else options.replace(clevel=level)


class BlpickleStoreBackend(FileSystemStoreBackend):  # type: ignore[misc,valid-type]
    """A ``joblib.Memory`` store that writes results with `blpickle.dump`.

    Selected with ``joblib.Memory(location, backend="blpickle")``; everything else is
    joblib's file-system store (same directory layout, ``output.pkl`` per result, so
    ``clear``, ``reduce_size`` and ``call_and_shelve`` work unchanged). ``compress`` maps to
    blpickle options with `options_for_compress`; ``backend_options`` may also hold
    blpickle options (``codec``, ``clevel``, ``preset``, ``pickler``, ...) that override it.
    Results are written atomically (a temporary file renamed over ``output.pkl``), so
    concurrent writers of one result leave one complete file. Results written by joblib's own
    backend in the same directory are still read.
    """

    options: Options

    def configure(self, location: str, verbose: int = 1, backend_options: dict[str, Any] | None = None) -> None:
        joblib_options = dict(backend_options or {})
        ours = {name: joblib_options.pop(name) for name in list(joblib_options) if name in _OPTION_NAMES}
        super().configure(location, verbose=verbose, backend_options=joblib_options)
        options = options_for_compress(self.compress)
        if "preset" in ours:
            options = resolve_options(ours.pop("preset"))
        self.options = options.replace(**ours) if ours else options
        if self.mmap_mode is not None and self.options.codec is not None and not self.compress:
            warnings.warn(
                f"blpickle store: buffers compressed with {self.options.codec} cannot be "
                "memory-mapped; mmap_mode applies to raw buffers only (codec=None)",
                BlpickleWarning,
                stacklevel=2,
            )

    def dump_item(self, call_id: list[str], item: Any, verbose: int = 1) -> None:
        """Write ``item`` to ``<location>/<call_id...>/output.pkl`` with `blpickle.dump`."""
        try:
            item_path = os.path.join(self.location, *call_id)
            if not self._item_exists(item_path):
                self.create_location(item_path)
            filename = os.path.join(item_path, "output.pkl")
            if verbose > 10:
                print(f"Persisting in {item_path}")
            try:
                # atomic: a temporary file renamed over the result
                blpickle_dump(item, filename, preset=self.options)
            except (PicklingError, TypeError, AttributeError) as exc:  # what pickle raises
                warnings.warn(  # the category and message of joblib's own store
                    f"Unable to cache to disk: failed to pickle output. Exception: {exc}.",
                    FutureWarning,
                    stacklevel=2,
                )
        except Exception as exc:
            warnings.warn(f"Unable to cache to disk. Exception: {exc}.", CacheWarning, stacklevel=2)

    def load_item(
        self,
        call_id: list[str],
        verbose: int = 1,
        timestamp: float | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> Any:
        """Read a result with `blpickle.load` (memory-mapping raw buffers with ``mmap_mode``).

        Raises:
            KeyError: when the result is not in the store.
            blpickle.LoadError: when the stored result is damaged or truncated.
        """
        full_path = os.path.join(self.location, *call_id)
        if verbose > 1:
            _print_loading(full_path, call_id, verbose, timestamp, metadata)
        filename = os.path.join(full_path, "output.pkl")
        if not self._item_exists(filename):
            raise KeyError(f"Non-existing item (may have been cleared).\nFile {filename} does not exist")
        mmap_mode = "r+" if self.mmap_mode == "w+" else self.mmap_mode  # as joblib does
        with open(filename, "r+b" if mmap_mode == "r+" else "rb") as file:
            if file.read(len(fmt.MAGIC)) != fmt.MAGIC:  # written by joblib's own store backend
                return super().load_item(call_id, verbose=0)
            file.seek(0)
            try:
                if mmap_mode is None:
                    return blpickle_load(file, nthreads=self.options.nthreads)
                unpickler = _MemmapUnpickler(file, mmap_mode=mmap_mode, nthreads=self.options.nthreads)
                return unpickler.load()
            except LoadError as exc:
                raise CorruptItemError(f"the cached result {filename} is damaged: {exc}") from exc


class CorruptItemError(LoadError, ValueError):
    """A cached result is damaged or truncated (the original error is its ``__cause__``).

    Also a ``ValueError``, so ``MemorizedResult.get()`` turns it into joblib's ``KeyError``
    ("folder is corrupted"), as for damaged files of joblib's own store; a cached call
    recomputes the result.
    """


class _MemmapUnpickler(Unpickler):
    """Returns memory-mapped arrays as ``numpy.memmap`` instances (with ``mode``,
    ``filename`` and ``offset``), as joblib's own store does, rather than plain arrays
    viewing the map."""

    def __init__(self, file: BinaryIO, *, mmap_mode: str, nthreads: int | None) -> None:
        super().__init__(file, mmap_mode=mmap_mode, nthreads=nthreads)
        self._memmap_info = (file, mmap_mode)

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("blpickle.arrays", "rebuild_ndarray"):
            return functools.partial(_rebuild_memmap, *self._memmap_info)
        return super().find_class(module, name)


def _rebuild_memmap(
    file: BinaryIO, mode: str, buffer: Any, dtype: np.dtype, shape: tuple[int, ...], order: str
) -> np.ndarray:
    """Rebuild an array of the store as a ``numpy.memmap`` of the open ``file`` (the one being
    loaded, even if a writer has since renamed another over its name) when its buffer is
    memory-mapped (a raw buffer), else as the plain array."""
    array = rebuild_ndarray(buffer, dtype, shape, order)  # validates the arguments
    mapping = _mapping_of(array)
    if mapping is None or not array.size:
        return array  # not mapped (a compressed buffer) or empty
    offset = array.ctypes.data - np.frombuffer(mapping, dtype=np.uint8).ctypes.data
    return np.memmap(file, array.dtype, mode, offset, array.shape, order)


def _mapping_of(array: np.ndarray) -> mmap.mmap | None:
    """Return the map of the whole file that ``array``'s memory belongs to, if any."""
    base: Any = array
    while base is not None:
        if isinstance(base, mmap.mmap):
            return base
        base = base.obj if isinstance(base, memoryview) else getattr(base, "base", None)
    return None


def _print_loading(
    full_path: str,
    call_id: list[str],
    verbose: int,
    timestamp: float | None,
    metadata: dict[str, Any] | None,
) -> None:
    """Print what joblib's own store prints when it loads a result."""
    ts_string = f"{format_time(time.time() - timestamp): <16}" if timestamp is not None else ""
    signature = os.path.basename(call_id[0])
    if metadata is not None and "input_args" in metadata:
        signature += "({})".format(", ".join(f"{k}={v}" for k, v in metadata["input_args"].items()))
    message = f"[Memory]{ts_string}: Loading {signature}"
    print(f"{message}..." if verbose < 10 else f"{message} from {full_path}")


# --------------------------------------------------------------------------------------------
# Registration


def register() -> None:
    """Register the ``"blosc"`` compressor and the ``"blpickle"`` store backend with joblib.

    Idempotent; another compressor or store backend registered under these names is replaced.
    """
    joblib.register_compressor(NAME, BloscCompressorWrapper(), force=True)
    joblib.register_store_backend(BACKEND_NAME, BlpickleStoreBackend)
