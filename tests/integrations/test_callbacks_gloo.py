"""The training callbacks where users train, on real frameworks: Lightning DDP and a Hugging Face
`Trainer`, each run by torchrun on 2 gloo ranks (CPU). On every rank the steps traced, the
collectives per op (spans and metrics) and per module and phase (spans) equal the test's referee,
a dispatch mode with its own forward hooks entered by a callback of the test's own over its own
list of steps (tests/support/callback_referee.py). Lightning's automatic optimization runs
forward and backward inside `optimizer.step(closure)`: the backward all_reduce there counts as
phase backward for the module whose autograd node issued it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hp_otel.workloads.process_groups import free_port

pytestmark = pytest.mark.multiprocess  # torchrun, 2 gloo ranks

SUPPORT = Path(__file__).resolve().parents[1] / "support"
ROOT = SUPPORT.parents[1]
ALL_REDUCE, BROADCAST = "c10d.allreduce_", "c10d.broadcast_"


def _torchrun(worker: str, out: Path) -> list[dict]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(SUPPORT), os.environ.get("PYTHONPATH", "")]))
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
    command += ["--master-addr", "127.0.0.1", "--master-port", str(free_port()), str(SUPPORT / worker), str(out)]
    run = subprocess.run(command, env=env, cwd=out, capture_output=True, text=True, timeout=240)
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-6000:]
    assert "Traceback" not in output, output[-6000:]
    results = [json.loads((out / f"{worker.split('_')[0]}_rank{rank}.json").read_text()) for rank in (0, 1)]
    _summarised_by_rank_0(output, results[0])
    return results


def _summarised_by_rank_0(output: str, result: dict) -> None:
    """The callback's default summary at the end of training: printed once (rank 0), rank 0's counts per op."""
    said = [line for line in output.splitlines() if line.startswith("hp_otel: HpOtel") and " traced " in line]
    print(*said, sep="\n")
    ops = ", ".join(
        f"{name.split('.')[-1].rstrip('_').replace('allreduce', 'all_reduce')} {n}"
        for name, n in sorted(result["referee_ops"].items(), key=lambda item: (-item[1], item[0]))
    )
    steps = result["steps"]
    assert len(said) == 1 and said[0].endswith(
        f"traced {len(steps)} steps ({steps[0]}..{steps[-1]}) on rank 0: collectives per op {ops}"
    ), (said, ops)


def _agree(result: dict, steps: list[int]) -> None:
    rank = result["rank"]
    print(f"\nrank {rank}: steps {result['steps']}; per op: ours (spans) {result['span_ops']}, ours (metrics)")
    print(f"  {result['metric_ops']}, referee {result['referee_ops']}")
    print(f"  per module/phase: ours {result['modules']}")
    print(f"  referee {result['referee_modules']}")
    assert result["faults"] == 0, result
    assert result["steps"] == steps == result["referee_steps"], result  # one rank_step span per traced step
    assert result["span_ops"] == result["metric_ops"] == result["referee_ops"], result
    assert result["modules"] == result["referee_modules"], result
    assert "(optimizer)" not in result["modules"], result  # SGD/AdamW issue no collective of their own


def test_lightning_ddp_callback_counts_equal_the_referee(tmp_path) -> None:
    results = _torchrun("lightning_worker.py", tmp_path)
    for result in results:
        _agree(result, [2, 3, 4, 5])  # HpOtelCallback(steps=range(2, 6))
        # two calls of the LightningModule a step: DDP's forward calls it with `forward` redirected to
        # `training_step` (Lightning's _ForwardRedirection), which calls `self(x)`
        assert result["root_forward_calls"] == 2 * 4, result
        per_step = 4  # traced steps
        # per step: the forward all_reduce, the `sync` layer's backward all_reduce, DDP's one bucket
        assert result["referee_ops"] == {ALL_REDUCE: 3 * per_step}, result
        modules = result["modules"]
        # inside optimizer.step(closure): sync's backward all_reduce is sync's backward, not the optimizer's
        assert modules["net.sync"] == {"backward": {ALL_REDUCE: per_step}}, modules
        # DDP's bucket all_reduce runs in fc1's AccumulateGrad (its gradients come last): fc1's backward
        assert modules["net.fc1"] == {"backward": {ALL_REDUCE: per_step}}, modules
        assert modules["(root)"] == {"forward": {ALL_REDUCE: per_step}, "backward": {ALL_REDUCE: 2 * per_step}}


def test_trainer_callback_counts_equal_the_referee(tmp_path) -> None:
    results = _torchrun("trainer_worker.py", tmp_path)
    for result in results:
        _agree(result, [0, 2, 4])  # HpOtelTrainerCallback(steps=2): every 2nd of 6 steps
        assert result["root_forward_calls"] == 2 * 3, result  # both micro-batches of each traced step
        assert set(result["referee_ops"]) == {ALL_REDUCE, BROADCAST}, result
        # DDP's reducer: backward, in the embedding's AccumulateGrad (its gradient completes the bucket)
        assert set(result["modules"]["model.embed_tokens"]) == {"backward"}, result
        assert result["modules"]["(outside)"] == {"outside": {BROADCAST: 3}}, result  # DDP's buffer broadcast
