"""The suite's markers, decided here once: a pytest plugin, its hooks imported by tests/conftest.py.

`slow` is never written on a test: it is the union of the kinds pyproject.toml registers as
"(implies slow)", so `-m "not slow"` (the inner loop) and CI's torch 2.14.1 pass
(`-m "not torch_free and not server and not browser and not bench"`, .ci/run) select from one
split. `torch_free` marks a whole module whose tests need no torch; with
HP_OTEL_TESTS_WITHOUT_TORCH=1 only those modules run, with torch made unimportable in the
process and its children, so a module wrongly marked fails instead of silently missing the
torch 2.14.1 pass.
"""

from __future__ import annotations

import ast
import functools
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

IMPLIES_SLOW = "(implies slow)"  # how pyproject.toml says a marker is one of slow's kinds
TORCH_FREE = "torch_free"
WITHOUT_TORCH_VARIABLE = "HP_OTEL_TESTS_WITHOUT_TORCH"
WITHOUT_TORCH_DIR = Path(__file__).resolve().parent / "without_torch"


def slow_kinds(config: pytest.Config) -> tuple[str, ...]:
    """The markers pyproject.toml registers as kinds of slow: the split is written once, there."""
    lines = config.getini("markers")
    return tuple(line.split(":", 1)[0].strip() for line in lines if line.rstrip().endswith(IMPLIES_SLOW))


def without_torch() -> bool:
    return os.environ.get(WITHOUT_TORCH_VARIABLE) == "1"


def block_torch() -> None:
    """Torch unimportable here and in every child process that inherits PYTHONPATH."""
    import importlib.util
    import sys

    if "torch" in sys.modules:
        raise pytest.UsageError(
            f"{WITHOUT_TORCH_VARIABLE}=1: torch was imported before tests/conftest.py could block it"
        )
    spec = importlib.util.spec_from_file_location("_hp_otel_torch_blocker", WITHOUT_TORCH_DIR / "sitecustomize.py")
    assert spec is not None and spec.loader is not None
    spec.loader.exec_module(importlib.util.module_from_spec(spec))
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(WITHOUT_TORCH_DIR), os.environ.get("PYTHONPATH")) if p)


@functools.cache
def torch_free_module(path: Path) -> bool:
    """Whether the module's own `pytestmark` names torch_free, read from its source: the
    without-torch run must know before importing it (importing a torch module there fails)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in targets) and node.value is not None:
                if any(isinstance(n, ast.Attribute) and n.attr == TORCH_FREE for n in ast.walk(node.value)):
                    return True
    return False


def apply(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Adds `slow` to every test of a slow kind; refuses a bare `slow` (it would fall outside
    the split) and a `torch_free` that is not the module's (the without-torch run would miss it)."""
    kinds = slow_kinds(config)
    bare_slow, partial_torch_free = [], []
    for item in items:
        if any(item.get_closest_marker(kind) for kind in kinds):
            item.add_marker(pytest.mark.slow)
        elif item.get_closest_marker("slow"):
            bare_slow.append(item.nodeid)
        if item.get_closest_marker(TORCH_FREE) and not torch_free_module(Path(item.path)):
            partial_torch_free.append(item.nodeid)
    if bare_slow:
        raise pytest.UsageError(
            "marked slow without saying why; use one of " + ", ".join(kinds) + ":\n  " + "\n  ".join(bare_slow)
        )
    if partial_torch_free:
        raise pytest.UsageError(
            f"{TORCH_FREE} marks whole modules (pytestmark = pytest.mark.{TORCH_FREE}):\n  "
            + "\n  ".join(partial_torch_free)
        )


def skipped_for_torch(report: pytest.TestReport) -> bool:
    """A skip that says torch: in the without-torch run it means the module is not torch free."""
    if not report.skipped:
        return False
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    return "torch" in reason.lower()


# The hooks (tests/conftest.py imports them by name).


def pytest_configure(config: pytest.Config) -> None:
    if without_torch():
        block_torch()


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """With HP_OTEL_TESTS_WITHOUT_TORCH=1 only the torch_free modules are collected (under tests/,
    where this conftest reaches: the run is given `tests`; examples/ are torch programs, and
    collecting them there fails loudly)."""
    if without_torch() and collection_path.suffix == ".py" and collection_path.name.startswith("test_"):
        return not torch_free_module(collection_path)
    return None


@pytest.hookimpl(tryfirst=True)  # before -m deselects: `slow` must be there when it does
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    apply(config, items)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if without_torch() and skipped_for_torch(report):
        report.outcome = "failed"  # a torch_free module that skips without torch is not torch free
