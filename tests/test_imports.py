"""Importing blpickle, or any of its integration modules, defines names and does nothing else:
no host library is imported by ``import blpickle`` and no registry changes. Each check runs in
a fresh interpreter, since the test session itself has imported and registered everything."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

_REGISTRIES = """
import copyreg, io, json, sys
from multiprocessing.reduction import ForkingPickler

HOSTS = ("joblib", "dask", "distributed", "loky", "torch", "jax", "jaxlib", "ml_dtypes")

def registries():
    state = {
        "copyreg": sorted(map(repr, copyreg.dispatch_table.items())),
        "forking_pickler": sorted(map(repr, ForkingPickler(io.BytesIO()).dispatch_table.items())),
        "hosts": sorted(m for m in sys.modules if m.split(".")[0] in HOSTS),
    }
    if "blosc2" in sys.modules:
        import blosc2
        releasegil = blosc2.set_releasegil(False)  # returns the state it replaces
        blosc2.set_releasegil(releasegil)
        state["blosc2_releasegil"] = releasegil
    return state
"""


def _run(code: str) -> dict:
    result = subprocess.run(
        [sys.executable, "-c", _REGISTRIES + textwrap.dedent(code)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.splitlines()[-1])


def test_import_blpickle_imports_no_host_library_and_changes_no_registry():
    found = _run(
        """
        import blosc2
        before = registries()
        import blpickle
        after = registries()
        import joblib
        try:
            joblib.dump(1, io.BytesIO(), compress="blosc")
            blosc = "registered"
        except ValueError:
            blosc = "unknown"
        print(json.dumps({"before": before, "after": after, "blosc": blosc}))
        """
    )
    assert found["after"]["hosts"] == []
    assert found["after"] == found["before"]
    assert found["after"]["blosc2_releasegil"] is False
    assert found["blosc"] == "unknown"  # joblib imported after blpickle: no "blosc" compressor


def test_blpickle_works_after_import_without_any_registration():
    found = _run(
        """
        import numpy as np
        import blpickle
        data = np.arange(1_000_000.0)
        assert (blpickle.loads(blpickle.dumps(data, nthreads=2)) == data).all()
        print(json.dumps(registries()))
        """
    )
    assert found["hosts"] == []
    assert found["blosc2_releasegil"] is True  # set when the thread pool first compressed


@pytest.mark.parametrize("module", ["joblib", "loky", "multiprocessing", "dask"])
def test_importing_an_integration_registers_nothing(module):
    found = _run(
        f"""
        import blosc2, joblib, joblib.compressor
        {"from distributed.protocol.serialize import families" if module == "dask" else "families = {}"}
        names = sorted(families)
        before = registries()
        import blpickle.integrations.{module}
        after = registries()
        after["hosts"] = before["hosts"]  # the integration imports its host: that is its job
        try:
            joblib.dump(1, io.BytesIO(), compress="blosc")
            blosc = "registered"
        except ValueError:
            blosc = "unknown"
        print(json.dumps({{"same": before == after, "blosc": blosc, "families": sorted(families) == names}}))
        """
    )
    assert found == {"same": True, "blosc": "unknown", "families": True}


def test_the_installed_version_is_the_package_version():
    import importlib.metadata

    import blpickle

    assert importlib.metadata.version("blpickle") == blpickle.__version__
