"""Every code block of README.md and docs/ runs as printed.

The blocks of one page run in order, as a reader pastes them one after the other, in an empty
directory holding only the files the page says its reader already has (``GIVEN``): Python
blocks in one namespace, and the ``blpickle ...`` lines of shell blocks through the command line
(the other shell lines install things or run the benchmarks: the jobs of CI and bench/). A block
that is not meant to run says so in its fence, with the reason:
``python {test="skip" reason="..."}``.
"""

from __future__ import annotations

import dataclasses
import pickle
import re
import shlex
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import joblib
import numpy as np
import pytest

import blpickle

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
#: A fenced block (indented in a list, or not): its indent, language, options
#: (``{test="skip" ...}``) and text.
_BLOCK = re.compile(r"^([ \t]*)```(\w+)[ \t]*(\{[^}\n]*\})?[ \t]*\n(.*?)^\1```", re.DOTALL | re.MULTILINE)
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
        language, options = match.group(2), dict(_OPTION.findall(match.group(3) or ""))
        text = textwrap.dedent(match.group(4))
        line = source.count("\n", 0, match.start(4)) + 1
        if options.get("test") == "skip":
            assert options.get("reason"), f"{page.name}:{line}: a block marked test=skip states its reason"
            continue
        found.append(Block(page, line, language, options, text))
    return found


def _shell_commands(block: Block) -> list[list[str]]:
    """The ``blpickle`` command lines of a shell block, as argument lists (comments dropped)."""
    commands = (shlex.split(line, comments=True) for line in block.text.splitlines())
    return [command for command in commands if command[:1] == ["blpickle"]]


def _run(block: Block, namespace: dict) -> None:
    """Run one block as a reader would: Python in the page's namespace, shell lines of the
    ``blpickle`` command through the command line."""
    if block.language in ("python", "py"):
        # blank lines first, so that a traceback gives the block's line number in the page
        exec(compile("\n" * (block.line - 1) + block.text, str(block.page), "exec"), namespace)
    elif block.language in ("bash", "sh", "shell"):
        for command in _shell_commands(block):
            done = subprocess.run([sys.executable, "-m", *command], capture_output=True, text=True, timeout=600)
            where = f"{block.page.name}:{block.line}: `{shlex.join(command)}`"
            assert done.returncode == 0, f"{where} exited {done.returncode}:\n{done.stderr}"


def _pickle(path: Path) -> None:
    with open(path, "wb") as file:
        pickle.dump({"weights": np.random.rand(100, 10), "labels": list(range(100))}, file)


#: Files a page says its reader already has, and how to make them.
GIVEN: dict[str, dict[str, Callable[[Path], None]]] = {
    "cli.md": {
        "model.pkl": _pickle,
        "model.joblib": lambda path: joblib.dump({"weights": np.random.rand(100, 10)}, path),
        "arrays.npz": lambda path: np.savez(path, x=np.arange(10), y=np.ones(3)),
        "image.blp": lambda path: blpickle.dump(np.zeros((64, 64), np.uint8), path),
    },
}


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty directory to run a page in."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_the_code_blocks_of_a_page_run_in_order(page: Path, workdir: Path) -> None:
    for name, make in GIVEN.get(page.name, {}).items():
        make(Path(name))
    namespace: dict = {"__name__": "__main__"}
    for block in blocks(page):
        _run(block, namespace)
