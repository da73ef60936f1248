"""Two MindSpore workers over mccl on loopback (scheduler + workers started by environment)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mindspore", reason="mindspore is not installed (CI installs it)")

from hp_otel.workloads.process_groups import free_port

pytestmark = pytest.mark.multiprocess  # two MindSpore workers over mccl

WORKER = Path(__file__).resolve().parents[1] / "support" / "mindspore_mccl_worker.py"
WORKERS = 2
TIMEOUT_S = 180


def test_collectives_spans_counts_and_metrics_on_every_worker(tmp_path: Path) -> None:
    base = {
        **os.environ,
        "GLOG_v": "3",
        "MS_SCHED_HOST": "127.0.0.1",
        "MS_SCHED_PORT": str(free_port()),
        "MS_WORKER_NUM": str(WORKERS),
        "HP_TEST_OUT": str(tmp_path),
    }
    roles = [("sched", {"MS_ROLE": "MS_SCHED"})]
    roles += [(f"worker{i}", {"MS_ROLE": "MS_WORKER", "MS_NODE_ID": str(i)}) for i in range(WORKERS)]
    procs = []
    for name, env in roles:
        log = open(tmp_path / f"{name}.log", "w")
        procs.append((name, log, subprocess.Popen([sys.executable, str(WORKER)], env={**base, **env}, stdout=log,
                                                  stderr=subprocess.STDOUT, cwd=tmp_path)))  # fmt: skip
    try:
        codes = {name: proc.wait(timeout=TIMEOUT_S) for name, _, proc in procs}
    finally:
        for _, log, proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            log.close()
    logs = {name: (tmp_path / f"{name}.log").read_text()[-3000:] for name, _, _ in procs}
    assert codes == dict.fromkeys(codes, 0), "\n".join(f"--- {n}\n{text}" for n, text in logs.items())
    for rank in range(WORKERS):
        result = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert result["rank"] == rank
        assert result["mindspore"]["counts"]["mint.distributed.all_reduce"] == 3
        assert result["mindspore"]["spans"] == 7
        assert result["hyper_parallel"]["counts"]["differentiable_all_reduce"] == 2
