"""Files on disk: what is read or mapped, where dump writes, and what errors name."""

from __future__ import annotations

import bz2
import gzip
import lzma
import subprocess
import sys

import numpy as np
import pytest

import blpickle

OBJECT = {"array": np.arange(50_000, dtype="f8"), "text": "x" * 100}


def _same(actual: object) -> bool:
    return isinstance(actual, dict) and np.array_equal(actual["array"], OBJECT["array"]) and actual["text"] == "x" * 100


@pytest.mark.parametrize("opener", [gzip.open, bz2.open, lzma.open])
@pytest.mark.parametrize("codec", ["zstd", None])
def test_load_reads_compressed_file_objects(tmp_path, opener, codec):
    """Their fileno() is the compressed file underneath: it must not be mapped or read."""
    path = tmp_path / "data.blp.x"
    with opener(path, "wb") as f:
        blpickle.dump(OBJECT, f, codec=codec)
        blpickle.dump([1, 2], f)
    for mmap_mode in (None, "r"):
        with opener(path, "rb") as f:
            assert _same(blpickle.load(f, mmap_mode=mmap_mode))
            assert blpickle.load(f) == [1, 2]
    with opener(path, "rb") as f:
        assert blpickle.inspect(f).buffers[0].nbytes == OBJECT["array"].nbytes


CHANGE_DURING_LOAD = r"""
import os, sys
import blpickle
from blpickle import format as fmt

call, change, path = sys.argv[1:]
decode = fmt.Header.decode.__func__


def decode_then_change(cls, data):
    header = decode(cls, data)
    if change == "truncate":
        os.truncate(path, 4096)
    else:
        with open(path, "r+b") as f:
            f.seek(os.path.getsize(path) - (1 << 20))  # inside the last buffer's data
            f.write(bytes(4096))
    return header


fmt.Header.decode = classmethod(decode_then_change)
try:
    if call == "load":
        blpickle.load(path)
    else:
        blpickle.inspect(path, verify=call == "inspect")  # or "inspect-unverified"
except blpickle.LoadError as exc:
    print(type(exc).__name__)
"""


@pytest.mark.parametrize("codec", ["lz4", None])
@pytest.mark.parametrize(
    ("call", "change", "error"),
    [
        ("load", "truncate", "TruncatedError"),
        ("load", "rewrite", "ChecksumError"),
        ("inspect", "truncate", "TruncatedError"),
        ("inspect", "rewrite", "ChecksumError"),
        ("inspect-unverified", "truncate", "TruncatedError"),  # reads the trailer from the end
    ],
)
def test_a_file_changed_during_a_load_raises_a_load_error(tmp_path, codec, call, change, error):
    """Without mmap_mode the file is read, never mapped: a file that shrinks meanwhile is an
    error, not a SIGBUS (so this runs in a subprocess)."""
    path = str(tmp_path / "data.blp")
    rng = np.random.default_rng(3)
    blpickle.dump([rng.random(1 << 18), rng.random(1 << 18)], path, codec=codec)
    result = subprocess.run(
        [sys.executable, "-c", CHANGE_DURING_LOAD, call, change, path],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert (result.returncode, result.stdout.strip()) == (0, error), result.stderr


def test_with_mmap_mode_the_object_graph_is_still_checked(tmp_path):
    path = tmp_path / "data.blp"
    blpickle.dump({"a": np.arange(100_000.0), "label": "marker-0123456789"}, path, codec=None)
    data = bytearray(path.read_bytes())
    data[data.index(b"marker-0123456789") + 7] ^= 1  # inside the pickle stream (stream 0)
    path.write_bytes(data)
    for mmap_mode in ("r", "c", None):
        with pytest.raises(blpickle.ChecksumError, match="the pickle stream"):
            blpickle.load(path, mmap_mode=mmap_mode)


@pytest.mark.parametrize("prefix", [0, 4, 64 + 8])
def test_mapped_arrays_are_aligned_wherever_the_record_starts(tmp_path, prefix):
    """Raw payloads are aligned from the record start: a record that does not start at a
    multiple of 64 in its file gives copies, not misaligned views of the map."""
    path = tmp_path / "data.blp"
    with open(path, "wb") as f:
        f.write(b"x" * prefix)
        blpickle.dump({"f8": np.arange(10_000.0), "c16": np.arange(5_000, dtype="c16")}, f, codec=None)
    with open(path, "rb") as f:
        f.seek(prefix)
        loaded = blpickle.load(f, mmap_mode="r")
    for name, array in loaded.items():
        assert array.flags.aligned, name
        mapped = not array.flags.writeable
        assert mapped == (prefix % 64 == 0)
        if mapped:
            assert array.ctypes.data % 64 == 0
        np.testing.assert_array_equal(array, np.arange(array.size, dtype=array.dtype))
