"""`OTEL_<SIGNAL>_EXPORTER=none` is honoured even when an endpoint is given as an argument.

A traces-only backend (Phoenix, MLflow) answers 404 on `/v1/metrics`: before, `--otlp-endpoint`
or `configure(endpoint=...)` turned OTLP metrics back on whatever the variable said.  The referee
is a loopback HTTP server that counts the requests it gets per path.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from hp_otel.export.config import ExportConfig


@pytest.mark.parametrize("signal", ["traces", "metrics"])
def test_exporter_none_wins_over_an_endpoint_argument(signal: str) -> None:
    other = "metrics" if signal == "traces" else "traces"
    env = {f"OTEL_{signal.upper()}_EXPORTER": "none"}
    config = ExportConfig.resolve(endpoint="http://127.0.0.1:4318", environ=env)
    assert getattr(config, f"{signal}_exporters") == ()
    assert getattr(config, f"{other}_exporters") == ("otlp",)
    from_env = ExportConfig.resolve(environ={**env, "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"})
    assert getattr(from_env, f"{signal}_exporters") == ()


def test_a_signals_own_endpoint_argument_is_an_explicit_ask_and_wins() -> None:
    """The shared `endpoint` says where, not which signals; `metrics_endpoint=` asks for metrics by name."""
    env = {"OTEL_METRICS_EXPORTER": "none"}
    config = ExportConfig.resolve(metrics_endpoint="http://127.0.0.1:4318/v1/metrics", environ=env)
    assert config.metrics_exporters == ("otlp",)


def test_an_endpoint_argument_still_adds_otlp_to_the_other_named_exporters() -> None:
    config = ExportConfig.resolve(endpoint="http://127.0.0.1:4318", environ={"OTEL_METRICS_EXPORTER": "console"})
    assert config.metrics_exporters == ("console", "otlp")


class _Counting(BaseHTTPRequestHandler):
    paths: Counter[str]

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.paths[self.path] += 1
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def receiver() -> Iterator[tuple[str, Counter[str]]]:
    paths: Counter[str] = Counter()
    handler = type("Handler", (_Counting,), {"paths": paths})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", paths
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def _demo(tmp_path, endpoint: str, *extra: str, env: dict[str, str] | None = None) -> None:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    result = subprocess.run(
        [
            *(sys.executable, "-m", "hp_otel.cli", "demo", "--out", str(tmp_path), "--steps", "2"),
            *("--otlp-endpoint", endpoint, "--otlp-protocol", "http/protobuf", *extra),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**environ, **(env or {})},
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]


@pytest.mark.multiprocess  # two real 2-rank gloo demos
@pytest.mark.parametrize(
    ("how", "extra", "env"),
    [
        ("OTEL_METRICS_EXPORTER=none", (), {"OTEL_METRICS_EXPORTER": "none"}),
        ("--otlp-traces-only", ("--otlp-traces-only",), None),
    ],
)
def test_a_traces_only_demo_sends_no_request_to_v1_metrics(tmp_path, receiver, how, extra, env) -> None:
    endpoint, paths = receiver
    _demo(tmp_path, endpoint, *extra, env=env)
    assert paths["/v1/traces"] > 0, (how, dict(paths))
    assert paths["/v1/metrics"] == 0, (how, dict(paths))
    assert set(paths) == {"/v1/traces"}, dict(paths)


@pytest.mark.multiprocess
def test_without_the_switch_the_demo_sends_both_signals(tmp_path, receiver) -> None:
    """The counting server sees metrics when they are asked for: the zero above is not a deaf server."""
    endpoint, paths = receiver
    _demo(tmp_path, endpoint)
    assert paths["/v1/traces"] > 0 and paths["/v1/metrics"] > 0, dict(paths)
