"""The benchmark's dtensor-transformer reproduces PyTorch's test Transformer (common_dtensor):
same modules and parameters, same step result, same collectives per module and phase, with
and without sequence parallelism.  (Tests may import torch.testing; the shipped CLI must not.)"""

from __future__ import annotations

import pytest
import torch
from referee import Referee
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, distribute_tensor
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.testing._internal.distributed._tensor.common_dtensor import ModelArgs
from torch.testing._internal.distributed._tensor.common_dtensor import Transformer as TorchTransformer

from benchmarks.models.dtensor_transformer import Transformer, TransformerShape, parallelize


def _pair(vocab: int = 8, dim: int = 16, heads: int = 4) -> tuple[Transformer, TorchTransformer]:
    """Ours and torch's, each built from the same seed."""
    torch.manual_seed(0)
    ours = Transformer(TransformerShape(vocab=vocab, dim=dim, heads=heads))
    torch.manual_seed(0)
    args = ModelArgs(n_layers=2, vocab_size=vocab, max_seq_len=16, dim=dim, n_heads=heads, dropout_p=0.0)
    args.use_attn_mask = False
    return ours, TorchTransformer(args)


def _tokens(vocab: int = 8) -> torch.Tensor:
    return torch.randint(vocab, (8, 8), generator=torch.Generator().manual_seed(1))


def _layout(model) -> list[tuple[str, tuple[int, ...], str]]:
    return [
        (name, tuple(p.shape), repr(p.placements) if isinstance(p, DTensor) else "")
        for name, p in model.named_parameters()
    ]


def test_same_modules_parameters_and_step_as_torchs_test_transformer() -> None:
    ours, theirs = _pair()
    assert [name for name, _ in ours.named_modules()] == [name for name, _ in theirs.named_modules()]
    assert _layout(ours) == _layout(theirs)
    assert ours.output.weight is ours.tok_embeddings.weight  # tied, as torch's
    for model in (ours, theirs):
        model(_tokens()).sum().backward()
    torch.testing.assert_close(ours(_tokens()), theirs(_tokens()), rtol=0, atol=0)  # same init, same ops
    for (name, p), (_, q) in zip(ours.named_parameters(), theirs.named_parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=0, atol=0, msg=name)


@pytest.mark.parametrize("sequence_parallel", [False, True], ids=["tp", "tp+sp"])
def test_same_plan_and_collectives_as_torchs_parallelize(fake_world, sequence_parallel) -> None:
    """The fake process group moves no data, so collectives are compared, not values."""
    mesh = init_device_mesh("cpu", (fake_world,))
    ours, theirs = _pair()
    ours = parallelize(ours, mesh, sequence_parallel)
    theirs = TorchTransformer.parallelize(theirs, mesh, sequence_parallel)
    assert _layout(ours) == _layout(theirs)
    assert ours.output.weight is ours.tok_embeddings.weight
    tokens = distribute_tensor(_tokens(), mesh)
    referees = []
    for model in (ours, theirs):
        with Referee(model) as referee, sdpa_kernel(SDPBackend.MATH):
            model(tokens).sum().backward()
        referees.append(referee)
    assert referees[0].counts == referees[1].counts and sum(referees[0].counts.values()) > 0
    assert referees[0].module_counts_dict() == referees[1].module_counts_dict()
    reduce_scatter = "_c10d_functional.reduce_scatter_tensor"
    assert (reduce_scatter in referees[0].counts) == sequence_parallel  # SP scatters back to sequence shards


def test_heads_must_divide_dim() -> None:
    with pytest.raises(ValueError, match="not a multiple"):
        Transformer(TransformerShape(dim=10, heads=4))
