"""TorchPlatform: collectives as staticmethods, groups are `torch.distributed.ProcessGroup`s."""

from __future__ import annotations

import torch
import torch.distributed as dist

from hyper_parallel._release import HAS_ALL_TO_ALL_SINGLE, PLATFORM_HAS_DIFFERENTIABLE
from hyper_parallel.platform.torch import collectives


class TorchPlatform:
    @staticmethod
    def get_op_name(op_call):
        return getattr(op_call, "__name__", str(op_call))

    @staticmethod
    def get_rank(group=None):
        return dist.get_rank(group)

    if PLATFORM_HAS_DIFFERENTIABLE:
        differentiable_all_gather_concat = staticmethod(collectives.differentiable_all_gather_concat)
        differentiable_all_to_all = staticmethod(collectives.differentiable_all_to_all)
        differentiable_all_reduce = staticmethod(collectives.differentiable_all_reduce)
        differentiable_reduce_scatter = staticmethod(collectives.differentiable_reduce_scatter)
        if HAS_ALL_TO_ALL_SINGLE:
            differentiable_all_to_all_single = staticmethod(collectives.differentiable_all_to_all_single)
            differentiable_all_to_all_single_async = staticmethod(collectives.differentiable_all_to_all_single_async)

    @staticmethod
    def all_reduce(data, group_info, async_op=False):
        handle = dist.all_reduce(data, group=group_info.group, async_op=async_op)
        return data, handle  # as the real release: always a pair

    @staticmethod
    def all_gather_into_tensor(data, group_info, async_op=False):
        output = data.new_empty((data.shape[0] * group_info.rank_size, *data.shape[1:]))
        handle = dist.all_gather_into_tensor(output, data.contiguous(), group=group_info.group, async_op=async_op)
        return output, handle

    @staticmethod
    def reduce_scatter_tensor(data, group_info, async_op=False):
        output = data.new_empty((data.shape[0] // group_info.rank_size, *data.shape[1:]))
        handle = dist.reduce_scatter_tensor(output, data.contiguous(), group=group_info.group, async_op=async_op)
        return output, handle

    @staticmethod
    def broadcast(data, src, group=None, async_op=False):
        handle = dist.broadcast(data, src, group=group, async_op=async_op)
        if async_op:  # as the real release: waits itself, returns nothing
            handle.wait()

    @staticmethod
    def empty_like(tensor):
        return torch.empty_like(tensor)
