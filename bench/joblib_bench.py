"""blpickle with joblib: ``compress="blosc"`` against joblib's zlib and lz4, and ``Memory`` cache
hits with ``backend="blpickle"`` against joblib's own store.

Run ``python bench/joblib_bench.py`` (``--quick`` for small arrays); it prints two tables and
writes every figure of the run to ``bench/results/joblib.json``. Dumps are timed with an
``fsync`` of the file, loads with the file in the page cache (hot); each figure is the best of
``--repeat`` runs, as the machine is shared and timings are noisy.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import math
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import blosc2
import joblib
import numpy as np

import blpickle
from blpickle.integrations import joblib as blosc_joblib

blosc_joblib.register()  # the "blosc" compressor and the "blpickle" store backend

MB = 1e6
RESULTS = Path(__file__).resolve().parent / "results" / "joblib.json"

#: ``joblib.dump`` methods compared: label -> ``compress`` value.
DUMP_METHODS = {
    "joblib uncompressed": 0,
    "joblib zlib 3": ("zlib", 3),
    "joblib lz4": "lz4",
    "joblib blosc": "blosc",
}


def make_arrays(nbytes: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Arrays of ``nbytes`` each: a sine (period 1000) plus gaussian noise (sigma 0.1) as
    float64 and float32, and the same signal scaled to +-3000 as int16 samples."""
    rng = np.random.default_rng(seed)
    arrays = {}
    for name, dtype in (("float64", np.float64), ("float32", np.float32), ("int16", np.int16)):
        n = nbytes // np.dtype(dtype).itemsize
        signal = np.sin(np.arange(n) * (2 * math.pi / 1000)) + rng.normal(0, 0.1, n)
        arrays[name] = (signal * 3000).astype(dtype) if dtype is np.int16 else signal.astype(dtype)
    return arrays


def best_time(run: Callable[[], Any], repeat: int) -> float:
    """The fastest of ``repeat`` runs of ``run`` (garbage collector off while timing)."""
    times = []
    for _ in range(repeat):
        gc.collect()
        gc.disable()
        try:
            start = time.perf_counter()
            result = run()
            times.append(time.perf_counter() - start)
        finally:
            gc.enable()
        del result
    return min(times)


def fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def bench_dump_load(arrays: dict[str, np.ndarray], tmp: Path, repeat: int) -> list[dict]:
    """Ratio and dump/load speed of each method on each array."""
    rows = []
    for name, array in arrays.items():
        methods: dict[str, tuple[Callable[[Path], None], Callable[[Path], Any]]] = {
            label: (
                lambda path, compress=compress, array=array: joblib.dump(array, path, compress=compress),
                joblib.load,
            )
            for label, compress in DUMP_METHODS.items()
        }
        methods["blpickle.dump"] = (
            lambda path, array=array: blpickle.dump(array, path),
            blpickle.load,
        )
        for label, (dump, load) in methods.items():
            path = tmp / f"{name}.{label.replace(' ', '_')}"

            def dump_and_sync(path: Path = path, dump: Callable[[Path], None] = dump) -> None:
                dump(path)
                fsync(path)

            dump_time = best_time(dump_and_sync, repeat)
            load_time = best_time(lambda path=path, load=load: load(path), repeat)
            loaded = load(path)
            assert loaded.dtype == array.dtype, (name, label)
            assert np.array_equal(loaded, array), (name, label)
            del loaded
            size = path.stat().st_size
            rows.append(
                {
                    "array": name,
                    "method": label,
                    "nbytes": array.nbytes,
                    "file_bytes": size,
                    "ratio": array.nbytes / size,
                    "dump_s": dump_time,
                    "load_s": load_time,
                    "dump_MBps": array.nbytes / dump_time / MB,
                    "load_MBps": array.nbytes / load_time / MB,
                }
            )
            path.unlink()
            print(
                f"  {name:8s} {label:20s} ratio {rows[-1]['ratio']:6.2f}  "
                f"dump {rows[-1]['dump_MBps']:7.0f} MB/s  load {rows[-1]['load_MBps']:7.0f} MB/s",
                flush=True,
            )
    return rows


