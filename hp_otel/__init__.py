"""hp_otel: the collectives inside distributed-tensor training, as OpenTelemetry spans and metrics."""

from hp_otel.always_on.steps import step
from hp_otel.export.telemetry import Telemetry, configure, shutdown
from hp_otel.mode import CommDebugMode
from hp_otel.record.installation import install, uninstall
from hp_otel.record.watchdog import HangWatchdog
from hp_otel.spans.infos import CollectiveInfo, ModuleInfo, OpInfo, TensorInfo
from hp_otel.version import __version__

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
