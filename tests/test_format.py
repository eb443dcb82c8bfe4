"""The record layout: magic, header and trailer encoding and their validation."""

import io
import pickle
import re
from unittest import mock

import msgpack
import numpy as np
import pytest
from bombs import peak_allocated
from conftest import JOBLIB_PREFIXES
from hypothesis import example, given
from hypothesis import strategies as st
from records import split

import blpickle
from blpickle import format as fmt

# Prefixes of the formats a blpickle record must never be mistaken for (design.md).
FOREIGN_PREFIXES = [*JOBLIB_PREFIXES, b"\x93NUMPY", b"PK"]


def test_magic_collides_with_no_other_format():
    for prefix in FOREIGN_PREFIXES:
        assert not fmt.MAGIC.startswith(prefix)
    # not a pickle opcode either: plain pickle data of any protocol never starts like a record
    assert fmt.MAGIC[:1].decode("latin-1") not in {op.code for op in __import__("pickletools").opcodes}


def test_preamble_round_trips_and_rejects_bad_input():
    assert fmt.decode_preamble(fmt.encode_preamble(1234)) == (fmt.VERSION_MINOR, 0, 1234)
    with pytest.raises(blpickle.BadMagicError, match="magic"):
        fmt.decode_preamble(b"\x80" * fmt.PREAMBLE.size)
    future = fmt.PREAMBLE.pack(fmt.MAGIC, fmt.VERSION_MAJOR + 1, 0, 0, 10)
    with pytest.raises(blpickle.UnsupportedVersionError, match=r"2\.0"):
        fmt.decode_preamble(future)
    with pytest.raises(blpickle.LimitError, match="header size"):
        fmt.decode_preamble(fmt.encode_preamble(fmt.MAX_HEADER_SIZE + 1))


def _header(**changes):
    header = fmt.Header(
        options=blpickle.Options().to_dict(),
        protocol=5,
        streams=(fmt.StreamInfo(100, 4096), fmt.StreamInfo(80, 4096, 8, False, "float64", (10,))),
        external=(1,),
    )
    doc = msgpack.unpackb(header.encode())
    doc.update(changes)
    return msgpack.packb(doc)


def test_header_round_trips():
    header = fmt.Header.decode(_header())
    assert header.streams[1] == fmt.StreamInfo(80, 4096, 8, False, "float64", (10,))
    assert header.external == (1,)
    assert fmt.Header.decode(header.encode()) == header


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"protocol": 6}, "protocol"),
        ({"protocol": "5"}, "protocol"),
        ({"streams": []}, "streams"),
        ({"streams": [{"nbytes": -1, "chunk_size": 1, "itemsize": 1, "raw": False}]}, "size"),
        ({"streams": [{"nbytes": 10, "chunk_size": 0, "itemsize": 1, "raw": False}]}, "chunk size"),
        ({"streams": [{"nbytes": 10, "chunk_size": 2**31, "itemsize": 1, "raw": False}]}, "chunk size"),
        ({"streams": [{"nbytes": 10, "chunk_size": 10, "itemsize": 0, "raw": False}]}, "itemsize"),
        ({"streams": [{"nbytes": 10, "chunk_size": 10, "itemsize": 1}]}, "raw"),
        ({"streams": [{"nbytes": 10, "chunk_size": 10, "itemsize": 1, "raw": False, "shape": [-1]}]}, "shape"),
        ({"streams": [5]}, "map"),
        ({"external": [2, 1]}, "external"),
        ({"external": [-1]}, "external"),
        ({"options": None}, "options"),
    ],
)
def test_bad_headers_raise_load_errors_saying_what_is_wrong(changes, message):
    with pytest.raises(blpickle.LoadError, match=message) as info:
        fmt.Header.decode(_header(**changes))
    assert isinstance(info.value, pickle.UnpicklingError)


def test_garbage_is_not_a_header():
    for garbage in (b"", b"\xc1", b"\x91\x01", msgpack.packb([1, 2])):
        with pytest.raises(blpickle.CorruptError):
            fmt.Header.decode(garbage)


def test_chunk_index_round_trips_and_checks_its_length():
    index = fmt.ChunkIndex([24, 500], [100, 200], [2**64 - 1, 0])
    assert fmt.ChunkIndex.decode(index.encode(), 2) == index
    with pytest.raises(blpickle.CorruptError, match="chunks"):
        fmt.ChunkIndex.decode(index.encode(), 3)


