"""The ``joblib.Memory`` store backend ``"blpickle"``: cached results written with `blpickle.dump`."""

from __future__ import annotations

import contextlib
import functools
import mmap
import os
import threading
import time
import uuid
import warnings
from collections.abc import Iterator
from pickle import PicklingError
from typing import Any, BinaryIO, Literal

import numpy as np
from joblib.logger import format_time

from ... import format as fmt
from ...arrays import rebuild_ndarray
from ...errors import BlpickleWarning, LoadError, OptionsError
from ...options import Options, resolve_options
from ...pickler import dump as blpickle_dump
from ...unpickler import Unpickler
from ...unpickler import load as blpickle_load
from ...unpickler import loads as blpickle_loads
from .._host_internals import joblib_store_classes

__all__ = ["BlpickleStoreBackend", "CorruptItemError", "options_for_compress", "warning_on_failure"]

FileSystemStoreBackend, CacheWarning = joblib_store_classes()

#: joblib compressor names -> blpickle codec and level when ``compress`` names no level.
_CODECS: dict[str, tuple[Any, int]] = {
    "blosc": ("auto", 1),
    "zlib": ("zlib", 3),
    "gzip": ("zlib", 3),
    "lz4": ("lz4", 1),
    "bz2": ("zstd", 5),
    "lzma": ("zstd", 5),
    "xz": ("zstd", 5),
}
#: ``backend_options`` keys that are blpickle options rather than joblib's.
_OPTION_NAMES = {"codec", "clevel", "shuffle", "bytedelta", "chunk_size", "nthreads", "pickler", "preset"}
_RESULT = "output.pkl"
#: Results up to this size are read whole and loaded from memory (fewer calls than reading a file).
_WHOLE_READ_SIZE = 1 << 20


@contextlib.contextmanager
def warning_on_failure() -> Iterator[None]:
    """Turn a failure to cache a result into the warning joblib's own store gives (same
    category and message), so that the call's result is returned and recomputed next time."""
    try:
        yield
    except (PicklingError, TypeError, AttributeError) as exc:  # what pickle raises
        warnings.warn(
            f"Unable to cache to disk: failed to pickle output. Exception: {exc}.", FutureWarning, stacklevel=4
        )
    except Exception as exc:
        warnings.warn(f"Unable to cache to disk. Exception: {exc}.", CacheWarning, stacklevel=4)


def options_for_compress(compress: Any) -> Options:
    """Return the blpickle options that match a joblib ``compress`` value.

    ``False``/``0``/``None`` store buffers raw (mappable with ``mmap_mode``), ``True`` is
    blpickle's default (codec "auto", level 1, shuffle), an integer 1-9 is that level of the default
    codec; a name or a ``(name, level)`` pair picks the Blosc2 codec closest to that joblib
    compressor (``"zlib"``/``"gzip"`` -> zlib, ``"lz4"`` -> lz4, ``"bz2"``/``"lzma"``/``"xz"`` ->
    zstd, ``"blosc"`` -> the default), level 0 meaning raw. An `Options` or a preset name
    of `blpickle.PRESETS` is used as is.

    Raises:
        OptionsError: for a value joblib would not accept either.
    """
    if isinstance(compress, Options):
        return compress
    if compress is None or compress is False or (isinstance(compress, int) and compress == 0):
        return resolve_options("raw")
    if compress is True:
        return Options()
    if isinstance(compress, int):
        return Options(clevel=compress)
    if isinstance(compress, str):
        if compress not in _CODECS:
            return resolve_options(compress)  # a preset name, or OptionsError
        compress = (compress, None)
    if not isinstance(compress, tuple) or len(compress) != 2 or compress[0] not in _CODECS:
        raise OptionsError(
            f"compress must be a bool, a level 0-9, a compressor name or a (name, level) pair, not {compress!r}"
        )
    name, level = compress
    if level == 0:
        return resolve_options("raw")
    codec, default_level = _CODECS[name]
    return Options(codec=codec, clevel=default_level if level is None else level)


