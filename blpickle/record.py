"""`blpickle.open`: a record's arrays, one at a time, without unpickling anything.

The header describes every out-of-band array (dtype, shape, order, name) and the trailer
says where each of its chunks is, so reading one array reads the header, the trailer and
that array's chunks only; each chunk's checksum is checked before Blosc2 sees it. Nothing is
unpickled (but by `Record.load`), so opening an untrusted file runs none of its code.
"""

from __future__ import annotations

import builtins
import dataclasses
import math
from collections.abc import Iterator
from typing import Any

import numpy as np

from . import format as fmt
from .engine.chunks import unpack_chunk
from .engine.jobs import allocate_stream
from .engine.pool import map_ordered
from .engine.reader import RecordReader
from .errors import BadMagicError, ChecksumError, CorruptError, LimitError, LoadError, TruncatedError
from .format.dtypes import parse_dtype
from .format.trailer import RecordIndex, check_footer, check_trailer_size, chunk_name, parse_index
from .info import BufferInfo, RecordInfo, graph_globals
from .io.files import expand, is_path, naming_errors
from .io.ranges import FileRanges, MemoryRanges, Ranges, UrlRanges
from .io.remote import is_url
from .io.sources import MemorySource
from .options import Options
from .tensors import ml_dtype, stored_array
from .unpickler import load, loads

__all__ = ["ArrayInfo", "Record", "open"]

#: Chunks whose size fields `Record._confirm` reads at once.
_CONFIRM_BATCH = 256
#: The first read of a record: its first bytes (the preamble and, most often, the whole
#: header) and its last (the footer and, most often, the whole trailer).
_HEAD_READ = 64 << 10
#: Why an array of the dumped object may have no name in its record.
_UNNAMED = (
    "only arrays stored out of band have names: arrays under 64 KiB are kept in the pickle, "
    "as are arrays under 512 KiB that barely compress in a record under 1 MiB, "
    "and a tensor sharing the storage of a tensor met before it, or not covering its storage, is stored "
    "as part of it; read those with Record.load()"
)


@dataclasses.dataclass(frozen=True)
class ArrayInfo:
    """One out-of-band buffer of a record, as `Record.array` gives it back.

    Attributes:
        position: its number among the record's buffers (``rec.array(position)``).
        name: its path in the dumped object (``"model.coef_"``), or None.
        dtype: the dtype of the array it holds; None for a buffer that is not a described
            numpy array, read as bytes (a uint8 array).
        shape: the array's shape, or None as for ``dtype``.
        order: the array's memory order, "C" or "F", or None as for ``dtype``.
        nbytes: decompressed size.
        stored: bytes its chunks take in the record.
        nchunks: how many chunks it is stored in.
        chunk_size: decompressed bytes per chunk.
        codec: the Blosc2 codec of its chunks (None for a raw buffer).
        tensor: the type `Record.array` gives it back as when not a numpy array:
            ``"torch.<dtype>"`` (a torch tensor), ``"jax.<dtype>"`` (a jax array) or
            ``"cupy.<dtype>"`` (a numpy array, or a cupy one under `map_location`); None
            for a numpy array.
    """

    position: int
    name: str | None
    dtype: np.dtype | None
    shape: tuple[int, ...] | None
    order: str | None
    nbytes: int
    stored: int
    nchunks: int
    chunk_size: int
    codec: str | None
    tensor: str | None = None


