"""The ``blpickle`` command (also ``python -m blpickle``): a thin layer over the library.

Subcommands: ``info`` (what a file holds, without unpickling it), ``verify`` (every checksum,
and the signature with a key), ``convert`` (between pickle, joblib, npy, npz and blpickle) and
``bench`` (dump/load speed and size against pickle and joblib).

Exit status: 0 success; 1 the file is the problem (damaged, not a record, wrong key,
unknown format, a conversion that cannot be done); 2 the command line is (bad arguments, a
missing file or key).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TextIO

from . import __version__
from . import format as fmt
from ._cli_formats import (
    FORMATS,
    ConversionError,
    Detected,
    UsageError,
    format_for_path,
    read_object,
    sniff,
    write_object,
)
from .errors import BlpickleError, LoadError, SignatureError, UnsafeLoadError, add_note
from .info import RecordInfo, inspect
from .options import PRESETS, Options

__all__ = ["main"]

PROG = "blpickle"
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2

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

INFO_EPILOG = """\
Reads only the header and the object graph's opcodes: nothing is unpickled, nothing imported.
For files that are not blpickle records it says what they are (pickle, joblib, npy, npz).

examples:
  blpickle info model.blp
  blpickle info model.blp --json > model-info.json
"""

VERIFY_EPILOG = """\
Reads the whole file and checks every checksum (the header, each chunk, the trailer) and,
with a key, the HMAC signature. Nothing is unpickled. Exit status 0 when every record is
intact (and signed with the key), 1 when not, 2 for a bad command line.

The key is read from a file (its bytes as they are) or an environment variable (its UTF-8
bytes), never from the command line, where other users could see it.

examples:
  blpickle verify model.blp
  blpickle verify model.blp --key-file ~/.config/myapp/key
  BLPICKLE_KEY=secret blpickle verify model.blp --key-env BLPICKLE_KEY --json
"""

BENCH_EPILOG = """\
Without FILE, times the Bloscpack paper's datasets: low (arange int64), medium (sine plus
noise, float64) and high (uniform random float64) entropy, 80 MB each (8 MB with --quick).
With FILE, loads it (running its pickle: see "blpickle convert --help" about --safe) and times
that object. Files go to a temporary directory and are read back from the page cache; each
time is the best of --repeat runs. Codec options add a "blpickle" row with those options.
For the full study (cold cache, fsync, memory, plots) run "python -m bench" in the sources.

examples:
  blpickle bench --quick
  blpickle bench model.pkl --repeat 5
  blpickle bench --codec zstd --clevel 3 --json > results.json
"""


# --------------------------------------------------------------------------------------------
# Small helpers


def _error(command: str, message: str) -> None:
    print(f"{PROG} {command}: error: {message}", file=sys.stderr)


def _warn(command: str, message: str) -> None:
    print(f"{PROG} {command}: warning: {message}", file=sys.stderr)


def human_size(nbytes: float) -> str:
    """Return a size in B, kB, MB, GB, TB (powers of 1000)."""
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(nbytes) < 1000 or unit == "TB":
            return f"{nbytes:.0f} {unit}" if unit == "B" else f"{nbytes:.1f} {unit}"
        nbytes /= 1000
    raise AssertionError("unreachable")


def binary_size(nbytes: int) -> str:
    """Return a size in B, KiB, MiB, GiB (powers of 1024), as chunk sizes are given."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if nbytes < 1024 or unit == "GiB":
            return f"{nbytes:g} {unit}"
        nbytes /= 1024
    raise AssertionError("unreachable")


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


def _read_key(args: argparse.Namespace) -> bytes | None:
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


def _check_input(path: str) -> None:
    if not os.path.exists(path):
        raise UsageError(f"{path}: no such file")
    if os.path.isdir(path):
        raise UsageError(f"{path}: is a directory")
    if not os.access(path, os.R_OK):
        raise UsageError(f"{path}: permission denied")


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
        if self._bar is not None:
            if self._started:
                self._bar.update(1)
            self._bar.close()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _print_json(doc: Any) -> None:
    print(json.dumps(doc, indent=2, default=str))


# --------------------------------------------------------------------------------------------
# blpickle info


