"""Backward attribution by autograd node, checked against an independent referee.

One process over torch's fake process group.  PyTorch's own test Transformer
(`common_dtensor.Transformer`) with tensor parallel and tensor + sequence parallel,
forward and backward in one window; attention runs on local tensors (DTensor has no
CPU rule for it), as torch's float64 tests do.  The referee (`tests/support/referee.py`) tags
autograd nodes by walking the graph; hp_otel numbers them by sequence intervals.
"""

from __future__ import annotations

import pytest
import torch
from referee import Referee
from span_counts import assert_counts_add_up, module_counts_from_spans
from torch import nn
from torch.distributed.tensor.debug import CommDebugMode as TorchCommDebugMode

from hp_otel import CommDebugMode
from hp_otel.spans.call_tree import build_call_tree

common_dtensor = pytest.importorskip(
    "torch.testing._internal.distributed._tensor.common_dtensor",
    reason="torch's test Transformer needs the `expecttest` package (pip install expecttest)",
)


def _torch_module_counts(torch_mode: TorchCommDebugMode, root: str) -> dict[str, dict[str, dict[str, int]]]:
    """torch's `comm_module_counts` in hp_otel's form: named_modules() names, op names as strings."""
    out: dict[str, dict[str, dict[str, int]]] = {}
    for key, phases in torch_mode.comm_module_counts.items():
        if key == "Global":
            continue
        fqn = "(root)" if key == root else key.removeprefix(root + ".")
        counts = {
            phase: {str(op).replace("c10d_functional.", "_c10d_functional."): n for op, n in ops.items()}
            for phase, ops in phases.items()
            if phase in ("forward", "backward") and ops
        }
        if counts:
            out[fqn] = counts
    return out


def _transformer(fake_world: int, sequence_parallel: bool) -> tuple[nn.Module, torch.Tensor]:
    from torch.distributed.device_mesh import init_device_mesh

    args = common_dtensor.ModelArgs(dropout_p=0.0)
    torch.manual_seed(0)
    model = common_dtensor.Transformer(args).to(torch.float64)
    mesh = init_device_mesh("cpu", (fake_world,))
    model = common_dtensor.Transformer.parallelize(model, mesh, sequence_parallel, local_output_for_attn=True)
    return model, torch.randint(args.vocab_size, (8, 8))


def _backward_tree(mode: CommDebugMode) -> dict[str, tuple[str | None, list[str]]]:
    """fqn of each backward module span -> (fqn of the module span it sits in, its collectives' names)."""
    out: dict[str, tuple[str | None, list[str]]] = {}

    def walk(record, parent: str | None) -> None:
        if record.kind == "module" and record.phase == "backward":
            out[record.fqn] = (parent, [c.name for c in record.children if c.kind == "collective"])
            parent = record.fqn
        for child in record.children:
            walk(child, parent)

    for root in build_call_tree(mode.get_finished_spans()):
        walk(root, None)
    return out


@pytest.mark.filterwarnings("ignore:Full backward hook")
@pytest.mark.parametrize("sequence_parallel", [False, True], ids=["tp", "tp_sp"])
def test_transformer_counts_match_referee_and_torch(fake_world, sequence_parallel) -> None:
    model, tokens = _transformer(fake_world, sequence_parallel)
    referee = Referee(model)
    with CommDebugMode(module=model) as mode, TorchCommDebugMode() as torch_mode, referee:
        model(tokens).sum().backward()

    ours = mode.get_comm_module_counts()
    assert mode.get_comm_counts() == dict(referee.counts)
    assert mode.get_total_counts() == sum(referee.counts.values()) == torch_mode.get_total_counts()
    assert mode.get_comm_counts() == {
        str(op).replace("c10d_functional.", "_c10d_functional."): n for op, n in torch_mode.get_comm_counts().items()
    }
    assert ours == referee.module_counts_dict()
    theirs = _torch_module_counts(torch_mode, "Transformer")
    if not sequence_parallel:
        assert ours == theirs
    else:
        # torch keeps wq's backward open until attention's input gradient is complete, so the
        # reduce_scatter of attention's own input (PrepareModuleInput) lands in wq; the node
        # that runs it was made by attention's forward, as the referee confirms.
        for layer in ("layers.0", "layers.1"):
            assert theirs.pop(f"{layer}.attention.wq") == {"backward": {"_c10d_functional.reduce_scatter_tensor": 1}}
            assert ours[f"{layer}.attention"]["backward"]["_c10d_functional.reduce_scatter_tensor"] == 1
        assert ours == theirs
    assert mode.get_callback_error_counts() == {}
    # Every backward collective ran in an autograd node the referee could name.
    assert referee.backward_nodes and all(referee.backward_nodes)

    # The siblings that share attention's input each own exactly their own backward collective.
    for layer in ("layers.0", "layers.1"):
        for proj in ("wq", "wk", "wv"):
            expected = {} if sequence_parallel else {"_c10d_functional.all_reduce": 1}
            assert ours.get(f"{layer}.attention.{proj}", {}).get("backward", {}) == expected
    # The embeddings' inputs need no gradient: they must not collect later modules' collectives.
    backward_embeddings = ours.get("tok_embeddings", {}).get("backward", {})
    assert backward_embeddings == ({"_c10d_functional.all_gather_into_tensor": 1} if sequence_parallel else {})


