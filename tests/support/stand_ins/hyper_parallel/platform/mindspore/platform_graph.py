"""MindSporeGraphPlatform: graph-mode variant; overrides the all_reduce with the `ops.AllReduce` primitive."""

from __future__ import annotations

from hyper_parallel._release import PLATFORM_HAS_DIFFERENTIABLE
from hyper_parallel.platform.mindspore.platform import MindSporePlatform


class MindSporeGraphPlatform(MindSporePlatform):
    if PLATFORM_HAS_DIFFERENTIABLE:

        @staticmethod
        def differentiable_all_reduce(data, op, group):
            from mindspore import ops

            reduce_op = {"sum": ops.ReduceOp.SUM, "max": ops.ReduceOp.MAX, "min": ops.ReduceOp.MIN}[op]
            return ops.AllReduce(reduce_op, group)(data)
