"""`hp_otel.torch.CommDebugMode`: torch's CommDebugMode API, with hp_otel's spans and metrics.

Change `from torch.distributed.tensor.debug import CommDebugMode` to
`from hp_otel.torch import CommDebugMode` and every existing line keeps working:
counts keyed by torch's op packets, torch's module names (`MLPModule.net2`, `Global`),
torch's table and JSON dump.  The same window is an `hp_otel.CommDebugMode` (`.otel`):
OTel spans with per-collective shape, dtype, bytes, group and duration, metrics, and
the collectives torch does not count (`get_extra_comm_counts()`).
"""

from __future__ import annotations

import json
import os
import re
import warnings
from collections import defaultdict
from typing import Any

from opentelemetry.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import TracerProvider

from hp_otel.common.files import check_path, write_text_atomically
from hp_otel.mode import CommDebugMode as OtelCommDebugMode
from hp_otel.mode.options import DEFAULT_MAX_SPANS, WindowOptions
from hp_otel.torch import op_keys, report
from hp_otel.torch.module_tracker import GLOBAL
from hp_otel.torch.source import TorchCompatSource, TorchRecordMode, new_phase_counts

_ANSI_ESCAPE = re.compile(r"\x1B\[[0-?]*[ -/]*[@-~]")


class CommDebugMode(TorchRecordMode):
    """torch 2.13's `CommDebugMode`, recorded by hp_otel as well.

    Needs no arguments, like torch's.  Optional, keyword only: `tracer_provider`,
    `meter_provider`, `max_spans`, `live_spans` — passed to the `hp_otel.CommDebugMode`
    that records the same window (see its docs).
    """

    def __init__(
        self,
        *,
        tracer_provider: TracerProvider | None = None,
        meter_provider: MeterProvider | None = None,
        max_spans: int = DEFAULT_MAX_SPANS,
        live_spans: bool | None = None,
    ) -> None:
        super().__init__()
        options = WindowOptions.parse(  # checked as every window's options are
            engine="torch",
            tracer_provider=tracer_provider,
            meter_provider=meter_provider,
            max_spans=max_spans,
            live_spans=live_spans,
            extra_sources=[TorchCompatSource(self)],
        )
        self._otel = OtelCommDebugMode.from_options(options)
        self._otel._warns_partial_view = False  # torch's API reads counts inside the window without a word

    # --- window ---------------------------------------------------------------------
    def __enter__(self) -> CommDebugMode:
        if self._otel.active:
            raise RuntimeError("this CommDebugMode is already active; create a new one to nest")
        self.comm_counts.clear()
        self.comm_module_counts.clear()
        self.comm_module_counts[GLOBAL] = new_phase_counts()
        self.comm_module_operation_counts.clear()
        self._otel.__enter__()
        return self

    def __exit__(self, *args: Any) -> None:
        self._otel.__exit__(*args)

    # --- torch's queries ------------------------------------------------------------
    def get_comm_counts(self, include_extra: bool = False) -> dict[Any, int]:
        """torch's counts: `{torch.ops.c10d_functional.all_reduce: n, ...}` (a defaultdict, like torch's).

        With `include_extra=True`, a new dict that also holds the collectives torch does
        not count (`torch.ops.c10d.barrier`, `torch.ops._c10d_functional.all_reduce_`, ...).
        """
        if not isinstance(include_extra, bool):
            raise TypeError(f"include_extra must be True or False, got {include_extra!r}")
        if not include_extra:
            return self.comm_counts
        merged: defaultdict[Any, int] = defaultdict(int, self.comm_counts)
        for key, n in self.get_extra_comm_counts().items():
            merged[key] += n
        return merged

    def get_total_counts(self, include_extra: bool = False) -> int:
        return sum(self.get_comm_counts(include_extra).values())

    def get_comm_module_counts(self) -> dict[str, dict[str, dict[Any, int]]]:
        """`comm_module_counts`: `{fqn: {"forward": {packet: n}, "backward": {packet: n}}}`, `"Global"` included."""
        return self.comm_module_counts

    def get_parameter_info(self) -> dict[str, dict[str, Any]]:
        """`{fqn: {param name: param.data}}` for the modules that ran."""
        return self.advanced_module_tracker.module_parameters_dict

    def get_sharding_info(self) -> dict[str, Any]:
        """`{"MLPModule.net1.weight": (Shard(dim=0),)}` for DTensor parameters of the modules that ran."""
        return self.advanced_module_tracker.sharding_dict

    def generate_comm_debug_tracing_table(self, noise_level: int = 3) -> str:
        """torch's module table: 0 collective counts; 1 + module data, DTensor ops; 2 + local ops; 3 + trivial ops."""
        return report.tracing_table(self._records(), noise_level)

    def log_comm_debug_tracing_table_to_file(
        self, file_name: str | os.PathLike[str] = "comm_mode_log.txt", noise_level: int = 3
    ) -> None:
        """The table without colours, written to a file."""
        check_path(file_name, "file_name")
        text = _ANSI_ESCAPE.sub("", self.generate_comm_debug_tracing_table(noise_level))
        write_text_atomically(file_name, lambda handle: handle.write(text), argument="file_name")

    def generate_json_dump(
        self, file_name: str | os.PathLike[str] = "comm_mode_log.json", noise_level: int = 3
    ) -> None:
        """torch's JSON tree (the comm-mode visualiser's input) written to a file."""
        check_path(file_name, "file_name")
        tree = report.json_tree(self._records(), noise_level)
        write_text_atomically(file_name, lambda handle: json.dump(tree, handle, indent=4), argument="file_name")

    def _records(self) -> report.Records:
        tracker = self.advanced_module_tracker
        return report.Records(
            tracker.module_helper_dict, tracker.parent_dict, self.comm_module_counts, self.comm_module_operation_counts
        )

    # --- what torch's mode cannot give ------------------------------------------------
    @property
    def otel(self) -> OtelCommDebugMode:
        """The `hp_otel.CommDebugMode` recording this window: its table, JSON, normalised counts, spans."""
        return self._otel

    def get_extra_comm_counts(self) -> dict[Any, int]:
        """Collectives torch's CommDebugMode does not count, by op packet (`torch.ops.c10d.barrier: 1`)."""
        extra: dict[Any, int] = {}
        for name, n in self._otel.get_comm_counts().items():
            if op_keys.torch_key_for_name(name, self.comm_registry) is None:
                key = op_keys.extra_key_for_name(name)
                extra[key] = extra.get(key, 0) + n
        return extra

    def generate_otel_tracing_table(self, noise_level: int | None = None) -> str:
        """hp_otel's span table of this window (`hp_otel.CommDebugMode.generate_comm_debug_tracing_table`);
        module boundaries come from the drop-in's tracker, so level 2 needs no `module=`."""
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="noise_level=.*needs CommDebugMode\\(module=")
            return self._otel.generate_comm_debug_tracing_table(noise_level)

    def get_finished_spans(self) -> tuple[ReadableSpan, ...]:
        return self._otel.get_finished_spans()

    def get_metric_reader(self) -> InMemoryMetricReader | None:
        return self._otel.get_metric_reader()

    def get_callback_error_counts(self) -> dict[str, int]:
        return self._otel.get_callback_error_counts()

    def get_dropped_record_count(self) -> int:
        return self._otel.get_dropped_record_count()

    def __repr__(self) -> str:
        return f"CommDebugMode(get_total_counts()={self.get_total_counts()})"