@pytest.mark.parametrize("sequence_parallel", [False, True], ids=["tp", "tp_sp"])
def test_backward_spans_follow_the_node_rule(fake_world, sequence_parallel) -> None:
    model, tokens = _transformer(fake_world, sequence_parallel)
    with CommDebugMode(module=model) as mode:
        model(tokens).sum().backward()
    tree = _backward_tree(mode)
    for layer in ("layers.0", "layers.1"):
        for proj in ("wq", "wk", "wv"):
            parent, collectives = tree[f"{layer}.attention.{proj}"]
            assert parent == f"{layer}.attention"  # siblings follow each other, none inside another
            assert collectives == []  # the collective sits under its redistribute
    assert tree["tok_embeddings"][0] == "(root)"
    # The span tree agrees with the counts: each backward collective under its owner.
    owners = {
        fqn: sum(1 for _ in spans)
        for fqn, spans in {
            r.fqn: [c for c in _walk(r) if c.kind == "collective"]
            for r in _walk_all(mode)
            if r.kind == "module" and r.phase == "backward"
        }.items()
    }
    # each backward collective names, as its module, the innermost backward module span around it
    for record in _walk_all(mode):
        if record.kind == "module" and record.phase == "backward":
            for child in _walk_direct_collectives(record):
                assert child.attributes["hp_otel.collective.module"] == record.fqn
    counts = mode.get_comm_module_counts()
    for fqn in set(counts) | set(owners):
        assert owners.get(fqn, 0) == sum(counts.get(fqn, {}).get("backward", {}).values()), fqn


def _walk(record):
    yield record
    for child in record.children:
        yield from _walk(child)


def _walk_direct_collectives(record):
    """Collectives under `record` with no module span between (through redistributes)."""
    for child in record.children:
        if child.kind == "collective":
            yield child
        elif child.kind != "module":
            yield from _walk_direct_collectives(child)


def _walk_all(mode: CommDebugMode):
    for root in build_call_tree(mode.get_finished_spans()):
        yield from _walk(root)


class _Reused(nn.Module):
    """A TP block called twice, and a TP branch whose output never reaches the loss."""

    def __init__(self) -> None:
        from hp_otel.workloads.tp_mlp import MLP

        super().__init__()
        self.block = MLP()
        self.unused = MLP()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.unused(x)  # computed, never used: its backward never runs
        return self.block(self.block(x))


def test_reused_module_and_unused_branch_match_referee(fake_world) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = init_device_mesh("cpu", (fake_world,))
    plan = {
        f"{m}.{fc}": style
        for m in ("block", "unused")
        for fc, style in (("fc1", ColwiseParallel()), ("fc2", RowwiseParallel()))
    }
    model = parallelize_module(_Reused(), mesh, plan)
    x = torch.randn(4, 16, requires_grad=True)
    referee = Referee(model)
    with CommDebugMode(module=model) as mode, referee:
        model(x).sum().backward()
    ours = mode.get_comm_module_counts()
    assert ours == referee.module_counts_dict()
    assert ours["block.fc1"]["backward"] == {"_c10d_functional.all_reduce": 2}  # one per call
    assert "backward" not in ours["unused"]
    assert mode.get_comm_counts() == dict(referee.counts)
    # Two calls, two backward spans of block.fc1, one after the other.
    fc1 = [r for r in _walk_all(mode) if r.kind == "module" and r.phase == "backward" and r.fqn == "block.fc1"]
    assert len(fc1) == 2


