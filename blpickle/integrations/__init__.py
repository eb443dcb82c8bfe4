"""Integrations with other libraries: joblib, loky, multiprocessing, dask.

Each module imports the library it integrates with; this package imports none of them, and
nothing registers itself on import: ``blpickle.integrations.joblib.register()`` and
``blpickle.integrations.dask.register()`` do it explicitly.
"""

from __future__ import annotations

from ..format import JOBLIB_MAGIC

__all__ = ["JOBLIB_MAGIC"]
