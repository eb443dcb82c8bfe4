"""Each vetted reconstructor of blpickle.restricted.registry: what its library writes loads,
hostile arguments are refused before anything runs; and the real objects of other libraries
load with their own package's pattern and nothing else."""

from __future__ import annotations

import datetime
import pickle
import warnings

import numpy as np
import pytest

import blpickle
from blpickle.format import MAGIC
from blpickle.info import pickle_globals
from blpickle.restricted.registry import FAMILIES, REGISTRY


def _call(module: str, name: str, *args: object) -> bytes:
    """A protocol 2 pickle calling ``module.name(*args)``, each argument pickled as pickle does."""
    body = pickle.dumps(args, 2)[2:-1]  # the tuple, without PROTO and STOP
    return b"\x80\x02c" + module.encode() + b"\n" + name.encode() + b"\n" + body + b"R."


class Foreign:
    """A class no policy here admits."""


#: Per entry: (a value its library pickles through it, the pattern it needs, hostile calls:
#: (module, name, arguments) that must be refused with a LoadError).
CASES = {
    "builtins.set": (lambda: {1, 2}, None, [("builtins", "set", (5,))]),
    "builtins.frozenset": (lambda: frozenset({1}), None, [("builtins", "frozenset", ("ab",))]),
    "builtins.bytes": (lambda: b"", None, [("builtins", "bytes", (10**12,))]),
    "builtins.bytearray": (lambda: bytearray(b"ab"), None, [("builtins", "bytearray", (10**12,))]),
    "builtins.complex": (lambda: 1 + 2j, None, [("builtins", "complex", ("1+2j",))]),
    "builtins.slice": (lambda: slice(1, 2), None, [("builtins", "slice", ([1],))]),
    "builtins.range": (lambda: range(3), None, [("builtins", "range", ("3",))]),
    "builtins.getattr": (None, None, [("builtins", "getattr", (Foreign, "__init__")), ("builtins", "getattr", (1,))]),
    "_codecs.encode": (None, None, [("_codecs", "encode", ("x", "rot13"))]),
    "copyreg._reconstructor": (None, None, [("copyreg", "_reconstructor", (Foreign, list, None))]),
    "collections.OrderedDict": (
        lambda: __import__("collections").OrderedDict(a=1),
        None,
        [("collections", "OrderedDict", (5,))],
    ),
    "collections.defaultdict": (
        lambda: __import__("collections").defaultdict(list),
        None,
        [("collections", "defaultdict", (print,))],
    ),
    "collections.Counter": (
        lambda: __import__("collections").Counter("ab"),
        None,
        [("collections", "Counter", ("ab",))],
    ),
    "collections.deque": (
        lambda: __import__("collections").deque([1], 2),
        None,
        [("collections", "deque", ([1], "x"))],
    ),
    "datetime.datetime": (lambda: datetime.datetime(2026, 1, 1), None, [("datetime", "datetime", (2026, 1, 1))]),
    "datetime.date": (lambda: datetime.date(2026, 1, 1), None, [("datetime", "date", (b"xx",))]),
    "datetime.time": (lambda: datetime.time(1, 2), None, [("datetime", "time", ("01:02",))]),
    "datetime.timedelta": (lambda: datetime.timedelta(1, 2), None, [("datetime", "timedelta", (1.5,))]),
    "datetime.timezone": (lambda: datetime.timezone.utc, None, [("datetime", "timezone", (3600,))]),
    "decimal.Decimal": (lambda: __import__("decimal").Decimal("1.5"), None, [("decimal", "Decimal", ((1, 2),))]),
    "fractions.Fraction": (
        lambda: __import__("fractions").Fraction(1, 3),
        None,
        [("fractions", "Fraction", ("1" * 20_000,))],
    ),
    "numpy.dtype": (lambda: np.dtype("f8"), None, [("numpy", "dtype", (Foreign,)), ("numpy", "dtype", ("f8,(",))]),
    "numpy.ndarray": (None, None, [("numpy", "ndarray", ((10**6,),))]),
    "numpy._core.multiarray._reconstruct": (
        lambda: np.arange(3).astype(object),
        None,
        [("numpy._core.multiarray", "_reconstruct", (Foreign, (0,), b"b"))],
    ),
    "numpy.core.multiarray._reconstruct": (
        None,
        None,
        [("numpy.core.multiarray", "_reconstruct", (np.matrix, (0,), b"b"))],
    ),
    "numpy._core.multiarray.scalar": (
        lambda: np.float64(2.5),
        None,
        [("numpy._core.multiarray", "scalar", (np.dtype("f8"), b"x"))],
    ),
    "numpy.core.multiarray.scalar": (None, None, [("numpy.core.multiarray", "scalar", (np.dtype("f8"), b"x" * 9))]),
    "numpy._core.numeric._frombuffer": (
        lambda: np.arange(4.0),
        None,
        [  # protocol 5
            ("numpy._core.numeric", "_frombuffer", (b"x" * 7, np.dtype("f8"), (1,), "C"))
        ],
    ),
    "numpy.core.numeric._frombuffer": (
        None,
        None,
        [("numpy.core.numeric", "_frombuffer", (b"", np.dtype("O"), (0,), "C"))],
    ),
    "numpy._core._internal._convert_to_stringdtype_kwargs": (
        lambda: np.array(["a", None], dtype=np.dtypes.StringDType(na_object=None)),
        None,
        [
            ("numpy._core._internal", "_convert_to_stringdtype_kwargs", (1, Foreign)),
            ("numpy._core._internal", "_convert_to_stringdtype_kwargs", (2,)),
            ("numpy._core._internal", "_convert_to_stringdtype_kwargs", ("yes",)),
        ],
    ),
    "numpy.random._pickle.__bit_generator_ctor": (
        lambda: np.random.PCG64(1),
        None,
        [("numpy.random._pickle", "__bit_generator_ctor", (Foreign,))],
    ),
    "numpy.random._pickle.__generator_ctor": (
        lambda: np.random.default_rng(1),
        None,
        [("numpy.random._pickle", "__generator_ctor", ("PCG64", print))],
    ),
    "numpy.random._pickle.__randomstate_ctor": (
        lambda: np.random.RandomState(1),
        None,
        [("numpy.random._pickle", "__randomstate_ctor", ("nope",))],
    ),
    "numpy.random.bit_generator.__pyx_unpickle_SeedSequence": (
        lambda: np.random.SeedSequence(5),
        None,
        [("numpy.random.bit_generator", "__pyx_unpickle_SeedSequence", (Foreign, 0, None))],
    ),
    "blpickle.arrays.rebuild_ndarray": (
        lambda: blpickle.loads(blpickle.dumps(np.ones(10**5))),
        None,
        [("blpickle.arrays", "rebuild_ndarray", (b"x" * 8, np.dtype("f8"), (10**6,), "C"))],
    ),
    "blpickle.arrays.rebuild_view": (
        None,
        None,
        [("blpickle.arrays", "rebuild_view", (np.zeros(2), 0, np.dtype("f8"), (4,), (8,)))],
    ),
}


