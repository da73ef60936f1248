"""The docs' zero-code command, run verbatim against a real OTLP receiver (Arize Phoenix).

The block between `<!-- zero-code: begin/end -->` in docs/guide/always-on.md is run with bash from the
repository root; only the endpoint and the Prometheus port are replaced by free ones
(and `.venv/bin/` by this interpreter's folder when the checkout has no `.venv`).
Without `opentelemetry-distro` (hp_otel configures export from the variables) and with
it (the distro's providers; `.ci/run` puts it in `.tools/otel-distro`).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import urllib.request
from collections import Counter
from pathlib import Path

import pytest
import servers
from installed_metadata import ROOT, subprocess_env, write_dist_info

pytestmark = [pytest.mark.server, pytest.mark.multiprocess]  # a real OTLP receiver and 2-rank torchrun runs

DISTRO = ROOT / ".tools" / "otel-distro"
LIST_DISTROS = (
    "from importlib.metadata import entry_points\nprint([d.name for d in entry_points(group='opentelemetry_distro')])"
)
STEPS = 5  # examples/train_tp_mlp.py's default: 4 recorded steps (the one before the first optimizer.step() is not)


def documented_command() -> str:
    text = (ROOT / "docs" / "guide" / "always-on.md").read_text()
    block = re.search(r"<!-- zero-code: begin -->\s*```bash\n(.*?)```\s*<!-- zero-code: end -->", text, re.S)
    assert block, "docs/guide/always-on.md has no zero-code block"
    return block.group(1)


@pytest.fixture(scope="module")
def phoenix(tmp_path_factory):
    server, http_port, _ = servers.start_phoenix(tmp_path_factory.mktemp("phoenix"))
    yield http_port
    server.close()


def _metrics(port: int) -> str | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
            return response.read().decode()
    except OSError:
        return None


def _run(command: str, tmp_path: Path, env: dict[str, str], scrape: list[int]) -> dict[int, str]:
    """Run the command; while the ranks linger, scrape `scrape` ports; return what each served."""
    child = subprocess.Popen(
        ["bash", "-c", "set -euo pipefail\n" + command],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    scraped: dict[int, str] = {}
    try:

        def served() -> bool:
            if child.poll() is not None:
                raise AssertionError(f"the run ended before its ranks were scraped:\n{child.communicate()[0][-4000:]}")
            for port in scrape:
                text = _metrics(port)
                if text and 'hp_otel_module_fqn="fc2"' in text and port not in scraped:
                    scraped[port] = text
            return len(scraped) == len(scrape)

        if scrape:
            servers.wait_for(served, 120, f"/metrics with module attribution on ports {scrape}")
        output, _ = child.communicate(timeout=180)
    finally:
        servers.stop(child)
    assert child.returncode == 0, output[-4000:]
    assert "trained; last loss" in output, output[-4000:]
    assert "Traceback" not in output and "Address already in use" not in output, output[-4000:]
    return scraped


def _spans_of_run(http_port: int, service: str, run_id: str) -> list[dict]:
    def spans() -> list[dict] | None:
        stored = servers.phoenix_spans(http_port)
        traces = {
            s["context"]["trace_id"] for s in stored if s["attributes"].get("hp_otel.run.id") == run_id
        }  # step roots
        found = [s for s in stored if s["context"]["trace_id"] in traces]
        return (
            found
            if sum(s["name"] == f"rank {s['attributes'].get('hp_otel.rank')}" for s in found) >= 2 * (STEPS - 1)
            else None
        )

    return servers.wait_for(spans, 60, f"{2 * (STEPS - 1)} rank_step spans of run {run_id} in Phoenix")


@pytest.mark.parametrize("distro", [False, True], ids=["sdk-only", "opentelemetry-distro"])
def test_the_documented_zero_code_command(phoenix, tmp_path, distro) -> None:
    if distro and not (DISTRO / "opentelemetry").is_dir():
        servers.missing(f"opentelemetry-distro is not in {DISTRO} (pip install --no-deps --target, see .ci/run)")
    run_id = f"zero-code-{'distro' if distro else 'sdk'}-{os.getpid()}"
    base = servers.free_port_pair()
    command = documented_command()
    command = command.replace("http://localhost:4318", f"http://127.0.0.1:{phoenix}")
    command = command.replace("HP_OTEL_RUN_ID=zero-code-1", f"HP_OTEL_RUN_ID={run_id}")
    command = command.replace("OTEL_EXPORTER_PROMETHEUS_PORT=9464", f"OTEL_EXPORTER_PROMETHEUS_PORT={base}")
    if not (ROOT / ".venv" / "bin" / "torchrun").exists():
        command = command.replace(".venv/bin/", f"{Path(sys.executable).parent}/")
    env = subprocess_env(write_dist_info(tmp_path / "dist"), TRAIN_LINGER_S="0" if distro else "20")
    env = {k: v for k, v in env.items() if not k.startswith("OTEL_") or k == "OTEL_PYTHON_LOG_LEVEL"}
    if distro:
        env["PYTHONPATH"] = f"{DISTRO}{os.pathsep}{env['PYTHONPATH']}"
        listed = subprocess.run([sys.executable, "-c", LIST_DISTROS], env=env, capture_output=True, text=True)
        assert "'distro'" in listed.stdout  # opentelemetry-instrument will load it (and its gRPC default)

    scraped = _run(command, tmp_path, env, [] if distro else [base, base + 1])

    spans = _spans_of_run(phoenix, "tp-mlp", run_id)
    by_id = {s["context"]["span_id"]: s for s in spans}
    rank_steps = Counter(
        s["attributes"]["hp_otel.rank"] for s in spans if s["name"] == f"rank {s['attributes'].get('hp_otel.rank')}"
    )
    assert rank_steps == {0: STEPS - 1, 1: STEPS - 1}  # over HTTP (the distro alone would pick gRPC)
    collectives = [s for s in spans if s["attributes"].get("hp_otel.call.kind") == "collective"]
    # fc2's forward all_reduce, per rank and step (the input needs no gradient: no backward all_reduce in fc1)
    assert len(collectives) == 2 * (STEPS - 1)

    def module_of(span: dict) -> str:  # the innermost module span enclosing it: attribution
        while span["attributes"].get("hp_otel.call.kind") != "module":
            span = by_id[span["parent_id"]]
        return f"{span['attributes']['hp_otel.module.fqn']}/{span['attributes']['hp_otel.phase']}"

    assert Counter(module_of(s) for s in collectives) == {"fc2/forward": 2 * (STEPS - 1)}
    if not distro:  # both ranks served /metrics (the launcher left rank 0's port free), counts per module
        for text in scraped.values():
            calls = [line for line in text.splitlines() if line.startswith("hp_otel_collective_calls_total{")]
            assert any('hp_otel_module_fqn="fc2"' in line and 'hp_otel_phase="forward"' in line for line in calls), (
                calls
            )
            assert 'hp_otel_rank="' in text  # the resource (target_info) says which rank
        assert sorted(scraped) == [base, base + 1]
