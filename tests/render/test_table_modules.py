"""Noise level 2 shows every collective under the module calls that enclose it, backward ones too
(issue 35 item 3: before, a backward collective printed at column 0, as if outside the model).

The referee is a TorchDispatchMode with its own forward hooks (tests/support/referee.py): the
counts read off the table's nesting, per module and phase, must equal its counts.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict

import pytest
from referee import Referee

from hp_otel import CommDebugMode
from hp_otel.workloads.tp_transformer import build_tp_transformer, demo_tokens

_PHASES = {"enter": "forward", "backward": "backward", "recompute": "recompute", "optimizer": "optimizer"}
_MODULE = re.compile(r"^( *)Module +Module\((.*)\) \[(\w+)\]$")
_COLLECTIVE = re.compile(r"^( *)Collective +Collective\(([^)]*)\)")


def _counts_by_nesting(table: str) -> dict[str, dict[str, dict[str, int]]]:
    """Each collective counted once for every module line above it in the tree, in that line's phase."""
    counts: dict[str, dict[str, Counter[str]]] = defaultdict(lambda: defaultdict(Counter))
    enclosing: list[tuple[int, str, str]] = []  # (indent, fqn, phase)
    for line in table.splitlines()[2:]:
        module, collective = _MODULE.match(line), _COLLECTIVE.match(line)
        indent = len((module or collective).group(1)) if (module or collective) else None
        if indent is None:
            continue
        enclosing = [e for e in enclosing if e[0] < indent]
        if module:
            enclosing.append((indent, module.group(2), _PHASES[module.group(3)]))
        elif collective:
            for fqn, phase in {(fqn, phase) for _, fqn, phase in enclosing}:
                counts[fqn][phase][collective.group(2)] += 1
    return {fqn: {phase: dict(c) for phase, c in phases.items()} for fqn, phases in counts.items()}


def test_level_2_puts_the_tp_mlps_backward_all_reduce_under_fc1(tp_mlp) -> None:
    model, x = tp_mlp
    with CommDebugMode(module=model) as mode:
        model(x).sum().backward()
    lines = mode.generate_comm_debug_tracing_table(noise_level=2).splitlines()
    all_reduce = "Collective(_c10d_functional.all_reduce) group_size=2 input_shape=(4, 16) output_shape=(4, 16)"
    assert lines[-4:] == [
        "Module               Module((root)) [backward]",
        "  Module             Module(fc2) [backward]",
        "  Module             Module(fc1) [backward]",
        f"    Collective       {all_reduce}",
    ]


@pytest.mark.parametrize("model_name", ["mlp", "transformer"])
def test_level_2_nesting_counts_equal_the_referees(fake_world, tp_mlp, model_name: str) -> None:
    if model_name == "mlp":
        model, x = tp_mlp
    else:
        model, x = build_tp_transformer(fake_world), demo_tokens()
    with Referee(model) as referee, CommDebugMode(module=model) as mode:
        model(x).sum().backward()
    table = mode.generate_comm_debug_tracing_table(noise_level=2)
    assert not [line for line in table.splitlines() if line.startswith("Collective")]  # none outside the model
    assert _counts_by_nesting(table) == referee.module_counts_dict()
