"""The rank comparison as text (`hp-otel ranks`) and as JSON (`--json`)."""

from __future__ import annotations

from typing import Any

from hp_otel.common.safe_text import printable
from hp_otel.spans import exposure, schema

# Ops whose shapes legitimately differ between ranks (uneven splits, point to point).
from ranks_before.bandwidth import bandwidth_report, bandwidth_to_json, format_bandwidth
from ranks_before.comparing import RanksReport


def _ms(ns: float) -> str:
    return f"{ns / 1e6:.3f} ms"


def _ranks_text(ranks: list[int]) -> str:
    """`0-3,6`: runs of ranks shortened (a 1024-rank job missing half its files stays one line)."""
    runs: list[list[int]] = []
    for r in ranks:
        if runs and r == runs[-1][1] + 1:
            runs[-1][1] = r
        else:
            runs.append([r, r])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


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


def verdict_line(report: RanksReport) -> str:
    if not report.agree:
        return f"verdict: ranks DIVERGE or miss collectives (exit status {EXIT_DIVERGE})"
    if report.missing_ranks:
        return (
            f"verdict: INCOMPLETE: the {len(report.ranks)} ranks given agree, but ranks "
            f"{_ranks_text(report.missing_ranks)} have no file (exit status {EXIT_INCOMPLETE})"
        )
    return "verdict: ranks agree"


def format_report(report: RanksReport, top: int = 5) -> str:
    lines = []
    total = sum(len(f.calls) for f in report.files)
    lines.append(
        f"ranks {','.join(map(str, report.ranks))}: {len(report.files)} files, {total} collectives, "
        f"{len(report.groups)} group windows"
    )
    for note in report.notes:
        lines.append(f"note: {note}")
    missing = report.missing_ranks
    if missing:
        expected = _expected_text(report)
        lines.append(f"note: no file for ranks {_ranks_text(missing)} of {expected}: they are not compared")
    for f in report.files:
        if f.unsequenced:
            lines.append(
                f"note: {f.path} has {f.unsequenced} collectives without {schema.COLLECTIVE_SEQ} (not compared)"
            )
    for g in report.groups:
        verdict = "agree" if g.agree else "DIVERGE" if g.divergence is not None else "INCOMPLETE"
        lines += ["", f"{g.title()}: {verdict} ({g.compared} collectives reached by every rank)"]
        if g.absent_ranks:
            lines.append(f"  no file for ranks {','.join(map(str, g.absent_ranks))} (not compared)")
        if g.divergence is not None:
            d = g.divergence
            lines.append(f"  first divergence at seq #{d.seq}:")
            for rank in sorted(d.calls):
                lines.append(f"    rank {rank}: {d.calls[rank].describe()}")
        for m in g.missing:
            ref = m.reference
            waiting = f"; rank {','.join(map(str, m.in_flight_on))} waiting in it" if m.in_flight_on else ""
            at = f" at {ref.stack[0]}" if ref.stack else ""  # where the others issued it (stack=, FR frames)
            lines.append(
                f"  hang suspect: rank {m.rank} never reached {ref.op} #{m.seq} in {ref.where()} "
                f"(issued by rank {','.join(map(str, m.issued_by))}{at}{waiting})"
            )
        for seq in g.stuck_together:
            lines.append(f"  every rank is waiting in seq #{seq}: the collective itself does not complete")
    lines += ["", "stragglers (arrival skew = last issue - first issue, over collectives every rank reached):"]
    lines.append(f"  {'rank':>4}  {'last':>9}  {'others waited':>14}  {'mean skew when last':>20}  {'max skew':>12}")
    for row in report.stragglers:
        last = f"{row.last}/{row.compared}"
        lines.append(
            f"  {row.rank:>4}  {last:>9}  {_ms(row.total_skew_ns):>14}  {_ms(row.mean_skew_ns):>20}"
            f"  {_ms(row.max_skew_ns):>12}"
        )
    worst = sorted(((k, g) for g in report.groups for k in g.skews), key=lambda kg: -kg[0].skew_ns)[:top]
    if worst and worst[0][0].skew_ns > 0:
        lines.append("  largest skews:")
        for k, g in worst:
            where = f"Module({k.module})" if k.module else "(outside)"
            lines.append(f"    {k.op} #{k.seq} in {where}, {g.window}: {_ms(k.skew_ns)}, rank {k.last_rank} last")
    lines += exposure_lines(report)
    lines += format_bandwidth(bandwidth_report(report.files), top)
    lines += ["", verdict_line(report)]
    # Module, op and group names and paths come from the files: escaped, not acted on by the terminal.
    return "\n".join(map(printable, lines))


def report_to_json(report: RanksReport) -> dict[str, Any]:
    return {
        "agree": report.agree,
        "complete": report.complete,
        "exit_status": exit_status(report),
        "ranks": report.ranks,
        "missing_ranks": report.missing_ranks,
        "notes": report.notes,
        "files": [
            {
                "path": f.path,
                "rank": f.rank,
                "collectives": len(f.calls),
                "exposure": {window: e.to_json() for window, e in f.exposure.items()},
            }
            for f in report.files
        ],
        "groups": [
            {
                "window": g.window,
                "group": g.group,
                "group_ranks": list(g.group_ranks),
                "ranks": g.ranks,
                "compared": g.compared,
                "agree": g.agree,
                "absent_ranks": g.absent_ranks,
                "divergence": None
                if g.divergence is None
                else {"seq": g.divergence.seq, "calls": [c.to_json() for _, c in sorted(g.divergence.calls.items())]},
                "missing": [
                    {
                        "rank": m.rank,
                        "seq": m.seq,
                        "op": m.reference.op,
                        "module": m.reference.module or "(outside)",
                        "issued_by": m.issued_by,
                        "in_flight_on": m.in_flight_on,
                    }
                    for m in g.missing
                ],
                "stuck_together": g.stuck_together,
                "skews": [
                    {
                        "seq": k.seq,
                        "op": k.op,
                        "module": k.module or "(outside)",
                        "skew_ns": k.skew_ns,
                        "last_rank": k.last_rank,
                    }
                    for k in g.skews
                ],
            }
            for g in report.groups
        ],
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
        "bandwidth": bandwidth_to_json(bandwidth_report(report.files)),
    }


def exposure_lines(report: RanksReport) -> list[str]:
    """Per rank and window: communication time, the part the rank waited for, the overlap (docs/overlap.md)."""
    rows = [(f.rank, window, e) for f in report.files for window, e in f.exposure.items() if e.total.collectives]
    if not rows:
        return []
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
    return lines
