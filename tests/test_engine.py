"""The engine's building blocks: policy decisions, the chunk codec and the ordered pool."""

from __future__ import annotations

import os
from typing import TypeGuard

import blosc2
import numpy as np
import pytest

import blpickle
from blpickle.engine import chunks, policy
from blpickle.engine.buffers import Payload
from blpickle.engine.pool import map_ordered
from blpickle.engine.reader import RecordReader
from blpickle.errors import ChecksumError, CorruptError
from blpickle.io.sources import MemorySource
from blpickle.options import Options

RAMP = np.arange(1 << 20, dtype=np.int64)  # compresses hundreds of times
NOISE = np.frombuffer(os.urandom(1 << 20), dtype=np.uint8)  # does not compress


def test_compressed_chunks_come_back_in_order_and_decompress_into_their_slots():
    view = RAMP.view(np.uint8).data
    plan = policy.plan_buffer(Options(codec="lz4"), view.nbytes, 8, lambda size: view[:size])
    pieces = [view[i : i + plan.chunk_size] for i in range(0, view.nbytes, plan.chunk_size)]
    for nthreads in (1, 3):
        packed = list(chunks.compress_chunks(pieces, plan.cparams, len(pieces), nthreads))
        out = np.empty_like(RAMP)
        slots = out.view(np.uint8).data
        jobs = ((p, slots[i * plan.chunk_size : (i + 1) * plan.chunk_size], f"chunk {i}") for i, p in enumerate(packed))
        chunks.decompress_chunks(jobs, len(packed), nthreads)
        assert np.array_equal(out, RAMP)


def test_a_chunk_that_does_not_fit_its_slot_is_refused_naming_it():
    packed = chunks.compress_chunk(b"x" * 1000, policy.blosc2_cparams(Options(), 1, "zstd"))
    with pytest.raises(CorruptError, match=r"chunk 7 of buffer 2 holds 1000 bytes in \d+, expected 999"):
        chunks.decompress_chunk(packed, memoryview(bytearray(999)), "chunk 7 of buffer 2")
    with pytest.raises(CorruptError, match="the last chunk at offset 40 is too short"):
        chunks.decompress_chunk(packed[:20], memoryview(bytearray(1000)), "the last chunk", 40)
    with pytest.raises(CorruptError, match=r"holds 1000 bytes in \d+, expected 1000 in"):
        chunks.decompress_chunk(packed + b"\0", memoryview(bytearray(1000)), "a chunk")
    stored = blpickle.format.checksum(packed, 5)
    with pytest.raises(ChecksumError):
        chunks.unpack_chunk(packed, stored + 1, 5, 1000, None, "a frame", 0)
    out = bytearray(1000)
    chunks.unpack_chunk(packed, stored, 5, 1000, memoryview(out), "a frame", 0)
    assert out == b"x" * 1000


def test_the_policy_plans_record_buffers_and_the_pickle_stream():
    options = Options()
    assert policy.plan_buffer(Options(codec=None), 100, 4, lambda size: b"").raw
    ramp = policy.plan_buffer(options, RAMP.nbytes, 8, lambda size: RAMP.view(np.uint8).data[:size])
    noise = policy.plan_buffer(options, NOISE.nbytes, 1, lambda size: NOISE.data[:size])
    assert (ramp.codec, noise.codec) == ("zstd", "lz4")  # "auto": zstd only where it pays
    assert ramp.cparams["typesize"] == 8 and ramp.cparams["blocksize"] % 8 == 0
    assert policy.plan_buffer(Options(codec="zlib"), 10, 1, lambda size: b"").codec == "zlib"
    graph = policy.plan_graph(options)
    assert (graph.codec, graph.chunk_size) == (policy.GRAPH_CODEC, policy.GRAPH_CHUNK_SIZE)
    assert graph.cparams["blocksize"] == graph.chunk_size
    assert policy.plan_graph(Options(codec=None)).raw
    assert policy.chunk_size_for(Options(nthreads=4, chunk_size=1 << 22), 3 << 20, 8) == policy.PARALLEL_CHUNK_SIZE


