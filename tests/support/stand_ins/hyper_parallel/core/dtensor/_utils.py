"""Torch helpers of `core.dtensor`; from the newest release on, also the six differentiable collectives."""

from __future__ import annotations

from hyper_parallel._release import PLATFORM_HAS_DIFFERENTIABLE

if not PLATFORM_HAS_DIFFERENTIABLE:
    from hyper_parallel.platform.torch.collectives import (  # noqa: F401 - re-exported: callers and tracers use _utils.<name>
        differentiable_all_gather_concat,
        differentiable_all_reduce,
        differentiable_all_to_all,
        differentiable_all_to_all_single,
        differentiable_all_to_all_single_async,
        differentiable_reduce_scatter,
    )


def tensor_type_cast(input_data, cast_type):
    import torch

    return input_data.to({"float32": torch.float32, "float16": torch.float16}[cast_type])
