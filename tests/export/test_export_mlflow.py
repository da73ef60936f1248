"""A real 2-rank run exports its spans over OTLP/HTTP to a real MLflow tracking server, read back with MLflow's API.

What MLflow gives an ML team, checked through `mlflow.search_traces` (the MLflow venv's
python, in a child process): the `x-mlflow-experiment-id` header files each step's trace
in that experiment; the `x-mlflow-run-id` header links the traces to the training run's
MLflow run (`search_traces(run_id=...)`, the run page's traces) and a run that sent no
such header stays unlinked; each trace is the whole step across ranks, its tree (one
`step N` root, a `rank R` per rank, each collective's parent chain) and its
`hp_otel.collective.*` attributes (int arrays too) intact. The expected span counts come from
each rank's own spans file, not from MLflow.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from typing import Any

import pytest
import servers

from hp_otel.always_on.steps import step_ids
from hp_otel.spans.otlp_json import read_spans

pytestmark = [pytest.mark.server, pytest.mark.multiprocess]  # a real MLflow server and two 2-rank runs

STEPS = 2
UNLINKED_RUN = "mlflow-unlinked"

CREATE_RUN = """
import json, sys, mlflow
mlflow.set_tracking_uri(sys.argv[1])
experiment = mlflow.create_experiment("hp_otel")
run = mlflow.MlflowClient().create_run(experiment, run_name="training")
print(json.dumps({"experiment": experiment, "run": run.info.run_id}))
"""

SEARCH_TRACES = """
import json, sys, mlflow
url, experiment, run_id = sys.argv[1:4]
mlflow.set_tracking_uri(url)
def spans(trace):
    return [
        {"name": s.name, "span_id": s.span_id, "parent_id": s.parent_id, "attributes": s.attributes,
         "links": [[link.trace_id, link.span_id] for link in s.links]}
        for s in trace.data.spans
    ]
every = mlflow.search_traces(locations=[experiment], return_type="list")
linked = mlflow.search_traces(locations=[experiment], run_id=run_id, return_type="list")
print(json.dumps({
    "traces": {t.info.trace_id: spans(t) for t in every},
    "linked": sorted(t.info.trace_id for t in linked),
}, default=str))
"""


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("mlflow")
    server, url = servers.start_mlflow(workdir)
    try:
        ids = servers.mlflow_client(CREATE_RUN, url, workdir=workdir)
        yield url, ids["experiment"], ids["run"], workdir
    finally:
        server.close(grace_s=2)  # its job runner outlives SIGTERM by > 10 s; the store is a throwaway


# The docs' recipe (docs/guide/mlflow.md) in a training script of one rank (the fake process group):
# the traces endpoint and headers variables alone, `hp_otel.configure()` reading them.
ONE_RANK_STEP = """
import json, torch, torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore
import hp_otel
from hp_otel.workloads.tp_mlp import build_tp_mlp, train_step

dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
model = build_tp_mlp(2)
hp_otel.configure()
with hp_otel.step(0), hp_otel.CommDebugMode(module=model) as mode:
    train_step(model, torch.randn(4, 16, requires_grad=True))
