"""A ``joblib.Memory`` store in object storage: results written with `blpickle.dump` to any
fsspec URL (``s3://bucket/cache``, ``gs://...``, ``memory://...``).

```python
import joblib
import blpickle.integrations.fsspec_store

blpickle.integrations.fsspec_store.register()
memory = joblib.Memory("s3://bucket/cache", backend="blpickle-fsspec")
```

joblib's own store logic (directory layout, metadata, ``clear``, ``reduce_size``) runs
unchanged over the file system's objects; each result is one record, published once
complete. Memory mapping does not apply (``mmap_mode`` is refused).
"""

from __future__ import annotations

import collections
import datetime
import os
import re
from typing import Any

import joblib

from ..errors import OptionsError
from ..io.remote import filesystem
from ..options import Options, resolve_options
from ..pickler import dump
from ..unpickler import load
from .joblib.store import BlpickleStoreBackend, warning_on_failure

__all__ = ["BACKEND_NAME", "FsspecStoreBackend", "register"]

#: The name ``joblib.Memory(..., backend=...)`` selects this store by.
BACKEND_NAME = "blpickle-fsspec"


#: What joblib's ``reduce_size`` reads of each cached result (its own type has these fields).
CacheItem = collections.namedtuple("CacheItem", "path size last_access")
_RESULT_DIRECTORY = re.compile("[a-f0-9]{32}")


class FsspecStoreBackend(BlpickleStoreBackend):
    """A ``joblib.Memory`` store at an fsspec URL, results written with `blpickle.dump`.

    ``backend_options`` may hold blpickle options (``codec``, ``clevel``, ``preset``, ...);
    ``compress`` and ``mmap_mode`` are refused (blpickle compresses by default; nothing is
    memory-mapped from object storage).
    """

    options: Options

    def configure(self, location: str, verbose: int = 1, backend_options: dict[str, Any] | None = None) -> None:
        options = dict(backend_options or {})
        if options.pop("compress", False) or options.pop("mmap_mode", None) is not None:
            raise OptionsError("the blpickle-fsspec store takes blpickle options, not compress= or mmap_mode=")
        self.location = location
        self.verbose = verbose
        self.compress = False
        self.mmap_mode = None
        self.options = resolve_options(**options)
        self._fs, _ = filesystem(location)
        self._fs.makedirs(location, exist_ok=True)

    def _open_item(self, path: str, mode: str) -> Any:
        return self._fs.open(path, mode)

    def _item_exists(self, path: str) -> bool:
        return bool(self._fs.exists(path))

    def _move_item(self, source: str, target: str) -> None:
        self._fs.mv(source, target)

    def create_location(self, location: str) -> None:
        self._fs.makedirs(location, exist_ok=True)

    def clear_location(self, location: str) -> None:
        if self._fs.exists(location):
            self._fs.rm(location, recursive=True)
        if location == self.location:
            self._fs.makedirs(location, exist_ok=True)

    def get_items(self) -> list[CacheItem]:
        """Return every cached result: its directory, size and last modification (object
        stores keep no access time)."""
        sizes: dict[str, int] = collections.defaultdict(int)
        times: dict[str, float] = {}
        protocol = self.location.split("://", 1)[0]
        for path, info in self._fs.find(self.location, detail=True).items():
            directory = os.path.dirname(path)
            if not _RESULT_DIRECTORY.fullmatch(os.path.basename(directory)):
                continue
            sizes[directory] += info.get("size") or 0
            times[directory] = max(times.get(directory, 0.0), _modified(info))
        return [
            CacheItem(f"{protocol}://{directory}", size, datetime.datetime.fromtimestamp(times[directory]))
            for directory, size in sizes.items()
        ]

    def dump_item(self, call_id: list[str], item: Any, verbose: int = 1) -> None:
        """Write ``item`` to ``<location>/<call_id...>/output.pkl`` with `blpickle.dump`
        (published only once complete)."""
        with warning_on_failure():
            path = self._join(self.location, *call_id)
            if verbose > 10:
                print(f"Persisting in {path}")
            dump(item, f"{path}/output.pkl", preset=self.options)

    def _join(self, *parts: str) -> str:
        """Return the URL of a location's item (joined with ``/``, whatever the platform)."""
        return "/".join(parts)

    def _load_result(self, filename: str, call_id: list[str]) -> Any:
        """Read the result at the URL ``filename`` with `blpickle.load`."""
        return load(filename, nthreads=self.options.nthreads)


def _modified(info: dict[str, Any]) -> float:
    """The modification time an fsspec listing gives, as a timestamp (0 if none)."""
    for key in ("LastModified", "mtime", "created"):
        value = info.get(key)
        if isinstance(value, datetime.datetime):
            return value.timestamp()
        if isinstance(value, (int, float)):
            return float(value)
    return 0.0


def register() -> None:
    """Register the ``"blpickle-fsspec"`` store backend with joblib (idempotent)."""
    joblib.register_store_backend(BACKEND_NAME, FsspecStoreBackend)
