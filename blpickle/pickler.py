"""The drop-in Pickler/Unpickler and dump/dumps/load/loads.

Pickling runs the C pickler at protocol 5 into memory (the object graph is small), taking
every contiguous buffer out of band, then writes one record (:mod:`blpickle.format`) with the
buffers as chunked, multithreaded Blosc2 streams. Loading reads the record back; input that
does not start with blpickle's magic is read as plain pickle data.
"""

from __future__ import annotations

import contextlib
import copyreg
import functools
import io
import pickle
import struct
import sys
import traceback
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack
from pickle import PickleBuffer
from typing import Any, BinaryIO

import cloudpickle
import numpy as np

from . import format as fmt
from .arrays import reduce_ndarray
from .buffers import Payload
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
from .files import atomic_write, is_path
from .options import Options, resolve_options
from .safe import Policy
from .stream import (
    FileSource,
    MappedFileSource,
    MemorySource,
    PackedStream,
    PickleFile,
    RecordReader,
    Source,
    map_file,
    write_record,
)

__all__ = [
    "DEFAULT_PROTOCOL",
    "HIGHEST_PROTOCOL",
    "CloudPickler",
    "Pickler",
    "Unpickler",
    "dump",
    "dumps",
    "load",
    "loads",
]

HIGHEST_PROTOCOL = pickle.HIGHEST_PROTOCOL
#: blpickle pickles at protocol 5 unless told otherwise: it is the one with out-of-band buffers.
DEFAULT_PROTOCOL = 5

BufferCallback = Callable[[PickleBuffer], Any]
#: Buffers smaller than this stay in the pickle stream (compressed with it): a stream of its
#: own costs more (header entry, Blosc2 call, checksum) than copying them. Uncompressed
#: records (codec None) keep every buffer out of band, so that all can be memory-mapped.
INBAND_LIMIT = 64 << 10
#: Payloads the pickler writes in band (bytes, bytearray, str) from this size are spliced out.
#: Frames are at most about 128 KiB, so no frame is ever mistaken for a payload.
SPLICE_LIMIT = 1 << 20
#: What the C unpickler raises for a malformed stream. In a record the stream passed its
#: checksum, so these, and any other error the unpickler raises itself (TypeError,
#: AttributeError, SystemError for opcodes applied to the wrong objects; MemoryError for a
#: declared size: LimitError), mean a forged or damaged record: they become CorruptErrors.
#: Other errors raised by the Python code the pickle calls (a class's ``__setstate__``, the
#: import of a missing module) pass through unchanged, except in a restricted load.
_MALFORMED_PICKLE = (pickle.UnpicklingError, EOFError, ValueError, struct.error, IndexError, KeyError, OverflowError)
MMAP_MODES = (None, "r", "r+", "c")


class _Graph:
    """Where the C pickler writes. The pickle stream is cut into chunks that are compressed in
    the background as soon as they are complete (a :class:`PackedStream`; kept whole when
    uncompressed). At protocol 4 and up, the large bytes, bytearray and str payloads the
    pickler writes on their own (never inside a frame) are kept by reference, to be stored as
    streams of their own and spliced back in on load."""

    def __init__(self, streams: list[tuple[Payload, int | None]], splice: bool, options: Options) -> None:
        self._streams = streams  # shared with the pickler: streams in the order the pickle uses them
        self._splice = splice
        self._options = options
        self.reset()

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        if self._splice and view.nbytes >= SPLICE_LIMIT:
            self._streams.append((Payload(view, None, 1), self._start + len(self._tail)))
            return view.nbytes
        self._tail += view
        chunk_size = self._chunk_size
        while len(self._tail) >= chunk_size:
            self._packed.add(bytes(self._tail[:chunk_size]))
            del self._tail[:chunk_size]
            self._start += chunk_size
        return view.nbytes

    def finish(self) -> PackedStream | Payload:
        """Return the whole pickle stream, compressing or whole."""
        if self._packed is None:
            return Payload(memoryview(self._tail), None, 1)
        self._packed.add(bytes(self._tail), last=True)
        return self._packed

    def reset(self) -> None:
        """Start a new pickle stream (dropping chunks of a failed one not compressed yet)."""
        if getattr(self, "_packed", None) is not None:
            self._packed.cancel()
        self._tail = bytearray()
        self._start = 0  # offset of the tail in the pickle stream
        self._packed = PackedStream(self._options) if self._options.codec is not None else None
        self._chunk_size = sys.maxsize if self._packed is None else self._packed.chunk_size


