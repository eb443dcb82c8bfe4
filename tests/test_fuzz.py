"""Fuzzing: mutated records (flips, truncations, inflated sizes and counts, overlapping
offsets, header bombs), with and without their checksums fixed, only ever raise LoadErrors
or load the right object. Never a crash, a hang, a MemoryError or wrong data.

The hypothesis tests run a few hundred cases each (``--hypothesis-profile=fuzz`` for more);
``test_structure_aware_fuzzer`` runs a short profile of ``tests/fuzz.py``, whose long run is
``python tests/fuzz.py --cases 100000``. The regression tests below hold what it found.
"""

from __future__ import annotations

import copy
import gc
import io
import json
import os
import pickle
import re
import signal
import threading
import warnings

import bombs
import fuzz
import numpy as np
import pytest
import records
from bombs import peak_allocated
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import blpickle
import blpickle.engine.pool
import blpickle.engine.reader
import blpickle.info
from blpickle import format as fmt
from blpickle.engine import policy

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


def test_structure_aware_fuzzer():
    """A short profile of the structure-aware fuzzer: mutated records with every checksum
    recomputed raise only LoadErrors, never crash, hang or use memory without bound."""
    report = fuzz.run(cases=1000, seed=2026)
    assert report.cases == 1000
    assert report.guaranteed_held, report.summary()
    assert set(report.peaks) >= {"loads", "loads(safe=True)", "inspect", "inspect(verify=False)", "cli info"}


def test_the_fuzz_report_keeps_pickles_own_unsafety_apart():
    """Crashes, hangs and failures of unrestricted loads are listed, not failures."""
    failure = fuzz.Failure(3, "default", "loads", "MemoryBound: the peak RSS grew by 300 MiB", [])
    report = fuzz.Report(
        cases=5, failures=[failure], crashes=["4: loads (-11)"], hangs=["5: loads(key=..., signed by the attacker)"]
    )
    assert report.guaranteed_held
    assert report.of_class(True) == ([failure], ["4: loads (-11)"], ["5: loads(key=..., signed by the attacker)"])
    report.crashes.append("6: loads(safe=True) (-11)")
    assert not report.guaranteed_held
    assert report.of_class(False) == ([], ["6: loads(safe=True) (-11)"], [])
    assert "guaranteed (" in report.summary() and "1 crashes, 0 hangs, 0 failures" in report.summary()


def record_of(pickled: bytes, protocol: int = 5, chunk_size: int | None = None, **options) -> bytes:
    """Return a record, every checksum right, whose object graph's pickle is ``pickled``
    (in chunks of ``chunk_size``, if given)."""
    kind = fuzz.Kind("test", False, None, {"protocol": protocol, **options})
    case = fuzz.Case.from_record(kind, _full_record(protocol, **options))
    case.streams[0].data, case.streams[0].dirty = pickled, True
    if chunk_size is not None:
        case.streams[0].chunk_size = case.parts.header["streams"][0]["chunk_size"] = chunk_size
    case.encode_frames()
    return case.to_bytes()


def _full_record(protocol: int, **options) -> bytes:
    """A full record (not a compact one) whose only stream is its pickle: one dumped with an
    out-of-band buffer, the buffer's stream then dropped (the pickle holds enough bytes to be
    compressed, with a codec)."""
    obj = [np.ones(1 << 20, "u1"), bytes(policy.GRAPH_RAW_LIMIT)]
    parts = records.split(blpickle.dumps(obj, protocol, **options))
    first = parts.header["streams"][0]
    nframes = fmt.StreamInfo(first["nbytes"], first["chunk_size"], raw=first["raw"]).nchunks
    parts.header["streams"] = [first]
    parts.payloads, parts.raw = parts.payloads[:nframes], parts.raw[:nframes]
    return records.join(parts)


# Found by the fuzzer or the audit: each raised an exception outside blpickle's tree.
OPCODE_MISUSE = {
    "REDUCE on an int (TypeError)": b"\x80\x05K\x01K\x02\x85R.",
    "APPENDS onto a str (AttributeError)": b"\x80\x05\x8c\x01x(K\x01e.",
    "SETITEMS onto a tuple (TypeError)": b"\x80\x05)(K\x01K\x02u.",
    "ADDITEMS onto a dtype (AttributeError)": b"\x80\x05\x8c\x05numpy\x8c\x05dtype\x93\x8c\x02i2\x85R(K\x01\x90.",
    "dtype state numpy cannot read (SystemError)": (
        b"\x80\x02cnumpy\ndtype\nX\x02\x00\x00\x00i2\x89\x88\x87R"
        b"(K\x03X\x01\x00\x00\x00<X\x01\x00\x00\x00<NNNJ\xff\xff\xff\xffJ\xff\xff\xff\xffK\x00tb."
    ),
}


