"""The spans file's fast reader (msgspec: only the collective spans decoded) gives what the standard
library's reader gives, file by file, or steps aside (None) so that reader names the problem: the same
RankFile or the same one-line error either way."""

from __future__ import annotations

import copy
import dataclasses
import json

import pytest
from events import ALL_REDUCE

from hp_otel import CommDebugMode
from hp_otel.analysis import RankInputError, rank_input
from hp_otel.analysis.flight_recorder import read_any_rank_file

pytestmark = pytest.mark.torch_free

msgspec = pytest.importorskip("msgspec")  # a dependency of hp_otel (pyproject.toml); the reader runs without it


@pytest.fixture
def spans_payload(monkeypatch) -> dict:  # type: ignore[type-arg]
    from hp_otel.spans.infos import ModuleInfo
    from hp_otel.spans.otlp_json import spans_to_otlp_json

    gather = dataclasses.replace(ALL_REDUCE, name="c10d._allgather_base_", op="all_gather", reduce_op="")
    with CommDebugMode() as mode:
        observer = mode.observer
        for i, info in enumerate([ALL_REDUCE, gather, ALL_REDUCE, ALL_REDUCE]):
            observer.on_module_enter(ModuleInfo(f"layers.{i}", f"layers.{i}", "Block"), "forward")
            start = 1_700_000_000_000_000_000 + i * 10_000_000
            observer.on_collective(info, start, start + 2000, None, None, observer.on_collective_issue(info, start))
            observer.on_module_exit(f"layers.{i}", "forward")
    payload = spans_to_otlp_json(mode.get_finished_spans())
    return json.loads(json.dumps(payload))


def _both(tmp_path, monkeypatch, payload, text: str | None = None):  # type: ignore[no-untyped-def]
    """(fast reader's result or error, standard library's) for the file."""
    path = tmp_path / "spans_rank3.json"
    path.write_text(text if text is not None else json.dumps(payload))
    out = []
    for fast in (True, False):
        with monkeypatch.context() as patch:
            if not fast:
                patch.setattr(rank_input, "msgspec", None)
            try:
                f = read_any_rank_file(str(path))
                out.append((f.rank, list(f.calls), f.unsequenced, f.world_size, f.exposure, f.ring))
            except RankInputError as exc:
                out.append(str(exc))
    return out


def test_the_fast_reader_decodes_the_collectives_alone_and_alike(tmp_path, monkeypatch, spans_payload) -> None:
    data = json.dumps(spans_payload).encode()
    resources, spans = rank_input.fast_collectives("f", data)
    want_resources, want_spans = rank_input.resources_and_collectives("f", json.loads(data))
    assert resources == want_resources and spans == list(want_spans) and len(spans) == 4
    fast, slow = _both(tmp_path, monkeypatch, spans_payload)
    assert fast == slow
    assert [c.op for c in fast[1]] == ["all_reduce", "all_gather", "all_reduce", "all_reduce"]


def _span(payload):  # type: ignore[no-untyped-def]
    return payload["resourceSpans"][0]["scopeSpans"][0]["spans"]


def _collective(payload):  # type: ignore[no-untyped-def]
    return next(s for s in _span(payload) if '"collective"' in json.dumps(s["attributes"]))


def _set(key: str, value):  # type: ignore[no-untyped-def]
    def change(payload) -> None:  # type: ignore[no-untyped-def]
        for kv in _collective(payload)["attributes"]:
            if kv["key"] == key:
                kv["value"] = value

    return change


DAMAGES = {
    "a span that is not an object": lambda p: _span(p).append(7),
    "a stringValue that is no string": _set("hp_otel.collective.op", {"stringValue": 5}),
    "a seq beyond int64": _set("hp_otel.collective.seq", {"intValue": str(2**63)}),
    "a seq as an integral float": _set("hp_otel.collective.seq", {"intValue": 1.0}),
    "a seq with a fraction": _set("hp_otel.collective.seq", {"intValue": 1.5}),
    "a seq as text with spaces": _set("hp_otel.collective.seq", {"intValue": " 2 "}),
    "a group rank that is text": _set("hp.collective.group_ranks", {"arrayValue": {"values": [{"stringValue": "0"}]}}),
    "a shape of a bool": _set("hp_otel.collective.input.shape", {"arrayValue": {"values": [{"intValue": True}]}}),
    "a value that is not an object": _set("hp_otel.collective.dtype", "torch.float32"),
    "a null stringValue": _set("hp_otel.collective.op", {"stringValue": None}),
    "a double value as text": _set("hp_otel.collective.busbw", {"doubleValue": "1e9"}),
    "a kvlist value": _set("hp_otel.collective.module", {"kvlistValue": {"values": []}}),
    "null scope spans": lambda p: p["resourceSpans"][0].update(scopeSpans=None),
    "a null resource entry": lambda p: p["resourceSpans"].append(None),
    "no resourceSpans": lambda p: p.pop("resourceSpans"),
    "start time as a float": lambda p: _collective(p).update(startTimeUnixNano=1.0e18),
    "start time as nonsense": lambda p: _collective(p).update(startTimeUnixNano="soon"),
    "a name that is a number": lambda p: _collective(p).update(name=5),
    "also a Flight Recorder dump's keys": lambda p: p.update(entries=[], pg_config={}),
    "also a collectives file's format": lambda p: p.update(format="hp_otel.collectives"),
    "a second resource of another rank": lambda p: p["resourceSpans"].append(
        {"resource": {"attributes": [{"key": "hp_otel.rank", "value": {"intValue": "4"}}]}, "scopeSpans": []}
    ),
}


@pytest.mark.parametrize("damage", DAMAGES.values(), ids=DAMAGES.keys())
def test_a_damaged_or_unusual_file_reads_the_same_either_way(tmp_path, monkeypatch, spans_payload, damage) -> None:
    payload = copy.deepcopy(spans_payload)
    damage(payload)
    fast, slow = _both(tmp_path, monkeypatch, payload)
    assert fast == slow


@pytest.mark.parametrize(
    "text",
    [
        '{"resourceSpans": [{"scopeSpans": [{"spans": [{"name": "x", "attributes": [], "startTimeUnixNano": NaN}]}]}]}',
        '{"resourceSpans": [], "resourceSpans": [1]}',
        '{"resourceSpans": [{"scopeSpans": [{"spans": [{"name": "\\ud800"}]}]}]}',
        '{"resourceSpans": ',
    ],
    ids=["NaN", "a repeated key", "a lone surrogate", "truncated"],
)
def test_json_the_fast_decoder_reads_otherwise_goes_the_general_way(tmp_path, monkeypatch, text) -> None:
    fast, slow = _both(tmp_path, monkeypatch, None, text)
    assert fast == slow
