"""hp_otel against the real hyper-parallel (not the stand-in): torch platform over gloo, MindSpore platform over mccl.

Needs the framework's source: `HP_OTEL_HYPER_PARALLEL_SRC=/path/to/hyper-parallel`
(github.com/mindspore-ai/hyper-parallel; not on PyPI).  Without it these tests skip,
saying so — the one skip CI allows; the stand-in tests (test_hyper_parallel*.py) run
everywhere.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from hyper_parallel_real import SKIP_REASON, source_dir

SRC = source_dir()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(SRC is None, reason=SKIP_REASON)]
TESTS = Path(__file__).resolve().parent


def test_torch_platform_on_two_gloo_ranks(tmp_path: Path) -> None:
    import hyper_parallel_real_workers
    import torch.multiprocessing as mp

    from hp_otel.demo import free_port

    sys.path.insert(0, SRC)
    os.environ["HYPER_PARALLEL_PLATFORM"] = "torch"
    try:
        mp.spawn(hyper_parallel_real_workers.worker, args=(2, free_port(), str(tmp_path)), nprocs=2, join=True)
    finally:
        sys.path.remove(SRC)
    for rank in range(2):
        result = json.loads((tmp_path / f"torch_rank{rank}.json").read_text())
        print(json.dumps(result, indent=1))
