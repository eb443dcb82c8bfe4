"""The ``blpickle convert`` command: between pickle, joblib, npy, npz and blpickle files."""

from __future__ import annotations

import argparse
import os
from typing import Any

from ..errors import UnsafeLoadError
from ..io.remote import is_url
from .arguments import (
    add_codec_options,
    add_command,
    add_key_options,
    add_load_options,
    check_input,
    codec_options,
    input_format,
    read_key,
)
from .formats import (
    FORMATS,
    ConversionError,
    UsageError,
    file_size,
    format_for_path,
    path_kind,
    read_object,
    write_object,
)
from .output import EXIT_OK, Progress, error_text, human_size, warn

__all__ = ["add_commands"]

CONVERT_EPILOG = """\
The input format is recognised by its first bytes (or --from); the output format comes from
OUT's extension (.blp/.blpickle, .pkl/.pickle, .joblib, .npy, .npz) or --to.

Converting LOADS the input: for pickle, joblib and blpickle files that means running the
pickle inside, which can run any code. Convert only files you trust, or use --safe (only
builtin containers and numpy arrays may be rebuilt) and --allow NAME for more.

examples:
  blpickle convert model.pkl model.blp --preset small
  blpickle convert model.pkl model.blp --codec lz4 --clevel 5 --chunk-size 4M
  blpickle convert model.blp model.joblib --compress zlib:3
  blpickle convert arrays.blp arrays.npz --compress zlib
  blpickle convert untrusted.pkl out.blp --safe --allow sklearn.*
"""


def add_commands(commands: Any) -> None:
    """Add ``convert`` to ``commands`` (what ``ArgumentParser.add_subparsers`` returns)."""
    convert = add_command(
        commands, "convert", "convert between pickle, joblib, npy, npz and blpickle files", CONVERT_EPILOG
    )
    convert.add_argument("input", metavar="IN")
    convert.add_argument("output", metavar="OUT")
    convert.add_argument(
        "--to",
        dest="to_format",
        choices=FORMATS,
        help="the output format (default: from OUT's extension)",
    )
    convert.add_argument("--force", "-f", action="store_true", help="replace OUT if it exists")
    convert.add_argument(
        "--protocol",
        type=int,
        choices=range(6),
        metavar="0-5",
        help="pickle protocol of the output (default: 5)",
    )
    convert.add_argument(
        "--compress",
        metavar="SPEC",
        help="joblib output: a compressor, name:level or level (zlib:3, lz4, blosc, 3); "
        "npz output: zlib or zlib:level (deflate the arrays)",
    )
    convert.add_argument(
        "--durable", action="store_true", help="flush OUT and its directory to the device (fsync) before exiting"
    )
    convert.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_load_options(convert, "IN")
    add_key_options(
        convert,
        "check the signature of blpickle input and sign blpickle output with the key in this file",
    )
    add_codec_options(convert)
    convert.set_defaults(run=cmd_convert)


def cmd_convert(args: argparse.Namespace) -> int:
    """Run ``blpickle convert``; return the exit status."""
    source, target = args.input, args.output
    check_input(source)
    key = read_key(args)
    options = codec_options(args)
    target_format = args.to_format or format_for_path(target)
    if target_format is None:
        raise UsageError(
            f"cannot tell the output format from {target!r}: pass --to, or name it .blp, .pkl, .joblib, .npy or .npz"
        )
    try:
        existing = path_kind(target)
    except ImportError as exc:
        raise UsageError(str(exc)) from None
    if existing == "directory":
        raise UsageError(f"{target}: is a directory")
    if existing is None and not is_url(target) and os.path.islink(target):
        existing = "dangling symbolic link"  # writing would create the file it names
    if existing is not None and not args.force:
        raise UsageError(f"{target} exists ({existing}): pass --force to replace it")
    source_format = input_format(source, args.from_format)
    if key is not None and "blpickle" not in (source_format, target_format):
        raise UsageError("a key checks blpickle input and signs blpickle output; neither is blpickle here")
    if target_format != "blpickle" and options:
        raise UsageError(f"codec options apply to blpickle output only; the output is a {target_format} file")
    nthreads = args.nthreads
    with Progress(2, "convert", enabled=not args.no_progress) as progress:
        progress.step(f"reading {source_format}")
        try:
            obj, notes = read_object(
                source,
                source_format,
                safe=args.safe,
                allowed=args.allow or None,
                key=key if source_format == "blpickle" else None,
                nthreads=nthreads if source_format == "blpickle" else None,
            )
        except (UsageError, ConversionError):
            raise
        except Exception as exc:  # reading runs the input's own code: anything can come out
            hint = ""
            if isinstance(exc, UnsafeLoadError):
                hint = " (if you trust it: " + " ".join(f"--allow {path}" for path in exc.refused) + ")"
            raise ConversionError(
                f"cannot read {source} as {source_format}: {type(exc).__name__}: {error_text(exc)}{hint}"
            ) from None
        for note in notes:
            warn("convert", note)
        progress.step(f"writing {target_format}")
        if target_format == "blpickle" and nthreads is not None:
            options["nthreads"] = nthreads
        try:
            write_object(
                obj,
                target,
                target_format,
                protocol=args.protocol,
                compress=args.compress,
                key=key if target_format == "blpickle" else None,
                options=options,
                durable=args.durable,
            )
        except (UsageError, ConversionError):
            raise
        except Exception as exc:
            raise ConversionError(
                f"cannot write {target} as {target_format}: {type(exc).__name__}: {error_text(exc)}"
            ) from None
    in_size, out_size = file_size(source), file_size(target)
    print(f"{source} ({source_format}, {human_size(in_size)}) -> {target} ({target_format}, {human_size(out_size)})")
    return EXIT_OK
