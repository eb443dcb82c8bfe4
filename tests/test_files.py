"""Files on disk: what is read or mapped, where dump writes, and what errors name."""

from __future__ import annotations

import bz2
import gzip
import lzma

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
