"""How the pickler reduces torch tensors and parameters and jax arrays (their rebuilding:
`blpickle.tensors`).

A tensor is reduced to `blpickle.tensors.rebuild_tensor` over its storage, which one pickle
stream reduces once (the pickler's memo refers to it after): to
`blpickle.tensors.rebuild_storage` of a numpy array over the storage's bytes, copied to the
host for a GPU tensor, typed by the element size of the first tensor met on it. The pickler
then takes that array out of band as any other, so the shuffle filter sees whole elements.
A storage that the tensor met first covers whole, contiguous, is stored with that tensor's
shape and named by that tensor's path (`blpickle.names`): ``blpickle.open`` gives it back as
a tensor. A jax array is reduced to `blpickle.tensors.rebuild_jax_array` of the numpy array of
its host data, a cupy array to `blpickle.tensors.rebuild_cupy_array` of a numpy copy of it
(its GPU memory copied to the host).

Tensors are recognised by their exact type once their library is imported (`TensorReducer.
reducers`, asked once per pickle stream): blpickle imports none of torch, jax and cupy.
Tensors that carry more than a dense storage (sparse, quantized, nested, conjugate or negative views, other
devices than the CPU and CUDA, subclasses, Python attributes, dtypes outside
`blpickle.tensors.TORCH_DTYPES`) keep torch's own reduction.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from .tensors import (
    CUPY_DTYPES,
    TORCH_DTYPES,
    rebuild_cupy_array,
    rebuild_jax_array,
    rebuild_parameter,
    rebuild_storage,
    rebuild_tensor,
)

__all__ = ["TensorReducer"]

Reduce = Callable[[Any], Any]


class _Storage:
    """One torch storage met in a pickle stream, with the tensor met first on it."""

    __slots__ = ("first", "named", "storage")

    def __init__(self, storage: Any, first: Any, named: Any) -> None:
        self.storage = storage
        self.first = first  # the tensor whose dtype types the storage's bytes
        self.named = named  # the object whose path names the storage, if it covers it


class TensorReducer:
    """The torch storages and jax and cupy arrays met in one pickle stream, kept alive until
    `clear` so that no id is reused meanwhile.

    Attributes:
        stand_ins: id of each numpy array this reducer made for the pickler to take out of
            band -> the object whose path names it (None for none) and its ``tensor`` label
            (``"torch.bfloat16"``, ``"jax.float32"``, ``"cupy.float32"``), recorded in the header.
    """

    def __init__(self) -> None:
        self.stand_ins: dict[int, tuple[Any, str]] = {}
        self._storages: dict[int, _Storage] = {}
        self._kept: list[Any] = []
        self._libraries: tuple[Any, Any, Any] = (None, None, None)
        self._reducers: dict[type, Reduce] = {}
        self._dtype_names: dict[Any, str] = {}

    def __bool__(self) -> bool:
        return bool(self._kept)

    def clear(self) -> None:
        """Forget the storages and arrays met (when the pickle stream is done)."""
        self.stand_ins.clear()
        self._storages.clear()
        self._kept.clear()

    def reducers(self) -> dict[type, Reduce]:
        """Return ``{type: reduce}`` for the tensor types of the libraries imported so far
        (empty when none is): what the pickler's ``reducer_override`` looks types up in."""
        torch, jax = sys.modules.get("torch"), getattr(sys.modules.get("jax._src.array"), "ArrayImpl", None)
        cupy = getattr(sys.modules.get("cupy"), "ndarray", None)
        if not hasattr(torch, "nn"):  # not imported, or still importing
            torch = None
        if (torch, jax, cupy) != self._libraries:
            self._libraries = (torch, jax, cupy)
            reducers: dict[type, Reduce] = {}
            if torch is not None:
                reducers.update({torch.Tensor: self._reduce_tensor, torch.nn.Parameter: self._reduce_parameter})
                reducers[_Storage] = self._reduce_storage
                names = (name for name in TORCH_DTYPES if hasattr(torch, name))
                self._dtype_names = {getattr(torch, name): name for name in names}
            if jax is not None:
                reducers[jax] = self._reduce_jax
            if cupy is not None:
                reducers[cupy] = self._reduce_cupy
            self._reducers = reducers
        return self._reducers

    def _plain(self, tensor: Any) -> bool:
        """Whether ``tensor`` is a dense tensor of a known dtype over a CPU or CUDA storage,
        with nothing more to keep (no Python attributes, conjugate or negative bit)."""
        return (
            tensor.layout is self._libraries[0].strided
            and tensor.dtype in self._dtype_names
            and tensor.device.type in ("cpu", "cuda")
            and not tensor.is_quantized
            and not tensor.is_nested
            and not tensor.is_conj()
            and not tensor.is_neg()
            and not tensor.__dict__
        )

    def _storage(self, tensor: Any, named: Any) -> _Storage:
        """Return the `_Storage` of ``tensor``'s storage, met first now if not before: then
        ``named`` is the object whose path may name it."""
        storage = tensor.untyped_storage()
        found = self._storages.get(storage._cdata)
        if found is None:
            found = self._storages[storage._cdata] = _Storage(storage, tensor, named)
            self._kept.append(storage)  # so that no other storage gets its address meanwhile
        return found

    def _reduce_tensor(self, tensor: Any) -> Any:
        if not self._plain(tensor):
            return NotImplemented
        storage = self._storage(tensor, tensor)
        args = (tensor.storage_offset(), tuple(tensor.shape), tensor.stride(), tensor.requires_grad)
        return rebuild_tensor, (storage, self._dtype_names[tensor.dtype], *args)

    def _reduce_parameter(self, parameter: Any) -> Any:
        if not self._plain(parameter):
            return NotImplemented
        data = parameter.detach()  # a plain tensor over the same storage
        self._storage(data, parameter)  # the parameter's path names the storage
        self._kept.append(data)
        return rebuild_parameter, (data, parameter.requires_grad)

    def _reduce_storage(self, met: _Storage) -> Any:
        """Reduce a storage to `rebuild_storage` of a numpy array over its bytes (on the
        host), typed by the dtype of the first tensor met on it (bytes if its size is not a
        multiple of that dtype's) and shaped as that tensor if it covers the storage."""
        storage, first = met.storage, met.first
        nbytes = storage.nbytes()
        torch = self._libraries[0]
        raw = torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage, 0, (nbytes,), (1,))
        raw = raw.cpu().numpy()  # a GPU storage's bytes are copied to the host
        name = self._dtype_names[first.dtype]
        dtype = np.dtype(TORCH_DTYPES[name])
        if nbytes % dtype.itemsize:
            name, dtype = "uint8", np.dtype(np.uint8)
        data = raw.view(dtype)
        named = None
        if first.storage_offset() == 0 and first.numel() * first.element_size() == nbytes and first.is_contiguous():
            data = data.reshape(tuple(first.shape))
            named = met.named
        self.stand_ins[id(data)] = (named, f"torch.{name}")
        self._kept.append(data)
        return rebuild_storage, (data,)

    def _reduce_jax(self, array: Any) -> Any:
        data = np.ascontiguousarray(array)  # its host data
        self.stand_ins[id(data)] = (array, f"jax.{data.dtype}")
        self._kept.extend((array, data))
        return rebuild_jax_array, (data,)

    def _reduce_cupy(self, array: Any) -> Any:
        if array.dtype not in CUPY_DTYPES:
            return NotImplemented
        data = array.get()  # copied from the GPU, in C order
        self.stand_ins[id(data)] = (array, f"cupy.{data.dtype}")
        self._kept.extend((array, data))
        return rebuild_cupy_array, (data,)
