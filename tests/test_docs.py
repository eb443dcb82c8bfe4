"""Every code block of README.md and docs/ runs as printed.

The Python blocks of one page run in order in one namespace, as a reader pastes them one after
the other, in a temporary directory that holds the files the pages refer to. In shell blocks
each ``blpickle ...`` line runs through the command line; lines that install or set up an
environment (``pip``, ``python3 -m venv``, ``.venv/bin/...``) are CI's own steps and are not run
here. A block that is not meant to run says so in its fence, with the reason:
````python {test="skip" reason="..."}````.
"""

from __future__ import annotations

import dataclasses
import pickle
import re
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import blpickle

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
#: A fenced block at the left margin: its language, its options (``{test="skip" ...}``), its text.
_BLOCK = re.compile(r"^```(\w+)[ \t]*(\{[^}\n]*\})?[ \t]*\n(.*?)^```", re.DOTALL | re.MULTILINE)
_OPTION = re.compile(r'(\w+)="([^"]*)"')


@dataclasses.dataclass(frozen=True)
class Block:
    """One fenced code block of a page."""

    page: Path
    line: int
    language: str
    options: dict[str, str]
    text: str


def blocks(page: Path) -> list[Block]:
    """The page's fenced blocks, without those marked ``test="skip"`` (which must give a reason)."""
    source = page.read_text()
    found = []
    for match in _BLOCK.finditer(source):
        language, options, text = match.group(1), dict(_OPTION.findall(match.group(2) or "")), match.group(3)
        line = source.count("\n", 0, match.start(3)) + 1
        if options.get("test") == "skip":
            assert options.get("reason"), f"{page.name}:{line}: a block marked test=skip states its reason"
            continue
        found.append(Block(page, line, language, options, text))
    return found


def _python_blocks(page: Path) -> list[Block]:
    return [b for b in blocks(page) if b.language in ("python", "py")]


def _shell_lines(page: Path) -> list[str]:
    lines = []
    for block in blocks(page):
        if block.language in ("bash", "sh", "shell"):
            for line in block.text.splitlines():
                command = line.split(" #")[0].strip()
                if command.startswith("blpickle "):
                    lines.append(command)
    return lines


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A directory holding the files the pages use: a record, a pickle, npy and npz files."""
    monkeypatch.chdir(tmp_path)
    obj = {"weights": np.arange(1000.0).reshape(10, 100), "labels": list(range(10))}
    with open("model.pkl", "wb") as file:
        pickle.dump(obj, file, protocol=5)
    blpickle.dump(obj, "model.blp")
    np.save("image.npy", np.zeros((64, 64), np.uint8))
    np.savez("arrays.npz", a=np.arange(10), b=np.ones(3))
    return tmp_path


@pytest.mark.parametrize("page", [p for p in PAGES if _python_blocks(p)], ids=lambda p: p.name)
def test_python_blocks_run_in_order(page: Path, workdir: Path) -> None:
    namespace: dict = {"__name__": "__main__"}
    for block in _python_blocks(page):
        # blank lines first, so that a traceback gives the block's line number in the page
        code = compile("\n" * (block.line - 1) + block.text, str(page), "exec")
        exec(code, namespace)


@pytest.mark.parametrize("page", [p for p in PAGES if _shell_lines(p)], ids=lambda p: p.name)
def test_shell_blocks_run(page: Path, workdir: Path) -> None:
    for command in _shell_lines(page):
        args = shlex.split(command)[1:]
        done = subprocess.run([sys.executable, "-m", "blpickle", *args], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, f"{page.name}: `{command}` exited {done.returncode}:\n{done.stderr}"
