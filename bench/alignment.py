"""Loads of one raw array (``codec=None``, 100 MB of noisy float64) whose payload starts at
several offsets within a page of its file, optionally against the blpickle of another commit.

The kernel copies a page-aligned part of a file to an address a few bytes past a page
boundary several times slower than to one aligned alike; blpickle allocates the arrays it
reads into aligned as the record's raw payloads are (64 bytes), so that no payload offset
is slow. Each file is the same record behind a few bytes of padding; the loads run from
open files in the page cache, interleaved in rounds that rotate which goes first. Figures:
ms per load, best (median); it prints a table and writes ``bench/results/alignment.json``.

Run: ``python -m bench.alignment [--base COMMIT] [--quick]`` from the repository root.
"""

from __future__ import annotations

import argparse
import functools
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

import blpickle

from .datasets import make_array
from .report import text_table, write_result
from .timing import interleaved
from .versus import import_commit

RESULTS = Path(__file__).parent / "results" / "alignment.json"
#: Where the payload starts within a page of the file.
PAGE_OFFSETS = (0, 448, 2048)
PAGE = 4096


def write_files(directory: str, array: np.ndarray) -> dict[int, tuple[str, int]]:
    """Write the record of ``array`` once for each of `PAGE_OFFSETS`, behind the padding that
    puts its payload there; return ``{page offset: (path, padding)}``."""
    record = blpickle.dumps(array, codec=None)
    payload = record.find(array[:64].tobytes())
    files = {}
    for offset in PAGE_OFFSETS:
        padding = (offset - payload) % PAGE
        path = os.path.join(directory, f"at-{offset}.blp")
        with open(path, "wb") as file:
            file.write(bytes(padding) + record)
        files[offset] = (path, padding)
    return files


def _load(module: Any, path: str, padding: int) -> Any:
    with open(path, "rb") as file:
        file.seek(padding)
        return module.load(file)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", help="also load with the blpickle of this commit")
    parser.add_argument("--quick", action="store_true", help="8 MB, 3 rounds")
    args = parser.parse_args(argv)
    nbytes, rounds = (8_000_000, 3) if args.quick else (100_000_000, 7)
    array = make_array("medium", nbytes // 8)
    with tempfile.TemporaryDirectory() as directory:
        modules = {"blpickle": blpickle}
        if args.base:
            modules[f"blpickle {args.base}"] = import_commit(args.base, directory)
        files = write_files(directory, array)
        calls = {
            (name, offset): functools.partial(_load, module, path, padding)
            for name, module in modules.items()
            for offset, (path, padding) in files.items()
        }
        assert all(np.array_equal(call(), array) for call in calls.values())
        times = interleaved({f"{name} @{offset}": call for (name, offset), call in calls.items()}, rounds, 0.2)
    rows = [{"method": name, "page_offset": offset, **times[f"{name} @{offset}"]} for (name, offset) in calls]
    lines = [("method", "payload offset in its page", "load ms, best (median)")]
    lines += [
        (row["method"], str(row["page_offset"]), f"{row['min'] * 1e3:.1f} ({row['median'] * 1e3:.1f})") for row in rows
    ]
    print(f"Raw array of {nbytes / 1e6:g} MB, loaded from an open file in the page cache:")
    print(text_table(lines))
    write_result(RESULTS, "bench.alignment", {"nbytes": nbytes, "rounds": rounds, "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
