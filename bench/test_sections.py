"""The sections of ``python -m bench`` run once, tiny, and their goals read what they produce.

Run: ``pytest bench/test_sections.py`` (``pytest`` alone collects only ``tests/``). Nothing
here asserts a timing: only that every row is measured and every goal finds its figures.
"""

from __future__ import annotations

import importlib.util
import json
import pickle
from pathlib import Path

import numpy as np
import pytest

import blpickle

from . import (
    alignment,
    fixed_cost,
    goals,
    pipeline,
    processes_bench,
    real_objects,
    section_tables,
    small_tasks,
    tensors,
    timing,
)
from .__main__ import write_sections


def test_fixed_cost_rows_feed_every_goal(tmp_path) -> None:
    rows = fixed_cost.measure_memory(rounds=1, seconds=1e-4) + fixed_cost.measure_forest(1, 1e-4, str(tmp_path))
    rows += fixed_cost.measure_crowded(1, 1e-4, str(tmp_path))
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


def test_pipeline_uses_the_record_parameters_and_feeds_its_goal() -> None:
    rows = pipeline.measure("medium", nbytes=8 << 20, rounds=1)
    assert [row["op"] for row in rows] == ["dump", "load"]
    parameters = rows[0]["parameters"]
    assert parameters["chunksize"] > 0 and parameters["blocksize"] > 0
    assert parameters["blpickle_ratio"] == pytest.approx(parameters["blosc2_ratio"], rel=0.02)
    assert goals.check_pipeline(rows)[0].status in ("PASS", "FAIL")


def test_first_chunk_is_not_found_in_a_raw_record() -> None:
    record = blpickle.dumps(np.arange(1 << 20, dtype=np.int64), codec=None)
    info = blpickle.inspect(record)
    with pytest.raises(ValueError, match="no Blosc2 chunk"):
        pipeline.first_chunk(record, info.buffers[0].nbytes, 1, 8)


def test_pareto_finds_dominating_peers_and_covering_presets() -> None:
    def row(method: str, dump: float, load: float, ratio: float) -> dict:
        spread = {"min": 1.0, "median": 1.0}
        return {
            "dataset": "medium",
            "size": "mid",
            "method": method,
            "nbytes": 1e6,
            "ratio": ratio,
            "dump": {**spread, "min": 1 / dump},
            "load_hot": {**spread, "min": 1 / load},
        }

    rows = [
        row("blpickle default", 100, 100, 1.1),
        row("blpickle balanced", 90, 96, 1.2),
        row("better peer", 101, 101, 1.2),
        row("slow peer", 50, 90, 1.19),
    ]
    entries = {e["peer"]: e for e in goals.pareto(rows)}
    assert entries["better peer"]["dominance"] == pytest.approx(1.01)
    assert entries["slow peer"]["preset"] == "balanced"
    assert entries["slow peer"]["margin"] == pytest.approx(min(1.2 / 1.19 / 0.99, 90 / 50, 96 / 90 / 0.95))
    status = {g.text: g.status for g in goals.check_pareto(rows)}
    assert [s for text, s in status.items() if text.startswith("Pareto (a)")] == ["FAIL"]
    assert status["Pareto (b): a preset as good as slow peer on all three (margin)"] == "PASS"
    assert status["Pareto (b): a preset as good as better peer on all three (margin)"] == "FAIL"


def test_section_tables_render_every_section_and_its_goals(tmp_path) -> None:
    fixed = fixed_cost.measure_memory(rounds=1, seconds=1e-4)
    lines = pipeline.measure("low", nbytes=4_000_000, rounds=1)
    doc = {
        "fixed": fixed,
        "pipeline": lines,
        "goals": [g.to_dict() for g in goals.check_fixed(fixed) + goals.check_pipeline(lines) + goals.check([], [])],
    }
    text = section_tables.markdown(doc)
    assert "| tiny dict {'a': 1} | size |" in text and "| low, 4 MB | load |" in text
    assert "| load pipeline >= 0.95x Blosc2's own throughput, same parameters |" in text
    assert "3x joblib lz4" not in text  # the study's goals stay in the study's report

    write_sections(doc, str(tmp_path), "fixed-pipeline")
    with open(tmp_path / "fixed-pipeline.md") as markdown, open(tmp_path / "fixed-pipeline.json") as saved:
        assert markdown.read() == text + "\n" and section_tables.markdown(json.load(saved)) == text


