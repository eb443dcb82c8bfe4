"""The vetted reconstructors of scikit-learn (decision trees, neighbours' binary trees, distance
metrics) and the check of a tree's nodes, which sklearn's ``__setstate__`` does not make."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import numpy as np

from ...errors import CorruptError
from ..shown import shown
from .checks import Check, Context, Reconstructor, check_types

__all__ = ["RECONSTRUCTORS", "STATE_CHECKS", "STATE_GUARDS"]

#: The package pattern a caller allows for these to be called.
_SKLEARN = "sklearn"


def _sklearn_tree(args: tuple[Any, ...], context: Context) -> Any:
    """``Tree(n_features, n_classes, n_outputs)``: its state comes with ``BUILD``, which
    sklearn checks (node dtype and count)."""
    n_features, n_classes, n_outputs = check_types(args, ((int,), (np.ndarray,), (int,)), "sklearn Tree")
    if n_classes.dtype.kind not in "iu" or n_classes.ndim != 1 or len(n_classes) != n_outputs or n_features < 0:
        raise CorruptError(f"a sklearn Tree takes a count of features, classes and outputs, not {shown(args, 120)}")
    return importlib.import_module("sklearn.tree._tree").Tree(n_features, n_classes, n_outputs)


def _sklearn_new(module: str, base: str) -> Check:
    """sklearn's Cython ``newObj(cls)``: ``cls.__new__(cls)`` for an admitted subclass of
    ``base`` (a binary tree, a distance metric)."""

    def check(args: tuple[Any, ...], context: Context) -> Any:
        (cls,) = check_types(args, ((type,),), f"{module}.newObj")
        context.subclass(cls, getattr(importlib.import_module(module), base), f"{module}.newObj")
        return cls.__new__(cls)

    return check


def _tree_state(tree: Any, context: Context) -> None:
    """Check a sklearn Tree's nodes: children are nodes of the tree (or -1, a leaf) and
    features are features it has (or -2): sklearn's ``__setstate__`` checks neither, and
    prediction follows them through memory."""
    state = tree.__getstate__()
    nodes, count = state["nodes"], state["node_count"]
    for side in ("left_child", "right_child"):
        if len(nodes) and not ((nodes[side] >= -1) & (nodes[side] < count)).all():
            raise CorruptError(f"a sklearn Tree's {side} must name nodes of the tree")
    if len(nodes) and not ((nodes["feature"] >= -2) & (nodes["feature"] < tree.n_features)).all():
        raise CorruptError("a sklearn Tree's nodes must split on features it has")


def _binary_tree_state(tree: Any, context: Context) -> None:
    """Check a KDTree's or BallTree's arrays: its indices name rows of its data, its nodes
    ranges of its indices, its bounds cover its nodes, and its metric's weights or matrix
    are for as many features as its data has: sklearn's ``__setstate__`` checks none, and a
    query follows them through memory."""
    state = tree.__getstate__()
    data, indices, nodes, bounds, _, levels = state[:6]
    rows = len(data)
    if len(indices) != rows or (rows and not ((indices >= 0) & (indices < rows)).all()):
        raise CorruptError(f"a sklearn binary tree's indices must name the {rows} rows of its data")
    starts, ends = nodes["idx_start"], nodes["idx_end"]
    if len(nodes) and not ((starts >= 0) & (starts <= ends) & (ends <= rows)).all():
        raise CorruptError("a sklearn binary tree's nodes must hold ranges of its indices")
    if len(nodes) != 2**levels - 1 or bounds.shape[1:2] != (len(nodes),):
        raise CorruptError("a sklearn binary tree's levels, nodes and bounds must agree")
    metric = state[11]
    _, vec, mat = metric.__getstate__()[:3]
    features = data.shape[1] if data.ndim == 2 else -1
    # the tree's queries give its metric as many features as its data has, unchecked
    if "Mahalanobis" in type(metric).__name__ and mat.shape != (features, features):
        raise CorruptError(f"a Mahalanobis metric of a tree of {features} features has a matrix of shape {mat.shape}")
    weights = {"SEuclidean": (features,), "Minkowski": (0, features)}  # Minkowski: 0 unweighted
    sizes = next((sizes for kind, sizes in weights.items() if type(metric).__name__.startswith(kind)), None)
    if sizes is not None and len(vec) not in sizes:
        raise CorruptError(f"the weights of a tree's metric are {len(vec)}, its data has {features} features")


def _predictor_state(predictor: Any, context: Context) -> None:
    """Check a HistGradientBoosting tree's nodes (`_tree_splits`)."""
    _tree_splits(predictor)


