"""Killing a process in the middle of dump(obj, path) leaves the old file or the new one,
never a mix: the record is written to a temporary file and renamed over the target.

The writer is killed at a point it reports itself (while it pickles the object of a dump, the
temporary file open), never after a guessed delay."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import numpy as np
import pytest

import blpickle

WRITER = r"""
import sys
import numpy as np
import blpickle

path, pause_at = sys.argv[1], int(sys.argv[2])


class Pause:
    # In generation pause_at, pickling this object says so and waits to be killed.
    def __init__(self, generation):
        self.generation = generation

    def __reduce__(self):
        if self.generation == pause_at:
            print("writing", flush=True)
            sys.stdin.readline()  # never answered: the parent kills this process
        return int, ()


big = np.random.default_rng(0).random(4_000_000)  # 32 MB of incompressible data
for generation in range(1, pause_at + 1):
    blpickle.dump({"generation": generation, "data": big, "pause": Pause(generation)}, path, chunk_size=1 << 20)
    print("dumped", generation, flush=True)
"""


def _leftovers(directory) -> list[str]:
    return [name for name in os.listdir(directory) if name != "state.blp"]


def _start_writer(path, pause_at: int) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", WRITER, str(path), str(pause_at)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


@pytest.mark.parametrize("pause_at", [1, 3])
def test_a_writer_killed_during_a_dump_leaves_the_previous_record(tmp_path, pause_at):
    path = tmp_path / "state.blp"
    blpickle.dump({"generation": 0, "data": np.zeros(3)}, path)
    with _start_writer(path, pause_at) as writer:
        lines = [writer.stdout.readline() for _ in range(pause_at)]
        assert lines == [f"dumped {g}\n" for g in range(1, pause_at)] + ["writing\n"]
        assert len(_leftovers(tmp_path)) == 1  # the temporary file being written
        writer.send_signal(signal.SIGKILL)
    loaded = blpickle.load(path)
    assert loaded["generation"] == pause_at - 1  # the last complete record, whole
    assert loaded["data"].shape == ((3,) if pause_at == 1 else (4_000_000,))
    [leftover] = _leftovers(tmp_path)
    assert leftover.startswith(".state.blp.") and leftover.endswith(".blpickle-tmp")
