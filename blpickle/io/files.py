"""Opening paths: ``~`` expansion, atomic replacement on write, and errors that name the
user's path."""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import stat
import sys
import threading
from collections.abc import Iterator
from typing import Any, BinaryIO

from ..errors import BlpickleError, add_note
from .remote import is_url, reading

try:
    import fcntl
except ImportError:  # Windows: no flock, so stale temporary files stay
    fcntl = None  # type: ignore[assignment]

__all__ = ["atomic_write", "expand", "is_path", "naming_errors", "open_input"]

_TEMPORARY_SUFFIX = ".blpickle-tmp"


def is_path(file: object) -> bool:
    """Return True for a file name (``str`` or ``os.PathLike``) rather than a file object."""
    return isinstance(file, (str, os.PathLike))


def expand(path: str | os.PathLike[str]) -> str:
    """Return ``path`` as a string with a leading ``~`` or ``~user`` expanded."""
    return os.path.expanduser(os.fspath(path))


@contextlib.contextmanager
def naming_errors(path: str) -> Iterator[None]:
    """Make the errors raised in the block name ``path``: an ``OSError`` that names no file,
    or a temporary file of `atomic_write`, names ``path`` instead; a blpickle error
    gets a note saying which file it was about."""
    try:
        yield
    except OSError as exc:
        if exc.filename is None or _is_temporary(exc.filename):
            exc.filename = path
        if _is_temporary(exc.filename2):
            exc.filename2 = None
        raise
    except BlpickleError as exc:
        add_note(exc, f"file: {path}")
        raise


@contextlib.contextmanager
def open_input(file: Any, mode: str = "rb") -> Iterator[Any]:
    """Yield what to read from: ``file`` itself when it is not a path (a file object, or
    bytes), else the file at that path (``~`` expanded) opened with ``mode`` and closed when
    the block ends, or the object at a URL (``s3://...``, through fsspec: see `remote`);
    errors raised in the block name the path (see `naming_errors`)."""
    if is_url(file):
        with reading(file) as opened:
            yield opened
        return
    if not is_path(file):
        yield file
        return
    path = expand(file)
    with naming_errors(path), open(path, mode) as opened:
        yield opened


def _is_temporary(filename: object) -> bool:
    return isinstance(filename, str) and filename.endswith(_TEMPORARY_SUFFIX)


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike[str], *, durable: bool = False) -> Iterator[BinaryIO]:
    """Yield a binary file that replaces ``path`` (``~`` expanded) only when the block succeeds.

    Over a regular file, or where there is none, the data goes to a temporary file next to
    the target, renamed over it at the end: on any error (or if the process dies) the
    previous file stays as it was. With ``durable``, the file is flushed to the device
    (``fsync``) before the rename and the directory after it, so that a power loss also
    leaves the old file or the whole new one; without, the kernel writes both out when it
    chooses, as with ``open``/``write``. An existing file's permissions are kept; a new file
    gets the usual ones (0o666 minus the umask). Anything else (a FIFO, a device such as
    ``/dev/null``, or a symbolic link to one) is written in place. A temporary file that a
    killed writer left next to the same target is removed by the next writer that would
    use its name (see `_create_temporary`).
    Errors name ``path``, never the temporary file.

    On Linux a durable write starts sending the data to the device as it is written (see
    `_EarlyWriteback`), so the final ``fsync`` finds little left to do.
    """
    user_path = expand(path)
    target = os.path.realpath(user_path)
    with naming_errors(user_path):
        if _is_special(target):
            with open(target, "wb") as file:
                yield file
            return
        directory, name = os.path.split(target)
        fd, temporary = _create_temporary(directory, name)
        # The lock belongs to the open file: a duplicate holds it once the file is closed,
        # until the name is renamed or removed, so that no other writer takes the name for a
        # dead writer's meanwhile. (Without flock, on Windows, an open file cannot be renamed.)
        lock = None if fcntl is None else os.dup(fd)
        try:
            with open(fd, "wb") as file, _early_writeback(file) if durable else contextlib.nullcontext(file) as writer:
                yield writer
                if durable:
                    file.flush()
                    os.fsync(fd)
            with contextlib.suppress(FileNotFoundError):
                os.chmod(temporary, stat.S_IMODE(os.stat(target).st_mode))
            os.replace(temporary, target)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            raise
        finally:
            if lock is not None:
                os.close(lock)
        if durable:
            _sync_directory(directory)