def read_records(path: str, key: bytes | None = None) -> tuple[list[RecordInfo], int]:
    """Inspect every record of a blpickle file in turn; return their descriptions and the
    number of bytes after the last record that are not a record (data appended by another
    writer, such as a plain pickle).

    Raises:
        blpickle.LoadError: for the first damaged record; its notes say which record it is.
    """
    records: list[RecordInfo] = []
    with open(path, "rb") as file:
        size = os.fstat(file.fileno()).st_size
        while True:
            try:
                records.append(inspect(file, key=key))
            except LoadError as exc:
                if records:
                    add_note(exc, f"(in record {len(records) + 1} of the file; the records before it are intact)")
                raise
            position = file.tell()
            if position >= size:
                return records, 0
            if file.read(len(fmt.MAGIC)) != fmt.MAGIC:
                return records, size - position
            file.seek(position)


def _error_text(exc: BaseException) -> str:
    notes = getattr(exc, "__notes__", None) or []
    return " ".join([str(exc), *notes])


def _record_lines(info: RecordInfo) -> list[str]:
    options = dict(info.options)
    if isinstance(options.get("chunk_size"), int):
        options["chunk_size"] = binary_size(options["chunk_size"])
    lines = [
        f"  format version {info.version}, {human_size(info.size)}, "
        f"{human_size(info.nbytes)} decompressed (ratio {info.ratio:.2f}), "
        f"{'signed' if info.signed else 'not signed'}",
        "  options: " + ", ".join(f"{k}={v}" for k, v in options.items()),
        f"  object graph: pickle protocol {info.protocol}, {human_size(info.pickle_nbytes)} "
        f"({human_size(info.pickle_stored)} stored)",
    ]
    if info.external:
        lines.append(f"  out-of-band buffers kept by the writer (pass them as buffers= on load): {info.external}")
    if info.buffers:
        raw = sum(b.nbytes for b in info.buffers)
        stored = sum(b.stored for b in info.buffers)
        lines.append(f"  buffers: {len(info.buffers)}, {human_size(raw)} ({human_size(stored)} stored)")
        rows = [("#", "dtype", "shape", "raw", "stored", "ratio", "chunks", "codec")]
        for n, b in enumerate(info.buffers):
            shape = (
                "-"
                if b.shape is None
                else "(" + ", ".join(map(str, b.shape)) + ("," if len(b.shape) == 1 else "") + ")"
            )
            rows.append(
                (
                    str(n),
                    b.dtype or f"bytes (itemsize {b.itemsize})",
                    shape,
                    human_size(b.nbytes),
                    human_size(b.stored) + (" raw" if b.raw else ""),
                    f"{b.ratio:.2f}",
                    str(b.nchunks),
                    b.codec or ("-" if b.raw else "?"),
                )
            )
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        for row in rows:
            cells = [
                f"{c:<{w}}" if i in (1, 2) else f"{c:>{w}}" for i, (c, w) in enumerate(zip(row, widths, strict=True))
            ]
            lines.append("    " + "  ".join(cells).rstrip())
    else:
        lines.append("  buffers: none")
    lines += _globals_lines(info.globals, "")
    return lines


def _globals_lines(names: Sequence[str], where: str) -> list[str]:
    if not names:
        return [f"  globals it imports{where}: none"]
    return [f"  globals it imports{where}:", *(f"    {name}" for name in names)]


def _other_lines(path: str, detected: Detected) -> list[str]:
    details = detected.details
    lines = []
    if detected.format == "npy" and "dtype" in details:
        lines.append(
            f"  format version {details['version']}, {human_size(details['nbytes'])} of data, "
            f"{'Fortran' if details['fortran_order'] else 'C'} order"
        )
    if detected.format == "npz":
        for array in details.get("arrays", []):
            if "error" in array:
                lines.append(f"  {array['name']}: damaged ({array['error']})")
            else:
                lines.append(
                    f"  {array['name']}: {array['dtype']} {tuple(array['shape'])}, "
                    f"{human_size(array['nbytes'])} ({human_size(array['stored'])} stored)"
                )
    if "globals" in details:
        complete = "" if details.get("globals_complete") else " (read from the start of the file)"
        lines += _globals_lines(details["globals"], complete)
    if detected.format in ("pickle", "joblib", "npy", "npz"):
        stem = os.path.splitext(path)[0]
        lines.append(f'  to convert it: blpickle convert "{path}" "{stem}.blp"')
    return lines


