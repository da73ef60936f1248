"""hyper-parallel source against the stand-in (tests/support/stand_ins), in one process over torch's fake process group.

Every release variant of the stand-in: ops through `_debug_mode_observer` or the
wrapped `OpDispatcher.dispatch`, collectives on the platform classes or in
`core.dtensor._utils`; exact restore; faults kept away from the traced code.  The
real 2-process gloo run is in test_hyper_parallel_gloo.py.
"""

from __future__ import annotations

import importlib
import sys

import hp_mlp
import pytest
import torch
from stand_in import RELEASES, hyper_parallel_release

from hp_otel import CommDebugMode
from hp_otel.sources import default_sources
from hp_otel.sources import hyper_parallel as source_module
from hp_otel.sources.hyper_parallel import (
    DIFFERENTIABLE_COLLECTIVES,
    PLATFORM_COLLECTIVES,
    TORCH_DISTRIBUTED_COLLECTIVES,
    HyperParallelSource,
)
from hp_otel.spans import schema

ALL_COLLECTIVES = (*DIFFERENTIABLE_COLLECTIVES, *PLATFORM_COLLECTIVES)


@pytest.fixture(params=RELEASES)
def hp(request, fake_world):
    with hyper_parallel_release(request.param) as module:
        yield module


def _descriptors() -> dict:
    """Every patchable slot of the stand-in: (owner, name) -> the object stored in its __dict__."""
    owners = [importlib.import_module("hyper_parallel.platform.torch.platform").TorchPlatform]
    if "mindspore" in sys.modules:
        owners.append(importlib.import_module("hyper_parallel.platform.mindspore.platform").MindSporePlatform)
        owners.append(
            importlib.import_module("hyper_parallel.platform.mindspore.platform_graph").MindSporeGraphPlatform
        )
    owners.append(importlib.import_module("hyper_parallel.core.dtensor._utils"))
    slots = {(owner, name): vars(owner)[name] for owner in owners for name in ALL_COLLECTIVES if name in vars(owner)}
    dispatcher = importlib.import_module("hyper_parallel.core.shard._op_dispatch").OpDispatcher
    slots[(dispatcher, "dispatch")] = vars(dispatcher)["dispatch"]
    return slots


def _assert_restored(before: dict) -> None:
    after = _descriptors()
    assert after.keys() == before.keys()
    for key, saved in before.items():
        assert after[key] is saved, f"{key} not restored"


def test_design_mlp_tables_at_each_noise_level(hp) -> None:
    model = hp_mlp.build(2)
    x = torch.randn(4, 16)
    with CommDebugMode(module=model) as mode:  # auto: the stand-in is importable
        model(x)
    assert mode.get_comm_counts() == {"differentiable_all_reduce": 1}
    assert mode.get_comm_counts(normalized=True) == {"all_reduce": 1}
    assert mode.get_comm_module_counts() == {
        "(root)": {"forward": {"differentiable_all_reduce": 1}},
        "fc2": {"forward": {"differentiable_all_reduce": 1}},
    }
    for level, expected in hp_mlp.TABLES.items():
        assert mode.generate_comm_debug_tracing_table(noise_level=level).splitlines() == expected, level
    assert mode.get_sharding_info() == {"fc1.weight": "Shard(dim=0)", "fc2.weight": "Shard(dim=1)"}
    assert mode.get_callback_error_counts() == {}
    (span,) = [s for s in mode.get_finished_spans() if s.attributes[schema.CALL_KIND] == "collective"]
    assert span.name == span.attributes[schema.COLLECTIVE_OP] == "all_reduce"
    assert span.attributes[schema.COLLECTIVE_GROUP_SIZE] == 2
    assert span.attributes[schema.COLLECTIVE_GROUP_MEMBERS] == "0,1"  # its group's first span: described
    assert span.attributes[schema.COLLECTIVE_REDUCE_OP] == "sum"
    linear = [s for s in mode.get_finished_spans() if s.name == "linear"]
    assert linear[0].attributes[schema.OP_INPUT_PLACEMENTS] == ("Replicate()", "Shard(dim=0)")
    assert linear[1].attributes[schema.OP_OUTPUT_PLACEMENTS] == ("Partial(reduce_op='sum')",)
    assert linear[1].attributes[schema.OP_INPUT_MESH_SHAPES] == (2, 2)  # int arrays, as on collective spans


