"""Half-open time intervals `[start, end)` in integer nanoseconds: union, intersection, length.

Pure functions on sorted, disjoint lists (what `union` returns), so the exposed-communication
figures (`hp_otel.spans.exposure`) are computed the same way by the recorder, the table,
`hp-otel ranks` and the plot.  Empty and reversed intervals are dropped.
"""

from __future__ import annotations

from collections.abc import Iterable

Interval = tuple[int, int]


def union(intervals: Iterable[Interval]) -> list[Interval]:
    """The intervals merged: sorted, disjoint, none empty (touching ones are joined)."""
    merged: list[Interval] = []
    for start, end in sorted(i for i in intervals if i[1] > i[0]):
        if merged and start <= merged[-1][1]:
            if end > merged[-1][1]:
                merged[-1] = (merged[-1][0], end)
        else:
            merged.append((start, end))
    return merged


def length(merged: Iterable[Interval]) -> int:
    """Total length of disjoint intervals (of `union`'s result)."""
    return sum(end - start for start, end in merged)


def intersect(a: list[Interval], b: list[Interval]) -> list[Interval]:
    """The parts common to two merged lists (one linear sweep)."""
    out: list[Interval] = []
    i = j = 0
    while i < len(a) and j < len(b):
        start = max(a[i][0], b[j][0])
        end = min(a[i][1], b[j][1])
        if end > start:
            out.append((start, end))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def subtract(a: list[Interval], b: list[Interval]) -> list[Interval]:
    """The parts of merged list `a` outside merged list `b`."""
    out: list[Interval] = []
    j = 0
    for start, end in a:
        cursor = start
        while j < len(b) and b[j][1] <= cursor:
            j += 1
        k = j
        while k < len(b) and b[k][0] < end:
            if b[k][0] > cursor:
                out.append((cursor, b[k][0]))
            cursor = max(cursor, b[k][1])
            if cursor >= end:
                break
            k += 1
        if cursor < end:
            out.append((cursor, end))
    return out