class _RecordPickler:
    """Shared by :class:`Pickler` and :class:`CloudPickler`: pickles into memory with
    buffers out of band, then writes one blpickle record to the file per :meth:`dump`."""

    options: Options

    def __init__(
        self,
        file: BinaryIO,
        protocol: int | None = None,
        *,
        fix_imports: bool = True,
        buffer_callback: BufferCallback | None = None,
        key: bytes | None = None,
        **options: Any,
    ) -> None:
        self.options = resolve_options(**options)
        self._key = _check_key(key)
        if self.options.pickler != self._kind:
            raise OptionsError(f"pickler={self.options.pickler!r}: use blpickle.{_PICKLER_NAMES[self.options.pickler]}")
        self._protocol = DEFAULT_PROTOCOL if protocol is None else protocol
        if self._protocol < 0:
            self._protocol = HIGHEST_PROTOCOL
        self._streams: list[tuple[Payload, int | None]] = []  # (payload, splice offset)
        self._graph = _Graph(self._streams, self._protocol >= 4, self.options)
        self._user_callback = buffer_callback
        # small arrays are copied in band (and compressed with the pickle stream), writable
        self._copy_small_arrays = self._protocol >= 5 and buffer_callback is None and self.options.codec is not None
        self.dispatch_table = self._dispatch_table()
        callback = self._take_buffer if self._protocol >= 5 else buffer_callback
        self._init_pickler(self._graph, self._protocol, fix_imports, callback)
        if not hasattr(file, "write"):
            raise TypeError("file must have a 'write' attribute")
        self._file = file
        self._reset()

    _kind = "pickle"

    def _init_pickler(self, graph: _Graph, protocol: int, fix_imports: bool, callback: Any) -> None:
        pickle.Pickler.__init__(self, graph, protocol, fix_imports=fix_imports, buffer_callback=callback)

    def _dispatch_table(self) -> Any:
        return {**copyreg.dispatch_table, np.ndarray: self._reduce_ndarray, np.memmap: self._reduce_ndarray}

    def _reset(self) -> None:
        self._streams.clear()
        self._placeholders: dict[int, tuple[PickleBuffer, np.ndarray]] = {}
        self._external: list[int] = []
        self._slots = 0

    def _reduce_ndarray(self, array: np.ndarray) -> Any:
        if (
            self._copy_small_arrays
            and array.nbytes < INBAND_LIMIT
            and array.dtype.itemsize
            and not array.dtype.hasobject
        ):
            return reduce_ndarray(array, bytearray(array.tobytes(order="A")))  # "A": the order reduce_ndarray names
        if type(array) is not np.ndarray:
            array = array.view(np.ndarray)  # np.memmap and friends load as plain arrays
        contiguous = array.flags.c_contiguous or array.flags.f_contiguous
        if (
            self._protocol < 5
            or array.dtype.hasobject
            or array.dtype.itemsize == 0
            or (self._user_callback is not None and (contiguous or array.nbytes < INBAND_LIMIT))
        ):
            return array.__reduce_ex__(self._protocol)
        placeholder = PickleBuffer(bytearray())
        self._placeholders[id(placeholder)] = (placeholder, array)
        return reduce_ndarray(array, placeholder)

    def _take_buffer(self, buffer: PickleBuffer) -> bool:
        taken = self._placeholders.pop(id(buffer), None)
        if taken is not None:
            self._streams.append((Payload.from_array(taken[1]), None))
        elif self._user_callback is not None:
            if self._user_callback(buffer):
                return True  # the caller wants it in band
            self._external.append(self._slots)
        elif buffer.raw().nbytes < INBAND_LIMIT and self.options.codec is not None:
            return True
        else:
            self._streams.append((Payload.from_picklebuffer(buffer), None))
        self._slots += 1
        return False

    def dump(self, obj: Any) -> None:
        """Write ``obj`` as one blpickle record to the file.

        Raises:
            pickle.PicklingError: when ``obj`` cannot be pickled.
        """
        if not hasattr(self, "_graph"):
            raise pickle.PicklingError(f"Pickler.__init__() was not called by {type(self).__name__}.__init__()")
        self._reset()
        self.clear_memo()
        try:
            super().dump(obj)
            streams = [(self._graph.finish(), None), *self._streams]
            payloads = [payload for payload, _ in streams]
            write_record(self._file, self._header(streams), payloads, self.options, self._key)
        finally:
            self._graph.reset()
            self._reset()

    def _header(self, streams: list[tuple[Payload | PackedStream, int | None]]) -> fmt.Header:
        raw = self.options.codec is None
        infos = []
        for payload, splice in streams:
            if isinstance(payload, PackedStream):
                infos.append(fmt.StreamInfo(payload.nbytes, payload.chunk_size, codec=payload.codec))
                continue
            chunk_size = self.options.chunk_size_for(payload.nbytes, payload.chunk_multiple)
            infos.append(
                fmt.StreamInfo(
                    nbytes=payload.nbytes,
                    chunk_size=max(payload.nbytes, 1) if raw else chunk_size,
                    itemsize=payload.itemsize,
                    raw=raw,
                    dtype=None if payload.dtype is None else _dtype_name(payload.dtype),
                    shape=payload.shape,
                    splice=splice,
                )
            )
        return fmt.Header(self.options.to_dict(), self._protocol, tuple(infos), tuple(self._external))


