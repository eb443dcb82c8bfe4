"""The restricted unpickler of safe mode: numpy states that crash numpy's own ``__setstate__``
are refused, everything legitimate loads as pickle loads it, malformed input gives LoadErrors."""

from __future__ import annotations

import collections
import contextlib
import io
import pickle
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from conftest import NonSeekable, assert_same_array
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from test_properties import dtypes

import blpickle
from blpickle.arrays import rebuild_ndarray
from blpickle.restricted import RestrictedUnpickler
from blpickle.safe import Policy

_reconstruct = np._core.multiarray._reconstruct
_scalar = np._core.multiarray.scalar


class Reduces:
    """Pickles as whatever ``__reduce__`` value it is given (how the attacks are written)."""

    def __init__(self, *value):
        self.value = value

    def __reduce__(self):
        return self.value


def _dtype(code, state):
    return Reduces(np.dtype, (code, False, True), state)


def _array(state):
    return Reduces(_reconstruct, (np.ndarray, (0,), b"b"), state)


F8 = np.dtype("f8")
OBJECT_PAIR = np.dtype([("a", "O"), ("b", "i8")])

#: States that numpy's native __setstate__ takes without checking (a crash, at once or on use).
CRASHES = {
    "dtype with a 6-item state": _dtype("f8", (3, "<", None, None, -1, -1)),
    "dtype with a 5-item state": _dtype("f8", (3, "<", None, -1, -1)),
    "field offset past the item size": _dtype("V8", (3, "|", None, ("a",), {"a": (F8, 1 << 20)}, 8, 1, 16)),
    "field offset negative": _dtype("V8", (3, "|", None, ("a",), {"a": (F8, -8)}, 8, 1, 16)),
    "field running past the item size": _dtype("V8", (3, "|", None, ("a",), {"a": (F8, 4)}, 8, 1, 16)),
    "overlapping object fields": _dtype(
        "V16", (3, "|", None, ("a", "b"), {"a": (OBJECT_PAIR, 0), "b": (F8, 0)}, 16, 1, 63)
    ),
    "subarray larger than the item size": _dtype("V8", (3, "|", (F8, (1000,)), None, None, 8, 8, 0)),
    "field names not in the fields": _dtype("V8", (3, "|", None, ("a",), {"b": (F8, 0)}, 8, 1, 16)),
    "datetime of an unknown unit": _dtype("M8", (4, "<", None, None, None, -1, -1, 0, (None, (b"eons", 1, 1, 1)))),
    "datetime count out of range": _dtype("M8", (4, "<", None, None, None, -1, -1, 0, (None, (b"s", 1 << 40, 1, 1)))),
    "array data shorter than its shape": _array((1, (1000, 1000), F8, False, b"\0" * 8)),
    "object array from raw bytes": _array((1, (2,), np.dtype(object), False, b"\1" * 16)),
    "object fields from raw bytes": _array((1, (1,), OBJECT_PAIR, False, b"\1" * 16)),
    "scalar of object fields from raw bytes": Reduces(_scalar, (OBJECT_PAIR, b"\1" * 16)),
    "scalar shorter than its dtype": Reduces(_scalar, (F8, b"\1")),
    "state set on a rebuilt array": Reduces(
        rebuild_ndarray, (bytearray(8), F8, (1,), "C"), (1, (1000,), F8, False, b"")
    ),
    "state set on a numpy scalar": Reduces(_scalar, (F8, b"\0" * 8), (None, b"")),
}


def _alternating_nesting(levels):
    """A pickle nesting ``levels`` times a tuple in a frozenset made by ``frozenset(...)``."""
    body = b""
    for level in range(levels):
        body += b"\x85\x94" + b"0h\x00j" + (level + 1).to_bytes(4, "little") + b"\x85\x85R"
    return b"\x80\x04\x8c\x08builtins\x8c\tfrozenset\x93\x94N" + body + b"."


def _nested_deques(levels, tail=b"."):
    """A pickle of ``deque([deque([... deque([]) ...])])``, ``levels`` deques around the innermost."""
    return b"\x80\x02ccollections\ndeque\nq\x00" + b"h\x00(" * levels + b"h\x00]\x85R" + b"l\x85R" * levels + tail


