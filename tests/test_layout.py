"""The pickle stream's layout (blpickle.format.layout): every reader puts splices only at the data of
payload opcodes outside the frames, and load and inspect see the same opcodes."""

from __future__ import annotations

import io
import os
import pickle
import struct

import numpy as np
import pytest
import records
from bombs import peak_allocated
from test_safe import CALLS

import blpickle
from blpickle import cli
from blpickle import format as fmt
from blpickle.engine.pickle_file import PickleFile, open_pickle
from blpickle.engine.reader import RecordReader
from blpickle.format.layout import DATA, FRAME, OPCODE, SPLICE, Layout, tokens
from blpickle.io.sources import MemorySource


def _record(stream: bytes, splices: list[tuple[int, bytes]], protocol: int = 5) -> bytes:
    """A raw (codec None) record of the pickle stream ``stream`` with ``splices`` (offset,
    payload), every checksum right."""
    streams = [{"nbytes": len(stream), "chunk_size": max(len(stream), 1), "itemsize": 1, "raw": True}]
    for offset, payload in splices:
        streams.append(
            {"nbytes": len(payload), "chunk_size": max(len(payload), 1), "itemsize": 1, "raw": True, "splice": offset}
        )
    header = {
        "options": blpickle.Options(codec=None).to_dict(),
        "protocol": protocol,
        "streams": streams,
        "external": [],
    }
    payloads = [stream, *(payload for _, payload in splices)]
    return records.join(records.Parts(0, header, payloads, [True] * len(payloads), {}))


def _stream_and_splices(data: bytes) -> tuple[bytes, list[tuple[int, bytes]]]:
    """Take a raw record apart into its pickle stream and its splices."""
    parts = records.split(data)
    streams = parts.header["streams"]
    return parts.payloads[0], [(s["splice"], p) for s, p in zip(streams[1:], parts.payloads[1:], strict=True)]


def _system_call(marker: str) -> bytes:
    """Opcodes that call ``posix.system`` to create ``marker`` and pop the result."""
    command = f"touch {marker}".encode()
    return b"\x8c\x05posix\x8c\x06system\x93\x8c" + bytes([len(command)]) + command + b"\x85R0"


def _assert_refused_everywhere(data: bytes, tmp_path, marker: str | None = None) -> None:
    """Load (plain and safe), inspect, `blpickle info` and `blpickle verify` all refuse the
    record as damaged, and nothing ran."""
    path = tmp_path / "forged.blp"
    path.write_bytes(data)
    CALLS.clear()  # other modules' tests leave their calls there
    for load in (
        lambda: blpickle.loads(data),
        lambda: blpickle.loads(data, safe=True),
        lambda: blpickle.load(path),
        lambda: blpickle.load(io.BytesIO(data)),
        lambda: blpickle.inspect(data),
        lambda: blpickle.inspect(path, verify=False),
    ):
        with pytest.raises(blpickle.CorruptError):
            load()
    for command in ("info", "verify"):
        assert cli.main([command, os.fspath(path)]) == cli.EXIT_FAILED
    assert CALLS == []
    if marker is not None:
        assert not os.path.exists(marker)


def test_a_splice_inside_a_harmless_bytes_literal_is_refused(tmp_path, capsys):
    marker = os.fspath(tmp_path / "pwned")
    evil = _system_call(marker)
    # a bytes literal (inside a frame) that ends like a BINBYTES8 opcode and its size
    literal = b"harmless" + pickle.BINBYTES8 + struct.pack("<Q", len(evil))
    stream = pickle.dumps(["before", literal, "after" * 20], protocol=5)
    offset = stream.index(literal) + len(literal)
    data = _record(stream, [(offset, evil)])
    assert blpickle.loads(_record(stream, []))[1] == literal  # the record is valid without the splice
    _assert_refused_everywhere(data, tmp_path, marker)
    assert "posix.system" not in capsys.readouterr().out


def _spliced_record() -> tuple[bytes, list[tuple[int, bytes]]]:
    big = bytes(range(256)) * 8192  # 2 MiB: spliced out of the pickle
    data = blpickle.dumps(["small", big, "x" * (3 << 20), bytearray(big)], codec=None)
    return _stream_and_splices(data)


