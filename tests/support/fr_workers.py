"""Per-rank bodies of the Flight Recorder tests: real gloo collectives, recorded by torch's
Flight Recorder (`TORCH_FR_BUFFER_SIZE`) and by hp_otel (`stack=True`) in the same run.

Each rank writes its FR dump as torch's tooling does (`_dump_fr_trace()` pickle bytes to
`<prefix><rank>`, and `_dump_fr_trace_json()`), its hp_otel spans, and a referee: the list of
what it issued, with the line that issued it (read from the frame, not from either recorder).
"""

from __future__ import annotations

import json
import os
import sys
import time

import torch
import torch.distributed as dist

FR_PREFIX = "fr_trace_rank_"
LATE_S = 3.0  # rank 1's planted lateness: well above a loaded 2-core machine's noise (1 s was not)


def _issued(referee: list[list[object]], op: str) -> None:
    """Called on the line after the collective: that line is the one that issued it."""
    caller = sys._getframe(1)
    referee.append([op, f"{caller.f_code.co_filename}:{caller.f_lineno - 1}:{caller.f_code.co_name}"])


def _dump(out_dir: str, rank: int, only_active: bool = False) -> None:
    from torch._C._distributed_c10d import _dump_fr_trace, _dump_fr_trace_json

    with open(os.path.join(out_dir, f"{FR_PREFIX}{rank}"), "wb") as handle:
        handle.write(_dump_fr_trace(onlyActive=only_active))
    with open(os.path.join(out_dir, f"fr_json_rank{rank}.json"), "wb") as handle:
        handle.write(_dump_fr_trace_json(onlyActive=only_active))


def fr_worker(rank: int, world_size: int, port: int, out_dir: str, scenario: str) -> None:
    """`agree`: same collectives, rank 1 late to the broadcast; `desync`: the all_gather's shapes
    differ (same bytes: gloo runs it); `hang`: rank 0 issues an all_reduce rank 1 has not when both dump."""
    os.environ["TORCH_FR_BUFFER_SIZE"] = "64"  # before the process group: FR reads it once
    from hp_otel import CommDebugMode
    from hp_otel.workloads.process_groups import init_gloo

    init_gloo(rank, world_size, port)
    referee: list[list[object]] = []
    x = torch.ones(4, 8)
    try:
        dist.barrier()  # FR's seq 1, before hp_otel's window: the numbers differ by what came before
        with CommDebugMode(stack=True) as mode:
            dist.all_reduce(x)
            _issued(referee, "all_reduce")
            shape = (8, 4) if scenario == "desync" and rank == 1 else (4, 8)
            dist.all_gather_into_tensor(torch.empty(shape[0] * world_size, shape[1]), torch.ones(shape))
            _issued(referee, "all_gather")
            if scenario == "agree" and rank == 1:
                time.sleep(LATE_S)
            dist.broadcast(x, 0)
            _issued(referee, "broadcast")
            if rank == 0:
                dist.send(x, 1)
                _issued(referee, "send")
            else:
                dist.recv(x, 0)
                _issued(referee, "recv")
            pending = None
            if scenario == "hang" and rank == 0:
                pending = dist.all_reduce(x, async_op=True)  # rank 1 has not issued it yet
                _issued(referee, "all_reduce")
            _dump(out_dir, rank)
        # after the window: spans of calls whose completion hp_otel awaits (send's Work) end when it closes
        mode.write_spans(os.path.join(out_dir, f"spans_rank{rank}.json"))
        if scenario == "hang":
            # both dumps are written (a side channel, not a collective of the group under test)
            store = dist.distributed_c10d._get_default_store()
            store.set(f"dumped{rank}", "1")
            store.wait([f"dumped{1 - rank}"])
            if rank == 1:
                dist.all_reduce(x)  # now rank 0's completes and the job ends cleanly
            else:
                pending.wait()  # type: ignore[union-attr]
        with open(os.path.join(out_dir, f"referee_rank{rank}.json"), "w") as handle:
            json.dump(referee, handle)
        dist.barrier()
    finally:
        dist.destroy_process_group()