def _deques_filled_after_held(count):
    """A pickle of ``count`` empty deques, each then appended to the one before it, from the
    outermost in: each deque is held before it is filled."""
    deque = b"\x80\x04\x8c\x0bcollections\x8c\x05deque\x93\x94" + b"h\x00)R\x94" * count  # memo 1..count
    get = [b"j" + key.to_bytes(4, "little") for key in range(count + 1)]
    appends = b"".join(get[key] + get[key + 1] + b"a0" for key in range(1, count))
    return deque + b"0" * count + appends + get[1] + b"."


def _nested_defaultdicts(levels):
    """A pickle of ``levels`` defaultdicts, each holding the one before under key 0."""
    one = b"h\x00)RK\x00h\x01sq\x010"  # a new defaultdict; [0] = memo 1; memo 1 = it
    return b"\x80\x04ccollections\ndefaultdict\n\x94h\x00)R\x940" + one * levels + b"h\x01."


def _nested_object_arrays(levels, tail=b"."):
    """A pickle of ``levels`` arrays of one object, each holding the next; None innermost."""
    start = b"\x80\x02cnumpy._core.multiarray\n_reconstruct\nq\x00cnumpy\nndarray\nK\x00\x85C\x01b\x87q\x01"
    start += b"cnumpy\ndtype\nU\x02O8\x89\x88\x87R(K\x03U\x01|NNNJ\xff\xff\xff\xffJ\xff\xff\xff\xffK?tbq\x020"
    level = b"h\x00h\x01R(K\x01K\x01\x85h\x02\x89("  # an array of shape (1,) and dtype object, its state open
    return start + level * levels + b"N" + b"ltb" * levels + tail


#: Hand-made pickles that crash CPython itself: hashing tuples nested a million deep (as a
#: dict key, a set item, a frozenset's) recurses in C without a limit, and so does freeing
#: deques or arrays of objects nested deeply, once loaded or with the error of a bad opcode.
NESTING_CRASHES = {
    "dict key nested a million tuples deep": b"\x80\x04}N" + b"\x85" * 1_000_000 + b"Ns.",
    "set item nested a million tuples deep": b"\x80\x04\x8f(N" + b"\x85" * 1_000_000 + b"\x90.",
    "frozenset() of tuples nested in frozensets": _alternating_nesting(100_000),
    "deques nested 300,000 deep": _nested_deques(300_000),
    "deques nested 300,000 deep, then a bad opcode": _nested_deques(300_000, b"\xff"),
    "300,000 deques, each filled after another holds it": _deques_filled_after_held(300_000),
    "arrays of objects nested 200,000 deep": _nested_object_arrays(200_000),
    "defaultdicts nested 150,000 deep": _nested_defaultdicts(150_000),
}


def _safe_loads_in_a_child(attacks):
    """Load each of ``attacks`` (name -> pickle) with safe=True in a child process, then use
    what it gave; return name -> the LoadError's class name, or "loaded". A crash shows up
    as the child's exit status, not as pytest dying."""
    script = textwrap.dedent(
        """
        import pickle, sys
        import numpy as np
        import blpickle
        for name, data in pickle.loads(sys.stdin.buffer.read()).items():
            try:
                obj = blpickle.loads(data, safe=True)
            except blpickle.LoadError as exc:
                print(name, "->", type(exc).__name__, flush=True)
            else:
                np.zeros(4, dtype=obj) if isinstance(obj, np.dtype) else repr(obj)  # use it
                print(name, "-> loaded", flush=True)
        """
    )
    child = subprocess.run(
        [sys.executable, "-c", script], input=pickle.dumps(attacks), capture_output=True, timeout=300, check=False
    )
    assert child.returncode == 0, child.stderr.decode()
    return dict(line.split(" -> ") for line in child.stdout.decode().splitlines())


@pytest.mark.parametrize("protocol", [2, 5])
def test_numpy_states_that_crash_numpy_are_refused(protocol):
    attacks = {name: pickle.dumps(obj, protocol) for name, obj in CRASHES.items()}
    assert _safe_loads_in_a_child(attacks) == dict.fromkeys(CRASHES, "CorruptError")


def test_nesting_that_crashes_cpython_is_refused():
    assert _safe_loads_in_a_child(NESTING_CRASHES) == dict.fromkeys(NESTING_CRASHES, "CorruptError")


