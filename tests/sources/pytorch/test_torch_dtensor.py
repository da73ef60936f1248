"""PyTorch DTensor source in one process over torch's fake process group.

Fast checks of what the hooks see and what they leave behind; the real 2-process
gloo run is in test_torch_gloo.py.
"""

from __future__ import annotations

import threading

import pytest
import torch
from torch import nn
from torch.distributed.tensor.debug import CommDebugMode as TorchCommDebugMode
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

from hp_otel import CommDebugMode
from hp_otel.spans import schema
from hp_otel.spans.call_tree import build_call_tree
from hp_otel.workloads.tp_mlp import train_step

REDISTRIBUTE_MODULES = (
    "torch.distributed.tensor._redistribute",
    "torch.distributed.tensor._dispatch",
    "torch.distributed.tensor._api",
)


def _redistribute_functions() -> list:
    import importlib

    return [importlib.import_module(m).redistribute_local_tensor for m in REDISTRIBUTE_MODULES]


def _hook_state(model: nn.Module) -> list:
    return [(dict(m._forward_pre_hooks), dict(m._forward_hooks), dict(m._backward_hooks)) for m in model.modules()]


def _short(name: str) -> str:
    return str(name).rsplit(".", 1)[-1]


def _tree(mode: CommDebugMode) -> list:
    def walk(record):
        return (record.name, record.phase, [walk(c) for c in record.children])

    return [walk(r) for r in build_call_tree(mode.get_finished_spans())]


def test_tp_mlp_step_span_tree_and_counts_match_torch(tp_mlp) -> None:
    model, x = tp_mlp
    with CommDebugMode(module=model) as mode, TorchCommDebugMode() as torch_mode:
        train_step(model, x)
    ours = {_short(k): v for k, v in mode.get_comm_counts().items()}
    theirs = {_short(k): v for k, v in torch_mode.get_comm_counts().items()}
    assert ours == theirs == {"all_reduce": 2}
    assert mode.get_comm_counts() == {"_c10d_functional.all_reduce": 2}
    assert mode.get_comm_module_counts() == {
        "(root)": {"forward": {"_c10d_functional.all_reduce": 1}, "backward": {"_c10d_functional.all_reduce": 1}},
        "fc2": {"forward": {"_c10d_functional.all_reduce": 1}},
        "fc1": {"backward": {"_c10d_functional.all_reduce": 1}},
    }
    assert mode.get_callback_error_counts() == {}
    forward, backward = _tree(mode)
    assert forward[:2] == ("MLP", "forward")
    fc1, fc2 = forward[2]
    assert fc1[0] == "fc1" and "linear" in [c[0] for c in fc1[2]]
    assert fc2[0] == "fc2"
    redistribute = [c for c in fc2[2] if c[0] == "redistribute" and c[2]]
    assert redistribute == [("redistribute", "forward", [("all_reduce", "forward", [])])]
    assert backward[:2] == ("MLP backward", "backward")
    assert [c[0] for c in backward[2]] == ["fc2 backward", "fc1 backward"]
    fc1_backward = backward[2][1]
    assert ("redistribute", "backward", [("all_reduce", "backward", [])]) in fc1_backward[2]


def test_op_spans_carry_dtensor_metadata(tp_mlp) -> None:
    model, x = tp_mlp
    with CommDebugMode(module=model) as mode:
        model(x).sum()  # use the output: its all_reduce is waited
    linear = [s for s in mode.get_finished_spans() if s.name == "linear"]
    assert len(linear) == 2
    fc1_linear = min(linear, key=lambda s: s.start_time)
    a = fc1_linear.attributes
    # int arrays, as on collective spans: every input's dims in turn, and the dims per input
    assert a[schema.OP_INPUT_SHAPES] == (4, 16, 32, 16, 32) and a[schema.OP_INPUT_NDIMS] == (2, 2, 1)
    assert a[schema.OP_INPUT_IS_DTENSOR] == (True, True, True)
    assert a[schema.OP_INPUT_PLACEMENTS] == ("Replicate()", "Shard(dim=0)", "Shard(dim=0)")
    assert a[schema.OP_INPUT_MESH_SHAPES] == (2, 2, 2) and a[schema.OP_INPUT_MESH_NDIMS] == (1, 1, 1)
    assert a[schema.OP_OUTPUT_PLACEMENTS] == ("Shard(dim=1)",)
    assert a[schema.OP_INPUT_DTYPES][0] == "torch.float32"
    assert mode.get_sharding_info() == {
        "fc1.weight": "Shard(dim=0)",
        "fc1.bias": "Shard(dim=0)",
        "fc2.weight": "Shard(dim=1)",
        "fc2.bias": "Replicate()",
    }
    assert mode.get_parameter_info()["fc2"]["weight"] == {
        "shape": [16, 32],
        "dtype": "torch.float32",
        "placements": "Shard(dim=1)",
    }


