"""Reading the msgpack maps of a header and a trailer within limits: no count a document
declares allocates more than the bytes that hold it, a few times over (docs/format.md, "Limits").
"""

from __future__ import annotations

import io
import itertools
import operator
from collections.abc import Iterator
from typing import Any

import msgpack

from ..errors import CorruptError, LoadError
from .preamble import MAX_HEADER_KEYS, MAX_ITEMS, SMALL_DOCUMENT_SIZE

#: msgpack array 16 and array 32: the size of their headers.
ARRAY_HEADERS = {0xDC: 3, 0xDD: 5}


class Parsing:
    """A block of msgpack parsing: its errors, of the several unrelated types msgpack raises
    for bad input, become a `CorruptError` naming ``where`` (a class rather than a generator
    context manager: a header is parsed in a few dozen such blocks)."""

    __slots__ = ("_where",)

    def __init__(self, where: str) -> None:
        self._where = where

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, traceback: Any) -> None:
        if isinstance(exc, Exception) and not isinstance(exc, LoadError):
            raise _not_msgpack(self._where, exc) from None


def _not_msgpack(where: str, exc: Exception) -> CorruptError:
    return CorruptError(f"{where} is not valid msgpack within the limits: {exc}")


class Reader:
    """Reads a msgpack document piece by piece: its outer map and the ``streams`` array are
    walked (the stream maps are decoded and validated a run at a time: `runs`), and each
    value is materialised only within limits on its maps, arrays and items, so that no count
    it declares allocates more than the bytes that hold it, a few times over."""

    def __init__(self, data: bytes | memoryview, what: str) -> None:
        self._view = memoryview(data)
        self._what = what
        self.unpacker = msgpack.Unpacker(io.BytesIO(data), max_buffer_size=max(len(data), 1))

    def keys(self, where: str, seen: dict[str, Any]) -> Iterator[str]:
        """Yield the keys of the top-level map, whose values the caller reads in between;
        refuse more than `MAX_HEADER_KEYS` keys, keys that are not strings, and a key
        already in ``seen``."""
        with Parsing(where):
            count = self.unpacker.read_map_header()
        if count > MAX_HEADER_KEYS:
            raise CorruptError(f"{where}: a map of {count} keys, at most {MAX_HEADER_KEYS} allowed")
        for _ in range(count):
            key = self.value(f"{where} key", containers=0, items=0)
            if not isinstance(key, str):
                raise CorruptError(f"{where}: keys must be strings, found {type(key).__name__}")
            if key in seen:
                raise CorruptError(f"{where}: key {key!r} appears twice")
            yield key

    def integers(self, field: str, *, count: int | None = None, ascending: bool = False) -> list[int]:
        """Read an array of non-negative integers (``count`` of them, if given) 65536 at a
        time, each block checked (ascending without repeats, if asked) before the next is
        decoded: only a valid array costs memory, a few times its size."""
        rule = "ascending non-negative integers without repeats" if ascending else "64-bit unsigned integers"
        with Parsing(f"{self._what} field {field!r}"):
            start = self.unpacker.tell()
            self.unpacker.skip()
            data = self._view[start : self.unpacker.tell()]
            if data[0] >> 4 == 0x9:  # fixarray
                found, body = data[0] & 0xF, 1
            elif data[0] in ARRAY_HEADERS:
                found, body = int.from_bytes(data[1 : ARRAY_HEADERS[data[0]]], "big"), ARRAY_HEADERS[data[0]]
            else:
                raise CorruptError(f"{self._what}: field {field!r} must be an array, found msgpack type {data[0]:#04x}")
            if count is not None and found != count:
                raise CorruptError(f"{self._what}: {field!r} lists {found} chunks, the header implies {count}")
            limits = dict.fromkeys(("max_str_len", "max_bin_len", "max_array_len", "max_map_len", "max_ext_len"), 0)
            items = msgpack.Unpacker(io.BytesIO(data[body:]), max_buffer_size=max(len(data) - body, 1), **limits)
            values: list[int] = []
            while len(values) < found:
                block = tuple(itertools.islice(items, min(found - len(values), 1 << 16)))
                after = (values[-1] if values else -1) if ascending else None
                if not integers(block, after):
                    raise CorruptError(f"{self._what}: {field!r} must list {rule}")
                values.extend(block)
        return values

    def value(self, where: str, *, containers: int, items: int) -> Any:
        """Decode the next value: at most ``containers`` maps and arrays (lists come as
        tuples), each of at most ``items`` items."""
        left = containers

        def count(container: Any) -> Any:
            nonlocal left
            left -= 1
            if left < 0:
                raise CorruptError(f"{where}: more than {containers} maps and arrays")
            return container

        with Parsing(where):
            start = self.unpacker.tell()
            self.unpacker.skip()
            return unpackb(self._view[start : self.unpacker.tell()], items, object_hook=count, list_hook=count)

    def runs(self, count: int, where: str) -> Iterator[tuple[int, memoryview, int]]:
        """Pass over the next ``count`` values (msgpack's parser allocates nothing), yielding
        them in runs of consecutive values: ``(index of the first, their bytes, how many)``,
        each run at most `SMALL_DOCUMENT_SIZE` bytes long unless it is one larger value. The
        values before one that is not msgpack are yielded before its error is raised.

        Raises:
            CorruptError: naming the value (``where`` formatted with its index) that is not
                msgpack within the limits.
        """
        view, unpacker = self._view, self.unpacker
        start = end = unpacker.tell()
        index = 0
        for number in range(count):
            try:
                unpacker.skip()
            except Exception as exc:  # as `Parsing` reports it, after the values before it
                if number > index:
                    yield index, view[start:end], number - index
                raise _not_msgpack(where.format(number), exc) from None
            if unpacker.tell() - start > SMALL_DOCUMENT_SIZE and number > index:
                yield index, view[start:end], number - index
                index, start = number, end
            end = unpacker.tell()
        if count > index:
            yield index, view[start:end], count - index

    def skip(self, where: str) -> None:
        """Pass over the next value without decoding it (msgpack's parser allocates nothing)."""
        with Parsing(where):
            self.unpacker.skip()

    def end(self) -> None:
        """Check that the document ends here."""
        if self.unpacker.tell() != len(self._view):
            raise CorruptError(f"{self._what}: {len(self._view) - self.unpacker.tell()} bytes after its end")