@pytest.mark.parametrize("pickled", OPCODE_MISUSE.values(), ids=OPCODE_MISUSE.keys())
def test_opcodes_applied_to_the_wrong_objects_are_corrupt_records(pickled):
    with pytest.raises(blpickle.CorruptError, match="not a valid pickle") as raised:
        blpickle.loads(record_of(pickled, protocol=pickled[1]))
    assert isinstance(raised.value.__cause__, (TypeError, AttributeError, SystemError))


@pytest.mark.parametrize("pickled", OPCODE_MISUSE.values(), ids=OPCODE_MISUSE.keys())
def test_the_restricted_unpickler_refuses_opcodes_applied_to_the_wrong_objects(pickled):
    with pytest.raises(blpickle.CorruptError):
        blpickle.loads(record_of(pickled, protocol=pickled[1]), safe=True)


@pytest.mark.parametrize("opcode", [pickle.BINBYTES8, pickle.BINUNICODE8, pickle.BYTEARRAY8])
@pytest.mark.parametrize("safe", [False, True])
def test_a_size_declared_in_the_pickle_stream_past_its_end_is_refused_before_allocating(opcode, safe):
    pickled = b"\x80\x05" + opcode + (2**60).to_bytes(8, "little") + b"."
    with pytest.raises(blpickle.CorruptError, match="inside an opcode's data of 1152921504606846976 bytes"):
        blpickle.loads(record_of(pickled), safe=safe)


@pytest.mark.parametrize("case", [851, 4027, 4262])
def test_sizes_that_cannot_be_allocated_are_load_errors(case):
    """Cases of seed 1 whose MemoryError escaped the error tree (a FRAME or a payload opcode
    declaring more than can be allocated)."""
    _, data = fuzz.make_case(1, case)
    with pytest.raises(blpickle.LoadError):
        blpickle.loads(data)


class _Stale:
    def __init__(self):
        self.renamed = 1

    def __setstate__(self, state):
        raise AttributeError("'_Stale' object has no attribute 'renamed'")


def test_errors_of_the_classes_the_pickle_calls_pass_through_unless_restricted():
    """An unrestricted load reports what a class's own code raises as pickle does (a class
    changed since the record was written); a restricted load trusts nothing of the record."""
    record = blpickle.dumps(_Stale())
    with pytest.raises(AttributeError, match="renamed"):
        blpickle.loads(record)
    with pytest.raises(blpickle.CorruptError, match="AttributeError: '_Stale' object"):
        blpickle.loads(record, allowed=[_Stale])
    missing = record_of(b"\x80\x05\x8c\x0cnosuchmodule\x8c\x01x\x93.")
    with pytest.raises(ModuleNotFoundError):
        blpickle.loads(missing)
    with pytest.raises(blpickle.UnsafeLoadError):
        blpickle.loads(missing, safe=True)


@pytest.mark.parametrize(
    "signature", ["\u00e9" * 64, "g" * 64, "A" * 64, "\x00" * 64], ids=["non-ASCII", "not hex", "upper case", "NUL"]
)
def test_a_signature_that_is_not_64_hex_digits_is_corrupt(signature):
    parts = records.split(blpickle.dumps([1, 2], key=b"k"))
    parts.trailer["signature"] = signature
    forged = records.join(parts)
    message = re.escape("'signature' must be 64 lowercase hex digits")
    with pytest.raises(blpickle.CorruptError, match=message):
        blpickle.loads(forged, key=b"k")
    with pytest.raises(blpickle.CorruptError, match=message):
        blpickle.inspect(forged, key=b"k")


# Found by the fuzzer (seed 1): inspect, info and verify held the whole pickle stream (up to
# 512 MiB, a few times over). They hold one decompressed chunk at a time now.


