"""Per-rank bodies of the 2-process gloo jobs that `hp-otel ranks` compares (test_rank_compare_gloo.py).

Each job runs a small model whose layers each issue one eager all_reduce, under
CommDebugMode(module=model), and writes its spans file; the test then runs the CLI on
the files.  Rank 1 misbehaves in a different way per job.  A referee (a dispatch mode
of the test's own) lists what each rank really issued, written next to the spans.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

GLOO_TIMEOUT_S = 4.0  # short: a rank waiting for a peer that never comes gives up
LATE_S = 3.0  # the consistent run's planted lateness: well above a loaded 2-core machine's noise (1 s was not)


class Referee(TorchDispatchMode):
    """Independent record of the c10d collectives this rank issued, in order (name, first input shape)."""

    def __init__(self) -> None:
        super().__init__()
        self.issued: list[tuple[str, list[int]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        name = str(func.overloadpacket)
        if name.startswith("c10d."):
            first = args[0][0] if args and isinstance(args[0], list) and args[0] else args[0] if args else None
            self.issued.append((name, list(getattr(first, "shape", ()))))
        return func(*args, **(kwargs or {}))


class Layer(nn.Module):
    def __init__(self, index: int, action: object) -> None:
        super().__init__()
        self.index = index
        self.action = action

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.action(self.index, x)  # type: ignore[operator]


class Model(nn.Module):
    def __init__(self, action: object, layers: int = 4) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Layer(i, action) for i in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def _init(rank: int, world_size: int, port: int, timeout_s: float = GLOO_TIMEOUT_S) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world_size), HP_OTEL_RUN_ID=f"ranks-test-{port}",
    )  # fmt: skip
    dist.init_process_group("gloo", rank=rank, world_size=world_size, timeout=datetime.timedelta(seconds=timeout_s))


def _write_referee(out_dir: str, rank: int, referee: Referee) -> None:
    with open(os.path.join(out_dir, f"referee_rank{rank}.json"), "w") as handle:
        json.dump(referee.issued, handle)


def consistent_worker(rank: int, world_size: int, port: int, out_dir: str) -> None:
    """Every rank issues the same all_reduces; rank 1 arrives `LATE_S` late at layers.2's (rank 0
    waits that long in it, so this run's gloo timeout is longer than the hang tests')."""
    from hp_otel import CommDebugMode, HangWatchdog

    _init(rank, world_size, port, timeout_s=4 * LATE_S)

    def action(index: int, x: torch.Tensor) -> torch.Tensor:
        if rank == 1 and index == 2:
            time.sleep(LATE_S)
        dist.all_reduce(x)
        return x

    model = Model(action)
    referee = Referee()
    dist.barrier()  # start together: process start-up is not a straggler
    # a watchdog that never fires: gloo's Work objects must say their work is done
    watchdog = HangWatchdog(30, os.path.join(out_dir, "never_rank{rank}.json"))
    with CommDebugMode(module=model, watchdog=watchdog) as mode, referee:
        model(torch.ones(4, 8))
    mode.write_spans(os.path.join(out_dir, f"spans_rank{rank}.json"))
    assert watchdog.written == [] and mode._recorder.in_flight() == [], mode._recorder.in_flight()
    _write_referee(out_dir, rank, referee)
    dist.barrier()
    dist.destroy_process_group()


def divergent_worker(rank: int, world_size: int, port: int, out_dir: str) -> None:
    """In layers.1 rank 1 all-gathers a tensor of another shape than rank 0's (same size: gloo,
    which aborts the process on a size mismatch, runs it and silently gathers garbage)."""
    from hp_otel import CommDebugMode

    _init(rank, world_size, port)

    def action(index: int, x: torch.Tensor) -> torch.Tensor:
        if index == 1:
            shape = (4, 8) if rank == 0 else (8, 4)
            local = torch.ones(shape)
            dist.all_gather_into_tensor(torch.empty(shape[0] * world_size, shape[1]), local)
            return x
        dist.all_reduce(x)
        return x

    model = Model(action, layers=3)
    referee = Referee()
    with CommDebugMode(module=model) as mode, referee:
        model(torch.ones(4, 8))
    mode.write_spans(os.path.join(out_dir, f"spans_rank{rank}.json"))
    _write_referee(out_dir, rank, referee)
    dist.barrier()
    dist.destroy_process_group()


def skipping_worker(rank: int, world_size: int, port: int, out_dir: str) -> None:
    """Rank 1 skips layers.2's all_reduce and waits in a barrier on another group: both ranks hang.

    Each rank's watchdog (1 s) writes its spans so far from its own thread; gloo's
    short timeout then ends the job.
    """
    from hp_otel import CommDebugMode, HangWatchdog

    _init(rank, world_size, port)
    other = dist.new_group([0, 1])
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logging.getLogger("hp_otel").addHandler(handler)

    def action(index: int, x: torch.Tensor) -> torch.Tensor:
        if rank == 1 and index == 2:
            dist.barrier(group=other)  # rank 0 never comes: it waits in all_reduce #2
            return x
        dist.all_reduce(x)
        return x

    model = Model(action)
    referee = Referee()
    dist.barrier()  # start together: a slow process start is not the hang
    watchdog = HangWatchdog(1.0, os.path.join(out_dir, "spans_rank{rank}.json"), poll_s=0.1)
    try:
        with CommDebugMode(module=model, watchdog=watchdog), referee:
            model(torch.ones(4, 8))
    except RuntimeError:  # gloo's timeout
        pass
    _write_referee(out_dir, rank, referee)
    fired = [r for r in records if "has not completed" in r.getMessage()]
    assert fired, [r.getMessage() for r in records]
    assert {r.threadName for r in fired} == {"hp_otel-watchdog"}, [r.threadName for r in fired]
    # a loaded machine may make an earlier collective wait past the timeout too: the stuck one writes last
    assert set(watchdog.written) == {os.path.join(out_dir, f"spans_rank{rank}.json")}, watchdog.written
    stuck = "all_reduce #2 on group" if rank == 0 else "barrier #0 on group"
    assert stuck in fired[-1].getMessage(), [r.getMessage() for r in fired]
    with open(os.path.join(out_dir, f"watchdog_log_rank{rank}.txt"), "w") as handle:
        handle.write("\n".join(r.getMessage() for r in fired))