def test_stream_chunking():
    stream = fmt.StreamInfo(10_000, 4096)
    assert stream.nchunks == 3
    assert list(stream.chunk_spans()) == [(0, 4096), (4096, 8192), (8192, 10_000)]
    assert fmt.StreamInfo(0, 4096).nchunks == 0
    raw = fmt.StreamInfo(10_000, 10_000, raw=True)
    assert raw.nchunks == 1
    assert list(raw.chunk_spans()) == [(0, 10_000)]


def test_raw_padding_aligns_payloads():
    for offset in range(200):
        assert (offset + fmt.raw_padding(offset) + fmt.U64.size) % fmt.ALIGNMENT == 0


# Headers built to cost memory: each declares or nests far more than its bytes hold. 2 MiB
# headers suffice, since what a header may cost is a multiple of its size (format.md, Limits).
_SIZE = 2 << 20


def _doc(**changes):
    doc = msgpack.unpackb(_header())
    doc.update(changes)
    return doc


def _raw(**encoded):
    """Return a header whose fields are ``_doc()``'s, or these msgpack encodings."""
    fields = {key: msgpack.packb(value) for key, value in _doc().items()} | encoded
    return bytes([0x80 | len(fields)]) + b"".join(msgpack.packb(key) + value for key, value in fields.items())


def _nested(depth):
    return b"\x91" * depth + b"\x90"


