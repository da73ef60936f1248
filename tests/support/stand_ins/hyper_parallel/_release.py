"""Which hyper-parallel release this stand-in behaves like, from `HP_STANDIN_RELEASE` at import time.

- `snapshot` (March 2026): no `_debug_mode_observer`; four `differentiable_*` staticmethods
  on the platform classes (no `all_to_all_single`, no `_async`);
- `newer` (default): `_debug_mode_observer` in `_op_dispatch`; all six on the platform
  classes (MindSpore: five, no `_async`);
- `newest`: `_debug_mode_observer`; the six are functions of `core.dtensor._utils` and
  the platform classes keep only the non-differentiable collectives.
"""

from __future__ import annotations

import os

RELEASES = ("snapshot", "newer", "newest")
RELEASE = os.environ.get("HP_STANDIN_RELEASE", "newer")
if RELEASE not in RELEASES:
    raise ValueError(f"HP_STANDIN_RELEASE must be one of {RELEASES}, got {RELEASE!r}")
HAS_OBSERVER_SLOT = RELEASE != "snapshot"
PLATFORM_HAS_DIFFERENTIABLE = RELEASE != "newest"
HAS_ALL_TO_ALL_SINGLE = RELEASE != "snapshot"
