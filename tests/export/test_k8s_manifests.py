"""deploy/k8s: every manifest valid for the Kubernetes API, every port name one the API server takes.

`kubernetes-validate` checks each object against the API's OpenAPI schemas (strict: no unknown
field); prometheus-operator's PodMonitor and PrometheusRule, which it does not know, are checked
the same way against their CRDs' schemas (crd_schemas/, from the operator's release). It does not
check IANA_SVC_NAME, the rule the API server applies to a port name (at most 15 characters,
lowercase letters, digits and '-', a letter among them, no '--', no '-' at either end), so that is
checked here, on every container and service port.  The Prometheus pod job keeps exactly the
example training pod's per-local-rank metrics ports, and so does the PodMonitor. The PrometheusRule
is deploy/alerts/hp_otel_rules.yml, generated from it: `python tests/export/test_k8s_manifests.py`
rewrites it after the rules change.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

pytestmark = pytest.mark.torch_free  # needs no torch: not rerun on torch 2.14.1 (tests/support/markers.py)

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
MANIFESTS = sorted(p for p in (DEPLOY / "k8s").glob("*.yaml") if p.name != "prometheus-pod-sd.yaml")
RULES = DEPLOY / "alerts/hp_otel_rules.yml"
PROMETHEUS_RULE = DEPLOY / "k8s/prometheusrule.yaml"
_CRD_SCHEMAS = json.loads((Path(__file__).parent / "crd_schemas/monitoring.coreos.com_v1.json").read_text())["schemas"]
_PROMETHEUS_RULE_HEAD = """\
# prometheus-operator's form of ../alerts/hp_otel_rules.yml (the same groups, for clusters that run the operator).
# Generated from that file by `python tests/export/test_k8s_manifests.py`: edit the rules there, not here.
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata:
  name: hp-otel
  labels:
    app.kubernetes.io/name: hp-otel
spec:
"""
_IANA_SVC_NAME = re.compile(r"^(?=.*[a-z])(?!.*--)[a-z0-9]([a-z0-9-]*[a-z0-9])?$")


def _objects(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def prometheus_rule(rules: str) -> str:
    """The PrometheusRule holding the rules file's groups: its text from `groups:` on, indented under `spec`."""
    lines = rules.splitlines(keepends=True)
    start = next(i for i, line in enumerate(lines) if line.startswith("groups:"))
    return _PROMETHEUS_RULE_HEAD + "".join("  " + line if line.strip() else line for line in lines[start:])


