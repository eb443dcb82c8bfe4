"""The drop-in Unpickler and load/loads: records (full or compact) and plain pickle data.

A record is read by `blpickle.engine.reader.RecordReader` and its pickle stream unpickled as the
reader decompresses it (`blpickle.format.layout`); a compact record given to `loads` is checked and
unpickled in one step. Input that does not start with blpickle's magic is read as plain
pickle data.
"""

from __future__ import annotations

import io
import os
import pickle
import struct
import traceback
from collections.abc import Callable, Iterable, Iterator
from typing import Any, BinaryIO, NamedTuple, NoReturn

from . import format as fmt
from .engine.pickle_file import PickleFile, open_pickle
from .engine.policy import COMPACT_LIMIT
from .engine.reader import RecordReader
from .errors import (
    BadMagicError,
    BlpickleError,
    CorruptError,
    LimitError,
    LoadError,
    OptionsError,
    SignatureError,
    TruncatedError,
)
from .format.scan import scan_globals
from .io.files import open_input
from .io.ranges import has_readinto, read_upto, readinto_of, readinto_whole
from .io.sources import FileSource, MemorySource, Source, map_file
from .options import Options, available_threads, check_key
from .restricted import Policy, RestrictedUnpickler

__all__ = ["MMAP_MODES", "Unpickler", "load", "loads"]


class _Settings(NamedTuple):
    """The arguments of ``pickle.Unpickler`` an unpickler passes on to each load."""

    fix_imports: bool
    encoding: str
    errors: str


#: What the C unpickler raises for a malformed stream. In a record the stream passed its
#: checksum, so these, and any other error the unpickler raises itself (TypeError,
#: AttributeError, SystemError for opcodes applied to the wrong objects; MemoryError for a
#: declared size: LimitError), mean a forged or damaged record: they become CorruptErrors.
#: Other errors raised by the Python code the pickle calls (a class's ``__setstate__``, the
#: import of a missing module) pass through unchanged, except in a restricted load.
_MALFORMED_PICKLE = (pickle.UnpicklingError, EOFError, ValueError, struct.error, IndexError, KeyError, OverflowError)
MMAP_MODES = (None, "r", "r+", "c")


