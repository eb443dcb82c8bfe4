"""Reading streams ahead of the unpickler: while it rebuilds one buffer, the chunks of the
next ones are read, checked and decompressed (or copied) in the shared pool into their
arrays, so that many small buffers load in parallel as the chunks of one large buffer do.

`ReadAhead` is the part of `blpickle.engine.reader.RecordReader` that does it; the work on
each chunk is in `blpickle.engine.jobs`.
"""

from __future__ import annotations

import functools
from collections import deque
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import format as fmt
from ..errors import LoadError
from ..format.trailer import chunk_name
from ..io.sources import MemorySource, Source
from . import jobs
from .pool import shared_pool

__all__ = ["AHEAD_SIZE", "RUN_SIZE", "RUN_STREAMS", "ReadAhead"]

#: Streams after the one the unpickler asks for are read ahead while together they declare at
#: most this many bytes (their arrays, allocated as they are read; their chunks, held as
#: stored until checked and decompressed): a few chunks of the default size.
AHEAD_SIZE = 16 << 20
#: Raw streams read ahead from a plain file are read in runs of up to this many bytes (four
#: runs in flight) and streams (`jobs.RawRun`: one job and one positional read for all, of
#: at most four buffers a stream, within the 1,024 that ``preadv`` takes).
RUN_SIZE = AHEAD_SIZE // 4
RUN_STREAMS = 128


