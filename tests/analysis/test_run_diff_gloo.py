"""`hp-otel diff` on two real 2-process gloo FSDP2 runs: reshard_after_forward off vs on.

Each run's ranks write their spans into one folder; the CLI compares the folders as a user
would. The expected difference is written by hand; the referee (per-module counts) and FSDP's
own profiler labels (whose parameters each collective moves) witness it independently.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import diff_workers
import pytest
import torch.multiprocessing as mp

from hp_otel.workloads.process_groups import free_port

pytestmark = pytest.mark.multiprocess  # two gloo processes a run

WORLD_SIZE = 2
F32 = 4
# A layer Linear(16, 16) holds 16 * 16 + 16 = 272 parameters; FSDP2 gathers 136 a rank.
SHARD_BYTES = 272 // WORLD_SIZE * F32
# With reshard_after_forward=True the layers free their gathered parameters after forward, so
# backward gathers them again: layers.1's in its pre-backward hook, and layers.0's there too
# (FSDP2 prefetches the next layer's all_gather in backward by default). hp_otel counts an FSDP
# collective for the module whose parameter group it moves (docs/attribution.md): one more
# all_gather for each layer. The reduce_scatters of the gradients, and forward, are the same.
EXPECTED = {
    ("layers.1", "backward", "all_gather"): ((0, 0), (1, SHARD_BYTES)),
    ("layers.0", "backward", "all_gather"): ((0, 0), (1, SHARD_BYTES)),
}


def _runs(tmp_path: Path) -> tuple[Path, Path]:
    """Both runs in one 2-process job (fresh models): folders reshard_off and reshard_on."""
    off, on = tmp_path / "reshard_off", tmp_path / "reshard_on"
    runs = [(str(off), False), (str(on), True)]
    mp.spawn(diff_workers.fsdp_steps_worker, args=(WORLD_SIZE, free_port(), runs), nprocs=WORLD_SIZE)
    return off, on


def _witness(folder: Path, rank: int) -> dict:
    return json.loads(Path(f"{folder}.referee_rank{rank}.json").read_text())


def test_reshard_after_forward_off_vs_on(tmp_path: Path) -> None:
    off, on = _runs(tmp_path)
    for rank in range(WORLD_SIZE):
        before, after = _witness(off, rank), _witness(on, rank)
        # FSDP's labels: the run with resharding gathers layers.1's and layers.0's parameters once more
        gathered = Counter(m for op, m in after["fsdp_param_modules"] if "allgather" in op)
        gathered.subtract(m for op, m in before["fsdp_param_modules"] if "allgather" in op)
        assert +gathered == Counter({"layers.1": 1, "layers.0": 1})
        # the referee: two more all_gathers issued in layers.1's backward (none in layers.0's), nothing else
        added = Counter()
        for module, phases in after["module_counts"].items():
            for phase, ops in phases.items():
                for op, n in ops.items():
                    added[(module, phase, op)] += n
        for module, phases in before["module_counts"].items():
            for phase, ops in phases.items():
                for op, n in ops.items():
                    added[(module, phase, op)] -= n
        assert +added == Counter(
            {("layers.1", "backward", "c10d._allgather_base_"): 2, ("(root)", "backward", "c10d._allgather_base_"): 2}
        )

    def cli(*extra: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "hp_otel.cli", "diff", str(off), str(on), *extra]
        return subprocess.run(command, capture_output=True, text=True, timeout=60)

    result = cli()
    print(result.stdout)
    assert result.returncode == 3, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert "layers.0 backward: +1 all_gather (544 B)" in lines  # on both ranks alike: said once
    assert "layers.1 backward: +1 all_gather (544 B)" in lines
    assert "per rank; a line without ranks holds on all 2" in lines
    report = json.loads(cli("--json").stdout)
    changes = {
        (c["module"], c["phase"], c["op"]): (
            (c["before"]["count"], c["before"]["bytes"]),
            (c["after"]["count"], c["after"]["bytes"]),
        )
        for c in report["changes"]
    }
    assert changes == EXPECTED
    assert [c["ranks"] for c in report["changes"]] == [[0, 1], [0, 1]]
    assert report["a"]["by_op"]["reduce_scatter"] == report["b"]["by_op"]["reduce_scatter"]
