"""Restricted loading: what ``safe=True`` and ``allowed=`` admit (`Policy`, the model), and
`untrusted_globals`, which lists what a file needs beyond it without loading anything."""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from .errors import BadMagicError
from .format import MAGIC
from .info import inspect, pickle_globals
from .io.files import open_input
from .restricted.policy import DENIED, SAFE_CLASSES, SAFE_GLOBALS, SAFE_PACKAGES, UNCHECKED, Policy

__all__ = ["DENIED", "SAFE_CLASSES", "SAFE_GLOBALS", "SAFE_PACKAGES", "UNCHECKED", "Policy", "untrusted_globals"]


def untrusted_globals(
    file: Any, *, allowed: Iterable[str | Any] | None = None, key: bytes | None = None
) -> dict[str, str]:
    """Return every global the pickle in ``file`` names that a load with ``allowed`` would
    refuse, ``{"module.name": why}`` in order of first use, unpickling nothing (as
    ``skops.io.get_untrusted_types`` does). Empty: the names all pass, although a load may
    still refuse how the pickle uses one (a class called with arguments). Modules of allowed
    packages are imported to judge names in them; nothing else is.

    Args:
        file: a path, a binary file object or a bytes-like object: a blpickle record (its
            checksums are checked, and its signature with ``key``) or plain pickle data.
        allowed: as for `blpickle.load` (None: what ``safe=True`` admits).
        key: the key a record was signed with.

    Raises:
        blpickle.LoadError: for a damaged record or pickle.
    """
    policy = Policy(allowed or ())
    if isinstance(file, (str, os.PathLike)):
        with open_input(file) as opened:
            return untrusted_globals(opened.read(), allowed=allowed, key=key)
    data = file if not hasattr(file, "read") else file.read()
    try:
        names = inspect(data, key=key).globals
    except BadMagicError:
        if bytes(memoryview(data)[: len(MAGIC)]) == MAGIC:
            raise
        names = pickle_globals(data)
    found: dict[str, str] = {}
    for name in names:
        reason = _refusal(policy, name)
        if reason is not None:
            found[name] = reason
    return found


def _refusal(policy: Policy, name: str) -> str | None:
    """Why ``policy`` refuses ``name`` (``module.name`` as the scanner joins them, where
    either part may hold dots), or None when one way of splitting it is admitted."""
    if name.startswith("<"):
        return "a name the pickle computes, which cannot be judged before it runs"
    parts = name.split(".")
    first = None
    for cut in range(len(parts) - 1, 0, -1):
        reason = policy.refusal(".".join(parts[:cut]), ".".join(parts[cut:]))
        if reason is None:
            return None
        first = first or reason
    return first or "it names no module"
