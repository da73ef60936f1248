"""The user's span hooks: `CommDebugMode(collective_hook=fn)` (and module / op), and the instrumentor's."""

from __future__ import annotations

import logging

import pytest
import torch
from events import design_mlp_forward
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import hp_otel
from hp_otel import CommDebugMode
from hp_otel.always_on.instrumentor import HpOtelInstrumentor
from hp_otel.spans import schema
from hp_otel.spans.infos import CollectiveInfo, ModuleInfo, OpInfo
from hp_otel.spans.otlp_json import read_spans
from hp_otel.workloads.tp_mlp import train_step


def _exporting_provider() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(shutdown_on_exit=False)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def _kind(span) -> str:
    return span.attributes.get(schema.CALL_KIND, "")


def _tagging_hooks(seen: list[object]) -> dict[str, object]:
    def collective_hook(span, info: CollectiveInfo) -> None:
        seen.append(info)
        span.set_attribute("user.collective", f"{info.op} {info.bytes}")

    def module_hook(span, info: ModuleInfo) -> None:
        seen.append(info)
        span.set_attribute("user.module", info.fqn)

    def op_hook(span, info: OpInfo) -> None:
        seen.append(info)
        span.set_attribute("user.op", f"{info.name} {len(info.inputs)}->{len(info.outputs)}")

    return {"collective_hook": collective_hook, "module_hook": module_hook, "op_hook": op_hook}


@pytest.mark.parametrize("live", [True, False], ids=["live", "deferred"])
def test_attributes_a_hook_adds_reach_the_exporter(tp_mlp, live: bool) -> None:
    model, x = tp_mlp
    provider, exporter = _exporting_provider()
    seen: list[object] = []
    with CommDebugMode(module=model, tracer_provider=provider, live_spans=live, **_tagging_hooks(seen)) as mode:
        train_step(model, x)
    exported = exporter.get_finished_spans()
    collectives = [s for s in exported if _kind(s) == schema.KIND_COLLECTIVE]
    modules = [s for s in exported if _kind(s) == schema.KIND_MODULE]
    ops = [s for s in exported if _kind(s) == schema.KIND_OP]
    assert len(collectives) == mode.get_total_counts() == 2 and modules and ops
    for span in collectives:
        assert span.attributes["user.collective"] == f"all_reduce {span.attributes[schema.COLLECTIVE_BYTES]}"
    for span in modules:
        assert span.attributes["user.module"] == span.attributes[schema.MODULE_FQN]
    for span in ops:
        name = span.attributes[schema.OP_NAME]
        assert span.attributes["user.op"] == f"{name} {len(span.attributes[schema.OP_INPUT_NDIMS])}->" + str(
            len(span.attributes.get(schema.OP_OUTPUT_NDIMS, ()))
        )
    # one call per span, with the info the source reported
    assert sum(isinstance(i, CollectiveInfo) for i in seen) == len(collectives)
    assert sum(isinstance(i, ModuleInfo) for i in seen) == len(modules)
    assert sum(isinstance(i, OpInfo) for i in seen) == len(ops)
    assert mode.get_callback_error_counts() == {}


def test_a_deferred_hook_runs_when_the_spans_are_built_not_during_the_step(tp_mlp) -> None:
    model, x = tp_mlp
    calls: list[CollectiveInfo] = []
    with CommDebugMode(module=model, collective_hook=lambda span, info: calls.append(info)) as mode:
        train_step(model, x)
        assert calls == []  # hp_otel's own provider: deferred, nothing built yet
    assert calls == []
    spans = mode.get_finished_spans()  # reading builds them: the hooks run now
    assert len(calls) == 2 and sum(_kind(s) == schema.KIND_COLLECTIVE for s in spans) == 2


