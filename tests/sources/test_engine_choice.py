"""The "auto" engine where no framework is importable: a window opens with nothing to patch, no fault."""

from __future__ import annotations

import pytest

import hp_otel.sources as sources
from hp_otel import CommDebugMode
from hp_otel.sources.graph_mode import GraphModeWatch

pytestmark = pytest.mark.torch_free

_FRAMEWORKS = {"torch", "mindspore", "hyper_parallel"}


def test_auto_without_any_framework_makes_no_engine_source(monkeypatch) -> None:
    real = sources.importable
    monkeypatch.setattr(sources, "importable", lambda name: name not in _FRAMEWORKS and real(name))
    assert sources.resolve_engine("auto") == "mindspore"  # what "auto" names without torch
    assert [type(s) for s in sources.default_sources()] == [GraphModeWatch]
    with CommDebugMode() as mode:
        pass
    assert mode.get_callback_error_counts() == {}
    assert mode.get_total_counts() == 0
