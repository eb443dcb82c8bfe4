"""The ``blpickle`` commands read and write fsspec URLs (here ``memory://``) as they do paths."""

from __future__ import annotations

import json
import pickle
import uuid

import numpy as np
import pytest

import blpickle
from blpickle import cli

fsspec = pytest.importorskip("fsspec")


@pytest.fixture
def base():
    url = f"memory://blpickle-cli-{uuid.uuid4().hex}"
    yield url
    fs, path = fsspec.core.url_to_fs(url)
    if fs.exists(path):
        fs.rm(path, recursive=True)


OBJ = {"weights": np.arange(200_000.0), "labels": list(range(10))}


def test_info_and_verify_read_a_record_at_a_url(base, capsys):
    url = f"{base}/model.blp"
    blpickle.dump(OBJ, url)
    assert cli.main(["info", "--json", url]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["format"] == "blpickle" and doc["size"] == len(blpickle.dumps(OBJ))
    assert [b["nbytes"] for b in doc["records"][0]["buffers"]] == [OBJ["weights"].nbytes]
    assert cli.main(["verify", "--json", url]) == 0
    assert json.loads(capsys.readouterr().out)["ok"] is True


def test_a_damaged_record_at_a_url_fails_verify(base, capsys):
    url = f"{base}/damaged.blp"
    data = bytearray(blpickle.dumps(OBJ, codec=None))
    data[-200] ^= 0xFF  # in the raw buffer's bytes
    fs, path = fsspec.core.url_to_fs(url)
    fs.pipe(path, bytes(data))
    assert cli.main(["verify", url]) != 0
    assert "ChecksumError" in capsys.readouterr().err


def test_convert_reads_and_writes_urls(base, capsys):
    source, target = f"{base}/model.pkl", f"{base}/model.blp"
    fs, path = fsspec.core.url_to_fs(source)
    fs.pipe(path, pickle.dumps(OBJ))
    assert cli.main(["info", source]) == 0
    assert "pickle" in capsys.readouterr().out
    assert cli.main(["convert", "--no-progress", source, target]) == 0
    loaded = blpickle.load(target)
    np.testing.assert_array_equal(loaded["weights"], OBJ["weights"])
    assert cli.main(["convert", "--no-progress", source, target]) != 0  # it exists now
    assert "--force" in capsys.readouterr().err
    assert cli.main(["convert", "--no-progress", f"{base}/model.blp", f"{base}/copy.pkl"]) == 0
    with fsspec.open(f"{base}/copy.pkl", "rb") as file:
        assert pickle.load(file)["labels"] == OBJ["labels"]


def test_missing_urls_are_usage_errors(base, capsys):
    for command in (["info"], ["verify"], ["convert", "--no-progress"]):
        args = [*command, f"{base}/missing.blp"] + ([f"{base}/out.blp"] if command[0] == "convert" else [])
        assert cli.main(args) == 2
        assert "no such file" in capsys.readouterr().err
    fs, path = fsspec.core.url_to_fs(f"{base}/folder/inside.bin")
    fs.pipe(path, b"x")
    assert cli.main(["info", f"{base}/folder"]) == 2
    assert "is a directory" in capsys.readouterr().err
