"""The vetted reconstructors of pandas: datetime, categorical, period, interval and extension
columns, indexes, blocks and block managers, timestamps and NaT; and the families of pandas
classes that pickle calls with plain data (date offsets, extension dtypes)."""

from __future__ import annotations

import datetime
import importlib
from collections.abc import Callable
from typing import Any

import numpy as np

from ...errors import CorruptError
from ..shown import shown
from .checks import Check, Context, Family, Reconstructor, check_arity, check_types, cython_state

__all__ = ["FAMILIES", "RECONSTRUCTORS", "STATE_CHECKS", "STATE_GUARDS"]

#: The package pattern a caller allows for these to be called.
_PANDAS = "pandas"
#: The keys of the dicts that pandas' indexes pickle for ``_new_Index`` and
#: ``_new_DatetimeIndex`` (pandas 1 to 3): never a dtype to convert to, nor a copy flag.
_INDEX_KEYS = frozenset(
    {"data", "name", "names", "freq", "tz", "start", "stop", "step", "levels", "codes", "sortorder"}
)


def _pandas_index(function: str) -> Check:
    """``_new_Index(cls, d)`` and ``_new_DatetimeIndex(cls, d)``: ``cls(**d)`` for an
    admitted index class and a dict of str keys."""

    def check(args: tuple[Any, ...], context: Context) -> Any:
        pandas = importlib.import_module("pandas")
        cls, fields = check_types(args, ((type,), (dict,)), function)
        context.subclass(cls, pandas.Index, function)
        if not all(type(key) is str for key in fields) or not _INDEX_KEYS.issuperset(fields):
            raise CorruptError(f"{function} takes a dict of the keys pandas writes, not {shown(list(fields))}")
        data = fields.get("data")
        # an Index as data (a RangeIndex of 10**9 rows takes a few bytes) would be materialized
        if data is not None and not isinstance(data, (np.ndarray, pandas.api.extensions.ExtensionArray)):
            raise CorruptError(f"{function} takes its data as an array, not a {type(data).__name__}")
        module = "pandas.core.indexes.datetimes" if "Datetime" in function else "pandas.core.indexes.base"
        return context.built(getattr(importlib.import_module(module), function)(cls, fields))

    return check


def _pandas_block(args: tuple[Any, ...], context: Context) -> Any:
    """``_unpickle_block(values, placement, ndim)``: a block of a DataFrame's columns."""
    pandas = importlib.import_module("pandas")
    internals = importlib.import_module("pandas._libs.internals")
    values, placement, ndim = check_types(
        args,
        ((np.ndarray, pandas.api.extensions.ExtensionArray), (slice, np.ndarray, internals.BlockPlacement), (int,)),
        "pandas _unpickle_block",
    )
    if ndim not in (1, 2):
        raise CorruptError(f"a pandas block has 1 or 2 dimensions, not {ndim}")
    return context.built(internals._unpickle_block(values, placement, ndim))


def _pandas_manager(args: tuple[Any, ...], context: Context) -> Any:
    """``BlockManager(blocks, axes)``: a DataFrame's blocks and its axes."""
    pandas = importlib.import_module("pandas")
    internals = importlib.import_module("pandas._libs.internals")
    blocks, axes = check_types(args, ((tuple,), (list,)), "pandas BlockManager")
    if not all(isinstance(block, internals.Block) for block in blocks) or not all(
        isinstance(axis, pandas.Index) for axis in axes
    ):
        raise CorruptError(f"a pandas BlockManager takes blocks and indexes, not {shown(args, 120)}")
    if len(axes) != 2:
        raise CorruptError(f"a pandas BlockManager has two axes, not {len(axes)}")
    # sizes first, from the blocks' data: an axis (a RangeIndex) or a placement (a slice) may
    # declare any length in a few bytes
    for block in blocks:
        if block.shape != (len(block.mgr_locs), len(axes[1])):
            raise CorruptError(f"a pandas block of shape {block.shape} does not fit its DataFrame")
    if sum(len(block.mgr_locs) for block in blocks) != len(axes[0]):
        raise CorruptError(f"a pandas BlockManager's blocks must place each of its {len(axes[0])} columns once")
    placed = np.concatenate([block.mgr_locs.as_array for block in blocks]) if blocks else np.zeros(0, np.intp)
    if not np.array_equal(np.sort(placed), np.arange(len(axes[0]))):
        raise CorruptError(f"a pandas BlockManager's blocks must place each of its {len(axes[0])} columns once")
    return context.built(importlib.import_module("pandas.core.internals.managers").BlockManager(blocks, axes))


