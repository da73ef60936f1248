"""Stand-in for hyper-parallel, for hp_otel's tests only (see README.md next to this file)."""

from hyper_parallel._release import RELEASE
from hyper_parallel.core.dtensor import DeviceMesh, DTensor, init_device_mesh
from hyper_parallel.core.tensor_parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from hyper_parallel.platform import get_platform

__all__ = [
    "RELEASE",
    "ColwiseParallel",
    "DTensor",
    "DeviceMesh",
    "RowwiseParallel",
    "get_platform",
    "init_device_mesh",
    "parallelize_module",
]
