"""Files on disk: what is read or mapped, where dump writes, and what errors name."""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import os
import pickle
import stat
import subprocess
import sys
import threading

import numpy as np
import pytest

import blpickle
from blpickle import format as fmt
from blpickle.io.files import open_input
from blpickle.io.ranges import READ_PIECE

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


def _read_fifo(path, out: list) -> threading.Thread:
    def read() -> None:
        with open(path, "rb") as f:
            out.append(f.read())

    reader = threading.Thread(target=read)
    reader.start()
    return reader


@pytest.mark.parametrize("through_symlink", [False, True])
def test_dump_writes_into_a_fifo_in_place(tmp_path, through_symlink):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    target = fifo
    if through_symlink:
        target = tmp_path / "link"
        target.symlink_to(fifo)
    received: list[bytes] = []
    reader = _read_fifo(fifo, received)
    blpickle.dump(OBJECT, target)
    reader.join()
    assert stat.S_ISFIFO(os.stat(fifo).st_mode) and os.path.islink(target) == through_symlink
    assert _same(blpickle.loads(received[0]))
    assert sorted(os.listdir(tmp_path)) == sorted({"fifo", target.name})


def test_dump_writes_into_devices_in_place(tmp_path):
    device = "/dev/null"
    if os.geteuid() == 0:  # root could replace the system's /dev/null should this regress: use a twin
        device = str(tmp_path / "null")
        os.mknod(device, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    before = os.stat(device)
    blpickle.dump(OBJECT, device)
    after = os.stat(device)
    assert stat.S_ISCHR(after.st_mode) and (after.st_ino, after.st_rdev) == (before.st_ino, before.st_rdev)


def _syncs_and_renames(monkeypatch) -> list[tuple[str, bool | None]]:
    """Record each ``os.fsync`` (whether of a regular file) and ``os.replace``, in order."""
    calls: list[tuple[str, bool | None]] = []
    monkeypatch.setattr(os, "fsync", lambda fd: calls.append(("fsync", stat.S_ISREG(os.fstat(fd).st_mode))))
    replace = os.replace
    monkeypatch.setattr(os, "replace", lambda *paths: (calls.append(("replace", None)), replace(*paths)))
    return calls


def test_durable_dumps_fsync_the_file_before_the_rename_and_the_directory_after(tmp_path, monkeypatch):
    calls = _syncs_and_renames(monkeypatch)
    blpickle.dump(OBJECT, tmp_path / "data.blp", durable=True)
    assert calls == [("fsync", True), ("replace", None), ("fsync", False)]  # the file, then its directory
    assert _same(blpickle.load(tmp_path / "data.blp"))


def test_dumps_to_a_path_are_renamed_into_place_without_fsync_by_default(tmp_path, monkeypatch):
    calls = _syncs_and_renames(monkeypatch)
    blpickle.dump(OBJECT, tmp_path / "data.blp")
    assert calls == [("replace", None)]
    assert _same(blpickle.load(tmp_path / "data.blp"))
    assert os.listdir(tmp_path) == ["data.blp"]


def test_paths_expand_the_home_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    blpickle.dump(OBJECT, "~/data.blp")
    assert (tmp_path / "data.blp").exists()
    assert _same(blpickle.load("~/data.blp"))
    assert blpickle.inspect("~/data.blp").buffers[0].nbytes == OBJECT["array"].nbytes


def test_errors_name_the_users_path_never_a_temporary_file(tmp_path):
    missing = str(tmp_path / "no such directory" / "data.blp")
    with pytest.raises(FileNotFoundError) as info:
        blpickle.dump(OBJECT, missing)
    assert info.value.filename == missing and "blpickle-tmp" not in str(info.value)
    with pytest.raises(FileNotFoundError) as info:
        blpickle.load(missing)
    assert info.value.filename == missing
    (tmp_path / "a directory").mkdir()
    with pytest.raises(IsADirectoryError) as info:
        blpickle.dump(OBJECT, tmp_path / "a directory")
    assert info.value.filename == str(tmp_path / "a directory")
    damaged = tmp_path / "damaged.blp"
    damaged.write_bytes(blpickle.dumps(OBJECT)[:100])
    for call in (blpickle.load, blpickle.inspect):
        with pytest.raises(blpickle.TruncatedError) as info:
            call(damaged)
        assert f"file: {damaged}" in info.value.__notes__


def test_open_input_opens_paths_and_passes_file_objects_through(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "data.bin").write_bytes(b"data")
    with open_input("~/data.bin") as opened:
        assert opened.read() == b"data"
    assert opened.closed
    with open(tmp_path / "data.bin", "rb") as given:
        with open_input(given) as opened:
            assert opened is given
        assert not given.closed
    with pytest.raises(blpickle.CorruptError) as info, open_input(tmp_path / "data.bin"):
        raise blpickle.CorruptError("damaged")
    assert info.value.__notes__ == [f"file: {tmp_path / 'data.bin'}"]


WRITER = r"""
import sys, time
from blpickle.io.files import atomic_write

with atomic_write(sys.argv[1]) as f:
    f.write(b"partial")
    print("writing", flush=True)
    time.sleep(600)
"""


def _temporaries(directory) -> list[str]:
    """The names of the temporary files in ``directory``."""
    return sorted(name for name in os.listdir(directory) if name.endswith(".blpickle-tmp"))


def _locked(path) -> bool:
    """Whether another open file holds a lock on ``path`` (a live writer's temporary file)."""
    import fcntl

    with open(path, "rb") as file:
        try:
            fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        return False


def test_temporary_files_of_dead_writers_are_removed(tmp_path):
    """Each writer holds a lock on its temporary file: an unlocked one is a dead writer's."""
    path = tmp_path / "data.blp"
    temporary = tmp_path / ".data.blp.0.blpickle-tmp"

    def start_writer() -> subprocess.Popen:
        writer = subprocess.Popen([sys.executable, "-c", WRITER, str(path)], stdout=subprocess.PIPE, text=True)
        assert writer.stdout.readline() == "writing\n"
        return writer

    with start_writer() as dead:
        dead.kill()
    assert _temporaries(tmp_path) == [temporary.name] and not _locked(temporary)
    with start_writer() as alive:
        try:
            assert _temporaries(tmp_path) == [temporary.name] and _locked(temporary)  # the dead one's is gone
            blpickle.dump(OBJECT, path)
            assert _temporaries(tmp_path) == [temporary.name] and _locked(temporary)  # the live one's stays
            assert _same(blpickle.load(path))
        finally:
            alive.kill()


@pytest.mark.skipif(sys.platform == "win32", reason="no flock: temporary files are never removed")
def test_a_dump_takes_the_first_name_free_or_left_by_a_dead_writer(tmp_path):
    """Names are tried in order, passing a live writer's (its file locked) and anything not
    a regular file, and reusing a dead writer's (unlocked): nothing is left behind."""
    import fcntl

    path = tmp_path / "data.blp"
    names = [tmp_path / f".data.blp.{slot}.blpickle-tmp" for slot in range(5)]
    with open(names[0], "wb") as live:
        fcntl.flock(live, fcntl.LOCK_EX)
        names[1].mkdir()
        names[2].symlink_to(tmp_path / "nowhere")
        os.mkfifo(names[3])
        names[4].write_bytes(b"a dead writer's")
        blpickle.dump(OBJECT, path)
        assert _same(blpickle.load(path))
        assert _temporaries(tmp_path) == sorted(name.name for name in names[:4])
        assert _locked(names[0]) and names[1].is_dir() and names[2].is_symlink()
        assert stat.S_ISFIFO(names[3].lstat().st_mode)


def test_a_dump_does_not_list_the_directory(tmp_path, monkeypatch):
    """Finding a free temporary name costs the same in a directory of any size."""

    def refuse(*args: object) -> None:
        raise AssertionError("the directory was listed")

    for name in ("scandir", "listdir"):
        monkeypatch.setattr(os, name, refuse)
    blpickle.dump(OBJECT, tmp_path / "data.blp")
    monkeypatch.undo()
    assert os.listdir(tmp_path) == ["data.blp"]


class _Refused:
    def __reduce__(self):
        raise RuntimeError("not picklable")


@pytest.mark.skipif(sys.platform == "win32", reason="no flock")
@pytest.mark.parametrize("fails", [False, True])
def test_the_temporary_file_stays_locked_until_renamed_or_removed(tmp_path, monkeypatch, fails):
    """Unlocked, it would look like a dead writer's: another writer could take its name and
    have its own file renamed over the target, or removed."""
    seen = []
    replace, unlink = os.replace, os.unlink

    def check(real):
        def call(path, *args):
            if str(path).endswith(".blpickle-tmp"):
                seen.append(_locked(path))
            return real(path, *args)

        return call

    monkeypatch.setattr(os, "replace", check(replace))
    monkeypatch.setattr(os, "unlink", check(unlink))
    if fails:
        with pytest.raises(RuntimeError, match="not picklable"):
            blpickle.dump(_Refused(), tmp_path / "data.blp")
    else:
        blpickle.dump(OBJECT, tmp_path / "data.blp")
    assert seen == [True]
    assert os.listdir(tmp_path) == ([] if fails else ["data.blp"])


@pytest.mark.skipif(sys.platform == "win32", reason="no flock: temporary files are never removed")
def test_what_dead_writers_left_after_the_name_taken_is_removed(tmp_path):
    for slot in (1, 2, 4):
        (tmp_path / f".data.blp.{slot}.blpickle-tmp").write_bytes(b"a dead writer's")
    blpickle.dump(OBJECT, tmp_path / "data.blp")
    assert _temporaries(tmp_path) == [".data.blp.4.blpickle-tmp"]  # past the first free name


@pytest.mark.skipif(sys.platform == "win32", reason="no flock")
@pytest.mark.timeout(60)
def test_a_lock_taken_on_a_new_temporary_file_is_passed_over(tmp_path, monkeypatch):
    """Whoever can read the directory may lock a writer's new file before the writer does:
    the writer takes the next name instead of waiting for ever."""
    import fcntl

    stranger = []
    real_open = os.open

    def open_and_lock(path, flags, *args):
        fd = real_open(path, flags, *args)
        if flags & os.O_CREAT and not stranger:
            stranger.append(open(path, "rb"))  # noqa: SIM115 (closed at the end of the test)
            fcntl.flock(stranger[0], fcntl.LOCK_EX | fcntl.LOCK_NB)
        return fd

    monkeypatch.setattr(os, "open", open_and_lock)
    try:
        blpickle.dump(OBJECT, tmp_path / "data.blp")
    finally:
        monkeypatch.undo()
        for file in stranger:
            file.close()
    assert _same(blpickle.load(tmp_path / "data.blp"))
    assert _temporaries(tmp_path) == [".data.blp.0.blpickle-tmp"]  # the stranger's, left alone


def test_a_target_with_a_name_of_255_bytes_is_dumped(tmp_path):
    path = tmp_path / ("é" * 127 + "x")
    assert len(os.fsencode(path.name)) == 255
    blpickle.dump(OBJECT, path)
    assert _same(blpickle.load(path)) and os.listdir(tmp_path) == [path.name]


class _StallingFile(io.RawIOBase):
    """A raw stream that takes 10 bytes, then none."""

    def __init__(self) -> None:
        self.taken = 0

    def writable(self) -> bool:
        return True

    def write(self, data: object) -> int:
        size = min(10, memoryview(data).nbytes) if self.taken == 0 else 0
        self.taken += size
        return size


def test_a_file_that_stops_taking_bytes_fails_the_dump():
    with pytest.raises(blpickle.DumpError, match="no more"):
        blpickle.dump({"a": 1}, _StallingFile())


class _ReadOnlyRaw(io.RawIOBase):
    """A raw file that implements ``read`` only: its ``readinto`` is `io.RawIOBase`'s, which
    raises NotImplementedError."""

    def __init__(self, data: bytes, seekable: bool, most: int = 1000) -> None:
        self._data, self._pos, self._seekable, self._most = data, 0, seekable, most

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        end = len(self._data) if size < 0 else self._pos + min(size, self._most)  # short reads
        out = self._data[self._pos : end]
        self._pos += len(out)
        return out

    def seekable(self) -> bool:
        return self._seekable

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if not self._seekable:
            raise io.UnsupportedOperation("seek")
        self._pos = [0, self._pos, len(self._data)][whence] + offset
        return self._pos

    def tell(self) -> int:
        return self._pos


RECORDS = {
    "compact": {"a": np.arange(10.0)},
    "array": np.arange(100_000.0),
    "several streams": {"noise": np.random.default_rng(0).random(300_000), "ramp": np.arange(2_000_000)},
}


@pytest.mark.parametrize("seekable", [False, True])
@pytest.mark.parametrize("name", list(RECORDS))
@pytest.mark.parametrize("kind", ["record", "plain pickle"])
def test_files_that_implement_read_only_load(seekable, name, kind):
    obj = RECORDS[name]
    if kind == "record":  # read in short pieces, as a raw file may
        file = _ReadOnlyRaw(blpickle.dumps(obj) + b"after", seekable)
    else:  # whole: pickle's own unpickler takes a short read for the end of the data
        file = _ReadOnlyRaw(pickle.dumps(obj, protocol=5) + b"after", seekable, most=1 << 30)
    loaded = blpickle.load(file)
    assert pickle.dumps(loaded, protocol=5) == pickle.dumps(obj, protocol=5)
    assert file.read() == b"after"  # left just after what it loaded, as pickle leaves a file


def test_open_reads_a_seekable_file_that_implements_read_only():
    obj = RECORDS["several streams"]
    record = blpickle.open(_ReadOnlyRaw(blpickle.dumps(obj), seekable=True))
    assert np.array_equal(record["noise"], obj["noise"]) and np.array_equal(record.load()["ramp"], obj["ramp"])


class _BadReadinto(_ReadOnlyRaw):
    """A file whose ``readinto`` is honest for the first 16 bytes, then returns
    ``count(size)`` and reads nothing."""

    def __init__(self, data: bytes, count) -> None:
        super().__init__(data, seekable=True)
        self._count = count

    def readinto(self, buffer) -> int:
        if self._pos >= 16:
            return self._count(len(buffer))
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)


