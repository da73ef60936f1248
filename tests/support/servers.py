"""Real servers for the end-to-end tests, started on loopback and stopped after.

- Prometheus: Debian's `prometheus` binary (`.ci/run` installs it with apt).
- Arize Phoenix: a real OTLP receiver (HTTP and gRPC) we did not write, installed by
  `.ci/run` into its own venv `.venv-phoenix` so its dependencies cannot change ours;
  found through `HP_OTEL_PHOENIX` or that path.
- MLflow's tracking server: the trace backend ML teams already run (OTLP/HTTP only), in
  its own venv `.venv-mlflow` (`HP_OTEL_MLFLOW` or that path); its client API is used from
  that venv's python in a child process, so mlflow never enters ours.

A missing server skips the test with the reason outside CI and fails it in CI
(`CI` set, as `.ci/run` does), so CI never skips silently.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]


def missing(what: str) -> None:
    """Fail in CI, skip (with the reason) elsewhere."""
    if os.environ.get("CI"):
        pytest.fail(f"{what} (CI installs it: see .ci/run)")
    pytest.skip(what)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def free_port_pair() -> int:
    """A base port whose successor is free too (rank r serves base + r)."""
    for _ in range(50):
        base = free_port()
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("127.0.0.1", base))
                b.bind(("127.0.0.1", base + 1))
            return base
        except OSError:
            continue
    raise RuntimeError("no two consecutive free ports on loopback")


def http_json(url: str, timeout: float = 5.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.loads(response.read())


def wait_for(check: Callable[[], Any], timeout: float, what: str, interval: float = 0.25) -> Any:
    """Poll `check` until it returns something truthy; fail with `what` after `timeout` s."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
            if last:
                return last
        except (OSError, urllib.error.URLError, ValueError) as exc:
            last = exc
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}; last: {last!r}")


