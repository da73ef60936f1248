"""`TorchHSDPSchedulerV2`: a `fully_shard`ed module's hooks (the real `platform/torch/fully_shard/scheduler.py`
with its base `core/fully_shard/hsdp_scheduler.py::HSDPSchedulerV2`, and `hook_function.py`'s
`PostBackwardFunction`).

As the real one:
- forward pre-hook: unshard its own state, then `prefetch()` the states of the cells set by
  `set_modules_to_forward_prefetch` (unit i+1's all_gather from unit i's hook); wrap the inputs
  in `PostBackwardFunction`, whose backward runs the post-backward;
- forward hook: a hook on each output that needs a gradient (the backward pre-hook), reshard
  if `reshard_after_forward`;
- backward pre-hook: queue the root's end-of-backward callback, unshard again if resharded,
  `prefetch()` the cells set by `set_modules_to_backward_prefetch`;
- post-backward (`PostBackwardFunction.backward`, or the end-of-backward callback for a module
  whose inputs need no gradient): `TorchHSDPStateV2.post_backward` (the reduce-scatters).
"""

from __future__ import annotations

import torch

from hyper_parallel.platform.torch.fully_shard.state import TorchHSDPStateV2

PRE_FORWARD, FORWARD, PRE_BACKWARD, BACKWARD = "pre_forward", "forward", "pre_backward", "backward"


class PostBackwardFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hsdp_scheduler, *inputs):
        ctx.hsdp_scheduler = hsdp_scheduler
        return inputs

    @staticmethod
    def backward(ctx, *grads):
        ctx.hsdp_scheduler._backward_hook()
        return (None, *grads)


class TorchHSDPSchedulerV2:
    root_bp_state = False

    def __init__(self, cell, group, reshard_after_forward) -> None:
        self.cell = cell
        self.reshard_after_forward = bool(reshard_after_forward)
        self.scheduler_state = None
        self.forward_prefetch_cells: list = []
        self.backward_prefetch_cells: list = []
        self._backup_forward_fetch = None
        self.hsdp_state = TorchHSDPStateV2(cell, group)
        cell.register_forward_pre_hook(self._forward_pre_hook, with_kwargs=True)
        cell.register_forward_hook(self._forward_hook)

    def _forward_pre_hook(self, cell, args, kwargs):
        if TorchHSDPSchedulerV2.root_bp_state:
            self._backup_forward_fetch = self.forward_prefetch_cells
            self.forward_prefetch_cells = []
        if self.scheduler_state != PRE_BACKWARD:
            self.scheduler_state = PRE_FORWARD
            self.hsdp_state.unshard()
            for prefetch_cell in self.forward_prefetch_cells:
                prefetch_cell.hsdp_scheduler.hsdp_state.prefetch()
        tensors = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
        if not tensors:
            return args, kwargs
        wrapped = PostBackwardFunction.apply(self, *(args[i] for i in tensors))
        args = list(args)
        for i, value in zip(tensors, wrapped, strict=True):
            args[i] = value
        return tuple(args), kwargs

    def _forward_hook(self, cell, inputs, outputs):
        for output in outputs if isinstance(outputs, (tuple, list)) else (outputs,):
            if isinstance(output, torch.Tensor) and output.requires_grad:
                output.register_hook(self._backward_pre_hook)
        if self.scheduler_state == PRE_BACKWARD:
            return
        if TorchHSDPSchedulerV2.root_bp_state:
            if self._backup_forward_fetch:
                self.forward_prefetch_cells = self._backup_forward_fetch
                self._backup_forward_fetch = []
            return
        self.scheduler_state = FORWARD
        if self.reshard_after_forward:
            self.hsdp_state.shard()

    def _backward_pre_hook(self, grad):
        torch.autograd.Variable._execution_engine.queue_callback(self._root_backward_hook)
        if self.scheduler_state == PRE_BACKWARD:
            return grad
        TorchHSDPSchedulerV2.root_bp_state = True
        self.scheduler_state = PRE_BACKWARD
        if self.reshard_after_forward:
            self.hsdp_state.unshard()
        for prefetch_cell in self.backward_prefetch_cells:
            prefetch_cell.hsdp_scheduler.hsdp_state.prefetch()
        return grad

    def _root_backward_hook(self):
        apply_final_reduce = self.scheduler_state != BACKWARD
        self._backward_hook()
        if apply_final_reduce:
            TorchHSDPSchedulerV2.root_bp_state = False
            self.hsdp_state.reduce_params()

    def _backward_hook(self):
        if self.scheduler_state == BACKWARD:
            return
        self.scheduler_state = BACKWARD
        self.hsdp_state.post_backward()
