"""The transformer `python -m benchmarks --model dtensor-transformer` times: a reproduction of the
toy Transformer in PyTorch's DTensor tests (`common_dtensor.Transformer`, nanoGPT-like),
written here so the shipped CLI does not import `torch.testing._internal`.

What is reproduced is what the benchmark depends on: the module tree and its names
(`tok_embeddings`, `pos_embeddings`, `layers.<i>.attention.wq`, ..., `feed_forward.w2`,
`norm`, `output`, the output weight tied to the embedding), the ops of a step, and the
tensor-parallel plan, with or without sequence parallelism, so a step issues the same
collectives as torch's model under `Transformer.parallelize` (tests/bench/test_dtensor_transformer.py
compares the two).  Unlike the demo's transformer (`tp_transformer.py`), attention runs
on DTensors (the projections keep DTensor outputs), so SDPA needs a backend with a DTensor
rule: the benchmark selects the math one.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class TransformerShape:
    """The model's sizes; dropout 0 and no causal mask by default, as the benchmark runs it."""

    layers: int = 2
    vocab: int = 8
    max_seq: int = 16
    dim: int = 16
    heads: int = 4
    dropout: float = 0.0
    causal: bool = False


class Attention(nn.Module):
    def __init__(self, shape: TransformerShape) -> None:
        super().__init__()
        if shape.dim % shape.heads:
            raise ValueError(f"dim {shape.dim} is not a multiple of heads {shape.heads}")
        self.n_heads = shape.heads
        self.dropout_p = shape.dropout
        self.causal = shape.causal
        self.resid_dropout = nn.Dropout(shape.dropout)  # registered first: torch's module order
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(shape.dim, shape.dim, bias=False) for _ in range(4))

    def _heads(self, x: torch.Tensor, batch: int, seq: int) -> torch.Tensor:
        """(batch, seq, dim) -> (batch, heads, seq, head_dim)."""
        return x.view(batch, seq, self.n_heads, -1).transpose(1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.size()
        q, k, v = (self._heads(w(x), batch, seq) for w in (self.wq, self.wk, self.wv))
        dropout = self.dropout_p if self.training else 0
        attended = F.scaled_dot_product_attention(q, k, v, None, dropout, self.causal)
        return self.resid_dropout(self.wo(attended.transpose(1, 2).reshape(batch, seq, -1)))


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden: int, dropout: float) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, hidden)
        self.gelu = nn.GELU()
        self.w2 = nn.Linear(hidden, dim)
        self.resid_dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.resid_dropout(self.w2(self.gelu(self.w1(x))))


class TransformerBlock(nn.Module):
    def __init__(self, shape: TransformerShape) -> None:
        super().__init__()
        self.attention_norm = nn.LayerNorm(shape.dim)
        self.attention = Attention(shape)
        self.ffn_norm = nn.LayerNorm(shape.dim)
        self.feed_forward = FeedForward(shape.dim, 4 * shape.dim, shape.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x))
        return x + self.feed_forward(self.ffn_norm(x))


class Transformer(nn.Module):
    """Token and position embeddings, `layers` blocks, a final norm, an output tied to the embedding."""

    def __init__(self, shape: TransformerShape) -> None:
        super().__init__()
        self.shape = shape
        self.tok_embeddings = nn.Embedding(shape.vocab, shape.dim)
        self.pos_embeddings = nn.Embedding(shape.max_seq, shape.dim)
        self.dropout = nn.Dropout(shape.dropout)
        self.layers = nn.ModuleList(TransformerBlock(shape) for _ in range(shape.layers))
        self.norm = nn.LayerNorm(shape.dim)
        self.output = nn.Linear(shape.dim, shape.vocab, bias=False)
        self.output.weight = self.tok_embeddings.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        seq = tokens.size(1)
        if seq > self.shape.max_seq:
            raise ValueError(f"sequence of {seq} tokens is longer than max_seq {self.shape.max_seq}")
        h = self.tok_embeddings(tokens) + self.pos_embeddings(torch.arange(0, seq, device=tokens.device))
        h = self.dropout(h)
        for layer in self.layers:
            h = layer(h)
        return self.output(self.norm(h)).float()


def parallelize(model: Transformer, mesh: object, sequence_parallel: bool) -> Transformer:
    """Megatron-style tensor parallelism over a 1-D mesh: attention's projections and the
    feed-forward column- then row-sharded; with `sequence_parallel` the activations between
    them stay sharded along the sequence (norms and embeddings included).  The same plan as
    torch's `Transformer.parallelize(model, mesh, use_seq_parallel)`."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    between = Shard(1) if sequence_parallel else Replicate()  # the layout of activations between blocks
    root: dict[str, object] = {
        "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=between),
        "pos_embeddings": RowwiseParallel(
            input_layouts=Replicate(), output_layouts=Shard(0) if sequence_parallel else Replicate()
        ),
    }
    if sequence_parallel:
        root["norm"] = SequenceParallel()
    parallelize_module(model, mesh, root)  # type: ignore[arg-type]
    for layer in model.layers:
        plan: dict[str, object] = {}
        if sequence_parallel:  # the norms run on sequence shards; attention gathers its input
            plan["attention"] = PrepareModuleInput(input_layouts=Shard(1), desired_input_layouts=Replicate())
            plan["attention_norm"] = SequenceParallel()
            plan["ffn_norm"] = SequenceParallel()
        for name in ("wq", "wk", "wv"):  # DTensor outputs: attention computes on DTensors
            plan[f"attention.{name}"] = ColwiseParallel(use_local_output=False)
        plan["attention.wo"] = RowwiseParallel(output_layouts=Shard(1)) if sequence_parallel else RowwiseParallel()
        plan["feed_forward.w1"] = ColwiseParallel(input_layouts=Shard(1)) if sequence_parallel else ColwiseParallel()
        plan["feed_forward.w2"] = RowwiseParallel(output_layouts=Shard(1)) if sequence_parallel else RowwiseParallel()
        parallelize_module(layer, mesh, plan)  # type: ignore[arg-type]
    output = (
        ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate())
        if sequence_parallel
        else ColwiseParallel(output_layouts=Replicate())
    )
    parallelize_module(model.output, mesh, output)  # type: ignore[arg-type]
    model.output.weight = model.tok_embeddings.weight  # tied again: parameters and gradients shared
    return model
