"""Arrays sharing memory are stored once and load as views sharing it; equal but independent
arrays stay independent (blpickle.engine.aliases, blpickle.arrays.rebuild_view)."""

from __future__ import annotations

import io
import itertools
import pickle
import weakref

import numpy as np
import pandas as pd
import pytest

import blpickle
from blpickle.arrays import rebuild_view

BIG = np.arange(600_000, dtype=np.float64).reshape(600, 1000)  # 4.8 MB: out of band
SMALL = np.arange(60, dtype=np.int32).reshape(6, 10)  # in band


def _views(x: np.ndarray) -> dict[str, np.ndarray]:
    return {
        "whole": x[:],
        "rows": x[2:5],
        "transposed": x.T,
        "strided": x[::2],
        "reversed": x[::-1, ::-3],
        "column": x[:, 3],
        "bytes": x.reshape(-1, order="A").view(np.uint8),
        "flat": x.ravel(order="K"),
        "element": x[1, 2:3],
    }


def _same_view(expected: np.ndarray, actual: np.ndarray) -> None:
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    assert actual.strides == expected.strides
    np.testing.assert_array_equal(actual, expected)


@pytest.mark.parametrize(
    ("base", "options"),
    [(BIG, {}), (np.asfortranarray(BIG), {}), (BIG, {"codec": None}), (SMALL, {"codec": None})],
    ids=["big", "fortran", "big-raw", "small-raw"],
)
@pytest.mark.parametrize("safe", [False, True], ids=["load", "safe"])
def test_views_load_as_views_of_one_stored_base(base, options, safe):
    x = base.copy(order="K")
    views = _views(x)
    data = blpickle.dumps({"base": x, **views}, **options)
    info = blpickle.inspect(data)
    assert len(info.buffers) == 1
    assert "blpickle.arrays.rebuild_view" in info.globals
    loaded = blpickle.loads(data, safe=safe)
    for name, view in views.items():
        _same_view(view, loaded[name])
        assert np.shares_memory(loaded[name], loaded["base"]), name
    loaded["whole"][0, 0] = -1.0  # written through one, seen in the others
    assert loaded["base"].flat[0] == loaded["transposed"][0, 0] == loaded["bytes"][:8].view(x.dtype)[0] == -1


@pytest.mark.parametrize("safe", [False, True], ids=["load", "safe"])
def test_views_of_an_array_in_band_load_as_pickle_loads_them(safe):
    x = SMALL.copy()  # under 64 KiB: in the pickle stream, reduced by numpy as pickle does
    views = _views(x)
    data = blpickle.dumps({"base": x, **views})
    info = blpickle.inspect(data)
    assert not info.buffers and "blpickle.arrays.rebuild_view" not in info.globals
    loaded = blpickle.loads(data, safe=safe)
    plain = pickle.loads(pickle.dumps({"base": x, **views}, protocol=5))
    for name, view in views.items():
        _same_view(plain[name], loaded[name])
        np.testing.assert_array_equal(loaded[name], view)
        assert not np.shares_memory(loaded[name], loaded["base"]), name


def test_a_view_and_its_base_of_100_mb_are_one_stream():
    x = np.arange(12_500_000, dtype=np.float64)  # 100 MB
    data = blpickle.dumps([x, x[:]])
    assert len(data) < len(blpickle.dumps(x)) + 200
    assert [b.nbytes for b in blpickle.inspect(data).buffers] == [x.nbytes]
    a, b = blpickle.loads(data)
    assert np.shares_memory(a, b)
    b[-1] = -1.0
    assert a[-1] == -1.0


def test_equal_independent_arrays_stay_independent():
    a = np.zeros(100_000)
    data = blpickle.dumps([a, a.copy(), a])
    assert len(blpickle.inspect(data).buffers) == 2
    first, copy, same = blpickle.loads(data)
    assert same is first and not np.shares_memory(first, copy)
    for arrays in ([SMALL, SMALL.copy()], [BIG[:10], BIG[10:20]]):  # disjoint parts share no byte
        loaded = blpickle.loads(blpickle.dumps(arrays))
        assert not np.shares_memory(*loaded)


def test_a_view_before_its_base_is_copied_unless_it_spans_the_whole_base():
    x = BIG.copy()
    part, base = blpickle.loads(blpickle.dumps([x[10:20], x]))
    assert not np.shares_memory(part, base)  # a slice alone never stores the whole array
    np.testing.assert_array_equal(part, x[10:20])
    data = blpickle.dumps([x.T, x, x[5:7]])
    assert len(blpickle.inspect(data).buffers) == 1
    transposed, base, rows = blpickle.loads(data)
    assert np.shares_memory(transposed, base) and np.shares_memory(rows, base)
    _same_view(x, base)


