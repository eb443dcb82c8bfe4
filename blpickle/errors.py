"""The blpickle exception tree.

```text
BlpickleError
 ├── OptionsError (ValueError)          invalid dump/load options
 ├── DumpError (pickle.PicklingError)   could not write an object or buffer
 └── LoadError (pickle.UnpicklingError) not a valid blpickle record
      ├── BadMagicError                 no blpickle magic at the start
      ├── UnsupportedVersionError       a format major version not known
      ├── TruncatedError (EOFError)     the input ended early
      ├── ChecksumError                 a checksum does not match the data
      ├── LimitError                    a size over a limit or unallocatable
      ├── CorruptError                  a field value that cannot be right
      ├── SignatureError                no signature, or a wrong one
      └── UnsafeLoadError               a global the restricted load refuses
```

Every load-side error is a ``pickle.UnpicklingError``, so ``except pickle.UnpicklingError``
in existing code keeps catching them.
"""

from __future__ import annotations

import pickle
import sys

__all__ = [
    "BadMagicError",
    "BlpickleError",
    "BlpickleWarning",
    "ChecksumError",
    "CorruptError",
    "DumpError",
    "LimitError",
    "LoadError",
    "OptionsError",
    "SignatureError",
    "TruncatedError",
    "UnsafeLoadError",
    "UnsupportedVersionError",
]


def add_note(exc: BaseException, note: str) -> None:
    """Add ``note`` to ``exc`` as ``BaseException.add_note`` does from Python 3.11 on; before,
    append it to ``__notes__`` by hand, where callers (and the CLI) find it all the same."""
    if sys.version_info >= (3, 11):
        exc.add_note(note)
    else:
        exc.__notes__ = [*getattr(exc, "__notes__", ()), note]  # type: ignore[attr-defined]


class BlpickleError(Exception):
    """Base class of every exception raised by blpickle."""


class BlpickleWarning(UserWarning):
    """Something in the environment changes how blpickle works (for example BLOSC_* variables)."""


class OptionsError(BlpickleError, ValueError):
    """An option passed to dump/load has an invalid value."""


class DumpError(BlpickleError, pickle.PicklingError):
    """An object or one of its buffers could not be written."""


class LoadError(BlpickleError, pickle.UnpicklingError):
    """The input is not a valid blpickle record."""


class BadMagicError(LoadError):
    """The input does not start with the blpickle magic bytes."""

    def __init__(self, found: bytes, hint: str = "") -> None:
        message = f"not a blpickle record: expected the magic bytes at offset 0, found {found!r}"
        super().__init__(f"{message}; {hint}" if hint else message)
        self.found = found


class UnsupportedVersionError(LoadError):
    """The record was written with a format major version this reader does not know."""

    def __init__(self, major: int, minor: int, supported: int) -> None:
        super().__init__(
            f"blpickle format version {major}.{minor} is not supported by this reader "
            f"(it reads major version {supported}); upgrade blpickle"
        )
        self.major, self.minor = major, minor


class _MismatchError(LoadError):
    """What the record promised at one place (``what`` at ``offset``), and what was found."""

    _template: str  # the message, formatted with the four fields

    def __init__(self, what: str, offset: int, expected: int, found: int) -> None:
        super().__init__(self._template.format(what=what, offset=offset, expected=expected, found=found))
        self.what, self.offset, self.expected, self.found = what, offset, expected, found


class TruncatedError(_MismatchError, EOFError):
    """The input ended before the record was complete."""

    _template = (
        "blpickle record truncated while reading {what} at offset {offset}: expected {expected} bytes, found {found}"
    )


class ChecksumError(_MismatchError):
    """A stored checksum does not match the data it covers."""

    _template = (
        "checksum mismatch in {what} at offset {offset}: "
        "stored {expected:#018x}, computed {found:#018x}; the data is damaged"
    )


class LimitError(LoadError):
    """A size declared in the record (in its header, or by an object of its pickle) is over a
    limit or more than can be allocated; nothing was allocated for it."""


class CorruptError(LoadError):
    """A field of the record has a value that cannot be right."""


class SignatureError(LoadError):
    """A load with a key found the record unsigned, or signed with another key, or altered."""


class UnsafeLoadError(LoadError):
    """A restricted load (``safe=True``, ``allowed=``) met a global it does not admit, or a use
    of one it does not allow (a function called, a class called with arguments); the refused
    global never ran.

    Attributes:
        module, name, reason: the first refusal.
        refused: every global of the pickle the policy refuses, ``{"module.name": reason}``
            (the pickle is read to its end, running nothing after the first refusal).
    """

    def __init__(self, module: str, name: str, reason: str = "", refused: dict[str, str] | None = None) -> None:
        self.module, self.name = module, name
        self.reason = reason or "safe=True admits builtin containers and scalars and numpy data"
        self.refused = dict(refused) if refused else {f"{module}.{name}": self.reason}
        lines = [f"refused to import {path}: {why}" for path, why in self.refused.items()]
        hint = ", ".join(
            repr(path)
            for path, why in self.refused.items()
            if not path.startswith("<") and "even when named" not in why
        )
        lines.append(
            "if you trust this data, allow what it needs: a package's classes with allowed=['pkg.*'], "
            f"a function or a class called with arguments by its exact name (allowed=[{hint}])"
            if hint
            else "no allowed= admits it"
        )
        super().__init__("\n".join(lines) if len(self.refused) > 1 else f"{lines[0]}; {lines[1]}")

    @classmethod
    def of(cls, refused: dict[str, str]) -> UnsafeLoadError:
        """The error that lists every refusal of ``refused`` (at least one)."""
        path, reason = next(iter(refused.items()))
        module, _, name = path.rpartition(".") if not path.startswith("<") else ("", "", path)
        return cls(module, name, reason, refused)
