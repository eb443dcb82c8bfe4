"""The record layout: magic, header and trailer encoding and their validation."""

import pickle

import msgpack
import pytest
from conftest import JOBLIB_PREFIXES

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


def test_frame_index_round_trips_and_checks_its_length():
    index = fmt.FrameIndex([24, 500], [100, 200], [2**64 - 1, 0])
    assert fmt.FrameIndex.decode(index.encode(), 2) == index
    with pytest.raises(blpickle.CorruptError, match="frames"):
        fmt.FrameIndex.decode(index.encode(), 3)


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
