"""The command-line options the ``blpickle`` commands share: sizes, keys, input files, how the
input is loaded, and the codec options of blpickle output."""

from __future__ import annotations

import argparse
import os
from typing import Any

from ..errors import BlpickleError
from ..io.remote import is_url
from ..options import PRESETS, Options
from .formats import FORMATS, ConversionError, UsageError, path_kind, sniff

__all__ = [
    "add_codec_options",
    "add_command",
    "add_key_options",
    "add_load_options",
    "check_input",
    "codec_options",
    "input_format",
    "parse_size",
    "read_key",
]


def add_command(commands: Any, name: str, help: str, epilog: str) -> argparse.ArgumentParser:
    """Return the parser of the subcommand ``name``, added to ``commands`` (what
    ``ArgumentParser.add_subparsers`` returns)."""
    parser: argparse.ArgumentParser = commands.add_parser(
        name,
        help=help,
        description=help,
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    return parser


def parse_size(text: str) -> int:
    """Parse a byte count: ``4096``, ``64K``, ``8M``, ``1G`` (binary units; ``KiB``, ``MB``,
    ... are accepted and also binary)."""
    units = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    value = text.strip().upper().removesuffix("B").removesuffix("I")
    number, unit = (value[:-1], value[-1]) if value and value[-1] in units else (value, "")
    try:
        return int(float(number) * units[unit])
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (examples: 4096, 512K, 8M)") from None


def read_key(args: argparse.Namespace) -> bytes | None:
    """The key named by --key-file or --key-env, or None.

    Raises:
        UsageError: for a missing file or variable, or an empty key.
    """
    if getattr(args, "key_file", None):
        try:
            with open(args.key_file, "rb") as file:
                key = file.read()
        except OSError as exc:
            raise UsageError(f"cannot read the key file: {exc}") from None
        source = f"the key file {args.key_file}"
    elif getattr(args, "key_env", None):
        value = os.environ.get(args.key_env)
        if value is None:
            raise UsageError(f"the environment variable {args.key_env} is not set")
        key, source = (
            value.encode("utf-8", "surrogateescape"),
            f"the environment variable {args.key_env}",
        )
    else:
        return None
    if not key:
        raise UsageError(f"{source} is empty")
    return key


def check_input(path: str) -> None:
    """Raise `UsageError` unless ``path`` is a readable file, or a URL (``s3://...``,
    through fsspec) naming a file."""
    try:
        kind = path_kind(path)
    except ImportError as exc:
        raise UsageError(str(exc)) from None
    if kind is None:
        raise UsageError(f"{path}: no such file")
    if kind == "directory":
        raise UsageError(f"{path}: is a directory")
    if not is_url(path) and not os.access(path, os.R_OK):
        raise UsageError(f"{path}: permission denied")


def add_codec_options(parser: argparse.ArgumentParser) -> None:
    """Add the options of blpickle output that `codec_options` reads."""
    group = parser.add_argument_group("blpickle codec options (blpickle output; defaults: the preset's)")
    group.add_argument("--preset", choices=list(PRESETS), help="start from a named preset (default: default)")
    group.add_argument(
        "--codec",
        choices=["auto", "zstd", "lz4", "lz4hc", "blosclz", "zlib", "none"],
        help="Blosc2 codec (auto: zstd or lz4 for each buffer from a sample); none stores buffers raw and mappable",
    )
    group.add_argument("--clevel", type=int, metavar="0-9", help="compression level")
    group.add_argument(
        "--shuffle",
        choices=["shuffle", "bitshuffle", "noshuffle"],
        help="byte or bit shuffle by element size",
    )
    group.add_argument(
        "--bytedelta",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="Blosc2's bytedelta filter after the shuffle",
    )
    group.add_argument("--chunk-size", type=parse_size, metavar="SIZE", help="bytes per chunk, e.g. 8M (4K to 1G)")
    group.add_argument(
        "--pickler",
        choices=["pickle", "cloudpickle"],
        help="cloudpickle also saves lambdas and __main__ classes",
    )
    group.add_argument(
        "--nthreads",
        type=int,
        metavar="N",
        help="compression/decompression threads (default: all CPUs)",
    )


def codec_options(args: argparse.Namespace) -> dict[str, Any]:
    """The blpickle options given on the command line (validated).

    Raises:
        UsageError: for an invalid value.
    """
    options: dict[str, Any] = {}
    for name in ("codec", "clevel", "shuffle", "bytedelta", "chunk_size", "pickler"):
        value = getattr(args, name, None)
        if value is not None:
            options[name] = None if value == "none" else value
    if getattr(args, "preset", None) is not None:
        options["preset"] = args.preset
    try:
        Options(nthreads=args.nthreads)
        preset = options.get("preset")
        Options.from_dict(
            {
                **(PRESETS[preset] if preset else Options()).to_dict(),
                **{k: v for k, v in options.items() if k != "preset"},
            }
        )
    except BlpickleError as exc:
        raise UsageError(str(exc)) from None
    return options


def add_load_options(parser: argparse.ArgumentParser, what: str) -> None:
    """Add the options that say how the input ``what`` is loaded (its format, safe mode)."""
    group = parser.add_argument_group(f"loading {what} (it runs the input's pickle)")
    group.add_argument(
        "--from",
        dest="from_format",
        choices=FORMATS,
        help="the input format (default: recognised by its first bytes)",
    )
    group.add_argument(
        "--safe",
        action="store_true",
        help="import no global but builtin containers and numpy's (blpickle.load(safe=True))",
    )
    group.add_argument(
        "--allow",
        action="append",
        default=[],
        metavar="NAME",
        help="also allow this global or package (pkg.mod.Name, pkg.*); implies --safe; repeatable",
    )


def add_key_options(parser: argparse.ArgumentParser, help_file: str) -> None:
    """Add --key-file and --key-env, which `read_key` reads."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--key-file", metavar="FILE", help=help_file)
    group.add_argument(
        "--key-env",
        metavar="VAR",
        help="the same key, from an environment variable (its UTF-8 bytes)",
    )


def input_format(path: str, given: str | None) -> str:
    """Return the format given with ``--from``, else the one ``path``'s first bytes say.

    Raises:
        ConversionError: when they say nothing blpickle can read.
    """
    if given is not None:
        return given
    detected = sniff(path)
    if detected.format not in FORMATS:
        raise ConversionError(f"cannot tell what {path} is ({detected.description}): pass --from to say")
    return detected.format
