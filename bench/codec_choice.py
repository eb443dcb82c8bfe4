"""Why blpickle's default codec is "auto": each codec choice, and zstd's block size, side by side.

Run ``python -m bench.codec_choice`` (``--quick`` for 8 MB arrays). For each dataset of the
Bloscpack paper (80 MB by default), and with ``--datasets weights`` for float32 weights
(``0.02 * N(0, 1)``: random mantissas, as in a model's layers), it dumps and loads an array
with codec "auto", zstd and lz4 (level 1, shuffle), uncompressed (the copy every codec adds
to), and with zstd at three block sizes and in larger chunks, in interleaved rounds (the
best of ``--repeat`` runs counts); it prints a table and writes
``bench/results/codec_choice.json``.
Files are written to the page cache (no fsync): this compares codecs, not disks.

Two reference rows: ``blosc2.save_tensor``/``load_tensor`` (the goals' yardstick: zstd level
5, Blosc2's own block size), and the fault-in of a fresh result (allocating the array and
touching each page: the part of any load that no codec avoids).
"""

from __future__ import annotations

import argparse
import mmap
import os
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import blosc2
import numpy as np

import blpickle
import blpickle.engine.policy

from .datasets import ENTROPIES, make_array
from .report import write_result

#: The paper's datasets, and float32 weights.
DATASETS = (*ENTROPIES, "weights")
RESULTS = Path(__file__).parent / "results" / "codec_choice.json"
#: (name, blpickle options, zstd block size or None for blpickle's own).
VARIANTS = [
    ("auto (default)", {}, None),
    ("zstd, 1 MiB blocks", {"codec": "zstd"}, None),
    ("lz4", {"codec": "lz4"}, None),
    ("raw (codec None)", {"codec": None}, None),
    ("zstd, 256 KiB blocks", {"codec": "zstd"}, 256 << 10),
    ("zstd, 512 KiB blocks", {"codec": "zstd"}, 512 << 10),
    ("zstd, 1 MiB blocks, 16 MiB chunks", {"codec": "zstd", "chunk_size": 16 << 20}, None),
    ("zstd, 512 KiB blocks, 64 MiB chunks", {"codec": "zstd", "chunk_size": 64 << 20}, 512 << 10),
]


def _dataset(name: str, nbytes: int) -> np.ndarray:
    """The array of dataset ``name`` (`DATASETS`), of about ``nbytes`` bytes."""
    if name == "weights":
        return (0.02 * np.random.default_rng(0).standard_normal(nbytes // 4)).astype(np.float32)
    return make_array(name, nbytes // 8)


def _fault_in(nbytes: int) -> np.ndarray:
    """Allocate ``nbytes`` as a load allocates its result, and touch every page."""
    out = np.empty(nbytes, dtype=np.uint8)
    out[:: mmap.PAGESIZE] = 0
    return out


@contextmanager
def zstd_blocksize(size: int | None) -> Iterator[None]:
    """Use ``size`` as blpickle's zstd block size inside the block (None: leave it)."""
    saved = blpickle.engine.policy.ZSTD_BLOCKSIZE
    blpickle.engine.policy.ZSTD_BLOCKSIZE = size or saved
    try:
        yield
    finally:
        blpickle.engine.policy.ZSTD_BLOCKSIZE = saved


def measure(array: np.ndarray, path: str, repeat: int) -> list[dict]:
    """Best dump and load seconds and the file size of every variant on ``array``, then of
    the two references."""
    tensor_path = path + ".b2"
    best = {name: [float("inf"), float("inf"), 0] for name, _, _ in VARIANTS}
    best_tensor, best_fault_in = [float("inf"), float("inf")], float("inf")
    for _ in range(repeat):
        for name, options, blocksize in VARIANTS:
            with zstd_blocksize(blocksize):
                start = time.perf_counter()
                blpickle.dump(array, path, **options)
                dumped = time.perf_counter()
                blpickle.load(path)
                loaded = time.perf_counter()
            row = best[name]
            row[:] = [min(row[0], dumped - start), min(row[1], loaded - dumped), os.path.getsize(path)]
        start = time.perf_counter()
        blosc2.save_tensor(array, tensor_path, mode="w")
        dumped = time.perf_counter()
        blosc2.load_tensor(tensor_path)
        loaded = time.perf_counter()
        _fault_in(array.nbytes)
        faulted = time.perf_counter()
        best_tensor = [min(best_tensor[0], dumped - start), min(best_tensor[1], loaded - dumped)]
        best_fault_in = min(best_fault_in, faulted - loaded)
    codecs = {}
    for name, options, blocksize in VARIANTS:  # which codec "auto" chose
        with zstd_blocksize(blocksize):
            blpickle.dump(array, path, **options)
        codecs[name] = blpickle.inspect(path).buffers[0].codec or "none"
    rows = [_row(name, codecs[name], array.nbytes, dump, load, size) for name, (dump, load, size) in best.items()]
    rows.append(_row("blosc2 save_tensor", "zstd-5", array.nbytes, *best_tensor, os.path.getsize(tensor_path)))
    rows.append(_row("fault-in of the result", "-", array.nbytes, None, best_fault_in, None))
    return rows


def _row(variant: str, codec: str, nbytes: int, dump: float | None, load: float, size: int | None) -> dict:
    return {
        "variant": variant,
        "codec": codec,
        "dump_MBps": None if dump is None else nbytes / dump / 1e6,
        "load_MBps": nbytes / load / 1e6,
        "ratio": None if size is None else nbytes / size,
    }


def _cell(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=float, default=80, help="size of each array in MB (default 80)")
    parser.add_argument("--repeat", type=int, default=5, help="runs per variant; the best counts")
    parser.add_argument("--quick", action="store_true", help="8 MB arrays, 2 runs")
    parser.add_argument(
        "--datasets", nargs="+", choices=DATASETS, default=ENTROPIES, help="datasets (default the paper's three)"
    )
    parser.add_argument("--out", type=Path, default=RESULTS, help="JSON file to write")
    args = parser.parse_args()
    mb, repeat = (8, 2) if args.quick else (args.mb, args.repeat)
    results: dict = {"mb": mb, "rows": []}
    print(f"{'dataset':8s} {'variant':36s} {'codec':6s} {'dump MB/s':>10s} {'load MB/s':>10s} {'ratio':>8s}")
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "array.blp")
        for entropy in args.datasets:
            array = _dataset(entropy, int(mb * 1e6))
            for row in measure(array, path, repeat):
                results["rows"].append({"dataset": entropy, **row})
                print(
                    f"{entropy:8s} {row['variant']:36s} {row['codec']:6s} {_cell(row['dump_MBps'], '10,.0f'):>10s} "
                    f"{row['load_MBps']:10,.0f} {_cell(row['ratio'], '8.4g'):>8s}"
                )
    write_result(args.out, "bench.codec_choice", results)


if __name__ == "__main__":
    main()
