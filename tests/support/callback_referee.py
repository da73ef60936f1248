"""The callbacks' referee, shared by the Lightning and Trainer workers: the suite's dispatch-mode
`Referee` (per op, per module and phase from its own forward hooks and autograd-node tags), with
a backward inside `optimizer.step(closure)` counted by its running node (Lightning's automatic
optimization), entered and left by a framework callback of the test's own over the test's own
list of steps, and what the rank exported, summed the way the test compares them."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import torch
from referee import Referee, _node_stack
from span_counts import module_counts_from_spans
from torch import nn

from hp_otel.spans import schema
from hp_otel.testing import metric_points


class StepReferee(Referee):
    """Backward inside a step is counted by its autograd node, not as the optimizer's; a collective
    issued in a parameter's `AccumulateGrad` node (DDP's reducer, when that gradient completes a
    bucket) counts for the module owning the parameter and the calls enclosing its latest call
    (docs/reference/semantics.md), found from the parameter object and this referee's forward hooks."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__(model)
        self._owner = {id(p): fqn or "(root)" for fqn, m in model.named_modules() for p in m.parameters(recurse=False)}
        self._chains: dict[str, tuple[str, ...]] = {}  # module -> the calls enclosing its latest call, itself last
        for fqn, module in model.named_modules():  # prepended after the base's: runs before its push
            self._handles.append(module.register_forward_pre_hook(self._chain(fqn or "(root)"), prepend=True))

    def _chain(self, name: str) -> Any:
        def hook(module: nn.Module, args: Any) -> None:
            self._chains[name] = (*self._stack, name)

        return hook

    def _count(self, name: str) -> None:
        if not self._stack and torch._C._current_graph_task_id() != -1:
            node = torch._C._current_autograd_node()
            if node is not None and node.name().endswith("AccumulateGrad"):
                self.counts[name] += 1
                for fqn in set(self._chains.get(self._owner.get(id(node.variable), ""), ())):
                    self.module_counts[fqn]["backward"][name] += 1
                return
            if self._in_step:
                self.counts[name] += 1
                for fqn in set(_node_stack()):
                    self.module_counts[fqn]["backward"][name] += 1
                return
        super()._count(name)


class RefereeWindows:
    """One referee per listed step, entered when the step begins and left when it ends; the totals."""

    def __init__(self, steps: set[int]) -> None:
        self.steps = steps
        self.seen: list[int] = []
        self.counts: Counter[str] = Counter()
        self.modules: dict[str, dict[str, Counter[str]]] = {}
        self._open: StepReferee | None = None

    def begin(self, step: int, model: Any) -> None:
        if self._open is None and step in self.steps:
            self._open = StepReferee(model)
            self._open.__enter__()
            self.seen.append(step)

    def end(self) -> None:
        referee, self._open = self._open, None
        if referee is None:
            return
        referee.__exit__(None, None, None)
        self.counts.update(referee.counts)
        for fqn, phases in referee.module_counts_dict().items():
            for phase, ops in phases.items():
                self.modules.setdefault(fqn, {}).setdefault(phase, Counter()).update(ops)


def in_memory_providers(rank: int) -> tuple[Any, Any, Any, Any]:
    """(span exporter, tracer provider, metric reader, meter provider), in memory, their resource naming the rank."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    resource = Resource.create({schema.RESOURCE_RANK: rank})
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider(resource=resource, shutdown_on_exit=False)
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader], resource=resource, shutdown_on_exit=False)
    return exporter, tracer_provider, reader, meter_provider


def write_result(path: Path, rank: int, referee: RefereeWindows, exporter: Any, reader: Any, faults: int) -> None:
    """What this rank exported and what its referee counted, as JSON for the test."""
    spans = exporter.get_finished_spans()
    steps = sorted(s.attributes[schema.STEP] for s in spans if schema.is_rank_step_span(s.name, s.attributes))
    span_ops = Counter(
        s.attributes[schema.COLLECTIVE_NAME] for s in spans if s.attributes.get(schema.COLLECTIVE_NAME) is not None
    )
    metric_ops: Counter[str] = Counter()
    for point in metric_points(reader, schema.METRIC_CALLS):
        metric_ops[str(point.attributes.get(schema.COLLECTIVE_NAME))] += point.value
    root_calls = sum(  # forward calls of the model per window: one per micro-batch
        s.attributes.get(schema.MODULE_FQN) == "(root)" and s.attributes.get(schema.PHASE) == schema.PHASE_FORWARD
        for s in spans
        if s.attributes.get(schema.CALL_KIND) == schema.KIND_MODULE
    )
    result = {
        "rank": rank,
        "root_forward_calls": root_calls,
        "steps": steps,
        "referee_steps": referee.seen,
        "span_ops": dict(span_ops),
        "metric_ops": dict(metric_ops),
        "modules": module_counts_from_spans(spans),
        "referee_ops": dict(referee.counts),
        "referee_modules": {f: {p: dict(c) for p, c in ph.items()} for f, ph in referee.modules.items()},
        "faults": faults,
    }
    path.write_text(json.dumps(result, indent=1, sort_keys=True))
