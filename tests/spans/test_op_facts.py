"""What hp_otel knows per normalised op covers exactly `schema.NORMALISED_OPS`, wherever it is kept:
the NCCL-tests bandwidth rule (`spans/bandwidth.py`), the timeline's colour (`render/timeline.py`),
Flight Recorder's names (`analysis/flight_recorder.py`), the ranks comparison's op sets
(`analysis/rank_call.py`). An op added to the schema and not to one of them, or a stale entry in
one of them, fails here by name (docs/how-it-works/architecture.md's change table lists them).
The engines' own name -> op tables are checked by tests/sources/test_normalised_ops.py."""

from __future__ import annotations

import pytest

from hp_otel.analysis import flight_recorder, rank_call
from hp_otel.render.timeline import COLLECTIVE_COLOURS
from hp_otel.spans import bandwidth, schema

pytestmark = pytest.mark.torch_free

OPS = frozenset(schema.NORMALISED_OPS)
# No Flight Recorder profiling name is read as "p2p" (the functional batch of sends and receives):
# named here, so that mapping one, or another op going unnamed, is a deliberate change.
FR_UNNAMED = frozenset({"p2p"})


def test_the_schema_lists_each_op_once() -> None:
    assert len(OPS) == len(schema.NORMALISED_OPS)


def test_every_op_has_a_bandwidth_rule_or_is_declared_without_one() -> None:
    rules = frozenset(bandwidth._RULES)
    assert not rules & bandwidth.NO_BANDWIDTH, "an op both with and without a bandwidth rule"
    assert sorted(OPS - rules - bandwidth.NO_BANDWIDTH) == [], "no bandwidth rule, nor in NO_BANDWIDTH"
    assert sorted((rules | bandwidth.NO_BANDWIDTH) - OPS) == [], "not a normalised op"
    for op in OPS:  # the rule is what nccl_size reads: an op without one gets no size
        assert (bandwidth.nccl_size(op, 8, 2) > 0) is (op in rules), op


def test_every_op_has_its_timeline_colour() -> None:
    assert sorted(OPS - set(COLLECTIVE_COLOURS)) == [], "drawn in OTHER_COLLECTIVE, missing from the legend"
    assert sorted(set(COLLECTIVE_COLOURS) - OPS) == [], "not a normalised op"


def test_flight_recorder_reads_its_names_as_normalised_ops() -> None:
    read_as = set(flight_recorder._OPS.values())
    assert sorted(read_as - OPS) == [], "not a normalised op"
    assert sorted(OPS - FR_UNNAMED - read_as) == [], "no Flight Recorder name is read as these ops"
    assert not read_as & FR_UNNAMED, "now read from Flight Recorder: take it out of FR_UNNAMED"


def test_the_ranks_comparison_names_normalised_ops() -> None:
    assert rank_call.SHAPE_FREE_OPS <= OPS
    assert rank_call.P2P_OPS <= OPS
