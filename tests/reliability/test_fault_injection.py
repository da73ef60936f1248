"""Fault injection: every hook point of hp_otel fails in turn during a real TP-MLP step.

For each point the step's loss and gradients are bit-identical to an untraced run, an
exception of the user's own code (forward or backward) propagates unchanged, the fault
is counted (`get_callback_error_counts()` and the `hp_otel.callback.errors` metric) and logged
once per kind, and everything patched is restored exactly.  Runs in one process over
torch's fake process group.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

import hp_otel.sources.pytorch.collective_timer as collective_timer
import hp_otel.sources.pytorch.collectives as collectives
import hp_otel.sources.pytorch.completion as completion_source
import hp_otel.sources.pytorch.dtensor as dtensor_source
import hp_otel.sources.pytorch.modules as module_source
import hp_otel.sources.pytorch.op_hook as op_hook
from hp_otel import CommDebugMode
from hp_otel.record import events as ev
from hp_otel.record.instruments import CollectiveTotals, DeferredDurations
from hp_otel.record.span_feed import SpanFeed
from hp_otel.spans import codec, schema
from hp_otel.testing import assert_collective_counts, assert_no_callback_errors, metric_points
from hp_otel.workloads.tp_mlp import build_tp_mlp, train_step

STEPS = 2  # the second step shows that a kind is logged once, not once per occurrence
REDISTRIBUTE_MODULES = (
    "torch.distributed.tensor._redistribute",
    "torch.distributed.tensor._dispatch",
    "torch.distributed.tensor._api",
)


class InjectedFault(RuntimeError):
    """A fault we inject into hp_otel's own code."""


def _raise(*args, **kwargs):
    raise InjectedFault("injected")