class Unpickler(pickle.Unpickler):
    """A C ``pickle.Unpickler`` that reads blpickle records, and plain pickle data too.

    Same arguments as ``pickle.Unpickler``, plus:

    Args:
        mmap_mode: for records written with ``codec=None`` in a regular file, return arrays
            that view a memory map of the file, read-only ("r"), read-write ("r+") or
            copy-on-write ("c"), as ``numpy.load`` does, instead of reading them. Mapped
            buffers are not checksummed on load (data changed through "r+" no longer matches
            its checksum: a later load without mmap_mode raises ChecksumError); the object
            graph is always read and checked. As with ``numpy.memmap``, if another program
            truncates the file while arrays map it, touching them kills the process (SIGBUS).
            With ``key``, nothing is mapped: what loads is what the signature was checked on.
            Compressed buffers, and files that are not plain files on disk, are read as
            usual.
        nthreads: decompression threads (default: every available CPU).
        safe: load data only (see `blpickle.safe`): builtin containers and scalars, numpy
            arrays, dtypes, scalars and random generators; nothing is called but vetted
            reconstructors; anything else raises `blpickle.UnsafeLoadError`, naming every
            global the pickle needs that is not admitted, before it is imported. The pickle is
            run by `blpickle.restricted.RestrictedUnpickler` (pure Python), which rebuilds
            numpy dtypes and arrays from checked states; ``find_class`` and
            ``persistent_load`` overrides are not used.
        allowed: what a safe load admits besides: ``"pkg.*"`` (a package's classes and
            constants, created as data, and its vetted reconstructors) or exact names
            (``"pkg.mod.name"`` or the object itself: called as pickle calls it). Any value
            but None, an empty list included, means a restricted load.
        key: the key the record was signed with: the whole record is read and its
            signature checked before anything is decompressed or unpickled; unsigned or
            altered records raise `blpickle.SignatureError`. Plain pickle data is
            refused.
    """

    def find_class(self, module: str, name: str) -> Any:
        """Import ``module.name`` as pickle does. Overridden in Python so that the error of a
        missing module or name comes from a stack frame the loader recognises as code the pickle
        called (and passes through as pickle does), not as a malformed pickle."""
        return super().find_class(module, name)

    def __init__(
        self,
        file: BinaryIO,
        *,
        fix_imports: bool = True,
        encoding: str = "ASCII",
        errors: str = "strict",
        buffers: Iterable[Any] | None = None,
        mmap_mode: str | None = None,
        nthreads: int | None = None,
        safe: bool = False,
        allowed: Iterable[str | Any] | None = None,
        key: bytes | None = None,
    ) -> None:
        if mmap_mode not in MMAP_MODES:
            raise OptionsError(f"mmap_mode must be one of {MMAP_MODES}, not {mmap_mode!r}")
        self._settings = _Settings(fix_imports, encoding, errors)
        super().__init__(file, fix_imports=fix_imports, encoding=encoding, errors=errors, buffers=buffers)
        self._file = file
        self._buffers = buffers
        self._mmap_mode = mmap_mode
        self._nthreads = available_threads() if nthreads is None else Options(nthreads=nthreads).threads
        self._policy = Policy(allowed or ()) if safe or allowed is not None else None
        self._key = check_key(key)

    def load(self) -> Any:
        """Read one record (or one plain pickle) from the file and return the object.

        Raises:
            blpickle.LoadError: for a damaged or truncated record (a ``pickle.UnpicklingError``).
            pickle.UnpicklingError, EOFError: for plain pickle data, as ``pickle`` does.
        """
        if not hasattr(self, "_settings"):
            raise pickle.UnpicklingError(f"Unpickler.__init__() was not called by {type(self).__name__}.__init__()")
        head, taken = _first_bytes(self._file)
        if head == fmt.MAGIC:
            if not taken:
                _read_upto(self._file, len(head))
            if type(self) is Unpickler and self._mmap_mode is None and self._policy is None and self._key is None:
                return self._load_small_record(head)
            return self._load_record(head)
        if len(head) < len(fmt.MAGIC) and fmt.MAGIC.startswith(head):
            raise TruncatedError("the magic bytes", 0, len(fmt.MAGIC), len(head))
        if fmt.damaged_magic(head):
            raise BadMagicError(head)
        if self._key is not None:
            raise SignatureError("this is not a blpickle record, so it cannot be signed: refusing to load it")
        return self._unpickle(_rewind(self._file, head if taken else b""), self._buffers)

    def _load_small_record(self, magic: bytes) -> Any:
        """Load the record whose magic was just read: a compact one under `COMPACT_LIMIT`
        bytes is read whole and loaded as `loads` loads it (one checksum, one unpickling;
        a header the quick check refuses is read again from memory, to report the error as
        for every record), any other by a `RecordReader` on the file."""
        preamble = magic + _read_upto(self._file, fmt.PREAMBLE.size - len(magic))
        size = fmt.compact_size(preamble)
        if size is None or size >= COMPACT_LIMIT:
            return self._load_from(FileSource(self._file, pos=len(preamble)), preamble)
        rest = _read_upto(self._file, size + fmt.U64.size)
        body = fmt.checked_compact_pickle(rest, preamble)
        if body is not None:
            fix_imports, encoding, errors = self._settings
            try:
                return pickle.loads(body, fix_imports=fix_imports, encoding=encoding, errors=errors)
            except Exception as exc:
                _raise_compact_error(exc, body)
        return self._load_from(MemorySource(preamble + rest, len(preamble)), preamble)

    def _load_record(self, magic: bytes) -> Any:
        """Load the record whose magic was just read, by reading the file, or with
        ``mmap_mode`` from a memory map of it if it is a plain file (then leave the file just
        after the record)."""
        # a signed record loads from the bytes its signature was checked on, never from a map
        # that another program could change after the check
        mapped = None if self._mmap_mode is None or self._key is not None else map_file(self._file, self._mmap_mode)
        if mapped is None:
            return self._load_from(FileSource(self._file, pos=len(magic)), magic)
        start = self._file.tell() - len(magic)
        source = MemorySource(mapped, len(magic), offset=start, mapped=True)
        try:
            return self._load_from(source, magic)
        finally:
            self._file.seek(start + source.pos)

    def _unpickle(self, file: Any, buffers: Iterable[Any] | None, stored: Callable[[], int] | None = None) -> Any:
        """Unpickle ``file``: in safe mode with the `RestrictedUnpickler` (``stored`` gives the
        bytes of input read so far, for a record's decompressed pickle stream), else with
        the C unpickler with a fresh state, keeping this object's overrides (``find_class``,
        ``persistent_load``) and attributes. (Re-initialising a C Unpickler that has already
        loaded crashes CPython, so each load gets a clone.)"""
        fix_imports, encoding, errors = self._settings
        if self._policy is not None:
            return RestrictedUnpickler(
                file,
                self._policy,
                buffers=buffers,
                fix_imports=fix_imports,
                encoding=encoding,
                errors=errors,
                stored=stored,
            ).load()
        clone = pickle.Unpickler.__new__(type(self))
        clone.__dict__.update(self.__dict__)
        pickle.Unpickler.__init__(
            clone, file, buffers=buffers, fix_imports=fix_imports, encoding=encoding, errors=errors
        )
        return pickle.Unpickler.load(clone)

    def _load_from(self, source: Source, magic: bytes) -> Any:
        reader = RecordReader(source, self._nthreads, magic=magic, key=self._key)
        header = reader.header
        graph = open_pickle(reader)
        buffers: Iterable[Any] = reader.buffers()
        if header.external:
            if self._buffers is None:
                raise LoadError(
                    f"this record uses {len(header.external)} out-of-band buffers kept by the "
                    "caller when it was written: pass them as buffers="
                )
            buffers = _merge_buffers(iter(buffers), iter(self._buffers), header.external)
        try:
            obj = self._unpickle(graph, buffers, lambda: source.pos)
        except BlpickleError:
            raise
        except Exception as exc:
            if isinstance(graph, PickleFile) and graph.error is not None:  # lost by the unpickler
                raise graph.error from None
            error = _graph_error(exc, self._policy is None and _raised_by_called_code(exc))
            if error is exc:
                raise
            raise error from exc
        finally:
            reader.settle()  # the buffers read ahead that the unpickler did not take
        if isinstance(graph, PickleFile):
            graph.check_rest()
        reader.finish()
        return obj