def test_nesting_up_to_the_limit_loads():
    assert blpickle.loads(b"\x80\x04}N" + b"\x85" * 999 + b"Ns.", safe=True)
    assert type(blpickle.loads(_alternating_nesting(400), safe=True)) is frozenset
    deques, levels = blpickle.loads(_nested_deques(998), safe=True), 0
    while deques:
        (deques,), levels = deques, levels + 1
    assert type(deques) is collections.deque and levels == 998
    arrays = blpickle.loads(_nested_object_arrays(1000), safe=True)
    assert arrays.dtype == object and arrays[0].dtype == object
    with pytest.raises(blpickle.CorruptError, match="more than 1000 deep"):
        blpickle.loads(_nested_object_arrays(1001), safe=True)
    defaultdicts = blpickle.loads(_nested_defaultdicts(998), safe=True)
    assert type(defaultdicts) is collections.defaultdict and type(defaultdicts[0]) is collections.defaultdict
    filled = blpickle.loads(_deques_filled_after_held(2), safe=True)
    assert filled == collections.deque([collections.deque()])


def test_deques_that_hold_themselves_load():
    ring = collections.deque([1])
    ring.append(ring)
    loaded = blpickle.loads(pickle.dumps(ring), safe=True)
    assert loaded[0] == 1 and loaded[1] is loaded
    inner = collections.deque([collections.deque([2])])
    shared = blpickle.loads(pickle.dumps([inner, collections.deque([inner, inner])]), safe=True)
    assert shared[1][0] is shared[1][1] is shared[0]


def test_records_refuse_the_same_states():
    for name, obj in CRASHES.items():
        with pytest.raises(blpickle.CorruptError):
            blpickle.loads(blpickle.dumps(obj), safe=True)
        assert name


# -- legitimate objects load as pickle loads them -------------------------------------------

CODES = ["?", "b", "B", "<i2", ">i2", "=u4", ">i8", "<f2", ">f4", "f8", "g", ">c8", "c16", "G", "O", "S0", "S7"]
CODES += ["<U0", ">U5", "V0", "V9", "M8", ">M8[D]", "<m8[3us]", "M8[Y]", "m8[as]", "M8[15m]"]
DTYPES = [
    *map(np.dtype, CODES),
    np.dtype([("a", "<i4"), ("b", ">f8")]),
    np.dtype([("a", "u1"), ("b", "f8"), ("c", "i2")], align=True),
    np.dtype([("outer", [("x", ">i2"), ("y", "f4", (2, 3))]), ("z", "S3")]),
    np.dtype([(("title", "name"), "i4"), ("o", "O")]),
    np.dtype({"names": ["a", "b"], "formats": ["i1", "f8"], "offsets": [8, 0], "itemsize": 24}),
    np.dtype(("f4", (2, 3))),
    np.dtype((">i2", 4)),
    np.dtype("f8", metadata={"unit": "m"}),
    np.dtype([("when", "M8[ms]"), ("dt", ">m8[s]")]),
]


def _same_dtype(expected, actual):
    assert isinstance(actual, np.dtype)
    assert actual == expected
    assert actual.str == expected.str
    assert repr(actual) == repr(expected)
    assert actual.isalignedstruct == expected.isalignedstruct
    assert actual.metadata == expected.metadata
    assert actual.fields == expected.fields


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_dtypes_load_as_pickle_loads_them(dtype, protocol):
    for data in (pickle.dumps(dtype, protocol), blpickle.dumps(dtype, protocol)):
        _same_dtype(pickle.loads(pickle.dumps(dtype, protocol)), blpickle.loads(data, safe=True))


def _arrays():
    base = np.arange(24.0).reshape(2, 3, 4)
    objects = np.empty(4, dtype=object)
    objects[:] = [1, "two", (3.0, None), np.arange(3)]
    return {
        "C": base,
        "F": np.asfortranarray(base),
        "strided": base[:, ::2, ::-3],
        "0-d": np.array(7, dtype=">i4"),
        "empty": np.empty((0, 3), dtype="f4"),
        "empty F": np.asfortranarray(np.empty((3, 0, 2), dtype="c8")),
        "zero itemsize": np.empty((3,), dtype="V0"),
        "objects": objects,
        "objects 2-d F": np.asfortranarray(np.array([[1, "a"], [[2], {"b": 3}]], dtype=object)),
        "object fields": np.array([(None, 1), ("x", 2)], dtype=OBJECT_PAIR),
        "structured": np.zeros(3, dtype=DTYPES[-1]),
        "big": np.random.default_rng(0).random(100_000),
    }


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
@pytest.mark.parametrize("name", sorted(_arrays()))
def test_arrays_load_as_pickle_loads_them(name, protocol):
    array = _arrays()[name]
    expected = pickle.loads(pickle.dumps(array, protocol))
    for data in (pickle.dumps(array, protocol), blpickle.dumps(array, protocol)):
        loaded = blpickle.loads(data, safe=True)
        if array.dtype.hasobject:
            assert loaded.dtype == expected.dtype and loaded.shape == expected.shape
            assert loaded.flags.f_contiguous == expected.flags.f_contiguous
            assert repr(loaded.tolist()) == repr(expected.tolist())
        else:
            assert_same_array(expected, loaded)


