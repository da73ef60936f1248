"""Tensor parallelism: `ColwiseParallel`, `RowwiseParallel`, `parallelize_module(module, device_mesh, plan)`.

The styles convert parameters to DTensors and put forward hooks on the module: the
rowwise output hook redistributes Partial -> Replicate, so its all_reduce runs in the
module's forward hook, after the `linear` dispatch has exited.
"""

from __future__ import annotations

from hyper_parallel.core.dtensor.dtensor import DTensor
from hyper_parallel.core.dtensor.placement_types import Replicate, Shard


class ParallelStyle:
    weight_placement = Replicate()
    bias_placement = Replicate()

    def _partition(self, module, device_mesh):
        rank = device_mesh.get_local_rank()
        size = device_mesh.size()
        for name, placement in (("weight", self.weight_placement), ("bias", self.bias_placement)):
            param = module._parameters.get(name)
            if param is None:
                continue
            local = param.detach()
            if isinstance(placement, Shard):
                local = local.chunk(size, dim=placement.dim)[rank]
            local = local.clone().requires_grad_(param.requires_grad)
            # DTensor parameters live in _parameters, so named_parameters() lists them
            module._parameters[name] = DTensor(local, device_mesh, (placement,))

    def apply(self, module, device_mesh):
        self._partition(module, device_mesh)
        module.register_forward_pre_hook(lambda mod, args: self._prepare_input(args, device_mesh))
        module.register_forward_hook(lambda mod, args, output: self._prepare_output(output, device_mesh))
        return module


class ColwiseParallel(ParallelStyle):
    """Weight Shard(0), bias Shard(0); input made Replicate; output Shard(-1) stays a DTensor."""

    weight_placement = Shard(0)
    bias_placement = Shard(0)

    def _prepare_input(self, args, device_mesh):
        x = args[0]
        if not isinstance(x, DTensor):
            x = DTensor.from_local(x, device_mesh, (Replicate(),))
        return (x, *args[1:])

    def _prepare_output(self, output, device_mesh):
        return output


class RowwiseParallel(ParallelStyle):
    """Weight Shard(1), bias Replicate; input expected Shard(-1); output Partial -> Replicate."""

    weight_placement = Shard(1)
    bias_placement = Replicate()

    def _prepare_input(self, args, device_mesh):
        x = args[0]
        if not isinstance(x, DTensor):
            x = DTensor.from_local(x, device_mesh, (Shard(x.dim() - 1),))
        return (x, *args[1:])

    def _prepare_output(self, output, device_mesh):
        return output.redistribute(device_mesh, (Replicate(),))


def parallelize_module(module, device_mesh, parallelize_plan):
    for fqn, style in parallelize_plan.items():
        style.apply(module.get_submodule(fqn), device_mesh)
    return module