def _graph_error(exc: Exception, by_called_code: bool) -> Exception:
    """Return the error to report for ``exc``, raised while unpickling a record's object
    graph: ``exc`` itself when code the unpickler called raised it (a class's
    ``__setstate__``, a missing module: as pickle reports them), else a `LimitError` for a
    size the pickle declares, a `CorruptError` for a malformed pickle."""
    if isinstance(exc, MemoryError):  # a size the pickle declares, wherever it was allocated
        return LimitError(f"the record's object graph declares more than can be allocated: {exc}")
    if by_called_code and not isinstance(exc, _MALFORMED_PICKLE):
        return exc
    return CorruptError(f"the record's object graph is not a valid pickle: {type(exc).__name__}: {exc}")


def _raised_by_called_code(exc: BaseException) -> bool:
    """True when ``exc`` was raised in Python code the unpickler called (its traceback goes
    deeper than `Unpickler._unpickle`), not by the unpickler or a builtin itself."""
    frames = [frame.f_code for frame, _ in traceback.walk_tb(exc.__traceback__)]
    return Unpickler._unpickle.__code__ in frames[:-1]


def _merge_buffers(ours: Iterator[Any], theirs: Iterator[Any], external: tuple[int, ...]) -> Iterator[Any]:
    """Yield out-of-band buffers in pickle order, from the caller's at ``external`` slots.

    Raises:
        LoadError: when the caller's buffers run out at an ``external`` slot (the record
            is sound: the call lacks buffers).
    """
    slots = set(external)
    slot = 0
    while True:
        source = theirs if slot in slots else ours
        try:
            buffer = next(source)
        except StopIteration:
            if source is theirs:
                raise LoadError(
                    f"this record uses {len(external)} out-of-band buffers kept by the caller when it "
                    f"was written; buffers= holds only {external.index(slot)}"
                ) from None
            return
        yield buffer
        slot += 1


def _read_upto(file: BinaryIO, size: int) -> bytes:
    """Return up to ``size`` bytes read from ``file`` (fewer at its end), with ``read``: a
    record's magic and preamble, the rest of a compact record (no buffer to set up), or what
    the unpickler asks `_Prefixed` for (`blpickle.io.ranges.read_upto`, as bytes)."""
    data = file.read(size)
    if type(data) is bytes and len(data) == size:  # as it mostly comes
        return data
    return bytes(read_upto(file, size, first=data))


