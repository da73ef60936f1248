"""The docs site reads at 1280 px without sideways scrolling (issue 47): the CLI reference's
`--help` blocks and the guide's code wrap inside the page.

The site is built as CI builds it (`mkdocs build --strict`), opened from disk in headless
Chromium with a 1280 x 900 viewport, and on each page the document and every code block
must be no wider than the space it is given (its scroll width within its client width).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from devtools import Browser
from servers import missing

pytestmark = pytest.mark.browser  # headless Chromium

ROOT = Path(__file__).resolve().parents[2]
WIDTH, HEIGHT = 1280, 900
# The CLI reference (every --help), and pages with the longest code and output lines.
PAGES = ("reference/cli.html", "getting-started.html", "examples.html", "guide/usage.html", "guide/your-model.html")

_WIDTHS = """(() => {
  // Material scrolls a block's <code> inside its <pre>: either may be the one wider than its box
  const blocks = [...document.querySelectorAll("pre, pre > code")].map(el => ({
    text: el.innerText.split("\\n")[0].slice(0, 80), scroll: el.scrollWidth, client: el.clientWidth,
  }));
  return {page: document.documentElement.scrollWidth, window: window.innerWidth, blocks};
})()"""


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    try:
        import mkdocs  # noqa: F401
    except ImportError:
        missing("mkdocs is not installed (pip install -e '.[docs]')")
    out = tmp_path_factory.mktemp("site")
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        cwd=ROOT, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr[-3000:]
    return out


def test_code_and_help_blocks_fit_the_page_at_1280_px(site: Path) -> None:
    too_wide = {}
    with Browser(timeout_s=120) as browser:
        page = browser.page()
        page.send(
            "Emulation.setDeviceMetricsOverride",
            {"width": WIDTH, "height": HEIGHT, "deviceScaleFactor": 1, "mobile": False},
        )
        for name in PAGES:
            page.navigate((site / name).as_uri())
            page.wait_for("document.readyState === 'complete' && document.querySelectorAll('pre').length > 0",
                          60, f"{name} to load")  # fmt: skip
            widths = page.evaluate(_WIDTHS)
            assert widths["window"] == WIDTH, widths["window"]
            wide = [b for b in widths["blocks"] if b["scroll"] > b["client"] + 1]
            if widths["page"] > WIDTH or wide:
                too_wide[name] = {"page": widths["page"], "blocks": wide[:5], "of": len(widths["blocks"])}
    assert too_wide == {}, too_wide
