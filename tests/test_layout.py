"""The package's layout: hp_otel's modules import each other without cycles, each layer only
the layers below it (docs/how-it-works/architecture.md's picture), frameworks only where they belong.

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

import pytest

import hp_otel

pytestmark = pytest.mark.torch_free  # needs no torch: not rerun on torch 2.14.1 (tests/support/markers.py)

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


# --- layers ---------------------------------------------------------------------------

# What each layer may import of hp_otel (besides itself): the arrows of docs/how-it-works/architecture.md's
# picture.  A layer is the first name under `hp_otel` (`hp_otel.record.recorder` is in
# `record`; `hp_otel.mode` is its own layer; `hp_otel` is the package's face).
BASE = {"common", "version"}
ALLOWED: dict[str, set[str]] = {
    "version": set(),
    "common": {"version"},
    "spans": BASE,
    "record": BASE | {"spans"},
    "render": BASE | {"spans"},
    "analysis": BASE | {"spans"},
    "export": BASE | {"spans"},
    "sources": BASE | {"spans", "record"},
    "mode": BASE | {"spans", "record", "sources", "render", "export"},
    "always_on": BASE | {"spans", "record", "sources", "export", "mode"},
    "integrations": BASE | {"record", "always_on"},  # callbacks for training frameworks: no layer imports them
    "testing": BASE | {"spans", "record", "analysis", "mode", "hp_otel"},
    "torch": BASE | {"spans", "record", "sources", "render", "mode"},
    "workloads": BASE | {"sources"},
    "cli": {"*"},
    "hp_otel": {"spans", "record", "export", "always_on", "mode", "version"},
}
# Frameworks stay in sources/ (and the drop-in, the workloads' models, the CLI, the always-on
# model finder); OpenTelemetry stays out of sources/: sources know frameworks, not telemetry.
FRAMEWORKS = ("torch", "mindspore", "hyper_parallel")
NO_FRAMEWORK = ("spans", "record", "render", "analysis", "export", "common", "mode", "testing")


def layer_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    found = []
    for module, targets in sorted(graph.items()):
        allowed = ALLOWED.get(layer_of(module))
        if allowed is None:
            found.append(f"{module}: in no layer of ALLOWED (add its folder there)")
            continue
        for target in sorted(targets):
            if layer_of(target) != layer_of(module) and "*" not in allowed and layer_of(target) not in allowed:
                found.append(f"{module} -> {target}")
    return found


def external_imports(package_dir: Path = PACKAGE_DIR, package: str = PACKAGE) -> dict[str, set[str]]:
    """`{module: the top-level names of other packages it imports}` (any import statement)."""
    imports: dict[str, set[str]] = {}
    for module, path in module_files(package_dir, package).items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        names = {name.split(".")[0] for name, _ in _imported_names(tree, module, path.name == "__init__.py")}
        imports[module] = names - {package, ""}
    return imports


def test_each_layer_imports_only_the_layers_below_it() -> None:
    violations = layer_violations(import_graph())
    assert violations == [], (
        "imports across layers that docs/how-it-works/architecture.md does not draw:\n" + "\n".join(violations)
    )


def test_frameworks_only_in_sources_and_telemetry_never_in_sources() -> None:
    wrong = []
    for module, names in sorted(external_imports().items()):
        if layer_of(module) in NO_FRAMEWORK and names & set(FRAMEWORKS):
            wrong.append(f"{module} imports {sorted(names & set(FRAMEWORKS))}")
        if layer_of(module) == "sources" and "opentelemetry" in names:
            wrong.append(f"{module} imports opentelemetry")
    assert wrong == [], "\n".join(wrong)


def test_the_package_imports_nothing_the_wheel_leaves_out() -> None:
    """`benchmarks/` and `tests/` stay in the repository (tests/test_packaging.py): no hp_otel module imports them."""
    wrong = [
        f"{module} imports {sorted(names & {'benchmarks', 'tests'})}"
        for module, names in sorted(external_imports().items())
        if names & {"benchmarks", "tests"}
    ]
    assert wrong == [], "\n".join(wrong)


# Training frameworks a callback is written for: each imported by its own module of integrations/ only,
# so `import hp_otel` (and every other module) works without them.
TRAINING_FRAMEWORKS = {
    "lightning": "hp_otel.integrations.lightning",
    "pytorch_lightning": "hp_otel.integrations.lightning",
    "transformers": "hp_otel.integrations.transformers",
}


def test_training_frameworks_only_in_their_integration_module() -> None:
    wrong = [
        f"{module} imports {name}"
        for module, names in sorted(external_imports().items())
        for name in sorted(names & set(TRAINING_FRAMEWORKS))
        if module != TRAINING_FRAMEWORKS[name]
    ]
    assert wrong == [], "\n".join(wrong)


def test_the_layer_rules_catch_a_wrong_arrow(tmp_path: Path) -> None:
    """A recorder module importing a source, and a source importing OpenTelemetry, are both reported."""
    package = tmp_path / "hp_otel"
    for folder in ("record", "sources"):
        (package / folder).mkdir(parents=True)
        (package / folder / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "record" / "recorder.py").write_text("from hp_otel.sources import dtensor\n")
    (package / "sources" / "dtensor.py").write_text("def f():\n    import opentelemetry.trace\n")
    assert layer_violations(import_graph(package, "hp_otel")) == ["hp_otel.record.recorder -> hp_otel.sources.dtensor"]
    assert external_imports(package, "hp_otel")["hp_otel.sources.dtensor"] == {"opentelemetry"}


# --- input files ------------------------------------------------------------------------

_PARSERS = {("json", "load"), ("pickle", "load"), ("pickle", "loads"), ("pickle", "Unpickler")}


def test_every_input_file_is_read_by_the_one_bounded_reader() -> None:
    """`json.load`, `pickle.load(s)` and `pickle.Unpickler` (a file parsed without the size limit,
    the regular-file check or the unpickler's budget) appear in `common/input_files.py` only."""
    found = []
    for module, path in module_files().items():
        if module == "hp_otel.common.input_files":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                if (node.value.id, node.attr) in _PARSERS:
                    found.append(f"{module}:{node.lineno} {node.value.id}.{node.attr}")
    assert not found, "files parsed outside hp_otel/common/input_files.py:\n" + "\n".join(found)


# --- the CLI's room -------------------------------------------------------------------------


def test_models_live_in_workloads_not_in_the_cli() -> None:
    """The CLI runs models, it does not define them: a class deriving from a torch `Module` under
    `hp_otel/cli/` belongs in `hp_otel/workloads/`, where the tests and the examples import it too."""
    found = []
    for module, path in module_files().items():
        if layer_of(module) != "cli":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                bases = {ast.unparse(base) for base in node.bases}
                if bases & {"Module", "nn.Module", "torch.nn.Module"}:
                    found.append(f"{module}.{node.name}")
    assert found == [], "models defined in the CLI (move them to hp_otel/workloads/):\n" + "\n".join(found)
