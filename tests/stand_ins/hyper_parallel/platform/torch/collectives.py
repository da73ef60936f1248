"""The six differentiable collectives over real torch.distributed (gloo on CPU).

Where they are reachable depends on the release (see `_release.py`): staticmethods of
`TorchPlatform`, or functions of `hyper_parallel.core.dtensor._utils`.  Each is a small
autograd Function around an eager c10d collective.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

_OP_MAP = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}


class _AllReduce(torch.autograd.Function):
    """Partial -> Replicate; the gradient of a replicated output is each partial's gradient."""

    @staticmethod
    def forward(ctx, data, reduce_op, group):
        out = data.clone()
        dist.all_reduce(out, op=reduce_op, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        return grad, None, None


class _AllGather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, data, group, concat_dim):
        size = dist.get_world_size(group)
        ctx.group, ctx.concat_dim, ctx.size = group, concat_dim, size
        gathered = data.new_empty((size * data.shape[0], *data.shape[1:]))
        dist.all_gather_into_tensor(gathered, data.contiguous(), group=group)
        return torch.cat(gathered.chunk(size, dim=0), dim=concat_dim)

    @staticmethod
    def backward(ctx, grad):
        return grad.chunk(ctx.size, dim=ctx.concat_dim)[dist.get_rank(ctx.group)], None, None


class _AllToAllSingle(torch.autograd.Function):
    @staticmethod
    def forward(ctx, data, output_splits, input_splits, group):
        ctx.splits, ctx.group = (input_splits, output_splits), group
        rows = sum(output_splits) if output_splits is not None else data.shape[0]
        out = data.new_empty((rows, *data.shape[1:]))
        dist.all_to_all_single(out, data.contiguous(), output_splits, input_splits, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        input_splits, output_splits = ctx.splits
        return _AllToAllSingle.apply(grad, input_splits, output_splits, ctx.group), None, None, None


def differentiable_all_gather_concat(data, group, concat_size, concat_dim):
    if concat_size != dist.get_world_size(group):
        raise ValueError(f"concat_size {concat_size} != group size {dist.get_world_size(group)}")
    return _AllGather.apply(data, group, concat_dim)


def differentiable_all_to_all(input_data, output_shape, group):
    return _AllToAllSingle.apply(input_data, None, None, group).reshape(output_shape)


def differentiable_all_reduce(data, op, group):
    reduce_op = _OP_MAP.get(op, dist.ReduceOp.SUM) if isinstance(op, str) else op
    return _AllReduce.apply(data, reduce_op, group)


def differentiable_reduce_scatter(data, dev_num, axis, op, group):
    reduce_op = _OP_MAP.get(op, dist.ReduceOp.SUM) if isinstance(op, str) else op
    return _AllReduce.apply(data, reduce_op, group).chunk(dev_num, dim=axis)[dist.get_rank(group)]


def differentiable_all_to_all_single(input_tensor, input_splits, output_splits, group):
    return _AllToAllSingle.apply(input_tensor, list(output_splits), list(input_splits), group)


def differentiable_all_to_all_single_async(input_tensor, input_splits, output_splits, group):
    output = input_tensor.new_empty((sum(output_splits), *input_tensor.shape[1:]))
    work = dist.all_to_all_single(
        output, input_tensor.contiguous(), list(output_splits), list(input_splits), group=group, async_op=True
    )
    return output, work