def test_a_hook_that_raises_is_counted_logged_once_and_training_is_bit_identical(tp_mlp, caplog) -> None:
    model, x = tp_mlp
    loss = train_step(model, x)
    expected = (loss.detach().clone(), x.grad.clone(), [p.grad.clone() for p in model.parameters()])
    x.grad = None
    model.zero_grad()

    def broken(span, info) -> None:
        raise RuntimeError("user hook bug")

    provider, exporter = _exporting_provider()
    with caplog.at_level(logging.WARNING, logger="hp_otel"):
        with CommDebugMode(
            module=model, tracer_provider=provider, collective_hook=broken, module_hook=broken, op_hook=broken
        ) as mode:
            loss = train_step(model, x)
    assert torch.equal(loss.detach(), expected[0]) and torch.equal(x.grad, expected[1])
    assert all(torch.equal(p.grad, g) for p, g in zip(model.parameters(), expected[2], strict=True))
    faults = mode.get_callback_error_counts()
    exported = exporter.get_finished_spans()
    by_kind = {kind: sum(_kind(s) == kind for s in exported) for kind in schema.CALL_KINDS}
    assert faults == {
        "user_collective_hook": by_kind[schema.KIND_COLLECTIVE],
        "user_module_hook": by_kind[schema.KIND_MODULE],
        "user_op_hook": by_kind[schema.KIND_OP],
    }
    assert by_kind[schema.KIND_COLLECTIVE] == 2 and by_kind[schema.KIND_MODULE] and by_kind[schema.KIND_OP]
    assert mode.get_comm_counts() == {"_c10d_functional.all_reduce": 2}  # every span still ended and exported
    logged = [r.getMessage() for r in caplog.records if "user_" in r.getMessage()]
    assert len(logged) == 3  # once per kind, not once per span


def test_hooks_are_not_called_when_spans_are_not_recorded(tp_mlp) -> None:
    model, x = tp_mlp
    seen: list[object] = []
    with CommDebugMode(module=model, record_spans=False, **_tagging_hooks(seen)) as mode:
        train_step(model, x)
    assert mode.get_finished_spans() == ()
    assert mode.get_total_counts() == 2 and seen == []


@pytest.mark.parametrize("argument", ["collective_hook", "module_hook", "op_hook"])
def test_a_hook_that_is_not_callable_is_refused_naming_the_argument(argument: str) -> None:
    with pytest.raises(TypeError, match=rf"^{argument} must be a callable taking \(span, info\), or None; got int$"):
        CommDebugMode(**{argument: 3})
    instrumentor = HpOtelInstrumentor()
    with pytest.raises(TypeError, match=rf"^{argument} must be a callable"):
        instrumentor.instrument(**{argument: "not a function"})
    assert not instrumentor.is_instrumented_by_opentelemetry


def test_the_instrumentor_gives_its_hooks_to_every_sampled_step() -> None:
    provider, exporter = _exporting_provider()
    modules: list[str] = []

    def module_hook(span, info: ModuleInfo) -> None:
        modules.append(info.fqn)
        span.set_attribute("user.step_module", info.fqn)

    def collective_hook(span, info: CollectiveInfo) -> None:
        span.set_attribute("user.group_size", info.group_size)

    instrumentor = HpOtelInstrumentor()
    instrumentor.instrument(
        tracer_provider=provider,
        meter_provider=MeterProvider(shutdown_on_exit=False),
        module_hook=module_hook,
        collective_hook=collective_hook,
    )
    try:
        from hp_otel.mode import registry

        for n in range(2):
            with hp_otel.step(n, run_id="hooks", rank=0):
                design_mlp_forward(registry.current_mode.get().observer)
    finally:
        instrumentor.uninstrument()
    exported = exporter.get_finished_spans()
    collectives = [s for s in exported if _kind(s) == schema.KIND_COLLECTIVE]
    module_spans = [s for s in exported if _kind(s) == schema.KIND_MODULE]
    assert len(collectives) == 2 and all(s.attributes["user.group_size"] == 2 for s in collectives)
    assert module_spans
    assert all(s.attributes["user.step_module"] == s.attributes[schema.MODULE_FQN] for s in module_spans)
    assert len(modules) == len(module_spans)


