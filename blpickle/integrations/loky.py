"""blpickle as loky's pickler, for ``joblib.Parallel`` and loky executors.

One line, before the first ``Parallel`` call:

```python
# or, in the environment: LOKY_PICKLER=blpickle.integrations.loky
blpickle.integrations.loky.enable()
```

``enable`` calls ``set_loky_pickler("blpickle.integrations.loky")`` of the loky that joblib
vendors (and of a standalone ``loky`` if installed); loky hands the name to every worker with
each task, so workers pickle their results with blpickle too.

What changes. loky writes each message as one pickle that the other side reads with plain
``pickle.loads``; this module's `Pickler` writes such a pickle too. An object with no big
buffer is pickled by the C pickler with loky's reducers (cloudpickle where it cannot, and for
what names ``__main__``, as loky's default does): that pickle is the message. Otherwise the
message is an envelope: inside it the object is a protocol-5 pickle whose big buffers follow
on their own, each one either raw (written from the array's memory, received as a writable
``bytearray`` the array is rebuilt around: no further copy) or as Blosc2 chunks when a sample
shows that compression pays. joblib's default pickles a result array twice (a nested
``pickle.dumps`` inside loky's cloudpickle) and receives it through two more copies.

What stays. joblib's auto-memmapping: arrays over ``max_nbytes`` (default 1 MB) sent to
workers are still dumped once to a shared temporary file and memory-mapped by the workers (so
several tasks share one copy), and arrays backed by a memmap still travel as a reference. Only
the arrays joblib would have pickled (below the threshold, with ``max_nbytes=None``, and
every result sent back) go through blpickle. Custom reducers registered with loky or passed
as ``job_reducers``/``result_reducers`` are kept.
"""

from __future__ import annotations

import copyreg
import json
import os
import pickle
import struct
import sys
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ..errors import CorruptError
from . import _host_internals, transport
from .transport import WireOptions, wire_options

__all__ = ["ENV_OPTIONS", "NAME", "Pickler", "configure", "disable", "enable"]

#: The name to give ``set_loky_pickler`` or the ``LOKY_PICKLER`` environment variable.
NAME = "blpickle.integrations.loky"
#: Environment variable holding the options (JSON) so that worker processes use them too.
ENV_OPTIONS = "BLPICKLE_LOKY_OPTIONS"

_HEAD = struct.Struct("<BI")  # version, number of buffers
_DESC = struct.Struct("<QQ")  # nbytes, chunk size (0: raw)
_VERSION = 1


def _options_from_env() -> WireOptions:
    text = os.environ.get(ENV_OPTIONS)
    if not text:
        return WireOptions()
    return wire_options(**json.loads(text))


_WIRE = _options_from_env()


def configure(preset: Any = None, **options: Any) -> WireOptions:
    """Set the options this process (and worker processes started after this call) use.

    Same arguments as `blpickle.integrations.multiprocessing.get_context`
    (``codec=``, ``clevel=``, ..., ``compress=``, ``min_size=``, ``min_ratio=``).
    """
    global _WIRE
    wire = wire_options(preset, **options)
    _WIRE = wire
    settings = {
        **wire.options.to_dict(),
        "compress": wire.compress,
        "min_size": wire.min_size,
        "min_ratio": wire.min_ratio,
        "inband_size": wire.inband_size,
    }
    os.environ[ENV_OPTIONS] = json.dumps(settings)
    return wire


def _set_loky_pickler(name: str | None) -> None:
    from joblib.externals.loky import set_loky_pickler

    set_loky_pickler(name)
    standalone = sys.modules.get("loky")
    if standalone is not None and hasattr(standalone, "set_loky_pickler"):
        standalone.set_loky_pickler(name)


def enable(preset: Any = None, **options: Any) -> None:
    """Make loky (and so ``joblib.Parallel``) pickle with blpickle in this process and in its
    workers; options as `configure`."""
    if preset is not None or options:
        configure(preset, **options)
    _set_loky_pickler(NAME)


def disable() -> None:
    """Go back to loky's default pickler (cloudpickle)."""
    _set_loky_pickler("cloudpickle")


# --- the pickler -----------------------------------------------------------------------------


