"""Who this process is in the job, read from what the launcher put in the environment.

The one place that knows torchrun's and MindSpore msrun's variable names; every
other module asks here (the resource, the per-rank Prometheus port, step traces).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping

# First set variable wins: torchrun's name, then MindSpore's.
RANK_VARIABLES = ("RANK", "RANK_ID", "MS_NODE_ID")
# torchrun, MindSpore, then SLURM (srun), Open MPI (mpirun), MPICH/Intel MPI (Hydra) and PMI.
LOCAL_RANK_VARIABLES = (
    "LOCAL_RANK",
    "DEVICE_ID",
    "SLURM_LOCALID",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "MPI_LOCALRANKID",
    "PMI_LOCAL_RANK",
)
WORLD_SIZE_VARIABLES = ("WORLD_SIZE", "RANK_SIZE", "MS_WORKER_NUM")


def env_value(name: str, environ: Mapping[str, str] = os.environ) -> str | None:
    """The variable's value stripped, None when unset or blank."""
    value = environ.get(name)
    return value.strip() if value is not None and value.strip() else None


def _first_int(names: tuple[str, ...], environ: Mapping[str, str]) -> int | None:
    for name in names:
        value = env_value(name, environ)
        if value is not None and value.isdigit():
            return int(value)
    return None


def global_rank(environ: Mapping[str, str] = os.environ) -> int | None:
    """This process's rank in the job (torchrun `RANK`, MindSpore `RANK_ID` / `MS_NODE_ID`), None if unknown."""
    return _first_int(RANK_VARIABLES, environ)


def local_rank(environ: Mapping[str, str] = os.environ) -> int | None:
    """This process's rank on its host (torchrun `LOCAL_RANK`, MindSpore `DEVICE_ID`), None if unknown."""
    return _first_int(LOCAL_RANK_VARIABLES, environ)


def world_size(environ: Mapping[str, str] = os.environ) -> int | None:
    """Processes in the job (torchrun `WORLD_SIZE`, MindSpore `RANK_SIZE` / `MS_WORKER_NUM`), None if unknown."""
    return _first_int(WORLD_SIZE_VARIABLES, environ)


def run_id(environ: Mapping[str, str] = os.environ) -> str | None:
    """A run id that every rank of one job reads alike, without talking to the others.

    `HP_OTEL_RUN_ID`, else torchrun's `TORCHELASTIC_RUN_ID` (unless its placeholder
    `none`), else one derived from the rendezvous address all ranks share
    (`MASTER_ADDR:MASTER_PORT` for torch, `MS_SCHED_HOST:MS_SCHED_PORT` for MindSpore) —
    two runs on the same address and port then share ids, so set `HP_OTEL_RUN_ID` when
    runs repeat.
    """
    explicit = env_value("HP_OTEL_RUN_ID", environ)
    if explicit:
        return explicit
    elastic = env_value("TORCHELASTIC_RUN_ID", environ)
    if elastic and elastic.lower() != "none":
        return elastic
    for host_var, port_var in (("MASTER_ADDR", "MASTER_PORT"), ("MS_SCHED_HOST", "MS_SCHED_PORT")):
        host, port = env_value(host_var, environ), env_value(port_var, environ)
        if host and port:
            digest = hashlib.sha256(f"{host}:{port}".encode()).hexdigest()[:16]
            return f"rdzv-{digest}"
    return None
