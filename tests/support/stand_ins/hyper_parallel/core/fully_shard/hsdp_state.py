"""`HSDPState`: one `fully_shard`ed module's parameters (the real `hsdp_state.py::HSDPState`).

As the real one: `unshard(async_op)` all-gathers every sharded parameter
(`HSDPParamV2.unshard` -> `torch.distributed.all_gather_into_tensor`), `prefetch()` is
`unshard(async_op=True)`, `wait_for_unshard()` waits and makes the parameters whole.
Parameters here keep their full data on every rank (the stand-in's shard is a copy of its
chunk), so the module computes as without FSDP; the collectives are the real ones.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


class HSDPParamV2:
    """One parameter: its flat chunk on this rank, gathered into a flat buffer on unshard."""

    def __init__(self, param: torch.nn.Parameter, group: dist.ProcessGroup) -> None:
        self.param = param
        self.group = group
        world = dist.get_world_size(group)
        self.chunk = -(-param.numel() // world)
        flat = torch.zeros(self.chunk * world, dtype=param.dtype)
        flat[: param.numel()] = param.detach().reshape(-1)
        self.sharded = flat.chunk(world)[dist.get_rank(group)].clone()
        self.prefetch_handle: dist.Work | None = None
        self.gathered: torch.Tensor | None = None
        self.reduce_scatter_handle: dist.Work | None = None

    def unshard(self, async_op: bool = False) -> None:
        if self.prefetch_handle is not None:  # already prefetched
            return
        self.gathered = torch.empty(self.chunk * dist.get_world_size(self.group), dtype=self.param.dtype)
        self.prefetch_handle = dist.all_gather_into_tensor(
            self.gathered, self.sharded, group=self.group, async_op=async_op
        )

    def wait_for_unshard(self) -> None:
        if self.prefetch_handle is not None:
            self.prefetch_handle.wait()
            self.prefetch_handle = None
        # into `.data` (its own version counter): backward saved the parameter (the real one swaps storage)
        self.param.data.copy_(self.gathered[: self.param.numel()].view_as(self.param))

    def reduce_scatter_grad(self) -> None:
        grad = self.param.grad
        world = dist.get_world_size(self.group)
        flat = torch.zeros(self.chunk * world, dtype=grad.dtype)
        flat[: grad.numel()] = grad.reshape(-1)
        self.reduced = torch.empty(self.chunk, dtype=grad.dtype)
        self.reduce_scatter_handle = dist.reduce_scatter_tensor(
            self.reduced, flat, op=dist.ReduceOp.AVG, group=self.group, async_op=True
        )


def _managed_parameters(cell: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The cell's parameters, but not those of a submodule `fully_shard` was applied to before (bottom-up)."""
    params: list[torch.nn.Parameter] = []

    def visit(module: torch.nn.Module) -> None:
        params.extend(module.parameters(recurse=False))
        for child in module.children():
            if not hasattr(child, "hsdp_scheduler"):
                visit(child)

    visit(cell)
    return params


class HSDPState:
    """HSDP state for cell (the real base class; the torch platform's subclass adds post_backward)."""

    def __init__(self, cell: torch.nn.Module, group: dist.ProcessGroup) -> None:
        self.cell = cell
        self.hsdp_params = [HSDPParamV2(p, group) for p in _managed_parameters(cell)]
        self.sharded_hsdp_params = self.hsdp_params
        self.is_shard = True

    def shard(self) -> None:
        self.is_shard = True

    def unshard(self, async_op: bool = False) -> None:
        if not self.is_shard:
            return
        for param in self.sharded_hsdp_params:
            param.unshard(async_op)
        if not async_op:
            self.wait_for_unshard()

    def prefetch(self) -> None:
        self.unshard(async_op=True)

    def wait_for_unshard(self) -> None:
        if not self.is_shard:
            return
        for param in self.sharded_hsdp_params:
            param.wait_for_unshard()
        self.is_shard = False
