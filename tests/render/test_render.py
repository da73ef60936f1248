"""The table and the JSON dump, from synthetic event sequences (no distributed run needed)."""

from __future__ import annotations

import json
import warnings

import pytest
from events import DESIGN_TABLE_0, DESIGN_TABLE_1, DESIGN_TABLE_2, design_mlp_forward
from torch import nn

from hp_otel import CommDebugMode
from hp_otel.render.table import EMPTY_TABLE, render_table
from hp_otel.spans.call_tree import count_collectives
from hp_otel.spans.infos import ModuleInfo
from hp_otel.spans.otlp_json import SpanFileError, read_spans, write_spans


class TwoLayer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.fc2 = nn.Linear(32, 16)


@pytest.fixture
def design_mode() -> CommDebugMode:
    with CommDebugMode(module=TwoLayer()) as mode:
        design_mlp_forward(mode.observer)
    return mode


@pytest.mark.parametrize("level, expected", [(0, DESIGN_TABLE_0), (1, DESIGN_TABLE_1), (2, DESIGN_TABLE_2)])
def test_table_matches_the_design_example(design_mode: CommDebugMode, level: int, expected: str) -> None:
    assert design_mode.generate_comm_debug_tracing_table(noise_level=level) == expected


def test_default_noise_level_is_1_and_alias_matches(design_mode: CommDebugMode) -> None:
    assert design_mode.generate_comm_debug_tracing_table() == DESIGN_TABLE_1
    assert design_mode.generate_tracing_table(2) == DESIGN_TABLE_2


def test_detail_starts_at_column_21_on_every_line(design_mode: CommDebugMode) -> None:
    for line in design_mode.generate_comm_debug_tracing_table(noise_level=2).splitlines()[2:]:
        assert line[20] == " " and line[21] != " ", line


def test_empty_table() -> None:
    with CommDebugMode() as mode:
        pass
    assert mode.generate_comm_debug_tracing_table() == EMPTY_TABLE


def test_every_entry_point_checks_a_noise_level_with_the_one_check(design_mode: CommDebugMode, capsys) -> None:
    """CommDebugMode, the renderers, the torch drop-in and the command line say the same thing."""
    from hp_otel.cli import main
    from hp_otel.torch import CommDebugMode as TorchCompatMode

    said = []
    for call in (
        lambda: design_mode.generate_comm_debug_tracing_table(7),
        lambda: render_table(design_mode.get_finished_spans(), 7),
        lambda: TorchCompatMode().generate_comm_debug_tracing_table(7),
    ):
        with pytest.raises(ValueError) as caught:
            call()
        said.append(str(caught.value))
    with pytest.raises(SystemExit):
        main(["render", "x.json", "--noise-level", "7"])
    said.append(capsys.readouterr().err.strip().splitlines()[-1])
    assert said == [
        "noise_level must be one of 0, 1, 2, 3 or None (the default, 1), got 7",
        "noise_level must be one of 0, 1, 2, 3 or None (the default, 1), got 7",
        "noise_level must be one of 0, 1, 2, 3 or None (the default, 3), got 7",  # torch's default level
        "hp-otel render: error: argument --noise-level: noise level must be one of 0, 1, 2, 3, got 7",
    ]


@pytest.mark.parametrize("bad", [-1, 4, 1.0, "1", True])
def test_invalid_noise_level_names_the_allowed_values(design_mode: CommDebugMode, bad: object) -> None:
    with pytest.raises(ValueError, match=r"noise_level must be one of 0, 1, 2, 3"):
        design_mode.generate_comm_debug_tracing_table(noise_level=bad)  # type: ignore[arg-type]
    assert design_mode.get_total_counts() == 1  # nothing recorded is lost


