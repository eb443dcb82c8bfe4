"""Tables (plain text and Markdown), machine information and plots of one run."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
from collections.abc import Callable, Collection, Iterable
from pathlib import Path
from typing import Any

import blosc2
import joblib
import matplotlib
import numpy as np
import psutil

import blpickle

from .contenders import DEFAULT
from .datasets import ENTROPIES, SIZES
from .goals import relative, speed

matplotlib.use("Agg")
import matplotlib.pyplot as plt

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_HEADER = (
    "method",
    "dump MB/s",
    "load hot MB/s",
    "load cold MB/s",
    "ratio",
    "default faster: dump / hot load",
)
_SPEEDS = {"dump": "dump", "load_hot": "load (hot cache)", "load_cold": "load (cold cache)"}


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            return next(line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=_REPO, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def machine_info() -> dict:
    """CPU, cores, RAM, OS, library versions, the blpickle commit and the date."""
    return {
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "ram_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "os": platform.platform(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "blosc2": blosc2.__version__,
        "joblib": joblib.__version__,
        "blpickle": blpickle.__version__,
        "commit": _git("rev-parse", "--short", "HEAD")
        + (" (modified)" if _git("status", "--porcelain", "blpickle") else ""),
        "default_options": blpickle.PRESETS["default"].to_dict(),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "load_average_at_start": os.getloadavg()[0],
    }


def run_arguments(
    description: str, results: Path, quick: tuple[int, float], full: tuple[int, float], argv: list[str] | None
) -> tuple[argparse.Namespace, int, float]:
    """Parse the arguments of a benchmark run on its own (``--quick``, ``--out``); return
    them, and the rounds and seconds per sample to run: ``quick`` or ``full``."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"{quick[0]} rounds of {quick[1]} s samples (default {full[0]} of {full[1]} s)",
    )
    parser.add_argument("--out", type=Path, default=results, help="JSON file to write")
    args = parser.parse_args(argv)
    rounds, seconds = quick if args.quick else full
    return args, rounds, seconds


def write_result(out: Path, module: str, fields: dict[str, Any]) -> None:
    """Write ``fields`` as JSON to ``out``, after the command that ran ``module`` and the
    machine (`machine_info`)."""
    doc = {"command": shlex.join(["python", "-m", module, *sys.argv[1:]]), "machine": machine_info(), **fields}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1))
    print(f"wrote {out}")


def _mbs(row: dict, what: str) -> str:
    """Best MB/s, and in parentheses the median run's."""
    if row.get(what) is None:
        return "-"
    median = row["nbytes"] / 1e6 / row[what]["median"]
    return f"{speed(row, what):,.0f} ({median:,.0f})"


def _times(row: dict, ours: dict | None) -> str:
    """How many times faster blpickle's default is than this row: dump / hot load."""
    if ours is None:
        return "-"
    dump, load = (row[what]["min"] / ours[what]["min"] for what in ("dump", "load_hot"))
    return f"{dump:.2f}x / {load:.2f}x"


def group_table(group: list[dict]) -> list[tuple[str, ...]]:
    """Header and one line per method of one (dataset, size) group."""
    ours = next((r for r in group if r["method"] == DEFAULT), None)
    lines = [_HEADER]
    for row in group:
        speeds = (_mbs(row, what) for what in _SPEEDS)
        lines.append((row["method"], *speeds, f"{row['ratio']:.3g}", _times(row, ours)))
    return lines


def group_title(group: list[dict]) -> str:
    first = group[0]
    return f"{first['dataset']} / {first['size']} ({first['nbytes'] / 1e6:,.2f} MB)"


def group_text(group: list[dict], seconds: float) -> str:
    return f"\n{group_title(group)}, {seconds:.0f} s\n{text_table(group_table(group))}"


def memory_table(memory: list[dict]) -> list[tuple[str, ...]]:
    lines = [("method", "dataset/size", "dump MiB", "load MiB")]
    for m in memory:
        lines.append((m["method"], f"{m['dataset']}/{m['size']}", f"{m['dump']:.1f}", f"{m['load']:.1f}"))
    return lines