def test_views_of_a_part_stored_first_view_that_part():
    x = BIG.copy()
    data = blpickle.dumps([x[100:400], x[200:300], x[350:450]])
    first, inside, across = blpickle.loads(data)
    assert np.shares_memory(first, inside) and not np.shares_memory(first, across)
    assert len(blpickle.inspect(data).buffers) == 2


@pytest.mark.parametrize("parts", [2, 7, 8, 9, 30])  # around the pairwise checks' limit
def test_views_of_parts_of_one_memory_view_their_part(parts):
    size = 10_000  # 80 KB: each piece out of band
    memory = np.arange(parts * float(size))
    pieces = [memory[i * size : (i + 1) * size] for i in range(parts)]  # disjoint, one owner
    views = [pieces[-1][2:5], pieces[0][::3], pieces[parts // 2][1:]]
    loaded = blpickle.loads(blpickle.dumps([*pieces, *views, np.arange(5.0)]))
    *pieces_back, view_last, view_first, view_middle, other = loaded
    assert all(np.array_equal(a, b) for a, b in zip(pieces_back, pieces, strict=True))
    assert not any(np.shares_memory(a, b) for a, b in itertools.combinations(pieces_back, 2))
    assert np.shares_memory(view_last, pieces_back[-1]) and np.array_equal(view_last, views[0])
    assert np.shares_memory(view_first, pieces_back[0]) and np.array_equal(view_first, views[1])
    assert np.shares_memory(view_middle, pieces_back[parts // 2]) and np.array_equal(view_middle, views[2])
    assert not any(np.shares_memory(other, piece) for piece in pieces_back)


def test_views_keep_the_writability_they_had():
    x = BIG.copy()
    frozen = x[:10]
    frozen.flags.writeable = False
    base, loaded_frozen = blpickle.loads(blpickle.dumps([x, frozen]))
    assert not loaded_frozen.flags.writeable and base.flags.writeable  # stored apart, as pickle does
    np.testing.assert_array_equal(loaded_frozen, frozen)
    y = BIG.copy()
    y.flags.writeable = False
    base, view = blpickle.loads(blpickle.dumps([y, y[::3]]))
    assert np.shares_memory(base, view) and not view.flags.writeable


def test_memory_mapped_views_view_the_mapping(tmp_path):
    path = tmp_path / "views.blp"
    x = BIG.copy()
    blpickle.dump([x, x[::-2], x[3]], path, codec=None)
    base, reversed_rows, row = blpickle.load(path, mmap_mode="r+")
    assert np.shares_memory(base, reversed_rows) and np.shares_memory(base, row)
    row[0] = -7.0  # goes to the file
    del base, reversed_rows, row
    assert blpickle.load(path, mmap_mode="r")[0][3, 0] == -7.0  # (its checksum no longer matches)


def test_pandas_objects_sharing_blocks_share_them_after_loading():
    frame = pd.DataFrame({"a": np.arange(50_000.0), "b": np.ones(50_000)})
    column = frame["a"]
    loaded_frame, loaded_column = blpickle.loads(blpickle.dumps([frame, column]))
    assert loaded_frame.equals(frame) and loaded_column.equals(column)
    assert np.shares_memory(loaded_column.to_numpy(), loaded_frame._mgr.blocks[0].values)


def test_a_pickler_forgets_the_arrays_of_its_last_dump():
    out = io.BytesIO()
    pickler = blpickle.Pickler(out)
    x = SMALL.copy()
    pickler.dump(x)
    pickler.dump(x[2:4])  # x is not in this record: the view is stored itself
    out.seek(0)
    np.testing.assert_array_equal(blpickle.load(out), x)
    np.testing.assert_array_equal(blpickle.load(out), x[2:4])
    assert blpickle.loads(blpickle.dumps(x[1:3])).base is not None  # and in blpickle.dumps


def test_dumps_forgets_the_small_arrays_of_its_last_call():
    x = SMALL.copy()
    blpickle.dumps([x])  # a compact record: x went in band, remembered as a possible base
    alive = weakref.ref(x)
    view = x[::2]
    loaded = blpickle.loads(blpickle.dumps(view))  # x is not in this record
    assert loaded.flags.c_contiguous
    np.testing.assert_array_equal(loaded, view)
    del x, view
    assert alive() is None  # dumps keeps nothing of what it dumped


def test_views_of_memmaps_and_of_reloaded_arrays_are_views(tmp_path):
    memmap = np.memmap(tmp_path / "m.dat", dtype=np.float32, mode="w+", shape=(1000, 100))
    memmap[:] = 1.5
    base, view = blpickle.loads(blpickle.dumps([memmap, memmap[10:20]]))
    assert type(base) is np.ndarray and np.shares_memory(base, view)
    again = blpickle.loads(blpickle.dumps([base, view]))
    assert np.shares_memory(*again)


def test_open_lists_the_stored_base_only(tmp_path):
    path = tmp_path / "views.blp"
    x = BIG.copy()
    blpickle.dump({"weights": x, "top": x[:10], "t": x.T}, path)
    with blpickle.open(path) as rec:
        assert rec.names == ("weights",) and len(rec.arrays) == 1
        np.testing.assert_array_equal(rec["weights"], x)
        loaded = rec.load()
    assert np.shares_memory(loaded["weights"], loaded["t"])


def test_protocols_under_5_and_buffer_callbacks_copy_views():
    x = BIG.copy()
    assert not np.shares_memory(*blpickle.loads(blpickle.dumps([x, x[:5]], protocol=4)))
    buffers: list[pickle.PickleBuffer] = []
    data = blpickle.dumps([x, x[:5]], buffer_callback=buffers.append)
    assert "blpickle.arrays.rebuild_view" not in blpickle.inspect(data).globals


class ForgedView:
    """Pickles as rebuild_view with the given arguments."""

    def __init__(self, *args: object) -> None:
        self.args = args

    def __reduce__(self):
        return rebuild_view, self.args


F8 = np.dtype("f8")
BASE = np.arange(10.0)
FORGED = {
    "offset past the end": (BASE, 80, F8, (1,), (8,)),
    "negative offset": (BASE, -8, F8, (1,), (8,)),
    "shape past the end": (BASE, 0, F8, (11,), (8,)),
    "negative stride below the start": (BASE, 8, F8, (3,), (-8,)),
    "stride past the end": (BASE, 0, F8, (2,), (80,)),
    "huge stride": (BASE, 0, F8, (2,), (1 << 70,)),
    "huge shape": (BASE, 0, F8, (1 << 40, 1 << 40), (0, 0)),
    "object dtype": (BASE, 0, np.dtype(object), (1,), (8,)),
    "object base": (np.array([1, "a"], dtype=object), 0, F8, (1,), (8,)),
    "strided base": (ForgedView(BASE, 0, F8, (5,), (16,)), 0, F8, (1,), (8,)),
    "bytes base": (b"\0" * 80, 0, F8, (1,), (8,)),
    "strides missing": (BASE, 0, F8, (2,), (8,) * 0),
    "negative shape": (BASE, 0, F8, (-1,), (8,)),
    "float offset": (BASE, 0.0, F8, (1,), (8,)),
}


@pytest.mark.parametrize("args", FORGED.values(), ids=FORGED.keys())
@pytest.mark.parametrize("safe", [False, True], ids=["load", "safe"])
def test_forged_view_arguments_are_refused(args, safe):
    with pytest.raises(blpickle.CorruptError, match="view"):
        blpickle.loads(blpickle.dumps(ForgedView(*args)), safe=safe)
    with pytest.raises(blpickle.CorruptError, match="view"):
        blpickle.loads(pickle.dumps(ForgedView(*args), protocol=5), safe=safe)


def test_safe_mode_refuses_views_whose_elements_overlap():
    base = np.zeros(1, np.float32)
    repeated = ForgedView(base, 0, np.dtype(np.float32), (10**9,), (0,))  # a copy would take 4 GB
    data = blpickle.dumps([base, repeated])
    assert blpickle.loads(data)[1].shape == (10**9,)  # a plain load gives the view, as pickle would
    with pytest.raises(blpickle.LimitError, match="overlap"):
        blpickle.loads(data, safe=True)
    grid = np.arange(12_000.0).reshape(30, 400)
    views = [grid, grid[::-1, ::2], grid.T, grid[1:, 1:3]]
    loaded = blpickle.loads(blpickle.dumps(views), safe=True)
    assert all(np.shares_memory(loaded[0], view) for view in loaded[1:])
    assert all((a == b).all() for a, b in zip(views, loaded, strict=True))


def test_safe_mode_checks_the_number_of_arguments():
    with pytest.raises(blpickle.CorruptError, match="5 to 5 arguments"):
        blpickle.loads(blpickle.dumps(ForgedView(BASE, 0, F8, (1,))), safe=True)


def test_rebuild_view_builds_any_view_inside_its_base():
    structured = np.zeros(4, dtype=[("id", "<i4"), ("x", "<f8")])
    structured["x"] = [1, 2, 3, 4]
    assert rebuild_view(structured, 4, F8, (4,), (12,)).tolist() == [1, 2, 3, 4]
    empty = rebuild_view(BASE, 80, F8, (0, 3), (8, 8))
    assert empty.shape == (0, 3)
    broadcast = rebuild_view(BASE, 8, F8, (1000, 2), (0, 8))
    assert broadcast.shape == (1000, 2) and broadcast[999].tolist() == [1.0, 2.0]
    frozen = BASE.copy()
    frozen.flags.writeable = False
    assert not rebuild_view(frozen, 0, F8, (2,), (8,)).flags.writeable
