"""The package's layers, read from its import statements (``ast``, nothing imported): the
format layer imports nothing above it, nor does the engine or io; integrations use the public
API and a few modules besides; no module or folder imports itself back."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "blpickle"
#: The public modules on top: what any user (and so any integration) may import.
PUBLIC = {"blpickle", *(f"blpickle.{m}" for m in ("arrays", "errors", "info", "lazy", "options", "pickler", "record"))}
PUBLIC |= {"blpickle.safe", "blpickle.unpickler"}
#: What each layer may import besides its own folder.
BELOW = {
    "format": {"blpickle.errors"},
    "io": {"blpickle.errors", "blpickle.format"},
    "engine": {"blpickle.errors", "blpickle.options", "blpickle.arrays", "blpickle.format", "blpickle.io"},
}
#: At most this many modules outside integrations/ and the public API serve integrations.
MAX_INTEGRATION_HELPERS = 6


def _module(path: Path) -> str:
    parts = ["blpickle", *path.relative_to(PACKAGE).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(name: str) -> bool:
    path = PACKAGE.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _imports(path: Path, *, module_level: bool) -> set[str]:
    """The blpickle modules ``path`` imports (``from X import m`` counts module ``X.m``); with
    ``module_level``, only the statements that run on import (not in functions, not under
    ``TYPE_CHECKING``)."""
    module = _module(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    tree = ast.parse(path.read_text())
    nodes = _top_statements(tree.body) if module_level else _all_statements(tree)
    found = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([node.module] if node.module else []))
            for alias in node.names:
                name = f"{base}.{alias.name}"
                found.add(name if _is_module(name) else base)
    return {name for name in found if name.split(".")[0] == "blpickle"} - {module}


def _type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _all_statements(tree: ast.AST) -> list[ast.AST]:
    """Every node of ``tree`` but those under ``if TYPE_CHECKING:`` (imports for types only)."""
    out, todo = [], [tree]
    while todo:
        node = todo.pop()
        out.append(node)
        todo += [child for child in ast.iter_child_nodes(node) if not _type_checking(child)]
    return out


def _top_statements(body: list[ast.stmt]) -> list[ast.stmt]:
    out = []
    for node in body:
        if _type_checking(node):
            continue
        if isinstance(node, (ast.If, ast.Try)):
            out += _top_statements(node.body + getattr(node, "orelse", []) + getattr(node, "finalbody", []))
            for handler in getattr(node, "handlers", []):
                out += _top_statements(handler.body)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            out.append(node)
    return out


MODULES = {_module(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _folder(module: str) -> str:
    """The folder of a module under blpickle/ ("format", "engine", ...), or the module itself on top."""
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and (PACKAGE / parts[1]).is_dir()) else module


def _within(name: str, allowed: set[str]) -> bool:
    return any(name == a or name.startswith(a + ".") for a in allowed)


@pytest.mark.parametrize("layer", sorted(BELOW))
def test_a_lower_layer_imports_nothing_above_it(layer):
    allowed = BELOW[layer] | {f"blpickle.{layer}"}
    above = {
        (module, name)
        for module, path in MODULES.items()
        if _folder(module) == layer
        for name in _imports(path, module_level=False)
        if not _within(name, allowed)
    }
    assert above == set()


def test_integrations_use_the_public_api_and_a_few_modules_besides():
    helpers = {
        name
        for module, path in MODULES.items()
        if _folder(module) == "integrations"
        for name in _imports(path, module_level=False)
        if _folder(name) != "integrations" and name not in PUBLIC
    }
    assert len(helpers) <= MAX_INTEGRATION_HELPERS, sorted(helpers)
    assert not any(_folder(name) in ("cli", "restricted") for name in helpers)


def test_each_library_s_reconstructors_import_only_the_shared_checks():
    """A library's vetted reconstructors change in its own module of restricted/reconstructors/."""
    folder = "blpickle.restricted.reconstructors"
    crossing = {
        (module, name)
        for module, path in MODULES.items()
        if module.startswith(folder + ".")
        for name in _imports(path, module_level=False)
        if name.startswith(folder) and name != f"{folder}.checks"
    }
    assert crossing == set()


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """Return a cycle of ``graph`` (a list of nodes, the first repeated at the end), or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for after in sorted(graph.get(node, ())):
            if state.get(after) == 1:
                return [*stack[stack.index(after) :], after]
            if after not in state and (found := visit(after)) is not None:
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)) is not None:
            return found
    return None


def test_no_module_imports_itself_back_on_import():
    graph = {module: _imports(path, module_level=True) for module, path in MODULES.items()}
    assert _cycle(graph) is None


def test_no_folder_imports_itself_back():
    """Folders and the modules on top, each one node; imports in functions count too."""
    graph: dict[str, set[str]] = defaultdict(set)
    for module, path in MODULES.items():
        for name in _imports(path, module_level=False):
            if _folder(name) != _folder(module):
                graph[_folder(module)].add(_folder(name))
    assert _cycle(graph) is None


def test_the_checks_see_the_imports_they_judge():
    assert "blpickle.format" in _imports(MODULES["blpickle.engine.reader"], module_level=True)
    assert "blpickle.format.trailer" in _imports(MODULES["blpickle.record"], module_level=True)
    assert _cycle({"a": {"b"}, "b": {"a"}}) == ["a", "b", "a"]
    assert len(MODULES) > 40


def test_no_module_is_over_600_lines():
    lengths = {path.relative_to(PACKAGE): len(path.read_text().splitlines()) for path in PACKAGE.rglob("*.py")}
    assert {str(path): n for path, n in lengths.items() if n > 600} == {}
