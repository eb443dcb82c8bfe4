"""Time ``load(safe=True)`` (the restricted pure-Python unpickler) against a plain load.

Run: ``python bench/safe_load.py [--rounds N]``: prints the best of N rounds of each, and
their ratio, for an object-heavy graph and for a dict of big arrays.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import blpickle


def cases() -> dict[str, object]:
    """The objects timed: a dict of 200k small tuples, and a dict of 8 arrays of 32 MB."""
    return {
        "dict of 200k tuples": {i: (i, str(i), float(i)) for i in range(200_000)},
        "dict of 8 arrays of 32 MB": {f"a{i}": np.random.default_rng(i).random(4_000_000) for i in range(8)},
    }


def best_of(rounds: int, data: bytes, safe: bool) -> float:
    """Return the shortest time of ``rounds`` loads of ``data``, in seconds."""
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        blpickle.loads(data, safe=safe)
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    rounds = parser.parse_args().rounds
    for name, obj in cases().items():
        data = blpickle.dumps(obj)
        plain, safe = best_of(rounds, data, False), best_of(rounds, data, True)
        print(f"{name}: plain {plain * 1e3:.0f} ms, safe {safe * 1e3:.0f} ms, safe/plain {safe / plain:.1f}x")


if __name__ == "__main__":
    main()