@functools.lru_cache(maxsize=256)
def _dtype_name(dtype: np.dtype) -> str:
    return str(dtype)  # slow for structured dtypes, and many arrays share one


class Pickler(_RecordPickler, pickle.Pickler):
    """A C ``pickle.Pickler`` that writes blpickle records.

    Same arguments as ``pickle.Pickler`` (protocol defaults to 5), plus ``key=`` (bytes: sign
    each record with HMAC-SHA256) and keyword options for :class:`blpickle.Options`
    (``codec=``, ``clevel=``, ..., or ``preset=``).
    """


class CloudPickler(_RecordPickler, cloudpickle.Pickler):
    """A ``cloudpickle.Pickler`` that writes blpickle records: it also saves lambdas,
    closures and classes defined in ``__main__``, by value."""

    _kind = "cloudpickle"

    def _init_pickler(self, graph: _Graph, protocol: int, fix_imports: bool, callback: Any) -> None:
        cloudpickle.Pickler.__init__(self, graph, protocol, buffer_callback=callback)

    def _dispatch_table(self) -> Any:
        from collections import ChainMap

        ours = {np.ndarray: self._reduce_ndarray, np.memmap: self._reduce_ndarray}
        return ChainMap(ours, cloudpickle.Pickler.dispatch_table)


_PICKLER_NAMES = {"pickle": "Pickler", "cloudpickle": "CloudPickler"}
_PICKLERS: dict[str, type[_RecordPickler]] = {"pickle": Pickler, "cloudpickle": CloudPickler}


