"""Forged pickles of a few bytes that would make a restricted load allocate gigabytes, run for
minutes or leave objects that read outside memory when used: each is refused with a
`LoadError` before the work is done (blpickle.restricted: the budget of copies, the checks of
shapes, numbers, pandas and scikit-learn states, one state per object)."""

from __future__ import annotations

import collections
import copyreg
import io
import pickle
import struct

import numpy as np
import pytest

import blpickle

P = pickle


class Reduced:
    """Pickles as ``func(*args)``, with ``state`` for BUILD if given."""

    def __init__(self, func, args, state=None) -> None:
        self.value = (func, args) if state is None else (func, args, state)

    def __reduce__(self):
        return self.value


def _global(module: str, name: str) -> bytes:
    return (
        P.SHORT_BINUNICODE
        + bytes([len(module)])
        + module.encode()
        + P.SHORT_BINUNICODE
        + bytes([len(name)])
        + name.encode()
        + P.STACK_GLOBAL
    )


def _copies(count: int, size: int = 1 << 20) -> bytes:
    """A list of ``count`` bytearrays, each a copy of the same memoized ``size`` bytes."""
    memo = struct.Struct("<I")
    out = bytearray(b"\x80\x04" + P.EMPTY_LIST)
    out += P.BINBYTES8 + struct.pack("<Q", size) + b"\0" * size + P.LONG_BINPUT + memo.pack(0) + P.POP
    out += _global("builtins", "bytearray") + P.LONG_BINPUT + memo.pack(1) + P.POP
    one = P.LONG_BINGET + memo.pack(1) + P.LONG_BINGET + memo.pack(0) + P.TUPLE1 + P.REDUCE + P.APPEND
    return bytes(out + one * count + P.STOP)


def test_the_same_bytes_copied_again_and_again_are_refused():
    few = blpickle.loads(_copies(3), safe=True)  # a copy or two of what the pickle holds is what it means
    assert [len(copy) for copy in few] == [1 << 20] * 3
    with pytest.raises(blpickle.LimitError, match="copies over"):  # 100 MiB of copies from 1 MiB
        blpickle.loads(_copies(100), safe=True)


def test_arrays_copied_from_the_same_bytes_are_refused():
    from numpy._core.multiarray import _reconstruct

    data = b"\0" * (1 << 20)
    array = Reduced(_reconstruct, (np.ndarray, (0,), b"b"), (1, (len(data),), np.dtype("u1"), False, data))
    assert blpickle.loads(pickle.dumps([array] * 1, protocol=4), safe=True)[0].nbytes == len(data)
    # the same state object, memoized: one BUILD per element, each a copy of the read-only bytes
    many = pickle.dumps([Reduced(_reconstruct, (np.ndarray, (0,), b"b"), array.value[2]) for _ in range(100)])
    with pytest.raises(blpickle.LimitError, match="copies over"):
        blpickle.loads(many, safe=True)


def test_a_subarray_dtype_of_objects_is_refused():
    from numpy._core.multiarray import _reconstruct

    n = 10**7  # each element would be 10**7 object pointers
    dtype = Reduced(np.dtype, (f"V{8 * n}", False, True), (3, "|", (np.dtype("O"), (n,)), None, None, 8 * n, 8, 63))
    array = Reduced(_reconstruct, (np.ndarray, (0,), b"b"), (1, (1,), dtype, False, [None]))
    with pytest.raises(blpickle.CorruptError, match="subarray dtype of objects"):
        blpickle.loads(pickle.dumps(array, protocol=2), safe=True)


def test_shapes_of_huge_ints_are_refused_before_any_arithmetic():
    from numpy._core.multiarray import _reconstruct

    huge = 1 << 4000
    state = (1, (huge,) * 2000, np.dtype("u1"), False, b"")  # math.prod of these takes minutes
    with pytest.raises(blpickle.CorruptError, match="tuple of sizes"):
        blpickle.loads(pickle.dumps(Reduced(_reconstruct, (np.ndarray, (0,), b"b"), state)), safe=True)


