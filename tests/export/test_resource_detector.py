"""Rank identity as a resource detector: every launcher's variables, and the SDK finding it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from installed_metadata import subprocess_env, write_dist_info

from hp_otel.common import launcher_env
from hp_otel.export.providers import build_resource
from hp_otel.export.resource_detector import rank_attributes

pytestmark = pytest.mark.torch_free  # needs no torch: not rerun on torch 2.14.1 (tests/support/markers.py)

RANK_KEYS = ("hp_otel.rank", "hp_otel.local_rank", "hp_otel.world.size", "hp_otel.run.id")

# What each launcher puts in a worker's environment (rank 3 of 8, local rank 1), and what must come out.
LAUNCHERS = {
    "torchrun": (
        {"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "TORCHELASTIC_RUN_ID": "elastic-42"},
        (3, 1, 8, "elastic-42"),
    ),
    "torchrun, static rendezvous (run id none)": (
        {"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "TORCHELASTIC_RUN_ID": "none"}
        | {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"},
        (3, 1, 8, launcher_env.run_id({"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"})),
    ),
    "srun (SLURM)": (
        {"SLURM_PROCID": "3", "SLURM_LOCALID": "1", "SLURM_NTASKS": "8", "SLURM_JOB_ID": "918", "SLURM_STEP_ID": "0"},
        (3, 1, 8, "slurm-918.0"),
    ),
    "srun torchrun (torchrun's rank wins over the SLURM task)": (
        {"SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NTASKS": "2", "SLURM_JOB_ID": "918"}
        | {"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "8"},
        (3, 1, 8, "slurm-918"),
    ),
    "mpirun (Open MPI 5)": (
        {"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_SIZE": "8"}
        | {"PMIX_NAMESPACE": "prterun-node1-4242@1"},
        (3, 1, 8, "mpi-prterun-node1-4242@1"),
    ),
    "mpirun (Open MPI 4)": (
        {"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_SIZE": "8"}
        | {"OMPI_MCA_orte_ess_jobid": "3141"},
        (3, 1, 8, "mpi-3141"),
    ),
    "msrun (MindSpore)": (
        {"MS_NODE_ID": "3", "DEVICE_ID": "1", "MS_WORKER_NUM": "8"}
        | {"MS_SCHED_HOST": "10.0.0.2", "MS_SCHED_PORT": "8118"},
        (3, 1, 8, launcher_env.run_id({"MS_SCHED_HOST": "10.0.0.2", "MS_SCHED_PORT": "8118"})),
    ),
    "Kubeflow PyTorchJob (one process per pod)": (
        {"RANK": "3", "WORLD_SIZE": "8", "MASTER_ADDR": "job-master-0", "MASTER_PORT": "23456"},
        (3, None, 8, launcher_env.run_id({"MASTER_ADDR": "job-master-0", "MASTER_PORT": "23456"})),
    ),
    "Kubeflow Trainer (torchrun from PET_ variables)": (
        {"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "TORCHELASTIC_RUN_ID": "none"}
        | {"PET_MASTER_ADDR": "train-node-0-0.train", "PET_MASTER_PORT": "29400"},
        (3, 1, 8, launcher_env.run_id({"PET_MASTER_ADDR": "train-node-0-0.train", "PET_MASTER_PORT": "29400"})),
    ),
}


@pytest.mark.parametrize("launcher", list(LAUNCHERS))
def test_each_launcher_s_variables_give_rank_local_rank_world_size_and_run_id(launcher) -> None:
    environ, expected = LAUNCHERS[launcher]
    attrs = rank_attributes(environ)
    assert tuple(attrs.get(key) for key in RANK_KEYS) == expected
    assert expected[3] is not None and expected[3].strip()  # every launcher gives a run id
    assert isinstance(attrs["process.pid"], int) and attrs["host.name"]


def test_run_ids_differ_between_jobs_and_agree_between_ranks() -> None:
    jobs = [launcher_env.run_id(env) for env, _ in LAUNCHERS.values()]
    assert len(set(jobs)) == len(jobs)
    for environ, _ in LAUNCHERS.values():
        other_rank = {**environ, "RANK": "5", "SLURM_PROCID": "5", "OMPI_COMM_WORLD_RANK": "5", "MS_NODE_ID": "5"}
        assert launcher_env.run_id(other_rank) == launcher_env.run_id(environ)


def test_nothing_set_leaves_the_rank_keys_out() -> None:
    assert not set(RANK_KEYS) & set(rank_attributes({}))


@pytest.mark.parametrize(
    ("argv", "launcher"),
    [
        (["/v/bin/python3", "/v/bin/torchrun", "--nproc-per-node", "2", "train.py"], True),
        (["/v/bin/torchrun", "--nproc-per-node", "2", "train.py"], True),
        (["python", "-u", "-m", "torch.distributed.run", "train.py"], True),
        (["python", "-X", "dev", "-m", "torch.distributed.launch", "train.py"], True),
        (["/usr/bin/python3", "/opt/ms/bin/msrun", "--worker_num", "2", "train.py"], True),
        (["/v/bin/python3", "-u", "train.py", "--local-rank", "0"], False),  # a rank torchrun started
        (["python", "train.py", "-m", "torchrun"], False),  # the script's own arguments
        (["python", "-c", "import torchrun"], False),
        (["python"], False),
    ],
)
def test_launcher_processes_are_told_from_the_ranks_they_start(argv, launcher) -> None:
    assert launcher_env.is_launcher_process(argv) is launcher


def test_our_providers_use_the_detector_and_otel_resource_attributes_win(monkeypatch) -> None:
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "HP_OTEL_RUN_ID", "TORCHELASTIC_RUN_ID", "OTEL_SERVICE_NAME"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("SLURM_PROCID", "6")
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "hp_otel.world.size=99,service.name=trainer")
    attrs = build_resource().attributes
    assert (attrs["hp_otel.rank"], attrs["hp_otel.run.id"]) == (6, "slurm-77")
    assert (attrs["hp_otel.world.size"], attrs["service.name"]) == ("99", "trainer")  # the user's variable wins
    assert build_resource({"hp_otel.run.id": "explicit"}).attributes["hp_otel.run.id"] == "explicit"


_SDK_RESOURCE = """
import json
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
created, provider = Resource.create().attributes, TracerProvider().resource.attributes
print(json.dumps({"create": dict(created), "provider": dict(provider)}))
"""


@pytest.mark.parametrize("detectors", ["hp_otel", "*"])
def test_the_sdk_finds_the_detector_by_its_entry_point_for_a_users_own_provider(tmp_path, detectors) -> None:
    """A provider hp_otel did not make (the SDK's defaults) carries the ranks when the variable names hp_otel."""
    dist = write_dist_info(tmp_path)
    launch = {"SLURM_PROCID": "5", "SLURM_LOCALID": "1", "SLURM_NTASKS": "8", "SLURM_JOB_ID": "31"}
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "HP_OTEL_RUN_ID", "TORCHELASTIC_RUN_ID"):
        launch[key] = ""
    results = {}
    for name, value in (("on", detectors), ("off", "")):
        env = subprocess_env(dist, OTEL_EXPERIMENTAL_RESOURCE_DETECTORS=value, **launch)
        out = subprocess.run([sys.executable, "-c", _SDK_RESOURCE], env=env, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        results[name] = json.loads(out.stdout.strip().splitlines()[-1])
    for where in ("create", "provider"):
        on = results["on"][where]
        assert (on["hp_otel.rank"], on["hp_otel.local_rank"], on["hp_otel.world.size"], on["hp_otel.run.id"]) == (
            5,
            1,
            8,
            "slurm-31",
        )
        assert not set(RANK_KEYS) & set(results["off"][where])  # the control: without it, no ranks
