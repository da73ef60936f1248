"""hp_otel: the collectives inside distributed-tensor training, as OpenTelemetry spans and metrics."""

from hp_otel.mode import CommDebugMode
from hp_otel.records import CollectiveInfo, TensorInfo
from hp_otel.version import __version__

__all__ = ["CollectiveInfo", "CommDebugMode", "TensorInfo", "__version__"]
