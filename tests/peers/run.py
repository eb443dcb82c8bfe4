"""Run the peer suites: other projects' pickle tests, from the installed packages, with
blpickle as ``pickle`` (see plugin.py).

    python tests/peers/run.py [SUITE ...] [-- PYTEST_ARGS ...]

SUITE is one of numpy, numpy-ma, pandas, joblib (default: all), each run in its own process.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent

#: suite -> (package whose conftest applies, test paths inside the installed packages, pytest args)
SUITES = {
    "numpy": ("numpy", ["numpy/_core/tests"], ["-k", "pickl or reduce"]),
    "numpy-ma": ("numpy", ["numpy/ma/tests"], []),
    "pandas": ("pandas", ["pandas/tests/io/test_pickle.py"], []),
    "joblib": ("joblib", ["joblib/test/test_numpy_pickle.py"], []),
}


def site_packages(package: str) -> Path:
    spec = importlib.util.find_spec(package)
    assert spec is not None and spec.origin is not None, package
    return Path(spec.origin).parent.parent


def run_suite(name: str, extra: list[str]) -> int:
    package, paths, args = SUITES[name]
    root = site_packages(package)
    sys.path.insert(0, str(HERE))
    import plugin

    argv = [
        "-c", str(HERE / "pytest.ini"),
        "--rootdir", str(root),
        "--confcutdir", str(root / package),
        "-p", "no:cacheprovider",
        *args,
        *([] if extra else ["--peers-check-list"]),
        *extra,
        *(str(root / path) for path in paths),
    ]
    return pytest.main(argv, plugins=[plugin])


def main(argv: list[str]) -> int:
    extra: list[str] = []
    if "--" in argv:
        argv, extra = argv[: argv.index("--")], argv[argv.index("--") + 1 :]
    names = argv or list(SUITES)
    unknown = [name for name in names if name not in SUITES]
    if unknown:
        print(f"unknown suite {unknown}: choose from {', '.join(SUITES)}", file=sys.stderr)
        return 2
    if len(names) == 1:
        return run_suite(names[0], extra)
    status = 0
    for name in names:
        start = time.monotonic()
        code = subprocess.call([sys.executable, __file__, name, "--", *extra])
        print(f"peers: {name} exited {code} in {time.monotonic() - start:.0f} s", flush=True)
        status = status or code
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
