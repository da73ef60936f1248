"""`python -m benchmarks --instructions`: instructions per step under valgrind's callgrind, the steady figure.

Wall clock on a shared machine drifts 0.5-2 % between identical blocks; the instructions
a step executes repeat within ±0.2 % whatever else runs. Each variant runs in its own
process under `valgrind --tool=callgrind --instr-atstart=no`: it builds the workload, warms
up (a first window, then a dozen steps of the variant: imports, kernel registration and
CPython's specialisation happen there), and switches instrumentation on around the counted
steps only, with the garbage collector off (its pauses land on random steps). Work a
step leaves to another thread (a batch processor's export) is done after each step by the
variant's `drain`: that thread wakes by wall time, which callgrind's slowdown makes random.

The switch is a callgrind client request, a magic instruction sequence only C can emit:
a tiny C library (CLIENT_SOURCE), built at first use with the system C compiler into
a cache folder and loaded with ctypes in the child. Nothing here runs at import.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from benchmarks.variants import UNTRACED
from hp_otel.common.cache_dir import cache_folder

DEFAULT_STEPS = 10  # callgrind runs the step ≈50x slower: few counted steps (they repeat exactly)
WARM_UP_STEPS = 12  # CPython specialises code after about 8 runs: count after that
DUMP_LABEL = "hp_otel counted steps"
CLIENT_SOURCE = f"""\
#include <valgrind/callgrind.h>
void hp_otel_cg_start(void) {{ CALLGRIND_ZERO_STATS; CALLGRIND_START_INSTRUMENTATION; }}
void hp_otel_cg_stop(void) {{ CALLGRIND_STOP_INSTRUMENTATION; CALLGRIND_DUMP_STATS_AT("{DUMP_LABEL}"); }}
"""


class ToolMissing(RuntimeError):
    """valgrind, a C compiler or callgrind's header is missing: the message says which and what to install."""


@dataclass(frozen=True)
class InstructionCount:
    """One variant's instructions per counted step, and its ratio to untraced's."""

    ir_per_step: float
    ratio: float | None  # None when untraced was not counted
    steps: int


@dataclass(frozen=True)
class Tools:
    valgrind: str
    library: Path  # the client-request library


def find_valgrind() -> str:
    path = shutil.which("valgrind")
    if path is None:
        raise ToolMissing("valgrind is not on PATH (Debian/Ubuntu: apt-get install valgrind)")
    return path


def find_c_compiler() -> str:
    """$CC if set, else the first of cc, gcc, clang on PATH."""
    names = [os.environ["CC"]] if os.environ.get("CC") else ["cc", "gcc", "clang"]
    for name in names:
        path = shutil.which(name)
        if path is not None:
            return path
    raise ToolMissing(
        f"no C compiler ({' or '.join(names)}) on PATH to build callgrind's client requests "
        "(Debian/Ubuntu: apt-get install gcc)"
    )


def client_library(compiler: str | None = None, folder: Path | None = None) -> Path:
    """The client-request library, built on first use (named after its source and compiler, so
    a change of either builds it again); a cache folder that cannot be written falls back to
    a temporary one."""
    compiler = compiler or find_c_compiler()
    key = hashlib.sha256(f"{compiler}\n{CLIENT_SOURCE}".encode()).hexdigest()[:16]
    for place in (folder or cache_folder(), Path(tempfile.gettempdir()) / f"hp_otel-{os.getuid()}"):
        library = place / f"callgrind_requests-{key}.so"
        if library.is_file():
            return library
        try:
            place.mkdir(parents=True, exist_ok=True)
            return _build(compiler, library)
        except PermissionError:
            continue
    raise ToolMissing(f"cannot write the callgrind client library into {folder or cache_folder()} nor a temp folder")


