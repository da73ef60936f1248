"""MindSporePlatform: collectives as staticmethods over `mindspore.mint.distributed`; groups are names.

Kernels missing on CPU (all_gather_into_tensor, reduce_scatter, all_to_all) are built
from all_gather / all_reduce, which run on CPU over mccl.  MindSpore is imported inside
the functions, so this module imports without it.
"""

from __future__ import annotations

from hyper_parallel._release import HAS_ALL_TO_ALL_SINGLE, PLATFORM_HAS_DIFFERENTIABLE


def _distributed():
    from mindspore.mint import distributed

    return distributed


def _gather(data, group):
    from mindspore import communication, ops

    size = communication.get_group_size(group) if group is not None else communication.get_group_size()
    parts = [ops.zeros_like(data) for _ in range(size)]
    _distributed().all_gather(parts, data, group=group)
    return parts


class MindSporePlatform:
    @staticmethod
    def get_op_name(op_call):
        return getattr(op_call, "__name__", str(op_call))

    if PLATFORM_HAS_DIFFERENTIABLE:

        @staticmethod
        def differentiable_all_gather_concat(data, group, concat_size, concat_dim):
            from mindspore import ops

            return ops.cat(_gather(data, group)[:concat_size], axis=concat_dim)

        @staticmethod
        def differentiable_all_to_all(input_data, output_shape, group):
            from mindspore import communication, ops

            rank = communication.get_rank(group) if group is not None else communication.get_rank()
            parts = _gather(input_data, group)
            chunk = input_data.shape[0] // len(parts)
            return ops.cat([p[rank * chunk : (rank + 1) * chunk] for p in parts], axis=0).reshape(output_shape)

        @staticmethod
        def differentiable_all_reduce(data, op, group):
            out = data.copy()
            _distributed().all_reduce(out, op=op, group=group)
            return out

        @staticmethod
        def differentiable_reduce_scatter(data, dev_num, axis, op, group):
            from mindspore import communication, ops

            out = data.copy()
            _distributed().all_reduce(out, op=op, group=group)
            rank = communication.get_rank(group) if group is not None else communication.get_rank()
            return ops.chunk(out, dev_num, axis)[rank]

        if HAS_ALL_TO_ALL_SINGLE:  # MindSpore has no _async variant

            @staticmethod
            def differentiable_all_to_all_single(input_tensor, input_splits, output_splits, group):
                from mindspore import communication, ops

                rank = communication.get_rank(group) if group is not None else communication.get_rank()
                parts = _gather(input_tensor, group)
                pieces = []
                for part in parts:
                    offset = sum(input_splits[:rank])
                    pieces.append(part[offset : offset + input_splits[rank]])
                return ops.cat(pieces, axis=0)

    @staticmethod
    def all_reduce(data, group_info, async_op=False):
        handle = _distributed().all_reduce(data, group=group_info.group, async_op=async_op)
        return (data, handle) if async_op else data

    @staticmethod
    def all_gather_into_tensor(data, group_info, async_op=False):
        from mindspore import ops

        return ops.cat(_gather(data, group_info.group), axis=0), None

    @staticmethod
    def reduce_scatter_tensor(data, group_info, async_op=False):
        from mindspore import communication, ops

        out = data.copy()
        _distributed().all_reduce(out, group=group_info.group)
        rank = communication.get_rank(group_info.group)
        return ops.chunk(out, group_info.rank_size, 0)[rank], None

    @staticmethod
    def broadcast(data, src, group=None, async_op=False):
        handle = _distributed().broadcast(data, src, group=group, async_op=async_op)
        return (data, handle) if async_op else data
