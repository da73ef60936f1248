"""The small transformer `hp-otel demo --model transformer` runs: 2 layers, tensor +
sequence parallel, the layout most TP training uses (torchtitan's plan).

Activations between layers are sharded along the sequence (`Shard(1)`); attention and
the feed-forward gather them (all_gather), run column- then row-sharded linears and
scatter the result back (reduce_scatter); backward does the mirror image. Attention
runs on local tensors (each rank its heads), so it needs no DTensor rule.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

DIM, HEADS, VOCAB, LAYERS = 16, 4, 32, 2


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
    def __init__(self, dim: int = DIM, heads: int = HEADS, vocab: int = VOCAB, layers: int = LAYERS) -> None:
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


def build_tp_transformer(world_size: int, seed: int = 0) -> nn.Module:
    """The transformer over a 1-D CPU mesh of the default process group (which must exist), TP + SP."""
    from torch.distributed.device_mesh import init_device_mesh

    torch.manual_seed(seed)
    mesh = init_device_mesh("cpu", (world_size,))
    return parallelize_tp_sp(Transformer(), mesh)


def parallelize_tp_sp(model: nn.Module, mesh: Any) -> nn.Module:
    """torchtitan's TP + sequence-parallel plan, applied over the 1-D `mesh`: the one plan of the
    demo's transformer and the llama (`llama.py`), so the two cannot drift apart.

    `model` has `tok_embeddings`, `norm`, `output` and `layers` of blocks with
    `attention_norm`, `attention` (wq, wk, wv, wo; `heads`), `ffn_norm` and `feed_forward`
    (w1, w2, and a SwiGLU's gate w3 if it has one, column-sharded as w1).
    """
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

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
        plan = {
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
        }
        if hasattr(layer.feed_forward, "w3"):
            plan["feed_forward.w3"] = ColwiseParallel()
        parallelize_module(layer, mesh, plan)
    return model


def demo_tokens(batch: int = 4, seq: int = 8, seed: int = 1) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(VOCAB, (batch, seq), generator=generator)
