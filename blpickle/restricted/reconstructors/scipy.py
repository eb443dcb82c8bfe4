"""The checks of scipy's sparse matrices and arrays, and of ``gaussian_kde``: pickle sets
their arrays as a plain state, and scipy's compiled routines (``toarray``, products, sums,
the kernel's sum) follow them without bounds checks, so a column index past the shape read
and wrote outside memory. Each sparse format is checked as scipy's own full check does it
(indices within the shape, pointers ascending from 0, one value per index), after ``BUILD``
sets the state.
(Other scipy classes whose compiled code trusts their state are not admitted by a pattern:
`blpickle.restricted.policy.UNCHECKED`.)"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ...errors import CorruptError
from ..shown import shown
from .checks import Context

__all__ = ["STATE_CHECKS"]


def _compressed(matrix: Any, context: Context) -> None:
    """CSR, CSC and BSR: integer ``indices`` and ``indptr``, then scipy's full check (BSR's
    also needs its shape to be whole blocks, as its constructor does)."""
    _integers(matrix.indices, matrix.indptr)
    if matrix.format == "bsr":
        rows, columns = matrix.shape
        block_rows, block_columns = matrix.data.shape[1:] if matrix.data.ndim == 3 else (0, 0)
        if not block_rows or not block_columns or rows % block_rows or columns % block_columns:
            raise ValueError(f"blocks of data shape {matrix.data.shape} do not tile shape {matrix.shape}")
    matrix.check_format(full_check=True)


def _coordinates(matrix: Any, context: Context) -> None:
    """COO: one integer index array per dimension (``coords``; ``row`` and ``col`` before
    scipy 1.13), each within it (scipy's check)."""
    coords = getattr(matrix, "coords", None)
    _integers(*((matrix.row, matrix.col) if coords is None else coords))
    matrix._check()


def _diagonals(matrix: Any, context: Context) -> None:
    """DIA: one row of data per diagonal (scipy's products read ``len(offsets)`` rows),
    each diagonal within the shape."""
    data, offsets = matrix.data, matrix.offsets
    _integers(offsets)
    rows, columns = matrix.shape
    if not isinstance(data, np.ndarray) or data.ndim != 2 or offsets.ndim != 1 or len(offsets) != len(data):
        raise ValueError("data must be 2-D, with one row for each diagonal offset")
    if len(offsets) and not (offsets.min() > -rows and offsets.max() < columns):
        raise ValueError(f"diagonal offsets must lie within the shape {matrix.shape}")


def _lists(matrix: Any, context: Context) -> None:
    """LIL: for each row a list of ascending column indices within the shape, and a list of
    as many values (scipy's conversions copy them unchecked). Each pair is copied as it is
    checked, the copies counted against the load's budget: the pickle could fill a list it
    names again after this check (``APPEND``), or name one list for every row."""
    rows, columns = matrix.shape
    for what, array in (("rows", matrix.rows), ("data", matrix.data)):
        if not isinstance(array, np.ndarray) or array.dtype != object or array.shape != (rows,):
            raise ValueError(f"{what} must be an object array of one list for each of {rows} rows")
    for row in range(rows):
        indices, values = matrix.rows[row], matrix.data[row]
        if type(indices) is not list or type(values) is not list or len(indices) != len(values):
            raise ValueError("each row must be a list of column indices and a list of as many values")
        context.copying(16 * len(indices))
        indices, values = list(indices), list(values)
        previous = -1
        for index in indices:
            if type(index) is not int or not previous < index < columns:
                raise ValueError(f"a row's column indices must ascend from 0 to {columns - 1}")
            previous = index
        matrix.rows[row], matrix.data[row] = indices, values


def _keys(matrix: Any, context: Context) -> None:
    """DOK: each key a tuple of one index within the shape for each dimension (scipy sums
    and indexes entries unchecked); the dict is copied as it is checked (the pickle could
    fill it after this check), the copy counted against the load's budget."""
    entries, shape = matrix._dict, matrix.shape
    if type(entries) is not dict:
        raise ValueError("a DOK's entries must be a dict")
    context.copying(64 * len(entries))
    entries = dict(entries)
    for key in entries:
        within = type(key) is tuple and len(key) == len(shape)
        if not within or not all(
            isinstance(index, (int, np.integer)) and 0 <= index < size for index, size in zip(key, shape, strict=True)
        ):
            raise ValueError(f"a DOK's keys must be tuples of indices within its shape {shape}, not {shown(key)}")
    matrix._dict = entries


def _density(kde: Any, context: Context) -> None:
    """``gaussian_kde``: ``d`` rows of ``n`` points, one weight per point and ``d x d``
    covariances (its compiled kernel reads one weight per point unchecked)."""
    dataset, weights = kde.dataset, kde._weights
    if not (isinstance(dataset, np.ndarray) and dataset.ndim == 2 and dataset.shape == (kde.d, kde.n)):
        raise ValueError("its dataset must be an array of d rows of n points")
    if not (isinstance(weights, np.ndarray) and weights.shape == (kde.n,)):
        raise ValueError(f"it needs one weight for each of its {kde.n} points")
    for name in ("covariance", "cho_cov"):
        matrix = getattr(kde, name, None)
        if matrix is not None and not (isinstance(matrix, np.ndarray) and matrix.shape == (kde.d, kde.d)):
            raise ValueError(f"its {name} must be a {kde.d} x {kde.d} matrix")


def _integers(*arrays: Any) -> None:
    if not all(isinstance(array, np.ndarray) and array.dtype.kind in "iu" for array in arrays):
        raise ValueError("index arrays must be arrays of integers")


def _checked(check: Callable[[Any, Context], None], *, sparse: bool = True) -> Callable[[Any, Context], None]:
    """``check`` of a scipy object (with ``sparse``, first of a shape that is a tuple of
    sizes), its refusal a `CorruptError`."""

    def state_check(obj: Any, context: Context) -> None:
        shape = getattr(obj, "_shape", None)
        try:
            if sparse and (type(shape) is not tuple or not all(type(size) is int and size >= 0 for size in shape)):
                raise ValueError(f"its shape must be a tuple of sizes, not {shown(shape)}")
            check(obj, context)
        except (ValueError, TypeError, AttributeError, IndexError, OverflowError) as exc:
            raise CorruptError(f"a scipy {type(obj).__name__} with this state is not valid: {exc}") from None

    return state_check


#: Checks of a state that ``BUILD`` set, by the import path of the class.
STATE_CHECKS: dict[str, Callable[[Any, Context], None]] = {
    "scipy.sparse._compressed._cs_matrix": _checked(_compressed),
    "scipy.sparse._coo._coo_base": _checked(_coordinates),
    "scipy.sparse._dia._dia_base": _checked(_diagonals),
    "scipy.sparse._lil._lil_base": _checked(_lists),
    "scipy.sparse._dok._dok_base": _checked(_keys),
    "scipy.stats._kde.gaussian_kde": _checked(_density, sparse=False),
}
