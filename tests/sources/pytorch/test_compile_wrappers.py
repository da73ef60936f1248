"""`compile_wrappers`: the `torch.compile(module)` wrappers of given modules, from the modules' side.

The heap is scanned only when a wrapper may have been made since the last scan: checked
here by counting scans while wrappers are made, dropped, swapped (one dies as another is
made: the reference count of the class is the same, the known wrappers alive are not), and
while windows open and close on a compiled model.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hp_otel import CommDebugMode
from hp_otel.sources.pytorch import compile_wrappers


@pytest.fixture
def scans(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    import torch._dynamo  # noqa: F401  (the wrapper class exists once dynamo is imported)

    counted: list[int] = []
    scan = compile_wrappers._scan

    def counting(classes: list[type]) -> list:
        counted.append(1)
        return scan(classes)

    monkeypatch.setattr(compile_wrappers, "_scan", counting)
    compile_wrappers.generation()  # whatever earlier tests left: scanned once here
    counted.clear()
    return counted


def _names(found: dict[int, list[nn.Module]], modules: dict[str, nn.Module]) -> dict[str, int]:
    return {name: len(found[id(m)]) for name, m in modules.items() if id(m) in found}


def test_wrappers_are_found_and_the_heap_scanned_only_after_one_is_made(scans: list[int]) -> None:
    a, b = nn.Sequential(nn.Linear(2, 2)), nn.Linear(2, 2)
    modules = {"a": a, "b": b}
    assert _names(compile_wrappers.wrappers_of([a, b]), modules) == {}
    assert scans == []
    first = torch.compile(a)
    assert _names(compile_wrappers.wrappers_of([a, b]), modules) == {"a": 1}
    assert compile_wrappers.wrappers_of([a])[id(a)] == [first]
    assert len(scans) == 1
    for _ in range(5):
        compile_wrappers.wrappers_of([a, b])
        compile_wrappers.generation()
    assert len(scans) == 1  # nothing made: no scan
    second = torch.compile(a)
    assert _names(compile_wrappers.wrappers_of([a, b]), modules) == {"a": 2}
    del second
    assert _names(compile_wrappers.wrappers_of([a, b]), modules) == {"a": 1}
    assert len(scans) == 2  # a wrapper gone: no scan
    generation = compile_wrappers.generation()
    first = torch.compile(b)  # the wrapper of `a` dies as one of `b` is made
    assert _names(compile_wrappers.wrappers_of([a, b]), modules) == {"b": 1}
    assert len(scans) == 3
    assert compile_wrappers.generation() != generation
    del first


def test_windows_on_a_compiled_model_do_not_scan(scans: list[int]) -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4))
    call = torch.compile(model, backend="eager")
    call(torch.randn(2, 4)).sum().backward()
    with CommDebugMode(module=model):
        call(torch.randn(2, 4)).sum().backward()
    before = len(scans)
    assert before <= 1
    for _ in range(4):
        with CommDebugMode(module=model):
            call(torch.randn(2, 4)).sum().backward()
    assert len(scans) == before


def test_without_dynamo_nothing_is_scanned(monkeypatch: pytest.MonkeyPatch) -> None:
    from hp_otel.sources.pytorch import _compat

    monkeypatch.setattr(_compat, "loaded_compiled_module_class", lambda: None)
    assert compile_wrappers.wrappers_of([nn.Linear(1, 1)]) == {}
    assert compile_wrappers.generation() == 0
