"""Synthetic event sequences: the design's MLP example, fed through the observer interface."""

from __future__ import annotations

import time

from hp_otel.record.observer import Observer
from hp_otel.spans.infos import CollectiveInfo, ModuleInfo, TensorInfo


def dt(*shape: int, placement: str = "Replicate()") -> TensorInfo:
    return TensorInfo(shape=shape, dtype="torch.float32", is_dtensor=True, placements=(placement,), mesh_shape=(2,))


ALL_REDUCE = CollectiveInfo(
    name="differentiable_all_reduce",
    op="all_reduce",
    group_size=2,
    group="tp",
    group_ranks=(0, 1),
    input_shape=(4, 16),
    output_shape=(4, 16),
    dtype="torch.float32",
    bytes=4 * 16 * 4,
    reduce_op="sum",
)


def collective(observer: Observer, info: CollectiveInfo = ALL_REDUCE, phase: str | None = None) -> None:
    start = time.time_ns()
    observer.on_collective(info, start, start + 1000, None, phase)


def design_mlp_forward(observer: Observer, modules: bool = True) -> None:
    """Section 3.5 of the design: fc1 column-sharded, fc2 row-sharded, one all_reduce in fc2's linear."""
    if modules:
        observer.on_module_enter(ModuleInfo("(root)", "MLP", "MLP"), "forward")
        observer.on_module_enter(ModuleInfo("fc1", "fc1", "Linear"), "forward")
    observer.on_op_enter("linear", [dt(4, 16), dt(32, 16, placement="Shard(dim=0)")])
    observer.on_op_exit("linear", [dt(4, 32, placement="Shard(dim=1)")])
    if modules:
        observer.on_module_exit("fc1", "forward")
    observer.on_op_enter("gelu", [dt(4, 32, placement="Shard(dim=1)")])
    observer.on_op_exit("gelu", [dt(4, 32, placement="Shard(dim=1)")])
    if modules:
        observer.on_module_enter(ModuleInfo("fc2", "fc2", "Linear"), "forward")
    observer.on_op_enter("linear", [dt(4, 32, placement="Shard(dim=1)"), dt(16, 32, placement="Shard(dim=1)")])
    collective(observer)
    observer.on_op_exit("linear", [dt(4, 16)])
    if modules:
        observer.on_module_exit("fc2", "forward")
        observer.on_module_exit("(root)", "forward")


DESIGN_TABLE_0 = """\
Type                 Detail
--------------------------------------------------------------------------------
  Collective         Collective(differentiable_all_reduce) group_size=2 input_shape=(4, 16) output_shape=(4, 16)"""

DESIGN_TABLE_1 = """\
Type                 Detail
--------------------------------------------------------------------------------
Op                   Op(linear) inputs=[DTensor[4, 16], DTensor[32, 16]] outputs=[DTensor[4, 32]]
Op                   Op(gelu) inputs=[DTensor[4, 32]] outputs=[DTensor[4, 32]]
Op                   Op(linear) inputs=[DTensor[4, 32], DTensor[16, 32]] outputs=[DTensor[4, 16]]
  Collective         Collective(differentiable_all_reduce) group_size=2 input_shape=(4, 16) output_shape=(4, 16)"""

DESIGN_TABLE_2 = """\
Type                 Detail
--------------------------------------------------------------------------------
Module               Module((root)) [enter]
  Module             Module(fc1) [enter]
    Op               Op(linear) inputs=[DTensor[4, 16], DTensor[32, 16]] outputs=[DTensor[4, 32]]
  Op                 Op(gelu) inputs=[DTensor[4, 32]] outputs=[DTensor[4, 32]]
  Module             Module(fc2) [enter]
    Op               Op(linear) inputs=[DTensor[4, 32], DTensor[16, 32]] outputs=[DTensor[4, 16]]
      Collective     Collective(differentiable_all_reduce) group_size=2 input_shape=(4, 16) output_shape=(4, 16)"""
