"""hp_otel against the real hyper-parallel (not the stand-in): torch platform over gloo, MindSpore platform over mccl.

Needs the framework's source: `HP_OTEL_HYPER_PARALLEL_SRC=/path/to/hyper-parallel`
(github.com/mindspore-ai/hyper-parallel; not on PyPI).  Without it these tests skip,
saying so — the one skip CI allows; the stand-in tests (test_hyper_parallel*.py) run
everywhere.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hyper_parallel_real import SKIP_REASON, source_dir

SRC = source_dir()
pytestmark = [pytest.mark.multiprocess, pytest.mark.skipif(SRC is None, reason=SKIP_REASON)]
TESTS = Path(__file__).resolve().parents[1] / "support"


def test_torch_platform_on_two_gloo_ranks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import hyper_parallel_real_workers
    import torch.multiprocessing as mp

    from hp_otel.workloads.process_groups import free_port

    monkeypatch.setenv("HYPER_PARALLEL_PLATFORM", "torch")
    sys.path.insert(0, SRC)  # the spawned ranks inherit it; this process never imports hyper_parallel
    try:
        mp.spawn(hyper_parallel_real_workers.worker, args=(2, free_port(), str(tmp_path)), nprocs=2, join=True)
    finally:
        sys.path.remove(SRC)
    for rank in range(2):
        result = json.loads((tmp_path / f"torch_rank{rank}.json").read_text())
        print(json.dumps({k: v for k, v in result.items() if k != "tp_mlp"}, indent=1))
        assert result["tp_mlp"]["counts"] == {"differentiable_all_reduce": 1, "torch.distributed.all_reduce": 1}
        assert result["transformer"]["counts"] == {"differentiable_all_reduce": 4, "torch.distributed.all_reduce": 4}
        assert result["fully_shard"]["forward"] == {"torch.distributed.all_gather_into_tensor": 2}
        assert result["fully_shard"]["backward"] == {"torch.distributed.reduce_scatter_tensor": 2}
        assert result["all_to_all"]["counts"] == {
            "differentiable_all_to_all": 1,
            "torch.distributed.all_to_all_single": 1,
        }
        assert "ValueError" in result["failing"]["all_reduce_complex_max"]


def test_mindspore_platform_on_two_mccl_workers(tmp_path: Path) -> None:
    pytest.importorskip("mindspore", reason="mindspore is not installed (CI installs it)")
    from hp_otel.workloads.process_groups import free_port

    base = {**os.environ, "GLOG_v": "3", "MS_SCHED_HOST": "127.0.0.1", "MS_SCHED_PORT": str(free_port()),
            "MS_WORKER_NUM": "2", "HP_TEST_OUT": str(tmp_path), "HP_OTEL_HYPER_PARALLEL_SRC": SRC}  # fmt: skip
    roles = [("sched", {"MS_ROLE": "MS_SCHED"})]
    roles += [(f"worker{i}", {"MS_ROLE": "MS_WORKER", "MS_NODE_ID": str(i)}) for i in range(2)]
    procs = []
    for name, env in roles:
        log = open(tmp_path / f"{name}.log", "w")
        worker = TESTS / "hyper_parallel_real_mindspore_worker.py"
        procs.append((name, log, subprocess.Popen([sys.executable, str(worker)], env={**base, **env}, stdout=log,
                                                  stderr=subprocess.STDOUT, cwd=tmp_path)))  # fmt: skip
    try:
        codes = {name: proc.wait(timeout=240) for name, _, proc in procs}
    finally:
        for _, log, proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            log.close()
    logs = {name: (tmp_path / f"{name}.log").read_text()[-3000:] for name, _, _ in procs}
    assert codes == dict.fromkeys(codes, 0), "\n".join(f"--- {n}\n{text}" for n, text in logs.items())
    for rank in range(2):
        result = json.loads((tmp_path / f"mindspore_rank{rank}.json").read_text())
        print(json.dumps(result, indent=1))
        assert result["rank"] == rank
        assert result["tp_mlp"]["counts"] == {"differentiable_all_reduce": 1}
        assert result["all_to_all"]["counts"] == {"differentiable_all_to_all": 1}
        assert result["platform_all_reduce"]["counts"] == {"all_reduce": 1}
