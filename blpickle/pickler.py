"""The drop-in Pickler and dump/dumps (loading: `blpickle.unpickler`).

Pickling runs the C pickler at protocol 5 into memory, taking every large contiguous buffer
out of band (and compressing a big pickle stream as it grows), then writes one record
(`blpickle.format`): a compact one for a small pickle with nothing out of band, else a full
one with the buffers as chunked, multithreaded Blosc2 streams (`blpickle.engine.writer`).
"""

from __future__ import annotations

import copyreg
import io
import os
import pickle
import threading
from collections.abc import Callable
from contextlib import ExitStack
from pickle import PickleBuffer
from typing import Any, BinaryIO, cast

import cloudpickle
import numpy as np

from . import format as fmt
from .arrays import pickle_keeps_dtype, reduce_in_band, reduce_ndarray, reduced_from_buffer
from .engine.aliases import Aliases
from .engine.buffers import Payload
from .engine.graph import GraphStream
from .engine.names import array_names
from .engine.policy import fits_compact, stays_raw
from .engine.writer import CountingWriter, Pickled, write_pickled
from .errors import OptionsError
from .io import remote
from .io.files import atomic_write
from .io.remote import is_url
from .options import PRESETS, Options, PicklerKind, check_key, resolve_options
from .tensor_reducers import TensorReducer

__all__ = [
    "DEFAULT_PROTOCOL",
    "HIGHEST_PROTOCOL",
    "CloudPickler",
    "Pickler",
    "dump",
    "dumps",
]

HIGHEST_PROTOCOL = pickle.HIGHEST_PROTOCOL
DEFAULT_PROTOCOL = 5
"""blpickle pickles at protocol 5 unless told otherwise: it is the one with out-of-band buffers."""

BufferCallback = Callable[[PickleBuffer], Any]
#: Buffers smaller than this stay in the pickle stream (compressed with it): a stream of its
#: own costs more (header entry, Blosc2 call, checksum) than copying them. Uncompressed
#: records (codec None) keep every buffer out of band, so that all can be memory-mapped.
INBAND_LIMIT = 64 << 10