class Unpickler(pickle.Unpickler):
    """A C ``pickle.Unpickler`` that reads blpickle records, and plain pickle data too.

    Same arguments as ``pickle.Unpickler``, plus:

    Args:
        mmap_mode: for records written with ``codec=None`` in a regular file, return arrays
            that view a memory map of the file, read-only ("r"), read-write ("r+") or
            copy-on-write ("c"), as ``numpy.load`` does, instead of reading them. Mapped
            buffers are not checksummed on load (data changed through "r+" no longer matches
            its checksum: a later load without mmap_mode raises ChecksumError). Compressed
            buffers, and files that cannot be mapped, are read as usual.
        nthreads: decompression threads (default: every available CPU).
        safe: import no global but builtin containers and scalars and numpy arrays, dtypes
            and scalars (:data:`blpickle.safe.SAFE_GLOBALS`); anything else raises
            :class:`blpickle.UnsafeLoadError` before it is imported.
        allowed: more globals a safe load may import: import paths (``"pkg.mod.Name"``,
            ``"pkg.*"``) or the types and functions themselves. Implies ``safe``.
        key: the key the record was signed with: the whole record is read and its
            signature checked before anything is unpickled; unsigned or altered records
            raise :class:`blpickle.SignatureError`. Plain pickle data is refused.
    """

    def find_class(self, module: str, name: str) -> Any:
        """Import ``module.name``, after checking it against the policy of a safe load."""
        if self._policy is not None:
            self._policy.check(module, name)
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
        allowed: Iterable[str | Any] = (),
        key: bytes | None = None,
    ) -> None:
        if mmap_mode not in MMAP_MODES:
            raise OptionsError(f"mmap_mode must be one of {MMAP_MODES}, not {mmap_mode!r}")
        self._settings = {"fix_imports": fix_imports, "encoding": encoding, "errors": errors}
        super().__init__(file, buffers=buffers, **self._settings)
        self._file = file
        self._buffers = buffers
        self._mmap_mode = mmap_mode
        self._nthreads = Options(nthreads=nthreads).threads
        allowed = tuple(allowed)
        self._policy = Policy(allowed) if safe or allowed else None
        self._key = _check_key(key)

    def load(self) -> Any:
        """Read one record (or one plain pickle) from the file and return the object.

        Raises:
            blpickle.LoadError: for a damaged or truncated record (a ``pickle.UnpicklingError``).
            pickle.UnpicklingError, EOFError: for plain pickle data, as ``pickle`` does.
        """
        if not hasattr(self, "_settings"):
            raise pickle.UnpicklingError(f"Unpickler.__init__() was not called by {type(self).__name__}.__init__()")
        head = _read_upto(self._file, len(fmt.MAGIC))
        if head == fmt.MAGIC:
            return self._load_record(head)
        if len(head) < len(fmt.MAGIC) and fmt.MAGIC.startswith(head):
            raise TruncatedError("the magic bytes", 0, len(fmt.MAGIC), len(head))
        if head[:1] == fmt.JOBLIB_MAGIC[:1]:
            raise BadMagicError(head, "this is a joblib file compressed with 'blosc': read it with joblib.load")
        if fmt.damaged_magic(head):
            raise BadMagicError(head)
        if self._key is not None:
            raise SignatureError("this is not a blpickle record, so it cannot be signed: refusing to load it")
        return self._unpickle(_rewind(self._file, head), self._buffers)

    def _load_record(self, magic: bytes) -> Any:
        """Load the record whose magic was just read, from a memory map of the file if it is
        a regular file (then leave the file just after the record), else by reading it."""
        mapped = map_file(self._file, self._mmap_mode)
        if mapped is None:
            return self._load_from(FileSource(self._file, pos=len(magic)), magic)
        start = self._file.tell() - len(magic)
        if self._mmap_mode is None:
            source: MemorySource = MappedFileSource(mapped, len(magic), start)
        else:
            source = MemorySource(mapped, len(magic), offset=start, mapped=True)
        try:
            return self._load_from(source, magic)
        finally:
            self._file.seek(start + source.pos)
            if self._mmap_mode is None:  # nothing loaded refers to the map: close it now
                source.release()
                with contextlib.suppress(BufferError):
                    mapped.close()

    def _unpickle(self, file: Any, buffers: Iterable[Any] | None) -> Any:
        """Run the C unpickler on ``file`` with a fresh state, keeping this object's overrides
        (``find_class``, ``persistent_load``) and attributes. (Re-initialising a C Unpickler
        that has already loaded crashes CPython, so each load gets a clone.)"""
        clone = pickle.Unpickler.__new__(type(self))
        clone.__dict__.update(self.__dict__)
        pickle.Unpickler.__init__(clone, file, buffers=buffers, **self._settings)
        return pickle.Unpickler.load(clone)

    def _load_from(self, source: Source, magic: bytes) -> Any:
        reader = RecordReader(source, self._nthreads, magic=magic, key=self._key)
        header = reader.header
        # A framed pickle is read a frame at a time: from a file object that follows the
        # decompression; the unpickler reads an unframed one an opcode at a time: from memory.
        framed = header.protocol >= 4
        graph = PickleFile(reader.read_chunks(), reader) if framed else io.BytesIO(reader.read_stream())
        if self._key is not None:  # check the signature before unpickling anything
            reader.preload()
            reader.finish()
        buffers: Iterable[Any] = reader.buffers()
        if header.external:
            if self._buffers is None:
                raise LoadError(
                    f"this record uses {len(header.external)} out-of-band buffers kept by the "
                    "caller when it was written: pass them as buffers="
                )
            buffers = _merge_buffers(buffers, iter(self._buffers), header.external)
        try:
            obj = self._unpickle(graph, buffers)
        except BlpickleError:
            raise
        except Exception as exc:
            if self._policy is None and not isinstance(exc, _MALFORMED_PICKLE) and _raised_by_called_code(exc):
                raise  # a class's __setstate__, a missing module: as pickle reports them
            if isinstance(exc, MemoryError):
                raise LimitError(f"the record's object graph declares more than can be allocated: {exc}") from exc
            raise CorruptError(f"the record's object graph is not a valid pickle: {type(exc).__name__}: {exc}") from exc
        if self._key is None:
            reader.finish()
        return obj


