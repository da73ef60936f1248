"""The frameworks `HpOtelInstrumentor` instruments, as opentelemetry-python-contrib declares them.

`_instruments` must all be installed, `_instruments_any` at least one (contrib's
`instruments` / `instruments-any` extras, which pyproject.toml repeats for
`opentelemetry-instrument`'s dependency check of the installed distribution).
"""

from __future__ import annotations

_instruments_torch = "torch >= 2.13, < 2.15"
_instruments_mindspore = "mindspore >= 2.4"

_instruments: tuple[str, ...] = ()
_instruments_any: tuple[str, ...] = (_instruments_torch, _instruments_mindspore)
