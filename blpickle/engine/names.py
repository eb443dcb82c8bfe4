"""Where each out-of-band array sits in a dumped object: its path, such as ``"weights"``,
``"model.coef_"`` or ``"layers[3]"``, recorded in the header so that `blpickle.open` can
find an array by name.

The object is walked breadth first through dict keys, list and tuple indices and instance
attributes, a few levels deep and within a fixed budget of steps, so that naming costs
little whatever the object's size; arrays it does not reach stay unnamed (listed by
position).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from types import FunctionType, ModuleType
from typing import Any

import numpy as np

__all__ = ["MAX_DEPTH", "MAX_NAME_LENGTH", "MAX_STEPS", "array_names"]

#: Containers deeper than this under the dumped object are not looked into.
MAX_DEPTH = 6
#: At most this many children are looked at in one walk.
MAX_STEPS = 20_000
#: Longer paths are not recorded.
MAX_NAME_LENGTH = 200

#: Children of these types hold no arrays: not worth a step in the queue.
_LEAVES = (str, bytes, bytearray, int, float, complex, bool, type(None), type, ModuleType, FunctionType)


def array_names(root: Any, wanted: dict[int, int]) -> dict[int, str]:
    """Return ``{position: path}`` for the arrays of ``wanted`` (``{id(array): position}``)
    found in ``root``, each by its shortest path; an array whose path another one has
    already (``{"a.b": x, "a": {"b": y}}``) gets no name. The root itself gets no name."""
    names: dict[int, str] = {}
    taken: set[str] = set()
    seen = {id(root)}
    queue: deque[tuple[Any, str, int]] = deque([(root, "", 0)])
    steps = 0
    while queue and len(names) < len(wanted) and steps < MAX_STEPS:
        obj, path, depth = queue.popleft()
        if depth >= MAX_DEPTH or isinstance(obj, np.ndarray):
            continue
        for child_path, child in _children(obj, path):
            steps += 1
            if steps > MAX_STEPS:
                break
            if isinstance(child, _LEAVES) or id(child) in seen:
                continue
            seen.add(id(child))
            position = wanted.get(id(child))
            if position is not None:
                if len(child_path) <= MAX_NAME_LENGTH and child_path not in taken:
                    names[position] = child_path
                    taken.add(child_path)
                continue
            queue.append((child, child_path, depth + 1))
    return names


def _children(obj: Any, path: str) -> Iterator[tuple[str, Any]]:
    """Yield ``(path, child)`` for the items of a dict, list or tuple, or the attributes of
    an instance."""
    if isinstance(obj, dict):
        for key, value in obj.items():
            name = _key_path(path, key)
            if name is not None:
                yield name, value
    elif isinstance(obj, (list, tuple)):
        for index, value in enumerate(obj):
            yield f"{path}[{index}]", value
    else:
        attributes = getattr(obj, "__dict__", None)
        if isinstance(attributes, dict):
            for key, value in attributes.items():
                if isinstance(key, str):
                    yield _attribute_path(path, key), value


def _attribute_path(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _key_path(path: str, key: Any) -> str | None:
    """The path of a dict item: ``a.key`` for identifier keys and dotted ones (the keys of a
    torch state dict, ``layers.0.weight``), ``a['some key']`` or ``a[3]`` for other strings
    and integers; None for other keys."""
    if isinstance(key, str):
        dotted = all(part.isidentifier() or part.isdigit() for part in key.split("."))
        return _attribute_path(path, key) if dotted else f"{path}[{key!r}]"
    if isinstance(key, int) and not isinstance(key, bool):
        return f"{path}[{key}]"
    return None
