"""GPU tensors: a CUDA state dict and a cupy array through blpickle, against ``torch.save``
and ``torch.load``.

The seeded encoder of `bench.tensors` (fp32, ~19M parameters) with its weights on the GPU,
dumped to the page cache (neither side fsyncs; blpickle copies each storage to the host) and
loaded back on the CPU and onto the GPU (`blpickle.tensors.map_location` against
``torch.load``'s ``map_location``); a 64 MB cupy array dumped and loaded back onto the GPU.
Interleaved rounds, each call ending with ``torch.cuda.synchronize()``; best (median). Writes
``bench/results/gpu.json``.

Run: ``python -m bench.gpu [--quick]`` on a machine with a CUDA device, torch and cupy.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

import blpickle
from blpickle.tensors import map_location

from .report import run_arguments, text_table, write_result
from .tensors import transformer
from .timing import interleaved

RESULTS = Path(__file__).parent / "results" / "gpu.json"


def _synced(call: Callable[[], Any]) -> Callable[[], None]:
    import torch

    def run() -> None:
        call()
        torch.cuda.synchronize()

    return run


def main(argv: list[str] | None = None) -> int:
    import cupy
    import torch

    args, rounds, seconds = run_arguments(__doc__.splitlines()[0], RESULTS, (3, 0.1), (7, 0.3), argv)
    state = {key: value.cuda() for key, value in transformer().state_dict().items()}
    nbytes = sum(t.numel() * t.element_size() for t in state.values())
    array = cupy.asarray(np.random.default_rng(0).standard_normal((4096, 4096)).astype(np.float32))
    with tempfile.TemporaryDirectory(prefix="blpickle-gpu-") as tmp:
        ours, theirs, cupy_path = (os.path.join(tmp, name) for name in ("state.blp", "state.pt", "cupy.blp"))

        def load_on_gpu() -> Any:
            with map_location("cuda"):
                return blpickle.load(ours)

        def load_cupy() -> Any:
            with map_location("cuda"):
                return blpickle.load(cupy_path)

        calls = {
            "dump": {"blpickle": lambda: blpickle.dump(state, ours), "torch": lambda: torch.save(state, theirs)},
            "load on the CPU": {
                "blpickle": lambda: blpickle.load(ours),
                "torch": lambda: torch.load(theirs, map_location="cpu"),
            },
            "load on the GPU": {"blpickle": load_on_gpu, "torch": lambda: torch.load(theirs, map_location="cuda")},
        }
        blpickle.dump(state, ours)
        torch.save(state, theirs)
        blpickle.dump(array, cupy_path)
        assert all(torch.equal(load_on_gpu()[key], value) for key, value in state.items())
        assert bool((load_cupy() == array).all())
        sizes = {"blpickle": os.path.getsize(ours), "torch": os.path.getsize(theirs)}
        rows = []
        for op, pair in calls.items():
            times = interleaved({name: _synced(call) for name, call in pair.items()}, rounds, seconds)
            rows.append({"op": op, **times, "speed_best": times["torch"]["min"] / times["blpickle"]["min"]})
        cupy_times = interleaved(
            {"dump": _synced(lambda: blpickle.dump(array, cupy_path)), "load": _synced(load_cupy)}, rounds, seconds
        )
    lines = [("fp32 state dict on the GPU", "blpickle ms", "torch ms", "blpickle GB/s", "torch's time / blpickle's")]
    for row in rows:
        best = row["blpickle"]["min"], row["torch"]["min"]
        lines.append(
            (
                row["op"],
                f"{best[0] * 1e3:.1f} ({row['blpickle']['median'] * 1e3:.1f})",
                f"{best[1] * 1e3:.1f} ({row['torch']['median'] * 1e3:.1f})",
                f"{nbytes / best[0] / 1e9:.2f}",
                f"{row['speed_best']:.2f}x",
            )
        )
    print(text_table(lines))
    print(
        f"{nbytes / 1e6:.1f} MB of weights; files: blpickle {sizes['blpickle'] / 1e6:.1f} MB, "
        f"torch.save {sizes['torch'] / 1e6:.1f} MB ({sizes['torch'] / sizes['blpickle']:.2f}x)"
    )
    for op, spread in cupy_times.items():
        print(f"cupy float32 array, 67 MB, {op}: {spread['min'] * 1e3:.1f} ms ({spread['median'] * 1e3:.1f})")
    write_result(
        args.out,
        "bench.gpu",
        {
            "device": torch.cuda.get_device_name(),
            "nbytes": nbytes,
            "sizes": sizes,
            "rows": rows,
            "cupy": {"nbytes": array.nbytes, **cupy_times},
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
