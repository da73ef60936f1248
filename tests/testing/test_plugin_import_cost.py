"""The pytest plugin costs a pytest run that uses none of its fixtures next to nothing.

pytest loads every `pytest11` plugin of the venv in every run, so before issue 47 each run
paid for `import hp_otel` (the OpenTelemetry SDK, the mode, the analysis). The plugin now
imports only hp_otel's package shells, whose names load on first use. Checked two ways on a
tiny test folder collected with and without the plugin (`-p no:hp_otel`): which modules the
plugin brings in (exact), and their import time as `python -X importtime` reports it.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.torch_free, pytest.mark.multiprocess]  # pytest sessions in child processes

BUDGET_S = 0.2  # issue 47
LINE = re.compile(r"^import time:\s+(\d+) \|\s+\d+ \| ( *)(\S+)$")


def _imports(folder: Path, *flags: str) -> dict[str, int]:
    """Module -> its own import time (µs) in `pytest --co -q` on `folder`."""
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "pytest", "--co", "-q", "-p", "no:cacheprovider", *flags],
        cwd=folder, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "1 test collected" in result.stdout, result.stdout
    found = (LINE.match(line) for line in result.stderr.splitlines())
    return {m.group(3): int(m.group(1)) for m in found if m}


_LOAD_THE_PLUGIN = """
import importlib.metadata, json, sys, time
import pytest  # pytest's own imports are paid by every run, plugin or not
before = set(sys.modules)
started = time.perf_counter()
(entry,) = [e for e in importlib.metadata.entry_points(group="pytest11") if e.name == "hp_otel"]
entry.load()
print(json.dumps({"seconds": time.perf_counter() - started, "modules": sorted(set(sys.modules) - before)}))
"""


def test_loading_the_plugin_imports_only_hp_otels_package_shells() -> None:
    """As pytest loads it (its entry point): what it imports and how long that takes. (`-X importtime`
    does not list a module that importlib.import_module loads itself, the plugin's own packages.)"""
    result = subprocess.run([sys.executable, "-c", _LOAD_THE_PLUGIN], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    loaded = json.loads(result.stdout)
    print(loaded)
    assert loaded["modules"] == ["hp_otel", "hp_otel.testing", "hp_otel.testing.pytest_plugin", "hp_otel.version"]
    assert loaded["seconds"] <= BUDGET_S


def test_a_run_without_hp_otel_fixtures_pays_almost_nothing_for_the_plugin(tmp_path: Path) -> None:
    """The issue's measure: `python -X importtime -m pytest --co -q` with and without `-p no:hp_otel`."""
    (tmp_path / "test_tiny.py").write_text("def test_one():\n    assert 1 + 1 == 2\n")
    with_plugin, without = _imports(tmp_path), _imports(tmp_path, "-p", "no:hp_otel")
    added = {name: us for name, us in with_plugin.items() if name not in without}
    heavy = sorted(n for n in added if n.startswith(("torch", "opentelemetry", "hp_otel.mode", "hp_otel.analysis")))
    assert heavy == [], heavy
    assert sorted(n for n in added if n.startswith("hp_otel")) == ["hp_otel.version"]
    print(f"imported for the plugin: {sum(added.values()) / 1e6:.3f} s: {added}")
    assert sum(added.values()) / 1e6 <= BUDGET_S, added
