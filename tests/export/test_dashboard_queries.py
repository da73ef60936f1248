"""The dashboard's queries, proven with `promtool test rules` on real expositions, on both metric paths.

Two ranks' real Prometheus expositions (hp_otel's metrics from a TP-MLP step over torch's
fake process group, through OTel's PrometheusMetricReader, scraped after step 1 and after
step 2, 64 s apart) become promtool input series twice:

- direct scrape: each rank is its own target (job `hp_otel_ranks`, instance host:port),
  the rank only in `target_info`;
- through the collector: the collector's Prometheus exporter sets job = service.name and
  instance = service.instance.id, copies the resource onto every series
  (resource_to_telemetry_conversion) and emits one target_info per rank; Prometheus keeps
  those labels because the scrape job has `honor_labels: true`.

Each dashboard query (`$run_id` and `$__rate_interval` filled in) must give the values a
referee computes here from the step itself (2 all_reduce of 256 bytes a step: fc2's
forward, fc1's backward) and from the raw exposition. And without honor_labels the
collector path fails the per-rank join many-to-many, as the old configuration did.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import servers
import yaml

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
RUN_ID = "run-7"
SERVICE = "hp_otel"
CALLS_PER_STEP = 2
BYTES_PER_CALL = 256
# Two scrapes 64 s apart and a 64 s rate window: rate = (after - before) / 64, no extrapolation, and
# with durations rounded to multiples of 2**-30 s every sum below is exact in binary floating point,
# so promtool's exact comparison does not depend on the order Prometheus adds series in.
SCRAPE = "64s"
SECONDS = 64
QUANTUM = 2.0**-30


def _promtool() -> str:
    found = shutil.which("promtool") or ("/usr/bin/promtool" if os.access("/usr/bin/promtool", os.X_OK) else None)
    if found is None:
        servers.missing("promtool (Debian's prometheus package) is not installed")
    return str(found)


def dashboard_queries() -> dict[str, str]:
    dashboard = json.loads((DEPLOY / "grafana/dashboards/hp_otel_collectives.json").read_text())
    return {
        panel["title"]: panel["targets"][0]["expr"].replace("$run_id", RUN_ID).replace("$__rate_interval", SCRAPE)
        for panel in dashboard["panels"]
    }


@pytest.fixture(scope="module")
def expositions(fake_world) -> dict[int, list[list[tuple[str, dict[str, str], float]]]]:
    """{rank: [samples after step 1, samples after step 2]} from real PrometheusMetricReader expositions."""
    import torch
    from opentelemetry.exporter.prometheus import PrometheusMetricReader
    from opentelemetry.sdk.metrics import MeterProvider
    from prometheus_client import REGISTRY, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from hp_otel import CommDebugMode
    from hp_otel.export.providers import build_resource
    from hp_otel.workloads.tp_mlp import build_tp_mlp, train_step

    out: dict[int, list] = {}
    for rank in (0, 1):
        resource = build_resource(
            {"hp_otel.rank": rank, "hp_otel.local_rank": rank, "hp_otel.world.size": 2, "hp_otel.run.id": RUN_ID,
             "service.instance.id": f"instance-{rank}", "service.name": SERVICE}
        )  # fmt: skip
        reader = PrometheusMetricReader()
        provider = MeterProvider(metric_readers=[reader], resource=resource)
        model = build_tp_mlp(2)
        scrapes = []
        try:
            for _ in range(2):
                with CommDebugMode(module=model, meter_provider=provider):
                    train_step(model, torch.randn(4, 16, requires_grad=True))
                text = generate_latest(REGISTRY).decode()
                families = text_string_to_metric_families(text)
                samples = [(s.name, dict(s.labels), s.value) for family in families for s in family.samples]
                scrapes.append([(n, labels, round(v / QUANTUM) * QUANTUM) for n, labels, v in samples])
        finally:
            provider.shutdown()
        out[rank] = scrapes
    return out


def _ours(name: str) -> bool:
    return name.startswith("hp_") or name == "target_info"


def _series(labels: dict[str, str]) -> str:
    name = labels.pop("__name__")
    inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return f"{name}{{{inner}}}"


def input_series(expositions, path: str, honor_labels: bool = True) -> list[dict[str, str]]:
    """The series Prometheus would store from these expositions, on one path."""
    stored: dict[str, list[float]] = {}
    for rank, scrapes in expositions.items():
        resource = {}
        for name, labels, _ in scrapes[0]:
            if name == "target_info":
                resource = {k: v for k, v in labels.items() if k not in ("job", "instance")}
        for scrape in scrapes:
            for name, labels, value in scrape:
                if not _ours(name):
                    continue
                labels = {**labels, "__name__": name}
                if path == "direct":
                    labels.update(job="hp_otel_ranks", instance=f"10.0.0.{rank + 1}:9464")
                else:  # the collector's exporter: job/instance from the resource, resource labels on each series
                    if name != "target_info":
                        labels.update(resource)
                    labels.update(job=SERVICE, instance=resource["service_instance_id"])
                    if not honor_labels:  # Prometheus renames them and puts its own target's
                        labels["exported_job"], labels["exported_instance"] = labels["job"], labels["instance"]
                        labels.update(job="otel-collector", instance="otel-collector:8889")
                stored.setdefault(_series(labels), []).append(value)
    return [{"series": key, "values": " ".join(repr(v) for v in values)} for key, values in stored.items()]


def _total(expositions, rank: int, scrape: int, name: str, **match: str) -> float:
    samples = expositions[rank][scrape]
    return sum(v for n, labels, v in samples if n == name and all(labels.get(k) == m for k, m in match.items()))


def _summed_rates(expositions, rank: int, name: str) -> float:
    """sum(rate(name[64s])) as Prometheus computes it: each series' (after - before) / 64, then added."""
    before = {tuple(sorted(labels.items())): v for n, labels, v in expositions[rank][0] if n == name}
    after = {tuple(sorted(labels.items())): v for n, labels, v in expositions[rank][1] if n == name}
    return sum((after[key] - before.get(key, 0.0)) / SECONDS for key in after)


