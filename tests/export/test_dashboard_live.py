"""Every dashboard panel's PromQL, and every recording rule, against a real Prometheus scraping a live run.

A 2-rank gloo demo serves /metrics on base port + local rank; Debian's Prometheus scrapes both
every 0.25 s while its steps run (0.3 s apart: on a quiet machine the 12 steps took less than one
scrape interval, and every rate() panel read 0 or NaN).  Once Prometheus holds every step's calls (the referee: the TP
MLP issues 2 all_reduce a step, per rank), each panel's query, `$run_id` and `$__rate_interval`
filled in as Grafana would, must return series for both ranks where it splits by rank, with
finite values in their range: busbw and exposed time positive, the exposed fraction within
[0, 1], no collective in flight once the steps are done and the oldest-in-flight age 0.
(`test_dashboard_queries.py` proves the first panels' exact values from a step with promtool.)
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import servers
import yaml

pytestmark = [pytest.mark.server, pytest.mark.multiprocess]  # a real Prometheus and a 2-rank gloo run

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
STEPS = 12
CALLS_PER_STEP = 2  # the TP MLP's forward and backward all_reduce
RATE_WINDOW = "5m"  # covers the whole run: a rate from its first scrape to its last


def _panels() -> list[dict]:
    return json.loads((DEPLOY / "grafana/dashboards/hp_otel_collectives.json").read_text())["panels"]


def _filled(expr: str) -> str:
    return expr.replace("$run_id", ".*").replace("$__rate_interval", RATE_WINDOW)


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("dashboard")
    base = servers.free_port_pair()
    server, url = servers.start_prometheus(workdir, [f"127.0.0.1:{base}", f"127.0.0.1:{base + 1}"], interval="250ms")
    # --step-pause: the steps span many scrapes, so every rate() sees its counters grow
    child = servers.hp_otel_cli(
        "demo", "--out", str(workdir / "out"), "--prometheus-port", str(base), "--steps", str(STEPS),
        "--linger", "60", "--step-pause", "0.3",
    )  # fmt: skip
    expected = {"0": float(STEPS * CALLS_PER_STEP), "1": float(STEPS * CALLS_PER_STEP)}
    by_rank = "sum by (hp_otel_rank) ({} * on (job, instance) group_left (hp_otel_rank) target_info)"

    def complete() -> bool:
        if child.poll() is not None:
            raise AssertionError(f"the demo exited early: {child.communicate()[1][-3000:]}")
        for metric in ("hp_otel_collective_calls_total", "hp_otel_collective_duration_seconds_count"):
            result = servers.prometheus_query(url, by_rank.format(metric))
            if {r["metric"].get("hp_otel_rank"): float(r["value"][1]) for r in result} != expected:
                return False
        return True

    try:
        servers.wait_for(complete, 120, f"Prometheus to see {expected} calls by rank")
        yield url
    finally:
        servers.stop(child)
        server.close()


@pytest.mark.parametrize("panel", _panels(), ids=lambda p: p["title"])
def test_every_panel_returns_data_from_the_live_run(prometheus, panel) -> None:
    (target,) = panel["targets"]
    result = servers.prometheus_query(prometheus, _filled(target["expr"]))
    assert result, f"{panel['title']}: no series"
    values = [float(r["value"][1]) for r in result]
    assert all(math.isfinite(v) for v in values), (panel["title"], result)
    if "hp_otel_rank" in target["expr"].partition("(")[2].partition(")")[0]:  # split by rank
        assert sorted(r["metric"]["hp_otel_rank"] for r in result) == ["0", "1"], result
    title = panel["title"]
    if "busbw" in title or "Exposed communication time" in title:
        assert all(v > 0 for v in values), (title, values)
    if "fraction" in title:
        assert all(0.0 <= v <= 1.0 for v in values), (title, values)
    if "in flight" in title or "in-flight" in title:
        assert values == [0.0, 0.0], (title, values)  # the steps are over: nothing in flight


def test_the_dashboard_shows_what_we_measure() -> None:
    exprs = " ".join(t["expr"] for p in _panels() for t in p["targets"])
    for metric in (
        "hp_otel_collective_busbw_bytes_per_second_sum",
        "hp_otel_collective_time_seconds_total",
        "hp_otel_collective_in_flight_count",
        "hp_otel_collective_oldest_in_flight_age_seconds",
    ):
        assert metric in exprs, metric


def test_every_recording_rule_returns_data_from_the_live_run(prometheus) -> None:
    groups = yaml.safe_load((DEPLOY / "alerts/hp_otel_rules.yml").read_text())["groups"]
    records = [rule for group in groups for rule in group["rules"] if "record" in rule]
    assert records
    for rule in records:
        result = servers.prometheus_query(prometheus, rule["expr"])
        assert sorted(r["metric"]["hp_otel_rank"] for r in result) == ["0", "1"], (rule["record"], result)


def test_the_series_name_the_backend_the_run_initialised(prometheus) -> None:
    """The demo's ranks call init_process_group("gloo"): every collective series says so."""
    series = servers.prometheus_query(prometheus, "hp_otel_collective_calls_total")
    assert series and {s["metric"].get("hp_otel_collective_system_name") for s in series} == {"gloo"}
