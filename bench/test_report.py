"""The charts of the docs' integration pages are drawn from the committed results.

Run: ``pytest bench/test_report.py`` (``pytest`` alone collects only ``tests/``). A change
to what bench/joblib_bench.py or bench/processes_bench.py writes that the charts cannot
read fails here, before ``python -m bench --replot`` does.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from . import report

RESULTS = Path(__file__).with_name("results")
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    ("stem", "charts"),
    [("joblib", ["dump", "memory"]), ("processes", ["multiprocessing", "loky", "dask"])],
)
def test_the_charts_of_a_result_are_drawn(tmp_path: Path, stem: str, charts: list[str]) -> None:
    doc = json.loads((RESULTS / f"{stem}.json").read_text())
    paths = report.plot_integrations(doc, str(tmp_path), stem)
    assert paths == [str(tmp_path / f"{stem}-{chart}.png") for chart in charts]
    assert all(Path(path).read_bytes().startswith(PNG) for path in paths)


def test_a_result_of_another_kind_draws_nothing(tmp_path: Path) -> None:
    assert report.plot_integrations({"rows": []}, str(tmp_path), "full") == []
    assert list(tmp_path.iterdir()) == []


def _row(method: str, dump_s: float, load_s: float, ratio: float, dataset: str = "low") -> dict:
    return {
        "dataset": dataset,
        "size": "mid",
        "nbytes": 80_000_000,
        "method": method,
        "dump": {"min": dump_s},
        "load_hot": {"min": load_s},
        "ratio": ratio,
    }


def test_the_summary_gives_the_range_of_the_default_over_each_peer() -> None:
    rows = [
        _row("blpickle default", 0.1, 0.05, 10.0),
        _row("pickle p5", 0.2, 0.2, 1.0),
        _row("blpickle default", 0.1, 0.1, 2.0, "high"),
        _row("pickle p5", 0.05, 0.3, 1.0, "high"),
        {**_row("blpickle default", 9.0, 9.0, 1.0), "size": "small"},  # small arrays: left out
        {**_row("pickle p5", 1.0, 1.0, 1.0), "size": "small"},
    ]
    assert report.summary_table(rows) == [
        ("peer", "dump speed, x the peer's", "load speed, x the peer's", "peer's file size, x blpickle's"),
        ("`pickle` protocol 5", "0.50-2.0x", "3.0-4.0x", "2.0-10x"),
    ]


def test_a_study_run_without_pickle_draws_its_speed_charts_without_a_warning(tmp_path: Path) -> None:
    rows = [_row("np.save", 0.1, 0.05, 1.0, dataset) for dataset in ("low", "medium", "high")]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        report.plot_headline(rows, str(tmp_path / "headline.png"))
        report.plot_speeds(rows, str(tmp_path / "speed.png"), "mid")
    assert (tmp_path / "headline.png").read_bytes().startswith(PNG)
