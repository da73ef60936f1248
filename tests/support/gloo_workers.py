"""Per-rank bodies of the 2-process gloo tests (imported by the spawned processes).

Each worker asserts on its own rank; a failure raises in the child and
torch.multiprocessing.spawn re-raises it in the test with the child's traceback.
"""

from __future__ import annotations

import json
import os
import tempfile

import torch
import torch.distributed as dist

from hp_otel.spans.groups import GroupTable
from hp_otel.testing import metric_points


def _eq(actual: object, expected: object) -> None:
    """assert ==, with both sides in the message (pytest does not rewrite asserts in spawned workers)."""
    assert actual == expected, f"\nactual:   {actual!r}\nexpected: {expected!r}"


def _short(name: object) -> str:
    return str(name).rsplit(".", 1)[-1]


def tp_mlp_worker(rank: int, world_size: int, port: int) -> None:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from torch.distributed.tensor.debug import CommDebugMode as TorchCommDebugMode

    from hp_otel import CommDebugMode
    from hp_otel.spans import schema
    from hp_otel.workloads.process_groups import init_gloo
    from hp_otel.workloads.tp_mlp import build_tp_mlp, train_step

    init_gloo(rank, world_size, port)
    try:
        model = build_tp_mlp(world_size)
        x = torch.randn(4, 16, requires_grad=True)
        hooks_before = [(dict(m._forward_pre_hooks), dict(m._forward_hooks)) for m in model.modules()]
        reader = InMemoryMetricReader()
        with CommDebugMode(module=model, meter_provider=MeterProvider(metric_readers=[reader])) as mode, \
                TorchCommDebugMode() as torch_mode:  # fmt: skip
            train_step(model, x)

        # counts: ours against torch's own CommDebugMode in the same window
        assert {_short(k): v for k, v in torch_mode.get_comm_counts().items()} == {"all_reduce": 2}
        assert mode.get_comm_counts() == {"_c10d_functional.all_reduce": 2}
        assert mode.get_comm_counts(normalized=True) == {"all_reduce": 2}
        assert mode.get_comm_module_counts()["fc2"] == {"forward": {"_c10d_functional.all_reduce": 1}}
        assert mode.get_comm_module_counts()["fc1"] == {"backward": {"_c10d_functional.all_reduce": 1}}
        assert mode.get_callback_error_counts() == {}

        # collective spans: attributes, parents
        spans = mode.get_finished_spans()
        by_id = {s.context.span_id: s for s in spans}
        collectives = sorted((s for s in spans if s.name == "all_reduce"), key=lambda s: s.start_time)
        assert len(collectives) == 2
        groups = GroupTable.of(s.attributes for s in spans)  # each group described on one span of the window
        for span, phase, module in zip(collectives, ("forward", "backward"), ("fc2", "fc1"), strict=True):
            a = span.attributes
            assert a[schema.COLLECTIVE_NAME] == "_c10d_functional.all_reduce"
            assert a[schema.COLLECTIVE_GROUP_SIZE] == world_size
            assert tuple(groups.group_of(a).members) == tuple(range(world_size))
            assert a[schema.COLLECTIVE_INPUT_SHAPE] == (4, 16) == a[schema.COLLECTIVE_OUTPUT_SHAPE]
            assert a[schema.COLLECTIVE_DTYPE] == "torch.float32"
            assert a[schema.COLLECTIVE_BYTES] == 4 * 16 * 4
            assert a[schema.COLLECTIVE_REDUCE_OP] == "sum"
            assert a[schema.COLLECTIVE_ASYNC] is True
            assert a[schema.PHASE] == phase
            parent = by_id[span.parent.span_id]
            assert parent.name == "redistribute"
            assert parent.attributes[schema.REDISTRIBUTE_SRC_PLACEMENTS] == "Partial(sum)"
            assert parent.attributes[schema.REDISTRIBUTE_DST_PLACEMENTS] == "Replicate()"
            grandparent = by_id[parent.parent.span_id]
            assert (grandparent.name, grandparent.attributes[schema.PHASE]) == (
                schema.module_span_name(module, phase),
                phase,
            )
        # one trace a window (issue 46 item 5; two before), with two roots: the forward's and the backward's
        assert len({s.context.trace_id for s in spans}) == 1
        assert sum(1 for s in spans if s.parent is None) == 2

        # metrics from the same events
        calls = {(p.attributes[schema.PHASE], p.attributes[schema.MODULE_FQN]): p.value
                 for p in metric_points(reader, schema.METRIC_CALLS)}  # fmt: skip
        assert calls == {("forward", "fc2"): 1, ("backward", "fc1"): 1}
        assert sum(p.value for p in metric_points(reader, schema.METRIC_BYTES)) == 2 * 256
        assert sum(p.count for p in metric_points(reader, schema.METRIC_DURATION)) == 2

        # the table at each noise level
        table0 = mode.generate_comm_debug_tracing_table(noise_level=0).splitlines()
        assert table0[:2] == ["Type                 Detail", "-" * 80]
        collective_line = (
            "Collective(_c10d_functional.all_reduce) group_size=2 input_shape=(4, 16) output_shape=(4, 16)"
        )
        assert [line.split(maxsplit=1)[1] for line in table0[2:]] == [collective_line] * 2
        # torch's CommDebugMode wraps module inputs in backward-hook views: its view_as calls on
        # DTensors are real DTensor ops that we trace; they are not the model's own.
        table2 = [
            line for line in mode.generate_comm_debug_tracing_table(noise_level=2).splitlines() if "view_as" not in line
        ]
        _eq(
            table2[2:],
            [
                "Module               Module((root)) [enter]",
                "  Module             Module(fc1) [enter]",
                "    Op               Op(linear) inputs=[DTensor[4, 16], DTensor[32, 16], DTensor[32]] "
                "outputs=[DTensor[4, 32]]",
                "  Module             Module(fc2) [enter]",
                "    Op               Op(linear) inputs=[DTensor[4, 32], DTensor[16, 32], DTensor[16]] "
                "outputs=[DTensor[4, 16]]",
                "    Collective       " + collective_line,
                "Module               Module((root)) [backward]",  # backward under its module too (issue 35)
                "  Module             Module(fc2) [backward]",
                "  Module             Module(fc1) [backward]",
                "    Collective       " + collective_line,
            ],
        )
        table1 = mode.generate_comm_debug_tracing_table(noise_level=1).splitlines()
        table1 = [line for line in table1 if "view_as" not in line]
        _eq([line.split()[0] for line in table1[2:]], ["Op", "Op", "Collective", "Collective"])
        table3 = mode.generate_comm_debug_tracing_table(noise_level=3)
        assert "Module(fc1) [backward]" in table3 and "Redistribute(Partial(sum) -> Replicate())" in table3

        # the JSON dump
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "dump.json")
            mode.generate_json_dump(path, noise_level=2)
            dump = json.load(open(path))
        assert dump["comm_counts"] == {"_c10d_functional.all_reduce": 2} and dump["total_counts"] == 2
        assert dump["sharding_info"]["fc2.weight"] == "Shard(dim=1)"
        root = dump["records"][0]
        assert (root["type"], root["module_fqn"]) == ("module", "(root)")
        assert [c["module_fqn"] for c in root["children"]] == ["fc1", "fc2"]
        fc2_children = [c for c in root["children"][1]["children"] if c.get("op_name") != "view_as"]
        _eq([c["type"] for c in fc2_children], ["op", "collective"])

        # cleanup: no hook left on the model
        assert [(dict(m._forward_pre_hooks), dict(m._forward_hooks)) for m in model.modules()] == hooks_before
        dist.barrier()  # no rank tears gloo down while its peer still talks to it
    finally:
        dist.destroy_process_group()


