"""Where each collective was called (`CommDebugMode(stack=...)`): the user's frames, library frames dropped.

The referee for a frame is the test's own line number (`sys._getframe().f_lineno` next to the
call), never hp_otel's capture; "costs nothing when off" is the number of frame walks, counted.
"""

from __future__ import annotations

import inspect
import json
import os
import sys
import traceback

import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

import hp_otel
from hp_otel import CommDebugMode
from hp_otel.always_on.instrumentation import active_session
from hp_otel.always_on.instrumentor import HpOtelInstrumentor
from hp_otel.record import call_stack
from hp_otel.spans import schema
from hp_otel.spans.infos import CollectiveInfo

HERE = os.path.abspath(__file__)
LIBRARY_DIRS = tuple(os.path.join(os.path.realpath(p), "") for p in (*torch.__path__, *hp_otel.__path__))


def _frame(line: int, function: str) -> str:
    return f"{HERE}:{line}:{function}"


def _issue(t: torch.Tensor) -> tuple[torch.Tensor, int]:
    line = sys._getframe().f_lineno + 1
    out = funcol.all_reduce(t, "sum", dist.group.WORLD)
    return funcol.wait_tensor(out), line


def _caller(t: torch.Tensor) -> tuple[int, int]:
    line = sys._getframe().f_lineno + 1
    _, inner = _issue(t)
    return inner, line


def _collective_spans(mode: CommDebugMode) -> list:
    return [sp for sp in mode.get_finished_spans() if sp.attributes.get(schema.CALL_KIND) == schema.KIND_COLLECTIVE]


def test_a_collective_names_the_users_lines_innermost_first_without_library_frames(fake_world) -> None:
    with CommDebugMode(stack=True) as mode:
        here = sys._getframe().f_lineno + 1
        inner, outer = _caller(torch.ones(4))
    (span,) = _collective_spans(mode)
    stack = span.attributes[schema.CALL_STACK]
    assert stack[:2] == (_frame(inner, "_issue"), _frame(outer, "_caller"))
    assert stack[2] == _frame(here, inspect.currentframe().f_code.co_name)
    # then pytest's: installed libraries other than the framework's are the user's, up to the depth
    assert len(stack) == call_stack.DEFAULT_DEPTH and all("pluggy" in f or "pytest" in f for f in stack[3:])
    assert not [f for f in stack if f.startswith(LIBRARY_DIRS)]
    assert span.attributes[schema.CODE_FILE_PATH] == HERE
    assert span.attributes[schema.CODE_LINE_NUMBER] == inner
    # semconv (1.33+): the function's fully qualified name, module included, as Python names it
    assert span.attributes[schema.CODE_FUNCTION_NAME] == f"{_issue.__module__}.{_issue.__qualname__}"


def test_the_depth_limit_keeps_the_innermost_frames(fake_world) -> None:
    with CommDebugMode(stack=1) as mode:
        inner, _ = _caller(torch.ones(4))
    (span,) = _collective_spans(mode)
    assert span.attributes[schema.CALL_STACK] == (_frame(inner, "_issue"),)


class _MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(16, 32)
        self.fc2 = torch.nn.Linear(32, 16)
        self.line = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.fc1(x))
        self.line = sys._getframe().f_lineno + 1
        return self.fc2(h)


