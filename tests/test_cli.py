"""The ``blpickle`` command.

Each behaviour is run at least once as the real command in a subprocess (``python -m blpickle``,
the ``blpickle`` script); variations of it call :func:`blpickle.cli.main` in this process
(same code, without a second of interpreter start-up per call), to keep the module fast.
"""

from __future__ import annotations

import collections
import importlib.metadata
import io
import itertools
import json
import os
import pickle
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from records import Parts, join, split

import blpickle
from blpickle import cli
from blpickle import format as fmt
from blpickle.cli import arguments, output

joblib = pytest.importorskip("joblib")


def run(*args: object, env: dict[str, str] | None = None, prelude: str = "") -> subprocess.CompletedProcess:
    """Run ``python -m blpickle ARGS``; ``prelude`` is Python run first in the same process
    (to hide an optional module)."""
    argv = [str(a) for a in args]
    if prelude:
        code = f"import sys; {prelude}; from blpickle.cli import main; raise SystemExit(main(sys.argv[1:]))"
        command = [sys.executable, "-c", code, *argv]
    else:
        command = [sys.executable, "-m", "blpickle", *argv]
    return subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
        stdin=subprocess.DEVNULL,
    )


def run_json(*args: object, **kwargs: object) -> tuple[subprocess.CompletedProcess, dict]:
    result = run(*args, "--json", **kwargs)
    return result, json.loads(result.stdout)


@pytest.fixture
def call(capsys):
    """``call(*args)`` runs ``blpickle.cli.main(args)`` in this process and returns what
    :func:`run` returns (``returncode``, ``stdout``, ``stderr``)."""

    def call(*args: object, json_output: bool = False) -> subprocess.CompletedProcess:
        argv = [str(a) for a in args] + (["--json"] if json_output else [])
        capsys.readouterr()
        code = cli.main(argv)
        out, err = capsys.readouterr()
        return subprocess.CompletedProcess(argv, code, out, err)

    return call


def sample() -> dict:
    return {  # arrays over 64 KiB: smaller ones may stay in the pickle stream
        "ramp": np.arange(200_000, dtype=np.int64),
        "noise": np.random.default_rng(0).random((1000, 100)),
        "meta": {"name": "sample", "rate": 1000},
    }


def assert_same(expected: dict, actual: object) -> None:
    assert isinstance(actual, dict)
    assert actual.keys() == expected.keys()
    for key, value in expected.items():
        if isinstance(value, np.ndarray):
            assert actual[key].dtype == value.dtype
            np.testing.assert_array_equal(actual[key], value)
        else:
            assert actual[key] == value


NPY = np.arange(20_000.0).reshape(200, 100)


