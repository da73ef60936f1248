"""Headless Chromium (Debian's `chromium` package, see .ci/run) for tests that look at a page.

`screenshot(page, png, width, height)` loads a local file in a fresh profile, writes a
screenshot of the viewport and returns what the page wrote to its console: Chromium's
`--enable-logging=stderr` log lines `INFO:CONSOLE...` carry every console message and
uncaught error of the page (the level is not in the line, so a page that should print
nothing must print nothing).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from servers import missing

FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking")
_CONSOLE = re.compile(r":CONSOLE[:(]")


def chromium() -> str:
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    missing("Chromium is not installed (apt-get install chromium)")
    raise AssertionError("unreachable")


def screenshot(page: Path, png: Path, width: int, height: int, timeout_s: float = 120) -> list[str]:
    """The page's console lines; the screenshot of its first `width` x `height` pixels in `png`."""
    with tempfile.TemporaryDirectory(prefix="hp_otel_chromium_") as profile:
        done = subprocess.run(
            [
                chromium(),
                *FLAGS,
                f"--user-data-dir={profile}",
                "--enable-logging=stderr",
                "--v=0",
                "--hide-scrollbars",
                f"--window-size={width},{height}",
                f"--screenshot={png}",
                page.resolve().as_uri(),
            ],
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    assert done.returncode == 0 and png.exists(), done.stderr[-3000:]
    return [line for line in done.stderr.splitlines() if _CONSOLE.search(line)]
