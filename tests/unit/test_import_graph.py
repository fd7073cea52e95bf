"""probe_agent's modules import each other without a circle (STYLE.md B: the agent is layered;
agent.py wires the parts and nothing imports it).

The graph is read from the source with ``ast``, not from ``sys.modules`` after an import: an
import inside a function counts as much as one at the top (a function-local import that closes
a circle is still a circle, only a hidden one), and relative imports are resolved against the
importing module's package. ``from pkg import name`` is an edge to ``pkg.name`` when that is a
module, else to ``pkg`` itself. A package's ``__init__`` is not implied by importing one of its
submodules: the edge is to what the code names.

A control builds a small package with a circle closed by a function-local relative import, so
the check is shown to be able to fail, and to name the circle.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def module_names(package_dir: Path) -> dict[str, Path]:
    """Dotted name -> file, for every .py under ``package_dir`` (a package's own name is its
    ``__init__``)."""
    base = package_dir.parent
    names = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = list(path.relative_to(base).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def _resolve(importer: str, is_package: bool, level: int, module: str | None) -> str:
    if level == 0:
        return module or ""
    parts = importer.split(".")
    if not is_package:
        parts.pop()  # the importing module's own package
    if level > 1:
        parts = parts[: len(parts) - (level - 1)]
    return ".".join(parts + ([module] if module else []))


def _is_type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and (
        (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING")
        or (isinstance(node.test, ast.Attribute) and node.test.attr == "TYPE_CHECKING"))


def _imports(tree: ast.AST, type_only: bool) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement, at any depth; those under ``if TYPE_CHECKING:`` only when
    ``type_only``."""
    found = []
    todo = [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        elif _is_type_checking(node) and not type_only:
            todo.extend(node.orelse)
            continue
        todo.extend(ast.iter_child_nodes(node))
    return found


def import_graph(package_dir: Path, type_only: bool = False) -> dict[str, set[str]]:
    """Module -> the modules of the same package it imports, anywhere in its body (and under
    ``if TYPE_CHECKING:`` when ``type_only``)."""
    modules = module_names(package_dir)
    top = package_dir.name
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        for node in _imports(ast.parse(path.read_text(), str(path)), type_only):
            targets = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(name, is_package, node.level, node.module)
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    targets.append(sub if sub in modules else base)
            for target in targets:
                if target.split(".")[0] != top:
                    continue
                # `import a.b.c` of a name that is no module: its longest module prefix
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One shortest circle per strongly connected component of more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def connect(v: str) -> None:  # Tarjan; the graph is small, recursion is fine
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                components.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    found = []
    for comp in components:
        members = set(comp)
        start = comp[0]
        # breadth-first from start back to start, inside the component: a shortest circle
        paths = {start: [start]}
        frontier = [start]
        circle = None
        while frontier and circle is None:
            nxt = []
            for v in frontier:
                for w in sorted(graph[v] & members):
                    if w == start:
                        circle = paths[v] + [start]
                        break
                    if w not in paths:
                        paths[w] = paths[v] + [w]
                        nxt.append(w)
                if circle:
                    break
            frontier = nxt
        found.append(circle or comp)
    return found


def describe(found: list[list[str]], graph: dict[str, set[str]]) -> str:
    in_cycles = {m for c in found for m in c}
    lines = [f"{len(found)} circle(s):"]
    lines += ["  " + " -> ".join(c) for c in found]
    lines.append(f"({len(in_cycles)} modules on a shown circle, of {len(graph)})")
    return "\n".join(lines)


def test_probe_agent_has_no_import_circle():
    # GIVEN the import graph of probe_agent/ read from its source
    graph = import_graph(ROOT / "probe_agent")
    assert len(graph) > 60, sorted(graph)  # the walk saw the subpackages
    assert "probe_agent.store.store" in graph["probe_agent.agent"], graph["probe_agent.agent"]
    # THEN no module reaches itself
    found = circles(graph)
    assert not found, describe(found, graph)


#: process.py keeps the process's one agent; the entry points (``probe_agent.start``, the
#: PROBE=1 start-up hook, `probe inject`'s attach) reach agent.py only through it, and
#: ``probe_agent/__init__`` names the Agent class for type checking. Every part sits below.
ENTRY_POINTS = {"probe_agent", "probe_agent.process"}


def test_nothing_but_the_process_module_imports_agent_py():
    # GIVEN the graph with the imports made for type checking only: a part typed against the
    # Agent still reaches up to it
    graph = import_graph(ROOT / "probe_agent", type_only=True)
    # THEN only process.py (and a type-only name in __init__) imports agent.py; the parts are
    # handed what they use
    importers = sorted(m for m, deps in graph.items() if "probe_agent.agent" in deps)
    assert set(importers) <= ENTRY_POINTS, sorted(set(importers) - ENTRY_POINTS)


def test_the_check_finds_a_circle_closed_inside_a_function(tmp_path):
    # GIVEN a package where a.py imports b at the top and b.py imports a inside a function,
    # through a relative import from a subpackage
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from .sub import b\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from ..a import thing\n    return thing\n")
    (pkg / "c.py").write_text("import pkg.sub.b\n")
    # WHEN the graph is built
    graph = import_graph(pkg)
    # THEN the circle is found and named, and the import-only module is not on it
    assert graph["pkg.a"] == {"pkg.sub.b"} and graph["pkg.sub.b"] == {"pkg.a"}, graph
    assert graph["pkg.c"] == {"pkg.sub.b"}, graph
    assert circles(graph) == [["pkg.a", "pkg.sub.b", "pkg.a"]]
    assert "pkg.a -> pkg.sub.b -> pkg.a" in describe(circles(graph), graph)
