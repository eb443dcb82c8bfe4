"""Many small tasks and small cached results through blpickle's integrations against the
defaults they replace, side by side in one run (and one big buffer of each, which must keep
its gain).

- multiprocessing (spawn, 2 workers): ``Pool.map`` with chunksize 1 and
  ``ProcessPoolExecutor.map`` of small tasks, with
  ``blpickle.integrations.multiprocessing.get_context()`` against the standard context.
- ``joblib.Parallel(n_jobs=2)`` of small tasks with ``blpickle.integrations.loky.enable()``
  against loky's default pickler (one pool, the pickler switched between samples: loky names
  it with every task).
- ``joblib.Memory(backend="blpickle")`` against joblib's default store: hits and misses of
  small results, and hits of a big array.
- dask.distributed, two ``LocalCluster``s of 2 worker processes on 127.0.0.1 (one with the
  ``"blpickle"`` family on its client and workers, one with dask's defaults): a graph of many
  small tasks, a task that combines all their results (fetched across workers), and every
  result gathered by the client; the family's ``serialize``/``deserialize`` round trip of
  one small result beside dask's default, for information.

Each figure is per sample (a batch of tasks or calls), over interleaved rounds: best and
median. Run on its own: ``python -m bench --section processes [--quick]``.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import logging
import multiprocessing
import shutil
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import joblib
import numpy as np

from blpickle.integrations import joblib as bl_joblib
from blpickle.integrations import loky as bl_loky
from blpickle.integrations import multiprocessing as bmp

from . import processes_bench
from .datasets import make_array
from .report import text_table
from .timing import compare, interleaved

METHOD = "spawn"
WORKERS = 2
#: Settings of a full and a quick run.
FULL = {"rounds": 7, "tasks": 10_000, "executor_tasks": 5_000, "cached": 200, "big_mb": 80, "dask_tasks": 1_000}
QUICK = {"rounds": 3, "tasks": 10_000, "executor_tasks": 2_000, "cached": 50, "big_mb": 8, "dask_tasks": 300}


# --- tasks (importable by spawned workers) -----------------------------------------------------


def small_task(i: int) -> int:
    """A task that costs nothing but its transfer."""
    return i + 1


def small_result(i: int) -> dict:
    """A small result: a few scalars, a string and a 10-element array."""
    return {"i": i, "name": f"result {i}", "score": i / 7, "values": np.arange(10.0) + i}


def combine(results: list[dict]) -> int:
    """A task that needs every small result."""
    return sum(r["i"] for r in results)


_BIG: dict[str, np.ndarray] = {}


def big_result(key: int) -> np.ndarray:
    """The big array of the run (computed once, outside)."""
    return _BIG["array"]


# --- multiprocessing and loky ------------------------------------------------------------------


@contextlib.contextmanager
def _pools() -> Iterator[dict[str, Any]]:
    """Label -> a running ``Pool`` of each context."""
    contexts = {"stdlib": multiprocessing.get_context(METHOD), "blpickle": bmp.get_context(METHOD)}
    with contextlib.ExitStack() as stack:
        yield {label: stack.enter_context(ctx.Pool(WORKERS)) for label, ctx in contexts.items()}


@contextlib.contextmanager
def _executors() -> Iterator[dict[str, Any]]:
    contexts = {"stdlib": multiprocessing.get_context(METHOD), "blpickle": bmp.get_context(METHOD)}
    with contextlib.ExitStack() as stack:
        yield {
            label: stack.enter_context(concurrent.futures.ProcessPoolExecutor(WORKERS, mp_context=ctx))
            for label, ctx in contexts.items()
        }


def _checked(expected: list, run: Callable[[], list]) -> Callable[[], None]:
    def call() -> None:
        if run() != expected:
            raise AssertionError("the tasks returned something else")

    return call


def _executor_map(executor: concurrent.futures.Executor, tasks: int) -> list:
    return list(executor.map(small_task, range(tasks)))


def measure_multiprocessing(tasks: int, executor_tasks: int, rounds: int) -> list[dict]:
    """Pool.map (chunksize 1) and ProcessPoolExecutor.map of small tasks, both contexts."""
    rows = []
    expected = [small_task(i) for i in range(tasks)]
    with _pools() as pools:
        calls = {
            label: _checked(expected, functools.partial(pool.map, small_task, range(tasks), chunksize=1))
            for label, pool in pools.items()
        }
        rows.append(compare("Pool.map (chunksize 1)", "small tasks", interleaved(calls, rounds, 0), "stdlib", tasks))
    expected = expected[:executor_tasks]
    with _executors() as executors:
        calls = {
            label: _checked(expected, functools.partial(_executor_map, executor, executor_tasks))
            for label, executor in executors.items()
        }
        times = interleaved(calls, rounds, 0)
        rows.append(compare("ProcessPoolExecutor.map", "small tasks", times, "stdlib", executor_tasks))
    return rows


def _with_loky(enabled: bool, run: Callable[[], Any]) -> Callable[[], Any]:
    def call() -> Any:
        (bl_loky.enable if enabled else bl_loky.disable)()
        return run()

    return call


def measure_loky(tasks: int, rounds: int) -> list[dict]:
    """joblib.Parallel of small tasks, loky's default pickler against blpickle's."""
    expected = [small_task(i) for i in range(tasks)]
    try:
        with joblib.Parallel(n_jobs=WORKERS) as parallel:

            def run() -> list:
                return parallel(joblib.delayed(small_task)(i) for i in range(tasks))

            calls = {
                "loky default": _checked(expected, _with_loky(False, run)),
                "blpickle": _checked(expected, _with_loky(True, run)),
            }
            times = interleaved(calls, rounds, 0)
    finally:
        bl_loky.disable()
    return [compare("joblib.Parallel (loky)", "small tasks", times, "loky default", tasks)]


# --- joblib.Memory ------------------------------------------------------------------------------


def _memories(directory: str) -> dict[str, joblib.Memory]:
    bl_joblib.register()
    return {
        "joblib store": joblib.Memory(f"{directory}/joblib", verbose=0),
        "blpickle": joblib.Memory(f"{directory}/blpickle", backend="blpickle", verbose=0),
    }


def _hits(cached: Any, count: int) -> None:
    for i in range(count):
        cached(i)


def measure_memory(cached_count: int, big_mb: int, rounds: int) -> list[dict]:
    """Memory hits and misses of ``cached_count`` small results, and hits of a big array."""
    directory = tempfile.mkdtemp(prefix="blpickle-memory-")
    try:
        memories = _memories(directory)
        small = {label: memory.cache(small_result) for label, memory in memories.items()}
        misses = {label: iter(range(cached_count, 1 << 62, cached_count)) for label in memories}

        def miss(label: str) -> None:
            start = next(misses[label])
            for i in range(start, start + cached_count):
                small[label](i)

        times = interleaved({label: functools.partial(miss, label) for label in memories}, rounds, 0)
        rows = [compare("joblib.Memory", "miss, small results", times, "joblib store", cached_count)]
        for cached in small.values():
            for i in range(cached_count):
                cached(i)
            loaded = cached(0)
            if loaded["name"] != "result 0" or not np.array_equal(loaded["values"], np.arange(10.0)):
                raise AssertionError("a cache hit returned something else")
        calls = {label: functools.partial(_hits, cached, cached_count) for label, cached in small.items()}
        times = interleaved(calls, rounds, 0)
        rows.append(compare("joblib.Memory", "hit, small results", times, "joblib store", cached_count))
        _BIG["array"] = make_array("medium", big_mb * 10**6 // 8)
        big = {label: memory.cache(big_result) for label, memory in memories.items()}
        for cached in big.values():
            cached(0)
            if not np.array_equal(cached(0), _BIG["array"]):
                raise AssertionError("a cache hit returned another array")
        times = interleaved({label: functools.partial(cached, 0) for label, cached in big.items()}, rounds, 0)
        rows.append(compare("joblib.Memory", f"hit, {big_mb} MB noisy float64", times, "joblib store", 1))
    finally:
        _BIG.clear()
        shutil.rmtree(directory, ignore_errors=True)
    return rows


# --- dask -----------------------------------------------------------------------------------------


@contextlib.contextmanager
def _dask_clients() -> Iterator[dict[str, Any]]:
    """Label -> a client of its own 2-process LocalCluster: dask's defaults, and blpickle's
    family on the client and (by the plugin) on the workers."""
    from distributed import Client, LocalCluster

    from blpickle.integrations import dask as bl_dask

    bl_dask.register()
    settings = {
        "processes": True,
        "n_workers": WORKERS,
        "threads_per_worker": 1,
        "host": "127.0.0.1",
        "dashboard_address": ":0",
        "worker_dashboard_address": None,
        "silence_logs": logging.CRITICAL,
    }
    families = {
        "dask default": {},
        "blpickle": {"serializers": bl_dask.SERIALIZERS, "deserializers": bl_dask.DESERIALIZERS},
    }
    with contextlib.ExitStack() as stack:
        clients = {}
        for label, serializers in families.items():
            cluster = stack.enter_context(LocalCluster(**settings))
            clients[label] = stack.enter_context(Client(cluster, set_as_default=False, **serializers))
        clients["blpickle"].register_plugin(bl_dask.WorkerPlugin())
        yield clients


def _dask_graph(client: Any, tasks: int) -> None:
    """Submit ``tasks`` small tasks and one that combines them, gather everything."""
    futures = client.map(small_result, range(tasks), pure=False)
    total = client.submit(combine, futures, pure=False)
    results = client.gather([*futures, total])
    if results[-1] != tasks * (tasks - 1) // 2 or results[0]["i"] != 0:
        raise AssertionError("the dask graph returned something else")


def _dask_round_trip(serializers: list[str] | None, deserializers: list[str] | None) -> Callable[[], Any]:
    from distributed.protocol import deserialize, serialize

    obj = small_result(1)

    def call() -> Any:
        header, frames = serialize(obj, serializers=serializers)
        return deserialize(header, frames, deserializers=deserializers)

    return call


def measure_dask(tasks: int, rounds: int) -> list[dict]:
    """The graph of small results on both clusters; the family's round trip of one result."""
    try:
        import distributed  # noqa: F401
    except ImportError:
        print("distributed is not installed: dask skipped")
        return []
    from blpickle.integrations import dask as bl_dask

    logging.getLogger("distributed").setLevel(logging.CRITICAL)
    with _dask_clients() as clients:
        calls = {label: functools.partial(_dask_graph, client, tasks) for label, client in clients.items()}
        times = interleaved(calls, rounds, 0)
    rows = [compare("dask graph (+1 combining task)", "small results", times, "dask default", tasks)]
    round_trips = {
        "dask default": _dask_round_trip(None, None),
        "blpickle": _dask_round_trip(bl_dask.SERIALIZERS, bl_dask.DESERIALIZERS),
    }
    times = interleaved(round_trips, rounds, 0.01)
    rows.append(compare("dask serialize+deserialize", "one small result (info)", times, "dask default"))
    return rows


