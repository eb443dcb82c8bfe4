"""The Markdown tables of the fixed-cost, processes, pipeline, tensors and real-objects sections, and their goals,
from a saved run (``python -m bench --markdown RESULTS.json``), for docs/benchmarks.md."""

from __future__ import annotations

from . import fixed_cost, pipeline, real_objects, small_tasks, tensors
from .report import markdown_table

#: Goal texts that belong to each section (the study's goals are in its own report).
_SECTION_GOALS = (
    "tiny dict",
    "list of",
    "200 arrays",
    "forest (100 trees)",
    "Pool.map",
    "ProcessPoolExecutor",
    "joblib.Parallel",
    "joblib.Memory",
    "dask graph",
    "big ",
    "load pipeline",
    "tensors:",
    "Pareto",
    "real: ",
)


def big_transfers_table(rows: list[dict]) -> list[tuple[str, ...]]:
    """`bench.processes_bench` rows: blpickle's speed over the standard library's."""
    lines: list[tuple[str, ...]] = [("transport", "data", "MB", "send", "round trip")]
    for row in rows:
        lines.append(
            (
                row["transport"],
                row["data"],
                f"{row['nbytes'] / 1e6:.0f}",
                f"{row['speedup_send']:.2f}x",
                f"{row['speedup_round_trip']:.2f}x",
            )
        )
    return lines


def goals_table(goals: list[dict]) -> list[tuple[str, ...]]:
    """The run's goals of these sections: text, worst value and status."""
    lines: list[tuple[str, ...]] = [("goal", "worst in this run", "status")]
    for goal in goals:
        if goal["text"].startswith(_SECTION_GOALS):
            worst = "-" if goal["worst"] is None else f"{goal['worst']:.3g}{goal['unit']}"
            lines.append((goal["text"], worst, goal["status"]))
    return lines


def markdown(doc: dict) -> str:
    """Every table of the sections the run has, then their goals."""
    parts = []
    if doc.get("fixed"):
        parts += ["Fixed costs (µs per call, best (median)):", "", markdown_table(fixed_cost.table(doc["fixed"])), ""]
    if doc.get("processes"):
        processes = doc["processes"]
        parts += [
            "Small tasks (ms per batch, best (median)):",
            "",
            markdown_table(small_tasks.table(processes["small"])),
            "",
        ]
        parts += ["Big buffers to a process (blpickle's speed over the stdlib's, best runs):", ""]
        parts += [markdown_table(big_transfers_table(processes["big"])), ""]
    if doc.get("pipeline"):
        parts += ["Pipeline efficiency (MB/s, best (median)):", "", markdown_table(pipeline.table(doc["pipeline"])), ""]
    if doc.get("tensors"):
        parts += ["Tensors (ms, best (median)):", "", markdown_table(tensors.table(doc["tensors"]["rows"])), ""]
    if doc.get("real"):
        parts += [
            "Real objects (open files in the page cache, no fsync; cold loads after evicting the file;"
            " ms per call, best (median)):",
            "",
            markdown_table(real_objects.table(doc["real"])),
            "",
        ]
    parts += ["Goals:", "", markdown_table(goals_table(doc["goals"]))]
    return "\n".join(parts)