def _quantile(q: float, buckets: list[tuple[float, float]]) -> float:
    """Prometheus' histogram_quantile on (upper bound, cumulative rate) pairs: linear within the bucket."""
    buckets = sorted(buckets)
    total = buckets[-1][1]
    rank = q * total
    lower, below = 0.0, 0.0
    for upper, count in buckets:
        if count >= rank:
            if math.isinf(upper):
                return lower
            return lower + (upper - lower) * ((rank - below) / (count - below))  # Prometheus' order of operations
        lower, below = upper, count
    return math.nan


def expected(expositions) -> dict[str, list[dict[str, object]]]:
    """The referee: what each panel must show at the second scrape (rates between the two scrapes)."""
    per_step_calls = CALLS_PER_STEP  # from the step itself: fc2's forward all_reduce and fc1's backward one
    rate_calls = per_step_calls / SECONDS
    sums = {r: _summed_rates(expositions, r, "hp_otel_collective_duration_seconds_sum") for r in (0, 1)}
    bounds = sorted(
        {labels["le"] for n, labels, _ in expositions[0][0] if n == "hp_otel_collective_duration_seconds_bucket"},
        key=float,
    )
    bucket = "hp_otel_collective_duration_seconds_bucket"
    buckets = [
        (float(le), sum(_total(expositions, r, 1, bucket, le=le) - _total(expositions, r, 0, bucket, le=le)
                        for r in (0, 1)) / SECONDS)
        for le in bounds
    ]  # fmt: skip
    op = {"hp_otel_collective_op": "all_reduce"}
    return {
        "Collective calls/s by rank and op": [
            {"labels": {"hp_otel_rank": str(r), **op}, "value": rate_calls} for r in (0, 1)
        ],
        "Collective bytes/s by rank and op": [
            {"labels": {"hp_otel_rank": str(r), **op}, "value": rate_calls * BYTES_PER_CALL} for r in (0, 1)
        ],
        "Collective duration p95 by op and group size": [
            {"labels": {**op, "hp_otel_collective_group_size": "2"}, "value": _quantile(0.95, buckets)}
        ],
        "Collective time/s by rank": [{"labels": {"hp_otel_rank": str(r)}, "value": sums[r]} for r in (0, 1)],
        "Collective calls by module and phase (total)": [
            {"labels": {"hp_otel_module_fqn": fqn, "hp_otel_phase": phase, **op}, "value": 2.0 * 2}  # 2 ranks x 2 steps
            for fqn, phase in (("fc2", "forward"), ("fc1", "backward"))
        ],
        "Collective bytes by group size (total)": [
            {"labels": {"hp_otel_collective_group_size": "2", **op}, "value": 2.0 * 2 * CALLS_PER_STEP * BYTES_PER_CALL}
        ],
    }