def open(file: Any, *, nthreads: int | None = None) -> Record:
    """Open the record in ``file`` (a path, a URL such as ``s3://bucket/key`` with fsspec
    installed, a seekable binary file standing at the record, or a bytes-like object) and
    return a `Record`, having read its header and trailer only.

    Nothing is unpickled: the arrays are read from the record's own description, so opening
    an untrusted file is safe (`Record.load` unpickles, as `blpickle.load` does).

    Example:
        ```python
        with blpickle.open("model.blp") as rec:
            weights = rec["weights"]
        ```

    Raises:
        blpickle.BadMagicError: when the input is not a blpickle record.
        blpickle.LoadError: for a damaged or truncated header or trailer.
        ValueError: for a file object that cannot seek.
    """
    threads = Options(nthreads=nthreads).threads  # checks nthreads
    if is_url(file):
        return _open(UrlRanges(file), threads, file)
    if is_path(file):
        path = expand(file)
        with naming_errors(path):
            handle = builtins.open(path, "rb")  # noqa: SIM115 - the Record closes it
            try:
                ranges = FileRanges(handle, owned=True)
            except BaseException:
                handle.close()
                raise
            return _open(ranges, threads, path)
    if hasattr(file, "read"):
        return _open(FileRanges(file), threads, None)
    return _open(MemoryRanges(file), threads, None)


def _open(ranges: Ranges, nthreads: int, where: str | None) -> Record:
    try:
        return Record(ranges, nthreads, where)
    except BaseException:
        ranges.close()
        raise


