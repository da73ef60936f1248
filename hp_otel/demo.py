"""`hp-otel demo`: a real 2-process CPU (gloo) tensor-parallel MLP step under CommDebugMode.

Each rank runs forward+backward inside `CommDebugMode(module=model)` and writes its
JSON dump and its spans (OTLP/JSON); rank 0 prints the counts and the tables.
"""

from __future__ import annotations

import os
import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO


@dataclass(frozen=True)
class DemoConfig:
    out_dir: Path
    world_size: int = 2
    noise_level: int = 2
    port: int = 0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def init_gloo(rank: int, world_size: int, port: int) -> None:
    import torch.distributed as dist

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    os.environ["RANK"] = str(rank)
    os.environ["LOCAL_RANK"] = str(rank)
    os.environ["WORLD_SIZE"] = str(world_size)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)


def _rank_main(rank: int, config: DemoConfig) -> None:
    import torch
    import torch.distributed as dist

    from hp_otel import CommDebugMode
    from hp_otel.otlp_json import write_spans
    from hp_otel.tp_mlp import build_tp_mlp, train_step

    init_gloo(rank, config.world_size, config.port)
    try:
        model = build_tp_mlp(config.world_size)
        x = torch.randn(4, 16, requires_grad=True)
        with CommDebugMode(module=model) as mode:
            train_step(model, x)
        mode.generate_json_dump(config.out_dir / f"comm_rank{rank}.json", noise_level=3)
        write_spans(config.out_dir / f"spans_rank{rank}.json", mode.get_finished_spans())
        if rank == 0:
            _report(mode, config, sys.stdout)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _report(mode: object, config: DemoConfig, out: TextIO) -> None:
    from hp_otel import CommDebugMode

    assert isinstance(mode, CommDebugMode)
    print(f"collective counts (rank 0): {mode.get_comm_counts()}", file=out)
    print(f"by op: {mode.get_comm_counts(normalized=True)}", file=out)
    print(f"by module: {mode.get_comm_module_counts()}", file=out)
    print(f"sharding: {mode.get_sharding_info()}", file=out)
    print(f"\ntracing table, noise_level={config.noise_level}:", file=out)
    print(mode.generate_comm_debug_tracing_table(noise_level=config.noise_level), file=out)
    print("\ntracing table, noise_level=3 (redistributes and backward):", file=out)
    print(mode.generate_comm_debug_tracing_table(noise_level=3), file=out)
    print(
        f"\nwrote {config.out_dir}/comm_rank<r>.json (JSON dump) and {config.out_dir}/spans_rank<r>.json (OTLP/JSON)",
        file=out,
    )
    out.flush()


def run_demo(config: DemoConfig) -> None:
    import torch.multiprocessing as mp

    config.out_dir.mkdir(parents=True, exist_ok=True)
    if not config.port:
        config = DemoConfig(config.out_dir, config.world_size, config.noise_level, free_port())
    mp.spawn(_rank_main, args=(config,), nprocs=config.world_size, join=True)
