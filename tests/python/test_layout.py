"""The package's layout rules, read from the source: no import cycle between gpuguard's modules (imports inside
functions and under TYPE_CHECKING count too), and every module opens with a one-line docstring."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.version_independent  # CI runs this file on the oldest corner only (pyproject's markers)

PACKAGE = Path(__file__).resolve().parents[2] / "python" / "gpuguard"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """Every gpuguard module ``name`` imports, wherever the import statement stands."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package
            for _ in range(node.level - 1):
                base = base.rpartition(".")[0]
            module = node.module or ""
            base = (f"{base}.{module}" if base else module) if node.level else module
            # "from pkg import x" imports pkg, and pkg.x too when x is a module
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        found.update(t for t in targets if t in known and t != name)
    return found


def _cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import cycle as a list of modules, or [] when there is none (depth-first search)."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return []

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return []


def test_no_import_cycle_between_gpuguard_modules():
    modules = _modules()
    known = set(modules)
    # the package's __init__ re-exports everything by design; what matters is that no module imports it back
    graph = {name: _imports(name, path, known) for name, path in modules.items()}
    importers_of_root = sorted(n for n, deps in graph.items() if "gpuguard" in deps and n != "gpuguard")
    assert importers_of_root == [], f"these modules import the gpuguard package itself: {importers_of_root}"
    assert _cycle(graph) == []


def test_the_cycle_finder_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) == []


def test_every_module_opens_with_a_docstring_saying_what_it_is_for():
    missing = [name for name, path in _modules().items() if not ast.get_docstring(ast.parse(path.read_text()))]
    assert missing == []


COMPILED = {"_core", "_libtorch", "_C", "_scan"}  # the two modules, and the names they replaced


def test_compiled_modules_are_imported_from_where_they_live_and_libtorch_only_through_its_loader():
    through_package, libtorch_users = [], []
    for name, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom):
                continue
            if node.level and not node.module and {a.name for a in node.names} & COMPILED:
                through_package.append(name)  # `from . import _core` asks the package's __getattr__ first
            if (node.module or "").split(".")[-1] == "_libtorch":
                libtorch_users.append(name)
    assert through_package == [], f"these modules reach a compiled module through the package: {through_package}"
    # torch's version is checked before _libtorch loads, so nothing imports it but _libtorch_loader (importlib)
    assert libtorch_users == [], f"these modules import gpuguard._libtorch past its loader: {libtorch_users}"