def test_op_events_come_from_the_observer_slot_where_the_release_has_one(hp) -> None:
    dispatch_module = importlib.import_module("hyper_parallel.core.shard._op_dispatch")
    mode = CommDebugMode(engine="hyper_parallel")
    (source,) = [s for s in mode.sources if isinstance(s, HyperParallelSource)]
    before = _descriptors()
    with mode:
        assert source.uses_observer_slot is (hp.RELEASE != "snapshot")
        if source.uses_observer_slot:
            slot = dispatch_module._debug_mode_observer.get()
            assert isinstance(slot, source_module.DispatchObserver)
            assert vars(dispatch_module.OpDispatcher)["dispatch"] is before[(dispatch_module.OpDispatcher, "dispatch")]
        else:
            assert not hasattr(dispatch_module, "_debug_mode_observer")
            assert (
                vars(dispatch_module.OpDispatcher)["dispatch"] is not before[(dispatch_module.OpDispatcher, "dispatch")]
            )
    if source.uses_observer_slot:
        assert dispatch_module._debug_mode_observer.get() is None
    _assert_restored(before)


def test_hooked_functions_per_release(hp) -> None:
    with CommDebugMode():
        hooked = set(source_module.hooked_functions())
    platform = {f"TorchPlatform.{n}" for n in PLATFORM_COLLECTIVES}
    platform |= {f"torch.distributed.{n}" for n in TORCH_DISTRIBUTED_COLLECTIVES}  # fully_shard and backward
    four = ["differentiable_all_gather_concat", "differentiable_all_to_all", "differentiable_all_reduce"]
    four.append("differentiable_reduce_scatter")
    single = ["differentiable_all_to_all_single", "differentiable_all_to_all_single_async"]
    utils = "hyper_parallel.core.dtensor._utils"
    expected = {
        "snapshot": platform | {f"TorchPlatform.{n}" for n in four} | {"OpDispatcher.dispatch"},
        "newer": platform | {f"TorchPlatform.{n}" for n in four + single},
        "newest": platform | {f"{utils}.{n}" for n in four + single},
    }[hp.RELEASE]
    if "mindspore" in sys.modules:  # the MindSpore platform classes are traced once MindSpore is imported
        hooked = {h for h in hooked if not h.startswith("MindSpore")}
    assert hooked == expected
    assert source_module.hooked_functions() == []


def test_restored_exactly_when_the_traced_code_raises(hp) -> None:
    model = hp_mlp.build(2)
    hooks_before = [(dict(m._forward_pre_hooks), dict(m._forward_hooks)) for m in model.modules()]
    before = _descriptors()
    with pytest.raises(ZeroDivisionError), CommDebugMode(module=model) as mode:
        model(torch.randn(4, 16))
        1 / 0  # noqa: B018
    _assert_restored(before)
    assert [(dict(m._forward_pre_hooks), dict(m._forward_hooks)) for m in model.modules()] == hooks_before
    assert mode.get_total_counts() == 1


def test_an_op_that_raises_ends_its_span_with_error_status(hp) -> None:
    a = hp.DTensor.from_local(torch.ones(2, 2), hp.init_device_mesh("cpu", (2,)), [hp.core.dtensor.Replicate()])
    with CommDebugMode() as mode, pytest.raises(NotImplementedError):
        torch.matmul(a, a)
    (span,) = mode.get_finished_spans()
    assert span.name == "matmul" and not span.status.is_ok
    assert "NotImplementedError" in (span.status.description or "")


