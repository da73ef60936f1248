"""Callbacks for the loops where users train: Lightning (`hp_otel.integrations.lightning`) and the
Hugging Face `Trainer` (`hp_otel.integrations.transformers`).

Each traces a window of steps (`window`: every step, every N-th, or a range), marks each traced
step with `hp_otel.step()` and takes the always-on instrumentor's settings (`tracer`). Importing
`hp_otel` (or this package) never imports a framework: the names below are loaded when first used,
and only a callback's own module imports its framework.
"""

from __future__ import annotations

import importlib
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hp_otel.integrations.lightning import HpOtelCallback
    from hp_otel.integrations.tracer import StepTracer
    from hp_otel.integrations.transformers import HpOtelTrainerCallback
    from hp_otel.integrations.window import StepWindow

_WHERE = MappingProxyType(
    {
        "HpOtelCallback": "hp_otel.integrations.lightning",
        "HpOtelTrainerCallback": "hp_otel.integrations.transformers",
        "StepTracer": "hp_otel.integrations.tracer",
        "StepWindow": "hp_otel.integrations.window",
    }
)

__all__ = ["HpOtelCallback", "HpOtelTrainerCallback", "StepTracer", "StepWindow"]


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module 'hp_otel.integrations' has no attribute {name!r}")
    value = getattr(importlib.import_module(where), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
