"""The sections of ``python -m bench`` run once, tiny, and their goals read what they produce.

Run: ``pytest bench/test_sections.py`` (``pytest`` alone collects only ``tests/``). Nothing
here asserts a timing: only that every row is measured and every goal finds its figures.
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from . import fixed_cost, goals, processes_bench, small_tasks, timing


def test_fixed_cost_rows_feed_every_goal(tmp_path) -> None:
    rows = fixed_cost.measure_memory(rounds=1, seconds=1e-4) + fixed_cost.measure_forest(1, 1e-4, str(tmp_path))
    checked = goals.check_fixed(rows)
    assert {goal.status for goal in checked} <= {"PASS", "FAIL"}, [g.summary for g in checked]
    size = next(r for r in rows if r["op"] == "size")
    assert size["reference"] == len(pickle.dumps({"a": 1}, protocol=5))
    assert size["extra_bytes"] == size["blpickle"] - size["reference"]
    for row in rows:
        if row["op"] != "size":
            assert row["speed_best"] > 0 and len(row["blpickle"]["runs"]) == 1


def test_interleaved_times_each_call_per_round() -> None:
    calls = {"a": lambda: None, "b": lambda: sum(range(10))}
    times = timing.interleaved(calls, rounds=3, seconds=1e-4)
    assert set(times) == {"a", "b"}
    assert all(len(t["runs"]) == 3 and t["min"] <= t["median"] for t in times.values())


def test_fixed_cost_goals_without_rows_are_not_measured() -> None:
    assert {goal.status for goal in goals.check_fixed([])} == {"N/A"}


@pytest.mark.parametrize("obj", [[1, 2], [np.arange(3.0)]])
def test_same_value_compares_lists(obj) -> None:
    assert fixed_cost.same_value(obj, list(obj))
    assert not fixed_cost.same_value(obj, obj[:0])


def test_small_task_rows_feed_every_goal() -> None:
    pytest.importorskip("distributed")
    rows = small_tasks.measure_multiprocessing(tasks=20, executor_tasks=10, rounds=1)
    rows += small_tasks.measure_loky(tasks=20, rounds=1)
    rows += small_tasks.measure_memory(cached_count=3, big_mb=1, rounds=1)
    rows += small_tasks.measure_dask(tasks=5, rounds=1)
    big = processes_bench.run_multiprocessing([10**6])
    checked = goals.check_processes({"small": rows, "big": big})
    assert {goal.status for goal in checked} <= {"PASS", "FAIL"}, [g.summary for g in checked]
    assert all(row["speed_best"] > 0 and len(row["blpickle"]["runs"]) == 1 for row in rows)
    assert [line[0] for line in small_tasks.table(rows)[1:]] == [row["workload"] for row in rows]
