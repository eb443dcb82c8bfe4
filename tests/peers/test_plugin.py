"""The peer-suite plugin itself, on small made-up suites (the peer suites are run by run.py)."""

from __future__ import annotations

import pickle

import plugin
import pytest
from expected import Expectation

import blpickle.integrations.joblib
from blpickle.format import MAGIC

pytest_plugins = ["pytester"]


def run(pytester: pytest.Pytester, source: str, *args: str) -> pytest.RunResult:
    pytester.makepyfile(test_peer=source)
    return pytester.runpytest_inprocess("-p", "no:cacheprovider", *args, plugins=[plugin])


def test_pickle_functions_are_blpickle_during_each_test_only(pytester):
    result = run(
        pytester,
        """
        import io, pickle
        import numpy as np
        from blpickle.format import MAGIC

        def test_routed():
            data = pickle.dumps({"a": np.arange(10)})
            assert data.startswith(MAGIC)
            assert pickle.loads(data)["a"].tolist() == list(range(10))
            file = io.BytesIO()
            pickle.dump([1, 2], file)
            assert file.getvalue().startswith(MAGIC)
            assert pickle.load(io.BytesIO(file.getvalue())) == [1, 2]
        """,
    )
    result.assert_outcomes(passed=1)
    assert not pickle.dumps(1).startswith(MAGIC)


def test_joblib_dumps_with_blosc(pytester):
    result = run(
        pytester,
        f"""
        import joblib

        def test_blosc(tmp_path):
            joblib.dump([1, 2], tmp_path / "x", compress="blosc")
            assert (tmp_path / "x").read_bytes().startswith({blpickle.integrations.joblib.MAGIC!r})
            assert joblib.load(tmp_path / "x") == [1, 2]
        """,
    )
    result.assert_outcomes(passed=1)


SUITE = """
import pytest

def test_fails():
    assert False

def test_passes():
    pass

def test_skips_itself():
    pytest.skip("no lz4")

def test_unlisted_skip():
    pytest.skip("no data")
"""


def test_listed_tests_are_marked_and_other_skips_fail(pytester, monkeypatch):
    monkeypatch.setattr(
        plugin,
        "EXPECTED",
        {
            "test_peer.py::test_fails": Expectation("skip", "searches the bytes"),
            "test_peer.py::test_passes": Expectation("xfail", "issue 14 item 0: fixed"),
            "test_peer.py::test_skips_itself": Expectation("may-skip", "runs only without lz4"),
        },
    )
    result = run(pytester, SUITE, "-rA")
    result.assert_outcomes(skipped=2, failed=2)
    result.stdout.fnmatch_lines(
        [
            "*SKIPPED*tests/peers/expected.py: searches the bytes*",
            "FAILED test_peer.py::test_passes*XPASS(strict)*",
            "FAILED test_peer.py::test_unlisted_skip*",
        ]
    )


def test_check_list_names_entries_that_match_no_test(pytester, monkeypatch):
    monkeypatch.setattr(plugin, "EXPECTED", {"test_peer.py::test_renamed": Expectation("skip", "gone")})
    result = run(pytester, SUITE, "--peers-check-list")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*not collected*test_peer.py::test_renamed*"])