@pytest.mark.parametrize("name", ["Decimal", "Fraction"])
def test_numbers_of_millions_of_bits_are_refused(name):
    import decimal
    import fractions

    cls = {"Decimal": decimal.Decimal, "Fraction": fractions.Fraction}[name]
    assert blpickle.loads(pickle.dumps(cls(12345)), safe=True) == 12345
    with pytest.raises(blpickle.CorruptError, match="whole numbers of at most"):
        blpickle.loads(pickle.dumps(Reduced(cls, (1 << 4_000_000,))), safe=True)  # Decimal: ~30 s


def test_a_pandas_axis_of_any_length_is_refused_before_it_is_built():
    pd = pytest.importorskip("pandas")
    from pandas.core.internals.managers import BlockManager

    manager = Reduced(BlockManager, ((), [pd.RangeIndex(10**12), pd.RangeIndex(0)]))  # 8 TB of positions
    with pytest.raises(blpickle.CorruptError, match="place each of its"):
        blpickle.loads(pickle.dumps(manager, protocol=5), allowed=["pandas.*"])


@pytest.mark.parametrize(
    "fields",
    [
        {"data": "range", "dtype": "float64"},  # a RangeIndex materialized as floats
        {"data": "range"},
        {"data": np.zeros(1000, np.uint8), "dtype": "S300000"},  # each byte made 300 KB
    ],
    ids=["astype", "range as data", "bytes dtype"],
)
def test_pandas_index_fields_are_what_pandas_writes(fields):
    pd = pytest.importorskip("pandas")
    from pandas.core.indexes.base import _new_Index

    fields = {
        key: pd.RangeIndex(10**12) if isinstance(value, str) and value == "range" else value
        for key, value in fields.items()
    }
    with pytest.raises(blpickle.CorruptError, match="_new_Index takes"):
        blpickle.loads(pickle.dumps(Reduced(_new_Index, (pd.Index, fields)), protocol=5), allowed=["pandas.*"])


def _with_data(obj, data):
    """``obj`` pickled with ``data`` in place of the numpy array in its state (whose layout
    differs between pandas versions)."""
    fn, args, state = obj.__reduce_ex__(5)[:3]
    return Reduced(fn, args, tuple(data if isinstance(part, np.ndarray) else part for part in state))


def _forged_categorical(pd, codes):
    return _with_data(pd.Categorical([10, 20]), codes)


@pytest.mark.parametrize("codes", [np.array([0, 2**40]), np.array([0, -2]), np.array([0.0, 1.0])])
def test_categorical_codes_must_name_a_category(codes):
    pd = pytest.importorskip("pandas")
    with pytest.raises(blpickle.CorruptError, match="Categorical's codes"):
        blpickle.loads(pickle.dumps(_forged_categorical(pd, codes), protocol=5), allowed=["pandas.*"])
    cat = pd.Categorical(["a", None, "b"])
    assert blpickle.loads(blpickle.dumps(cat), allowed=["pandas.*"]).equals(cat)


def test_datetime_arrays_hold_data_of_their_dtype():
    pd = pytest.importorskip("pandas")
    dates = pd.array(pd.date_range("2020-01-01", periods=3, tz="UTC"))
    forged = _with_data(dates, np.zeros(3, np.int8))
    with pytest.raises(blpickle.CorruptError, match="cannot hold data of int8"):
        blpickle.loads(pickle.dumps(forged, protocol=5), allowed=["pandas.*"])
    assert blpickle.loads(blpickle.dumps(dates), allowed=["pandas.*"]).equals(dates)
    # numpy's units that pandas does not read right: days, picoseconds (wrong dates, errors on use)
    for data in (np.zeros(3, "M8[D]"), np.zeros(3, "M8[ps]")):
        forged = _with_data(pd.array(pd.date_range("2020-01-01", periods=3)), data)
        with pytest.raises(blpickle.CorruptError, match="seconds to nanoseconds"):
            blpickle.loads(pickle.dumps(forged, protocol=5), allowed=["pandas.*"])
    durations = pd.array(pd.timedelta_range(0, periods=3, freq="s").as_unit("s"))
    assert blpickle.loads(blpickle.dumps(durations), allowed=["pandas.*"]).equals(durations)


