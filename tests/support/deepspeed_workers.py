"""Workers for tests/sources/pytorch/test_deepspeed_phases.py (issue 44 item 7): DeepSpeed ZeRO 1/2/3 on
gloo ranks, on CPU, with a plain torch optimizer (no DeepSpeed op to compile).

The referee is the training loop itself: a dispatch mode of the test's own (`CollectiveLog`) sees every
collective op, labelled with the engine call the loop is in (`engine(x)`: forward, `engine.backward(loss)` or
`loss.backward()`: backward, `engine.step()`: optimizer), which is what a DeepSpeed user calls those phases.
"""

from __future__ import annotations

import json
import os
import sys
from collections import Counter
from typing import Any

import torch
import torch.distributed as dist
from attribution_workers import CollectiveLog
from span_counts import assert_counts_add_up
from torch import nn

# DeepSpeed's `engine.backward()` runs autograd, then its epilogue (gradient reduction), the engine's
# own methods a DeepSpeed user never calls; the referee labels the whole call.
PHASE_OF_CALL = {"forward": "forward", "backward": "backward", "step": "optimizer"}


def _no_shm_op() -> None:
    """DeepSpeed's CPU accelerator JIT-compiles a shared-memory all_reduce op (g++, ninja) when its comm
    backend starts; the gloo process group does the work here, so it is not built."""
    sys.modules["deepspeed.comm.torch"].build_shm_op = lambda: None


def _engine(stage: int) -> Any:
    import deepspeed

    _no_shm_op()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    config = {
        "train_micro_batch_size_per_gpu": 4,
        "zero_optimization": {"stage": stage},
        "zero_allow_untested_optimizer": True,  # a torch optimizer: DeepSpeed's own need compiled ops
        "steps_per_print": 10**9,
    }
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    return engine


def zero_phases_worker(rank: int, world_size: int, port: int, out_dir: str, stage: int, backward: str) -> None:
    """Two steps of ZeRO `stage` (the first outside the window), the second's collectives per phase, ours
    and the referee's; what the window patched, restored object for object. `backward`: "engine"
    (`engine.backward(loss)`) or "tensor" (`loss.backward()`, which DeepSpeed supports for ZeRO: its
    epilogue then runs from a gradient hook inside autograd)."""
    os.environ["DS_ACCELERATOR"] = "cpu"
    os.environ.update(LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world_size))
    from hp_otel import CommDebugMode
    from hp_otel.spans import schema
    from hp_otel.workloads.process_groups import init_gloo

    init_gloo(rank, world_size, port)
    try:
        with CommDebugMode(module=nn.Linear(2, 2)):
            dist.barrier()
        imported_by_window = "deepspeed" in sys.modules  # hp_otel never imports it itself

        engine = _engine(stage)
        from deepspeed.runtime.engine import DeepSpeedEngine

        before = dict(vars(DeepSpeedEngine))
        x, y = torch.randn(4, 16), torch.randn(4, 4)
        log = CollectiveLog()

        def step() -> None:
            for call in ("forward", "backward", "step"):
                log.label.append(PHASE_OF_CALL[call])
                try:
                    if call == "forward":
                        loss = nn.functional.mse_loss(engine(x), y)
                    elif call == "backward" and backward == "engine":
                        engine.backward(loss)
                    elif call == "backward":
                        loss.backward()
                    else:
                        engine.step()
                finally:
                    log.label.pop()

        step()
        dist.barrier()
        with log, CommDebugMode(module=engine) as mode:
            step()
            during = dict(vars(DeepSpeedEngine))
        after = dict(vars(DeepSpeedEngine))
        assert mode.get_callback_error_counts() == {}, mode.get_callback_error_counts()
        assert_counts_add_up(mode)
        spans = [s for s in mode.get_finished_spans() if s.attributes[schema.CALL_KIND] == schema.KIND_COLLECTIVE]
        ours = Counter(f"{s.attributes[schema.PHASE]} {s.attributes[schema.COLLECTIVE_NAME]}" for s in spans)
        referee = Counter(f"{label} {name}" for name, label in log.seen)
        module_spans = Counter(
            f"{s.attributes[schema.MODULE_FQN]} {s.attributes[schema.PHASE]} {s.name}"
            for s in mode.get_finished_spans()
            if s.attributes[schema.CALL_KIND] == schema.KIND_MODULE
        )
        result = {
            "ours": dict(ours),
            "referee": dict(referee),
            "module_counts": mode.get_comm_module_counts(),
            "module_spans": dict(module_spans),
            "optimizer": type(engine.optimizer).__name__,
            "imported_by_window": imported_by_window,
            "patched": sorted(k for k in before if during.get(k) is not before[k]),
            "not_restored": sorted(k for k in before if after.get(k) is not before[k]),
            "added": sorted(set(after) - set(before)),
        }
        with open(os.path.join(out_dir, f"zero{stage}_{backward}_rank{rank}.json"), "w") as f:
            json.dump(result, f)
    finally:
        dist.destroy_process_group()