def _strict(schema: Any) -> Any:
    """A CRD schema as the API server applies it to a manifest applied strictly: no unknown field."""
    if isinstance(schema, list):
        return [_strict(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: _strict(value) for key, value in schema.items()}
    if "properties" in out and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


def _validate_custom(obj: dict[str, Any]) -> list[str]:
    import jsonschema

    group_version = obj["apiVersion"]
    schema = _CRD_SCHEMAS[f"{group_version}/{obj['kind']}"]
    errors = jsonschema.Draft7Validator(_strict(schema)).iter_errors(obj)
    return [f"{error.message} at {list(error.absolute_path)}" for error in errors]


def _port_names(node: Any) -> list[str]:
    """Every `ports[].name` anywhere in an object (containers, init containers, services)."""
    if isinstance(node, dict):
        names = [p["name"] for p in node.get("ports", []) if isinstance(p, dict) and "name" in p]
        return names + [n for key, value in node.items() if key != "ports" for n in _port_names(value)]
    if isinstance(node, list):
        return [n for item in node for n in _port_names(item)]
    return []


def test_there_are_manifests_and_a_training_pod_example() -> None:
    assert {p.name for p in MANIFESTS} >= {"otel-collector-daemonset.yaml", "training-pod-example.yaml"}


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_every_object_is_valid_for_the_kubernetes_api(path: Path) -> None:
    import kubernetes_validate

    for obj in _objects(path):
        if obj["apiVersion"].startswith("monitoring.coreos.com/"):
            assert not _validate_custom(obj), f"{path.name}: {obj['kind']}: {_validate_custom(obj)}"
            continue
        try:
            kubernetes_validate.validate(obj, kubernetes_validate.latest_version(), strict=True)
        except kubernetes_validate.ValidationError as error:
            pytest.fail(f"{path.name}: {obj['kind']} {obj['metadata'].get('name')}: {error.message} at {error.path}")


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_every_port_name_is_one_the_api_server_accepts(path: Path) -> None:
    names = [n for obj in _objects(path) for n in _port_names(obj)]
    bad = [n for n in names if len(n) > 15 or not _IANA_SVC_NAME.match(n)]
    assert not bad, f"{path.name}: port names over 15 characters or not IANA_SVC_NAME: {bad}"


def test_the_name_rule_refuses_what_the_api_server_refuses() -> None:
    assert _IANA_SVC_NAME.match("hp-otel-m0") and _IANA_SVC_NAME.match("otlp-http")
    for refused in ("hp-otel-metrics1"[:15] + "x", "Hp-otel", "hp--otel", "-hp", "hp-", "1234"):
        assert len(refused) > 15 or not _IANA_SVC_NAME.match(refused), refused


def _port_keep_regex(scrape: str) -> str:
    if scrape == "prometheus-pod-sd":
        (job,) = yaml.safe_load((DEPLOY / "k8s/prometheus-pod-sd.yaml").read_text())["scrape_configs"]
        rules, source = job["relabel_configs"], "source_labels"
    else:  # the PodMonitor: the same rule in the operator's spelling
        (monitor,) = _objects(DEPLOY / "k8s/podmonitor.yaml")
        (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
        assert "port" not in endpoint and "portNumber" not in endpoint  # else the operator keeps that one port only
        rules, source = endpoint["relabelings"], "sourceLabels"
    (rule,) = [r for r in rules if r[source] == ["__meta_kubernetes_pod_container_port_name"]]
    assert rule["action"] == "keep"
    return rule["regex"]


@pytest.mark.parametrize("scrape", ["prometheus-pod-sd", "podmonitor"])
def test_the_pod_scrape_job_keeps_every_local_ranks_metrics_port_and_nothing_else(scrape: str) -> None:
    keep = re.compile(f"^(?:{_port_keep_regex(scrape)})$")  # Prometheus anchors relabel regexes
    (pod,) = [o for o in _objects(DEPLOY / "k8s/training-pod-example.yaml") if o["kind"] == "Pod"]
    ports = [p for c in pod["spec"]["containers"] for p in c.get("ports", [])]
    kept = [p for p in ports if keep.match(p.get("name", ""))]
    local_ranks = int(pod["metadata"]["annotations"]["hp-otel.io/local-ranks"])
    assert [p["containerPort"] for p in kept] == [9464 + r for r in range(local_ranks)]
    assert len(kept) < len(ports)  # the pod's other ports are not scraped
    # the rank on a pod a port belongs to is in its name, so it survives as a label
    assert [p["name"] for p in kept] == [f"hp-otel-m{r}" for r in range(local_ranks)]


def test_the_podmonitor_selects_the_training_pod() -> None:
    (monitor,) = _objects(DEPLOY / "k8s/podmonitor.yaml")
    (pod,) = [o for o in _objects(DEPLOY / "k8s/training-pod-example.yaml") if o["kind"] == "Pod"]
    wanted = monitor["spec"]["selector"]["matchLabels"]
    assert wanted and wanted.items() <= pod["metadata"]["labels"].items()


def test_the_prometheus_rule_holds_the_rules_file() -> None:
    """One source: the PrometheusRule's groups are the rules file's, text and parsed."""
    assert PROMETHEUS_RULE.read_text() == prometheus_rule(RULES.read_text()), (
        "prometheusrule.yaml is not the rules file: run python tests/export/test_k8s_manifests.py"
    )
    (resource,) = _objects(PROMETHEUS_RULE)
    assert resource["spec"]["groups"] == yaml.safe_load(RULES.read_text())["groups"]


def test_the_crd_schemas_refuse_a_misspelt_field() -> None:
    """The custom resources' check can fail: an unknown field (strict) and a wrong type are refused."""
    (resource,) = _objects(PROMETHEUS_RULE)
    resource["spec"]["groups"][0]["rules"][0]["expresion"] = resource["spec"]["groups"][0]["rules"][0].pop("expr")
    (monitor,) = _objects(DEPLOY / "k8s/podmonitor.yaml")
    monitor["spec"]["podMetricsEndpoints"][0]["interval"] = 15
    assert _validate_custom(resource) and _validate_custom(monitor)


if __name__ == "__main__":  # regenerate the PrometheusRule from the rules file
    PROMETHEUS_RULE.write_text(prometheus_rule(RULES.read_text()))
    sys.exit(0)
