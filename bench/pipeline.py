"""Pipeline efficiency: blpickle's dump and load throughput on one big buffer over Blosc2's own
compression and decompression of the same buffer, with the same parameters.

For each dataset of the paper (80 MB), blpickle's default dumps the array to bytes and loads it
back; the codec, level, filters, element size, chunk size and thread count it used are read
from the record (`blpickle.inspect`), the chunk and block sizes from its first chunk's Blosc2 header.
Blosc2 then compresses the same array into a ``blosc2.SChunk`` of the same chunk size with
those parameters and its own threads, and decompresses every chunk into a fresh array. Both
in memory, interleaved rounds; efficiency is Blosc2's time over blpickle's (1.0: blpickle's
pipeline costs nothing beyond Blosc2's own work).

Run on its own: ``python -m bench --section pipeline [--quick]``.
"""

from __future__ import annotations

import functools
import os
import time
from typing import Any

import blosc2
import numpy as np

import blpickle

from .datasets import ENTROPIES, SIZES, make_array
from .report import text_table
from .timing import compare, interleaved

ROUNDS, QUICK_ROUNDS = 11, 5
SIZE = "mid"
_SHUFFLES = {
    "shuffle": blosc2.Filter.SHUFFLE,
    "bitshuffle": blosc2.Filter.BITSHUFFLE,
    "noshuffle": blosc2.Filter.NOFILTER,
}
#: Where a Blosc2 chunk header keeps the element size, and the header's size.
_TYPESIZE_AT, _HEADER_SIZE = 3, 32


