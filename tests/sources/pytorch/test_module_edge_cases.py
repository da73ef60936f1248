"""Issue 19 item 5: module attribution on a DDP model with a multi-tensor output, and with a
`torch.jit.script` submodule (which takes no module hooks)."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.distributed as dist
from referee import Referee
from span_counts import module_counts_from_spans
from torch import nn

from hp_otel import CommDebugMode


class _Net(nn.Module):
    """Returns a dict of tensors (as Hugging Face models do: the loss and the logits)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 8)
        self.fc2 = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        logits = self.fc2(torch.relu(self.fc1(x)))
        return {"loss": logits.pow(2).mean(), "logits": logits}


class _Wrapper(nn.Module):
    """Calls its child and returns the child's output as is (as DDP does)."""

    def __init__(self) -> None:
        super().__init__()
        self.module = _Net()

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        out = self.module(x)
        dist.all_reduce(out["loss"].detach().clone())  # something to count, in the wrapper's forward
        return out


def _check_one_backward_span_each(mode: CommDebugMode) -> None:
    table = mode.generate_comm_debug_tracing_table(noise_level=3)
    # before: "Module(module) [backward]" twice in a row, the first one empty
    assert table.count("Module(module) [backward]") == 1, table
    assert table.count("Module((root)) [backward]") == 1, table
    backward = [
        sp.attributes["hp_otel.module.fqn"]
        for sp in mode.get_finished_spans()
        if sp.attributes.get("hp_otel.phase") == "backward" and sp.attributes["hp_otel.call.kind"] == "module"
    ]
    assert sorted(backward) == ["(root)", "module", "module.fc1", "module.fc2"]
    assert mode.get_comm_module_counts() == module_counts_from_spans(mode.get_finished_spans())
    assert mode.get_callback_error_counts() == {}


def test_shared_dict_output_opens_each_backward_span_once(fake_world) -> None:
    """The root and its child return the same tensors: their grad hooks may run in either order."""
    torch.manual_seed(0)
    model = _Wrapper()
    referee = Referee(model)
    with CommDebugMode(module=model) as mode, referee:
        model(torch.randn(4, 8))["loss"].backward()
    _check_one_backward_span_each(mode)
    assert mode.get_comm_module_counts() == referee.module_counts_dict()


def _ddp_worker(rank: int, port: int) -> None:
    from hp_otel.workloads.process_groups import init_gloo

    init_gloo(rank, 1, port)
    try:
        torch.manual_seed(0)
        model = nn.parallel.DistributedDataParallel(_Net())
        with CommDebugMode(module=model) as mode:
            model(torch.randn(4, 8))["loss"].backward()
        _check_one_backward_span_each(mode)
        # DDP's reducer calls the group from C++ (no dispatch mode sees it): its one bucket is launched
        # when the last gradient (fc1's, the first layer's) is ready: it counts for fc1 and its callers
        assert mode.get_comm_counts() == {"c10d.allreduce_": 1}
        expected = {f: {"backward": {"c10d.allreduce_": 1}} for f in ("(root)", "module", "module.fc1")}
        assert mode.get_comm_module_counts() == expected
    finally:
        dist.destroy_process_group()


@pytest.mark.multiprocess  # a gloo process of its own (DDP's reducer needs real completions)
def test_ddp_dict_output_opens_each_backward_span_once() -> None:
    import torch.multiprocessing as mp

    from hp_otel.workloads.process_groups import free_port

    mp.spawn(_ddp_worker, args=(free_port(),), nprocs=1, join=True)


class _Scripted(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.fc(x))


class _AllReduce(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.clone()
        dist.all_reduce(x)
        return x


class _WithScript(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.pre = _AllReduce()
        self.scripted = torch.jit.script(_Scripted())
        self.post = _AllReduce()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.scripted(self.pre(x))
        dist.all_reduce(y)  # the root's own, right after the scripted call
        return self.post(y)


@pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning")
def test_script_submodule_keeps_attribution_and_says_so_once(fake_world, caplog) -> None:
    torch.manual_seed(0)
    model = _WithScript()
    x = torch.randn(4, 8)
    caplog.set_level(logging.INFO, logger="hp_otel")
    for _ in range(2):  # before: every window lost module attribution, with one traceback each
        referee = Referee(model)
        with CommDebugMode(module=model) as mode, referee:
            model(x).sum().backward()
        assert mode.get_callback_error_counts() == {}
        ours = mode.get_comm_module_counts()
        assert ours == referee.module_counts_dict()
        assert ours == module_counts_from_spans(mode.get_finished_spans())
        assert ours == {
            "(root)": {"forward": {"c10d.allreduce_": 3}},
            "pre": {"forward": {"c10d.allreduce_": 1}},
            "post": {"forward": {"c10d.allreduce_": 1}},
        }
    said = [r for r in caplog.records if "torch.jit.script" in r.getMessage()]
    assert len(said) == 1 and said[0].exc_info is None
    assert "module scripted" in said[0].getMessage()
    assert not [r for r in caplog.records if r.exc_info]
