"""Span names: a module span is named by its module's path, bounded by the model (docs/reference/schema.md).

The decision this pins: names come from the code's structure, like an HTTP route template, never
from a call (no shapes, ranks, steps), so the set of distinct names is fixed by the model: the
same after one step or three, one name per module and phase (the path, `<path> backward` for its
backward, so a trace list tells them apart) plus a handful of op, redistribute and collective
names. The referee is torch's own `named_modules()`.
"""

from __future__ import annotations

import pytest
import torch

from hp_otel import CommDebugMode
from hp_otel.spans import schema


def _model(layers: int):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import distribute_tensor

    from benchmarks.models.dtensor_transformer import Transformer, TransformerShape, parallelize

    torch.manual_seed(0)
    mesh = init_device_mesh("cpu", (2,))
    model = parallelize(Transformer(TransformerShape(layers=layers)), mesh, False)
    return model, distribute_tensor(torch.randint(8, (4, 16)), device_mesh=mesh)


def _names(model, tokens, steps: int) -> tuple[set[str], set[str]]:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with CommDebugMode(module=model) as mode, sdpa_kernel(SDPBackend.MATH):
        for _ in range(steps):
            model(tokens).sum().backward()
    spans = mode.get_finished_spans()
    modules = {
        sp.name.removesuffix(" backward") for sp in spans if sp.attributes[schema.CALL_KIND] == schema.KIND_MODULE
    }
    return modules, {sp.name for sp in spans}


@pytest.mark.parametrize("layers", [2, 4])
def test_distinct_span_names_are_the_models_modules_and_do_not_grow_with_steps(fake_world, layers) -> None:
    model, tokens = _model(layers)
    one_modules, one = _names(model, tokens, steps=1)
    three_modules, three = _names(model, tokens, steps=3)
    assert one == three  # steps add spans, never names
    # every module once: its path; the root by its class (its path is "(root)", in hp_otel.module.fqn)
    # (containers that are never called, `layers`: a ModuleList, have no span)
    containers = (torch.nn.ModuleList, torch.nn.ModuleDict)
    expected = {fqn for fqn, m in model.named_modules() if fqn and not isinstance(m, containers)}
    expected.add(type(model).__name__)
    assert one_modules == three_modules == expected
    # besides the modules (forward and backward): a few op names, "redistribute" and the normalised collective ops
    others = one - one_modules - {f"{name} backward" for name in one_modules}
    assert len(others) <= 12 and {"all_reduce", "redistribute"} <= others


def test_the_path_is_also_an_attribute_and_the_class_groups_them(fake_world) -> None:
    """For a backend query by class (all `Linear`s), `hp_otel.module.type`; by path, `hp_otel.module.fqn`."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    model, tokens = _model(2)
    with CommDebugMode(module=model) as mode, sdpa_kernel(SDPBackend.MATH):
        model(tokens).sum().backward()
    for sp in mode.get_finished_spans():
        if (
            sp.attributes[schema.CALL_KIND] == schema.KIND_MODULE
            and sp.attributes[schema.MODULE_FQN] != schema.ROOT_MODULE_FQN
        ):
            phase = sp.attributes[schema.PHASE]
            suffix = {schema.PHASE_FORWARD: "", schema.PHASE_BACKWARD: " backward"}[phase]
            assert sp.name == sp.attributes[schema.MODULE_FQN] + suffix
            assert sp.attributes[schema.MODULE_TYPE].rsplit(".", 1)[-1] in {
                "Linear", "Attention", "FeedForward", "TransformerBlock", "LayerNorm", "Dropout", "Embedding", "GELU"
            }  # fmt: skip
