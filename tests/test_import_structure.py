"""The package's shape: no import cycle between its modules, and no module over 500 lines.

The graph is read from the source with ``ast``, not by importing. In the load-time graph
an edge is an import that runs when the module loads: imports inside functions run later,
and those under ``if TYPE_CHECKING:`` never run, so neither is an edge. The full graph
adds the imports deferred into functions, since a deferred import is the usual way to
hide a cycle rather than remove it; only ``TYPE_CHECKING`` imports (annotations) stay
out. A package's own ``__init__`` being run before its submodules is Python's doing, not
an edge; an explicit ``from . import name`` of a name that is not a submodule is one (it
reads the package).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

PACKAGE = "django_mysqlq"
ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / PACKAGE
MAX_LINES = 500


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def all_modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(SOURCE.rglob("*.py"))}


def is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def load_time_imports(body: list[ast.stmt],
                      deferred: bool = False) -> Iterator[ast.Import | ast.ImportFrom]:
    """The import statements that run when the module is imported (with ``deferred``,
    also those inside its functions)."""
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.If):
            if not is_type_checking(node.test):
                yield from load_time_imports(node.body, deferred)
            yield from load_time_imports(node.orelse, deferred)
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody,
                          *(handler.body for handler in node.handlers)):
                yield from load_time_imports(block, deferred)
        elif isinstance(node, ast.With | ast.For | ast.While):
            yield from load_time_imports([*node.body, *getattr(node, "orelse", [])], deferred)
        elif isinstance(node, ast.ClassDef):  # a class body runs at import
            yield from load_time_imports(node.body, deferred)
        elif deferred and isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield from load_time_imports(node.body, deferred)


def imported_modules(name: str, path: Path, modules: dict[str, Path],
                     deferred: bool = False) -> set[str]:
    """The package's modules that ``name`` imports at load time (or ever, ``deferred``)."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in load_time_imports(ast.parse(path.read_text(), str(path)).body, deferred):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            if node.level:
                base = name.split(".")
                # A package's level 1 is itself; a module's is the package holding it.
                base = base[: len(base) - node.level + (1 if is_package else 0)]
                origin = ".".join([*base, *([node.module] if node.module else [])])
            else:
                origin = node.module or ""
            # ``from origin import x`` reads the submodule ``origin.x`` when there is one.
            targets = [f"{origin}.{alias.name}" if f"{origin}.{alias.name}" in modules
                       else origin for alias in node.names]
        for target in targets:
            while target and target not in modules:  # ``import a.b.c`` of a non-module c
                target = target.rpartition(".")[0]
            if target.startswith(PACKAGE) and target != name:
                found.add(target)
    return found


def import_graph(deferred: bool = False) -> dict[str, set[str]]:
    modules = all_modules()
    return {name: imported_modules(name, path, modules, deferred)
            for name, path in modules.items()}


