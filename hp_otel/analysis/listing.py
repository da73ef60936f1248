"""How the text of `hp-otel ranks` lists ranks and rows: in full for a few, cut for thousands."""

from __future__ import annotations

from hp_otel.common.rank_set import ranks_with_exceptions


def ranks_text(ranks: list[int]) -> str:
    """`0-3,6`: runs of ranks shortened (a 1024-rank job missing half its files stays one line)."""
    runs: list[list[int]] = []
    for r in ranks:
        if runs and r == runs[-1][1] + 1:
            runs[-1][1] = r
        else:
            runs.append([r, r])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


# Rows of a per-rank or per-group table the text lists (the rest: a count, and --json for all of
# them), so the text of 4,096 ranks stays a page; the JSON lists every rank and group.
LISTED = 16


def ranks_listed(ranks: list[int]) -> str:
    """`0,1,2` for a few ranks; runs shortened for many (`0-1023`); a long list cut (a DP group's 512 ranks)."""
    if len(ranks) <= LISTED:
        return ",".join(map(str, ranks))
    return ranks_with_exceptions(ranks, LISTED)  # `0-4095 except 17`, `3-4091:8`; at most LISTED runs


def more_line(hidden: int, what: str) -> list[str]:
    return [f"  ... and {hidden} more {what} (--json lists every one)"] if hidden > 0 else []
