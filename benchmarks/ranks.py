"""`python -m benchmarks --ranks N`: `hp-otel ranks` on N ranks' files of the llama step, with faults planted.

Makes the files (`rank_files`: the step recorded once, re-keyed per rank of an
(N / tp) x tp mesh, a hang, a desync and a straggler planted), runs `hp-otel ranks --json`
on them as a child process, and prints its wall time, CPU per rank (the child and its
workers), the peak memory of the child's process tree (summed over its processes, sampled
every 20 ms) and whether each planted fault was named.  Figures depend on the machine and
its load: the command prints them, tests assert only the verdicts.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from benchmarks.rank_files import (
    PlantedFaults,
    check_mesh,
    plant_faults,
    record_template,
    split_template,
    write_rank_files,
)
from hp_otel.cli.progress import Progress, quiet
from hp_otel.common.input_files import read_json


@dataclass(frozen=True)
class RanksBenchResult:
    ranks: int
    tp: int
    evidence: str  # the files read: "spans" or "collectives"
    layout: str  # "mesh" (TP x DP groups) or "world" (one group of every rank)
    file_bytes: int  # rank 0's file
    make_s: float
    wall_s: float
    cpu_s: float
    peak_rss_bytes: int  # the ranks process tree, summed
    exit_status: int
    report_bytes: int
    faults: PlantedFaults
    found: dict[str, bool]

    @property
    def cpu_per_rank_ms(self) -> float:
        return self.cpu_s / self.ranks * 1e3


def _tree(pid: int, cpu: dict[int, float]) -> int:
    """Resident bytes of `pid` and every process under it; each one's CPU seconds so far into `cpu`
    (Linux /proc: a worker the child does not wait for is not in its rusage)."""
    total, stack = 0, [pid]
    ticks = os.sysconf("SC_CLK_TCK")
    while stack:
        p = stack.pop()
        try:
            with open(f"/proc/{p}/statm") as handle:
                total += int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
            with open(f"/proc/{p}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
            cpu[p] = max(cpu.get(p, 0.0), (int(fields[11]) + int(fields[12])) / ticks)  # utime + stime
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as handle:
                    stack.extend(int(c) for c in handle.read().split())
        except (OSError, ValueError, IndexError):
            continue
    return total


def run_ranks_command(paths: Sequence[str], jobs: int | None, out_path: str) -> tuple[float, float, int, int]:
    """`hp-otel ranks --json PATHS` in a child: (wall s, CPU s of it and its workers, peak tree RSS, exit status)."""
    command = [sys.executable, "-m", "hp_otel.cli", "ranks", "--json", *paths]
    if jobs is not None:
        command[4:4] = ["--jobs", str(jobs)]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    peak = [0]
    seen: dict[int, float] = {}
    started = time.perf_counter()
    with open(out_path, "w") as out:
        child = subprocess.Popen(command, stdout=out, stderr=subprocess.PIPE, text=True)

        def sample() -> None:
            while child.poll() is None:
                peak[0] = max(peak[0], _tree(child.pid, seen))
                time.sleep(0.02)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        _, err = child.communicate()
        sampler.join()
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    waited = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    # the child and what it waited for, or what was seen of its tree (workers it does not wait for)
    cpu = max(waited, sum(seen.values()))
    if child.returncode == 2:
        raise RuntimeError(f"hp-otel ranks refused its input: {err.strip()}")
    return wall, cpu, peak[0], child.returncode


def faults_found(report: dict[str, Any], faults: PlantedFaults) -> dict[str, bool]:
    """Did the report name each planted fault: the hanging rank, the desync's seq, the straggler first?"""
    hang = any(m["rank"] == faults.hang_rank for g in report["groups"] for m in g["missing"])
    desync = any(
        g["divergence"] is not None
        and g["divergence"]["seq"] == faults.desync_seq
        and faults.desync_rank in [c["rank"] for c in g["divergence"]["calls"]]
        for g in report["groups"]
    )
    straggler = bool(report["stragglers"]) and report["stragglers"][0]["rank"] == faults.straggler_rank
    return {"hang": hang, "desync": desync, "straggler": straggler}


def run_ranks_bench(
    ranks: int,
    tp: int = 8,
    jobs: int | None = None,
    out_dir: str | None = None,
    progress: Progress = quiet,
    evidence: str = "spans",
    layout: str = "mesh",
) -> RanksBenchResult:
    """Make the files under `out_dir` (default: a temporary folder, removed after) and time `hp-otel ranks`."""
    check_mesh(ranks, tp)
    with tempfile.TemporaryDirectory(prefix="hp_otel_ranks_") as scratch:
        folder = out_dir or scratch
        progress(f"recording the llama step (tp {tp})")
        started = time.perf_counter()
        template = split_template(record_template(tp), tp, layout)
        faults = plant_faults(ranks, tp, template.tp_seqs)
        progress(f"writing {ranks} ranks' files to {folder}")
        paths = write_rank_files(template, folder, ranks, faults, jobs or os.cpu_count() or 1, evidence)
        made = time.perf_counter() - started
        progress(f"hp-otel ranks on {ranks} files")
        report_path = os.path.join(scratch, "report.json")
        wall, cpu, peak, status = run_ranks_command(paths, jobs, report_path)
        report = read_json(report_path, "ranks report")
        return RanksBenchResult(
            ranks=ranks,
            tp=tp,
            evidence=evidence,
            layout=layout,
            file_bytes=os.path.getsize(paths[0]),
            make_s=made,
            wall_s=wall,
            cpu_s=cpu,
            peak_rss_bytes=peak,
            exit_status=status,
            report_bytes=os.path.getsize(report_path),
            faults=faults,
            found=faults_found(report, faults),
        )


def format_ranks_bench(result: RanksBenchResult) -> list[str]:
    f = result.faults
    named = ", ".join(f"{fault} {'named' if ok else 'NOT NAMED'}" for fault, ok in result.found.items())
    return [
        f"hp-otel ranks on {result.ranks} ranks' {result.evidence} files ({_layout(result)}, llama step, "
        f"{result.file_bytes / 1e6:.3f} MB a rank; files made in {result.make_s:.1f} s)",
        f"  wall {result.wall_s:.1f} s, CPU {result.cpu_s:.1f} s ({result.cpu_per_rank_ms:.1f} ms a rank), "
        f"peak RSS {result.peak_rss_bytes / 2**20:.0f} MiB (all its processes), exit status {result.exit_status}, "
        f"JSON report {result.report_bytes / 1e3:.0f} kB",
        f"  planted: hang rank {f.hang_rank}, desync rank {f.desync_rank} at seq {f.desync_seq}, straggler rank "
        f"{f.straggler_rank} ({f.late_ns / 1e6:.0f} ms late): {named}",
    ]


def _layout(result: RanksBenchResult) -> str:
    if result.layout == "world":
        return f"every collective on one group of {result.ranks} ranks"
    return f"{result.ranks // result.tp} x {result.tp} mesh"


def ranks_bench_json(result: RanksBenchResult) -> dict[str, Any]:
    return {**asdict(result), "cpu_per_rank_ms": result.cpu_per_rank_ms}