#: The resolutions of pandas' datetime and timedelta arrays (numpy's others, from days to
#: attoseconds, pandas neither writes nor reads right).
_PANDAS_UNITS = frozenset((unit, 1) for unit in ("s", "ms", "us", "ns"))


def _backed_state(array: Any, context: Context) -> None:
    """Check that the data of a pandas array built on ``NDArrayBacked`` fits its dtype:
    pandas trusts both on unpickling, and a categorical's code past its categories makes
    pandas read outside memory. Categories in a `RangeIndex` count against the load's copies
    as the array they become on use.

    Raises:
        CorruptError: for data that does not fit, or an array of another kind.
        LimitError: for more categories than the load's budget of copies allows.
    """
    pandas = importlib.import_module("pandas")
    arrays = pandas.arrays
    data, dtype = array._ndarray, array._dtype
    if data is None:  # made without its state, which BUILD sets (and this checks) next
        return
    if isinstance(array, pandas.Categorical):
        if isinstance(dtype.categories, pandas.RangeIndex):
            context.copying(len(dtype.categories) * 8)  # stored in a few bytes, materialized by many uses
        if data.dtype.kind != "i" or (data.size and not (data.min() >= -1 and data.max() < len(dtype.categories))):
            raise CorruptError(
                f"a pandas Categorical's codes must be ints from -1 to {len(dtype.categories) - 1}, its categories"
            )
        return
    if isinstance(array, (arrays.DatetimeArray, arrays.TimedeltaArray)) and (
        data.dtype.kind in "Mm" and np.datetime_data(data.dtype) not in _PANDAS_UNITS
    ):
        raise CorruptError(f"a pandas {type(array).__name__} holds seconds to nanoseconds, not {data.dtype}")
    if isinstance(array, arrays.DatetimeArray):
        fits = data.dtype == (dtype if isinstance(dtype, np.dtype) else np.dtype(f"M8[{dtype.unit}]"))
    elif isinstance(array, arrays.TimedeltaArray):
        fits = data.dtype == dtype
    elif isinstance(array, arrays.PeriodArray):
        fits = data.dtype == np.int64
    elif isinstance(array, arrays.StringArray):
        fits = data.dtype == object
    elif isinstance(array, arrays.NumpyExtensionArray):
        fits = data.dtype == dtype.numpy_dtype
    else:
        raise CorruptError(f"safe mode loads pandas' own arrays, not a {type(array).__qualname__}")
    if not fits:
        raise CorruptError(f"a pandas {type(array).__name__} of dtype {dtype} cannot hold data of {data.dtype}")


def _sparse_index(name: str, arrays: int) -> Check:
    """``IntIndex(length, indices)`` and ``BlockIndex(length, blocs, blengths)``: where a
    sparse array's values lie, given as int32 positions (pandas writes them so, and casts
    others unchecked); pandas checks them (in range, ascending) as it builds the index."""

    def check(args: tuple[Any, ...], context: Context) -> Any:
        length, *positions = check_types(args, ((int,), *[(np.ndarray,)] * arrays), f"pandas {name}")
        if length < 0 or not all(p.ndim == 1 and p.dtype == np.int32 for p in positions):
            raise CorruptError(f"a pandas {name} takes a length and 1-D int32 positions, not {shown(args, 120)}")
        cls = getattr(importlib.import_module("pandas._libs.sparse"), name)
        try:
            return context.built(cls(length, *positions))
        except (ValueError, OverflowError) as exc:
            raise CorruptError(f"pandas refuses this {name} of length {length}: {exc}") from None

    return check