SCALARS = [
    np.float32(1.5),
    np.float64(-0.0),
    np.longdouble(3),
    np.int8(-3),
    np.uint64(2**64 - 1),
    np.bool_(True),
    np.complex64(1 - 2j),
    np.str_("snake 🐍"),
    np.bytes_(b"ab\0"),
    np.datetime64("2026-01-01T10:00", "ms"),
    np.timedelta64(-5, "D"),
    np.void(b"\1\2\3"),
    np.zeros(1, dtype=[("a", ">i2"), ("b", "f4")])[0],
]


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_numpy_scalars_load_as_pickle_loads_them(protocol):
    for data in (pickle.dumps(SCALARS, protocol), blpickle.dumps(SCALARS, protocol)):
        loaded = blpickle.loads(data, safe=True)
        expected = pickle.loads(pickle.dumps(SCALARS, protocol))
        assert [type(x) for x in loaded] == [type(x) for x in expected]
        assert [x.dtype for x in loaded] == [x.dtype for x in expected]
        assert [x.tobytes() for x in loaded] == [x.tobytes() for x in expected]


@settings(deadline=None)
@given(dtype=dtypes, shape=hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=6), protocol=st.integers(0, 5))
def test_drawn_arrays_load_as_pickle_loads_them(dtype, shape, protocol):
    array = np.zeros(shape, dtype)
    expected = pickle.loads(pickle.dumps(array, protocol))
    loaded = blpickle.loads(pickle.dumps(array, protocol), safe=True)
    assert_same_array(expected, loaded)
    _same_dtype(expected.dtype, loaded.dtype)


hashables = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False),
    st.text(),
    st.binary(),
    st.complex_numbers(allow_nan=False),
)


def _containers(children):
    """Lists, tuples and dicts of ``children``."""
    return st.one_of(
        st.lists(children, max_size=4),
        st.tuples(children),
        st.tuples(children, children, children, children),
        st.dictionaries(hashables, children, max_size=4),
    )


builtins = st.recursive(
    st.one_of(
        hashables,
        st.builds(bytearray, st.binary()),
        st.builds(slice, st.integers(), st.integers() | st.none(), st.integers(1, 5)),
        st.builds(range, st.integers(-5, 5), st.integers(-5, 5), st.integers(1, 3)),
        st.frozensets(hashables, max_size=4),
        st.sets(hashables, max_size=4),
    ),
    _containers,
    max_leaves=20,
)


@settings(deadline=None)
@given(obj=builtins, protocol=st.integers(0, 5))
def test_builtins_load_as_pickle_loads_them(obj, protocol):
    shared = [obj, obj]  # memo references
    data = pickle.dumps(shared, protocol)
    loaded = blpickle.loads(data, safe=True)
    expected = pickle.loads(data)
    assert repr(loaded) == repr(expected)
    assert (loaded[0] is loaded[1]) == (expected[0] is expected[1])
    assert repr(blpickle.loads(blpickle.dumps(shared, protocol), safe=True)) == repr(loaded)


def test_encodings_of_python_2_strings_apply():
    data = b"U\x03\xe9t\xe9q\x00."  # SHORT_BINSTRING 'été' in latin-1, as Python 2 writes it
    assert blpickle.loads(data, safe=True, encoding="latin1") == pickle.loads(data, encoding="latin1")
    assert blpickle.loads(data, safe=True, encoding="bytes") == b"\xe9t\xe9"
    with pytest.raises(blpickle.CorruptError, match="UnicodeDecodeError"):
        blpickle.loads(data, safe=True)
    assert blpickle.loads(b"S'a\\nb'\np0\n.", safe=True) == "a\nb"


