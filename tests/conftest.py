"""Shared helpers for blpickle's tests."""

from __future__ import annotations

import io
import os

import numpy as np
import pytest
from hypothesis import settings

import blpickle

settings.register_profile("default", max_examples=150, deadline=2000)
settings.register_profile("fuzz", max_examples=200_000, deadline=10_000)
settings.load_profile("default")


#: What joblib's files start with: pickle, then its compressors' prefixes (zlib, gzip, bz2, xz,
#: lzma, lz4, its old zfile). blpickle's magics must collide with none.
JOBLIB_PREFIXES = [b"\x80", b"\x78", b"\x1f\x8b", b"BZ", b"\xfd7zXZ", b"\x5d\x00", b"\x04\x22\x4d\x18", b"ZF"]


def assert_same_array(expected: np.ndarray, actual: object) -> None:
    """Assert that ``actual`` is an ndarray equal to ``expected`` in dtype, shape, memory
    order and values (bit for bit), and that it is writable."""
    assert isinstance(actual, np.ndarray), type(actual)
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    assert actual.shape == expected.shape
    if expected.flags.f_contiguous and not expected.flags.c_contiguous:
        assert actual.flags.f_contiguous
    else:
        assert actual.flags.c_contiguous
    assert actual.flags.writeable
    assert actual.tobytes(order="A") == expected.tobytes(order="A")  # bit for bit


def roundtrip(obj: object, **options: object) -> object:
    """Dump ``obj`` to bytes and load it back."""
    return blpickle.loads(blpickle.dumps(obj, **options))


class NonSeekable(io.RawIOBase):
    """A stream that can only be read forward (like a pipe), returning short reads."""

    def __init__(self, data: bytes, max_read: int = 1000) -> None:
        self._data = memoryview(data)
        self._pos = 0
        self._max_read = max_read

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        size = min(len(buffer), self._max_read, len(self._data) - self._pos)
        buffer[:size] = self._data[self._pos : self._pos + size]
        self._pos += size
        return size


@pytest.fixture
def small_chunks() -> dict[str, int]:
    """Options that cut buffers into many chunks."""
    return {"chunk_size": 4096}


@pytest.fixture
def tmp_file(tmp_path) -> str:
    return os.fspath(tmp_path / "data.blp")