#: ``Memory`` configurations compared for a cache hit: label -> ``Memory`` keyword arguments.
CACHE_SETUPS = {
    "joblib store, uncompressed": {},
    "joblib store, compress=True (zlib 3)": {"compress": True},
    "joblib store, compress='lz4'": {"compress": "lz4"},
    "joblib store, compress='blosc'": {"compress": "blosc"},
    "joblib store, uncompressed, mmap_mode='r'": {"mmap_mode": "r"},
    "blpickle store, uncompressed": {"backend": "blpickle"},
    "blpickle store, compress=True (auto, level 1)": {"backend": "blpickle", "compress": True},
    "blpickle store, uncompressed, mmap_mode='r'": {"backend": "blpickle", "mmap_mode": "r"},
}
REFERENCE_SETUP = "joblib store, uncompressed"

_RESULT: dict[str, np.ndarray] = {}


def cached_result(key: int) -> dict[str, np.ndarray]:
    """The cached function: returns the arrays of the benchmark (computed once, outside)."""
    return dict(_RESULT)


def bench_cache_hits(arrays: dict[str, np.ndarray], tmp: Path, repeat: int) -> list[dict]:
    """Time of a ``Memory`` cache hit returning ``arrays`` with each store configuration."""
    _RESULT.clear()
    _RESULT.update(arrays)
    nbytes = sum(a.nbytes for a in arrays.values())
    rows = []
    for label, kwargs in CACHE_SETUPS.items():
        location = tmp / f"cache-{len(rows)}"
        memory = joblib.Memory(location, verbose=0, **kwargs)
        cached = memory.cache(cached_result)
        start = time.perf_counter()
        cached(0)  # computes and stores
        store_time = time.perf_counter() - start
        hit_time = best_time(lambda cached=cached: cached(0), repeat)
        result = cached(0)
        for name, array in arrays.items():
            assert np.array_equal(result[name], array), (label, name)
        del result
        size = sum(f.stat().st_size for f in location.rglob("output.pkl"))
        rows.append(
            {
                "setup": label,
                "memory_kwargs": {k: str(v) for k, v in kwargs.items()},
                "nbytes": nbytes,
                "stored_bytes": size,
                "ratio": nbytes / size,
                "store_s": store_time,
                "hit_s": hit_time,
                "hit_MBps": nbytes / hit_time / MB,
            }
        )
        print(
            f"  {label:46s} size {size / MB:7.1f} MB  hit {hit_time * 1e3:8.1f} ms ({rows[-1]['hit_MBps']:6.0f} MB/s)",
            flush=True,
        )
        memory.clear(warn=False)
        shutil.rmtree(location, ignore_errors=True)
    reference = next(r["hit_s"] for r in rows if r["setup"] == REFERENCE_SETUP)
    for row in rows:
        row["speedup_vs_joblib_uncompressed"] = reference / row["hit_s"]
    return rows


def summarize(dump_rows: list[dict], cache_rows: list[dict]) -> dict:
    """The comparisons the integration promises, from this run's figures."""

    def row(array: str, method: str) -> dict:
        return next(r for r in dump_rows if r["array"] == array and r["method"] == method)

    per_array = {}
    for array in dict.fromkeys(r["array"] for r in dump_rows):
        blosc = row(array, "joblib blosc")
        per_array[array] = {
            "blosc_ratio_vs_blpickle": blosc["ratio"] / row(array, "blpickle.dump")["ratio"],
            "blosc_ratio_vs_lz4": blosc["ratio"] / row(array, "joblib lz4")["ratio"],
            "blosc_dump_speedup_vs_zlib": row(array, "joblib zlib 3")["dump_s"] / blosc["dump_s"],
            "blosc_load_speedup_vs_zlib": row(array, "joblib zlib 3")["load_s"] / blosc["load_s"],
            "blosc_dump_speedup_vs_lz4": row(array, "joblib lz4")["dump_s"] / blosc["dump_s"],
            "blosc_load_speedup_vs_lz4": row(array, "joblib lz4")["load_s"] / blosc["load_s"],
        }
    hits = {r["setup"]: r["hit_s"] for r in cache_rows}
    fastest_joblib = min(t for s, t in hits.items() if s.startswith("joblib store") and "mmap" not in s)
    return {
        "per_array": per_array,
        "goals": {
            "blosc ratio >= 90% of blpickle.dump (float32, float64, int16)": all(
                v["blosc_ratio_vs_blpickle"] >= 0.9 for v in per_array.values()
            ),
            "blosc dump >= 10x joblib zlib": all(v["blosc_dump_speedup_vs_zlib"] >= 10 for v in per_array.values()),
            "blpickle store cache hit faster than joblib's store (uncompressed and compressed)": (
                hits["blpickle store, uncompressed"] < fastest_joblib
            ),
            "blpickle store mmap hit faster than joblib's store mmap hit": (
                hits["blpickle store, uncompressed, mmap_mode='r'"] < hits["joblib store, uncompressed, mmap_mode='r'"]
            ),
        },
    }


