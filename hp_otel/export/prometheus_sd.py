"""A Prometheus file_sd target per rank, so a scrape job finds N ranks without a port list.

With `HP_OTEL_PROMETHEUS_SD_DIR` set, each rank that serves /metrics writes
`<run id>-rank<r>.json` there — `[{"targets": ["host:port"], "labels": {...}}]`, the
format of Prometheus' `file_sd_configs` — and removes it when export shuts down.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

from hp_otel.common import launcher_env
from hp_otel.common.files import write_text_atomically

SD_DIR_VARIABLE = "HP_OTEL_PROMETHEUS_SD_DIR"


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
    labels = {"hp_run_id": run_id or "", "hp_rank": "" if rank is None else str(rank)}
    path = target_file(directory, run_id, rank)
    Path(directory).mkdir(parents=True, exist_ok=True)
    payload = [{"targets": [f"{address}:{port}"], "labels": labels}]
    write_text_atomically(path, lambda handle: json.dump(payload, handle), argument=SD_DIR_VARIABLE)
    return path
