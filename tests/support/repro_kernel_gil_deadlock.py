"""Reproduce why hp_otel's kernels are not on the CPU key (not a test: it can hang).

    PYTHONPATH=$PWD python tests/support/repro_kernel_gil_deadlock.py {cpu-kernels|kernels|dispatch} [ITERATIONS]

Two gloo ranks run `broadcast` then `barrier` ITERATIONS times (500).  gloo's worker thread
frees each finished work while it holds the process group's work lock; freeing the work's
tensors drops their Python objects, which takes the GIL.

- `cpu-kernels`: pass-through Python kernels on the CPU key of `c10d.broadcast_` and
  `c10d.barrier`, calling the original with `torch.library.get_kernel(...).call_boxed`,
  which keeps the GIL: the next `barrier` waits for the lock while the worker thread waits
  for the GIL (hp_otel's first kernel hook did this);
- `kernels` (hp_otel's default) and `dispatch`: a hp_otel window; counts are checked.

A rank that hangs 45 s dumps its Python stacks (faulthandler) and exits; `py-spy dump
--native` or `gdb -p PID -batch -ex "thread apply all bt"` on a hung rank shows both
threads.  Measured on this machine: docs/how-it-works/collective-hook.md.
"""

from __future__ import annotations

import faulthandler
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _cpu_key_pass_through(libraries: list) -> None:
    for op in (torch.ops.c10d.broadcast_.default, torch.ops.c10d.barrier.default):
        original = torch.library.get_kernel(op, "CPU")

        def kernel(keyset, *args, _call=original.call_boxed, **kwargs):  # keeps the GIL in _call
            return _call(keyset, *args, **kwargs)

        library = torch.library.Library("c10d", "IMPL")
        library.impl(op._schema.name.split("::")[1], kernel, "CPU", with_keyset=True)
        libraries.append(library)


def _rank(rank: int, hook: str, iterations: int, port: int) -> None:
    import contextlib

    from hp_otel import CommDebugMode
    from hp_otel.workloads.process_groups import init_gloo

    libraries: list = []
    if hook == "cpu-kernels":
        _cpu_key_pass_through(libraries)
    else:
        os.environ["HP_OTEL_TORCH_COLLECTIVE_HOOK"] = hook
    init_gloo(rank, 2, port)
    faulthandler.dump_traceback_later(45, exit=True)
    with contextlib.nullcontext() if libraries else CommDebugMode() as mode:
        for _ in range(iterations):
            t = torch.ones(64)
            dist.broadcast(t, src=0)
            del t
            dist.barrier()
    if mode is not None:
        assert mode.get_comm_counts() == {"c10d.broadcast_": iterations, "c10d.barrier": iterations}
    dist.barrier()
    dist.destroy_process_group()


def main() -> int:
    from hp_otel.workloads.process_groups import free_port

    hook = sys.argv[1] if len(sys.argv) > 1 else "kernels"
    iterations = int(sys.argv[2]) if len(sys.argv) > 2 else 500
    started = time.time()
    try:
        mp.spawn(_rank, args=(hook, iterations, free_port()), nprocs=2, join=True)
    except Exception as exc:
        print(f"{hook}: a rank hung or failed after {time.time() - started:.0f} s ({type(exc).__name__})")
        return 1
    print(f"{hook}: {iterations} iterations in {time.time() - started:.1f} s, no hang")
    return 0


if __name__ == "__main__":
    sys.exit(main())
