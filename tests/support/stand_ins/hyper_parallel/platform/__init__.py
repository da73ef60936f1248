from hyper_parallel.platform.platform import GroupInfo, get_platform

__all__ = ["GroupInfo", "get_platform"]
