"""Reading N ranks' Flight Recorder dumps: `hp-otel ranks` against torch's own `fr_trace`, same files.

    python -m benchmarks.flight_recorder 4096 [--entries 200] [--folder DIR]

Writes N pickle dumps shaped as torch 2.13's gloo dumps are (version 2.10, one world-sized group,
`entries` all-reduces of a [4, 8] float tensor, 11 frames each: torch's, the user's, the
interpreter's), then runs each reader once as a child and prints its CPU time (user + system) and
peak RSS. All-reduces only: their sizes agree at any world size, so `fr_trace` runs its whole
matching instead of stopping at "too many mismatches".
"""

from __future__ import annotations

import argparse
import os
import pickle
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PREFIX = "fr_trace_rank_"
_SITE = "/venv/lib/python3.11/site-packages"
_PYTHON = "/usr/lib/python3.11"
_FRAMES = [  # innermost first, as a 2-rank gloo run under torch.multiprocessing.spawn wrote them
    ("all_reduce", f"{_SITE}/torch/distributed/distributed_c10d.py", 3245),
    ("wrapper", f"{_SITE}/torch/distributed/c10d_logger.py", 83),
    ("forward", "/home/user/train/model.py", 51),
    ("_call_impl", f"{_SITE}/torch/nn/modules/module.py", 1786),
    ("_wrapped_call_impl", f"{_SITE}/torch/nn/modules/module.py", 1775),
    ("train_step", "/home/user/train/loop.py", 88),
    ("main", "/home/user/train/loop.py", 120),
    ("_wrap", f"{_SITE}/torch/multiprocessing/spawn.py", 87),
    ("run", f"{_PYTHON}/multiprocessing/process.py", 108),
    ("_bootstrap", f"{_PYTHON}/multiprocessing/process.py", 314),
    ("<module>", "<string>", 1),
]


def dump(rank: int, world_size: int, entries: int) -> dict[str, object]:
    """One rank's dump: `entries` retired all-reduces on the default group of `world_size` ranks."""
    return {
        "version": "2.10",
        "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": str(list(range(world_size)))}},
        "comm_lib_version": "",
        "pg_status": {"0": {"last_enqueued_collective": entries, "last_started_collective": -1,
                            "last_completed_collective": entries}},
        "rank": rank,
        "entries": [
            {
                "frames": [{"name": name, "filename": file, "line": line} for name, file, line in _FRAMES],
                "record_id": i, "pg_id": 0, "process_group": ("0", "default_pg"), "thread_name": "python",
                "thread_id": "139681358142336", "collective_seq_id": i + 1, "p2p_seq_id": 0, "op_id": i + 1,
                "profiling_name": "gloo:all_reduce", "time_created_ns": 1_796_524_238_444_958_355 + i * 1_000_000,
                "input_sizes": [[4, 8]], "input_dtypes": ["Float"], "output_sizes": [[4, 8]],
                "output_dtypes": ["Float"], "state": "scheduled", "time_discovered_started_ns": None,
                "time_discovered_completed_ns": None, "retired": True, "timeout_ms": 1_800_000, "is_p2p": False,
            }
            for i in range(entries)
        ],
    }  # fmt: skip


def write_dumps(folder: Path, world_size: int, entries: int) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for rank in range(world_size):
        path = folder / f"{PREFIX}{rank}"
        path.write_bytes(pickle.dumps(dump(rank, world_size, entries)))
        paths.append(path)
    return paths


def measure(command: list[str]) -> tuple[float, float, float]:
    """(CPU seconds, wall seconds, peak RSS MiB) of one child run to its end."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if done.returncode != 0:  # the dumps agree: `ranks` exits 0, as `fr_trace` does
        raise SystemExit(f"{command[0]} exited {done.returncode}: {done.stderr[-2000:]}")
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, wall, after.ru_maxrss / 1024  # the largest child so far (Linux: kB)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.flight_recorder", description=__doc__.split("\n")[0])
    parser.add_argument("ranks", type=int, help="how many ranks' dumps to write and read")
    parser.add_argument("--entries", type=int, default=200, help="entries a dump holds (default 200)")
    parser.add_argument("--folder", type=Path, help="where to write the dumps (default: a temporary folder)")
    args = parser.parse_args(argv)
    folder = args.folder or Path(tempfile.mkdtemp(prefix="hp_otel_fr_"))
    paths = write_dumps(folder, args.ranks, args.entries)
    size = sum(p.stat().st_size for p in paths)
    print(f"{args.ranks:,} dumps of {args.entries} entries in {folder} ({size / 2**20:.0f} MiB)")
    hp_otel = os.path.join(os.path.dirname(sys.executable), "hp-otel")
    runs = {  # hp_otel's peak is measured first: RUSAGE_CHILDREN keeps the largest child seen
        "hp-otel ranks --jobs 1": [hp_otel, "ranks", "--jobs", "1", str(folder)],
        "torch fr_trace": [sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", str(folder)],
    }
    for name, command in runs.items():
        cpu, wall, peak = measure(command)
        print(f"  {name}: {cpu:.1f} s CPU ({cpu / args.ranks * 1e3:.1f} ms a rank), {wall:.1f} s wall, "
              f"peak RSS {peak:.0f} MiB (largest child so far)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
