"""What is dumped: the Bloscpack paper's arrays and two object graphs without big buffers."""

from __future__ import annotations

import math
import pickle
from typing import Any

import numpy as np

ENTROPIES = ("low", "medium", "high")
#: Elements (8 bytes each) per size, as in the paper: 80 KB, 80 MB, 800 MB, and > 4 GiB.
SIZES = {"small": 10_000, "mid": 10_000_000, "large": 100_000_000, "huge": 540_000_000}
#: Generating in blocks keeps the peak at the array itself (no full-size temporaries).
_BLOCK = 1 << 20


def make_array(entropy: str, n: int, seed: int = 0) -> np.ndarray:
    """Return ``n`` elements of data: low = ``arange`` int64, medium = a sine (period 1000)
    plus gaussian noise (sigma 0.1) float64, high = uniform random float64."""
    if entropy == "low":
        return np.arange(n, dtype=np.int64)
    rng = np.random.default_rng(seed)
    out = np.empty(n)
    if entropy == "high":
        return rng.random(out=out)
    rng.standard_normal(out=out)
    out *= 0.1
    for start in range(0, n, _BLOCK):
        stop = min(start + _BLOCK, n)
        out[start:stop] += np.sin(np.arange(start, stop) * (2 * math.pi / 1000))
    return out


def make_objects(count: int = 200_000) -> dict:
    """An object-heavy graph with no big buffers: ``count`` string keys to small tuples."""
    return {f"k{i}": (i, float(i), str(i)) for i in range(count)}


def make_small_dict() -> dict:
    """A small object with arrays, dumped to a path: two 8 KB arrays and a string."""
    return {"a": np.arange(1000), "b": np.linspace(0, 1, 1000), "name": "small"}


def make_forest(trees: int = 100) -> Any:
    """A graph of many small arrays: a fitted random forest, or None without sklearn."""
    try:
        from sklearn.datasets import make_classification
        from sklearn.ensemble import RandomForestClassifier
    except ImportError:
        return None
    x, y = make_classification(n_samples=2000, n_features=20, random_state=0)
    return RandomForestClassifier(n_estimators=trees, random_state=0, n_jobs=1).fit(x, y)


def nbytes(obj: Any) -> int:
    """The size speeds and ratios are measured against: the array's bytes, or the plain
    pickle's size for object graphs."""
    if isinstance(obj, np.ndarray):
        return obj.nbytes
    return len(pickle.dumps(obj, protocol=5))


def same(expected: Any, actual: Any) -> bool:
    """Whether a loaded object equals the original: arrays and dicts by value, a fitted model
    by its predictions (its structured arrays have padding bytes that need not survive)."""
    if isinstance(expected, np.ndarray):
        return isinstance(actual, np.ndarray) and actual.dtype == expected.dtype and np.array_equal(actual, expected)
    if isinstance(expected, dict):
        return actual == expected
    probe = np.random.default_rng(1).standard_normal((500, expected.n_features_in_))
    return np.array_equal(actual.predict_proba(probe), expected.predict_proba(probe))
