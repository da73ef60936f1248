"""A Prometheus file_sd target per rank, so a scrape job finds N ranks without a port list.

With `HP_OTEL_PROMETHEUS_SD_DIR` set, each rank that serves /metrics writes
`<run id>-rank<r>.json` there — `[{"targets": ["host:port"], "labels": {...}}]`, the
format of Prometheus' `file_sd_configs` — and removes it when export shuts down, at exit, and on
SIGTERM when nobody else handles that signal (`remove_at_termination`): Prometheus stops scraping a
rank that is gone.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
from pathlib import Path

from hp_otel.common import launcher_env
from hp_otel.common.files import write_in_folder

SD_DIR_VARIABLE = "HP_OTEL_PROMETHEUS_SD_DIR"
# The target's labels, on every series scraped from it (`up` too, which tells a rank that is down):
# not the resource's hp_otel_run_id / hp_otel_rank, which target_info carries (Prometheus would rename those
# to exported_hp_otel_run_id / exported_hp_otel_rank on it).
TARGET_RUN_ID_LABEL = "hp_target_run_id"
TARGET_RANK_LABEL = "hp_target_rank"


def target_file(directory: str | os.PathLike[str], run_id: str | None, rank: int | None) -> Path:
    safe_run = "".join(c if c.isalnum() or c in "-_." else "_" for c in (run_id or "run"))
    return Path(directory) / f"{safe_run}-rank{rank if rank is not None else os.getpid()}.json"


def write_target(host: str, port: int, run_id: str | None, environ: dict[str, str] | None = None) -> Path | None:
    """Write this rank's target (None when the variable is unset); the host is reachable, not 0.0.0.0."""
    env = os.environ if environ is None else environ
    directory = launcher_env.env_value(SD_DIR_VARIABLE, env)
    if directory is None:
        return None
    rank = launcher_env.global_rank(env)
    address = socket.gethostname() if host in ("", "0.0.0.0", "::") else host
    labels = {TARGET_RUN_ID_LABEL: run_id or "", TARGET_RANK_LABEL: "" if rank is None else str(rank)}
    path = target_file(directory, run_id, rank)
    Path(directory).mkdir(parents=True, exist_ok=True)
    payload = [{"targets": [f"{address}:{port}"], "labels": labels}]
    # a shared folder: a link or FIFO planted at the name is replaced, never followed (write_in_folder)
    write_in_folder(directory, path.name, lambda handle: json.dump(payload, handle), argument=SD_DIR_VARIABLE)
    return path


_written: dict[Path, int] = {}  # this process's targets -> the pid that wrote them (a forked child's are not its own)


def remove_at_termination(path: Path) -> None:
    """Remove `path` if the process is killed by SIGTERM (atexit covers a normal exit and Ctrl-C's
    KeyboardInterrupt). Only where SIGTERM has its default action and on the main thread: another
    handler (the user's, Lightning's) decides what SIGTERM does, and the exit then removes the file."""
    _written[path] = os.getpid()
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _on_sigterm)


def forget(path: Path) -> None:
    """`path` was removed (export shut down)."""
    _written.pop(path, None)


def _on_sigterm(signum: int, frame: object) -> None:
    for path, pid in list(_written.items()):
        if pid == os.getpid():
            path.unlink(missing_ok=True)
    signal.signal(signum, signal.SIG_DFL)  # then die of the signal, as without this handler
    os.kill(os.getpid(), signum)