def test_level_2_without_module_warns_once_and_equals_level_1() -> None:
    with CommDebugMode() as mode:
        design_mlp_forward(mode.observer, modules=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        table = mode.generate_comm_debug_tracing_table(noise_level=2)
    assert table == DESIGN_TABLE_1
    assert len([w for w in caught if "module=" in str(w.message)]) == 1


def test_level_3_adds_redistribute_and_detail_level_2_the_backward_module(design_mode: CommDebugMode) -> None:
    with CommDebugMode(module=TwoLayer()) as mode:
        obs = mode.observer
        obs.on_module_enter(ModuleInfo("(root)", "MLP", "MLP"), "backward")
        obs.on_redistribute_enter("Partial(sum)", "Replicate()", (4, 16))
        from events import collective

        collective(obs)
        obs.on_redistribute_exit()
        obs.on_backward_end()
    table3 = mode.generate_comm_debug_tracing_table(noise_level=3).splitlines()
    # level 3 ends with the exposed-communication footer (docs/overlap.md): a synchronous call, all exposed
    assert table3[5] == "-" * 80 and table3[6].startswith("communication: comm ") and table3[6].endswith("(0%)")
    assert table3[7].startswith("  backward: comm ") and len(table3) == 8
    assert table3[2:5] == [
        "Module               Module((root)) [backward]",
        "  Redistribute       Redistribute(Partial(sum) -> Replicate()) shape=(4, 16)",
        "    Collective       Collective(differentiable_all_reduce) group_size=2 input_shape=(4, 16) "
        "output_shape=(4, 16) dtype=torch.float32 bytes=256 reduce_op=sum phase=backward"
        " busbw=256 MB/s algbw=256 MB/s",  # 256 B in 1 µs; all_reduce of 2: factor 2(2-1)/2 = 1
    ]
    # level 2 hides redistributes and detail, not the backward module (issue 35 item 3)
    assert mode.generate_comm_debug_tracing_table(noise_level=2).splitlines()[2:] == [
        "Module               Module((root)) [backward]",
        "  Collective         Collective(differentiable_all_reduce) group_size=2 input_shape=(4, 16) "
        "output_shape=(4, 16)",
    ]


def test_json_dump_has_the_design_structure(design_mode: CommDebugMode, tmp_path) -> None:
    path = tmp_path / "dump.json"
    design_mode.generate_json_dump(path, noise_level=1)
    dump = json.loads(path.read_text())
    assert dump["comm_counts"] == {"differentiable_all_reduce": 1}
    assert dump["total_counts"] == 1
    ops = dump["records"]
    assert [r["type"] for r in ops] == ["op", "op", "op"]
    assert [r["op_name"] for r in ops] == ["linear", "gelu", "linear"]
    assert ops[0]["inputs"][1] == {
        "shape": [32, 16],
        "dtype": "torch.float32",
        "is_dtensor": True,
        "placements": ["Shard(dim=0)"],
        "mesh_shape": [2],
    }
    (child,) = ops[2]["children"]
    assert child["type"] == "collective"
    assert child["collective_type"] == "differentiable_all_reduce"
    assert (child["group_size"], child["input_shape"], child["bytes"]) == (2, [4, 16], 256)
    assert dump["comm_module_counts"]["fc2"]["forward"] == {"differentiable_all_reduce": 1}


def test_json_dump_level_2_nests_modules(design_mode: CommDebugMode, tmp_path) -> None:
    path = tmp_path / "dump.json"
    design_mode.generate_json_dump(path, noise_level=2)
    (root,) = json.loads(path.read_text())["records"]
    assert (root["type"], root["module_fqn"], root["event_type"]) == ("module", "(root)", "enter")
    assert [c.get("module_fqn", c.get("op_name")) for c in root["children"]] == ["fc1", "gelu", "fc2"]


def test_table_file_strips_ansi(design_mode: CommDebugMode, tmp_path) -> None:
    path = tmp_path / "table.txt"
    design_mode.log_comm_debug_tracing_table_to_file(path, noise_level=0)
    assert path.read_text() == DESIGN_TABLE_0 + "\n"


def test_unwritable_path_is_a_clear_error_and_keeps_records(design_mode: CommDebugMode, tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match="file_name"):
        design_mode.generate_json_dump(tmp_path / "missing" / "x.json")
    with pytest.raises(IsADirectoryError, match="file_name"):
        design_mode.log_comm_debug_tracing_table_to_file(tmp_path)
    with pytest.raises(TypeError, match="file_name"):
        design_mode.generate_json_dump(42)  # type: ignore[arg-type]
    assert design_mode.get_comm_counts() == {"differentiable_all_reduce": 1}
    assert len(design_mode.get_finished_spans()) == 7


def test_spans_round_trip_through_otlp_json(design_mode: CommDebugMode, tmp_path) -> None:
    path = tmp_path / "spans.json"
    write_spans(path, design_mode.get_finished_spans())
    spans = read_spans(path)
    assert render_table(spans, 2) == DESIGN_TABLE_2
    assert count_collectives(spans) == {"differentiable_all_reduce": 1}
    payload = json.loads(path.read_text())
    span_id = payload["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["spanId"]
    assert len(span_id) == 16 and int(span_id, 16) >= 0  # OTLP/JSON: ids in hex


@pytest.mark.parametrize(
    "content, message",
    [
        (None, "does not exist"),
        ("{not json", "not JSON"),
        ('{"x": 1}', "resourceSpans"),
        ('{"resourceSpans": 5}', "valid"),
    ],
)
def test_malformed_span_files_get_clear_errors(tmp_path, content: str | None, message: str) -> None:
    path = tmp_path / "spans.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(SpanFileError, match=message):
        read_spans(path)


def test_written_files_get_the_usual_permissions(design_mode: CommDebugMode, tmp_path) -> None:
    import os
    import stat

    path = tmp_path / "dump.json"
    design_mode.generate_json_dump(path)
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask
    assert [p.name for p in tmp_path.iterdir()] == ["dump.json"]  # no temporary file left behind
