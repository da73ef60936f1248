"""deploy/alerts: the hang, slow-rank and exposed-communication alerts are proven by `promtool test rules`,
on names hp_otel really exports."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import servers
from events import ALL_REDUCE, design_mlp_forward

ALERTS = Path(__file__).resolve().parents[2] / "deploy" / "alerts"


def _promtool() -> str:
    found = shutil.which("promtool") or ("/usr/bin/promtool" if os.access("/usr/bin/promtool", os.X_OK) else None)
    if found is None:
        servers.missing("promtool (Debian's prometheus package) is not installed")
    return found  # type: ignore[return-value]


def test_promtool_proves_the_alerts() -> None:
    result = subprocess.run(
        [_promtool(), "test", "rules", "hp_otel_rules_test.yml"], cwd=ALERTS, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_promtool_fails_a_rule_that_does_not_fire(tmp_path: Path) -> None:
    """The unit test can fail: with the peers' freshness threshold at 0 s no rank is ever 'stale while peers fresh'."""
    rules = (ALERTS / "hp_otel_rules.yml").read_text().replace("by_rank) < 30", "by_rank) < 0")
    (tmp_path / "hp_otel_rules.yml").write_text(rules)
    shutil.copy(ALERTS / "hp_otel_rules_test.yml", tmp_path)
    result = subprocess.run(
        [_promtool(), "test", "rules", "hp_otel_rules_test.yml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0 and "HpOtelRankStale" in result.stdout + result.stderr


def test_rules_use_only_names_hp_otel_exports(fake_world) -> None:
    from opentelemetry.exporter.prometheus import PrometheusMetricReader
    from opentelemetry.sdk.metrics import MeterProvider
    from prometheus_client import REGISTRY, generate_latest

    from hp_otel import CommDebugMode
    from hp_otel.export.providers import build_resource

    reader = PrometheusMetricReader()
    provider = MeterProvider(
        metric_readers=[reader], resource=build_resource({"hp_otel.rank": 0, "hp_otel.run.id": "run-1"})
    )
    try:
        import torch

        from hp_otel.workloads.tp_mlp import build_tp_mlp, train_step

        with CommDebugMode(meter_provider=provider) as mode:
            design_mlp_forward(mode.observer)
        model = build_tp_mlp(2)  # its async collectives give the busbw and exposed-communication metrics
        with CommDebugMode(module=model, meter_provider=provider) as mode:
            train_step(model, torch.randn(4, 16, requires_grad=True))
            mode.observer.on_collective_issue(ALL_REDUCE, time.time_ns())  # one in flight: the oldest gauge has a point
            text = generate_latest(REGISTRY).decode()
    finally:
        provider.shutdown()
    exported = set()
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        metric, _, rest = line.partition("{")
        exported.add(metric.split()[0])
        exported.update(re.findall(r'(\w+)="', rest))
    rules = (ALERTS / "hp_otel_rules.yml").read_text()
    used = set(re.findall(r"\bhp_otel_collective_\w+|\bhp_otel_rank\b|\bhp_otel_run_id\b|\btarget_info\b", rules))
    assert {
        "hp_otel_collective_since_last_completion_seconds",
        "hp_otel_collective_oldest_in_flight_age_seconds",
        "hp_otel_collective_busbw_bytes_per_second_sum",
        "hp_otel_collective_time_seconds_total",
    } <= used
    assert used - exported == set()
    test_series = (ALERTS / "hp_otel_rules_test.yml").read_text()
    assert set(re.findall(r"\bhp_otel_collective_\w+_seconds\b", test_series)) <= exported