def test_categories_of_a_range_count_as_their_values():
    pd = pytest.importorskip("pandas")
    few = pd.Categorical.from_codes([0, 1, 2], dtype=pd.CategoricalDtype(pd.RangeIndex(10)))
    assert blpickle.loads(pickle.dumps(few, protocol=5), allowed=["pandas.*"]).equals(few)
    # a few hundred bytes, then gigabytes for repr or value_counts
    many = pd.Categorical.from_codes([0, 1, 2], dtype=pd.CategoricalDtype(pd.RangeIndex(10**8)))
    with pytest.raises(blpickle.LimitError, match="copies over"):
        blpickle.loads(pickle.dumps(pd.Series(many), protocol=5), allowed=["pandas.*"])


class _Items:
    """Pickles as its class, then APPENDS of its items (a reduction giving list items)."""

    def __init__(self, items=()) -> None:
        self.items = list(items)

    def append(self, item) -> None:
        self.items.append(item)

    def __reduce__(self):
        return type(self), (), None, iter(self.items)


def test_only_containers_are_filled():
    pd = pytest.importorskip("pandas")
    # a categorical's codes, checked, then rewritten through a pandas array on the same ndarray
    cat = pd.Categorical.from_codes([0, 1, 0], dtype=pd.CategoricalDtype(["x", "y"]))
    alias = pd.arrays.NumpyExtensionArray(cat._ndarray)
    out = io.BytesIO()
    pickler = pickle._Pickler(out, protocol=4)
    pickler.dump([alias, cat])
    at = pickler.memo[id(alias)][0]
    write = P.LONG_BINGET + struct.pack("<I", at) + P.BININT1 + b"\0" + P.LONG1 + b"\x08" + struct.pack("<q", 10**12)
    forged = out.getvalue()[:-1] + write + P.SETITEM + P.POP + P.STOP  # alias[0] = 10**12
    with pytest.raises(blpickle.CorruptError, match=r"SETITEM\(S\) on a NumpyExtensionArray"):
        blpickle.loads(forged, allowed=["pandas.*"])
    # appending to an object of a class admitted by a pattern, not a list or deque
    appended = pickle.dumps(_Items([1, 2]), protocol=4)
    with pytest.raises(blpickle.CorruptError, match=r"APPEND\(S\) on a _Items"):
        blpickle.loads(appended, allowed=[f"{_Items.__module__}.*"])
    # a class named exactly is trusted: filled as pickle fills it
    assert blpickle.loads(appended, allowed=[_Items]).items == [1, 2]
    # what pickle fills: subclasses of dict and list, deques
    filled = [collections.OrderedDict(a=1), collections.defaultdict(int, b=2), collections.deque([3, 4])]
    assert blpickle.loads(pickle.dumps(filled, protocol=4), safe=True) == filled


def test_pandas_nat_is_never_given_a_state():
    pd = pytest.importorskip("pandas")
    nat = pickle.dumps(pd.NaT, protocol=4)[:-1]
    timestamp_nat = pickle.dumps(pd.Timestamp("NaT"), protocol=4)[:-1]  # _unpickle_timestamp gives NaT too
    assert blpickle.loads(nat + P.STOP, allowed=["pandas.*"]) is pd.NaT
    for stream in (nat, timestamp_nat):
        state = pickle.dumps({"isoformat": None}, protocol=4)[2:-1]
        with pytest.raises(blpickle.CorruptError, match="has its state already"):
            blpickle.loads(stream + state + P.BUILD + P.STOP, allowed=["pandas.*"])
    assert "isoformat" not in getattr(pd.NaT, "__dict__", {})


