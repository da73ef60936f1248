"""`CommDebugMode` and its pieces, each with one job.

- `facade`: `CommDebugMode`, the user-facing context manager and its queries;
- `options`: the window's options, parsed, checked and defaulted once (`WindowOptions`);
- `registry`: which windows are open on which thread and model (process-wide);
- `window`: opening and closing a window (claim, attach, watchdog; and undoing them);
- `files`: what a window writes (table, JSON dump, spans, collectives file);
- `former_sources`: the adapter for sources written with the former method names.

The names below are loaded when first used (PEP 562): the instrumentor parses its options
with `hp_otel.mode.options` without loading the recording machinery.
"""

from __future__ import annotations

import importlib
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hp_otel.mode.facade import STACK_SKIPPED_PACKAGES, CommDebugMode
    from hp_otel.mode.options import DEFAULT_MAX_SPANS, NOT_GIVEN, WindowOptions, check_module, check_providers

_WHERE = MappingProxyType(
    {
        "CommDebugMode": "hp_otel.mode.facade",
        "STACK_SKIPPED_PACKAGES": "hp_otel.mode.facade",
        "DEFAULT_MAX_SPANS": "hp_otel.mode.options",
        "NOT_GIVEN": "hp_otel.mode.options",
        "WindowOptions": "hp_otel.mode.options",
        "check_module": "hp_otel.mode.options",
        "check_providers": "hp_otel.mode.options",
    }
)

__all__ = [
    "DEFAULT_MAX_SPANS",
    "NOT_GIVEN",
    "STACK_SKIPPED_PACKAGES",
    "CommDebugMode",
    "WindowOptions",
    "check_module",
    "check_providers",
]


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module 'hp_otel.mode' has no attribute {name!r}")
    value = getattr(importlib.import_module(where), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
