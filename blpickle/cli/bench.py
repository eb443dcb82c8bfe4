"""``blpickle bench``: time dump and load of one object with blpickle, pickle and joblib.

A quick, self-contained comparison for the machine at hand (the full study, with cold caches,
fsync'd writes, memory peaks and plots, is ``python -m bench`` in the source tree). Files are
written to a temporary directory and read back from the page cache; each time is the best of
``repeat`` runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import gc
import math
import os
import pickle
import platform
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np

from .. import __version__
from ..options import PRESETS, available_threads
from ..pickler import dump as blpickle_dump
from ..unpickler import load as blpickle_load
from .arguments import (
    add_codec_options,
    add_command,
    add_load_options,
    check_input,
    codec_options,
    input_format,
)
from .formats import ConversionError, UsageError, read_object
from .output import EXIT_OK, Progress, error_text, human_size, print_json, warn

__all__ = ["DATASETS", "Method", "add_commands", "format_table", "make_dataset", "methods", "run"]

#: The Bloscpack paper's datasets: low, medium and high entropy.
DATASETS = ("low", "medium", "high")
#: Elements (8 bytes each) of each dataset: 80 MB, or 8 MB with ``--quick``.
DEFAULT_ELEMENTS = 10_000_000
QUICK_ELEMENTS = 1_000_000
MB = 1_000_000


def make_dataset(entropy: str, n: int, seed: int = 0) -> np.ndarray:
    """Return ``n`` elements: low = ``arange`` int64, medium = a sine (period 1000) plus
    gaussian noise (sigma 0.1) float64, high = uniform random float64."""
    if entropy == "low":
        return np.arange(n, dtype=np.int64)
    rng = np.random.default_rng(seed)
    if entropy == "high":
        return rng.random(n)
    out = rng.standard_normal(n)
    out *= 0.1
    out += np.sin(np.arange(n) * (2 * math.pi / 1000))
    return out


@dataclasses.dataclass(frozen=True)
class Method:
    """One way to write and read a file."""

    name: str
    dump: Callable[[Any, str], None]
    load: Callable[[str], Any]


def _pickle_dump(obj: Any, path: str) -> None:
    with open(path, "wb") as file:
        pickle.dump(obj, file, protocol=5)


def _pickle_load(path: str) -> Any:
    with open(path, "rb") as file:
        return pickle.load(file)


def _blpickle(name: str, nthreads: int | None, **options: Any) -> Method:
    settings: dict[str, Any] = {"nthreads": nthreads} if nthreads else {}
    return Method(
        name,
        lambda obj, path: blpickle_dump(obj, path, **options, **settings),
        lambda path: blpickle_load(path, nthreads=nthreads),
    )


def methods(nthreads: int | None = None, custom: Mapping[str, Any] | None = None) -> tuple[list[Method], list[str]]:
    """Return the methods to compare (pickle first: it sets the reference size of objects
    that are not arrays) and notes on the ones left out."""
    found = [Method("pickle (protocol 5)", _pickle_dump, _pickle_load)]
    found += [_blpickle(f"blpickle {name}", nthreads, preset=name) for name in PRESETS]
    if custom:
        label = " ".join(f"{k}={v}" for k, v in custom.items())
        found.append(_blpickle(f"blpickle {label}", nthreads, **custom))
    notes = []
    try:
        import joblib
    except ImportError:
        notes.append("joblib is not installed: pip install joblib to compare with it")
        return found, notes
    found.append(Method("joblib zlib 3", lambda o, p: joblib.dump(o, p, compress=("zlib", 3)), joblib.load))
    try:
        import lz4  # noqa: F401
    except ImportError:
        notes.append("lz4 is not installed: pip install lz4 to compare with joblib's lz4")
    else:
        found.append(Method("joblib lz4", lambda o, p: joblib.dump(o, p, compress="lz4"), joblib.load))
    from ..integrations.joblib import register

    register()
    found.append(Method("joblib blosc", lambda o, p: joblib.dump(o, p, compress="blosc"), joblib.load))
    return found, notes


def _best(fn: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    best, result = math.inf, None
    for _ in range(repeat):
        result = None
        gc.collect()
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return best, result


def _same(expected: Any, actual: Any) -> bool | None:
    if isinstance(expected, np.ndarray):
        return isinstance(actual, np.ndarray) and actual.dtype == expected.dtype and np.array_equal(actual, expected)
    return None  # not checked


def run(
    objects: list[tuple[str, Any]],
    contenders: list[Method],
    directory: str | None = None,
    repeat: int = 3,
    step: Callable[[str], None] | None = None,
) -> Iterator[dict[str, Any]]:
    """Dump and load each object with each method; yield one row per (object, method).

    A row holds ``dataset``, ``method``, ``nbytes`` (the reference size: an array's bytes, or
    the size of the plain pickle for other objects), ``size`` (the file's), ``ratio``,
    ``dump_s``, ``load_s``, ``dump_mbps``, ``load_mbps`` and ``same`` (the loaded array
    equals the original; None when not checked), or ``error``. ``step(label)`` is called
    before each measurement (for a progress bar).
    """
    with tempfile.TemporaryDirectory(prefix="blpickle-bench-", dir=directory) as tmp:
        for dataset, obj in objects:
            nbytes = obj.nbytes if isinstance(obj, np.ndarray) else None
            for index, method in enumerate(contenders):
                if step is not None:
                    step(f"{dataset}: {method.name}")
                path = os.path.join(tmp, f"{index}.bin")
                row: dict[str, Any] = {"dataset": dataset, "method": method.name}
                try:
                    dump_s, _ = _best(functools.partial(method.dump, obj, path), repeat)
                    size = os.path.getsize(path)
                    load_s, loaded = _best(functools.partial(method.load, path), repeat)
                    same = _same(obj, loaded)
                    del loaded
                except Exception as exc:  # one method failing must not stop the others
                    row["error"] = f"{type(exc).__name__}: {exc}"
                    yield row
                    continue
                finally:
                    if os.path.exists(path):
                        os.unlink(path)
                if nbytes is None:
                    nbytes = size  # pickle runs first: objects are measured by their pickle
                row.update(
                    nbytes=nbytes,
                    size=size,
                    ratio=nbytes / size if size else 1.0,
                    dump_s=dump_s,
                    load_s=load_s,
                    dump_mbps=nbytes / MB / dump_s if dump_s else math.inf,
                    load_mbps=nbytes / MB / load_s if load_s else math.inf,
                    same=same,
                )
                yield row


def format_table(rows: list[dict[str, Any]]) -> str:
    """Return the rows of one dataset as an aligned text table."""
    header = ("method", "dump MB/s", "load MB/s", "ratio", "size")
    lines = []
    for row in rows:
        if "error" in row:
            continue
        mark = "" if row.get("same") in (True, None) else "  (loaded data differs!)"
        lines.append(
            (
                row["method"] + mark,
                f"{row['dump_mbps']:.0f}",
                f"{row['load_mbps']:.0f}",
                f"{row['ratio']:.2f}",
                human_size(row["size"]),
            )
        )
    widths = [max(len(cells[i]) for cells in (header, *lines)) for i in range(len(header))]
    out = []
    for n, cells in enumerate((header, *lines)):
        out.append(
            "  ".join(
                f"{c:<{w}}" if i == 0 else f"{c:>{w}}" for i, (c, w) in enumerate(zip(cells, widths, strict=True))
            )
        )
        if not n:
            out.append("  ".join("-" * w for w in widths))
    out += [f"{row['method']}: failed: {row['error']}" for row in rows if "error" in row]
    return "\n".join(line.rstrip() for line in out)


BENCH_EPILOG = """\
Without FILE, times the Bloscpack paper's datasets: low (arange int64), medium (sine plus
noise, float64) and high (uniform random float64) entropy, 80 MB each (8 MB with --quick).
With FILE, loads it (running its pickle: see "blpickle convert --help" about --safe) and times
that object. Files go to a temporary directory and are read back from the page cache; each
time is the best of --repeat runs. Codec options add a "blpickle" row with those options.
For the full study (cold cache, fsync, memory, plots) run "python -m bench" in the sources.

