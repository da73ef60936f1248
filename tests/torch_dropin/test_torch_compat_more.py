"""`hp_otel.torch.CommDebugMode` beyond torch's tests: equal to torch where torch works,
and what the drop-in adds (spans, metrics, extra collectives, re-entry, backward-only
windows, never breaking training).  The referee for torch-shaped output is torch's own
CommDebugMode on the same run; for collectives torch does not count, a dispatch mode
written here.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.nn as nn
from torch.distributed._tools.mod_tracker import ModTracker
from torch.distributed.tensor import DeviceMesh, distribute_tensor
from torch.distributed.tensor.debug import CommDebugMode as TorchCommDebugMode
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.modules import module as module_globals
from torch.testing._internal.distributed._tensor.common_dtensor import MLPModule, ModelArgs, Transformer
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode_stack
from torch.utils.checkpoint import checkpoint

from hp_otel.testing import assert_collective_counts, assert_span_tree, metric_points
from hp_otel.torch import CommDebugMode
from hp_otel.torch.module_tracker import CompatModuleTracker
from hp_otel.torch.source import TorchRecordMode

pytestmark = pytest.mark.filterwarnings("ignore:Full backward hook is firing")

c10d_functional = torch.ops.c10d_functional


@pytest.fixture
def mesh(fake_world):
    return DeviceMesh("cpu", torch.arange(0, fake_world))


def _tp_mlp(mesh: DeviceMesh) -> nn.Module:
    torch.manual_seed(0)
    return parallelize_module(MLPModule("cpu"), mesh, {"net1": ColwiseParallel(), "net2": RowwiseParallel()})


class _Checkpointed(nn.Module):
    """An MLP whose forward is recomputed in backward (torch's ACTIVATION CHECKPOINTING section)."""

    def __init__(self, mesh: DeviceMesh) -> None:
        super().__init__()
        self.mlp = _tp_mlp(mesh)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return checkpoint(self.mlp, x, use_reentrant=False)


def _mlp_fwd_bwd(mesh: DeviceMesh) -> Callable[[], None]:
    model = _tp_mlp(mesh)
    x = torch.rand(8, 10, requires_grad=True)  # its gradient makes net1's backward all_reduce
    return lambda: model(x).sum().backward()


def _checkpointed_fwd_bwd(mesh: DeviceMesh) -> Callable[[], None]:
    model = _Checkpointed(mesh)
    x = torch.rand(8, 10, requires_grad=True)
    return lambda: model(x).sum().backward()


def _transformer_fwd_bwd(mesh: DeviceMesh) -> Callable[[], None]:
    torch.manual_seed(0)
    args = ModelArgs(dropout_p=0.0, use_attn_mask=False)  # runnable on CPU, see test_torch_compat.py
    model = Transformer.parallelize(Transformer(args), mesh, False)
    tokens = distribute_tensor(torch.randint(args.vocab_size, (8, 8)), device_mesh=mesh)

    def run() -> None:
        with sdpa_kernel(SDPBackend.MATH):
            model(tokens).sum().backward()

    return run


def _plain(counts: dict[str, dict[str, dict[Any, int]]]) -> dict[str, dict[str, dict[Any, int]]]:
    return {fqn: {phase: dict(c) for phase, c in phases.items()} for fqn, phases in counts.items()}


def _observed(mode: Any, tmp_path: Any, tag: str) -> dict[str, Any]:
    """Everything torch's API exposes, in comparable form."""
    out: dict[str, Any] = {
        "counts": dict(mode.get_comm_counts()),
        "total": mode.get_total_counts(),
        "module_counts": _plain(mode.comm_module_counts),
        "helper": mode.advanced_module_tracker.module_helper_dict,
        "parents": mode.advanced_module_tracker.module_parents_dict,
        "children": mode.advanced_module_tracker.parent_dict,
        "sharding": mode.get_sharding_info(),
        "parameters": {
            m: {n: (tuple(p.shape), type(p)) for n, p in ps.items()} for m, ps in mode.get_parameter_info().items()
        },
    }
    for level in range(4):
        out[f"table{level}"] = mode.generate_comm_debug_tracing_table(level)
        path = tmp_path / f"{tag}{level}.json"
        mode.generate_json_dump(str(path), noise_level=level)
        out[f"json{level}"] = json.loads(path.read_text())
    mode.log_comm_debug_tracing_table_to_file(str(tmp_path / f"{tag}.txt"), noise_level=2)
    out["file"] = (tmp_path / f"{tag}.txt").read_text()
    return out


@pytest.mark.parametrize("build", [_mlp_fwd_bwd, _checkpointed_fwd_bwd, _transformer_fwd_bwd])
def test_everything_equals_torch(build, mesh, tmp_path):
    """Counts, module counts, tracker dictionaries, tables (levels 0-3), log file and JSON dumps
    (levels 0-3) are exactly torch's on the same forward+backward."""
    build(mesh)()  # warm DTensor's caches: a cold first run issues extra local ops (sharding prop)
    observed = []
    for tag, cls in (("torch", TorchCommDebugMode), ("hp", CommDebugMode)):
        step = build(mesh)
        mode = cls()
        with mode:
            step()
        observed.append(_observed(mode, tmp_path, tag))
    ours, theirs = observed[1], observed[0]
    assert ours["total"] > 0
    for key in theirs:
        assert ours[key] == theirs[key], key


def test_backward_collectives_attributed_like_torch(mesh):
    """The backward all_reduce (gradient of net1's replicated input) is counted under
    backward, for net1 and its parents, as torch counts it."""
    step = _mlp_fwd_bwd(mesh)
    with CommDebugMode() as mode:
        step()
    counts = mode.comm_module_counts
    for fqn in ("Global", "MLPModule", "MLPModule.net1"):
        assert counts[fqn]["backward"][c10d_functional.all_reduce] == 1, fqn
    assert counts["MLPModule.net2"]["forward"][c10d_functional.all_reduce] == 1
    assert mode.get_total_counts() == 2


def test_same_window_yields_otel_spans_and_metrics(mesh):
    step = _mlp_fwd_bwd(mesh)
    mode = CommDebugMode()
    with mode:
        step()
    spans = mode.get_finished_spans()
    by_id = {span.context.span_id: span for span in spans}
    collectives = [span for span in spans if span.attributes.get("hp_otel.call.kind") == "collective"]
    assert len(collectives) == mode.get_total_counts() == 2

    def module_ancestors(span: Any) -> list[str]:
        names = []
        while span.parent is not None and span.parent.span_id in by_id:
            span = by_id[span.parent.span_id]
            if span.attributes.get("hp_otel.call.kind") == "module":
                names.append(f"{span.attributes['hp_otel.module.fqn']}/{span.attributes['hp_otel.phase']}")
        return names

    forward = next(s for s in collectives if s.attributes["hp_otel.phase"] == "forward")
    backward = next(s for s in collectives if s.attributes["hp_otel.phase"] == "backward")
    assert module_ancestors(forward)[:2] == ["MLPModule.net2/forward", "MLPModule/forward"]
    assert "MLPModule.net1/backward" in module_ancestors(backward)
    assert forward.attributes["hp_otel.collective.input.size"] == 8 * 10 * 4
    points = metric_points(mode.get_metric_reader(), "hp_otel.collective.calls")
    assert sum(p.value for p in points) >= 2
    assert {p.attributes["hp_otel.module.fqn"] for p in points} >= {"MLPModule.net2", "MLPModule.net1"}
    assert_collective_counts(mode.otel, {"all_reduce": 2}, normalized=True)
    assert_span_tree(
        mode,
        """
        MLPModule
          MLPModule.net1
          MLPModule.relu
          MLPModule.net2
            all_reduce
        """,
        kinds=["module", "collective"],
        phase="forward",
    )
    assert mode.get_callback_error_counts() == {}
    assert "Module(MLPModule.net2) [enter]" in mode.generate_otel_tracing_table(noise_level=2)


class _Referee(TorchDispatchMode):
    """Counts every collective op by its packet, knowing nothing of either CommDebugMode."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: dict[Any, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        packet = func._overloadpacket
        namespace = func.namespace
        if namespace in ("c10d", "_c10d_functional") and packet.__name__ not in (
            "wait_tensor",
            "_wrap_tensor_autograd",
        ):
            self.counts[packet] = self.counts.get(packet, 0) + 1
        return func(*args, **(kwargs or {}))


def test_collectives_torch_misses_are_counted_apart(fake_world):
    group = dist.distributed_c10d._get_default_group()

    def step() -> None:
        with _Referee() as referee:
            dist.barrier()
            torch.ops._c10d_functional.wait_tensor(
                torch.ops._c10d_functional.all_reduce_(torch.ones(4), "sum", group.group_name)
            )
            funcol.all_reduce(torch.ones(4), "sum", group).wait()
        return referee

    with TorchCommDebugMode() as theirs:
        step()
    with CommDebugMode() as ours:
        referee = step()
    assert referee.counts == {
        torch.ops.c10d.barrier: 1,
        torch.ops._c10d_functional.all_reduce_: 1,
        torch.ops._c10d_functional.all_reduce: 1,
    }
    assert dict(ours.get_comm_counts()) == dict(theirs.get_comm_counts()) == {c10d_functional.all_reduce: 1}
    assert ours.get_extra_comm_counts() == {torch.ops.c10d.barrier: 1, torch.ops._c10d_functional.all_reduce_: 1}
    assert ours.get_total_counts(include_extra=True) == sum(referee.counts.values())
    assert ours.get_comm_counts(include_extra=True)[torch.ops.c10d.barrier] == 1
    assert ours.get_comm_counts()[torch.ops.c10d.barrier] == 0  # torch-shaped counts stay torch's


def test_module_run_twice_counts_twice(mesh):
    """torch 2.13 raises IndexError here (2.14 lists each module twice); the drop-in counts both calls
    and lists each module once."""
    model = _tp_mlp(mesh)
    x = torch.rand(8, 10)
    with TorchCommDebugMode() as once:
        model(x)
    with CommDebugMode() as twice:
        model(x)
        model(x)
    assert {k: 2 * n for k, n in once.get_comm_counts().items()} == dict(twice.get_comm_counts())
    doubled = {
        f: {p: {k: 2 * n for k, n in c.items()} for p, c in ps.items()}
        for f, ps in _plain(once.comm_module_counts).items()
    }
    assert _plain(twice.comm_module_counts) == doubled
    assert twice.advanced_module_tracker.parent_dict == once.advanced_module_tracker.parent_dict
    assert twice.advanced_module_tracker.module_helper_dict == once.advanced_module_tracker.module_helper_dict


def test_backward_only_window_counts_under_global(mesh):
    """Forward before the window: no module hooks wrap it, so backward collectives are Global's (as in torch)."""
    model = _tp_mlp(mesh)
    results = []
    for cls in (TorchCommDebugMode, CommDebugMode):
        loss = model(torch.rand(8, 10, requires_grad=True)).sum()
        with cls() as mode:
            loss.backward()
        results.append(_plain(mode.comm_module_counts))
    assert results[0] == results[1] == {"Global": {"forward": {}, "backward": {c10d_functional.all_reduce: 1}}}


def test_forward_and_backward_in_two_windows_of_one_mode(mesh):
    """Backward in a later window than its forward: torch raises KeyError from inside autograd
    (the module's parents were cleared on re-entry); the drop-in counts it for the module and Global."""
    model = _tp_mlp(mesh)
    x = torch.rand(8, 10, requires_grad=True)
    mode = CommDebugMode()
    with mode:
        loss = model(x).sum()
    with mode:
        loss.backward()
    counts = _plain(mode.comm_module_counts)
    assert counts["Global"]["backward"] == {c10d_functional.all_reduce: 1}
    assert counts["MLPModule.net1"]["backward"] == {c10d_functional.all_reduce: 1}

    theirs = TorchCommDebugMode()
    with theirs:
        loss = model(x).sum()
    with pytest.raises(KeyError, match=r"MLPModule\.net1"), theirs:
        loss.backward()


def _hook_state() -> tuple[Any, ...]:
    return (
        dict(module_globals._global_forward_pre_hooks),
        dict(module_globals._global_forward_hooks),
        dict(module_globals._global_backward_pre_hooks),
        len(_get_current_dispatch_mode_stack()),
        torch._C._len_torch_function_stack(),
    )


def test_everything_restored_even_when_the_step_raises(mesh):
    model = _tp_mlp(mesh)
    before = _hook_state()
    module_hooks = {name: (dict(m._forward_hooks), dict(m._forward_pre_hooks)) for name, m in model.named_modules()}

    class Boom(Exception):
        pass

    def fail_in_net2(module: Any, args: Any, output: Any) -> None:
        raise Boom

    handle = model.net2.register_forward_hook(fail_in_net2)
    try:
        with pytest.raises(Boom), CommDebugMode() as mode:
            assert isinstance(mode, TorchDispatchMode)  # like torch's, it is the dispatch mode
            assert _get_current_dispatch_mode_stack()[-1] is mode
            model(torch.rand(8, 10))
    finally:
        handle.remove()
    assert _hook_state() == before
    assert {
        name: (dict(m._forward_hooks), dict(m._forward_pre_hooks)) for name, m in model.named_modules()
    } == module_hooks


def test_faults_in_the_drop_in_never_reach_training(mesh, monkeypatch):
    x = torch.rand(8, 10, requires_grad=True)
    model = _tp_mlp(mesh)
    expected = model(x)
    expected.sum().backward()
    expected, expected_grad = expected.detach().clone(), x.grad.clone()
    x.grad = None

    def broken(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("injected")

    monkeypatch.setattr(CompatModuleTracker, "_note_module", broken)
    monkeypatch.setattr(TorchRecordMode, "_count", broken)
    monkeypatch.setattr(ModTracker, "_maybe_set_engine_callback", broken)  # inside autograd's grad hooks
    with CommDebugMode() as mode:
        out = model(x)
        out.sum().backward()
    assert torch.equal(out.detach().clone(), expected)
    assert torch.equal(x.grad, expected_grad)
    faults = mode.get_callback_error_counts()
    assert faults["compat_module_forward_pre"] == 4  # MLPModule, net1, relu, net2
    assert faults["compat_collective_count"] >= 2  # every local op asks _count (the two all_reduces among them)
    assert faults["compat_module_backward_start"] >= 1
    assert mode.otel.get_comm_counts() == {"_c10d_functional.all_reduce": 2}  # hp_otel's counts unaffected


def test_bad_input_is_named(tmp_path):
    mode = CommDebugMode()
    with pytest.raises(ValueError, match=r"noise_level must be one of 0, 1, 2, 3 or None \(the default, 3\), got '3'"):
        mode.generate_comm_debug_tracing_table("3")
    with pytest.raises(TypeError, match="include_extra"):
        mode.get_comm_counts(include_extra="yes")
    with pytest.raises(IsADirectoryError, match="file_name"):
        mode.generate_json_dump(str(tmp_path))
    with pytest.raises(FileNotFoundError, match="file_name"):
        mode.log_comm_debug_tracing_table_to_file(str(tmp_path / "missing" / "log.txt"))
    assert repr(mode) == "CommDebugMode(get_total_counts()=0)"


HOSTILE = "blk\x1b]0;owned\x07\x1b[2J\x1b[31mred\x1b[0m\n  *all_reduce: 9\u202eelbat_层ü🙂"


class _HostileName(nn.Module):
    """A TP MLP under an attribute name carrying terminal escapes, a forged table line and a bidi override."""

    def __init__(self, mesh: DeviceMesh) -> None:
        super().__init__()
        self.add_module(HOSTILE, _tp_mlp(mesh))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return getattr(self, HOSTILE)(x)


def test_the_table_keeps_torchs_colours_and_escapes_the_names(mesh):
    """torch's table byte for byte, except that a name's control characters are written visibly
    (`\\x1b`, `\\n`, `\\u202e`): only the colour codes torch itself emits reach the terminal."""
    from hp_otel.common.safe_text import printable

    x = torch.rand(8, 10, requires_grad=True)
    _HostileName(mesh)(x).sum().backward()  # warm DTensor's caches
    tables = []
    for cls in (TorchCommDebugMode, CommDebugMode):
        model = _HostileName(mesh)
        mode = cls()
        with mode:
            model(x).sum().backward()
        tables.append([mode.generate_comm_debug_tracing_table(level) for level in range(4)])
    theirs, ours = tables
    assert any(HOSTILE in table for table in theirs)  # torch prints the name raw
    for level, (torch_table, table) in enumerate(zip(theirs, ours, strict=True)):
        assert table == torch_table.replace(HOSTILE, printable(HOSTILE)), level
        assert "\n  *all_reduce: 9" not in table and "\u202e" not in table and "\x07" not in table
    assert "\x1b[1;33m" in ours[0] and "层ü🙂" in ours[0]  # torch's own yellow, and ordinary Unicode, kept