def _pandas_timestamp(args: tuple[Any, ...], context: Context) -> Any:
    """``_unpickle_timestamp(value, freq, tz, reso)``."""
    check_arity(args, 3, 4, "pandas _unpickle_timestamp")
    value, freq, tz = args[:3]
    if type(value) is not int or not (tz is None or isinstance(tz, datetime.tzinfo)):
        raise CorruptError(f"a pandas Timestamp is an int and a time zone, not {shown(args)}")
    if freq is not None or (len(args) == 4 and type(args[3]) is not int):
        raise CorruptError(f"a pandas Timestamp's freq is None and its resolution an int, not {shown(args)}")
    timestamps = importlib.import_module("pandas._libs.tslibs.timestamps")
    return context.built(timestamps._unpickle_timestamp(*args))  # NaT itself, for NaT's value


def _pandas_timedelta(args: tuple[Any, ...], context: Context) -> Any:
    """``_timedelta_unpickle(value, reso)``."""
    check_types(args, ((int,), (int,)), "pandas _timedelta_unpickle")
    timedeltas = importlib.import_module("pandas._libs.tslibs.timedeltas")
    return context.built(timedeltas._timedelta_unpickle(*args))  # NaT itself, for NaT's value


def _pandas_nat(args: tuple[Any, ...], context: Context) -> Any:
    """``_nat_unpickle(None)``: pandas' NaT, the process's one instance, which a load never
    gives a state."""
    check_arity(args, 0, 1, "pandas _nat_unpickle")
    if args and args[0] is not None:
        raise CorruptError(f"pandas _nat_unpickle takes None, not {shown(args[0])}")
    return context.built(importlib.import_module("pandas").NaT)


#: Families of classes that pickle calls with arguments.
FAMILIES = (
    # pandas date offsets: (n, normalize, and a weekday, holidays, ...)
    Family("pandas._libs.tslibs.offsets.BaseOffset", _PANDAS),
    # pandas extension dtypes: StringDtype(storage, na_value)
    Family("pandas.core.dtypes.base.ExtensionDtype", _PANDAS),
)

#: The reconstructors of pandas, by import path.
RECONSTRUCTORS: dict[str, Reconstructor] = {
    # a categorical, datetime, timedelta, period or string array, its data checked against its dtype
    "pandas._libs.arrays.__pyx_unpickle_NDArrayBacked": Reconstructor(
        cython_state("pandas._libs.arrays.NDArrayBacked", "__pyx_unpickle_NDArrayBacked", _backed_state), _PANDAS
    ),
    "pandas._libs.interval.__pyx_unpickle_IntervalMixin": Reconstructor(
        cython_state("pandas._libs.interval.IntervalMixin", "__pyx_unpickle_IntervalMixin"), _PANDAS
    ),
    "pandas._libs.internals._unpickle_block": Reconstructor(_pandas_block, _PANDAS),
    "pandas.core.internals.managers.BlockManager": Reconstructor(_pandas_manager, _PANDAS),
    "pandas.core.indexes.base._new_Index": Reconstructor(_pandas_index("_new_Index"), _PANDAS),
    "pandas.core.indexes.datetimes._new_DatetimeIndex": Reconstructor(_pandas_index("_new_DatetimeIndex"), _PANDAS),
    "pandas._libs.sparse.IntIndex": Reconstructor(_sparse_index("IntIndex", 1), _PANDAS),
    "pandas._libs.sparse.BlockIndex": Reconstructor(_sparse_index("BlockIndex", 2), _PANDAS),
    "pandas._libs.tslibs.timestamps._unpickle_timestamp": Reconstructor(_pandas_timestamp, _PANDAS),
    "pandas._libs.tslibs.timedeltas._timedelta_unpickle": Reconstructor(_pandas_timedelta, _PANDAS),
    **{
        f"pandas._libs.tslibs.nattype.{name}": Reconstructor(_pandas_nat, _PANDAS)
        for name in ("_nat_unpickle", "__nat_unpickle")  # pandas 3, pandas 2
    },
}


