"""Dump and load a realistic object with blpickle, pickle and joblib; print what it costs.

The object is a small "experiment": a sensor time series (timestamps, two noisy float64
channels, int16 labels), a float32 image stack and some metadata, ~160 MB in all.

Run: ``python bench/demo.py [--size-mb N] [--dir DIR]``. It says what it is doing as it goes
(a line per step), then prints the table.
"""

from __future__ import annotations

import argparse
import os
import pickle
import tempfile
import time
from collections.abc import Callable

import joblib
import numpy as np

import blpickle


def make_experiment(size_mb: int, seed: int = 0) -> dict:
    """Return a dict of arrays of about ``size_mb`` MB, like a saved experiment."""
    rng = np.random.default_rng(seed)
    n = size_mb * 1_000_000 // 30
    t = np.arange(n)
    return {
        "timestamps": np.datetime64("2026-01-01T00:00:00", "ms") + t.astype("m8[ms]"),
        "signal": np.stack(
            [np.sin(t / 500) + rng.normal(0, 0.05, n), np.cos(t / 700) + rng.normal(0, 0.05, n)], axis=1
        ),
        "labels": (t // 10_000 % 7).astype(np.int16),
        "frames": (rng.random((max(n // 4096, 1), 64, 64)) * 255).astype(np.float32).round(),
        "meta": {"instrument": "demo", "rate_hz": 1000, "channels": ["x", "y"]},
    }


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _pickle_dump(obj: object, path: str) -> None:
    with open(path, "wb") as f:
        pickle.dump(obj, f, protocol=5)


def _pickle_load(path: str) -> object:
    with open(path, "rb") as f:
        return pickle.load(f)


def contenders() -> dict[str, tuple[Callable[[object, str], None], Callable[[str], object]]]:
    """Return name -> (dump(obj, path), load(path)) for every method compared."""
    return {
        "blpickle": (blpickle.dump, blpickle.load),
        "pickle (protocol 5)": (_pickle_dump, _pickle_load),
        "joblib zlib 3": (lambda o, p: joblib.dump(o, p, compress=("zlib", 3)), joblib.load),
        "joblib lz4": (lambda o, p: joblib.dump(o, p, compress="lz4"), joblib.load),
    }


def _best(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def _say(message: str) -> None:
    """Print a progress line at once (the run takes minutes)."""
    print(message, flush=True)


def run(size_mb: int, directory: str, repeat: int) -> list[dict]:
    """Time every contender on the experiment object, saying what it does as it goes; return
    one row per method."""
    _say(f"Making the experiment object ({size_mb} MB of arrays)...")
    obj = make_experiment(size_mb)
    nbytes = sum(v.nbytes for v in obj.values() if isinstance(v, np.ndarray))
    rows = []
    methods = contenders()
    for number, (name, (dump, load)) in enumerate(methods.items(), 1):
        step = f"[{number}/{len(methods)}] {name}:"
        path = os.path.join(directory, "experiment." + name.split()[0])

        def dump_synced(dump: Callable = dump, path: str = path) -> None:
            dump(obj, path)
            _fsync(path)

        _say(f"{step} dumping {repeat} times (with fsync)...")
        dump_s = _best(dump_synced, repeat)
        _say(f"{step} loading {repeat} times...")
        load_s = _best(lambda load=load, path=path: load(path), repeat)
        _say(f"{step} checking the loaded arrays...")
        loaded = load(path)
        assert all(np.array_equal(loaded[k], obj[k]) for k in obj if isinstance(obj[k], np.ndarray))
        size = os.path.getsize(path)
        _say(f"{step} {size / 1e6:.1f} MB, best dump {dump_s:.2f} s, best load {load_s:.2f} s")
        rows.append(
            {"method": name, "size": size, "ratio": nbytes / size, "dump_s": dump_s, "load_s": load_s, "nbytes": nbytes}
        )
    return rows


def print_table(rows: list[dict]) -> None:
    base = rows[0]
    print(
        f"{'method':22s} {'file MB':>9s} {'ratio':>7s} {'dump MB/s':>10s} {'load MB/s':>10s} {'blpickle dump/load speed-up':>28s}"
    )
    for r in rows:
        mb = r["nbytes"] / 1e6
        speedup = f"{r['dump_s'] / base['dump_s']:.1f}x / {r['load_s'] / base['load_s']:.1f}x"
        print(
            f"{r['method']:22s} {r['size'] / 1e6:9.1f} {r['ratio']:7.2f} {mb / r['dump_s']:10.0f} {mb / r['load_s']:10.0f} {speedup:>28s}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mb", type=int, default=160, help="size of the arrays (default: 160)")
    parser.add_argument("--dir", default=None, help="where to write the files (default: a temporary directory)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per timing; the best is kept (default: 3)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(dir=args.dir) as directory:
        rows = run(args.size_mb, directory, args.repeat)
    print(f"\nObject: {rows[0]['nbytes'] / 1e6:.0f} MB of arrays; dumps include fsync; best of {args.repeat} runs.")
    print_table(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