def threads_table(threads: list[dict]) -> list[tuple[str, ...]]:
    lines = [("dataset/size", "nthreads", "dump MB/s", "load hot MB/s")]
    for t in threads:
        where = f"{t['dataset']}/{t['size']}"
        lines.append((where, str(t["nthreads"]), _mbs(t, "dump"), _mbs(t, "load_hot")))
    return lines


def text_table(lines: list[tuple[str, ...]]) -> str:
    """Aligned columns: the first to the left, the others to the right."""
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    return "\n".join(
        "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(line, widths, strict=True)))
        for line in lines
    )


def markdown_table(lines: list[tuple[str, ...]]) -> str:
    rule = tuple("---" if i == 0 else "---:" for i in range(len(lines[0])))
    return "\n".join("| " + " | ".join(line) + " |" for line in [lines[0], rule, *lines[1:]])


def groups(rows: list[dict]) -> Iterable[list[dict]]:
    """Rows split by (dataset, size), in run order."""
    for key in dict.fromkeys((r["dataset"], r["size"]) for r in rows):
        yield [r for r in rows if (r["dataset"], r["size"]) == key]


def preamble(machine: dict, cold_cache: Iterable[str]) -> str:
    """What is measured where, printed before the tables."""
    return (
        f"{machine['cpu']}, {machine['cores']} cores, {machine['ram_gib']} GiB RAM, "
        f"load average {machine['load_average_at_start']:.1f}; "
        f"blpickle {machine['commit']}, default options {machine['default_options']}\n"
        f"Cold loads evict the file with: {', '.join(cold_cache)}. "
        "Speeds: best run (median run); dumps include fsync."
    )


def summary_text(doc: dict) -> str:
    """Memory, threads and goals, printed after the tables."""
    out = [f"\nCold loads: files evicted from the page cache with {doc['settings']['cold_cache']}"]
    if doc["memory"]:
        out += [
            "\nExtra peak memory (MiB beyond the array)",
            text_table(memory_table(doc["memory"])),
        ]
    if doc["threads"]:
        out += ["\nblpickle default: threads", text_table(threads_table(doc["threads"]))]
    out.append("\nGoals (design.md), from this run:")
    out += [f"  {goal['status']:4s}  {goal['summary']}" for goal in doc["goals"]]
    return "\n".join(out)


#: The peers of the summary table, as the pages name them.
_SUMMARY_PEERS = {
    "pickle p5": "`pickle` protocol 5",
    "np.save": "`np.save`",
    "blosc2 save_tensor": "`blosc2.save_tensor`",
    "joblib lz4": '`joblib.dump(compress="lz4")`',
    "joblib zlib-3": "`joblib.dump(compress=3)` (zlib)",
    "np.savez_compressed": "`np.savez_compressed`",
}


def summary_table(rows: list[dict]) -> list[tuple[str, ...]]:
    """blpickle default against each peer on the arrays of mid size and up: the range (worst
    to best dataset and size) of its dump and hot load speed over the peer's, and of the
    peer's file size over its own."""
    arrays = [r for r in rows if r["size"] not in ("small", "graph")]

    def times(value: float) -> str:
        return f"{value:.2f}" if value < 2 else f"{value:.1f}" if value < 10 else f"{value:.0f}"

    def span(values: Iterable[float]) -> str:
        ordered = sorted(values)
        return f"{times(ordered[0])}-{times(ordered[-1])}x" if ordered else "-"

    lines = [("peer", "dump speed, x the peer's", "load speed, x the peer's", "peer's file size, x blpickle's")]
    for method, label in _SUMMARY_PEERS.items():
        found = [relative(arrays, method, what).values() for what in ("dump", "load_hot", "ratio")]
        if any(found):
            lines.append((label, *map(span, found)))
    return lines


