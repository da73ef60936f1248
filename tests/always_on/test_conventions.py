"""Ecosystem conventions (issue 22, item 5): the instrumentor's declared frameworks, a stable
service.instance.id, the duration histogram's description, the scope's schema URL."""

from __future__ import annotations

import importlib.metadata as metadata

import pytest
from opentelemetry.instrumentation.dependencies import get_dist_dependency_conflicts
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from hp_otel import CommDebugMode
from hp_otel.always_on.instrumentor import HpOtelInstrumentor
from hp_otel.always_on.package import _instruments, _instruments_any
from hp_otel.export.providers import build_resource
from hp_otel.spans import schema

pytestmark = pytest.mark.torch_free  # needs no torch: not rerun on torch 2.14.1 (tests/support/markers.py)


def test_the_instrumentor_declares_the_frameworks_it_instruments_as_contrib_does() -> None:
    (entry,) = [e for e in metadata.entry_points(group="opentelemetry_instrumentor") if e.name == "hp_otel"]
    requires = entry.dist.requires or []
    from packaging.requirements import Requirement

    def key(text: str) -> tuple[str, object]:
        requirement = Requirement(text.split(";")[0])
        return requirement.name, requirement.specifier

    declared_any = {key(r) for r in requires if 'extra == "instruments-any"' in r}
    assert declared_any == {key(r) for r in _instruments_any}  # pyproject.toml repeats package.py
    assert _instruments == () and not any('extra == "instruments"' in r for r in requires)
    # what opentelemetry-instrument checks before loading it: torch is installed here, no conflict
    assert get_dist_dependency_conflicts(entry.dist) is None
    deps = HpOtelInstrumentor().instrumentation_dependencies()
    assert deps == ("torch >= 2.13, < 2.15",) and HpOtelInstrumentor()._check_dependency_conflicts() is None


def _uuid5(name: str) -> str:
    """The semantic conventions' recipe for service.instance.id: UUIDv5 in their namespace."""
    import uuid

    return str(uuid.uuid5(uuid.UUID("4d63009a-8d0f-11ee-aad7-4c796ed8e320"), name))


def test_service_instance_id_is_a_uuid5_of_the_run_and_rank_and_the_same_each_time(monkeypatch) -> None:
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("HP_OTEL_RUN_ID", "run-42")
    first, again = build_resource(), build_resource()
    assert first.attributes["service.instance.id"] == again.attributes["service.instance.id"] == _uuid5("run-42/rank3")
    assert build_resource({schema.RESOURCE_RUN_ID: "other"}).attributes["service.instance.id"] == _uuid5("other/rank3")
    # the precedence: configure()'s attributes, then OTEL_RESOURCE_ATTRIBUTES, then ours, then the SDK's
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "service.instance.id=mine")  # a user's own wins
    assert build_resource().attributes["service.instance.id"] == "mine"
    assert build_resource({"service.instance.id": "given"}).attributes["service.instance.id"] == "given"
    monkeypatch.delenv("OTEL_RESOURCE_ATTRIBUTES")
    monkeypatch.setenv("OTEL_EXPERIMENTAL_RESOURCE_DETECTORS", "hp_otel")  # any provider, through the SDK
    assert Resource.create().attributes["service.instance.id"] == _uuid5("run-42/rank3")


def test_without_a_run_the_sdk_keeps_its_own_instance_id(monkeypatch) -> None:
    for name in (
        "RANK",
        "HP_OTEL_RUN_ID",
        "TORCHELASTIC_RUN_ID",
        "MASTER_ADDR",
        "SLURM_JOB_ID",
        "OMPI_COMM_WORLD_RANK",
    ):
        monkeypatch.delenv(name, raising=False)
    instance = build_resource().attributes.get("service.instance.id", "")
    assert instance not in {_uuid5(f"{run}/rank0") for run in ("", "None")}