def _build(compiler: str, library: Path) -> Path:
    with tempfile.TemporaryDirectory(dir=library.parent) as work:
        source = Path(work) / "callgrind_requests.c"
        source.write_text(CLIENT_SOURCE)
        built = Path(work) / library.name
        done = subprocess.run(
            [compiler, "-shared", "-fPIC", "-O1", "-o", str(built), str(source)],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            if "callgrind.h" in done.stderr:
                raise ToolMissing(
                    f"{compiler} cannot find valgrind/callgrind.h (Debian/Ubuntu: apt-get install valgrind; "
                    "Fedora: valgrind-devel)"
                )
            first = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[0]
            raise ToolMissing(f"{compiler} failed to build the callgrind client library: {first}")
        os.replace(built, library)  # atomic: a parallel build of the same file is harmless
    return library


def find_tools(folder: Path | None = None) -> Tools:
    """valgrind and the built client library, or ToolMissing saying which is missing."""
    valgrind = find_valgrind()
    return Tools(valgrind, client_library(folder=folder))


def read_counted_total(folder: Path) -> int:
    """Instructions in the callgrind dump labelled DUMP_LABEL among the files in `folder`."""
    for path in sorted(folder.iterdir()):
        lines = path.read_text(errors="replace").splitlines()
        if f"desc: Trigger: Client Request: {DUMP_LABEL}" not in lines:
            continue
        for line in reversed(lines):
            if line.startswith(("totals:", "summary:")):
                return int(line.split()[1])
    raise RuntimeError(f"no callgrind dump labelled {DUMP_LABEL!r} in {folder}")


def count_variant(workload: str, variant: str, steps: int, tools: Tools) -> int:
    """Instructions in `steps` counted steps of `variant` on `workload`, in a child under callgrind."""
    package_root = str(Path(__file__).resolve().parents[1])  # the checkout: `benchmarks` and `hp_otel`
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    env["PYTHONHASHSEED"] = "0"  # the same dict layouts every run
    env.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    with tempfile.TemporaryDirectory(prefix="hp_otel-callgrind-") as work:
        done = subprocess.run(
            [
                tools.valgrind,
                "--tool=callgrind",
                "--instr-atstart=no",
                f"--callgrind-out-file={work}/callgrind.out.%p",
                sys.executable,
                "-m",
                "benchmarks.instructions",
                workload,
                variant,
                str(steps),
                str(tools.library),
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            said = [line for line in done.stderr.splitlines() if line.strip() and not line.startswith("==")]
            raise RuntimeError(
                f"{workload}/{variant} under callgrind exited with {done.returncode}: {' | '.join(said[-3:])}"
            )
        return read_counted_total(Path(work))


def count_variants(
    workload: str,
    variants: Sequence[str],
    steps: int = DEFAULT_STEPS,
    jobs: int = 1,
    progress: Callable[[str], None] = lambda message: None,
    tools: Tools | None = None,
) -> dict[str, InstructionCount]:
    """Each variant's instructions per step, `jobs` children at a time (counts do not depend on
    what else runs), with ratios to "untraced" when it is among `variants`."""
    tools = tools or find_tools()
    progress(
        f"{workload}: counting instructions of {len(variants)} variants under callgrind, "
        f"{steps} steps each, {jobs} at a time (each about a minute or more: valgrind is ≈50x slower)"
    )
    totals: dict[str, int] = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = {pool.submit(count_variant, workload, name, steps, tools): name for name in variants}
        for future in concurrent.futures.as_completed(futures):
            name = futures[future]
            totals[name] = future.result()
            progress(f"{workload}: {name}: {totals[name] / steps / 1e6:.3f} MIr/step")
    base = totals.get(UNTRACED)
    return {
        name: InstructionCount(totals[name] / steps, totals[name] / base if base else None, steps) for name in variants
    }


def _counted_child(workload_name: str, variant_name: str, steps: int, library: str) -> int:
    """The child's body, run under callgrind: warm up, then count `steps` steps of the variant."""
    import ctypes
    import gc
    import warnings

    requests = ctypes.CDLL(library)
    warnings.filterwarnings("ignore", message="Full backward hook is firing", category=UserWarning)
    import hp_otel
    from benchmarks.variants import build_variants
    from benchmarks.workloads import build_workload

    workload = build_workload(workload_name)
    variants, skipped = build_variants(workload.model)
    chosen = [v for v in variants if v.name == variant_name]
    if not chosen:
        reason = skipped.get(variant_name, f"unknown; known: {[v.name for v in variants]}")
        print(f"variant {variant_name!r}: {reason}", file=sys.stderr)
        return 3
    variant = chosen[0]
    with hp_otel.CommDebugMode(module=workload.model):  # dynamo's import, kernel registration
        workload.step()
    with variant.around_block():
        for _ in range(WARM_UP_STEPS):
            with variant.step_context():
                workload.step()
            variant.drain()
        gc.collect()
        gc.disable()
        try:
            requests.hp_otel_cg_start()
            for _ in range(steps):
                with variant.step_context():
                    workload.step()
                variant.drain()  # what the step left to another thread, counted in it every run
            requests.hp_otel_cg_stop()
        finally:
            gc.enable()
    return 0


if __name__ == "__main__":  # the child: WORKLOAD VARIANT STEPS LIBRARY
    sys.exit(_counted_child(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]))
