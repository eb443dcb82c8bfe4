"""Killing a process in the middle of dump(obj, path) leaves the old file or the new one,
never a mix: the record is written to a temporary file and renamed over the target."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import blpickle

WRITER = r"""
import sys
import numpy as np
import blpickle
path = sys.argv[1]
rng = np.random.default_rng(0)
big = rng.random(4_000_000)  # 32 MB of incompressible data: each dump takes a while
print("ready", flush=True)
for i in range(1, 10_000):
    blpickle.dump({"generation": i, "data": big}, path, chunk_size=1 << 20)
"""


@pytest.mark.slow
def test_killed_writer_never_leaves_a_partial_file(tmp_path):
    path = tmp_path / "state.blp"
    blpickle.dump({"generation": 0, "data": np.zeros(3)}, path)
    rng = np.random.default_rng(1)
    generations = set()
    for _ in range(8):
        with subprocess.Popen([sys.executable, "-c", WRITER, str(path)], stdout=subprocess.PIPE, text=True) as writer:
            assert writer.stdout.readline() == "ready\n"
            time.sleep(float(rng.uniform(0.0, 0.5)))
            writer.send_signal(signal.SIGKILL)
        loaded = blpickle.load(path)  # the complete old record or a complete new one
        generations.add(loaded["generation"])
        assert loaded["data"].shape in ((3,), (4_000_000,))
    assert len(generations) > 1  # some kills landed after a rename, some before
    leftovers = [name for name in os.listdir(tmp_path) if name != "state.blp"]
    assert all(name.startswith(".state.blp.") and name.endswith(".blpickle-tmp") for name in leftovers)
