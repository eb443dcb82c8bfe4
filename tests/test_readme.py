"""The README's examples run as written: the Quick start, then the command line on its files."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: Benchmarks take minutes: the README's ``blpickle bench`` line is left to bench/'s own checks.
NOT_RUN = ("blpickle bench",)


def _env() -> dict[str, str]:
    """The environment of a subprocess that imports this tree's blpickle."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}


def _block(heading: str, language: str) -> str:
    """Return the first ``language`` code block under the README's ``## heading``."""
    text = (ROOT / "README.md").read_text()
    section = text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    return re.search(rf"```{language}\n(.*?)```", section, re.DOTALL).group(1)


@pytest.mark.slow
def test_the_command_line_examples_run_after_the_quick_start(tmp_path):
    run = {"cwd": tmp_path, "env": _env(), "capture_output": True, "text": True, "timeout": 600}
    done = subprocess.run([sys.executable, "-c", _block("Quick start", "python")], **run)
    assert done.returncode == 0, done.stderr
    for line in _block("Command line", "bash").splitlines():
        command = shlex.split(line, comments=True)
        if not command or line.startswith(NOT_RUN):
            continue
        assert command[0] == "blpickle"
        done = subprocess.run([sys.executable, "-m", "blpickle", *command[1:]], **run)
        assert done.returncode == 0, (line, done.stdout, done.stderr)
    assert (tmp_path / "small.blp").exists()


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