def _pandas_cases() -> dict:
    pd = pytest.importorskip("pandas")
    nat = pd.NaT.__reduce__()[0].__name__
    return {
        "pandas._libs.arrays.__pyx_unpickle_NDArrayBacked": (
            lambda: pd.array(pd.date_range("2026", periods=3)),
            "pandas.*",
            [("pandas._libs.arrays", "__pyx_unpickle_NDArrayBacked", (Foreign, 0, ()))],
        ),
        "pandas._libs.interval.__pyx_unpickle_IntervalMixin": (
            lambda: pd.interval_range(0, 4).array,
            "pandas.*",
            [("pandas._libs.interval", "__pyx_unpickle_IntervalMixin", (pd.Index, 0, ()))],
        ),
        "pandas._libs.internals._unpickle_block": (
            lambda: pd.DataFrame({"a": [1]}),
            "pandas.*",
            [("pandas._libs.internals", "_unpickle_block", (np.arange(3), slice(0, 1), 7))],
        ),
        "pandas.core.internals.managers.BlockManager": (
            lambda: pd.DataFrame({"a": [1.0]}),
            "pandas.*",
            [("pandas.core.internals.managers", "BlockManager", ((1,), [2]))],
        ),
        "pandas.core.indexes.base._new_Index": (
            lambda: pd.Index(["a"]),
            "pandas.*",
            [("pandas.core.indexes.base", "_new_Index", (Foreign, {}))],
        ),
        "pandas.core.indexes.datetimes._new_DatetimeIndex": (
            lambda: pd.date_range("2026", periods=2),
            "pandas.*",
            [("pandas.core.indexes.datetimes", "_new_DatetimeIndex", (pd.Index, {1: 2}))],
        ),
        "pandas._libs.sparse.IntIndex": (
            lambda: pd.arrays.SparseArray([0.0, 0.0, 1.5, 0.0], kind="integer"),
            "pandas.*",
            [
                ("pandas._libs.sparse", "IntIndex", (4, np.array([1, 9], dtype=np.int32))),  # past the length
                ("pandas._libs.sparse", "IntIndex", (4, np.array([2, 1], dtype=np.int32))),  # not ascending
                ("pandas._libs.sparse", "IntIndex", (4, np.array([2**32 + 1]))),  # cast to 1 by pandas
            ],
        ),
        "pandas._libs.sparse.BlockIndex": (
            lambda: pd.arrays.SparseArray([0.0, 2.0, 1.5, 0.0], kind="block"),
            "pandas.*",
            [("pandas._libs.sparse", "BlockIndex", (4, np.array([1], dtype=np.int32), np.array([7], dtype=np.int32)))],
        ),
        "pandas._libs.tslibs.timestamps._unpickle_timestamp": (
            lambda: pd.Timestamp("2026-01-01", tz="UTC"),
            "pandas.*",
            [("pandas._libs.tslibs.timestamps", "_unpickle_timestamp", ("x", None, None, 10))],
        ),
        "pandas._libs.tslibs.timedeltas._timedelta_unpickle": (
            lambda: pd.Timedelta("1s"),
            "pandas.*",
            [("pandas._libs.tslibs.timedeltas", "_timedelta_unpickle", (1.5, 10))],
        ),
        f"pandas._libs.tslibs.nattype.{nat}": (  # __nat_unpickle in pandas 2
            lambda: pd.NaT,
            "pandas.*",
            [("pandas._libs.tslibs.nattype", nat, (print,))],
        ),
    }


