"""FSDP1 (`FullyShardedDataParallel`): every all-gather and gradient reduction counts for the FSDP
unit whose flat parameter it moves, with `use_orig_params=True` (the flat parameter is then no
registered parameter of any module, so its gradient hook's reduce-scatters counted for none) as
with `use_orig_params=False`.  Two gloo ranks; the referee is a dispatch mode written here: the
unit from the collective's size (each unit's padded flat parameter has its own), the enclosing
calls from its own forward hooks."""

from __future__ import annotations

import gc
import os
from collections import Counter, defaultdict
from typing import Any

import pytest
import torch
import torch.distributed as dist
from referee import CallChains
from span_counts import module_counts_from_spans
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from hp_otel import CommDebugMode
from hp_otel.workloads.process_groups import free_port


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(8, 8), nn.Linear(8, 6)])  # 72 and 54 parameters
        self.head = nn.Linear(6, 4)  # 28: the root unit's own

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = torch.relu(layer(x))
        return self.head(x)


def _numel(arg: Any) -> int:
    """Elements of a tensor argument, or of all tensors of a (nested) list: an all_gather's output list."""
    if isinstance(arg, torch.Tensor):
        return arg.numel()
    if isinstance(arg, (list, tuple)):
        return sum(_numel(a) for a in arg)
    return 0


class _UnitReferee(TorchDispatchMode):
    """Counts c10d collectives per module and phase: a collective moving unit U's flat parameter
    counts for U's sharded module with the calls enclosing it (forward: the open calls; backward:
    those of its latest forward call)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        self.counts: Counter[str] = Counter()
        self.module_counts: dict[str, dict[str, Counter[str]]] = defaultdict(lambda: defaultdict(Counter))
        names = {id(m): fqn or "(root)" for fqn, m in model.named_modules()}
        self._unit_by_numel: dict[int, str] = {}
        for unit in model.modules():
            if isinstance(unit, FSDP):
                numel = unit._handle.flat_param._padded_unsharded_size.numel()
                assert numel not in self._unit_by_numel, "the referee tells units apart by their size"
                self._unit_by_numel[numel] = names[id(unit._fsdp_wrapped_module)]
        self._calls = CallChains(model)  # the open calls, and each module's latest call's chain

    def remove_hooks(self) -> None:
        self._calls.remove()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        if func.namespace == "c10d" and func._schema.name != "c10d::barrier":
            name = f"c10d.{func._schema.name.split('::')[-1]}"
            self.counts[name] += 1
            unit = self._unit_by_numel.get(max((_numel(a) for a in args), default=-1))
            backward = torch._C._current_graph_task_id() != -1
            if unit is None:
                owners = set() if backward else set(self._calls.stack)
            elif backward:
                owners = set(self._calls.latest.get(unit, (unit,)))
            else:
                owners = {*self._calls.stack, unit}
            for fqn in owners:
                self.module_counts[fqn]["backward" if backward else "forward"][name] += 1
        return func(*args, **kwargs)

    def module_counts_dict(self) -> dict[str, dict[str, dict[str, int]]]:
        return {f: {p: dict(c) for p, c in phases.items() if c} for f, phases in self.module_counts.items()}


def _eq(actual: object, expected: object) -> None:
    assert actual == expected, f"\nactual:   {actual!r}\nexpected: {expected!r}"


def _worker(rank: int, port: int) -> None:
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        for orig in (False, True):
            torch.manual_seed(0)
            net = _Net()
            for i, layer in enumerate(net.layers):
                net.layers[i] = FSDP(layer, use_orig_params=orig, device_id=torch.device("cpu"))
            model = FSDP(net, use_orig_params=orig, device_id=torch.device("cpu"))
            x = torch.randn(4, 8)
            model(x).sum().backward()  # untraced: FSDP's lazy init
            referee = _UnitReferee(model)
            with referee, CommDebugMode(module=model) as mode:
                model(x).sum().backward()
            referee.remove_hooks()
            got = mode.get_comm_module_counts()
            _eq((orig, Counter(mode.get_comm_counts())), (orig, referee.counts))
            _eq((orig, got), (orig, referee.module_counts_dict()))
            _eq(got, module_counts_from_spans(mode.get_finished_spans()))  # the spans say the same
            _eq(mode.get_callback_error_counts(), {})
            assert any(p.get("backward", {}).get("c10d._reduce_scatter_base_") for p in got.values()), got
            del model, net, referee, mode  # FSDP's handles hold the group: let it go here, not at exit
        gc.collect()
        dist.barrier()  # neither rank tears its group down while the other still talks to it
    finally:
        dist.destroy_process_group()


@pytest.mark.multiprocess  # two gloo ranks
def test_fsdp1_collectives_count_for_the_unit_whose_flat_parameter_they_move() -> None:
    import torch.multiprocessing as mp

    mp.spawn(_worker, args=(free_port(),), nprocs=2, join=True)
