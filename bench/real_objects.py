"""Real objects, the kind users save: blpickle's default against pickle, joblib and numpy,
side by side in one run (issue 29).

Objects: one noisy float64 array of 80 KB, 800 KB and 8 MB; 500 arrays of 200 KB and one of
100 MB (the same bytes); a dict of 50 arrays of 2 MB of mixed dtypes; a 1M-row DataFrame
(int, float, datetime, categorical, string and nullable columns); a CSR matrix of 5M nonzeros;
an xarray Dataset of 3 x 20 MB float32; the fp32 state dict of a 6-layer torch transformer
encoder (76 MB); 20,000 small arrays; a 200k-entry dict; a fitted 100-tree random forest and
a small dict of arrays dumped to and loaded from a path.
Peers: ``pickle`` protocol 5, joblib (zlib 3, lz4, and blpickle's ``"blosc"``), ``np.save``
for one array, ``np.savez`` for a dict or list of arrays and ``torch.save`` for the state
dict. Dumps go to and loads come from files already open (in the page cache, no fsync on
either side), except the path cases, where blpickle and joblib open the path themselves and
pickle runs both ways: to an open file and open + dump + close. Every sample loops over calls long enough to be measured;
rounds rotate which contender goes first; a contender stops repeating once it has used its
time budget. Each round also times one cold load: the file is written to the device and
evicted from the page cache first (`timing.CacheDropper`), where the OS allows it.
Figures: the best sample and the median one.

Run on its own: ``python -m bench --section real [--quick]``. Objects whose library is
missing (pandas, scipy, xarray, scikit-learn, torch) are skipped.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import os
import pickle
import tempfile
import time
from collections.abc import Callable
from typing import IO, Any

import joblib
import joblib.compressor
import numpy as np

import blpickle

from .contenders import pickle_dump_path, pickle_load_path
from .datasets import make_array, make_forest, make_objects, make_small_dict
from .datasets import same as same_array_or_model
from .goals import REAL_OURS as OURS
from .goals import REAL_PATH_REFERENCE as PATH_REFERENCE
from .goals import REAL_REFERENCE as REFERENCE
from .goals import real_relative as relative
from .report import text_table
from .tensors import transformer
from .timing import CacheDropper, fsync, spread, timed

#: Rounds, seconds a sample lasts at least, and seconds after which a contender stops repeating.
ROUNDS, SAMPLE_SECONDS, BUDGET = 7, 0.05, 10.0
QUICK_ROUNDS, QUICK_SAMPLE_SECONDS, QUICK_BUDGET = 3, 0.01, 1.0


@dataclasses.dataclass(frozen=True)
class Case:
    """One object to dump and load; ``path``: blpickle and joblib go through a path."""

    name: str
    make: Callable[[], Any]
    path: bool = False


def _noisy(nbytes: int) -> np.ndarray:
    return make_array("medium", nbytes // 8)


def mixed_arrays(count: int = 50, nbytes: int = 2_000_000) -> dict[str, np.ndarray]:
    """``count`` arrays of ``nbytes``, cycling through noisy float64 and float32, an int64
    ramp, small int32 counts, uint8 pixels and booleans."""
    rng = np.random.default_rng(0)
    makers: list[Callable[[int], np.ndarray]] = [
        lambda n: make_array("medium", n // 8),
        lambda n: make_array("medium", n // 4).astype(np.float32),
        lambda n: np.arange(n // 8, dtype=np.int64),
        lambda n: rng.poisson(20, n // 4).astype(np.int32),
        lambda n: np.convolve(rng.integers(0, 256, n), np.ones(8) / 8, "same").astype(np.uint8),
        lambda n: rng.random(n) < 0.1,
    ]
    return {f"array{i:02d}": makers[i % len(makers)](nbytes) for i in range(count)}


def make_frame(rows: int = 1_000_000) -> Any:
    """A DataFrame of ``rows``: int, float, datetime, categorical, string and nullable columns."""
    import pandas as pd

    rng = np.random.default_rng(0)
    nullable = pd.array(rng.integers(0, 1000, rows), dtype="Int64")
    nullable[rng.random(rows) < 0.1] = pd.NA
    return pd.DataFrame(
        {
            "id": np.arange(rows, dtype=np.int64),
            "price": np.round(rng.lognormal(3, 1, rows), 2),
            "time": pd.date_range("2024-01-01", periods=rows, freq="s"),
            "city": pd.Categorical(rng.choice(["Paris", "Lyon", "Nice", "Lille", "Brest"], rows)),
            "user": [f"user{i}" for i in rng.integers(0, 50_000, rows)],
            "quantity": nullable,
        }
    )


def make_csr(nonzeros: int = 5_000_000) -> Any:
    """A float64 CSR matrix of 100,000 rows with ``nonzeros`` nonzeros."""
    import scipy.sparse

    shape = (100_000, 20_000)
    density = nonzeros / (shape[0] * shape[1])
    return scipy.sparse.random_array(shape, density=density, format="csr", rng=0)


def make_dataset(nbytes: int = 20_000_000) -> Any:
    """An xarray Dataset of three float32 variables of ``nbytes`` each on (time, lat, lon)."""
    import xarray as xr

    times = nbytes // 4 // (50 * 100)
    rng = np.random.default_rng(0)
    base = np.sin(np.linspace(0, 20, times, dtype=np.float32))[:, None, None]

    def field(scale: float) -> np.ndarray:
        return (base * scale + rng.standard_normal((times, 50, 100), dtype=np.float32)).astype(np.float32)

    coords = {"time": np.arange(times), "lat": np.linspace(-60, 60, 50), "lon": np.linspace(0, 360, 100)}
    dims = ("time", "lat", "lon")
    return xr.Dataset({name: (dims, field(s)) for name, s in (("t2m", 10), ("u10", 3), ("v10", 3))}, coords=coords)


def make_state_dict(layers: int = 6) -> Any:
    """The fp32 state dict (torch tensors by name) of issue 30's seeded transformer encoder
    of ``layers`` layers."""
    return transformer(layers).state_dict()


def _or_none(make: Callable[[], Any]) -> Callable[[], Any]:
    """``make`` returning None when its library is missing."""

    def build() -> Any:
        try:
            return make()
        except ImportError:
            return None

    return build


def cases(scale: float = 1.0) -> list[Case]:
    """Every case, its sizes multiplied by ``scale`` (1: the issue's sizes)."""

    def n(value: float) -> int:
        return max(1, int(value * scale))

    return [
        Case("noisy float64, 80 KB", functools.partial(_noisy, n(80_000))),
        Case("noisy float64, 800 KB", functools.partial(_noisy, n(800_000))),
        Case("noisy float64, 8 MB", functools.partial(_noisy, n(8_000_000))),
        Case("500 arrays of 200 KB", lambda: [_noisy(n(200_000)) for _ in range(500)]),
        Case("1 array of 100 MB", functools.partial(_noisy, 500 * n(200_000))),
        Case("dict of 50 mixed arrays of 2 MB", functools.partial(mixed_arrays, 50, n(2_000_000))),
        Case("DataFrame, 1M rows", _or_none(functools.partial(make_frame, n(1_000_000)))),
        Case("CSR matrix, 5M nonzeros", _or_none(functools.partial(make_csr, n(5_000_000)))),
        Case("xarray Dataset, 3 x 20 MB", _or_none(functools.partial(make_dataset, n(20_000_000)))),
        Case("torch state dict, fp32, 76 MB", _or_none(functools.partial(make_state_dict, n(6)))),
        Case("20,000 small arrays", lambda: [np.full(100, i, dtype=np.float64) for i in range(n(20_000))]),
        Case("200k-entry dict", functools.partial(make_objects, n(200_000))),
        Case("forest (100 trees) via a path", functools.partial(make_forest, n(100)), path=True),
        Case("small dict of arrays via a path", make_small_dict, path=True),
    ]


# --- the contenders: dump(obj, file), load(file) on open files, or on paths -------------------


def _pickle_dump(obj: Any, file: IO[bytes]) -> None:
    pickle.dump(obj, file, protocol=5)


def _save(array: np.ndarray, file: IO[bytes]) -> None:
    np.save(file, array)


def _savez(obj: dict | list, file: IO[bytes]) -> None:
    if isinstance(obj, dict):
        np.savez(file, **obj)
    else:
        np.savez(file, *obj)


def _loadz(kind: type, file: IO[bytes]) -> dict | list:
    with np.load(file) as archive:
        if kind is dict:
            return {name: archive[name] for name in archive.files}
        return [archive[f"arr_{i}"] for i in range(len(archive.files))]


@dataclasses.dataclass(frozen=True)
class Contender:
    """A way to dump and load: to an open file (``path`` False) or through a path."""

    name: str
    dump: Callable[[Any, Any], Any]
    load: Callable[[Any], Any]
    path: bool = False


def _is_tensors(obj: Any) -> bool:
    """Whether ``obj`` is a dict of torch tensors (a state dict), without importing torch."""
    return isinstance(obj, dict) and bool(obj) and all(type(v).__module__.startswith("torch") for v in obj.values())


def _torch_load(file: IO[bytes]) -> Any:
    import torch

    return torch.load(file)


def _is_arrays(obj: Any) -> bool:
    values = obj.values() if isinstance(obj, dict) else obj if isinstance(obj, list) else ()
    return bool(values) and all(type(v) is np.ndarray for v in values)


def contenders(case: Case, obj: Any) -> list[Contender]:
    """The contenders that apply to ``obj``: blpickle first, then pickle (to an open file,
    and through a path in path cases), joblib's compressors, torch.save for a state dict,
    np.save or np.savez."""
    path = case.path
    table = [Contender(OURS, blpickle.dump, blpickle.load, path), Contender(REFERENCE, _pickle_dump, pickle.load)]
    if path:
        table.append(Contender(PATH_REFERENCE, pickle_dump_path, pickle_load_path, True))
    compressors = [("zlib-3", ("zlib", 3)), ("lz4", "lz4")]
    if "blosc" in joblib.compressor._COMPRESSORS:
        compressors.append(("blosc", "blosc"))
    table += [
        Contender(f"joblib {label}", functools.partial(joblib.dump, compress=compress), joblib.load, path)
        for label, compress in compressors
    ]
    if _is_tensors(obj):
        import torch

        table.append(Contender("torch.save", torch.save, _torch_load))
    if type(obj) is np.ndarray:
        table.append(Contender("np.save", _save, np.load))
    elif _is_arrays(obj) and not path:
        table.append(Contender("np.savez", _savez, functools.partial(_loadz, type(obj))))
    return table


def same(expected: Any, actual: Any) -> bool:
    """Whether a loaded object equals the original: arrays by dtype and value, containers
    item by item, frames, sparse matrices and datasets by their own equality, a model by its
    predictions."""
    if isinstance(expected, dict):
        return expected.keys() == actual.keys() and all(same(v, actual[k]) for k, v in expected.items())
    if isinstance(expected, (list, tuple)):
        return len(expected) == len(actual) and all(same(e, a) for e, a in zip(expected, actual, strict=True))
    if hasattr(expected, "identical"):  # xarray
        return bool(expected.identical(actual))
    if hasattr(expected, "equals") and hasattr(expected, "dtypes"):  # pandas
        return bool(expected.equals(actual)) and bool((expected.dtypes == actual.dtypes).all())
    if hasattr(expected, "tocsr"):  # scipy.sparse
        return (
            type(actual) is type(expected)
            and expected.dtype == actual.dtype
            and expected.shape == actual.shape
            and (expected != actual).nnz == 0
        )
    if type(expected).__module__.startswith("torch"):  # a tensor
        import torch

        return type(actual) is type(expected) and expected.dtype == actual.dtype and torch.equal(expected, actual)
    if isinstance(expected, np.ndarray) or hasattr(expected, "predict_proba"):
        return same_array_or_model(expected, actual)
    return bool(expected == actual)


# --- measuring ----------------------------------------------------------------------------


class _Target:
    """Where a contender dumps and loads: a path, or a file opened once for both."""

    def __init__(self, path: str, contender: Contender) -> None:
        self.path = path
        self.file = None if contender.path else open(path, "w+b")  # noqa: SIM115 (closed by close())
        self._contender = contender

    def dump(self, obj: Any) -> None:
        if self.file is None:
            self._contender.dump(obj, self.path)
            return
        self.file.seek(0)
        self._contender.dump(obj, self.file)
        self.file.truncate()

    def load(self) -> Any:
        if self.file is None:
            return self._contender.load(self.path)
        self.file.seek(0)
        return self._contender.load(self.file)

    def size(self) -> int:
        if self.file is not None:
            self.file.flush()
        return os.path.getsize(self.path)

    def load_cold(self, drop: Callable[[str], None]) -> float:
        """Seconds of one load after the file is written to the device and evicted."""
        if self.file is not None:
            self.file.flush()
        fsync(self.path)
        drop(self.path)
        return timed(self.load)[0]

    def close(self) -> None:
        if self.file is not None:
            self.file.close()


def _sample(call: Callable[[], Any], number: int) -> float:
    """Seconds per call of a loop of ``number`` calls."""

    def loop() -> None:
        for _ in range(number):
            call()

    return timed(loop)[0] / number


def measure(
    case: Case,
    obj: Any,
    rounds: int,
    seconds: float,
    budget: float,
    directory: str,
    drop: Callable[[str], None] | None = None,
) -> list[dict]:
    """One row per contender of ``case``: file size, and the `spread` of seconds per dump,
    per load and, with ``drop``, per cold load, sampled in rounds that rotate which
    contender goes first."""
    todo = contenders(case, obj)
    targets = [_Target(os.path.join(directory, f"{i}.bin"), c) for i, c in enumerate(todo)]
    speeds = ("dump", "load", "cold") if drop else ("dump", "load")
    rows: list[dict] = [{"case": case.name, "method": c.name, **{what: [] for what in speeds}} for c in todo]
    numbers = []
    try:
        for target, row in zip(targets, rows, strict=True):  # warm-up, check, and loop sizes
            took = timed(functools.partial(target.dump, obj))[0]
            row["file_bytes"] = target.size()
            loaded_in, loaded = timed(target.load)
            if not same(obj, loaded):
                raise AssertionError(f"{row['method']} did not load back the {case.name} it dumped")
            del loaded
            numbers.append(tuple(max(1, math.ceil(seconds / max(t, 1e-7))) for t in (took, loaded_in)))
            if min(took, loaded_in) >= budget / rounds:  # slow: this run is a sample, not a warm-up
                row["dump"].append(took)
                row["load"].append(loaded_in)
        for round_ in range(rounds):
            first = round_ % len(todo)
            for i in list(range(first, len(todo))) + list(range(first)):
                row, target = rows[i], targets[i]
                spent = sum(row["dump"]) * numbers[i][0] + sum(row["load"]) * numbers[i][1] + sum(row.get("cold", ()))
                if row["dump"] and spent > budget and (not drop or row["cold"]):
                    continue
                row["dump"].append(_sample(functools.partial(target.dump, obj), numbers[i][0]))
                row["load"].append(_sample(target.load, numbers[i][1]))
                if drop:
                    row["cold"].append(target.load_cold(drop))
    finally:
        for target in targets:
            target.close()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(target.path)
    for row in rows:
        row.update({what: spread(row[what]) for what in speeds})
    return rows


def run(quick: bool, directory: str | None = None, scale: float = 1.0) -> list[dict]:
    """Every row of the section, each case's table printed once measured."""
    rounds, seconds, budget = (
        (QUICK_ROUNDS, QUICK_SAMPLE_SECONDS, QUICK_BUDGET) if quick else (ROUNDS, SAMPLE_SECONDS, BUDGET)
    )
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(dir=directory, prefix="blpickle-real-") as tmp:
        drop = CacheDropper(tmp)
        cold = f"cold loads evicted with {', '.join(drop.used)}" if drop.possible else "no cold loads (cannot evict)"
        print(f"\nReal objects: {rounds} interleaved rounds, open files in the page cache, no fsync; {cold}")
        for case in cases(scale):
            obj = case.make()
            if obj is None:
                print(f"\n{case.name}: skipped (its library is missing)")
                continue
            started = time.perf_counter()
            measured = measure(case, obj, rounds, seconds, budget, tmp, drop if drop.possible else None)
            del obj
            rows += measured
            print(f"\n{case.name} ({time.perf_counter() - started:.0f} s)")
            print(text_table(table(measured)), flush=True)
    return rows


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3g}"


def table(rows: list[dict]) -> list[tuple[str, ...]]:
    """One line per row: size, dump, load and cold load ms best (median), and each as x
    pickle's; "-" where a figure was not measured."""
    lines: list[tuple[str, ...]] = [
        (
            "case / method",
            "MB",
            "dump ms",
            "load ms",
            "cold load ms",
            "dump x pickle",
            "load x pickle",
            "cold load x pickle",
            "pickle size / size",
        )
    ]
    for row in rows:
        case, method = row["case"], row["method"]
        times = (
            f"{_ms(row[what]['min'])} ({_ms(row[what]['median'])})" if what in row else "-"
            for what in ("dump", "load", "cold")
        )
        x = (relative(rows, case, method, what) for what in ("dump", "load", "cold", "size"))
        lines.append(
            (
                f"{case} / {method}" if method == OURS else f"  {method}",
                f"{row['file_bytes'] / 1e6:.3g}",
                *times,
                *("-" if value is None else f"{value:.2f}x" for value in x),
            )
        )
    return lines
