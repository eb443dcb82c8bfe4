"""Gadgets an outside audit found under the restricted-loading model, each refused: classes
whose __setstate__ runs code or reaches the network, objects a module holds (changed through
BUILD or SETITEM), arguments to __new__, states numpy and sklearn check by type only, sizes
and exponents that cost unbounded work, other names of vetted reconstructors."""

from __future__ import annotations

import copyreg
import os
import pickle
import struct

import numpy as np
import pytest

import blpickle

PROTO = b"\x80\x04"


def _str(text: str) -> bytes:
    data = text.encode()
    return b"\x8c" + bytes([len(data)]) + data if len(data) < 256 else b"X" + struct.pack("<I", len(data)) + data


def _global(module: str, name: str) -> bytes:
    return _str(module) + _str(name) + b"\x93"


def _body(obj: object) -> bytes:
    """The opcodes that push ``obj`` (a protocol 4 pickle without PROTO, FRAME and STOP)."""
    data = pickle.dumps(obj, 4)
    return data[11:-1] if data[2:3] == b"\x95" else data[2:-1]


def test_a_class_whose_setstate_runs_code_is_refused(tmp_path):
    pytest.importorskip("scipy")
    marker = tmp_path / "ran"
    state = b"}(" + _str("_parse_arg_template") + _str(f"open({str(marker)!r}, 'w')") + b"u"
    data = PROTO + _global("scipy.stats._continuous_distns", "norm_gen") + b")\x81" + state + b"b."
    with pytest.raises(blpickle.UnsafeLoadError, match="runs code from its state"):
        blpickle.loads(data, allowed=["scipy.*"])
    assert not marker.exists()


def test_a_class_whose_setstate_connects_out_is_refused():
    pytest.importorskip("sklearn.callback._scoring_monitor")
    data = PROTO + _global("sklearn.callback._scoring_monitor", "ScoringMonitor") + b")\x81}b."
    with pytest.raises(blpickle.UnsafeLoadError, match="connects to an address"):
        blpickle.loads(data, allowed=["sklearn.*"])


def test_objects_a_module_holds_are_never_changed():
    pd = pytest.importorskip("pandas")
    backend = pd.get_option("plotting.backend")
    options = PROTO + _global("pandas", "options.plotting") + b"N}" + _str("backend") + _str("this") + b"s\x86b."
    with pytest.raises(blpickle.LoadError):
        blpickle.loads(options, allowed=["pandas.*"])
    assert pd.get_option("plotting.backend") == backend
    state = np.random.MT19937(0).state
    rand = PROTO + _global("numpy.random.mtrand", "_rand") + _body({**state, "has_gauss": 0, "gauss": 0.0}) + b"b."
    before = np.random.get_state(legacy=False)
    with pytest.raises(blpickle.CorruptError, match="which a module holds"):
        blpickle.loads(rand, safe=True)
    kinds = PROTO + _global("numpy.random._pickle", "BitGenerators") + _str("MT19937")
    kinds += _global("numpy.random._pcg64", "PCG64") + b"s."
    with pytest.raises(blpickle.CorruptError, match="which a module holds"):
        blpickle.loads(kinds, safe=True)
    after = np.random.get_state(legacy=False)
    assert after["state"]["pos"] == before["state"]["pos"]
    assert np.random._pickle.BitGenerators["MT19937"] is np.random.MT19937


def test_a_pattern_passes_no_arguments_to_new():
    pytest.importorskip("pandas")
    huge = (
        PROTO + _global("pandas", "Index") + _global("builtins", "range") + b"J\x00\x00\x00\x00J\x00\xa3\xe1\x11\x86R"
    )
    huge += _str("float64") + b"\x86\x81."
    with pytest.raises(blpickle.UnsafeLoadError, match="with arguments to its __new__"):
        blpickle.loads(huge, allowed=["pandas.*"])