class _Prefixed:
    """A file that returns ``prefix`` then the rest of ``file`` (for non-seekable input)."""

    def __init__(self, prefix: bytes, file: BinaryIO) -> None:
        self._prefix = prefix
        self._file = file
        self._readinto = readinto_of(file)

    def read(self, size: int = -1) -> bytes:
        if not self._prefix and size >= 0:  # what the unpickler reads after the magic
            return _read_upto(self._file, size)  # whole, as pickle expects of read
        head, self._prefix = (
            (self._prefix, b"") if size < 0 or size >= len(self._prefix) else (self._prefix[:size], self._prefix[size:])
        )
        if size < 0:
            return head + self._file.read()
        return head + _read_upto(self._file, size - len(head)) if size > len(head) else head

    def readinto(self, buffer: Any) -> int:
        """Fill ``buffer`` with the prefix, then from the file (its own ``readinto``, or reads
        of at most `blpickle.io.ranges.READ_PIECE` bytes); return the count, short only at
        the file's end. The unpickler reads large payloads this way, straight into the
        object they make, instead of through a copy per read."""
        view = memoryview(buffer).cast("B")
        done = min(len(self._prefix), len(view))
        view[:done] = self._prefix[:done]
        self._prefix = self._prefix[done:]
        return done + readinto_whole(self._readinto, view[done:])

    def peek(self, size: int = 0) -> bytes:
        """Return bytes to come without reading them, for the unpickler to read ahead (without
        it, it calls ``read`` for each opcode): the prefix, else what the file's own ``peek``
        gives.

        Raises:
            NotImplementedError: for a file without ``peek`` (the unpickler then reads as it goes).
        """
        if self._prefix:
            return self._prefix
        peek = getattr(self._file, "peek", None)
        if peek is None:
            raise NotImplementedError("the file has no peek")
        return peek(size)

    def readline(self, size: int = -1) -> bytes:
        end = self._prefix.find(b"\n") + 1 or len(self._prefix)
        if 0 <= size < end:
            end = size
        head, self._prefix = self._prefix[:end], self._prefix[end:]
        if head.endswith(b"\n") or self._prefix or 0 <= size <= len(head):
            return head
        return head + self._file.readline(-1 if size < 0 else size - len(head))


def _first_bytes(file: BinaryIO) -> tuple[bytes, bool]:
    """Return the first bytes of ``file``, as many as a record's magic (fewer at its end),
    and whether they were read. A file that cannot seek but can ``peek`` (a pipe's reader)
    shows them without their being read where its buffer holds enough of them to tell a
    record from pickle data: a pickle shorter than the magic is then not cut from what
    follows it, and the unpickler reads ahead through that buffer. From a file that can do
    neither, bytes that start pickle data (an opcode, which the magic's first byte is not)
    are read one at a time up to a STOP opcode's byte, for the same reason: a pickle ends
    with one, so no byte after it is taken."""
    size = len(fmt.MAGIC)
    if _can_seek(file):
        return _read_upto(file, size), True
    peek = getattr(file, "peek", None)
    if peek is not None:
        try:
            shown = bytes(peek(size)[:size])
        except (OSError, ValueError, TypeError, NotImplementedError):
            shown = b""
        if len(shown) == size or (shown and not fmt.MAGIC.startswith(shown)):
            return shown, False
    head = _read_upto(file, 1)
    if head not in fmt.PICKLE_OPCODES:  # a record, a damaged magic, or the end
        return head + _read_upto(file, size - 1) if head else head, True
    while len(head) < size and not head.endswith(pickle.STOP) and (more := _read_upto(file, 1)):
        head += more
    return head, True


def _can_seek(file: BinaryIO) -> bool:
    try:
        return bool(file.seekable())
    except (AttributeError, OSError, ValueError):
        return False


def _rewind(file: BinaryIO, head: bytes) -> Any:
    """Return ``file`` as it was before ``head`` was read from it, for the unpickler: sought
    back, or with ``head`` in front of it where it cannot seek; behind a `_Prefixed`, which
    reads it with ``read``, where it has no ``readinto`` of its own (which the unpickler
    calls for large payloads)."""
    if head and _can_seek(file):
        try:
            file.seek(-len(head), io.SEEK_CUR)
            head = b""
        except OSError:
            pass
    return file if not head and has_readinto(file) else _Prefixed(head, file)


