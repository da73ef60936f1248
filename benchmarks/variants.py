"""The ways `python -m benchmarks` runs a step: untraced, under hp_otel's modes, under torch's tools.

Each variant is a factory for the context one step runs in (a new one per step, as a
user writes `with CommDebugMode(...): step()`), plus an optional context around a whole
timed block for set-up a user pays once (the always-on instrumentor).
"""

from __future__ import annotations

import contextlib
import inspect
import itertools
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

StepContext = Callable[[], contextlib.AbstractContextManager[Any]]

UNTRACED = "untraced"
HP_OTEL = "hp_otel"
HP_OTEL_READ = "hp_otel, spans read"
HP_OTEL_EXPORTING = "hp_otel, exporting provider"
HP_OTEL_KEPT = "hp_otel, hooks kept"
HP_OTEL_STACK = "hp_otel, stack=True"
HP_OTEL_NO_OPS = "hp_otel, ops=False"
COUNTS_ONLY = "hp_otel, counts only"
COUNTS_ONLY_KEPT = "hp_otel, counts only, hooks kept"
COUNTS_ONLY_DEPTH_1 = "hp_otel, counts only, metric depth 1"
HP_OTEL_DEPTH_2 = "hp_otel, module_depth=2"
INSTRUMENTOR = "hp_otel instrumentor, unsampled"
DISPATCH_HOOK = "hp_otel, dispatch-mode hook"
KERNEL_HOOK = "hp_otel, kernel hook"
INACTIVE = "hp_otel imported, inactive"
TORCH_COMM = "torch CommDebugMode"
TORCH_DEBUG = "torch DebugMode"
PROFILER = "torch.profiler, record_shapes"
FLOOR = "floor: bare torch modes"
# Every variant's name, in the tables' order (`--variant`'s help lists them).
VARIANT_NAMES = (
    UNTRACED,
    HP_OTEL,
    HP_OTEL_READ,
    HP_OTEL_EXPORTING,
    HP_OTEL_STACK,
    HP_OTEL_NO_OPS,
    HP_OTEL_KEPT,
    COUNTS_ONLY,
    COUNTS_ONLY_KEPT,
    COUNTS_ONLY_DEPTH_1,
    HP_OTEL_DEPTH_2,
    INSTRUMENTOR,
    DISPATCH_HOOK,
    KERNEL_HOOK,
    INACTIVE,
    TORCH_COMM,
    TORCH_DEBUG,
    PROFILER,
    FLOOR,
)


@dataclass
class Variant:
    """How to run one step; `around_block` wraps each timed block (outside the timed steps).

    `drain` does now, on the calling thread, the work a step left to another thread (a batch
    processor's export): the instruction count calls it after each step, so that work is
    counted in the step that made it every run, not when that thread happens to run."""

    name: str
    step_context: StepContext
    around_block: StepContext = contextlib.nullcontext
    records_events: bool = False  # an hp_otel recorder runs: the table gives µs per recorded event
    drain: Callable[[], None] = lambda: None


