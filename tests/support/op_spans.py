"""Op spans read back from a window, to compare two ways of recording them (the op hook and the
TorchFunctionMode fallback; the hook with the native filter and without)."""

from __future__ import annotations

from hp_otel import CommDebugMode


def op_spans(mode: CommDebugMode) -> list[tuple[str, tuple]]:
    """Op spans in start order, with every attribute (the op spans are those with op input attributes)."""
    spans = sorted(mode.get_finished_spans(), key=lambda s: (s.start_time, s.context.span_id))
    return [
        (s.name, tuple(sorted((k, v) for k, v in s.attributes.items() if k.startswith("hp_otel.op."))))
        for s in spans
        if any(k.startswith("hp_otel.op.") for k in s.attributes)
    ]