class _New:
    """Pickles (with `_dumps`) as ``cls.__new__(cls)`` (NEWOBJ), then BUILD of ``state``."""

    def __init__(self, cls, state) -> None:
        self.cls, self.state = cls, state


class _Again:
    """Pickles as BUILD of ``state`` on ``target`` (a memo reference when pickled before): a
    second state for an object that has one."""

    def __init__(self, target, state) -> None:
        self.target, self.state = target, state


class _Pickler(pickle._Pickler):  # the Python pickler, which can write a BUILD on its own
    def save(self, obj, save_persistent_id=True):
        if type(obj) is _Again:
            self.save(obj.target)
            self.save(obj.state)
            self.write(pickle.BUILD)
            return
        if type(obj) is _New:
            self.save(obj.cls)
            self.save(())
            self.write(pickle.NEWOBJ)
            self.memoize(obj)
            self.save(obj.state)
            self.write(pickle.BUILD)
            return
        super().save(obj, save_persistent_id)


def _dumps(obj) -> bytes:
    out = io.BytesIO()
    _Pickler(out, protocol=4).dump(obj)
    return out.getvalue()


def test_scalars_and_containers_of_the_same_data_are_copies_too():
    from numpy._core.multiarray import scalar

    data = b"\1" * (1 << 20)
    scalars = [Reduced(scalar, (np.dtype(f"S{len(data)}"), data)) for _ in range(100)]
    with pytest.raises(blpickle.LimitError, match="copies over"):
        blpickle.loads(pickle.dumps(scalars, protocol=4), safe=True)
    items = list(range(200_000))
    for cls in (set, collections.deque):
        assert len(blpickle.loads(pickle.dumps(Reduced(cls, (items,))), safe=True)) == len(items)
        with pytest.raises(blpickle.LimitError, match="copies over"):
            blpickle.loads(pickle.dumps([Reduced(cls, (items,)) for _ in range(100)]), safe=True)


def test_an_array_of_strings_counts_each_string_it_copies():
    from numpy._core.multiarray import _reconstruct

    dtype = np.dtypes.StringDType()
    text = "x" * (1 << 20)  # one string, pickled once, 1000 times in the array (1 GB)
    forged = Reduced(_reconstruct, (np.ndarray, (0,), b"b"), (1, (1000,), dtype, False, [text] * 1000))
    with pytest.raises(blpickle.LimitError, match="copies over"):
        blpickle.loads(pickle.dumps(forged, protocol=4), safe=True)
    for item in (b"bytes", 3, Reduced(collections.OrderedDict, ())):  # str, float and None only
        forged = Reduced(_reconstruct, (np.ndarray, (0,), b"b"), (1, (1,), dtype, False, [item]))
        with pytest.raises(blpickle.CorruptError, match="holds str, float or None items"):
            blpickle.loads(pickle.dumps(forged, protocol=4), safe=True)
    arrays = [
        np.array(["a", None, "γ"], dtype=np.dtypes.StringDType(na_object=None)),  # noqa: RUF001 - non-ASCII on purpose
        np.array([["a", "bb"], ["c", np.nan]], dtype=np.dtypes.StringDType(na_object=np.nan, coerce=False)).T,
    ]
    for array in arrays:
        loaded = blpickle.loads(blpickle.dumps(array), safe=True)
        assert loaded.dtype == array.dtype and loaded.shape == array.shape
        assert str(loaded) == str(array)