def cmd_info(args: argparse.Namespace) -> int:
    path = args.file
    _check_input(path)
    key = _read_key(args)
    detected = sniff(path)
    size = os.path.getsize(path)
    doc: dict[str, Any] = {
        "path": path,
        "format": detected.format,
        "description": detected.description,
        "size": size,
    }
    if detected.format != "blpickle":
        if key is not None:
            _warn("info", "a key checks blpickle records only: ignored")
        doc.update(detected.details)
        doc.pop("readable_ops", None)
        known = detected.format not in ("unknown", "empty", "zip") and "error" not in detected.details
        if args.json:
            _print_json(doc)
        else:
            print(f"{path}: {detected.description}, {human_size(size)}")
            for line in _other_lines(path, detected):
                print(line)
        if not known:
            _error("info", f"{path}: not a file blpickle can read ({detected.description})")
        return EXIT_OK if known else EXIT_FAILED
    try:
        records, trailing = read_records(path, key)
    except LoadError as exc:
        doc.update(error=_error_text(exc), error_type=type(exc).__name__)
        if args.json:
            _print_json(doc)
        _error("info", f"{path}: {type(exc).__name__}: {_error_text(exc)}")
        return EXIT_FAILED
    doc["records"] = [r.to_dict() for r in records]
    doc["trailing_bytes"] = trailing
    if args.json:
        _print_json(doc)
        return EXIT_OK
    count = f"{len(records)} blpickle records" if len(records) > 1 else "a blpickle record"
    print(f"{path}: {count}, {human_size(size)}")
    for n, record in enumerate(records):
        if len(records) > 1:
            print(f" record {n + 1}:")
        for line in _record_lines(record):
            print(line)
    if trailing:
        print(f"  then {human_size(trailing)} that are not a blpickle record (plain pickle data, say)")
    return EXIT_OK


# --------------------------------------------------------------------------------------------
# blpickle verify


def cmd_verify(args: argparse.Namespace) -> int:
    path = args.file
    _check_input(path)
    key = _read_key(args)
    detected = sniff(path)
    doc: dict[str, Any] = {
        "path": path,
        "format": detected.format,
        "ok": False,
        "signature_checked": key is not None,
    }
    if detected.format != "blpickle":
        message = f"{path} is {detected.description}: only blpickle records carry checksums to verify"
        doc.update(error=message, error_type="NotARecord")
        if args.json:
            _print_json(doc)
        _error("verify", message)
        return EXIT_FAILED
    try:
        records, trailing = read_records(path, key)
    except LoadError as exc:
        doc.update(error=_error_text(exc), error_type=type(exc).__name__)
        if args.json:
            _print_json(doc)
        problem = "bad signature" if isinstance(exc, SignatureError) else "damaged"
        _error("verify", f"{path}: {problem}: {type(exc).__name__}: {_error_text(exc)}")
        return EXIT_FAILED
    buffers = sum(len(r.buffers) for r in records)
    chunks = sum(b.nchunks for r in records for b in r.buffers)
    doc.update(
        ok=True,
        records=len(records),
        buffers=buffers,
        buffer_chunks=chunks,
        signed=[r.signed for r in records],
        checked_bytes=sum(r.size for r in records),
        trailing_bytes=trailing,
        error=None,
        error_type=None,
    )
    if args.json:
        _print_json(doc)
    else:
        what = f"{_plural(len(records), 'record')}, {_plural(buffers, 'buffer')} in {_plural(chunks, 'chunk')}"
        signature = (
            "; signature ok" if key is not None else ("; signed (pass a key to check it)" if any(doc["signed"]) else "")
        )
        print(f"{path}: ok ({what}, every checksum matches{signature})")
    if trailing:
        _warn(
            "verify",
            f"{path}: the last {trailing} bytes are not a blpickle record and were not checked",
        )
    return EXIT_OK


# --------------------------------------------------------------------------------------------
# Codec options, shared by convert and bench


def _add_codec_options(parser: argparse.ArgumentParser) -> None:
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


def _add_load_options(parser: argparse.ArgumentParser, what: str) -> None:
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


