"""Children of an instrumented rank under `opentelemetry-instrument`: DataLoader workers forked from it
(`num_workers=2`) and a `multiprocessing` spawn child, which starts a fresh interpreter that loads the
instrumentor again with the rank's environment (its Prometheus port included).

Before, the spawn child crashed in the instrumentor ("Instrumenting of hp_otel failed", a traceback
ending in "Prometheus port … already in use") and the forked workers inherited the rank's exporters.
Now the spawn child says in one line that it is not instrumented, the forked workers export nothing
(their exporters are silenced: tests/reliability/test_fork.py), and the rank's own /metrics counts
exactly its steps' collectives: the referee is the script's own all_reduce, one per step.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import servers
from installed_metadata import ROOT, subprocess_env, write_dist_info

pytestmark = pytest.mark.multiprocess  # an instrumented rank with forked and spawned children

SCRIPT = ROOT / "tests" / "support" / "zero_code_children.py"
INSTRUMENT = str(Path(sys.executable).parent / "opentelemetry-instrument")


def test_forked_and_spawned_children_never_crash_and_export_nothing_of_their_own(tmp_path) -> None:
    port = servers.free_port()
    env = subprocess_env(write_dist_info(tmp_path / "dist"))
    env = {k: v for k, v in env.items() if not k.startswith(("OTEL_", "HP_OTEL_"))}
    env |= {"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_PROMETHEUS_PORT": str(port)}
    env |= {"STORE_PORT": str(servers.free_port()), "HP_OTEL_RUN_ID": "children"}
    done = subprocess.run(
        [INSTRUMENT, sys.executable, str(SCRIPT)], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert "Traceback" not in done.stderr and "failed" not in done.stderr, done.stderr[-4000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["spawned"]["exitcode"] == 0 and result["port"] == port
    # 4 optimizer steps: 3 closed windows, each holding one all_reduce (the first is before any window)
    (calls,) = result["calls"]
    assert 'hp_otel_collective_op="all_reduce"' in calls and calls.endswith(" 3.0"), calls
    said = [line for line in done.stderr.splitlines() if "not instrumented" in line]
    assert len(said) == 1, done.stderr[-4000:]  # the spawn child, once; the forked workers say nothing
    assert said[0].startswith(f"{result['spawned']['pid']} hp_otel INFO ")
    assert re.search(rf"multiprocessing child .* of process {result['pid']}", said[0])