class _OutOfBand:
    """The buffers of one pickle stream: numpy arrays reduced to out-of-band placeholders or
    copied in band, what the pickler's ``buffer_callback`` receives, and the large payloads
    its `GraphStream` splices out. The pickler gives its ``reducer_override``, ``buffer_callback``
    and its graph's splices to the methods of this object, which never refers back to the
    pickler: a pickler and what it dumped are freed as soon as they are dropped, with no
    reference cycle left for the garbage collector.

    What it keeps is a record's: arrays load as pickle gives them back (read-only ones stay
    read-only, views of an array reduced before stay views of it), strided views are read a
    chunk at a time, and each `Payload` keeps its array's dtype, shape, path and tensor type
    for the header. (A message to another process collects its buffers with the transport's
    ``_MessageBuffers``, which keeps none of these.)"""

    def __init__(self, protocol: int, user_callback: BufferCallback | None, options: Options) -> None:
        self.streams: list[tuple[Payload, int | None]] = []  # (payload, splice offset), pickle order
        self._protocol = protocol
        self._user_callback = user_callback
        self._options = options
        self._codec = options.codec
        # small arrays are copied in band (and compressed with the pickle stream)
        self._copy_small_arrays = protocol >= 5 and user_callback is None and options.codec is not None
        # arrays viewing the memory of one reduced before them are reduced to views of it
        self._aliases = Aliases() if protocol >= 5 and user_callback is None else None
        #: torch storages and jax arrays, reduced to numpy arrays (`blpickle.tensor_reducers`)
        self.tensors = TensorReducer()
        self.reset()

    def reset(self) -> None:
        """Forget the buffers of the last pickle stream."""
        #: whether the pickle stream met an array, a buffer or a payload to splice since the
        #: last reset
        self.met = False
        #: whether a small contiguous array may be left to numpy's own reduction, its buffer
        #: kept in band by `take_buffer` (`_RecordPickler.reducer_override`): the arrays are
        #: copied in band and none has been reduced out of band, whose views they might be
        self.numpy_small = self._copy_small_arrays
        self.streams.clear()
        self.external: list[int] = []  # slots of the buffers given to the caller's callback
        self._placeholders: dict[int, tuple[PickleBuffer, np.ndarray, np.ndarray]] = {}
        #: the buffers of arrays kept in band by `_raw_in_band`, until `take_buffer` meets them
        self._in_band: dict[int, PickleBuffer] = {}
        #: id of each array taken out of band, as the pickler met it -> its position in
        #: `streams`; the arrays are kept alive until the reset, so that no id is reused
        self._arrays: dict[int, int] = {}
        self._kept: list[np.ndarray] = []
        self._slots = 0
        self.tensors.clear()
        if self._aliases is not None:
            self._aliases.clear()

    def used(self) -> bool:
        """Whether the last pickle stream met any buffer: out of band, the caller's, or a
        placeholder (then a reset is needed)."""
        return bool(self._slots or self._placeholders or self.streams or self._in_band)

    def forget(self) -> None:
        """Reset if the last pickle stream met any buffer or array."""
        if self.used() or self._aliases or self.tensors or self.numpy_small != self._copy_small_arrays:
            self.reset()

    def release_if_unused(self) -> bool:
        """If the last pickle stream met no buffer, forget the arrays it remembered as
        possible view bases (kept in band) and return True (its record can be compact); else
        return False, keeping everything for the full record."""
        if self._slots or self._placeholders or self.streams:
            return False
        if self._aliases is not None:
            self._aliases.clear()
        self.tensors.clear()
        self.met = False
        self.numpy_small = self._copy_small_arrays
        return True

    def reduce_ndarray(self, array: np.ndarray, take_raw: Callable[[int, Callable[[], bool]], bool]) -> Any:
        """Return the reduce value of a numpy array: a placeholder buffer taken out of band by
        `take_buffer`, a view of an array reduced before whose memory holds it
        (`blpickle.engine.aliases`), or numpy's own reduction: with the data copied in band
        for arrays under `INBAND_LIMIT` that view no array out of band and for those
        `_raw_in_band` keeps there (``take_raw``: the pickle stream's `GraphStream.take_raw`), as
        numpy makes it for protocols under 5, object arrays, dtypes numpy gives back changed
        and a caller's ``buffer_callback``. The array loads as ``pickle`` gives it back,
        contiguous ones read-only if they were, views of an array over `INBAND_LIMIT` reduced
        before it (out of band or kept in band raw) as views."""
        self.met = True
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
        if self._copy_small_arrays and array.nbytes < INBAND_LIMIT:
            # as pickle stores it; only arrays over INBAND_LIMIT are remembered as views' bases
            view = self._aliases.place(met, array, False) if self._aliases and array.size else None
            return reduce_in_band(array) if view is None else view
        self.numpy_small = False  # from now on, a small array may view this one
        if self._aliases is not None and array.size:
            view = self._aliases.place(met, array, flags.c_contiguous or flags.f_contiguous)
            if view is not None:
                return view
        if self._copy_small_arrays and self._raw_in_band(array, met, take_raw):
            # written from its memory, as numpy reduces it; a base for the views after it
            buffer = PickleBuffer(cast(Any, array))
            self._in_band[id(buffer)] = buffer
            return reduce_in_band(array, buffer)
        # numpy copies strided views into new (writable) arrays; others keep their flag
        readonly = not flags.writeable and (flags.c_contiguous or flags.f_contiguous)
        if self._user_callback is not None and (
            flags.c_contiguous or flags.f_contiguous or array.nbytes < INBAND_LIMIT
        ):  # the caller's callback gets the buffers pickle would give it
            return array.__reduce_ex__(self._protocol)
        placeholder = PickleBuffer(b"" if readonly else bytearray())  # pickle marks a read-only one
        self._placeholders[id(placeholder)] = (placeholder, array, met)
        return reduce_ndarray(array, placeholder)

    def _raw_in_band(self, array: np.ndarray, met: Any, take_raw: Callable[[int, Callable[[], bool]], bool]) -> bool:
        """Whether a contiguous ``array`` over `INBAND_LIMIT` is kept in band all the same,
        as part of a pickle stream that may make a compact record: nothing is out of band
        yet, it is not a tensor's data (``met``: which keeps its name), numpy reduces its
        dtype to `_frombuffer`, the stream has room for it (``take_raw``) and its codec would
        store it raw (`blpickle.engine.policy.stays_raw`: compressing it would not pay)."""
        flags = array.flags
        if self.streams or self._slots or not (flags.c_contiguous or flags.f_contiguous):
            return False
        if id(met) in self.tensors.stand_ins or not reduced_from_buffer(array.dtype):
            return False
        payload = Payload.from_array(array)
        return take_raw(
            payload.nbytes, lambda: stays_raw(self._options, payload.nbytes, payload.itemsize, payload.sample)
        )

    def splice(self, data: Any, offset: int) -> None:
        """Keep a large payload the pickler wrote at ``offset`` of the pickle stream, to be
        stored as a stream of its own."""
        self.met = True
        self.streams.append((Payload(memoryview(data).cast("B"), 1), offset))

    def name_arrays(self, obj: Any) -> None:
        """Name the payloads of the arrays taken out of band by their paths in ``obj``, the
        object just pickled (`blpickle.engine.names`)."""
        if self._arrays:
            for position, name in array_names(obj, self._arrays).items():
                self.streams[position][0].name = name

    def take_buffer(self, buffer: PickleBuffer) -> bool:
        """The C pickler's ``buffer_callback``: keep ``buffer`` out of band (False) or in the
        pickle stream (True)."""
        self.met = True
        if self._in_band and self._in_band.pop(id(buffer), None) is not None:
            return True
        taken = self._placeholders.pop(id(buffer), None) if self._placeholders else None
        if taken is not None:
            payload = Payload.from_array(taken[1])
            named, payload.tensor = self.tensors.stand_ins.get(id(taken[2]), (taken[2], None))
            if named is not None:
                self._arrays[id(named)] = len(self.streams)
                self._kept.append(named)
            self.streams.append((payload, None))
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


