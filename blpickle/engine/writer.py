"""Writing full records: a pickled object in, one record out.

Data flows one way: the pickler hands over a `Pickled` (its pickle stream, compressing
already if it is big, and its out-of-band buffers); `write_pickled` plans every stream
(`blpickle.engine.policy`), encodes the header once with its codecs, then writes the chunks and the
trailer. (A small pickle with no out-of-band buffer is a compact record instead, written by
the pickler with `blpickle.format.encode_compact`.)
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from typing import Any, BinaryIO, TypeGuard

from .. import format as fmt
from ..errors import DumpError
from ..format.dtypes import dtype_text
from ..options import Options
from .buffers import Payload
from .chunk_hash import ChunkHash
from .chunks import compress_chunk
from .policy import ChunkPlan, plan_buffer, plan_raw
from .pool import map_ordered, shared_pool

__all__ = ["CountingWriter", "PackedStream", "Pickled", "write_pickled", "write_record"]

#: Raw payloads are hashed and written in pieces of this size.
RAW_PIECE_SIZE = 8 << 20


class PackedStream:
    """A stream compressed while it is still being written, for the pickle stream: each chunk
    given to `add` is compressed in the shared pool at once, so that compressing the
    pickle overlaps pickling the rest of it.

    Attributes:
        plan: how its chunks are compressed (`blpickle.engine.policy.plan_graph`).
        nbytes: bytes added so far.
    """

    def __init__(self, plan: ChunkPlan, nthreads: int) -> None:
        self.plan = plan
        self._nthreads = nthreads
        self._chunks: list[Future[bytes]] = []
        self.nbytes = 0

    def add(self, chunk: bytes, *, last: bool = False) -> None:
        """Start compressing the next chunk (``plan.chunk_size`` bytes, or fewer for the
        ``last``). The last one is compressed in this thread, which would only wait for the
        pool."""
        self.nbytes += len(chunk)
        if self._nthreads <= 1 or last:
            future: Future[bytes] = Future()
            future.set_result(compress_chunk(chunk, self.plan.cparams))
            self._chunks.append(future)
            return
        started = threading.Event()
        self._chunks.append(shared_pool(self._nthreads).submit(self._compress, chunk, started))
        # Wait until a thread runs it: the pickler holds the GIL, which a waiting thread would
        # otherwise get only at the next switch interval (5 ms), so after pickling is over.
        started.wait()

    def _compress(self, chunk: bytes, started: threading.Event) -> bytes:
        started.set()
        return compress_chunk(chunk, self.plan.cparams)

    @property
    def nchunks(self) -> int:
        """The number of chunks added so far."""
        return len(self._chunks)

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


@dataclasses.dataclass
class Pickled:
    """An object pickled, ready to be written as a record.

    Attributes:
        graph: the pickle stream: compressing, or whole in memory to be stored raw (see
            `blpickle.engine.policy.plan_pickle`).
        buffers: the out-of-band buffers, and the large payloads spliced out of the pickle
            (with their offset in it), in the order the pickle uses them.
        external: positions of the out-of-band buffers the caller keeps (``buffer_callback``).
        protocol: the pickle protocol.
    """

    graph: PackedStream | bytearray
    buffers: Sequence[tuple[Payload, int | None]]
    external: tuple[int, ...]
    protocol: int


class CountingWriter:
    """A binary file wrapper that writes everything it is given (looping over short writes
    of raw streams) and counts the bytes written since it was created, in ``pos``.

    Raises:
        DumpError: from `write`, when the file stops taking bytes midway.
    """

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
            if not more:  # 0, or None from a non-blocking stream that would block
                raise DumpError(f"the file took {written} of {size} bytes and then no more")
            written += more
        self.pos += size


def write_pickled(file: BinaryIO, pickled: Pickled, options: Options, key: bytes | None = None) -> None:
    """Write ``pickled`` as one full record, with every stream planned by `blpickle.engine.policy`
    before the header is encoded (a compact record needs none of this: see
    `blpickle.format.encode_compact`).

    Raises:
        DumpError: when the header would be over ``MAX_HEADER_SIZE`` (nothing is written
            then), or when Blosc2 cannot compress a chunk.
    """
    graph = pickled.graph
    payloads: list[PackedStream | Payload] = []
    plans: list[ChunkPlan] = []
    infos: list[fmt.StreamInfo] = []
    if isinstance(graph, bytearray):
        plan = plan_raw(len(graph))
        payloads.append(Payload(memoryview(graph), 1))
    else:
        payloads.append(graph)
        plan = graph.plan
    nbytes = payloads[0].nbytes
    plans.append(plan)
    infos.append(fmt.StreamInfo(nbytes, plan.chunk_size, raw=plan.raw, codec=plan.codec))
    for payload, splice in pickled.buffers:
        plan = plan_buffer(options, payload.nbytes, payload.itemsize, payload.sample, _chunk_multiple(payload, options))
        payloads.append(payload)
        plans.append(plan)
        infos.append(
            fmt.StreamInfo(
                nbytes=payload.nbytes,
                chunk_size=plan.chunk_size,
                itemsize=payload.itemsize,
                raw=plan.raw,
                dtype=None if payload.dtype is None else dtype_text(payload.dtype),
                shape=payload.shape,
                splice=splice,
                codec=plan.codec,
                order=payload.order,
                name=payload.name,
                tensor=payload.tensor,
            )
        )
    header = fmt.Header(options.to_dict(), pickled.protocol, tuple(infos), pickled.external)
    write_record(file, header, payloads, plans, options.threads, key)


def _chunk_multiple(payload: Payload, options: Options) -> int:
    """What a buffer's chunk size is a multiple of: a row (along the leading axis) of a
    C-order array whose rows fit in a chunk, so that reading a range of rows decompresses
    only the chunks that hold them (`blpickle.lazy`); else what the payload needs."""
    shape = payload.shape
    if payload.order != "C" or not shape or not shape[0]:
        return payload.chunk_multiple
    row = payload.nbytes // shape[0]
    return row if 0 < row <= options.chunk_size else payload.chunk_multiple


Stored = tuple[int, int, int, "bytes | None"]  # a chunk written: offset, stored size, checksum, digest


def write_record(
    file: BinaryIO,
    header: fmt.Header,
    payloads: Sequence[Payload | PackedStream],
    plans: Sequence[ChunkPlan],
    nthreads: int,
    key: bytes | None = None,
) -> None:
    """Write one full record: preamble and header, the chunks of every stream, the trailer.

    ``payloads`` and ``plans`` hold the data of ``header.streams`` and how to compress it,
    in the same order (a PackedStream is compressing already). With a ``key`` the record is
    signed (HMAC-SHA256 of the header and of a BLAKE2b digest of every chunk).

    Raises:
        DumpError: when the header is over ``MAX_HEADER_SIZE`` (nothing is written then), or
            when Blosc2 cannot compress a chunk.
    """
    header_bytes = header.encode()
    if len(header_bytes) > fmt.MAX_HEADER_SIZE:
        raise DumpError(
            f"the record's header takes {len(header_bytes)} bytes ({len(header.streams)} streams), over the "
            f"{fmt.MAX_HEADER_SIZE} bytes readers accept: write fewer out-of-band buffers per record"
        )
    out = CountingWriter(file)
    head = fmt.encode_preamble(len(header_bytes), 0 if key is None else fmt.FLAG_SIGNED) + header_bytes
    header_checksum = fmt.checksum(head)
    out.write(head + fmt.U64.pack(header_checksum))
    index = fmt.ChunkIndex()
    digests: list[bytes] = []
    sign = key is not None
    raw_threads = nthreads if _writes_to_os(file) else 1  # a copy into memory holds the GIL
    jobs = _chunk_jobs(header.streams, payloads, plans, header_checksum, sign)
    count = sum(plan.nchunks(p.nbytes) for p, plan in zip(payloads, plans, strict=True) if not _written_here(p, plan))
    for job in map_ordered(_compress_job, jobs, count, nthreads, skip=_is_stream):
        chunks: Iterable[Stored]
        if isinstance(job, _Stream):
            chunks = _write_stream(out, job, header_checksum, sign, raw_threads)
        else:
            packed, checksum, digest = job
            chunks = [(out.pos, len(packed), checksum, digest)]
            out.write(fmt.U64.pack(len(packed)))
            out.write(packed)
            out.write(fmt.U64.pack(checksum))
        for offset, csize, checksum, digest in chunks:
            index.add(offset, csize, checksum)
            if digest is not None:
                digests.append(digest)
    if key is not None:
        index.signature = fmt.signature(key, head, digests)
    trailer = index.encode()
    footer = fmt.FOOTER.pack(len(trailer), fmt.checksum(trailer, header_checksum), fmt.END_MAGIC)
    out.write(fmt.U64.pack(len(trailer)) + trailer + footer)


@dataclasses.dataclass(frozen=True)
class _Stream:
    """A stream whose chunks the writing thread writes itself (a raw one, or a
    PackedStream), numbered from ``first_chunk``."""

    payload: Payload | PackedStream
    first_chunk: int


#: A chunk to compress in the pool: its data, the ``compress2`` arguments, its checksum's seed.
_Chunk = tuple[Any, Mapping[str, Any], int, bool]


def _written_here(payload: Payload | PackedStream, plan: ChunkPlan) -> bool:
    return isinstance(payload, PackedStream) or plan.raw


def _is_stream(job: object) -> TypeGuard[_Stream]:
    return isinstance(job, _Stream)


def _chunk_jobs(
    streams: Sequence[fmt.StreamInfo],
    payloads: Sequence[Payload | PackedStream],
    plans: Sequence[ChunkPlan],
    header_checksum: int,
    sign: bool,
) -> Iterator[_Stream | _Chunk]:
    """The chunks of a record in order: every chunk of a compressed buffer, to compress in the
    pool (all buffers' chunks in one pipeline, so that the next buffers compress while this
    one is written), and the streams the writing thread writes itself."""
    chunk = 0
    for info, payload, plan in zip(streams, payloads, plans, strict=True):
        if isinstance(payload, PackedStream):
            yield _Stream(payload, chunk)
            chunk += payload.nchunks
        elif plan.raw:
            yield _Stream(payload, chunk)
            chunk += 1 if info.nbytes else 0
        else:
            for piece in payload.chunks(plan.chunk_size):
                yield piece, plan.cparams, fmt.chunk_seed(header_checksum, chunk), sign
                chunk += 1


def _compress_job(job: _Chunk) -> tuple[bytes, int, bytes | None]:
    """Compress a chunk; return it, its checksum and (in a signed record) its digest."""
    piece, cparams, seed, sign = job
    packed = compress_chunk(piece, cparams)
    return packed, fmt.checksum(packed, seed), (fmt.chunk_digest(packed) if sign else None)


def _write_stream(out: CountingWriter, job: _Stream, header_checksum: int, sign: bool, nthreads: int) -> list[Stored]:
    """Write the chunks of a PackedStream or of a raw stream."""
    payload = job.payload
    if isinstance(payload, PackedStream):
        return _write_packed_stream(out, payload, header_checksum, job.first_chunk, sign)
    if not payload.nbytes:
        return []
    return [_write_raw_chunk(out, payload, fmt.chunk_seed(header_checksum, job.first_chunk), sign, nthreads)]


def _write_packed_stream(
    out: CountingWriter, stream: PackedStream, header_checksum: int, first_chunk: int, sign: bool
) -> list[Stored]:
    """Write the chunks of a PackedStream (the pickle stream, compressed by now) in one write,
    so that an unbuffered file sees one system call for them, not three per chunk."""
    chunks: list[Stored] = []
    parts: list[bytes] = []
    offset = out.pos
    for chunk, packed in enumerate(stream.packed(), start=first_chunk):
        checksum = fmt.checksum(packed, fmt.chunk_seed(header_checksum, chunk))
        parts += [fmt.U64.pack(len(packed)), packed, fmt.U64.pack(checksum)]
        chunks.append((offset, len(packed), checksum, fmt.chunk_digest(packed) if sign else None))
        offset += len(packed) + 2 * fmt.U64.size
    out.write(b"".join(parts))
    return chunks


def _writes_to_os(file: BinaryIO) -> bool:
    """Whether writes to ``file`` are system calls, which release the GIL (it has a
    descriptor), rather than copies into memory."""
    try:
        file.fileno()
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is both
        return False
    return True


def _write_raw_chunk(out: CountingWriter, payload: Payload, seed: int, sign: bool, nthreads: int) -> Stored:
    """Write a raw chunk, each piece hashed while it is written."""
    out.write(bytes(fmt.raw_padding(out.pos)))
    offset = out.pos
    out.write(fmt.U64.pack(payload.nbytes))
    multiple = payload.chunk_multiple
    piece_size = RAW_PIECE_SIZE - RAW_PIECE_SIZE % multiple or multiple
    chunk_hash = ChunkHash(seed, sign, nthreads if payload.nbytes > piece_size else 1)
    try:
        for piece in payload.chunks(piece_size):
            chunk_hash.add(piece)
            out.write(piece)
    finally:  # the caller's buffer is released when dump returns, even on a failed write
        chunk_hash.settle()
    checksum = chunk_hash.checksum()
    out.write(fmt.U64.pack(checksum))
    return offset, payload.nbytes, checksum, chunk_hash.digest()
