"""The one place that calls Blosc2: compressing and decompressing chunks, checked.

Every buffer blpickle stores or sends (record streams, the joblib stream, process transfers)
is cut into chunks that are compressed independently with the parameters of a
`blpickle.engine.policy.ChunkPlan`; here each chunk is compressed, and decompressed only after its
declared sizes match what its slot expects.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import blosc2

from .. import format as fmt
from ..errors import ChecksumError, CorruptError, DumpError
from .pool import map_ordered

__all__ = [
    "compress_chunk",
    "compress_chunks",
    "decompress_chunk",
    "decompress_chunks",
    "unpack_chunk",
]


def compress_chunk(data: Any, cparams: Mapping[str, Any]) -> bytes:
    """Compress ``data`` into one Blosc2 chunk with ``cparams`` (`blpickle.engine.policy.blosc2_cparams`).

    An explicit block size larger than the data shrinks to the data's whole elements: with a
    block larger than the data, or not a multiple of the element size, Blosc2 writes chunks
    that decompress wrong, without an error (``tests/test_options.py`` holds it to this).
    Data that ends in a partial element is compressed without bytedelta, which some Blosc2
    releases the dependency floor allows apply wrongly to that partial element.

    Raises:
        DumpError: when Blosc2 cannot compress it.
    """
    nbytes = memoryview(data).nbytes
    if cparams.get("blocksize", 0) > nbytes:
        cparams = {**cparams, "blocksize": nbytes - nbytes % cparams["typesize"]}
    if nbytes % cparams["typesize"] and blosc2.Filter.BYTEDELTA in cparams["filters"]:
        filters = [f for f in cparams["filters"] if f != blosc2.Filter.BYTEDELTA]
        cparams = {**cparams, "filters": filters, "filters_meta": [0] * len(filters)}
    try:
        return blosc2.compress2(data, **cparams)
    except Exception as exc:
        raise DumpError(f"Blosc2 could not compress a chunk of {nbytes} bytes: {exc}") from exc


def compress_chunks(pieces: Iterable[Any], cparams: Mapping[str, Any], count: int, nthreads: int) -> Iterator[bytes]:
    """Yield the compressed ``pieces`` in order, compressing up to ``nthreads`` at once
    (``count``: how many pieces there are, see `blpickle.engine.pool.map_ordered`).

    Raises:
        DumpError: when Blosc2 cannot compress a piece.
    """

    def compress(piece: Any) -> bytes:
        return compress_chunk(piece, cparams)

    return map_ordered(compress, pieces, count, nthreads)


def _check_sizes(packed: Any, nbytes: int, what: str, offset: int | None) -> None:
    """Check that the chunk header declares ``nbytes`` decompressed bytes and the chunk's own
    size compressed (``decompress2`` trusts the header, not the size of its destination)."""
    csize = memoryview(packed).nbytes
    if csize < fmt.BLOSC2_MIN_CHUNK:
        declared, cbytes = -1, -1
    else:
        declared, cbytes, _ = blosc2.get_cbuffer_sizes(packed)
    if declared != nbytes or cbytes != csize:
        where = "" if offset is None else f" at offset {offset}"
        found = "is too short for a Blosc2 chunk" if declared < 0 else f"holds {declared} bytes in {cbytes}"
        raise CorruptError(f"{what}{where} {found}, expected {nbytes} in {csize}")


def decompress_chunk(packed: Any, dst: memoryview, what: str, offset: int | None = None) -> None:
    """Decompress one Blosc2 chunk into ``dst``, which it must fill exactly.

    Raises:
        CorruptError: naming ``what`` (and ``offset``, if given) when the chunk declares other
            sizes than ``dst`` and its own length, or Blosc2 cannot decompress it.
    """
    _check_sizes(packed, dst.nbytes, what, offset)
    try:
        blosc2.decompress2(packed, dst=dst, nthreads=1)  # the default spawns a thread pool per call
    except Exception as exc:
        where = "" if offset is None else f" at offset {offset}"
        raise CorruptError(f"Blosc2 could not decompress {what}{where}: {exc}") from None


def decompress_chunks(jobs: Iterable[tuple[Any, memoryview, str]], count: int, nthreads: int) -> None:
    """Decompress each ``(packed, dst, what)`` of ``jobs`` (see `decompress_chunk`), up to
    ``nthreads`` at once; ``count``: how many there are.

    Raises:
        CorruptError: for the first chunk that does not hold what its slot expects.
    """
    for _ in map_ordered(_decompress_job, jobs, count, nthreads):
        pass


def _decompress_job(job: tuple[Any, memoryview, str]) -> None:
    decompress_chunk(*job)


def unpack_chunk(
    packed: Any, stored: int, seed: int, nbytes: int, dst: memoryview | None, what: str, offset: int
) -> None:
    """Check one stored chunk (its Blosc2 data) and decompress it into ``dst``; with
    ``dst`` None, only check it.

    In this order: its checksum (before anything reaches Blosc2), then its declared sizes
    (``nbytes`` decompressed, its own length compressed), then decompression.

    Raises:
        ChecksumError, CorruptError: naming ``what`` and its ``offset``.
    """
    computed = fmt.checksum(packed, seed)
    if computed != stored:
        raise ChecksumError(what, offset, stored, computed)
    if dst is None:
        _check_sizes(packed, nbytes, what, offset)
    else:
        if dst.nbytes != nbytes:
            raise CorruptError(f"{what} at offset {offset}: {nbytes} bytes expected, its slot holds {dst.nbytes}")
        decompress_chunk(packed, dst, what, offset)