class _RecordPickler(pickle.Pickler):
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
        self._key = check_key(key)
        self._protocol = DEFAULT_PROTOCOL if protocol is None else protocol
        if self._protocol < 0:
            self._protocol = HIGHEST_PROTOCOL
        self._out_of_band = _OutOfBand(self._protocol, buffer_callback, self.options)
        splice = self._out_of_band.splice if self._protocol >= 4 else None
        self._graph = GraphStream(splice, self.options)
        callback = self._out_of_band.take_buffer if self._protocol >= 5 else buffer_callback
        self._init_pickler(self._graph, self._protocol, fix_imports, callback)
        self._file = file
        self._tensor_reducers = self._out_of_band.tensors.reducers()

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

    def _init_pickler(self, graph: GraphStream, protocol: int, fix_imports: bool, callback: Any) -> None:
        pickle.Pickler.__init__(self, graph, protocol, fix_imports=fix_imports, buffer_callback=callback)

    def _prepare(self) -> None:
        """Before a dump: take the tensor reducers of the libraries imported by now, and leave
        small arrays to numpy only if no dispatch table (the pickler's or copyreg's) has a
        reducer for numpy arrays, which `reducer_override` overrides for every array."""
        self._tensor_reducers = self._out_of_band.tensors.reducers()
        if np.ndarray in (getattr(self, "dispatch_table", None) or copyreg.dispatch_table):
            self._out_of_band.numpy_small = False

    def reducer_override(self, obj: Any) -> Any:
        """Reduce numpy arrays for blpickle (see `_OutOfBand.reduce_ndarray`), torch tensors
        and jax arrays too once their library is imported (`blpickle.tensor_reducers`);
        return ``NotImplemented`` for anything else, which the pickler then saves as usual,
        and for the small contiguous arrays numpy's own reduction stores as blpickle would
        (`_OutOfBand.numpy_small`): no Python code runs for them but `take_buffer`."""
        kind = type(obj)
        if kind is np.ndarray and obj.nbytes < INBAND_LIMIT and self._out_of_band.numpy_small:
            flags = obj.flags
            if flags.c_contiguous or flags.f_contiguous:
                return NotImplemented  # what `_OutOfBand.reduce_ndarray` would give, at less cost
        if kind in _ARRAY_TYPES:
            return self._out_of_band.reduce_ndarray(obj, self._graph.take_raw)
        reduce = self._tensor_reducers.get(kind)
        return NotImplemented if reduce is None else reduce(obj)

    def dump(self, obj: Any) -> None:
        """Write ``obj`` as one blpickle record to the file.

        Raises:
            pickle.PicklingError: when ``obj`` cannot be pickled.
        """
        if not hasattr(self, "_graph"):
            raise pickle.PicklingError(f"Pickler.__init__() was not called by {type(self).__name__}.__init__()")
        self._prepare()
        try:
            super().dump(obj)  # pickle.Pickler's, or cloudpickle's for CloudPickler (the MRO)
            self._out_of_band.name_arrays(obj)
            tail = self._compact_pickle()
            if tail is not None:
                start, end = fmt.compact_ends(tail)
                out = CountingWriter(self._file)
                for part in (start, tail, end):  # no copy of the pickle
                    out.write(part)
            else:
                self._write_full(self._file)
        finally:
            self._reset()

    def _compact_pickle(self) -> bytearray | None:
        """Return the last pickling, if `blpickle.engine.policy.fits_compact` says it makes a
        compact record."""
        graph = self._graph
        tail = graph.whole()
        if tail is None or self._out_of_band.used() or not fits_compact(len(tail), graph.raw_nbytes, 0, (), self._key):
            return None
        return tail

    def _write_full(self, file: BinaryIO) -> None:
        """Write the last pickling as a full record (`blpickle.engine.writer.write_pickled`)."""
        out_of_band = self._out_of_band
        pickled = Pickled(
            self._graph.finish(),
            tuple(out_of_band.streams),
            tuple(out_of_band.external),
            self._protocol,
        )
        write_pickled(file, pickled, self.options, self._key)

    def _full_record_bytes(self, obj: Any) -> bytes:
        """Return the last pickling of ``obj`` as a full record, and reset."""
        self._out_of_band.name_arrays(obj)
        out = io.BytesIO()
        self._write_full(out)
        self._reset()
        return out.getvalue()

    def _reset(self) -> None:
        """Keep nothing of the last object: the memo and the buffers would hold it alive."""
        self.clear_memo()
        self._graph.reset()
        self._out_of_band.forget()


