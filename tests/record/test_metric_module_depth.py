"""metric_module_depth: how many label sets the collective metrics have, per setting.

Measured on the TP + sequence-parallel transformer (torch's test Transformer,
`benchmarks/models/dtensor_transformer.py`) with 4 and 8 layers, one training step over the fake
process group; the referee is the set of module fqns the window counted collectives for
(`get_comm_module_counts`), cut to the depth by hand.
"""

from __future__ import annotations

import pytest
from events import ALL_REDUCE

from hp_otel import CommDebugMode
from hp_otel.record.metric_labels import ALWAYS_ON_DEFAULT, ENV_VAR, parse_depth, resolve_depth
from hp_otel.spans import schema
from hp_otel.spans.infos import ModuleInfo
from hp_otel.testing import metric_points


def _provider():  # type: ignore[no-untyped-def]
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    reader = InMemoryMetricReader()
    return MeterProvider(metric_readers=[reader]), reader


@pytest.mark.parametrize(
    ("value", "depth"), [("full", None), ("FULL", None), ("none", 0), (0, 0), (2, 2), ("3", 3), (" 1 ", 1)]
)
def test_parse(value: object, depth: int | None) -> None:
    assert parse_depth(value) == depth


@pytest.mark.parametrize("bad", [-1, "deep", 1.5, True, "", [1]])
def test_bad_values_name_the_argument_and_what_is_allowed(bad: object) -> None:
    with pytest.raises(ValueError, match=r"metric_module_depth must be 'full', 'none' or an int >= 0"):
        CommDebugMode(metric_module_depth=bad)  # type: ignore[arg-type]


def test_env_var_and_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_VAR, raising=False)
    assert resolve_depth(None, None) is None and resolve_depth(None, ALWAYS_ON_DEFAULT) == 1
    monkeypatch.setenv(ENV_VAR, "none")
    assert resolve_depth(None, ALWAYS_ON_DEFAULT) == 0
    assert resolve_depth("full", ALWAYS_ON_DEFAULT) is None  # the argument wins
    monkeypatch.setenv(ENV_VAR, "sideways")
    with pytest.raises(ValueError, match=ENV_VAR):
        resolve_depth(None, None)


def _series(depth: object) -> list[dict]:
    provider, reader = _provider()
    with CommDebugMode(meter_provider=provider, metric_module_depth=depth) as mode:  # type: ignore[arg-type]
        obs = mode.observer
        for fqn in ("layers.0.attention", "layers.1.attention", "embed"):
            obs.on_module_enter(ModuleInfo(fqn, fqn, "M"), "forward")
            obs.on_collective(ALL_REDUCE, 0, 1000)
            obs.on_module_exit(fqn, "forward")
    assert mode.get_comm_module_counts().keys() == {"layers.0.attention", "layers.1.attention", "embed"}  # unaffected
    return [dict(p.attributes) for p in metric_points(reader, schema.METRIC_CALLS)]


def test_depth_cuts_the_label_and_none_drops_it() -> None:
    labels = {d: sorted(a.get(schema.MODULE_FQN, "<absent>") for a in _series(d)) for d in ("full", 2, 1, "none")}
    assert labels == {
        "full": ["embed", "layers.0.attention", "layers.1.attention"],
        2: ["embed", "layers.*"],  # a container index is one `*`: the blocks share a series
        1: ["embed", "layers"],
        "none": ["<absent>"],
    }
    (merged,) = [p for p in metric_points(_provider_with_calls("none"), schema.METRIC_CALLS)]
    assert merged.value == 3  # merged series keep the sum


def _provider_with_calls(depth: object):  # type: ignore[no-untyped-def]
    provider, reader = _provider()
    with CommDebugMode(meter_provider=provider, metric_module_depth=depth) as mode:  # type: ignore[arg-type]
        for fqn in ("a.x", "b.y", "c"):
            mode.observer.on_module_enter(ModuleInfo(fqn, fqn, "M"), "forward")
            mode.observer.on_collective(ALL_REDUCE, 0, 1000)
            mode.observer.on_module_exit(fqn, "forward")
    return reader


def _cut(fqn: str, depth: int | None, indices: set[str]) -> str | None:
    """The label by hand: the first `depth` parts, a container's child names (`indices`) as `*`."""
    if depth is None:
        return fqn
    return None if depth == 0 else ".".join("*" if p in indices else p for p in fqn.split(".")[:depth])


def _index_names(model) -> set[str]:  # type: ignore[no-untyped-def]
    """The child names of the model's ModuleLists and Sequentials (the referee's idea of an index)."""
    from torch import nn

    return {
        name
        for module in model.modules()
        if isinstance(module, nn.ModuleList | nn.Sequential)
        for name, _ in module.named_children()
    }


@pytest.mark.long  # five DTensor training steps per size (≈25-40 s on a loaded machine)
def test_series_count_per_setting_on_a_transformer(fake_world: int) -> None:
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import distribute_tensor
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from benchmarks.models.dtensor_transformer import Transformer, TransformerShape, parallelize

    counts: dict[int, dict[object, int]] = {}
    for layers in (4, 8):
        torch.manual_seed(0)
        mesh = init_device_mesh("cpu", (fake_world,))
        model = parallelize(Transformer(TransformerShape(layers=layers)), mesh, sequence_parallel=True)
        indices = _index_names(model)
        tokens = distribute_tensor(torch.randint(8, (4, 8)), device_mesh=mesh)
        counts[layers] = {}
        for depth in ("full", 3, 2, 1, "none"):
            provider, reader = _provider()
            with CommDebugMode(model, meter_provider=provider, metric_module_depth=depth, ops=False) as mode:
                with sdpa_kernel(SDPBackend.MATH):
                    model(tokens).sum().backward()
            model.zero_grad(set_to_none=True)
            points = metric_points(reader, schema.METRIC_CALLS)
            # referee: the innermost module of each collective, as the spans say, cut by hand
            parsed = parse_depth(depth)
            spans = [
                sp for sp in mode.get_finished_spans() if sp.attributes.get(schema.CALL_KIND) == schema.KIND_COLLECTIVE
            ]
            expected = {
                (
                    sp.attributes[schema.COLLECTIVE_NAME],
                    sp.attributes[schema.PHASE],
                    _cut(sp.attributes[schema.COLLECTIVE_MODULE], parsed, indices),
                )
                for sp in spans
            }
            got = {
                (p.attributes[schema.COLLECTIVE_NAME], p.attributes[schema.PHASE], p.attributes.get(schema.MODULE_FQN))
                for p in points
            }
            assert got == expected
            assert sum(p.value for p in points) == len(spans)  # merging series loses no call
            counts[layers][depth] = len(points)
        print(f"\n{layers} layers: series of {schema.METRIC_CALLS} per setting: {counts[layers]}")
    for by_depth in counts.values():
        assert by_depth["full"] > by_depth[3] > by_depth[2] >= by_depth[1] > by_depth["none"]
    assert counts[8]["full"] > counts[4]["full"]  # the whole fqn: a label set per layer
    assert {d: n for d, n in counts[8].items() if d != "full"} == {d: n for d, n in counts[4].items() if d != "full"}
