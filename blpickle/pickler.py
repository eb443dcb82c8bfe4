"""The drop-in Pickler/Unpickler and dump/dumps/load/loads.

Pickling runs the C pickler at protocol 5 into memory (the object graph is small), taking
every contiguous buffer out of band, then writes one record (`blpickle.format`) with the
buffers as chunked, multithreaded Blosc2 streams. Loading reads the record back; input that
does not start with blpickle's magic is read as plain pickle data.
"""

from __future__ import annotations

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
from . import remote
from .arrays import pickle_keeps_dtype, reduce_ndarray
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
from .files import atomic_write, expand, is_path, naming_errors
from .layout import PickleFile, open_pickle
from .names import array_names
from .options import PRESETS, Options, PicklerKind, resolve_options
from .remote import is_url
from .restricted import RestrictedUnpickler
from .safe import Policy
from .stream import (
    FileSource,
    MemorySource,
    PackedStream,
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
    the background as soon as they are complete (a `PackedStream`; kept whole when
    uncompressed). At protocol 4 and up, the large bytes, bytearray and str payloads the
    pickler writes on their own (never inside a frame) are kept by reference, to be stored as
    streams of their own and spliced back in on load."""

    def __init__(self, streams: list[tuple[Payload, int | None]], splice: bool, options: Options) -> None:
        self._streams = streams  # shared with _OutOfBand: streams in the order the pickle uses them
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


class _OutOfBand:
    """The buffers of one pickle stream: numpy arrays reduced to out-of-band placeholders or
    copied in band, and what the pickler's ``buffer_callback`` receives. The pickler gives its
    ``reducer_override`` and ``buffer_callback`` to the methods of this object, which never
    refers back to the pickler: a pickler and what it dumped are freed as soon as they are
    dropped, with no reference cycle left for the garbage collector."""

    def __init__(self, protocol: int, user_callback: BufferCallback | None, options: Options) -> None:
        self.streams: list[tuple[Payload, int | None]] = []  # (payload, splice offset), pickle order
        self._protocol = protocol
        self._user_callback = user_callback
        self._codec = options.codec
        # small arrays are copied in band (and compressed with the pickle stream)
        self._copy_small_arrays = protocol >= 5 and user_callback is None and options.codec is not None
        self.reset()

    def reset(self) -> None:
        """Forget the buffers of the last pickle stream."""
        self.streams.clear()
        self.external: list[int] = []  # slots of the buffers given to the caller's callback
        self._placeholders: dict[int, tuple[PickleBuffer, np.ndarray, np.ndarray]] = {}
        #: the arrays taken out of band, as the pickler met them, by position in `streams`
        #: (kept alive until reset, so that their ids name them: `blpickle.names`)
        self.arrays: dict[int, np.ndarray] = {}
        self._slots = 0

    def reduce_ndarray(self, array: np.ndarray) -> Any:
        """Return the reduce value of a numpy array: a placeholder buffer taken out of band by
        `take_buffer`, a copy in band, or numpy's own reduction (protocols under 5,
        object arrays, dtypes numpy gives back changed, a caller's ``buffer_callback``). The
        array loads as ``pickle`` gives it back, contiguous ones read-only if they were."""
        met = array
        if type(array) is not np.ndarray:
            array = array.view(np.ndarray)  # np.memmap loads as a plain array
        dtype = array.dtype
        flags = array.flags
        if (
            self._protocol < 5
            or dtype.hasobject
            or not dtype.itemsize
            # numpy gives native dtypes back unchanged, and some byte-swapped ones changed
            or (not dtype.isnative and not pickle_keeps_dtype(dtype, flags.c_contiguous or flags.f_contiguous))
        ):
            return array.__reduce_ex__(self._protocol)
        # numpy copies strided views into new (writable) arrays; others keep their flag
        readonly = not flags.writeable and (flags.c_contiguous or flags.f_contiguous)
        if self._copy_small_arrays and array.nbytes < INBAND_LIMIT:
            data = array.tobytes(order="A")  # "A": the order reduce_ndarray names
            return reduce_ndarray(array, data if readonly else bytearray(data))
        if self._user_callback is not None and (
            flags.c_contiguous or flags.f_contiguous or array.nbytes < INBAND_LIMIT
        ):  # the caller's callback gets the buffers pickle would give it
            return array.__reduce_ex__(self._protocol)
        placeholder = PickleBuffer(b"" if readonly else bytearray())  # pickle marks a read-only one
        self._placeholders[id(placeholder)] = (placeholder, array, met)
        return reduce_ndarray(array, placeholder)

    def take_buffer(self, buffer: PickleBuffer) -> bool:
        """The C pickler's ``buffer_callback``: keep ``buffer`` out of band (False) or in the
        pickle stream (True)."""
        taken = self._placeholders.pop(id(buffer), None)
        if taken is not None:
            self.arrays[len(self.streams)] = taken[2]
            self.streams.append((Payload.from_array(taken[1]), None))
        elif self._user_callback is not None:
            if self._user_callback(buffer):
                return True  # the caller wants it in band
            self.external.append(self._slots)
        elif buffer.raw().nbytes < INBAND_LIMIT and self._codec is not None:
            return True
        else:
            self.streams.append((Payload.from_picklebuffer(buffer), None))
        self._slots += 1
        return False


#: The array types blpickle takes out of band (subclasses keep their own reduction).
_ARRAY_TYPES = (np.ndarray, np.memmap)


class _RecordPickler:
    """Shared by `Pickler` and `CloudPickler`: pickles into memory with
    buffers out of band, then writes one blpickle record to the file per `dump`.

    The subclass's ``dispatch_table`` (a class attribute, or one set on the instance) is the
    pickler's, as with ``pickle``; numpy arrays go through `reducer_override`."""

    options: Options
    _kind: PicklerKind = "pickle"

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
        if not hasattr(file, "write"):
            raise TypeError("file must have a 'write' attribute")
        self.options = self._resolve_options(options)
        self._key = _check_key(key)
        self._protocol = DEFAULT_PROTOCOL if protocol is None else protocol
        if self._protocol < 0:
            self._protocol = HIGHEST_PROTOCOL
        self._out_of_band = _OutOfBand(self._protocol, buffer_callback, self.options)
        self._graph = _Graph(self._out_of_band.streams, self._protocol >= 4, self.options)
        callback = self._out_of_band.take_buffer if self._protocol >= 5 else buffer_callback
        self._init_pickler(self._graph, self._protocol, fix_imports, callback)
        self._file = file

    def _resolve_options(self, options: dict[str, Any]) -> Options:
        """Return the options with this class's pickler.

        Raises:
            OptionsError: when ``pickler=``, or a preset's pickler other than the default,
                names another pickler than this class.
        """
        resolved = resolve_options(**options)
        named = options.get("pickler", resolved.pickler)
        if named != self._kind and ("pickler" in options or named != PRESETS["default"].pickler):
            raise OptionsError(
                f"pickler={named!r} contradicts blpickle.{type(self).__name__}: "
                f"use blpickle.{_PICKLER_NAMES[named]}, or leave pickler= out"
            )
        return resolved if resolved.pickler == self._kind else resolved.replace(pickler=self._kind)

    def _init_pickler(self, graph: _Graph, protocol: int, fix_imports: bool, callback: Any) -> None:
        pickle.Pickler.__init__(self, graph, protocol, fix_imports=fix_imports, buffer_callback=callback)

    def reducer_override(self, obj: Any) -> Any:
        """Reduce numpy arrays for blpickle (see `_OutOfBand.reduce_ndarray`); return
        ``NotImplemented`` for anything else, which the pickler then saves as usual."""
        if type(obj) in _ARRAY_TYPES:
            return self._out_of_band.reduce_ndarray(obj)
        return NotImplemented

    def dump(self, obj: Any) -> None:
        """Write ``obj`` as one blpickle record to the file.

        Raises:
            pickle.PicklingError: when ``obj`` cannot be pickled.
        """
        if not hasattr(self, "_graph"):
            raise pickle.PicklingError(f"Pickler.__init__() was not called by {type(self).__name__}.__init__()")
        try:
            super().dump(obj)
            streams = [(self._graph.finish(), None), *self._out_of_band.streams]
            payloads = [payload for payload, _ in streams]
            write_record(self._file, self._header(streams, obj), payloads, self.options, self._key)
        finally:  # keep nothing of obj: the memo and the buffers would hold it alive
            self.clear_memo()
            self._graph.reset()
            self._out_of_band.reset()

    def _header(self, streams: list[tuple[Payload | PackedStream, int | None]], obj: Any) -> fmt.Header:
        raw = self.options.codec is None
        arrays = self._out_of_band.arrays
        names = array_names(obj, {id(array): position for position, array in arrays.items()}) if arrays else {}
        infos = []
        for number, (payload, splice) in enumerate(streams):
            if isinstance(payload, PackedStream):
                infos.append(fmt.StreamInfo(payload.nbytes, payload.chunk_size, codec=payload.codec))
                continue
            array = arrays.get(number - 1)
            chunk_size = self.options.chunk_size_for(payload.nbytes, self._chunk_multiple(payload, array))
            infos.append(
                fmt.StreamInfo(
                    nbytes=payload.nbytes,
                    chunk_size=max(payload.nbytes, 1) if raw else chunk_size,
                    itemsize=payload.itemsize,
                    raw=raw,
                    dtype=None if payload.dtype is None else _dtype_name(payload.dtype),
                    shape=payload.shape,
                    splice=splice,
                    order=None if array is None else "F" if array.flags.fnc else "C",
                    name=names.get(number - 1),
                )
            )
        return fmt.Header(self.options.to_dict(), self._protocol, tuple(infos), tuple(self._out_of_band.external))

    def _chunk_multiple(self, payload: Payload, array: np.ndarray | None) -> int:
        """What a payload's chunk size is a multiple of: a C-order array's row (its leading
        axis), so that reading a range of rows decompresses only the chunks holding them, when
        a row fits in a chunk; else what the payload needs (`Payload.chunk_multiple`)."""
        if array is None or array.ndim == 0 or not array.shape[0] or array.flags.fnc:
            return payload.chunk_multiple
        row = payload.nbytes // array.shape[0]
        return row if 0 < row <= self.options.chunk_size else payload.chunk_multiple


@functools.lru_cache(maxsize=256)
def _dtype_name(dtype: np.dtype) -> str:
    return str(dtype)  # slow for structured dtypes, and many arrays share one


class Pickler(_RecordPickler, pickle.Pickler):
    """A C ``pickle.Pickler`` that writes blpickle records.

    Same arguments as ``pickle.Pickler`` (protocol defaults to 5), plus ``key=`` (bytes: sign
    each record with HMAC-SHA256) and keyword options for `blpickle.Options`
    (``codec=``, ``clevel=``, ..., or ``preset=``; ``pickler=`` may be left out).

    Raises:
        blpickle.OptionsError: for an invalid option, or a ``pickler=`` naming the other class.
    """


class CloudPickler(_RecordPickler, cloudpickle.Pickler):
    """A ``cloudpickle.Pickler`` that writes blpickle records: it also saves lambdas,
    closures and classes defined in ``__main__``, by value. Arguments as `Pickler`."""

    _kind = "cloudpickle"

    def _init_pickler(self, graph: _Graph, protocol: int, fix_imports: bool, callback: Any) -> None:
        cloudpickle.Pickler.__init__(self, graph, protocol, buffer_callback=callback)

    def reducer_override(self, obj: Any) -> Any:
        """Reduce numpy arrays as `Pickler` does, the rest as cloudpickle does."""
        reduced = _RecordPickler.reducer_override(self, obj)
        return cloudpickle.Pickler.reducer_override(self, obj) if reduced is NotImplemented else reduced


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
            its checksum: a later load without mmap_mode raises ChecksumError); the object
            graph is always read and checked. As with ``numpy.memmap``, if another program
            truncates the file while arrays map it, touching them kills the process (SIGBUS).
            With ``key``, nothing is mapped: what loads is what the signature was checked on.
            Compressed buffers, and files that are not plain files on disk, are read as
            usual.
        nthreads: decompression threads (default: every available CPU).
        safe: import no global but builtin containers and scalars and numpy arrays, dtypes
            and scalars (`blpickle.safe.SAFE_GLOBALS`); anything else raises
            `blpickle.UnsafeLoadError` before it is imported. The pickle is run by
            `blpickle.restricted.RestrictedUnpickler` (pure Python), which rebuilds
            numpy dtypes and arrays from checked states; ``find_class`` and
            ``persistent_load`` overrides are not used.
        allowed: more globals a safe load may import: import paths (``"pkg.mod.Name"``,
            ``"pkg.*"``) or the types and functions themselves. Implies ``safe``.
        key: the key the record was signed with: the whole record is read and its
            signature checked before anything is decompressed or unpickled; unsigned or
            altered records raise `blpickle.SignatureError`. Plain pickle data is
            refused.
    """

    def find_class(self, module: str, name: str) -> Any:
        """Import ``module.name`` as pickle does. Overridden in Python so that the error of a
        missing module or name comes from a frame the loader recognises as code the pickle
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
        if fmt.damaged_magic(head):
            raise BadMagicError(head)
        if self._key is not None:
            raise SignatureError("this is not a blpickle record, so it cannot be signed: refusing to load it")
        return self._unpickle(_rewind(self._file, head), self._buffers)

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

    def _unpickle(self, file: Any, buffers: Iterable[Any] | None) -> Any:
        """Unpickle ``file``: in safe mode with the `RestrictedUnpickler`, else with
        the C unpickler with a fresh state, keeping this object's overrides (``find_class``,
        ``persistent_load``) and attributes. (Re-initialising a C Unpickler that has already
        loaded crashes CPython, so each load gets a clone.)"""
        if self._policy is not None:
            return RestrictedUnpickler(file, self._policy, buffers=buffers, **self._settings).load()
        clone = pickle.Unpickler.__new__(type(self))
        clone.__dict__.update(self.__dict__)
        pickle.Unpickler.__init__(clone, file, buffers=buffers, **self._settings)
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
            buffers = _merge_buffers(buffers, iter(self._buffers), header.external)
        try:
            obj = self._unpickle(graph, buffers)
        except BlpickleError:
            raise
        except Exception as exc:
            if isinstance(graph, PickleFile) and graph.error is not None:  # lost by the unpickler
                raise graph.error from None
            if isinstance(exc, MemoryError):  # a size the pickle declares, wherever it was allocated
                raise LimitError(f"the record's object graph declares more than can be allocated: {exc}") from exc
            if self._policy is None and not isinstance(exc, _MALFORMED_PICKLE) and _raised_by_called_code(exc):
                raise  # a class's __setstate__, a missing module: as pickle reports them
            raise CorruptError(f"the record's object graph is not a valid pickle: {type(exc).__name__}: {exc}") from exc
        reader.finish()
        return obj