kept = len(mode.get_finished_spans())
hp_otel.shutdown()
dist.destroy_process_group()
print(json.dumps({"window_spans": kept}))
"""


@pytest.fixture(scope="module")
def runs(mlflow_server, tmp_path_factory):
    """Two runs at once into one experiment: a 2-rank demo linked to the MLflow run, a 1-rank step not."""
    url, experiment, run_id, _ = mlflow_server
    out = tmp_path_factory.mktemp("linked")
    args = ["demo", "--out", str(out), "--otlp-endpoint", url, "--otlp-protocol", "http/protobuf"]
    # MLflow takes no OTLP metrics (404 on /v1/metrics): the spans alone, as docs/guide/mlflow.md says
    args += ["--otlp-traces-only", "--steps", str(STEPS), "--run-id", run_id]
    headers = f"x-mlflow-experiment-id={experiment},x-mlflow-run-id={run_id}"
    demo = servers.hp_otel_cli(*args, env={"OTEL_EXPORTER_OTLP_HEADERS": headers})
    one_rank_env = {
        **os.environ,
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"{url}/v1/traces",
        "OTEL_EXPORTER_OTLP_TRACES_HEADERS": f"x-mlflow-experiment-id={experiment}",
        "HP_OTEL_RUN_ID": UNLINKED_RUN,
    }
    one_rank = subprocess.Popen(
        [sys.executable, "-c", ONE_RANK_STEP],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=one_rank_env,
        start_new_session=True,
    )
    try:
        stdout, stderr = demo.communicate(timeout=240)
        assert demo.returncode == 0, stderr[-3000:]
        assert f"run id {run_id}" in stdout
        assert "Failed to export" not in stderr  # --otlp-traces-only: no metrics sent to a backend that takes none
        one_stdout, one_stderr = one_rank.communicate(timeout=240)
        assert one_rank.returncode == 0, one_stderr[-3000:]
        assert "Failed to export" not in one_stderr  # traces only: no metrics sent to a backend that takes none
    finally:
        for child in (demo, one_rank):
            if child.poll() is None:
                servers.stop(child)
    window_spans = json.loads(one_stdout.strip().splitlines()[-1])["window_spans"]
    per_rank = {r: len(read_spans(out / f"spans_rank{r}.json")) + 1 for r in (0, 1)}  # + its rank_step
    return {"linked": (run_id, STEPS, per_rank), "unlinked": (UNLINKED_RUN, 1, {0: window_spans + 1})}


def _mlflow_trace_id(trace_id: int) -> str:
    return f"tr-{trace_id:032x}"  # MLflow names an OTLP trace by its OpenTelemetry trace id


@pytest.fixture(scope="module")
def stored(mlflow_server, runs) -> dict[str, Any]:
    """What MLflow returns once every step's trace holds all its spans (both ranks' exports have landed)."""
    url, experiment, run_id, workdir = mlflow_server
    expected = {}
    for hp_otel_run_id, steps, per_rank in runs.values():
        for step in range(steps):
            expected[_mlflow_trace_id(step_ids(hp_otel_run_id, step)[0])] = 1 + sum(per_rank.values())

    def complete() -> dict[str, Any] | None:
        found = servers.mlflow_client(SEARCH_TRACES, url, experiment, run_id, workdir=workdir)
        counts = {trace: len(spans) for trace, spans in found["traces"].items()}
        return found if all(counts.get(t, 0) >= n for t, n in expected.items()) else None

    return servers.wait_for(complete, 90, f"the traces {expected} in MLflow", interval=2)


def test_every_step_is_one_mlflow_trace_with_its_tree_and_collective_attributes(runs, stored) -> None:
    hp_otel_run_id, steps, per_rank = runs["linked"]
    for step in range(steps):
        trace_id, root_id = step_ids(hp_otel_run_id, step)
        spans = stored["traces"][_mlflow_trace_id(trace_id)]
        assert len(spans) == 1 + sum(per_rank.values())
        by_id = {s["span_id"]: s for s in spans}
        assert len(by_id) == len(spans)

        roots = [s for s in spans if s["parent_id"] is None]
        assert [(r["name"], r["span_id"]) for r in roots] == [(f"step {step}", f"{root_id:016x}")]
        assert (
            roots[0]["attributes"]["hp_otel.step"] == step
            and roots[0]["attributes"]["hp_otel.run.id"] == hp_otel_run_id
        )

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

        assert Counter(rank_of(s) for s in spans if s["parent_id"] is not None) == per_rank
        collectives = [s for s in spans if s["attributes"].get("hp_otel.call.kind") == "collective"]
        phases = Counter((rank_of(s), s["attributes"]["hp_otel.phase"]) for s in collectives)
        assert phases == {(0, "forward"): 1, (0, "backward"): 1, (1, "forward"): 1, (1, "backward"): 1}
        for span in collectives:
            attrs = span["attributes"]
            assert attrs["hp_otel.collective.name"] == "_c10d_functional.all_reduce"
            assert attrs["hp_otel.collective.op"] == "all_reduce"
            assert attrs["hp_otel.collective.group.size"] == 2
            assert attrs["hp_otel.collective.input.size"] == 256
            assert attrs["hp_otel.collective.input.shape"] == [4, 16]
            assert "hp.collective.group_ranks" not in attrs  # the members: once per group and window
            assert attrs["hp_otel.collective.window"] == f"step {step}"
            assert by_id[span["parent_id"]]["name"] == "redistribute"
        # the same collective on both ranks carries the same match id: searchable in MLflow as in any backend
        by_match = Counter(s["attributes"]["hp_otel.collective.match.id"] for s in collectives)
        assert sorted(by_match.values()) == [2, 2]
        # rank 1's span of each collective links to rank 0's (the group's first member): the link opens it
        links = [(s, link) for s in collectives for link in s["links"]]
        assert sorted(rank_of(s) for s, _ in links) == [1, 1]
        for span, (trace, target) in links:
            assert trace == _mlflow_trace_id(trace_id) and rank_of(by_id[target]) == 0
            assert (
                by_id[target]["attributes"]["hp_otel.collective.match.id"]
                == span["attributes"]["hp_otel.collective.match.id"]
            )
        modules = {
            s["attributes"]["hp_otel.module.fqn"] for s in spans if s["attributes"].get("hp_otel.call.kind") == "module"
        }
        assert modules == {"(root)", "fc1", "fc2"}


def test_the_run_id_header_links_exactly_that_runs_traces_to_the_mlflow_run(runs, stored) -> None:
    linked_run, linked_steps, _ = runs["linked"]
    linked = {_mlflow_trace_id(step_ids(linked_run, step)[0]) for step in range(linked_steps)}
    unlinked = _mlflow_trace_id(step_ids(UNLINKED_RUN, 0)[0])
    assert linked | {unlinked} == set(stored["traces"])  # both runs' steps are in the experiment ...
    assert stored["linked"] == sorted(linked)  # ... only the one that sent x-mlflow-run-id is the run's


def test_the_docs_recipe_exports_a_training_step_with_the_variables_alone(runs, stored) -> None:
    """OTEL_EXPORTER_OTLP_TRACES_ENDPOINT/_HEADERS and hp_otel.configure(): the step's whole trace, traces only."""
    _, _, per_rank = runs["unlinked"]
    trace_id, root_id = step_ids(UNLINKED_RUN, 0)
    spans = stored["traces"][_mlflow_trace_id(trace_id)]
    assert len(spans) == 1 + per_rank[0]
    roots = [s for s in spans if s["parent_id"] is None]
    assert [(r["name"], r["span_id"]) for r in roots] == [("step 0", f"{root_id:016x}")]
    collectives = [s for s in spans if s["attributes"].get("hp_otel.call.kind") == "collective"]
    assert Counter(s["attributes"]["hp_otel.phase"] for s in collectives) == {"forward": 1, "backward": 1}


