"""The package's layout: hp_otel's modules import each other without cycles.

`import_graph` reads the source with `ast` (nothing is imported), so a rule about which
module may import which can be checked here without torch or MindSpore installed.
Every `import` statement counts as an arrow, wherever it stands: at module level, inside
a function (a deferred import still ties the two modules together) or under
`TYPE_CHECKING`.  Imports by name at run time (`importlib.import_module("hp_otel…")`,
the engine registry) are not seen.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import hp_otel

PACKAGE = "hp_otel"
PACKAGE_DIR = Path(hp_otel.__file__).parent


def module_files(package_dir: Path = PACKAGE_DIR, package: str = PACKAGE) -> dict[str, Path]:
    """`{dotted module name: file}` of every module in the package (a package is its `__init__`)."""
    modules: dict[str, Path] = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = path.relative_to(package_dir).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join((package, *parts))] = path
    return modules


def _imported_names(tree: ast.AST, module: str, is_package: bool) -> Iterator[tuple[str, tuple[str, ...]]]:
    """(module named, names taken from it) for every import statement in `tree`, relative ones resolved."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, ()
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                if not is_package:
                    base = base[:-1]
                base = base[: len(base) - (node.level - 1)]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            yield name, tuple(alias.name for alias in node.names)


def import_graph(package_dir: Path = PACKAGE_DIR, package: str = PACKAGE) -> dict[str, set[str]]:
    """`{module: the package's modules it imports}`.

    `from a.b import c` is an arrow to `a.b.c` when that is a module, else to `a.b`;
    `import a.b.c` is an arrow to `a.b.c` only (the parent packages it also runs are not
    arrows: every module would then sit in a cycle with the package's `__init__`).
    """
    files = module_files(package_dir, package)
    graph: dict[str, set[str]] = {name: set() for name in files}
    for module, path in files.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        is_package = path.name == "__init__.py"
        for name, taken in _imported_names(tree, module, is_package):
            if name != package and not name.startswith(package + "."):
                continue
            submodules = [f"{name}.{t}" for t in taken if f"{name}.{t}" in files]
            targets = submodules if submodules and len(submodules) == len(taken) else [name, *submodules]
            graph[module].update(t for t in targets if t in files and t != module)
    return graph


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """The graph's strongly connected components of more than one module (Tarjan, iterative), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, successors = work[-1]
            for successor in successors:
                if successor not in index:
                    index[successor] = low[successor] = counter
                    counter += 1
                    stack.append(successor)
                    on_stack.add(successor)
                    work.append((successor, iter(sorted(graph.get(successor, ())))))
                    break
                if successor in on_stack:
                    low[node] = min(low[node], index[successor])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        components.append(sorted(component))
    return sorted(components)


def a_cycle(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    """One import cycle through the component's first module, as a path that ends where it starts."""
    members = set(component)
    start = component[0]
    paths = {start: [start]}
    frontier = [start]
    while frontier:  # breadth first: the shortest way back to `start`
        next_frontier = []
        for node in frontier:
            for successor in sorted(graph[node] & members):
                if successor == start:
                    return [*paths[node], start]
                if successor not in paths:
                    paths[successor] = [*paths[node], successor]
                    next_frontier.append(successor)
        frontier = next_frontier
    return component  # pragma: no cover - a strongly connected component always has one


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component: what to report when there are any."""
    return [a_cycle(graph, component) for component in strongly_connected(graph)]


# --- the checks ---------------------------------------------------------------------


def test_hp_otel_has_no_import_cycle() -> None:
    cycles = import_cycles(import_graph())
    assert cycles == [], "import cycles:\n" + "\n".join(" -> ".join(cycle) for cycle in cycles)


def test_the_graph_sees_every_kind_of_import(tmp_path: Path) -> None:
    """The builder itself: top-level, function-level, relative and `from package import module` imports
    are arrows; imports from outside the package are not; a cycle is found and reported as a path."""
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("from pkg.a import thing\n")
    (package / "a.py").write_text("import os\nthing = 1\n\ndef later():\n    from pkg.sub import b\n")
    (package / "sub" / "__init__.py").write_text("")
    (package / "sub" / "b.py").write_text("from ..c import value\nfrom . import d\n")
    (package / "sub" / "d.py").write_text("")
    (package / "c.py").write_text("import pkg.a\nvalue = 2\n")
    graph = import_graph(package, "pkg")
    assert graph == {
        "pkg": {"pkg.a"},
        "pkg.a": {"pkg.sub.b"},
        "pkg.sub": set(),
        "pkg.sub.b": {"pkg.c", "pkg.sub.d"},
        "pkg.sub.d": set(),
        "pkg.c": {"pkg.a"},
    }
    assert import_cycles(graph) == [["pkg.a", "pkg.sub.b", "pkg.c", "pkg.a"]]
    (package / "c.py").write_text("value = 2\n")
    assert import_cycles(import_graph(package, "pkg")) == []