def test_other_names_of_a_vetted_reconstructor_are_checked_as_it_is():
    pytest.importorskip("sklearn")
    alias = PROTO + _global("sklearn.tree._classes", "Tree") + _body((1, np.array([2]), 10**7)) + b"\x81."
    with pytest.raises(blpickle.CorruptError, match="sklearn Tree"):
        blpickle.loads(alias, allowed=["sklearn.*"])


class _Forged:
    """Pickles as ``function(*args)`` with ``state`` (a random state numpy may refuse to set)."""

    def __init__(self, function, args, state=None):
        self.function, self.args, self.state = function, args, state

    def __reduce__(self):
        return self.function, self.args, self.state


@pytest.mark.parametrize("kind", ["MT19937", "Philox"])
def test_random_states_out_of_range_are_refused(kind):
    ctor = getattr(np.random._pickle, "__bit_generator_ctor")
    state = getattr(np.random, kind)(0).state
    if kind == "MT19937":
        state["state"]["pos"] = 2**31 - 1
    else:
        state["buffer_pos"] = -(2**31)
    bits = _Forged(ctor, (kind,), (state, None))
    objects = [_Forged(getattr(np.random._pickle, "__generator_ctor"), (bits,))]
    if kind == "MT19937":
        objects.append(_Forged(getattr(np.random._pickle, "__randomstate_ctor"), (bits,)))
        # a Generator as numpy 1.x pickles it: its bit generator's name, then that one's state
        objects.append(_Forged(getattr(np.random._pickle, "__generator_ctor"), (kind,), state))
    for obj in objects:
        # numpy 2.5 checks the position itself; earlier versions crash on the next draw
        with pytest.raises(blpickle.CorruptError, match=r"position|buffer_pos"):
            blpickle.loads(pickle.dumps(obj, 4), safe=True)


class _Block:
    def __init__(self, places):
        self.places = places

    def __reduce__(self):
        from pandas._libs.internals import _unpickle_block

        return _unpickle_block, (np.zeros((2, 3)), np.array(self.places, dtype=np.intp), 2)


class _Manager:
    def __init__(self, places):
        self.places = places

    def __reduce__(self):
        import pandas as pd
        from pandas.core.internals.managers import BlockManager

        return BlockManager, ((_Block(self.places),), [pd.Index(["a", "b"]), pd.RangeIndex(3)])


@pytest.mark.parametrize("places", [[0, 10**12], [0, -5], [1, 1]])
def test_pandas_blocks_must_place_each_column_once(places):
    pytest.importorskip("pandas")
    with pytest.raises(blpickle.CorruptError, match="place each of its 2 columns once"):
        blpickle.loads(pickle.dumps(_Manager(places), 4), allowed=["pandas.*"])
    assert blpickle.loads(pickle.dumps(_Manager([1, 0]), 4), allowed=["pandas.*"]).shape == (2, 3)


def test_sklearn_tree_nodes_must_lie_in_the_tree():
    pytest.importorskip("sklearn")
    from sklearn.tree import DecisionTreeRegressor
    from sklearn.tree._tree import Tree

    points = np.random.default_rng(0).random((50, 2))
    tree = DecisionTreeRegressor(max_depth=2).fit(points, points[:, 0]).tree_
    state = tree.__getstate__()
    nodes = state["nodes"].copy()
    nodes["left_child"][0] = 10**9
    state["nodes"] = nodes

    class Forged:
        def __reduce__(self):
            return Tree, (tree.n_features, np.array(tree.n_classes, dtype=np.intp), tree.n_outputs), state

    with pytest.raises(blpickle.CorruptError, match="left_child"):
        blpickle.loads(pickle.dumps(Forged(), 4), allowed=["sklearn.*"])


