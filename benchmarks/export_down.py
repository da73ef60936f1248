"""`python -m benchmarks --export-down`: what an unreachable OTLP endpoint costs a traced step.

Same step as `python -m benchmarks` (TP MLP over torch's fake process group, one process),
traced with `hp_otel.step(n)` + `CommDebugMode(module=model)`, spans built at the end
of each window and handed to the providers. Variants, interleaved round after round:

- `no export`: SDK providers with no processor or reader (spans built, sent nowhere);
- `refused (http|grpc)`: BatchSpanProcessor + OTLP exporter to a loopback port nobody
  listens on, plus a 1 s periodic metric export there;
- `blackholed (http|grpc)`: the same to a loopback socket that accepts and never answers.

The ratio to `no export` is what exporting to a dead endpoint adds to a step.
"""

from __future__ import annotations

import contextlib
import gc
import random
import socket
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from hp_otel.cli.progress import Progress, quiet


class Blackhole:
    """A loopback TCP server that accepts connections and never reads or answers."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(128)
        self.port = int(self.sock.getsockname()[1])
        self._held: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        self.sock.settimeout(0.2)
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
                self._held.append(conn)
            except OSError:
                continue

    def close(self) -> None:
        self._stop.set()
        self._thread.join(1)
        for conn in self._held:
            conn.close()
        self.sock.close()


def closed_port() -> int:
    """A loopback port with nothing listening (bound, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _variant_telemetry(endpoint: str | None, protocol: str) -> Any:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.trace import TracerProvider

    from hp_otel.export.config import ExportConfig
    from hp_otel.export.telemetry import build_telemetry

    if endpoint is None:
        return None, TracerProvider(shutdown_on_exit=False), MeterProvider(shutdown_on_exit=False)
    config = ExportConfig.resolve(
        endpoint=endpoint,
        protocol=protocol,
        schedule_delay_ms=1000,
        metric_export_interval_ms=1000,
        export_timeout_s=2.0,
        environ={},
    )
    telemetry = build_telemetry(config)
    return telemetry, telemetry.tracer_provider, telemetry.meter_provider


def run_export_bench(
    rounds: int = 15, steps: int = 20, progress: Progress = quiet
) -> tuple[dict[str, float], dict[str, Any]]:
    """Median µs per step per variant, and what the exporting variants counted (dropped, failed)."""
    import torch

    from hp_otel import CommDebugMode
    from hp_otel.always_on.steps import step as mark_step
    from hp_otel.workloads.process_groups import fake_process_group
    from hp_otel.workloads.tp_mlp import build_tp_mlp, train_step

    torch.set_num_threads(1)
    fake_process_group(2)
    model = build_tp_mlp(2, 32, 64)
    batch = torch.randn(8, 32)
    blackhole = Blackhole()
    refused = closed_port()
    endpoints: dict[str, tuple[str | None, str]] = {
        "no export": (None, "http/protobuf"),
        "refused http": (f"http://127.0.0.1:{refused}", "http/protobuf"),
        "refused grpc": (f"http://127.0.0.1:{refused}", "grpc"),
        "blackholed http": (f"http://127.0.0.1:{blackhole.port}", "http/protobuf"),
        "blackholed grpc": (f"http://127.0.0.1:{blackhole.port}", "grpc"),
    }
    variants = {name: _variant_telemetry(*spec) for name, spec in endpoints.items()}
    counter = iter(range(10**9))

    def make_step(tracer_provider: Any, meter_provider: Any) -> Callable[[], None]:
        def one_step() -> None:
            with (
                mark_step(next(counter), run_id="bench", rank=0, tracer_provider=tracer_provider),
                CommDebugMode(
                    module=model, tracer_provider=tracer_provider, meter_provider=meter_provider, live_spans=False
                ),
            ):
                train_step(model, batch.detach().requires_grad_(True))
            model.zero_grad(set_to_none=True)

        return one_step

    steps_by_name = {name: make_step(tp, mp) for name, (_, tp, mp) in variants.items()}

    def time_block(fn: Callable[[], None]) -> float:
        gc.collect()
        samples = []
        for _ in range(steps):
            t0 = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - t0)
        return statistics.median(samples) * 1e6

    try:
        for fn in steps_by_name.values():
            time_block(fn)  # warm-up
        per_round: dict[str, list[float]] = {name: [] for name in steps_by_name}
        order = list(steps_by_name)
        progress(f"{len(steps_by_name)} variants x {rounds} rounds x {steps} steps")
        for done in range(rounds):
            if done and done % max(1, rounds // 5) == 0:
                progress(f"round {done + 1}/{rounds}")
            random.Random(len(per_round["no export"])).shuffle(order)
            for name in order:
                per_round[name].append(time_block(steps_by_name[name]))
        results = {name: statistics.median(v) for name, v in per_round.items()}
        spread = {name: (min(v), max(v)) for name, v in per_round.items()}
        counts: dict[str, Any] = {"spread": spread}
        progress("shutting the exporters down (each bounded to 3 s)")
        for name, (telemetry, _, _) in variants.items():
            if telemetry is not None:
                started = time.monotonic()
                finished = telemetry.shutdown(timeout_s=3.0)
                counts[name] = {
                    "dropped": telemetry.dropped_spans,
                    "failed": telemetry.failed_spans,
                    "shutdown_s": round(time.monotonic() - started, 2),
                    "shutdown_finished": finished,
                }
        return results, counts
    finally:
        blackhole.close()


def format_export_results(results: dict[str, float], counts: dict[str, Any]) -> Iterator[str]:
    base = results["no export"]
    yield f"{'variant':<20}{'median µs/step':>16}{'ratio':>9}{'round min..max':>20}   export counts"
    for name, value in results.items():
        low, high = counts["spread"][name]
        extra = counts.get(name, "")
        yield f"{name:<20}{value:>16.0f}{value / base:>8.3f}x{f'{low:.0f}..{high:.0f}':>20}   {extra}"


@contextlib.contextmanager
def _quiet_exporter_logs() -> Iterator[None]:
    """The OTLP exporters log every retry against a dead endpoint; the bench reports counts instead."""
    import logging

    loggers = [logging.getLogger(n) for n in ("opentelemetry.exporter", "opentelemetry.sdk", "hp_otel")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


def main(rounds: int, steps: int, progress: Progress = quiet) -> list[str]:
    with _quiet_exporter_logs():
        results, counts = run_export_bench(rounds, steps, progress)
    return list(format_export_results(results, counts))