def _masked_state(array: Any, context: Context) -> None:
    """Check a masked array's state (integer, floating and boolean arrays): a bool mask of
    its data's shape, and data of its kind; pandas indexes the mask by the data's length.

    Raises:
        CorruptError: for any other state.
    """
    arrays = importlib.import_module("pandas").arrays
    data, mask = getattr(array, "_data", None), getattr(array, "_mask", None)
    kinds = next(
        (
            kinds
            for cls, kinds in ((arrays.IntegerArray, "iu"), (arrays.FloatingArray, "f"), (arrays.BooleanArray, "b"))
            if isinstance(array, cls)
        ),
        None,
    )
    if not (
        isinstance(data, np.ndarray)
        and isinstance(mask, np.ndarray)
        and mask.dtype == np.bool_
        and mask.shape == data.shape
        and (kinds is None or data.dtype.kind in kinds)
    ):
        raise CorruptError(f"a pandas {type(array).__name__} needs data of its kind and a bool mask of its shape")


def _interval_state(array: Any, context: Context) -> None:
    """Check an IntervalArray's state, which pandas sets unchecked: left and right bounds of
    one kind, one length and its dtype's subtype (pandas reads both at the same positions).

    Raises:
        CorruptError: for any other state.
    """
    api = importlib.import_module("pandas.api.extensions")
    left: Any = getattr(array, "_left", None)
    right: Any = getattr(array, "_right", None)
    subtype = getattr(getattr(array, "_dtype", None), "subtype", None)
    if not (
        type(left) is type(right)
        and isinstance(left, (np.ndarray, api.ExtensionArray))
        and left.ndim == right.ndim == 1
        and len(left) == len(right)
        and left.dtype == right.dtype == subtype
    ):
        raise CorruptError("a pandas IntervalArray needs left and right bounds of one length and of its subtype")


#: Checks of a state that ``BUILD`` set, by the import path of the class.
STATE_CHECKS: dict[str, Callable[[Any, Context], None]] = {
    "pandas._libs.arrays.NDArrayBacked": _backed_state,
    "pandas.core.arrays.masked.BaseMaskedArray": _masked_state,
    "pandas.arrays.IntervalArray": _interval_state,  # pandas 3
    "pandas.core.arrays.interval.IntervalArray": _interval_state,  # pandas 2
}


def _placement_length(placement: Any) -> int:
    """The number of positions a block's placement names, without building them: a slice of
    ints (any length in a few bytes), an array of ints, or a BlockPlacement.

    Raises:
        CorruptError: for anything else.
    """
    internals = importlib.import_module("pandas._libs.internals")
    if isinstance(placement, slice):
        parts = (placement.start or 0, placement.stop, 1 if placement.step is None else placement.step)
        if all(type(part) is int for part in parts) and parts[0] >= 0 and parts[2] > 0:
            return len(range(*parts))
    elif (isinstance(placement, np.ndarray) and placement.ndim == 1 and placement.dtype.kind in "iu") or isinstance(
        placement, internals.BlockPlacement
    ):
        return len(placement)
    raise CorruptError(f"a pandas block's placement must be a slice or an array of positions, not {shown(placement)}")


