"""Bandwidth across ranks for `hp-otel ranks`: per collective, per group and op, per rank.

Each rank's span carries the NCCL-tests busbw of its own call (`hp_otel.spans.bandwidth`);
on a rank that arrived early that time includes waiting for the others.  The same
collective's bandwidth without arrival skew is its busbw on the rank that arrived last
(shortest duration): the highest across ranks.  Per group and op, and per rank (over
the collectives it took part in), the medians of those skew-free figures say which link
is slow; the lowest is marked when it is lower than every other (ranks of one group
share its collectives, so only ranks on different links can differ).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hp_otel.analysis.listing import LISTED, more_line
from hp_otel.analysis.rank_call import module_where
from hp_otel.analysis.reading import RankFile
from hp_otel.spans.bandwidth import format_rate
from hp_otel.spans.schema import OUTSIDE_FQN


@dataclass(frozen=True)
class CollectiveBandwidth:
    """One collective lined up across ranks: each rank's busbw and the skew-free one."""

    window: str
    group: str
    seq: int
    op: str
    module: str
    per_rank: dict[int, float]  # rank -> its own busbw (bytes/s)

    @property
    def skew_free(self) -> float:
        return max(self.per_rank.values())


@dataclass(frozen=True)
class BandwidthRow:
    """Medians over the collectives of one group and op, or of one rank."""

    label: str
    collectives: int
    median_busbw: float  # skew-free (the last arriver's)
    min_busbw: float  # skew-free, the slowest collective
    median_own_busbw: float  # this rank's own spans (waiting included); for groups: all ranks'


@dataclass(frozen=True)
class BandwidthReport:
    collectives: list[CollectiveBandwidth]
    groups: list[BandwidthRow]  # slowest first
    ranks: list[BandwidthRow]  # slowest first
    in_flight: int = 0  # ranks' calls left out: never completed
    untimed: int = 0  # ranks' calls left out: no bandwidth recorded (a barrier, 0 bytes, a fake group, older files)


def bandwidth_report(files: Sequence[RankFile]) -> BandwidthReport:
    """Line the ranks' bandwidths up by (window, group, seq)."""
    matched: dict[tuple[str, str, tuple[int, ...], int], tuple[str, str, dict[int, float]]] = {}
    in_flight = untimed = 0
    for f in files:
        table = f.calls
        for i, busbw in enumerate(table.busbw):
            if table.in_flight[i]:
                in_flight += 1
            elif busbw <= 0:
                untimed += 1
            else:
                kind = table.kinds[table.kind[i]]
                key = (kind.window, kind.group, kind.group_ranks, table.seq[i])
                found = matched.get(key)
                if found is None:
                    found = matched[key] = (kind.op, kind.module, {})
                found[2][f.rank] = busbw
    collectives = [
        CollectiveBandwidth(key[0], key[1], key[3], op, module, per_rank)
        for key, (op, module, per_rank) in matched.items()
    ]
    by_group: dict[str, list[CollectiveBandwidth]] = {}
    by_rank: dict[int, list[CollectiveBandwidth]] = {}
    for c in collectives:
        by_group.setdefault(f"group {c.group or '?'} {c.op}", []).append(c)
        for rank in c.per_rank:
            by_rank.setdefault(rank, []).append(c)
    groups = [_row(label, cs, [b for c in cs for b in c.per_rank.values()]) for label, cs in by_group.items()]
    ranks = [_row(f"rank {rank}", cs, [c.per_rank[rank] for c in cs]) for rank, cs in sorted(by_rank.items())]
    return BandwidthReport(
        collectives=collectives,
        groups=sorted(groups, key=lambda r: r.median_busbw),
        ranks=sorted(ranks, key=lambda r: r.median_busbw),
        in_flight=in_flight,
        untimed=untimed,
    )


def _row(label: str, collectives: list[CollectiveBandwidth], own: list[float]) -> BandwidthRow:
    skew_free = [c.skew_free for c in collectives]
    return BandwidthRow(label, len(collectives), statistics.median(skew_free), min(skew_free), statistics.median(own))


def format_bandwidth(report: BandwidthReport, top: int = 5) -> list[str]:
    """The report's lines (none when no file has bandwidths)."""
    if not report.collectives:
        return []
    lines = [
        "",
        "bandwidth (NCCL-tests busbw; skew-free = on the rank that arrived last, i.e. the highest across ranks):",
    ]
    for title, rows in (("group and op", report.groups), ("rank", report.ranks)):
        lines.append(f"  {'by ' + title:<28} {'calls':>6}  {'median busbw':>13}  {'slowest':>11}  {'median own':>11}")
        for i, row in enumerate(rows[:LISTED]):
            mark = "  <- slowest" if i == 0 and len(rows) > 1 and row.median_busbw < rows[1].median_busbw else ""
            lines.append(
                f"  {row.label:<28} {row.collectives:>6}  {format_rate(row.median_busbw):>13}"
                f"  {format_rate(row.min_busbw):>11}  {format_rate(row.median_own_busbw):>11}{mark}"
            )
        lines += more_line(len(rows) - LISTED, "rows")
    lines.append("  slowest collectives:")
    for c in slowest(report, top):
        listed = (
            sorted(c.per_rank.items())
            if len(c.per_rank) <= LISTED
            else sorted(c.per_rank.items(), key=lambda rb: rb[1])[:LISTED]
        )
        ranks = ", ".join(f"rank {r} {format_rate(b)}" for r, b in listed)
        ranks += f", ... {len(c.per_rank) - LISTED} more ranks" if len(c.per_rank) > LISTED else ""
        lines.append(
            f"    {c.op} #{c.seq} in {module_where(c.module)}, {c.window}: {format_rate(c.skew_free)} ({ranks})"
        )
    return lines + left_out_line(report)


def left_out_line(report: BandwidthReport) -> list[str]:
    """What the section did not count, and why (none: no line)."""
    reasons = [f"{report.in_flight} in flight"] if report.in_flight else []
    if report.untimed:
        reasons.append(f"{report.untimed} with no bandwidth recorded (a barrier, 0 bytes, torch's fake group)")
    return [f"  left out: {'; '.join(reasons)}"] if reasons else []


def slowest(report: BandwidthReport, top: int) -> list[CollectiveBandwidth]:
    return sorted(report.collectives, key=lambda c: c.skew_free)[:top]


def bandwidth_to_json(report: BandwidthReport, per_collective: bool = True, top: int = 5) -> dict[str, Any]:
    """The rows by group and by rank; every collective only with `per_collective` (it grows with
    ranks x collectives), else the `top` slowest."""

    def row(r: BandwidthRow) -> dict[str, Any]:
        return {
            "label": r.label,
            "collectives": r.collectives,
            "median_busbw_bytes_per_s": r.median_busbw,
            "min_busbw_bytes_per_s": r.min_busbw,
            "median_own_busbw_bytes_per_s": r.median_own_busbw,
        }

    def collective(c: CollectiveBandwidth) -> dict[str, Any]:
        return {
            "window": c.window,
            "group": c.group,
            "seq": c.seq,
            "op": c.op,
            "module": c.module or OUTSIDE_FQN,
            "skew_free_busbw_bytes_per_s": c.skew_free,
            "busbw_bytes_per_s": {str(r): b for r, b in sorted(c.per_rank.items())},
        }

    listed = report.collectives if per_collective else slowest(report, top)
    key = "collectives" if per_collective else "slowest_collectives"
    return {
        "groups": [row(r) for r in report.groups],
        "ranks": [row(r) for r in report.ranks],
        key: [collective(c) for c in listed],
    }