def _raised_by_called_code(exc: BaseException) -> bool:
    """True when ``exc`` was raised in Python code the unpickler called (its traceback goes
    deeper than :meth:`Unpickler._unpickle`), not by the unpickler or a builtin itself."""
    frames = [frame.f_code for frame, _ in traceback.walk_tb(exc.__traceback__)]
    return Unpickler._unpickle.__code__ in frames[:-1]


def _check_key(key: Any) -> bytes | None:
    if key is not None and (not isinstance(key, (bytes, bytearray)) or not key):
        raise OptionsError("key must be a non-empty bytes object")
    return None if key is None else bytes(key)


def _merge_buffers(ours: Iterator[Any], theirs: Iterator[Any], external: tuple[int, ...]) -> Iterator[Any]:
    """Yield out-of-band buffers in pickle order, from the caller's at ``external`` slots."""
    slots = set(external)
    slot = 0
    while True:
        source = theirs if slot in slots else ours
        try:
            buffer = next(source)
        except StopIteration:
            return
        yield buffer
        slot += 1


def _read_upto(file: BinaryIO, size: int) -> bytes:
    data = b""
    while len(data) < size:
        more = file.read(size - len(data))
        if not more:
            break
        data += more
    return data


class _Prefixed:
    """A file that returns ``prefix`` then the rest of ``file`` (for non-seekable input)."""

    def __init__(self, prefix: bytes, file: BinaryIO) -> None:
        self._prefix = prefix
        self._file = file

    def read(self, size: int = -1) -> bytes:
        head, self._prefix = (
            (self._prefix, b"") if size < 0 or size >= len(self._prefix) else (self._prefix[:size], self._prefix[size:])
        )
        if size < 0:
            return head + self._file.read()
        return head + (self._file.read(size - len(head)) if size > len(head) else b"")

    def readline(self, size: int = -1) -> bytes:
        if b"\n" in self._prefix:
            end = self._prefix.index(b"\n") + 1
            line, self._prefix = self._prefix[:end], self._prefix[end:]
            return line
        head, self._prefix = self._prefix, b""
        return head + self._file.readline()