# --- the section --------------------------------------------------------------------------------


def run(quick: bool) -> dict[str, list[dict]]:
    """Every row of the section, printed as tables once measured: ``"small"``, the rows of
    this module, and ``"big"``, those of `bench.processes_bench` for one big array."""
    settings = QUICK if quick else FULL
    rounds = settings["rounds"]
    started = time.perf_counter()
    warnings.simplefilter("ignore", DeprecationWarning)
    rows = measure_multiprocessing(settings["tasks"], settings["executor_tasks"], rounds)
    rows += measure_loky(settings["tasks"], rounds)
    rows += measure_memory(settings["cached"], settings["big_mb"], rounds)
    rows += measure_dask(settings["dask_tasks"], rounds)
    seconds = time.perf_counter() - started
    print(f"\nSmall tasks: blpickle's integrations vs the defaults, {rounds} interleaved rounds ({seconds:.0f} s)")
    print(text_table(table(rows)), flush=True)
    print(f"\nBig buffers ({processes_bench.METHOD}, 1 worker): stdlib -> blpickle, best of runs")
    big = processes_bench.run_multiprocessing([settings["big_mb"] * processes_bench.MB])
    return {"small": rows, "big": big}


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.0f}" if seconds >= 0.1 else f"{seconds * 1e3:.3g}"


def table(rows: list[dict]) -> list[tuple[str, ...]]:
    """Per-sample ms best (median) of each, and blpickle's relative speed."""
    lines: list[tuple[str, ...]] = [
        ("workload", "what", "count", "reference", "reference ms", "blpickle ms", "speed vs reference best (median)")
    ]
    for row in rows:
        ours, theirs = row["blpickle"], row["reference"]
        lines.append(
            (
                row["workload"],
                row["op"],
                f"{row['count']:,}",
                row["reference_name"],
                f"{_ms(theirs['min'])} ({_ms(theirs['median'])})",
                f"{_ms(ours['min'])} ({_ms(ours['median'])})",
                f"{row['speed_best']:.3g}x ({row['speed_median']:.3g}x)",
            )
        )
    return lines
