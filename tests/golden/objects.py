"""The objects stored in the golden files, built without randomness or libm (bit-stable)."""

from __future__ import annotations

import numpy as np

#: file name -> dump arguments (``blob``: the object also holds a payload large enough to be
#: spliced out of the pickle; ``small``: the object is `small_golden_object`, which makes a
#: compact record; ``views``: the object is `views_golden_object`, a full record with what 1.1
#: added to full records; ``tensors``: the object is `tensors_golden_object`, which needs
#: torch; ``cupy``: `cupy_golden_object`, which needs cupy and a GPU; ``inband``:
#: `inband_golden_object`, small arrays as 1.4 reduces them). Files are written once per
#: format version and never rewritten.
GOLDEN_FILES = {
    "v1.0-default.blp": {},
    "v1.0-raw.blp": {"codec": None},
    "v1.0-lz4-bitshuffle.blp": {"codec": "lz4", "clevel": 9, "shuffle": "bitshuffle", "chunk_size": 4096},
    "v1.0-zlib-bytedelta.blp": {"codec": "zlib", "bytedelta": True, "chunk_size": 8192},
    "v1.0-protocol2.blp": {"protocol": 2},
    "v1.0-signed-spliced.blp": {"key": b"golden key", "blob": True, "chunk_size": 65536},
    "v1.1-compact.blp": {"small": True},
    "v1.1-full-views.blp": {"views": True, "chunk_size": 65536},
    "v1.2-tensors.blp": {"tensors": True, "chunk_size": 65536},
    "v1.3-cupy.blp": {"cupy": True, "chunk_size": 65536},
    "v1.4-inband.blp": {"inband": True},
}


def golden_object(blob: bool = False) -> dict:
    """Return the object a golden file holds."""
    ramp = np.arange(20_000, dtype=np.int64)
    structured = np.zeros(50, dtype=[("id", "<i4"), ("pos", ">f8", (2,)), ("name", "S4")])
    structured["id"] = np.arange(50)
    structured["pos"] = np.arange(100).reshape(50, 2) / 4
    structured["name"] = [b"n%02d" % i for i in range(50)]
    floats = (ramp % 1000).astype(np.float64) / 8
    return {
        "ramp": ramp,
        "floats_f": np.asfortranarray(floats.reshape(100, 200)),
        "strided": floats.reshape(100, 200)[::3, ::-7],
        "big_endian": ramp.astype(">i4"),
        "float32": (ramp % 255).astype(np.float32),
        "int16": (ramp % 300).astype(np.int16),
        "datetimes": np.datetime64("2026-01-01", "s") + ramp[:100].astype("m8[s]"),
        "unicode": np.array(["alpha", "beta", "γάμμα", ""], dtype="U6"),
        "structured": structured,
        "objects": np.array([1, "two", ramp[:3]], dtype=object),
        "zero_d": np.array(3.25),
        "empty": np.empty((0, 4), dtype=np.float32),
        "bytearray": bytearray(b"golden" * 100),
        "nested": {"tuple": (1, 2.5, "three", None, True), "list": [b"bytes", {1, 2}], "shared": ramp},
    } | ({"blob": bytes(range(256)) * 6144, "text": "golden γ " * 200_000} if blob else {})  # noqa: RUF001 - non-ASCII on purpose


def small_golden_object() -> dict:
    """Return the object of the compact golden file: small values and small arrays only."""
    ramp = np.arange(100, dtype=np.int16)
    return {
        "ints": [0, 1, -1, 2**31, 2**70],
        "floats": (0.5, -0.0, float("inf")),
        "text": "compact γ",  # noqa: RUF001 - non-ASCII on purpose
        "bytes": b"\x00\xff" * 8,
        "ramp": ramp,
        "fortran": np.asfortranarray(np.arange(12.0).reshape(3, 4)),
        "nested": {"set": {1, 2}, "none": None, "shared": ramp},
    }


def views_golden_object() -> dict:
    """Return the object of the full 1.1 golden file: named out-of-band arrays (the stream keys
    ``name`` and ``order``, a Fortran-order one among them) and views of them
    (``rebuild_view``)."""
    ramp = np.arange(40_000, dtype=np.int64)
    grid = np.asfortranarray((ramp % 977).astype(np.float64).reshape(200, 200))
    return {
        "ramp": ramp,
        "model": {"grid": grid},
        "views": [ramp[:], ramp[100:200], ramp[::-3], grid.T, grid[5:50:5, ::7], ramp.view(np.uint8)[8:24]],
    }


def tensors_golden_object() -> dict:
    """Return the object of the 1.2 tensors file: a state dict of torch tensors of several
    dtypes, a view and a reshaped alias of one storage, and a parameter (needs torch)."""
    import torch

    weights = torch.arange(300 * 300, dtype=torch.float32).reshape(300, 300) / 64
    return {
        "model": {
            "layers.0.weight": weights,
            "layers.0.bias": torch.arange(300, dtype=torch.float32),
            "layers.1.weight": weights.to(torch.bfloat16),
            "steps": torch.arange(40_000, dtype=torch.int64) % 7,
        },
        "rows": weights[100:200],
        "flat": weights.reshape(-1),
        "parameter": torch.nn.Parameter(weights[:, :150].to(torch.float16).contiguous()),
    }


def cupy_golden_arrays() -> dict:
    """Return the numpy arrays of the 1.3 cupy file: what its cupy arrays hold."""
    return {
        "weights": (np.arange(300 * 300, dtype=np.float32).reshape(300, 300) / 64),
        "ids": np.arange(40_000, dtype=np.int64) % 7,
        "mask": np.arange(10) % 3 == 0,
    }


def cupy_golden_object() -> dict:
    """Return the object of the 1.3 cupy file: `cupy_golden_arrays` as cupy arrays, and a
    strided view (needs cupy and a CUDA device)."""
    import cupy

    arrays = {name: cupy.asarray(array) for name, array in cupy_golden_arrays().items()}
    return {**arrays, "columns": arrays["weights"][:, ::3]}


def inband_golden_object() -> dict:
    """Return the object of the 1.4 file: arrays under 64 KiB reduced by numpy in the pickle
    stream (C and Fortran order, read-only, strided, a row of another), next to an array out
    of band and a small view of it (`rebuild_view`)."""
    ramp = np.arange(20_000, dtype=np.int64)  # 160 KB: out of band
    grid = np.arange(60, dtype=np.float32).reshape(6, 10)
    frozen = np.arange(16, dtype=np.uint8)
    frozen.flags.writeable = False
    return {
        "ramp": ramp,
        "grid": grid,
        "fortran": np.asfortranarray(grid),
        "frozen": frozen,
        "strided": grid[::2, ::3],
        "row": grid[2],
        "slice": ramp[5:10],
        "shared": grid,
    }