def _rewind(file: BinaryIO, head: bytes) -> Any:
    try:
        if file.seekable():
            file.seek(-len(head), io.SEEK_CUR)
            return file
    except (AttributeError, OSError):
        pass
    return _Prefixed(head, file)


def dump(
    obj: Any,
    file: BinaryIO | str,
    protocol: int | None = None,
    *,
    fix_imports: bool = True,
    buffer_callback: BufferCallback | None = None,
    key: bytes | None = None,
    **options: Any,
) -> None:
    """Write ``obj`` to ``file`` (a binary file object or a path) as a blpickle record.

    Writing to a path is atomic: the file is replaced only once the record is complete.
    ``options`` are :class:`blpickle.Options` fields (``codec=``, ``clevel=``, ``shuffle=``,
    ``bytedelta=``, ``chunk_size=``, ``nthreads=``, ``pickler=``) or ``preset=``. With
    ``key`` (bytes) the record is signed: ``load(..., key=key)`` checks it.

    Raises:
        blpickle.OptionsError: for an invalid option.
        pickle.PicklingError: when ``obj`` cannot be pickled.
    """
    resolved = resolve_options(**options)
    with ExitStack() as stack:
        if is_path(file):
            file = stack.enter_context(atomic_write(file))
        pickler = _PICKLERS[resolved.pickler](
            file, protocol, fix_imports=fix_imports, buffer_callback=buffer_callback, key=key, preset=resolved
        )
        pickler.dump(obj)


def dumps(
    obj: Any,
    protocol: int | None = None,
    *,
    fix_imports: bool = True,
    buffer_callback: BufferCallback | None = None,
    key: bytes | None = None,
    **options: Any,
) -> bytes:
    """Return ``obj`` as a blpickle record in a bytes object; see :func:`dump`."""
    out = io.BytesIO()
    dump(obj, out, protocol, fix_imports=fix_imports, buffer_callback=buffer_callback, key=key, **options)
    return out.getvalue()


def load(
    file: BinaryIO | str,
    *,
    fix_imports: bool = True,
    encoding: str = "ASCII",
    errors: str = "strict",
    buffers: Iterable[Any] | None = None,
    mmap_mode: str | None = None,
    nthreads: int | None = None,
    safe: bool = False,
    allowed: Iterable[str | Any] = (),
    key: bytes | None = None,
) -> Any:
    """Read one object from ``file`` (a binary file object or a path).

    Reads blpickle records and plain pickle data. See :class:`Unpickler` for ``mmap_mode``,
    ``nthreads``, ``safe``, ``allowed`` and ``key``.

    Raises:
        blpickle.LoadError: for a damaged or truncated record (a ``pickle.UnpicklingError``).
    """
    with ExitStack() as stack:
        if is_path(file):
            file = stack.enter_context(open(file, "r+b" if mmap_mode == "r+" else "rb"))
        unpickler = Unpickler(
            file,
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
    allowed: Iterable[str | Any] = (),
    key: bytes | None = None,
) -> Any:
    """Read one object from a bytes-like object (a blpickle record or plain pickle data);
    see :func:`load`.

    Raises:
        TypeError: for ``str`` input.
        blpickle.LoadError: for a damaged or truncated record (a ``pickle.UnpicklingError``).
    """
    if isinstance(data, str):
        raise TypeError("a bytes-like object is required, not 'str'")
    view = memoryview(data).cast("B")
    head = bytes(view[: len(fmt.MAGIC)])
    settings = {"fix_imports": fix_imports, "encoding": encoding, "errors": errors, "buffers": buffers}
    restrictions = {"nthreads": nthreads, "safe": safe, "allowed": allowed, "key": key}
    if head != fmt.MAGIC:
        return load(io.BytesIO(data), **settings, **restrictions)
    unpickler = Unpickler(io.BytesIO(), **settings, **restrictions)
    return unpickler._load_from(MemorySource(view, len(fmt.MAGIC)), head)
