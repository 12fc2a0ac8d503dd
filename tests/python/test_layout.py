"""The package's layout rules, read from the source: the layer table in ARCHITECTURE.md (which layer may import
which) holds for every import, no import cycle between gpuguard's modules (imports inside functions and under
TYPE_CHECKING count too), and every module opens with a one-line docstring."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Optional

import pytest

pytestmark = pytest.mark.version_independent  # CI runs this file on the oldest corner only (pyproject's markers)

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "python" / "gpuguard"
ARCHITECTURE = ROOT / "ARCHITECTURE.md"
COMPILED = {"_core", "_libtorch", "_C", "_scan"}  # the two modules, and the names they replaced


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    """The package's source modules; not the build records a build writes beside them (_build_info_<tag>.py)."""
    return {_module_name(p): p for p in PACKAGE.rglob("*.py") if not p.name.startswith("_build_info")}


def _known() -> set[str]:
    """Every gpuguard module: the Python ones and the compiled ones (no source here)."""
    return set(_modules()) | {"gpuguard._core", "gpuguard._libtorch"}


def _is_package(name: str) -> bool:
    return (PACKAGE.parent / name.replace(".", "/") / "__init__.py").exists()


def _targets(node: ast.AST, name: str, known: set[str]) -> list[str]:
    """The gpuguard modules one import statement of module ``name`` names, relative imports resolved:
    ``from .. import x`` in gpuguard.a.b is gpuguard.x when x is a module, else the package gpuguard."""
    if isinstance(node, ast.Import):
        targets = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom):
        if node.level:
            base = name if _is_package(name) else name.rpartition(".")[0]
            for _ in range(node.level - 1):
                base = base.rpartition(".")[0]
            base = f"{base}.{node.module}" if node.module else base
        else:
            base = node.module or ""
        # "from pkg import x" imports pkg.x when x is a module, else pkg itself (x is a name its __init__ defines)
        modules = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in known]
        targets = modules + ([base] if len(modules) < len(node.names) else [])
    else:
        return []
    return [t for t in targets if t in known]


def _with_parents(target: str, importer: str) -> list[str]:
    """The packages above ``target``, whose __init__ an import of it runs (importing a.b.c runs a/__init__ and
    a/b/__init__), less those above the importer itself (they ran before it did); then ``target``."""
    parts = target.split(".")
    above_importer = {".".join(importer.split(".")[:i]) for i in range(1, importer.count(".") + 1)}
    return [p for p in (".".join(parts[:i]) for i in range(1, len(parts))) if p not in above_importer] + [target]


def _imports(name: str, path: Path, known: set[str], transparent: frozenset[str] = frozenset()) -> set[str]:
    """Every gpuguard module ``name`` imports, wherever the import statement stands, with the parent packages
    each import runs but those in ``transparent`` (an __init__ that imports nothing at run time costs nothing to
    pass through; a package imported for itself still counts)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        for target in _targets(node, name, known):
            *parents, _ = _with_parents(target, name)
            found.update(p for p in parents if p not in transparent)
            found.add(target)
    found.discard(name)
    return found


def _run_time_imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The gpuguard modules a module's body imports when it is imported: top-level statements, none of them under
    ``if TYPE_CHECKING:`` (a package __init__ that imports nothing then costs nothing to pass through)."""
    found: set[str] = set()

    def visit(statements: list[ast.stmt]) -> None:
        for node in statements:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                visit(node.orelse)
            elif isinstance(node, (ast.If, ast.Try, ast.With)):
                for block in ("body", "orelse", "finalbody"):
                    visit(getattr(node, block, []))
                for handler in getattr(node, "handlers", []):
                    visit(handler.body)
            else:
                found.update(_targets(node, name, known))

    visit(ast.parse(path.read_text()).body)
    found.discard(name)
    return found


# ---- the layer table -------------------------------------------------------------------------------------------

