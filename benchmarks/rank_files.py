"""N ranks' spans files from one recorded step, with faults planted: the input of `python -m benchmarks --ranks`.

The llama step (`llama.py`) runs once on torch's fake process group as rank 0 of a
(2 x tp) mesh; its spans file is then re-keyed per rank of an (N / tp) x tp mesh: the
resource's rank and world size, each collective's group (name, ranks, size), and its
times (each rank's own small jitter).  Every other span is the template's, byte for byte.
Planted: a hang (a rank that never reaches its TP group's last collectives, the rest of
its group waiting in the first of them), a desync (another shape at one seq) and a
straggler (one rank late to every collective).
"""

from __future__ import annotations

import json
import os
import random
import re
from dataclasses import dataclass, field
from typing import Any

from hp_otel.common.rank_set import RankSet
from hp_otel.spans import groups, schema
from hp_otel.spans.groups import GroupTable

TEMPLATE_DP = 2  # the recorded world: (TEMPLATE_DP x tp) ranks, recorded as rank 0
JITTER_NS = 1_000_000  # each rank issues each collective up to 1 ms after the template
_SLOT = "@@hp-slot-{}@@"
_SLOT_RE = re.compile(r'"@@hp-slot-(\d+)@@"')


@dataclass(frozen=True)
class PlantedFaults:
    """Which ranks misbehave, and how (`plant_faults` picks them in three different TP groups)."""

    hang_rank: int
    hang_from_end: int  # the hanging rank misses its TP group's last `hang_from_end` collectives
    desync_rank: int
    desync_seq: int  # on the desync rank's TP group: its input shape differs there
    straggler_rank: int
    late_ns: int

    def to_json(self) -> dict[str, int]:
        return dict(self.__dict__)


def check_mesh(ranks: int, tp: int) -> None:
    """ValueError unless `ranks` make 3 or more whole TP groups of `tp` (one per planted fault)."""
    if ranks % tp or ranks // tp < 3:
        raise ValueError(f"--ranks must be a multiple of --tp ({tp}) of at least {3 * tp} (a TP group per planted "
                         f"fault), got {ranks}")  # fmt: skip