def test_the_span_hooks_example_runs_and_prints_what_it_says(tmp_path) -> None:
    import subprocess
    import sys
    from pathlib import Path

    from hp_otel.workloads.process_groups import free_port

    root = Path(__file__).resolve().parents[2]
    code = (root / "examples" / "span_hooks.py").read_text()  # docs/guide/providers.md includes this file
    assert "<!-- include: examples/span_hooks.py -->" in (root / "docs" / "guide" / "providers.md").read_text()
    assert 'MASTER_PORT="29517"' in code
    code = code.replace('MASTER_PORT="29517"', f'MASTER_PORT="{free_port()}"')
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "all_reduce 4.0 {}"


def _in_a_thread(call, timeout_s: float = 60.0) -> list[object]:
    """`call()` on a daemon thread: a deadlock fails the test instead of hanging it."""
    import threading

    out: list[object] = []
    thread = threading.Thread(target=lambda: out.append(call()), daemon=True)
    thread.start()
    thread.join(timeout_s)
    assert not thread.is_alive(), "the read deadlocked (a span hook read the mode while its spans were built)"
    return out


@pytest.mark.parametrize("read", ["get_finished_spans", "write_spans", "get_dropped_record_count"])
def test_a_hook_that_reads_the_mode_sees_the_spans_built_so_far_and_does_not_hang(tp_mlp, tmp_path, read) -> None:
    model, x = tp_mlp
    seen: list[int] = []
    holder: list[CommDebugMode] = []

    def module_hook(span, info: ModuleInfo) -> None:
        mode = holder[0]
        if read == "write_spans":
            mode.write_spans(tmp_path / f"{len(seen)}.json")
            seen.append(len(read_spans(tmp_path / f"{len(seen)}.json")))
        elif read == "get_finished_spans":
            seen.append(len(mode.get_finished_spans()))
        else:
            seen.append(mode.get_dropped_record_count())

    with CommDebugMode(module=model, module_hook=module_hook) as mode:
        holder.append(mode)
        train_step(model, x)
    spans = _in_a_thread(lambda: holder[0].get_finished_spans())[0]
    modules = [s for s in spans if _kind(s) == schema.KIND_MODULE]
    assert len(seen) == len(modules) > 0 and mode.get_callback_error_counts() == {}
    if read != "get_dropped_record_count":  # each hook saw the spans that had ended before its own
        assert seen == sorted(seen) and seen[-1] < len(spans)


def test_clear_from_a_hook_is_refused_with_a_clear_error_not_a_hang(tp_mlp, caplog) -> None:
    model, x = tp_mlp
    holder: list[CommDebugMode] = []
    with CommDebugMode(module=model, collective_hook=lambda span, info: holder[0].clear()) as mode:
        holder.append(mode)
        train_step(model, x)
    with caplog.at_level(logging.WARNING, logger="hp_otel"):
        spans = _in_a_thread(lambda: holder[0].get_finished_spans())[0]
    assert sum(_kind(s) == schema.KIND_COLLECTIVE for s in spans) == 2  # the build went on, nothing forgotten
    assert mode.get_callback_error_counts() == {"user_collective_hook": 2}
    assert "clear() was called from a span hook" in caplog.text


def test_repr_runs_no_user_span_hook() -> None:
    """`repr(mode)` reads what is there: a deferred window's spans are not built by it, so no hook runs
    (a debugger or a log line showing the mode must not call the user's code); reading them does."""
    seen: list[object] = []
    with CommDebugMode(live_spans=False, **_tagging_hooks(seen)) as mode:
        design_mlp_forward(mode.observer)
        assert "CommDebugMode(active" in repr(mode) and seen == []
    text = repr(mode)
    assert seen == [] and "collectives=1" in text and "unbuilt_events=" in text
    assert mode.get_finished_spans() and seen  # reading the spans builds them: the hooks run then
    assert "unbuilt_events" not in repr(mode)
