"""deploy/k8s: every manifest valid for the Kubernetes API, every port name one the API server takes.

`kubernetes-validate` checks each object against the API's OpenAPI schemas (strict: no unknown
field); it does not check IANA_SVC_NAME, the rule the API server applies to a port name (at most
15 characters, lowercase letters, digits and '-', a letter among them, no '--', no '-' at either
end), so that is checked here, on every container and service port.  The Prometheus pod job keeps
exactly the example training pod's per-local-rank metrics ports.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

pytestmark = pytest.mark.torch_free  # needs no torch: not rerun on torch 2.14.1 (tests/support/markers.py)

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
MANIFESTS = sorted(p for p in (DEPLOY / "k8s").glob("*.yaml") if p.name != "prometheus-pod-sd.yaml")
_IANA_SVC_NAME = re.compile(r"^(?=.*[a-z])(?!.*--)[a-z0-9]([a-z0-9-]*[a-z0-9])?$")


def _objects(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


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


def test_the_pod_scrape_job_keeps_every_local_ranks_metrics_port_and_nothing_else() -> None:
    (job,) = yaml.safe_load((DEPLOY / "k8s/prometheus-pod-sd.yaml").read_text())["scrape_configs"]
    (rule,) = [r for r in job["relabel_configs"] if r["source_labels"] == ["__meta_kubernetes_pod_container_port_name"]]
    keep = re.compile(f"^(?:{rule['regex']})$")  # Prometheus anchors relabel regexes
    (pod,) = [o for o in _objects(DEPLOY / "k8s/training-pod-example.yaml") if o["kind"] == "Pod"]
    ports = [p for c in pod["spec"]["containers"] for p in c.get("ports", [])]
    kept = [p for p in ports if keep.match(p.get("name", ""))]
    local_ranks = int(pod["metadata"]["annotations"]["hp-otel.io/local-ranks"])
    assert [p["containerPort"] for p in kept] == [9464 + r for r in range(local_ranks)]
    assert len(kept) < len(ports)  # the pod's other ports are not scraped
    # the rank on a pod a port belongs to is in its name, so it survives as a label
    assert [p["name"] for p in kept] == [f"hp-otel-m{r}" for r in range(local_ranks)]
