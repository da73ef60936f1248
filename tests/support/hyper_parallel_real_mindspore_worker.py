"""One process of the 2-worker test against the real hyper-parallel on its MindSpore platform (mccl, CPU).

Launched by environment like mindspore_mccl_worker.py (scheduler + workers).  Each worker
runs the scenarios under CommDebugMode and under the test's own referee (wrapping
`MindSporePlatform`'s collectives itself) and writes what it saw to
`$HP_TEST_OUT/mindspore_rank<r>.json`.

Two CPU-harness steps, neither of them hp_otel's: hyper-parallel's
`MindSporePlatform.init_process_group` hard-codes the "hccl" backend (MindSpore on CPU
needs "mccl"; `init()` has already run, so it is made a no-op), and its `DTensorBase`
moves every local tensor to device "Ascend" by default (a CPU-only MindSpore aborts the
process), so that default is "CPU" here.  `pynative_synchronize` makes a failing
collective raise at its call instead of at some later, unrelated line.
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("GLOG_v", "3")
os.environ["HYPER_PARALLEL_PLATFORM"] = "mindspore"
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # tests/support/: hyper_parallel_real
sys.path.insert(0, os.environ["HP_OTEL_HYPER_PARALLEL_SRC"])

import mindspore as ms
import numpy as np
from mindspore import Tensor, mint, nn
from mindspore.communication import get_group_size, get_rank, init

init()
if os.environ["MS_ROLE"] == "MS_SCHED":
    sys.exit(0)
ms.set_context(pynative_synchronize=True)

from hyper_parallel_real import Referee  # noqa: E402

from hp_otel import CommDebugMode  # noqa: E402
from hp_otel.spans import schema  # noqa: E402

RANK = get_rank()
WORLD = get_group_size()
PLATFORM_NAMES = [
    "differentiable_all_gather_concat",
    "differentiable_all_to_all",
    "differentiable_all_reduce",
    "differentiable_reduce_scatter",
    "all_reduce",
    "all_gather_into_tensor",
    "reduce_scatter_tensor",
    "broadcast",
]


def _eq(actual: object, expected: object, what: str = "") -> None:
    assert actual == expected, f"rank {RANK} {what}\nactual:   {actual!r}\nexpected: {expected!r}"


def _cpu_harness() -> None:
    from hyper_parallel.platform.mindspore.dtensor import DTensorBase
    from hyper_parallel.platform.mindspore.platform import MindSporePlatform

    MindSporePlatform.init_process_group = staticmethod(lambda *args, **kwargs: None)
    DTensorBase.__new__.__defaults__ = (None, None, "CPU")


def _referee():
    from hyper_parallel.platform.mindspore.platform import MindSporePlatform

    referee = Referee()
    referee.wrap(MindSporePlatform, PLATFORM_NAMES)
    return referee


def _group_of(call: dict) -> str:
    args, kwargs = call["args"], call["kwargs"]
    position = {"differentiable_all_reduce": 2, "differentiable_all_to_all": 2}[call["name"]]
    return kwargs["group"] if "group" in kwargs else args[position]


def _collective_spans(mode) -> list:
    return sorted((s for s in mode.get_finished_spans() if s.attributes[schema.CALL_KIND] == "collective"),
                  key=lambda s: s.start_time)  # fmt: skip


def _agree_on_failure(mode, referee, raised: BaseException, what: str) -> dict:
    _eq(mode.get_comm_counts(), referee.counts(), f"{what}: counts")
    (call,) = referee.calls
    assert call["error"] is raised, f"{what}: hp_otel re-raised the very exception"
    (span,) = _collective_spans(mode)
    _eq(span.status.is_ok, False, f"{what}: error status")
    assert type(raised).__name__ in (span.status.description or ""), span.status.description
    group = _group_of(call)
    _eq(type(group), str, f"{what}: MindSpore passes a group name")
    _eq(span.attributes[schema.COLLECTIVE_GROUP], group, f"{what}: group")  # its group's one span: described
    _eq(span.attributes[schema.COLLECTIVE_GROUP_SIZE], get_group_size(group), f"{what}: group size")
    return {"counts": mode.get_comm_counts(), "error": f"{type(raised).__name__}: {str(raised).splitlines()[0]}",
            "group": group, "table": mode.generate_comm_debug_tracing_table(noise_level=2)}  # fmt: skip


class MLP(nn.Cell):
    """The design's MLP with MindSpore ops: w1 column-, w2 row-sharded."""

    def __init__(self) -> None:
        super().__init__()
        from mindspore.common.initializer import initializer

        self.w1 = ms.Parameter(initializer(0.1, [16, 32], ms.float32), name="w1")
        self.w2 = ms.Parameter(initializer(0.1, [32, 16], ms.float32), name="w2")

    def construct(self, x):
        return mint.matmul(mint.nn.functional.relu(mint.matmul(x, self.w1)), self.w2)


