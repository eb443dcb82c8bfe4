"""URLs through fsspec: dump, load, open and inspect on memory:// and on a real S3-compatible
server (moto's, started on loopback)."""

from __future__ import annotations

import pickle
import subprocess
import sys

import numpy as np
import pytest

import blpickle
from blpickle.io.remote import is_url

fsspec = pytest.importorskip("fsspec")


def _object() -> dict:
    rng = np.random.default_rng(5)
    return {"weights": rng.random(400_000), "ramp": np.arange(300_000).reshape(3000, 100), "text": "x" * 10}


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """A bucket on moto's S3 server, listening on a loopback port; yields its URL prefix."""
    pytest.importorskip("s3fs")
    server_module = pytest.importorskip("moto.server")
    server = server_module.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    previous = fsspec.config.conf.get("s3")
    fsspec.config.conf["s3"] = {
        "endpoint_url": f"http://{host}:{port}",
        "key": "testing",
        "secret": "testing",
        "client_kwargs": {"region_name": "us-east-1"},
    }
    boto3 = pytest.importorskip("boto3")
    client = boto3.client(
        "s3",
        endpoint_url=f"http://{host}:{port}",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        region_name="us-east-1",
    )
    client.create_bucket(Bucket="blpickle-test")
    yield "s3://blpickle-test"
    if previous is None:
        fsspec.config.conf.pop("s3", None)
    else:
        fsspec.config.conf["s3"] = previous
    server.stop()


@pytest.fixture(params=["memory", "s3"])
def base(request):
    if request.param == "memory":
        return "memory://blpickle-test"
    return request.getfixturevalue("s3")


def test_urls_are_told_from_paths():
    assert is_url("s3://bucket/key") and is_url("memory://x") and is_url("file:///tmp/x")
    assert not is_url("/tmp/x") and not is_url("C:\\x") and not is_url("relative/x.blp") and not is_url(b"s3://x")


def test_dump_load_inspect_and_open_a_url(base):
    obj = _object()
    url = f"{base}/record.blp"
    blpickle.dump(obj, url, chunk_size=1 << 18)
    loaded = blpickle.load(url)
    assert np.array_equal(loaded["weights"], obj["weights"]) and loaded["text"] == obj["text"]
    info = blpickle.inspect(url)
    assert [b.shape for b in info.buffers] == [(400_000,), (3000, 100)]
    with blpickle.open(url) as rec:
        assert rec.names == ("weights", "ramp")
        assert np.array_equal(rec["ramp"], obj["ramp"])
        assert np.array_equal(rec.lazy("ramp")[1000:1010], obj["ramp"][1000:1010])
        assert rec.info.globals == info.globals
        assert np.array_equal(rec.load(safe=True)["weights"], obj["weights"])


def test_open_fetches_only_the_header_trailer_and_the_array(base, monkeypatch):
    obj = _object()
    url = f"{base}/ranges.blp"
    blpickle.dump(obj, url, chunk_size=1 << 18)
    fs, path = fsspec.core.url_to_fs(url)
    size = fs.size(path)
    fetched: list[int] = []
    calls: list[int] = []
    cat_ranges = fs.cat_ranges

    def counting(paths, starts, ends, **kwargs):
        calls.append(len(paths))
        fetched.extend(end - start for start, end in zip(starts, ends, strict=True))
        return cat_ranges(paths, starts, ends, **kwargs)

    monkeypatch.setattr(fs, "cat_ranges", counting)  # the file system's instance is shared
    with blpickle.open(url) as rec:
        opened = sum(fetched)
        assert calls == [2]  # one request for both ends of the record
        info = rec.arrays[rec.names.index("ramp")]
        # the size field (and Blosc2 sizes) of every chunk up to the array's last, checked first
        heads = [8 + (0 if s.raw else 16) for s in rec.header.streams[: info.position + 2] for _ in range(s.nchunks)]
        assert np.array_equal(rec["ramp"], obj["ramp"])
    assert calls == [2, len(heads), info.nchunks]  # the heads in one request, the array's frames in one
    assert opened <= 2 * 65536
    assert sum(fetched) - opened == info.stored + 16 * info.nchunks + sum(heads)
    assert sum(fetched) < size / 3  # the random weights make most of the record


def test_a_failed_dump_leaves_the_previous_object(s3):
    """(memory:// writes in place: its files cannot be left uncommitted.)"""
    url = f"{s3}/kept.blp"
    blpickle.dump({"v": 1}, url)
    with pytest.raises((pickle.PicklingError, AttributeError)):
        blpickle.dump({"v": 2, "f": lambda: None}, url)
    assert blpickle.load(url) == {"v": 1}


def test_a_missing_object_raises_file_not_found(base):
    with pytest.raises(FileNotFoundError):
        blpickle.open(f"{base}/missing.blp")
    with pytest.raises(FileNotFoundError):
        blpickle.load(f"{base}/missing.blp")


def test_importing_blpickle_does_not_import_fsspec():
    code = "import sys, blpickle; blpickle.dumps(1); assert 'fsspec' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_joblib_memory_store_at_a_url(base):
    joblib = pytest.importorskip("joblib")
    from blpickle.integrations import fsspec_store

    fsspec_store.register()
    calls: list[int] = []
    memory = joblib.Memory(f"{base}/cache", backend="blpickle-fsspec", verbose=0)

    def compute(n):
        calls.append(n)
        return {"a": np.arange(n, dtype=np.float64)}

    cached = memory.cache(compute)
    assert np.array_equal(cached(100_000)["a"], np.arange(100_000.0))
    assert np.array_equal(cached(100_000)["a"], np.arange(100_000.0))
    assert calls == [100_000]  # the second call read the store
    (item,) = memory.store_backend.get_items()
    output = f"{item.path}/output.pkl"
    assert blpickle.inspect(output).buffers[0].shape == (100_000,)  # a blpickle record
    assert item.size > 0
    memory.reduce_size(items_limit=0)
    assert memory.store_backend.get_items() == []
    cached(100_000)
    assert calls == [100_000, 100_000]
    memory.clear(warn=False)
    assert memory.store_backend.get_items() == []


def test_the_url_store_reports_missing_and_damaged_results_as_joblib_expects(base):
    pytest.importorskip("joblib")
    from blpickle.integrations import fsspec_store
    from blpickle.integrations.joblib import CorruptItemError

    store = fsspec_store.FsspecStoreBackend()
    store.configure(f"{base}/store", verbose=0)
    with pytest.raises(KeyError):
        store.load_item(["f", "0" * 32])
    store.dump_item(["f", "1" * 32], {"a": np.arange(100_000.0)}, verbose=0)
    path = f"{base}/store/f/{'1' * 32}/output.pkl"
    fs, inner = fsspec_store.filesystem(path)
    data = bytearray(fs.cat_file(inner))
    data[len(data) // 2] ^= 0xFF
    fs.pipe_file(inner, bytes(data))
    with pytest.raises(CorruptItemError):
        store.load_item(["f", "1" * 32])


def test_the_url_store_refuses_joblib_compression_and_memory_maps():
    joblib = pytest.importorskip("joblib")
    from blpickle.integrations import fsspec_store

    fsspec_store.register()
    with pytest.raises(blpickle.OptionsError, match="compress= or mmap_mode="):
        joblib.Memory("memory://blpickle-test/refused", backend="blpickle-fsspec", mmap_mode="r")
