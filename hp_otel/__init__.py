"""hp_otel: the collectives inside distributed-tensor training, as OpenTelemetry spans and metrics."""

from hp_otel.export import Telemetry, configure, shutdown
from hp_otel.infos import CollectiveInfo, TensorInfo
from hp_otel.installation import install, uninstall
from hp_otel.mode import CommDebugMode
from hp_otel.steps import step
from hp_otel.version import __version__
from hp_otel.watchdog import HangWatchdog

__all__ = [
    "CollectiveInfo",
    "CommDebugMode",
    "HangWatchdog",
    "Telemetry",
    "TensorInfo",
    "__version__",
    "configure",
    "install",
    "shutdown",
    "step",
    "uninstall",
]