def _joblib_aware(table: Mapping[Any, Any]) -> Callable[[transport.ArrayReducer], transport.ArrayReducer]:
    """Return what makes the array reducer of a pickling from blpickle's: joblib's array
    reducer in ``table``, if any, keeps the arrays joblib memory-maps and leaves blpickle the
    others; any other reducer of the table is respected as it is."""
    reducer: Any = table.get(np.ndarray)
    joblib = _host_internals.joblib_memmapping()

    def wrap(ours: transport.ArrayReducer) -> transport.ArrayReducer:
        if reducer is None:
            return ours
        if joblib is None:
            return reducer
        backing = joblib.backing_memmap
        if isinstance(reducer, joblib.forward):
            max_nbytes = joblib.max_nbytes(reducer)

            def reduce_forward(array: np.ndarray) -> Any:
                if isinstance(backing(array), np.memmap):
                    return reducer(array)  # a reference to the file it maps
                if max_nbytes is not None and not array.dtype.hasobject and array.nbytes > max_nbytes:
                    return reducer(array)  # joblib dumps it once to a shared file
                return ours(array)

            return reduce_forward
        if reducer is joblib.backward:

            def reduce_backward(array: np.ndarray) -> Any:
                mapped = backing(array)
                if isinstance(mapped, np.memmap) and mapped.filename not in joblib.temporary_files:
                    return reducer(array)  # a memmap of the user's: a reference
                return ours(array)

            return reduce_backward
        return reducer

    return wrap


class Pickler(pickle.Pickler):
    """A pickler for loky: writes a plain pickle that carries a blpickle transfer.

    ``Pickler(file, protocol=None)``; ``dump(obj)`` writes one pickle to ``file`` that
    ``pickle.loads`` turns back into ``obj`` (blpickle must be importable there): the pickle
    of ``obj`` itself when it has no big buffer, else an envelope that brings its buffers.
    The dispatch table loky gives it is used (copyreg's by default); array reducers in it that
    come from joblib are adapted as the module docstring says.
    """

    def __init__(self, file: Any, protocol: int | None = None, *args: Any, **kwargs: Any) -> None:
        super().__init__(file, 5)
        self._bl_file = file

    def dump(self, obj: Any) -> None:
        wire = _WIRE
        table = getattr(self, "dispatch_table", None)
        if table is None:
            table = copyreg.dispatch_table
        graph, buffers = transport.pickle_graph(
            obj, wire, (table,), main_by_value=True, wrap_arrays=_joblib_aware(table)
        )
        try:
            if not buffers:
                self._bl_file.write(graph)
                return
            _write_envelope(self._bl_file, graph, transport.plan_buffers(buffers, wire), wire)
        finally:
            graph.release()


# --- the envelope: a plain pickle calling _open(head, graph, *parts) ---------------------------

_PROTO = b"\x80\x05"
_MARK = b"("
_TUPLE = b"t"
_REDUCE = b"R"
_STOP = b"."
_STACK_GLOBAL = b"\x93"
_BINBYTES8 = b"\x8e"
_BYTEARRAY8 = b"\x96"
_U64 = struct.Struct("<Q")


def _short_unicode(text: str) -> bytes:
    data = text.encode()
    return b"\x8c" + bytes([len(data)]) + data


_OPENER = _short_unicode(__name__) + _short_unicode("_open") + _STACK_GLOBAL


def _write_envelope(file: Any, graph: memoryview, transfers: list[transport.Transfer], wire: WireOptions) -> None:
    head = _HEAD.pack(_VERSION, len(transfers)) + b"".join(_DESC.pack(*shape) for shape in transport.layout(transfers))
    write = file.write
    write(_PROTO + _OPENER + _MARK + _BINBYTES8 + _U64.pack(len(head)) + head + _BINBYTES8 + _U64.pack(graph.nbytes))
    write(graph)
    for transfer in transfers:
        if not transfer.chunk_size:
            write(_BYTEARRAY8 + _U64.pack(transfer.nbytes))  # arrives as a writable bytearray
            write(transfer.payload.whole())
            continue
        for packed in transport.compressed_chunks(transfer, wire.options.threads):
            write(_BINBYTES8 + _U64.pack(len(packed)))
            write(packed)
    write(_TUPLE + _REDUCE + _STOP)


def _open(head: bytes, graph: bytes, *parts: Any) -> Any:
    """Rebuild the object of an envelope (called by ``pickle.loads``)."""
    version, count = _HEAD.unpack_from(head)
    if version != _VERSION:
        raise CorruptError(
            f"a loky message of blpickle transfer version {version}; this blpickle reads version {_VERSION}"
        )
    if len(head) != _HEAD.size + count * _DESC.size:
        raise CorruptError("a loky message with a damaged head")
    layout = [_DESC.unpack_from(head, _HEAD.size + index * _DESC.size) for index in range(count)]
    parts_in = transport.ReceivedParts(parts, "a loky message")
    return transport.unpickle_graph(graph, transport.receive_buffers(layout, parts_in, _WIRE.options.threads))