@pytest.mark.parametrize("case", [8, 1882])
@pytest.mark.parametrize("verify", [True, False])
def test_inspect_holds_one_chunk_of_a_large_pickle_stream(case, verify):
    fuzzed, data = fuzz.make_case(1, case)
    stream = fuzzed.parts.header["streams"][0]
    assert stream["nbytes"] >= 64 << 20  # the pickle, then zeros
    chunk = min(stream["chunk_size"], stream["nbytes"])
    peak = peak_allocated(lambda: blpickle.inspect(data, verify=verify))
    assert peak < chunk + (4 << 20)


def test_data_inside_the_frames_is_read_past_not_held():
    """A 64 MiB bytes literal inside a frame (an attacker's pickle: the pickler puts large
    payloads outside the frames) streams by the scanner in 1 MiB chunks."""
    body = _short_str(b"os") + _short_str(b"getpid") + b"\x93" + b"\x8e" + (64 << 20).to_bytes(8, "little")
    body += bytes(64 << 20) + b"0."
    pickled = b"\x80\x05\x95" + len(body).to_bytes(8, "little") + body
    record = record_of(pickled, chunk_size=1 << 20)
    found = []
    peak = peak_allocated(lambda: found.append(blpickle.inspect(record).globals))
    assert found == [("os.getpid",)]
    assert peak < 8 << 20


def _short_str(text: bytes) -> bytes:
    return b"\x8c" + bytes([len(text)]) + text


def test_a_damaged_raw_pickle_stream_reports_its_checksum_before_its_opcodes():
    """A raw stream's checksum comes after its last piece: the opcodes the damage made
    are not what is reported."""
    record = record_of(pickle.dumps({"a": 1}, protocol=5), codec=None)  # a full record: compact ones have no frames
    stream = records.split(record).payloads[0]
    at = record.index(stream) + 2  # the first opcode after PROTO
    damaged = record[:at] + b"\xff" + record[at + 1 :]
    with pytest.raises(blpickle.ChecksumError, match="chunk 0 of the pickle stream"):
        blpickle.inspect(damaged)
    with pytest.raises(blpickle.ChecksumError, match="chunk 0 of the pickle stream"):
        blpickle.loads(damaged)


def _zeros_first(pickled: bytes, zeros: int, noise: bool) -> bytes:
    """A record whose pickle stream is ``pickled`` (in one 4 MiB chunk, zero-padded), then
    ``zeros`` chunks of 4 MiB of zeros stored in 32 bytes each, then (with ``noise``) a
    chunk of 4 MiB of random bytes."""
    chunk = 4 << 20
    kind = fuzz.Kind("test", False, None, {})
    case = fuzz.Case.from_record(kind, _full_record(5))
    stream = pickled.ljust(chunk, b"\0") + (np.random.default_rng(0).bytes(chunk) if noise else b"")
    case.streams[0].data, case.streams[0].dirty = stream, True
    case.streams[0].chunk_size = case.parts.header["streams"][0]["chunk_size"] = chunk
    case.encode_frames()
    case.frames[1:1] = [(bombs.zeros_chunk(chunk), False)] * zeros
    case.parts.header["streams"][0]["nbytes"] = len(stream) + chunk * zeros
    return case.to_bytes()


def test_inspect_decompresses_at_most_the_ratio_limit_of_what_it_has_read():
    """Chunks of zeros that pass MAX_GRAPH_RATIO only with the chunks after them are read
    ahead, not decompressed; a stream whose whole passes it is refused as load refuses it."""
    data = _zeros_first(b"\x80\x05N.", 40, noise=True)
    assert blpickle.loads(data) is None
    assert blpickle.inspect(data).globals == ()
    assert peak_allocated(lambda: blpickle.inspect(data)) < (4 << 20) + (1 << 20)
    bomb = _zeros_first(b"\x80\x05N.", 4000, noise=False)
    with pytest.raises(blpickle.LimitError, match="times its stored size"):
        blpickle.loads(bomb)
    with pytest.raises(blpickle.LimitError, match="times its stored size"):
        blpickle.inspect(bomb)
    # one 4 MiB chunk decompressed, then the 4000 frames read ahead, kept as stored (32 bytes
    # each) with their bookkeeping
    assert peak_allocated(lambda: _refused(bomb)) < (4 << 20) + (2 << 20)


def _refused(record: bytes) -> None:
    with pytest.raises(blpickle.LimitError):
        blpickle.inspect(record)


