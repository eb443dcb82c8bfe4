"""blpickle.integrations.dask: the "blpickle" serialization family, alone and on a real
LocalCluster of two worker processes on loopback."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import assert_same_array
from test_multiprocessing import check_objects, sample_objects

distributed = pytest.importorskip("distributed")

from distributed.protocol import deserialize, dumps, loads, serialize, to_serialize  # noqa: E402

import blpickle  # noqa: E402
from blpickle.integrations import dask as bl_dask  # noqa: E402

pytestmark = [
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]


@pytest.fixture(autouse=True)
def _registered():
    """Every test here runs with the family registered in this process."""
    bl_dask.register()


# --- the family alone ----------------------------------------------------------------------------


def test_register_adds_the_family():
    from distributed.protocol.serialize import families

    bl_dask.register()  # idempotent
    assert families[bl_dask.FAMILY][:2] == (bl_dask.serialize, bl_dask.deserialize)


@pytest.mark.parametrize("compress", ["auto", True, False])
def test_serialize_round_trip(compress):
    bl_dask.configure(compress=compress, nthreads=2)
    try:
        objects = sample_objects()
        header, frames = serialize(objects, serializers=["blpickle"], on_error="raise", iterate_collection=False)
        assert header["serializer"] == "blpickle"
        layout = header["blpickle"][1]
        if compress is True:
            assert all(chunk_size > 0 for nbytes, chunk_size in layout if nbytes >= 64 << 10)
        if compress is False:
            assert all(chunk_size == 0 for _, chunk_size in layout)
        check_objects(objects, deserialize(header, frames))
        # dask may also serialize a dict value by value
        header, frames = serialize(objects, serializers=["blpickle"], on_error="raise")
        check_objects(objects, deserialize(header, frames))
    finally:
        bl_dask.configure()


def test_compressed_frames_are_marked_and_raw_frames_are_views():
    data = {"low": np.arange(2_000_000), "high": np.random.default_rng(1).random(500_000)}
    header, frames = bl_dask.serialize(data)
    (low_nbytes, low_chunk), (_, high_chunk) = header["blpickle"][1]
    assert low_chunk > 0 and high_chunk == 0
    nchunks = -(-low_nbytes // low_chunk)
    assert header["compression"] == (None,) + (False,) * (nchunks + 1)
    assert sum(len(f) for f in frames[1 : 1 + nchunks]) < low_nbytes / 10
    raw = frames[-1]
    assert isinstance(raw, memoryview) and np.shares_memory(np.frombuffer(raw, np.float64), data["high"])


@pytest.mark.parametrize("as_bytes", [False, True])
def test_message_round_trip_through_dask_framing(as_bytes):
    """dumps/loads split, compress (if configured) and merge frames as a comm would; frames
    received as read-only bytes still give writable arrays."""
    objects = sample_objects()
    frames = dumps({"op": "x", "data": to_serialize(objects)}, serializers=["blpickle"], frame_split_size=1 << 20)
    frames = [bytes(f) if as_bytes else bytearray(f) for f in frames]
    message = loads(frames, deserializers=["blpickle"])
    check_objects(objects, message["data"])


def test_an_object_without_big_buffers_is_one_frame():
    header, frames = bl_dask.serialize({"a": 1, "small": np.arange(10)})
    assert header["blpickle"][1] == [] and len(frames) == 1
    loaded = bl_dask.deserialize(header, frames)
    assert loaded["a"] == 1
    assert_same_array(np.arange(10), loaded["small"])


def test_lambdas_fall_back_to_cloudpickle():
    offset = 2
    header, frames = bl_dask.serialize(lambda x: x + offset)
    assert bl_dask.deserialize(header, frames)(1) == 3


def test_unpicklable_falls_through_to_the_next_family():
    import threading

    header, _ = serialize(threading.Lock(), serializers=["blpickle", "pickle"], on_error="message")
    assert header["serializer"] == "error"
    with pytest.raises(TypeError):
        serialize(threading.Lock(), serializers=["blpickle"], on_error="raise")


def test_bad_header_is_a_clear_error():
    with pytest.raises(blpickle.CorruptError):
        bl_dask.deserialize({"blpickle": "nonsense"}, [b""])
    header, frames = bl_dask.serialize(np.arange(1_000_000))
    with pytest.raises(blpickle.CorruptError):
        bl_dask.deserialize(header, frames[:1])


def test_a_buffer_too_large_to_allocate_is_a_limit_error():
    """A message announcing a buffer of 2**60 bytes (with one real chunk of it): a LimitError,
    not a MemoryError."""
    header, frames = bl_dask.serialize(np.zeros(1 << 20, "u1"))
    chunk_size = header["blpickle"][1][0][1]
    assert chunk_size  # compressed
    header["blpickle"][1][0] = (1 << 60, chunk_size)
    with pytest.raises(blpickle.LimitError, match="buffer 0 announces 1152921504606846976 bytes"):
        bl_dask.deserialize(header, frames)


# --- a real cluster ------------------------------------------------------------------------------


def _install_counter() -> None:
    """Count the family's calls in this process (runs on workers through client.run)."""
    import importlib

    module = importlib.import_module("distributed.protocol.serialize")

    dumps_fn, loads_fn, wants_context = module.families["blpickle"]
    if hasattr(module, "_blpickle_counts"):
        return
    counts = {"dumps": 0, "loads": 0}

    def counting_dumps(x, context=None):
        counts["dumps"] += 1
        return dumps_fn(x, context)

    def counting_loads(header, frames):
        counts["loads"] += 1
        return loads_fn(header, frames)

    module.families["blpickle"] = (counting_dumps, counting_loads, True)
    module._blpickle_counts = counts
    module._blpickle_original = (dumps_fn, loads_fn, wants_context)


