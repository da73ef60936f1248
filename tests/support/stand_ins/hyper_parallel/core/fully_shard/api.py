"""`fully_shard(module, mesh=, reshard_after_forward=)` (the real `core/fully_shard/api.py`): the module's
class is extended with `HSDPModule` (`set_modules_to_forward_prefetch`, `set_modules_to_backward_prefetch`)
and gets a `hsdp_scheduler` (platform/torch/fully_shard/scheduler.py).  Torch platform only."""

from __future__ import annotations

import torch.distributed as dist

from hyper_parallel.platform.torch.fully_shard.scheduler import TorchHSDPSchedulerV2


class HSDPModule:
    def set_modules_to_forward_prefetch(self, modules):
        if not isinstance(modules, (tuple, list)) or not all(isinstance(m, HSDPModule) for m in modules):
            raise ValueError("modules must be HSDPModule list")
        self.hsdp_scheduler.forward_prefetch_cells = list(modules)

    def set_modules_to_backward_prefetch(self, modules):
        if not isinstance(modules, (tuple, list)) or not all(isinstance(m, HSDPModule) for m in modules):
            raise ValueError("modules must be HSDPModule list")
        self.hsdp_scheduler.backward_prefetch_cells = list(modules)


def fully_shard(module, *, mesh=None, reshard_after_forward=None):
    cls = module.__class__
    if not isinstance(module, HSDPModule):
        module.__class__ = type(f"HSDP{cls.__name__}", (HSDPModule, cls), {})
    group = mesh.get_group(0) if mesh is not None else dist.group.WORLD
    module.hsdp_scheduler = TorchHSDPSchedulerV2(module, group, reshard_after_forward)
    return module
