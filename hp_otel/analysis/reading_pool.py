"""Reading thousands of rank files on every core, holding one compact table per rank.

Each worker process reads and decodes one file at a time (`flight_recorder.read_any_rank_file`)
and sends back its `RankFile`: typed arrays and the few kinds of call it holds.  The parent
interns the kinds (`KindInterner`), so what it keeps grows with the calls, not with the
strings and tuples of every file.  Workers are forked from a parent that runs one thread
(the `hp-otel` command: nothing to import again); from one that runs more (a test, a
notebook), where forking can deadlock, they come from a forkserver.  A pool whose workers
die (a parent that cannot be re-imported) raises instead of starting new ones forever.

There are never more workers than cores (`workers`: more only add memory, the reading is CPU
work), and none outlives the reading: on an error or Ctrl-C they are stopped before it
propagates, and each one ends with its parent however the parent ends (SIGKILL too: Linux's
parent-death signal, `_end_with_parent`).
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import gc
import multiprocessing
import os
import signal
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor

from hp_otel.analysis.call_table import KindInterner
from hp_otel.analysis.flight_recorder import read_any_rank_file
from hp_otel.analysis.reading import RankFile

_FILES_PER_TASK = 4  # a task per file would cost more in messages than a 1 MB file costs to read


def default_jobs() -> int:
    """The cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


MAX_JOBS = 1024  # the most `--jobs` accepts; what runs is also capped at the cores (`workers`)


def workers(jobs: int, files: int) -> int:
    """How many processes read `files` files when `jobs` are asked for: never more than the cores."""
    return max(1, min(jobs, default_jobs(), files))


def _end_with_parent() -> None:
    """A worker's initializer: SIGKILL it when its parent ends (Linux `PR_SET_PDEATHSIG`), so a parent
    killed mid-read leaves no orphan. Elsewhere nothing: the pool's own shutdown then has to do."""
    with contextlib.suppress(AttributeError, OSError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # 1: PR_SET_PDEATHSIG
    if os.getppid() == 1:  # the parent ended before the signal was asked for
        os._exit(1)


def _stop(pool: ProcessPoolExecutor) -> None:
    """Stop the pool now (an error, Ctrl-C): drop the queued files and end the workers, reaped."""
    processes = list((getattr(pool, "_processes", None) or {}).values())  # stdlib-private: {pid: process}
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        with contextlib.suppress(Exception):
            process.terminate()
    for process in processes:
        with contextlib.suppress(Exception):
            process.join(5)


def read_one(path: str, by_module: bool = True) -> RankFile:
    """One rank's file, with its exposure per module only if `by_module`.

    The collector is paused meanwhile (as torch's `fr_trace` does): a decoded file is acyclic
    plain data, so the passes its thousands of new containers would trigger find nothing."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return read_any_rank_file(path, by_module)
    finally:
        if was_enabled:
            gc.enable()


def _read_task(task: tuple[str, bool]) -> RankFile:
    return read_one(*task)


def read_rank_files(
    paths: Sequence[str], jobs: int = 1, on_read: Callable[[int, int], None] | None = None, by_module: bool = True
) -> list[RankFile]:
    """The files' `RankFile`s, in the order given; `on_read(done, total)` after each file."""
    intern = KindInterner()
    total = len(paths)
    out: list[RankFile] = []

    def keep(f: RankFile) -> None:
        out.append(dataclasses.replace(f, calls=intern(f.calls)))
        if on_read is not None:
            on_read(len(out), total)

    if workers(jobs, total) <= 1 or total <= _FILES_PER_TASK:  # a pool costs more than reading a few files here
        for path in paths:
            keep(read_one(path, by_module))
        return out
    if threading.active_count() == 1:
        context = multiprocessing.get_context("fork")
    else:
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(["hp_otel.analysis.reading_pool"])
    pool = ProcessPoolExecutor(workers(jobs, total), mp_context=context, initializer=_end_with_parent)
    try:
        for f in pool.map(_read_task, [(p, by_module) for p in paths], chunksize=_FILES_PER_TASK):
            keep(f)
    except BaseException:
        _stop(pool)
        raise
    pool.shutdown(wait=True)
    return out
