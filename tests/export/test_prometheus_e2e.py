"""A real Prometheus scrapes the /metrics endpoints of a real 2-rank run and answers per-rank counts.

The run serves /metrics on base port + local rank; Prometheus scrapes both every
second; its HTTP API then splits the collective counters by rank through target_info
(where OTel's Prometheus exporter puts the resource, `hp_otel.rank` included).
"""

from __future__ import annotations

import pytest
import servers

pytestmark = [pytest.mark.server, pytest.mark.multiprocess]  # a real Prometheus and 2-rank runs

STEPS = 3
CALLS_PER_STEP = 2  # the TP MLP's forward and backward all_reduce


def by_rank(metric: str) -> str:
    return f"sum by (hp_otel_rank) ({metric} * on (job, instance) group_left (hp_otel_rank) target_info)"


@pytest.fixture(scope="module")
def scraped(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("prometheus")
    base = servers.free_port_pair()
    server, url = servers.start_prometheus(workdir, [f"127.0.0.1:{base}", f"127.0.0.1:{base + 1}"])
    child = servers.hp_otel_cli(
        "demo", "--out", str(workdir / "out"), "--prometheus-port", str(base), "--steps", str(STEPS),
        "--linger", "30",
    )  # fmt: skip
    try:
        expected = {"0": STEPS * CALLS_PER_STEP, "1": STEPS * CALLS_PER_STEP}

        def counts_by_rank() -> dict[str, float] | None:
            if child.poll() is not None:
                raise AssertionError(f"the demo exited early: {child.communicate()[1][-3000:]}")
            # calls count as they happen; durations are recorded when each step's window
            # ends, so a scrape can fall between the two: wait until both are complete
            counts = {}
            for metric in ("hp_otel_collective_calls_total", "hp_otel_collective_duration_seconds_count"):
                result = servers.prometheus_query(url, by_rank(metric))
                counts[metric] = {r["metric"].get("hp_otel_rank"): float(r["value"][1]) for r in result}
            return counts if all(c == expected for c in counts.values()) else None

        servers.wait_for(counts_by_rank, 60, f"Prometheus to see {expected} calls by rank")
        yield url, base
    finally:
        servers.stop(child)
        server.close()


def test_each_rank_serves_metrics_on_base_port_plus_local_rank(scraped) -> None:
    url, base = scraped
    targets = servers.http_json(f"{url}/api/v1/targets")["data"]["activeTargets"]
    health = {t["labels"]["instance"]: t["health"] for t in targets}
    assert health == {f"127.0.0.1:{base}": "up", f"127.0.0.1:{base + 1}": "up"}


def test_counts_bytes_and_durations_per_rank_through_the_http_api(scraped) -> None:
    url, _ = scraped
    calls = servers.prometheus_query(url, by_rank("hp_otel_collective_calls_total"))
    assert {r["metric"]["hp_otel_rank"]: float(r["value"][1]) for r in calls} == {"0": 6.0, "1": 6.0}
    nbytes = servers.prometheus_query(url, by_rank("hp_otel_collective_input_size_bytes_total"))
    assert {r["metric"]["hp_otel_rank"]: float(r["value"][1]) for r in nbytes} == {"0": 6 * 256.0, "1": 6 * 256.0}
    durations = servers.prometheus_query(url, by_rank("hp_otel_collective_duration_seconds_count"))
    assert {r["metric"]["hp_otel_rank"]: float(r["value"][1]) for r in durations} == {"0": 6.0, "1": 6.0}
    buckets = servers.prometheus_query(url, 'hp_otel_collective_duration_seconds_bucket{le="+Inf"}')
    assert sum(float(r["value"][1]) for r in buckets) == 12.0


def test_series_carry_op_phase_module_and_group_size_labels(scraped) -> None:
    url, _ = scraped
    series = servers.prometheus_query(url, "hp_otel_collective_calls_total")
    labels = {
        (s["metric"]["hp_otel_collective_op"], s["metric"]["hp_otel_phase"], s["metric"]["hp_otel_module_fqn"]): s[
            "metric"
        ]["hp_otel_collective_group_size"]
        for s in series
    }
    assert labels == {("all_reduce", "forward", "fc2"): "2", ("all_reduce", "backward", "fc1"): "2"}
    info = servers.prometheus_query(url, "target_info")
    assert sorted(s["metric"]["hp_otel_rank"] for s in info) == ["0", "1"]
    assert {s["metric"]["hp_otel_world_size"] for s in info} == {"2"}
    assert {s["metric"]["service_name"] for s in info} == {"hp_otel"}
