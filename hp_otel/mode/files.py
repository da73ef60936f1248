"""What a window renders and writes to files: its table, its JSON dump, its spans (OTLP/JSON) and
its collectives file, each file atomically (`hp_otel.common.files`)."""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Callable
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan

from hp_otel.common.files import check_path, write_text_atomically
from hp_otel.common.launcher_env import current_rank
from hp_otel.mode import window
from hp_otel.render import json_dump, table
from hp_otel.render.levels import noise_level as parse_noise_level
from hp_otel.spans import schema

CommDebugMode = Any  # the facade's class (not imported: it imports this module)


def table_text(mode: CommDebugMode, noise_level: int | None) -> str:
    """The window's call tree as text (`generate_comm_debug_tracing_table`)."""
    level = parse_noise_level(noise_level)
    window.partial_view(mode, "the tracing table")
    if level.modules and mode.module is None:
        warnings.warn(
            f"noise_level={level.level} shows module boundaries, which needs CommDebugMode(module=...); "
            "showing module-less output",
            UserWarning,
            stacklevel=3,  # table_text -> generate_comm_debug_tracing_table -> its caller
        )
    return table.render_table(mode.get_finished_spans(), level, dropped=mode.get_dropped_record_count())


def write_table(mode: CommDebugMode, file_name: str | os.PathLike[str], noise_level: int | None) -> None:
    check_path(file_name, "file_name")
    text = mode.generate_comm_debug_tracing_table(noise_level)
    write_text_atomically(file_name, lambda handle: handle.write(text + "\n"), argument="file_name")


def write_json_dump(mode: CommDebugMode, file_name: str | os.PathLike[str], noise_level: int | None) -> None:
    check_path(file_name, "file_name")
    level = parse_noise_level(noise_level)
    window.partial_view(mode, "the JSON dump")
    json_dump.write_json_dump(
        file_name,
        argument="file_name",
        spans=mode.get_finished_spans(),
        level=level,
        comm_counts=mode.get_comm_counts(),
        comm_module_counts=mode.get_comm_module_counts(),
        dropped_records=mode.get_dropped_record_count(),
    )


def write_spans(
    mode: CommDebugMode, path: str | os.PathLike[str], in_flight: bool, pause: Callable[[], None] | None
) -> None:
    """The window's spans as OTLP/JSON. Safe from another thread while the window records (the hang
    watchdog writes from its own). `in_flight`: also the collectives issued and not completed yet, as
    spans marked `hp_otel.collective.in_flight` (start = issue time, end = now). The file's resource names
    this rank (`hp_otel.rank`) even when no launcher variable does. `pause`: called between pieces of the
    encoding (the watchdog's thread yields there)."""
    from hp_otel.spans.otlp_json import write_spans

    check_path(path, "path")
    spans = spans_to_write(mode, in_flight)
    write_spans(path, spans, argument="path", resource_defaults={schema.RESOURCE_RANK: current_rank()}, pause=pause)


def write_collectives(mode: CommDebugMode, path: str | os.PathLike[str], in_flight: bool) -> None:
    """The collectives as `write_spans` writes them (`in_flight` the same), without the module and op
    spans: group, seq, op, shapes, dtype, bytes, times, module, phase, waits, bandwidths, call site
    (with `stack=`). Safe from another thread, atomic."""
    from hp_otel.spans.collectives_file import write_collectives

    check_path(path, "path")
    spans = spans_to_write(mode, in_flight)
    resource = dict(spans[0].resource.attributes) if spans and spans[0].resource is not None else {}
    resource.setdefault(schema.RESOURCE_RANK, current_rank())
    write_collectives(path, spans, resource)


def spans_to_write(mode: CommDebugMode, in_flight: bool) -> list[ReadableSpan]:
    """The finished spans, and with `in_flight` the collectives not completed yet (marked so)."""
    spans = list(mode.get_finished_spans())
    if in_flight:
        pending = mode.observer.in_flight_spans(time.time_ns())  # type: ignore[attr-defined]
        if pending:  # an op that returned while its work is not done: written once, as in flight
            match = schema.COLLECTIVE_MATCH_ID
            waiting = {span.attributes.get(match) for span in pending}
            spans = [span for span in spans if (span.attributes or {}).get(match) not in waiting]
            spans.extend(pending)
    return spans
