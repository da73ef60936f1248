"""The rank comparison as text (`hp-otel ranks`) and as JSON (`--json`)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

from hp_otel.analysis.bandwidth import bandwidth_report, bandwidth_to_json, format_bandwidth
from hp_otel.analysis.comparing import GroupReport, RanksReport, Skew
from hp_otel.analysis.listing import LISTED, more_line, ranks_listed
from hp_otel.analysis.rank_call import module_where
from hp_otel.common.rank_set import RankSet
from hp_otel.common.safe_text import printable
from hp_otel.spans import exposure, schema


def _ms(ns: float) -> str:
    return f"{ns / 1e6:.3f} ms"


def _expected_text(report: RanksReport) -> str:
    sizes = [f.world_size for f in report.files if f.world_size]
    return f"world size {max(sizes)}" if sizes else "the ranks their groups name"


# Exit statuses of `hp-otel ranks` (cli.ranks returns them; the verdict line names them).
EXIT_AGREE = 0
EXIT_BAD_INPUT = 2
EXIT_DIVERGE = 3
EXIT_INCOMPLETE = 4


def exit_status(report: RanksReport) -> int:
    """3 when the compared ranks part (whatever else is missing), 4 when they agree but ranks have no file, else 0."""
    if not report.agree:
        return EXIT_DIVERGE
    return EXIT_INCOMPLETE if report.missing_ranks else EXIT_AGREE


def verdict_line(report: RanksReport, top: int = LISTED) -> str:
    if not report.agree:
        return f"verdict: ranks DIVERGE or miss collectives (exit status {EXIT_DIVERGE})"
    if report.missing_ranks:
        return (
            f"verdict: INCOMPLETE: the {len(report.ranks)} ranks given agree, but ranks "
            f"{ranks_listed(report.missing_ranks, top)} have no file (exit status {EXIT_INCOMPLETE})"
        )
    return "verdict: ranks agree"


def format_report(report: RanksReport, top: int = 5) -> str:
    lines = []
    total = sum(len(f.calls) for f in report.files)
    lines.append(
        f"ranks {ranks_listed(report.ranks, top)}: {len(report.files)} files, {total} collectives, "
        f"{len(report.groups)} group windows"
    )
    for note in report.notes:
        lines.append(f"note: {note}")
    missing = report.missing_ranks
    if missing:
        expected = _expected_text(report)
        lines.append(f"note: no file for ranks {ranks_listed(missing, top)} of {expected}: they are not compared")
    for f in report.files:
        if f.unsequenced:
            lines.append(
                f"note: {f.path} has {f.unsequenced} collectives without {schema.COLLECTIVE_SEQ} (not compared)"
            )
    agreeing = [g for g in report.groups if g.agree and not g.absent_ranks]
    folded = {id(g) for g in agreeing} if len(agreeing) > LISTED else set()
    for g in report.groups:
        if id(g) not in folded:
            lines += _group_lines(g, top)
    if folded:
        reached = sorted({g.compared for g in agreeing})
        each = f"{reached[0]}" if len(reached) == 1 else f"{reached[0]}-{reached[-1]}"
        lines += ["", f"{len(agreeing)} other group windows agree ({each} collectives reached by every rank of each)"]
    lines += ["", "stragglers (arrival skew = last issue - first issue, over collectives every rank reached):"]
    lines.append(f"  {'rank':>4}  {'last':>9}  {'others waited':>14}  {'mean skew when last':>20}  {'max skew':>12}")
    for row in report.stragglers[:LISTED]:
        last = f"{row.last}/{row.compared}"
        lines.append(
            f"  {row.rank:>4}  {last:>9}  {_ms(row.total_skew_ns):>14}  {_ms(row.mean_skew_ns):>20}"
            f"  {_ms(row.max_skew_ns):>12}"
        )
    lines += more_line(len(report.stragglers) - LISTED, "ranks")
    worst = largest_skews(report, top)
    if worst and worst[0][0].skew_ns > 0:
        lines.append("  largest skews:")
        for k, g in worst:
            where = module_where(k.module)
            lines.append(f"    {k.op} #{k.seq} in {where}, {g.window}: {_ms(k.skew_ns)}, rank {k.last_rank} last")
    lines += exposure_lines(report)
    lines += format_bandwidth(bandwidth_report(report.files), top)
    lines += ["", verdict_line(report, top)]
    # Module, op and group names and paths come from the files: escaped, not acted on by the terminal.
    return "\n".join(map(printable, lines))


def largest_skews(report: RanksReport, top: int) -> list[tuple[Skew, GroupReport]]:
    return sorted(((k, g) for g in report.groups for k in g.skews), key=lambda kg: -kg[0].skew_ns)[:top]


def _group_lines(g: GroupReport, top: int) -> list[str]:
    """A group window's lines; its rank lists as ranges of at most `top` runs (`ranks_listed`)."""
    verdict = "agree" if g.agree else "DIVERGE" if g.divergence is not None else "INCOMPLETE"
    ranks = ranks_listed(g.group_ranks or g.ranks, top)
    lines = ["", f"group {g.group or '?'} (ranks {ranks}), {g.window or 'no window'}: {verdict} "
             f"({g.compared} collectives reached by every rank)"]  # fmt: skip
    if g.absent_ranks:
        lines.append(f"  no file for ranks {ranks_listed(g.absent_ranks, top)} (not compared)")
    if g.divergence is not None:
        d = g.divergence
        lines.append(f"  first divergence at seq #{d.seq}:")
        shown = sorted(d.calls)
        if len(shown) > LISTED:  # a big group: the ranks that differ from the most common call, and one that does not
            common = Counter(c.signature() for c in d.calls.values()).most_common(1)[0][0]
            odd = [r for r in shown if d.calls[r].signature() != common]
            shown = sorted({*odd[: LISTED - 1], next(r for r in shown if r not in odd)})
        for rank in shown:
            lines.append(f"    rank {rank}: {d.calls[rank].describe()}")
        lines += more_line(len(d.calls) - len(shown), "ranks")
    for m in g.missing[:LISTED]:
        ref = m.reference
        waiting = f"; rank {ranks_listed(m.in_flight_on, top)} waiting in it" if m.in_flight_on else ""
        at = f" at {ref.stack[0]}" if ref.stack else ""  # where the others issued it (stack=, FR frames)
        lines.append(
            f"  hang suspect: rank {m.rank} never reached {ref.op} #{m.seq} in {ref.where()} "
            f"(issued by rank {ranks_listed(m.issued_by, top)}{at}{waiting})"
        )
    lines += more_line(len(g.missing) - LISTED, "ranks that never reached a collective")
    for seq in g.stuck_together:
        lines.append(f"  every rank is waiting in seq #{seq}: the collective itself does not complete")
    return lines