def test_sizes_and_exponents_that_cost_unbounded_work_are_refused():
    scalar = _global("numpy._core.multiarray", "scalar") + _body(np.dtype("i8")) + _body(struct.pack("<q", 6 << 30))
    array = PROTO + _global("builtins", "bytearray") + scalar + b"\x86R\x85R."
    with pytest.raises(blpickle.CorruptError, match="bytearray"):
        blpickle.loads(array, safe=True)
    fraction = PROTO + _global("fractions", "Fraction") + _str("1e1000000000") + b"\x85R."
    with pytest.raises(blpickle.CorruptError, match="Fraction"):
        blpickle.loads(fraction, safe=True)
    assert not os.path.exists("blpickle-pwned")


class _Made:
    """Pickles as ``cls.__new__(cls)`` (``NEWOBJ``) given ``state`` (``BUILD``)."""

    def __init__(self, cls, state):
        self.cls, self.state = cls, state

    @property  # type: ignore[misc]
    def __class__(self):  # pickle checks that NEWOBJ's class is the object's
        return self.cls

    def __reduce_ex__(self, protocol):
        return copyreg.__newobj__, (self.cls,), self.state


def test_a_state_sets_no_dunder_attribute_of_a_class_admitted_as_data():
    pytest.importorskip("sklearn")
    from sklearn.preprocessing import StandardScaler

    for state in ({"__name__": "fromfile"}, {"with_mean": True, "__class__": StandardScaler}, (None, {"__dict__": {}})):
        with pytest.raises(blpickle.CorruptError, match="no dunder attribute"):
            blpickle.loads(pickle.dumps(_Made(StandardScaler, state), 4), allowed=["sklearn.*"])
    state = StandardScaler(with_mean=False).__getstate__()
    assert blpickle.loads(pickle.dumps(_Made(StandardScaler, state), 4), allowed=["sklearn.*"]).with_mean is False


def test_an_xarray_array_that_calls_what_its_state_holds_is_refused():
    # .values of this Variable called numpy.fromfile("/etc/passwd"): xarray's _unary_ufunc calls
    # the numpy function its __name__ names, over a path that builtins.str made of an array
    xr = pytest.importorskip("xarray")
    from xarray.coding.common import _ElementwiseFunctionArray
    from xarray.core.indexing import NumpyIndexingAdapter
    from xarray.ufuncs import _unary_ufunc

    path = _Made(NumpyIndexingAdapter, (None, {"array": np.array("/etc/passwd")}))
    path = _Made(_ElementwiseFunctionArray, {"array": path, "func": str, "_dtype": np.dtype("U1")})
    read = _Made(_ElementwiseFunctionArray, {"array": path, "func": _Made(_unary_ufunc, {"__name__": "fromfile"})})
    variable = _Made(xr.Variable, (None, {"_dims": ("x",), "_data": read, "_attrs": None, "_encoding": None}))
    for data in (pickle.dumps(variable, 4), blpickle.dumps(variable)):
        with pytest.raises(blpickle.UnsafeLoadError, match="_ElementwiseFunctionArray") as refusal:
            blpickle.loads(data, allowed=["xarray.*", "pandas.*"])
        assert "xarray.ufuncs._unary_ufunc" in refusal.value.refused


def test_a_class_is_denied_where_its_code_is():
    pytest.importorskip("pandas")
    # pandas 3 names ExcelWriter's module "pandas": its code is in the denied pandas.io
    with pytest.raises(blpickle.UnsafeLoadError, match=r"pandas\.io\.excel"):
        blpickle.loads(PROTO + _global("pandas", "ExcelWriter") + b".", allowed=["pandas.*"])


def _rows(*rows: list) -> np.ndarray:
    """A LIL matrix's rows: an object array of lists."""
    array = np.empty(len(rows), dtype=object)
    array[:] = rows
    return array