def unpackb(data: Any, items: int, **hooks: Any) -> Any:
    """Decode one msgpack value as a header's values are: arrays as tuples, map keys strings
    or bytes, no extension types, at most ``items`` items in any map or array.

    Raises:
        msgpack's errors, ValueError and TypeError for anything else.
    """
    return msgpack.unpackb(data, **_decoding(items), **hooks)


def _decoding(items: int) -> dict[str, Any]:
    """msgpack's options for `unpackb`: arrays as tuples, map keys strings or bytes, no
    extension types, at most ``items`` items in any map or array."""
    return {
        "raw": False,
        "strict_map_key": True,
        "use_list": False,
        "max_array_len": items,
        "max_map_len": items,
        "max_ext_len": 0,
    }


def _unique_map(pairs: list[tuple[Any, Any]]) -> dict[Any, Any]:
    """Return the map of ``pairs``; raise ValueError for a key given twice (what a one-call
    decoding would drop with it is then never checked: `Reader` reads such a document)."""
    mapping = dict(pairs)
    if len(mapping) != len(pairs):
        raise ValueError("a map repeats a key")
    return mapping


def small_document(data: bytes, limit: int) -> dict[str, Any] | None:
    """Return the map a header or trailer of at most `SMALL_DOCUMENT_SIZE` bytes holds,
    decoded in one call, when no map or array in it has over `MAX_ITEMS` items, no map
    repeats a key and its at most ``limit`` keys are strings; else None.

    Decoding allocates less than ``HEADER_COST * len(data) + 1 MiB``: each byte can be a map
    (about 64 bytes), and a map or array is allocated for the items it declares, at most
    `MAX_ITEMS`, as it starts, in at most 1024 levels (under 600 KiB). Larger documents are
    read piece by piece (`Reader`)."""
    values = small_values(data, 1)
    doc = None if values is None else values[0]
    if type(doc) is not dict or len(doc) > limit or any(type(key) is not str for key in doc):
        return None
    return doc


def small_values(data: Any, count: int) -> tuple[Any, ...] | None:
    """Return the ``count`` values of at most `SMALL_DOCUMENT_SIZE` bytes (a small document,
    a run of `Reader.runs`), decoded in one call within `small_document`'s bound on memory,
    when they are msgpack with at most `MAX_ITEMS` items in any map or array and no map
    repeats a key; else None (`Reader` reads them one by one, or says what is wrong with
    them)."""
    if len(data) > SMALL_DOCUMENT_SIZE:
        return None
    unpacker = msgpack.Unpacker(
        None, max_buffer_size=max(len(data), 1), object_pairs_hook=_unique_map, **_decoding(MAX_ITEMS)
    )
    unpacker.feed(data)
    try:
        values = tuple(unpacker)
    except Exception:  # any values not within these bounds
        return None
    return values if len(values) == count else None


def integers(block: tuple[Any, ...], after: int | None) -> bool:
    """True when ``block`` holds non-negative integers only, at least one, and with ``after``
    given, in ascending order without repeats, all over ``after``."""
    return (
        set(map(type, block)) == {int}
        and min(block) >= 0
        and (after is None or (block[0] > after and all(map(operator.lt, block, block[1:]))))
    )


def get(doc: dict[str, Any], key: str, kind: type, where: str) -> Any:
    if key not in doc:
        raise CorruptError(f"{where}: field {key!r} is missing")
    value = doc[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise CorruptError(f"{where}: field {key!r} must be {kind.__name__}, found {type(value).__name__}")
    return value