def eager_collectives_worker(rank: int, world_size: int, port: int) -> None:
    """Every eager c10d and functional collective gloo runs, including those torch's CommDebugMode misses."""
    import torch.distributed._functional_collectives as funcol
    from torch.distributed.tensor.debug import CommDebugMode as TorchCommDebugMode

    from hp_otel import CommDebugMode
    from hp_otel.spans import schema
    from hp_otel.workloads.process_groups import init_gloo

    init_gloo(rank, world_size, port)
    try:
        t = torch.ones(4, 2)
        with CommDebugMode() as mode, TorchCommDebugMode() as torch_mode:
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            dist.broadcast(t, src=0)
            dist.barrier()
            dist.all_gather_into_tensor(torch.empty(4 * world_size, 2), t)
            dist.reduce_scatter_tensor(torch.empty(4 // world_size, 2), t)
            dist.all_to_all_single(torch.empty(4, 2), t)
            if rank == 0:
                dist.send(t, 1)
            else:
                dist.recv(t, 0)
            funcol.wait_tensor(funcol.all_reduce(t, "sum", dist.group.WORLD))
            torch.ops._c10d_functional.all_reduce_(t, "sum", dist.group.WORLD.group_name)
            torch.ops._c10d_functional.wait_tensor(t)
        expected = {
            "c10d.allreduce_": 1,
            "c10d.broadcast_": 1,
            "c10d.barrier": 1,
            "c10d._allgather_base_": 1,
            "c10d._reduce_scatter_base_": 1,
            "c10d.alltoall_base_": 1,
            "c10d.send" if rank == 0 else "c10d.recv_": 1,
            "_c10d_functional.all_reduce": 1,
            "_c10d_functional.all_reduce_": 1,
        }
        _eq(mode.get_comm_counts(), expected)
        assert mode.get_callback_error_counts() == {}
        theirs = {str(k) for k in torch_mode.get_comm_counts()}
        # what torch's CommDebugMode does not count, and hp_otel does
        assert not {"c10d.barrier", "c10d.send", "c10d.recv_", "_c10d_functional.all_reduce_"} & theirs
        spans = {s.attributes[schema.COLLECTIVE_NAME]: s.attributes for s in mode.get_finished_spans()}
        assert spans["c10d.allreduce_"][schema.COLLECTIVE_REDUCE_OP] == "max"
        assert spans["c10d.allreduce_"][schema.COLLECTIVE_ASYNC] is False
        assert spans["c10d._allgather_base_"][schema.COLLECTIVE_OUTPUT_SHAPE] == (4 * world_size, 2)
        assert spans["c10d._reduce_scatter_base_"][schema.COLLECTIVE_OP] == "reduce_scatter"
        assert spans["c10d.barrier"][schema.COLLECTIVE_OP] == "barrier"
        assert all(a[schema.COLLECTIVE_GROUP_SIZE] == world_size for a in spans.values())
        dist.barrier()  # no rank tears gloo down while its peer still talks to it
    finally:
        dist.destroy_process_group()


def work_freed_on_gloo_thread_worker(rank: int, world_size: int, port: int, iterations: int, hook: str) -> None:
    """Synchronous collectives back to back in a window: gloo's worker thread frees each
    finished work (and its tensors' Python objects, which takes the GIL) while holding the
    lock the next collective takes.  A hook that keeps the GIL while the collective runs
    (kernels on the CPU key calling torch's `call_boxed`) deadlocked here within seconds;
    neither hook may.  A hung rank dumps its stacks and exits, failing the test."""
    import faulthandler

    from hp_otel import CommDebugMode
    from hp_otel.sources.pytorch import dtensor as torch_dtensor
    from hp_otel.workloads.process_groups import init_gloo

    os.environ[torch_dtensor.HOOK_ENV] = hook
    init_gloo(rank, world_size, port)
    faulthandler.dump_traceback_later(60, exit=True)
    try:
        with CommDebugMode() as mode:
            for _ in range(iterations):
                t = torch.ones(64)
                dist.broadcast(t, src=0)
                del t  # the worker thread may now hold the last reference to it
                dist.barrier()
        _eq(torch_dtensor.collective_hook(), {"kernels": torch_dtensor.KERNELS}.get(hook, torch_dtensor.DISPATCH_MODE))
        _eq(mode.get_comm_counts(), {"c10d.broadcast_": iterations, "c10d.barrier": iterations})
        assert mode.get_callback_error_counts() == {}
        dist.barrier()
    finally:
        faulthandler.cancel_dump_traceback_later()
        dist.destroy_process_group()
