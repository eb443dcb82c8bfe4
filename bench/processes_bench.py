"""Shipping big arrays to other processes: the standard library and loky/dask defaults against
blpickle's integrations, side by side in one run.

- multiprocessing ``Pool.map`` and ``concurrent.futures.ProcessPoolExecutor`` (spawn, one
  worker): a *send* (the worker returns the array's size) and a *round trip* (the worker
  returns the array), with the standard context and with
  ``blpickle.integrations.multiprocessing.get_context``; peak memory of parent and worker per
  round trip (RSS high-water mark reset before each transfer, minus the RSS before it).
- ``joblib.Parallel`` (loky, one task of a 2-worker pool returning its argument) with loky's
  default pickler and with ``blpickle.integrations.loky.enable()``, with joblib's
  auto-memmapping (default ``max_nbytes="1M"``) and without (``max_nbytes=None``).
- dask.distributed on a ``LocalCluster`` of one worker process on 127.0.0.1: ``scatter`` then
  ``gather`` (direct), with dask's default serializers and with the ``"blpickle"`` family;
  time and bytes sent over loopback.

Data: compressible (``arange`` int64) and random (uniform float64) arrays. Goals checked:
blpickle at least 1.5x faster than the standard library on compressible data and never more
than 10% slower on random data (Pool and executor, send and round trip).

Run: ``python bench/processes_bench.py [--quick]``; writes ``bench/results/processes.json``.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import functools
import gc
import json
import logging
import multiprocessing
import os
import platform
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

import blpickle
from blpickle.integrations import multiprocessing as bmp

MB = 10**6
FULL_SIZES = [8 * MB, 64 * MB, 256 * MB, 1000 * MB]
QUICK_SIZES = [8 * MB, 64 * MB]
DATASETS = ("compressible", "random")
METHOD = "spawn"
GOAL_SPEEDUP = 1.5
GOAL_MAX_SLOWDOWN = 1.10
HERE = os.path.dirname(os.path.abspath(__file__))


def make_array(kind: str, nbytes: int) -> np.ndarray:
    count = nbytes // 8
    if kind == "compressible":
        return np.arange(count, dtype=np.int64)
    return np.random.default_rng(0).random(count)


def repeats_for(nbytes: int) -> int:
    """Runs per timing (the best is kept): this 2-core machine is noisy."""
    if nbytes <= 64 * MB:
        return 5
    return 3 if nbytes <= 256 * MB else 2


# --- worker functions (importable by spawned children as __mp_main__) ------------------------------


def size_of(array: np.ndarray) -> int:
    return array.nbytes


def identity(array: Any) -> Any:
    return array


# --- measuring -----------------------------------------------------------------------------------


def _status(pid: int, field: str) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


@contextlib.contextmanager
def peak_memory(pids: dict[str, int]) -> Iterator[dict[str, float | None]]:
    """Yield a dict filled, on exit, with each process's extra peak RSS in bytes during the
    block (Linux: reset the high-water mark through /proc/PID/clear_refs, then read VmHWM)."""
    before: dict[str, int | None] = {}
    for name, pid in pids.items():
        try:
            with open(f"/proc/{pid}/clear_refs", "w") as refs:
                refs.write("5")
            before[name] = _status(pid, "VmRSS")
        except OSError:
            before[name] = None
    out: dict[str, float | None] = {}
    yield out
    for name, pid in pids.items():
        peak = _status(pid, "VmHWM")
        out[name] = None if peak is None or before[name] is None else float(max(peak - before[name], 0))


def best_time(fn: Callable[[], Any], repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        gc.collect()
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def check_same(expected: np.ndarray, actual: Any) -> None:
    if not (isinstance(actual, np.ndarray) and actual.dtype == expected.dtype and np.array_equal(actual, expected)):
        raise AssertionError("the array came back different")


# --- multiprocessing -----------------------------------------------------------------------------


def bench_pool(ctx: Any, array: np.ndarray, repeats: int) -> dict[str, Any]:
    with ctx.Pool(1) as pool:
        pool.map(identity, [np.arange(10)])  # the worker is up and has imported everything
        worker = pool._pool[0].pid
        send = best_time(lambda: pool.map(size_of, [array]), repeats)
        trip = best_time(lambda: pool.map(identity, [array]), repeats)
        with peak_memory({"parent": os.getpid(), "worker": worker}) as peaks:
            result = pool.map(identity, [array])[0]
        check_same(array, result)
    return {
        "send_s": send,
        "round_trip_s": trip,
        "peak_parent_bytes": peaks["parent"],
        "peak_worker_bytes": peaks["worker"],
    }


def bench_executor(ctx: Any, array: np.ndarray, repeats: int) -> dict[str, Any]:
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=ctx) as executor:
        executor.submit(identity, np.arange(10)).result()
        worker = next(iter(executor._processes))
        send = best_time(lambda: executor.submit(size_of, array).result(), repeats)
        trip = best_time(lambda: executor.submit(identity, array).result(), repeats)
        with peak_memory({"parent": os.getpid(), "worker": worker}) as peaks:
            result = executor.submit(identity, array).result()
        check_same(array, result)
    return {
        "send_s": send,
        "round_trip_s": trip,
        "peak_parent_bytes": peaks["parent"],
        "peak_worker_bytes": peaks["worker"],
    }


def run_multiprocessing(sizes: list[int]) -> list[dict[str, Any]]:
    contexts = {"stdlib": multiprocessing.get_context(METHOD), "blpickle": bmp.get_context(METHOD)}
    rows = []
    for transport, bench in (("Pool.map", bench_pool), ("ProcessPoolExecutor", bench_executor)):
        for kind in DATASETS:
            for nbytes in sizes:
                array = make_array(kind, nbytes)
                row: dict[str, Any] = {"transport": transport, "data": kind, "nbytes": nbytes}
                for name, ctx in contexts.items():
                    row[name] = bench(ctx, array, repeats_for(nbytes))
                for op in ("send_s", "round_trip_s"):
                    row[f"speedup_{op[:-2]}"] = row["stdlib"][op] / row["blpickle"][op]
                rows.append(row)
                print_mp_row(row)
                del array
    return rows


# --- loky / joblib -------------------------------------------------------------------------------


def run_loky(sizes: list[int]) -> list[dict[str, Any]]:
    try:
        from joblib import Parallel, delayed

        from blpickle.integrations import loky as bl_loky
    except ImportError:
        print("joblib is not installed: loky skipped")
        return []
    rows = []
    for max_nbytes in ("1M", None):
        for kind in DATASETS:
            for nbytes in sizes:
                array = make_array(kind, nbytes)
                row: dict[str, Any] = {"max_nbytes": max_nbytes, "data": kind, "nbytes": nbytes}
                for name in ("default", "blpickle"):
                    (bl_loky.enable if name == "blpickle" else bl_loky.disable)()
                    with Parallel(n_jobs=2, max_nbytes=max_nbytes) as parallel:
                        parallel(delayed(identity)(a) for a in [np.arange(10)] * 8)  # both workers warm
                        task = [delayed(identity)(array)]
                        seconds = best_time(functools.partial(parallel, task), repeats_for(nbytes))
                        check_same(array, parallel(task)[0])
                    row[name] = {"round_trip_s": seconds}
                bl_loky.disable()
                row["speedup"] = row["default"]["round_trip_s"] / row["blpickle"]["round_trip_s"]
                rows.append(row)
                print(
                    f"  loky max_nbytes={max_nbytes!s:4s} {kind:12s} {nbytes / MB:6.0f} MB  "
                    f"default {row['default']['round_trip_s'] * 1e3:8.1f} ms  blpickle {row['blpickle']['round_trip_s'] * 1e3:8.1f} ms  "
                    f"x{row['speedup']:.2f}"
                )
                del array
    return rows


# --- dask ----------------------------------------------------------------------------------------


def _lo_bytes_sent() -> int | None:
    try:
        import psutil

        return psutil.net_io_counters(pernic=True)["lo"].bytes_sent
    except (ImportError, KeyError):
        return None


def run_dask(sizes: list[int]) -> list[dict[str, Any]]:
    try:
        from distributed import Client, LocalCluster

        from blpickle.integrations import dask as bl_dask
    except ImportError:
        print("distributed is not installed: dask skipped")
        return []
    logging.getLogger("distributed").setLevel(logging.ERROR)
    bl_dask.register()
    rows = []
    with LocalCluster(
        processes=True,
        n_workers=1,
        threads_per_worker=1,
        host="127.0.0.1",
        dashboard_address=None,
        worker_dashboard_address=None,
    ) as cluster:
        clients = {
            "dask default": Client(cluster, set_as_default=False),
            "blpickle": Client(
                cluster, serializers=bl_dask.SERIALIZERS, deserializers=bl_dask.DESERIALIZERS, set_as_default=False
            ),
        }
        clients["blpickle"].register_plugin(bl_dask.WorkerPlugin())
        try:
            for kind in DATASETS:
                for nbytes in sizes:
                    array = make_array(kind, nbytes)
                    row: dict[str, Any] = {"data": kind, "nbytes": nbytes}
                    runs: dict[str, list] = {name: [] for name in clients}
                    for _ in range(max(repeats_for(nbytes), 5)):  # interleaved: the noise hits both alike
                        for name, client in clients.items():
                            runs[name].append(_dask_transfer(client, array))
                    for name, measured in runs.items():
                        row[name] = {
                            "scatter_s": min(m["scatter_s"] for m in measured),
                            "gather_s": min(m["gather_s"] for m in measured),
                            "wire_bytes": measured[-1]["wire_bytes"],
                        }
                    row["speedup_scatter"] = row["dask default"]["scatter_s"] / row["blpickle"]["scatter_s"]
                    row["speedup_gather"] = row["dask default"]["gather_s"] / row["blpickle"]["gather_s"]
                    rows.append(row)
                    d, b = row["dask default"], row["blpickle"]
                    print(
                        f"  dask {kind:12s} {nbytes / MB:6.0f} MB  scatter {d['scatter_s'] * 1e3:7.1f} -> {b['scatter_s'] * 1e3:7.1f} ms "
                        f"(x{row['speedup_scatter']:.2f})  gather {d['gather_s'] * 1e3:7.1f} -> {b['gather_s'] * 1e3:7.1f} ms "
                        f"(x{row['speedup_gather']:.2f})  on loopback {_mb(d['wire_bytes'])} -> {_mb(b['wire_bytes'])} MB"
                    )
                    del array
        finally:
            for client in clients.values():
                client.close()
    return rows


def _mb(value: float | None) -> str:
    return "n/a" if value is None else f"{value / MB:.1f}"


def _dask_transfer(client: Any, array: np.ndarray) -> dict[str, Any]:
    """Scatter ``array`` to the worker and gather it back; seconds of each, and the bytes sent
    over loopback by both (all processes of the cluster run here)."""
    gc.collect()
    sent0 = _lo_bytes_sent()
    start = time.perf_counter()
    future = client.scatter(array, direct=True, hash=False)  # returns once the worker has it
    scatter = time.perf_counter() - start
    start = time.perf_counter()
    result = client.gather(future, direct=True)
    gather = time.perf_counter() - start
    sent1 = _lo_bytes_sent()
    check_same(array, result)
    del result, future
    time.sleep(0.1)  # let the worker release the data
    return {"scatter_s": scatter, "gather_s": gather, "wire_bytes": None if sent0 is None else sent1 - sent0}


# --- report --------------------------------------------------------------------------------------


def print_mp_row(row: dict[str, Any]) -> None:
    s, b = row["stdlib"], row["blpickle"]
    size = row["nbytes"]

    def peak(value: float | None) -> str:
        return "  n/a" if value is None else f"{value / size:5.2f}"

    print(
        f"  {row['transport']:19s} {row['data']:12s} {size / MB:6.0f} MB  send {s['send_s'] * 1e3:8.1f} -> {b['send_s'] * 1e3:7.1f} ms "
        f"(x{row['speedup_send']:5.2f})  round trip {s['round_trip_s'] * 1e3:8.1f} -> {b['round_trip_s'] * 1e3:7.1f} ms "
        f"(x{row['speedup_round_trip']:5.2f})  peak parent/worker (x size) {peak(s['peak_parent_bytes'])}/{peak(s['peak_worker_bytes'])} -> "
        f"{peak(b['peak_parent_bytes'])}/{peak(b['peak_worker_bytes'])}"
    )


def check_goals(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    goals = []
    for row in rows:
        for op in ("send", "round_trip"):
            speedup = row[f"speedup_{op}"]
            if row["data"] == "compressible":
                ok, goal = speedup >= GOAL_SPEEDUP, f">= {GOAL_SPEEDUP}x faster"
            else:
                ok, goal = speedup >= 1 / GOAL_MAX_SLOWDOWN, f"<= {GOAL_MAX_SLOWDOWN - 1:.0%} slower"
            goals.append(
                {
                    "transport": row["transport"],
                    "data": row["data"],
                    "nbytes": row["nbytes"],
                    "op": op,
                    "speedup": speedup,
                    "goal": goal,
                    "met": ok,
                }
            )
    return goals


def markdown(results: dict[str, Any]) -> str:
    """The tables of docs/multiprocessing.md and docs/dask.md, from a saved run."""
    lines = [
        f"Command: `{results['command']}` ({results['machine']['cpus']} CPUs, Python {results['machine']['python']}).",
        "",
    ]

    def ms(seconds: float) -> str:
        return f"{seconds * 1e3:,.0f}" if seconds >= 0.1 else f"{seconds * 1e3:.1f}"

    def peak(value: float | None, size: int) -> str:
        return "n/a" if value is None else f"{value / size:.2f}"

    if results.get("multiprocessing"):
        lines += [
            "| transport | data | size | send ms stdlib → blpickle | × | round trip ms stdlib → blpickle | × | extra peak parent / worker (× size) stdlib → blpickle |",
            "|---|---|---:|---:|---:|---:|---:|---|",
        ]
        for row in results["multiprocessing"]:
            s, b, size = row["stdlib"], row["blpickle"], row["nbytes"]
            lines.append(
                f"| {row['transport']} | {row['data']} | {size / MB:.0f} MB | {ms(s['send_s'])} → {ms(b['send_s'])} | {row['speedup_send']:.1f} "
                f"| {ms(s['round_trip_s'])} → {ms(b['round_trip_s'])} | {row['speedup_round_trip']:.1f} "
                f"| {peak(s['peak_parent_bytes'], size)} / {peak(s['peak_worker_bytes'], size)} → {peak(b['peak_parent_bytes'], size)} / {peak(b['peak_worker_bytes'], size)} |"
            )
        lines.append("")
    if results.get("loky"):
        lines += [
            "| max_nbytes | data | size | round trip ms loky default → blpickle | × |",
            "|---|---|---:|---:|---:|",
        ]
        for row in results["loky"]:
            lines.append(
                f"| {row['max_nbytes']} | {row['data']} | {row['nbytes'] / MB:.0f} MB | {ms(row['default']['round_trip_s'])} → {ms(row['blpickle']['round_trip_s'])} | {row['speedup']:.1f} |"
            )
        lines.append("")
    if results.get("dask"):
        lines += [
            "| data | size | scatter ms default → blpickle | × | gather ms default → blpickle | × | MB on loopback (both ways) default → blpickle |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        for row in results["dask"]:
            d, b = row["dask default"], row["blpickle"]
            lines.append(
                f"| {row['data']} | {row['nbytes'] / MB:.0f} MB | {ms(d['scatter_s'])} → {ms(b['scatter_s'])} | {row['speedup_scatter']:.2f} "
                f"| {ms(d['gather_s'])} → {ms(b['gather_s'])} | {row['speedup_gather']:.2f} | {_mb(d['wire_bytes'])} → {_mb(b['wire_bytes'])} |"
            )
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="8 and 64 MB only")
    parser.add_argument("--only", choices=["multiprocessing", "loky", "dask"], nargs="*", help="run only these parts")
    parser.add_argument("--out", default=os.path.join(HERE, "results", "processes.json"))
    parser.add_argument("--markdown", metavar="JSON", help="print the Markdown tables of a saved run and exit")
    args = parser.parse_args(argv)
    if args.markdown:
        with open(args.markdown) as saved:
            print(markdown(json.load(saved)))
        return 0
    warnings.simplefilter("ignore", DeprecationWarning)
    sizes = QUICK_SIZES if args.quick else FULL_SIZES
    parts = args.only or ["multiprocessing", "loky", "dask"]
    started = time.time()
    results: dict[str, Any] = {
        "command": "python bench/processes_bench.py" + (" --quick" if args.quick else ""),
        "machine": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "blpickle": blpickle.__version__,
        },
        "start_method": METHOD,
        "blpickle_options": repr(bmp.get_context(METHOD).wire_options),
    }
    if "multiprocessing" in parts:
        print(f"multiprocessing ({METHOD}, 1 worker): stdlib -> blpickle, best of {repeats_for(0)}")
        results["multiprocessing"] = run_multiprocessing(sizes)
        results["goals"] = check_goals(results["multiprocessing"])
    if "loky" in parts:
        print("joblib.Parallel(n_jobs=2), one task returning its argument: loky default -> blpickle")
        results["loky"] = run_loky(sizes)
    if "dask" in parts:
        print("dask LocalCluster (1 worker process, 127.0.0.1): default serializers -> blpickle family")
        results["dask"] = run_dask(sizes)
    results["seconds"] = time.time() - started
    if "goals" in results:
        print("\nGoals (multiprocessing, vs stdlib):")
        for goal in results["goals"]:
            print(
                f"  {'met ' if goal['met'] else 'MISSED'} {goal['transport']:19s} {goal['data']:12s} {goal['nbytes'] / MB:6.0f} MB {goal['op']:10s} x{goal['speedup']:.2f} ({goal['goal']})"
            )
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as out:
        json.dump(results, out, indent=1)
    print(f"\nwrote {args.out} ({results['seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