# -- out-of-band buffers ------------------------------------------------------------------


def test_out_of_band_buffers_of_records_and_plain_pickles():
    obj = {"a": np.arange(100_000), "b": np.ones((300, 200)).T, "p": pickle.PickleBuffer(b"read only")}
    taken = []
    record = blpickle.dumps(obj, buffer_callback=taken.append)
    loaded = blpickle.loads(record, safe=True, buffers=taken)
    assert_same_array(obj["b"], np.array(loaded["b"]))
    np.testing.assert_array_equal(loaded["a"], obj["a"])
    assert memoryview(loaded["p"]).readonly and bytes(loaded["p"]) == b"read only"
    taken = []
    plain = pickle.dumps(obj, 5, buffer_callback=taken.append)
    loaded = blpickle.loads(plain, safe=True, buffers=taken)
    expected = pickle.loads(plain, buffers=taken)
    np.testing.assert_array_equal(loaded["b"], expected["b"])
    assert loaded["a"].flags.writeable == expected["a"].flags.writeable
    assert memoryview(loaded["p"]).readonly and bytes(loaded["p"]) == b"read only"
    with pytest.raises(blpickle.CorruptError, match="no buffers"):
        blpickle.loads(plain, safe=True)
    with pytest.raises(blpickle.CorruptError, match="more out-of-band buffers"):
        blpickle.loads(plain, safe=True, buffers=taken[:1])


def test_records_with_spliced_payloads_and_compression():
    obj = {"big": b"x" * (3 << 20), "text": "y" * (2 << 20), "array": np.arange(1_000_000)}
    for options in ({}, {"codec": None}, {"chunk_size": 4096}):
        loaded = blpickle.loads(blpickle.dumps(obj, **options), safe=True)
        assert loaded["big"] == obj["big"] and loaded["text"] == obj["text"]
        np.testing.assert_array_equal(loaded["array"], obj["array"])


def test_file_objects_are_left_after_the_pickle():
    file = io.BytesIO(pickle.dumps([1], 5) + pickle.dumps({2}, 0) + blpickle.dumps((3,)))
    assert [blpickle.load(file, safe=True) for _ in range(3)] == [[1], {2}, (3,)]


# -- malformed input ---------------------------------------------------------------------------

SAMPLE = {"a": [1, 2.5, "x", b"y", None, True], "n": np.arange(6.0).reshape(2, 3), "d": np.dtype("M8[s]")}


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_every_truncation_is_a_load_error(protocol):
    data = pickle.dumps(SAMPLE, protocol)
    for end in range(len(data)):
        with pytest.raises(blpickle.LoadError):
            blpickle.loads(data[:end], safe=True)


@settings(deadline=None, max_examples=300)
@given(
    protocol=st.integers(0, 5),
    flips=st.lists(st.tuples(st.integers(0, 10**6), st.integers(1, 255)), min_size=1, max_size=4),
)
def test_damaged_pickles_give_load_errors_only(protocol, flips):
    data = bytearray(pickle.dumps(SAMPLE, protocol))
    for position, mask in flips:
        data[position % len(data)] ^= mask
    with contextlib.suppress(blpickle.LoadError):
        blpickle.loads(bytes(data), safe=True)


MALFORMED = {
    b"": "truncated",
    b"\x80\x06.": "protocol",
    b"0.": "MARK",
    b"(.": "nothing on its stack",
    b"t.": "MARK",
    b"h\x05.": "memo entry 5",
    b"\x95\xff\xff\xff\xff\xff\xff\xff\x7fN.": "truncated",
    b"\x8e\xff\xff\xff\xff\xff\xff\xff\x7f": "truncated",
    b"\x95\x0a" + bytes(7) + b"\x95\x01" + bytes(7) + b"N.": "inside the previous frame",
    b"\x95\x03\x00\x00\x00\x00\x00\x00\x00\x8c\x02ab.": "past the end of its frame",
    b"K\x01K\x02K\x03s.": "SETITEM",
    b"N)R.": "not callable",
    b"}]\x94h\x00s.": "unhashable",
    b"(K\x01K\x02K\x03d.": "pairs",
    b"P1\n.": "persistent",
    b"\x82\x01.": "extension code",
    b"\x8c\x08builtins\x8c\x03set\x93J\x00\xca\x9a;\x85R.": "set\\(\\) takes a list",
    b"\x8c\x08builtins\x8c\tbytearray\x93J\x00\xca\x9a;\x85R.": "bytearray\\(\\) takes bytes",
    b"\x8c\x05numpy\x8c\x07ndarray\x93J\x00\xca\x9a;\x85R.": "reconstructors",
    b"\x8c\x05numpy\x8c\x05dtype\x93\x8c\x03f8x\x85R.": "data type",
    b"\x8c\x05numpy\x8c\x05dtype\x93\x8c\x02f8\x85R.": "state",
    b"\x8c\x05numpy\x8c\x05dtype\x93\x8c\x02f8\x85R\x94h\x00.": "recursive",
    b"\x8c\x05numpy\x8c\x05dtype\x93\x8c\x02f8\x85R2.": "copies a dtype, array or object before",
}