def _sklearn_cases() -> dict:
    pytest.importorskip("sklearn")
    from sklearn.neighbors import BallTree, KDTree
    from sklearn.tree import DecisionTreeClassifier

    points = np.random.default_rng(0).random((20, 2))
    return {
        "sklearn.tree._tree.Tree": (
            lambda: DecisionTreeClassifier(max_depth=2).fit(points, points[:, 0] > 0.5).tree_,
            "sklearn.*",
            [("sklearn.tree._tree", "Tree", (2, np.array([2.5]), 1))],
        ),
        "sklearn.neighbors._kd_tree.newObj": (
            lambda: KDTree(points),
            "sklearn.*",
            [("sklearn.neighbors._kd_tree", "newObj", (Foreign,))],
        ),
        "sklearn.neighbors._ball_tree.newObj": (
            lambda: BallTree(points),
            "sklearn.*",
            [("sklearn.neighbors._ball_tree", "newObj", (KDTree,))],
        ),
        "sklearn.metrics._dist_metrics.newObj": (
            lambda: KDTree(points).get_arrays,
            "sklearn.*",
            [("sklearn.metrics._dist_metrics", "newObj", (Foreign,))],
        ),
    }


def test_every_registry_entry_has_a_case():
    # pandas' and sklearn's below; blpickle.tensors' rebuilders in tests/test_tensors.py
    tested_elsewhere = ("pandas.", "sklearn.", "blpickle.tensors.", "pytz.")
    assert set(REGISTRY) == set(CASES) | {key for key in REGISTRY if key.startswith(tested_elsewhere)}
    assert {f.package for f in FAMILIES} <= {"pandas"}