class Marker:
    """Unpickling this creates a file: proves whether a command ran the pickle."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (Path.touch, (Path(self.path),))


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    obj = sample()
    out = {
        name: tmp_path / name
        for name in (
            "x.blp",
            "signed.blp",
            "x.pkl",
            "p0.pkl",
            "a.npy",
            "a.npz",
            "x.joblib",
            "z.joblib",
            "b.joblib",
        )
    }
    blpickle.dump(obj, out["x.blp"], chunk_size=64 << 10)
    blpickle.dump(obj, out["signed.blp"], key=b"secret")
    out["x.pkl"].write_bytes(pickle.dumps(obj, protocol=5))
    out["p0.pkl"].write_bytes(pickle.dumps([1, "two", 3.0], protocol=0))
    np.save(out["a.npy"], NPY)
    np.savez(out["a.npz"], x=np.arange(10), y=np.ones((300, 300), dtype=np.float32))
    joblib.dump(obj, out["x.joblib"])
    joblib.dump(obj, out["z.joblib"], compress=("zlib", 3))
    from blpickle.integrations.joblib import register

    register()
    joblib.dump(obj, out["b.joblib"], compress="blosc")
    (tmp_path / "key").write_bytes(b"secret")
    (tmp_path / "wrong").write_bytes(b"wrong key")
    return out


def flip_byte(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x40
    path.write_bytes(bytes(data))


# --------------------------------------------------------------------------------------------
# The command itself


def test_help_shows_commands_and_examples():
    result = run("--help")
    assert result.returncode == 0
    for word in ("info", "verify", "convert", "bench", "examples:", "exit status"):
        assert word in result.stdout
    result = run("convert", "--help")
    assert result.returncode == 0
    assert "--safe" in result.stdout and "--preset" in result.stdout and "examples:" in result.stdout


def test_version_and_usage_errors(call):
    result = run("--version")
    assert result.returncode == 0 and blpickle.__version__ in result.stdout
    result = run()
    assert result.returncode == 2 and "usage:" in result.stderr
    assert call("info").returncode == 2
    assert call("frobnicate").returncode == 2
    assert call("verify", "--help").returncode == 0


def test_console_script_is_installed(files):
    (entry,) = importlib.metadata.entry_points(group="console_scripts", name="blpickle")
    assert entry.value == "blpickle.cli:main"
    script = Path(sys.executable).parent / "blpickle"
    assert script.exists(), "reinstall: pip install -e ."
    result = subprocess.run([script, "verify", files["x.blp"]], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and "ok" in result.stdout


# --------------------------------------------------------------------------------------------
# info


def test_info_describes_a_record(files):
    result = run("info", files["x.blp"])
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "blpickle record" in out and "format version 1.4" in out
    assert "int64" in out and "(200000,)" in out and "float64" in out and "(1000, 100)" in out
    assert "codec=auto" in out and "chunk_size=64 KiB" in out
    assert " zstd" in out and " lz4" in out  # the codec "auto" chose for each buffer
    assert "blpickle.arrays.rebuild_ndarray" in out


def test_info_json_and_nothing_unpickled(tmp_path):
    marker = tmp_path / "ran"
    path = tmp_path / "marked.blp"
    blpickle.dump({"m": Marker(str(marker)), "a": np.arange(100_000, dtype=np.int32)}, path, codec="lz4")
    result, doc = run_json("info", path)
    assert result.returncode == 0, result.stderr
    assert not marker.exists()
    assert doc["format"] == "blpickle" and doc["size"] == path.stat().st_size
    (record,) = doc["records"]
    assert record["version"] == "1.4" and record["signed"] is False
    assert record["options"]["codec"] == "lz4"
    (buffer,) = record["buffers"]
    assert (buffer["dtype"], buffer["shape"], buffer["nbytes"]) == ("int32", [100_000], 400_000)
    assert buffer["ratio"] > 1
    assert any(name.endswith("Path.touch") for name in record["globals"]), record["globals"]
    assert doc["trailing_bytes"] == 0


def test_info_on_a_plain_pickle_runs_nothing(tmp_path):
    marker, path = tmp_path / "ran", tmp_path / "m.pkl"
    path.write_bytes(pickle.dumps(Marker(str(marker))))
    result = run("info", path)
    assert result.returncode == 0, result.stderr
    assert "plain pickle" in result.stdout and "Path.touch" in result.stdout
    assert "blpickle convert" in result.stdout  # the hint
    assert not marker.exists()


def test_info_on_an_npz_file(files):
    result = run("info", files["a.npz"])
    assert result.returncode == 0, result.stderr
    assert (
        "2 arrays" in result.stdout and "x: int64 (10,)" in result.stdout and "y: float32 (300, 300)" in result.stdout
    )


@pytest.mark.parametrize(
    ("name", "fmt", "words"),
    [
        ("x.pkl", "pickle", ["plain pickle (protocol 5)"]),
        ("p0.pkl", "pickle", ["plain pickle (protocol 0 or 1)"]),
        ("a.npy", "npy", ["float64 array of shape (200, 100)"]),
        ("a.npz", "npz", ["2 arrays"]),
        ("x.joblib", "joblib", ["joblib file (uncompressed"]),
        ("z.joblib", "joblib", ["compressed with zlib"]),
        ("b.joblib", "joblib", ["compressed with 'blosc'"]),
    ],
)
def test_info_says_what_other_files_are(call, files, name, fmt, words):
    result = call("info", files[name], json_output=True)
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["format"] == fmt
    for word in words:
        assert word in doc["description"]
    if fmt == "pickle":
        assert "globals" in doc and "protocol" in doc
    if name == "x.joblib":
        assert "joblib.numpy_pickle.NumpyArrayWrapper" in doc["globals"]
    if fmt == "npy":
        assert (doc["dtype"], doc["shape"]) == ("float64", [200, 100])
    if fmt == "npz":
        assert [a["name"] for a in doc["arrays"]] == ["x", "y"]


ERASE = "\x1b[1A\x1b[2K"  # up one line, erase it: hides the line above from a terminal


def test_info_escapes_what_the_file_says(call, tmp_path):
    """Names of globals, of npz members, a dtype and options taken from a file reach the
    terminal escaped: a file cannot erase ``posix.system`` from the listing."""
    hidden = b"\x80\x04\x8c\x05posix\x8c\x06system\x93" + b"\x8c\x01x\x8c" + bytes([len(ERASE) + 1])
    hidden += b"y" + ERASE.encode() + b"\x93\x86."
    paths = {"compact.blp": tmp_path / "compact.blp", "plain.pkl": tmp_path / "plain.pkl"}
    paths["compact.blp"].write_bytes(join(Parts(fmt.FLAG_COMPACT, {}, [hidden], [True], {})))
    paths["plain.pkl"].write_bytes(hidden)
    parts = split(blpickle.dumps({"a": np.zeros(100_000, "f4")}, codec="lz4"))
    parts.header["options"]["extra" + ERASE] = "v" + ERASE
    parts.header["streams"][1]["dtype"] = "<f4" + ERASE
    paths["record.blp"] = tmp_path / "record.blp"
    paths["record.blp"].write_bytes(join(parts))
    paths["arrays.npz"] = tmp_path / "arrays.npz"
    np.savez(paths["arrays.npz"], **{"a" + ERASE: np.zeros(3)})
    for name, path in paths.items():
        result = call("info", path)
        shown = result.stdout + result.stderr
        assert "\x1b" not in shown, name
        assert "\\x1b[2K" in shown, name
    assert "posix.system" in call("info", paths["compact.blp"]).stdout


def test_info_on_bad_input(call, files, tmp_path):
    flip_byte(files["x.blp"], files["x.blp"].stat().st_size // 2)
    result = run("info", files["x.blp"])
    assert result.returncode == 1
    assert "ChecksumError" in result.stderr and "chunk" in result.stderr
    result = run("info", tmp_path / "missing.blp")
    assert result.returncode == 2 and "no such file" in result.stderr
    (tmp_path / "text").write_text("hello world\n")
    result = call("info", tmp_path / "text")
    assert result.returncode == 1 and "unknown format" in result.stderr
    (tmp_path / "empty").write_bytes(b"")
    assert call("info", tmp_path / "empty").returncode == 1
    assert call("info", tmp_path).returncode == 2  # a directory
    result = call("info", files["x.blp"], json_output=True)
    assert result.returncode == 1 and json.loads(result.stdout)["error_type"] == "ChecksumError"


# --------------------------------------------------------------------------------------------
# verify


def test_verify_ok_and_json(call, files):
    result = run("verify", files["x.blp"])
    assert result.returncode == 0, result.stderr
    assert "ok" in result.stdout and "every checksum matches" in result.stdout
    result = call("verify", files["x.blp"], json_output=True)
    assert result.returncode == 0
    doc = json.loads(result.stdout)
    assert doc["ok"] is True and doc["records"] == 1 and doc["buffers"] == 2 and doc["error"] is None
    info = blpickle.inspect(files["x.blp"])
    assert doc["buffer_chunks"] == sum(b.nchunks for b in info.buffers) > 2


def test_verify_reports_the_first_damaged_chunk(call, files):
    path = files["x.blp"]
    info = blpickle.inspect(path)
    flip_byte(path, info.size - info.buffers[-1].stored // 2)  # inside the last buffer
    result = run("verify", path)
    assert result.returncode == 1
    assert "damaged" in result.stderr and "checksum mismatch in chunk" in result.stderr
    assert f"of buffer {len(info.buffers) - 1}" in result.stderr
    result = call("verify", path, json_output=True)
    assert result.returncode == 1
    doc = json.loads(result.stdout)
    assert doc["ok"] is False and doc["error_type"] == "ChecksumError" and "chunk" in doc["error"]


def test_verify_truncated_and_second_record(call, files, tmp_path):
    whole = files["x.blp"].read_bytes()
    cut = tmp_path / "cut.blp"
    cut.write_bytes(whole[: len(whole) // 3])
    result = call("verify", cut)
    assert result.returncode == 1 and "TruncatedError" in result.stderr
    two = tmp_path / "two.blp"
    damaged = bytearray(whole)
    damaged[len(whole) // 2] ^= 1
    two.write_bytes(whole + bytes(damaged))
    result = call("verify", two)
    assert result.returncode == 1 and "record 2" in result.stderr
    two.write_bytes(whole + whole + pickle.dumps("appended"))
    result = call("verify", two)
    assert result.returncode == 0 and "2 records" in result.stdout and "not a blpickle record" in result.stderr


def test_verify_signatures(call, files, tmp_path):
    signed, key, wrong = files["signed.blp"], tmp_path / "key", tmp_path / "wrong"
    result = run("verify", signed, "--key-file", key)
    assert result.returncode == 0 and "signature ok" in result.stdout
    result = run("verify", signed, "--key-file", wrong)
    assert result.returncode == 1 and "SignatureError" in result.stderr
    assert run("verify", signed, "--key-env", "BLPK_TEST_KEY", env={"BLPK_TEST_KEY": "secret"}).returncode == 0
    result = call("verify", files["x.blp"], "--key-file", key)  # unsigned: refused with a key
    assert result.returncode == 1 and "not signed" in result.stderr
    # usage errors: 2
    result = call("verify", signed, "--key-env", "BLPK_UNSET_VARIABLE")
    assert result.returncode == 2 and "not set" in result.stderr
    (tmp_path / "empty-key").write_bytes(b"")
    assert call("verify", signed, "--key-file", tmp_path / "empty-key").returncode == 2
    assert call("verify", signed, "--key-file", tmp_path / "no-such-key").returncode == 2
    assert call("verify", signed, "--key-file", key, "--key-env", "X").returncode == 2


def test_verify_refuses_what_is_not_a_record(call, files):
    result = call("verify", files["x.pkl"], json_output=True)
    assert result.returncode == 1 and json.loads(result.stdout)["ok"] is False
    assert "plain pickle" in result.stderr
    assert call("verify", "no-such-file.blp").returncode == 2


# --------------------------------------------------------------------------------------------
# convert


def test_convert_round_trip_through_every_format(files, tmp_path):
    steps = ["x.pkl", "a.blp", "b.joblib", "c.pkl", "d.blpickle", "e.pickle"]
    paths = [files["x.pkl"]] + [tmp_path / "rt" / name for name in steps[1:]]
    paths[1].parent.mkdir()
    for source, target in itertools.pairwise(paths):
        result = run("convert", source, target)
        assert result.returncode == 0, result.stderr
        assert f"-> {target}" in result.stdout
    assert blpickle.inspect(paths[1]).buffers[0].dtype == "int64"
    assert joblib.load(paths[2])["meta"] == sample()["meta"]
    assert_same(sample(), pickle.loads(paths[-1].read_bytes()))


def test_convert_joblib_inputs_and_compressors(call, files, tmp_path):
    for name in ("x.joblib", "z.joblib", "b.joblib"):
        target = tmp_path / f"{name}.blp"
        result = call("convert", files[name], target)
        assert result.returncode == 0, result.stderr
        assert_same(sample(), blpickle.load(target))
    for spec, prefix in (("zlib:3", b"x"), ("blosc", b"\xb2")):
        target = tmp_path / f"out-{spec}.joblib"
        result = call("convert", files["x.blp"], target, "--compress", spec)
        assert result.returncode == 0, result.stderr
        assert target.read_bytes()[:1] == prefix
        assert_same(sample(), joblib.load(target))


def test_convert_arrays_npy_npz(call, files, tmp_path):
    blp, npz, npy = tmp_path / "a.blp", tmp_path / "back.npz", tmp_path / "back.npy"
    assert call("convert", files["a.npz"], blp).returncode == 0
    loaded = blpickle.load(blp)
    assert sorted(loaded) == ["x", "y"] and loaded["y"].dtype == np.float32
    result = call("convert", blp, npz, "--compress", "zlib")
    assert result.returncode == 0, result.stderr
    assert npz.stat().st_size < files["a.npz"].stat().st_size
    with np.load(npz) as back:
        np.testing.assert_array_equal(back["x"], np.arange(10))
    assert call("convert", files["a.npy"], blp, "--force", "--codec", "none").returncode == 0
    assert blpickle.inspect(blp).buffers[0].raw
    assert call("convert", blp, npy).returncode == 0
    np.testing.assert_array_equal(np.load(npy), NPY)


def test_convert_with_codec_options_and_explicit_formats(call, files, tmp_path):
    target = tmp_path / "out.data"
    result = call(
        "convert",
        files["x.pkl"],
        target,
        "--to",
        "blpickle",
        "--preset",
        "small",
        "--chunk-size",
        "128K",
        "--clevel",
        "3",
    )
    assert result.returncode == 0, result.stderr
    options = blpickle.inspect(target).options
    assert (options["codec"], options["clevel"], options["bytedelta"], options["chunk_size"]) == (
        "zstd",
        3,
        True,
        128 << 10,
    )
    source = tmp_path / "noext"
    source.write_bytes(files["x.pkl"].read_bytes())
    assert call("convert", source, tmp_path / "y.blp", "--from", "pickle").returncode == 0


@pytest.mark.parametrize("name", ["out.blp", "out.pkl"])
def test_convert_fsyncs_the_output_only_with_durable(call, files, tmp_path, monkeypatch, name):
    synced: list[bool] = []
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(stat.S_ISREG(os.fstat(fd).st_mode)))
    assert call("convert", files["x.pkl"], tmp_path / name).returncode == 0
    assert synced == []
    assert call("convert", files["x.pkl"], tmp_path / name, "--force", "--durable").returncode == 0
    assert synced == [True, False]  # the file, then its directory


def test_convert_signs_with_a_key(call, files, tmp_path):
    target = tmp_path / "signed-copy.blp"
    result = call("convert", files["x.pkl"], target, "--key-file", tmp_path / "key")
    assert result.returncode == 0, result.stderr
    assert blpickle.inspect(target, key=b"secret").signed
    result = call("convert", files["signed.blp"], tmp_path / "o.pkl", "--key-file", tmp_path / "wrong")
    assert result.returncode == 1 and "SignatureError" in result.stderr
    result = call("convert", files["x.pkl"], tmp_path / "o.npy", "--key-file", tmp_path / "key")
    assert result.returncode == 2  # neither side is blpickle


def test_convert_refuses_impossible_conversions(call, files, tmp_path):
    result = run("convert", files["x.pkl"], tmp_path / "x.npy")
    assert result.returncode == 1 and ".npz" in result.stderr and "dict" in result.stderr
    assert not (tmp_path / "x.npy").exists()
    result = call("convert", files["x.pkl"], tmp_path / "x.npz")
    assert result.returncode == 1 and "'meta'" in result.stderr
    assert not (tmp_path / "x.npz").exists()
    result = call("convert", files["x.pkl"], tmp_path / "x.unknown")
    assert result.returncode == 2 and "--to" in result.stderr
    result = call("convert", files["x.pkl"], files["x.blp"])
    assert result.returncode == 2 and "--force" in result.stderr
    result = call("convert", files["x.pkl"], tmp_path / "x2.pkl", "--codec", "lz4")
    assert result.returncode == 2 and "blpickle output only" in result.stderr
    result = call("convert", files["x.pkl"], tmp_path / "x3.blp", "--clevel", "12")
    assert result.returncode == 2 and "clevel" in result.stderr
    result = call("convert", files["x.pkl"], tmp_path / "x4.blp", "--compress", "zlib")
    assert result.returncode == 2 and "--compress" in result.stderr
    (tmp_path / "text").write_text("hello\n")
    result = call("convert", tmp_path / "text", tmp_path / "t.blp")
    assert result.returncode == 1 and "--from" in result.stderr
    result = call("convert", tmp_path / "text", tmp_path / "t.blp", "--from", "pickle")
    assert result.returncode == 1 and "cannot read" in result.stderr
    assert call("convert", tmp_path / "missing.pkl", tmp_path / "m.blp").returncode == 2
    assert not (tmp_path / "t.blp").exists() and not (tmp_path / "m.blp").exists()


def test_convert_refuses_a_dangling_symbolic_link_as_an_existing_file(call, files, tmp_path):
    """Writing through a link to nothing would create the file it names, wherever that is."""
    link, elsewhere = tmp_path / "out.blp", tmp_path / "elsewhere.blp"
    link.symlink_to(elsewhere)
    result = call("convert", files["x.pkl"], link)
    assert result.returncode == 2 and "dangling symbolic link" in result.stderr and "--force" in result.stderr
    assert not elsewhere.exists() and link.is_symlink()


def test_convert_safe_refuses_unknown_globals(call, tmp_path):
    marker, source = tmp_path / "ran", tmp_path / "m.pkl"
    source.write_bytes(pickle.dumps({"m": Marker(str(marker))}))
    result = run("convert", source, tmp_path / "m.blp", "--safe")
    assert result.returncode == 1
    assert "UnsafeLoadError" in result.stderr and "--allow" in result.stderr
    assert not marker.exists() and not (tmp_path / "m.blp").exists()
    chained = tmp_path / "o.pkl"
    chained.write_bytes(pickle.dumps(collections.ChainMap({"a": np.arange(3)})))
    assert call("convert", chained, tmp_path / "o.blp", "--safe").returncode == 1
    result = call("convert", chained, tmp_path / "o.blp", "--allow", "collections.ChainMap")
    assert result.returncode == 0, result.stderr
    assert isinstance(blpickle.load(tmp_path / "o.blp"), collections.ChainMap)


def test_convert_safe_and_joblib(call, files, tmp_path):
    result = call("convert", files["z.joblib"], tmp_path / "z.blp", "--safe")
    assert result.returncode == 2 and "joblib" in result.stderr


def test_convert_without_joblib_gives_a_hint(files, tmp_path):
    result = run("convert", files["z.joblib"], tmp_path / "z.blp", prelude="sys.modules['joblib'] = None")
    assert result.returncode == 1
    assert "pip install joblib" in result.stderr


def test_convert_works_without_tqdm(files, tmp_path):
    result = run("convert", files["x.pkl"], tmp_path / "t.blp", prelude="sys.modules['tqdm'] = None")
    assert result.returncode == 0, result.stderr
    assert_same(sample(), blpickle.load(tmp_path / "t.blp"))


# --------------------------------------------------------------------------------------------
# bench


def test_bench_a_file_json(files):
    result, doc = run_json("bench", files["x.pkl"], "--quick")
    assert result.returncode == 0, result.stderr
    assert doc["machine"]["cpus"] >= 1 and doc["settings"]["repeat"] == 1
    methods = [row["method"] for row in doc["results"]]
    assert methods[0] == "pickle (protocol 5)"
    assert {
        "blpickle default",
        "blpickle fast",
        "blpickle small",
        "blpickle raw",
        "joblib zlib 3",
    } <= set(methods)
    for row in doc["results"]:
        assert "error" not in row, row
        assert row["dataset"] == "x.pkl"
        assert row["size"] > 0 and row["dump_s"] > 0 and row["load_s"] > 0
        assert row["ratio"] == pytest.approx(row["nbytes"] / row["size"])
    default = next(r for r in doc["results"] if r["method"] == "blpickle default")
    assert default["ratio"] > 2.5  # the ramp compresses (the noise alone would not reach 1.2)


def test_bench_sample_datasets_table():
    result = run("bench", "--quick", "--size-mb", "0.2", "--only", "pickle", "default", "--codec", "lz4")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    for word in (
        "low entropy",
        "medium entropy",
        "high entropy",
        "dump MB/s",
        "load MB/s",
        "ratio",
        "blpickle default",
        "codec=lz4",
    ):
        assert word in out
    assert "joblib" not in out  # --only
    assert "differs" not in out


def test_bench_json_checks_loaded_arrays(call):
    result = call("bench", "--quick", "--size-mb", "0.1", "--only", "default", "raw", json_output=True)
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert {row["dataset"] for row in doc["results"]} == {"low", "medium", "high"}
    assert all(row["same"] is True for row in doc["results"])
    assert call("bench", "--only", "nothing-matches", "--quick", "--size-mb", "0.1").returncode == 2
    assert call("bench", "--repeat", "0").returncode == 2


# --------------------------------------------------------------------------------------------
# Pieces


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bar_only_on_a_terminal_and_without_tqdm(monkeypatch):
    pytest.importorskip("tqdm")
    with output.Progress(2, "test", stream=FakeTerminal()) as progress:
        assert progress._bar is not None
        progress.step("one")
        progress.step("two")
    hidden = io.StringIO()
    with output.Progress(2, "test", stream=hidden) as progress:
        assert progress._bar is None
        progress.step("one")
    assert hidden.getvalue() == ""
    monkeypatch.setitem(sys.modules, "tqdm", None)
    with output.Progress(2, "test", stream=FakeTerminal()) as progress:
        assert progress._bar is None
        progress.step("one")


@pytest.mark.parametrize(
    ("text", "size"),
    [("4096", 4096), ("64K", 64 << 10), ("8M", 8 << 20), ("8MiB", 8 << 20), ("1g", 1 << 30)],
)
def test_parse_size(text, size):
    assert arguments.parse_size(text) == size


def test_joblib_blosc_files_are_recognised_without_joblib(call, files, monkeypatch):
    monkeypatch.setitem(sys.modules, "joblib", None)
    result = call("info", files["b.joblib"])
    assert result.returncode == 0, result.stderr
    assert "'blosc'" in result.stdout and "pip install joblib" in result.stdout
