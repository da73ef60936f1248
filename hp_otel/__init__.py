"""hp_otel: the collectives inside distributed-tensor training, as OpenTelemetry spans and metrics.

The names below are loaded when first used (PEP 562): `opentelemetry-instrument` loads the
always-on instrumentor into every process of the environment, and that must not pay for the
recording machinery (or torch) in processes that never train (docs/guide/always-on.md); and
every pytest run in a venv with hp_otel's pytest plugin imports `hp_otel` too.
"""

from __future__ import annotations

import importlib
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from hp_otel.version import __version__

if TYPE_CHECKING:
    from hp_otel.always_on.steps import step
    from hp_otel.export.telemetry import Telemetry, configure, shutdown
    from hp_otel.mode import CommDebugMode
    from hp_otel.record.installation import install, uninstall
    from hp_otel.record.watchdog import HangWatchdog
    from hp_otel.spans.infos import CollectiveInfo, ModuleInfo, OpInfo, TensorInfo

_WHERE = MappingProxyType(
    {
        "step": "hp_otel.always_on.steps",
        "Telemetry": "hp_otel.export.telemetry",
        "configure": "hp_otel.export.telemetry",
        "shutdown": "hp_otel.export.telemetry",
        "CommDebugMode": "hp_otel.mode",
        "install": "hp_otel.record.installation",
        "uninstall": "hp_otel.record.installation",
        "HangWatchdog": "hp_otel.record.watchdog",
        "CollectiveInfo": "hp_otel.spans.infos",
        "ModuleInfo": "hp_otel.spans.infos",
        "OpInfo": "hp_otel.spans.infos",
        "TensorInfo": "hp_otel.spans.infos",
    }
)

__all__ = [
    "CollectiveInfo",
    "CommDebugMode",
    "HangWatchdog",
    "ModuleInfo",
    "OpInfo",
    "Telemetry",
    "TensorInfo",
    "__version__",
    "configure",
    "install",
    "shutdown",
    "step",
    "uninstall",
]


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module 'hp_otel' has no attribute {name!r}")
    value = getattr(importlib.import_module(where), name)
    globals()[name] = value  # the next lookup is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
