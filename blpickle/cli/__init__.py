"""The ``blpickle`` command (also ``python -m blpickle``): a thin layer over the library.

Subcommands: ``info`` (what a file holds, without unpickling it), ``verify`` (every checksum,
and the signature with a key), ``convert`` (between pickle, joblib, npy, npz and blpickle) and
``bench`` (dump/load speed and size against pickle and joblib), each in its own module
(`blpickle.cli.inspect`, `.convert`, `.bench`) with its options and help; this one
builds the parser and runs the command.

Exit status: 0 success; 1 the file is the problem (damaged, not a record, wrong key,
unknown format, a conversion that cannot be done); 2 the command line is (bad arguments, a
missing file or key).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from .. import __version__
from . import bench, convert, inspect
from .formats import ConversionError, UsageError
from .output import EXIT_FAILED, EXIT_OK, EXIT_USAGE, PROG, error

__all__ = ["build_parser", "main"]

EXAMPLES = """\
examples:
  blpickle info model.blp                 what a record holds (nothing is unpickled)
  blpickle info data.pkl --json           also says what other files are
  blpickle verify model.blp               check every checksum (exit 1 if damaged)
  blpickle verify model.blp --key-env BLPICKLE_KEY    and the signature
  blpickle convert model.pkl model.blp    pickle -> blpickle (codec options apply)
  blpickle convert model.blp model.joblib --compress lz4
  blpickle convert arrays.npz arrays.blp --preset small
  blpickle bench --quick                  blpickle vs pickle and joblib on sample data
  blpickle bench model.pkl --json         ... on your own object

exit status: 0 ok, 1 bad or damaged input, 2 bad command line.
Run "blpickle COMMAND --help" for each command's options.
"""


def build_parser() -> argparse.ArgumentParser:
    """Return the ``blpickle`` argument parser."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Inspect, verify, convert and benchmark blpickle files.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.required = True
    inspect.add_commands(commands)
    convert.add_commands(commands)
    bench.add_commands(commands)
    return parser


@contextmanager
def _quiet_broken_pipe() -> Iterator[None]:
    """``blpickle info x --json | head``: stop quietly when the reader goes away."""
    try:
        yield
        sys.stdout.flush()
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        raise


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``blpickle`` command with ``argv`` (default: ``sys.argv[1:]``); return the exit
    status: 0 success, 1 bad or damaged input, 2 bad command line."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version and usage errors
        return exc.code if isinstance(exc.code, int) else EXIT_OK if exc.code is None else EXIT_USAGE
    try:
        with _quiet_broken_pipe():
            return args.run(args)
    except UsageError as exc:
        error(args.command, str(exc))
        return EXIT_USAGE
    except ConversionError as exc:
        error(args.command, str(exc))
        return EXIT_FAILED
    except OSError as exc:
        if isinstance(exc, BrokenPipeError):
            return EXIT_FAILED
        error(args.command, f"{exc.filename or ''}{': ' if exc.filename else ''}{exc.strerror or exc}")
        return EXIT_FAILED
    except KeyboardInterrupt:
        error(args.command, "interrupted")
        return 130
