"""What the ``blpickle`` command gives back: its exit status, errors and warnings on stderr,
sizes for people, JSON for scripts, and a progress bar."""

from __future__ import annotations

import json
import sys
from typing import Any, TextIO

__all__ = [
    "EXIT_FAILED",
    "EXIT_OK",
    "EXIT_USAGE",
    "PROG",
    "Progress",
    "binary_size",
    "error",
    "error_text",
    "human_size",
    "plural",
    "print_json",
    "shown",
    "warn",
]

PROG = "blpickle"
#: The exit status: success; the file is the problem (damaged, not a record, wrong key, unknown
#: format, a conversion that cannot be done); the command line is (bad arguments, a missing
#: file or key).
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def shown(text: str) -> str:
    """Return ``text`` as a terminal may print it: every character that does not print as
    itself (control characters, such as those of a sequence that erases a line, line breaks,
    invisible format characters) written as its Python escape (``\\x1b``). Everything the
    command prints from a file (names, dtypes, options, messages quoting them) goes through
    this."""
    if text.isprintable():
        return text
    return "".join(char if char.isprintable() else ascii(char)[1:-1] for char in text)


def error(command: str, message: str) -> None:
    """Print ``message`` as the error of ``blpickle command`` on stderr."""
    print(f"{PROG} {command}: error: {shown(message)}", file=sys.stderr)


def warn(command: str, message: str) -> None:
    """Print ``message`` as a warning of ``blpickle command`` on stderr."""
    print(f"{PROG} {command}: warning: {shown(message)}", file=sys.stderr)


def error_text(exc: BaseException) -> str:
    """Return the message of ``exc`` followed by its notes."""
    notes = getattr(exc, "__notes__", None) or []
    return " ".join([str(exc), *notes])


def human_size(nbytes: float) -> str:
    """Return a size in B, kB, MB, GB, TB (powers of 1000)."""
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(nbytes) < 1000 or unit == "TB":
            return f"{nbytes:.0f} {unit}" if unit == "B" else f"{nbytes:.1f} {unit}"
        nbytes /= 1000
    raise AssertionError("unreachable")


def binary_size(nbytes: float) -> str:
    """Return a size in B, KiB, MiB, GiB (powers of 1024), as chunk sizes are given."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if nbytes < 1024 or unit == "GiB":
            return f"{nbytes:g} {unit}"
        nbytes /= 1024
    raise AssertionError("unreachable")


def plural(count: int, noun: str) -> str:
    """Return ``"1 noun"`` or ``"N nouns"``."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


def print_json(doc: Any) -> None:
    """Print ``doc`` as indented JSON (what JSON cannot hold, as its ``str``)."""
    print(json.dumps(doc, indent=2, default=str))


def _tqdm() -> Any:
    """tqdm's class, or None when tqdm is not installed (progress bars are optional)."""
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm


class Progress:
    """A progress bar over named steps on stderr: shown only when stderr is a terminal, tqdm
    is installed and the work takes more than a second."""

    def __init__(self, total: int, description: str, enabled: bool = True, stream: TextIO | None = None) -> None:
        stream = stream or sys.stderr
        tqdm = _tqdm() if enabled and stream.isatty() else None
        self._bar = None
        if tqdm is not None:
            self._bar = tqdm(total=total, desc=description, unit="step", delay=1.0, leave=False, file=stream)
        self._started = False

    def step(self, label: str) -> None:
        """Finish the previous step (if any) and start the one called ``label``."""
        if self._bar is None:
            return
        if self._started:
            self._bar.update(1)
        self._started = True
        self._bar.set_postfix_str(label, refresh=True)

    def close(self) -> None:
        """Finish the last step and remove the bar."""
        if self._bar is not None:
            if self._started:
                self._bar.update(1)
            self._bar.close()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