def test_every_collective_is_read_from_its_signature(hp) -> None:
    import torch.distributed as dist
    from hyper_parallel.platform import GroupInfo, get_platform

    platform = get_platform()
    world = dist.group.WORLD
    functions = importlib.import_module("hyper_parallel.core.dtensor._utils") if hp.RELEASE == "newest" else platform
    t = torch.ones(4, 2)
    info = GroupInfo(group=world, rank_size=2, group_name="tp")
    with CommDebugMode() as mode:
        functions.differentiable_all_reduce(t, "max", group=world)
        functions.differentiable_all_gather_concat(t, group=world, concat_size=2, concat_dim=0)
        functions.differentiable_all_to_all(input_data=t, output_shape=t.shape, group=world)
        functions.differentiable_reduce_scatter(t, 2, 0, "sum", group=world)
        if hp.RELEASE != "snapshot":
            functions.differentiable_all_to_all_single(t, [2, 2], [2, 2], group=world)
            functions.differentiable_all_to_all_single_async(t, [2, 2], [2, 2], group=world)[1].wait()
        platform.all_reduce(t, info)
        platform.all_gather_into_tensor(t, group_info=info)
        platform.reduce_scatter_tensor(t, info, async_op=False)
        platform.broadcast(t, 0, group=world)
    spans = {s.attributes[schema.COLLECTIVE_NAME]: s.attributes for s in mode.get_finished_spans()}
    expected_ops = {
        "differentiable_all_reduce": "all_reduce",
        "differentiable_all_gather_concat": "all_gather",
        "differentiable_all_to_all": "all_to_all",
        "differentiable_reduce_scatter": "reduce_scatter",
        "all_reduce": "all_reduce",
        "all_gather_into_tensor": "all_gather",
        "reduce_scatter_tensor": "reduce_scatter",
        "broadcast": "broadcast",
    }
    if hp.RELEASE != "snapshot":
        expected_ops["differentiable_all_to_all_single"] = "all_to_all"
        expected_ops["differentiable_all_to_all_single_async"] = "all_to_all"
    assert {name: a[schema.COLLECTIVE_OP] for name, a in spans.items()} == expected_ops
    assert mode.get_comm_counts() == dict.fromkeys(expected_ops, 1)
    assert all(a[schema.COLLECTIVE_GROUP_SIZE] == 2 for a in spans.values())
    assert spans["all_reduce"][schema.COLLECTIVE_GROUP] == "tp"  # from the group_info
    assert spans["differentiable_all_reduce"][schema.COLLECTIVE_REDUCE_OP] == "max"
    assert spans["differentiable_all_gather_concat"][schema.COLLECTIVE_OUTPUT_SHAPE] == (8, 2)
    assert spans["differentiable_all_to_all"][schema.COLLECTIVE_INPUT_SHAPE] == (4, 2)  # keywords only
    assert spans["all_gather_into_tensor"][schema.COLLECTIVE_OUTPUT_SHAPE] == (8, 2)
    assert spans["broadcast"][schema.COLLECTIVE_BYTES] == 4 * 2 * 4
    assert spans["broadcast"][schema.COLLECTIVE_ASYNC] is False
    if hp.RELEASE != "snapshot":
        assert spans["differentiable_all_to_all_single_async"][schema.COLLECTIVE_ASYNC] is True


def test_a_fault_in_our_callback_never_reaches_the_traced_code(hp, monkeypatch) -> None:
    def broken(self, arguments, result):
        raise RuntimeError("describe failed")

    monkeypatch.setattr(source_module.CallReader, "describe", broken)
    model = hp_mlp.build(2)
    x = torch.randn(4, 16)
    expected = model(x).to_local()
    with CommDebugMode(module=model) as mode:
        out = model(x)
    assert torch.equal(out.to_local(), expected)
    assert mode.get_callback_error_counts() == {  # described when issued, and again after the call
        "collective_issue:differentiable_all_reduce": 1,
        "collective_describe:differentiable_all_reduce": 1,
    }
    assert mode.get_total_counts() == 0


def test_inner_mode_records_and_outer_resumes(hp) -> None:
    model = hp_mlp.build(2)
    x = torch.randn(4, 16)
    with CommDebugMode() as outer:
        model(x)
        with CommDebugMode() as inner:
            model(x)
            model(x)
        model(x)
    assert inner.get_comm_counts() == {"differentiable_all_reduce": 2}
    assert outer.get_comm_counts() == {"differentiable_all_reduce": 2}
    assert len([s for s in outer.get_finished_spans() if s.name == "linear"]) == 4


def test_auto_engine_picks_hyper_parallel_when_importable(hp) -> None:
    assert [type(s).__name__ for s in default_sources(None)] == [
        "HyperParallelSource",
        "OptimizerStepSource",
        "GraphModeWatch",
    ]
    assert [type(s).__name__ for s in default_sources(None, "torch")] == [
        "TorchDTensorSource",
        "OptimizerStepSource",
        "GraphModeWatch",
    ]


def test_mindspore_platform_classes_are_patched_and_restored(hp) -> None:
    pytest.importorskip("mindspore", reason="mindspore is not installed (CI installs it)")
    graph = importlib.import_module("hyper_parallel.platform.mindspore.platform_graph").MindSporeGraphPlatform
    base = importlib.import_module("hyper_parallel.platform.mindspore.platform").MindSporePlatform
    before = _descriptors()
    with CommDebugMode():
        hooked = set(source_module.hooked_functions())
    _assert_restored(before)
    assert {f"MindSporePlatform.{n}" for n in PLATFORM_COLLECTIVES} <= hooked
    if hp.RELEASE != "newest":
        assert "MindSporeGraphPlatform.differentiable_all_reduce" in hooked  # its own override
        assert "MindSporePlatform.differentiable_all_to_all_single_async" not in hooked  # absent on MindSpore
    assert "all_reduce" not in vars(graph) and "all_reduce" in vars(base)  # inherited: patched on the base only
