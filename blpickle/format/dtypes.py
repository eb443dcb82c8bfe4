"""An array's dtype as a header's stream map holds it: the text ``str(dtype)`` gives
(docs/format.md, "Header"), written by `dtype_text` and read back by `parse_dtype`."""

from __future__ import annotations

import ast

import numpy as np

__all__ = ["dtype_text", "parse_dtype"]

#: Longest dtype text parsed as a structured dtype.
MAX_DTYPE_TEXT = 4096

_TEXTS: dict[np.dtype, str] = {}


def dtype_text(dtype: np.dtype) -> str:
    """Return ``str(dtype)``, remembered: slow for structured dtypes, and many arrays share one."""
    text = _TEXTS.get(dtype)
    if text is None:
        if len(_TEXTS) > 256:
            _TEXTS.clear()
        text = _TEXTS[dtype] = str(dtype)
    return text


def parse_dtype(text: str) -> np.dtype | None:
    """Return the dtype whose `dtype_text` is ``text`` (structured dtypes through a literal,
    never through code); None for any other text, and for dtypes a buffer cannot be viewed
    as: object dtypes, subarray dtypes (``"(2,)f8"``) and empty ones."""
    try:
        dtype = np.dtype(text)
    except Exception:  # numpy raises TypeError, ValueError or SyntaxError for text it cannot read
        if len(text) > MAX_DTYPE_TEXT:
            return None
        try:
            dtype = np.dtype(ast.literal_eval(text))
        except Exception:  # any text a forged header may hold
            return None
    if dtype.hasobject or not dtype.itemsize or dtype.subdtype is not None:
        return None
    return dtype
