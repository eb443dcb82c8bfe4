"""The ``blpickle info`` and ``blpickle verify`` commands: what a file holds, and whether every
checksum of its records (and their signature) holds, without unpickling anything."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from typing import Any

from .. import format as fmt
from ..errors import LoadError, SignatureError, add_note
from ..info import RecordInfo, inspect
from ..io.files import open_input
from .arguments import add_command, add_key_options, check_input, read_key
from .formats import Detected, file_size, sniff
from .output import (
    EXIT_FAILED,
    EXIT_OK,
    binary_size,
    error,
    error_text,
    human_size,
    plural,
    print_json,
    shown,
    warn,
)

__all__ = ["add_commands", "read_records"]

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


def add_commands(commands: Any) -> None:
    """Add ``info`` and ``verify`` to ``commands`` (what ``ArgumentParser.add_subparsers`` returns)."""
    info = add_command(commands, "info", "show what a file holds, without unpickling it", INFO_EPILOG)
    info.add_argument("file", metavar="FILE")
    info.add_argument("--json", action="store_true", help="print JSON for scripts")
    add_key_options(info, "also check the signature with the key in this file (its bytes as they are)")
    info.set_defaults(run=cmd_info)

    verify = add_command(
        commands, "verify", "check every checksum of a blpickle file (and its signature)", VERIFY_EPILOG
    )
    verify.add_argument("file", metavar="FILE")
    verify.add_argument("--json", action="store_true", help="print JSON for scripts")
    add_key_options(verify, "check the signature with the key in this file (its bytes as they are)")
    verify.set_defaults(run=cmd_verify)


def read_records(path: str, key: bytes | None = None) -> tuple[list[RecordInfo], int]:
    """Inspect every record of a blpickle file in turn; return their descriptions and the
    number of bytes after the last record that are not a record (data appended by another
    writer, such as a plain pickle).

    Raises:
        blpickle.LoadError: for the first damaged record; its notes say which record it is.
    """
    records: list[RecordInfo] = []
    size = file_size(path)
    with open_input(path) as file:
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
                    shown(b.dtype or f"bytes (itemsize {b.itemsize})"),
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


def _examined(args: argparse.Namespace) -> tuple[str, bytes | None, Detected]:
    """Return the file a command examines (checked to be readable), the key it was given
    (None without one) and what the file is, recognised by its first bytes."""
    path = args.file
    check_input(path)
    return path, read_key(args), sniff(path)


def _failed(
    command: str, args: argparse.Namespace, doc: dict[str, Any], message: str, exc: LoadError | None = None
) -> int:
    """Report why ``command`` failed: ``doc`` (with the error ``exc``, if given) on stdout with
    --json, then ``message`` on stderr; return the exit status."""
    if exc is not None:
        doc.update(error=error_text(exc), error_type=type(exc).__name__)
    if args.json:
        print_json(doc)
    error(command, message)
    return EXIT_FAILED


def cmd_info(args: argparse.Namespace) -> int:
    """Run ``blpickle info``; return the exit status."""
    path, key, detected = _examined(args)
    size = file_size(path)
    doc: dict[str, Any] = {
        "path": path,
        "format": detected.format,
        "description": detected.description,
        "size": size,
    }
    if detected.format != "blpickle":
        if key is not None:
            warn("info", "a key checks blpickle records only: ignored")
        doc.update(detected.details)
        doc.pop("readable_ops", None)
        known = detected.format not in ("unknown", "empty", "zip") and "error" not in detected.details
        if args.json:
            print_json(doc)
        else:
            print(shown(f"{path}: {detected.description}, {human_size(size)}"))
            for line in _other_lines(path, detected):
                print(shown(line))
        if not known:
            error("info", f"{path}: not a file blpickle can read ({detected.description})")
        return EXIT_OK if known else EXIT_FAILED
    try:
        records, trailing = read_records(path, key)
    except LoadError as exc:
        return _failed("info", args, doc, f"{path}: {type(exc).__name__}: {error_text(exc)}", exc)
    doc["records"] = [r.to_dict() for r in records]
    doc["trailing_bytes"] = trailing
    if args.json:
        print_json(doc)
        return EXIT_OK
    count = f"{len(records)} blpickle records" if len(records) > 1 else "a blpickle record"
    print(f"{path}: {count}, {human_size(size)}")
    for n, record in enumerate(records):
        if len(records) > 1:
            print(f" record {n + 1}:")
        for line in _record_lines(record):
            print(shown(line))
    if trailing:
        print(f"  then {human_size(trailing)} that are not a blpickle record (plain pickle data, say)")
    return EXIT_OK


def cmd_verify(args: argparse.Namespace) -> int:
    """Run ``blpickle verify``; return the exit status."""
    path, key, detected = _examined(args)
    doc: dict[str, Any] = {
        "path": path,
        "format": detected.format,
        "ok": False,
        "signature_checked": key is not None,
    }
    if detected.format != "blpickle":
        message = f"{path} is {detected.description}: only blpickle records carry checksums to verify"
        doc.update(error=message, error_type="NotARecord")
        return _failed("verify", args, doc, message)
    try:
        records, trailing = read_records(path, key)
    except LoadError as exc:
        problem = "bad signature" if isinstance(exc, SignatureError) else "damaged"
        return _failed("verify", args, doc, f"{path}: {problem}: {type(exc).__name__}: {error_text(exc)}", exc)
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
        print_json(doc)
    else:
        what = f"{plural(len(records), 'record')}, {plural(buffers, 'buffer')} in {plural(chunks, 'chunk')}"
        signature = (
            "; signature ok" if key is not None else ("; signed (pass a key to check it)" if any(doc["signed"]) else "")
        )
        print(f"{path}: ok ({what}, every checksum matches{signature})")
    if trailing:
        warn(
            "verify",
            f"{path}: the last {trailing} bytes are not a blpickle record and were not checked",
        )
    return EXIT_OK