def test_scipy_sparse_indices_must_lie_in_the_shape():
    sparse = pytest.importorskip("scipy.sparse")
    dense = np.array([[0, 1.5, 0, 0], [2, 0, 0, 3], [0, 0, 0, 0], [0, 4, 0, 5]])
    changes = {
        "csr": lambda m: {"indices": np.where(m.indices == 3, 10**8, m.indices)},  # toarray wrote past its output
        "csc": lambda m: {"indptr": m.indptr[::-1].copy()},
        "coo": lambda m: {"coords": (m.coords[0], m.coords[1] + 4)},
        "dia": lambda m: {"offsets": np.append(m.offsets, 3)},  # one more diagonal than rows of data
        "bsr": lambda m: {"indices": m.indices + 2},
        "lil": lambda m: {"rows": _rows([1], [0, 3], [], [1, 9])},
    }
    csr = sparse.csr_matrix(dense)
    for kind, change in changes.items():
        matrix = csr.tobsr(blocksize=(2, 2)) if kind == "bsr" else csr.asformat(kind)
        assert blpickle.loads(pickle.dumps(matrix, 4), allowed=["scipy.*"]).format == kind
        forged = _Made(type(matrix), {**vars(matrix), **change(matrix)})
        with pytest.raises(blpickle.CorruptError, match=f"scipy {type(matrix).__name__}"):
            blpickle.loads(pickle.dumps(forged, 4), allowed=["scipy.*"])


def test_a_pandas_sparse_array_holds_one_value_per_position_of_its_index():
    pd = pytest.importorskip("pandas")
    from pandas._libs.sparse import IntIndex

    genuine = pd.arrays.SparseArray([0.0, 1.5, 0.0, 2.0])
    state = dict(vars(genuine))
    for change in ({"_sparse_index": IntIndex(4, np.array([1], dtype=np.int32))}, {"_sparse_values": np.ones(9)}):
        with pytest.raises(blpickle.CorruptError, match="one value per position"):
            blpickle.loads(pickle.dumps(_Made(type(genuine), {**state, **change}), 4), allowed=["pandas.*"])
    back = blpickle.loads(pickle.dumps(_Made(type(genuine), state), 4), allowed=["pandas.*"])
    pd.testing.assert_extension_array_equal(back, genuine)


def test_a_mapping_in_a_state_is_a_dict():
    # a slot state that is another mapping hid "__class__" from the check, and swapped the
    # class of a checked object for a CSR matrix whose index then went unchecked
    sparse = pytest.importorskip("scipy.sparse")
    from scipy._lib._docscrape import NumpyDocString
    from scipy.sparse._base import _spbase

    hidden = _Made(NumpyDocString, {"_parsed_data": {"__class__": sparse.csr_array}})
    state = {**vars(sparse.csr_array(np.eye(4))), "indices": np.array([0, 1, 2, 10**8], dtype=np.int32)}
    with pytest.raises(blpickle.CorruptError, match="NumpyDocString where pickle writes a dict"):
        blpickle.loads(pickle.dumps(_Made(_spbase, (state, hidden)), 4), allowed=["scipy.*"])


def test_scipy_lists_and_dicts_are_copied_as_they_are_checked():
    sparse = pytest.importorskip("scipy.sparse")
    import pickletools

    matrix = sparse.lil_array(np.eye(4))
    data = pickle.dumps((matrix, matrix.rows[0]), 2)
    # after the matrix's state is checked, fill its first row again: APPEND of a column 10**8
    at = max(pos for op, _, pos in pickletools.genops(data) if op.name == "BINGET")
    at += 2
    data = data[:at] + b"J" + (10**8).to_bytes(4, "little") + b"a" + data[at:]
    loaded, row = blpickle.loads(data, allowed=["scipy.*"])
    assert row == [0, 10**8] and loaded.rows[0] == [0]
    np.testing.assert_array_equal(loaded.toarray(), np.eye(4))
    keys = sparse.dok_array(np.eye(4))
    forged = _Made(type(keys), {**vars(keys), "_dict": {(0, 10**8): 1.0}})
    with pytest.raises(blpickle.CorruptError, match="keys must be tuples of indices within its shape"):
        blpickle.loads(pickle.dumps(forged, 4), allowed=["scipy.*"])