def plant_faults(ranks: int, tp: int, seqs_per_tp_group: int) -> PlantedFaults:
    """A hang in the last TP group, a desync in the second, a straggler in the middle one."""
    check_mesh(ranks, tp)
    groups = ranks // tp
    return PlantedFaults(
        hang_rank=ranks - 3,
        hang_from_end=3,
        desync_rank=tp + 2,
        desync_seq=seqs_per_tp_group // 2,
        straggler_rank=(groups // 2) * tp + 1,
        late_ns=20_000_000,
    )


def record_template(tp: int) -> dict[str, Any]:
    """The llama step (two steps, one window) as rank 0 of a (TEMPLATE_DP x tp) fake world: its OTLP/JSON."""
    import torch

    from benchmarks.models.llama import build_llama_step
    from hp_otel import CommDebugMode
    from hp_otel.spans.otlp_json import spans_to_otlp_json
    from hp_otel.workloads.process_groups import fake_process_group

    torch.set_num_threads(1)
    fake_process_group(TEMPLATE_DP * tp)
    model, step = build_llama_step(TEMPLATE_DP, tp)
    step()  # warm: the first step builds DTensor's caches
    with CommDebugMode(module=model) as mode:
        step()
        step()
    return spans_to_otlp_json(mode.get_finished_spans())


def _attrs(span: dict[str, Any]) -> dict[str, Any]:
    return {kv["key"]: kv["value"] for kv in span.get("attributes", ())}


def _ints(values: Any) -> dict[str, Any]:
    return {"arrayValue": {"values": [{"intValue": str(v)} for v in values]}}


@dataclass
class _Template:
    """The template file split into fixed text and the slots re-keyed per rank."""

    texts: list[str]  # literal JSON between slots
    slots: list[int]  # slot i of the text: index into `collectives`, or -1 for the resource
    resource: dict[str, Any]
    collectives: list[dict[str, Any]]
    tp: int
    tp_seqs: int  # collectives per window on the TP group (the world layout: on the world group)
    tp_group: str = ""  # the TP group's id in the template
    # The world layout: every collective on one world-sized group (as FSDP over all ranks), numbered
    # in issue order (template index -> seq); empty: the (N / tp) x tp mesh layout.
    world_seq: dict[int, int] = field(default_factory=dict)


def split_template(payload: dict[str, Any], tp: int, layout: str = "mesh") -> _Template:
    """Mark the resource and every collective span as slots; everything else is dumped once.
    `layout`: "mesh" (TP and DP groups) or "world" (every collective on the world group)."""
    collectives: list[dict[str, Any]] = []
    resource: dict[str, Any] = {}
    entries = payload.get("resourceSpans", [])
    for entry in entries:
        resource = entry.get("resource", {})
        entry["resource"] = _SLOT.format("r")
        for scope in entry.get("scopeSpans", ()):
            spans = scope.get("spans", [])
            for i, span in enumerate(spans):
                if _attrs(span).get(schema.CALL_KIND, {}).get("stringValue") == schema.KIND_COLLECTIVE:
                    spans[i] = _SLOT.format(len(collectives))
                    collectives.append(span)
    text = json.dumps(payload).replace(f'"{_SLOT.format("r")}"', '"@@hp-slot-999999999@@"')
    parts = _SLOT_RE.split(text)
    texts, slots = parts[0::2], [(-1 if p == "999999999" else int(p)) for p in parts[1::2]]
    groups = GroupTable.of({k: v.get("stringValue") for k, v in _attrs(c).items()} for c in collectives)
    tp_group = next(gid for gid, g in groups.by_id.items() if g.members == RankSet.of(range(tp)))
    tp_seqs = sum(1 for c in collectives if _group_id(c) == tp_group)
    if layout == "world":
        order = sorted(range(len(collectives)), key=lambda i: int(collectives[i]["startTimeUnixNano"]))
        world_seq = {i: seq for seq, i in enumerate(order)}
        return _Template(texts, slots, resource, collectives, tp, len(collectives), tp_group, world_seq)
    return _Template(texts, slots, resource, collectives, tp, tp_seqs, tp_group)


def _group_id(span: dict[str, Any]) -> str:
    return str(_attrs(span)[schema.COLLECTIVE_GROUP_ID]["stringValue"])


def _int_attr(span: dict[str, Any], key: str) -> int:
    return int(_attrs(span)[key]["intValue"])


def rank_file_text(template: _Template, rank: int, ranks: int, faults: PlantedFaults) -> str:
    """Rank `rank`'s spans file of an (ranks / tp) x tp mesh."""
    out = {i: json.dumps(span) if span else "" for i, span in _rank_collectives(template, rank, ranks, faults).items()}
    resource = dict(template.resource)
    resource["attributes"] = [
        kv
        for kv in resource.get("attributes", ())
        if kv["key"] not in (schema.RESOURCE_RANK, schema.RESOURCE_WORLD_SIZE)
    ] + [
        {"key": schema.RESOURCE_RANK, "value": {"intValue": str(rank)}},
        {"key": schema.RESOURCE_WORLD_SIZE, "value": {"intValue": str(ranks)}},
    ]
    return "".join(_pieces(template, out, json.dumps(resource)))


def rank_collectives_text(template: _Template, rank: int, ranks: int, faults: PlantedFaults) -> str:
    """The same rank's collectives file (`CommDebugMode.write_collectives`'s format)."""
    from hp_otel.analysis.rank_input import attribute_values
    from hp_otel.spans.collectives_file import collectives_payload

    spans = [
        _Span(span["name"], attribute_values(span["attributes"]), int(span["startTimeUnixNano"]),
              int(span["endTimeUnixNano"]))
        for span in _rank_collectives(template, rank, ranks, faults).values()
        if span
    ]  # fmt: skip
    resource = {schema.RESOURCE_RANK: rank, schema.RESOURCE_WORLD_SIZE: ranks}
    return json.dumps(collectives_payload(spans, resource), separators=(",", ":"))


@dataclass(frozen=True)
class _Span:
    name: str
    attributes: dict[str, Any]
    start_time: int
    end_time: int


def _rank_collectives(
    template: _Template, rank: int, ranks: int, faults: PlantedFaults
) -> dict[int, dict[str, Any] | None]:
    """Each template collective re-keyed for `rank` (None: a collective the rank never issued)."""
    tp = template.tp
    tp_index, dp_index = divmod(rank, tp)
    tp_ranks = RankSet(((tp_index * tp, tp_index * tp + tp - 1, 1),))
    dp_ranks = RankSet(((dp_index, dp_index + ranks - tp, tp),))
    groups = {  # torch names groups by creation order, the same on every rank: the TP groups first
        "tp": (str(1 + tp_index), tp_ranks),
        "dp": (str(1 + ranks // tp + dp_index), dp_ranks),
    }
    world = bool(template.world_seq)
    if world:  # one group of every rank: "tp" below is the world group
        groups["tp"] = ("0", RankSet(((0, ranks - 1, 1),)))
    jitter = random.Random(rank)
    hang_group = world or faults.hang_rank // tp == tp_index
    cut = template.tp_seqs - faults.hang_from_end  # the first seq the hanging rank never reaches
    cut_ns: int | None = None
    out: dict[int, dict[str, Any] | None] = {}
    for i, span in enumerate(template.collectives):
        kind = "tp" if world or _group_id(span) == template.tp_group else "dp"
        seq = template.world_seq[i] if world else _int_attr(span, schema.COLLECTIVE_SEQ)
        if hang_group and kind == "tp" and seq == cut:
            cut_ns = int(span["startTimeUnixNano"])
        in_flight = False
        if hang_group and (cut_ns is not None and int(span["startTimeUnixNano"]) >= cut_ns):
            # in the hanging group: the rank itself stops; the others wait in the cut collective
            if rank == faults.hang_rank or kind != "tp" or seq != cut:
                out[i] = None
                continue
            in_flight = True
        late = jitter.randrange(JITTER_NS) + (faults.late_ns if rank == faults.straggler_rank else 0)
        desync = rank == faults.desync_rank and kind == "tp" and seq == faults.desync_seq
        out[i] = _rekeyed(span, groups[kind], late, in_flight, desync, seq)
    return out


def _pieces(template: _Template, spans: dict[int, str], resource: str) -> list[str]:
    out = [template.texts[0]]
    drop_separator = False
    for slot, text in zip(template.slots, template.texts[1:], strict=True):
        piece = resource if slot < 0 else spans[slot]
        if not piece:  # a dropped span: drop the separator before it, else (first in its list) the one after
            if out[-1].endswith(", "):
                out[-1] = out[-1][:-2]
            else:
                drop_separator = True
        elif drop_separator:
            out[-1] = out[-1][2:] if out[-1].startswith(", ") else out[-1]
            drop_separator = False
        out.append(piece)
        out.append(text)
    return out


def _rekeyed(
    span: dict[str, Any], group: tuple[str, RankSet], late_ns: int, in_flight: bool, desync: bool, seq: int
) -> dict[str, Any]:
    name, members = group
    described = groups.group(name, members)
    attributes = []
    for kv in span["attributes"]:
        key, value = kv["key"], kv["value"]
        if key == schema.COLLECTIVE_GROUP:
            value = {"stringValue": name}
        elif key == schema.COLLECTIVE_GROUP_ID:
            value = {"stringValue": described.id}
        elif key == schema.COLLECTIVE_GROUP_MEMBERS:
            value = {"stringValue": str(described.members)}
        elif key == schema.COLLECTIVE_GROUP_SIZE:
            value = {"intValue": str(len(members))}
        elif key == schema.COLLECTIVE_INPUT_SHAPE and desync:
            dims = [int(v["intValue"]) for v in value["arrayValue"]["values"]]
            value = _ints([dims[0] + 1, *dims[1:]])
        elif key == schema.COLLECTIVE_SEQ:
            value = {"intValue": str(seq)}
        elif key == schema.COLLECTIVE_IN_FLIGHT:
            continue
        attributes.append({"key": key, "value": value})
    if in_flight:
        attributes.append({"key": schema.COLLECTIVE_IN_FLIGHT, "value": {"boolValue": True}})
    start = int(span["startTimeUnixNano"]) + late_ns
    end = start if in_flight else int(span["endTimeUnixNano"]) + late_ns
    return {**span, "attributes": attributes, "startTimeUnixNano": str(start), "endTimeUnixNano": str(end)}


EVIDENCE = {
    "spans": ("spans_rank{}.json", rank_file_text),
    "collectives": ("collectives_rank{}.json", rank_collectives_text),
}


def write_rank_file(
    template: _Template, out_dir: str, rank: int, ranks: int, faults: PlantedFaults, evidence: str = "spans"
) -> str:
    """Rank `rank`'s file under `out_dir`: its spans file, or its collectives file."""
    name, text = EVIDENCE[evidence]
    path = os.path.join(out_dir, name.format(rank))
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text(template, rank, ranks, faults))
    return path


_WORKER_TEMPLATE: list[Any] = []  # the pool's template (fork: shared, not pickled per file)


def _write_one(args: tuple[str, int, int, PlantedFaults, str]) -> str:
    return write_rank_file(_WORKER_TEMPLATE[0], *args)


def write_rank_files(
    template: _Template, out_dir: str, ranks: int, faults: PlantedFaults, jobs: int, evidence: str = "spans"
) -> list[str]:
    """Every rank's file under `out_dir` (made if missing), `jobs` processes at a time; their paths by rank."""
    import multiprocessing

    os.makedirs(out_dir, exist_ok=True)
    work = [(out_dir, rank, ranks, faults, evidence) for rank in range(ranks)]
    if jobs <= 1:
        return [write_rank_file(template, *w) for w in work]
    _WORKER_TEMPLATE[:] = [template]
    try:
        with multiprocessing.get_context("fork").Pool(jobs) as pool:
            return pool.map(_write_one, work, chunksize=16)
    finally:
        _WORKER_TEMPLATE.clear()
