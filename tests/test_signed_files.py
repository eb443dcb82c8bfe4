"""Signed records read from files: checked first, then read again, each frame matched
against the digest the signature covered, so memory does not hold the file and a file
changed in between is refused."""

from __future__ import annotations

import gzip

import numpy as np
import pytest
from bombs import peak_allocated

import blpickle
from blpickle.engine.reader import RecordReader

KEY = b"k" * 32
NOISE = np.frombuffer(np.random.default_rng(0).bytes(32 << 20), np.uint8)  # 32 MiB that do not compress


@pytest.mark.parametrize("codec", [None, "lz4"])
def test_a_signed_file_is_not_held_in_memory_while_it_is_read(tmp_path, codec):
    path = tmp_path / "signed.blp"
    blpickle.dump({"noise": NOISE}, path, key=KEY, codec=codec, chunk_size=1 << 20)
    assert path.stat().st_size > NOISE.nbytes
    assert peak_allocated(lambda: blpickle.inspect(path, key=KEY)) < 12 << 20  # raw frames: read in 8 MiB pieces
    loaded = []
    assert peak_allocated(lambda: loaded.append(blpickle.load(path, key=KEY))) < NOISE.nbytes + (8 << 20)
    assert np.array_equal(loaded[0]["noise"], NOISE)


@pytest.mark.parametrize("codec", [None, "lz4"])
@pytest.mark.parametrize("call", ["load", "inspect"])
def test_a_signed_file_changed_after_its_check_is_refused(tmp_path, monkeypatch, codec, call):
    path = tmp_path / "signed.blp"
    blpickle.dump({"x": np.arange(100_000)}, path, key=KEY, codec=codec)
    other = blpickle.dumps({"x": np.arange(100_000)[::-1].copy()}, key=KEY, codec=codec)
    authenticate = RecordReader._authenticate

    def then_replaced(reader):
        authenticate(reader)
        path.write_bytes(other)  # signed with the same key: only the digests tell

    monkeypatch.setattr(RecordReader, "_authenticate", then_replaced)
    with pytest.raises(blpickle.SignatureError, match="not what the signature was checked on"):
        blpickle.load(path, key=KEY) if call == "load" else blpickle.inspect(path, key=KEY)


def test_a_signed_record_from_a_stream_is_still_kept_as_read(tmp_path):
    """A file that cannot be read again (a gzip stream) is kept in memory as stored."""
    path = tmp_path / "signed.blp.gz"
    with gzip.open(path, "wb") as file:
        blpickle.dump({"x": np.arange(1000)}, file, key=KEY)
    with gzip.open(path, "rb") as file:
        assert np.array_equal(blpickle.load(file, key=KEY)["x"], np.arange(1000))
