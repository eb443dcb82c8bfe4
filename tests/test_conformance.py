"""CPython's own pickle conformance suite, run against blpickle.

``test.pickletester`` is the suite CPython uses for its pickle implementations. blpickle runs
``AbstractPickleTests``, ``AbstractUnpickleTests`` and ``AbstractPickleModuleTests`` through
``dumps/loads/dump/load`` and through ``Pickler``/``Unpickler``, and the unpickling tests in
safe mode too (``SafeFunctionsTests``, with ``SAFE_MODE_EXCLUDED``: the restricted interpreter,
with a policy that admits every name the suite uses as if named exactly; tests/test_safe.py
tests the policy itself). Opcode checks read the pickle
stream inside each record. The only tests left out inspect the raw output bytes, which
blpickle wraps in its own compressed record; each one is listed in ``RAW_OUTPUT_TESTS`` with
the reason.
"""

import _compat_pickle
import importlib
import io
import pickle
import pickletools
import struct
import types
import unittest
from unittest import mock

from test import pickletester

import blpickle
import blpickle.unpickler
from blpickle.engine.reader import RecordReader
from blpickle.format import MAGIC
from blpickle.io.sources import MemorySource
from blpickle.restricted.policy import Admitted, Policy
from blpickle.restricted.registry import REGISTRY

#: Tests that compare the raw output bytes with what plain pickle writes: blpickle wraps the
#: pickle stream in a compressed record, so these assertions cannot apply. Each keeps its reason.
RAW_OUTPUT_TESTS = {
    "test_float_format": "checks that the output bytes start with the protocol 0 text b'F1.'",
    "test_proto": "checks that the output bytes start with the PROTO opcode",
    "test_bytearray": "looks for the text b'bytearray' in the output bytes",
    "test_in_band_buffers": "looks for the buffer's bytes verbatim in the output bytes",
    "test_pickle_to_2x": "compares the output bytes with Python 2's pickle bytes",
    "test_optional_frames": "removes FRAME opcodes from the output bytes, then loads them",
    "test_framing_many_objects": "relates the FRAME sizes to the length of the output bytes",
    "test_compat_pickle": "looks for GLOBAL opcodes' text (b'cexceptions\\nException') verbatim in the output bytes",
}


def _pickle_stream(data):
    """Return the pickle stream inside a blpickle record, with its spliced payloads put back
    (plain pickle data is returned as is)."""
    if bytes(data[: len(MAGIC)]) != MAGIC:
        return data
    reader = RecordReader(MemorySource(data), nthreads=1)
    graph = bytes(reader.read_stream())
    pieces, last = [], 0
    for info in reader.header.streams[1:]:
        payload = bytes(reader.read_stream())
        if info.splice is not None:
            pieces += [graph[last : info.splice], payload]
            last = info.splice
    return b"".join([*pieces, graph[last:]])


# The suite reads opcodes with pickletools: let it read the pickle stream inside each record,
# so the opcodes the C pickler wrote are checked exactly as for plain pickle.
pickletester.pickletools = types.SimpleNamespace(
    genops=lambda pickle, *args: pickletools.genops(_pickle_stream(pickle), *args),
    dis=lambda pickle, *args, **kwargs: pickletools.dis(_pickle_stream(pickle), *args, **kwargs),
    optimize=pickletools.optimize,
)


#: Tests blpickle fails, each with its reason: expected failures, so a fix shows as an
#: unexpected success.
KNOWN_FAILURES = {
    "test_find_class": "Unpickler.load unpickles with a clone, so find_class called on the "
    "Unpickler afterwards does not resolve protocol 4's dotted names (Python 3.13's suite checks it)",
    "test_pickle_setstate_None": "Python 3.13's suite expects TypeError for a class whose __setstate__ "
    "is None; loading a record reports the unpickler's AttributeError as a CorruptError",
}


def _exclude(cls, names=RAW_OUTPUT_TESTS):
    for name in names:
        if hasattr(cls, name):
            setattr(cls, name, None)
    for name in KNOWN_FAILURES:
        if hasattr(cls, name):
            setattr(cls, name, unittest.expectedFailure(getattr(cls, name)))
    return cls