def _check(path: str, make, pattern, hostile) -> None:
    allowed = [pattern] if pattern else []
    if make is not None:
        obj = make()
        found = set()
        for data in (*(pickle.dumps(obj, protocol) for protocol in (2, 3, 5)), blpickle.dumps(obj)):
            found.update(_globals(data))
            assert type(blpickle.loads(data, allowed=allowed)) is type(obj)
        assert path in found
    for module, name, args in hostile:
        data = _call(module, name, *args)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # numpy.core's spellings
            with pytest.raises(blpickle.LoadError):
                blpickle.loads(data, allowed=[*allowed, "test_registry.*"])


def _globals(data: bytes) -> tuple[str, ...]:
    """The globals a record or a plain pickle names."""
    names = blpickle.inspect(data).globals if data.startswith(MAGIC) else pickle_globals(data)
    return tuple(name.replace("__builtin__.", "builtins.") for name in names)  # Python 2 names


@pytest.mark.parametrize("path", sorted(CASES))
def test_a_vetted_reconstructor_loads_what_its_library_writes_and_refuses_the_rest(path):
    make, pattern, hostile = CASES[path]
    _check(path, make, pattern, hostile)


def test_pandas_reconstructors():
    for path, (make, pattern, hostile) in _pandas_cases().items():
        _check(path, make, pattern, hostile)
        module, name, args = hostile[0]
        with pytest.raises(blpickle.UnsafeLoadError, match=r"allow 'pandas\.\*'"):
            blpickle.loads(_call(module, name, *args), safe=True)


def test_sklearn_reconstructors():
    for path, (make, pattern, hostile) in _sklearn_cases().items():
        if path == "sklearn.metrics._dist_metrics.newObj":
            make = None  # reached through a KDTree's metric: loaded by the KDTree case
        _check(path, make, pattern, hostile)


def test_pytz_time_zones_of_pandas_2():
    pytz = pytest.importorskip("pytz")
    for zone in (pytz.utc, pytz.timezone("Europe/Paris")):
        assert blpickle.loads(pickle.dumps(zone), safe=True) is zone
    for args in (("../../etc/passwd",), ("UTC", [1])):
        with pytest.raises(blpickle.CorruptError):
            blpickle.loads(_call("pytz", "_p", *args), safe=True)
    for made in (b"\x8c\x04pytz\x8c\x04_UTC\x93)R", b"\x8c\x04pytz\x8c\x02_p\x93\x8c\x0cEurope/Paris\x85R"):
        with pytest.raises(blpickle.CorruptError, match="has its state already"):  # pytz's own, for every user
            blpickle.loads(b"\x80\x04" + made + b"}\x8c\x04zone\x8c\x03BADsb.", safe=True)
    assert pytz.utc.zone == "UTC" and pytz.timezone("Europe/Paris").zone == "Europe/Paris"


def test_family_members_are_called_with_plain_data_only():
    pd = pytest.importorskip("pandas")
    for obj in (pd.offsets.Day(2), pd.offsets.Week(weekday=1), pd.StringDtype("python")):
        assert blpickle.loads(pickle.dumps(obj), allowed=["pandas.*"]) == obj
    hostile = _call("pandas._libs.tslibs.offsets", "Day", [1])
    with pytest.raises(blpickle.CorruptError, match="plain data"):
        blpickle.loads(hostile, allowed=["pandas.*"])


# -- real objects, each with its own package's pattern ------------------------------------------


