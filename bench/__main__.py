"""Reproduce the Bloscpack paper's benchmark with blpickle and its contenders, side by side.

Sections (``--section``, default all):
  study      low/medium/high entropy arrays of 80 KB, 80 MB and 800 MB (and > 4 GiB with
             --huge), an object-heavy dict and a fitted random forest; dumps include fsync;
             loads with a hot and a cold page cache; the Pareto goals of the presets.
  fixed      small objects against pickle: what every record costs (bench/fixed_cost.py).
  processes  many small tasks through multiprocessing, loky, joblib.Memory and dask with
             blpickle against their defaults, and a big buffer (bench/small_tasks.py).
  pipeline   blpickle's throughput over Blosc2's own on the same big buffer (bench/pipeline.py).
  tensors    torch state dicts, an optimizer state, jax and ml_dtypes arrays against pickle's
             size and torch.save/torch.load's speed (bench/tensors.py; needs the tensor extras).
  real       real objects (DataFrame, CSR, xarray, a forest, many arrays...) against pickle,
             joblib and numpy, to and from open files (bench/real_objects.py).
Prints tables and the goals, writes JSON (the study also Markdown and plots).

Run: ``python -m bench [--quick] [--huge] [--section NAME ...] [--only NAME ...] [--dir DIR] [--out DIR]``.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import re
import tempfile
import time
from typing import Any

import numpy as np

from . import fixed_cost, goals, pipeline, real_objects, report, section_tables, small_tasks, tensors
from .contenders import DEFAULT, Contender, blpickle_contender, contenders
from .datasets import ENTROPIES, SIZES, make_array, make_forest, make_objects, nbytes, same
from .memory import extra_peak_mib
from .timing import CacheDropper, fsync, spread, timed

#: Runs per timing by size (the best is kept, the median shows the spread) and the seconds
#: of dumps and loads after which a contender stops repeating.
REPEATS = {"small": 20, "mid": 5, "large": 3, "huge": 1, "graph": 5}
QUICK_REPEATS = {"small": 5, "mid": 2, "graph": 2}
BUDGET, QUICK_BUDGET = 60.0, 1.0
SPEEDS = ("dump", "load_hot", "load_cold")
#: Sizes whose every run follows an untimed one of the same contender: tiny timings and
#: allocation-heavy graphs otherwise depend on what the previous contender left behind.
WARM_UP = ("small", "graph")
RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def _wanted(name: str, args: argparse.Namespace) -> bool:
    """Whether to run this contender: named by ``--only``, or needed by the goals in quick mode."""
    if args.only:
        return any(part in name for part in args.only)
    return not args.quick or name in goals.REFERENCES


class Run:
    """The settings of one benchmark run and the figures collected so far."""

    def __init__(self, args: argparse.Namespace, directory: str) -> None:
        self.quick = args.quick
        self.directory = directory
        self.repeats = QUICK_REPEATS if args.quick else REPEATS
        self.budget = QUICK_BUDGET if args.quick else BUDGET
        self.sizes = ["small", "mid"] if args.quick else ["small", "mid", "large", *(["huge"] if args.huge else [])]
        self.contenders = [c for c in contenders() if _wanted(c.name, args)]
        self.drop = CacheDropper(directory)
        self.rows: list[dict] = []
        self.memory: list[dict] = []
        self.threads: list[dict] = []

    def path(self, contender: Contender) -> str:
        return os.path.join(self.directory, re.sub(r"\W+", "-", contender.name) + contender.suffix)

    def measure(self, todo: list[Contender], obj: Any, dataset: str, size: str) -> list[dict]:
        """Time the contenders in rounds, one run each per round, so that all of them meet the
        same machine conditions (each round starts with the next contender: whoever runs first
        after a new dataset is slower); a contender stops once it has used the time budget.

        Returns one row per contender with every run of ``dump``, ``load_hot``, ``load_cold``.
        """
        base = {"dataset": dataset, "size": size, "nbytes": nbytes(obj)}
        rows = [{**base, "method": c.name, "dump": [], "load_hot": [], "load_cold": []} for c in todo]
        for round_ in range(self.repeats[size]):
            first = round_ % len(todo)
            for contender, row in zip(todo[first:] + todo[:first], rows[first:] + rows[:first], strict=True):
                spent = sum(sum(row[what]) for what in SPEEDS)
                if round_ == 0 or spent < self.budget:
                    self._one_run(contender, obj, row, first=round_ == 0)
        for row in rows:
            for what in SPEEDS:
                row[what] = spread(row[what]) if row[what] else None
        return rows

    def _one_run(self, contender: Contender, obj: Any, row: dict, first: bool) -> None:
        """Dump (with fsync), load hot, evict, load cold, remove the file; the first run also
        records the ratio and checks the loaded object."""
        path = self.path(contender)
        if row["size"] in WARM_UP:
            contender.dump(obj, path)
            contender.load(path)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        row["dump"].append(timed(lambda: (contender.dump(obj, path), fsync(path)))[0])
        seconds, loaded = timed(functools.partial(contender.load, path))
        row["load_hot"].append(seconds)
        if first:
            row["file_bytes"] = os.path.getsize(path)
            row["ratio"] = row["nbytes"] / row["file_bytes"]
            if not same(obj, loaded):
                where = f"{row['dataset']}/{row['size']}"
                raise AssertionError(f"{contender.name} did not load back what it dumped ({where})")
        del loaded
        if self.drop.possible:
            self.drop(path)
            row["load_cold"].append(timed(functools.partial(contender.load, path))[0])
        os.unlink(path)

    def run_group(self, obj: Any, dataset: str, size: str) -> None:
        started = time.perf_counter()
        arrays = isinstance(obj, np.ndarray)
        todo = [c for c in self.contenders if (arrays or not c.arrays_only) and not (c.slow and size == "huge")]
        group = self.measure(todo, obj, dataset, size)
        self.rows += group
        print(report.group_text(group, time.perf_counter() - started), flush=True)

    def run_memory(self, array: np.ndarray, dataset: str, size: str) -> None:
        """Peak memory of every contender (blpickle default only in quick mode) on this array."""
        source = os.path.join(self.directory, "source.npy")
        np.save(source, array)
        for contender in self.contenders:
            if (self.quick and contender.name != DEFAULT) or (contender.slow and size == "huge"):
                continue
            path = self.path(contender)
            extra = {op: extra_peak_mib(contender.name, op, source, path) for op in ("dump", "load")}
            self.memory.append({"dataset": dataset, "size": size, "method": contender.name, **extra})
            os.unlink(path)
        os.unlink(source)

    def run_threads(self, array: np.ndarray, dataset: str, size: str) -> None:
        """blpickle default with 1, 2, 4, ... up to every core."""
        cores = os.cpu_count() or 1
        counts = sorted({*(2**k for k in range(cores.bit_length()) if 2**k < cores), cores})
        todo = [blpickle_contender(f"blpickle nthreads={n}", nthreads=n) for n in counts]
        rows = self.measure(todo, array, dataset, size)
        self.threads += [{**row, "nthreads": n} for row, n in zip(rows, counts, strict=True)]

    def run(self) -> None:
        memory_size = self.sizes[-1]
        threads_size = "mid" if self.quick else "large"
        for size in self.sizes:
            for entropy in ENTROPIES:
                array = make_array(entropy, SIZES[size])
                self.run_group(array, entropy, size)
                if size == memory_size:
                    self.run_memory(array, entropy, size)
                if size == threads_size and any(c.name == DEFAULT for c in self.contenders):
                    self.run_threads(array, entropy, size)
                del array
        for dataset, obj in (("objects", make_objects()), ("forest", make_forest())):
            if obj is not None:
                self.run_group(obj, dataset, "graph")


SECTIONS = ("study", "fixed", "processes", "pipeline", "tensors", "real")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.markdown:
        with open(args.markdown) as file:
            print(section_tables.markdown(json.load(file)))
        return 0
    if args.replot:
        with open(args.replot) as file:
            doc = json.load(file)
        stem = os.path.splitext(os.path.basename(args.replot))[0]
        out = os.path.dirname(args.replot) or "."
        if "rows" in doc:
            write_results(doc, out, stem)
        else:  # a result of bench/joblib_bench.py or bench/processes_bench.py
            print("Plots:", *report.plot_integrations(doc, out, stem))
        return 0
    started = time.perf_counter()
    machine = report.machine_info()
    sections = args.section or list(SECTIONS)
    doc: dict[str, Any] = {"machine": machine, "settings": {"sections": sections, "quick": args.quick}, "goals": []}
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="blpickle-bench-") as directory:
        if "study" in sections:
            run = Run(args, directory)
            print(report.preamble(machine, run.drop.used))
            run.run()
            doc["settings"].update(
                sizes=run.sizes,
                repeats=run.repeats,
                budget_s=run.budget,
                cold_cache=dict(run.drop.used),
                contenders=[c.name for c in run.contenders],
            )
            doc.update(rows=run.rows, memory=run.memory, threads=run.threads)
            doc["goals"] += [goal.to_dict() for goal in goals.check(run.rows, run.memory)]
            print("\nPareto: each peer against the default, and the best preset's figures over the peer's")
            print(report.text_table(goals.pareto_table(run.rows)), flush=True)
        if "fixed" in sections:
            doc["fixed"] = fixed_cost.run(args.quick, args.dir)
            doc["goals"] += [goal.to_dict() for goal in goals.check_fixed(doc["fixed"])]
        if "processes" in sections:
            doc["processes"] = small_tasks.run(args.quick)
            doc["goals"] += [goal.to_dict() for goal in goals.check_processes(doc["processes"])]
        if "pipeline" in sections:
            doc["pipeline"] = pipeline.run(args.quick)
            doc["goals"] += [goal.to_dict() for goal in goals.check_pipeline(doc["pipeline"])]
        if "tensors" in sections:
            doc["tensors"] = tensors.run(args.quick)
            doc["goals"] += [goal.to_dict() for goal in goals.check_tensors(doc["tensors"])]
        if "real" in sections:
            doc["real"] = real_objects.run(args.quick, args.dir)
            doc["goals"] += [goal.to_dict() for goal in goals.check_real(doc["real"])]
    doc["settings"]["seconds"] = round(time.perf_counter() - started)
    doc["settings"]["load_average_at_end"] = os.getloadavg()[0]
    stem = "quick" if args.quick else "huge" if args.huge else "full"
    if "study" in sections:
        print(report.summary_text(doc))
        write_results(doc, args.out, stem)
    else:
        print("\nGoals, from this run:")
        print("\n".join(f"  {goal['status']:4s}  {goal['summary']}" for goal in doc["goals"]))
        write_sections(doc, args.out, "-".join(sections) + ("-quick" if args.quick else ""))
    print(f"\nDone in {doc['settings']['seconds']} s.")
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add = parser.add_argument
    add(
        "--quick",
        action="store_true",
        help="small and mid sizes, fewer runs, only the contenders the goals name (under two minutes)",
    )
    add(
        "--huge",
        action="store_true",
        help="add a 4.3 GB size (over 4 GiB; slow compressors skipped; takes long)",
    )
    add("--section", nargs="+", choices=SECTIONS, help="run only these sections (default: all)")
    add("--only", nargs="+", metavar="NAME", help="study: run the contenders whose name contains one")
    add("--dir", help="where to write the files (default: the system's temporary directory)")
    add("--out", default=RESULTS, help="where to write results (default: bench/results)")
    add(
        "--replot",
        metavar="JSON",
        help="run nothing: write the Markdown and plots of a saved run again (or the plots of a "
        "joblib_bench.py or processes_bench.py result)",
    )
    add(
        "--markdown",
        metavar="JSON",
        help="run nothing: print the Markdown tables of the fixed, processes, pipeline and real sections of a saved run",
    )
    return parser


def write_json(doc: dict, out: str, stem: str) -> None:
    """Write ``<stem>.json`` into ``out``."""
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, f"{stem}.json"), "w") as file:
        json.dump(doc, file, indent=1)
    print(f"Results: {out}/{stem}.json")


def write_sections(doc: dict, out: str, stem: str) -> None:
    """Write ``<stem>.json`` and the Markdown tables of its sections, ``<stem>.md``, into ``out``."""
    write_json(doc, out, stem)
    with open(os.path.join(out, f"{stem}.md"), "w") as file:
        file.write(section_tables.markdown(doc) + "\n")
    print(f"Results: {out}/{stem}.md")


def write_results(doc: dict, out: str, stem: str) -> None:
    """Write ``<stem>.json``, ``<stem>.md`` and the ``<stem>-*.png`` plots into ``out``."""
    write_json(doc, out, stem)
    with open(os.path.join(out, f"{stem}.md"), "w") as file:
        file.write(report.markdown_report(doc))
    report.plot_headline(doc["rows"], os.path.join(out, f"{stem}-headline.png"))
    for size in dict.fromkeys(r["size"] for r in doc["rows"] if r["size"] in SIZES):
        report.plot_speeds(doc["rows"], os.path.join(out, f"{stem}-speed-{size}.png"), size)
    report.plot_ratios(doc["rows"], os.path.join(out, f"{stem}-ratio.png"))
    report.plot_growth(doc["rows"], os.path.join(out, f"{stem}-growth.png"))
    if doc["threads"]:
        report.plot_threads(doc["threads"], os.path.join(out, f"{stem}-threads.png"))
    print(f"Results: {out}/{stem}.md, {stem}-*.png")


if __name__ == "__main__":
    raise SystemExit(main())
