"""`python -m benchmarks --scale`: memory per retained span, and rendering time for a long window.

Spans come from the design's MLP forward (module, op and collective spans with real
attributes) fed through the observer interface, so no distributed run is needed.
Memory is measured with tracemalloc around recording and building the spans; times are
the median of a few runs after `gc.collect()`.  Figures depend on the machine and its
load: the command prints them, the tests do not assert them.
"""

from __future__ import annotations

import gc
import os
import statistics
import tempfile
import time
import tracemalloc
from collections.abc import Callable, Iterator
from typing import Any

from hp_otel import CommDebugMode
from hp_otel.cli.progress import Progress, quiet
from hp_otel.render.levels import NOISE_LEVELS
from hp_otel.render.table import render_table
from hp_otel.spans.infos import CollectiveInfo, ModuleInfo, TensorInfo

_SPANS_PER_STEP = 7  # design_mlp_forward: root, fc1, linear, gelu, fc2, linear, all_reduce


def _dt(*shape: int, placement: str = "Replicate()") -> TensorInfo:
    return TensorInfo(shape=shape, dtype="torch.float32", is_dtensor=True, placements=(placement,), mesh_shape=(2,))


_ALL_REDUCE = CollectiveInfo(
    "_c10d_functional.all_reduce", "all_reduce", 2, "tp", (0, 1), (4, 16), (4, 16), "torch.float32", 256, "sum"
)


_ROOT = ModuleInfo("(root)", "MLP", "MLP")
_FC1 = ModuleInfo("fc1", "fc1", "Linear")
_FC2 = ModuleInfo("fc2", "fc2", "Linear")


# The tensors' infos, made once: the sources hand out cached infos (one per DTensor spec), so a
# step's ops see the same objects every step.
_X = _dt(4, 16)
_W1 = _dt(32, 16, placement="Shard(dim=0)")
_H = _dt(4, 32, placement="Shard(dim=1)")
_W2 = _dt(16, 32, placement="Shard(dim=1)")


def mlp_forward_events(observer: Any) -> None:
    """One forward of the design's TP MLP as observer events (7 spans)."""
    observer.on_module_enter(_ROOT, "forward")
    observer.on_module_enter(_FC1, "forward")
    observer.on_op_enter("linear", [_X, _W1])
    observer.on_op_exit("linear", [_H])
    observer.on_module_exit("fc1", "forward")
    observer.on_op_enter("gelu", [_H])
    observer.on_op_exit("gelu", [_H])
    observer.on_module_enter(_FC2, "forward")
    observer.on_op_enter("linear", [_H, _W2])
    start = time.time_ns()
    observer.on_collective(_ALL_REDUCE, start, start + 1000)
    observer.on_op_exit("linear", [_X])
    observer.on_module_exit("fc2", "forward")
    observer.on_module_exit("(root)", "forward")


def record_window(spans: int, max_spans: int | None = None) -> CommDebugMode:
    """A finished window holding about `spans` spans (whole steps)."""
    mode = CommDebugMode(max_spans=max_spans if max_spans is not None else spans + _SPANS_PER_STEP)
    with mode:
        for _ in range(-(-spans // _SPANS_PER_STEP)):
            mlp_forward_events(mode.observer)
    return mode


def measure_memory(spans: int) -> dict[str, float]:
    """Bytes per retained span (events recorded and spans built), and what `clear()` leaves behind."""
    record_window(_SPANS_PER_STEP).clear()  # imports and one-time caches are not per-span memory
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        mode = record_window(spans)
        kept = len(mode.get_finished_spans())
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - base
        mode.clear()
        gc.collect()
        after_clear = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    return {
        "spans": kept,
        "bytes_per_span": held / kept,
        "held_mib": held / 2**20,
        "after_clear_kib": after_clear / 1024,
    }


def _median_seconds(run: Callable[[], Any], repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        gc.collect()
        t0 = time.perf_counter()
        run()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def time_outputs(spans: int, repeats: int = 3, progress: Progress = quiet) -> dict[str, float]:
    """Seconds to render the table and to write the JSON dump, per noise level."""
    progress(f"recording a window of {spans} spans")
    mode = record_window(spans)
    finished = mode.get_finished_spans()
    out: dict[str, float] = {"spans": len(finished)}
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "dump.json")
        for level in NOISE_LEVELS:
            progress(f"table and JSON dump at noise level {level} ({repeats} runs each)")
            out[f"table_level_{level}_s"] = _median_seconds(lambda lv=level: render_table(finished, lv), repeats)
            out[f"json_level_{level}_s"] = _median_seconds(
                lambda lv=level: mode.generate_json_dump(path, noise_level=lv), repeats
            )
        out["json_mib"] = os.path.getsize(path) / 2**20
    return out


def run_scale_bench(
    spans: int = 100_000, repeats: int = 3, memory_spans: int = 20_000, progress: Progress = quiet
) -> dict[str, dict[str, float]]:
    """Memory on `memory_spans` spans (tracemalloc slows recording several times), times on `spans`."""
    progress(f"memory per span on {min(spans, memory_spans)} spans (traced by tracemalloc)")
    memory = measure_memory(min(spans, memory_spans))
    return {"memory": memory, "outputs": time_outputs(spans, repeats, progress)}


def format_scale_results(results: dict[str, dict[str, float]]) -> Iterator[str]:
    memory, outputs = results["memory"], results["outputs"]
    yield (
        f"memory: {memory['spans']:.0f} spans retained, {memory['bytes_per_span']:.0f} B/span "
        f"({memory['held_mib']:.1f} MiB), {memory['after_clear_kib']:.1f} KiB left after clear()"
    )
    yield f"outputs for {outputs['spans']:.0f} spans (median s; JSON {outputs['json_mib']:.1f} MiB at level 3):"
    for level in NOISE_LEVELS:
        yield (
            f"  noise_level={level}: table {outputs[f'table_level_{level}_s']:.3f} s, "
            f"JSON dump {outputs[f'json_level_{level}_s']:.3f} s"
        )