def load(
    file: BinaryIO | str | os.PathLike[str],
    *,
    fix_imports: bool = True,
    encoding: str = "ASCII",
    errors: str = "strict",
    buffers: Iterable[Any] | None = None,
    mmap_mode: str | None = None,
    nthreads: int | None = None,
    safe: bool = False,
    allowed: Iterable[str | Any] | None = None,
    key: bytes | None = None,
) -> Any:
    """Read one object from ``file``: a blpickle record or plain pickle data.

    Args:
        file: a binary file object (anything with ``read``), a path (``~`` is expanded) or
            a URL such as ``s3://bucket/key`` (with fsspec; ``mmap_mode`` is ignored). After a
            record, a file is left just after it, so records written one after the other load
            one after the other.
        fix_imports: as in `pickle.load`.
        encoding: as in `pickle.load` (for Python 2 pickles).
        errors: as in `pickle.load` (for Python 2 pickles).
        buffers: the out-of-band buffers a ``buffer_callback`` kept at dump time, in order.
        mmap_mode: ``"r"``, ``"r+"`` or ``"c"``: arrays of records written with ``codec=None``
            view a memory map of the file, as with `numpy.load` (not checksummed); None (the
            default) reads the file. Ignored with ``key``: a signed load maps nothing.
        nthreads: decompression threads (default: every available CPU).
        safe: load data only, with a restricted unpickler (`blpickle.restricted`): builtin
            containers and scalars, numpy arrays, dtypes, scalars and random generators,
            blpickle's tensors (`blpickle.tensors`), and what ``allowed`` adds; call nothing
            but vetted reconstructors.
        allowed: what a safe load admits besides: ``"pkg.*"`` (the classes and constants of a
            package, created as data, and its vetted reconstructors), ``"pkg.mod.name"`` or
            the object itself (that object, called as pickle calls it). Any value but None
            (an empty list included) means a restricted load.
        key: the key the record was signed with: the signature is checked before anything
            is decompressed or unpickled; unsigned or altered records raise `SignatureError`.

    Example:
        ```python
        obj = blpickle.load("model.blp", safe=True)
        ```

    Raises:
        blpickle.LoadError: for a damaged or truncated record (a ``pickle.UnpicklingError``).
    """
    with open_input(file, "r+b" if mmap_mode == "r+" else "rb") as opened:
        unpickler = Unpickler(
            opened,
            fix_imports=fix_imports,
            encoding=encoding,
            errors=errors,
            buffers=buffers,
            mmap_mode=mmap_mode,
            nthreads=nthreads,
            safe=safe,
            allowed=allowed,
            key=key,
        )
        return unpickler.load()


def loads(
    data: Any,
    /,
    *,
    fix_imports: bool = True,
    encoding: str = "ASCII",
    errors: str = "strict",
    buffers: Iterable[Any] | None = None,
    nthreads: int | None = None,
    safe: bool = False,
    allowed: Iterable[str | Any] | None = None,
    key: bytes | None = None,
) -> Any:
    """Read one object from a bytes-like object: a blpickle record or plain pickle data.

    Takes the arguments of `load` but ``file`` and ``mmap_mode``.

    Example:
        ```python
        array = blpickle.loads(blpickle.dumps(np.arange(10)))
        ```

    Raises:
        TypeError: for ``str`` input.
        blpickle.LoadError: for a damaged or truncated record (a ``pickle.UnpicklingError``).
    """
    if isinstance(data, str):
        raise TypeError("a bytes-like object is required, not 'str'")
    if not safe and allowed is None and key is None:
        body = fmt.checked_compact_pickle(data)
        if body is not None:
            try:
                return pickle.loads(body, fix_imports=fix_imports, encoding=encoding, errors=errors)
            except Exception as exc:
                _raise_compact_error(exc, body)
    view = memoryview(data).cast("B")
    head = bytes(view[: len(fmt.MAGIC)])
    unpickler = Unpickler(
        io.BytesIO(data) if head != fmt.MAGIC else io.BytesIO(),
        fix_imports=fix_imports,
        encoding=encoding,
        errors=errors,
        buffers=buffers,
        nthreads=nthreads,
        safe=safe,
        allowed=allowed,
        key=key,
    )
    if head != fmt.MAGIC:
        return unpickler.load()
    return unpickler._load_from(MemorySource(view, len(fmt.MAGIC)), head)


def _raise_compact_error(exc: Exception, body: Any) -> NoReturn:
    """Called while handling ``exc``, raised by unpickling a compact record's pickle
    ``body``: raise it when Python code the pickle called raised it, as for every record (see
    `_graph_error`); when the unpickler itself refused the pickle, raise what a scan of its
    opcodes finds wrong (`blpickle.format.scan`), or else the `CorruptError` for ``exc``. The pickle
    is never unpickled again: the calls it made before the damage ran once."""
    if isinstance(exc, BlpickleError):
        raise
    if len(traceback.extract_tb(exc.__traceback__)) > 1 or _raised_by_find_class(exc):
        error = _graph_error(exc, True)
        if error is exc:
            raise
        raise error from exc
    header = fmt.compact_header(body)
    scan_globals([body], header.protocol, (), header.streams[0].nbytes)
    raise _graph_error(exc, False) from exc


def _raised_by_find_class(exc: Exception) -> bool:
    """True for the error of the C unpickler's ``find_class`` (a module that is not installed,
    a name it does not hold), which leaves no stack frame to tell it by: an import error, or
    pickle's own message for a missing name."""
    return isinstance(exc, ImportError) or (
        isinstance(exc, AttributeError) and str(exc).startswith("Can't get attribute")
    )
