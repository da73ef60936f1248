"""The metric series key: values by name, mapped onto the schema's metric attribute keys in one place."""

from __future__ import annotations

import pytest

from hp_otel.spans import schema
from hp_otel.spans.codec import MetricKey, metric_attributes
from hp_otel.spans.infos import CollectiveInfo

pytestmark = pytest.mark.torch_free  # needs no torch: not rerun on torch 2.14.1 (tests/support/markers.py)

_INFO = CollectiveInfo(
    name="_c10d_functional.all_reduce", op="all_reduce", group_size=4, dtype="torch.float32", backend="nccl"
)


def test_a_key_names_every_metric_attribute_of_the_schema_in_order() -> None:
    key = MetricKey.of(_INFO, schema.PHASE_BACKWARD, "layers.0")
    assert isinstance(key, tuple) and key.error_type == ""
    attrs = metric_attributes(key)
    assert tuple(attrs) == schema.METRIC_ATTRIBUTE_KEYS
    assert attrs == {
        schema.COLLECTIVE_NAME: "_c10d_functional.all_reduce",
        schema.COLLECTIVE_OP: "all_reduce",
        schema.COLLECTIVE_BACKEND: "nccl",
        schema.COLLECTIVE_GROUP_SIZE: 4,
        schema.COLLECTIVE_DTYPE: "torch.float32",
        schema.PHASE: "backward",
        schema.MODULE_FQN: "layers.0",
    }


def test_a_failed_call_is_its_own_series_with_error_type() -> None:
    ok = MetricKey.of(_INFO, schema.PHASE_FORWARD, "")
    failed = MetricKey.of(_INFO, schema.PHASE_FORWARD, "", TimeoutError("peer gone"))
    assert ok != failed and failed.error_type == "TimeoutError"
    assert metric_attributes(failed) == {**metric_attributes(ok), schema.ERROR_TYPE: "TimeoutError"}
