"""The DeepSpeed phase source without DeepSpeed (issue 44 item 7): a stand-in `deepspeed.runtime.engine`
module whose `DeepSpeedEngine` has the two methods the source wraps, in this process over torch's fake
group. What is checked here and not on real ZeRO ranks (test_deepspeed_phases.py): nothing is wrapped or
imported while DeepSpeed is not imported; a fault of ours is counted and the engine's call goes on; a
step that raises closes its span; the methods are the same objects again after the window."""

from __future__ import annotations

import sys
import types

import pytest
import torch
import torch.distributed as dist
from torch import nn

from hp_otel import CommDebugMode
from hp_otel.sources.pytorch import deepspeed as ds_source
from hp_otel.spans import schema


class _ZeroOptimizer:
    """DeepSpeed's ZeRO optimizer stands for none of torch's: it wraps a torch one."""

    def __init__(self, params) -> None:  # type: ignore[no-untyped-def]
        self.inner = torch.optim.SGD(params, lr=0.1)

    def step(self) -> None:
        self.inner.step()  # torch's step hooks fire here: no second optimizer span
        dist.all_gather_into_tensor(torch.zeros(2), torch.ones(1))  # the updated partitions


def _stand_in(monkeypatch) -> type:
    class DeepSpeedEngine(nn.Module):
        def __init__(self, module: nn.Module) -> None:
            super().__init__()
            self.module = module
            self.optimizer = _ZeroOptimizer(module.parameters())

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.module(x)

        def backward(self, loss: torch.Tensor) -> None:
            loss.backward()
            self._backward_epilogue()

        def _backward_epilogue(self) -> None:
            for p in self.module.parameters():
                dist.all_reduce(p.grad)

        def step(self) -> str:
            self.optimizer.step()
            return "stepped"

    engine = types.ModuleType("deepspeed.runtime.engine")
    engine.DeepSpeedEngine = DeepSpeedEngine  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "deepspeed", types.ModuleType("deepspeed"))
    monkeypatch.setitem(sys.modules, "deepspeed.runtime", types.ModuleType("deepspeed.runtime"))
    monkeypatch.setitem(sys.modules, "deepspeed.runtime.engine", engine)
    return DeepSpeedEngine


def _phases(mode: CommDebugMode) -> dict[str, int]:
    seen: dict[str, int] = {}
    for s in mode.get_finished_spans():
        if s.attributes[schema.CALL_KIND] == schema.KIND_COLLECTIVE:
            key = f"{s.attributes[schema.PHASE]} {s.attributes[schema.COLLECTIVE_NAME]}"
            seen[key] = seen.get(key, 0) + 1
    return seen


def test_without_deepspeed_imported_nothing_is_wrapped_or_imported(fake_world) -> None:
    if "deepspeed" in sys.modules:
        pytest.fail("an earlier test imported DeepSpeed into this process")
    model = nn.Linear(2, 2)
    with CommDebugMode(module=model) as mode:
        dist.all_reduce(torch.ones(1))
    assert "deepspeed" not in sys.modules
    assert not any(isinstance(s, ds_source.DeepSpeedPhaseSource) for s in mode.sources)
    assert ds_source.deepspeed_patches.users == 0 and ds_source.deepspeed_patches.patches == []


def test_engine_step_and_backward_epilogue_are_their_phases_and_restored(fake_world, monkeypatch) -> None:
    engine_class = _stand_in(monkeypatch)
    saved = {name: vars(engine_class)[name] for name in ("step", "_backward_epilogue", "backward", "forward")}
    engine = engine_class(nn.Linear(2, 1))
    with CommDebugMode(module=engine) as mode:
        assert {n for n in saved if vars(engine_class)[n] is not saved[n]} == {"step", "_backward_epilogue"}
        engine.backward(engine(torch.ones(1, 2)).sum())
        assert engine.step() == "stepped"
    assert {n: vars(engine_class)[n] for n in saved} == saved and all(vars(engine_class)[n] is saved[n] for n in saved)
    # the referee: the stand-in issues 2 gradient all_reduces in its epilogue and 1 all_gather in its step
    assert _phases(mode) == {"backward c10d.allreduce_": 2, "optimizer c10d._allgather_base_": 1}
    counts = mode.get_comm_module_counts()
    assert counts["(root)"]["backward"] == {"c10d.allreduce_": 2}
    assert counts["(optimizer)"] == {"optimizer": {"c10d._allgather_base_": 1}}
    names = [s.name for s in mode.get_finished_spans() if s.attributes.get(schema.MODULE_FQN) == "(optimizer)"]
    assert names == ["_ZeroOptimizer"]  # DeepSpeed's optimizer; the SGD inside it opens no span of its own
    assert mode.get_callback_error_counts() == {}


def test_a_fault_of_ours_is_counted_and_the_step_goes_on(fake_world, monkeypatch) -> None:
    engine_class = _stand_in(monkeypatch)
    engine = engine_class(nn.Linear(2, 1))
    monkeypatch.setattr(ds_source, "_span_module", lambda *a: 1 / 0)
    with CommDebugMode(module=engine) as mode:
        assert engine.step() == "stepped"
    assert mode.get_callback_error_counts() == {"deepspeed_step_enter": 1}
    assert _phases(mode) == {"outside c10d._allgather_base_": 1}  # as before the source: counted, not lost


def test_a_step_that_raises_closes_its_span(fake_world, monkeypatch) -> None:
    engine_class = _stand_in(monkeypatch)
    engine = engine_class(nn.Linear(2, 1))

    def fail() -> None:
        raise RuntimeError("overflow")

    engine.optimizer.step = fail
    with CommDebugMode(module=engine) as mode:
        with pytest.raises(RuntimeError, match="overflow"):
            engine.step()
        dist.all_reduce(torch.ones(1))  # after the failed step: outside again
    assert _phases(mode) == {"outside c10d.allreduce_": 1}
    assert mode.get_callback_error_counts() == {}
