"""The CLI's errors are one line on stderr with exit status 2, never a traceback (issue 43): a full disk
under stdout or --out, a Prometheus port past 65535 once the local rank is added, a huge --max-bytes."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from events import ALL_REDUCE

from hp_otel import CommDebugMode
from hp_otel.cli import main
from hp_otel.export.telemetry import PrometheusPortError, start_prometheus


@pytest.fixture(scope="module")
def spans_file(tmp_path_factory) -> Path:
    with CommDebugMode() as mode:
        start = time.time_ns()
        mode.observer.on_collective(ALL_REDUCE, start, start + 1000, None, None)
    path = tmp_path_factory.mktemp("spans") / "spans_rank0.json"
    mode.write_spans(path)
    return path


def _hp_otel(*args: str, stdout=subprocess.PIPE) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.run(
        [sys.executable, "-m", "hp_otel.cli", *args], stdout=stdout, stderr=subprocess.PIPE, text=True, env=env,
        timeout=300,
    )  # fmt: skip


@pytest.mark.parametrize("command", [["render"], ["ranks"], ["ranks", "--json"]])
def test_stdout_on_a_full_disk_is_one_line(spans_file, command):
    with open("/dev/full", "w") as full:
        done = _hp_otel(*command, str(spans_file), stdout=full)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"hp-otel {command[0]}: cannot write to stdout (No space left on device)"
    ]


def test_a_huge_max_bytes_is_no_limit(spans_file, capsys):
    assert main(["render", str(spans_file), "--max-bytes", "9" * 30]) == 0
    assert "collective counts" in capsys.readouterr().out


def test_a_huge_max_bytes_variable_is_no_limit(spans_file, monkeypatch, capsys):
    monkeypatch.setenv("HP_OTEL_RENDER_MAX_BYTES", "9" * 30)
    assert main(["render", str(spans_file)]) == 0


def test_a_port_past_65535_with_the_local_rank_names_the_setting(monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "3")
    with pytest.raises(PrometheusPortError, match=r"port 65536 is above 65535 .*prometheus_port=65533 \+ local rank 3"):
        start_prometheus("127.0.0.1", 65533)


def test_demo_refuses_a_port_its_last_rank_cannot_use(capsys, tmp_path):
    assert main(["demo", "--prometheus-port", "65535", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "hp-otel demo: --prometheus-port 65535: rank 1 would serve on 65536, above 65535; use at most 65534, or 0"
    ]
    assert not (tmp_path / "out").exists()  # refused before anything ran


def test_demo_out_not_a_folder_is_one_line(capsys, tmp_path):
    (tmp_path / "file").write_text("")
    assert main(["demo", "--out", str(tmp_path / "file" / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("hp-otel demo: --out ") and "cannot make the folder" in err[0]


@pytest.fixture
def full_disk(tmp_path):
    """A 64 KiB tmpfs, filled: the disk full for real (root mounts it; CI runs as root)."""
    if os.geteuid() != 0:
        if os.environ.get("CI"):
            pytest.fail("CI runs as root: the full-disk case must run")
        pytest.skip("mounting a tmpfs needs root")
    folder = tmp_path / "full"
    folder.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(folder)], capture_output=True)
    if mounted.returncode != 0:
        pytest.fail(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        with open(folder / "fill", "wb", buffering=0) as fill:
            with pytest.raises(OSError):  # ENOSPC
                while True:
                    fill.write(b"\0" * 4096)
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=True)


@pytest.mark.multiprocess  # a real 2-process gloo demo
def test_demo_out_on_a_full_disk_is_one_line(full_disk):
    done = _hp_otel("demo", "--out", str(full_disk / "out"))
    assert done.returncode == 2, done.stderr
    said = [line for line in done.stderr.splitlines() if not line.startswith("hp-otel demo [")]  # progress lines
    assert said == [f"hp-otel demo: --out '{full_disk}/out': cannot write this run's files (No space left on device)"]
