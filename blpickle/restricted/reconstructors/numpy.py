"""The vetted reconstructors of numpy (arrays, dtypes, scalars, random generators; numpy 2 and
numpy 1 spellings) and of blpickle's own records (arrays, views of them, torch and jax
tensors), and the checks of random states that numpy accepts without checking their values."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import numpy as np

from ... import tensors
from ...arrays import rebuild_ndarray, rebuild_view, view_extent
from ...errors import CorruptError, LimitError, UnsafeLoadError
from ..numpy_state import STRING_ITEMS, Pending
from ..shown import shown
from .checks import Check, Context, Reconstructor, check_arity, cython_state

__all__ = ["RECONSTRUCTORS", "STATE_CHECKS"]

#: The longest type code accepted for ``numpy.dtype(code, align, copy)``.
_MAX_CODE = 64
_CORE = "numpy._core"
_SCALAR = importlib.import_module(f"{_CORE}.multiarray").scalar


def _dtype(args: tuple[Any, ...], context: Context) -> Any:
    check_arity(args, 1, 3, "numpy.dtype")
    code = args[0]
    if isinstance(code, type):
        if not (issubclass(code, np.generic) and context.admitted(code)):
            raise CorruptError(f"numpy.dtype takes an admitted numpy scalar type in safe mode, not {shown(code)}")
    elif not isinstance(code, str) or len(code) > _MAX_CODE:
        raise CorruptError(f"numpy.dtype takes a type code or a scalar type and two flags, not {shown(args)}")
    if not all(type(flag) in (bool, int) for flag in args[1:]):
        raise CorruptError(f"numpy.dtype takes a type code or a scalar type and two flags, not {shown(args)}")
    try:
        np.dtype(code)  # check it now
    except Exception as exc:  # numpy raises TypeError, ValueError, even SyntaxError for some codes
        raise CorruptError(f"numpy.dtype refuses the type code {shown(code)}: {exc}") from None
    return Pending("dtype", args)


def _string_dtype(args: tuple[Any, ...], context: Context) -> Any:
    """numpy's ``StringDType(coerce=, na_object=)`` (how numpy pickles it): ``coerce`` 0 or 1,
    ``na_object`` None, a float or a str (values whose conversion to str runs no code of an
    admitted class)."""
    check_arity(args, 1, 2, "numpy StringDType")
    if (
        type(args[0]) not in (bool, int)
        or args[0] not in (0, 1)
        or (len(args) == 2 and type(args[1]) not in STRING_ITEMS)
    ):
        raise CorruptError(f"numpy StringDType takes a flag and None, a float or a str, not {shown(args)}")
    missing = {"na_object": args[1]} if len(args) == 2 else {}
    return np.dtypes.StringDType(coerce=bool(args[0]), **missing)


def _reconstruct(args: tuple[Any, ...], context: Context) -> Any:
    check_arity(args, 3, 3, "numpy _reconstruct")
    if args[0] is np.ndarray:
        return Pending("array", args)
    raise CorruptError(f"numpy _reconstruct rebuilds numpy.ndarray in safe mode, not {shown(args[0])}")


def _scalar(args: tuple[Any, ...], context: Context) -> Any:
    check_arity(args, 1, 2, "numpy scalar")
    dtype = args[0]
    if not isinstance(dtype, np.dtype):
        raise CorruptError(f"numpy scalar needs a dtype, not {shown(dtype)}")
    if dtype == np.dtype(object):
        return args[1] if len(args) == 2 else None
    data = args[1] if len(args) == 2 else b""
    if dtype.hasobject or type(data) is not bytes or len(data) != dtype.itemsize:
        raise CorruptError(f"a numpy scalar of dtype {dtype} needs {dtype.itemsize} bytes, not {shown(data)}")
    context.copying(dtype.itemsize)
    try:
        return _SCALAR(dtype, data)
    except Exception as exc:
        raise CorruptError(f"numpy refuses a scalar of dtype {dtype}: {exc}") from None


def _rebuild(what: str) -> Callable[[tuple[Any, ...], Context], np.ndarray]:
    """The check of an array reconstructor taking (buffer, dtype, shape, order), which
    `rebuild_ndarray` checks (numpy's ``_frombuffer`` takes the same arguments)."""

    def check(args: tuple[Any, ...], context: Context) -> np.ndarray:
        check_arity(args, 4, 4, what)
        return rebuild_ndarray(*args)

    return check


def _rebuild_view(args: tuple[Any, ...], context: Context) -> np.ndarray:
    """`rebuild_view` (base, offset, dtype, shape, strides) checks that the view lies inside
    its base, a contiguous array without objects; safe mode also refuses views whose elements
    overlap (broadcast views), so that a copy of any view costs no more than its base."""
    check_arity(args, 5, 5, "blpickle rebuild_view")
    view = rebuild_view(*args)
    low, high = view_extent(0, view.itemsize, view.shape, view.strides)
    if view.nbytes > high - low:
        raise LimitError(
            f"safe mode refuses a view whose elements overlap (shape {view.shape}, strides {view.strides}): "
            f"a copy of it would take {view.nbytes} bytes for {high - low} bytes of its base"
        )
    return view


def _tensors(name: str, arity: int, copies: Callable[[np.ndarray], bool] = lambda data: False) -> Check:
    """A rebuild function of `blpickle.tensors`, which checks every argument itself;
    ``copies(data)``: whether it copies its first argument, a numpy array (counted against
    the load's copies)."""

    def check(args: tuple[Any, ...], context: Context) -> Any:
        check_arity(args, arity, arity, f"blpickle {name}")
        if isinstance(args[0], np.ndarray) and copies(args[0]):
            context.copying(args[0].nbytes)
        return getattr(tensors, name)(*args)

    return check


def _refuse_ndarray(args: tuple[Any, ...], context: Context) -> None:
    raise UnsafeLoadError("numpy", "ndarray", "safe mode builds arrays only through their reconstructors")


def _bit_generators() -> dict[str, type]:
    return dict(importlib.import_module("numpy.random._pickle").BitGenerators)


def _bit_generator(args: tuple[Any, ...], context: Context) -> Any:
    """``__bit_generator_ctor(cls_or_name)``: a new bit generator of one of numpy's kinds."""
    check_arity(args, 0, 1, "numpy __bit_generator_ctor")
    kinds = _bit_generators()
    kind = args[0] if args else "MT19937"
    cls = kinds.get(kind) if isinstance(kind, str) else kind
    if cls is None or cls not in kinds.values():
        raise CorruptError(f"numpy's bit generators are {sorted(kinds)}, not {shown(kind)}")
    return cls()


def _generator(cls_name: str) -> Check:
    """``__generator_ctor`` / ``__randomstate_ctor``: a Generator or RandomState over a bit
    generator the pickle built, or named (never a bit generator maker of the pickle's)."""

    def check(args: tuple[Any, ...], context: Context) -> Any:
        random = importlib.import_module("numpy.random")
        check_arity(args, 0, 1, f"numpy {cls_name} constructor")
        bits = args[0] if args else "MT19937"
        if isinstance(bits, str):
            bits = _bit_generator((bits,), context)
        if not isinstance(bits, random.BitGenerator):
            raise CorruptError(f"a numpy {cls_name} takes a bit generator, not {shown(bits)}")
        return getattr(random, cls_name)(bits)

    return check


def _random_state(obj: Any, context: Context) -> None:
    """Check the state numpy accepted for a bit generator, a RandomState or a Generator: numpy
    checks its types only, and a position out of range crashes the next draw."""
    random = importlib.import_module("numpy.random")
    if isinstance(obj, random.RandomState):
        bits = obj._bit_generator
    else:
        bits = obj.bit_generator if isinstance(obj, random.Generator) else obj
    state = bits.state
    inner = state.get("state", {})
    if "pos" in inner and not (0 <= inner["pos"] <= 624 and np.shape(inner.get("key")) == (624,)):
        raise CorruptError(f"an MT19937 state must have a position within its 624 words, not {shown(inner['pos'], 40)}")
    if "buffer_pos" in state and not 0 <= state["buffer_pos"] <= np.size(state.get("buffer", ())):
        raise CorruptError(f"a Philox state must have a buffer position within its buffer, not {state['buffer_pos']}")
    if state.get("has_uint32", 0) not in (0, 1):
        raise CorruptError("a bit generator's has_uint32 must be 0 or 1")


def _seed_state(seq: Any, context: Context) -> None:
    """Check a SeedSequence's pool: as many words as its declared size, which numpy trusts
    (mixing a pool declared 2¹⁶ words long from 4 stored takes seconds, and time grows with
    the square of the size)."""
    if np.size(seq.pool) != seq.pool_size:
        raise CorruptError(f"a numpy SeedSequence's pool holds {np.size(seq.pool)} words, not its size {seq.pool_size}")


#: Checks of a numpy random object's state after ``BUILD`` set it, by the import path of its class.
STATE_CHECKS: dict[str, Callable[[Any, Context], None]] = {
    "numpy.random.bit_generator.SeedSequence": _seed_state,
    "numpy.random.bit_generator.BitGenerator": _random_state,
    "numpy.random.mtrand.RandomState": _random_state,
    "numpy.random._generator.Generator": _random_state,
}

#: The reconstructors of numpy and of blpickle records, by import path.
RECONSTRUCTORS: dict[str, Reconstructor] = {
    # numpy arrays, dtypes, scalars and random generators (numpy 2 and numpy 1 spellings)
    "numpy.dtype": Reconstructor(_dtype),
    "numpy.ndarray": Reconstructor(_refuse_ndarray),
    **{f"{core}.multiarray._reconstruct": Reconstructor(_reconstruct) for core in (_CORE, "numpy.core")},
    **{f"{core}.multiarray.scalar": Reconstructor(_scalar) for core in (_CORE, "numpy.core")},
    **{f"{core}.numeric._frombuffer": Reconstructor(_rebuild("numpy _frombuffer")) for core in (_CORE, "numpy.core")},
    f"{_CORE}._internal._convert_to_stringdtype_kwargs": Reconstructor(_string_dtype),
    "numpy.random._pickle.__bit_generator_ctor": Reconstructor(_bit_generator),
    "numpy.random._pickle.__generator_ctor": Reconstructor(_generator("Generator")),
    "numpy.random._pickle.__randomstate_ctor": Reconstructor(_generator("RandomState")),
    "numpy.random.bit_generator.__pyx_unpickle_SeedSequence": Reconstructor(
        cython_state("numpy.random.bit_generator.SeedSequence", "__pyx_unpickle_SeedSequence", _seed_state)
    ),
    # how blpickle records rebuild arrays (checks sizes, refuses object dtypes) and views
    # of them (checks that the view lies inside its base)
    "blpickle.arrays.rebuild_ndarray": Reconstructor(_rebuild("blpickle rebuild_ndarray")),
    "blpickle.arrays.rebuild_view": Reconstructor(_rebuild_view),
    # how blpickle records rebuild torch storages, tensors and parameters, jax arrays and
    # cupy arrays
    "blpickle.tensors.rebuild_storage": Reconstructor(
        _tensors("rebuild_storage", 1, lambda data: not data.flags.writeable)
    ),
    "blpickle.tensors.rebuild_tensor": Reconstructor(_tensors("rebuild_tensor", 6)),
    "blpickle.tensors.rebuild_parameter": Reconstructor(_tensors("rebuild_parameter", 2)),
    "blpickle.tensors.rebuild_jax_array": Reconstructor(_tensors("rebuild_jax_array", 1, lambda data: True)),
    "blpickle.tensors.rebuild_cupy_array": Reconstructor(_tensors("rebuild_cupy_array", 1)),
}
