"""Two gloo ranks that agree, diverge, or hang — and the files `hp-otel ranks` compares.

    python examples/rank_desync.py --case consistent --out out/ok    # rank 1 is 300 ms late once
    python examples/rank_desync.py --case divergent  --out out/div   # rank 1 all-gathers another shape
    python examples/rank_desync.py --case hang       --out out/hang  # rank 1 skips an all_reduce
    hp-otel ranks out/hang/spans_rank*.json

Each rank runs a 4-layer model whose layers each issue one all_reduce, under
`CommDebugMode(module=model, watchdog=HangWatchdog(...))`, and writes
`spans_rank<r>.json` (on a hang, the watchdog writes it while the rank is stuck).
"""

from __future__ import annotations

import argparse
import datetime
import os
import signal
import socket
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.multiprocessing.spawn import ProcessException

from hp_otel import CommDebugMode, HangWatchdog


class Layer(nn.Module):
    def __init__(self, index: int, case: str, rank: int) -> None:
        super().__init__()
        self.index, self.case, self.rank = index, case, rank

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.case == "consistent" and self.rank == 1 and self.index == 2:
            time.sleep(0.3)  # a straggler
        if self.case == "divergent" and self.index == 1:
            local = torch.ones((4, 8) if self.rank == 0 else (8, 4))  # same size, another shape
            dist.all_gather_into_tensor(torch.empty(local.shape[0] * 2, local.shape[1]), local)
            return x
        if self.case == "hang" and self.rank == 1 and self.index == 2:
            time.sleep(60)  # rank 1 skips this all_reduce and is busy in host code: rank 0 waits in it
            return x
        dist.all_reduce(x)
        return x


class Model(nn.Module):
    def __init__(self, case: str, rank: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Layer(i, case, rank) for i in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def run_rank(rank: int, case: str, out: str, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2")
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=5))
    model = Model(case, rank)
    path = os.path.join(out, "spans_rank{rank}.json")
    dist.barrier()  # start together: process start-up is not a straggler
    # 3 s without completing: write this rank's spans so far; and when the job is killed (SIGTERM)
    watchdog = HangWatchdog(timeout_s=3.0, path=path, on_signals=(signal.SIGTERM,))
    try:
        with CommDebugMode(module=model, watchdog=watchdog) as mode:
            model(torch.ones(4, 8))
        mode.write_spans(path.format(rank=rank))
    finally:
        dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--case", choices=("consistent", "divergent", "hang"), required=True)
    parser.add_argument("--out", default="hp_otel_ranks")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    try:
        mp.spawn(run_rank, args=(args.case, args.out, port), nprocs=2)
    except ProcessException as exc:  # a hung job fails: gloo's timeout, then the launcher kills the others
        print(f"the job failed: {str(exc).strip().splitlines()[-1]}")
    print(f"now run: hp-otel ranks {args.out}/spans_rank0.json {args.out}/spans_rank1.json")


if __name__ == "__main__":
    main()