def _skew_json(k: Skew) -> dict[str, Any]:
    return {
        "seq": k.seq,
        "op": k.op,
        "module": k.module or schema.OUTSIDE_FQN,
        "skew_ns": k.skew_ns,
        "last_rank": k.last_rank,
    }


def report_to_json(report: RanksReport, per_collective: bool = True, top: int = 5) -> dict[str, Any]:
    """The report as JSON. `per_collective`: each group's skew per collective and each collective's
    bandwidths (the JSON then grows with ranks x collectives); else the `top` largest skews and slowest
    collectives, and exposure per window and phase only."""
    out: dict[str, Any] = {
        "agree": report.agree,
        "complete": report.complete,
        "exit_status": exit_status(report),
        "ranks": report.ranks,
        "missing_ranks": runs(report.missing_ranks),
        "notes": report.notes,
        "per_collective": per_collective,
        "files": [
            {
                "path": f.path,
                "rank": f.rank,
                "collectives": len(f.calls),
                "exposure": {window: _exposure_json(e, per_collective) for window, e in f.exposure.items()},
            }
            for f in report.files
        ],
        "groups": [_group_json(g, per_collective) for g in report.groups],
        "stragglers": [
            {
                "rank": r.rank,
                "last": r.last,
                "compared": r.compared,
                "total_skew_ns": r.total_skew_ns,
                "mean_skew_ns": r.mean_skew_ns,
                "max_skew_ns": r.max_skew_ns,
            }
            for r in report.stragglers
        ],
        "bandwidth": bandwidth_to_json(bandwidth_report(report.files), per_collective, top),
    }
    if not per_collective:
        out["largest_skews"] = [
            {"window": g.window, "group": g.group, **_skew_json(k)} for k, g in largest_skews(report, top)
        ]
    return out


def runs(ranks: Iterable[int]) -> str:
    """A rank list in the JSON report: strided runs (`0-4095`, `0-16,18-4095`; `RankSet.parse` reads it),
    so no field grows with a group's size."""
    return str(RankSet.of(ranks))


def _exposure_json(e: exposure.ExposureReport, by_module: bool) -> dict[str, Any]:
    shown = e.to_json()
    if not by_module:
        del shown["by_module"]
    return shown


def _group_json(g: GroupReport, per_collective: bool) -> dict[str, Any]:
    out: dict[str, Any] = {
        "window": g.window,
        "group": g.group,
        "group_ranks": runs(g.group_ranks),
        "ranks": runs(g.ranks),
        "compared": g.compared,
        "agree": g.agree,
        "absent_ranks": runs(g.absent_ranks),
        "divergence": None
        if g.divergence is None
        else {"seq": g.divergence.seq, "calls": [c.to_json() for _, c in sorted(g.divergence.calls.items())]},
        "missing": [
            {
                "rank": m.rank,
                "seq": m.seq,
                "op": m.reference.op,
                "module": m.reference.module or schema.OUTSIDE_FQN,
                "issued_by": runs(m.issued_by),
                "in_flight_on": runs(m.in_flight_on),
            }
            for m in g.missing
        ],
        "stuck_together": g.stuck_together,
    }
    if per_collective:
        out["skews"] = [_skew_json(k) for k in g.skews]
    return out


def exposure_lines(report: RanksReport) -> list[str]:
    """Per rank and window: communication time, the part the rank waited for, the overlap (docs/overlap.md)."""
    rows = [(f.rank, window, e) for f in report.files for window, e in f.exposure.items() if e.total.collectives]
    if not rows:
        return []
    hidden = len(rows) - LISTED
    if hidden > 0:  # the ranks that waited most
        rows = sorted(rows, key=lambda r: -r[2].total.exposed_ns)[:LISTED]
    lines = ["", "exposed communication (in flight = union of [issue, completion]; exposed = the rank waited):"]
    lines.append(f"  {'rank':>4}  {'window':<12}  {'in flight':>12}  {'exposed':>12}  {'overlapped':>12}  overlap")
    for rank, window, e in sorted(rows, key=lambda r: (r[1], r[0])):
        t = e.total
        fraction = t.overlap_fraction
        share = f"{fraction:.0%}" if fraction is not None else "-"
        lines.append(
            f"  {rank:>4}  {window or '-':<12}  {_ms(t.comm_ns):>12}  {_ms(t.exposed_ns):>12}"
            f"  {_ms(t.overlapped_ns):>12}  {share:>7}"
        )
        for phase, p in sorted(e.by_phase.items()):
            if len(e.by_phase) > 1:
                lines.append(f"  {'':>4}  {'  ' + phase:<12}  {exposure.describe(p)}")
    if hidden > 0:
        lines += more_line(hidden, "rank windows (those above waited most)")
    return lines