@pytest.fixture
def reentrant_checkpoint(monkeypatch):
    """torch's test Transformer checkpoints with use_reentrant=False; this makes it reentrant."""
    import torch.utils.checkpoint as checkpoint_module

    original = checkpoint_module.checkpoint

    def reentrant(function, *args, use_reentrant=None, **kwargs):
        return original(function, *args, use_reentrant=True, **kwargs)

    monkeypatch.setattr(checkpoint_module, "checkpoint", reentrant)


@pytest.mark.parametrize(
    ("reentrant", "sequence_parallel"),
    [(False, False), (False, True), (True, False)],
    ids=["non_reentrant-tp", "non_reentrant-tp_sp", "reentrant-tp"],
)
@pytest.mark.filterwarnings("ignore:Full backward hook")
def test_activation_checkpointing_recompute_matches_referee(fake_world, request, reentrant, sequence_parallel) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    if reentrant:
        request.getfixturevalue("reentrant_checkpoint")
    args = common_dtensor.ModelArgs(dropout_p=0.0, checkpoint_activations=True)
    torch.manual_seed(0)
    model = common_dtensor.Transformer(args).to(torch.float64)
    mesh = init_device_mesh("cpu", (fake_world,))
    model = common_dtensor.Transformer.parallelize(model, mesh, sequence_parallel, local_output_for_attn=True)
    tokens = torch.randint(args.vocab_size, (8, 8))
    referee = Referee(model)
    with CommDebugMode(module=model) as mode, TorchCommDebugMode() as torch_mode, referee:
        model(tokens).sum().backward()

    ours = mode.get_comm_module_counts()
    assert mode.get_comm_counts() == dict(referee.counts)
    assert mode.get_total_counts() == torch_mode.get_total_counts()  # torch counts them all too (as backward)
    assert ours == referee.module_counts_dict()
    assert mode.get_callback_error_counts() == {}
    # The recomputed forward's collectives are counted, under "recompute", for the checkpointed
    # layers and the calls whose backward spans hold them (the root's, whose backward caused the
    # recompute): every call's counts add up; forward and backward counts are those without
    # checkpointing.
    assert ours == module_counts_from_spans(mode.get_finished_spans())
    assert_counts_add_up(mode)
    recomputed = {fqn for fqn, phases in ours.items() if "recompute" in phases}
    assert {"(root)", "layers.0", "layers.1"} <= recomputed
    plain_model, plain_tokens = _transformer(fake_world, sequence_parallel)
    with CommDebugMode(module=plain_model) as plain:
        plain_model(plain_tokens).sum().backward()
    without = {fqn: {p: c for p, c in phases.items() if p != "recompute"} for fqn, phases in ours.items()}
    assert without == plain.get_comm_module_counts()
    # Spans: the recompute is phase "recompute"; the table shows its modules from level 2 on.
    phases = {
        s.attributes["hp_otel.phase"]
        for s in mode.get_finished_spans()
        if s.attributes["hp_otel.call.kind"] == "collective"
    }
    assert phases == {"forward", "backward", "recompute"}
    assert "Module(layers.0) [recompute]" in mode.generate_comm_debug_tracing_table(noise_level=3)
    assert "Module(layers.0) [recompute]" in mode.generate_comm_debug_tracing_table(noise_level=2)
    assert "[recompute]" not in mode.generate_comm_debug_tracing_table(noise_level=1)
    assert "error" not in mode.generate_comm_debug_tracing_table(noise_level=3)  # an early stop is no error


def test_demo_transformer_matches_referee(fake_world) -> None:
    """The transformer `hp-otel demo --model transformer` runs (TP + sequence parallel)."""
    from hp_otel.workloads.tp_transformer import build_tp_transformer, demo_tokens

    model = build_tp_transformer(fake_world)
    referee = Referee(model)
    with CommDebugMode(module=model) as mode, referee:
        model(demo_tokens()).sum().backward()
    assert mode.get_comm_counts() == dict(referee.counts)
    assert mode.get_comm_counts(normalized=True) == {"all_gather": 11, "reduce_scatter": 10}
    assert mode.get_comm_module_counts() == referee.module_counts_dict()
    assert mode.get_callback_error_counts() == {}
