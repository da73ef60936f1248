"""Says once when a window met graph-mode code, which the hooks cannot trace (design constraint 3).

- torch.compile: dynamo does not run compiled graphs while a non-infra torch dispatch
  mode is active (hp_otel's fallback collective hook is one; the default, Python kernels
  on the collective ops, is not: compiled graphs then run compiled and their collectives
  are counted), so under the fallback compiled functions called in a window run
  eagerly and are traced as eager code — which can differ from the compiled step (fused,
  reordered or bucketed collectives).  The signal is dynamo's own record of the frames it
  skipped for that reason (`eval_frame.dynamo_tls.skip_reasons`), collected for the
  window and restored exactly afterwards.  dynamo is only consulted when already imported.
- MindSpore in GRAPH_MODE: cell hooks and op dispatch do not run in graph mode, so the
  window records nothing from compiled cells.  Read from `mindspore.get_context("mode")`
  when MindSpore is already imported.

A Source like the others (attach = window start, detach = window end), so CommDebugMode
needs no change; the warning is given once per mode.
"""

from __future__ import annotations

import sys
import warnings
from typing import Any

from hp_otel.record.observer import Observer

_DISPATCH_MODE_SKIP = "torch dispatch mode"
_MAX_REASONS = 64  # the first few frames are enough to name the compiled function


class _FirstReasons(list):  # type: ignore[type-arg]
    """dynamo appends one reason per skipped frame: keep the first few, whatever the window's length."""

    def append(self, item: Any) -> None:
        if len(self) < _MAX_REASONS:
            super().append(item)


def _loaded_skip_reasons() -> Any:
    """dynamo's `skip_reasons`, through the compat layer (`_compat.SkipReasons`), when dynamo is already
    imported (never imported for this), else None."""
    if "torch._dynamo.eval_frame" not in sys.modules:
        return None
    from hp_otel.sources.pytorch._compat import loaded_skip_reasons

    return loaded_skip_reasons()


class GraphModeWatch:
    """Source that notices graph-mode code in a window and warns once per mode."""

    def __init__(self) -> None:
        self.warned = False
        self.notes: list[str] = []  # every note of the latest window
        self._reasons: Any = None  # the compat layer's accessor of dynamo's skip_reasons, while attached
        self._saved: Any = None
        self._mark = 0

    def attach(self, observer: Observer) -> None:
        self.notes = []
        self._reasons = None
        reasons = _loaded_skip_reasons()
        if reasons is not None:
            self._reasons, self._saved = reasons, reasons.get()
            if self._saved is None:
                reasons.set(_FirstReasons())
                self._mark = 0
            else:  # someone else collects them already: read what this window adds
                self._mark = len(self._saved)
        self._check_mindspore()

    def detach(self) -> None:
        accessor, self._reasons = self._reasons, None
        if accessor is not None:
            reasons = list(accessor.get() or ())[self._mark :]
            accessor.set(self._saved)  # restored exactly (the same object, usually None)
            self._saved = None
            skipped = [r for r in reasons if _DISPATCH_MODE_SKIP in r]
            if skipped:
                self.notes.append(
                    f"torch.compile'd code ran in this window ({skipped[0].split(':', 1)[0]}...). "
                    "torch.compile does not run compiled graphs under a torch dispatch mode, which "
                    "CommDebugMode installs with HP_OTEL_TORCH_COLLECTIVE_HOOK=dispatch, so that code ran eagerly: "
                    "the trace shows its eager ops and "
                    "collectives, which can differ from the compiled step's (fused, reordered or bucketed)."
                )
        if self.notes and not self.warned:
            self.warned = True
            # stacklevel: warn -> detach -> CommDebugMode._detach_one -> __exit__ -> the user's `with`
            warnings.warn("hp_otel: " + " ".join(self.notes), UserWarning, stacklevel=4)

    def _check_mindspore(self) -> None:
        mindspore = sys.modules.get("mindspore")
        if mindspore is None:
            return
        try:
            in_graph_mode = mindspore.get_context("mode") == mindspore.GRAPH_MODE
        except Exception:  # an unusual build: say nothing rather than guess
            return
        if in_graph_mode:
            self.notes.append(
                "MindSpore is in GRAPH_MODE: cell hooks and op dispatch do not run in graph mode, so this "
                "window records nothing from compiled cells; use PYNATIVE_MODE to trace them."
            )
