"""One process of the 2-worker MindSpore test over mccl (CPU), launched by environment.

The scheduler (`MS_ROLE=MS_SCHED`) only calls `init()`, which returns when the workers
finish.  Each worker runs two windows and asserts on its own rank — MindSpore
collectives (`engine="auto"` with a Cell), then the hyper-parallel stand-in on its
MindSpore platform — and writes what it saw to `$HP_TEST_OUT/rank<r>.json`.
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("GLOG_v", "3")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # tests/support/: stand_in

import mindspore as ms
import numpy as np
from mindspore import Tensor, mint, nn, ops
from mindspore.communication import GlobalComm, get_group_size, get_rank, init

init()
if os.environ["MS_ROLE"] == "MS_SCHED":
    sys.exit(0)

from opentelemetry.sdk.metrics import MeterProvider  # noqa: E402
from opentelemetry.sdk.metrics.export import InMemoryMetricReader  # noqa: E402

from hp_otel import CommDebugMode  # noqa: E402
from hp_otel.spans import schema  # noqa: E402
from hp_otel.spans.groups import GroupTable  # noqa: E402

RANK = get_rank()
WORLD = get_group_size()
WORLD_GROUP = GlobalComm.WORLD_COMM_GROUP


from hp_otel.testing import metric_points  # noqa: E402


def _eq(actual: object, expected: object) -> None:
    assert actual == expected, f"rank {RANK}\nactual:   {actual!r}\nexpected: {expected!r}"


class RowParallelDense(nn.Cell):
    """A dense layer whose partial outputs are summed over the world, like a row-parallel linear."""

    def __init__(self, reduce) -> None:
        super().__init__()
        self.dense = nn.Dense(8, 4, has_bias=False)
        self.reduce = reduce

    def construct(self, x):
        return self.reduce(self.dense(x))


class Net(nn.Cell):
    def __init__(self, reduce) -> None:
        super().__init__()
        self.fc1 = nn.Dense(4, 8)
        self.fc2 = RowParallelDense(reduce)

    def construct(self, x):
        return self.fc2(self.fc1(x))


def mint_all_reduce(y):
    mint.distributed.all_reduce(y)
    return y


def mindspore_collectives() -> dict:
    net = Net(mint_all_reduce)
    x = Tensor(np.ones((2, 4), np.float32))
    t = Tensor(np.full((2,), RANK + 1, np.float32))
    gathered = [Tensor(np.zeros((2,), np.float32)) for _ in range(WORLD)]
    functions = {name: vars(mint.distributed)[name] for name in ("all_reduce", "all_gather", "broadcast", "barrier")}
    reader = InMemoryMetricReader()
    with CommDebugMode(module=net, meter_provider=MeterProvider(metric_readers=[reader])) as mode:
        net(x)
        ops.communication.all_reduce(t)
        mint.distributed.all_gather(gathered, t)
        mint.distributed.broadcast(t, 0)
        mint.distributed.barrier()
        waited = Tensor(np.ones((3,), np.float32))
        mint.distributed.all_reduce(waited, async_op=True).wait()
        late = Tensor(np.ones((5,), np.float32))
        late_handle = mint.distributed.all_reduce(late, async_op=True)
    late_handle.wait()  # after the window: reported when the window ended
    assert "wait" not in vars(late_handle), "the wait shadow stays on the handle"
    _eq({n: vars(mint.distributed)[n] is f for n, f in functions.items()}, dict.fromkeys(functions, True))
    _eq(t.asnumpy().tolist(), [3.0, 3.0])  # 1 + 2, then broadcast from rank 0
    _eq([g.asnumpy().tolist() for g in gathered], [[3.0, 3.0], [3.0, 3.0]])
    _eq(waited.asnumpy().tolist(), [2.0] * 3)
    _eq(late.asnumpy().tolist(), [2.0] * 5)
    counts = {
        "mint.distributed.all_reduce": 3,
        "ops.communication.all_reduce": 1,
        "mint.distributed.all_gather": 1,
        "mint.distributed.broadcast": 1,
        "mint.distributed.barrier": 1,
    }
    _eq(mode.get_comm_counts(), counts)
    _eq(mode.get_comm_counts(normalized=True), {"all_reduce": 4, "all_gather": 1, "broadcast": 1, "barrier": 1})
    _eq(mode.get_comm_module_counts()["fc2"], {"forward": {"mint.distributed.all_reduce": 1}})
    _eq(mode.get_callback_error_counts(), {})
    spans = [s for s in mode.get_finished_spans() if s.attributes[schema.CALL_KIND] == "collective"]
    _eq(len(spans), 7)
    table = GroupTable.of(s.attributes for s in spans)  # each group described once, on its first span
    for span in spans:
        a = span.attributes
        group = table.group_of(a)
        _eq((a[schema.COLLECTIVE_GROUP_SIZE], group.name), (WORLD, WORLD_GROUP))
        _eq(tuple(group.members), tuple(range(WORLD)))
        _eq(span.name, a[schema.COLLECTIVE_OP])
        _eq(a[schema.COLLECTIVE_BACKEND], "mccl")  # what init() picks on CPU (docs: MindSpore's CPU collectives)
    asyncs = sorted(s.attributes[schema.COLLECTIVE_INPUT_SHAPE] for s in spans if s.attributes[schema.COLLECTIVE_ASYNC])
    _eq(asyncs, [(3,), (5,)])
    in_fc2 = [s for s in spans if s.attributes[schema.COLLECTIVE_INPUT_SHAPE] == (2, 4)]
    _eq([(s.attributes[schema.COLLECTIVE_DTYPE], s.attributes[schema.COLLECTIVE_BYTES]) for s in in_fc2],
        [("Float32", 32)])  # fmt: skip
    _eq(
        mode.generate_comm_debug_tracing_table(noise_level=2).splitlines()[2:6],
        [
            "Module               Module((root)) [enter]",
            "  Module             Module(fc1) [enter]",
            "  Module             Module(fc2) [enter]",
            "    Module           Module(fc2.dense) [enter]",
        ],
    )
    calls = {p.attributes[schema.COLLECTIVE_NAME]: 0 for p in metric_points(reader, schema.METRIC_CALLS)}
    for p in metric_points(reader, schema.METRIC_CALLS):
        calls[p.attributes[schema.COLLECTIVE_NAME]] += p.value
    _eq(calls, counts)
    _eq({p.attributes.get(schema.COLLECTIVE_BACKEND) for p in metric_points(reader, schema.METRIC_CALLS)}, {"mccl"})
    _eq(sum(p.count for p in metric_points(reader, schema.METRIC_DURATION)), 7)
    return {"counts": mode.get_comm_counts(), "spans": len(spans)}


def hyper_parallel_on_mindspore() -> dict:
    from stand_in import hyper_parallel_release

    with hyper_parallel_release("newer", platform="mindspore"):
        from hyper_parallel.platform import GroupInfo, get_platform
        from hyper_parallel.platform.mindspore.platform import MindSporePlatform
        from hyper_parallel.platform.mindspore.platform_graph import MindSporeGraphPlatform

        platform = get_platform()
        assert isinstance(platform, MindSporePlatform)
        net = Net(lambda y: platform.differentiable_all_reduce(y, "sum", group=WORLD_GROUP))
        slots = {(c, n): v for c in (MindSporePlatform, MindSporeGraphPlatform) for n, v in vars(c).items()}
        t = Tensor(np.full((2,), RANK + 1, np.float32))
        info = GroupInfo(group=WORLD_GROUP, rank_size=WORLD, group_name=WORLD_GROUP)
        with CommDebugMode(module=net) as mode:  # auto: hyper_parallel is importable
            out = net(Tensor(np.ones((2, 4), np.float32)))
            concat = platform.differentiable_all_gather_concat(t, group=WORLD_GROUP, concat_size=WORLD, concat_dim=0)
            graph_sum = MindSporeGraphPlatform.differentiable_all_reduce(t, "sum", group=WORLD_GROUP)
            platform.all_reduce(t, info)
        _eq(all(vars(c)[n] is v for (c, n), v in slots.items()), True)
        _eq(concat.asnumpy().tolist(), [1.0, 1.0, 2.0, 2.0])
        _eq(graph_sum.asnumpy().tolist(), [3.0, 3.0])
        _eq(t.asnumpy().tolist(), [3.0, 3.0])
        _eq(out.shape, (2, 4))
        _eq(
            mode.get_comm_counts(),
            {"differentiable_all_reduce": 2, "differentiable_all_gather_concat": 1, "all_reduce": 1},
        )
        _eq(mode.get_comm_module_counts()["fc2"], {"forward": {"differentiable_all_reduce": 1}})
        spans = [s for s in mode.get_finished_spans() if s.attributes[schema.CALL_KIND] == "collective"]
        _eq({s.attributes[schema.COLLECTIVE_GROUP_SIZE] for s in spans}, {WORLD})  # from get_group_size(name)
        _eq({s.attributes.get(schema.COLLECTIVE_BACKEND) for s in spans}, {"mccl"})
        _eq(mode.get_callback_error_counts(), {})
        return {"counts": mode.get_comm_counts()}


if __name__ == "__main__":
    ms.set_seed(0)
    result = {"rank": RANK, "mindspore": mindspore_collectives(), "hyper_parallel": hyper_parallel_on_mindspore()}
    with open(os.path.join(os.environ["HP_TEST_OUT"], f"rank{RANK}.json"), "w") as handle:
        json.dump(result, handle)