def test_an_object_gets_its_state_once():
    pd = pytest.importorskip("pandas")
    cat = pd.Categorical(np.arange(1000))
    shrunk = _Again(cat.dtype, {"categories": pd.Index(["x"], dtype=object), "ordered": False})
    with pytest.raises(blpickle.CorruptError, match="has its state already"):  # its codes were checked
        blpickle.loads(_dumps([pd.Series(cat), shrunk]), allowed=["pandas.*"])
    frame = pd.DataFrame({"x": np.arange(3.0)})
    again = _Again(frame._mgr, frame._mgr.__reduce_ex__(4)[2] if len(frame._mgr.__reduce_ex__(4)) > 2 else {})
    with pytest.raises(blpickle.CorruptError, match="has its state already"):
        blpickle.loads(_dumps([frame, again]), allowed=["pandas.*"])


def test_a_series_manager_holds_as_many_values_as_labels():
    pd = pytest.importorskip("pandas")
    from pandas.core.internals.managers import SingleBlockManager

    axes = [pd.RangeIndex(10**6)]
    values = np.array(["x"], dtype=object)
    blocks = [{"values": values, "mgr_locs": slice(0, 1, 1)}]
    manager = _New(SingleBlockManager, (axes, [values], axes, {"0.14.1": {"axes": axes, "blocks": blocks}}))
    state = {**pd.Series(["x"]).__reduce_ex__(4)[2], "_mgr": manager}
    with pytest.raises(blpickle.CorruptError, match="does not fit its 1000000 rows"):
        blpickle.loads(_dumps(_New(pd.Series, state)), allowed=["pandas.*"])
    series = pd.Series(["x", "y"], index=[3, 4])
    assert blpickle.loads(pickle.dumps(series), allowed=["pandas.*"]).equals(series)


def test_a_pandas_index_is_not_built_from_a_state():
    pd = pytest.importorskip("pandas")
    level, codes = pd.Index(["x"], dtype=object), np.array([0, 10**6])
    state = {"_levels": [level], "_codes": [codes], "_names": [None], "sortorder": None, "_cache": {}}
    forged = Reduced(copyreg._reconstructor, (pd.MultiIndex, object, None), state)
    with pytest.raises(blpickle.CorruptError, match="with _new_Index, not from a state"):
        blpickle.loads(pickle.dumps(forged, protocol=4), allowed=["pandas.*"])


def test_a_binary_tree_indexes_rows_of_its_data():
    neighbors = pytest.importorskip("sklearn.neighbors")
    from sklearn.neighbors._kd_tree import newObj

    tree = neighbors.KDTree(np.random.default_rng(0).random((40, 2)), leaf_size=5)
    state = list(tree.__getstate__())
    state[1] = np.full_like(np.asarray(state[1]), 10**8)
    with pytest.raises(blpickle.CorruptError, match="indices must name the 40 rows"):
        blpickle.loads(pickle.dumps(Reduced(newObj, (neighbors.KDTree,), tuple(state))), allowed=["sklearn.*"])
    assert blpickle.loads(pickle.dumps(tree), allowed=["sklearn.*"]).query(np.zeros((1, 2)))[1].shape == (1, 1)


def test_items_of_no_size_are_counted():
    from numpy._core.multiarray import _reconstruct

    state = (1, (10**15,), np.dtype("V0"), False, b"")  # sorting or copying it would never end
    with pytest.raises(blpickle.LimitError):
        blpickle.loads(pickle.dumps(Reduced(_reconstruct, (np.ndarray, (0,), b"b"), state)), safe=True)
    assert blpickle.loads(pickle.dumps(np.empty((0, 5))), safe=True).shape == (0, 5)


def test_a_masked_array_has_a_mask_of_its_data_shape():
    pd = pytest.importorskip("pandas")
    forged = _New(pd.arrays.IntegerArray, {"_data": np.arange(1000, dtype=np.int8), "_mask": np.ones(1, bool)})
    with pytest.raises(blpickle.CorruptError, match="bool mask of its shape"):
        blpickle.loads(_dumps(forged), allowed=["pandas.*"])
    ints = pd.array([1, None, 3], dtype="Int64")
    assert blpickle.loads(blpickle.dumps(ints), allowed=["pandas.*"]).equals(ints)