class BlpickleStoreBackend(FileSystemStoreBackend):  # type: ignore[misc,valid-type]  # a class from the shim
    """A ``joblib.Memory`` store that writes results with `blpickle.dump`.

    Selected with ``joblib.Memory(location, backend="blpickle")``; everything else is
    joblib's file-system store (same directory layout, ``output.pkl`` per result, so
    ``clear``, ``reduce_size`` and ``call_and_shelve`` work unchanged). ``compress`` maps to
    blpickle options with `options_for_compress`; ``backend_options`` may also hold
    blpickle options (``codec``, ``clevel``, ``preset``, ``pickler``, ...) that override it.
    Results are written to a temporary file renamed over ``output.pkl``, so concurrent
    writers of one result leave one complete file (as joblib's own store, without syncing to
    the device: a result damaged by a crash fails its checksum and is recomputed). Results
    written by joblib's own backend in the same directory are still read.
    """

    options: Options

    def configure(self, location: str, verbose: int = 1, backend_options: dict[str, Any] | None = None) -> None:
        joblib_options = dict(backend_options or {})
        ours = {name: joblib_options.pop(name) for name in list(joblib_options) if name in _OPTION_NAMES}
        super().configure(location, verbose=verbose, backend_options=joblib_options)
        options = options_for_compress(self.compress)
        if "preset" in ours:
            options = resolve_options(ours.pop("preset"))
        self.options = options.replace(**ours) if ours else options
        if self.mmap_mode is not None and self.options.codec is not None and not self.compress:
            warnings.warn(
                f"blpickle store: buffers compressed with {self.options.codec} cannot be "
                "memory-mapped; mmap_mode applies to raw buffers only (codec=None)",
                BlpickleWarning,
                stacklevel=2,
            )

    def dump_item(self, call_id: list[str], item: Any, verbose: int = 1) -> None:
        """Write ``item`` to ``<location>/<call_id...>/output.pkl`` with `blpickle.dump`."""
        with warning_on_failure():
            item_path = os.path.join(self.location, *call_id)
            if not self._item_exists(item_path):
                self.create_location(item_path)
            if verbose > 10:
                print(f"Persisting in {item_path}")
            _write_atomically(item, os.path.join(item_path, _RESULT), self.options)

    def load_item(
        self,
        call_id: list[str],
        verbose: int = 1,
        timestamp: float | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> Any:
        """Read a result with `blpickle.load` (memory-mapping raw buffers with ``mmap_mode``).

        Raises:
            KeyError: when the result is not in the store (joblib then computes it again).
            CorruptItemError: when the stored result is damaged or truncated.
        """
        full_path = self._join(self.location, *call_id)
        if verbose > 1:
            _print_loading(full_path, call_id, verbose, timestamp, metadata)
        filename = self._join(full_path, _RESULT)
        try:
            return self._load_result(filename, call_id)
        except FileNotFoundError:
            raise KeyError(f"Non-existing item (may have been cleared).\nFile {filename} does not exist") from None
        except LoadError as exc:
            raise CorruptItemError(f"the cached result {filename} is damaged: {exc}") from exc

    def _join(self, *parts: str) -> str:
        """Return the path of a location's item (`os.path.join`: a folder on disk)."""
        return os.path.join(*parts)

    def _load_result(self, filename: str, call_id: list[str]) -> Any:
        """Read the result file ``filename``: a blpickle record (its raw buffers mapped with
        ``mmap_mode``), or a result joblib's own store wrote there."""
        mmap_mode = "r+" if self.mmap_mode == "w+" else self.mmap_mode  # as joblib does
        with open(filename, "r+b" if mmap_mode == "r+" else "rb") as file:
            whole = mmap_mode is None and os.fstat(file.fileno()).st_size <= _WHOLE_READ_SIZE
            head = file.read() if whole else file.read(len(fmt.MAGIC))
            if not head.startswith(fmt.MAGIC):  # written by joblib's own store backend
                return super().load_item(call_id, verbose=0)
            file.seek(0)
            if whole:
                return blpickle_loads(head, nthreads=self.options.nthreads)
            if mmap_mode is None:
                return blpickle_load(file, nthreads=self.options.nthreads)
            return _MemmapUnpickler(file, mmap_mode=mmap_mode, nthreads=self.options.nthreads).load()


class CorruptItemError(LoadError, ValueError):
    """A cached result is damaged or truncated (the original error is its ``__cause__``).

    Also a ``ValueError``, so ``MemorizedResult.get()`` turns it into joblib's ``KeyError``
    ("folder is corrupted"), as for damaged files of joblib's own store; a cached call
    recomputes the result.
    """


def _write_atomically(item: Any, filename: str, options: Options) -> None:
    """Write ``item`` to a temporary file next to ``filename``, then rename it over ``filename``."""
    temporary = f"{filename}.{uuid.uuid4().hex}-{os.getpid()}-{threading.get_ident()}"
    try:
        with open(temporary, "wb") as file:
            blpickle_dump(item, file, preset=options)
        os.replace(temporary, filename)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise


class _MemmapUnpickler(Unpickler):
    """Returns the arrays it maps as ``numpy.memmap`` instances (with ``mode``, ``filename``
    and ``offset``), as joblib's own store does: each views the one map of the file that
    the load makes, and so keeps viewing the file being loaded even if a writer has since
    renamed another over its name."""

    def __init__(self, file: BinaryIO, *, mmap_mode: str, nthreads: int | None) -> None:
        super().__init__(file, mmap_mode=mmap_mode, nthreads=nthreads)
        self._rebuild = functools.partial(_rebuild_memmap, mmap_mode, os.path.abspath(file.name))

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("blpickle.arrays", "rebuild_ndarray"):
            return self._rebuild
        return super().find_class(module, name)


def _rebuild_memmap(
    mode: str, filename: str, buffer: Any, dtype: np.dtype, shape: tuple[int, ...], order: str
) -> np.ndarray:
    """Rebuild an array as a ``numpy.memmap`` over the map its buffer views (a raw buffer),
    else (a compressed buffer, or an empty array) as the plain array."""
    array = rebuild_ndarray(buffer, dtype, shape, order)  # validates the arguments
    mapping = _mapping_of(array)
    if mapping is None or not array.size:
        return array
    offset = array.ctypes.data - np.frombuffer(mapping, dtype=np.uint8).ctypes.data
    layout: Literal["C", "F"] = "F" if order == "F" else "C"  # rebuild_ndarray checked it
    # numpy.memmap.__new__ sets these three on a map it opens itself; numpy's stubs mark
    # them final for everyone else, hence ``Any``.
    mapped: Any = np.ndarray.__new__(np.memmap, shape, dtype, buffer=mapping, offset=offset, order=layout)
    mapped.filename, mapped.offset, mapped.mode = filename, offset, mode
    return mapped


def _mapping_of(array: np.ndarray) -> mmap.mmap | None:
    """Return the map of the whole file that ``array``'s memory belongs to, if any."""
    base: Any = array
    while base is not None:
        if isinstance(base, mmap.mmap):
            return base
        base = base.obj if isinstance(base, memoryview) else getattr(base, "base", None)
    return None


def _print_loading(
    full_path: str,
    call_id: list[str],
    verbose: int,
    timestamp: float | None,
    metadata: dict[str, Any] | None,
) -> None:
    """Print what joblib's own store prints when it loads a result."""
    ts_string = f"{format_time(time.time() - timestamp): <16}" if timestamp is not None else ""
    signature = os.path.basename(call_id[0])
    if metadata is not None and "input_args" in metadata:
        signature += "({})".format(", ".join(f"{k}={v}" for k, v in metadata["input_args"].items()))
    message = f"[Memory]{ts_string}: Loading {signature}"
    print(f"{message}..." if verbose < 10 else f"{message} from {full_path}")