def _read_counter() -> dict:
    import importlib

    module = importlib.import_module("distributed.protocol.serialize")

    return dict(module._blpickle_counts)


def _remove_counter() -> None:
    import importlib

    module = importlib.import_module("distributed.protocol.serialize")

    if hasattr(module, "_blpickle_counts"):
        module.families["blpickle"] = module._blpickle_original
        del module._blpickle_counts, module._blpickle_original


# client.run pickles these by value (cloudpickle), whatever the workers' sys.path
for _fn in (_install_counter, _read_counter, _remove_counter):
    _fn.__module__ = "__main__"


@pytest.fixture(scope="module")
def client():
    from distributed import Client, LocalCluster

    with (
        LocalCluster(
            processes=True,
            n_workers=2,
            threads_per_worker=1,
            host="127.0.0.1",
            dashboard_address=":0",  # a free port: suites run side by side (None means 8787)
            worker_dashboard_address=":0",
        ) as cluster,
        Client(cluster, serializers=bl_dask.SERIALIZERS, deserializers=bl_dask.DESERIALIZERS) as client,
    ):
        client.register_plugin(bl_dask.WorkerPlugin())
        client.run(_install_counter)
        _install_counter()
        try:
            yield client
        finally:
            _remove_counter()


def double(array):
    return array * 2


def describe(array):
    return type(array).__name__, bool(array.flags.writeable), bool(array.flags.aligned), float(array.sum())


@pytest.mark.parametrize("direct", [True, False])
def test_scatter_compute_gather(client, direct):
    low = np.arange(3_000_000, dtype=np.int64)
    high = np.random.default_rng(2).random(1_000_000)
    before = client.run(_read_counter)
    futures = client.scatter([low, high], direct=direct)
    assert client.submit(describe, futures[1]).result() == ("ndarray", True, True, float(high.sum()))
    doubled = client.map(double, futures)
    got_low, got_high, back = client.gather([*doubled, futures[0]], direct=direct)
    assert_same_array(low * 2, got_low)
    assert_same_array(high * 2, got_high)
    assert_same_array(low, back)
    after = client.run(_read_counter)
    assert sum(a["loads"] - before[w]["loads"] for w, a in after.items()) >= 2  # scattered data
    assert sum(a["dumps"] - before[w]["dumps"] for w, a in after.items()) >= 3  # gathered results


def test_worker_to_worker_transfers(client):
    workers = sorted(client.scheduler_info()["workers"])
    [future] = client.scatter([np.arange(2_000_000)], workers=[workers[0]])
    before = client.run(_read_counter)
    total = client.submit(lambda a: int(a.sum()), future, workers=[workers[1]], allow_other_workers=False)
    assert total.result() == int(np.arange(2_000_000).sum())
    after = client.run(_read_counter)
    assert after[workers[0]]["dumps"] > before[workers[0]]["dumps"]  # sent with blpickle ...
    assert after[workers[1]]["loads"] > before[workers[1]]["loads"]  # ... received with blpickle
