"""How the text of `hp-otel ranks` lists ranks and rows: in full for a few, cut for thousands."""

from __future__ import annotations

from collections.abc import Sequence

from hp_otel.common.rank_set import RankSet, ranks_with_exceptions


def ranks_text(ranks: Sequence[int]) -> str:
    """`0-3,6`: runs of ranks shortened (a 1024-rank job missing half its files stays one line); a
    RankSet is read off its runs (a 3-million-rank run is one piece, never listed)."""
    runs = ranks.runs if isinstance(ranks, RankSet) else [(r, r, 1) for r in ranks]
    pieces: list[list[int]] = []  # [first, last, step]; step-1 stretches merged with their neighbours
    for first, last, step in runs:
        if step == 1 or last - first <= 2 * step:  # a short strided run reads better as its ranks
            for a, b in [(first, last)] if step == 1 else [(r, r) for r in range(first, last + 1, step)]:
                if pieces and pieces[-1][2] == 1 and a == pieces[-1][1] + 1:
                    pieces[-1][1] = b
                else:
                    pieces.append([a, b, 1])
        else:
            pieces.append([first, last, step])
    return ",".join(str(a) if a == b else f"{a}-{b}" if step == 1 else f"{a}-{b}:{step}" for a, b, step in pieces)


# Rows of a per-rank or per-group table the text lists (the rest: a count, and --json for all of
# them), so the text of 4,096 ranks stays a page; the JSON lists every rank and group.
LISTED = 16


def ranks_listed(ranks: Sequence[int], top: int = LISTED) -> str:
    """A rank list as ranges, never rank by rank: `0-3`, `0-4095 except 17`, `3-4091:8`; at most `top`
    runs (or excepted runs), then a count (`0-7,9-15,... (4000 ranks in 300 runs)`): one line whatever
    the group. A RankSet is read off its runs (a 3-million-rank run is one piece, never listed)."""
    return ranks_with_exceptions(ranks, max(1, top))


def more_line(hidden: int, what: str) -> list[str]:
    return [f"  ... and {hidden} more {what} (--json lists every one)"] if hidden > 0 else []
