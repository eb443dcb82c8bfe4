"""blpickle's presets on the real objects: file size, dump and load time against the default.

The objects of `bench.real_objects` that hold numpy buffers (one noisy array of 800 KB and
8 MB, 500 arrays of 200 KB, a dict of 50 mixed arrays, a 1M-row DataFrame, a CSR matrix, an
xarray Dataset, 20,000 small arrays, a forest), dumped to and loaded from memory with each
preset of `blpickle.PRESETS` but "raw"; interleaved rounds, best samples. Figures: the default's
file size over the preset's (above 1: the preset's file is smaller) and the preset's time over
the default's (above 1: the preset is slower). Writes ``bench/results/presets.json``.

Run: ``python -m bench.presets [--quick]``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import blpickle

from .real_objects import cases
from .report import run_arguments, text_table, write_result
from .timing import interleaved

RESULTS = Path(__file__).parent / "results" / "presets.json"
PRESETS = ("default", "fast", "balanced", "dense", "small")
#: The real objects left out: one array of 80 KB (a single raw stream, the same for every
#: preset), the 100 MB array (the Bloscpack study measures it), the small dict and the 200k-entry
#: dict (no buffer of 64 KB).
SKIPPED = ("noisy float64, 80 KB", "1 array of 100 MB", "small dict", "200k-entry dict")


def main(argv: list[str] | None = None) -> int:
    args, rounds, seconds = run_arguments(__doc__.splitlines()[0], RESULTS, (3, 0.05), (7, 0.2), argv)
    rows = []
    lines = [("object / preset", "size: default's / preset's", "dump: preset's time / default's", "load: ...")]
    for case in cases():
        obj = None if case.name.startswith(SKIPPED) else case.make()
        if obj is None:
            continue
        records = {preset: blpickle.dumps(obj, preset=preset) for preset in PRESETS}
        dumps = interleaved({p: lambda p=p, o=obj: blpickle.dumps(o, preset=p) for p in PRESETS}, rounds, seconds)
        loads = interleaved({p: lambda r=records[p]: blpickle.loads(r) for p in PRESETS}, rounds, seconds)
        for preset in PRESETS:
            row = {
                "case": case.name,
                "preset": preset,
                "bytes": len(records[preset]),
                "dump": dumps[preset],
                "load": loads[preset],
                "smaller": len(records["default"]) / len(records[preset]),
                "dump_time": dumps[preset]["min"] / dumps["default"]["min"],
                "load_time": loads[preset]["min"] / loads["default"]["min"],
            }
            rows.append(row)
            if preset != "default":
                lines.append(
                    (
                        f"{case.name} / {preset}",
                        f"{row['smaller']:.3f}x",
                        f"{row['dump_time']:.2f}x",
                        f"{row['load_time']:.2f}x",
                    )
                )
        print(text_table(lines), flush=True)
        lines = lines[:1]
    write_result(args.out, "bench.presets", {"rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