class Server:
    """A child process in its own process group, stopped (then killed) on close."""

    def __init__(self, args: list[str], log: Path, env: dict[str, str] | None = None) -> None:
        self.log = log
        self._log_handle = open(log, "wb")
        self.process = subprocess.Popen(
            args, stdout=self._log_handle, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )

    def log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]

    def close(self, grace_s: float = 10) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(grace_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(5)
        self._log_handle.close()


def prometheus_binary() -> str | None:
    return shutil.which("prometheus") or ("/usr/bin/prometheus" if os.access("/usr/bin/prometheus", os.X_OK) else None)


def start_prometheus(
    workdir: Path, targets: list[str], file_sd: Path | None = None, interval: str = "1s"
) -> tuple[Server, str]:
    """Prometheus scraping `targets` (or the file_sd targets in folder `file_sd`) every `interval`.

    Returns (server, base URL of its HTTP API).
    """
    binary = prometheus_binary()
    if binary is None:
        missing("Debian's prometheus is not installed (apt-get install prometheus)")
    config = workdir / "prometheus.yml"
    discovery = (
        f"    file_sd_configs:\n      - files: [{json.dumps(str(file_sd / '*.json'))}]\n        refresh_interval: 1s\n"
        if file_sd is not None
        else f"    static_configs:\n      - targets: {json.dumps(targets)}\n"
    )
    config.write_text(
        f"global:\n  scrape_interval: {interval}\n  evaluation_interval: {interval}\n"
        "scrape_configs:\n  - job_name: hp_otel\n" + discovery
    )
    port = free_port()
    server = Server(
        [
            str(binary),
            f"--config.file={config}",
            f"--storage.tsdb.path={workdir / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        workdir / "prometheus.log",
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: urllib.request.urlopen(f"{url}/-/ready", timeout=2).status == 200, 30, "Prometheus ready")
    except AssertionError:
        server.close()
        raise AssertionError(f"Prometheus did not start:\n{server.log_tail()}") from None
    return server, url


def prometheus_query(url: str, query: str) -> list[dict[str, Any]]:
    payload = http_json(f"{url}/api/v1/query?{urllib.parse.urlencode({'query': query})}")
    assert payload["status"] == "success", payload
    return payload["data"]["result"]


def phoenix_binary() -> Path | None:
    candidates = [os.environ.get("HP_OTEL_PHOENIX"), str(REPO / ".venv-phoenix" / "bin" / "phoenix")]
    for candidate in candidates:
        if candidate and os.access(candidate, os.X_OK):
            return Path(candidate)
    return None


def start_phoenix(workdir: Path) -> tuple[Server, int, int]:
    """Arize Phoenix with OTLP/HTTP on one free loopback port and OTLP/gRPC on another."""
    binary = phoenix_binary()
    if binary is None:
        missing("Arize Phoenix is not installed (.venv-phoenix/bin/phoenix or HP_OTEL_PHOENIX)")
    http_port, grpc_port = free_port(), free_port()
    env = {
        **os.environ,
        "PHOENIX_HOST": "127.0.0.1",
        "PHOENIX_PORT": str(http_port),
        "PHOENIX_GRPC_PORT": str(grpc_port),
        "PHOENIX_WORKING_DIR": str(workdir),
        "PHOENIX_TELEMETRY_ENABLED": "false",
    }
    for key in [k for k in env if k.startswith("OTEL_")]:
        del env[key]  # Phoenix must not try to export its own telemetry anywhere
    server = Server([str(binary), "serve"], workdir / "phoenix.log", env=env)
    try:
        wait_for(
            lambda: urllib.request.urlopen(f"http://127.0.0.1:{http_port}/healthz", timeout=2).status == 200,
            90,
            "Phoenix ready",
            interval=0.5,
        )
        wait_for(lambda: _port_open(grpc_port), 30, "Phoenix gRPC port")
    except AssertionError:
        server.close()
        raise AssertionError(f"Phoenix did not start:\n{server.log_tail()}") from None
    return server, http_port, grpc_port


def _port_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def phoenix_spans(http_port: int, project: str = "default") -> list[dict[str, Any]]:
    """Every span Phoenix stored in a project, following its pagination."""
    spans: list[dict[str, Any]] = []
    cursor = None
    while True:
        query = {"limit": 1000, **({"cursor": cursor} if cursor else {})}
        page = http_json(f"http://127.0.0.1:{http_port}/v1/projects/{project}/spans?{urllib.parse.urlencode(query)}")
        spans.extend(page["data"])
        cursor = page.get("next_cursor")
        if not cursor:
            return spans


def mlflow_binary() -> Path | None:
    candidates = [os.environ.get("HP_OTEL_MLFLOW"), str(REPO / ".venv-mlflow" / "bin" / "mlflow")]
    for candidate in candidates:
        if candidate and os.access(candidate, os.X_OK):
            return Path(candidate)
    return None


def _mlflow_env(workdir: Path) -> dict[str, str]:
    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true", "DO_NOT_TRACK": "true", "HOME": str(workdir)}
    for key in [k for k in env if k.startswith(("OTEL_", "MLFLOW_TRACKING_"))]:
        del env[key]  # MLflow must not export its own telemetry, nor find another tracking server
    return env


def start_mlflow(workdir: Path) -> tuple[Server, str]:
    """`mlflow server` on a free loopback port over a fresh SQLite store; (server, its URL).

    Ready in about 25 s on an idle machine, 80 s at load 10: start it once per test module.
    """
    binary = mlflow_binary()
    if binary is None:
        missing("MLflow is not installed (.venv-mlflow/bin/mlflow or HP_OTEL_MLFLOW)")
    port = free_port()
    store = f"sqlite:///{workdir / 'mlflow.db'}"
    args = [str(binary), "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1"]
    args += ["--backend-store-uri", store, "--artifacts-destination", str(workdir / "artifacts")]
    server = Server(args, workdir / "mlflow.log", env=_mlflow_env(workdir))
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(
            lambda: urllib.request.urlopen(f"{url}/health", timeout=2).status == 200, 240, "MLflow ready", interval=1
        )
    except AssertionError:
        server.close()
        raise AssertionError(f"MLflow did not start:\n{server.log_tail()}") from None
    return server, url


def mlflow_client(script: str, *args: str, workdir: Path, timeout: float = 120) -> Any:
    """Run `script` in the MLflow venv's python with `args`; what it printed as JSON (its last line)."""
    binary = mlflow_binary()
    assert binary is not None
    done = subprocess.run(
        [str(binary.parent / "python"), "-c", script, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=_mlflow_env(workdir),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def hp_otel_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """`hp-otel ARGS` as a child process (stdout and stderr captured)."""
    return subprocess.Popen(
        [sys.executable, "-m", "hp_otel.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
        start_new_session=True,  # stop() ends its rank processes too
    )


def stop(child: subprocess.Popen[str]) -> None:
    """End a child started by hp_otel_cli and every process of its session."""
    if child.poll() is None:
        os.killpg(child.pid, signal.SIGTERM)
    try:
        child.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        child.communicate(timeout=10)