class ReadAhead:
    """The streams a `blpickle.engine.reader.RecordReader` reads ahead (`_read_ahead`), in
    order, and how the reader takes them (`_take`) or stops the work on them (`settle`)."""

    header: fmt.Header
    index: fmt.ChunkIndex
    _source: Source
    _nthreads: int
    _header_checksum: int
    _next_stream: int
    _ahead: deque[jobs.Ahead]
    _ahead_bytes: int

    if TYPE_CHECKING:

        def _read_chunks(self, info: fmt.StreamInfo, number: int, out: Any) -> Any: ...

        def _raw_prologue(self, info: fmt.StreamInfo, number: int) -> tuple[str, int]: ...

        def _read_checksum(self, what: str, offset: int, nbytes: int) -> tuple[int, int]: ...

    def settle(self) -> None:
        """Stop the work on the streams read ahead: chunks not started are dropped, those
        being checked or decompressed finish before it returns."""
        for ahead in self._ahead:
            jobs.stop(ahead.jobs)
            if ahead.run is not None:
                ahead.run.stop()
        self._ahead.clear()
        self._ahead_bytes = 0

    def _read_ahead(self) -> None:
        """Read the chunks of the streams after those read so far, while together they declare
        at most `AHEAD_SIZE` bytes and up to a splice: allocate each stream's array and hand
        its chunks to the pool (but the consumer's next stream's single chunk, which `_take`
        runs: no hand-off with nothing to run beside it). An error in a stream stops the
        reading ahead; `_take` raises it when the consumer reaches that stream."""
        streams, ahead = self.header.streams, self._ahead
        while (number := self._next_stream + len(ahead)) < len(streams) and not (ahead and ahead[-1].error is not None):
            info = streams[number]
            if info.splice is not None or self._ahead_bytes + info.nbytes > AHEAD_SIZE:
                return
            if info.raw and 0 < info.nbytes < RUN_SIZE and self._source.system_reads:
                if ahead and self._ahead_bytes + RUN_SIZE > AHEAD_SIZE:
                    return  # until there is room for a whole run
                if self._raw_run(number):
                    continue
            pending: list[jobs.Job] = []
            out: Any = None
            error = None
            try:
                if info.raw:
                    out = self._raw_ahead(info, number, pending)
                else:
                    out = self._slabs.place(info.nbytes, number)
                    pending += (
                        jobs.Job(jobs.unpack, ((*chunk, False),)) for chunk in self._read_chunks(info, number, out)
                    )
            except LoadError as exc:
                error = exc
            if ahead or len(pending) > 1:
                pending = jobs.submit(pending, shared_pool(self._nthreads))
            ahead.append(jobs.Ahead(out, pending, error, info.nbytes))
            self._ahead_bytes += info.nbytes

    def _raw_run(self, number: int) -> int:
        """Read ahead the raw chunks of the streams from ``number`` on that are raw, up to
        `RUN_SIZE` bytes and `RUN_STREAMS` streams, as one `jobs.RawRun` in the pool; return
        how many (0 where the source cannot read them later, as a file that does not hold
        them all: its streams are read one by one, which says where it ends)."""
        pos = start = self._source.pos
        room, layout = RUN_SIZE, []
        for info in self.header.streams[number : number + RUN_STREAMS]:
            if not info.raw or not 0 < info.nbytes <= room or info.splice is not None:
                break
            room -= info.nbytes
            offset = pos + fmt.raw_padding(pos)
            layout.append((info.nbytes, offset - pos, offset))
            pos = offset + 2 * fmt.U64.size + info.nbytes
        try:
            outs = [self._slabs.place(nbytes, number + place) for place, (nbytes, _, _) in enumerate(layout)]
        except LoadError:
            return 0  # read one by one, which reports it where reading in order does
        pending = self._source.read_later(pos - start, chunk_name(number, 0), least=0) if layout else None
        if pending is None:
            return 0
        chunks = []
        for place, (out, (nbytes, padding, offset)) in enumerate(zip(outs, layout, strict=True)):
            entry = len(self.index)
            self.index.add(offset, nbytes, 0)  # its stored checksum once checked (`_take`)
            seed = fmt.chunk_seed(self._header_checksum, entry)
            chunks.append(jobs.RawChunk(out, padding, seed, chunk_name(number + place, 0), offset, entry))
        run = jobs.RawRun(pending, chunks)
        run.start(shared_pool(self._nthreads))
        for place, chunk in enumerate(chunks):
            self._ahead.append(jobs.Ahead(chunk.out, [], None, chunk.out.nbytes, run, place))
            self._ahead_bytes += chunk.out.nbytes
        return len(chunks)

    def _raw_ahead(self, info: fmt.StreamInfo, number: int, pending: list[jobs.Job]) -> np.ndarray:
        """Read a raw stream's chunk for `_read_ahead`: return its array, and add to ``pending``
        the copy of its payload into the array (a positional read from a plain file, a copy
        from memory) and its checksum; from any other file, and for the consumer's next
        stream (its jobs run in the calling thread), its payload is read here."""
        if not info.nbytes:
            return np.empty(0, dtype=np.uint8)
        source = self._source
        what, offset = self._raw_prologue(info, number)
        out = self._slabs.place(info.nbytes, number)
        payload: Any = source.read_later(info.nbytes, what, least=0) if self._ahead else None
        if payload is None and self._ahead and isinstance(source, MemorySource):
            payload = source.read(info.nbytes, what)
        elif payload is None:
            source.readinto(out.data, what)
        stored, seed = self._read_checksum(what, offset, info.nbytes)
        pending.append(jobs.Job(jobs.fill_raw, (payload, out, stored, seed, what, offset)))
        return out

    @functools.cached_property
    def _slabs(self) -> jobs.Slabs:
        """Where the streams read ahead are placed."""
        return jobs.Slabs(self.header.streams)

    def _take(self) -> Any:
        """Return the next stream read ahead once its chunks are checked and decompressed
        (running those the pool has not started here). A stream whose reading failed raises
        that error, as `read_stream` does before it reports a chunk read earlier; otherwise
        the first error of its chunks.

        Raises:
            LoadError subclasses: for a damaged, truncated or inconsistent stream.
        """
        ahead = self._ahead.popleft()
        self._ahead_bytes -= ahead.nbytes
        self._next_stream += 1
        if ahead.error is not None:
            jobs.stop(ahead.jobs)
            raise ahead.error
        if ahead.run is not None:  # a raw stream read with others: no jobs of its own
            entry, stored = ahead.run.check(ahead.place)
            self.index.checksums[entry] = stored
        else:
            jobs.complete(ahead.jobs)
        return ahead.out
