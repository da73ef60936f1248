"""The runnable example each callback page leads with (docs/guide/lightning.md, huggingface.md), run as
the page says, on 2 gloo ranks: what rank 0 prints at the end of training is the output the page shows.
The counts in it are the callbacks' (tests/integrations/test_callbacks_gloo.py checks them against a
referee); here the page is checked against the program."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hp_otel.workloads.process_groups import free_port

pytestmark = pytest.mark.multiprocess  # 2 gloo ranks per page

ROOT = Path(__file__).resolve().parents[2]


def _block(page: str, name: str) -> str:
    text = (ROOT / "docs" / "guide" / page).read_text()
    found = re.search(rf"<!-- {name}: begin -->\s*```\w+\n(.*?)```\s*<!-- {name}: end -->", text, re.S)
    assert found, f"docs/guide/{page} has no {name} block"
    return found.group(1)


@pytest.mark.parametrize("page", ["lightning.md", "huggingface.md"])
def test_the_pages_first_example_prints_what_the_page_shows(page, tmp_path) -> None:
    (tmp_path / "train.py").write_text(_block(page, "runnable"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "HP_OTEL_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    if page == "lightning.md":  # `python train.py`: Lightning starts the second rank
        command = [sys.executable, "train.py"]
    else:  # `torchrun --nproc-per-node 2 train.py`
        command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
        command += ["--master-addr", "127.0.0.1", "--master-port", str(free_port()), "train.py"]
    env["MASTER_PORT"] = str(free_port())  # Lightning's launcher: a free rendezvous port
    run = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-4000:]
    printed = [line for line in output.splitlines() if line.startswith("hp_otel: ")]
    assert printed == _block(page, "output").splitlines(), output[-4000:]
