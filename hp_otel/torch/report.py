"""torch's CommDebugMode table and JSON dump, from torch-shaped records.

Same text as torch 2.13 prints (ANSI colours included), same JSON schema — the input of
torch's comm-mode browser visualiser. One difference: control characters and bidi overrides
in a name (module, op, parameter) are written visibly (`\\x1b`), where torch prints them raw.
Noise levels as torch defines them: 0 module-level collective counts; 1 + module type,
parameter placements and DTensor ops that are not trivial; 2 + every non-trivial op;
3 + trivial ops too.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from hp_otel.common.safe_text import printable
from hp_otel.render.levels import noise_level

TORCH_DEFAULT_NOISE_LEVEL = 3
# torch's set: ops too common to be worth a line below noise level 3
TRIVIAL_OPS = frozenset(
    {
        "aten.detach.default",
        "aten.t.default",
        "aten.view.default",
        "aten._to_copy.default",
        "aten.as_strided.default",
        "aten.transpose.int",
    }
)
_YELLOW = "\033[1;33m"
_RED = "\033[1;31m"
_RESET = "\033[0m"


@dataclass(frozen=True)
class Noise:
    dtensor_ops: bool  # DTensor-level ops (and module data)
    module_data: bool
    all_ops: bool  # local ops too
    trivial_ops: bool

    @classmethod
    def of(cls, level: Any) -> Noise:
        """torch's levels 0-3 (None: torch's default, 3), checked as everywhere else (`render.levels`)."""
        level = noise_level(level, default=TORCH_DEFAULT_NOISE_LEVEL).level
        return cls(level > 0, level > 0, level > 1, level > 2)

    def keeps(self, op: dict[str, Any]) -> bool:
        """torch's rule for an op line (the table applies it; the JSON filters the same way)."""
        if self.trivial_ops:
            return True
        name = str(op["name"])
        if name in TRIVIAL_OPS:
            return False
        return self.all_ops or bool(len(op["input_shape"]))


@dataclass(frozen=True)
class Records:
    """What the renderers read: the drop-in's torch-shaped state."""

    module_helper: dict[str, dict[str, Any]]
    parent_dict: dict[str, list[str]]
    module_counts: dict[str, dict[str, dict[Any, int]]]
    operations: dict[str, dict[str, list[dict[str, Any]]]]

    def split_operations(self, fqn: str, noise: Noise) -> tuple[list[Any], list[Any], list[Any]]:
        """(forward, backward, activation checkpointing) ops of a module; none below noise 1."""
        if not noise.dtensor_ops or fqn not in self.operations:
            return [], [], []
        ops = self.operations[fqn]["operations_list"]
        forward = [op for op in ops if not op["is_bw"]]
        backward = [op for op in ops if op["is_bw"] and not op["is_activation_checkpointing"]]
        recompute = [op for op in ops if op["is_activation_checkpointing"]]
        return forward, backward, recompute


def _name(value: Any) -> str:
    """A name from the model (module, op, parameter, placement): torch prints it raw; here control
    characters and bidi overrides in it are escaped, so only the table's own colour codes reach the terminal."""
    return printable(str(value))


def _section(
    lines: list[str], title: str, depth: int, collectives: dict[Any, int], ops: list[dict[str, Any]], noise: Noise
) -> None:
    """One FORWARD PASS / BACKWARD PASS / ACTIVATION CHECKPOINTING block of a module."""
    count_indent = "  " * (2 * depth + 2)
    detail_indent = "  " * (2 * depth + 3)
    lines.append(f"{'  ' * (2 * depth)}  {title}")
    lines.extend(f"{_YELLOW}{count_indent}*{_name(key)}: {n}{_RESET}" for key, n in collectives.items())
    for op in ops:
        if not noise.keeps(op):
            continue
        lines.append(f"{_YELLOW}{count_indent}**{_name(op['name'])}{_RESET}")
        if len(op["input_shape"]):
            lines.append(f"{_RED}{detail_indent}shape: {_name(op['input_shape'])}{_RESET}")
            lines.append(f"{_RED}{detail_indent}sharding: {_name(op['input_sharding'])}{_RESET}")
            lines.append(f"{_RED}{detail_indent}device mesh: {_name(op['device_mesh'])}{_RESET}")


def tracing_table(records: Records, noise_level: int) -> str:
    noise = Noise.of(noise_level)
    lines: list[str] = []
    for fqn, helper in records.module_helper.items():
        depth = helper["depth"]
        indent = "  " * (2 * depth)
        lines.append(f"{indent}{_name(fqn)}")
        if noise.module_data:
            if "module_type" in helper:
                lines.append(f"{indent}*module type: {_name(helper['module_type'])}")
            if "parameters" in helper:
                lines.append(f"{indent}*Parameter List")
                parameters = helper["parameters"].items()
                lines.extend(f"{indent} *{_name(name)}: {_name(placement)}" for name, placement in parameters)
        counts = records.module_counts.get(fqn, {"forward": {}, "backward": {}})
        forward, backward, recompute = records.split_operations(fqn, noise)
        if counts["forward"] or forward:
            _section(lines, "FORWARD PASS", depth, counts["forward"], forward, noise)
        if counts["backward"] or backward:
            _section(lines, "BACKWARD PASS", depth, counts["backward"], backward, noise)
        if recompute:
            _section(lines, "ACTIVATION CHECKPOINTING", depth, {}, recompute, noise)
    return "".join(line + "\n" for line in lines)


def _jsonable(ops: list[dict[str, Any]], noise: Noise) -> list[dict[str, Any]]:
    kept = [copy.deepcopy(op) for op in ops if noise.keeps(op)]
    for op in kept:
        op["name"] = str(op["name"])
        op["input_sharding"] = [str(v) for v in op["input_sharding"]]
        op["input_shape"] = [str(v) for v in op["input_shape"]]
    return kept


def json_tree(records: Records, noise_level: int, fqn: str = "Global") -> dict[str, Any]:
    """torch's nested dump: one dict per module, children in first-call order."""
    noise = Noise.of(noise_level)
    helper = records.module_helper.get(fqn, {})
    node: dict[str, Any] = {
        "fqn": fqn,
        "module_type": "",
        "parameters": [],
        "children": [],
        "collectives_forward": [],
        "collectives_backward": [],
        "operations_forward": [],
        "operations_backward": [],
    }
    if noise.module_data and "module_type" in helper:
        node["module_type"] = helper["module_type"]
        node["parameters"] = [(name, placement) for name, placement in helper.get("parameters", {}).items()]
    if fqn in records.module_counts:
        for phase in ("forward", "backward"):
            node[f"collectives_{phase}"] = [(str(k), n) for k, n in records.module_counts[fqn][phase].items()]
    forward, backward, recompute = records.split_operations(fqn, noise)
    node["operations_forward"] = _jsonable(forward, noise)
    node["operations_backward"] = _jsonable(backward, noise)
    node["operations_checkpointing"] = _jsonable(recompute, noise)
    node["children"] = [json_tree(records, noise_level, child) for child in records.parent_dict.get(fqn, ())]
    return node
