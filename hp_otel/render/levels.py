"""Noise levels: what each level shows, decoded once into named flags.

0: collectives only · 1 (default): + DTensor ops · 2: + module boundaries, forward, backward,
recompute and optimizer alike (a backward collective shown without its module reads as if it ran
outside the model) · 3: + redistribute steps and collective detail (dtype, bytes, reduce op,
phase, bandwidth) and the exposed-communication footer.  Every renderer asks these flags, never
the number.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from hp_otel.spans import schema
from hp_otel.spans.call_tree import CallRecord

NOISE_LEVELS = (0, 1, 2, 3)
DEFAULT_NOISE_LEVEL = 1


@dataclass(frozen=True)
class NoiseLevel:
    level: int
    ops: bool  # op lines (hidden ops still indent their collectives)
    modules: bool  # module lines, in every phase
    redistributes: bool
    collective_detail: bool

    def is_node(self, record: CallRecord) -> bool:
        """Whether the record is a node of the tree at this level (it indents what it encloses)."""
        kind = record.kind
        if kind in (schema.KIND_OP, schema.KIND_COLLECTIVE):
            return True
        if kind == schema.KIND_MODULE:
            return self.modules
        return self.redistributes

    def shows(self, record: CallRecord) -> bool:
        """Whether the record is a line of the table / a node of the JSON dump."""
        if record.kind == schema.KIND_OP:
            return self.ops
        return self.is_node(record)


_LEVELS = MappingProxyType(
    {
        level: NoiseLevel(
            level=level,
            ops=level >= 1,
            modules=level >= 2,
            redistributes=level >= 3,
            collective_detail=level >= 3,
        )
        for level in NOISE_LEVELS
    }
)


def noise_level(
    value: Any, argument: str = "noise_level", *, default: int = DEFAULT_NOISE_LEVEL, allow_none: bool = True
) -> NoiseLevel:
    """The level's flags (None means `default`), or a ValueError naming the allowed values.

    The one check of a noise level: CommDebugMode, the renderers, the torch drop-in and
    the command line all call it, so they accept the same values and say the same thing.
    """
    if value is None and allow_none:
        return _LEVELS[default]
    if isinstance(value, NoiseLevel):
        return value
    if isinstance(value, bool) or not isinstance(value, int) or value not in _LEVELS:
        allowed = ", ".join(map(str, NOISE_LEVELS)) + (f" or None (the default, {default})" if allow_none else "")
        raise ValueError(f"{argument} must be one of {allowed}, got {value!r}")
    return _LEVELS[value]
