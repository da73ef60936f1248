"""The six differentiable collectives over real torch.distributed (gloo on CPU).

Where they are reachable depends on the release (see `_release.py`): staticmethods of
`TorchPlatform`, or functions of `hyper_parallel.core.dtensor._utils`.  Each is what the
real release runs: a `torch.distributed.nn.functional` autograd function.
"""

from __future__ import annotations

import warnings

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_func

# torch marks torch.distributed.nn.functional deprecated; hyper-parallel still uses it
warnings.filterwarnings("ignore", message=r"torch\.distributed\.nn\.functional", category=FutureWarning)

_OP_MAP = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}


# As in the real release (checked against mindspore-ai/hyper-parallel fdd0a80): the differentiable collectives
# are torch.distributed.nn.functional's autograd functions, so backward communicates too — all_reduce's
# backward all-reduces the gradient, all_gather's (on gloo) scatters once per rank, all_to_all's is an
# all_to_all_single — through torch.distributed's own functions.
def differentiable_all_gather_concat(data, group, concat_size, concat_dim):
    if concat_size != dist.get_world_size(group):
        raise ValueError(f"concat_size {concat_size} != group size {dist.get_world_size(group)}")
    return torch.cat(dist_func.all_gather(data, group=group), dim=concat_dim)


def differentiable_all_to_all(input_data, output_shape, group):
    output = torch.empty(output_shape, device=input_data.device, dtype=input_data.dtype)
    return dist_func.all_to_all_single(output, input_data.contiguous(), group=group)


def differentiable_all_reduce(data, op, group):
    reduce_op = _OP_MAP.get(op, dist.ReduceOp.SUM) if isinstance(op, str) else op
    return dist_func.all_reduce(data, op=reduce_op, group=group)


def differentiable_reduce_scatter(data, dev_num, axis, op, group):
    reduce_op = _OP_MAP.get(op, dist.ReduceOp.SUM) if isinstance(op, str) else op
    chunks = torch.chunk(data, dev_num, dim=axis)
    output = torch.empty(chunks[0].shape, device=data.device, dtype=data.dtype)
    return dist_func.reduce_scatter(output, chunks, op=reduce_op, group=group)


def differentiable_all_to_all_single(input_tensor, input_splits, output_splits, group):
    output = input_tensor.new_empty((sum(output_splits), *input_tensor.shape[1:]))
    return dist_func.all_to_all_single(output, input_tensor.contiguous(), list(output_splits), list(input_splits),
                                       group=group)  # fmt: skip


def differentiable_all_to_all_single_async(input_tensor, input_splits, output_splits, group):
    output = input_tensor.new_empty((sum(output_splits), *input_tensor.shape[1:]))
    work = dist.all_to_all_single(
        output, input_tensor.contiguous(), list(output_splits), list(input_splits), group=group, async_op=True
    )
    return output, work
