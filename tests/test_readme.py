"""The README's main job (bench/demo.py) says what it is doing as it goes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _env() -> dict[str, str]:
    """The environment of a subprocess that imports this tree's blpickle."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}


def test_the_main_job_says_what_it_is_doing_before_the_table(tmp_path):
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "demo.py"), "--size-mb", "2", "--repeat", "1", "--dir", str(tmp_path)],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    lines = done.stdout.splitlines()
    table = next(i for i, line in enumerate(lines) if line.startswith("method "))
    progress = lines[:table]
    assert progress[0].startswith("Making the experiment object")
    for number, method in enumerate(["blpickle", "pickle (protocol 5)", "joblib zlib 3", "joblib lz4"], 1):
        steps = [line.split(": ", 1)[1] for line in progress if line.startswith(f"[{number}/4] {method}: ")]
        assert [step.split()[0] for step in steps[:3]] == ["dumping", "loading", "checking"], steps
        assert "best dump" in steps[3] and len(steps) == 4, steps
