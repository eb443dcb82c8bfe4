"""Object graphs against C pickle, many times over: the full study's two graphs are dumped
and loaded a few times among many contenders, too few for differences of 10-20%.

Run ``python -m bench.graphs`` (``--rounds N``, default 200). The fitted random forest (400
small arrays) and the 200k-entry dict are dumped to a file and loaded back, by blpickle's
default and by C pickle (protocol 5), ``--rounds`` times each, in rounds that run the two in a
shuffled order (seeded), the file in the page cache (no fsync: this compares serializers, not
disks). It prints the median times and their ratio, and writes ``bench/results/graphs.json``.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import random
import statistics
import tempfile
from pathlib import Path
from typing import Any

from .contenders import DEFAULT, by_name
from .datasets import make_forest, make_objects, nbytes
from .report import machine_info, text_table
from .timing import timed

RESULTS = Path(__file__).parent / "results" / "graphs.json"


_STUDY = by_name()
#: Label in the table -> the full study's contender.
CONTENDERS = {"blpickle": _STUDY[DEFAULT], "pickle": _STUDY["pickle p5"]}


#: Seeds the order of the contenders in each round.
SEED = 0


def measure(obj: Any, directory: str, rounds: int) -> dict:
    """Median dump and load seconds of each contender, over rounds that each run every
    contender once, in a shuffled order (a fixed order would give one the other's leftovers:
    garbage to collect, a warm or cold cache)."""
    runs: dict[str, list[float]] = {f"{name} {step}": [] for name in CONTENDERS for step in ("dump", "load")}
    order = random.Random(SEED)
    for _ in range(rounds):
        for name in order.sample(list(CONTENDERS), len(CONTENDERS)):
            contender = CONTENDERS[name]
            path = os.path.join(directory, name + contender.suffix)
            runs[f"{name} dump"].append(timed(functools.partial(contender.dump, obj, path))[0])
            runs[f"{name} load"].append(timed(functools.partial(contender.load, path))[0])
    return {key: statistics.median(times) for key, times in runs.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=200, help="dumps and loads of each (default 200)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="JSON file to write")
    args = parser.parse_args()
    graphs = {"forest": make_forest(), "objects": make_objects()}
    results: dict[str, Any] = {"machine": machine_info(), "rounds": args.rounds, "order": "shuffled", "graphs": {}}
    lines = [
        (
            "graph",
            "MB",
            "blpickle dump ms",
            "pickle dump ms",
            "dump speed",
            "blpickle load ms",
            "pickle load ms",
            "load speed",
        )
    ]
    with tempfile.TemporaryDirectory() as directory:
        for name, obj in graphs.items():
            if obj is None:  # no scikit-learn
                continue
            medians = measure(obj, directory, args.rounds)
            results["graphs"][name] = {"nbytes": nbytes(obj), **medians}
            lines.append(
                (
                    name,
                    f"{nbytes(obj) / 1e6:.2f}",
                    *(f"{medians[f'{who} dump'] * 1e3:.2f}" for who in CONTENDERS),
                    f"{medians['pickle dump'] / medians['blpickle dump']:.2f}x",
                    *(f"{medians[f'{who} load'] * 1e3:.2f}" for who in CONTENDERS),
                    f"{medians['pickle load'] / medians['blpickle load']:.2f}x",
                )
            )
    print(text_table(lines))
    print("speed: blpickle's relative to pickle's (median times); the goals ask >= 0.91x (objects), >= 0.77x (forest)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))
    print(f"Results: {args.out}")


if __name__ == "__main__":
    main()