def _tree_splits(predictor: Any) -> np.ndarray:
    """Check a HistGradientBoosting tree's nodes: a split's children are nodes of the tree
    and its categorical bitset one the tree has (prediction follows both through memory).
    Return its split nodes.

    Raises:
        CorruptError: for nodes or bitsets of another form, or that point outside the tree.
    """
    nodes, bitsets = getattr(predictor, "nodes", None), getattr(predictor, "raw_left_cat_bitsets", None)
    fields = ("left", "right", "feature_idx", "is_leaf", "is_categorical", "bitset_idx")
    if not (
        isinstance(nodes, np.ndarray)
        and nodes.ndim == 1
        and nodes.dtype.names is not None
        and set(fields) <= set(nodes.dtype.names)
        and isinstance(bitsets, np.ndarray)
    ):
        raise CorruptError("a sklearn TreePredictor needs an array of nodes and of categorical bitsets")
    splits = nodes[nodes["is_leaf"] == 0]
    for side in ("left", "right"):
        if not ((splits[side] >= 0) & (splits[side] < len(nodes))).all():
            raise CorruptError(f"a sklearn TreePredictor's {side} children must be nodes of the tree")
    categorical = splits[splits["is_categorical"] != 0]
    if not ((categorical["bitset_idx"] >= 0) & (categorical["bitset_idx"] < len(bitsets))).all():
        raise CorruptError("a sklearn TreePredictor's categorical splits must name bitsets it has")
    return splits


def _boosting_state(model: Any, context: Context) -> None:
    """Check that a HistGradientBoosting model's trees split on features it has (prediction
    reads a row's value at each split's feature)."""
    features = getattr(model, "n_features_in_", None)
    for predictor in (p for trees in getattr(model, "_predictors", ()) for p in trees):
        splits = _tree_splits(predictor)
        if type(features) is not int or not ((splits["feature_idx"] >= 0) & (splits["feature_idx"] < features)).all():
            raise CorruptError("a sklearn HistGradientBoosting model's trees must split on features it has")


def _libsvm_state(model: Any, context: Context) -> None:
    """Check that a libsvm model's support vectors name rows it was fitted on and agree with
    its coefficients (libsvm indexes with them, unchecked, in predict)."""
    support, shape, counts = (getattr(model, name, None) for name in ("support_", "shape_fit_", "_n_support"))
    if support is None:  # not fitted
        return
    if not (
        isinstance(support, np.ndarray)
        and support.ndim == 1
        and support.dtype.kind in "iu"
        and type(shape) is tuple
        and shape
        and type(shape[0]) is int
        and isinstance(counts, np.ndarray)
        and int(counts.sum()) == len(support)
        and (not len(support) or (support.min() >= 0 and support.max() < shape[0]))
    ):
        raise CorruptError("a sklearn libsvm model's support vectors must be rows it was fitted on")


def _metric_state(metric: Any, state: Any) -> None:
    """Check a distance metric's state before its ``__setstate__`` takes it, unchecked: its
    parameter, a vector and a matrix; a Mahalanobis metric's matrix is square (sklearn
    checks its size against the data it is given, and reads that many columns of it: a
    matrix of one column made distances read past it).

    Raises:
        CorruptError: for any other state.
    """
    vec, mat = state[1:3] if type(state) is tuple and len(state) >= 3 else (None, None)
    if not (isinstance(vec, np.ndarray) and vec.ndim == 1 and isinstance(mat, np.ndarray) and mat.ndim == 2):
        raise CorruptError("a sklearn distance metric's state holds a vector and a matrix")
    if "Mahalanobis" in type(metric).__name__ and mat.shape[0] != mat.shape[1]:
        raise CorruptError(f"a Mahalanobis metric's matrix is square, not of shape {mat.shape}")


#: Checks of a state before ``BUILD`` sets it, by the import path of the class (or a base):
#: for states that sklearn's compiled ``__setstate__`` takes unchecked.
STATE_GUARDS: dict[str, Callable[[Any, Any], None]] = {
    "sklearn.metrics._dist_metrics.DistanceMetric": _metric_state,
}

#: Checks of a sklearn object's state after ``BUILD`` set it, by the import path of its class.
STATE_CHECKS: dict[str, Callable[[Any, Context], None]] = {
    "sklearn.tree._tree.Tree": _tree_state,
    **{f"sklearn.neighbors.{module}.BinaryTree64": _binary_tree_state for module in ("_kd_tree", "_ball_tree")},
    "sklearn.ensemble._hist_gradient_boosting.predictor.TreePredictor": _predictor_state,
    "sklearn.ensemble._hist_gradient_boosting.gradient_boosting.BaseHistGradientBoosting": _boosting_state,
    "sklearn.svm._base.BaseLibSVM": _libsvm_state,
}

#: The reconstructors of scikit-learn, by import path.
RECONSTRUCTORS: dict[str, Reconstructor] = {
    "sklearn.tree._tree.Tree": Reconstructor(_sklearn_tree, _SKLEARN),
    "sklearn.neighbors._kd_tree.newObj": Reconstructor(
        _sklearn_new("sklearn.neighbors._kd_tree", "BinaryTree64"), _SKLEARN
    ),
    "sklearn.neighbors._ball_tree.newObj": Reconstructor(
        _sklearn_new("sklearn.neighbors._ball_tree", "BinaryTree64"), _SKLEARN
    ),
    "sklearn.metrics._dist_metrics.newObj": Reconstructor(
        _sklearn_new("sklearn.metrics._dist_metrics", "DistanceMetric"), _SKLEARN
    ),
}
