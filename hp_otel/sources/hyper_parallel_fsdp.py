"""hyper-parallel's `fully_shard` (torch platform): which module's parameters a collective moves.

hyper-parallel's equivalent of FSDP2's `FSDPParamGroup` is the per-module state its scheduler
keeps (`hyper_parallel/core/fully_shard/hsdp_state.py::HSDPState`, on torch
`hyper_parallel/platform/torch/fully_shard/state.py::TorchHSDPStateV2`), whose `cell` is the
module `fully_shard` was applied to.  It issues every collective of that module's parameters
in two methods:

- `HSDPState.unshard` — the all_gathers (`HSDPParamV2.unshard` ->
  `torch.distributed.all_gather_into_tensor`), from the module's own forward pre-hook and
  backward pre-hook, and from another module's when prefetching (`HSDPState.prefetch` calls
  `unshard(async_op=True)` for the cells set by `set_modules_to_forward_prefetch` /
  `set_modules_to_backward_prefetch`);
- `TorchHSDPStateV2.post_backward` — the reduce_scatters / all_reduces of the gradients,
  from the module's post-backward function or from the root's end-of-backward callback
  (`TorchHSDPSchedulerV2._root_backward_hook`) for a module whose input needs no gradient.

Both are wrapped while a window is active, with FSDP2's wrapper (`fsdp.group_method_wrapper`):
the module tracker then counts (and nests) such a collective under the state's module and its
enclosing calls, with `hp_otel.collective.issued_by` naming the module running when it was issued,
exactly as for FSDP2.  hyper-parallel keeps no module name on the state, so its collectives
carry no `hp_otel.collective.param.module`.  Nothing is patched unless hyper-parallel's torch
`fully_shard` is imported (on MindSpore its HSDP cells are another class, not covered).
"""

from __future__ import annotations

import sys
from typing import Any

from hp_otel.sources.patching import AttributePatch, SharedPatches, all_or_nothing, patch_owned

# (module, class, methods): where the real source defines each method (see the docstring)
STATE_METHODS = (
    ("hyper_parallel.core.fully_shard.hsdp_state", "HSDPState", ("unshard",)),
    ("hyper_parallel.platform.torch.fully_shard.state", "TorchHSDPStateV2", ("post_backward",)),
)
_TORCH_STATE_MODULE = "hyper_parallel.platform.torch.fully_shard.state"


def _describe(state: Any) -> tuple[str, tuple[Any, ...]]:
    cell = getattr(state, "cell", None)
    return "", ((cell,) if cell is not None else ())


def _plan() -> list[AttributePatch]:
    if _TORCH_STATE_MODULE not in sys.modules:  # its torch fully_shard is not in use: nothing to patch
        return []
    from hp_otel.sources.pytorch.fsdp import group_method_wrapper

    def wrap_for(name: str) -> Any:
        return lambda original: group_method_wrapper(original, _describe, name)

    with all_or_nothing() as patches:
        for module_name, class_name, methods in STATE_METHODS:
            owner = getattr(sys.modules.get(module_name), class_name, None)
            if isinstance(owner, type):
                patches.extend(patch_owned(owner, methods, wrap_for))
    return patches


state_patches = SharedPatches(_plan)