def _names(cell: str) -> list[str]:
    """A cell's entries: `module` names in backticks (relative to gpuguard; `__init__` is the package itself) and
    plain layer names; "—" is none."""
    return [entry.strip() for entry in cell.replace("`", "").split(",") if entry.strip() not in ("", "—")]


def _table(text: str) -> tuple[dict[str, list[str]], dict[str, list[str]], set[str]]:
    """(layer -> its modules, layer -> what it may import, the layers whose row says "every layer") from the table
    under ARCHITECTURE.md's "## Layers"."""
    section = text.split("\n## Layers", 1)[1].split("\n## ", 1)[0]
    members: dict[str, list[str]] = {}
    allowed: dict[str, list[str]] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("|") or len(cells) != 3 or cells[0] in ("layer", "") or set(cells[0]) <= {"-"}:
            continue
        layer = cells[0].strip("*")
        members[layer] = ["gpuguard" if m == "__init__" else f"gpuguard.{m}" for m in _names(cells[1])]
        allowed[layer] = _names(cells[2])
    open_rows = {layer for layer, row in allowed.items() if row == ["every layer"]}
    for layer in open_rows:
        allowed[layer] = [other for other in members if other != layer]
    return members, allowed, open_rows


def _layer_of(module: str, members: dict[str, list[str]]) -> Optional[str]:
    """The layer whose entry names ``module`` most closely (itself, else the nearest package above it; the package
    gpuguard itself places only its __init__, so that a new top-level module must be placed)."""
    best: tuple[int, Optional[str]] = (-1, None)
    for layer, entries in members.items():
        for entry in entries:
            if module == entry or (entry != "gpuguard" and module.startswith(entry + ".")):
                best = max(best, (entry.count(".") + (module == entry), layer), key=lambda b: b[0])
    return best[1]


def _allows(importer_layer: str, target: str, members: dict[str, list[str]],
            allowed: dict[str, list[str]]) -> Optional[str]:
    """The entry of ``importer_layer``'s row that allows importing ``target`` (its own layer: the layer's name), or
    None when none does."""
    target_layer = _layer_of(target, members)
    if target_layer == importer_layer:
        return importer_layer
    for entry in allowed[importer_layer]:
        if entry == target_layer:
            return entry
        module = f"gpuguard.{entry}"
        if entry not in members and (target == module or target.startswith(module + ".")):
            return entry
    return None


def _violations(graph: dict[str, set[str]], members: dict[str, list[str]],
                allowed: dict[str, list[str]]) -> tuple[list[str], set[tuple[str, str]]]:
    """The imports the table does not allow, as lines to read, and the (layer, entry) permissions some import used."""
    wrong: list[str] = []
    used: set[tuple[str, str]] = set()
    for importer, targets in sorted(graph.items()):
        layer = _layer_of(importer, members)
        assert layer is not None, importer
        for target in sorted(targets):
            entry = _allows(layer, target, members, allowed)
            if entry is None:
                wrong.append(f"{importer} ({layer}) imports {target} ({_layer_of(target, members)})")
            else:
                used.add((layer, entry))
    return wrong, used


def _layer_graph() -> dict[str, set[str]]:
    """Each module's imports, passing through the packages whose __init__ imports nothing at run time."""
    modules, known = _modules(), _known()
    transparent = frozenset(name for name, path in modules.items()
                            if path.name == "__init__.py" and not _run_time_imports(name, path, known))
    return {name: _imports(name, path, known, transparent) for name, path in modules.items()}


def test_the_layer_table_places_every_module_in_one_layer():
    members, allowed, _ = _table(ARCHITECTURE.read_text())
    assert members, "ARCHITECTURE.md has no table under '## Layers'"
    unplaced = sorted(m for m in _known() if _layer_of(m, members) is None)
    assert unplaced == [], f"modules ARCHITECTURE.md's layer table does not place: {unplaced}"
    stale = sorted(e for entries in members.values() for e in entries
                   if not any(m == e or m.startswith(e + ".") for m in _known()))
    assert stale == [], f"the layer table names modules that do not exist: {stale}"
    unknown = sorted({e for row in allowed.values() for e in row if e not in members
                      and not any(m == f"gpuguard.{e}" or m.startswith(f"gpuguard.{e}.") for m in _known())})
    assert unknown == [], f"the layer table allows imports of what is neither a layer nor a module: {unknown}"


