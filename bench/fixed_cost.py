"""What every record costs whatever it holds: small objects through blpickle's default against
C pickle (protocol 5), side by side in one run.

Workloads: ``{"a": 1}`` round trip (``loads(dumps(obj))``) and its size; a list of 1,000 ints,
a list of 100 small dicts and 200 arrays of 800 bytes, round trip; a fitted 100-tree random
forest dumped to and loaded from a path (page cache hot), and dumped to an open file; a small
dict of arrays dumped to a path in a directory of `CROWD` files. Neither
side of a dump to a path fsyncs: ``blpickle.dump(obj, path)`` writes a temporary file and
renames it over the path (`blpickle.io.files`), pickle's side opens, dumps and closes
(`bench.contenders.pickle_dump_path`); the dump to an open file compares the serializers alone. Each sample times a loop of calls long enough to be measured
(calibrated per contender); rounds alternate which contender goes first. The figures are
per call: the best sample and the median one.

Run on its own: ``python -m bench --section fixed [--quick]``.
"""

from __future__ import annotations

import functools
import os
import pickle
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import blpickle

from .contenders import pickle_dump_path, pickle_load_path
from .datasets import make_forest, make_small_dict, same
from .report import text_table
from .timing import compare, interleaved

#: Rounds (one sample of each contender per round) in a full and a quick run.
ROUNDS, QUICK_ROUNDS = 15, 7
#: Seconds one sample should last at least (the loop of calls grows until it does).
SAMPLE_SECONDS, QUICK_SAMPLE_SECONDS = 0.02, 0.01
TINY = {"a": 1}
REFERENCE = "pickle"
#: Files beside the target of the crowded-directory dump.
CROWD = 10_000


def _pickle_dumps(obj: Any) -> bytes:
    return pickle.dumps(obj, protocol=5)


#: Label -> (dumps, loads) of the objects in memory.
MEMORY_CODECS: dict[str, tuple[Callable[[Any], bytes], Callable[[bytes], Any]]] = {
    "blpickle": (blpickle.dumps, blpickle.loads),
    REFERENCE: (_pickle_dumps, pickle.loads),
}


#: Label -> (dump, load) through a path.
PATH_CODECS: dict[str, tuple[Callable[[Any, str], Any], Callable[[str], Any]]] = {
    "blpickle": (blpickle.dump, blpickle.load),
    REFERENCE: (pickle_dump_path, pickle_load_path),
}


def small_objects() -> dict[str, Any]:
    """The in-memory workloads: label -> object."""
    return {
        "tiny dict {'a': 1}": dict(TINY),
        "list of 1,000 ints": list(range(1000)),
        "list of 100 small dicts": [{"id": i, "name": f"item{i}", "score": i / 7, "ok": True} for i in range(100)],
        "200 arrays of 800 bytes": [np.full(100, i, dtype=np.float64) for i in range(200)],
    }


def measure_memory(rounds: int, seconds: float) -> list[dict]:
    """Round trips of the in-memory workloads; the tiny dict also gets a ``size`` row."""
    rows = []
    for workload, obj in small_objects().items():
        for label, (dumps, loads) in MEMORY_CODECS.items():
            if not same_value(obj, loads(dumps(obj))):
                raise AssertionError(f"{label} did not load back what it dumped ({workload})")
        calls = {
            label: functools.partial(_round_trip, dumps, loads, obj) for label, (dumps, loads) in MEMORY_CODECS.items()
        }
        rows.append(compare(workload, "round trip", interleaved(calls, rounds, seconds), REFERENCE))
    ours, theirs = (len(MEMORY_CODECS[label][0](TINY)) for label in ("blpickle", REFERENCE))
    rows.append(
        {
            "workload": "tiny dict {'a': 1}",
            "op": "size",
            "reference_name": REFERENCE,
            "blpickle": ours,
            "reference": theirs,
            "extra_bytes": ours - theirs,
        }
    )
    return rows


def _round_trip(dumps: Callable[[Any], bytes], loads: Callable[[bytes], Any], obj: Any) -> Any:
    return loads(dumps(obj))


def same_value(expected: Any, actual: Any) -> bool:
    """Equality that also compares lists of arrays element by element."""
    if isinstance(expected, list) and expected and isinstance(expected[0], np.ndarray):
        return len(actual) == len(expected) and all(same(e, a) for e, a in zip(expected, actual, strict=True))
    return bool(expected == actual)