class Record:
    """An open record: its arrays by name or position, read one at a time. A context
    manager; `close` releases the file it opened.

    Attributes:
        arrays: an `ArrayInfo` per out-of-band buffer, in order.
        names: the names of the named arrays, in order.
        version: the record's format version, "major.minor".
        signed: the record carries a signature (checked by ``load(key=...)`` only).
        size: bytes of the whole record.
    """

    def __init__(self, ranges: Ranges, nthreads: int, where: str | None = None) -> None:
        self._ranges = ranges
        self._closed = False
        self._nthreads = nthreads
        self._where = where
        # the head and the tail (header, trailer), fetched together: one request to a URL
        edge = min(ranges.size, _HEAD_READ)
        head, tail = ranges.read_many([(0, edge), (ranges.size - edge, edge)], "the header and the trailer")
        self._read_ahead = [(0, head), (ranges.size - edge, tail)]
        magic = bytes(head[: len(fmt.MAGIC)])
        if magic != fmt.MAGIC:
            if fmt.MAGIC.startswith(magic):
                raise TruncatedError("the magic", 0, len(fmt.MAGIC), len(magic))
            raise BadMagicError(magic)
        header_size = fmt.PREAMBLE.unpack(head[: fmt.PREAMBLE.size])[-1] if len(head) >= fmt.PREAMBLE.size else 0
        fmt.check_header_size(header_size)
        self._data_start = fmt.PREAMBLE.size + header_size + fmt.U64.size
        if len(head) < self._data_start <= ranges.size:
            head = ranges.read(0, self._data_start, "the header")
        reader = RecordReader(MemorySource(head), 1)  # checks the preamble, the header and its checksum
        self.header = reader.header
        self.signed = reader.signed
        self.version = f"{fmt.VERSION_MAJOR}.{reader.minor}"
        self._header_checksum = fmt.checksum(head[: self._data_start - fmt.U64.size])
        streams = self.header.streams
        #: a compact record's pickle: it has no chunks and no trailer
        self._compact = bytes(head[fmt.PREAMBLE.size : self._data_start - fmt.U64.size]) if reader.compact else None
        if self._compact is not None:
            chunks = fmt.ChunkIndex()
            self._index = RecordIndex(chunks, (0,) * len(streams), (len(self._compact),), self._data_start)
            self.size = self._data_start
        else:
            self._index = self._read_index()
            self.size = self._index.end + fmt.U64.size + len(self._index_trailer) + fmt.FOOTER.size
        #: chunks before this one have their size fields checked against the index
        self._confirmed = 0
        self._stored = self._index.stored
        self.arrays = tuple(_describe(n - 1, s, self._stored[n]) for n, s in enumerate(streams) if n)
        self._by_name = {a.name: a.position for a in self.arrays if a.name is not None}
        self.names = tuple(self._by_name)
        self._info: RecordInfo | None = None

    def __enter__(self) -> Record:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        where = f" {self._where}" if self._where else ""
        return f"<blpickle.Record{where}: {len(self.arrays)} buffers, {self.size} bytes>"

    def close(self) -> None:
        """Close the file the record was opened from (when `open` opened it); reading it
        then raises ValueError."""
        self._closed = True
        self._ranges.close()

    def __getitem__(self, key: str | int) -> Any:
        """Read the array named ``key`` (or at position ``key``); see `array`."""
        return self.array(self._position(key))

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def array(self, position: int) -> Any:
        """Read buffer ``position`` whole (its chunks decompressed in parallel) and return it
        as the array its `ArrayInfo` describes, writable (a uint8 array for a buffer that is
        not a described array): a numpy array, or the torch tensor, jax array or cupy array it was
        dumped as (`blpickle.tensors.stored_array`). Only its chunks are read; nothing is
        unpickled.

        Raises:
            IndexError: for a position out of range.
            blpickle.ChecksumError, blpickle.CorruptError: for a damaged chunk (named).
            ImportError: for a tensor whose library is not installed.
        """
        info = self._array_info(position)
        data = self.read_bytes(position, 0, info.nbytes)
        if info.dtype is None or info.shape is None:
            return data
        array = data.view(info.dtype).reshape(info.shape, order="F" if info.order == "F" else "C")
        return array if info.tensor is None else stored_array(info.tensor, array)

    def lazy(self, key: str | int) -> Any:
        """Return a read-only array-like over the array named ``key`` (or at position
        ``key``) whose slices on the leading axis read only the chunks they cover (see
        `blpickle.lazy.LazyArray`)."""
        from .lazy import LazyArray

        return LazyArray(self, self._array_info(self._position(key)))

    def load(self, **kwargs: Any) -> Any:
        """Load the whole object, as `blpickle.load` does with ``kwargs`` (``safe=``,
        ``key=``...): this unpickles."""
        target = self._ranges.loadable()
        if not hasattr(target, "read"):  # a URL or bytes in memory: nothing to map
            kwargs.pop("mmap_mode", None)
        return loads(target, **kwargs) if isinstance(target, memoryview) else load(target, **kwargs)

    @property
    def info(self) -> RecordInfo:
        """What `blpickle.inspect` shows (reads and decompresses the pickle stream a chunk at a
        time, as `inspect` does, without unpickling it, to list its globals; the buffers'
        checksums are not read)."""
        if self._info is None:
            header = self.header
            buffers = tuple(
                BufferInfo(s.nbytes, stored, s.nchunks, s.itemsize, s.raw, s.dtype, s.shape, s.splice, s.codec)
                for s, stored in zip(header.streams[1:], self._stored[1:], strict=True)
            )
            self._info = RecordInfo(
                version=self.version,
                signed=self.signed,
                options=header.options,
                protocol=header.protocol,
                pickle_nbytes=header.streams[0].nbytes,
                pickle_stored=self._stored[0],
                buffers=buffers,
                external=len(header.external),
                globals=graph_globals(self._graph_chunks(), header, lambda: self.size),
                size=self.size,
            )
        return self._info

    def _graph_chunks(self) -> Iterator[Any]:
        """Yield the pickle stream a chunk at a time (a raw one whole: one checksum covers it)."""
        info = self.header.streams[0]
        if self._compact is not None or info.raw:
            yield self._compact if self._compact is not None else self._read(0, 0, info.nbytes)
            return
        for start, stop in info.chunk_spans():
            yield self._read(0, start, stop)

    def read_bytes(self, position: int, start: int, stop: int) -> np.ndarray:
        """Return bytes ``start:stop`` of buffer ``position`` (decompressed) as a new uint8
        array, reading and decompressing only the chunks that hold them, checksums checked
        (in a record written with codec None, a part of a raw buffer is read unchecked: its
        one checksum covers it whole).

        Raises:
            blpickle.ChecksumError, blpickle.CorruptError: for a damaged chunk (named).
            blpickle.LimitError: when the bytes cannot be allocated.
        """
        return self._read(self._array_info(position).position + 1, start, stop)

    def _position(self, key: str | int) -> int:
        if isinstance(key, str):
            if key not in self._by_name:
                known = ", ".join(map(repr, self.names[:20])) or "none"
                more = f" and {len(self.names) - 20} more" if len(self.names) > 20 else ""
                raise KeyError(f"no array named {key!r} in the record (named arrays: {known}{more}); {_UNNAMED}")
            return self._by_name[key]
        return key

    def _array_info(self, position: int) -> ArrayInfo:
        if not isinstance(position, int) or not 0 <= position < len(self.arrays):
            raise IndexError(f"the record has {len(self.arrays)} buffers, there is no buffer {position!r}")
        return self.arrays[position]

    def _read_index(self) -> RecordIndex:
        """Find, check and parse the record's own trailer (`blpickle.format.trailer.parse_index`):
        the one at the end of the input when its chunks run from the header to it, else the one
        after the last chunk, found by stepping over the chunks (a record followed by others,
        or by bytes appended to it).

        Raises:
            CorruptError, LimitError, ChecksumError, TruncatedError.
        """
        end = self._ranges.size
        error = None
        if end >= self._data_start + fmt.U64.size + fmt.FOOTER.size:
            size, stored, end_magic = fmt.FOOTER.unpack(
                self._read_at(end - fmt.FOOTER.size, fmt.FOOTER.size, "the footer")
            )
            start = end - fmt.FOOTER.size - size
            if end_magic == fmt.END_MAGIC and size <= fmt.MAX_TRAILER_SIZE and start - fmt.U64.size >= self._data_start:
                trailer = bytes(self._read_at(start, size, "the trailer"))
                if fmt.checksum(trailer, self._header_checksum) == stored:
                    try:
                        return self._parse(trailer, start - fmt.U64.size)
                    except CorruptError as exc:  # not this record's chunks: its own trailer follows them
                        error = exc
        try:
            return self._trailer_at(self._walk_chunks())
        except LoadError:
            if error is None:
                raise
            raise error from None  # no trailer after the chunks: the one at the end is wrong

    def _trailer_at(self, end: int) -> RecordIndex:
        """Read, check and parse the trailer whose size field is at ``end``.

        Raises:
            CorruptError, LimitError, ChecksumError, TruncatedError.
        """
        size = fmt.U64.unpack(self._read_at(end, fmt.U64.size, "the trailer size"))[0]
        check_trailer_size(size)
        start = end + fmt.U64.size
        block = self._read_at(start, size + fmt.FOOTER.size, "the trailer")
        trailer = bytes(block[:size])
        check_footer(trailer, block[size:], self._header_checksum, start)
        return self._parse(trailer, end)

    def _parse(self, trailer: bytes, end: int) -> RecordIndex:
        index = parse_index(self.header, trailer, self._data_start, end)
        self._index_trailer = trailer
        return index

    def _read_at(self, offset: int, size: int, what: str) -> Any:
        """Return the ``size`` bytes at ``offset``, from the bytes read on opening if they
        hold them."""
        for start, data in self._read_ahead:
            if start <= offset and offset + size <= start + len(data):
                return memoryview(data)[offset - start : offset - start + size]
        return self._ranges.read(offset, size, what)

    def _walk_chunks(self) -> int:
        """Return where the chunks end (the trailer's size field), found by stepping over
        every chunk (reading their size fields only)."""
        pos = self._data_start
        for number, info in enumerate(self.header.streams):
            if info.raw:
                if info.nbytes:
                    pos += fmt.raw_padding(pos)
                    pos += 2 * fmt.U64.size + info.nbytes
                continue
            for chunk in range(info.nchunks):
                what = f"the size of {chunk_name(number, chunk)}"
                pos += 2 * fmt.U64.size + fmt.U64.unpack(self._read_at(pos, fmt.U64.size, what))[0]
        return pos

    def _confirm(self, upto: int) -> None:
        """Check the size field of every chunk before chunk ``upto`` (and, for a compressed
        one, the sizes its Blosc2 header declares) against the index, before any of them is
        used or anything allocated for them: the chunks read are then those `blpickle.load`
        reads, and no chunk declares more than its slot holds.

        Raises:
            CorruptError: naming the first chunk that does not match.
            TruncatedError: when the input ends before.
        """
        chunks = self._index.chunks
        spans = list(_chunk_spans(self.header.streams))
        while self._confirmed < upto:
            batch = range(self._confirmed, min(upto, self._confirmed + _CONFIRM_BATCH))
            heads = [(chunks.offsets[f], fmt.U64.size + (0 if spans[f][2] else fmt.BLOSC2_SIZES.size)) for f in batch]
            found = self._ranges.read_many(heads, "the chunks' size fields")
            for entry, head in zip(batch, found, strict=True):
                number, chunk, raw, nbytes = spans[entry]
                declared = fmt.U64.unpack_from(head)[0]
                sizes = None if raw else fmt.BLOSC2_SIZES.unpack_from(head, fmt.U64.size)
                if declared != chunks.csizes[entry] or sizes not in (None, (nbytes, declared)):
                    raise CorruptError(
                        f"{chunk_name(number, chunk)} at offset {chunks.offsets[entry]} does not match the "
                        "trailer's index: its size field or its Blosc2 header declares other sizes"
                    )
            self._confirmed = batch.stop

    def _read(self, number: int, start: int, stop: int) -> np.ndarray:
        """Return bytes ``start:stop`` of stream ``number``, decompressed (see `read_bytes`)."""
        if self._closed:
            raise ValueError("I/O operation on a closed record")
        info = self.header.streams[number]
        if not 0 <= start <= stop <= info.nbytes:
            raise IndexError(f"bytes {start}:{stop} are not within stream {number}'s {info.nbytes}")
        if number == 0 and not info.raw and info.nbytes > self._stored[0] * fmt.MAX_GRAPH_RATIO:
            raise LimitError(
                f"the pickle stream declares {info.nbytes} bytes stored in {self._stored[0]}: "
                f"over {fmt.MAX_GRAPH_RATIO} times its stored size"
            )
        if info.raw and stop - start < info.nbytes and not self.header.uncompressed:
            return self._read(number, 0, info.nbytes)[start:stop].copy()  # read whole, to check it
        if stop == start:
            return allocate_stream(0, number)
        first, last = (0, 1) if info.raw else (start // info.chunk_size, -(-stop // info.chunk_size))
        self._confirm(self._index.first[number] + last)
        out = allocate_stream(stop - start, number)
        if info.raw:
            self._read_raw(number, start, out)
            return out
        jobs = self._fetch(number, range(first, last))
        for _ in map_ordered(lambda job: self._unpack(number, start, out, *job), jobs, last - first, self._nthreads):
            pass
        return out

    def _fetch(self, number: int, chunks: range) -> Iterator[tuple[int, Any]]:
        """Yield ``(chunk, stored bytes)`` for the chunks of stream ``number``, fetched a batch
        of chunks at a time."""
        first = self._index.first[number]
        index = self._index.chunks
        batch = max(self._ranges.batch, self._nthreads)
        for at in range(0, len(chunks), batch):
            part = chunks[at : at + batch]
            spans = [(index.offsets[first + c], index.csizes[first + c] + 2 * fmt.U64.size) for c in part]
            found = self._ranges.read_many(spans, f"the chunks from {chunk_name(number, part[0])}")
            yield from zip(part, found, strict=True)

    def _unpack(self, number: int, start: int, out: np.ndarray, chunk: int, data: Any) -> None:
        """Check one chunk and decompress it into ``out`` (which holds the stream's bytes
        from ``start``), straight where the chunk lies whole inside, else through a copy."""
        info = self.header.streams[number]
        entry = self._index.first[number] + chunk
        offset, csize, expected = (
            self._index.chunks.offsets[entry],
            self._index.chunks.csizes[entry],
            self._index.chunks.checksums[entry],
        )
        what = chunk_name(number, chunk)
        view = memoryview(data).cast("B")
        declared = fmt.U64.unpack(view[: fmt.U64.size])[0]
        stored = fmt.U64.unpack(view[-fmt.U64.size :])[0]
        if declared != csize or stored != expected:
            raise CorruptError(f"{what} at offset {offset} does not match the trailer's chunk index")
        low, high = chunk * info.chunk_size, min((chunk + 1) * info.chunk_size, info.nbytes)
        inside = start <= low and high <= start + out.nbytes
        dst = out.data[low - start : high - start] if inside else allocate_stream(high - low, number).data
        packed = view[fmt.U64.size : fmt.U64.size + csize]
        unpack_chunk(packed, stored, fmt.chunk_seed(self._header_checksum, entry), high - low, dst, what, offset)
        if not inside:
            begin, end = max(low, start), min(high, start + out.nbytes)
            out[begin - start : end - start] = np.frombuffer(dst, np.uint8)[begin - low : end - low]

    def _read_raw(self, number: int, start: int, out: np.ndarray) -> None:
        """Read bytes of a raw stream into ``out``: the whole payload with its size field and
        checksum checked, or a part of it unchecked."""
        info = self.header.streams[number]
        entry = self._index.first[number]
        offset = self._index.chunks.offsets[entry]
        what = chunk_name(number, 0)
        payload = offset + fmt.U64.size
        self._ranges.readinto(payload + start, out.data, what)
        if out.nbytes < info.nbytes:
            return
        size = fmt.U64.unpack(self._ranges.read(offset, fmt.U64.size, f"the size of {what}"))[0]
        stored = fmt.U64.unpack(self._ranges.read(payload + size, fmt.U64.size, f"the checksum of {what}"))[0]
        if size != info.nbytes or stored != self._index.chunks.checksums[entry]:
            raise CorruptError(f"{what} at offset {offset} does not match the trailer's chunk index")
        computed = fmt.checksum(out, fmt.chunk_seed(self._header_checksum, entry))
        if computed != stored:
            raise ChecksumError(what, payload, stored, computed)


def _chunk_spans(streams: tuple[fmt.StreamInfo, ...]) -> Iterator[tuple[int, int, bool, int]]:
    """Yield ``(stream, chunk, raw, decompressed size)`` for every chunk of a record, in order."""
    for number, info in enumerate(streams):
        for chunk, (low, high) in enumerate(info.chunk_spans()):
            yield number, chunk, info.raw, high - low


def _describe(position: int, info: fmt.StreamInfo, stored: int) -> ArrayInfo:
    """Describe a buffer from its stream map: an array where dtype, shape and order are
    given (or the order cannot matter: records of format 1.0 do not give it) and agree with
    its size, else bytes."""
    dtype = None if info.dtype is None or info.shape is None else parse_dtype(info.dtype) or ml_dtype(info.dtype)
    order = info.order
    if dtype is not None and info.shape is not None:
        if order is None and sum(n > 1 for n in info.shape) <= 1:
            order = "C"
        if order is None or math.prod(info.shape) * dtype.itemsize != info.nbytes:
            dtype = None
    shape = info.shape if dtype is not None else None
    return ArrayInfo(
        position=position,
        name=info.name,
        dtype=dtype,
        shape=shape,
        order=order if dtype is not None else None,
        nbytes=info.nbytes,
        stored=stored,
        nchunks=info.nchunks,
        chunk_size=info.chunk_size,
        codec=info.codec,
        tensor=info.tensor if dtype is not None else None,
    )
