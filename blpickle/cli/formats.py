"""What the ``blpickle`` command knows about other file formats: recognising a file by its first
bytes, and reading and writing objects as pickle, joblib, npy, npz or blpickle files.

Nothing here unpickles while *recognising* a file: pickle data is only read opcode by opcode
with `pickletools`. Reading an object (`read_object`) does run the file's pickle,
unless ``safe``/``allowed`` restrict it (blpickle and pickle input) or the format has no
pickle in it (npy and npz without object arrays).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import io
import os
import pickle
import pickletools
import zipfile
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, BinaryIO

import numpy as np
import numpy.lib.format as npy_format

from .. import format as fmt
from ..info import pickle_globals
from ..io.files import atomic_write, open_input
from ..io.remote import filesystem, is_url, writing
from ..pickler import dump as blpickle_dump
from ..unpickler import load as blpickle_load

__all__ = [
    "EXTENSIONS",
    "FORMATS",
    "ConversionError",
    "Detected",
    "UsageError",
    "format_for_path",
    "read_object",
    "sniff",
    "write_object",
]

#: Formats ``blpickle convert`` reads and writes.
FORMATS = ("blpickle", "pickle", "joblib", "npy", "npz")
#: File name extensions that name an output format.
EXTENSIONS = {
    ".blp": "blpickle",
    ".blpickle": "blpickle",
    ".pkl": "pickle",
    ".pickle": "pickle",
    ".joblib": "joblib",
    ".npy": "npy",
    ".npz": "npz",
}

#: joblib's compressors, by the first bytes of the files they write (joblib.compressor).
JOBLIB_PREFIXES = (
    (b"\x1f\x8b", "gzip"),
    (b"BZ", "bz2"),
    (b"\xfd7zXZ", "xz"),
    (b"\x5d\x00", "lzma"),
    (b"\x04\x22\x4d\x18", "lz4"),
    (b"\x78", "zlib"),
)
NPY_MAGIC = b"\x93NUMPY"
ZIP_MAGICS = (b"PK\x03\x04", b"PK\x05\x06")
#: How much of a pickle file is read to list the globals it imports.
PICKLE_SCAN_SIZE = 1 << 20
#: Opcodes a protocol 0 or 1 pickle can start with.
_OLD_PICKLE_STARTS = frozenset(op.code.encode("latin-1") for op in pickletools.opcodes if op.proto <= 1)


class UsageError(Exception):
    """A bad command line: wrong arguments, a missing file or key (exit status 2)."""


class ConversionError(Exception):
    """The input cannot be read or written as asked (exit status 1)."""


@dataclasses.dataclass
class Detected:
    """What the first bytes of a file say it is.

    Attributes:
        format: ``"blpickle"``, ``"pickle"``, ``"joblib"``, ``"npy"``, ``"npz"``, ``"zip"``,
            ``"empty"`` or ``"unknown"``.
        description: one line for people.
        details: JSON-compatible facts (protocol, globals, compressor, dtype and shape, ...).
    """

    format: str
    description: str
    details: dict[str, Any] = dataclasses.field(default_factory=dict)


def path_kind(path: str) -> str | None:
    """Return ``"file"`` or ``"directory"`` for what a path or URL (``s3://...``, through
    fsspec) names, or None where there is nothing.

    Raises:
        ImportError: for a URL without fsspec (or the file system's package).
    """
    if is_url(path):
        fs, inner = filesystem(path)
        return ("directory" if fs.isdir(inner) else "file") if fs.exists(inner) else None
    return ("directory" if os.path.isdir(path) else "file") if os.path.exists(path) else None


def file_size(path: str) -> int:
    """Return the size in bytes of the file at a path or URL."""
    if is_url(path):
        fs, inner = filesystem(path)
        return int(fs.size(inner))
    return os.path.getsize(path)


@contextlib.contextmanager
def _output(path: str, durable: bool) -> Iterator[BinaryIO]:
    """Yield a binary file that replaces ``path`` (fsync'd if ``durable``: see `atomic_write`),
    or writes to a URL, once the block succeeds."""
    with writing(path) if is_url(path) else atomic_write(path, durable=durable) as file:
        yield file


def format_for_path(path: str) -> str | None:
    """Return the format a file name's extension names, or None."""
    return EXTENSIONS.get(os.path.splitext(path)[1].lower())


def sniff(path: str) -> Detected:
    """Recognise the file at ``path`` by its first bytes, without unpickling anything.

    Raises:
        OSError: when the file cannot be read.
    """
    size = file_size(path)
    with open_input(path) as file:
        head = file.read(PICKLE_SCAN_SIZE)
        last = head[-1:]
        if size > len(head):
            file.seek(-1, os.SEEK_END)
            last = file.read(1)
    if not head:
        return Detected("empty", "an empty file")
    magic = fmt.MAGIC
    if head.startswith(magic) or (len(head) < len(magic) and magic.startswith(head)):
        return Detected("blpickle", "a blpickle record")
    if head[:1] == fmt.JOBLIB_MAGIC[:1]:
        description = "a joblib file compressed with 'blosc' (blpickle's joblib compressor)"
        if importlib.util.find_spec("joblib") is None:
            description += "; reading it needs joblib: pip install joblib"
        return Detected("joblib", description, {"compressor": "blosc"})
    if fmt.damaged_magic(head):
        return Detected("blpickle", "a damaged blpickle record (its magic bytes are altered)")
    if head.startswith(NPY_MAGIC):
        return _sniff_npy(head)
    if head.startswith(ZIP_MAGICS):
        return _sniff_zip(path)
    if head[:1] == b"\x80" and len(head) > 1:
        return _sniff_pickle(head, head[1])
    for prefix, name in JOBLIB_PREFIXES:
        if head.startswith(prefix):
            return Detected("joblib", f"a joblib file compressed with {name}", {"compressor": name})
    if head[:1] in _OLD_PICKLE_STARTS and last == b".":
        detected = _sniff_pickle(head, None)
        if detected.details.get("readable_ops", 0) > 0:
            return detected
    return Detected("unknown", f"unknown format (first bytes {head[:8]!r})")


def scan_pickle(head: bytes) -> tuple[tuple[str, ...], bool, int]:
    """Return the globals the pickle data in ``head`` imports (read without running it),
    whether the scan reached its STOP opcode, and how many opcodes were read.

    The scan stops at the first opcode it cannot read (data cut at the end of ``head``, or the
    raw array bytes joblib writes between opcodes): the globals before it are returned.
    """
    stream = io.BytesIO(head)
    end, count, complete = 0, 0, False
    try:
        for op, _arg, _pos in pickletools.genops(stream):
            end, count = stream.tell(), count + 1
            if op.name == "STOP":
                complete = True
                break
    except Exception:  # genops raises several types for data that is not pickle
        pass
    if not count:
        return (), False, 0
    data = head[:end] if complete else head[:end] + b"."
    try:
        return pickle_globals(data), complete, count
    except Exception:
        return (), complete, count


def _sniff_pickle(head: bytes, protocol: int | None) -> Detected:
    found, complete, count = scan_pickle(head)
    details: dict[str, Any] = {
        "protocol": protocol,
        "globals": list(found),
        "globals_complete": complete,
        "readable_ops": count,
    }
    if any(name.startswith("joblib.numpy_pickle.") for name in found):
        details["compressor"] = None
        return Detected("joblib", "a joblib file (uncompressed: a pickle with joblib's array records)", details)
    version = f"protocol {protocol}" if protocol is not None else "protocol 0 or 1"
    return Detected("pickle", f"a plain pickle ({version}), not a blpickle record", details)


def _sniff_npy(head: bytes) -> Detected:
    try:
        stream = io.BytesIO(head)
        version = npy_format.read_magic(stream)
        reader = npy_format.read_array_header_1_0 if version == (1, 0) else npy_format.read_array_header_2_0
        shape, fortran_order, dtype = reader(stream)
    except Exception as exc:  # numpy raises ValueError, but a cut header can raise others
        return Detected("npy", f"a damaged .npy file ({exc})", {"error": str(exc)})
    details = {
        "version": f"{version[0]}.{version[1]}",
        "dtype": str(dtype),
        "shape": list(shape),
        "fortran_order": fortran_order,
        "nbytes": int(np.prod(shape)) * dtype.itemsize,
    }
    return Detected("npy", f"a numpy .npy file: {dtype} array of shape {tuple(shape)}", details)


def _sniff_zip(path: str) -> Detected:
    try:
        with open_input(path) as file, zipfile.ZipFile(file) as archive:
            members = archive.infolist()
            arrays = [_npz_member(archive, m) for m in members if m.filename.endswith(".npy")]
    except (zipfile.BadZipFile, OSError, ValueError) as exc:
        return Detected("zip", f"a damaged zip archive ({exc})", {"error": str(exc)})
    if members and len(arrays) == len(members):
        return Detected("npz", f"a numpy .npz archive of {len(arrays)} arrays", {"arrays": arrays})
    if not members:
        return Detected("npz", "an empty numpy .npz archive", {"arrays": []})
    return Detected("zip", f"a zip archive of {len(members)} files, not an .npz file", {})


def _npz_member(archive: zipfile.ZipFile, member: zipfile.ZipInfo) -> dict[str, Any]:
    out: dict[str, Any] = {"name": member.filename[: -len(".npy")], "stored": member.compress_size}
    with archive.open(member) as stream:
        try:
            version = npy_format.read_magic(stream)
            reader = npy_format.read_array_header_1_0 if version == (1, 0) else npy_format.read_array_header_2_0
            shape, _, dtype = reader(stream)
        except Exception as exc:  # report any damaged member
            out["error"] = str(exc)
            return out
    nbytes = int(np.prod(shape)) * dtype.itemsize
    out.update(dtype=str(dtype), shape=list(shape), nbytes=nbytes)
    return out


# --------------------------------------------------------------------------------------------
# Reading and writing objects


def _need_joblib() -> Any:
    try:
        import joblib
    except ImportError:
        raise ConversionError("joblib files need joblib, which is not installed: pip install joblib") from None
    from ..integrations.joblib import register

    register()  # so that files compressed with "blosc" load
    return joblib


def read_object(
    path: str,
    format: str,
    *,
    safe: bool = False,
    allowed: Iterable[str] | None = None,
    key: bytes | None = None,
    nthreads: int | None = None,
) -> tuple[Any, list[str]]:
    """Read the object a file holds; return it and notes for the user.

    This runs the file's pickle (unless ``safe``/``allowed`` restrict it, for blpickle and
    pickle input). ``key`` checks a blpickle record's signature.

    Raises:
        UsageError: for options that do not apply to the format.
        ConversionError: when a needed package is missing.
        blpickle.LoadError, pickle.UnpicklingError, ValueError, OSError: for bad input.
    """
    restricted = safe or allowed is not None
    notes: list[str] = []
    if key is not None and format != "blpickle":
        raise UsageError(f"a key checks blpickle records only; the input is a {format} file")
    if format in ("blpickle", "pickle"):
        with open_input(path) as file:
            obj = blpickle_load(file, safe=safe, allowed=allowed, key=key, nthreads=nthreads)
            if file.read(1):
                notes.append(f"{path} holds more than one object: only the first was read")
        return obj, notes
    if format == "joblib":
        if restricted:
            raise UsageError("--safe/--allow cannot restrict joblib.load: it has no restricted mode")
        joblib = _need_joblib()
        with open_input(path) as file:
            return joblib.load(file), notes
    if format == "npy":
        with open_input(path) as file:
            return np.load(file, allow_pickle=not restricted), notes
    if format == "npz":
        with open_input(path) as file, np.load(file, allow_pickle=not restricted) as archive:
            return {name: archive[name] for name in archive.files}, notes
    raise UsageError(f"cannot read {format!r} files; formats: {', '.join(FORMATS)}")


def _describe(obj: Any) -> str:
    if isinstance(obj, np.ndarray):
        return f"a {obj.dtype} array of shape {obj.shape}"
    return f"a {type(obj).__module__}.{type(obj).__qualname__}".replace("builtins.", "")


def _plain_array(value: Any, where: str, target: str) -> np.ndarray:
    if not isinstance(value, np.ndarray):
        hint = (
            " (use .npz for a dict of arrays, or .blp/.pkl for any object)"
            if target == ".npy"
            else (" (use .blp/.pkl for any object)")
        )
        raise ConversionError(f"{target} holds only numpy arrays, but {where} is {_describe(value)}{hint}")
    if value.dtype.hasobject:
        raise ConversionError(
            f"{where} is an array of Python objects: {target} can only store it as a pickle; use .blp or .pkl"
        )
    return value


def npz_arrays(obj: Any) -> dict[str, np.ndarray]:
    """Return the arrays to write to an .npz file: a dict with string keys as is, a list or
    tuple as ``arr_0``, ``arr_1``, ..., one array as ``arr_0``.

    Raises:
        ConversionError: for anything else, naming the first value that is not a plain array.
    """
    if isinstance(obj, np.ndarray):
        return {"arr_0": _plain_array(obj, "the object", ".npz")}
    if isinstance(obj, (list, tuple)):
        return {f"arr_{i}": _plain_array(v, f"item {i}", ".npz") for i, v in enumerate(obj)}
    if isinstance(obj, Mapping):
        out = {}
        for name, value in obj.items():
            if not isinstance(name, str):
                raise ConversionError(f".npz names its arrays with strings, but a key is {name!r}")
            out[name] = _plain_array(value, f"the value of key {name!r}", ".npz")
        return out
    raise ConversionError(
        f".npz holds a dict (or list) of numpy arrays, but the object is {_describe(obj)}; "
        "use .blp or .pkl for any object"
    )


def parse_joblib_compress(spec: str | None) -> Any:
    """Turn ``--compress`` into joblib's ``compress`` argument: ``None`` -> 0 (none), ``"3"``
    -> 3 (zlib level 3), ``"lz4"`` -> ``"lz4"``, ``"zlib:6"`` -> ``("zlib", 6)``.

    Raises:
        UsageError: for a malformed value.
    """
    if spec is None:
        return 0
    name, _, level = spec.partition(":")
    if name.isdigit() and not level:
        return int(name)
    if level:
        if not level.isdigit() or not 0 <= int(level) <= 9:
            raise UsageError(f"--compress {spec!r}: the level must be 0 to 9")
        return (name, int(level))
    return name


def write_object(
    obj: Any,
    path: str,
    format: str,
    *,
    protocol: int | None = None,
    compress: str | None = None,
    key: bytes | None = None,
    options: Mapping[str, Any] | None = None,
    durable: bool = False,
) -> None:
    """Write ``obj`` to ``path`` (or a URL) as a ``format`` file, atomically (the file is
    replaced only when the write succeeds), flushed to the device if ``durable``.

    ``compress`` is joblib's compressor (``"zlib:3"``, ``"lz4"``, ``"blosc"``, a level) for
    joblib output, or any value for compressed .npz; ``options`` and ``key`` are blpickle's.

    Raises:
        ConversionError: when the object cannot be stored in that format.
        UsageError: for options that do not apply to the format.
    """
    options = dict(options or {})
    if format != "blpickle" and (options or key is not None):
        raise UsageError(
            "codec options (--codec, --preset, ...) and keys apply to blpickle output only; "
            f"the output is a {format} file"
        )
    if compress is not None and format not in ("joblib", "npz"):
        raise UsageError(f"--compress applies to joblib and npz output only; the output is a {format} file")
    if format == "blpickle":
        blpickle_dump(obj, path, protocol, key=key, durable=durable, **options)
    elif format == "pickle":
        with _output(path, durable) as file:
            pickle.dump(obj, file, pickle.HIGHEST_PROTOCOL if protocol is None else protocol)
    elif format == "joblib":
        joblib = _need_joblib()
        value = parse_joblib_compress(compress)
        with _output(path, durable) as file:
            joblib.dump(obj, file, compress=value, protocol=protocol)
    elif format == "npy":
        array = _plain_array(obj, "the object", ".npy")
        with _output(path, durable) as file:
            np.save(file, array, allow_pickle=False)
    elif format == "npz":
        arrays = npz_arrays(obj)
        compression = zipfile.ZIP_STORED if compress is None else zipfile.ZIP_DEFLATED
        with (
            _output(path, durable) as file,
            zipfile.ZipFile(file, "w", compression, allowZip64=True) as archive,
        ):
            for name, array in arrays.items():  # as numpy.savez does
                with archive.open(f"{name}.npy", "w", force_zip64=True) as member:
                    npy_format.write_array(member, array, allow_pickle=False)
    else:
        raise UsageError(f"cannot write {format!r} files; formats: {', '.join(FORMATS)}")
