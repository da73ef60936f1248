"""`--step` finds a step's spans whether the files name a rank's step span `rank 3` (now) or `rank_step`
(files of earlier hp_otel versions): one predicate, `schema.is_rank_step_span`, for every reader."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanContext

from hp_otel.render.rank_spans import load_rank_spans
from hp_otel.spans import schema
from hp_otel.spans.otlp_json import write_spans

pytestmark = pytest.mark.torch_free


def _span(name: str, trace_id: int, span_id: int, attributes: dict, rank: int) -> ReadableSpan:
    return ReadableSpan(
        name=name,
        context=SpanContext(trace_id, span_id, is_remote=False),
        resource=Resource({schema.RESOURCE_RANK: rank}),
        attributes=attributes,
        start_time=span_id * 1000,
        end_time=span_id * 1000 + 500,
    )


@pytest.mark.parametrize("legacy", [False, True], ids=["rank 0", "rank_step"])
def test_step_is_found_under_either_name(tmp_path, legacy: bool) -> None:
    spans = []
    for step in (0, 1):
        trace_id = 100 + step
        name = schema.LEGACY_RANK_STEP_SPAN_NAME if legacy else schema.rank_step_span_name(0)
        spans.append(_span(name, trace_id, 10 * step + 1, {schema.STEP: step, schema.RESOURCE_RANK: 0}, 0))
        spans.append(_span("all_reduce", trace_id, 10 * step + 2, {schema.CALL_KIND: schema.KIND_COLLECTIVE}, 0))
    path = tmp_path / "spans_rank0.json"
    write_spans(path, spans)
    chosen = load_rank_spans([path], "0")
    assert [s.context.trace_id for s in chosen[0]] == [100, 100]
    assert [s.context.trace_id for s in load_rank_spans([path])[0]] == [101, 101]  # the last step by default


def test_the_names_say_the_step_the_rank_and_the_phase() -> None:
    assert (schema.step_span_name(12), schema.rank_step_span_name(3)) == ("step 12", "rank 3")
    assert schema.module_span_name("layers.3.mlp", schema.PHASE_FORWARD) == "layers.3.mlp"
    assert schema.module_span_name("layers.3.mlp", schema.PHASE_BACKWARD) == "layers.3.mlp backward"
    assert schema.module_span_name("layers.3.mlp", schema.PHASE_RECOMPUTE) == "layers.3.mlp recompute"
    assert schema.module_span_name(schema.OPTIMIZER_FQN, schema.PHASE_OPTIMIZER) == schema.OPTIMIZER_FQN
