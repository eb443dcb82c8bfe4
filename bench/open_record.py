"""blpickle.open against loading the whole record: one array out of a large record, and a
slice of rows out of a large compressed array, side by side.

    python -m bench.open_record [--record-mb 1024] [--array-mb 800] [--repeat 3] [--s3-mb 0]
                                [--s3-endpoint URL [--s3-server NAME]] [--json PATH]

Each measurement alternates the two ways (open and read, load whole) ``--repeat`` times and
keeps the best time of each; memory is the peak of Python and numpy allocations
(tracemalloc) while reading. With ``--s3-mb N`` the first comparison also runs on a record
of N MB on an S3 server: by default moto's, started on loopback in this process (moto
answers a range request in a time that grows with the object's size, about 6 ms per MB, and
its allocations count in the memory figure: there it measures request counts, not S3's
speed); with ``--s3-endpoint URL``, the S3-compatible server at that URL (``--s3-server``
names it in the table and the JSON), with the credentials in ``AWS_ACCESS_KEY_ID`` and
``AWS_SECRET_ACCESS_KEY`` and the bucket ``blpickle-bench`` (created if missing; the
benchmark's objects are deleted at the end). The S3 server also times dumping the record to
and loading it from a URL against a local file followed by boto3's ``upload_file``
(preceded by its ``download_file``), interleaved ``--repeat`` rounds after one warm-up, best
and median. Writes ``--json`` (default ``bench/results/open_record.json``), which names the
S3 server used.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import tempfile
import tracemalloc
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

import blpickle

from .timing import compare, interleaved

MB = 1 << 20
ARRAY_MB = 8
RESULTS = os.path.join(os.path.dirname(__file__), "results", "open_record.json")
BUCKET = "blpickle-bench"


def _arrays(total_mb: int) -> dict[str, np.ndarray]:
    """Arrays of 8 MB of noisy but compressible values, ``total_mb`` in all."""
    rng = np.random.default_rng(0)
    count = max(total_mb // ARRAY_MB, 2)
    base = np.cumsum(rng.integers(-50, 51, ARRAY_MB * MB // 8)).astype(np.float64)
    return {f"a{i:04d}": base + i for i in range(count)}


def _peak(fn: Callable[[], Any]) -> int:
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def one_array(url: str, obj: dict[str, np.ndarray], repeat: int, where: str) -> dict[str, Any]:
    """Read one 8 MB array of the record at ``url`` vs loading the record."""
    name = sorted(obj)[len(obj) // 2]

    def read_one() -> np.ndarray:
        with blpickle.open(url) as rec:
            return rec[name]

    assert np.array_equal(read_one(), obj[name])
    case = f"one 8 MB array of a {sum(a.nbytes for a in obj.values()) // MB} MB record ({where})"
    return _against_load(case, read_one, url, repeat)


def row_slice(path: str, array: np.ndarray, repeat: int) -> dict[str, Any]:
    """Read 1,000 rows of a large compressed array vs loading it whole."""
    middle = array.shape[0] // 2

    def read_rows() -> np.ndarray:
        with blpickle.open(path) as rec:
            return rec.lazy("array")[middle : middle + 1000]

    assert np.array_equal(read_rows(), array[middle : middle + 1000])
    return _against_load(f"1,000 rows of a {array.nbytes // MB} MB array {array.shape} (disk)", read_rows, path, repeat)


def _against_load(case: str, read: Callable[[], Any], url: str, repeat: int) -> dict[str, Any]:
    """The row of ``case``: the best times of ``read`` and of loading the record at ``url``,
    in interleaved rounds, the speedup, and the peak memory of ``read``."""
    times = interleaved({"open": read, "load": lambda: blpickle.load(url)}, repeat, 0.0)
    fast, slow = times["open"]["min"], times["load"]["min"]
    return {"case": case, "open_s": fast, "load_s": slow, "speedup": slow / fast, "open_peak_mb": _peak(read) / MB}


def s3_transfer(url: str, client: Any, obj: dict[str, np.ndarray], path: str, repeat: int, where: str) -> list[dict]:
    """Dump to and load from the S3 ``url`` vs a local file and boto3's ``upload_file`` /
    ``download_file`` (the goal: within 1.5x, a ``speed`` of at least 1 / 1.5)."""
    bucket, key = url.removeprefix("s3://").split("/", 1)
    copy = f"{key}.boto3"

    def dump_upload() -> None:
        blpickle.dump(obj, path)
        client.upload_file(path, bucket, copy)

    def download_load() -> Any:
        client.download_file(bucket, copy, path)
        return blpickle.load(path)

    dumps = interleaved({"blpickle": lambda: blpickle.dump(obj, url), "boto3": dump_upload}, repeat, 0.0)
    assert all(np.array_equal(a, obj[k]) for k, a in blpickle.load(url).items())
    loads = interleaved({"blpickle": lambda: blpickle.load(url), "boto3": download_load}, repeat, 0.0)
    workload = f"{sum(a.nbytes for a in obj.values()) // MB} MB record, {where}"
    return [compare(workload, "dump", dumps, "boto3"), compare(workload, "load", loads, "boto3")]


@contextlib.contextmanager
def _moto() -> Iterator[str]:
    """Run moto's S3 server on loopback; yields its endpoint URL."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        yield f"http://{host}:{port}"
    finally:
        server.stop()


