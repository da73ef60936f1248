"""`CommDebugMode` and its pieces, each with one job.

- `facade`: `CommDebugMode`, the user-facing context manager and its queries;
- `options`: the window's options, parsed, checked and defaulted once (`WindowOptions`);
- `registry`: which windows are open on which thread and model (process-wide);
- `window`: opening and closing a window (claim, attach, watchdog; and undoing them);
- `files`: what a window writes (table, JSON dump, spans, collectives file);
- `former_sources`: the adapter for sources written with the former method names.
"""

from __future__ import annotations

from hp_otel.mode.facade import STACK_SKIPPED_PACKAGES, CommDebugMode
from hp_otel.mode.options import DEFAULT_MAX_SPANS, NOT_GIVEN, WindowOptions, check_module, check_providers

__all__ = [
    "DEFAULT_MAX_SPANS",
    "NOT_GIVEN",
    "STACK_SKIPPED_PACKAGES",
    "CommDebugMode",
    "WindowOptions",
    "check_module",
    "check_providers",
]
