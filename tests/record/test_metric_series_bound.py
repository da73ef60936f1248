"""Prometheus series per rank do not grow with the number of blocks at `metric_module_depth=1`.

Two model shapes, each with 2 and with 8 tensor-parallel MLP blocks, one training step over the
fake process group: the blocks as the model's top-level children (`nn.Sequential`), and the
blocks in a `layers` ModuleList beside a sharded `head`. The series are counted in a real
exposition (OTel's PrometheusMetricReader, `prometheus_client.generate_latest`); the referee for
the module labels is the model's structure (its container children are one `*`). `"full"` is the
control: there the series do grow with the blocks, so the count can tell.
"""

from __future__ import annotations

import pytest

from hp_otel import CommDebugMode

BLOCKS = (2, 8)


def _colwise():  # type: ignore[no-untyped-def]
    from torch.distributed.tensor.parallel import ColwiseParallel

    return ColwiseParallel()


def _rowwise():  # type: ignore[no-untyped-def]
    from torch.distributed.tensor.parallel import RowwiseParallel

    return RowwiseParallel()


_MLP_PLAN = (("fc1", _colwise), ("fc2", _rowwise))  # a block's plan: an all_reduce each way


def _sequential(blocks: int, world: int):  # type: ignore[no-untyped-def]
    """nn.Sequential of TP MLPs: fc1 column-sharded, fc2 row-sharded (an all_reduce each way)."""
    from torch import nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module

    from hp_otel.workloads.tp_mlp import MLP

    model = nn.Sequential(*(MLP() for _ in range(blocks)))
    plan = {f"{i}.{name}": style() for i in range(blocks) for name, style in _MLP_PLAN}
    return parallelize_module(model, init_device_mesh("cpu", (world,)), plan)


def _layers_and_head(blocks: int, world: int):  # type: ignore[no-untyped-def]
    """`layers` (a ModuleList of TP MLPs) then a column-sharded `head` gathered back (an all_gather)."""
    from torch import nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module

    from hp_otel.workloads.tp_mlp import MLP

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.ModuleList(MLP() for _ in range(blocks))
            self.head = nn.Linear(16, 8)

        def forward(self, x):  # type: ignore[no-untyped-def]
            for layer in self.layers:
                x = layer(x)
            return self.head(x)

    plan = {f"layers.{i}.{name}": style() for i in range(blocks) for name, style in _MLP_PLAN}
    plan["head"] = ColwiseParallel(output_layouts=Replicate())
    return parallelize_module(Net(), init_device_mesh("cpu", (world,)), plan)


def _exposition(model, depth: object) -> list[tuple[str, dict[str, str]]]:  # type: ignore[no-untyped-def]
    """hp_otel's samples (name, labels) in the Prometheus exposition after one step."""
    import torch
    from opentelemetry.exporter.prometheus import PrometheusMetricReader
    from opentelemetry.sdk.metrics import MeterProvider
    from prometheus_client import REGISTRY, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    reader = PrometheusMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    try:
        with CommDebugMode(model, meter_provider=provider, metric_module_depth=depth, ops=False):
            model(torch.randn(4, 16, requires_grad=True)).sum().backward()
        text = generate_latest(REGISTRY).decode()
    finally:
        provider.shutdown()  # takes the reader's collector out of the registry
    families = text_string_to_metric_families(text)
    return [(s.name, dict(s.labels)) for f in families for s in f.samples if s.name.startswith("hp_")]


def _modules(samples: list[tuple[str, dict[str, str]]]) -> set[str]:
    return {labels["hp_otel_module_fqn"] for _, labels in samples if "hp_otel_module_fqn" in labels}


@pytest.mark.parametrize(
    ("build", "labels"),
    [(_sequential, {"*"}), (_layers_and_head, {"layers", "head"})],
    ids=["sequential", "layers-and-head"],
)
def test_series_do_not_grow_with_the_blocks_at_depth_1(fake_world: int, build, labels: set[str]) -> None:  # type: ignore[no-untyped-def]
    series = {}
    full = {}
    for blocks in BLOCKS:
        model = build(blocks, fake_world)
        one = _exposition(model, 1)
        assert _modules(one) == labels  # the model's top level; a container's children are one `*`
        assert len({(n, tuple(sorted(lab.items()))) for n, lab in one}) == len(one)  # each sample a series
        series[blocks] = len(one)
        full[blocks] = len(_exposition(model, "full"))
    print(f"\nPrometheus series (hp_otel's) per rank, depth 1: {series}; full: {full}")
    assert series[2] == series[8] > 0
    assert full[8] > full[2]  # the control: whole fqns grow with the blocks
