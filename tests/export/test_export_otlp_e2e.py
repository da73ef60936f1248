"""A real 2-rank run exports its spans over OTLP/HTTP and OTLP/gRPC to a real receiver (Arize Phoenix).

Read back from Phoenix's REST API: one trace per step shared by both ranks, one `step`
root `step N` (rank 0), one `rank R` per rank under it, and each rank's collectives with
their attributes and parent chain intact.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
import servers

from hp_otel.always_on.steps import step_ids
from hp_otel.spans.otlp_json import read_spans

pytestmark = [pytest.mark.server, pytest.mark.multiprocess]  # a real OTLP receiver and 2-rank runs

STEPS = 2


@pytest.fixture(scope="module")
def phoenix(tmp_path_factory):
    server, http_port, grpc_port = servers.start_phoenix(tmp_path_factory.mktemp("phoenix"))
    yield http_port, grpc_port
    server.close()


@pytest.fixture(scope="module")
def runs(phoenix, tmp_path_factory):
    """Two 2-rank demo runs at once: one exporting over HTTP, one over gRPC."""
    http_port, grpc_port = phoenix
    specs = {
        "http/protobuf": (f"http://127.0.0.1:{http_port}", "e2e-http"),
        "grpc": (f"http://127.0.0.1:{grpc_port}", "e2e-grpc"),
    }
    children, outs = {}, {}
    for protocol, (endpoint, run_id) in specs.items():
        out = outs[protocol] = tmp_path_factory.mktemp(run_id)
        args = ["demo", "--out", str(out), "--otlp-endpoint", endpoint, "--otlp-protocol", protocol]
        args += ["--steps", str(STEPS), "--run-id", run_id]
        # Phoenix takes no metrics; this test is about spans.
        children[protocol] = servers.hp_otel_cli(*args, env={"OTEL_METRICS_EXPORTER": "none"})
    results = {}
    for protocol, child in children.items():
        stdout, stderr = child.communicate(timeout=180)
        assert child.returncode == 0, stderr[-3000:]
        results[protocol] = (specs[protocol][1], stdout, outs[protocol])
    return results


def _trace(http_port: int, trace_id: int, expected_spans: int) -> list[dict[str, Any]]:
    hex_id = f"{trace_id:032x}"

    def spans_of_trace() -> list[dict[str, Any]] | None:
        spans = [s for s in servers.phoenix_spans(http_port) if s["context"]["trace_id"] == hex_id]
        return spans if len(spans) >= expected_spans else None

    return servers.wait_for(spans_of_trace, 30, f"{expected_spans} spans of trace {hex_id} in Phoenix")


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_every_rank_of_a_step_shares_one_trace_with_parents_and_attributes(phoenix, runs, protocol) -> None:
    http_port, _ = phoenix
    run_id, stdout, out = runs[protocol]
    assert f"run id {run_id}" in stdout
    # each rank's spans of one step: what its local store kept of the last step, plus its rank_step
    per_rank = {r: len(read_spans(out / f"spans_rank{r}.json")) + 1 for r in (0, 1)}
    for step in range(STEPS):
        trace_id, root_id = step_ids(run_id, step)
        spans = _trace(http_port, trace_id, expected_spans=1 + sum(per_rank.values()))
        assert len(spans) == 1 + sum(per_rank.values())
        by_id = {s["context"]["span_id"]: s for s in spans}

        roots = [s for s in spans if s["parent_id"] is None]
        assert [(r["name"], r["context"]["span_id"]) for r in roots] == [(f"step {step}", f"{root_id:016x}")]
        assert roots[0]["attributes"]["hp_otel.step"] == step and roots[0]["attributes"]["hp_otel.run.id"] == run_id

        rank_steps = {
            s["attributes"]["hp_otel.rank"]: s
            for s in spans
            if s["name"] == f"rank {s['attributes'].get('hp_otel.rank')}"
        }
        assert sorted(rank_steps) == [0, 1]
        assert {s["parent_id"] for s in rank_steps.values()} == {f"{root_id:016x}"}

        def rank_of(span: dict[str, Any], by_id: dict[str, Any] = by_id) -> int:
            while span["name"] != f"rank {span['attributes'].get('hp_otel.rank')}":
                span = by_id[span["parent_id"]]  # every parent link resolves inside the trace
            return int(span["attributes"]["hp_otel.rank"])

        collectives = [s for s in spans if s["attributes"].get("hp_otel.call.kind") == "collective"]
        assert Counter(rank_of(s) for s in collectives) == {0: 2, 1: 2}
        for span in collectives:
            attrs = span["attributes"]
            assert attrs["hp_otel.collective.name"] == "_c10d_functional.all_reduce"
            assert attrs["hp_otel.collective.op"] == "all_reduce"
            assert attrs["hp_otel.collective.group.size"] == 2
            assert attrs["hp_otel.collective.input.size"] == 256
            assert list(attrs["hp_otel.collective.input.shape"]) == [4, 16]
            assert by_id[span["parent_id"]]["name"] == "redistribute"
        phases = Counter((rank_of(s), s["attributes"]["hp_otel.phase"]) for s in collectives)
        assert phases == {(0, "forward"): 1, (0, "backward"): 1, (1, "forward"): 1, (1, "backward"): 1}
        modules = {
            s["attributes"]["hp_otel.module.fqn"] for s in spans if s["attributes"].get("hp_otel.call.kind") == "module"
        }
        assert modules == {"(root)", "fc1", "fc2"}
        assert Counter(rank_of(s) for s in spans if s["parent_id"] is not None) == per_rank
