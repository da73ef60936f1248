"""A destroyed process group is let go before the interpreter exits (hp_otel/sources/pytorch/teardown.py).

Each case runs in a fresh interpreter: what `torch.distributed.nn.functional` binds depends on
whether it was imported before or after `init_process_group`, which this process already decided.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

_PRELUDE = """
import atexit, gc, weakref
import torch, torch.distributed as dist
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
{before_window}
from hp_otel import CommDebugMode
with CommDebugMode():  # the window's kernels import torch._dynamo, which imports nn.functional now
    dist.all_reduce(torch.ones(2))
import torch.distributed.nn.functional as F
world = weakref.ref(dist.group.WORLD)
"""


def _run(body: str, before_window: str = "") -> list[str]:
    prelude = textwrap.dedent(_PRELUDE).replace("{before_window}", before_window)
    done = subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(body)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.split()


def test_a_destroyed_group_pinned_by_default_arguments_is_released() -> None:
    pinned, released, gone = _run("""
        dist.destroy_process_group(); gc.collect()
        pinned = world() is not None  # torch's own behaviour: F's defaults hold it
        from hp_otel.sources.pytorch import teardown
        released = teardown.release_destroyed_groups(); gc.collect()
        print(pinned, released, world() is None)
    """)
    assert pinned == "True", "torch no longer pins the group: teardown.py may go"
    assert int(released) == 10  # broadcast, gather, scatter, reduce, reduce_scatter, all_gather, ... all_reduce
    assert gone == "True"


def test_at_exit_the_group_is_gone_before_finalisation() -> None:
    # atexit runs handlers last-registered first: one registered before the first window runs
    # after hp_otel's, and sees what finalisation will find.
    check = "atexit.register(lambda: print(gc.collect() >= 0 and world() is None))"
    (gone,) = _run("dist.destroy_process_group()", before_window=check)
    assert gone == "True"


def test_a_live_group_is_left_alone() -> None:
    released, same = _run("""
        from hp_otel.sources.pytorch import teardown
        released = teardown.release_destroyed_groups()
        print(released, F.all_reduce.__defaults__[-1] is dist.group.WORLD)
        dist.destroy_process_group()
    """)
    assert (released, same) == ("0", "True")
