"""Tensor + sequence parallel (torchtitan's plan) on a 2-layer transformer, one step traced.

Activations between layers are sharded along the sequence (`Shard(1)`); attention and the
feed-forward gather them (all_gather), run column- then row-sharded linears and scatter the
result back (reduce_scatter); backward does the mirror image. One process on torch's fake
process group (rank 0 of 2):

    .venv/bin/python examples/tp_sp_transformer.py
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from hp_otel import CommDebugMode


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.wq = nn.Linear(dim, dim, bias=False)
        self.wk = nn.Linear(dim, dim, bias=False)
        self.wv = nn.Linear(dim, dim, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        q, k, v = (w(x).view(batch, seq, self.heads, -1).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(batch, seq, -1))


class FeedForward(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, 4 * dim)
        self.w2 = nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.gelu(self.w1(x)))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.attention_norm = nn.LayerNorm(dim)
        self.attention = Attention(dim, heads)
        self.ffn_norm = nn.LayerNorm(dim)
        self.feed_forward = FeedForward(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x))
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    def __init__(self, dim: int = 16, heads: int = 4, vocab: int = 32, layers: int = 2) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.output = nn.Linear(dim, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h)
        return self.output(self.norm(h))


def parallelize(model: Transformer, mesh: DeviceMesh) -> Transformer:
    """The plan: sequence-sharded activations, column/row-sharded linears in each block."""
    parallelize_module(
        model,
        mesh,
        {
            "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
            "norm": SequenceParallel(),
            "output": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()),
        },
    )
    for layer in model.layers:
        layer.attention.heads //= mesh.size()  # each rank runs its share of the heads on local tensors
        parallelize_module(
            layer,
            mesh,
            {
                "attention_norm": SequenceParallel(),
                "attention": PrepareModuleInput(input_layouts=Shard(1), desired_input_layouts=Replicate()),
                "attention.wq": ColwiseParallel(),
                "attention.wk": ColwiseParallel(),
                "attention.wv": ColwiseParallel(),
                "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
                "ffn_norm": SequenceParallel(),
                "feed_forward": PrepareModuleInput(input_layouts=Shard(1), desired_input_layouts=Replicate()),
                "feed_forward.w1": ColwiseParallel(),
                "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
            },
        )
    return model


def main() -> None:
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    torch.manual_seed(0)
    model = parallelize(Transformer(), init_device_mesh("cpu", (2,)))
    tokens = torch.randint(32, (4, 8))

    with CommDebugMode(module=model) as mode:
        model(tokens).sum().backward()

    print(mode.get_comm_counts(normalized=True))
    for fqn, phases in sorted(mode.get_comm_module_counts().items()):  # who issued what, forward and backward
        if fqn.startswith("layers.0"):
            print(
                fqn, {phase: {op.split(".")[-1]: n for op, n in sorted(ops.items())} for phase, ops in phases.items()}
            )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