def test_spliced_payloads_of_every_kind_load_and_inspect():
    stream, splices = _spliced_record()
    assert len(splices) == 3
    data = _record(stream, splices)
    loaded = blpickle.loads(data, safe=True)
    assert loaded[1] == bytes(range(256)) * 8192 and loaded[2] == "x" * (3 << 20) and type(loaded[3]) is bytearray
    assert blpickle.inspect(data).globals == ()
    kinds = [kind for kind, _, _ in tokens(stream, 5, [(o, len(p)) for o, p in splices])]
    assert kinds.count(SPLICE) == 3 and FRAME in kinds and DATA not in kinds


@pytest.mark.parametrize(
    "variant",
    ["inside a frame", "wrong size", "duplicate", "overlapping", "unsorted", "at the end", "inside the size field"],
)
def test_misplaced_splices_are_refused(variant, tmp_path):
    stream, splices = _spliced_record()
    (first, payload), second = splices[0], splices[1]
    if variant == "inside a frame":
        splices[0] = (first - 20, payload)
    elif variant == "wrong size":
        splices[0] = (first, payload[:-1])
    elif variant == "duplicate":
        splices.insert(1, (first, payload))
    elif variant == "overlapping":
        splices.insert(1, (first + 1, payload))
    elif variant == "unsorted":
        splices[0], splices[1] = second, (first, payload)
    elif variant == "at the end":
        splices.append((len(stream), b"ab"))
    else:
        splices[0] = (first - 4, payload)
    _assert_refused_everywhere(_record(stream, splices), tmp_path)


@pytest.mark.parametrize("protocol", [0, 2, 3])
def test_splices_in_unframed_pickles_are_refused(protocol, tmp_path):
    payload = b"\x00" * 100
    stream = pickle.dumps([b"abc", "def"], protocol=protocol)
    offset = len(stream) // 2
    with pytest.raises(blpickle.CorruptError, match="protocol"):
        Layout(protocol, [(offset, 100)], len(stream))
    _assert_refused_everywhere(_record(stream, [(offset, payload)], protocol), tmp_path)


def test_an_opcode_running_past_its_frame_is_refused(tmp_path):
    # BININT's argument lies after the end of the frame its opcode is in: the C unpickler
    # reading from a file would take 4 other bytes than pickletools does
    framed = b"]\x94J"
    stream = b"\x80\x05\x95" + struct.pack("<Q", len(framed)) + framed + struct.pack("<i", 7) + b"a."
    assert pickle.loads(stream) == [7]
    _assert_refused_everywhere(_record(stream, []), tmp_path)


def test_an_opcode_running_past_a_stream_of_one_frame_is_refused(tmp_path):
    # the frame ends the stream: its last opcode runs past both
    framed = b"]\x94J\x07\x00"
    stream = b"\x80\x05\x95" + struct.pack("<Q", len(framed)) + framed
    _assert_refused_everywhere(_record(stream, []), tmp_path)


def test_a_size_declared_past_the_end_of_the_last_frame_is_not_allocated():
    # BINUNICODE8 declaring 3 GiB at the end of the stream's last frame: the unpickler asks
    # for that much once the stream has ended
    last = pickle.BINUNICODE8 + struct.pack("<Q", 3 << 30)
    stream = b"\x80\x05\x95" + struct.pack("<Q", 1) + b"]\x95" + struct.pack("<Q", len(last)) + last
    data = _record(stream, [])
    for load in (blpickle.loads, blpickle.inspect, lambda data: blpickle.load(io.BytesIO(data))):

        def refused(load=load):
            with pytest.raises(blpickle.LoadError):
                load(data)

        assert peak_allocated(refused) < 64 << 20


@pytest.mark.parametrize(
    ("graph", "codec", "whole"),
    [
        ({"a": [1, 2.5, "x" * 100]}, None, True),
        ({"a": [1, 2.5, "x" * 100]}, "zstd", True),
        (list(range(100_000)), "zstd", False),  # frames of 64 KiB
        (["x" * 300_000], None, False),  # spliced
    ],
)
def test_a_stream_of_one_frame_is_read_from_memory_and_others_by_layout(graph, codec, whole):
    obj = {"graph": graph, "array": np.arange(100_000.0)}  # out of band: a full record
    reader = RecordReader(MemorySource(blpickle.dumps(obj, codec=codec)), nthreads=1)
    file = open_pickle(reader)
    assert isinstance(file, io.BytesIO if whole else PickleFile)
    loaded = pickle.load(file, buffers=reader.buffers())
    assert loaded["graph"] == graph and np.array_equal(loaded["array"], obj["array"])