def measure_forest(rounds: int, seconds: float, directory: str) -> list[dict]:
    """Dump to and load from a path of the fitted forest (no rows without scikit-learn)."""
    forest = make_forest()
    if forest is None:
        return []
    paths = {label: os.path.join(directory, f"forest-{label}") for label in PATH_CODECS}
    for label, (dump, load) in PATH_CODECS.items():
        dump(forest, paths[label])
        if not same(forest, load(paths[label])):
            raise AssertionError(f"{label} did not load back the forest it dumped")
    rows = []
    for op in ("dump", "load"):
        calls = {
            label: functools.partial(dump, forest, paths[label])
            if op == "dump"
            else functools.partial(load, paths[label])
            for label, (dump, load) in PATH_CODECS.items()
        }
        rows.append(compare("forest (100 trees) via a path", op, interleaved(calls, rounds, seconds), REFERENCE))
    with open(os.path.join(directory, "forest-open-file"), "wb") as file:
        calls = {
            "blpickle": functools.partial(_dump_to_file, blpickle.dump, forest, file),
            REFERENCE: functools.partial(_dump_to_file, functools.partial(pickle.dump, protocol=5), forest, file),
        }
        rows.append(
            compare("forest (100 trees) to an open file", "dump", interleaved(calls, rounds, seconds), REFERENCE)
        )
    return rows


def measure_crowded(rounds: int, seconds: float, directory: str) -> list[dict]:
    """Dump to a path of a small dict of arrays, in a directory holding `CROWD` other files
    (a dump must not cost more there than in an empty one)."""
    obj = make_small_dict()
    crowded = os.path.join(directory, "crowded")
    os.mkdir(crowded)
    for number in range(CROWD):
        open(os.path.join(crowded, f"other-{number}.blp"), "wb").close()
    calls = {
        label: functools.partial(dump, obj, os.path.join(crowded, f"small-{label}"))
        for label, (dump, _) in PATH_CODECS.items()
    }
    workload = f"small dict in a directory of {CROWD:,} files"
    return [compare(workload, "dump", interleaved(calls, rounds, seconds), REFERENCE)]


def _dump_to_file(dump: Callable[[Any, Any], Any], obj: Any, file: Any) -> None:
    """Dump ``obj`` to the start of the open ``file`` (no fsync)."""
    file.seek(0)
    dump(obj, file)
    file.truncate()


def run(quick: bool, directory: str | None = None) -> list[dict]:
    """Every row of the section, printed as a table once measured."""
    rounds, seconds = (QUICK_ROUNDS, QUICK_SAMPLE_SECONDS) if quick else (ROUNDS, SAMPLE_SECONDS)
    started = time.perf_counter()
    rows = measure_memory(rounds, seconds)
    with tempfile.TemporaryDirectory(dir=directory, prefix="blpickle-fixed-") as tmp:
        rows += measure_forest(rounds, seconds, tmp)
        rows += measure_crowded(rounds, seconds, tmp)
    print(
        f"\nFixed costs: blpickle default vs pickle p5, {rounds} interleaved rounds ({time.perf_counter() - started:.0f} s)"
    )
    print(text_table(table(rows)), flush=True)
    return rows


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:,.1f}" if seconds < 1e-3 else f"{seconds * 1e6:,.0f}"


def table(rows: list[dict]) -> list[tuple[str, ...]]:
    """The section's table: per-call µs best (median) of each, and blpickle's relative speed."""
    lines: list[tuple[str, ...]] = [("workload", "op", "blpickle µs", "pickle µs", "speed vs pickle best (median)")]
    for row in rows:
        if row["op"] == "size":
            lines.append(
                (row["workload"], "size", f"{row['blpickle']} B", f"{row['reference']} B", f"{row['extra_bytes']:+d} B")
            )
            continue
        ours, theirs = row["blpickle"], row["reference"]
        lines.append(
            (
                row["workload"],
                row["op"],
                f"{_us(ours['min'])} ({_us(ours['median'])})",
                f"{_us(theirs['min'])} ({_us(theirs['median'])})",
                f"{row['speed_best']:.3g}x ({row['speed_median']:.3g}x)",
            )
        )
    return lines