class Pickler(_RecordPickler):
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

    def _init_pickler(self, graph: GraphStream, protocol: int, fix_imports: bool, callback: Any) -> None:
        cloudpickle.Pickler.__init__(self, graph, protocol, buffer_callback=callback)

    def reducer_override(self, obj: Any) -> Any:
        """Reduce numpy arrays as `Pickler` does, the rest as cloudpickle does."""
        reduced = _RecordPickler.reducer_override(self, obj)
        return cloudpickle.Pickler.reducer_override(self, obj) if reduced is NotImplemented else reduced


_PICKLER_NAMES = {"pickle": "Pickler", "cloudpickle": "CloudPickler"}
_PICKLERS: dict[str, type[_RecordPickler]] = {"pickle": Pickler, "cloudpickle": CloudPickler}


def dump(
    obj: Any,
    file: BinaryIO | str | os.PathLike[str],
    protocol: int | None = None,
    *,
    fix_imports: bool = True,
    buffer_callback: BufferCallback | None = None,
    key: bytes | None = None,
    durable: bool = False,
    **options: Any,
) -> None:
    """Write ``obj`` to ``file`` as a blpickle record.

    Writing to a path is atomic: a regular file is replaced only once the record is complete
    (a killed process leaves the old file or the new one); FIFOs and devices are written in
    place. Like ``pickle``, nothing is flushed to the device unless ``durable`` is true.

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
        durable: for a path, flush the file and its directory to the device (``fsync``)
            around the rename, so that the new record survives a power loss or an OS crash
            once ``dump`` returns; ignored for file objects and URLs.
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
        elif isinstance(file, (str, os.PathLike)):
            file = stack.enter_context(atomic_write(file, durable=durable))
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

    Takes the arguments of `dump` but ``file`` (and ``durable``, which concerns paths).

    Example:
        ```python
        data = blpickle.dumps(np.arange(10**6), codec="zstd")
        ```

    Raises:
        blpickle.OptionsError: for an invalid option.
        pickle.PicklingError: when ``obj`` cannot be pickled.
    """
    if protocol is None and buffer_callback is None and key is None and fix_imports and not options:
        # The default: each thread keeps an idle pickler from call to call, so that a compact
        # record costs a pickling, a checksum and a few attribute reads. A pickler is taken
        # while in use (a ``dumps`` nested in a reducer makes its own); one that failed is
        # not kept.
        idle = _IDLE.__dict__
        pickler = idle.pop("pickler", None)
        if pickler is None or pickler.options is not PRESETS["default"]:
            pickler = Pickler(io.BytesIO())
        graph = pickler._graph
        pickler._prepare()
        try:
            _C_DUMP(pickler, obj)
            small = graph.small()
            out_of_band = pickler._out_of_band
            if small is not None and (not out_of_band.met or out_of_band.release_if_unused()):
                record = fmt.encode_compact(small)
                pickler.clear_memo()
                graph.reset()  # encode_compact copied the stream
            else:
                record = pickler._full_record_bytes(obj)
        except BaseException:
            pickler._reset()
            raise
        idle["pickler"] = pickler
        return record
    out = io.BytesIO()
    dump(obj, out, protocol, fix_imports=fix_imports, buffer_callback=buffer_callback, key=key, **options)
    return out.getvalue()


#: Each thread's idle `Pickler` with the default options, for `dumps` without arguments.
_IDLE = threading.local()
_C_DUMP = pickle.Pickler.dump