def test_auto_takes_zstd_where_its_entropy_coder_pays_and_lz4_on_noisy_floats():
    rng = np.random.default_rng(0)
    weights = (0.02 * rng.standard_normal(1 << 20)).astype(np.float32)  # like a layer's weights
    bf16 = (weights.view(np.uint32) >> 16).astype(np.uint16)  # the same, rounded down to bfloat16
    noisy = rng.random(1 << 20)  # the benchmark's high-entropy float64 data

    def codec(data: np.ndarray) -> str:
        return policy.choose_codec(Options(), data.view(np.uint8)[: 1 << 18], data.itemsize)

    assert (codec(weights), codec(bf16), codec(noisy)) == ("zstd", "zstd", "lz4")


def test_a_small_buffer_that_does_not_compress_is_stored_raw():
    options = Options()
    small = policy.SMALL_BUFFER_LIMIT - 8
    noise, ramp = NOISE[:small], RAMP.view(np.uint8)[:small]
    assert policy.plan_buffer(options, small, 1, lambda size: noise.data[:size]).raw
    assert policy.plan_buffer(options, small, 8, lambda size: ramp.data[:size]).codec == "zstd"
    assert policy.plan_buffer(Options(codec="lz4"), small, 1, lambda size: noise.data[:size]).codec == "lz4"
    big = NOISE[: policy.SMALL_BUFFER_LIMIT]
    assert policy.plan_buffer(options, big.nbytes, 1, lambda size: big.data[:size]).codec == "lz4"
    floats = np.random.default_rng(0).standard_normal(10_000)  # 80 KB that shrinks a few percent
    for array, raw in ((floats, True), (np.arange(10_000.0), False)):
        data = blpickle.dumps([np.arange(100_000), array])  # after an array out of band
        stream = RecordReader(MemorySource(data), nthreads=1).header.streams[2]
        assert stream.raw is raw
        assert np.array_equal(blpickle.loads(data)[1], array)


def test_a_small_pickle_stream_is_stored_raw_and_a_larger_one_compressed():
    options = Options()
    assert policy.plan_pickle(options, policy.GRAPH_RAW_LIMIT - 1) == policy.plan_raw(policy.GRAPH_RAW_LIMIT - 1)
    assert policy.plan_pickle(options, policy.GRAPH_RAW_LIMIT) == policy.plan_graph(options)
    assert policy.plan_pickle(Options(codec=None), 1 << 20).raw
    for text, raw in (("x", True), ("x" * policy.GRAPH_RAW_LIMIT, False)):
        obj = {"array": RAMP, "text": text}  # the array makes it a full record
        data = blpickle.dumps(obj)
        graph = RecordReader(MemorySource(data), nthreads=1).header.streams[0]
        assert graph.raw is raw and (graph.codec is None) is raw
        loaded = blpickle.loads(data)
        assert loaded["text"] == text and np.array_equal(loaded["array"], RAMP)


def test_transfers_go_raw_when_compression_does_not_pay():
    options = Options(codec="lz4")
    ramp = RAMP.view(np.uint8).data
    assert policy.plan_transfer(options, ramp, 8, "auto", 1 << 19, 2.0).codec == "lz4"
    assert policy.plan_transfer(options, NOISE.data, 1, "auto", 1 << 19, 2.0).raw
    assert policy.plan_transfer(options, NOISE.data, 1, True, 1 << 19, 2.0).codec == "lz4"
    assert policy.plan_transfer(options, ramp, 8, False, 1 << 19, 2.0).raw
    assert policy.plan_transfer(options, ramp, 8, "auto", 1 << 30, 2.0).raw  # under min_size
    assert policy.plan_transfer(Options(codec=None), ramp, 8, True, 0, 2.0).raw