def _add_key_options(parser: argparse.ArgumentParser, help_file: str) -> None:
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--key-file", metavar="FILE", help=help_file)
    group.add_argument(
        "--key-env",
        metavar="VAR",
        help="the same key, from an environment variable (its UTF-8 bytes)",
    )


def _input_format(path: str, given: str | None) -> str:
    if given is not None:
        return given
    detected = sniff(path)
    if detected.format not in FORMATS:
        raise ConversionError(f"cannot tell what {path} is ({detected.description}): pass --from to say")
    return detected.format


# --------------------------------------------------------------------------------------------
# blpickle convert


def cmd_convert(args: argparse.Namespace) -> int:
    source, target = args.input, args.output
    _check_input(source)
    key = _read_key(args)
    options = codec_options(args)
    target_format = args.to_format or format_for_path(target)
    if target_format is None:
        raise UsageError(
            f"cannot tell the output format from {target!r}: pass --to, or name it .blp, .pkl, .joblib, .npy or .npz"
        )
    if os.path.exists(target) and not args.force:
        raise UsageError(f"{target} exists: pass --force to replace it")
    if os.path.isdir(target):
        raise UsageError(f"{target}: is a directory")
    source_format = _input_format(source, args.from_format)
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
                allowed=args.allow,
                key=key if source_format == "blpickle" else None,
                nthreads=nthreads if source_format == "blpickle" else None,
            )
        except (UsageError, ConversionError):
            raise
        except Exception as exc:  # reading runs the input's own code: anything can come out
            hint = ""
            if isinstance(exc, UnsafeLoadError):
                hint = f" (if you trust it: --allow {exc.module}.{exc.name})"
            raise ConversionError(
                f"cannot read {source} as {source_format}: {type(exc).__name__}: {_error_text(exc)}{hint}"
            ) from None
        for note in notes:
            _warn("convert", note)
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
            )
        except (UsageError, ConversionError):
            raise
        except Exception as exc:
            raise ConversionError(
                f"cannot write {target} as {target_format}: {type(exc).__name__}: {_error_text(exc)}"
            ) from None
    in_size, out_size = os.path.getsize(source), os.path.getsize(target)
    print(f"{source} ({source_format}, {human_size(in_size)}) -> {target} ({target_format}, {human_size(out_size)})")
    return EXIT_OK


# --------------------------------------------------------------------------------------------
# blpickle bench


