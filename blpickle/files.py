"""Opening paths: atomic replacement on write."""

from __future__ import annotations

import contextlib
import ctypes
import os
import secrets
import stat
import sys
import threading
from collections.abc import Iterator
from typing import Any, BinaryIO

__all__ = ["atomic_write", "is_path"]


def is_path(file: object) -> bool:
    """Return True for a file name (``str`` or ``os.PathLike``) rather than a file object."""
    return isinstance(file, (str, os.PathLike))


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike[str]) -> Iterator[BinaryIO]:
    """Yield a binary file that replaces ``path`` only when the block succeeds.

    The data goes to a temporary file next to the target, renamed over it at the end; on any
    error (or if the process dies) the previous file stays as it was. An existing file's
    permissions are kept; a new file gets the usual ones (0o666 minus the umask). On Linux the
    data starts going to the device as it is written (see :class:`_EarlyWriteback`).
    """
    target = os.path.realpath(os.fspath(path))
    directory, name = os.path.split(target)
    temporary = os.path.join(directory, f".{name}.{secrets.token_hex(6)}.blpickle-tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
    try:
        with open(fd, "wb") as file, _early_writeback(file) as writer:
            yield writer
        with contextlib.suppress(FileNotFoundError):
            os.chmod(temporary, stat.S_IMODE(os.stat(target).st_mode))
        os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


#: Bytes written between two starts of their write-out to the device.
WRITEBACK_STEP = 32 << 20
_SYNC_FILE_RANGE_WRITE = 2  # from <fcntl.h>: start writing the range's dirty pages, do not wait


def _find_sync_file_range() -> Any:
    """Linux's ``sync_file_range`` (which ``os`` does not offer), or None elsewhere."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        function = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    return function


_sync_file_range = _find_sync_file_range()


class _EarlyWriteback:
    """A file being written whose data starts going to the device every :data:`WRITEBACK_STEP`
    bytes, while the next chunks are compressed, so that an ``fsync`` at the end (or the
    kernel's own write-out, seconds later) finds little left to write instead of the whole
    file. The call runs in a thread of its own (it blocks while the device's queue is full);
    its errors are ignored: it only starts earlier what the kernel does anyway."""

    def __init__(self, file: BinaryIO) -> None:
        self._file = file
        self._fd = file.fileno()
        self._started = 0  # bytes whose write-out has started
        self._written = 0
        self._writeback: threading.Thread | None = None

    def write(self, data: Any) -> int:
        written = self._file.write(data)
        self._written += written
        if self._written - self._started >= WRITEBACK_STEP:
            self._file.flush()
            self.join()
            arguments = (self._fd, self._started, self._written - self._started, _SYNC_FILE_RANGE_WRITE)
            self._writeback = threading.Thread(target=_sync_file_range, args=arguments, daemon=True)
            self._writeback.start()
            self._started = self._written
        return written

    def join(self) -> None:
        """Wait until the last write-out call has returned."""
        if self._writeback is not None:
            self._writeback.join()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._file, name)


@contextlib.contextmanager
def _early_writeback(file: BinaryIO) -> Iterator[Any]:
    """Yield ``file`` wrapped in :class:`_EarlyWriteback` where the OS offers it, and wait for
    its last write-out call before the file is closed."""
    if _sync_file_range is None:
        yield file
        return
    writer = _EarlyWriteback(file)
    try:
        yield writer
    finally:
        writer.join()
