"""Optional integrations with other libraries; each one is only loaded when that library is."""

from __future__ import annotations

import sys

__all__ = ["register_joblib"]


def register_joblib() -> bool:
    """Register blpickle with joblib if joblib is installed; return whether it was.

    Registers the ``"blosc"`` compressor (``joblib.dump(obj, f, compress="blosc")``) and the
    ``"blpickle"`` store backend (``joblib.Memory(location, backend="blpickle")``); see
    :mod:`blpickle.integrations.joblib`. Safe to call more than once. While joblib itself is
    being imported (it imports blpickle when ``LOKY_PICKLER`` names it) nothing is registered
    and False is returned: the loky integration registers at its first use.
    """
    importing = sys.modules.get("joblib")
    if importing is not None and getattr(importing.__spec__, "_initializing", False):
        return False  # joblib is importing blpickle (LOKY_PICKLER): registered at first use
    try:
        from . import joblib as integration
    except ImportError as exc:
        if exc.name is not None and exc.name.split(".")[0] == "joblib":
            return False  # joblib is not installed: nothing to register with
        raise
    return integration.register()
