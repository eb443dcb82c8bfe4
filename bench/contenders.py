"""The table of serializers compared side by side: name -> how to dump to and load from a path."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import pickle
from collections.abc import Callable
from typing import Any

import blosc2
import joblib
import joblib.compressor
import numpy as np

import blpickle

with contextlib.suppress(ImportError):  # with joblib: the "joblib blosc" contender
    from blpickle.integrations.joblib import register

    register()


def preset_name(preset: str) -> str:
    """The contender of a named preset of `blpickle.PRESETS`."""
    return f"blpickle {preset}"


DEFAULT = preset_name("default")


@dataclasses.dataclass(frozen=True)
class Contender:
    """One way to serialize.

    Attributes:
        name: label in tables, plots and JSON.
        dump: ``dump(obj, path)``; the harness adds the fsync.
        load: ``load(path) -> obj``.
        suffix: file name ending (numpy and Blosc2 insist on theirs).
        arrays_only: takes one ndarray, not any object graph.
        slow: a compressor of tens of MB/s, skipped above the large size.
    """

    name: str
    dump: Callable[[Any, str], Any]
    load: Callable[[str], Any]
    suffix: str = ".bin"
    arrays_only: bool = False
    slow: bool = False


def pickle_dump_path(obj: Any, path: str) -> None:
    """``pickle.dump`` to ``path``: open, dump, close (no fsync)."""
    with open(path, "wb") as file:
        pickle.dump(obj, file, protocol=5)


def pickle_load_path(path: str) -> Any:
    """``pickle.load`` from ``path``."""
    with open(path, "rb") as file:
        return pickle.load(file)


def _npy_dump(array: np.ndarray, path: str) -> None:
    np.save(path, array)


def _npz_dump(array: np.ndarray, path: str) -> None:
    np.savez_compressed(path, array)


def _npz_load(path: str) -> np.ndarray:
    with np.load(path) as archive:
        return archive["arr_0"]


def blpickle_contender(name: str, **options: Any) -> Contender:
    """blpickle with these options (``nthreads`` applies to load too)."""
    return Contender(
        name,
        functools.partial(blpickle.dump, **options),
        functools.partial(blpickle.load, nthreads=options.get("nthreads")),
        suffix=".blp",
    )


def _joblib(name: str, compress: Any, slow: bool = False) -> Contender:
    return Contender(name, functools.partial(joblib.dump, compress=compress), joblib.load, ".joblib", slow=slow)


def contenders() -> list[Contender]:
    """Every contender available in this environment: blpickle's presets (the default
    first), other blpickle options, then the peers."""
    table = [
        *(blpickle_contender(preset_name(name), preset=name) for name in blpickle.PRESETS),
        blpickle_contender("blpickle lz4-5", codec="lz4", clevel=5),
        blpickle_contender("blpickle blosclz-5", codec="blosclz", clevel=5),
        blpickle_contender("blpickle zstd-5", codec="zstd", clevel=5),
        blpickle_contender("blpickle zstd-1 bytedelta", codec="zstd", clevel=1, bytedelta=True),
        Contender("pickle p5", pickle_dump_path, pickle_load_path, ".pkl"),
        Contender("np.save", _npy_dump, np.load, ".npy", arrays_only=True),
        Contender("np.savez_compressed", _npz_dump, _npz_load, ".npz", arrays_only=True, slow=True),
        _joblib("joblib zlib-3", ("zlib", 3), slow=True),
        _joblib("joblib lz4", "lz4"),
        _joblib("joblib lz4-3 (HC)", ("lz4", 3), slow=True),
        Contender(
            "blosc2 save_tensor",
            functools.partial(blosc2.save_tensor, mode="w"),
            blosc2.load_tensor,
            ".b2frame",
            arrays_only=True,
        ),
    ]
    if "blosc" in joblib.compressor._COMPRESSORS:
        table.append(_joblib("joblib blosc", "blosc"))
    return table


def by_name() -> dict[str, Contender]:
    """The contenders keyed by name."""
    return {c.name: c for c in contenders()}