def tp_mlp() -> dict:
    from hyper_parallel import DTensor, init_device_mesh, init_parameters, shard_module
    from hyper_parallel.core.placement_types import Replicate, Shard
    from hyper_parallel.core.shard.sharding_plan import ShardingPlan
    from mindspore.nn.utils import no_init_parameters

    mesh = init_device_mesh("cpu", (WORLD,), mesh_dim_names=("tp",))
    with no_init_parameters():  # initialised parameters would be sliced with Tensor.clone: no CPU kernel
        model = MLP()
    plan = ShardingPlan(plan={"w1": (Shard(1),), "w2": (Shard(0),)}, input_plan={"input": (Replicate(),)},
                        output_plan={"output": (Replicate(),)})  # fmt: skip
    shard_module(model, mesh, plan)
    model = init_parameters(model) or model
    x = DTensor.from_local(Tensor(np.ones((4, 16), np.float32)), mesh, (Replicate(),))
    referee = _referee()
    raised = None
    try:
        with CommDebugMode(module=model) as mode:
            model(x)
    except RuntimeError as error:
        raised = error
    finally:
        referee.restore()
    assert raised is not None, "comm_func.all_reduce has no CPU kernel in MindSpore 2.10"
    result = _agree_on_failure(mode, referee, raised, "tp_mlp")
    _eq(result["counts"], {"differentiable_all_reduce": 1})
    ops = [s.name for s in mode.get_finished_spans() if s.attributes[schema.CALL_KIND] == "op"]
    result["ops"] = ops
    _eq(ops, ["MatMulExt", "ReLU", "MatMulExt"], "ops dispatched (not the CellBackwardHook of module tracking)")
    return result


def all_to_all() -> dict:
    from hyper_parallel import DTensor, init_device_mesh
    from hyper_parallel.core.placement_types import Shard

    mesh = init_device_mesh("cpu", (WORLD,), mesh_dim_names=("tp",))
    local = Tensor(np.arange(16, dtype=np.float32).reshape(2, 8) + 16 * RANK)
    referee = _referee()
    raised = None
    try:
        with CommDebugMode() as mode:
            DTensor.from_local(local, mesh, (Shard(0),)).redistribute(mesh, (Shard(1),))
    except RuntimeError as error:
        raised = error
    finally:
        referee.restore()
    assert raised is not None, "comm_func.all_to_all_single_with_output_shape has no CPU kernel"
    result = _agree_on_failure(mode, referee, raised, "all_to_all")
    _eq(result["counts"], {"differentiable_all_to_all": 1})
    (call,) = referee.calls
    _eq((call["args"], sorted(call["kwargs"])), ((), ["group", "input_data", "output_shape"]), "keywords only")
    return result


def platform_all_reduce() -> dict:
    """The platform's non-differentiable all_reduce (mint.distributed underneath) does run on CPU."""
    from hyper_parallel import get_platform
    from mindspore.communication import GlobalComm

    platform = get_platform()
    t = Tensor(np.full((2,), RANK + 1, np.float32))
    referee = _referee()
    try:
        with CommDebugMode() as mode:
            platform.all_reduce(t, GlobalComm.WORLD_COMM_GROUP)
    finally:
        referee.restore()
    _eq(t.asnumpy().tolist(), [3.0, 3.0])
    _eq(mode.get_comm_counts(), referee.counts())
    (span,) = _collective_spans(mode)
    _eq((span.status.is_ok, span.attributes[schema.COLLECTIVE_GROUP_SIZE]), (True, WORLD))
    return {"counts": mode.get_comm_counts()}


if __name__ == "__main__":
    _cpu_harness()
    result = {
        "rank": RANK,
        "tp_mlp": tp_mlp(),
        "all_to_all": all_to_all(),
        "platform_all_reduce": platform_all_reduce(),
    }
    with open(os.path.join(os.environ["HP_TEST_OUT"], f"mindspore_rank{RANK}.json"), "w") as handle:
        json.dump(result, handle, indent=1)
