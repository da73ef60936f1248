"""`get_platform()`: the platform chosen once per process, cached in the module global `platform`.

`HYPER_PARALLEL_PLATFORM` = `torch` | `mindspore`; unset: MindSpore if importable, else torch.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from typing import Any

platform: Any = None


@dataclass(frozen=True)
class GroupInfo:
    """What the non-differentiable platform collectives take: the group, its size and its name."""

    group: Any
    rank_size: int
    group_name: str


def get_platform() -> Any:
    global platform
    if platform is None:
        choice = os.environ.get("HYPER_PARALLEL_PLATFORM")
        if choice is None:
            choice = "mindspore" if importlib.util.find_spec("mindspore") is not None else "torch"
        if choice == "mindspore":
            from hyper_parallel.platform.mindspore.platform import MindSporePlatform

            platform = MindSporePlatform()
        elif choice == "torch":
            from hyper_parallel.platform.torch.platform import TorchPlatform

            platform = TorchPlatform()
        else:
            raise ValueError(f"HYPER_PARALLEL_PLATFORM must be 'torch' or 'mindspore', got {choice!r}")
    return platform