def first_chunk(record: bytes, nbytes: int, nchunks: int, typesize: int) -> tuple[int, int]:
    """The uncompressed size and the block size of the first Blosc2 chunk in ``record`` that
    belongs to a buffer of ``nbytes`` in ``nchunks`` chunks of ``typesize`` elements: found
    by scanning for a chunk header that fits and decompresses.

    Raises:
        ValueError: when there is none.
    """
    for start in range(len(record) - _HEADER_SIZE):
        if record[start + _TYPESIZE_AT] != typesize:
            continue
        try:
            size, cbytes, blocksize = blosc2.get_cbuffer_sizes(record[start : start + _HEADER_SIZE])
        except (RuntimeError, ValueError):
            continue
        fits = size and not size % typesize and -(-nbytes // size) == nchunks and 0 < blocksize <= size
        if not fits or start + cbytes > len(record):
            continue
        try:
            if len(blosc2.decompress2(record[start : start + cbytes])) == size:
                return size, blocksize
        except (RuntimeError, ValueError):
            continue
    raise ValueError(f"no Blosc2 chunk of a {nbytes}-byte buffer in the record")


def blosc2_parameters(record: bytes) -> dict[str, Any]:
    """What blpickle compressed the record's only buffer with, as ``blosc2.SChunk``
    arguments: ``chunksize``, ``cparams`` and ``dparams``.

    Raises:
        ValueError: when the buffer is stored raw (no Blosc2 chunk to be found).
    """
    info = blpickle.inspect(record)
    (buffer,) = info.buffers
    if buffer.codec is None:
        raise ValueError("the buffer is stored raw")
    options = info.options
    typesize = buffer.itemsize
    chunk_size, blocksize = first_chunk(record, buffer.nbytes, buffer.nchunks, typesize)
    filters = [_SHUFFLES[options["shuffle"]]] + ([blosc2.Filter.BYTEDELTA] if options["bytedelta"] else [])
    threads = options["nthreads"] or len(os.sched_getaffinity(0))
    cparams = blosc2.CParams(
        codec=blosc2.Codec[buffer.codec.upper()],
        clevel=options["clevel"],
        typesize=typesize,
        filters=filters,
        filters_meta=[0] * len(filters),
        blocksize=blocksize,
        nthreads=threads,
    )
    return {"chunksize": chunk_size, "cparams": cparams, "dparams": blosc2.DParams(nthreads=threads)}


def _blosc2_dump(array: np.ndarray, parameters: dict[str, Any]) -> blosc2.SChunk:
    return blosc2.SChunk(data=array, **parameters)


def _blosc2_load(schunk: blosc2.SChunk, nbytes: int) -> np.ndarray:
    out = np.empty(nbytes, np.uint8)
    size = schunk.chunksize
    for index in range(schunk.nchunks):
        schunk.decompress_chunk(index, dst=out[index * size : (index + 1) * size])
    return out


def measure(dataset: str, nbytes: int, rounds: int) -> list[dict]:
    """The dump and load rows of one dataset, with the parameters both used."""
    array = make_array(dataset, nbytes // 8)
    record = blpickle.dumps(array)
    parameters = blosc2_parameters(record)
    schunk = _blosc2_dump(array, parameters)
    if not np.array_equal(_blosc2_load(schunk, array.nbytes).view(array.dtype), array):
        raise AssertionError(f"Blosc2 did not give back the {dataset} array")
    dumps = {
        "blpickle": functools.partial(blpickle.dumps, array),
        "Blosc2": functools.partial(_blosc2_dump, array, parameters),
    }
    loads = {
        "blpickle": functools.partial(blpickle.loads, record),
        "Blosc2": functools.partial(_blosc2_load, schunk, array.nbytes),
    }
    cparams = parameters["cparams"]
    described = {
        "codec": cparams.codec.name.lower(),
        "clevel": cparams.clevel,
        "filters": [f.name.lower() for f in cparams.filters if f != blosc2.Filter.NOFILTER],
        "typesize": cparams.typesize,
        "blocksize": cparams.blocksize,
        "chunksize": parameters["chunksize"],
        "nthreads": cparams.nthreads,
        "blpickle_ratio": array.nbytes / len(record),
        "blosc2_ratio": array.nbytes / schunk.cbytes,
    }
    rows = []
    for op, calls in (("dump", dumps), ("load", loads)):
        row = compare(dataset, op, interleaved(calls, rounds, 0), "Blosc2")
        row.update(nbytes=array.nbytes, parameters=described)
        rows.append(row)
    return rows


def run(quick: bool) -> list[dict]:
    """Every row of the section, printed as a table once measured."""
    rounds = QUICK_ROUNDS if quick else ROUNDS
    started = time.perf_counter()
    rows = [row for dataset in ENTROPIES for row in measure(dataset, SIZES[SIZE] * 8, rounds)]
    seconds = time.perf_counter() - started
    print(
        f"\nPipeline efficiency: blpickle over Blosc2's own SChunk, same parameters, {rounds} interleaved rounds ({seconds:.0f} s)"
    )
    print(text_table(table(rows)), flush=True)
    return rows


def table(rows: list[dict]) -> list[tuple[str, ...]]:
    """Throughputs best (median) of each, efficiency, and the parameters both used."""
    lines: list[tuple[str, ...]] = [
        ("dataset", "op", "blpickle MB/s", "Blosc2 MB/s", "efficiency", "ratio blpickle / Blosc2", "parameters")
    ]
    for row in rows:
        p = row["parameters"]

        def mbs(spread: dict, nbytes: int = row["nbytes"]) -> str:
            return f"{nbytes / 1e6 / spread['min']:,.0f} ({nbytes / 1e6 / spread['median']:,.0f})"

        lines.append(
            (
                f"{row['workload']}, {row['nbytes'] / 1e6:.0f} MB",
                row["op"],
                mbs(row["blpickle"]),
                mbs(row["reference"]),
                f"{row['speed_best']:.2f}x ({row['speed_median']:.2f}x)",
                f"{p['blpickle_ratio']:.2f} / {p['blosc2_ratio']:.2f}",
                f"{p['codec']}-{p['clevel']} {'+'.join(p['filters'])} typesize {p['typesize']} "
                f"block {p['blocksize'] >> 10} KiB chunk {p['chunksize'] >> 10} KiB {p['nthreads']} threads",
            )
        )
    return lines