@contextlib.contextmanager
def _s3_record(endpoint: str, obj: dict[str, np.ndarray]) -> Iterator[tuple[Any, str]]:
    """Dump ``obj`` to the S3 server at ``endpoint`` (creating the bucket if missing); yields
    a boto3 client and the record's URL, and deletes the benchmark's objects on exit."""
    import boto3
    import fsspec

    key = os.environ.get("AWS_ACCESS_KEY_ID", "bench")
    secret = os.environ.get("AWS_SECRET_ACCESS_KEY", "bench")
    fsspec.config.conf["s3"] = {"endpoint_url": endpoint, "key": key, "secret": secret}
    client = boto3.client(
        "s3", endpoint_url=endpoint, aws_access_key_id=key, aws_secret_access_key=secret, region_name="us-east-1"
    )
    if BUCKET not in {bucket["Name"] for bucket in client.list_buckets()["Buckets"]}:
        client.create_bucket(Bucket=BUCKET)
    url = f"s3://{BUCKET}/record.blp"
    try:
        blpickle.dump(obj, url)
        yield client, url
    finally:
        for item in client.list_objects_v2(Bucket=BUCKET, Prefix="record.blp").get("Contents", []):
            client.delete_object(Bucket=BUCKET, Key=item["Key"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--record-mb", type=int, default=1024)
    parser.add_argument("--array-mb", type=int, default=800)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--s3-mb", type=int, default=0)
    parser.add_argument("--s3-endpoint", help="an S3-compatible server's URL instead of moto's")
    parser.add_argument("--s3-server", default="S3", help="what serves --s3-endpoint (a label)")
    parser.add_argument("--json", default=RESULTS, help="where to write the results")
    args = parser.parse_args()
    if args.s3_endpoint and not args.s3_mb:
        parser.error("--s3-endpoint needs --s3-mb (the size of the record stored there)")
    rows = []
    with tempfile.TemporaryDirectory() as directory:
        obj = _arrays(args.record_mb)
        path = os.path.join(directory, "record.blp")
        blpickle.dump(obj, path)
        rows.append(one_array(path, obj, args.repeat, "disk"))
        del obj
        os.remove(path)
        columns = 1000
        array = np.cumsum(
            np.random.default_rng(1).integers(-50, 51, (args.array_mb * MB // 8 // columns, columns)), axis=0
        ).astype(np.float64)
        blpickle.dump({"array": array}, path)
        rows.append(row_slice(path, array, args.repeat))
        del array
    transfers = []
    where = f"{args.s3_server} at {args.s3_endpoint}" if args.s3_endpoint else "moto S3 on loopback"
    if args.s3_mb:
        obj = _arrays(args.s3_mb)
        server = contextlib.nullcontext(args.s3_endpoint) if args.s3_endpoint else _moto()
        with server as endpoint, _s3_record(endpoint, obj) as (client, url):
            rows.append(one_array(url, obj, args.repeat, where))
            with tempfile.TemporaryDirectory() as directory:
                path = os.path.join(directory, "record.blp")
                transfers = s3_transfer(url, client, obj, path, args.repeat, where)
    print(f"{'case':<72} {'open':>8} {'load':>8} {'speedup':>8} {'peak MB':>8}")
    for row in rows:
        print(
            f"{row['case']:<72} {row['open_s']:>7.3f}s {row['load_s']:>7.3f}s "
            f"{row['speedup']:>7.1f}x {row['open_peak_mb']:>8.1f}"
        )
    if transfers:
        print(f"\n{'to/from a URL vs a local file + boto3':<72} {'blpickle':>17} {'boto3':>17} {'boto3/ours':>11}")
        for row in transfers:
            ours, theirs = row["blpickle"], row["reference"]
            print(
                f"{row['op'] + ' ' + row['workload']:<72} {ours['min']:>7.3f}s/{ours['median']:>7.3f}s "
                f"{theirs['min']:>7.3f}s/{theirs['median']:>7.3f}s "
                f"{row['speed_best']:>5.2f}/{row['speed_median']:>5.2f}"
            )
        print("best/median; the goal (within 1.5x) is met at boto3/ours >= 0.67")
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as file:
        json.dump(
            {
                "args": {name: value for name, value in vars(args).items() if name != "json"},
                "cpus": os.cpu_count(),
                "s3_server": where if args.s3_mb else None,
                "rows": rows,
                "s3_transfer": transfers,
            },
            file,
            indent=1,
        )


if __name__ == "__main__":
    main()
