"""Every code block of README.md and docs/ runs as printed (see ``tests/doc_pages.py``).

Each page runs in a fresh interpreter, in an empty directory holding only the files the page
says its reader already has (``GIVEN``), so that no page sees what another one registered or
wrote.
"""

from __future__ import annotations

import pickle
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import joblib
import numpy as np
import pytest

import blpickle

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])


def _pickle(path: Path) -> None:
    with open(path, "wb") as file:
        pickle.dump({"weights": np.random.rand(100, 10), "labels": list(range(100))}, file)


#: Files a page says its reader already has, and how to make them.
GIVEN: dict[str, dict[str, Callable[[Path], None]]] = {
    "cli.md": {
        "model.pkl": _pickle,
        "model.joblib": lambda path: joblib.dump({"weights": np.random.rand(100, 10)}, path),
        "arrays.npz": lambda path: np.savez(path, x=np.arange(10), y=np.ones(3)),
        "image.blp": lambda path: blpickle.dump(np.zeros((64, 64), np.uint8), path),
    },
}


#: The optional libraries a page's code needs (CI's tensor step installs them).
NEEDS = {"tensors.md": ("torch", "jax", "ml_dtypes")}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_the_code_blocks_of_a_page_run_in_order(page: Path, tmp_path: Path) -> None:
    for module in NEEDS.get(page.name, ()):
        pytest.importorskip(module)
    for name, make in GIVEN.get(page.name, {}).items():
        make(tmp_path / name)
    runner = Path(__file__).with_name("doc_pages.py")
    done = subprocess.run(
        [sys.executable, str(runner), str(page)], cwd=tmp_path, capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stderr
