"""URLs (``s3://bucket/key``, ``gs://...``, ``memory://...``) through fsspec, an optional
dependency imported only when a URL is given.

Writing streams the record to the file system's writer (object stores upload it in parts as
it is written, never holding it whole) and publishes it only when it is complete: fsspec
files opened without autocommit, committed at the end or discarded on error.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from typing import Any, BinaryIO, TypeGuard

__all__ = ["filesystem", "is_url", "reading", "writing"]

_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")


def is_url(file: object) -> TypeGuard[str]:
    """Return True for a string that names a URL (``scheme://...``), not a local path."""
    return isinstance(file, str) and _URL.match(file) is not None


def filesystem(url: str) -> tuple[Any, str]:
    """Return the fsspec file system of ``url`` and the path within it.

    Raises:
        ImportError: when fsspec (or the file system's own package, such as s3fs) is missing.
    """
    try:
        import fsspec
    except ImportError:
        raise ImportError(f"reading or writing {url} needs fsspec: pip install 'blpickle[fsspec]'") from None
    return fsspec.core.url_to_fs(url)


@contextlib.contextmanager
def writing(url: str) -> Iterator[BinaryIO]:
    """Yield a binary file writing to ``url``; the object appears there only when the block
    succeeds, on file systems that can hold a file uncommitted (object stores, local files;
    not ``memory://``, which writes in place)."""
    fs, path = filesystem(url)
    file = fs.open(path, "wb", autocommit=False)
    try:
        yield file
        file.close()
    except BaseException:
        try:
            file.close()  # uncommitted: nothing is published
        finally:
            file.discard()
        raise
    file.commit()


@contextlib.contextmanager
def reading(url: str) -> Iterator[BinaryIO]:
    """Yield ``url`` opened for reading as a binary file."""
    fs, path = filesystem(url)
    with fs.open(path, "rb") as file:
        yield file
