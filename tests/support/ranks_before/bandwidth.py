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

from hp_otel.spans.bandwidth import format_rate
from ranks_before.reading import RankCall, RankFile


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
    left_out: tuple[int, int] = (0, 0)  # in flight, untimed (issue 47's line, as the text is now)


def bandwidth_report(files: Sequence[RankFile]) -> BandwidthReport:
    """Line the ranks' bandwidths up by (window, group, seq)."""
    matched: dict[tuple[str, str, tuple[int, ...], int], list[RankCall]] = {}
    for f in files:
        for call in f.calls:
            if call.busbw > 0 and not call.in_flight:
                matched.setdefault((call.window, call.group, call.group_ranks, call.seq), []).append(call)
    collectives = [
        CollectiveBandwidth(key[0], key[1], key[3], calls[0].op, calls[0].module, {c.rank: c.busbw for c in calls})
        for key, calls in matched.items()
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
        left_out=(
            sum(c.in_flight for f in files for c in f.calls),
            sum(not c.in_flight and c.busbw <= 0 for f in files for c in f.calls),
        ),
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
        for i, row in enumerate(rows):
            mark = "  <- slowest" if i == 0 and len(rows) > 1 and row.median_busbw < rows[1].median_busbw else ""
            lines.append(
                f"  {row.label:<28} {row.collectives:>6}  {format_rate(row.median_busbw):>13}"
                f"  {format_rate(row.min_busbw):>11}  {format_rate(row.median_own_busbw):>11}{mark}"
            )
    slowest = sorted(report.collectives, key=lambda c: c.skew_free)[:top]
    lines.append("  slowest collectives:")
    for c in slowest:
        where = f"Module({c.module})" if c.module else "(outside)"
        ranks = ", ".join(f"rank {r} {format_rate(b)}" for r, b in sorted(c.per_rank.items()))
        lines.append(f"    {c.op} #{c.seq} in {where}, {c.window}: {format_rate(c.skew_free)} ({ranks})")
    in_flight, untimed = report.left_out
    reasons = [f"{in_flight} in flight"] if in_flight else []
    if untimed:
        reasons.append(f"{untimed} with no bandwidth recorded (a barrier, 0 bytes, torch's fake group)")
    return lines + ([f"  left out: {'; '.join(reasons)}"] if reasons else [])


def bandwidth_to_json(report: BandwidthReport) -> dict[str, Any]:
    def row(r: BandwidthRow) -> dict[str, Any]:
        return {
            "label": r.label,
            "collectives": r.collectives,
            "median_busbw_bytes_per_s": r.median_busbw,
            "min_busbw_bytes_per_s": r.min_busbw,
            "median_own_busbw_bytes_per_s": r.median_own_busbw,
        }

    return {
        "groups": [row(r) for r in report.groups],
        "ranks": [row(r) for r in report.ranks],
        "collectives": [
            {
                "window": c.window,
                "group": c.group,
                "seq": c.seq,
                "op": c.op,
                "module": c.module or "(outside)",
                "skew_free_busbw_bytes_per_s": c.skew_free,
                "busbw_bytes_per_s": {str(r): b for r, b in sorted(c.per_rank.items())},
            }
            for c in report.collectives
        ],
    }