def _is_special(path: str) -> bool:
    """True when ``path`` exists and is not a regular file (a FIFO, a device, a socket...)."""
    try:
        return not stat.S_ISREG(os.stat(path).st_mode)
    except FileNotFoundError:
        return False


def _create_temporary(directory: str, name: str) -> tuple[int, str]:
    """Create the temporary file for ``name`` in ``directory``: the first of
    ``.name.0.blpickle-tmp``, ``.name.1.blpickle-tmp``... (`_temporary_name`) that is free, or
    a dead writer's (removed first, `_remove_if_dead`). It is locked (``flock``) for as long
    as it is open, so that later writers can tell a live writer's file from a dead one's.
    Return its descriptor and path.

    Killed writers thus leave at most one file per slot, which the next writer to reach the
    slot, or to take the slot before it, removes; the directory is never listed, so a dump
    costs the same in a directory of any size.
    """
    slot = 0
    while True:
        temporary = _temporary_name(directory, name, slot)
        try:
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
        except FileExistsError:
            if not _remove_if_dead(temporary):
                slot += 1  # a live writer's, or not ours to remove
            continue
        if fcntl is None:
            return fd, temporary
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # never waits on another's lock
            if os.stat(temporary).st_ino == os.fstat(fd).st_ino:
                _remove_dead_after(directory, name, slot)
                return fd, temporary
        except FileNotFoundError:
            pass  # another writer took it for a dead one's before the lock: start again
        except BlockingIOError:
            slot += 1  # locked first by a writer that removes it as a dead one's, or a stranger
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            raise
        os.close(fd)


#: Target names longer than this many bytes get temporary names made from their hash (a
#: name has at most 255 bytes on most file systems).
_LONG_NAME = 200


def _temporary_name(directory: str, name: str, slot: int) -> str:
    """Return the path of the temporary file number ``slot`` of the target ``name``."""
    if len(os.fsencode(name)) > _LONG_NAME:
        name = hashlib.sha256(os.fsencode(name)).hexdigest()
    return os.path.join(directory, f".{name}.{slot}{_TEMPORARY_SUFFIX}")


def _remove_dead_after(directory: str, name: str, slot: int) -> None:
    """Remove what dead writers of ``name`` left at the slots after ``slot``, up to the first
    free one (one failed ``lstat`` where there is nothing)."""
    while True:
        slot += 1
        path = _temporary_name(directory, name, slot)
        try:
            os.lstat(path)
        except OSError:
            return
        _remove_if_dead(path)


def _remove_if_dead(path: str) -> bool:
    """Remove the temporary file at ``path`` if its writer is gone (nobody holds its lock: a
    lock goes with the process that held it); return whether the slot may now be free.
    Anything this process cannot open or remove, and anything but a regular file (a
    symbolic link, a directory), is left alone: False. Without ``flock`` (Windows) nothing
    is removed."""
    if fcntl is None:
        return False
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            return False
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)  # never waits on a FIFO
    except FileNotFoundError:
        return True  # renamed or removed since
    except OSError:
        return False
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # replaced since the lstat
            return False
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # OSError while its writer lives
        if os.stat(path).st_ino == os.fstat(fd).st_ino:  # still the file that was locked
            os.unlink(path)
        return True
    except FileNotFoundError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def _sync_directory(directory: str) -> None:
    """Flush a directory's entries to the device (where the OS allows opening a directory)."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


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
    """A file being written whose data starts going to the device every `WRITEBACK_STEP`
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

    def fileno(self) -> int:
        return self._fd

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
    """Yield ``file`` wrapped in `_EarlyWriteback` where the OS offers it, and wait for
    its last write-out call before the file is closed."""
    if _sync_file_range is None:
        yield file
        return
    writer = _EarlyWriteback(file)
    try:
        yield writer
    finally:
        writer.join()
