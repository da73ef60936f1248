"""The training steps `python -m benchmarks` times: one forward + backward + zero_grad each.

All run in one process over torch's fake process group (DTensor dispatches and calls the
same collectives; they return at once). The small ones are pure dispatch, where tracing
costs most relative to the step; `realistic` is big enough that compute dominates, as in
real training, so its ratio shows what a user would see. The `llama-*` workloads are the
torchtitan-like llama (`benchmarks.models.llama`) at several depths and widths, with TP + sequence
parallel and without TP (no collectives): runs that differ in module calls and collectives,
from which `events` solves each variant's cost per module call, per collective and
per window.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hp_otel.workloads.process_groups import fake_process_group

WORLD_SIZE = 2


@dataclass(frozen=True)
class WorkloadSpec:
    """What `--help` says about a workload, and its default rounds x steps."""

    summary: str
    rounds: int
    steps: int
    family: str = ""  # workloads of one family are solved together for per-event costs (events)


@dataclass(frozen=True)
class LlamaSize:
    layers: int
    dim: int
    tp: bool  # False: the plain model, no DTensor and no collective


# name -> size; "-notp" is the same model unparallelised
LLAMA_SIZES: dict[str, LlamaSize] = {
    f"llama-L{layers}-d{dim}{'' if tp else '-notp'}": LlamaSize(layers, dim, tp)
    for tp in (True, False)
    for layers, dim in ((2, 64), (8, 64), (2, 256), (8, 256))
}


def _llama_spec(size: LlamaSize) -> WorkloadSpec:
    how = "TP + sequence parallel (torchtitan's plan), then a DP all_reduce of the grads" if size.tp else "no TP"
    return WorkloadSpec(
        f"the torchtitan-like llama, {size.layers} layers, dim {size.dim}, 8 heads, batch 2 x seq 16, {how}",
        rounds=11 if size.layers * size.dim <= 512 else 7,
        steps=5,
        family="llama",
    )


WORKLOADS: dict[str, WorkloadSpec] = {
    "mlp": WorkloadSpec("TP MLP 32->64->32, batch 8 (2 all_reduce a step)", rounds=15, steps=20),
    "transformer": WorkloadSpec("the demo's 2-layer TP + sequence-parallel transformer, dim 16", rounds=15, steps=10),
    "dtensor-transformer": WorkloadSpec(
        "a reproduction of PyTorch's test Transformer (common_dtensor's modules, ops and TP plan), 2 layers, "
        "dim 16, batch 8 x seq 8, TP",
        rounds=15,
        steps=10,
    ),
    "dtensor-transformer-sp": WorkloadSpec("the dtensor-transformer, TP + sequence parallel", rounds=15, steps=10),
    "medium": WorkloadSpec(
        "the dtensor-transformer, 2 layers, dim 256, 8 heads, batch 4 x seq 64, TP + sequence parallel "
        "(dispatch and compute about even)",
        rounds=11,
        steps=5,
    ),
    "realistic": WorkloadSpec(
        "the dtensor-transformer, 2 layers, dim 1024, 16 heads, batch 4 x seq 64, TP + sequence parallel "
        "(compute dominates: about 0.3 s a step on 2 cores)",
        rounds=5,
        steps=3,
    ),
    **{name: _llama_spec(size) for name, size in LLAMA_SIZES.items()},
}
# `--model llama`: the sizes the per-event costs are solved from (layers and TP differ; one wider)
GROUPS: dict[str, tuple[str, ...]] = {
    "llama": ("llama-L2-d64", "llama-L8-d64", "llama-L2-d256", "llama-L2-d64-notp", "llama-L8-d64-notp"),
}
# Former names (when the workload ran PyTorch's own test Transformer): still accepted.
ALIASES: dict[str, str] = {
    "torch-transformer": "dtensor-transformer",
    "torch-transformer-sp": "dtensor-transformer-sp",
}


@dataclass
class Workload:
    """A built model and its step; `step()` runs forward, backward and zero_grad."""

    name: str
    summary: str
    model: Any
    step: Callable[[], None]
    rounds: int
    steps: int
    family: str = ""  # WorkloadSpec.family


def workload_names(model: str) -> list[str]:
    """The workloads `--model` names: "all" every one, a group (GROUPS) its members, else the one."""
    if model == "all":
        return list(WORKLOADS)
    return list(GROUPS.get(model, (model,)))


def build_workload(name: str) -> Workload:
    """Build workload `name` (a key of WORKLOADS, or an alias) over the fake process group (started if needed)."""
    name = ALIASES.get(name, name)
    if name not in WORKLOADS:
        raise ValueError(f"workload must be one of {', '.join(WORKLOADS)}, got {name!r}")
    import torch

    torch.set_num_threads(1)  # intra-op threads only add noise (and take cores other jobs use)
    fake_process_group(WORLD_SIZE)
    spec = WORKLOADS[name]
    builders: dict[str, Callable[[], tuple[Any, Callable[[], None]]]] = {
        "mlp": _mlp,
        "transformer": _demo_transformer,
        "dtensor-transformer": lambda: _dtensor_transformer(sequence_parallel=False),
        "dtensor-transformer-sp": lambda: _dtensor_transformer(sequence_parallel=True),
        "medium": lambda: _dtensor_transformer(sequence_parallel=True, dim=256, heads=8, batch=4, seq=64, vocab=64),
        "realistic": lambda: _dtensor_transformer(
            sequence_parallel=True, dim=1024, heads=16, batch=4, seq=64, vocab=64
        ),
    }
    for llama_name, size in LLAMA_SIZES.items():
        builders[llama_name] = lambda size=size: _llama(size)  # type: ignore[misc]
    model, step = builders[name]()
    return Workload(name, spec.summary, model, step, spec.rounds, spec.steps, spec.family)


def _mlp() -> tuple[Any, Callable[[], None]]:
    import torch

    from hp_otel.workloads.tp_mlp import build_tp_mlp, train_step

    hidden = 32
    model = build_tp_mlp(WORLD_SIZE, hidden, 64)
    batch = torch.randn(8, hidden)

    def step() -> None:
        # A new leaf each step, as with a new batch: torch's CommDebugMode leaves a grad
        # hook on its window's inputs, and on a reused input those hooks would pile up
        # and slow every later variant.
        train_step(model, batch.detach().requires_grad_(True))
        model.zero_grad(set_to_none=True)

    return model, step


def _demo_transformer() -> tuple[Any, Callable[[], None]]:
    from hp_otel.workloads.tp_transformer import build_tp_transformer, demo_tokens

    model = build_tp_transformer(WORLD_SIZE)
    tokens = demo_tokens()

    def step() -> None:
        model(tokens).sum().backward()
        model.zero_grad(set_to_none=True)

    return model, step


def _dtensor_transformer(
    *, sequence_parallel: bool, dim: int = 16, heads: int = 4, batch: int = 8, seq: int = 8, vocab: int = 8
) -> tuple[Any, Callable[[], None]]:
    """The reproduction of torch's test Transformer (`dtensor_transformer.py`), parallelised by the same plan.

    No causal mask and SDPA's math backend: on CPU the flash/efficient kernels have no
    DTensor rule (see tests/torch_dropin/test_torch_compat.py); dropout 0 keeps steps identical.
    """
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import distribute_tensor
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from benchmarks.models.dtensor_transformer import Transformer, TransformerShape, parallelize

    torch.manual_seed(0)
    mesh = init_device_mesh("cpu", (WORLD_SIZE,))
    shape = TransformerShape(layers=2, vocab=vocab, max_seq=max(seq, 16), dim=dim, heads=heads)
    model = parallelize(Transformer(shape), mesh, sequence_parallel)
    tokens = distribute_tensor(torch.randint(vocab, (batch, seq)), device_mesh=mesh)

    def step() -> None:
        with sdpa_kernel(SDPBackend.MATH):
            model(tokens).sum().backward()
        model.zero_grad(set_to_none=True)

    return model, step


def _llama(size: LlamaSize) -> tuple[Any, Callable[[], None]]:
    """The llama step (forward, backward, the DP all_reduce, zero_grad) over TP 2 of the fake world,
    or without TP: the plain model's forward, backward and zero_grad, no collective."""
    import torch

    from benchmarks.models.llama import Llama, LlamaShape, build_llama_step

    shape = LlamaShape(layers=size.layers, dim=size.dim)
    if size.tp:
        return build_llama_step(1, WORLD_SIZE, shape)
    torch.manual_seed(0)
    model = Llama(shape)
    tokens = torch.randint(shape.vocab, (shape.batch, shape.seq), generator=torch.Generator().manual_seed(1))

    def step() -> None:
        model(tokens).sum().backward()
        model.zero_grad(set_to_none=True)

    return model, step