def build_variants(model: Any) -> tuple[list[Variant], dict[str, str]]:
    """The variants that can run here, and those that cannot with the reason."""
    import hp_otel
    from hp_otel import CommDebugMode
    from hp_otel.sources.pytorch.dtensor import idle_modes

    variants = [
        Variant(UNTRACED, contextlib.nullcontext, around_block=_nothing_installed),
        Variant(HP_OTEL, lambda: CommDebugMode(module=model), records_events=True),
        Variant(HP_OTEL_READ, lambda: _spans_read(model), records_events=True),
        _exporting_variant(model),
    ]
    skipped: dict[str, str] = {}
    if "stack" in inspect.signature(CommDebugMode).parameters:  # where each collective was called
        variants.append(Variant(HP_OTEL_STACK, lambda: CommDebugMode(module=model, stack=True), records_events=True))
    else:  # an hp_otel from before `stack=` (comparing releases)
        skipped[HP_OTEL_STACK] = "this hp_otel has no stack="
    if "ops" in inspect.signature(CommDebugMode).parameters:  # what the op spans cost
        variants.append(Variant(HP_OTEL_NO_OPS, lambda: CommDebugMode(module=model, ops=False), records_events=True))
    else:
        skipped[HP_OTEL_NO_OPS] = "this hp_otel has no ops="
    if hasattr(hp_otel, "install"):
        variants.append(Variant(HP_OTEL_KEPT, lambda: CommDebugMode(module=model), _hooks_kept, True))
    else:  # an hp_otel from before `install()` (comparing releases)
        skipped[HP_OTEL_KEPT] = "this hp_otel has no install()"
    variants.append(Variant(COUNTS_ONLY, lambda: CommDebugMode(module=model, record_spans=False), records_events=True))
    if hasattr(hp_otel, "install"):
        variants.append(
            Variant(COUNTS_ONLY_KEPT, lambda: CommDebugMode(module=model, record_spans=False), _hooks_kept, True)
        )
    else:
        skipped[COUNTS_ONLY_KEPT] = "this hp_otel has no install()"
    # labelled as the instrumentor labels: a counts-only window hooks only as deep as its labels
    variants.append(
        Variant(
            COUNTS_ONLY_DEPTH_1,
            lambda: CommDebugMode(module=model, record_spans=False, metric_module_depth=1),
            records_events=True,
        )
    )
    if "module_depth" in inspect.signature(CommDebugMode).parameters:  # block-level spans
        variants.append(
            Variant(HP_OTEL_DEPTH_2, lambda: CommDebugMode(module=model, module_depth=2), records_events=True)
        )
    else:
        skipped[HP_OTEL_DEPTH_2] = "this hp_otel has no module_depth="
    variants += [
        _instrumentor_variant(model),
        Variant(DISPATCH_HOOK, lambda: _hook_window(model, "dispatch"), records_events=True),
        Variant(KERNEL_HOOK, lambda: _hook_window(model, "kernels"), records_events=True),
        Variant(INACTIVE, contextlib.nullcontext, around_block=_after_a_window),
    ]
    try:  # torch.distributed.tensor.debug imports numpy, which `pip install torch` does not install
        from torch.distributed.tensor.debug import CommDebugMode as TorchCommDebugMode

        variants.append(Variant(TORCH_COMM, TorchCommDebugMode))
    except ImportError as exc:
        skipped[TORCH_COMM] = f"cannot import it ({exc}); pip install numpy"
    try:
        from hp_otel.sources.pytorch import _compat

        variants.append(Variant(TORCH_DEBUG, _compat.debug_mode_class()))
    except ImportError as exc:  # _compat.TorchCompatError too
        skipped[TORCH_DEBUG] = f"cannot import it ({exc})"
    profiler = _profiler_context()
    if isinstance(profiler, str):
        skipped[PROFILER] = profiler
    else:
        variants.append(Variant(PROFILER, profiler))
    variants.append(Variant(FLOOR, idle_modes))
    return variants, skipped


@contextlib.contextmanager
def _nothing_installed() -> Iterator[None]:
    """Untraced means untraced: what earlier windows left (the collective kernels) is removed first."""
    import hp_otel

    uninstall = getattr(hp_otel, "uninstall", None)
    if uninstall is not None:
        uninstall()
    yield


@contextlib.contextmanager
def _after_a_window() -> Iterator[None]:
    """hp_otel used earlier in the process, idle now: one empty window, and whatever it left.

    What the variants before it kept is taken out first (`uninstall()`): their windows came
    one after another, which keeps the collective kernels registered between windows."""
    import hp_otel
    from hp_otel import CommDebugMode

    hp_otel.uninstall()
    with CommDebugMode():
        pass
    yield


@dataclass
class SpansRead:
    """What the "spans read" variant read back: a step count and the spans of each (tests check it reads)."""

    per_step: list[int]


SPANS_READ = SpansRead([])


