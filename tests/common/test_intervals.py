"""The interval arithmetic behind the exposed-communication figures, against a brute-force referee
(sets of integer instants, sharing no code with hp_otel.common.intervals)."""

from __future__ import annotations

import itertools
import random

import pytest

from hp_otel.common import intervals

pytestmark = pytest.mark.torch_free  # needs no torch: not rerun on torch 2.14.1 (tests/support/markers.py)


def _points(spans: list[tuple[int, int]]) -> set[int]:
    return {t for start, end in spans for t in range(start, end)}


def _random_spans(rng: random.Random) -> list[tuple[int, int]]:
    out = []
    for _ in range(rng.randint(0, 8)):
        start = rng.randint(0, 60)
        out.append((start, start + rng.randint(-3, 15)))  # some empty or reversed: dropped
    return out


def test_union_merges_overlapping_and_touching_and_drops_empty() -> None:
    assert intervals.union([(5, 7), (0, 2), (1, 3), (3, 4), (9, 9), (12, 10)]) == [(0, 4), (5, 7)]
    assert intervals.length([(0, 4), (5, 7)]) == 6


def test_hand_cases() -> None:
    flight = [(0, 100)]
    blocked = intervals.union([(0, 5), (60, 100)])
    assert intervals.intersect(flight, blocked) == [(0, 5), (60, 100)]
    assert intervals.subtract(flight, blocked) == [(5, 60)]
    assert intervals.subtract([(0, 10), (20, 30)], [(5, 25)]) == [(0, 5), (25, 30)]
    assert intervals.intersect([], flight) == [] and intervals.subtract(flight, []) == flight


def test_against_point_sets() -> None:
    rng = random.Random(25)
    for _ in range(400):
        a, b = _random_spans(rng), _random_spans(rng)
        ua, ub = intervals.union(a), intervals.union(b)
        assert _points(ua) == _points(a) and intervals.length(ua) == len(_points(a))
        assert all(x[1] < y[0] for x, y in itertools.pairwise(ua))  # sorted, disjoint, not touching
        assert _points(intervals.intersect(ua, ub)) == _points(a) & _points(b)
        assert _points(intervals.subtract(ua, ub)) == _points(a) - _points(b)