@_exclude
class FunctionsTests(pickletester.AbstractPickleTests, pickletester.AbstractUnpickleTests, unittest.TestCase):
    """dumps/loads; unpickling of hand-made plain pickles goes through blpickle.loads."""

    pickler = blpickle.Pickler
    unpickler = blpickle.Unpickler

    bad_stack_errors = (pickle.UnpicklingError, IndexError)
    truncated_errors = (
        pickle.UnpicklingError,
        EOFError,
        AttributeError,
        ValueError,
        struct.error,
        IndexError,
        ImportError,
    )

    def dumps(self, arg, protocol=None, **kwargs):
        return blpickle.dumps(arg, protocol, **kwargs)

    def loads(self, buf, **kwds):
        return blpickle.loads(buf, **kwds)


@_exclude
class ClassesTests(pickletester.AbstractPickleTests, unittest.TestCase):
    """Pickler/Unpickler over file objects."""

    pickler = blpickle.Pickler
    unpickler = blpickle.Unpickler

    def dumps(self, arg, proto=None, **kwargs):
        f = io.BytesIO()
        self.pickler(f, proto, **kwargs).dump(arg)
        return f.getvalue()

    def loads(self, buf, **kwds):
        return self.unpickler(io.BytesIO(buf), **kwds).load()


class ModuleTests(pickletester.AbstractPickleModuleTests, unittest.TestCase):
    dump = staticmethod(blpickle.dump)
    dumps = staticmethod(blpickle.dumps)
    load = staticmethod(blpickle.load)
    loads = staticmethod(blpickle.loads)
    Pickler = blpickle.Pickler
    Unpickler = blpickle.Unpickler


class _EveryNameExactly(Policy):
    """A policy admitting every name the suite uses as if the caller named it exactly (the
    suite checks the interpreter, not the policy: tests/test_safe.py does that)."""

    def __init__(self, allowed=()):
        super().__init__(allowed)

    def admit(self, module, name):
        if (module, name) in _compat_pickle.NAME_MAPPING:
            module, name = _compat_pickle.NAME_MAPPING[(module, name)]
        module = _compat_pickle.IMPORT_MAPPING.get(module, module)
        obj = importlib.import_module(module)
        for part in name.split("."):
            obj = getattr(obj, part)
        if isinstance(obj, type):
            self._classes[id(obj)] = obj
        vetted = REGISTRY.get(f"{module}.{name}") if obj is not getattr else None
        return Admitted(obj, "vetted" if vetted else "exact", vetted)


#: Tests that cannot pass in safe mode, each with its reason: malformed input raises
#: CorruptError (an UnpicklingError) there, never pickle's TypeError or ValueError, and opcodes
#: that Python 3 never writes are refused.
SAFE_MODE_EXCLUDED = {
    "test_bad_reduce": "expects TypeError for calling None or with None arguments",
    "test_badly_escaped_string": "expects ValueError for a badly escaped STRING",
    "test_maxint64": "expects ValueError for a malformed INT",
    "test_negative_put": "expects ValueError for a negative PUT",
    "test_builtin_functions": "names builtins.__build_class__, which safe mode refuses (a dunder name)",
    "test_compat_unpickle": "loads Python 2 instances with the OBJ opcode",
    "test_load_classic_instance": "loads Python 2 instances with the INST and OBJ opcodes",
    "test_global_ext1": "uses extension codes (EXT1)",
    "test_global_ext2": "uses extension codes (EXT2)",
    "test_global_ext4": "uses extension codes (EXT4)",
    "test_bad_ext_code": "expects pickle's errors for unregistered extension codes, which safe mode refuses",
    "test_bad_ext_inverted_registry": "uses extension codes",
    "test_load_global": "expects the import errors of modules that do not exist; safe mode refuses "
    "names outside the allowed packages before importing anything",
    "test_load_stack_global": "as test_load_global",
    "test_py_methods": "calls methods that getattr returned: safe mode calls only the globals it imported",
    "test_c_methods": "as test_py_methods",
    "test_oob_buffers": "calls ZeroCopyBytes._reconstruct, which getattr returned (as test_py_methods)",
    "test_oob_buffers_writable_to_readonly": "as test_oob_buffers",
    "test_bytes_memoization": "as test_oob_buffers (Python 3.13)",
    "test_bytearray_memoization": "as test_oob_buffers (Python 3.13)",
    "test_complex_newobj_ex": "calls a functools.partial that a call returned (as test_py_methods)",
}


class SafeFunctionsTests(FunctionsTests):
    """dumps/loads with loads in safe mode (the restricted unpickler), the suite's packages allowed."""

    def loads(self, buf, **kwds):
        with mock.patch.object(blpickle.unpickler, "Policy", _EveryNameExactly):
            return blpickle.loads(buf, safe=True, **kwds)


_exclude(SafeFunctionsTests, SAFE_MODE_EXCLUDED)
