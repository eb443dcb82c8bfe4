"""Run the peer suites: other projects' own pickle tests, from the installed packages, with
blpickle as ``pickle`` (see plugin.py; the exceptions are in expected.py).

    python tests/peers/run.py [SUITE ...] [-- PYTEST_ARGS ...]

SUITE is one of numpy, numpy-ma, pandas, joblib (default: all of them, each in a process of
its own, since each loads its package's conftest.py). PYTEST_ARGS go to pytest; without them,
entries of expected.py that name no collected test fail the run. Exits non-zero if a suite fails.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import time
from pathlib import Path

import plugin  # this script's folder is on sys.path
import pytest

HERE = Path(__file__).resolve().parent

#: suite -> (the package whose tests run, test paths inside site-packages, pytest arguments)
SUITES = {
    # (test_simd's reduce_max_min tests check SIMD reductions, not pickling: they skip on CPUs
    # without the instruction sets they name)
    "numpy": ("numpy", ["numpy/_core/tests"], ["-k", "(pickl or reduce) and not test_simd"]),
    "numpy-ma": ("numpy", ["numpy/ma/tests"], []),
    "pandas": ("pandas", ["pandas/tests/io/test_pickle.py"], []),
    "joblib": ("joblib", ["joblib/test/test_numpy_pickle.py"], []),
}


def run_suite(name: str, extra: list[str]) -> int:
    """Run one suite in this process; return pytest's exit code."""
    package, paths, args = SUITES[name]
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        raise SystemExit(f"the {name} suite needs {package} installed: pip install -e '.[test]'")
    site = Path(spec.origin).parent.parent
    return pytest.main(
        [
            *("-c", str(HERE / "peers.ini")),  # not the project's own pytest settings
            *("--rootdir", str(site)),  # test ids relative to site-packages, as in expected.py
            *("--confcutdir", str(site / package)),  # the package's own conftest.py applies
            *("-p", "no:cacheprovider"),  # writes nothing into site-packages
            *args,
            *(extra or ["--peers-check-list"]),
            *(str(site / path) for path in paths),
        ],
        plugins=[plugin],
    )


def main(argv: list[str]) -> int:
    extra: list[str] = []
    if "--" in argv:
        argv, extra = argv[: argv.index("--")], argv[argv.index("--") + 1 :]
    names = argv or list(SUITES)
    unknown = [name for name in names if name not in SUITES]
    if unknown:
        print(f"unknown suite {', '.join(unknown)}: choose from {', '.join(SUITES)}", file=sys.stderr)
        return 2
    if len(names) == 1:
        return run_suite(names[0], extra)
    status = 0
    for name in names:
        start = time.monotonic()
        code = subprocess.call([sys.executable, __file__, name, "--", *extra])
        print(f"peers: {name} exited with {code} after {time.monotonic() - start:.0f} s", flush=True)
        status = status or code
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