@pytest.mark.parametrize("field", ["feature_idx", "left"])
def test_a_boosted_tree_splits_on_features_and_nodes_it_has(field):
    ensemble = pytest.importorskip("sklearn.ensemble")
    x = np.random.default_rng(0).random((200, 3))
    model = ensemble.HistGradientBoostingRegressor(max_iter=2, max_depth=2).fit(x, x[:, 0])
    expected = model.predict(x[:5])
    assert (blpickle.loads(pickle.dumps(model), allowed=["sklearn.*"]).predict(x[:5]) == expected).all()
    for trees in model._predictors:
        for tree in trees:
            tree.nodes[field][tree.nodes["is_leaf"] == 0] = 10**8
    with pytest.raises(blpickle.CorruptError, match="sklearn"):
        blpickle.loads(pickle.dumps(model), allowed=["sklearn.*"])


def test_a_libsvm_model_supports_with_rows_it_was_fitted_on():
    svm = pytest.importorskip("sklearn.svm")
    x = np.random.default_rng(0).random((40, 3))
    model = svm.SVC(kernel="precomputed").fit(x @ x.T, (x[:, 0] > 0.5).astype(int))
    loaded = blpickle.loads(pickle.dumps(model), allowed=["sklearn.*"])
    assert (loaded.predict(x[:3] @ x.T) == model.predict(x[:3] @ x.T)).all()
    model.support_ = np.full_like(model.support_, 10**9)
    with pytest.raises(blpickle.CorruptError, match="support vectors"):
        blpickle.loads(pickle.dumps(model), allowed=["sklearn.*"])


@pytest.mark.parametrize("name", ["PCG64", "PCG64DXSM", "Philox", "SFC64", "MT19937"])
def test_numpy_compiled_classes_come_from_their_reconstructors(name):
    cls = getattr(np.random, name)
    bare = pickle.dumps(Reduced(cls, ()), protocol=2)  # __new__ alone: PCG64's state pointer unset
    with_state = pickle.dumps(Reduced(cls, (), cls(1).state), protocol=2)
    for forged in (bare, with_state):
        with pytest.raises(blpickle.CorruptError, match="through their reconstructors"):
            blpickle.loads(forged, safe=True)
    generator = np.random.Generator(cls(7))
    assert blpickle.loads(pickle.dumps(generator), safe=True).random() == generator.random()
    assert blpickle.loads(pickle.dumps(np.ma.masked), safe=True) is np.ma.masked  # a Python class


def test_dotted_names_pass_only_through_modules_and_classes():
    # numpy's global RandomState's bit generator, wrapped in a Generator given a state
    bits = _global("numpy.random.mtrand", "_rand._bit_generator")
    state = pickle.dumps(np.random.MT19937(0).state, protocol=4)[2:-1]
    forged = b"\x80\x04" + _global("numpy.random._pickle", "__generator_ctor") + bits + P.TUPLE1 + P.REDUCE
    before = np.random.get_state()[1].copy()
    with pytest.raises(blpickle.UnsafeLoadError, match="reaches through _rand, a RandomState"):
        blpickle.loads(forged + state + P.BUILD + P.STOP, safe=True)
    assert (np.random.get_state()[1] == before).all()
    nested = pickle.dumps(_Outer.Inner, protocol=4)  # a class in a class: its qualified name
    assert blpickle.loads(nested, allowed=[f"{__name__}.*"]) is _Outer.Inner


class _Outer:
    class Inner:
        pass


def test_a_string_argument_is_read_as_pickle_reads_it():
    # pickle's STRING: escapes, never an expression (a deep one overflowed the parser's stack)
    forged = b"S'x' + " + b"-" * 30_000 + b"1 + 'x'\n."
    assert blpickle.loads(forged, safe=True, encoding="bytes") == pickle.loads(forged, encoding="bytes")
    with pytest.raises(blpickle.CorruptError, match="not a string literal"):
        blpickle.loads(b"S'\\x4'\n.", safe=True)


