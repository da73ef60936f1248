"""Names from users' models and from files others send reach no terminal raw: control characters
and bidi overrides are written visibly (`\\x1b`, `\\n`, `\\u202e`) in the table, `hp-otel render`,
`hp-otel ranks` and the CLI's messages; the SVG stays well-formed XML; other Unicode is kept."""

from __future__ import annotations

import dataclasses
import unicodedata
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from events import ALL_REDUCE
from opentelemetry.sdk.trace import TracerProvider
from torch import nn

from hp_otel import CommDebugMode
from hp_otel.cli import main
from hp_otel.common.safe_text import printable
from hp_otel.spans.infos import ModuleInfo

# An OSC title change (ESC ] 0; ... BEL), a screen clear, colours, a newline carrying a forged
# table line, and a right-to-left override.
FORGED = "Collective           Collective(forged) group_size=2"
EVIL = f"blk\x1b]0;owned\x07\x1b[2J\x1b[31mred\x1b[0m\n{FORGED}\u202eelbat"
KEPT = "层_ünï_🙂‍🙂"  # CJK, accents, an emoji ZWJ sequence: left as they are
FQN = f"{KEPT}.{EVIL}"
BIDI = set("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def unsafe(text: str) -> list[str]:
    """The characters a terminal would act on (every line break but the text's own `\\n`)."""
    return [c for c in text if (unicodedata.category(c) == "Cc" and c != "\n") or c in BIDI or c in "\u2028\u2029"]


def _window(fqn: str = FQN, *, second: bool = True, shape: tuple[int, ...] = (4, 16)) -> CommDebugMode:
    """Two all_reduces, the second in module `fqn` (or, `second=False`, never issued)."""
    info = dataclasses.replace(ALL_REDUCE, name=f"c10d.{KEPT}{EVIL}")
    with CommDebugMode(module=nn.Module(), tracer_provider=TracerProvider(shutdown_on_exit=False)) as mode:
        observer = mode.observer
        for i, name in enumerate(("layers.0", fqn) if second else ("layers.0",)):
            call = dataclasses.replace(info, input_shape=shape) if i == 1 else info
            observer.on_module_enter(ModuleInfo(name, name, f"Block{EVIL}"), "forward")
            start = 1_700_000_000_000_000_000 + i * 10_000_000
            ticket = observer.on_collective_issue(call, start)
            observer.on_collective(call, start, start + 1000, None, None, ticket)
            observer.on_module_exit(name, "forward")
    return mode


def _rank_files(tmp_path: Path, monkeypatch, *modes: CommDebugMode) -> list[str]:  # type: ignore[no-untyped-def]
    files = []
    for rank, mode in enumerate(modes):
        monkeypatch.setenv("RANK", str(rank))  # the rank the file names
        path = tmp_path / f"spans_rank{rank}.json"
        mode.write_spans(path)
        files.append(str(path))
    return files


def _check_visible(text: str) -> None:
    assert unsafe(text) == [], unsafe(text)
    assert "\\x1b]0;owned\\x07\\x1b[2J\\x1b[31mred\\x1b[0m\\n" in text and "\\u202eelbat" in text
    assert KEPT in text
    assert not any(line.startswith(FORGED) for line in text.splitlines())


def test_printable_escapes_controls_and_bidi_and_keeps_other_unicode() -> None:
    assert printable("a\x1b[2Jb\x07\x00\x7f\x9b\t\r\n\u202e\u2066\u200f\u2028") == (
        "a\\x1b[2Jb\\x07\\x00\\x7f\\x9b\\t\\r\\n\\u202e\\u2066\\u200f\\u2028"
    )
    assert printable(KEPT + " é ñ 中文 日本語 👍🏽 ") == KEPT + " é ñ 中文 日本語 👍🏽 "
    assert printable("\ud800") == "\\ud800"  # a lone surrogate (JSON can spell one) could not even be written


@pytest.mark.parametrize("level", [0, 1, 2, 3])
def test_the_modes_table_escapes_names(level) -> None:
    table = _window().generate_comm_debug_tracing_table(level)
    _check_visible(table)


def test_hp_otel_render_escapes_names(tmp_path, capsys) -> None:
    path = tmp_path / "spans.json"
    _window().write_spans(path)
    assert main(["render", str(path), "--noise-level", "2"]) == 0
    _check_visible(capsys.readouterr().out)


def test_hp_otel_ranks_escapes_the_hang_and_divergence_sentences(tmp_path, monkeypatch, capsys) -> None:
    assert main(["ranks", *_rank_files(tmp_path, monkeypatch, _window(), _window(second=False))]) == 3
    out = capsys.readouterr().out
    _check_visible(out)
    assert f"hang suspect: rank 1 never reached all_reduce #1 in Module({printable(FQN)}) (issued by rank 0)" in out
    assert main(["ranks", *_rank_files(tmp_path, monkeypatch, _window(), _window(shape=(2, 16)))]) == 3
    out = capsys.readouterr().out
    _check_visible(out)
    shapes = "input (2, 16) output (4, 16) torch.float32 sum"
    assert f"    rank 1: all_reduce {shapes} in Module({printable(FQN)}) [forward]" in out


def test_cli_messages_escape_the_paths_they_quote(tmp_path, monkeypatch, capsys) -> None:
    folder = tmp_path / EVIL.replace("/", "_")  # file names come from others too
    folder.mkdir()
    (first,) = _rank_files(folder, monkeypatch, _window())
    twin = folder / "again_rank0.json"
    twin.write_bytes(Path(first).read_bytes())
    assert main(["ranks", first, str(twin)]) == 2  # "... and ... are both rank 0"
    err = capsys.readouterr().err
    assert unsafe(err) == [] and "\\x1b]0;owned" in err and err.count("\n") == 1 and "are both rank 0" in err
    assert main(["plot", first, "-o", str(folder / "t.svg")]) == 0  # "wrote <path> (1 ranks)"
    out = capsys.readouterr().out
    assert unsafe(out) == [] and "\\x1b]0;owned" in out and out.count("\n") == 1
    (folder / "broken.json").write_text("not json")
    assert main(["render", str(folder / "broken.json")]) == 2
    err = capsys.readouterr().err
    assert unsafe(err) == [] and err.count("\n") == 1


def test_the_svg_is_well_formed_xml_and_the_html_stays_escaped(tmp_path, monkeypatch, capsys) -> None:
    hostile = f'{FQN}<x a="1">&amp;</x>'
    files = _rank_files(tmp_path, monkeypatch, _window(hostile), _window(hostile))
    svg, page = tmp_path / "t.svg", tmp_path / "t.html"
    assert main(["plot", *files, "-o", str(svg)]) == 0
    assert main(["plot", *files, "-o", str(page)]) == 0
    capsys.readouterr()
    text = svg.read_text(encoding="utf-8")
    root = ET.fromstring(text)  # raised "not well-formed (invalid token)" on the raw ESC
    titles = [t.text or "" for t in root.iter("{http://www.w3.org/2000/svg}title")]
    assert any(printable(hostile) in title for title in titles)  # the name, visibly, once XML-unescaped
    assert unsafe(text) == []
    html = page.read_text(encoding="utf-8")
    assert unsafe(html) == [] and '<x a="1">' not in html and "&lt;x a=&quot;1&quot;&gt;&amp;amp;&lt;/x&gt;" in html
