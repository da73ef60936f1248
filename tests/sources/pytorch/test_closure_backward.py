"""Backward inside `optimizer.step(closure)` (Lightning's automatic optimization, LBFGS) counts as
backward for the modules whose autograd nodes ran, exactly as `closure(); optimizer.step()` does;
a forward inside the closure is forward.  Two gloo ranks; the referee is a dispatch mode with its
own forward hooks and node tags, counting backward by the running node also inside the step."""

from __future__ import annotations

import os
from collections import Counter

import pytest
import torch
import torch.distributed as dist
from referee import Referee, _node_stack
from span_counts import module_counts_from_spans
from sync_net import SyncNet
from torch import nn

from hp_otel import CommDebugMode
from hp_otel.workloads.process_groups import free_port


class _StepReferee(Referee):
    """The shared referee, with backward inside a step counted by its node (the optimizer counts
    only what runs outside every module and outside backward)."""

    def _count(self, name: str) -> None:
        if self._in_step and not self._stack and torch._C._current_graph_task_id() != -1:
            self.counts[name] += 1
            for fqn in set(_node_stack()):
                self.module_counts[fqn]["backward"][name] += 1
            return
        super()._count(name)


def _eq(actual: object, expected: object) -> None:
    assert actual == expected, f"\nactual:   {actual!r}\nexpected: {expected!r}"


def _window(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, closure_in_step: bool) -> tuple:
    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = model(x).pow(2).mean()
        loss.backward()
        return loss

    referee = _StepReferee(model)
    with referee, CommDebugMode(module=model) as mode:
        if closure_in_step:
            opt.step(closure)
        else:
            closure()
            opt.step()
    return mode, referee


def _worker(rank: int, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        torch.manual_seed(0)
        for wrap in (False, True):
            model: nn.Module = SyncNet()
            if wrap:  # DDP: its bucket all_reduce runs from the reducer, inside the closure's backward
                model = nn.parallel.DistributedDataParallel(model)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            x = torch.randn(4, 8)
            for _ in range(2):  # untraced: DDP rebuilds its buckets after the first step, broadcasts in the second
                model(x).sum().backward()
            counts = {}
            for closure_in_step in (False, True):
                mode, referee = _window(model, opt, x, closure_in_step)
                got = mode.get_comm_module_counts()
                _eq(got, module_counts_from_spans(mode.get_finished_spans()))  # the spans say the same
                _eq(mode.get_callback_error_counts(), {})
                assert "(optimizer)" not in got, got  # SGD's step issues no collective of its own
                if not wrap:  # every collective is seen by the referee's dispatch mode
                    _eq(got, referee.module_counts_dict())
                    _eq(Counter(mode.get_comm_counts()), referee.counts)
                counts[closure_in_step] = got
            # DDP's reducer calls the group from C++ (no dispatch mode sees it): the control, which the
            # referee checks for every other collective, is the referee of its bucket all_reduce
            _eq(counts[True], counts[False])
            assert any("backward" in phases for phases in counts[True].values()), counts[True]
    finally:
        dist.destroy_process_group()


@pytest.mark.multiprocess  # two gloo ranks
def test_backward_inside_a_step_closure_counts_for_its_nodes_modules() -> None:
    import torch.multiprocessing as mp

    mp.spawn(_worker, args=(free_port(),), nprocs=2, join=True)
