"""Listing the refusals of a restricted load: after the first refusal, the rest of the pickle
is read with these handlers in place of those that would import, call, create, set or fill,
running nothing (each gives `UNKNOWN`), so that one `UnsafeLoadError` names every global the
policy refuses."""

from __future__ import annotations

from typing import Any

from .machine import UNKNOWN, Handler, Machine

__all__ = ["LISTING_HANDLERS"]


def _listed(self: Machine, module: Any, name: Any) -> None:
    """Record whether the policy refuses ``module.name``, importing nothing it refuses."""
    if not isinstance(module, str) or not isinstance(name, str):
        self._refused.setdefault("<computed>", "a name the pickle computes, which cannot be judged before it runs")
        return
    reason = self._policy.refusal(module, name)
    if reason is not None:
        self._refused.setdefault(f"{module}.{name}", reason)


def _list_global(self: Machine) -> None:
    module = self._line().decode("utf-8")
    name = self._line().decode("utf-8")
    _listed(self, module, name)
    self._stack.append(UNKNOWN)


def _list_stack_global(self: Machine) -> None:
    name = self._stack.pop()
    module = self._stack.pop()
    _listed(self, module, name)
    self._stack.append(UNKNOWN)


def _list_inst(self: Machine) -> None:
    _list_global(self)
    self._stack.pop()
    self._pop_mark()
    self._stack.append(UNKNOWN)


def _list_obj(self: Machine) -> None:
    self._pop_mark()
    self._stack.append(UNKNOWN)


def _skip(popped: int, mark: bool = False, result: bool = True) -> Handler:
    """A handler that pops ``popped`` items (then a mark) and pushes `UNKNOWN`, running nothing."""

    def skip(self: Machine) -> None:
        for _ in range(popped):
            self._stack.pop()
        if mark:
            self._pop_mark()
        if result:
            self._stack.append(UNKNOWN)

    return skip


def _list_ext(width: int) -> Handler:
    def ext(self: Machine) -> None:
        code = int.from_bytes(self._read(width), "little")
        self._refused.setdefault(f"copyreg.extension code {code:#x}", "safe mode does not load extension codes")
        self._stack.append(UNKNOWN)

    return ext


def _list_persid(self: Machine) -> None:
    self._line()
    self._stack.append(UNKNOWN)


def _push_unknown(self: Machine) -> None:
    self._stack.append(UNKNOWN)


#: The listing's handlers of the opcodes that would run code, import, set or fill, by opcode
#: name (the other opcodes keep the load's handlers).
LISTING_HANDLERS: dict[str, Handler] = {
    "GLOBAL": _list_global,
    "STACK_GLOBAL": _list_stack_global,
    "INST": _list_inst,
    "OBJ": _list_obj,
    "REDUCE": _skip(2),
    "NEWOBJ": _skip(2),
    "NEWOBJ_EX": _skip(3),
    "BUILD": _skip(1, result=False),
    "APPEND": _skip(1, result=False),
    "APPENDS": _skip(0, mark=True, result=False),
    "SETITEM": _skip(2, result=False),
    "SETITEMS": _skip(0, mark=True, result=False),
    "ADDITEMS": _skip(0, mark=True, result=False),
    "NEXT_BUFFER": _push_unknown,
    "READONLY_BUFFER": lambda self: None,
    "EXT1": _list_ext(1),
    "EXT2": _list_ext(2),
    "EXT4": _list_ext(4),
    "PERSID": _list_persid,
    "BINPERSID": _skip(1),
}
