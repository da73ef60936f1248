"""`hp-otel bench`: what tracing costs a training step, against torch's own tools.

Runs the TP-MLP step in one process over torch's fake process group (DTensor
dispatches and calls the same collectives; they return at once), so the step is pure
dispatch and ratios are stable run to run.  Variants run interleaved, round after
round, and each timed block starts after `gc.collect()`.
"""

from __future__ import annotations

import contextlib
import gc
import os
import random
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

from hp_otel.cli.progress import Progress, quiet


def fake_process_group(world_size: int) -> None:
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if not dist.is_initialized():
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)


def _variants(model: Any) -> tuple[dict[str, Callable[[], contextlib.AbstractContextManager[Any]]], dict[str, str]]:
    """The variants to time, and those left out with the reason (torch's debug modes need numpy)."""
    from hp_otel import CommDebugMode
    from hp_otel.sources.torch_dtensor import idle_modes

    variants: dict[str, Callable[[], contextlib.AbstractContextManager[Any]]] = {
        "untraced": contextlib.nullcontext,
        "hp_otel": lambda: CommDebugMode(module=model),
    }
    skipped: dict[str, str] = {}
    try:  # torch.distributed.tensor.debug imports numpy, which `pip install torch` does not install
        from torch.distributed.tensor.debug import CommDebugMode as TorchCommDebugMode

        variants["torch CommDebugMode"] = TorchCommDebugMode
    except ImportError as exc:
        skipped["torch CommDebugMode"] = f"cannot import it ({exc}); pip install numpy"
    try:
        from torch.utils._debug_mode import DebugMode

        variants["torch DebugMode"] = DebugMode
    except ImportError as exc:
        skipped["torch DebugMode"] = f"cannot import it ({exc})"
    variants["hp_otel, dispatch-mode hook"] = lambda: _hook_window(model, "dispatch")
    variants["hp_otel, kernel hook"] = lambda: _hook_window(model, "kernels")
    variants["hp_otel imported, inactive"] = contextlib.nullcontext
    variants["floor: bare torch modes"] = idle_modes
    return variants, skipped


@contextlib.contextmanager
def _hook_window(model: Any, hook: str) -> Iterator[Any]:
    """A window that sees collectives through `hook` (the env var is read at entry)."""
    from hp_otel import CommDebugMode
    from hp_otel.sources.torch_dtensor import HOOK_ENV

    saved = os.environ.get(HOOK_ENV)
    os.environ[HOOK_ENV] = hook
    try:
        mode = CommDebugMode(module=model)
        mode.__enter__()
    finally:
        if saved is None:
            del os.environ[HOOK_ENV]
        else:
            os.environ[HOOK_ENV] = saved
    try:
        yield mode
    finally:
        mode.__exit__(None, None, None)


def load_warning(threshold: float = 1.0) -> str | None:
    """A line to print when the machine is busy: timings taken under load are not comparable."""
    try:
        load = os.getloadavg()[0]
    except OSError:  # no load average on this platform
        return None
    if load <= threshold:
        return None
    return f"warning: 1-minute load average is {load:.2f} (> {threshold:g}): other processes skew these timings"


def _time_block(step: Callable[[], Any], make_ctx: Callable[[], Any], steps: int) -> float:
    """Median µs per step, each step in its own `with` block as a user would write it."""
    gc.collect()
    samples = []
    for _ in range(steps):
        t0 = time.perf_counter()
        with make_ctx():
            step()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples) * 1e6


def run_bench(
    rounds: int = 15,
    steps: int = 20,
    world_size: int = 2,
    hidden: int = 32,
    intermediate: int = 64,
    model_name: str = "mlp",
    progress: Progress = quiet,
) -> tuple[dict[str, float], dict[str, str]]:
    """Median µs per step for each variant, and the variants that cannot run here with the reason.

    `model_name`: "mlp" (the TP MLP) or "transformer" (the demo's 2-layer TP + SP transformer).
    """
    import torch

    from hp_otel import CommDebugMode
    from hp_otel.cli.tp_mlp import build_tp_mlp, train_step

    torch.set_num_threads(1)  # intra-op threads only add noise to a dispatch-bound step
    fake_process_group(world_size)
    if model_name == "transformer":
        from hp_otel.cli.tp_transformer import build_tp_transformer, demo_tokens

        model = build_tp_transformer(world_size)
        tokens = demo_tokens()

        def step() -> None:
            model(tokens).sum().backward()
            model.zero_grad(set_to_none=True)

    else:
        model = build_tp_mlp(world_size, hidden, intermediate)
        batch = torch.randn(8, hidden)

        def step() -> None:
            # A new leaf each step, as with a new batch: torch's CommDebugMode leaves a grad
            # hook on its window's inputs, and on a reused input those hooks would pile up
            # and slow every later variant.
            train_step(model, batch.detach().requires_grad_(True))
            model.zero_grad(set_to_none=True)

    variants, skipped = _variants(model)
    for name, reason in skipped.items():
        progress(f"left out {name!r}: {reason}")
    # "inactive": hp_otel imported and one mode entered and exited before; the variant itself is untraced.
    with CommDebugMode(module=model):
        step()
    for make_ctx in variants.values():  # warm-up
        _time_block(step, make_ctx, 3)
    per_round: dict[str, list[float]] = {name: [] for name in variants}
    order = list(variants)
    shuffle = random.Random(0).shuffle
    progress(f"{len(variants)} variants x {rounds} rounds x {steps} steps")
    warning = load_warning()
    if warning:
        progress(warning)
    for done in range(rounds):
        shuffle(order)  # no variant always runs right after another
        if done and done % max(1, rounds // 5) == 0:
            progress(f"round {done + 1}/{rounds}")
        for name in order:
            per_round[name].append(_time_block(step, variants[name], steps))
    return {name: statistics.median(values) for name, values in per_round.items()}, skipped


def format_results(results: dict[str, float], skipped: dict[str, str] | None = None) -> Iterator[str]:
    base = results["untraced"]
    yield f"{'variant':<30}{'median µs/step':>16}{'ratio':>9}"
    for name, value in results.items():
        yield f"{name:<30}{value:>16.0f}{value / base:>8.2f}x"
    for name, reason in (skipped or {}).items():
        yield f"{name:<30}{'skipped':>16}   {reason}"
