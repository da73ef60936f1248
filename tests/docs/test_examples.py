"""The examples the docs include run as written and print what the docs show.

Each fake-process-group example (`examples/<name>.py`) is run as `__main__`, all in one
child process (torch is imported once), and what it printed (ANSI colours removed) must equal
`examples/output/<name>.txt`: the docs include both files, so a page cannot show code or
output that no longer holds. Their counts are checked against the referee, a dispatch mode
of the tests' own (`tests/support/referee.py`), on the models and plans the examples define.
The torchrun example with OTLP export runs on 2 real gloo ranks against an OTLP/HTTP receiver.
"""

from __future__ import annotations

import http.server
import importlib.util
import json
import os
import re
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path
from types import ModuleType

import pytest
import torch
from referee import Referee

from hp_otel import CommDebugMode

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
FAKE_GROUP_EXAMPLES = ("tp_mlp", "tp_sp_transformer", "fsdp2", "migrate_from_torch", "fused_qkv")
ANSI = re.compile(r"\x1b\[[0-9;]*m")

_RUN_EACH = """
import contextlib, io, json, runpy, sys
printed = {}
for path in sys.argv[1:]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        runpy.run_path(path, run_name="__main__")
    printed[path] = out.getvalue()
print(json.dumps(printed))
"""


def _load(name: str) -> ModuleType:
    """An example as a module (its `if __name__ == "__main__"` part does not run)."""
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def printed() -> dict[str, str]:
    paths = [str(EXAMPLES / f"{name}.py") for name in FAKE_GROUP_EXAMPLES]
    result = subprocess.run(
        [sys.executable, "-c", _RUN_EACH, *paths], capture_output=True, text=True, timeout=300, cwd=ROOT, check=False
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return {Path(path).stem: ANSI.sub("", text) for path, text in json.loads(result.stdout).items()}


@pytest.mark.parametrize("name", FAKE_GROUP_EXAMPLES)
def test_the_example_prints_its_documented_output(printed, name) -> None:
    # Exactly: on the fake process group nothing is timed (issue 35 item 2), so nothing printed varies.
    assert printed[name] == (EXAMPLES / "output" / f"{name}.txt").read_text()


def test_the_readme_snippet_is_the_example_and_its_output() -> None:
    readme = (ROOT / "README.md").read_text()
    code = re.search(r"<!-- quickstart: begin -->\s*```python\n(.*?)```", readme, re.S)
    output = re.search(r"<!-- quickstart output: begin -->\s*```text\n(.*?)```", readme, re.S)
    assert code and output, "README.md has no quickstart block and output"
    assert code.group(1) == (EXAMPLES / "tp_mlp.py").read_text()
    assert output.group(1) == (EXAMPLES / "output" / "tp_mlp.txt").read_text()


def _counted(model: torch.nn.Module, step) -> tuple[CommDebugMode, Referee]:
    referee = Referee(model)
    with CommDebugMode(module=model) as mode, referee:
        step()
    return mode, referee


def test_the_tp_sp_transformer_counts_equal_the_referee(fake_world) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    example = _load("tp_sp_transformer")
    torch.manual_seed(0)
    model = example.parallelize(example.Transformer(), init_device_mesh("cpu", (fake_world,)))
    mode, referee = _counted(model, lambda: model(torch.randint(32, (4, 8))).sum().backward())
    assert mode.get_comm_counts() == dict(referee.counts)
    assert mode.get_comm_module_counts() == referee.module_counts_dict()
    assert Counter(mode.get_comm_counts(normalized=True)) == Counter(all_gather=11, reduce_scatter=10)


def test_the_fused_qkv_attention_counts_equal_the_referee(fake_world) -> None:
    """docs/guide/your-model.md reads this table: the fused projection's split is an all_gather
    in the forward of the module that splits it, its backward two more, as the referee counts."""
    from torch.distributed.device_mesh import init_device_mesh

    example = _load("fused_qkv")
    model = example.parallelize(example.FusedAttention(), init_device_mesh("cpu", (fake_world,)))
    x = torch.randn(2, 4, 16, requires_grad=True)
    mode, referee = _counted(model, lambda: model(x).sum().backward())
    assert mode.get_comm_counts() == dict(referee.counts)
    assert mode.get_comm_module_counts() == referee.module_counts_dict()
    assert Counter(mode.get_comm_counts(normalized=True)) == Counter(all_gather=3, all_reduce=2)
    assert mode.get_comm_module_counts()["qkv"] == {"backward": {"_c10d_functional.all_reduce": 1}}


def test_the_fsdp2_counts_and_param_modules_equal_the_referee_and_fsdp_labels(fake_world) -> None:
    from referee import fsdp_collectives_from_profile
    from torch.distributed.device_mesh import init_device_mesh
    from torch.profiler import ProfilerActivity, profile

    example = _load("fsdp2")
    torch.manual_seed(0)
    model = example.shard(example.Model(), init_device_mesh("cpu", (fake_world,)))
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        mode, referee = _counted(model, lambda: model(torch.randn(8, 16)).sum().backward())
    assert mode.get_comm_counts() == dict(referee.counts)
    spans = sorted(
        (s for s in mode.get_finished_spans() if s.attributes["hp_otel.call.kind"] == "collective"),
        key=lambda s: s.start_time,
    )
    ours = [(s.attributes["hp_otel.collective.name"], s.attributes["hp_otel.collective.param.module"]) for s in spans]
    assert ours == fsdp_collectives_from_profile(prof)  # FSDP's own profiler labels name the same modules


class _OtlpReceiver:
    """An OTLP/HTTP endpoint that keeps every span it is sent, with its resource's rank."""

    def __init__(self) -> None:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

        self.spans: list[dict] = []
        spans, lock = self.spans, threading.Lock()

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.path == "/v1/traces":
                    for resource_spans in ExportTraceServiceRequest.FromString(body).resource_spans:
                        resource = {a.key: a.value for a in resource_spans.resource.attributes}
                        rank = resource["hp_otel.rank"].int_value
                        for scope in resource_spans.scope_spans:
                            with lock:
                                spans.extend(
                                    {"rank": rank, "name": s.name, "trace_id": s.trace_id.hex(), "attrs": s.attributes}
                                    for s in scope.spans
                                )
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.multiprocess  # a real 2-process torchrun job
def test_the_torchrun_otlp_example_sends_one_trace_per_step_from_every_rank(tmp_path) -> None:
    receiver = _OtlpReceiver()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "HP_OTEL_"))}
    env.update(OTEL_EXPORTER_OTLP_ENDPOINT=receiver.url, OTEL_SERVICE_NAME="tp-mlp", TRAIN_STEPS="2")
    torchrun = Path(sys.executable).with_name("torchrun")
    try:
        result = subprocess.run(
            [str(torchrun), "--nproc-per-node", "2", str(EXAMPLES / "torchrun_otlp.py")],
            capture_output=True, text=True, timeout=240, check=False, cwd=tmp_path, env=env,
        )  # fmt: skip
    finally:
        receiver.close()
    assert result.returncode == 0, result.stderr[-4000:]
    assert re.findall(r"step (\d): loss [\d.]+, \{'all_reduce': 2\}", result.stdout) == ["0", "1"], result.stdout
    spans = receiver.spans
    for step in (0, 1):
        (root,) = [s for s in spans if s["name"] == f"step {step}" and s["attrs"] and _step(s) == step]
        rank_steps = [s for s in spans if s["name"] == f"rank {s['rank']}" and _step(s) == step]
        assert sorted(s["rank"] for s in rank_steps) == [0, 1]
        assert {s["trace_id"] for s in rank_steps} == {root["trace_id"]}  # one trace across ranks
        for rank in (0, 1):
            collectives = [s for s in spans if s["trace_id"] == root["trace_id"] and s["rank"] == rank]
            assert Counter(s["name"] for s in collectives if s["name"] == "all_reduce") == {"all_reduce": 2}


