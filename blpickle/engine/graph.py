"""The pickle stream as the C pickler writes it: in memory until it fills a chunk, then
compressed in the background a chunk at a time; large payloads spliced out; arrays stored
raw kept in it while the record may still be compact."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pickle import PickleBuffer
from typing import TYPE_CHECKING, Any

from .policy import COMPACT_LIMIT, GRAPH_RAW_LIMIT, fits_compact, plan_graph, plan_pickle
from .writer import PackedStream

if TYPE_CHECKING:
    from ..options import Options

__all__ = ["SPLICE_LIMIT", "GraphStream"]

#: Payloads the pickler writes in band (bytes, bytearray, str) from this size are spliced out.
#: Pickle frames are at most about 128 KiB, so no frame is ever mistaken for a payload.
SPLICE_LIMIT = 1 << 20


class GraphStream:
    """Where the C pickler writes. The pickle stream is kept in memory; once it reaches a
    chunk of `blpickle.engine.policy.plan_graph`, its chunks are compressed in the background
    as soon as they are complete (a `PackedStream`; never with codec None). At protocol 4 and
    up, the large bytes, bytearray and str payloads the pickler writes on their own (never
    inside a frame) are kept by reference and given to ``splice`` (the pickler's), to be
    stored as streams of their own and spliced back in on load.

    Arrays that their codec would store raw may be written in band while the stream can still
    make a compact record with them (`take_raw`): the stream waits, uncompressed, as long as
    it can."""

    def __init__(self, splice: Callable[[Any, int], None] | None, options: Options) -> None:
        self._splice = splice
        self._options = options
        self._plan = plan_graph(options)
        self._nthreads = options.threads
        self._chunk_size = sys.maxsize if self._plan.raw else self._plan.chunk_size
        self._packed: PackedStream | None = None
        self._tail = bytearray()
        self._start = 0  # offset of the tail in the pickle stream
        #: bytes of the arrays written in band by `take_raw`
        self.raw_nbytes = 0

    def write(self, data: Any) -> int:
        if type(data) is PickleBuffer:  # kept in band, written on its own: C or Fortran order
            data = data.raw()
        nbytes = len(data) if type(data) is bytes else memoryview(data).nbytes
        if self._splice is not None and nbytes >= SPLICE_LIMIT:
            self._splice(data, self._start + len(self._tail))
            return nbytes
        self._tail += data
        if len(self._tail) >= self._chunk_size and not self._waiting():
            self._cut()
        return nbytes

    def take_raw(self, nbytes: int, stays_raw: Callable[[], bool]) -> bool:
        """Whether an array of ``nbytes`` is to be written in band, as part of a stream that
        may still make a compact record: it is not compressing, it stays under
        `COMPACT_LIMIT` with the array (and room for a few opcodes), and ``stays_raw()``
        (its codec would store it raw). If so, count the array in `raw_nbytes`."""
        if self._packed is not None or len(self._tail) + nbytes + GRAPH_RAW_LIMIT >= COMPACT_LIMIT:
            return False
        if not stays_raw():
            return False
        self.raw_nbytes += nbytes
        return True

    def _waiting(self) -> bool:
        """Whether the stream holds arrays stored raw (`take_raw`) and may still make a
        compact record: then it is not cut into chunks to compress."""
        size = len(self._tail)
        return (
            self._packed is None
            and bool(self.raw_nbytes)
            and size < COMPACT_LIMIT
            and size - self.raw_nbytes < self._chunk_size
        )

    def _cut(self) -> PackedStream:
        """Hand every complete chunk of the tail to the PackedStream (started on the first);
        return it."""
        if self._packed is None:
            self._packed = PackedStream(self._plan, self._nthreads)
        chunk_size = self._chunk_size
        while len(self._tail) >= chunk_size:
            self._packed.add(bytes(self._tail[:chunk_size]))
            del self._tail[:chunk_size]
            self._start += chunk_size
        return self._packed

    def small(self) -> bytearray | None:
        """Return the pickle stream when it fits a compact record (`fits_compact` for an
        unsigned stream with no buffer), else None."""
        tail = self._tail
        return tail if self._packed is None and fits_compact(len(tail), self.raw_nbytes, 0, (), None) else None

    def whole(self) -> bytearray | None:
        """Return the pickle stream if it is all in memory (it was never cut into chunks),
        else None."""
        return self._tail if self._packed is None else None

    def finish(self) -> PackedStream | bytearray:
        """Return the whole pickle stream of a full record: in memory where it is to be
        stored raw (`plan_pickle`), else compressing, in chunks of the plan's size."""
        if self._packed is None and plan_pickle(self._options, len(self._tail), self.raw_nbytes).raw:
            return self._tail
        packed = self._cut()
        if self._tail:  # a stream of whole chunks has no shorter last one
            packed.add(bytes(self._tail), last=True)
        return packed

    def reset(self) -> None:
        """Start a new pickle stream (dropping chunks of a failed one not compressed yet)."""
        if self._packed is not None:
            self._packed.cancel()
        self._packed = None
        self._tail = bytearray()
        self._start = 0
        self.raw_nbytes = 0
