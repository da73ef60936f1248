"""What MLflow's trace list shows of a step: its name and a one-line input, on the step's root span.

Jaeger, Tempo and Phoenix list a trace by its root span's name (`step 12`). MLflow lists it by the
trace's `mlflow.traceName` tag and its root span's `mlflow.spanInputs` / `mlflow.spanOutputs`, which
its OTLP endpoint reads from the root span's attributes (`mlflow.traceTag.<tag>` becomes a tag); with
none, every row reads `-`. Those keys are MLflow's, so they are set only where the spans go to MLflow:
its OTLP endpoint takes spans only with the `x-mlflow-experiment-id` header (docs/guide/mlflow.md), and
that header in the traces exporter's headers is the sign.
"""

from __future__ import annotations

import json
import urllib.parse
from typing import Any

from hp_otel.common.env_read import getenv
from hp_otel.spans import schema

MLFLOW_EXPERIMENT_HEADER = "x-mlflow-experiment-id"
_HEADER_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "OTEL_EXPORTER_OTLP_HEADERS")


def _header_names(value: str) -> set[str]:
    """The names in an OTEL_EXPORTER_OTLP_*HEADERS value (`name=value,...`, percent-encoded), lowercased."""
    return {urllib.parse.unquote(item.split("=", 1)[0]).strip().lower() for item in value.split(",") if "=" in item}


def exporting_to_mlflow() -> bool:
    """Whether the spans go to an MLflow server: its experiment header in the configured or the variables' headers."""
    from hp_otel.export.telemetry import configured

    telemetry = configured()
    if telemetry is not None and any(k.lower() == MLFLOW_EXPERIMENT_HEADER for k in telemetry.config.headers):
        return True
    for variable in _HEADER_VARIABLES:
        value = getenv(variable)
        if value:  # the traces variable wins over the general one, as the exporter reads them
            return MLFLOW_EXPERIMENT_HEADER in _header_names(value)
    return False


def mlflow_root_attributes(step: int | str, run_id: str, world_size: int | None) -> dict[str, Any]:
    """The step root span's attributes MLflow lists a trace by: its name and what the step was run on."""
    inputs: dict[str, Any] = {"step": step, "run": run_id}
    if world_size is not None:
        inputs["ranks"] = world_size
    return {
        "mlflow.traceTag.mlflow.traceName": schema.step_span_name(step),
        "mlflow.spanInputs": json.dumps(inputs),
    }