def test_every_import_runs_the_way_the_layer_table_says():
    """Each import, with the parent packages it runs, is of the importer's own layer or of an entry of its row;
    and each entry of a row is used by some import, so that the table claims no more than the code does."""
    members, allowed, open_rows = _table(ARCHITECTURE.read_text())
    wrong, used = _violations(_layer_graph(), members, allowed)
    assert wrong == [], "imports ARCHITECTURE.md's layer table does not allow:\n" + "\n".join(wrong)
    unused = sorted(f"{layer}: {entry}" for layer, row in allowed.items() for entry in row
                    if (layer, entry) not in used and layer not in open_rows)
    assert unused == [], f"ARCHITECTURE.md's layer table allows imports no module makes: {unused}"


def test_bind_reaches_neither_the_watchdog_nor_the_explainer():
    """Everything gpuguard.binding can import, lazily or not: the NCCL check's one recogniser, no explainer (nor
    its 14 recognisers), no watchdog (bind(watch=True) is composed above both, in api.py)."""
    graph = _layer_graph()
    reached, todo = set(), ["gpuguard.binding"]
    while todo:
        for module in graph.get(todo.pop(), ()):
            if module not in reached:
                reached.add(module)
                todo.append(module)
    assert "gpuguard.logs.recognisers.duplicate_gpu" in reached
    assert sorted(m for m in reached if m in ("gpuguard.logs", "gpuguard.logs.explainer", "gpuguard.logs.registry")
                  or m.startswith("gpuguard.watchdog")) == []


def test_the_layer_check_sees_relative_imports_and_parent_packages():
    known = {"gpuguard", "gpuguard.a", "gpuguard.a.b", "gpuguard.a.b.c", "gpuguard.x"}
    tree = ast.parse("from .. import x\nfrom ..a.b import c\n")
    assert [t for node in tree.body for t in _targets(node, "gpuguard.a.m", known)] == ["gpuguard.x", "gpuguard.a.b.c"]
    assert _targets(ast.parse("from .. import bind").body[0], "gpuguard.a.m", known) == ["gpuguard"]
    assert _with_parents("gpuguard.a.b.c", "gpuguard.x") == ["gpuguard.a", "gpuguard.a.b", "gpuguard.a.b.c"]
    assert _with_parents("gpuguard.a.b.c", "gpuguard.a.b.d") == ["gpuguard.a.b.c"]  # its own packages ran first
    members = {"low": ["gpuguard.x"], "high": ["gpuguard.a"], "face": ["gpuguard"]}
    graph = {"gpuguard.x": {"gpuguard.a", "gpuguard.a.b"}, "gpuguard.a.b": {"gpuguard.x"}}
    wrong, used = _violations(graph, members, {"low": [], "high": ["low"], "face": []})
    assert wrong == ["gpuguard.x (low) imports gpuguard.a (high)", "gpuguard.x (low) imports gpuguard.a.b (high)"]
    assert used == {("high", "low")}
    # one module of another layer may be allowed alone, if its package's __init__ imports nothing at run time
    wrong, _ = _violations({"gpuguard.x": {"gpuguard.a.b"}}, members, {"low": ["a.b"], "high": [], "face": []})
    assert wrong == []
    wrong, _ = _violations({"gpuguard.x": {"gpuguard.a", "gpuguard.a.b"}}, members,
                           {"low": ["a.b"], "high": [], "face": []})
    assert wrong == ["gpuguard.x (low) imports gpuguard.a (high)"]


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
