"""Micro-benchmarks of blpickle's hot paths (pytest-benchmark).

Run: ``pytest bench/test_micro.py`` (``pytest`` alone collects only ``tests/``).
"""

from __future__ import annotations

import functools
import pickle

import blosc2
import numpy as np
import pytest

import blpickle
from blpickle import format as fmt
from blpickle.engine.buffers import spread_sample
from blpickle.engine.chunks import compress_chunk
from blpickle.engine.policy import blosc2_cparams, choose_codec

from .datasets import ENTROPIES, make_array, make_objects

CHUNK_ELEMENTS = blpickle.Options().chunk_size // 8
pickle_dumps = functools.partial(pickle.dumps, protocol=5)


@pytest.fixture(scope="module", params=ENTROPIES)
def chunk(request: pytest.FixtureRequest) -> np.ndarray:
    """One default-size chunk of 8-byte elements of each entropy."""
    return make_array(request.param, CHUNK_ELEMENTS)


@pytest.mark.parametrize("codec", ["zstd", "lz4"])  # what codec "auto" chooses between
def test_compress_chunk(benchmark, chunk: np.ndarray, codec: str) -> None:
    cparams = blosc2_cparams(blpickle.Options(), 8, codec)
    packed = benchmark(compress_chunk, chunk, cparams)
    assert blosc2.get_cbuffer_sizes(packed)[0] == chunk.nbytes


@pytest.mark.parametrize("codec", ["zstd", "lz4"])
def test_decompress_chunk(benchmark, chunk: np.ndarray, codec: str) -> None:
    packed = compress_chunk(chunk, blosc2_cparams(blpickle.Options(), 8, codec))
    out = np.empty_like(chunk)
    benchmark(blosc2.decompress2, packed, dst=out)
    assert np.array_equal(out, chunk)


def test_choose_codec(benchmark, chunk: np.ndarray) -> None:
    sample = spread_sample(chunk, 192 << 10, 8)
    assert benchmark(choose_codec, blpickle.Options(), sample, 8) in ("zstd", "lz4")


@pytest.fixture(scope="module")
def header() -> fmt.Header:
    """A header for a graph of 1000 float64 arrays."""
    stream = fmt.StreamInfo(nbytes=8000, chunk_size=8000, itemsize=8, dtype="<f8", shape=(1000,))
    streams = (fmt.StreamInfo(nbytes=50_000, chunk_size=50_000), *[stream] * 1000)
    return fmt.Header(blpickle.Options().to_dict(), 5, streams)


def test_header_encode(benchmark, header: fmt.Header) -> None:
    assert benchmark(header.encode)


def test_header_decode(benchmark, header: fmt.Header) -> None:
    assert benchmark(fmt.Header.decode, header.encode()) == header


SMALL_OBJECTS = {
    "dict of scalars": {f"k{i}": (i, float(i), str(i)) for i in range(100)},
    "one small array": np.arange(1000.0),
    "dict of 100 small arrays": {i: np.full(100, i, dtype=np.int32) for i in range(100)},
    "object-heavy dict (200k)": make_objects(),
}
#: blpickle next to the C pickler at protocol 5, one benchmark group per object.
MODULES = {"blpickle": (blpickle.dumps, blpickle.loads), "pickle": (pickle_dumps, pickle.loads)}


@pytest.mark.parametrize("module", MODULES)
@pytest.mark.parametrize("name", SMALL_OBJECTS)
def test_dumps(benchmark, name: str, module: str) -> None:
    benchmark.group = f"dumps: {name}"
    assert benchmark(MODULES[module][0], SMALL_OBJECTS[name])


@pytest.mark.parametrize("module", MODULES)
@pytest.mark.parametrize("name", SMALL_OBJECTS)
def test_loads(benchmark, name: str, module: str) -> None:
    benchmark.group = f"loads: {name}"
    dumps, loads = MODULES[module]
    loaded = benchmark(loads, dumps(SMALL_OBJECTS[name]))
    assert type(loaded) is type(SMALL_OBJECTS[name])