examples:
  blpickle bench --quick
  blpickle bench model.pkl --repeat 5
  blpickle bench --codec zstd --clevel 3 --json > results.json
"""


def add_commands(commands: Any) -> None:
    """Add ``bench`` to ``commands`` (what ``ArgumentParser.add_subparsers`` returns)."""
    parser = add_command(commands, "bench", "time dump/load against pickle and joblib", BENCH_EPILOG)
    parser.add_argument("file", metavar="FILE", nargs="?", help="time this file's object (default: sample datasets)")
    parser.add_argument("--quick", action="store_true", help="8 MB datasets, one run each")
    parser.add_argument("--size-mb", type=float, metavar="MB", help="size of each sample dataset (default: 80)")
    parser.add_argument("--repeat", type=int, metavar="N", help="best of N runs (default: 3, 1 with --quick)")
    parser.add_argument(
        "--only",
        nargs="+",
        metavar="WORD",
        help="only the methods whose names contain one of these words",
    )
    parser.add_argument("--dir", metavar="DIR", help="where to write the files (default: the temporary directory)")
    parser.add_argument("--json", action="store_true", help="print JSON for scripts")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_load_options(parser, "FILE")
    add_codec_options(parser)
    parser.set_defaults(run=cmd_bench)


def cmd_bench(args: argparse.Namespace) -> int:
    """Run ``blpickle bench``; return the exit status."""
    options = codec_options(args)
    if args.repeat is not None and args.repeat < 1:
        raise UsageError("--repeat must be at least 1")
    repeat = args.repeat if args.repeat is not None else 1 if args.quick else 3
    objects: list[tuple[str, Any]] = []
    if args.file is not None:
        check_input(args.file)
        source_format = input_format(args.file, args.from_format)
        try:
            obj, _ = read_object(args.file, source_format, safe=args.safe, allowed=args.allow or None)
        except (UsageError, ConversionError):
            raise
        except Exception as exc:
            raise ConversionError(
                f"cannot read {args.file} as {source_format}: {type(exc).__name__}: {error_text(exc)}"
            ) from None
        objects.append((os.path.basename(args.file), obj))
    else:
        if args.size_mb is not None:
            if args.size_mb <= 0:
                raise UsageError("--size-mb must be positive")
            n = max(int(args.size_mb * 1_000_000 // 8), 1)
        else:
            n = QUICK_ELEMENTS if args.quick else DEFAULT_ELEMENTS
        objects = [(name, make_dataset(name, n)) for name in DATASETS]
    contenders, notes = methods(args.nthreads, options or None)
    if args.only:
        wanted = [w.lower() for w in args.only]
        contenders = [m for m in contenders if any(w in m.name.lower() for w in wanted)]
        if not contenders:
            raise UsageError(f"--only {' '.join(args.only)} matches no method")
    for note in notes:
        warn("bench", note)
    rows = []
    with Progress(len(objects) * len(contenders), "bench", enabled=not args.no_progress) as progress:
        for row in run(objects, contenders, args.dir, repeat, progress.step):
            rows.append(row)
    machine = _machine()
    settings = {
        "repeat": repeat,
        "quick": args.quick,
        "file": args.file,
        "options": options,
        "nthreads": args.nthreads,
    }
    if args.json:
        print_json({"machine": machine, "settings": settings, "notes": notes, "results": rows})
        return EXIT_OK
    print(
        f"blpickle {machine['blpickle']}, numpy {machine['numpy']}, blosc2 {machine['blosc2']}, "
        f"Python {machine['python']}, {machine['cpus']} CPUs; best of {repeat}, "
        "files read back from the page cache"
    )
    descriptions = {
        "low": "low entropy: arange int64",
        "medium": "medium entropy: sine + noise float64",
        "high": "high entropy: uniform random float64",
    }
    for name, obj in objects:
        own = [r for r in rows if r["dataset"] == name]
        reference = next((r["nbytes"] for r in own if "nbytes" in r), None)
        label = descriptions.get(name, name) if args.file is None else name
        size = f"{human_size(reference)}" if reference is not None else "?"
        basis = "" if hasattr(obj, "nbytes") and not isinstance(obj, dict) else " (its pickle's size)"
        print(f"\n{label}, {size}{basis}")
        print(format_table(own))
    return EXIT_OK


def _machine() -> dict[str, Any]:
    """The versions and CPUs a bench ran with."""
    import blosc2

    return {
        "blpickle": __version__,
        "numpy": np.__version__,
        "blosc2": blosc2.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": available_threads(),
    }
