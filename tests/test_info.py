"""blpickle.inspect: what a record holds, without unpickling it."""

from __future__ import annotations

import io
import json
import pickle

import numpy as np
import pytest
from bombs import opcode_bomb, peak_allocated
from test_safe import CALLS, SideEffect

import blpickle
from blpickle.format import scan
from blpickle.info import pickle_globals


def test_inspect_describes_buffers_options_and_globals(tmp_path):
    obj = {"ramp": np.arange(1_000_000), "noise": np.random.default_rng(0).random((300, 200)).T, "fn": SideEffect()}
    path = tmp_path / "x.blp"
    blpickle.dump(obj, path, codec="lz4", chunk_size=1 << 20)
    CALLS.clear()
    info = blpickle.inspect(path)
    assert CALLS == []  # nothing was unpickled
    assert info.version == "1.4" and not info.signed
    assert info.options["codec"] == "lz4"
    assert info.protocol == 5
    ramp, noise = info.buffers
    assert (ramp.dtype, ramp.shape, ramp.nbytes, ramp.nchunks, ramp.itemsize) == (
        "int64",
        (1_000_000,),
        8_000_000,
        8,
        8,
    )
    assert ramp.ratio > 50 and noise.ratio < 2
    assert noise.shape == (200, 300)
    assert "test_safe.record_call" in info.globals and "blpickle.arrays.rebuild_ndarray" in info.globals
    assert info.size == path.stat().st_size
    assert info.ratio == pytest.approx(info.nbytes / info.size)
    assert json.loads(json.dumps(info.to_dict()))["buffers"][0]["nbytes"] == 8_000_000


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_pickle_globals_reads_every_protocol(protocol):
    data = pickle.dumps([SideEffect(), SideEffect(), np.dtype("f4"), {1, 2}], protocol)
    found = pickle_globals(data)
    assert "test_safe.record_call" in found
    assert "numpy.dtype" in found
    assert found.count("test_safe.record_call") == 1
    assert "<computed>" not in found


def test_inspect_reads_file_objects_and_leaves_them_after_the_record():
    out = io.BytesIO()
    blpickle.dump(np.arange(10_000), out)
    blpickle.dump("second", out)
    out.seek(0)
    assert blpickle.inspect(out).buffers[0].shape == (10_000,)
    assert blpickle.load(out) == "second"


def test_inspect_refuses_what_is_not_a_record():
    with pytest.raises(blpickle.BadMagicError):
        blpickle.inspect(b"\x80\x05K\x01." + bytes(20))
    data = bytearray(blpickle.dumps(np.arange(10_000)))
    data[-40] ^= 1
    with pytest.raises(blpickle.LoadError):
        blpickle.inspect(bytes(data))


def test_inspect_checks_the_signature_with_a_key():
    data = blpickle.dumps(np.arange(1000), key=b"k", codec=None)
    assert blpickle.inspect(data, key=b"k").signed
    with pytest.raises(blpickle.SignatureError):
        blpickle.inspect(data, key=b"other")
    with pytest.raises(blpickle.SignatureError, match="not signed"):
        blpickle.inspect(blpickle.dumps(1), key=b"k")


def test_inspect_without_verify_jumps_to_the_trailer(tmp_path):
    path = tmp_path / "x.blp"
    obj = [np.arange(2_000_000), np.random.default_rng(0).random(300_000)]
    blpickle.dump(obj, path, chunk_size=1 << 20)
    full = blpickle.inspect(path)
    quick = blpickle.inspect(path, verify=False)
    assert quick == full
    damaged = bytearray(path.read_bytes())
    damaged[len(damaged) // 2] ^= 0xFF  # inside a buffer chunk: only a verifying read sees it
    assert blpickle.inspect(bytes(damaged), verify=False).buffers == full.buffers
    with pytest.raises(blpickle.ChecksumError):
        blpickle.inspect(bytes(damaged))
    out = io.BytesIO()  # two records: the end of the data is not the first record's end
    blpickle.dump(obj, out, chunk_size=1 << 20)
    blpickle.dump("next", out)
    assert blpickle.inspect(out.getvalue(), verify=False).buffers == full.buffers


def _count_opcodes_read_one_at_a_time(monkeypatch) -> list[int]:
    """Count the opcodes `blpickle.format.scan` reads one at a time (each with a `_Cursor.byte`)."""
    count = [0]
    byte = scan._Cursor.byte

    def counting(self, end):
        count[0] += 1
        return byte(self, end)

    monkeypatch.setattr(scan._Cursor, "byte", counting)
    return count


def test_a_run_of_opcodes_costs_little_whatever_it_decompresses_to(monkeypatch):
    """8 Mi ``NONE`` opcodes in 800 bytes (the 2**16 ratio a pickle stream may have) are read
    as runs, not one at a time: inspect, `blpickle verify` and `Record.info` take time of the
    order of the input, not of what it declares."""
    data = opcode_bomb(b"N", 4)
    count = _count_opcodes_read_one_at_a_time(monkeypatch)
    assert blpickle.inspect(data).pickle_nbytes == 4 * (2 << 20) + 1
    assert blpickle.open(data).info.globals == ()
    assert count[0] < 1000


def test_opcodes_read_one_at_a_time_are_bounded_by_the_input(monkeypatch):
    """4 Mi ``DUP`` opcodes (never a run) in 700 bytes: past ``MAX_OPS_PER_BYTE`` opcodes per
    byte of the record, inspect and `Record.info` stop with a LimitError."""
    data = opcode_bomb(b"2", 2)
    count = _count_opcodes_read_one_at_a_time(monkeypatch)
    with pytest.raises(blpickle.LimitError, match="opcodes per byte of its record"):
        blpickle.inspect(data)
    assert count[0] <= scan.MAX_OPS_PER_BYTE * len(data) + 1
    count[0] = 0
    with pytest.raises(blpickle.LimitError, match="opcodes per byte of its record"):
        blpickle.open(data).info  # noqa: B018
    assert count[0] <= scan.MAX_OPS_PER_BYTE * len(data) + 1


def test_record_info_holds_one_chunk_of_the_pickle_stream_as_inspect_does():
    """A 5 KB record whose pickle stream declares 128 MiB (64 chunks of 2 MiB): `Record.info`
    decompresses it a chunk at a time, as `inspect` does, never whole."""
    data = opcode_bomb(b"N", 64)
    assert len(data) < 5 << 10
    record = blpickle.open(data)
    peak = peak_allocated(lambda: record.info)
    assert record.info.pickle_nbytes == 64 * (2 << 20) + 1
    assert peak < 3 * (2 << 20)