def test_opcodes_between_frames_are_followed():
    # a frame of under 4 bytes is written without its header: MEMOIZE and STOP stand outside
    payload = b"y" * 100_000
    stream = pickle.dumps(payload, protocol=5)
    found = list(tokens(stream, 5, []))
    assert [kind for kind, _, _ in found[:2]] == [OPCODE, "argument"]
    assert (DATA, stream.index(payload), len(payload)) in found
    assert blpickle.loads(_record(stream, [])) == payload
    assert blpickle.inspect(_record(stream, [])).globals == ()


GRAPH = {"names": [f"name {n}" for n in range(20_000)], "values": list(range(20_000))}


@pytest.mark.parametrize("nthreads", [1, 2])
@pytest.mark.parametrize("chunk", [0, 1, -1])
def test_a_damaged_chunk_of_the_pickle_stream_raises_its_checksum_error(chunk, nthreads, tmp_path):
    data = blpickle.dumps(GRAPH, chunk_size=4096)
    reader = RecordReader(MemorySource(data), nthreads=1)
    reader.read_stream()
    chunk %= reader.header.streams[0].nchunks
    offset, csize = reader.index.offsets[chunk], reader.index.csizes[chunk]
    payload = [offset + 8, offset + 8 + csize // 2, offset + 8 + csize - 1]
    stored = range(offset + 8 + csize, offset + 16 + csize)
    for position in [*payload, *stored]:
        damaged = bytearray(data)
        damaged[position] ^= 0x04
        path = tmp_path / f"damaged-{position}.blp"  # a new file: the last one may still be mapped
        path.write_bytes(damaged)
        for source in (bytes(damaged), path):
            with pytest.raises(blpickle.ChecksumError) as info:
                blpickle.load(source if source is path else io.BytesIO(source), nthreads=nthreads)
            assert (info.value.what, info.value.offset) == (f"chunk {chunk} of the pickle stream", offset), position


def _pickle_file(data: bytes) -> tuple[PickleFile, list[tuple[str, int, int]]]:
    reader = RecordReader(MemorySource(data, len(fmt.MAGIC)), nthreads=1, magic=bytes(fmt.MAGIC))
    stream, splices = _stream_and_splices(data)
    return open_pickle(reader), list(tokens(stream, 5, [(o, len(p)) for o, p in splices]))


def test_payloads_and_frames_may_be_read_in_pieces():
    # newer CPythons read data over 1 MiB in pieces: the layout allows any pieces of at least
    # 9 bytes (longer than an opcode and its argument), and the last one
    stream, splices = _spliced_record()
    data = _record(stream, splices)
    file, found = _pickle_file(data)
    pieces = []
    for kind, _, size in found:
        if kind in (OPCODE, "argument"):
            pieces.append(file.read(size))
            continue
        while size:
            piece = file.read(min(size, 1 << 20 if size > 1 << 20 else max(size // 2, 9)))
            pieces.append(piece)
            size -= len(piece)
    assert pickle.loads(b"".join(pieces)) == blpickle.loads(data)


def test_reads_that_do_not_follow_the_layout_are_refused():
    stream, splices = _spliced_record()
    data = _record(stream, splices)
    for wrong in ([1, 2], [1, 1, 1, 7], [1, 1, 1, 8, 1]):  # PROTO's argument, FRAME's, its contents
        file, _ = _pickle_file(data)
        for size in wrong[:-1]:
            file.read(size)
        with pytest.raises(blpickle.CorruptError, match="does not follow"):
            file.read(wrong[-1])
        assert isinstance(file.error, blpickle.CorruptError)


@pytest.mark.parametrize("opcode", [pickle.FRAME, pickle.BINBYTES8, pickle.BYTEARRAY8, pickle.BINUNICODE8])
def test_a_size_past_the_end_of_the_stream_is_refused_before_allocating(opcode, tmp_path):
    stream = b"\x80\x05" + opcode + struct.pack("<Q", 1 << 62) + b"N."
    _assert_refused_everywhere(_record(stream, []), tmp_path)
