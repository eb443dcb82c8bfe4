"""pytest plugin that runs other projects' pickle tests with blpickle as ``pickle``.

Loaded by ``tests/peers/run.py`` into a pytest session over an installed package's own tests:

- for the duration of each test (its fixtures included), ``pickle.dump``, ``pickle.dumps``,
  ``pickle.load`` and ``pickle.loads`` are blpickle's, so the suites' own calls and the code
  they test (``pandas.to_pickle``/``read_pickle``) write and read blpickle records. None of
  the suites run uses ``pickle.Pickler``/``Unpickler`` by name, so the classes are left alone;
- blpickle's joblib compressor is registered before collection, so joblib's tests
  parametrized over its compressors also run ``"blosc"``;
- the tests named in ``expected.py`` are marked: skipped with the reason they cannot hold for
  any container format, or ``xfail(strict=True)`` for a known blpickle defect;
- a test skipped for a reason ``expected.py`` does not give fails the run, and with
  ``--peers-check-list`` so does an entry of ``expected.py`` that names no collected test.
"""

from __future__ import annotations

import pickle
import posixpath

import pytest
from expected import EXPECTED, Expectation

import blpickle
import blpickle.integrations.joblib

#: The ``pickle`` functions replaced by blpickle's during each test.
ROUTED = ("dump", "dumps", "load", "loads")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--peers-check-list",
        action="store_true",
        help="fail when an entry of tests/peers/expected.py under the collected paths names no collected test",
    )


def pytest_configure(config: pytest.Config) -> None:
    blpickle.integrations.joblib.register()


@pytest.fixture(autouse=True)
def _pickle_is_blpickle(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ROUTED:
        monkeypatch.setattr(pickle, name, getattr(blpickle, name))


def expectation_of(nodeid: str) -> tuple[str, Expectation] | tuple[None, None]:
    """Return the entry of ``expected.py`` for a test (by its full id, then without its
    parameters) and its name there, or ``(None, None)``."""
    for name in (nodeid, nodeid.split("[", 1)[0]):
        if name in EXPECTED:
            return name, EXPECTED[name]
    return None, None


@pytest.hookimpl(trylast=True)  # on the tests left after -k and the suites' own selection
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    used = set()
    for item in items:
        name, expectation = expectation_of(item.nodeid)
        if expectation is None:
            continue
        used.add(name)
        if expectation.kind == "skip":
            item.add_marker(pytest.mark.skip(reason=f"tests/peers/expected.py: {expectation.reason}"))
        elif expectation.kind == "xfail":
            item.add_marker(pytest.mark.xfail(strict=True, reason=expectation.reason))
    if config.getoption("peers_check_list"):
        folders = {_folder(item.nodeid) for item in items}
        stale = sorted(name for name in EXPECTED.keys() - used if _folder(name) in folders)
        if stale:
            raise pytest.UsageError(
                "tests/peers/expected.py names tests that were not collected (renamed or removed?): " + ", ".join(stale)
            )


def _folder(nodeid: str) -> str:
    return posixpath.dirname(nodeid.split("::", 1)[0])


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> pytest.TestReport:
    """Turn a skip that ``expected.py`` does not allow into a failure."""
    report = yield
    if report.skipped and not hasattr(report, "wasxfail"):
        _, expectation = expectation_of(item.nodeid)
        if expectation is None or expectation.kind == "xfail":
            report.outcome = "failed"
            report.longrepr = f"skipped, which tests/peers/expected.py does not allow: {report.longrepr}"
    return report
