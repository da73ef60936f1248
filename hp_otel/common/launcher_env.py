"""Who this process is in the job, read from what the launcher put in the environment.

The one place that knows the launchers' variable names (torchrun / TorchElastic,
MindSpore msrun, Open MPI's mpirun, SLURM's srun, Kubeflow's training operator); every
other module asks here (the resource detector, the per-rank Prometheus port, step traces).
"""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Mapping, Sequence

# First set variable wins. torchrun's names come first: under `srun torchrun` or a
# Kubeflow PyTorchJob running torchrun, SLURM's task id and the pod's node rank describe
# the launcher, torchrun's RANK the worker. Then MindSpore, Open MPI, SLURM, PMI (MPICH).
RANK_VARIABLES = ("RANK", "RANK_ID", "MS_NODE_ID", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID", "PMI_RANK")
LOCAL_RANK_VARIABLES = (
    "LOCAL_RANK",
    "DEVICE_ID",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "SLURM_LOCALID",
    "MPI_LOCALRANKID",
    "PMI_LOCAL_RANK",
)
WORLD_SIZE_VARIABLES = ("WORLD_SIZE", "RANK_SIZE", "MS_WORKER_NUM", "OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS", "PMI_SIZE")
# Job ids every rank of one run shares, in order: (variable, prefix of the run id).
RUN_ID_VARIABLES = (
    ("SLURM_JOB_ID", "slurm-"),  # + ".<SLURM_STEP_ID>" when srun runs several steps in one allocation
    ("PMIX_NAMESPACE", "mpi-"),  # Open MPI 5 (PRRTE) and any PMIx launcher
    ("OMPI_MCA_orte_ess_jobid", "mpi-"),  # Open MPI 4
)
# Rendezvous addresses all ranks share (torchrun / a Kubeflow PyTorchJob, Kubeflow Trainer's
# torchrun arguments, MindSpore's scheduler): a run id derived from them when nothing better is set.
RENDEZVOUS_VARIABLES = (
    ("MASTER_ADDR", "MASTER_PORT"),
    ("PET_MASTER_ADDR", "PET_MASTER_PORT"),
    ("MS_SCHED_HOST", "MS_SCHED_PORT"),
)
# Launcher processes: they start the ranks and run no training step themselves.
LAUNCHER_COMMANDS = ("torchrun", "msrun", "torch.distributed.run", "torch.distributed.launch")


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
    """This process's rank in the job (`RANK`, MindSpore `RANK_ID`/`MS_NODE_ID`, Open MPI, SLURM), None if unknown."""
    return _first_int(RANK_VARIABLES, environ)


def local_rank(environ: Mapping[str, str] = os.environ) -> int | None:
    """This process's rank on its host (`LOCAL_RANK`, MindSpore `DEVICE_ID`, Open MPI, SLURM), None if unknown."""
    return _first_int(LOCAL_RANK_VARIABLES, environ)


def world_size(environ: Mapping[str, str] = os.environ) -> int | None:
    """Processes in the job (`WORLD_SIZE`, MindSpore `RANK_SIZE`/`MS_WORKER_NUM`, Open MPI, SLURM), None if unknown."""
    return _first_int(WORLD_SIZE_VARIABLES, environ)


def run_id(environ: Mapping[str, str] = os.environ) -> str | None:
    """A run id that every rank of one job reads alike, without talking to the others.

    `HP_OTEL_RUN_ID`, else torchrun's `TORCHELASTIC_RUN_ID` (unless its placeholder
    `none`), else the scheduler's job id (SLURM `SLURM_JOB_ID[.SLURM_STEP_ID]`, Open MPI's
    PMIx namespace or job id), else one derived from the rendezvous address all ranks
    share (`MASTER_ADDR:MASTER_PORT`, Kubeflow Trainer's `PET_MASTER_ADDR:PET_MASTER_PORT`,
    MindSpore's `MS_SCHED_HOST:MS_SCHED_PORT`) — two runs on the same address and port then
    share ids, so set `HP_OTEL_RUN_ID` when runs repeat.
    """
    explicit = env_value("HP_OTEL_RUN_ID", environ)
    if explicit:
        return explicit
    elastic = env_value("TORCHELASTIC_RUN_ID", environ)
    if elastic and elastic.lower() != "none":
        return elastic
    for name, prefix in RUN_ID_VARIABLES:
        job = env_value(name, environ)
        if job:
            step = env_value("SLURM_STEP_ID", environ) if name == "SLURM_JOB_ID" else None
            return f"{prefix}{job}" + (f".{step}" if step else "")
    for host_var, port_var in RENDEZVOUS_VARIABLES:
        host, port = env_value(host_var, environ), env_value(port_var, environ)
        if host and port:
            digest = hashlib.sha256(f"{host}:{port}".encode()).hexdigest()[:16]
            return f"rdzv-{digest}"
    return None


def is_launcher_process(argv: Sequence[str] | None = None) -> bool:
    """True in a launcher (`torchrun`, `python -m torch.distributed.run`, `msrun`), not in the ranks it starts.

    `opentelemetry-instrument torchrun ...` instruments every Python process, the launcher
    included; the launcher runs no step, and must not take a rank's Prometheus port.
    """
    args = list(sys.orig_argv if argv is None else argv)
    if not args:
        return False
    if not _is_python(args[0]):  # a console script run by its shebang: its own name
        return os.path.basename(args[0]) in LAUNCHER_COMMANDS
    rest = iter(args[1:])
    for arg in rest:  # the interpreter's options, then `-m module` or the script
        if arg == "-m":
            return next(rest, "") in LAUNCHER_COMMANDS
        if arg == "-c":
            return False
        if arg in ("-X", "-W"):  # options that take a value
            next(rest, None)
            continue
        if not arg.startswith("-"):
            return os.path.basename(arg) in LAUNCHER_COMMANDS
    return False


def _is_python(program: str) -> bool:
    return os.path.basename(program).startswith("python")


def current_rank() -> int:
    """The rank from the launcher's environment, else torch.distributed's, else 0."""
    rank = global_rank()
    if rank is not None:
        return rank
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return int(dist.get_rank())
    return 0


def is_multiprocessing_child() -> bool:
    """True in a process `multiprocessing` started (spawn, forkserver, fork), also while it still
    imports its parent's main module, before `parent_process()` is set (`_inheriting`, the flag the
    standard library's own "bootstrapping phase" check reads). Such a process is not one of the job's
    ranks in its own right: a DataLoader worker, or a helper of the rank that started it."""
    multiprocessing = sys.modules.get("multiprocessing")
    if multiprocessing is None:  # nothing imported it: not a child it started
        return False
    if multiprocessing.parent_process() is not None:
        return True
    return bool(getattr(multiprocessing.current_process(), "_inheriting", False))