def _frame():
    pd = pytest.importorskip("pandas")
    n = 500
    return pd.DataFrame(
        {
            "int": np.arange(n),
            "when": pd.date_range("2026-01-01", periods=n, freq="h"),
            "zoned": pd.date_range("2026-01-01", periods=n, freq="h", tz="Europe/Paris"),
            "delta": pd.to_timedelta(np.arange(n), unit="s"),
            "category": pd.Categorical(np.random.default_rng(0).choice(["a", "b"], n)),
            "text": pd.array([f"t{i}" for i in range(n)], dtype="string"),
            "nullable": pd.array([1, None] * (n // 2), dtype="Int64"),
            "flags": pd.array([True, None] * (n // 2), dtype="boolean"),
            "period": pd.period_range("2026-01", periods=n, freq="M"),
        },
        index=pd.date_range("2020-01-01", periods=n, freq="D", name="day"),
    )


def _xarray():
    xr = pytest.importorskip("xarray")
    pd = pytest.importorskip("pandas")
    return xr.Dataset(
        {"v": (("time", "x"), np.random.default_rng(0).random((10, 3)))},
        coords={"time": pd.date_range("2026-01-01", periods=10), "x": [1, 2, 3]},
    )


def _estimators():
    pytest.importorskip("sklearn")
    from sklearn.ensemble import HistGradientBoostingClassifier, HistGradientBoostingRegressor
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.neighbors import KNeighborsClassifier
    from sklearn.pipeline import make_pipeline

    rng = np.random.default_rng(0)
    x = rng.random((200, 4))
    y = (x[:, 0] > 0.5).astype(int)
    texts = ["apple banana cherry", "banana cherry date", "cherry date egg", "apple apple fig"]
    return [
        HistGradientBoostingRegressor(max_iter=5).fit(x, x[:, 1]),
        HistGradientBoostingClassifier(max_iter=5).fit(x, y),
        make_pipeline(TfidfVectorizer(), LogisticRegression()).fit(texts, [0, 1, 0, 1]),
        KNeighborsClassifier(3).fit(x, y),
    ]


def _boosters():
    lightgbm = pytest.importorskip("lightgbm")
    xgboost = pytest.importorskip("xgboost")
    rng = np.random.default_rng(0)
    x = rng.random((100, 3))
    y = (x[:, 0] > 0.5).astype(int)
    return [
        (lightgbm.train({"verbose": -1}, lightgbm.Dataset(x, y), 3), ["lightgbm.*"]),
        (xgboost.train({}, xgboost.DMatrix(x, y), 3), ["xgboost.*"]),
    ]


@pytest.mark.parametrize("dump", [blpickle.dumps, lambda obj: pickle.dumps(obj, 5)], ids=["record", "pickle"])
def test_real_objects_load_with_their_own_pattern_and_nothing_else(dump):
    pd = pytest.importorskip("pandas")
    frame = _frame()
    loaded = blpickle.loads(dump(frame), allowed=["pandas.*"])
    pd.testing.assert_frame_equal(loaded, frame)
    with pytest.raises(blpickle.UnsafeLoadError):
        blpickle.loads(dump(frame), safe=True)
    sparse = pd.DataFrame({"a": pd.arrays.SparseArray([0, 0, 3, 0]), "b": pd.arrays.SparseArray([1.0, 0, 0, 2])})
    pd.testing.assert_frame_equal(blpickle.loads(dump(sparse), allowed=["pandas.*"]), sparse)
    dataset = _xarray()
    assert blpickle.loads(dump(dataset), allowed=["xarray.*", "pandas.*"]).identical(dataset)
    scipy_sparse = pytest.importorskip("scipy.sparse")
    dense = np.array([[0, 1.5, 0, 0], [2, 0, 0, 3], [0, 0, 0, 0], [0, 4, 0, 5]])
    for matrix in (
        *(scipy_sparse.csr_matrix(dense).asformat(kind) for kind in ("csr", "csc", "coo", "dia", "lil", "dok")),
        scipy_sparse.bsr_array(dense, blocksize=(2, 2)),
    ):
        back = blpickle.loads(dump(matrix), allowed=["scipy.*"])
        assert type(back) is type(matrix)
        np.testing.assert_array_equal(back.toarray(), dense)
    x = np.random.default_rng(1).random((5, 4))
    for model in _estimators():
        back = blpickle.loads(dump(model), allowed=["sklearn.*"])
        if hasattr(model, "predict_proba") and not hasattr(model, "steps"):
            np.testing.assert_array_equal(back.predict(x), model.predict(x))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # xgboost warns about pickled boosters
        for booster, allowed in _boosters():
            back = blpickle.loads(dump(booster), allowed=allowed)
            assert type(back) is type(booster)