@pytest.mark.parametrize("index", [2**25, 2**32 - 1])
def test_a_memo_index_far_out_costs_nothing_in_restricted_loads_and_inspect(index):
    """CPython's unpickler sizes its memo by the largest index (``LONG_BINPUT`` 2**25 is
    256 MiB: pickle's own behaviour, in unrestricted loads); the restricted one and inspect
    keep a dict."""
    record = record_of(b"\x80\x05K\x07r" + index.to_bytes(4, "little") + b"0j" + index.to_bytes(4, "little") + b".")
    loaded = []
    assert peak_allocated(lambda: loaded.append(blpickle.loads(record, safe=True))) < 1 << 20
    assert loaded == [7]
    assert peak_allocated(lambda: blpickle.inspect(record)) < 1 << 20


def test_a_protocol_2_pickle_stream_is_held_at_most_twice_when_loaded():
    """Found by the fuzzer (seed 2, case 509): a protocol 0-3 stream is decompressed, then
    copied into the BytesIO the unpickler reads, chunk by chunk: at most twice its size.
    (Decompressing into the BytesIO's own buffer let a failed load free it while pool
    threads still wrote to it: seed 2026, case 46, a crash on Python 3.12.)"""
    record = record_of(b"\x80\x02N." + bytes(64 << 20), protocol=2, chunk_size=64 << 20)
    loaded = []
    for safe in (False, True):
        peak = peak_allocated(lambda safe=safe: loaded.append(blpickle.loads(record, safe=safe)))
        assert peak < 2 * (64 << 20) + (16 << 20)
    assert loaded == [None, None]


def test_the_fuzzer_catches_an_inspect_that_lists_less_than_load_imports(monkeypatch, tmp_path):
    """Its differential check: a load importing what inspect did not list is a failure."""
    fuzz.record_imports()
    try:
        monkeypatch.setattr(blpickle.info, "scan_globals", lambda *args, **kwargs: ())
        caught = [
            failure
            for number in range(10)
            for failure in fuzz.run_case(*fuzz.make_case(2026, number), str(tmp_path / "case.blp"))[0]
        ]
    finally:
        blpickle.Unpickler.find_class = fuzz._FIND_CLASS
    assert any(f.target == "inspect" and f.error.startswith("Unlisted: loads imported") for f in caught)


def test_a_failed_load_leaves_no_chunk_decompressing(monkeypatch):
    """Found by the fuzzer (seed 2, cases 37508-37511): a load that failed early left the
    pool decompressing the rest of a 512 MiB pickle stream, into memory, during the loads
    after it. The chunks not started are cancelled when the load fails."""
    calls, release = [], threading.Event()
    unpack = blpickle.engine.reader.unpack_chunk

    def held(*chunk):  # the pool's threads wait until the load has failed
        calls.append(chunk[6])
        if threading.current_thread() is not threading.main_thread():
            release.wait(30)
        unpack(*chunk)

    monkeypatch.setattr(blpickle.engine.reader, "unpack_chunk", held)
    record = record_of(b"\x80\x05\xff" + bytes(64 << 20), chunk_size=64 << 10)  # 1024 chunks, the first one bad
    try:
        blpickle.loads(record, nthreads=2)
    except blpickle.CorruptError:
        pass
    else:
        pytest.fail("a damaged record loaded")
    gc.collect()
    release.set()
    blpickle.engine.pool.shared_pool(2).submit(lambda: None).result()  # every chunk queued before it has started
    assert len(calls) < 16  # the first chunks, and those the pool had started (of 1024)


def test_a_case_whose_child_dies_is_a_crash_of_the_target_it_ran(monkeypatch, tmp_path):
    """The fuzzer runs each case in a child forked from its worker: a child killed while it
    ran a target, or one whose own (fuzzer) code raised, is reported as a crash of what it
    was running, and the worker goes on to the next case."""

    def killed(case, data, path, starting):
        starting("inspect")
        os.kill(os.getpid(), signal.SIGKILL)

    def mutator_bug(seed, number):
        raise ValueError("a bug of the fuzzer's own")

    out = io.StringIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork() of a process with threads
        monkeypatch.setattr(fuzz, "run_case", killed)
        fuzz._run_forked(out, 2026, 7, str(tmp_path / "case.blp"))
        monkeypatch.setattr(fuzz, "make_case", mutator_bug)
        fuzz._run_forked(out, 2026, 8, str(tmp_path / "case.blp"))
    reports = [json.loads(line) for line in out.getvalue().splitlines()]
    assert reports == [{"crash": "7: inspect (-9)", "done": 7}, {"crash": "8: the mutator (1)", "done": 8}]
