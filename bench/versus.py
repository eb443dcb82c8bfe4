"""blpickle's load of the real objects against the blpickle of another commit, side by side in
one process (and pickle's load, for the goals).

The other commit's ``blpickle`` package is copied out of git under the name ``blpickle_base``
(its imports are relative) and imported beside this checkout's; both load the same files,
written once by this checkout, from open files in the page cache, interleaved in rounds that
rotate which goes first. Figures: ms per load, best (median), and the speed ratios of the best
samples.

Run: ``python -m bench.versus BASE_COMMIT [--quick] [--only TEXT ...]`` from the repository root.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import os
import pickle
import subprocess
import sys
import tempfile
from typing import Any

import blpickle

from .real_objects import cases, same
from .report import text_table
from .timing import interleaved


def import_commit(commit: str, directory: str) -> Any:
    """Import the ``blpickle`` package of ``commit`` as ``blpickle_base``."""
    archive = subprocess.run(["git", "archive", commit, "blpickle"], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", directory], input=archive, check=True)
    os.rename(os.path.join(directory, "blpickle"), os.path.join(directory, "blpickle_base"))
    sys.path.insert(0, directory)
    return importlib.import_module("blpickle_base")


def _load(module: Any, file: Any) -> Any:
    file.seek(0)
    return module.load(file)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("base", help="the commit to compare with")
    parser.add_argument("--quick", action="store_true", help="3 rounds of 0.02 s samples (default 7 of 0.1 s)")
    parser.add_argument("--only", nargs="+", default=(), help="the cases whose name contains one of these")
    args = parser.parse_args(argv)
    rounds, seconds = (3, 0.02) if args.quick else (7, 0.1)
    lines = [("case", "MB", "base ms", "this ms", "pickle ms", "this x base", "base x pickle", "this x pickle")]
    with tempfile.TemporaryDirectory(prefix="blpickle-versus-") as tmp:
        base = import_commit(args.base, tmp)
        for case in cases():
            if args.only and not any(text in case.name for text in args.only):
                continue
            obj = case.make()
            if obj is None:
                continue
            ours_path, pickle_path = os.path.join(tmp, "record.blp"), os.path.join(tmp, "record.pkl")
            blpickle.dump(obj, ours_path)
            with open(pickle_path, "wb") as file:
                pickle.dump(obj, file, protocol=5)
            with open(ours_path, "rb") as ours, open(pickle_path, "rb") as theirs:
                for module in (base, blpickle):
                    if not same(obj, _load(module, ours)):
                        raise AssertionError(f"{module.__name__} did not load the {case.name} back")
                times = interleaved(
                    {
                        "base": functools.partial(_load, base, ours),
                        "this": functools.partial(_load, blpickle, ours),
                        "pickle": functools.partial(_load, pickle, theirs),
                    },
                    rounds,
                    seconds,
                )
            best = {label: spread["min"] for label, spread in times.items()}
            lines.append(
                (
                    case.name,
                    f"{os.path.getsize(ours_path) / 1e6:.3g}",
                    *(
                        f"{times[k]['min'] * 1e3:.3g} ({times[k]['median'] * 1e3:.3g})"
                        for k in ("base", "this", "pickle")
                    ),
                    f"{best['base'] / best['this']:.2f}x",
                    f"{best['pickle'] / best['base']:.2f}x",
                    f"{best['pickle'] / best['this']:.2f}x",
                )
            )
            print(text_table(lines[:1] + lines[-1:]), flush=True)
            del obj
    print(f"\nLoads, base {args.base}: best (median) ms, ratios of the best samples")
    print(text_table(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
