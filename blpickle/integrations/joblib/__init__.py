"""blpickle for joblib users: the ``"blosc"`` compressor and the ``"blpickle"`` store backend.

`register` registers both with joblib (importing this module registers nothing):

- the compressor ``"blosc"``: ``joblib.dump(obj, f, compress="blosc")`` or
  ``compress=("blosc", level)``, files named ``*.blosc``, ``joblib.Memory(..., compress="blosc")``;
  ``joblib.load`` recognises the files by their first byte. The stream is written and read by
  `blpickle.engine.joblib_stream.BloscFile` (format: ``docs/format.md``).
- the store backend ``"blpickle"``: ``joblib.Memory(location, backend="blpickle")`` writes cached
  results with `blpickle.dump` and reads them with `blpickle.load`
  (`blpickle.integrations.joblib.store.BlpickleStoreBackend`).

The compressor must be registered in every process that writes or loads such files. In worker
processes, pass ``compress=blpickle.integrations.joblib.BLOSC`` (a ``"blosc"`` string that
registers the compressor where it is unpickled) or call `register` in the worker's code.
"""

from __future__ import annotations

import pickletools
from collections.abc import Callable
from typing import Any

import joblib
from joblib.compressor import CompressorWrapper

from ...engine.joblib_stream import MAGIC, STREAM_OPTIONS, BloscFile
from ...errors import CorruptError
from ...options import Options, resolve_options
from .store import BlpickleStoreBackend, CorruptItemError, options_for_compress

__all__ = [
    "BLOSC",
    "EXTENSION",
    "MAGIC",
    "PREFIX",
    "BloscCompressorWrapper",
    "BloscFile",
    "BlpickleStoreBackend",
    "CorruptItemError",
    "options_for_compress",
    "register",
]

#: What joblib matches to recognise the stream: the magic's first byte, which is neither a pickle
#: opcode nor the first byte of another joblib format, so a file cut inside the magic still comes
#: to `BloscFile` and is reported as truncated.
PREFIX = MAGIC[:1]
#: ``joblib.dump(obj, "name.blosc")`` compresses with ``"blosc"``.
EXTENSION = ".blosc"
NAME = "blosc"
BACKEND_NAME = "blpickle"
#: The first byte of a pickle is one of these.
_PICKLE_OPCODES = frozenset(ord(op.code) for op in pickletools.opcodes)


class BloscCompressorWrapper(CompressorWrapper):
    """The joblib compressor: `BloscFile` streams with the given options.

    Register another name for other defaults, with its own extension (the prefix can stay:
    any ``"blosc"`` wrapper reads every stream):

    ```python
    fast = BloscCompressorWrapper("fast", extension=".blz4")
    joblib.register_compressor("blosc-lz4", fast)
    ```
    """

    def __init__(
        self,
        options: Options | str | None = None,
        *,
        prefix: bytes = PREFIX,
        extension: str = EXTENSION,
        try_bitshuffle: bool = True,
    ) -> None:
        super().__init__(obj=BloscFile, prefix=prefix, extension=extension)
        self.options = STREAM_OPTIONS if options is None else resolve_options(options)
        self.try_bitshuffle = try_bitshuffle

    def compressor_file(self, fileobj: Any, compresslevel: int | None = None) -> BloscFile:
        return BloscFile(fileobj, "wb", compresslevel, options=self.options, try_bitshuffle=self.try_bitshuffle)

    def decompressor_file(self, fileobj: Any) -> BloscFile:
        return _PickleStream(fileobj, "rb", options=self.options)


class _PickleStream(BloscFile):
    """A stream read for joblib, which always starts it with a pickle: one that does not is
    refused with a CorruptError (joblib's unpickler would raise a bare ``KeyError``)."""

    def readinto(self, buffer: Any) -> int:
        first = self.tell() == 0
        count = super().readinto(buffer)
        if first and count and memoryview(buffer).cast("B")[0] not in _PICKLE_OPCODES:
            found = memoryview(buffer).cast("B")[0]
            raise CorruptError(
                f"the joblib 'blosc' stream does not hold a pickle: it decompresses to byte {found:#04x} "
                "first, which is no pickle opcode"
            )
        return count


class _RegisteringName(str):
    """A compressor name that registers blpickle with joblib in the process that unpickles it."""

    __slots__ = ()

    def __reduce__(self) -> tuple[Callable[[str], str], tuple[str]]:
        return _registered_name, (str(self),)


def _registered_name(name: str) -> str:
    register()
    return _RegisteringName(name)


BLOSC = _RegisteringName(NAME)
"""``"blosc"``, and it registers the compressor in worker processes that unpickle it:
``Memory(location, compress=BLOSC)`` works in ``joblib.Parallel`` workers."""


def register() -> None:
    """Register the ``"blosc"`` compressor and the ``"blpickle"`` store backend with joblib.

    Idempotent; another compressor or store backend registered under these names is replaced.
    """
    joblib.register_compressor(NAME, BloscCompressorWrapper(), force=True)
    joblib.register_store_backend(BACKEND_NAME, BlpickleStoreBackend)
