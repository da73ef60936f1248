"""A small torchtitan-like llama on a 2-D (DP x TP) mesh: the step the scale harness records.

RMSNorm, attention (wq, wk, wv, wo) and a SwiGLU feed-forward (w1, w2, w3) per layer,
parallelised by torchtitan's TP + sequence-parallel plan on the mesh's `tp` dimension
(`tp_transformer.parallelize_tp_sp`, the demo transformer's plan, and its attention);
after backward the gradients are all-reduced over `dp` in one bucket, as DDP does. On
torch's fake process group every rank index runs the same collectives with its own groups.
Dimensions are small (the files' size comes from the spans, not the tensors).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from hp_otel.workloads.tp_transformer import Attention, parallelize_tp_sp


@dataclass(frozen=True)
class LlamaShape:
    layers: int = 8
    dim: int = 64
    heads: int = 8
    vocab: int = 128
    batch: int = 2
    seq: int = 16


class FeedForward(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        hidden = 4 * dim
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.attention_norm = nn.RMSNorm(dim)
        self.attention = Attention(dim, heads)
        self.ffn_norm = nn.RMSNorm(dim)
        self.feed_forward = FeedForward(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x))
        return h + self.feed_forward(self.ffn_norm(h))


class Llama(nn.Module):
    def __init__(self, shape: LlamaShape) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(shape.vocab, shape.dim)
        self.layers = nn.ModuleList(Block(shape.dim, shape.heads) for _ in range(shape.layers))
        self.norm = nn.RMSNorm(shape.dim)
        self.output = nn.Linear(shape.dim, shape.vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h)
        return self.output(self.norm(h))


def build_llama_step(dp: int, tp: int, shape: LlamaShape = LlamaShape(), seed: int = 0) -> tuple[nn.Module, Callable]:
    """The model over a (dp, tp) CPU mesh of the default process group (which must exist) and its step:
    forward, backward, one DP all_reduce of the gradients, zero_grad."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor

    if shape.heads % tp:
        raise ValueError(f"heads ({shape.heads}) must be a multiple of tp ({tp})")
    torch.manual_seed(seed)
    mesh = init_device_mesh("cpu", (dp, tp), mesh_dim_names=("dp", "tp"))
    model = Llama(shape)
    parallelize_tp_sp(model, mesh["tp"])
    dp_group = mesh.get_group("dp")
    generator = torch.Generator().manual_seed(seed + 1)
    tokens = torch.randint(shape.vocab, (shape.batch, shape.seq), generator=generator)

    def step() -> None:
        model(tokens).sum().backward()
        grads = [p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad for p in model.parameters()]
        bucket = torch.cat([g.reshape(-1) for g in grads if g is not None])
        dist.all_reduce(bucket, group=dp_group)  # DDP's gradient bucket, over the data-parallel replicas
        model.zero_grad(set_to_none=True)

    return model, step
