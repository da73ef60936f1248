"""One environment variable read cheaply, for settings a window reads each time it opens.

`os.environ.get(name)` runs three Python calls and, for an unset variable, raises and
catches a KeyError, several times a window (its cost: docs/how-it-works/costs.md).
`getenv(name)` looks the name up in the environment's own mapping instead, so a variable
set or removed since (`os.environ[...] =`, `monkeypatch.setenv`) is still seen at once;
where `os.environ` was replaced by another mapping it falls back to that mapping's `get`.
"""

from __future__ import annotations

import os
from typing import Any

_ENVIRON = os.environ
_DATA: dict[Any, Any] | None = getattr(_ENVIRON, "_data", None)
_keys: dict[str, Any] = {}  # name -> its key in _DATA (bytes on POSIX)
_values: dict[Any, str] = {}  # a raw value -> its text (settings take few values)


def getenv(name: str) -> str | None:
    """`os.environ.get(name)`, without its Python-level calls."""
    environ = os.environ
    if environ is not _ENVIRON or _DATA is None:
        return environ.get(name)
    key = _keys.get(name)
    if key is None:
        key = _keys[name] = _ENVIRON.encodekey(name)  # type: ignore[attr-defined]
    raw = _DATA.get(key)
    if raw is None:
        return None
    text = _values.get(raw)
    if text is None:
        text = _ENVIRON.decodevalue(raw)  # type: ignore[attr-defined]
        if len(_values) < 256:
            _values[raw] = text
    return text


SDK_DISABLED_VARIABLE = "OTEL_SDK_DISABLED"


def sdk_disabled() -> bool:
    """`OTEL_SDK_DISABLED=true`, read as the OpenTelemetry SDK reads it (its providers then hand out no-ops):
    hp_otel then opens and exports nothing either."""
    return (getenv(SDK_DISABLED_VARIABLE) or "").strip().lower() == "true"
