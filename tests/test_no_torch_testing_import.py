"""The shipped package never imports torch's test helpers (`torch.testing._internal`): not
when any hp_otel module is imported, nor when the benchmarks (`benchmarks/`, beside the tests)
build and run their workloads over the fake process group with hp_otel's helpers.

torch 2.13 imports some of them itself (`import torch` loads
`torch.testing._internal.logging_tensor` through `torch.utils.checkpoint`; FSDP's
`_flat_param` loads `fake_pg`), so `sys.modules` alone cannot tell: a fresh interpreter
records every import statement and `importlib.import_module` call naming
`torch.testing._internal` together with the module that made it, and none may be hp_otel's."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  # the repository: `benchmarks` is imported from here

_RECORD_IMPORTERS = """
import builtins, importlib, json, sys
PREFIX = "torch.testing._internal"
importers = set()
_import, _import_module = builtins.__import__, importlib.import_module

def _note(name, importer):
    if name.startswith(PREFIX):
        importers.add((importer, name))

def recording_import(name, globals=None, locals=None, fromlist=(), level=0):
    importer = (globals or {}).get("__name__", "?")
    if level == 0:
        _note(name, importer)
        for item in fromlist or ():
            _note(f"{name}.{item}", importer)
    return _import(name, globals, locals, fromlist, level)

def recording_import_module(name, package=None):
    _note(name, sys._getframe(1).f_globals.get("__name__", "?"))
    return _import_module(name, package)

builtins.__import__ = recording_import
importlib.import_module = recording_import_module
"""

_IMPORT_ALL = (
    _RECORD_IMPORTERS
    + """
import pkgutil
import hp_otel
skipped = {}
for info in pkgutil.walk_packages(hp_otel.__path__, "hp_otel."):
    if info.name.endswith(".__main__"):  # runs the CLI when imported
        continue
    try:
        importlib.import_module(info.name)
    except ImportError as exc:  # an optional framework (MindSpore) that is not installed
        skipped[info.name] = str(exc)
print(json.dumps({
    "imported": sorted(m for m in sys.modules if m.startswith("hp_otel")),
    "skipped": skipped,
    "importers": sorted(importers),
}))
"""
)

_RUN_BENCH_WORKLOADS = (
    _RECORD_IMPORTERS
    + """
from benchmarks.workloads import ALIASES, WORKLOADS, build_workload
for name in [n for n in WORKLOADS if n not in ("medium", "realistic")] + list(ALIASES):
    build_workload(name).step()
print(json.dumps({"importers": sorted(importers)}))
"""
)


def _run(code: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert isinstance(result, dict)
    return result


def _hp_otel_importers(result: dict) -> list:
    return [
        (importer, name)
        for importer, name in result["importers"]
        if importer.split(".")[0] in ("hp_otel", "benchmarks")
    ]


def test_importing_every_hp_otel_module_does_not_import_torch_testing() -> None:
    result = _run(_IMPORT_ALL)
    assert "hp_otel.cli.demo" in result["imported"] and "hp_otel.torch.source" in result["imported"]
    assert all("mindspore" in reason for reason in result["skipped"].values()), result["skipped"]
    assert result["importers"], "the recorder saw torch's own imports of torch.testing._internal"
    assert _hp_otel_importers(result) == []


def test_the_benchmark_workloads_run_without_importing_torch_testing() -> None:
    """Every small workload and alias built and stepped in a fresh interpreter (about 5 s)."""
    assert _hp_otel_importers(_run(_RUN_BENCH_WORKLOADS)) == []
