"""How torch tensors, jax arrays and cupy arrays are rebuilt from a record.

A record stores the storage of torch tensors once, as a numpy array typed by the element size
of the tensor's dtype (so that the shuffle filter sees whole elements), and rebuilds every
tensor over it: tensors that shared a storage when dumped share one again, views stay views.
A jax array is stored as the numpy array of its host data, and so is a cupy array (copied
from its GPU). The pickle stream calls the functions below; their import paths
(``blpickle.tensors.rebuild_storage``, ...) are part of the file format and never change. A
hostile file may call them with anything: each checks every argument and raises
`blpickle.CorruptError` for what it refuses, and none calls ``torch.load``.

Nothing here imports torch, jax or cupy before a function needs it: importing blpickle imports
none of them (`blpickle.tensor_reducers` recognises their objects by type).
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib
import re
from collections.abc import Iterator
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np

from .arrays import _is_ints, view_extent
from .errors import CorruptError, add_note

if TYPE_CHECKING:
    import torch

__all__ = [
    "CUPY_DTYPES",
    "TORCH_DTYPES",
    "map_location",
    "ml_dtype",
    "rebuild_cupy_array",
    "rebuild_jax_array",
    "rebuild_parameter",
    "rebuild_storage",
    "rebuild_tensor",
    "stored_array",
]

#: The torch dtypes whose tensors blpickle stores, by name (``torch.<name>``), and the numpy
#: dtype their bytes are stored as: numpy's own where it has one, else unsigned integers of the
#: element size (bfloat16 and the float8 formats have none in numpy itself).
TORCH_DTYPES: dict[str, str] = {
    "float64": "float64",
    "float32": "float32",
    "float16": "float16",
    "bfloat16": "uint16",
    "float8_e4m3fn": "uint8",
    "float8_e4m3fnuz": "uint8",
    "float8_e5m2": "uint8",
    "float8_e5m2fnuz": "uint8",
    "float8_e8m0fnu": "uint8",
    "float4_e2m1fn_x2": "uint8",
    "complex128": "complex128",
    "complex64": "complex64",
    "int64": "int64",
    "int32": "int32",
    "int16": "int16",
    "int8": "int8",
    "uint64": "uint64",
    "uint32": "uint32",
    "uint16": "uint16",
    "uint8": "uint8",
    "bool": "bool",
}
#: The dtypes of the cupy arrays blpickle stores as numpy arrays: cupy's booleans, integers,
#: floats and complex numbers, in native byte order.
CUPY_DTYPES = frozenset(np.dtype(char) for char in "?bhilqBHILQefdFD")
#: The numpy dtypes a storage may arrive as: those of `TORCH_DTYPES`.
_STORAGE_DTYPES = frozenset(np.dtype(name) for name in TORCH_DTYPES.values())
#: The most dimensions a rebuilt tensor may have (torch's own limit is larger; no real tensor nears it).
_MAX_NDIM = 64

#: The device `map_location` asks tensors to be rebuilt on (None: the CPU): a ``torch.device``
#: where torch is installed, else the string of a CPU or CUDA device.
_DEVICE: contextvars.ContextVar[Any] = contextvars.ContextVar("blpickle_tensor_device", default=None)


def _torch() -> ModuleType:
    return importlib.import_module("torch")


@contextlib.contextmanager
def map_location(device: str | torch.device) -> Iterator[None]:
    """Within the block, torch tensors that `blpickle.load` or `blpickle.open` rebuild are
    put on ``device`` (``"cuda"``, ``"cuda:1"``, a ``torch.device``), storages shared as
    before, and cupy arrays are rebuilt as cupy arrays on a CUDA ``device``; outside, torch
    tensors are rebuilt on the CPU and cupy arrays as numpy arrays, whatever device they were
    dumped from.

    Example:
        ```python
        with blpickle.tensors.map_location("cuda"):
            state = blpickle.load("model.blp")
        ```

    Raises:
        RuntimeError: for a string torch does not read as a device.
        ValueError: without torch, for anything but ``"cpu"``, ``"cuda"`` or ``"cuda:<n>"``.
    """
    try:
        checked = _torch().device(device)
    except ImportError:
        if not (isinstance(device, str) and re.fullmatch(r"cpu|cuda(:[0-9]+)?", device)):
            raise ValueError(f"a device is 'cpu', 'cuda' or 'cuda:<n>', not {device!r:.80}") from None
        checked = device
    token = _DEVICE.set(checked)
    try:
        yield
    finally:
        _DEVICE.reset(token)


def rebuild_storage(data: Any) -> torch.UntypedStorage:
    """Return a torch storage over the memory of ``data`` (no copy, unless it is read-only),
    moved to the device of `map_location` if one is set.

    Raises:
        CorruptError: when ``data`` is not a C-contiguous numpy array of a dtype of
            `TORCH_DTYPES`, in native byte order.
    """
    if not (type(data) is np.ndarray and data.flags.c_contiguous and data.dtype in _STORAGE_DTYPES):
        raise CorruptError(
            f"a torch storage is rebuilt from a contiguous numpy array of a fixed dtype, not {_describe(data)}"
        )
    torch = _torch()
    if not data.flags.writeable:  # torch warns on read-only memory, and may write to it
        data = data.copy()
    flat = torch.from_numpy(data.reshape(-1).view(np.uint8))
    device = _DEVICE.get()
    return (flat if device is None else flat.to(device)).untyped_storage()


def rebuild_tensor(storage: Any, dtype: Any, offset: Any, shape: Any, strides: Any, requires_grad: Any) -> torch.Tensor:
    """Return the tensor of ``dtype`` (a name of `TORCH_DTYPES`), ``shape`` and ``strides``
    (in elements) whose first element is element ``offset`` of ``storage``: a view of it,
    sharing it with every other tensor rebuilt over it.

    Raises:
        CorruptError: when ``storage`` is not a torch storage, ``dtype`` not a name of
            `TORCH_DTYPES`, ``offset``, ``shape`` and ``strides`` not non-negative ints (as
            many strides as sizes), ``requires_grad`` not a bool (True only for floating
            and complex dtypes), or any element would lie outside the storage.
    """
    torch = _torch()
    kind = getattr(torch, dtype, None) if type(dtype) is str and dtype in TORCH_DTYPES else None
    if not (
        isinstance(storage, torch.UntypedStorage)
        and isinstance(kind, torch.dtype)
        and type(offset) is int
        and offset >= 0
        and _is_ints(shape, 0)
        and _is_ints(strides, 0)
        and len(strides) == len(shape) <= _MAX_NDIM
        and type(requires_grad) is bool
        and (not requires_grad or kind.is_floating_point or kind.is_complex)
    ):
        raise CorruptError(
            f"cannot rebuild a tensor of dtype {dtype!r:.40}, shape {shape!r:.80}, strides {strides!r:.80}, "
            f"offset {offset!r:.40} and requires_grad {requires_grad!r:.20} over a {type(storage).__name__}"
        )
    itemsize = kind.itemsize
    low, high = view_extent(offset * itemsize, itemsize, shape, tuple(s * itemsize for s in strides))
    if high > storage.nbytes():
        raise CorruptError(
            f"a tensor of shape {shape} and strides {strides} at offset {offset} spans bytes {low}:{high} "
            f"of a storage of {storage.nbytes()} bytes"
        )
    try:
        tensor = torch.empty(0, dtype=kind, device=storage.device).set_(storage, offset, shape, strides)
    except (RuntimeError, OverflowError) as exc:  # sizes too large for torch, for instance
        raise CorruptError(f"torch refuses a tensor of shape {shape} and strides {strides}: {exc}") from None
    return tensor.requires_grad_() if requires_grad else tensor


def rebuild_parameter(data: Any, requires_grad: Any) -> torch.nn.Parameter:
    """Return ``torch.nn.Parameter(data, requires_grad)``.

    Raises:
        CorruptError: when ``data`` is not a plain tensor or ``requires_grad`` not a bool
            (True only for floating and complex dtypes).
    """
    torch = _torch()
    if not (
        type(data) is torch.Tensor
        and type(requires_grad) is bool
        and (not requires_grad or data.dtype.is_floating_point or data.dtype.is_complex)
    ):
        raise CorruptError(f"a parameter is a tensor and a bool, not {_describe(data)} and {requires_grad!r:.20}")
    return torch.nn.Parameter(data, requires_grad=requires_grad)


def rebuild_jax_array(data: Any) -> Any:
    """Return the jax array (on jax's default device) of the numpy array ``data``.

    Raises:
        CorruptError: when ``data`` is not a C-contiguous numpy array of numbers or booleans
            (numpy's own or ml_dtypes' dtypes): a view with zero strides would have jax
            allocate all the elements it repeats.
    """
    if not (type(data) is np.ndarray and data.flags.c_contiguous and _is_numeric(data.dtype)):
        raise CorruptError(f"a jax array is rebuilt from a numpy array of numbers, not {_describe(data)}")
    return importlib.import_module("jax.numpy").asarray(data)


def rebuild_cupy_array(data: Any) -> Any:
    """Return the numpy array ``data``, dumped from a cupy array: as is, on the host, unless
    `map_location` names a CUDA device; then a cupy array on that device (a copy of it).

    Raises:
        CorruptError: when ``data`` is not a C-contiguous numpy array of a dtype of
            `CUPY_DTYPES` (a view with zero strides would have cupy copy all the elements it
            repeats).
        ValueError: when `map_location` names a device that is neither the CPU nor a CUDA one.
        ImportError: when `map_location` names a CUDA device and cupy is not installed.
    """
    if not (type(data) is np.ndarray and data.flags.c_contiguous and data.dtype in CUPY_DTYPES):
        raise CorruptError(f"a cupy array is rebuilt from a contiguous numpy array of numbers, not {_describe(data)}")
    device = _DEVICE.get()
    if device is None:
        return data
    kind, _, index = str(device).partition(":")
    if kind == "cpu":
        return data
    if kind != "cuda":
        raise ValueError(f"cupy arrays are rebuilt on the CPU or on a CUDA device, not on {device}")
    try:
        cupy = importlib.import_module("cupy")
    except ImportError as exc:
        add_note(exc, "the record holds cupy arrays: outside map_location they load as numpy arrays")
        raise
    with cupy.cuda.Device(int(index) if index else None):
        return cupy.asarray(data)


def _is_numeric(dtype: np.dtype) -> bool:
    """Whether ``dtype`` holds numbers or booleans: numpy's, or an ml_dtypes type."""
    return dtype.kind in "biufc" or (dtype.kind == "V" and dtype.type.__module__ == "ml_dtypes")


def _describe(obj: Any) -> str:
    """A short description of an argument, for error messages."""
    if isinstance(obj, np.ndarray):
        return f"a numpy array of dtype {obj.dtype} and shape {obj.shape}"
    return f"a {type(obj).__module__}.{type(obj).__qualname__}"


def ml_dtype(name: str) -> np.dtype | None:
    """Return the ml_dtypes dtype named ``name`` (``"bfloat16"``, ``"float8_e4m3fn"``...),
    or None when there is none or ml_dtypes is not installed."""
    if not name.isidentifier():
        return None
    try:
        ml_dtypes = importlib.import_module("ml_dtypes")
    except ImportError:
        return None
    kind = getattr(ml_dtypes, name, None)
    return np.dtype(kind) if isinstance(kind, type) and issubclass(kind, np.generic) else None


def stored_array(tensor: str, data: np.ndarray) -> Any:
    """Return ``data`` (an array read from a record) as the type the record says it was
    dumped as: ``tensor`` is ``"torch.<dtype>"``, ``"jax.<dtype>"`` or ``"cupy.<dtype>"``
    (the ``tensor`` key of its stream). A torch tensor shares ``data``'s memory (on the
    device of `map_location`); a cupy array stays ``data`` unless `map_location` names a
    CUDA device (`rebuild_cupy_array`).

    Raises:
        ImportError: when the library is not installed (the hint says how to read the bytes).
        blpickle.CorruptError: for a ``tensor`` that names none of these libraries or a dtype
            that does not match the array's element size.
    """
    library, _, dtype = tensor.partition(".")
    if library not in ("torch", "jax", "cupy"):
        raise CorruptError(f"the record describes an array of {tensor!r:.80}, which is not torch's, jax's or cupy's")
    if library == "cupy":
        if dtype != data.dtype.name:
            raise CorruptError(f"the record describes a cupy array of dtype {dtype!r:.40} over {_describe(data)}")
        return rebuild_cupy_array(data)
    try:
        module = importlib.import_module(library)
    except ImportError as exc:
        add_note(exc, f"the array was a {library} array: read its bytes with Record.read_bytes")
        raise
    if library == "jax":
        return rebuild_jax_array(data)
    storage = rebuild_storage(np.ascontiguousarray(data))
    kind = getattr(module, dtype, None) if dtype in TORCH_DTYPES else None
    if kind is None or kind.itemsize != data.itemsize:
        raise CorruptError(f"the record describes a torch tensor of dtype {dtype!r:.40} over {_describe(data)}")
    return rebuild_tensor(storage, dtype, 0, data.shape, _contiguous_strides(data.shape), False)


def _contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The strides (in elements) of a C-contiguous tensor of ``shape``."""
    strides = []
    step = 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))