def markdown_report(doc: dict) -> str:
    """The whole run as Markdown: machine, one table per group, memory, threads, goals."""
    m = doc["machine"]
    out = [
        f"Taken {m['date']} on {m['cpu']}, {m['cores']} cores, {m['ram_gib']} GiB RAM, "
        f"{m['os']}; Python {m['python']}, numpy {m['numpy']}, blosc2 {m['blosc2']}, "
        f"joblib {m['joblib']}, blpickle {m['blpickle']} at {m['commit']} "
        f"(default options {m['default_options']}). Cold loads: {doc['settings']['cold_cache']}. "
        f"Load average (1 min) {m['load_average_at_start']:.1f} at the start, "
        f"{doc['settings']['load_average_at_end']:.1f} at the end. "
        "Speeds are MB/s of the best run, the median run in parentheses.",
    ]
    out += [
        "\n**blpickle's default against each peer, arrays of mid size and up**\n",
        markdown_table(summary_table(doc["rows"])),
    ]
    for group in groups(doc["rows"]):
        out += [f"\n**{group_title(group)}**\n", markdown_table(group_table(group))]
    if doc["memory"]:
        out += [
            "\n**Extra peak memory (MiB beyond the array)**\n",
            markdown_table(memory_table(doc["memory"])),
        ]
    if doc["threads"]:
        out += ["\n**blpickle default: threads**\n", markdown_table(threads_table(doc["threads"]))]
    out.append("\n**Goals**\n")
    out += [f"- **{goal['status']}** {goal['summary']}" for goal in doc["goals"]]
    return "\n".join(out) + "\n"


#: The peers a reader compares blpickle with, in the plots (REFERENCES less joblib's rarely used HC).
_PEERS = (DEFAULT, "pickle p5", "np.save", "blosc2 save_tensor", "joblib lz4", "joblib zlib-3")
_GREY = "0.6"
#: The plots of the pages are drawn 1000 px wide and shown about 700 px wide: type to read there.
_STYLE = {"font.size": 14, "axes.titlesize": 14, "figure.titlesize": 15}
ENTROPY_NAMES = {"low": "an int64 ramp", "medium": "noisy float64", "high": "random float64"}
#: blpickle in colour; in the line plots each peer has a colour of its own, none of them orange.
_OURS, _OURS_DARK = "tab:orange", "#a34a00"
_LINE_COLOURS = {
    DEFAULT: _OURS,
    "pickle p5": "tab:blue",
    "np.save": "tab:green",
    "blosc2 save_tensor": "tab:purple",
    "joblib lz4": "tab:gray",
    "joblib zlib-3": "tab:brown",
}