def test_scipy_classes_whose_compiled_code_trusts_their_state_need_their_exact_name():
    pytest.importorskip("scipy")
    from scipy.spatial import Delaunay, cKDTree

    points = np.random.default_rng(0).random((20, 2))
    for obj, name in ((cKDTree(points), "scipy.spatial._ckdtree.cKDTree"), (Delaunay(points), None)):
        with pytest.raises(blpickle.UnsafeLoadError, match="unchecked: a package pattern does not admit it"):
            blpickle.loads(pickle.dumps(obj, 4), allowed=["scipy.*"])
        if name is not None:
            assert blpickle.loads(pickle.dumps(obj, 4), allowed=["scipy.*", name]).query(points[0])[0] == 0


def test_a_tree_metric_reads_as_many_features_as_its_data_has():
    pytest.importorskip("sklearn")
    from sklearn.neighbors import BallTree

    points = np.random.default_rng(0).random((20, 3))
    for params in ({"metric": "mahalanobis", "VI": np.eye(3)}, {"metric": "seuclidean", "V": np.ones(3)}):
        tree = BallTree(points, **params)
        back = blpickle.loads(pickle.dumps(tree, 4), allowed=["sklearn.*"])
        np.testing.assert_array_equal(back.query(points[:2])[1], tree.query(points[:2])[1])
        state = list(tree.__getstate__())
        metric = state[11].__reduce__()
        wrong = list(metric[2])
        if params["metric"] == "mahalanobis":
            wrong[2] = np.ones((3, 1))  # distances read 3 columns of one: past the matrix
            with pytest.raises(blpickle.CorruptError, match="matrix is square"):
                blpickle.loads(pickle.dumps(_Forged(*metric[:2], tuple(wrong)), 4), allowed=["sklearn.*"])
            wrong[2] = np.eye(2)
        else:
            wrong[1] = np.ones(1)
        state[11] = _Forged(*metric[:2], tuple(wrong))
        with pytest.raises(blpickle.CorruptError, match="features"):
            blpickle.loads(pickle.dumps(_Forged(*tree.__reduce__()[:2], tuple(state)), 4), allowed=["sklearn.*"])


def test_a_kernel_density_has_one_weight_per_point():
    stats = pytest.importorskip("scipy.stats")
    points = np.random.default_rng(0).random((2, 50))
    kde = stats.gaussian_kde(points)
    back = blpickle.loads(pickle.dumps(kde, 4), allowed=["scipy.*"])
    np.testing.assert_allclose(back(points[:, :3]), kde(points[:, :3]))
    forged = _Made(type(kde), {**vars(kde), "_weights": np.ones(1)})  # the kernel read 49 weights past it
    with pytest.raises(blpickle.CorruptError, match="one weight for each of its 50 points"):
        blpickle.loads(pickle.dumps(forged, 4), allowed=["scipy.*"])


def test_scipy_splines_and_highs_objects_need_their_exact_name():
    interpolate = pytest.importorskip("scipy.interpolate")
    x = np.linspace(0, 1, 20)
    spline = interpolate.UnivariateSpline(x, x**2)  # a degree of 20 in its state wrote past a Fortran array
    with pytest.raises(blpickle.UnsafeLoadError, match="trust the knots and degree"):
        blpickle.loads(pickle.dumps(spline, 4), allowed=["scipy.*"])
    exact = blpickle.loads(pickle.dumps(spline, 4), allowed=["scipy.*", type(spline)])
    np.testing.assert_allclose(exact(x), spline(x))
    from scipy.optimize._highspy._core import HighsLp  # made without its constructor: a crash on use

    with pytest.raises(blpickle.UnsafeLoadError, match="only once their constructor ran"):
        blpickle.loads(PROTO + _global(HighsLp.__module__, "HighsLp") + b")\x81.", allowed=["scipy.*"])
