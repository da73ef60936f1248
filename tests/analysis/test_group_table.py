"""A process group described once: collectives carry its id, the members are in one table per window
and file; every reader resolves them there, and the files hp_otel wrote before stay readable."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
from pathlib import Path

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

from hp_otel import CommDebugMode
from hp_otel.analysis import compare_files, report_to_json
from hp_otel.export import providers
from hp_otel.render.chrome_trace import trace_events
from hp_otel.spans import schema
from hp_otel.spans.groups import GroupTable, group
from hp_otel.spans.infos import CollectiveInfo, ModuleInfo

pytestmark = pytest.mark.torch_free

BEFORE = Path(__file__).parent / "data" / "before_group_table"  # written by hp_otel before the group table
BASE = 1_700_000_000_000_000_000
WORLD = CollectiveInfo(
    "_c10d_functional.all_reduce", "all_reduce", 4, "0", (0, 1, 2, 3), (4, 16), (4, 16), "torch.float32", 256, "sum"
)
GATHER = dataclasses.replace(
    WORLD, name="_c10d_functional.all_gather_into_tensor", op="all_gather", output_shape=(16, 16), reduce_op=""
)


def _record(rank: int, world: CollectiveInfo = WORLD, steps: int = 1) -> CommDebugMode:
    """The program the files in BEFORE were written from: rank 1 gathers another shape at seq 1."""
    gather = dataclasses.replace(GATHER, group_size=world.group_size, group_ranks=world.group_ranks)
    with CommDebugMode() as mode:
        for i, info in enumerate([world, gather, world] * steps):
            if rank == 1 and i == 1:
                info = dataclasses.replace(info, input_shape=(5, 16))
            mode.observer.on_module_enter(ModuleInfo(f"layers.{i}", f"layers.{i}", "Block"), "forward")
            start = BASE + i * 10_000_000 + rank * 1000
            ticket = mode.observer.on_collective_issue(info, start)
            mode.observer.on_collective(info, start, start + 2000, None, None, ticket)
            mode.observer.on_module_exit(f"layers.{i}", "forward")
    return mode


def _write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for rank in (0, 1):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setattr(providers, "_default_tracer_provider", None)
        mode = _record(rank)
        spans = tmp_path / f"spans_rank{rank}.json"
        mode.write_spans(spans)
        spans.write_text(re.sub(r'("hp_otel.rank", "value": \{"intValue": )"\d+"', rf'\1"{rank}"', spans.read_text()))
        compact = tmp_path / f"collectives_rank{rank}.json"
        mode.write_collectives(compact)
        payload = json.loads(compact.read_text())
        payload["resource"]["hp_otel.rank"] = rank
        compact.write_text(json.dumps(payload))
        mode.generate_json_dump(tmp_path / f"comm_rank{rank}.json", noise_level=0)
    return tmp_path


def _verdict(folder: Path, pattern: str) -> dict:  # type: ignore[type-arg]
    report = report_to_json(compare_files(sorted(str(p) for p in folder.glob(pattern))))
    (g,) = report["groups"]
    return {
        "members": g["group_ranks"],
        "group": g["group"],
        "absent": g["absent_ranks"],
        "divergence": (g["divergence"]["seq"], sorted(c["rank"] for c in g["divergence"]["calls"])),
        "compared": g["compared"],
        "missing_ranks": report["missing_ranks"],
    }


EXPECTED = {
    "members": "0-3",
    "group": "0",
    "absent": "2,3",
    "divergence": (1, [0, 1]),
    "compared": 3,
    "missing_ranks": "2,3",
}


@pytest.mark.parametrize("pattern", ["spans_rank*.json", "collectives_rank*.json", "comm_rank*.json"])
def test_files_written_before_the_group_table_are_read_as_they_were(tmp_path: Path, pattern: str) -> None:
    old = shutil.copytree(BEFORE, tmp_path / "before")
    assert '"hp.collective.group_ranks": [0, 1, 2, 3]' in (old / "collectives_rank0.json").read_text()
    assert _verdict(old, pattern) == EXPECTED


@pytest.mark.parametrize("pattern", ["spans_rank*.json", "collectives_rank*.json", "comm_rank*.json"])
def test_files_with_the_group_table_say_the_same(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pattern) -> None:  # type: ignore[no-untyped-def]
    folder = _write(tmp_path, monkeypatch)
    assert _verdict(folder, pattern) == EXPECTED


def test_members_are_written_once_per_group_and_window(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = _write(tmp_path, monkeypatch)
    gid = group("0", (0, 1, 2, 3)).id
    compact = json.loads((folder / "collectives_rank0.json").read_text())
    assert compact["version"] == 2 and compact["groups"] == {gid: {"name": "0", "members": "0-3"}}
    assert all(kind[schema.COLLECTIVE_GROUP_ID] == gid for kind in compact["kinds"])
    assert not any(
        schema.COLLECTIVE_GROUP_RANKS in kind or schema.COLLECTIVE_GROUP in kind for kind in compact["kinds"]
    )
    dump = json.loads((folder / "comm_rank0.json").read_text())
    assert dump["groups"] == {gid: {"name": "0", "members": "0-3"}}
    spans = (folder / "spans_rank0.json").read_text()
    assert spans.count(schema.COLLECTIVE_GROUP_MEMBERS) == 1 and spans.count(schema.COLLECTIVE_GROUP_ID) == 3
    assert schema.COLLECTIVE_GROUP_RANKS not in spans


def test_a_picture_names_the_group_by_its_table() -> None:
    mode = _record(0)
    tracks = {
        e["args"]["name"] for e in trace_events({0: mode.get_finished_spans()}, BASE) if e["name"] == "thread_name"
    }
    assert "collectives 0 [0-3]" in tracks


def _otlp_bytes_per_collective(world_size: int) -> float:
    world = dataclasses.replace(WORLD, group_size=world_size, group_ranks=tuple(range(world_size)))
    spans = [s for s in _record(0, world, steps=20).get_finished_spans() if s.name in ("all_reduce", "all_gather")]
    assert len(spans) == 60 and len(GroupTable.of(s.attributes for s in spans).by_id) == 1
    return len(encode_spans(spans).SerializeToString()) / len(spans)


def test_a_collective_span_costs_the_same_bytes_at_4096_ranks_as_at_2() -> None:
    """OTLP protobuf as exported: before the table a world group's member list was on every span
    (≈ 8 kB a span at 4,096 ranks); now its runs are on one span of the window."""
    small, huge = _otlp_bytes_per_collective(2), _otlp_bytes_per_collective(4096)
    assert huge <= 1.01 * small, (small, huge)  # the size itself is a longer varint
