"""The checksum of a raw chunk (and its digest, in a signed record), computed a piece at a time
in the shared pool beside the caller's I/O."""

from __future__ import annotations

import hashlib
from concurrent.futures import Future, wait
from typing import Any

import xxhash

from .pool import shared_pool

__all__ = ["ChunkHash"]


class ChunkHash:
    """XXH3-64 (with ``seed``) and, with ``sign``, BLAKE2b-256 of the pieces given to `add`,
    in order.

    With ``nthreads`` over 1, each piece is hashed in the shared pool while the caller goes on
    (writing that piece, or reading the next: file I/O releases the GIL), one piece at a time;
    a piece's memory must then stay as it is until the next `add`, `checksum`, `digest` or
    `settle` returns. A caller stopped by an error calls `settle` before that memory can go.
    """

    def __init__(self, seed: int, sign: bool, nthreads: int) -> None:
        self._hasher = xxhash.xxh3_64(seed=seed)
        self._signer = hashlib.blake2b(digest_size=32) if sign else None
        self._pool = shared_pool(nthreads) if nthreads > 1 else None
        self._pending: Future[None] | None = None

    def add(self, piece: Any) -> None:
        """Add the next piece."""
        self._wait()
        if self._pool is None:
            self._update(piece)
        else:
            self._pending = self._pool.submit(self._update, piece)

    def checksum(self) -> int:
        """Return the XXH3-64 of the pieces added."""
        self._wait()
        return self._hasher.intdigest()

    def digest(self) -> bytes | None:
        """Return the BLAKE2b-256 of the pieces added, or None without ``sign``."""
        self._wait()
        return None if self._signer is None else self._signer.digest()

    def settle(self) -> None:
        """Wait until the piece being hashed, if any, is done (its error, if any, is dropped:
        for a caller that is failing already)."""
        if self._pending is not None:
            wait([self._pending])
            self._pending = None

    def _update(self, piece: Any) -> None:
        self._hasher.update(piece)
        if self._signer is not None:
            self._signer.update(piece)

    def _wait(self) -> None:
        if self._pending is not None:
            self._pending.result()
            self._pending = None