def cmd_bench(args: argparse.Namespace) -> int:
    from . import _cli_bench as bench

    options = codec_options(args)
    if args.repeat is not None and args.repeat < 1:
        raise UsageError("--repeat must be at least 1")
    repeat = args.repeat if args.repeat is not None else 1 if args.quick else 3
    objects: list[tuple[str, Any]] = []
    if args.file is not None:
        _check_input(args.file)
        source_format = _input_format(args.file, args.from_format)
        try:
            obj, _ = read_object(args.file, source_format, safe=args.safe, allowed=args.allow)
        except (UsageError, ConversionError):
            raise
        except Exception as exc:
            raise ConversionError(
                f"cannot read {args.file} as {source_format}: {type(exc).__name__}: {_error_text(exc)}"
            ) from None
        objects.append((os.path.basename(args.file), obj))
    else:
        if args.size_mb is not None:
            if args.size_mb <= 0:
                raise UsageError("--size-mb must be positive")
            n = max(int(args.size_mb * 1_000_000 // 8), 1)
        else:
            n = bench.QUICK_ELEMENTS if args.quick else bench.DEFAULT_ELEMENTS
        objects = [(name, bench.make_dataset(name, n)) for name in bench.DATASETS]
    contenders, notes = bench.methods(args.nthreads, options or None)
    if args.only:
        wanted = [w.lower() for w in args.only]
        contenders = [m for m in contenders if any(w in m.name.lower() for w in wanted)]
        if not contenders:
            raise UsageError(f"--only {' '.join(args.only)} matches no method")
    for note in notes:
        _warn("bench", note)
    rows = []
    with Progress(len(objects) * len(contenders), "bench", enabled=not args.no_progress) as progress:
        for row in bench.run(objects, contenders, args.dir, repeat, progress.step):
            rows.append(row)
    machine = _machine()
    settings = {
        "repeat": repeat,
        "quick": args.quick,
        "file": args.file,
        "options": options,
        "nthreads": args.nthreads,
    }
    if args.json:
        _print_json({"machine": machine, "settings": settings, "notes": notes, "results": rows})
        return EXIT_OK
    print(
        f"blpickle {machine['blpickle']}, numpy {machine['numpy']}, blosc2 {machine['blosc2']}, "
        f"Python {machine['python']}, {machine['cpus']} CPUs; best of {repeat}, "
        "files read back from the page cache"
    )
    descriptions = {
        "low": "low entropy: arange int64",
        "medium": "medium entropy: sine + noise float64",
        "high": "high entropy: uniform random float64",
    }
    for name, obj in objects:
        own = [r for r in rows if r["dataset"] == name]
        reference = next((r["nbytes"] for r in own if "nbytes" in r), None)
        label = descriptions.get(name, name) if args.file is None else name
        size = f"{human_size(reference)}" if reference is not None else "?"
        basis = "" if hasattr(obj, "nbytes") and not isinstance(obj, dict) else " (its pickle's size)"
        print(f"\n{label}, {size}{basis}")
        print(bench.format_table(own))
    return EXIT_OK


def _machine() -> dict[str, Any]:
    import blosc2
    import numpy as np

    from .options import available_threads

    return {
        "blpickle": __version__,
        "numpy": np.__version__,
        "blosc2": blosc2.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": available_threads(),
    }


# --------------------------------------------------------------------------------------------
# The parser and main()


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

    def add(name: str, help: str, epilog: str) -> argparse.ArgumentParser:
        return commands.add_parser(
            name,
            help=help,
            description=help,
            epilog=epilog,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )

    info = add("info", "show what a file holds, without unpickling it", INFO_EPILOG)
    info.add_argument("file", metavar="FILE")
    info.add_argument("--json", action="store_true", help="print JSON for scripts")
    _add_key_options(info, "also check the signature with the key in this file (its bytes as they are)")
    info.set_defaults(run=cmd_info)

    verify = add("verify", "check every checksum of a blpickle file (and its signature)", VERIFY_EPILOG)
    verify.add_argument("file", metavar="FILE")
    verify.add_argument("--json", action="store_true", help="print JSON for scripts")
    _add_key_options(verify, "check the signature with the key in this file (its bytes as they are)")
    verify.set_defaults(run=cmd_verify)

    convert = add("convert", "convert between pickle, joblib, npy, npz and blpickle files", CONVERT_EPILOG)
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
    convert.add_argument("--no-progress", action="store_true", help="no progress bar")
    _add_load_options(convert, "IN")
    _add_key_options(
        convert,
        "check the signature of blpickle input and sign blpickle output with the key in this file",
    )
    _add_codec_options(convert)
    convert.set_defaults(run=cmd_convert)

    bench = add("bench", "time dump/load against pickle and joblib", BENCH_EPILOG)
    bench.add_argument("file", metavar="FILE", nargs="?", help="time this file's object (default: sample datasets)")
    bench.add_argument("--quick", action="store_true", help="8 MB datasets, one run each")
    bench.add_argument("--size-mb", type=float, metavar="MB", help="size of each sample dataset (default: 80)")
    bench.add_argument("--repeat", type=int, metavar="N", help="best of N runs (default: 3, 1 with --quick)")
    bench.add_argument(
        "--only",
        nargs="+",
        metavar="WORD",
        help="only the methods whose names contain one of these words",
    )
    bench.add_argument("--dir", metavar="DIR", help="where to write the files (default: the temporary directory)")
    bench.add_argument("--json", action="store_true", help="print JSON for scripts")
    bench.add_argument("--no-progress", action="store_true", help="no progress bar")
    _add_load_options(bench, "FILE")
    _add_codec_options(bench)
    bench.set_defaults(run=cmd_bench)
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
        _error(args.command, str(exc))
        return EXIT_USAGE
    except ConversionError as exc:
        _error(args.command, str(exc))
        return EXIT_FAILED
    except OSError as exc:
        if isinstance(exc, BrokenPipeError):
            return EXIT_FAILED
        _error(args.command, f"{exc.filename or ''}{': ' if exc.filename else ''}{exc.strerror or exc}")
        return EXIT_FAILED
    except KeyboardInterrupt:
        _error(args.command, "interrupted")
        return 130