def human_size(nbytes: float) -> str:
    """``80000000`` -> ``"80 MB"`` (decimal units, as the datasets are named)."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if nbytes >= scale:
            return f"{nbytes / scale:.3g} {unit}"
    return f"{nbytes:.0f} B"


def _speed_vs_pickle(rows: list[dict], what: str, method: str, dataset: str, size: str) -> float | None:
    """``method``'s speed on one dataset over pickle's (None if either is missing)."""
    found = {r["method"]: r for r in rows if r["dataset"] == dataset and r["size"] == size and r.get(what)}
    if method not in found or "pickle p5" not in found:
        return None
    return found["pickle p5"][what]["min"] / found[method][what]["min"]


def _bars(ax: plt.Axes, labels: list[str], values: list[float], fmt: str, ours: Collection[str] = (DEFAULT,)) -> None:
    """Horizontal bars, those of ``ours`` (blpickle's) in colour, each labelled with its value."""
    y = np.arange(len(labels))
    colours = [_OURS if label in ours else _GREY for label in labels]
    ax.barh(y, values, color=colours)
    ax.set_yticks(y, labels)
    ax.invert_yaxis()
    for yi, value in zip(y, values, strict=True):
        ax.text(value, yi, " " + fmt.format(value), va="center", fontsize="small")
    ax.set_xlim(0, (max(values, default=0) or 1) * 1.25)  # all 0: the reference was not run
    ax.spines[["top", "right"]].set_visible(False)


def plot_headline(rows: list[dict], path: str, size: str = "mid", dataset: str = "medium") -> None:
    """One chart for the home page: dump and load speed of the peers as multiples of pickle's."""
    methods = [m for m in _PEERS if any(r["method"] == m for r in rows)]
    nbytes = next(r["nbytes"] for r in rows if r["size"] == size)
    with plt.rc_context({"font.size": 12}):
        fig, axes = plt.subplots(1, 2, figsize=(9, 3.2))
        for ax, what, label in ((axes[0], "dump", "dump"), (axes[1], "load_hot", "load")):
            _bars(ax, methods, [_speed_vs_pickle(rows, what, m, dataset, size) or 0 for m in methods], "{:.2g}x")
            ax.set_title(f"{label} (x pickle)")
        axes[1].set_yticklabels([])
        fig.suptitle(f"{human_size(nbytes)} of {ENTROPY_NAMES[dataset]}: speed as a multiple of pickle's")
        fig.tight_layout()
        fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_speeds(rows: list[dict], path: str, size: str) -> None:
    """Dump and load speed of the peers as multiples of pickle's at one size, a row per dataset."""
    methods = [m for m in _PEERS if any(r["method"] == m for r in rows)]
    nbytes = next(r["nbytes"] for r in rows if r["size"] == size)
    with plt.rc_context(_STYLE):
        fig, axes = plt.subplots(len(ENTROPIES), 2, figsize=(10, 0.8 + 2.6 * len(ENTROPIES)))
        for i, dataset in enumerate(ENTROPIES):
            for k, (what, label) in enumerate((("dump", "dump"), ("load_hot", "load"))):
                values = [_speed_vs_pickle(rows, what, m, dataset, size) or 0 for m in methods]
                _bars(axes[i][k], methods, values, "{:.2g}x")
                axes[i][k].set_title(f"{ENTROPY_NAMES[dataset]}: {label}")
            axes[i][1].set_yticklabels([])
        fig.suptitle(f"{human_size(nbytes)} arrays: speed, x pickle's (higher is better)")
        fig.tight_layout()
        fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_ratios(rows: list[dict], path: str) -> None:
    """Compression ratio of each peer, one panel per dataset, at the largest array size."""
    size = max({r["size"] for r in rows if r["size"] in SIZES}, key=SIZES.__getitem__)
    methods = [m for m in _PEERS if any(r["method"] == m for r in rows)]
    nbytes = next(r["nbytes"] for r in rows if r["size"] == size)
    with plt.rc_context(_STYLE):
        fig, axes = plt.subplots(1, len(ENTROPIES), figsize=(10, 3.8))
        for j, (ax, dataset) in enumerate(zip(axes, ENTROPIES, strict=True)):
            found = {r["method"]: r["ratio"] for r in rows if r["size"] == size and r["dataset"] == dataset}
            _bars(ax, methods, [found.get(m, 0) for m in methods], "{:.3g}")
            ax.set_title(ENTROPY_NAMES[dataset])
            if j:
                ax.set_yticklabels([])
        fig.suptitle(f"Compression ratio, {human_size(nbytes)} arrays (higher is better)")
        fig.tight_layout()
        fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_growth(rows: list[dict], path: str) -> None:
    """Speed against array size (one step per size) for blpickle default and the peers."""
    sizes = sorted({r["nbytes"] for r in rows if r["size"] in SIZES})
    with plt.rc_context(_STYLE):
        fig, axes = plt.subplots(2, len(ENTROPIES), figsize=(10, 7.4), squeeze=False, sharex=True)
        for j, entropy in enumerate(ENTROPIES):
            for i, what in enumerate(("dump", "load_hot")):
                ax = axes[i][j]
                for method in _PEERS:
                    found = sorted(
                        (sizes.index(r["nbytes"]), speed(r, what))
                        for r in rows
                        if r["method"] == method and r["dataset"] == entropy and r["size"] in SIZES
                    )
                    if found:
                        width = 3 if method == DEFAULT else 1.5
                        ax.plot(
                            *zip(*found, strict=True),
                            marker="o",
                            label=method,
                            color=_LINE_COLOURS[method],
                            linewidth=width,
                        )
                ax.set_xticks(range(len(sizes)), [human_size(s) for s in sizes])
                ax.set_xlim(-0.3, len(sizes) - 0.7)
                ax.set_title(f"{ENTROPY_NAMES[entropy]}: {'dump' if what == 'dump' else 'load'}", fontsize=13)
                ax.spines[["top", "right"]].set_visible(False)
            axes[0][0].set_ylabel("MB/s")
            axes[1][0].set_ylabel("MB/s")
        handles, labels = axes[0][0].get_legend_handles_labels()
        fig.legend(handles, labels, loc="lower center", ncol=3, frameon=False)
        fig.suptitle("Speed as the arrays grow, MB/s (higher is better; load from the page cache)")
        fig.tight_layout(rect=(0, 0.1, 1, 1))
        fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_threads(threads: list[dict], path: str) -> None:
    """blpickle default's dump and load speed against nthreads, per dataset."""
    fig, ax = plt.subplots(figsize=(7, 4))
    for entropy in ENTROPIES:
        found = [t for t in threads if t["dataset"] == entropy]
        for what, style in (("dump", "-o"), ("load_hot", "--s")):
            ax.plot(
                [t["nthreads"] for t in found],
                [speed(t, what) for t in found],
                style,
                label=f"{entropy} {_SPEEDS[what]}",
            )
    ax.set_xlabel("nthreads")
    ax.set_ylabel("MB/s")
    ax.set_xticks(sorted({t["nthreads"] for t in threads}))
    ax.set_title("blpickle default: thread scaling")
    ax.legend(fontsize=8)
    ax.spines[["top", "right"]].set_visible(False)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


# --------------------------------------------------------------------------------------------
# The integrations: bench/joblib_bench.py and bench/processes_bench.py results

#: joblib.dump methods of joblib_bench.py, as the chart names them.
_JOBLIB_METHODS = {
    "joblib uncompressed": "uncompressed",
    "joblib zlib 3": "zlib 3",
    "joblib lz4": "lz4",
    "joblib blosc": '"blosc"',
    "blpickle.dump": "blpickle.dump",
}
_JOBLIB_OURS = ('"blosc"', "blpickle.dump")


def plot_joblib_dump(doc: dict, path: str) -> None:
    """``joblib.dump(compress=...)`` per array: file ratio, dump and load speed as multiples of
    joblib's uncompressed dump and load."""
    rows = doc["dump_load"]
    arrays = list(dict.fromkeys(r["array"] for r in rows))
    labels = [label for method, label in _JOBLIB_METHODS.items() if any(r["method"] == method for r in rows)]
    with plt.rc_context(_STYLE):
        fig, axes = plt.subplots(len(arrays), 3, figsize=(10, 1.2 + 2.3 * len(arrays)), squeeze=False)
        for i, array in enumerate(arrays):
            found = {
                _JOBLIB_METHODS[r["method"]]: r for r in rows if r["array"] == array and r["method"] in _JOBLIB_METHODS
            }
            base = found["uncompressed"]
            columns = (
                ("file ratio", [found[label]["ratio"] for label in labels], "{:.3g}"),
                *(
                    (f"{what}, x uncompressed", [found[label][key] / base[key] for label in labels], "{:.2g}x")
                    for what, key in (("dump", "dump_MBps"), ("load", "load_MBps"))
                ),
            )
            for k, (title, values, fmt) in enumerate(columns):
                ax = axes[i][k]
                _bars(ax, labels, values, fmt, ours=_JOBLIB_OURS)
                if i == 0:
                    ax.set_title(title)
                if k:
                    ax.set_yticklabels([])
            axes[i][0].set_ylabel(array, fontweight="bold")
        nbytes = rows[0]["nbytes"]
        fig.suptitle(f"joblib.dump and joblib.load of {human_size(nbytes)} arrays (higher is better)")
        fig.tight_layout()
        fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_joblib_memory(doc: dict, path: str) -> None:
    """``joblib.Memory`` cache hits as multiples of joblib's store's uncompressed hit: loaded
    hits in one panel, memory-mapped ones in the other."""
    rows = doc["cache_hits"]
    mapped = [r for r in rows if "mmap_mode" in r["memory_kwargs"]]
    loaded = [r for r in rows if "mmap_mode" not in r["memory_kwargs"]]
    with plt.rc_context(_STYLE):
        fig, axes = plt.subplots(
            2, 1, figsize=(10, 1.8 + 0.5 * len(rows)), gridspec_kw={"height_ratios": [len(loaded), len(mapped)]}
        )
        for ax, group, title in ((axes[0], loaded, "loaded"), (axes[1], mapped, "memory-mapped (mmap_mode='r')")):
            labels = [r["setup"].replace(" store", "").replace(", mmap_mode='r'", "") for r in group]
            ours = [
                label for label, r in zip(labels, group, strict=True) if r["memory_kwargs"].get("backend") == "blpickle"
            ]
            _bars(ax, labels, [r["speedup_vs_joblib_uncompressed"] for r in group], "{:.3g}x", ours=ours)
            ax.set_title(title)
        fig.suptitle(
            f"joblib.Memory cache hit of {human_size(rows[0]['nbytes'])}, x joblib's store uncompressed (higher is better)"
        )
        fig.tight_layout()
        fig.savefig(path, dpi=100)
    plt.close(fig)


def _columns(
    ax: plt.Axes,
    sizes: list[float],
    series: dict[str, list[float]],
    baseline: str,
    colours: Iterable[str] = (_OURS, _OURS_DARK),
) -> None:
    """Vertical bars grouped by array size, one colour per series (blpickle's colours), each
    labelled with its value, over a dashed line at 1 (``baseline``)."""
    x = np.arange(len(sizes))
    width = 0.8 / len(series)
    for k, ((label, values), colour) in enumerate(zip(series.items(), colours, strict=False)):
        where = x - 0.4 + width * (k + 0.5)
        ax.bar(where, values, width, label=label, color=colour)
        for xi, value in zip(where, values, strict=True):
            ax.text(
                xi,
                value,
                f"{value:.2f}" if value < 10 else f"{value:.0f}",
                ha="center",
                va="bottom",
                fontsize="small",
            )
    ax.axhline(1, color="0.3", linestyle="--", linewidth=1, label=f"{baseline} = 1")
    ax.set_xticks(x, [human_size(s) for s in sizes])
    ax.set_ylim(0, max(max(v) for v in series.values()) * 1.18)
    ax.spines[["top", "right"]].set_visible(False)


def _finish(fig: plt.Figure, path: str, title: str) -> None:
    """Title, one legend under the panels (each series once), and save."""
    legend: dict[str, Any] = {}
    for ax in fig.axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            legend.setdefault(label, handle)
    fig.legend(legend.values(), legend.keys(), loc="lower center", ncol=len(legend), frameon=False)
    fig.suptitle(title)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    fig.savefig(path, dpi=100)


def _by_size(rows: list[dict], value: Callable[[dict], float]) -> tuple[list[float], list[float]]:
    ordered = sorted(rows, key=lambda r: r["nbytes"])
    return [r["nbytes"] for r in ordered], [value(r) for r in ordered]


def plot_multiprocessing(doc: dict, path: str) -> None:
    """Send and round trip with blpickle's context as multiples of the standard library's, a
    panel per transport and data."""
    rows = doc["multiprocessing"]
    transports = list(dict.fromkeys(r["transport"] for r in rows))
    datas = list(dict.fromkeys(r["data"] for r in rows))
    with plt.rc_context(_STYLE):
        fig, axes = plt.subplots(len(transports), len(datas), figsize=(10, 1.2 + 3.4 * len(transports)), squeeze=False)
        for i, transport in enumerate(transports):
            for j, data in enumerate(datas):
                group = [r for r in rows if r["transport"] == transport and r["data"] == data]
                sizes, send = _by_size(group, lambda r: r["speedup_send"])
                _, trip = _by_size(group, lambda r: r["speedup_round_trip"])
                _columns(axes[i][j], sizes, {"send": send, "round trip": trip}, "standard library")
                axes[i][j].set_title(f"{transport}, {data}")
        _finish(fig, path, "blpickle's multiprocessing context, x the standard library's speed (higher is better)")
    plt.close(fig)


def plot_loky(doc: dict, path: str) -> None:
    """joblib.Parallel round trips with blpickle's loky pickler as multiples of loky's default,
    with and without joblib's auto-memmapping, a panel per data."""
    rows = doc["loky"]
    datas = list(dict.fromkeys(r["data"] for r in rows))
    with plt.rc_context(_STYLE):
        fig, axes = plt.subplots(1, len(datas), figsize=(10, 4.4), squeeze=False)
        for j, data in enumerate(datas):
            series = {}
            for max_nbytes in dict.fromkeys(r["max_nbytes"] for r in rows):
                group = [r for r in rows if r["data"] == data and r["max_nbytes"] == max_nbytes]
                sizes, series[f"max_nbytes={max_nbytes}"] = _by_size(group, lambda r: r["speedup"])
            _columns(axes[0][j], sizes, series, "loky default")
            axes[0][j].set_title(f"{data} data")
        _finish(fig, path, "joblib.Parallel round trip with blpickle, x loky's default (higher is better)")
    plt.close(fig)


def plot_dask(doc: dict, path: str) -> None:
    """scatter and gather with the blpickle family as multiples of dask's default serializers,
    a panel per data, and how many times fewer bytes of compressible data crossed loopback."""
    rows = doc["dask"]
    datas = list(dict.fromkeys(r["data"] for r in rows))
    with plt.rc_context(_STYLE):
        fig, axes = plt.subplot_mosaic([datas, ["bytes"] * len(datas)], figsize=(10, 8.4))
        for data in datas:
            group = [r for r in rows if r["data"] == data]
            sizes, scatter = _by_size(group, lambda r: r["speedup_scatter"])
            _, gather = _by_size(group, lambda r: r["speedup_gather"])
            _columns(axes[data], sizes, {"scatter": scatter, "gather": gather}, "dask default")
            axes[data].set_title(f"{data} data: speed")
        top = max(axes[data].get_ylim()[1] for data in datas)
        for data in datas:
            axes[data].set_ylim(0, top)
        group = [r for r in rows if r["data"] == datas[0]]
        sizes, fewer = _by_size(group, lambda r: r["dask default"]["wire_bytes"] / r["blpickle"]["wire_bytes"])
        _columns(axes["bytes"], sizes, {"bytes sent": fewer}, "dask default", colours=["tab:cyan"])
        axes["bytes"].set_title(f"{datas[0]} data: x fewer bytes sent")
        _finish(fig, path, "dask scatter and gather with the blpickle family, x dask's default serializers")
    plt.close(fig)


def plot_integrations(doc: dict, out: str, stem: str) -> list[str]:
    """Draw the charts of a joblib_bench.py or processes_bench.py result into ``out`` as
    ``<stem>-*.png``; return their paths (none for a document of another kind)."""
    charts: dict[str, Callable[[dict, str], None]] = {}
    if "dump_load" in doc:
        charts |= {"dump": plot_joblib_dump, "memory": plot_joblib_memory}
    sections: dict[str, Callable[[dict, str], None]] = {
        "multiprocessing": plot_multiprocessing,
        "loky": plot_loky,
        "dask": plot_dask,
    }
    charts |= {section: plot for section, plot in sections.items() if doc.get(section)}
    paths = []
    for name, plot in charts.items():
        paths.append(os.path.join(out, f"{stem}-{name}.png"))
        plot(doc, paths[-1])
    return paths