class _BadRead(_ReadOnlyRaw):
    """A file that implements ``read`` only, honest for the first 16 bytes, then returning
    ``make(size)``."""

    def __init__(self, data: bytes, make) -> None:
        super().__init__(data, seekable=True)
        self._make = make

    def read(self, size: int = -1):
        return super().read(size) if self._pos < 16 else self._make(size)


BAD_COUNTS = {"negative": lambda size: -1, "more than asked": lambda size: size + 1}
BAD_READS = {
    "text": lambda size: "x" * size,
    "more than asked": lambda size: b"x" * (size + 1),
    "object pointers": lambda size: np.array([object()] * max(size // 8, 1)),
}
#: A compact record (read whole with read) and one of raw streams (each read with readinto).
BROKEN_FILE_RECORDS = {
    "compact": blpickle.dumps(RECORDS["compact"]),
    "raw streams": blpickle.dumps(RECORDS["several streams"], codec=None),
}


@pytest.mark.parametrize("record", list(BROKEN_FILE_RECORDS))
@pytest.mark.parametrize("count", list(BAD_COUNTS))
def test_a_readinto_that_breaks_the_protocol_raises_a_load_error(record, count):
    """Never a hang (a negative count read backwards forever) nor a bare error."""
    data = BROKEN_FILE_RECORDS[record]
    for load in (blpickle.load, lambda file: blpickle.open(file).load()):
        if record == "compact":  # read whole with read: readinto is never called
            assert np.array_equal(load(_BadReadinto(data, BAD_COUNTS[count]))["a"], RECORDS["compact"]["a"])
            continue
        with pytest.raises(blpickle.LoadError, match="the file's readinto returned"):
            load(_BadReadinto(data, BAD_COUNTS[count]))


class _BadBufferedRead(io.BufferedIOBase):
    """`_BadRead` as a buffered file: `io.BufferedIOBase` gives it a ``readinto`` that calls
    ``read`` without checking what it returns."""

    def __init__(self, data: bytes, make) -> None:
        self._raw = _BadRead(data, make)

    def readable(self) -> bool:
        return True

    def read(self, size: int | None = -1):
        return self._raw.read(-1 if size is None else size)

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        return self._raw.seek(offset, whence)

    def tell(self) -> int:
        return self._raw.tell()


@pytest.mark.parametrize("kind", [_BadRead, _BadBufferedRead])
@pytest.mark.parametrize("record", list(BROKEN_FILE_RECORDS))
@pytest.mark.parametrize("make", list(BAD_READS))
def test_a_read_that_breaks_the_protocol_raises_a_load_error(kind, record, make):
    data = BROKEN_FILE_RECORDS[record]
    with pytest.raises(blpickle.LoadError, match="the file's read returned"):
        blpickle.load(kind(data, BAD_READS[make]))
    with pytest.raises(blpickle.LoadError, match="the file's read returned"):
        blpickle.open(kind(data, BAD_READS[make])).load()


def test_a_pickle_shorter_than_the_magic_leaves_a_seekable_file_just_after_it():
    file = _ReadOnlyRaw(pickle.dumps(None, protocol=2) + b"after", seekable=True)
    assert blpickle.load(file) is None and file.read() == b"after"


def test_a_plain_pickle_loads_from_a_file_that_reads_a_little_at_a_time():
    """Its reads are made whole before the unpickler sees them (pickle.load fails here)."""
    obj = RECORDS["several streams"]
    file = _ReadOnlyRaw(pickle.dumps(obj, protocol=5) + b"after", seekable=False)
    assert pickle.dumps(blpickle.load(file), protocol=5) == pickle.dumps(obj, protocol=5)
    assert file.read() == b"after"


class _Reusing:
    """A read-only file whose ``read`` returns a view of one buffer it reuses."""

    def __init__(self, data: bytes) -> None:
        self._data, self._pos, self._buffer = data, 0, bytearray(1 << 16)

    def read(self, size: int = -1) -> memoryview:
        size = min(len(self._data) - self._pos if size < 0 else size, len(self._buffer))
        piece = self._data[self._pos : self._pos + size]
        self._pos += len(piece)
        self._buffer[: len(piece)] = piece
        return memoryview(self._buffer)[: len(piece)]

    def readline(self, size: int = -1) -> bytes:  # pickle asks for it; protocol 5 does not use it
        raise io.UnsupportedOperation("readline")


def test_a_file_that_reuses_the_buffer_it_returns_loads():
    obj = {"ramp": np.arange(200_000), "noise": np.random.default_rng(0).random(100_000), "n": list(range(1000))}
    data = blpickle.dumps(obj) + pickle.dumps(obj, protocol=5)
    file = _Reusing(data)
    for _ in range(2):  # a record, then a plain pickle
        loaded = blpickle.load(file)
        assert pickle.dumps(loaded, protocol=5) == pickle.dumps(obj, protocol=5)


class _Asking(_ReadOnlyRaw):
    """A read-only file that keeps the size of each read asked of it."""

    def __init__(self, data: bytes) -> None:
        super().__init__(data, seekable=False, most=1 << 30)
        self.asked: list[int] = []

    def read(self, size: int = -1) -> bytes:
        self.asked.append(size)
        return super().read(size)


def test_a_large_payload_of_a_plain_pickle_is_read_in_pieces_into_its_object():
    """Through the unpickler's ``readinto``, not one read of the whole payload held beside
    the object it makes."""
    obj = {"b": os.urandom(READ_PIECE * 2 + 100), "n": 1}
    file = _Asking(pickle.dumps(obj, protocol=5) + b"after")
    assert blpickle.load(file) == obj
    assert max(file.asked) <= READ_PIECE and file.read() == b"after"


@pytest.mark.parametrize("protocol", [0, 2, 5])
def test_short_plain_pickles_load_one_after_the_other_from_a_file_that_can_neither_seek_nor_peek(protocol):
    """Pickles shorter than a record's magic: no byte of the next one is read with them."""
    objects = [None, 1, True, "", (), b"", 0.5, [1, 2]]
    data = b"".join(pickle.dumps(obj, protocol=protocol) for obj in objects) + b"after"
    assert min(len(pickle.dumps(obj, protocol=protocol)) for obj in objects) < len(fmt.MAGIC)
    read, write = os.pipe()
    writer = threading.Thread(target=lambda: (os.write(write, data) and None, os.close(write)))
    with open(read, "rb", buffering=0) as file:  # a raw pipe: no seek, no peek
        writer.start()
        assert [blpickle.load(file) for _ in objects] == objects
        assert file.read() == b"after"
    writer.join()
    file = _ReadOnlyRaw(data, seekable=False, most=3)
    assert [blpickle.load(file) for _ in objects] == objects and file.read() == b"after"


@pytest.mark.parametrize("first", [b"\x00", b"1", b"\x80", b"\x95"])  # the last three are opcodes
def test_a_damaged_magic_is_reported_from_a_file_that_can_neither_seek_nor_peek(first):
    damaged = first + blpickle.dumps({"a": 1})[1:]
    with pytest.raises(blpickle.BadMagicError):
        blpickle.load(_ReadOnlyRaw(damaged, seekable=False))


class _EndingEarly(_ReadOnlyRaw):
    """A file whose first read returns nothing (an end of input), then reads on."""

    def read(self, size: int = -1) -> bytes:
        if not hasattr(self, "ended"):
            self.ended = True
            return b""
        return super().read(size)


def test_an_end_of_input_ends_a_load_from_a_file_that_can_neither_seek_nor_peek():
    file = _EndingEarly(pickle.dumps(None, protocol=2) + pickle.dumps(1, protocol=2) + b"after", seekable=False)
    with pytest.raises(EOFError):
        blpickle.load(file)
    assert blpickle.load(file) is None and blpickle.load(file) == 1 and file.read() == b"after"


@pytest.mark.parametrize("protocol", [0, 2, 4, 5])
def test_plain_pickles_load_from_a_pipe_one_after_the_other(protocol):
    """Read through the pipe's buffer (``peek``), not a call per opcode, and each load stops
    just after its pickle."""
    objects = [[str(i) for i in range(20_000)], {"b": b"x" * 100_000, "n": None}, None]
    data = b"".join(pickle.dumps(obj, protocol=protocol) for obj in objects) + b"after"
    read, write = os.pipe()
    writer = threading.Thread(target=lambda: (os.write(write, data) and None, os.close(write)))
    with open(read, "rb") as file:
        writer.start()
        assert [blpickle.load(file) for _ in objects] == objects
        assert file.read() == b"after"
    writer.join()
