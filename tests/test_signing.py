"""Signed records: what the signature covers (checked by a verifier written from
docs/format.md alone), and that nothing is decompressed or unpickled before it is checked."""

from __future__ import annotations

import hashlib
import hmac
import os
import struct

import msgpack
import numpy as np
import pytest
from bombs import bomb, peak_allocated
from golden.objects import GOLDEN_FILES
from records import join, split
from test_golden import GOLDEN_DIR

import blpickle

KEY = b"k" * 32


def verify_from_spec(data: bytes, key: bytes) -> bool:
    """Verify a signed record as docs/format.md ("Signing") specifies, using no blpickle code."""
    magic, major, _minor, flags, header_size = struct.unpack_from("<8sBBHI", data)
    assert magic == b"\xb1BLPK\r\n\x1a" and major == 1 and flags & 1
    header = msgpack.unpackb(data[16 : 16 + header_size])
    mac = hmac.new(key, data[: 16 + header_size], "sha256")
    pos = 16 + header_size + 8  # after the header checksum
    for stream in header["streams"]:
        nbytes = stream["nbytes"]
        frames = (1 if nbytes else 0) if stream["raw"] else -(-nbytes // stream["chunk_size"])
        for _ in range(frames):
            if stream["raw"]:
                pos += -(pos + 8) % 64  # zero padding: the payload starts at a multiple of 64
            (size,) = struct.unpack_from("<Q", data, pos)
            mac.update(hashlib.blake2b(data[pos + 8 : pos + 8 + size], digest_size=32).digest())
            pos += 8 + size + 8
    (trailer_size,) = struct.unpack_from("<Q", data, pos)
    trailer = msgpack.unpackb(data[pos + 8 : pos + 8 + trailer_size])
    return hmac.compare_digest(mac.hexdigest(), trailer["signature"])


OBJECTS = {
    "compressed": ({"a": np.arange(100_000), "b": b"x" * (2 << 20), "c": [1, "two"]}, {"chunk_size": 65536}),
    "raw": ({"a": np.arange(100_000.0), "b": bytearray(3 << 20), "c": [1]}, {"codec": None}),
    "protocol 2": ({"a": np.arange(1000), "c": [1]}, {}),
}


@pytest.mark.parametrize("kind", sorted(OBJECTS))
def test_a_verifier_written_from_the_spec_accepts_signed_records(kind):
    obj, options = OBJECTS[kind]
    data = blpickle.dumps(obj, 2 if kind == "protocol 2" else None, key=KEY, **options)
    assert verify_from_spec(data, KEY)
    assert not verify_from_spec(data, b"another key")
    damaged = bytearray(data)
    damaged[len(data) // 2] ^= 1  # inside some frame's payload
    assert not verify_from_spec(bytes(damaged), KEY)


def test_the_golden_signed_record_verifies_from_the_spec():
    with open(os.path.join(GOLDEN_DIR, "v1.0-signed-spliced.blp"), "rb") as f:
        data = f.read()
    key = GOLDEN_FILES["v1.0-signed-spliced.blp"]["key"]
    assert verify_from_spec(data, key)
    assert not verify_from_spec(data, KEY)


@pytest.mark.parametrize("stream", [0, 1])
def test_forged_signed_records_are_refused_before_anything_is_decompressed(stream):
    data = bomb(stream, key=KEY)
    assert len(data) < 1000
    for call in (
        lambda: blpickle.loads(data, key=KEY),
        lambda: blpickle.inspect(data, key=KEY),
    ):

        def refused(call=call):
            with pytest.raises(blpickle.SignatureError):
                call()

        assert peak_allocated(refused) < 4 << 20


def test_a_signed_load_refuses_what_the_signature_does_not_cover():
    parts = split(blpickle.dumps([np.arange(100_000)], key=KEY))
    data = join(parts, dict(parts.trailer, note="added later"))
    assert blpickle.loads(data)[0][-1] == 99_999  # without a key: ignored, as readers ignore unknown keys
    with pytest.raises(blpickle.CorruptError, match="outside the signature"):
        blpickle.loads(data, key=KEY)
    for signature in ("é" * 64, "A" * 64, 7):
        parts.trailer["signature"] = signature
        with pytest.raises(blpickle.CorruptError, match="signature"):
            blpickle.loads(join(parts), key=KEY)


def test_a_signed_load_with_mmap_mode_returns_what_was_authenticated(tmp_path):
    """With a key, mmap_mode maps nothing: the arrays are the bytes the signature was checked
    on, not a map that another program could change afterwards."""
    key = b"k" * 32
    path = tmp_path / "signed.blp"
    blpickle.dump({"x": np.arange(100_000)}, path, key=key, codec=None)
    loaded = blpickle.load(path, key=key, mmap_mode="r")
    with open(path, "r+b") as file:  # change every byte of the stored array
        data = bytearray(file.read())
        position = data.find(np.arange(100_000).tobytes()[:800])
        data[position : position + 800_000] = bytes(800_000)
        file.seek(0)
        file.write(data)
    assert np.array_equal(loaded["x"], np.arange(100_000))
