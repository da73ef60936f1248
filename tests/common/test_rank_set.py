"""RankSet: a group's members as strided runs, the same for every size to hash, compare and pickle."""

from __future__ import annotations

import itertools
import pickle
import random
import time

import pytest

from hp_otel.common.rank_set import RankSet, ranks_with_exceptions, union

pytestmark = pytest.mark.torch_free


@pytest.mark.parametrize(
    ("ranks", "text"),
    [
        ((), ""),
        ((0, 1), "0,1"),
        (tuple(range(4096)), "0-4095"),
        (tuple(range(3, 4096, 8)), "3-4091:8"),
        ((0, 1, 2, 3, 7, 9, 11), "0-3,7-11:2"),
        ((5, 2, 9), "5,2,9"),  # group order is kept: member i is the rank of group rank i
    ],
)
def test_text_round_trips_and_iterates_as_the_ranks(ranks: tuple[int, ...], text: str) -> None:
    members = RankSet.of(ranks)
    assert str(members) == text and RankSet.parse(text) == members
    assert tuple(members) == ranks and len(members) == len(ranks) and members == ranks
    assert all(members[i] == r for i, r in enumerate(ranks)) and all(r in members for r in ranks)
    assert -1 not in members and 4096 not in members


def test_hash_compare_and_pickle_do_not_grow_with_the_group() -> None:
    small, huge = RankSet.of(range(2)), RankSet.of(range(16_384))
    assert len(pickle.dumps(huge)) <= len(pickle.dumps(small)) + 8
    assert pickle.loads(pickle.dumps(huge)) == huge and hash(pickle.loads(pickle.dumps(huge))) == hash(huge)
    assert huge.runs == ((0, 16_383, 1),)


@pytest.mark.parametrize("text", ["a", "3-1", "0-5:2", "-1", "0-4:0"])
def test_bad_text_is_a_clear_error(text: str) -> None:
    with pytest.raises(ValueError, match="group members"):
        RankSet.parse(text)


def test_a_rank_list_with_few_gaps_reads_as_the_run_except_them() -> None:
    assert ranks_with_exceptions([r for r in range(4096) if r != 17], 16) == "0-4095 except 17"
    assert ranks_with_exceptions(range(0, 4096, 2), 16) == "0-4094:2"
    many = ranks_with_exceptions(range(0, 4096, 3 * 7), 2)
    assert many == "0-4095:21"
    scattered = ranks_with_exceptions([1, 5, 6, 20, 40, 41, 90], 3)
    assert scattered.startswith("1,5,6,...") and "(7 ranks in" in scattered


@pytest.mark.parametrize(
    ("text", "ranks"),
    [
        ("0-1", (0, 1)),
        ("0-4:2,6", (0, 2, 4, 6)),
        ("0,1,2", (0, 1, 2)),
        ("0-3,4-7", tuple(range(8))),
        ("9-12,3", (9, 10, 11, 12, 3)),
    ],
)
def test_one_member_list_has_one_form_however_it_was_written(text: str, ranks: tuple[int, ...]) -> None:
    # files and spans carry the text and readers key calls on it: two forms of one group split its calls
    written, listed, built = RankSet.parse(text), RankSet.of(ranks), RankSet(RankSet.parse(text).runs)
    assert written == listed == built and hash(written) == hash(listed) == hash(built)
    assert str(written) == str(listed) == str(built) and tuple(written) == ranks


def test_runs_given_directly_read_as_the_listed_ranks() -> None:
    rng = random.Random(7)
    for _ in range(2_000):
        if rng.random() < 0.5:
            ranks = sorted(rng.sample(range(64), rng.randint(0, 20)))
        else:
            ranks = list(range(rng.randint(0, 9)))
        # split the list into arbitrary runs of single ranks and steps as a writer might
        runs, i = [], 0
        while i < len(ranks):
            j = i + rng.randint(1, 3)
            chunk = ranks[i:j]
            if len(chunk) > 1 and len({b - a for a, b in itertools.pairwise(chunk)}) == 1:
                runs.append((chunk[0], chunk[-1], chunk[1] - chunk[0]))
            else:
                runs.extend((r, r, 1) for r in chunk)
            i = j
        assert RankSet(tuple(runs)) == RankSet.of(ranks) and str(RankSet(tuple(runs))) == str(RankSet.of(ranks))


def test_a_long_run_costs_the_same_to_build_as_a_short_one() -> None:
    # the canonical form is found without listing the members: 3 million ranks build as fast as 3
    start = time.perf_counter()
    for _ in range(1_000):
        RankSet(((0, 3_000_000, 1), (3_000_002, 6_000_002, 2)))
    assert time.perf_counter() - start < 1.0


def _random_group(rng: random.Random) -> RankSet:
    start, step = rng.randrange(0, 40), rng.choice((1, 1, 2, 3, 8))
    ranks = list(range(start, start + step * rng.randint(0, 30), step))
    if rng.random() < 0.3:  # a scattered group, in the order its creator gave
        ranks = rng.sample(range(100), rng.randint(0, 12))
    return RankSet.of(ranks)


def test_without_among_and_union_agree_with_set_arithmetic_on_the_listed_ranks() -> None:
    # the referee lists every member; RankSet never does (a 3-million-rank group's absent ranks are one run)
    rng = random.Random(11)
    for _ in range(3_000):
        group, files = _random_group(rng), set(rng.sample(range(120), rng.randint(0, 40)))
        assert tuple(group.without(files)) == tuple(r for r in group if r not in files)
        assert group.among(files) == [r for r in group if r in files]
        groups = [_random_group(rng) for _ in range(rng.randint(0, 4))]
        assert tuple(union(groups)) == tuple(sorted({r for g in groups for r in g}))


def test_runs_with_exceptions_read_off_the_runs_as_off_the_list() -> None:
    rng = random.Random(5)
    for _ in range(2_000):
        ranks = sorted(rng.sample(range(200), rng.randint(1, 150)))
        assert ranks_with_exceptions(RankSet.of(ranks), 4) == ranks_with_exceptions(list(ranks), 4)
    huge = RankSet.parse("0-16,18-2999999")
    assert ranks_with_exceptions(huge, 16) == "0-2999999 except 17"


def test_a_world_of_millions_less_its_files_costs_its_runs() -> None:
    world = RankSet(((0, 2_999_999, 1),))
    start = time.perf_counter()
    absent = union([world, RankSet.parse("0-2999992:8,3000005")]).without(range(0, 4096, 2))
    assert time.perf_counter() - start < 0.5
    assert len(absent) == 3_000_001 - 2048 and len(absent.runs) <= 4
    assert 4095 in absent and 4094 not in absent and 2_999_999 in absent and 3_000_005 in absent
