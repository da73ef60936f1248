"""How much of the module path the collective metrics carry (`hp_otel.module.fqn`): their cardinality.

Each module that issues collectives is one label set per metric per rank; a 96-layer
model has hundreds.  `metric_module_depth` keeps the first k dotted parts of the fqn
(`layers.3.attention` at depth 2 is `layers.*`, at depth 1 `layers`), `"none"` (or 0)
drops the attribute, `"full"` keeps it whole.  Within the kept parts a container index (a
part that is all digits: `nn.ModuleList` / `nn.Sequential` children) becomes `*`, so the label
values are bounded by the model's named structure, not by how many blocks it repeats: an
`nn.Sequential` of blocks at depth 1 is one `*`, whether it holds 2 blocks or 96.  The cut is
made when the series key is made, not with an SDK View: the calls and bytes counters are observable counters over
hp_otel's own totals, and a View that drops an attribute of an observable counter keeps
one of the merged observations instead of their sum (the SDK's asynchronous sum takes
the last value per attribute set), so the totals themselves are merged here.
"""

from __future__ import annotations

from hp_otel.common.env_read import getenv

ENV_VAR = "HP_OTEL_METRIC_MODULE_DEPTH"
FULL = "full"
NONE = "none"
INDEX = "*"  # a container index's label part: one series for all the repeated blocks
ALWAYS_ON_DEFAULT = 1  # the instrumentor's: the model's top-level children, whatever its depth


def parse_depth(value: object, argument: str = "metric_module_depth") -> int | None:
    """`"full"` -> None (keep all), `"none"` or 0 -> 0 (drop), k >= 1 -> k; else an error naming `argument`."""
    if isinstance(value, str):
        text = value.strip().lower()
        if text == FULL:
            return None
        if text == NONE:
            return 0
        if text.isdigit():
            return int(text)
    elif isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    raise ValueError(f"{argument} must be 'full', 'none' or an int >= 0 (module levels kept), got {value!r}")


def resolve_depth(value: object, default: int | None) -> int | None:
    """The depth to use: `value` if given, else $HP_OTEL_METRIC_MODULE_DEPTH if set, else `default`."""
    if value is not None:
        return parse_depth(value)
    env = getenv(ENV_VAR)
    if env is not None and env.strip():
        return parse_depth(env, ENV_VAR)
    return default


class ModuleLabel:
    """The `hp_otel.module.fqn` value of a series for one depth (cached per fqn: the hot path sees few)."""

    __slots__ = ("_cache", "depth")

    def __init__(self, depth: int | None) -> None:
        self.depth = depth
        self._cache: dict[str, str | None] = {}

    def __call__(self, fqn: str) -> str | None:
        """The label for `fqn` (None: the attribute is dropped)."""
        depth = self.depth
        if depth is None:
            return fqn
        cache = self._cache
        if fqn in cache:
            return cache[fqn]
        label = None if depth == 0 else ".".join(INDEX if p.isdigit() else p for p in fqn.split(".")[:depth])
        if len(cache) < 4096:
            cache[fqn] = label
        return label
