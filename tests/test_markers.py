"""The suite's markers (tests/support/markers.py), each rule seen in a real pytest run of a small
suite in a temporary folder: `slow` follows from its kinds, a bare `slow` or a test-level
`torch_free` is refused, and the without-torch run fails a torch_free module that uses torch,
in the test or in a child process, or skips for want of it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.torch_free, pytest.mark.multiprocess]  # pytest sessions in child processes

SUPPORT = Path(__file__).resolve().parent / "support"
CONFTEST = f"""
import sys
sys.path.insert(0, {str(SUPPORT)!r})
from markers import pytest_collection_modifyitems, pytest_configure, pytest_ignore_collect, pytest_runtest_makereport
"""


def _run(
    tmp_path: Path, config: pytest.Config, files: dict[str, str], *args: str, without_torch: bool = False
) -> subprocess.CompletedProcess[str]:
    markers = "\n".join(f"    {line}" for line in config.getini("markers"))
    (tmp_path / "pytest.ini").write_text(f"[pytest]\nmarkers =\n{markers}\n")
    (tmp_path / "conftest.py").write_text(CONFTEST)
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    env = {k: v for k, v in os.environ.items() if k != "HP_OTEL_TESTS_WITHOUT_TORCH"}
    if without_torch:
        env["HP_OTEL_TESTS_WITHOUT_TORCH"] = "1"
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rA", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


KINDS = """
import pytest

@pytest.mark.server
def test_with_a_server():
    pass

@pytest.mark.bench
@pytest.mark.multiprocess
def test_a_benchmark():
    pass

def test_quick():
    pass
"""


def test_each_kind_is_slow_and_not_slow_keeps_the_rest(tmp_path: Path, pytestconfig: pytest.Config) -> None:
    fast = _run(tmp_path, pytestconfig, {"test_kinds.py": KINDS}, "-m", "not slow")
    assert fast.returncode == 0, fast.stdout + fast.stderr
    assert "PASSED test_kinds.py::test_quick" in fast.stdout
    assert "1 passed, 2 deselected" in fast.stdout
    slow = _run(tmp_path, pytestconfig, {"test_kinds.py": KINDS}, "-m", "slow")
    assert "2 passed, 1 deselected" in slow.stdout, slow.stdout + slow.stderr
    no_servers = _run(tmp_path, pytestconfig, {"test_kinds.py": KINDS}, "-m", "not server")
    assert "2 passed, 1 deselected" in no_servers.stdout, no_servers.stdout + no_servers.stderr


def test_a_bare_slow_is_refused_naming_the_test(tmp_path: Path, pytestconfig: pytest.Config) -> None:
    bare = "import pytest\n\n@pytest.mark.slow\ndef test_why():\n    pass\n"
    result = _run(tmp_path, pytestconfig, {"test_bare.py": bare})
    assert result.returncode == pytest.ExitCode.USAGE_ERROR, result.stdout + result.stderr
    assert "marked slow without saying why" in result.stderr
    assert "test_bare.py::test_why" in result.stderr


def test_torch_free_on_one_test_is_refused(tmp_path: Path, pytestconfig: pytest.Config) -> None:
    partial = "import pytest\n\n@pytest.mark.torch_free\ndef test_one():\n    pass\n"
    result = _run(tmp_path, pytestconfig, {"test_partial.py": partial})
    assert result.returncode == pytest.ExitCode.USAGE_ERROR, result.stdout + result.stderr
    assert "torch_free marks whole modules" in result.stderr
    assert "test_partial.py::test_one" in result.stderr


WITHOUT_TORCH = {
    "test_free.py": "import pytest\n\npytestmark = pytest.mark.torch_free\n\ndef test_free():\n    import json\n",
    "test_imports.py": (
        "import pytest\n\npytestmark = [pytest.mark.torch_free]\n\ndef test_imports():\n    import torch  # noqa\n"
    ),
    "test_child.py": (
        "import subprocess, sys\nimport pytest\n\npytestmark = pytest.mark.torch_free\n\n"
        "def test_child():\n    subprocess.run([sys.executable, '-c', 'import torch'], check=True)\n"
    ),
    "test_skips.py": (
        "import pytest\n\npytestmark = pytest.mark.torch_free\n\ndef test_skips():\n    pytest.importorskip('torch')\n"
    ),
    "test_torch_at_top.py": "import torch  # noqa\n\ndef test_never_collected():\n    pass\n",
}


def test_the_without_torch_run_fails_what_uses_torch(tmp_path: Path, pytestconfig: pytest.Config) -> None:
    result = _run(tmp_path, pytestconfig, WITHOUT_TORCH, without_torch=True)
    out = result.stdout + result.stderr
    assert result.returncode == pytest.ExitCode.TESTS_FAILED, out
    assert "PASSED test_free.py::test_free" in out
    for failed in ("test_imports.py::test_imports", "test_child.py::test_child", "test_skips.py::test_skips"):
        assert f"FAILED {failed}" in out
    assert "torch is blocked" in out
    assert "test_torch_at_top" not in out  # an unmarked module is not even imported
    assert "1 passed" in out and "3 failed" in out