@pytest.mark.browser  # headless Chromium on MLflow's own UI
def test_mlflows_trace_list_shows_each_step(mlflow_server, runs, stored, tmp_path) -> None:
    """The experiment's trace list in MLflow's UI (headless Chromium) has a row a step that says which step,
    of which run, on how many ranks (its Input column: the step root span's `mlflow.spanInputs`; the rows
    were all `-` before); the page's text is read back, its screenshot kept in the server's folder."""
    import base64

    from devtools import Browser

    url, experiment, _, workdir = mlflow_server
    linked_run, steps, _ = runs["linked"]
    wanted = [json.dumps({"step": n, "run": linked_run, "ranks": 2}) for n in range(steps)]
    wanted.append(json.dumps({"step": 0, "run": UNLINKED_RUN}))  # the docs recipe: one process, no launcher
    with Browser(timeout_s=120) as browser:
        page = browser.page()
        page.send(
            "Emulation.setDeviceMetricsOverride",
            {"width": 1600, "height": 900, "deviceScaleFactor": 1, "mobile": False},
        )
        page.navigate(f"{url}/#/experiments/{experiment}/traces")
        text_js = "(document.body ? document.body.innerText : '')"  # no body until the page has loaded
        condition = " && ".join(f"{text_js}.includes({json.dumps(w)})" for w in wanted)
        try:
            page.wait_for(condition, 120, f"the trace list to show {wanted}")
        finally:
            text = page.evaluate(text_js)
            shot = base64.b64decode(page.send("Page.captureScreenshot", {"format": "png"})["data"])
            (workdir / "mlflow_trace_list.png").write_bytes(shot)
            print(f"MLflow trace list ({workdir / 'mlflow_trace_list.png'}): {text!r}")
    rows = [line for line in text.splitlines() if line.startswith('{"step": ')]
    assert sorted(rows) == sorted(wanted), text  # one row a step, nothing else in that column
    assert len(shot) > 10_000