def _manager_state(manager: Any, state: Any) -> None:
    """Check the state that pandas' managers pickle (format "0.14.1": axes, and blocks of
    values and placements) before pandas sets it: its axes and blocks must agree in size,
    which pandas does not check (a Series of a million labels on one value reads outside
    memory), and a placement is built only once its size is known to fit.

    Raises:
        CorruptError: for any other state.
    """
    pandas = importlib.import_module("pandas")
    try:
        axes, blocks = state[3]["0.14.1"]["axes"], state[3]["0.14.1"]["blocks"]
    except (TypeError, KeyError, IndexError):
        raise CorruptError("a pandas block manager's state must be the one pandas writes (format 0.14.1)") from None
    if not (
        type(axes) is list
        and len(axes) in (1, 2)
        and all(isinstance(axis, pandas.Index) for axis in axes)
        and type(blocks) is list
        and all(type(block) is dict and {"values", "mgr_locs"} <= block.keys() for block in blocks)
    ):
        raise CorruptError("a pandas block manager's state holds one or two indexes and blocks of values")
    rows = len(axes[-1])
    items = 0
    for block in blocks:
        values, length = block["values"], _placement_length(block["mgr_locs"])
        if not isinstance(values, (np.ndarray, pandas.api.extensions.ExtensionArray)):
            raise CorruptError(f"a pandas block's values must be an array, not a {type(values).__name__}")
        one_column = len(axes) == 1 or values.ndim == 1
        shape = (rows,) if len(axes) == 1 else (rows,) if one_column else (length, rows)
        if values.shape != shape or (len(axes) == 2 and one_column and length != 1):
            raise CorruptError(f"a pandas block of shape {values.shape} does not fit its {rows} rows")
        items += length
    if len(axes) == 2 and items != len(axes[0]):
        raise CorruptError(f"a pandas block manager's blocks must place each of its {len(axes[0])} columns once")
    if len(axes) == 1 and len(blocks) != 1:
        raise CorruptError("a pandas Series' manager holds one block")


def _sparse_state(array: Any, state: Any) -> None:
    """Check a sparse array's state before pandas sets it: a dict (its older tuple state
    would be given to numpy's own ``ndarray.__setstate__``, which trusts it) of an index
    built by its reconstructor, one value for each position it holds, and a sparse dtype of
    the values' dtype: pandas reads them together unchecked.

    Raises:
        CorruptError: for any other state.
    """
    if type(state) is not dict:
        raise CorruptError(f"a pandas SparseArray's state is a dict in safe mode, not a {type(state).__name__}")
    pandas = importlib.import_module("pandas")
    sparse = importlib.import_module("pandas._libs.sparse")
    index, values, dtype = (state.get(key) for key in ("_sparse_index", "_sparse_values", "_dtype"))
    if not (
        isinstance(index, (sparse.IntIndex, sparse.BlockIndex))
        and isinstance(values, np.ndarray)
        and values.ndim == 1
        and len(values) == index.npoints
        and isinstance(dtype, pandas.SparseDtype)
        and dtype.subtype == values.dtype
    ):
        raise CorruptError("a pandas SparseArray needs a sparse index, one value per position it holds, of its dtype")


def _index_state(index: Any, state: Any) -> None:
    """pandas writes indexes with ``_new_Index``, never as a state to set: refuse one (its
    levels, codes or data would bypass that function's checks)."""
    raise CorruptError(f"safe mode builds a pandas {type(index).__name__} with _new_Index, not from a state")


#: Checks of a state before ``BUILD`` sets it, by the import path of the class (or a base):
#: for states that pandas trusts and acts on as it sets them.
STATE_GUARDS: dict[str, Callable[[Any, Any], None]] = {
    "pandas.core.internals.managers.BaseBlockManager": _manager_state,
    **{f"{module}.Index": _index_state for module in ("pandas", "pandas.core.indexes.base")},  # pandas 3, 2
    **{f"{module}.SparseArray": _sparse_state for module in ("pandas.arrays", "pandas.core.arrays.sparse.array")},
}