def test_stream_chunks_find_their_element_size():
    int16 = (np.arange(1 << 18) % 300).astype(np.int16)
    assert policy.pick_filters(int16.view(np.uint8).data, Options())[1] == 2
    assert policy.pick_filters(RAMP.view(np.uint8).data, Options())[1] == 8
    assert policy.pick_filters(RAMP.view(np.uint8).data, Options(shuffle="noshuffle"))[1] == 1
    plan = policy.plan_stream_chunk(int16.view(np.uint8).data, Options(codec="zstd"))
    assert (plan.codec, plan.typesize, plan.chunk_size) == ("zstd", 2, int16.nbytes)
    packed = chunks.compress_chunk(int16.view(np.uint8).data, plan.cparams)
    assert blosc2.decompress2(packed) == int16.tobytes()


def test_strided_payloads_are_read_in_whole_elements():
    strided = np.arange(300.0).reshape(30, 10)[::2, ::-3]
    payload = Payload.from_array(strided)
    assert payload.nbytes == strided.nbytes and payload.chunk_multiple == 8
    assert b"".join(bytes(piece) for piece in payload.chunks(48)) == np.ascontiguousarray(strided).tobytes()


def test_map_ordered_keeps_order_and_stops_cleanly_on_an_error():
    assert list(map_ordered(lambda item: item * 2, iter(range(200)), 200, 3)) == [i * 2 for i in range(200)]

    def fails_at_50(item: int) -> int:
        if item == 50:
            raise ValueError("item 50")
        return item

    results = map_ordered(fails_at_50, iter(range(200)), 200, 3)
    assert [next(results) for _ in range(50)] == list(range(50))
    with pytest.raises(ValueError, match="item 50"):
        next(results)


@pytest.mark.parametrize(("count", "nthreads"), [(100, 3), (100, 1), (1, 3)])
def test_map_ordered_hands_skipped_items_back_in_their_place(count, nthreads):
    called: list[int] = []

    def double(item: int) -> int:
        called.append(item)
        return item * 2

    def is_str(item: object) -> TypeGuard[str]:
        return isinstance(item, str)

    items = [f"s{i}" if i % 7 == 0 else i for i in range(100)]
    expected = [item if isinstance(item, str) else item * 2 for item in items]
    assert list(map_ordered(double, iter(items), count, nthreads, skip=is_str)) == expected
    assert sorted(called) == [item for item in items if isinstance(item, int)]


def test_records_mixing_raw_and_compressed_buffers_round_trip_signed():
    """Raw and compressed buffers of one record go through one pipeline, frames in order."""
    rng = np.random.default_rng(0)
    obj = [np.arange(300_000) if i % 3 else rng.random(20_000) for i in range(12)]  # 2.4 MB ramps, 160 KB noise
    data = blpickle.dumps(obj, key=b"key", nthreads=2, chunk_size=1 << 20)
    raws = [stream.raw for stream in blpickle.inspect(data, key=b"key").buffers]
    assert any(raws) and not all(raws)
    assert all(np.array_equal(a, b) for a, b in zip(blpickle.loads(data, key=b"key"), obj, strict=True))


@pytest.mark.parametrize("nthreads", [1, 2])
def test_raw_buffers_of_several_pieces_round_trip_signed_and_strided(nthreads):
    """Raw buffers of several pieces are checksummed (and signed) whole, strided or not."""
    array = np.arange(1_200_005, dtype=np.float64)  # over one 8 MiB piece
    for obj in (array, array[::2], array.reshape(5, -1)[:, ::-1]):
        data = blpickle.dumps(obj, codec=None, key=b"key", nthreads=nthreads)
        assert np.array_equal(blpickle.loads(data, key=b"key"), obj)
        damaged = bytearray(data)
        damaged[len(data) // 2] ^= 1
        with pytest.raises(blpickle.LoadError):
            blpickle.loads(bytes(damaged), key=b"key")