_STREAM = {"nbytes": 1000, "chunk_size": 1000, "itemsize": 1, "raw": False}
HEADER_BOMBS = {
    "options of empty lists": msgpack.packb(_doc(options={"x": [[]] * _SIZE})),
    "options of 16-wide nested lists": msgpack.packb(_doc(options={"x": [[[[[]] * 16] * 16] * 16] * 16})),
    "options nested deeply": _raw(options=b"\x81\xa1x" + _nested(1000)),
    "options with many keys": msgpack.packb(_doc(options={str(i): 0 for i in range(_SIZE // 8)})),
    "external unsorted": msgpack.packb(_doc(external=[300] * (_SIZE // 3))),
    "external of empty lists": msgpack.packb(_doc(external=[[]] * _SIZE)),
    "external of maps": msgpack.packb(_doc(external=[{}] * _SIZE)),
    "stream maps nesting lists": msgpack.packb(_doc(streams=[{**_STREAM, "x": [[[]] * 15] * 15}] * 1000)),
    "a stream map with many keys": msgpack.packb(_doc(streams=[{**_STREAM, **{str(i): 0 for i in range(_SIZE // 8)}}])),
    "a header with many keys": msgpack.packb({str(i): 0 for i in range(_SIZE // 8)}),
    "an unknown key nested too deeply": _raw(extra=_nested(100_000)),
    "an array declaring 2**32-1 items": b"\x81\xa7options\xdd\xff\xff\xff\xff",
    "a map declaring 2**32-1 items": b"\x81\xa7options\xdf\xff\xff\xff\xff",
    "streams declaring 2**22": b"\x81\xa7streams\xdd\x00\x40\x00\x00" + msgpack.packb(_STREAM) * 1000,
}


@pytest.mark.parametrize("name", HEADER_BOMBS)
def test_header_bombs_are_refused_within_a_multiple_of_their_size(name):
    data = HEADER_BOMBS[name]
    failed = []

    def decode():
        with pytest.raises(blpickle.CorruptError) as info:
            fmt.Header.decode(data)
        failed.append(info.value)

    assert peak_allocated(decode) < fmt.HEADER_COST * len(data) + (1 << 20)
    assert "header" in str(failed[0])


HEADERS_THAT_COST = {
    "external of many buffers": _doc(external=list(range(70_000, 70_000 + _SIZE // 5))),
    "many stream maps": _doc(streams=[{**_STREAM, "dtype": "ab", "codec": "cd", "shape": [300] * 64}] * 8000),
    "long strings": _doc(options={"x": "a" * _SIZE}, streams=[{**_STREAM, "dtype": "b" * _SIZE}]),
    "unknown keys": _doc(extra=[[[[[]] * 30] * 30] * 30] * 30, streams=[{**_STREAM, "later": [[1, 2], {"a": [3]}]}]),
    "unknown keys of empty maps": _doc(extra=[[[{}] * 64] * 64] * 16),
}


@pytest.mark.parametrize("name", HEADERS_THAT_COST)
def test_valid_headers_cost_a_multiple_of_their_size(name):
    data = msgpack.packb(HEADERS_THAT_COST[name])
    decoded = []
    assert peak_allocated(lambda: decoded.append(fmt.Header.decode(data))) < fmt.HEADER_COST * len(data) + (1 << 20)
    assert len(decoded[0].streams) == len(HEADERS_THAT_COST[name]["streams"])
    assert list(decoded[0].external) == HEADERS_THAT_COST[name]["external"]


def test_a_header_read_in_one_call_costs_a_multiple_of_its_size():
    # the most one call allocates: arrays nested as deep as msgpack goes, each declaring 64
    # items, and empty maps (a dict for each byte) in the rest of the size it takes
    deep = b"\x81\xa5later" + b"\xdc\x00\x40" * 1100
    fixed = len(msgpack.packb(_doc(later=[])))
    maps = msgpack.packb(_doc(later=[[[{}] * 64] * ((fmt.SMALL_DOCUMENT_SIZE - fixed - 7) // 134)] * 2))
    assert len(deep) < len(maps) <= fmt.SMALL_DOCUMENT_SIZE
    assert fmt.header._small_header(maps) is not None
    decoded = []
    for data in (deep, maps):

        def decode(data=data):
            try:
                decoded.append(fmt.Header.decode(data))
            except blpickle.CorruptError as exc:
                decoded.append(exc)

        assert peak_allocated(decode) < fmt.HEADER_COST * len(data) + (1 << 20)
    assert isinstance(decoded[0], blpickle.CorruptError) and isinstance(decoded[1], fmt.Header)


def test_header_structure_errors_say_what_is_wrong():
    cases = [
        ({"options": {"x": list(range(65))}}, "options.*65"),
        ({"streams": [{**_STREAM, "shape": list(range(65))}]}, "stream 0.*65"),
        ({"external": {"a": 1}}, "'external' must be an array"),
        ({"external": [1, 1]}, "ascending"),
        ({"external": [0, True]}, "integers"),
    ]
    for changes, message in cases:
        with pytest.raises(blpickle.CorruptError, match=message):
            fmt.Header.decode(msgpack.packb(_doc(**changes)))
    doc = msgpack.packb(_doc())
    twice = bytes([doc[0] + 1]) + doc[1:] + msgpack.packb("protocol") + msgpack.packb(5)
    with pytest.raises(blpickle.CorruptError, match="'protocol' appears twice"):
        fmt.Header.decode(twice)
    with pytest.raises(blpickle.CorruptError, match="bytes after its end"):
        fmt.Header.decode(doc + b"\x00")
    with pytest.raises(blpickle.CorruptError, match="keys must be strings"):
        fmt.Header.decode(bytes([doc[0] + 1]) + doc[1:] + msgpack.packb(1) + msgpack.packb(5))
    assert fmt.Header.decode(msgpack.packb(_doc(later={"a": [1, 2]}))) == fmt.Header.decode(doc)


def _outcome(decode, data):
    """What ``decode(data)`` gives: its result, or the type and message of its LoadError."""
    try:
        return decode(data)
    except blpickle.LoadError as exc:
        return type(exc), str(exc)


def _both_ways(decode, small, data):
    """What ``decode(data)`` gives, in one call where it can and piece by piece (``small``,
    the one-call reader, patched out)."""
    module = fmt.header if small == "_small_header" else fmt.trailer
    with mock.patch.object(module, small, return_value=None):
        piecewise = _outcome(decode, data)
    return _outcome(decode, data), piecewise


_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=4)
    | st.binary(max_size=4),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=2), inner, max_size=3),
    max_leaves=8,
) | st.integers(10, 20).map(lambda depth: msgpack.unpackb(_nested(depth)))  # over the limit of 16 containers from 16
_HEADER_KEYS = ["options", "protocol", "streams", "external", "later"]
_STREAM_KEYS = [*fmt.StreamInfo._fields, "later"]


_DEEP = msgpack.unpackb(_nested(16))  # 17 arrays: over the limit of a field


@given(
    changes=st.dictionaries(st.sampled_from(_HEADER_KEYS), _VALUES, max_size=2),
    stream_changes=st.dictionaries(st.sampled_from(_STREAM_KEYS), _VALUES, max_size=2),
    option_changes=st.dictionaries(st.text(max_size=2), _VALUES, max_size=2),
    dropped=st.lists(st.sampled_from(_HEADER_KEYS), max_size=1),
    cut=st.integers(0, 3),
)
@example(changes={"protocol": _DEEP}, stream_changes={}, option_changes={}, dropped=[], cut=0)
@example(changes={}, stream_changes={"later": _DEEP}, option_changes={}, dropped=[], cut=0)
@example(changes={}, stream_changes={}, option_changes={"x": _DEEP}, dropped=[], cut=0)
@example(changes={"later": _DEEP}, stream_changes={}, option_changes={}, dropped=[], cut=0)
def test_a_header_decodes_the_same_in_one_call_and_piece_by_piece(
    changes, stream_changes, option_changes, dropped, cut
):
    doc = msgpack.unpackb(_header())
    doc["options"].update(option_changes)
    doc["streams"][1].update(stream_changes)
    doc.update(changes)
    for key in dropped:
        doc.pop(key, None)
    data = msgpack.packb(doc)
    for variant in (data, data[: len(data) - cut] + b"\xc0" * cut):
        one_call, piecewise = _both_ways(fmt.Header.decode, "_small_header", variant)
        assert one_call == piecewise


def _many_streams(at, encoded):
    """A header of 400 streams (over `SMALL_DOCUMENT_SIZE`: read in runs) whose stream ``at``
    is encoded as ``encoded``."""
    stream = {**_STREAM, "itemsize": 8, "dtype": "float64", "shape": [125], "codec": "lz4", "order": "C"}
    maps = [msgpack.packb({**stream, "name": f"[{i}]"}) for i in range(400)]
    maps[at] = encoded
    fields = {key: msgpack.packb(value) for key, value in _doc(streams=[]).items() if key != "streams"}
    fields["streams"] = b"\xdc" + len(maps).to_bytes(2, "big") + b"".join(maps)
    return bytes([0x80 | len(fields)]) + b"".join(msgpack.packb(key) + value for key, value in fields.items())


@given(
    at=st.integers(1, 399),
    changes=st.dictionaries(st.sampled_from(_STREAM_KEYS), _VALUES, max_size=2),
    garbage=st.sampled_from([None, b"\xc1", b"\xc0", b"\x91\xc1", b"\xdc\xff\xff"]),
)
@example(at=200, changes={"later": _DEEP}, garbage=None)
@example(at=200, changes={"dtype": _DEEP}, garbage=None)
@example(at=399, changes={}, garbage=b"\xdc\xff\xff")
def test_a_header_of_many_streams_decodes_the_same_in_runs_and_a_map_at_a_time(at, changes, garbage):
    stream = {**_STREAM, "itemsize": 8, "dtype": "float64", "shape": [125], "codec": "lz4", "order": "C"}
    data = _many_streams(at, garbage if garbage is not None else msgpack.packb({**stream, **changes}))
    assert len(data) > fmt.SMALL_DOCUMENT_SIZE
    with mock.patch.object(fmt.header, "small_values", return_value=None):
        one_at_a_time = _outcome(fmt.Header.decode, data)
    assert _outcome(fmt.Header.decode, data) == one_at_a_time
    if garbage is not None:
        assert one_at_a_time[0] is blpickle.CorruptError
        assert re.search(rf"header stream {at}\b", one_at_a_time[1])


def _repeating(doc, key):
    """``doc`` encoded with ``key`` given twice: first holding 17 nested arrays, then its value."""
    body = msgpack.packb(doc)
    return bytes([body[0] + 1]) + msgpack.packb(key) + _nested(16) + body[1:]


@pytest.mark.parametrize(
    "data",
    [
        _raw(options=_repeating(blpickle.Options().to_dict(), "codec")),
        _raw(streams=b"\x91" + _repeating({**_STREAM, "dtype": "f8"}, "dtype")),
        _many_streams(200, _repeating({**_STREAM, "dtype": "f8"}, "dtype")),
    ],
    ids=["options", "a stream of a small header", "a stream of a large header"],
)
def test_a_map_repeating_a_key_is_checked_as_a_map_read_alone_is(data):
    """The value the repetition drops is still within the limits: no way round them."""
    with pytest.raises(blpickle.CorruptError, match="more than 16 maps and arrays"):
        fmt.Header.decode(data)


@given(
    changes=st.dictionaries(st.sampled_from(["offsets", "csizes", "checksums", "signature", "later"]), _VALUES),
    authenticated=st.booleans(),
)
@example(changes={"signature": _DEEP}, authenticated=False)
@example(changes={"later": 1}, authenticated=True)
def test_a_trailer_decodes_the_same_in_one_call_and_piece_by_piece(changes, authenticated):
    data = msgpack.packb({**_INDEX, "signature": "ab" * 32, **changes})
    decode = lambda data: fmt.ChunkIndex.decode(data, 3, authenticated=authenticated)  # noqa: E731
    one_call, piecewise = _both_ways(decode, "_small_trailer", data)
    assert one_call == piecewise


def test_headers_and_trailers_of_few_streams_are_read_in_one_call():
    arrays = {str(i): np.arange(10.0) for i in range(20)}
    parts = split(blpickle.dumps(arrays, codec=None))
    assert fmt.header._small_header(msgpack.packb(parts.header)) is not None
    assert fmt.trailer._small_trailer(msgpack.packb(parts.trailer), 21, authenticated=False) is not None
    many = split(blpickle.dumps({**arrays, **{f"x{i}": np.arange(3) for i in range(64)}}, codec=None))
    header = msgpack.packb(many.header)
    assert fmt.header._small_header(header) is None
    streams = tuple(fmt.StreamInfo(**{**s, "shape": tuple(s["shape"])}) for s in many.header["streams"][1:])
    assert fmt.Header.decode(header).streams[1:] == streams


@pytest.mark.slow
def test_records_with_many_out_of_band_buffers_load():
    arrays = [np.full(3, i, dtype=np.int32) for i in range(100_000)]
    data = blpickle.dumps(arrays, codec=None)
    assert len(split(data).header["streams"]) == 100_001
    loaded = blpickle.loads(data)
    assert len(loaded) == 100_000
    assert all((a == b).all() for a, b in zip(arrays, loaded, strict=True))


def test_dump_refuses_a_header_over_the_limit(monkeypatch):
    monkeypatch.setattr(fmt, "MAX_HEADER_SIZE", 2000)
    file = io.BytesIO()
    with pytest.raises(blpickle.DumpError, match=r"header takes \d+ bytes .*over the 2000"):
        blpickle.dump([np.zeros(3) for _ in range(100)], file, codec=None)
    assert file.getvalue() == b""


_INDEX = {"offsets": [24, 500, 900], "csizes": [100, 200, 300], "checksums": [1, 2, 3]}
TRAILER_BOMBS = {
    "arrays of empty lists": msgpack.packb({**_INDEX, "offsets": [[]] * _SIZE}),
    "more entries than frames": msgpack.packb({**_INDEX, "csizes": [300] * (_SIZE // 3)}),
    "negative integers": msgpack.packb({**_INDEX, "checksums": [-1, -2, -3]}),
    "a signature of many maps": msgpack.packb({**_INDEX, "signature": [{}] * _SIZE}),
    "a map declaring 2**32-1 items": b"\xdf\xff\xff\xff\xff",
}


@pytest.mark.parametrize("name", TRAILER_BOMBS)
def test_trailer_bombs_are_refused_within_a_multiple_of_their_size(name):
    data = TRAILER_BOMBS[name]

    def decode():
        with pytest.raises(blpickle.CorruptError, match="trailer"):
            fmt.ChunkIndex.decode(data, 3)

    assert peak_allocated(decode) < fmt.HEADER_COST * len(data) + (1 << 20)


def test_trailers_cost_a_multiple_of_their_size():
    nframes = _SIZE // 20
    index = fmt.ChunkIndex(list(range(1 << 32, (1 << 32) + nframes)), [300] * nframes, [2**64 - 1] * nframes)
    data = msgpack.packb({**msgpack.unpackb(index.encode()), "later": [[[[]] * 30] * 30] * 30})
    decoded = []
    peak = peak_allocated(lambda: decoded.append(fmt.ChunkIndex.decode(data, nframes)))
    assert peak < fmt.HEADER_COST * len(data) + (1 << 20)
    assert decoded[0] == index
    with pytest.raises(blpickle.CorruptError, match="'later' is outside the signature"):
        fmt.ChunkIndex.decode(data, nframes, authenticated=True)


@pytest.mark.parametrize(
    "data", [b"\xc1", b"\x81\xa7streams\xc1", b"\x81\xa8external\x92\x01\xc1", b"\x81\xa7options\xc1"]
)
def test_bad_msgpack_in_a_header_is_a_corrupt_error_naming_where(data):
    with pytest.raises(blpickle.CorruptError, match="not valid msgpack within the limits") as raised:
        fmt.Header.decode(data)
    assert "header" in str(raised.value) and raised.value.__suppress_context__