def _fail_collective_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whether to record a collective cannot be decided (both hook paths ask the window's collective timer)."""

    def accepting(self):
        raise InjectedFault("injected check")

    monkeypatch.setattr(dtensor_source.CollectiveTimer, "accepting", property(accepting))


def _fail_event(tag: str) -> Callable[[pytest.MonkeyPatch], None]:
    """The recorder's handling of one observer event kind fails (after the exact counts)."""

    def inject(monkeypatch: pytest.MonkeyPatch) -> None:
        original = SpanFeed.emit

        def emit(self, event):
            if type(event) is tag:
                raise InjectedFault(f"injected in event {tag.__name__}")
            return original(self, event)

        monkeypatch.setattr(SpanFeed, "emit", emit)

    return inject


def _fail(target: object, name: str) -> Callable[[pytest.MonkeyPatch], None]:
    return lambda monkeypatch: monkeypatch.setattr(target, name, _raise)


def _in_op_mode(inject: Callable[[pytest.MonkeyPatch], None]) -> Callable[[pytest.MonkeyPatch], None]:
    """The fault, with op spans from the fallback TorchFunctionMode (`HP_OTEL_TORCH_OP_HOOK=mode`)."""

    def both(monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv(op_hook.OP_HOOK_ENV, "mode")
        inject(monkeypatch)

    return both


class _ProcessorRaising(SimpleSpanProcessor):
    def __init__(self, exporter: SpanExporter, on: str) -> None:
        super().__init__(exporter)
        self._on = on

    def on_start(self, span, parent_context=None):
        if self._on == "start":
            raise InjectedFault("processor on_start")
        super().on_start(span, parent_context)

    def on_end(self, span):
        if self._on == "end":
            raise InjectedFault("processor on_end")
        super().on_end(span)


class _ExporterRaising(SpanExporter):
    def export(self, spans):
        raise InjectedFault("exporter")

    def shutdown(self):
        pass


@dataclass(frozen=True)
class Fault:
    name: str
    inject: Callable[[pytest.MonkeyPatch], None] | None  # patches hp_otel's own code
    kinds: tuple[str, ...]  # fault kinds it must be counted under ((): the SDK isolates it)
    processor: str | None = None  # a user's span processor raising in on_start/on_end, or its exporter
    live: bool | None = None
    sees_collectives: bool = True  # False where the fault is in the code that recognises collectives


FAULTS = [
    # DTensor op hooks (the class hook, and the fallback TorchFunctionMode): before the call,
    # describing inputs/outputs, the callbacks
    Fault("op hook before the call", _fail(op_hook, "_graph_task_id"), ("op_before",)),
    Fault("op inputs/outputs", _fail(op_hook, "tensor_infos"), ("op_inputs", "op_outputs")),
    Fault("op mode before the call", _in_op_mode(_fail(dtensor_source, "_has_dtensor")), ("op_before",)),
    Fault("op mode inputs/outputs", _in_op_mode(_fail(op_hook, "tensor_infos")), ("op_inputs", "op_outputs")),
    Fault("op enter callback", _fail_event(ev.OpEnter), ("op_enter",)),
    Fault("op exit callback", _fail_event(ev.OpExit), ("op_exit",)),
    # collective hooks (kernels or dispatch mode): before the real call, after it, the callback
    Fault(
        "collective wrapper before the call",
        _fail_collective_check,
        ("collective_before",),
        sees_collectives=False,
    ),
    Fault(
        "collective describe after the call",
        _fail(collectives.CollectiveSpec, "describe"),
        ("collective_issue", "collective_describe"),  # described when issued, and again after
        sees_collectives=False,
    ),
    Fault(
        "collective wrapper after the call",
        _fail(collective_timer, "_in_backward"),
        ("collective_issue", "collective_after"),  # the phase is read when issued, and again after
        sees_collectives=False,
    ),
    Fault("collective callback", _fail_event(ev.Collective), ("collective",)),
    Fault("collective completion (wait)", _fail(completion_source.Completions, "waited"), ("collective_complete",)),
    # redistribute wrapper
    Fault("redistribute describe", _fail(dtensor_source, "placements_text"), ("redistribute_describe",)),
    Fault("redistribute enter callback", _fail_event(ev.RedistributeEnter), ("redistribute_enter",)),
    Fault("redistribute exit callback", _fail_event(ev.RedistributeExit), ("redistribute_exit",)),
    # module hooks, forward and backward
    Fault("module forward pre hook", _fail(module_source.TorchModuleTracker, "enter_call"), ("module_forward_pre",)),
    Fault("module forward post hook", _fail(module_source, "_grad_tensors"), ("module_forward_post",)),
    Fault("backward node attribution", _fail(module_source.TorchModuleTracker, "running_chain"), ("node_attribution",)),
    Fault("module enter callback", _fail_event(ev.ModuleEnter), ("module_enter",)),
    Fault("module exit callback", _fail_event(ev.ModuleExit), ("module_exit",)),
    Fault(
        "module backward start hook",
        _fail(module_source.TorchModuleTracker, "close_at_backward_end"),
        ("module_backward_start",),
    ),
    Fault(
        "module backward grad hook", _fail(module_source.TorchModuleTracker, "backward_start"), ("module_grad_hook",)
    ),
    Fault("backward end callback", _fail_event(ev.BackwardEnd), ("backward_end",)),
    Fault("module tracker install", _fail(module_source, "parameter_infos"), ("attach:TorchModuleTracker",)),
    # span building, span processors and exporters
    Fault("span building", _fail(codec, "encoded_op"), ("span_build",)),
    Fault("span processor on_start (live)", None, ("span_processor",), processor="start", live=True),
    Fault("span processor on_end (live)", None, ("span_processor",), processor="end", live=True),
    Fault("span processor on_end (deferred build on query)", None, ("span_processor",), processor="end", live=False),
    Fault("span exporter (the SDK processor isolates it)", None, (), processor="exporter", live=True),
    # metrics: the duration histogram at window end, the observable counters at collection
    Fault("duration histogram at window end", _fail(DeferredDurations, "add"), ("metrics",)),
    Fault("duration histogram at collection", _fail(DeferredDurations, "flush"), ("metric_durations",)),
    # (the attribute sets are shared with the histogram, which fails at window end too)
    Fault("observable counter callback", _fail(CollectiveTotals, "attributes"), ("metric_observe", "metrics")),
]


def _redistribute_functions() -> list:
    return [importlib.import_module(m).redistribute_local_tensor for m in REDISTRIBUTE_MODULES]


def _hook_state(model: torch.nn.Module) -> list:
    return [(dict(m._forward_pre_hooks), dict(m._forward_hooks), dict(m._backward_hooks)) for m in model.modules()]


def _run_steps(model: torch.nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    """The loss of each of STEPS steps."""
    return [train_step(model, x).detach().clone() for _ in range(STEPS)]


def _gradients(model: torch.nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    """Every parameter gradient (gathered: outside any window) and the input gradient."""
    return [*(p.grad.full_tensor().clone() for p in model.parameters()), x.grad.clone()]


def _fresh(world: int) -> tuple[torch.nn.Module, torch.Tensor]:
    model = build_tp_mlp(world, seed=0)
    torch.manual_seed(1)
    return model, torch.randn(4, 16, requires_grad=True)


def _make_mode(fault: Fault, model, meter_provider) -> tuple[CommDebugMode, InMemorySpanExporter]:
    users = InMemorySpanExporter()
    if fault.processor is None:
        return CommDebugMode(module=model, meter_provider=meter_provider, live_spans=fault.live), users
    provider = TracerProvider()
    if fault.processor == "exporter":
        provider.add_span_processor(SimpleSpanProcessor(_ExporterRaising()))
        provider.add_span_processor(SimpleSpanProcessor(users))
    else:
        provider.add_span_processor(_ProcessorRaising(users, fault.processor))
    mode = CommDebugMode(module=model, tracer_provider=provider, meter_provider=meter_provider, live_spans=fault.live)
    return mode, users


def _error_metric(reader) -> dict[str, int]:
    return {p.attributes[schema.CALLBACK_NAME]: p.value for p in metric_points(reader, schema.METRIC_CALLBACK_ERRORS)}


@pytest.fixture(scope="module")
def reference(fake_world) -> list[torch.Tensor]:
    model, x = _fresh(fake_world)
    return _run_steps(model, x) + _gradients(model, x)


@pytest.mark.parametrize("fault", FAULTS, ids=[f.name for f in FAULTS])
def test_fault_is_isolated_counted_and_logged_once(
    fault: Fault, fake_world, reference, monkeypatch, caplog, hp_meter_provider, hp_metric_reader
) -> None:
    model, x = _fresh(fake_world)
    before_functions = _redistribute_functions()
    before_hooks = _hook_state(model)
    if fault.inject is not None:
        fault.inject(monkeypatch)
    caplog.set_level(logging.WARNING, logger="hp_otel")
    mode, users = _make_mode(fault, model, hp_meter_provider)
    with mode:
        outputs = _run_steps(model, x)
    outputs += _gradients(model, x)

    # the user's step is bit-identical to the untraced one
    assert len(outputs) == len(reference)
    for got, want in zip(outputs, reference, strict=True):
        assert torch.equal(got, want)
    seen = 2 * STEPS if fault.sees_collectives else 0  # counting is unaffected by faults elsewhere
    assert_collective_counts(mode, {"all_reduce": seen} if seen else {}, normalized=True)

    spans = mode.get_finished_spans()  # a query never raises, even when building spans faults
    metric_errors = _error_metric(hp_metric_reader)  # collecting runs the observable callbacks
    faults = mode.get_callback_error_counts()
    if not fault.kinds:
        assert_no_callback_errors(mode)
        assert len(users.get_finished_spans()) == len(spans) > 0  # the other processor got every span
    for kind in fault.kinds:
        assert faults.get(kind, 0) >= 1, faults
        logged = [r for r in caplog.records if r.getMessage().startswith(f"hp_otel: {kind} failed")]
        assert len(logged) == 1, [r.getMessage() for r in caplog.records]
    assert set(faults) == set(fault.kinds), faults
    assert {k: v for k, v in metric_errors.items() if k in faults} == {
        k: v for k, v in faults.items() if k in metric_errors
    }
    assert set(metric_errors) >= set(faults) - {"metric_observe"}  # that one is counted while collecting
    if fault.processor in ("start", "end"):
        assert mode.get_finished_spans() == spans  # the local store is unaffected by the user's processor
    # everything patched is restored
    assert all(a is b for a, b in zip(_redistribute_functions(), before_functions, strict=True))
    assert _hook_state(model) == before_hooks
    assert not x._backward_hooks
    assert torch._C._len_torch_function_stack() == 0
    assert _get_current_dispatch_mode_stack() == []


def _raise_in_forward(model, error):
    def explode(module, args):
        raise error

    return model.fc2.register_forward_pre_hook(explode)


class _BackwardBomb(torch.autograd.Function):
    error: BaseException | None = None

    @staticmethod
    def forward(ctx, t):
        return t.view_as(t)

    @staticmethod
    def backward(ctx, grad):
        raise _BackwardBomb.error


@pytest.mark.parametrize("where", ["forward", "backward"])
@pytest.mark.parametrize("fault", FAULTS, ids=[f.name for f in FAULTS])
def test_user_exception_propagates_unchanged(fault: Fault, where: str, fake_world, monkeypatch) -> None:
    model, x = _fresh(fake_world)
    before_functions = _redistribute_functions()
    before_hooks = _hook_state(model)
    if fault.inject is not None:
        fault.inject(monkeypatch)
    error = ValueError(f"user code failed in {where}")
    handle = _raise_in_forward(model, error) if where == "forward" else None
    _BackwardBomb.error = error
    mode, _ = _make_mode(fault, model, None)
    try:
        with pytest.raises(ValueError) as caught, mode:
            out = model(x)
            _BackwardBomb.apply(out).sum().backward()
    finally:
        if handle is not None:
            handle.remove()
    assert caught.value is error
    assert str(error) == f"user code failed in {where}"
    assert error.__cause__ is None and error.__context__ is None
    assert all(a is b for a, b in zip(_redistribute_functions(), before_functions, strict=True))
    assert _hook_state(model) == before_hooks
    assert torch._C._len_torch_function_stack() == 0
    assert _get_current_dispatch_mode_stack() == []
    assert all(span.end_time is not None for span in mode.get_finished_spans())
