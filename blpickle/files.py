"""Opening paths: atomic replacement on write."""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from collections.abc import Iterator
from typing import BinaryIO

__all__ = ["atomic_write", "is_path"]


def is_path(file: object) -> bool:
    """Return True for a file name (``str`` or ``os.PathLike``) rather than a file object."""
    return isinstance(file, (str, os.PathLike))


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike[str]) -> Iterator[BinaryIO]:
    """Yield a binary file that replaces ``path`` only when the block succeeds.

    The data goes to a temporary file next to the target, renamed over it at the end; on any
    error (or if the process dies) the previous file stays as it was. An existing file's
    permissions are kept; a new file gets the usual ones (0o666 minus the umask).
    """
    target = os.path.realpath(os.fspath(path))
    directory, name = os.path.split(target)
    temporary = os.path.join(directory, f".{name}.{secrets.token_hex(6)}.blpickle-tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
    try:
        with open(fd, "wb") as file:
            yield file
        with contextlib.suppress(FileNotFoundError):
            os.chmod(temporary, stat.S_IMODE(os.stat(target).st_mode))
        os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
