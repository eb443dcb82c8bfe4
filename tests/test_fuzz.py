"""Fuzzing: mutated records (flips, truncations, inflated sizes and counts, overlapping
offsets, header bombs), with and without their checksums fixed, only ever raise LoadErrors
or load the right object. Never a crash, a hang, a MemoryError or wrong data.

The default profile runs a few hundred cases; a long run is one command away:
``pytest tests/test_fuzz.py --hypothesis-profile=fuzz``.
"""

from __future__ import annotations

import copy
import pickle

import numpy as np
import records
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import blpickle
from blpickle import format as fmt

OBJECT = {
    "ints": np.arange(30_000) // 3,
    "floats": np.linspace(0, 1, 20_000)[::-2],
    "text": "x" * 100,
    "blob": bytes(range(256)) * 4096,  # spliced out of the pickle
}
RECORDS = [
    blpickle.dumps(OBJECT, chunk_size=65536),
    blpickle.dumps(OBJECT, codec=None),
    blpickle.dumps(OBJECT, codec="lz4", chunk_size=65536, key=b"k"),
]


def _check(data: bytes) -> None:
    if sum(a == b for a, b in zip(data, fmt.MAGIC, strict=False)) < len(fmt.MAGIC) // 2:
        return  # no longer claims to be a record: loads reads it as plain pickle data
    try:
        loaded = blpickle.loads(data)
    except blpickle.LoadError:
        return
    except MemoryError as exc:  # pragma: no cover - the failure this test looks for
        raise AssertionError("a declared size caused a MemoryError") from exc
    assert isinstance(loaded, dict) and loaded.keys() == OBJECT.keys()
    for key in ("ints", "floats"):
        assert loaded[key].dtype == OBJECT[key].dtype and np.array_equal(loaded[key], OBJECT[key])
    assert loaded["text"] == OBJECT["text"]
    assert loaded["blob"] == OBJECT["blob"]


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(
    record=st.sampled_from(RECORDS),
    edits=st.lists(st.tuples(st.integers(0, 2**32), st.integers(1, 255)), min_size=1, max_size=8),
    cut=st.one_of(st.none(), st.integers(0, 2**32)),
    insert=st.one_of(st.none(), st.tuples(st.integers(0, 2**32), st.binary(min_size=1, max_size=16))),
)
def test_byte_level_damage(record, edits, cut, insert):
    data = bytearray(record)
    for position, mask in edits:
        data[position % len(data)] ^= mask
    if insert is not None:
        position = insert[0] % len(data)
        data[position:position] = insert[1]
    if cut is not None:
        del data[cut % len(data) :]
    _check(bytes(data))


SIZES = st.sampled_from([0, 1, 7, 4095, 4096, 2**31, 2**32 + 1, 2**40, 2**62, 2**63, 2**64 - 1, -1])


@st.composite
def header_mutations(draw, header):
    header = copy.deepcopy(header)
    streams = header["streams"]
    stream = streams[draw(st.integers(0, len(streams) - 1))]
    kind = draw(st.sampled_from(["field", "drop", "duplicate", "external", "type", "bomb"]))
    if kind == "field":
        field = draw(st.sampled_from(["nbytes", "chunk_size", "itemsize", "raw", "shape", "dtype", "splice"]))
        stream[field] = draw(
            st.one_of(SIZES, st.booleans(), st.lists(SIZES, max_size=3), st.text(max_size=5), st.none())
        )
    elif kind == "drop":
        streams.pop(draw(st.integers(0, len(streams) - 1)))
    elif kind == "duplicate":
        streams.extend([stream] * draw(st.integers(1, 1000)))
    elif kind == "external":
        header["external"] = draw(st.lists(st.integers(0, 10), max_size=5))
    elif kind == "type":
        header[draw(st.sampled_from(["streams", "external", "protocol", "options"]))] = draw(
            st.one_of(SIZES, st.text(max_size=3), st.none())
        )
    else:
        header["bomb"] = [[[0] * 1000] * 100] * draw(st.integers(1, 50))
    return header


@settings(suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(data=st.data(), record=st.sampled_from(RECORDS))
def test_forged_headers_with_valid_checksums(data, record):
    parts = records.split(record)
    parts.header = data.draw(header_mutations(parts.header))
    _check(records.join(parts))


@settings(suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(data=st.data(), record=st.sampled_from(RECORDS))
def test_forged_frame_sizes_counts_and_trailers(data, record):
    parts = records.split(record)
    trailer = None
    frame = data.draw(st.integers(0, len(parts.payloads) - 1))
    kind = data.draw(st.sampled_from(["resize", "drop", "offsets", "csizes", "count"]))
    if kind == "resize":
        size = data.draw(st.integers(0, 2 * len(parts.payloads[frame]) + 100))
        parts.payloads[frame] = (parts.payloads[frame] * 3)[:size]
    elif kind == "drop":
        del parts.payloads[frame], parts.raw[frame]
    else:
        trailer = dict(parts.trailer)
        if kind == "count":
            trailer["checksums"] = trailer["checksums"] + [0] * data.draw(st.integers(1, 10**5))
        else:  # overlapping or inflated entries
            column = list(trailer[kind])
            column[frame] = data.draw(SIZES.filter(lambda v: v >= 0))
            trailer[kind] = column
    _check(records.join(parts, trailer))


@settings(suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(data=st.data())
def test_forged_contents_are_caught_by_the_signature(data):
    """Chunks replaced or swapped, with every checksum fixed: checksums cannot tell (they are
    not cryptographic), the signature must."""
    parts = records.split(RECORDS[2])
    frame = data.draw(st.integers(0, len(parts.payloads) - 1))
    if data.draw(st.booleans()):
        payload = bytearray(parts.payloads[frame])
        for position, mask in data.draw(
            st.lists(st.tuples(st.integers(0, 2**16), st.integers(1, 255)), min_size=1, max_size=4)
        ):
            payload[position % len(payload)] ^= mask
        assume(bytes(payload) != parts.payloads[frame])
        parts.payloads[frame] = bytes(payload)
    else:
        other = data.draw(
            st.integers(0, len(parts.payloads) - 1).filter(lambda i: parts.payloads[i] != parts.payloads[frame])
        )
        parts.payloads[frame], parts.payloads[other] = parts.payloads[other], parts.payloads[frame]
    try:
        blpickle.loads(records.join(parts), key=b"k")
    except blpickle.LoadError:
        return
    raise AssertionError("forged contents loaded with a key")


def test_the_fuzzed_records_are_valid_to_start_with():
    for record in RECORDS:
        _check(record)
        assert records.join(records.split(record)) == record
    assert pickle.loads(pickle.dumps(OBJECT))["text"] == OBJECT["text"]
