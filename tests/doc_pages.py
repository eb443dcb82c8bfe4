"""Run the code blocks of a documentation page in order, as a reader pastes them into a fresh
session: ``python tests/doc_pages.py PAGE`` in the directory to run it in.

Python blocks run in one namespace (whose ``__name__`` is ``"__main__"``), and the
``blpickle ...`` lines of shell blocks through the command line; the other shell lines install
things or run the benchmarks, the jobs of CI and bench/. A block that is not meant to run says
so in its fence, with the reason: ``python {test="skip" reason="..."}``. Exits non-zero at the
first block that fails, with a traceback that names the page and line.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

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
            if not options.get("reason"):
                raise SystemExit(f"{page.name}:{line}: a block marked test=skip must state its reason")
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
            if done.returncode:
                raise SystemExit(f"{where} exited {done.returncode}:\n{done.stderr}")


def run_page(page: Path) -> None:
    """Run every block of ``page`` in order, in the current directory."""
    namespace: dict = {"__name__": "__main__"}
    for block in blocks(page):
        _run(block, namespace)


if __name__ == "__main__":
    run_page(Path(sys.argv[1]))
