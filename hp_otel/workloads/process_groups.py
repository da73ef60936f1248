"""Process groups the workloads run on: real gloo ranks on loopback (the demo, the multi-process
tests) and torch's fake process group in one process (the benchmark, the scale harness)."""

from __future__ import annotations

import os
import socket


def free_port() -> int:
    """A TCP port free on loopback now (for a gloo rendezvous)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def init_gloo(rank: int, world_size: int, port: int) -> None:
    """Join a gloo group of `world_size` ranks on loopback `port`, with the launcher's variables set
    (as torchrun would: hp_otel reads RANK, LOCAL_RANK and WORLD_SIZE)."""
    import torch.distributed as dist

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    os.environ["RANK"] = str(rank)
    os.environ["LOCAL_RANK"] = str(rank)
    os.environ["WORLD_SIZE"] = str(world_size)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)


def fake_process_group(world_size: int) -> None:
    """A world of `world_size` ranks in this process whose collectives return at once
    (torch's fake process group, registered without importing torch.testing)."""
    import torch.distributed as dist

    from hp_otel.sources.pytorch import _compat

    if not dist.is_initialized():
        _compat.register_fake_backend()
        dist.init_process_group("fake", store=dist.HashStore(), rank=0, world_size=world_size)