def test_tensor_rows_feed_the_table_and_every_goal(tmp_path) -> None:
    torch = pytest.importorskip("torch")
    jnp = pytest.importorskip("jax.numpy")
    ml_dtypes = pytest.importorskip("ml_dtypes")
    weights = {tensors.NAME: torch.randn(256, 256), "bias": torch.randn(256)}
    base = torch.randn(256, 256)
    small = {
        "state dict fp32": weights,
        "state dict bf16": {k: v.to(torch.bfloat16) for k, v in weights.items()},
        "jax float32 + bfloat16": {"f32": jnp.asarray(base.numpy()), "bf16": jnp.asarray(base.numpy(), jnp.bfloat16)},
        "ml_dtypes bfloat16": {"w": base.numpy().astype(ml_dtypes.bfloat16)},
        "tensor + view + alias": {"base": base, "view": base[10:], "alias": base.reshape(-1)},
    }
    rows = [tensors.measure(name, obj, str(tmp_path), 1) for name, obj in small.items()]
    checked = goals.check_tensors({"rows": rows})
    assert len(checked) == 8 and {goal.status for goal in checked} <= {"PASS", "FAIL"}, [g.summary for g in checked]
    assert len(tensors.table(rows)) == len(rows) + 1
    assert tensors.parameters_survive()


def test_real_objects_measure_every_contender_and_feed_every_goal(tmp_path) -> None:
    for library in ("pandas", "scipy", "xarray", "sklearn"):
        pytest.importorskip(library)
    rows = real_objects.run(quick=True, directory=str(tmp_path), scale=0.001)
    torch = importlib.util.find_spec("torch") is not None  # an optional extra: its case is skipped without it
    state_dict = next(case.name for case in real_objects.cases() if "torch" in case.name)
    expected = {case.name for case in real_objects.cases()} - (set() if torch else {state_dict})
    assert {row["case"] for row in rows} == expected
    methods = {(row["case"], row["method"]) for row in rows}
    assert ("noisy float64, 80 KB", "np.save") in methods and ("20,000 small arrays", "np.savez") in methods
    assert ((state_dict, "torch.save") in methods) == torch
    assert ("forest (100 trees) via a path", real_objects.PATH_REFERENCE) in methods
    assert all(row["dump"]["runs"] and row["load"]["runs"] and row["file_bytes"] > 0 for row in rows)
    checked = goals.check_real(rows)
    assert {goal.status for goal in checked} <= {"PASS", "FAIL"}, [g.summary for g in checked]
    assert len(real_objects.table(rows)) == len(rows) + 1
    assert "| noisy float64, 80 KB / blpickle |" in section_tables.markdown({"real": rows, "goals": []})


def test_real_objects_time_a_cold_load_per_round_after_evicting_the_file(tmp_path) -> None:
    evicted: list[str] = []
    case = real_objects.Case("tiny", lambda: np.arange(10.0))
    rows = real_objects.measure(case, case.make(), 2, 1e-4, 10.0, str(tmp_path), drop=evicted.append)
    assert all(len(row["cold"]["runs"]) == 2 for row in rows)
    assert len(evicted) == 2 * len(rows) and len(set(evicted)) == len(rows)
    assert real_objects.table(rows)[1][4] != "-" and goals.real_relative(rows, "tiny", "blpickle", "cold")
    assert "cold" not in real_objects.measure(case, case.make(), 1, 1e-4, 10.0, str(tmp_path))[0]


def test_real_objects_compare_what_they_load() -> None:
    pytest.importorskip("pandas")
    frame = real_objects.make_frame(100)
    assert real_objects.same(frame, frame.copy())
    assert not real_objects.same(frame, frame.astype({"quantity": "float64"}))
    arrays = {"a": np.arange(3), "name": "x"}
    assert real_objects.same(arrays, {"a": np.arange(3), "name": "x"})
    assert not real_objects.same(arrays, {"a": np.arange(3.0), "name": "x"})


def test_real_objects_compare_tensors_by_type_dtype_and_value() -> None:
    torch = pytest.importorskip("torch")
    state = real_objects.make_state_dict(1)
    assert real_objects.same(state, {k: v.clone() for k, v in state.items()})
    assert not real_objects.same(state, {k: v.double() for k, v in state.items()})
    assert not real_objects.same(state, {k: v.numpy() for k, v in state.items()})
    changed = {k: v.clone() for k, v in state.items()}
    next(iter(changed.values())).view(-1)[0] += 1
    assert not real_objects.same(state, changed) and isinstance(state[next(iter(state))], torch.Tensor)


def test_alignment_files_put_the_payload_at_each_page_offset(tmp_path) -> None:
    array = np.arange(100_000, dtype=np.float64)
    files = alignment.write_files(str(tmp_path), array)
    assert sorted(files) == sorted(alignment.PAGE_OFFSETS)
    for offset, (path, padding) in files.items():
        data = Path(path).read_bytes()
        assert data.find(array[:64].tobytes()) % alignment.PAGE == offset
        with open(path, "rb") as file:
            file.seek(padding)
            assert np.array_equal(blpickle.load(file), array)
