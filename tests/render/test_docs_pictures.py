"""The docs' timeline picture is what today's `hp-otel plot` draws from the spans committed beside it.

docs/timeline.svg (the README's and the docs' picture) is drawn from docs/timeline-spans/, the
spans of one `hp-otel demo` step on two gloo ranks. When the renderer changes, this fails until
the picture is drawn again, with the command the failure names, so the picture cannot drift
from the tool.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hp_otel.cli import main

pytestmark = pytest.mark.torch_free

ROOT = Path(__file__).resolve().parents[2]
SPANS = sorted((ROOT / "docs" / "timeline-spans").glob("spans_rank*.json"))
PICTURE = ROOT / "docs" / "timeline.svg"
REDRAW = "hp-otel plot docs/timeline-spans/spans_rank0.json docs/timeline-spans/spans_rank1.json -o docs/timeline.svg"


def test_the_docs_timeline_is_what_hp_otel_plot_draws_today(tmp_path: Path, capsys) -> None:
    assert [p.name for p in SPANS] == ["spans_rank0.json", "spans_rank1.json"]
    drawn = tmp_path / "timeline.svg"
    assert main(["plot", *map(str, SPANS), "-o", str(drawn)]) == 0
    capsys.readouterr()
    assert drawn.read_bytes() == PICTURE.read_bytes(), f"docs/timeline.svg is out of date: run `{REDRAW}`"


def test_the_pages_show_that_picture() -> None:
    for page in ("README.md", "docs/index.md", "docs/guide/pictures.md"):
        assert "timeline.svg)" in (ROOT / page).read_text(), page
