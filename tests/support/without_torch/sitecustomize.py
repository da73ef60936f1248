"""Makes `import torch` fail, as if torch were not installed, in every Python process that has
this folder on PYTHONPATH: the check that the tests marked `torch_free` need no torch, their
child processes included (tests/conftest.py puts the folder there when
HP_OTEL_TESTS_WITHOUT_TORCH=1).

It shadows Debian's sitecustomize (which only installs apport's crash hook) in those processes.
"""

from __future__ import annotations

import importlib.abc
import sys

MESSAGE = "torch is blocked: this run checks that the tests marked torch_free need no torch (tests/conftest.py)"


class TorchBlocker(importlib.abc.MetaPathFinder):
    """First on sys.meta_path: torch and its submodules are "not found" (find_spec raises, as the
    import does), whatever is installed."""

    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if name == "torch" or name.startswith("torch."):
            raise ModuleNotFoundError(MESSAGE, name=name)
        return None


if not any(isinstance(finder, TorchBlocker) for finder in sys.meta_path):
    sys.meta_path.insert(0, TorchBlocker())
