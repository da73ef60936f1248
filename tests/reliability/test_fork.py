"""A process forked from a configured one (a DataLoader worker with the `fork` start
method) exports nothing: not the parent's metric totals frozen at fork time, not spans,
not under the parent's identity. The real OTLP exporter classes are watched: every call
that reaches them records the calling process's pid in a file."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from events import design_mlp_forward
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

import hp_otel
from benchmarks.export_down import closed_port
from hp_otel import CommDebugMode
from hp_otel.export import providers
from hp_otel.export import telemetry as export

pytestmark = pytest.mark.torch_free  # needs no torch: not rerun on torch 2.14.1 (tests/support/markers.py)


@pytest.fixture
def exports_log(tmp_path: Path, monkeypatch) -> Path:
    log = tmp_path / "exports.log"
    for exporter in (OTLPMetricExporter, OTLPSpanExporter):
        original = exporter.export

        def export_and_note(self, *args, _original=original, _kind=exporter.__name__, **kwargs):  # type: ignore[no-untyped-def]
            with open(log, "a") as handle:
                handle.write(f"{os.getpid()} {_kind}\n")
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(exporter, "export", export_and_note)
    return log


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork is POSIX only")
def test_a_forked_child_exports_nothing_and_forgets_the_parents_telemetry(exports_log: Path) -> None:
    telemetry = hp_otel.configure(
        endpoint=f"http://127.0.0.1:{closed_port()}",
        metric_export_interval_ms=100,
        export_timeout_s=0.2,
        environ={},
    )
    try:
        with CommDebugMode() as mode:
            design_mlp_forward(mode.observer)
        status_file = exports_log.with_suffix(".child")
        pid = os.fork()
        if pid == 0:  # the child: wait through many export intervals, making spans of its own too
            try:
                state = (
                    export.configured() is None,
                    providers.default_tracer_provider() is not telemetry.tracer_provider,
                )
                with CommDebugMode() as child_mode:
                    design_mlp_forward(child_mode.observer)
                time.sleep(1.5)
                status_file.write_text(repr(state))
            finally:
                os._exit(0)
        _, status = os.waitpid(pid, 0)
        assert status == 0
        assert status_file.read_text() == "(True, True)"
        time.sleep(0.3)
        lines = exports_log.read_text().splitlines() if exports_log.exists() else []
        assert [line for line in lines if line.startswith(f"{pid} ")] == []  # nothing from the child
        assert any(line.startswith(f"{os.getpid()} OTLPMetricExporter") for line in lines)  # the parent still exports
    finally:
        hp_otel.shutdown(1)