def _raised_by_called_code(exc: BaseException) -> bool:
    """True when ``exc`` was raised in Python code the unpickler called (its traceback goes
    deeper than `Unpickler._unpickle`), not by the unpickler or a builtin itself."""
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
        end = self._prefix.find(b"\n") + 1 or len(self._prefix)
        if 0 <= size < end:
            end = size
        head, self._prefix = self._prefix[:end], self._prefix[end:]
        if head.endswith(b"\n") or self._prefix or 0 <= size <= len(head):
            return head
        return head + self._file.readline(-1 if size < 0 else size - len(head))


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
    """Write ``obj`` to ``file`` as a blpickle record.

    Writing to a path is atomic: a regular file is replaced only once the record is complete
    and on the device; FIFOs and devices are written in place.

    Args:
        obj: the object to pickle.
        file: a binary file object (anything with ``write``: files, pipes, sockets), a
            path (``str`` or ``os.PathLike``; ``~`` is expanded) or a URL such as
            ``s3://bucket/key`` (with fsspec: written as it is produced, published once complete).
        protocol: pickle protocol of the object graph, 5 by default (the one with out-of-band
            buffers; 0-4 keep every buffer in the pickle).
        fix_imports: as in `pickle.dump`.
        buffer_callback: as in `pickle.dump`: buffers it returns false for are kept by the
            caller, who passes them to `load` as ``buffers=``.
        key: sign the record with HMAC-SHA256 under this key (non-empty bytes);
            ``load(..., key=key)`` checks it.
        **options: `blpickle.Options` fields (``codec``, ``clevel``, ``shuffle``,
            ``bytedelta``, ``chunk_size``, ``nthreads``, ``pickler``) or ``preset`` (a name
            of `blpickle.PRESETS` or an `Options`), validated before anything is written.

    Example:
        ```python
        blpickle.dump({"weights": np.ones((1000, 1000))}, "model.blp", preset="fast")
        ```

    Raises:
        blpickle.OptionsError: for an invalid option.
        pickle.PicklingError: when ``obj`` cannot be pickled.
    """
    resolved = resolve_options(**options)
    with ExitStack() as stack:
        if is_url(file):
            file = stack.enter_context(remote.writing(file))
        elif is_path(file):
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
    """Return ``obj`` as a blpickle record in a bytes object.

    Takes the arguments of `dump` but ``file``.

    Example:
        ```python
        data = blpickle.dumps(np.arange(10**6), codec="zstd")
        ```

    Raises:
        blpickle.OptionsError: for an invalid option.
        pickle.PicklingError: when ``obj`` cannot be pickled.
    """
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
    """Read one object from ``file``: a blpickle record or plain pickle data.

    Args:
        file: a binary file object (anything with ``read``), a path (``~`` is expanded) or
            a URL such as ``s3://bucket/key`` (with fsspec; ``mmap_mode`` is ignored then).
            After a record, a file is left just after it, so records written one after the
            other load one after the other.
        fix_imports: as in `pickle.load`.
        encoding: as in `pickle.load` (for Python 2 pickles).
        errors: as in `pickle.load` (for Python 2 pickles).
        buffers: the out-of-band buffers a ``buffer_callback`` kept at dump time, in order.
        mmap_mode: ``"r"``, ``"r+"`` or ``"c"``: arrays of records written with ``codec=None``
            view a memory map of the file, as with `numpy.load` (not checksummed); None (the
            default) reads the file. Ignored with ``key``: a signed load maps nothing.
        nthreads: decompression threads (default: every available CPU).
        safe: refuse every global but builtin containers and scalars and numpy arrays,
            dtypes and scalars, with a restricted unpickler (`blpickle.restricted`).
        allowed: more globals a safe load may import: ``"pkg.mod.Name"``, ``"pkg.*"``, or the
            objects themselves. Implies ``safe``.
        key: the key the record was signed with: the signature is checked before anything
            is decompressed or unpickled; unsigned or altered records raise `SignatureError`.

    Example:
        ```python
        obj = blpickle.load("model.blp", safe=True)
        ```

    Raises:
        blpickle.LoadError: for a damaged or truncated record (a ``pickle.UnpicklingError``).
    """
    with ExitStack() as stack:
        if is_url(file):
            file, mmap_mode = stack.enter_context(remote.reading(file)), None
        elif is_path(file):
            path = expand(file)
            stack.enter_context(naming_errors(path))
            file = stack.enter_context(open(path, "r+b" if mmap_mode == "r+" else "rb"))
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
    view = memoryview(data).cast("B")
    head = bytes(view[: len(fmt.MAGIC)])
    settings = {"fix_imports": fix_imports, "encoding": encoding, "errors": errors, "buffers": buffers}
    restrictions = {"nthreads": nthreads, "safe": safe, "allowed": allowed, "key": key}
    if head != fmt.MAGIC:
        return load(io.BytesIO(data), **settings, **restrictions)
    unpickler = Unpickler(io.BytesIO(), **settings, **restrictions)
    return unpickler._load_from(MemorySource(view, len(fmt.MAGIC)), head)