@pytest.mark.parametrize("data", sorted(MALFORMED), ids=repr)
def test_malformed_pickles_are_load_errors(data):
    with pytest.raises(blpickle.LoadError, match=MALFORMED[data]):
        blpickle.loads(data, safe=True)


def test_opcodes_python_3_never_writes_are_refused():
    for data in (b"(S'x'\nibuiltins\nset\n.", b"(cbuiltins\nset\no."):
        with pytest.raises(blpickle.UnsafeLoadError, match=r"INST|OBJ"):
            blpickle.loads(data, safe=True)


# -- types the caller allows keep pickle's BUILD ------------------------------------------------


class WithState:
    def __init__(self):
        self.x = [1, 2]

    def __setstate__(self, state):
        self.__dict__.update(state, restored=True)


class WithSlots:
    __slots__ = ("__dict__", "a")

    def __init__(self):
        self.a = 1
        self.b = 2


class Listish(list):
    pass


def test_allowed_types_are_rebuilt_as_pickle_does():
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        obj = [WithState(), Listish([1, 2]), {"k": WithSlots()} if protocol >= 2 else {}]  # slots need 2
        loaded = blpickle.loads(pickle.dumps(obj, protocol), allowed=["test_restricted.*"])
        assert loaded[0].__dict__ == {"x": [1, 2], "restored": True}
        assert type(loaded[1]) is Listish and loaded[1] == [1, 2]
        if protocol >= 2:
            assert (loaded[2]["k"].a, loaded[2]["k"].b) == (1, 2)


class Boom(Exception):
    pass


def explode():
    raise Boom("from the caller's code")


def test_errors_of_allowed_code_pass_through_unchanged():
    data = b"\x8c\x0ftest_restricted\x8c\x07explode\x93)R."
    with pytest.raises(Boom):
        blpickle.loads(data, allowed=[explode])
    with pytest.raises(Boom):
        RestrictedUnpickler(io.BytesIO(data), Policy([explode])).load()


def _global2(module, name):
    return f"c{module}\n{name}\n".encode()


#: Classes that safe=True admits by itself, given what they refuse.
REFUSED_BY_ADMITTED_CODE = {
    "ZoneInfo with no key": b"\x80\x02" + _global2("zoneinfo", "ZoneInfo") + b")R.",
    "a numpy named tuple with no fields": b"\x80\x02"
    + _global2("numpy.lib._arraysetops_impl", "UniqueAllResult")
    + b")R.",
    "a UUID given an empty state": b"\x80\x02" + _global2("uuid", "UUID") + b")R}b.",
    "an OrderedDict given an int as state": b"\x80\x02" + _global2("collections", "OrderedDict") + b")RK\x01b.",
}


@pytest.mark.parametrize("name", REFUSED_BY_ADMITTED_CODE)
def test_what_code_admitted_as_data_refuses_is_a_damaged_pickle(name):
    with pytest.raises(blpickle.CorruptError, match="refuses what the pickle gives it") as caught:
        blpickle.loads(REFUSED_BY_ADMITTED_CODE[name], safe=True)
    assert caught.value.__cause__ is not None  # what the class raised, kept as the cause


