"""Each rank writes its own Prometheus file_sd target: N ranks are scraped without a port list."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import servers

from hp_otel.export.config import ExportConfig
from hp_otel.export.prometheus_sd import SD_DIR_VARIABLE
from hp_otel.export.telemetry import build_telemetry


def test_a_rank_writes_its_target_and_removes_it_at_shutdown(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv(SD_DIR_VARIABLE, str(tmp_path / "sd"))
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("LOCAL_RANK", "0")
    telemetry = build_telemetry(ExportConfig.resolve(prometheus_port=0, prometheus_host="127.0.0.1", run_id="r/9"))
    try:
        path = telemetry.prometheus_sd_file
        assert path is not None and path.name == "r_9-rank3.json"
        target = json.loads(path.read_text())
        assert target == [
            {
                "targets": [f"127.0.0.1:{telemetry.prometheus_port}"],
                "labels": {"hp_target_run_id": "r/9", "hp_target_rank": "3"},
            }
        ]
    finally:
        telemetry.shutdown(1.0)
    assert not path.exists()


def test_no_variable_no_file(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv(SD_DIR_VARIABLE, raising=False)
    telemetry = build_telemetry(ExportConfig.resolve(prometheus_port=0, prometheus_host="127.0.0.1", environ={}))
    try:
        assert telemetry.prometheus_sd_file is None
    finally:
        telemetry.shutdown(1.0)


@pytest.mark.server
@pytest.mark.multiprocess  # a real Prometheus and a 2-rank run
def test_a_real_prometheus_finds_both_ranks_through_file_sd(tmp_path) -> None:
    sd = tmp_path / "sd"
    sd.mkdir()
    server, url = servers.start_prometheus(tmp_path, [], file_sd=sd)
    base = servers.free_port_pair()
    child = servers.hp_otel_cli(
        "demo", "--out", str(tmp_path / "out"), "--prometheus-port", str(base), "--linger", "15",
        "--run-id", "sd-run", env={SD_DIR_VARIABLE: str(sd)},
    )  # fmt: skip
    try:

        def both_ranks_up() -> dict[str, float] | None:
            if child.poll() is not None:
                raise AssertionError(f"the demo exited early: {child.communicate()[1][-3000:]}")
            result = servers.prometheus_query(url, 'up{job="hp_otel", hp_target_run_id="sd-run"}')
            ranks = {r["metric"]["hp_target_rank"]: float(r["value"][1]) for r in result}
            return ranks if ranks == {"0": 1.0, "1": 1.0} else None

        servers.wait_for(both_ranks_up, 60, "Prometheus to scrape both ranks found through file_sd")

        def calls_by_rank() -> set[str] | None:  # the file's labels are on every series the rank serves
            calls = servers.prometheus_query(url, "sum by (hp_target_rank) (hp_otel_collective_calls_total)")
            ranks = {r["metric"].get("hp_target_rank") for r in calls}
            return ranks if ranks == {"0", "1"} else None

        servers.wait_for(calls_by_rank, 60, "collective counts labelled with both ranks")
        # the target's labels do not collide with the resource's: target_info keeps hp_otel_rank as the rank
        # said it, beside the target's own (before: renamed exported_hp_rank, exported_hp_run_id)
        infos = servers.prometheus_query(url, 'target_info{job="hp_otel"}')
        assert {(r["metric"]["hp_otel_rank"], r["metric"]["hp_target_rank"]) for r in infos} == {("0", "0"), ("1", "1")}
        assert not [name for r in infos for name in r["metric"] if name.startswith("exported_")], infos
        _, stderr = child.communicate(timeout=120)  # the demo ends by itself after lingering
        assert child.returncode == 0, stderr[-3000:]
    finally:
        servers.stop(child)
        server.close()
    assert sorted(p.name for p in sd.iterdir()) == []  # each rank removed its target when it shut down


KEEP_SERVING = """
import sys, time
import hp_otel
telemetry = hp_otel.configure(prometheus_port=0, prometheus_host="127.0.0.1", run_id="killed")
print(telemetry.prometheus_sd_file, flush=True)
if sys.argv[1] != "exit":
    time.sleep(120)
"""


@pytest.mark.multiprocess  # a real process, killed by a real signal
@pytest.mark.parametrize("how", ["SIGTERM", "SIGINT", "exit"])
def test_the_target_is_removed_when_the_rank_is_killed_or_exits(tmp_path, how) -> None:
    import signal
    import subprocess
    import sys

    from installed_metadata import ROOT

    env = {**os.environ, SD_DIR_VARIABLE: str(tmp_path / "sd"), "RANK": "5", "PYTHONPATH": str(ROOT)}
    # SIGINT at its default in the child, as in a process started from a terminal: a suite run as a
    # background job (`cmd &` without job control) hands its children SIGINT ignored, and Python then
    # installs no KeyboardInterrupt handler, so the signal would not reach hp_otel or the child at all.
    child = subprocess.Popen(
        [sys.executable, "-X", "faulthandler", "-c", KEEP_SERVING, how],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    try:
        path = Path(child.stdout.readline().strip())
        assert path.name == "killed-rank5.json"
        if how != "exit":
            assert path.exists()
            child.send_signal(getattr(signal, how))
        try:
            _, stderr = child.communicate(timeout=60)
        except subprocess.TimeoutExpired as timed_out:  # once seen under load in CI: say where the child is stuck
            child.send_signal(signal.SIGABRT)  # faulthandler prints every thread's stack
            stacks = child.communicate()[1][-4000:]
            raise AssertionError(f"the child did not exit within 60 s of {how}:\n{stacks}") from timed_out
    finally:
        if child.poll() is None:
            child.kill()
    assert not path.exists()  # before: left behind by SIGTERM, and Prometheus kept scraping a dead rank
    expected = {"SIGTERM": -signal.SIGTERM, "SIGINT": -signal.SIGINT, "exit": 0}[how]  # killed as without hp_otel
    assert child.returncode == expected, stderr[-2000:]