def test_module_called_twice_in_one_window(fake_world) -> None:
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    from hp_otel.workloads.tp_mlp import MLP

    class Twice(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.block = MLP()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.block(self.block(x))

    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (fake_world,))
    model = parallelize_module(Twice(), mesh, {"block.fc1": ColwiseParallel(), "block.fc2": RowwiseParallel()})
    x = torch.randn(4, 16, requires_grad=True)
    with CommDebugMode(module=model) as mode:
        train_step(model, x)
    assert mode.get_comm_counts() == {"_c10d_functional.all_reduce": 4}
    assert mode.get_comm_module_counts()["block.fc2"]["forward"] == {"_c10d_functional.all_reduce": 2}
    assert mode.get_comm_module_counts()["block.fc1"]["backward"] == {"_c10d_functional.all_reduce": 2}
    assert len([s for s in mode.get_finished_spans() if s.name in ("block", "block backward")]) == 4  # 2 fwd + 2 bwd
    assert mode.get_callback_error_counts() == {}


def test_everything_patched_is_restored_exactly(tp_mlp) -> None:
    model, x = tp_mlp
    before_functions = _redistribute_functions()
    before_hooks = _hook_state(model)
    with CommDebugMode(module=model):
        train_step(model, x)
        assert _redistribute_functions()[0] is not before_functions[0]
    assert all(a is b for a, b in zip(_redistribute_functions(), before_functions, strict=True))
    assert _hook_state(model) == before_hooks
    assert not x._backward_hooks  # no grad hook left on the leaf input
    assert torch._C._len_torch_function_stack() == 0
    assert _get_current_dispatch_mode_stack() == []


def test_user_exception_propagates_unchanged_and_everything_is_restored(tp_mlp) -> None:
    model, x = tp_mlp
    before_functions = _redistribute_functions()
    before_hooks = _hook_state(model)
    error = RuntimeError("user code failed")

    def explode(module, args):
        raise error

    handle = model.fc2.register_forward_pre_hook(explode)  # before fc2 issues its all_reduce
    try:
        with pytest.raises(RuntimeError) as caught, CommDebugMode(module=model) as mode:
            model(x)
    finally:
        handle.remove()
    assert caught.value is error
    assert all(a is b for a, b in zip(_redistribute_functions(), before_functions, strict=True))
    assert _hook_state(model) == before_hooks
    spans = {s.name: s for s in mode.get_finished_spans()}
    assert spans["fc2"].status.status_code.name == "ERROR"
    assert spans["MLP"].status.status_code.name == "ERROR"
    assert spans["fc1"].status.status_code.name == "UNSET"  # it finished before the failure
    assert mode.get_comm_counts() == {}


def test_modes_on_several_threads_restore_everything(fake_world) -> None:
    before = _redistribute_functions()
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            for _ in range(30):
                with CommDebugMode():
                    torch.ones(2) + 1
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert all(a is b for a, b in zip(_redistribute_functions(), before, strict=True))
    from hp_otel.sources.pytorch import dtensor as torch_dtensor

    assert torch_dtensor._redistribute_patches.patches == []


def test_memory_stays_bounded_over_many_steps(tp_mlp) -> None:
    model, x = tp_mlp
    with CommDebugMode(module=model, max_spans=50) as mode:
        for _ in range(20):
            train_step(model, x)
    assert len(mode.get_finished_spans()) == 50
    assert mode.get_dropped_record_count() > 0
    assert mode.get_total_counts() == 40
    assert len(x._backward_hooks or {}) == 0


def test_outputs_are_bit_identical_to_untraced(tp_mlp) -> None:
    model, x = tp_mlp
    ref = train_step(model, x).detach().clone()
    ref_grads = [p.grad.full_tensor().clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    with CommDebugMode(module=model):
        out = train_step(model, x)
    assert torch.equal(out, ref)
    assert all(torch.equal(p.grad.full_tensor(), g) for p, g in zip(model.parameters(), ref_grads, strict=True))
