"""Integrations with other libraries: joblib, loky, multiprocessing, dask.

Each module imports the library it integrates with; this package imports none of them, and
nothing registers itself on import: ``blpickle.integrations.joblib.register()`` and
``blpickle.integrations.dask.register()`` do it explicitly.
"""

from __future__ import annotations

__all__ = ["JOBLIB_MAGIC"]

#: The first 8 bytes of a stream written by the ``"blosc"`` joblib compressor
#: (`blpickle.integrations.joblib`), here so that the command line can recognise such
#: files without importing joblib.
JOBLIB_MAGIC = b"\xb2BLJB\r\n\x1a"