def _step(span: dict) -> int | None:
    for attribute in span["attrs"]:
        if attribute.key == "hp_otel.step":
            return attribute.value.int_value
    return None


@pytest.mark.multiprocess  # 2 gloo ranks
def test_the_rank_desync_example_diverges_as_the_walkthrough_shows(tmp_path) -> None:
    out = tmp_path / "div"
    run = subprocess.run(
        [sys.executable, str(EXAMPLES / "rank_desync.py"), "--case", "divergent", "--out", str(out)],
        capture_output=True, text=True, timeout=180, check=False, cwd=tmp_path,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-4000:]
    files = [str(out / f"spans_rank{rank}.json") for rank in (0, 1)]
    ranks = subprocess.run(
        [sys.executable, "-m", "hp_otel.cli", "ranks", *files], capture_output=True, text=True, timeout=120, check=False
    )
    assert ranks.returncode == 3, ranks.stdout + ranks.stderr
    page = (ROOT / "docs" / "guide" / "across-ranks.md").read_text()
    documented = page[page.index("`--case divergent`") :]
    documented = documented[documented.index("```\n") + 4 : documented.index("\n```", documented.index("```\n") + 4)]
    for line in documented.splitlines():  # the walkthrough's lines, as the command prints them
        assert line in ranks.stdout.splitlines(), f"{line!r} not in:\n{ranks.stdout}"