def print_tables(dump_rows: list[dict], cache_rows: list[dict], summary: dict) -> None:
    print("\njoblib.dump / joblib.load (dump includes fsync; hot load; best of runs)")
    print("| array    | method               |  ratio | dump MB/s | load MB/s |")
    print(f"|{'-' * 10}|{'-' * 22}|{'-' * 8}|{'-' * 11}|{'-' * 11}|")
    for r in dump_rows:
        print(
            f"| {r['array']:8s} | {r['method']:20s} | {r['ratio']:6.2f} | "
            f"{r['dump_MBps']:9.0f} | {r['load_MBps']:9.0f} |"
        )
    print("\ncompress='blosc' compared (this run)")
    print(
        "| array    | ratio vs blpickle.dump | ratio vs lz4 | dump vs zlib | load vs zlib | dump vs lz4 | load vs lz4 |"
    )
    print(f"|{'-' * 10}|{'-' * 24}|{'-' * 14}|{'-' * 14}|{'-' * 14}|{'-' * 13}|{'-' * 13}|")
    for array, v in summary["per_array"].items():
        print(
            f"| {array:8s} | {v['blosc_ratio_vs_blpickle']:22.3f} | "
            f"{v['blosc_ratio_vs_lz4']:12.2f} | "
            f"{v['blosc_dump_speedup_vs_zlib']:11.1f}x | "
            f"{v['blosc_load_speedup_vs_zlib']:11.1f}x | "
            f"{v['blosc_dump_speedup_vs_lz4']:10.1f}x | "
            f"{v['blosc_load_speedup_vs_lz4']:10.1f}x |"
        )
    nbytes = cache_rows[0]["nbytes"]
    print(f"\nMemory cache hit returning {nbytes / MB:.0f} MB of arrays (best of runs)")
    print(f"| {'setup':46s} | stored MB |   hit ms | hit MB/s | vs joblib uncompressed |")
    print(f"|{'-' * 48}|{'-' * 11}|{'-' * 10}|{'-' * 10}|{'-' * 24}|")
    for r in cache_rows:
        print(
            f"| {r['setup']:46s} | {r['stored_bytes'] / MB:9.1f} | {r['hit_s'] * 1e3:8.1f} | "
            f"{r['hit_MBps']:8.0f} | {r['speedup_vs_joblib_uncompressed']:21.2f}x |"
        )
    print("\ngoals:")
    for goal, met in summary["goals"].items():
        print(f"  [{'x' if met else ' '}] {goal}")


def environment() -> dict:
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None,
        "numpy": np.__version__,
        "blosc2": blosc2.__version__,
        "joblib": joblib.__version__,
        "blpickle": blpickle.__version__,
        "blosc_compressor_options": blosc_joblib.BloscCompressorWrapper().options.to_dict(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=float, default=80, help="size of each array in MB (default 80)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per timing; the best counts")
    parser.add_argument("--quick", action="store_true", help="8 MB arrays, 2 runs: a smoke test")
    parser.add_argument("--tmpdir", default=None, help="where to write the files (default: system temp)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="JSON file to write")
    args = parser.parse_args(argv)
    if args.quick:
        args.mb, args.repeat = 8, 2
    nbytes = int(args.mb * MB) // 8 * 8
    tmp = Path(tempfile.mkdtemp(prefix="blpickle-joblib-bench-", dir=args.tmpdir))
    try:
        arrays = make_arrays(nbytes)
        print(f"joblib.dump / load of {args.mb:g} MB arrays, best of {args.repeat}:", flush=True)
        dump_rows = bench_dump_load(arrays, tmp, args.repeat)
        print(f"Memory cache hits ({3 * args.mb:g} MB result), best of {args.repeat}:", flush=True)
        cache_rows = bench_cache_hits(arrays, tmp, args.repeat)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    summary = summarize(dump_rows, cache_rows)
    print_tables(dump_rows, cache_rows, summary)
    report = {
        "command": "python bench/joblib_bench.py" + (" " + " ".join(argv or sys.argv[1:])).rstrip(),
        "parameters": {"array_bytes": nbytes, "repeat": args.repeat},
        "environment": environment(),
        "dump_load": dump_rows,
        "cache_hits": cache_rows,
        "summary": summary,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