def test_the_schema_url_claims_the_release_our_code_attribute_names_come_from() -> None:
    """1.26 named them `code.filepath`/`code.lineno`/`code.function`; the names we emit (and
    `code.function.name` fully qualified) are those of 1.33.0, where the code.* namespace became stable."""
    from opentelemetry.semconv.attributes import code_attributes
    from opentelemetry.semconv.schemas import Schemas

    assert schema.SCHEMA_URL in {released.value for released in Schemas}  # a released schema, not a made-up one
    assert schema.SCHEMA_URL == Schemas.V1_33_0.value
    stable = {code_attributes.CODE_FILE_PATH, code_attributes.CODE_LINE_NUMBER, code_attributes.CODE_FUNCTION_NAME}
    assert {schema.CODE_FILE_PATH, schema.CODE_LINE_NUMBER, schema.CODE_FUNCTION_NAME} == stable


def test_scope_schema_url_and_the_duration_description() -> None:
    from events import collective

    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])
    with CommDebugMode(tracer_provider=tracer_provider, meter_provider=meter_provider) as mode:
        collective(mode.observer)
    (span,) = exporter.get_finished_spans()
    assert span.instrumentation_scope.schema_url == schema.SCHEMA_URL
    scopes = reader.get_metrics_data().resource_metrics[0].scope_metrics
    ours = [sm for sm in scopes if sm.scope.name == schema.INSTRUMENTATION_NAME]
    assert ours and all(sm.scope.schema_url == schema.SCHEMA_URL for sm in ours)
    (duration,) = [m for sm in ours for m in sm.metrics if m.name == schema.METRIC_DURATION]
    assert "issue to its completion" in duration.description and "launch time" not in duration.description


def test_the_steps_scope_has_the_schema_url_too() -> None:
    import hp_otel

    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    with hp_otel.step(7, run_id="r", rank=0, tracer_provider=tracer_provider):
        pass
    spans = exporter.get_finished_spans()
    assert sorted(s.name for s in spans) == ["rank 0", "step 7"]
    assert {(s.instrumentation_scope.name, s.instrumentation_scope.schema_url) for s in spans} == {
        ("hp_otel.always_on.steps", schema.SCHEMA_URL)
    }


def test_op_shapes_are_int_arrays_like_collective_shapes_and_old_files_still_read() -> None:
    from hp_otel.spans import codec
    from hp_otel.spans.infos import TensorInfo

    infos = [
        TensorInfo((4, 16), "torch.float32", True, ("Shard(dim=0)",), (2,)),
        TensorInfo((), "torch.float32", False),  # a scalar
        TensorInfo((32,), "torch.float32", True, ("Replicate()", "Shard(dim=0)"), (2, 4)),
    ]
    attrs = codec.encode_tensor_infos(infos, "input")
    assert attrs[schema.OP_INPUT_SHAPES] == (4, 16, 32) and attrs[schema.OP_INPUT_NDIMS] == (2, 0, 1)
    assert attrs[schema.OP_INPUT_MESH_SHAPES] == (2, 2, 4) and attrs[schema.OP_INPUT_MESH_NDIMS] == (1, 0, 2)
    assert all(type(d) is int for d in attrs[schema.OP_INPUT_SHAPES])
    assert codec.decode_tensor_infos(attrs, "input") == infos
    older = {  # what earlier versions wrote: one "4,16" string per tensor, no ndims
        schema.OP_INPUT_SHAPES: ("4,16", "", "32"),
        schema.OP_INPUT_DTYPES: ("torch.float32",) * 3,
        schema.OP_INPUT_IS_DTENSOR: (True, False, True),
        schema.OP_INPUT_PLACEMENTS: ("Shard(dim=0)", "", "Replicate();Shard(dim=0)"),
        schema.OP_INPUT_MESH_SHAPES: ("2", "", "2,4"),
    }
    assert codec.decode_tensor_infos(older, "input") == infos