def _promql_tests(expositions) -> list[dict]:
    wanted = expected(expositions)
    tests = []
    queries = dashboard_queries()  # the panels with exact values here; every panel: test_dashboard_live.py
    for title in wanted:
        expr = queries[title]
        samples = [
            {"labels": "{" + ",".join(f'{k}="{v}"' for k, v in sorted(s["labels"].items())) + "}", "value": s["value"]}
            for s in wanted[title]
        ]
        tests.append({"expr": expr, "eval_time": SCRAPE, "exp_samples": samples})
    return tests


def _run_promtool(tmp_path: Path, name: str, series: list[dict], tests: list[dict]) -> subprocess.CompletedProcess:
    test_file = tmp_path / f"{name}.yml"
    test_file.write_text(
        yaml.safe_dump({"rule_files": [], "evaluation_interval": SCRAPE,
                        "tests": [{"interval": SCRAPE, "input_series": series, "promql_expr_test": tests}]})
    )  # fmt: skip
    return subprocess.run([_promtool(), "test", "rules", str(test_file)], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("path", ["direct", "collector"])
def test_every_dashboard_query_gives_the_referees_values(expositions, tmp_path, path) -> None:
    result = _run_promtool(tmp_path, path, input_series(expositions, path), _promql_tests(expositions))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_without_honor_labels_the_collector_path_matches_many_to_many(expositions, tmp_path) -> None:
    """Why the scrape job has honor_labels: the old configuration's failure, reproduced."""
    series = input_series(expositions, "collector", honor_labels=False)
    result = _run_promtool(tmp_path, "old", series, _promql_tests(expositions)[:1])
    assert result.returncode != 0 and "many-to-many" in result.stdout + result.stderr


def test_the_scrape_job_honors_labels() -> None:
    config = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert jobs["otel-collector"]["honor_labels"] is True
    assert jobs["hp_otel_ranks"]["file_sd_configs"][0]["files"] == ["/etc/prometheus/hp_otel_sd/*.json"]


def test_the_oldest_in_flight_panel_shows_the_age_where_one_is_in_flight_and_0_elsewhere(tmp_path) -> None:
    """The live run ends with nothing in flight (0 on both ranks, test_dashboard_live.py); here rank 1
    has a collective in flight for 42 s: the gauge's age for it, 0 for rank 0 from its in-flight count."""
    (expr,) = [e for title, e in dashboard_queries().items() if "Oldest in-flight" in title]
    base = 'job="hp_otel_ranks", instance="10.0.0.{}:9464"'
    series = [
        {"series": f'target_info{{{base.format(1)}, hp_otel_rank="0", hp_otel_run_id="{RUN_ID}"}}', "values": "1 1"},
        {"series": f'target_info{{{base.format(2)}, hp_otel_rank="1", hp_otel_run_id="{RUN_ID}"}}', "values": "1 1"},
        {"series": f"hp_otel_collective_in_flight_count{{{base.format(1)}}}", "values": "0 0"},
        {"series": f"hp_otel_collective_in_flight_count{{{base.format(2)}}}", "values": "1 1"},
        {
            "series": f"hp_otel_collective_oldest_in_flight_age_seconds{{{base.format(2)}, "
            'hp_otel_collective_op="all_reduce"}',
            "values": "10 42",
        },
    ]
    test = {
        "expr": expr,
        "eval_time": SCRAPE,
        "exp_samples": [{"labels": '{hp_otel_rank="0"}', "value": 0}, {"labels": '{hp_otel_rank="1"}', "value": 42}],
    }
    result = _run_promtool(tmp_path, "oldest", series, [test])
    assert result.returncode == 0, result.stdout + result.stderr