def test_dtensor_collectives_and_redistributes_point_at_the_modules_forward_and_at_backward(fake_world) -> None:
    mesh = init_device_mesh("cpu", (fake_world,))
    model = parallelize_module(_MLP(), mesh, {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()})
    x = torch.randn(4, 16, requires_grad=True)
    with CommDebugMode(module=model, stack=True) as mode:
        out = model(x)
        backward_line = sys._getframe().f_lineno + 1
        out.sum().backward()
    forward_frame = _frame(model.line, "_MLP.forward")
    calls = [
        sp
        for sp in mode.get_finished_spans()
        if sp.attributes.get(schema.CALL_KIND) in (schema.KIND_COLLECTIVE, schema.KIND_REDISTRIBUTE)
    ]
    collectives = [sp for sp in calls if sp.attributes[schema.CALL_KIND] == schema.KIND_COLLECTIVE]
    assert len(collectives) == mode.get_total_counts() == 2  # fc2's forward all_reduce, fc1's backward one
    assert any(sp.attributes[schema.CALL_KIND] == schema.KIND_REDISTRIBUTE for sp in calls)
    for sp in calls:
        stack = sp.attributes[schema.CALL_STACK]
        assert not [f for f in stack if f.startswith(LIBRARY_DIRS)]
        if sp.attributes[schema.PHASE] == schema.PHASE_FORWARD:
            assert stack[0] == forward_frame
            assert stack[1].startswith(f"{HERE}:") and stack[1].endswith(":" + inspect.currentframe().f_code.co_name)
        else:  # backward runs from the .backward() call
            assert stack[0] == _frame(backward_line, inspect.currentframe().f_code.co_name)


@pytest.mark.filterwarnings("ignore:noise_level=")
def test_the_table_at_level_3_and_the_json_dump_show_the_stack(fake_world, tmp_path) -> None:
    with CommDebugMode(stack=2) as mode:
        inner, outer = _caller(torch.ones(4))
    level3 = mode.generate_comm_debug_tracing_table(noise_level=3).splitlines()
    at = level3.index(" " * 21 + f"  at {_frame(inner, '_issue')}")
    assert "Collective(_c10d_functional.all_reduce)" in level3[at - 1]
    assert level3[at + 1] == " " * 21 + f"  from {_frame(outer, '_caller')}"
    assert _frame(inner, "_issue") not in mode.generate_comm_debug_tracing_table(noise_level=2)
    mode.generate_json_dump(tmp_path / "dump.json", noise_level=0)
    (record,) = json.loads((tmp_path / "dump.json").read_text())["records"]
    assert record["stack"] == [_frame(inner, "_issue"), _frame(outer, "_caller")]


class _Counting:
    def __init__(self, real) -> None:
        self.real = real
        self.calls = 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.real(*args, **kwargs)


@pytest.fixture
def walks(monkeypatch):
    """Counts hp_otel's frame walks, and any traceback / inspect stack extraction anyone does."""
    counters = {
        "_getframe": _Counting(call_stack._getframe),
        "extract_stack": _Counting(traceback.extract_stack),
        "walk_stack": _Counting(traceback.walk_stack),
        "inspect.stack": _Counting(inspect.stack),
    }
    monkeypatch.setattr(call_stack, "_getframe", counters["_getframe"])
    monkeypatch.setattr(traceback, "extract_stack", counters["extract_stack"])
    monkeypatch.setattr(traceback, "walk_stack", counters["walk_stack"])
    monkeypatch.setattr(inspect, "stack", counters["inspect.stack"])
    return counters


def _tp_step(model, x) -> None:
    model(x).sum().backward()


@pytest.mark.parametrize("stack", [None, False, 0])
def test_off_no_frame_is_walked(fake_world, tp_mlp, walks, monkeypatch, stack) -> None:
    monkeypatch.delenv(call_stack.DEPTH_VARIABLE, raising=False)
    model, x = tp_mlp
    with CommDebugMode(module=model, stack=stack) as mode:
        _tp_step(model, x)
    assert mode.get_total_counts() == 2
    assert {name: c.calls for name, c in walks.items()} == dict.fromkeys(walks, 0)
    assert not [sp for sp in mode.get_finished_spans() if schema.CALL_STACK in sp.attributes]