def find_cycle(graph: dict[str, set[str]], among: set[str] | None = None) -> list[str] | None:
    """One cycle as the modules along it (first repeated at the end), or None."""
    nodes = set(graph) if among is None else among
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for target in sorted(graph[node] & nodes):
            if state.get(target) == 1:
                return [*path[path.index(target):], target]
            if target not in state and (cycle := visit(target)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(nodes):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen: set[str] = set()
    stack = [start]
    while stack:
        for target in graph[stack.pop()]:
            if target not in seen:
                seen.add(target)
                stack.append(target)
    return seen


# The reader itself, on sources it must get right.


def graph_of(tmp_path: Path, files: dict[str, str],
             deferred: bool = False) -> dict[str, set[str]]:
    for relative, text in files.items():
        target = tmp_path / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    modules = {module_name_under(tmp_path, p): p for p in sorted(tmp_path.rglob("*.py"))}
    return {name: imported_modules(name, path, modules, deferred)
            for name, path in modules.items()}


def module_name_under(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def test_the_reader_resolves_relative_imports_and_skips_deferred_ones(tmp_path: Path) -> None:
    graph = graph_of(tmp_path, {
        f"{PACKAGE}/__init__.py": "from .tasks import queue_task\n",
        f"{PACKAGE}/tasks.py": (
            "from typing import TYPE_CHECKING\n"
            "from . import payload\n"
            "if TYPE_CHECKING:\n    from .models import Message\n"
            "def later():\n    from .broker import claim\n"
        ),
        f"{PACKAGE}/payload.py": "import json\n",
        f"{PACKAGE}/models.py": "from .broker.claim import CLAIM\n",
        f"{PACKAGE}/broker/__init__.py": "from .claim import claim\nfrom .. import models\n",
        f"{PACKAGE}/broker/claim.py": "from ..models import Outcome\nfrom . import base\n",
        f"{PACKAGE}/broker/base.py": "from .. import payload\n",
    })
    assert graph[PACKAGE] == {f"{PACKAGE}.tasks"}
    assert graph[f"{PACKAGE}.tasks"] == {f"{PACKAGE}.payload"}
    assert graph[f"{PACKAGE}.broker"] == {f"{PACKAGE}.broker.claim", f"{PACKAGE}.models"}
    assert graph[f"{PACKAGE}.broker.claim"] == {f"{PACKAGE}.models", f"{PACKAGE}.broker.base"}
    assert graph[f"{PACKAGE}.broker.base"] == {f"{PACKAGE}.payload"}
    assert find_cycle(graph) == [f"{PACKAGE}.broker.claim", f"{PACKAGE}.models",
                                 f"{PACKAGE}.broker.claim"]


def test_the_full_graph_sees_a_cycle_hidden_in_a_function(tmp_path: Path) -> None:
    files = {
        f"{PACKAGE}/__init__.py": "",
        f"{PACKAGE}/backend/__init__.py": "",
        f"{PACKAGE}/backend/core.py": "from .results import Result\n",
        f"{PACKAGE}/backend/results.py": "from .lookup import find\n",
        f"{PACKAGE}/backend/lookup.py": (
            "from typing import TYPE_CHECKING\n"
            "if TYPE_CHECKING:\n    from .core import Backend\n"
            "def find():\n    from .core import Backend\n"
        ),
    }
    assert find_cycle(graph_of(tmp_path, files)) is None
    assert find_cycle(graph_of(tmp_path, files, deferred=True)) == [
        f"{PACKAGE}.backend.core", f"{PACKAGE}.backend.results", f"{PACKAGE}.backend.lookup",
        f"{PACKAGE}.backend.core"]


def test_the_reader_sees_a_package_importing_its_own_init(tmp_path: Path) -> None:
    graph = graph_of(tmp_path, {
        f"{PACKAGE}/__init__.py": "",
        f"{PACKAGE}/backend/__init__.py": "from .core import Backend\n",
        f"{PACKAGE}/backend/core.py": "from . import Backend as _B\n",
    })
    assert find_cycle(graph) == [f"{PACKAGE}.backend", f"{PACKAGE}.backend.core",
                                 f"{PACKAGE}.backend"]


# The package itself.


def test_the_package_has_no_import_cycle() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_no_cycle_is_hidden_in_a_function_either() -> None:
    cycle = find_cycle(import_graph(deferred=True))
    assert cycle is None, "import cycle through a deferred import: " + " -> ".join(cycle or [])


def collapsed(graph: dict[str, set[str]], package: str) -> dict[str, set[str]]:
    """The graph with ``package`` and all its modules as one node."""
    def node(name: str) -> str:
        return package if name == package or name.startswith(package + ".") else name

    merged: dict[str, set[str]] = {}
    for name, targets in graph.items():
        merged.setdefault(node(name), set()).update(node(t) for t in targets)
    for name, targets in merged.items():
        targets.discard(name)
    return merged


def test_tasks_broker_models_and_handles_import_one_another_in_no_circle() -> None:
    """The broker counts as one: any of its modules reaching back to it is a circle,
    deferred imports included."""
    graph = collapsed(import_graph(deferred=True), f"{PACKAGE}.broker")
    core = {f"{PACKAGE}.{name}" for name in ("tasks", "broker", "models", "handles")}
    for name in sorted(core):
        back = {m for m in reachable(graph, name) if name in reachable(graph, m)} - {name}
        assert not back, f"{name} reaches itself through {sorted(back)}"
    # The shared message types sit below all four.
    assert not reachable(graph, f"{PACKAGE}.messages") & core


def test_backend_has_no_import_cycle_inside() -> None:
    graph = import_graph(deferred=True)
    inside = {m for m in graph if m.startswith(f"{PACKAGE}.backend")}
    cycle = find_cycle(graph, inside)
    assert cycle is None, "import cycle in backend/: " + " -> ".join(cycle or [])


def test_no_module_is_over_500_lines() -> None:
    long = {name: n for name, path in all_modules().items()
            if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines: {long}"