@contextlib.contextmanager
def _spans_read(model: Any) -> Iterator[Any]:
    """hp_otel's window, then its spans read back as a user's test reads them: building the
    deferred SDK spans is part of the step's cost."""
    from hp_otel import CommDebugMode

    with CommDebugMode(module=model) as mode:
        yield mode
    SPANS_READ.per_step.append(len(mode.get_finished_spans()))


def _exporting_variant(model: Any) -> Variant:
    """hp_otel's window on a user's SDK provider that batches its spans to an exporter: live spans
    (the default with a provider of one's own), each handed to the batch processor as it ends.

    The provider is made once per timed block (a user makes it once per process) and shut
    down after; its exporter drops what it gets, so no network is timed. Its `drain` exports
    what the processor holds (`force_flush`): under callgrind the processor's worker thread
    wakes by wall time, so without it a count took in or left out some export, and the
    queue, left full by a warm-up that starved that thread, dropped a step's spans with a
    logged warning each (docs/how-it-works/costs.md)."""
    from hp_otel import CommDebugMode

    provider: list[Any] = []
    return Variant(
        HP_OTEL_EXPORTING,
        lambda: CommDebugMode(module=model, tracer_provider=provider[-1]),
        around_block=lambda: _exporting_provider(provider),
        records_events=True,
        drain=lambda: provider[-1].force_flush(),
    )


@contextlib.contextmanager
def _exporting_provider(holder: list[Any]) -> Iterator[None]:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    from benchmarks.dropping_exporter import DroppingExporter

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(DroppingExporter()))
    holder.append(provider)
    try:
        yield
    finally:
        holder.remove(provider)
        provider.shutdown()


@contextlib.contextmanager
def _hooks_kept() -> Iterator[None]:
    import hp_otel

    hp_otel.install()
    try:
        yield
    finally:
        hp_otel.uninstall()


def _instrumentor_variant(model: Any) -> Variant:
    """Always-on hp_otel as `opentelemetry-instrument` runs it, with steps that are never sampled.

    The instrumentor is active only around this variant's blocks (instrumenting is outside
    the timed steps), so the other variants run exactly as without it.
    """
    from hp_otel.always_on.steps import step as mark_step

    numbers = itertools.count()
    return Variant(
        INSTRUMENTOR,
        lambda: mark_step(next(numbers), run_id="hp-otel-bench", module=model),
        around_block=lambda: _instrumented(model),
        records_events=True,
    )


@contextlib.contextmanager
def _instrumented(model: Any) -> Iterator[None]:
    from opentelemetry.sdk.trace import TracerProvider

    from hp_otel.always_on.instrumentor import HpOtelInstrumentor
    from hp_otel.export.config import SAMPLERS
    from hp_otel.export.providers import build_resource, default_meter_provider

    tracer_provider = TracerProvider(sampler=SAMPLERS["always_off"](0.0), resource=build_resource())
    instrumentor = HpOtelInstrumentor()
    instrumentor.instrument(tracer_provider=tracer_provider, meter_provider=default_meter_provider()[0], module=model)
    try:
        yield
    finally:
        instrumentor.uninstrument()


@contextlib.contextmanager
def _hook_window(model: Any, hook: str) -> Iterator[Any]:
    """A window that sees collectives through `hook` (the env var is read at entry)."""
    from hp_otel import CommDebugMode
    from hp_otel.sources.pytorch.dtensor import HOOK_ENV

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


def _profiler_context() -> StepContext | str:
    """A factory for torch's profiler over CPU with shapes, or why it cannot run here."""
    # Kineto prints two lines to stderr per profile() at its default log level; 6 silences
    # them (read when the profiler first starts; a value the user set wins).
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    try:
        import torch
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU], record_shapes=True):
            torch.zeros(1).add_(1)
    except Exception as exc:  # a build without the profiler (kineto), or one that fails here
        return f"the profiler does not run here ({type(exc).__name__}: {exc})"
    return lambda: profile(activities=[ProfilerActivity.CPU], record_shapes=True)
