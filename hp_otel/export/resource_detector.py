"""Rank identity as an OpenTelemetry resource detector, for any provider.

`hp_otel.rank`, `hp_otel.local_rank`, `hp_otel.world.size` and `hp_otel.run.id` (read by `launcher_env`
from torchrun, SLURM, Open MPI, msrun or Kubeflow variables), with `host.name`,
`process.pid`, and `service.instance.id` = a UUIDv5 of the run id and rank when both are known:
stable for a run and rank (the SDK's own is a random UUID per process: a restarted rank would look
like a new instance, and one rank's series could not be named in advance), in the form and
namespace the semantic conventions recommend for it.
hp_otel's own providers use it; the SDK's `Resource.create()` runs it
for everyone else — `opentelemetry-instrument`, the distro, a provider you build —
when `OTEL_EXPERIMENTAL_RESOURCE_DETECTORS` names `hp_otel` (entry point
`opentelemetry_resource_detector: hp_otel`).
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Mapping
from typing import Any

from opentelemetry.sdk.resources import Resource, ResourceDetector
from opentelemetry.semconv.attributes import service_attributes

from hp_otel.common import launcher_env
from hp_otel.spans import schema


def rank_attributes(environ: Mapping[str, str] = os.environ) -> dict[str, Any]:
    """The resource attributes that say which process of which run this is (unknown ones left out)."""
    attrs: dict[str, Any] = {HOST_NAME: socket.gethostname(), PROCESS_PID: os.getpid()}
    for key, value in (
        (schema.RESOURCE_RANK, launcher_env.global_rank(environ)),
        (schema.RESOURCE_LOCAL_RANK, launcher_env.local_rank(environ)),
        (schema.RESOURCE_WORLD_SIZE, launcher_env.world_size(environ)),
        (schema.RESOURCE_RUN_ID, launcher_env.run_id(environ)),
    ):
        if value is not None:
            attrs[key] = value
    instance = service_instance_id(attrs.get(schema.RESOURCE_RUN_ID), attrs.get(schema.RESOURCE_RANK))
    if instance is not None:
        attrs[SERVICE_INSTANCE_ID] = instance
    return attrs


# Standard keys: service.* from the semantic conventions package (stable there); host.name and
# process.pid are still incubating in every release we accept, so spelled here.
SERVICE_NAME = service_attributes.SERVICE_NAME
SERVICE_INSTANCE_ID = getattr(service_attributes, "SERVICE_INSTANCE_ID", "service.instance.id")  # stable in 1.3x
HOST_NAME = "host.name"
PROCESS_PID = "process.pid"
# The semantic conventions' namespace for a service.instance.id derived as a UUIDv5 (service.instance.id's note).
INSTANCE_ID_NAMESPACE = uuid.UUID("4d63009a-8d0f-11ee-aad7-4c796ed8e320")


def service_instance_id(run_id: Any, rank: Any) -> str | None:
    """A UUIDv5 of `<run id>/rank<r>`: the same for a rank of a run on every start, unique within the run.

    Which value a resource ends with (`build_resource`, one rule): configure()'s resource attributes,
    then OTEL_RESOURCE_ATTRIBUTES, then this one, then any other detector's or the SDK's random UUID."""
    if run_id is None or rank is None or str(run_id) == "":
        return None
    return str(uuid.uuid5(INSTANCE_ID_NAMESPACE, f"{run_id}/rank{rank}"))


class RankResourceDetector(ResourceDetector):
    """The SDK's ResourceDetector interface over `rank_attributes()`."""

    def detect(self) -> Resource:
        return Resource(rank_attributes())

    def is_process_dependent(self) -> bool:
        return True  # process.pid: the SDK re-runs it in a forked child