def test_on_one_walk_per_collective_and_redistribute_and_none_without_spans(fake_world, tp_mlp, walks) -> None:
    model, x = tp_mlp
    with CommDebugMode(module=model, stack=True) as mode:
        _tp_step(model, x)
    calls = [sp for sp in mode.get_finished_spans() if schema.CALL_STACK in sp.attributes]
    kinds = {sp.attributes[schema.CALL_KIND] for sp in calls}
    assert kinds == {schema.KIND_COLLECTIVE, schema.KIND_REDISTRIBUTE}
    assert walks["_getframe"].calls == len(calls)
    assert walks["extract_stack"].calls == walks["inspect.stack"].calls == 0
    walks["_getframe"].calls = 0
    with CommDebugMode(module=model, stack=True, record_spans=False) as mode:  # an unsampled step
        _tp_step(model, x)
    assert mode.get_total_counts() == 2 and walks["_getframe"].calls == 0


def test_the_setting_turns_it_on_and_bad_values_are_refused_by_name(fake_world, monkeypatch) -> None:
    monkeypatch.setenv(call_stack.DEPTH_VARIABLE, "1")
    with CommDebugMode() as mode:
        inner, _ = _caller(torch.ones(4))
    assert _collective_spans(mode)[0].attributes[schema.CALL_STACK] == (_frame(inner, "_issue"),)
    with CommDebugMode(stack=False) as mode:  # the argument wins over the setting
        _caller(torch.ones(4))
    assert schema.CALL_STACK not in _collective_spans(mode)[0].attributes
    monkeypatch.setenv(call_stack.DEPTH_VARIABLE, "deep")
    with pytest.raises(ValueError, match=r"HP_OTEL_STACK_DEPTH must be a number of frames 0\.\.64"):
        CommDebugMode()
    for bad in ("yes", 65, -1, 2.0):
        with pytest.raises(ValueError, match="stack must be True"):
            CommDebugMode(stack=bad)


def _issue_and_hang(observer) -> tuple[object, int]:
    info = CollectiveInfo("all_reduce", "all_reduce", 2, "0", (0, 1), (4,), (4,), "torch.float32", 16)
    line = sys._getframe().f_lineno + 1
    return observer.on_collective_issue(info, 1), line


def test_an_in_flight_collective_written_for_the_watchdog_carries_its_stack(tmp_path) -> None:
    from hp_otel.spans.otlp_json import read_spans

    with CommDebugMode(stack=True) as mode:
        _, line = _issue_and_hang(mode.observer)
        mode.write_spans(tmp_path / "rank0.json")
    (span,) = read_spans(tmp_path / "rank0.json")
    assert span.attributes[schema.COLLECTIVE_IN_FLIGHT] is True
    assert span.attributes[schema.CALL_STACK][0] == _frame(line, "_issue_and_hang")


def test_the_instrumentor_records_stacks_of_sampled_steps(fake_world, monkeypatch) -> None:
    monkeypatch.delenv(call_stack.DEPTH_VARIABLE, raising=False)
    exporter = InMemorySpanExporter()
    provider = TracerProvider(shutdown_on_exit=False)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    meters = MeterProvider(metric_readers=[InMemoryMetricReader()])  # both given: no global configure()
    instrumentor = HpOtelInstrumentor()
    instrumentor.instrument(tracer_provider=provider, meter_provider=meters, stack=1)
    try:
        assert active_session().options.stack_depth == 1
        with hp_otel.step(0, run_id="r", rank=0):
            inner, _ = _caller(torch.ones(4))
    finally:
        instrumentor.uninstrument()
    (span,) = [
        sp for sp in exporter.get_finished_spans() if sp.attributes.get(schema.CALL_KIND) == schema.KIND_COLLECTIVE
    ]
    assert span.attributes[schema.CALL_STACK] == (_frame(inner, "_issue"),)
    monkeypatch.setenv(call_stack.DEPTH_VARIABLE, "lots")  # zero-code runs: a bad setting is logged, stacks off
    instrumentor.instrument(tracer_provider=provider, meter_provider=meters)
    try:
        assert active_session().options.stack_depth == 0
    finally:
        instrumentor.uninstrument()
    with pytest.raises(ValueError, match="stack must be True"):
        instrumentor.instrument(tracer_provider=provider, meter_provider=meters, stack="all")