def test_arguments_nested_past_the_recursion_limit_are_malformed():
    deep = b"\x80\x04" + _global("numpy", "dtype") + P.EMPTY_LIST * 100_000 + P.APPEND * 99_999
    with pytest.raises(blpickle.CorruptError, match=r"two flags, not \(\[\[\[\.\.\.\]\]\],\)"):
        blpickle.loads(deep + P.TUPLE1 + P.REDUCE + P.STOP, safe=True)  # its message shows three levels


@pytest.mark.parametrize("module", ["numpy.conftest", "numpy.random._examples.cffi.extending", "numpy.tests.x"])
def test_test_and_example_modules_are_never_imported(module):
    import sys

    before = set(sys.modules)
    with pytest.raises(blpickle.UnsafeLoadError, match="test or example code"):
        blpickle.loads(f"c{module}\nname\n.".encode(), safe=True)
    assert not {name for name in set(sys.modules) - before if name.startswith(module.rsplit(".", 1)[0])}


def test_a_seed_sequence_pool_has_its_size():
    from numpy.random.bit_generator import __pyx_unpickle_SeedSequence

    _, (cls, checksum, _), state = np.random.SeedSequence(5).__reduce__()
    forged = Reduced(__pyx_unpickle_SeedSequence, (cls, checksum, (*state[:3], 1 << 16, state[4])))
    with pytest.raises(blpickle.CorruptError, match="holds 4 words, not its size 65536"):
        blpickle.loads(pickle.dumps(forged), safe=True)  # then spawn(1) takes seconds, 2**20 minutes
    later = Reduced(__pyx_unpickle_SeedSequence, (cls, checksum, None), (*state[:3], 1 << 16, state[4]))
    with pytest.raises(blpickle.CorruptError, match="not its size"):  # the state given by BUILD
        blpickle.loads(pickle.dumps(later), safe=True)


def test_a_cython_object_is_unreachable_until_it_gets_its_state():
    pytest.importorskip("pandas")
    start = _global("pandas._libs.arrays", "__pyx_unpickle_NDArrayBacked") + _global("pandas.arrays", "DatetimeArray")
    stateless = start + P.BININT + struct.pack("<i", 0x4F1061F) + P.NONE + P.TUPLE3 + P.REDUCE  # no BUILD
    with pytest.raises(blpickle.CorruptError, match="before every dtype, array and object it made got its state"):
        blpickle.loads(b"\x80\x04" + stateless + P.STOP, allowed=["pandas.*"])  # its repr crashed
    used = b"\x80\x04" + _global("builtins", "complex") + stateless + P.TUPLE1 + P.REDUCE + P.STOP
    with pytest.raises(blpickle.CorruptError, match="takes numbers"):  # the message named it by its repr
        blpickle.loads(used, allowed=["pandas.*"])


def test_an_interval_array_has_bounds_of_one_length():
    pd = pytest.importorskip("pandas")
    intervals = pd.arrays.IntervalArray.from_breaks(np.arange(6.0))
    assert blpickle.loads(pickle.dumps(intervals), allowed=["pandas.*"]).equals(intervals)
    intervals.__dict__["_right"] = np.array([1.0])
    with pytest.raises(blpickle.CorruptError, match="bounds of one length"):
        blpickle.loads(pickle.dumps(intervals), allowed=["pandas.*"])


@pytest.mark.parametrize("dtype", ["float16", "V4"])
def test_what_pandas_refuses_to_index_is_a_damaged_pickle(dtype):
    pd = pytest.importorskip("pandas")
    from pandas.core.indexes.base import _new_Index

    forged = Reduced(_new_Index, (pd.Index, {"data": np.zeros(2, dtype=dtype)}))
    with pytest.raises(blpickle.CorruptError, match="NotImplementedError"):
        blpickle.loads(pickle.dumps(forged, 4), allowed=["pandas.*"])
