"""Which collective on one rank is which on another: what the timeline's dashed lines and the trace's flows join.

The key is the collective's process group with its `hp_otel.collective.match.id`, which every
rank derives alike without talking to the others (`record/matching.py`). Spans of an
older hp_otel carry no match id; there the k-th collective of an op in a group on one rank
is the k-th on every other, as ranks run the same program. One place decides this, so the
picture and the Perfetto trace never join different collectives.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hp_otel.spans import schema
from hp_otel.spans.groups import GroupTable


def group_label(attrs: Mapping[str, Any], groups: GroupTable | None = None) -> str:
    """The process group as the spans name it, with its ranks as runs: `tp [0-7]` (a 2-D mesh has two
    groups per rank); `groups`: those the rank's spans describe (a span carries only its group's id)."""
    return (groups or GroupTable()).group_of(attrs).label()


class CollectiveKeys:
    """The cross-rank key of each collective of ONE rank, fed in call order (depth first, as `CallRecord.walk`)."""

    def __init__(self, groups: GroupTable | None = None) -> None:
        self._seen: dict[tuple[str, str], int] = {}
        self._groups = groups

    def key(self, attrs: Mapping[str, Any], op: str, groups: GroupTable | None = None) -> tuple[tuple[Any, ...], int]:
        """(the key, the how-many-th collective of `op` in its group this is on this rank); `groups`:
        the table of the record's spans, when not given at construction."""
        group = group_label(attrs, groups or self._groups)
        index = self._seen[(group, op)] = self._seen.get((group, op), -1) + 1
        match_id = attrs.get(schema.COLLECTIVE_MATCH_ID)
        return ((group, "id", str(match_id)) if match_id else (group, "op", op, index)), index