def test_a_uuid_has_a_number_of_128_bits():
    import uuid

    made = uuid.uuid4()
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        assert blpickle.loads(pickle.dumps(made, protocol), safe=True) == made
    start = b"\x80\x02" + _global2("uuid", "UUID") + b")R"
    with pytest.raises(blpickle.CorruptError, match="an int of 128 bits, not 'abc'"):
        blpickle.loads(start + b"}U\x03intU\x03abcsb.", safe=True)
    with pytest.raises(blpickle.CorruptError, match="an int of 128 bits"):
        blpickle.loads(start + b"}U\x03intJ\xff\xff\xff\xffsb.", safe=True)  # -1
    with pytest.raises(blpickle.CorruptError, match="before every dtype, array and object it made got its state"):
        blpickle.loads(start + b".", safe=True)
    with pytest.raises(blpickle.CorruptError, match="copies a dtype, array or object before its state is set"):
        blpickle.loads(start + b"2b.", safe=True)  # DUP: a UUID without its state is not reachable


def _repr_bomb(levels):
    """``complex([L, L])``: each list holds the one before it twice, 2**levels items in its repr."""
    data = b"\x80\x04\x8c\x08builtins\x8c\x07complex\x93](K\x00K\x00e"
    for level in range(levels):
        data += b"\x940(h" + bytes([level]) + b"h" + bytes([level]) + b"l"
    return data + b"\x85R."


def test_error_messages_show_a_bounded_part_of_what_they_name():
    with pytest.raises(blpickle.CorruptError, match=r"complex\(\) takes numbers") as caught:
        blpickle.loads(_repr_bomb(60), safe=True)  # its repr: 2**60 lists
    assert len(str(caught.value)) < 300
    with pytest.raises(blpickle.CorruptError, match="an int of 80000 bits"):
        blpickle.loads(pickle.dumps(Reduces(complex, ([1 << 79_999],))), safe=True)


#: What the libraries of vetted reconstructors raise for what they refuse: each a CorruptError.
LIBRARY_ERRORS = {
    "ZeroDivisionError": b"\x80\x04\x8c\tfractions\x8c\x08Fraction\x93K\x01K\x00\x86R.",
    "InvalidOperation": b"\x80\x04\x8c\x07decimal\x8c\x07Decimal\x93\x8c\x191E99999999999999999999999\x85R.",
    "PickleError": b"\x80\x04\x8c\x1anumpy.random.bit_generator\x8c\x1b__pyx_unpickle_SeedSequence\x93"
    b"\x8c\x1anumpy.random.bit_generator\x8c\x0cSeedSequence\x93K\x00N\x87R.",
}


@pytest.mark.parametrize("error", LIBRARY_ERRORS)
def test_what_a_vetted_reconstructor_refuses_is_a_damaged_pickle(error):
    with pytest.raises(blpickle.CorruptError, match=error) as caught:
        blpickle.loads(LIBRARY_ERRORS[error], safe=True)
    assert type(caught.value.__cause__).__name__ == error


def test_short_reads_of_a_stream_are_completed():
    data = pickle.dumps({"a": np.arange(1000), "b": b"x" * 5000}, 5) + pickle.dumps([1], 0)
    stream = NonSeekable(data, max_read=7)
    loaded = blpickle.load(stream, safe=True)
    np.testing.assert_array_equal(loaded["a"], np.arange(1000))
    assert loaded["b"] == b"x" * 5000
    assert blpickle.load(stream, safe=True) == [1]


def test_declared_sizes_are_not_allocated_before_the_data_is_there(tmp_path):
    path = tmp_path / "huge.pkl"
    path.write_bytes(b"\x80\x05\x8e" + (1 << 62).to_bytes(8, "little") + b"x" * 100)  # BINBYTES8 of 4 EiB
    with open(path, "rb") as file, pytest.raises(blpickle.TruncatedError):
        blpickle.load(file, safe=True)


def test_a_long_line_is_refused_from_a_non_seekable_file_too():
    """Plain pickle data read from a pipe goes through the prefix of the bytes already read:
    its readline must stop at the line limit as a seekable file's does, not read the line whole."""
    pickled = b"\x80\x02I" + b"1" * (8 << 20) + b"\n."
    consumed = []

    class Pipe(NonSeekable):
        def readinto(self, buffer):
            consumed.append(super().readinto(buffer))
            return consumed[-1]

    with pytest.raises(blpickle.LoadError):
        blpickle.load(Pipe(pickled, max_read=1 << 16), safe=True)
    assert sum(consumed) < 2 << 20  # stopped after the limit, far before the line's end
