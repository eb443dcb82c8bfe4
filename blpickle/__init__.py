"""blpickle: pickle for objects with big numeric buffers.

A drop-in for ``pickle.dump/dumps/load/loads`` that takes every contiguous buffer out of band
and writes it as a chunked, multithreaded Blosc2 stream in one self-describing file.

``import blpickle as pickle`` keeps code written for the ``pickle`` module working: the
exceptions and ``PickleBuffer`` are the ``pickle`` module's own objects.
"""

from pickle import PickleBuffer, PickleError, PicklingError, UnpicklingError

from .errors import (
    BadMagicError,
    BlpickleError,
    BlpickleWarning,
    ChecksumError,
    CorruptError,
    DumpError,
    LimitError,
    LoadError,
    OptionsError,
    SignatureError,
    TruncatedError,
    UnsafeLoadError,
    UnsupportedVersionError,
)
from .info import BufferInfo, RecordInfo, inspect
from .lazy import LazyArray
from .options import PRESETS, Options
from .pickler import DEFAULT_PROTOCOL, HIGHEST_PROTOCOL, CloudPickler, Pickler, dump, dumps
from .record import ArrayInfo, Record, open
from .safe import untrusted_globals
from .unpickler import Unpickler, load, loads

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_PROTOCOL",
    "HIGHEST_PROTOCOL",
    "PRESETS",
    "ArrayInfo",
    "BadMagicError",
    "BlpickleError",
    "BlpickleWarning",
    "BufferInfo",
    "ChecksumError",
    "CloudPickler",
    "CorruptError",
    "DumpError",
    "LazyArray",
    "LimitError",
    "LoadError",
    "Options",
    "OptionsError",
    "PickleBuffer",
    "PickleError",
    "Pickler",
    "PicklingError",
    "Record",
    "RecordInfo",
    "SignatureError",
    "TruncatedError",
    "Unpickler",
    "UnpicklingError",
    "UnsafeLoadError",
    "UnsupportedVersionError",
    "__version__",
    "dump",
    "dumps",
    "inspect",
    "load",
    "loads",
    "open",
    "untrusted_globals",
]
