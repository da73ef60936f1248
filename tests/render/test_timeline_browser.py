"""The timeline page in a real browser (issue 22, item 4): headless Chromium loads `hp-otel plot`'s
HTML, the console stays silent, and the screenshot has the expected size with both ranks'
lanes and the collectives drawn (pixels read back with Pillow).

`HP_OTEL_WRITE_DOCS_PICTURE=1` also copies the screenshot to docs/timeline.png (how the docs'
picture is made; the test itself never writes into the repository).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from browser import screenshot
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan

from hp_otel import CommDebugMode
from hp_otel.cli import main
from hp_otel.render.timeline import COLLECTIVE_COLOURS, LEFT
from hp_otel.spans.otlp_json import write_spans

pytestmark = pytest.mark.browser  # headless Chromium

WIDTH, HEIGHT = 1280, 900
BODY_MARGIN = 16  # the page's body margin: the SVG's (0, 0) in the page
LANE_BG = (0xF6, 0xF8, 0xFA)
DOCS_PICTURE = Path(__file__).resolve().parents[2] / "docs" / "timeline.png"

Image = pytest.importorskip("PIL.Image", reason="Pillow is a test dependency (pip install -e '.[test]')")


def _rgb(colour: str) -> tuple[int, int, int]:
    return tuple(int(colour[i : i + 2], 16) for i in (1, 3, 5))  # type: ignore[return-value]


def _as_rank(spans, rank: int, shift_ns: int) -> list[ReadableSpan]:  # type: ignore[no-untyped-def]
    return [
        ReadableSpan(
            name=sp.name,
            context=sp.context,
            parent=sp.parent,
            resource=Resource({"hp_otel.rank": rank}),
            attributes=dict(sp.attributes),
            start_time=sp.start_time + shift_ns,
            end_time=sp.end_time + shift_ns,
        )
        for sp in spans
    ]


def page_of_the_transformer_step(tmp_path: Path, fake_world: int) -> Path:
    """`hp-otel plot` of the demo's TP + SP transformer step (fake process group; rank 1 a copy 300 µs late)."""
    from hp_otel.workloads.tp_mlp import train_step
    from hp_otel.workloads.tp_transformer import build_tp_transformer, demo_tokens

    model = build_tp_transformer(fake_world)
    with CommDebugMode(module=model) as mode:
        train_step(model, demo_tokens())
    files = []
    for rank in (0, 1):
        files.append(str(tmp_path / f"spans_rank{rank}.json"))
        write_spans(files[-1], _as_rank(mode.get_finished_spans(), rank, rank * 300_000))
    page = tmp_path / "timeline.html"
    assert main(["plot", *files, "-o", str(page)]) == 0
    return page


def _near(pixel: tuple[int, int, int], colour: tuple[int, int, int]) -> bool:
    return sum(abs(a - b) for a, b in zip(pixel, colour, strict=True)) <= 24


def _runs(column: list[tuple[int, int, int]], colour: tuple[int, int, int]) -> list[tuple[int, int]]:
    """The separate vertical stretches [start, end) of `colour` in a pixel column."""
    runs: list[tuple[int, int]] = []
    start = None
    for y, pixel in enumerate([*column, None]):
        if pixel == colour and start is None:
            start = y
        elif pixel != colour and start is not None:
            runs.append((start, y))
            start = None
    return runs


def test_chromium_loads_the_timeline_silently_and_draws_both_lanes(tmp_path, fake_world) -> None:
    page = page_of_the_transformer_step(tmp_path, fake_world)
    png = tmp_path / "timeline.png"
    console = screenshot(page, png, WIDTH, HEIGHT)
    assert console == [], console
    image = Image.open(png).convert("RGB")
    assert image.size == (WIDTH, HEIGHT)
    pixels = image.load()
    # left of the bars, inside the lanes: two lanes (rank 0 and rank 1), nothing else of their colour
    x = BODY_MARGIN + LEFT - 6
    lanes = _runs([pixels[x, y] for y in range(HEIGHT)], LANE_BG)
    assert len(lanes) == 2 and all(end - start > 60 for start, end in lanes), lanes
    # the TP + SP transformer's collectives drawn inside each lane: its reduce_scatters (some long ones)
    # and its all_gathers (short: a pixel or two wide on this axis, so their colour comes antialiased)
    for top, bottom in lanes:
        for op, at_least in (("reduce_scatter", 30), ("all_gather", 3)):
            colour = _rgb(COLLECTIVE_COLOURS[op])
            inside = sum(1 for y in range(top, bottom) for x in range(WIDTH) if _near(pixels[x, y], colour))
            assert inside >= at_least, (op, top, bottom, inside)
    if os.environ.get("HP_OTEL_WRITE_DOCS_PICTURE"):
        shutil.copyfile(png, DOCS_PICTURE)


def test_the_console_check_sees_what_a_page_prints(tmp_path) -> None:
    """The referee for the test above: a page that logs an error is caught."""
    page = tmp_path / "noisy.html"
    page.write_text('<!doctype html><html><body><script>console.error("broken page")</script></body></html>')
    console = screenshot(page, tmp_path / "noisy.png", 320, 200)
    assert len(console) == 1 and '"broken page"' in console[0]
