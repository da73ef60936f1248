"""The torch engine's settings, read from the environment: checked where a window or the
instrumentor is made, so a bad value is an error naming the variable before anything records.

A source reads them again as it attaches (`dtensor.collective_hook()`, `op_hook.requested()`,
`native.requested()`); there a bad value would only be a logged fault and a window that
records nothing, so `check()` runs first, when the window is made. Torch-free: the
instrumentor checks them at `instrument()` without importing torch.
"""

from __future__ import annotations

from types import MappingProxyType

from hp_otel.common.env_read import getenv
from hp_otel.sources.pytorch import native

COLLECTIVE_HOOK_ENV = "HP_OTEL_TORCH_COLLECTIVE_HOOK"
KERNELS = "kernels"
DISPATCH_MODE = "dispatch_mode"
_COLLECTIVE_HOOKS = MappingProxyType(
    {"": KERNELS, "kernels": KERNELS, "dispatch": DISPATCH_MODE, "dispatch_mode": DISPATCH_MODE}
)

OP_HOOK_ENV = "HP_OTEL_TORCH_OP_HOOK"
CLASS_HOOK = "class"
MODE = "mode"
_OP_HOOKS = MappingProxyType({"": CLASS_HOOK, "class": CLASS_HOOK, "mode": MODE})


def collective_hook() -> str:
    """`HP_OTEL_TORCH_COLLECTIVE_HOOK`: "kernels" (default) or "dispatch_mode"; another value is refused."""
    value = (getenv(COLLECTIVE_HOOK_ENV) or "").strip().lower()
    hook = _COLLECTIVE_HOOKS.get(value)
    if hook is None:
        raise ValueError(f"{COLLECTIVE_HOOK_ENV}={value!r}: allowed values are 'kernels' (default) and 'dispatch'")
    return hook


def op_hook() -> str:
    """`HP_OTEL_TORCH_OP_HOOK`: "class" (default) or "mode"; another value is refused."""
    value = (getenv(OP_HOOK_ENV) or "").strip().lower()
    hook = _OP_HOOKS.get(value)
    if hook is None:
        raise ValueError(f"{OP_HOOK_ENV}={value!r}: allowed values are 'class' (default) and 'mode'")
    return hook


def check() -> None:
    """Every torch setting: a bad one raises a ValueError naming it and the values allowed."""
    collective_hook()
    op_hook()
    native.requested()  # HP_OTEL_TORCH_NATIVE
