"""Grading several submissions at once, each worker a process of its own.

The main process generates the nbgrader course tree once; each worker (forked from a fork
server that has imported the grader once, never from the main process, which holds threads
and sockets) grades whole submissions in a copy of that
tree of its own, with its own sandbox and kernel per notebook and its own trusted judge. A
pre-started kernel is never shared: every notebook still gets a fresh sandbox. Each result
comes back to the main process, the only one that writes ``--out``, the gradebook and
``grades.csv`` (:func:`autograder.result.record`), as each arrives; the CSV is sorted at the
end, so every score is that of one worker; only the order of the terminal lines differs.

Cores are shared out: each worker's kernels and judge get ``cores // workers`` threads.
As root, each kernel runs under a user id that no other live sandbox on the machine holds
(:mod:`autograder.sandbox_ids`), so one submission's processes never count against
another's process limit, in this run or in another.

A worker that dies (killed, out of memory) takes with it only the submissions it was
grading: they are graded again in a fresh pool, at most :data:`MAX_ATTEMPTS` times, then
reported ``broken``. Rows already written are never lost or repeated.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import signal
import threading
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

from .result import WORK_DIR, failed
from .rows import GradeRow

MAX_ATTEMPTS = 3
RUNNING_DIR = WORK_DIR      # in --out: which submission each live worker holds, and its own tree
# Testing hook: a worker kills itself (SIGKILL) the first time it starts this
# "student/assignment", to show that a dead worker loses no row.
KILL_ENV = "COURSE_GRADER_KILL_WORKER"

_grader = None      # the worker process's own Grader, grading in its own copy of the tree
_running: Path | None = None
_source: Path | None = None     # the tree the main process generated
_number = 0         # the worker's number
_threads = 1
_left = None        # the pool's count of notebooks no worker has taken yet (a shared integer)


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def _memory_gib() -> float:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / (1 << 30)
    except (ValueError, OSError, AttributeError):
        return 0.0


def default_workers(memory_gb: float) -> int:
    """One worker per core, fewer when each kernel's memory limit (plus about 1 GiB for the
    worker itself) would not fit in the machine's memory."""
    by_memory = int(_memory_gib() // (memory_gb + 1)) if _memory_gib() else cores()
    return max(1, min(cores(), by_memory))


def threads_per_worker(workers: int) -> int:
    """The cores shared out between the workers, or ``$COURSE_KERNEL_THREADS`` when set."""
    from .coursetree import threads_from_environment

    return threads_from_environment() or max(1, cores() // max(1, workers))


def _start_worker(make_grader, solutions_dir: Path, out: Path, settings, numbers, threads: int, left) -> None:
    """A worker's start: what every submission needs imported and set up. It runs while the
    main process still generates the course tree, which the first task then opens."""
    from .coursetree import thread_environment

    os.environ.update(thread_environment(threads))
    import torch

    torch.set_num_threads(threads)
    global _grader, _running, _number, _threads, _source, _left
    _running = Path(out) / RUNNING_DIR
    _running.mkdir(exist_ok=True)
    _grader = make_grader(solutions_dir, _running / str(os.getpid()), settings)
    _number, _threads, _source, _left = numbers.get(), threads, Path(out) / "nbgrader", left


def _grade_task(found, sid: str | None, attempt: int, assignments: list[str]):
    if _grader.tree is None:        # a copy of the tree the main process generated, made once
        _grader.attach_tree(assignments, _source, worker=_number, threads=_threads)
    marker = _running / f"{os.getpid()}.json"
    marker.write_text(json.dumps(list(found.key)), encoding="utf-8")
    if sid is not None:        # a kernel is started ahead only while some notebook has not been taken
        with _left.get_lock():
            _left.value -= 1
            _grader.follows = _left.value > 0
    if attempt == 0 and os.environ.get(KILL_ENV) == f"{found.student}/{found.assignment}":
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        return _grader.grade_submission(found, sid)
    finally:
        marker.unlink(missing_ok=True)


def _held_by_dead_workers(out: Path) -> set[tuple[str, str]]:
    """The submissions the workers of a broken pool were grading."""
    held = set()
    folder = Path(out) / RUNNING_DIR
    for marker in folder.glob("*.json"):
        try:
            held.add(tuple(json.loads(marker.read_text(encoding="utf-8"))))
        except (OSError, ValueError):
            pass
        marker.unlink(missing_ok=True)
    return held


def start_pool(grader, workers: int, count: int) -> ProcessPoolExecutor:
    """Workers for ``count`` submissions (at most ``workers``), started now: they import and
    set up while the main process generates the course tree."""
    context = multiprocessing.get_context("forkserver")
    # The server imports PyTorch (with the judge), nbgrader and the grader once; each worker
    # is a fork of it, not a fresh interpreter that imports them again, and it ends without
    # tearing the interpreter down (~2.7 + 0.8 s of CPU a worker: benchmarks/process_costs.py).
    # No-op once the server runs. The main process, which judges nothing, imports no PyTorch.
    context.set_forkserver_preload(["autograder.grade", "autograder.remote"])
    numbers = context.Queue()
    for number in range(workers):
        numbers.put(number)
    size = max(1, min(workers, count))
    left = context.Value("i", count)      # notebooks no worker has taken yet
    pool = ProcessPoolExecutor(max_workers=size, mp_context=context, initializer=_start_worker,
                               initargs=(type(grader), grader.solutions_dir, grader.out, grader.settings, numbers,
                                         threads_per_worker(workers), left))
    # A pool starts a process for each task it is given: one each now, from a thread, as the
    # first waits until the fork server has imported the grader (3 s in which this process
    # runs the preflight and generates the course tree).
    threading.Thread(target=_start_processes, args=(pool, size), daemon=True).start()
    return pool


def _start_processes(pool: ProcessPoolExecutor, size: int) -> None:
    try:
        for _ in range(size):
            pool.submit(_ready)
    except RuntimeError:        # shut down before they started: the run stopped (a preflight failed)
        pass


def _ready() -> None:
    """Nothing: a task that makes the pool start a worker (see start_pool)."""


def grade_in_parallel(grader, tasks: list, workers: int,
                      pool: ProcessPoolExecutor | None = None) -> Iterator[tuple[object, object, object]]:
    """Yield ``(found, sid, result)`` for each ``(found, sid)`` of ``tasks`` as workers finish
    them (in ``pool`` if one was started early; a fresh pool after a worker died)."""

    attempts: dict[tuple[str, str], int] = {}
    queue = list(tasks)
    assignments = sorted({found.assignment for found, _ in tasks})
    while queue:
        pool = pool or start_pool(grader, workers, sum(1 for _, sid in queue if sid is not None))
        futures = {pool.submit(_grade_task, found, sid, attempts.get(found.key, 0), assignments): (found, sid)
                   for found, sid in queue}
        queue, broken, finished = [], False, False
        try:
            pending = set(futures)
            while pending:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for future in done:
                    found, sid = futures[future]
                    try:
                        result = future.result()
                    except BrokenProcessPool:
                        broken = True
                        queue.append((found, sid))
                        continue
                    except Exception as err:   # the worker could not start: grade nothing in it
                        result = failed(GradeRow(found.student, found.assignment, 0.0,
                                                 grader._safe_max(found.assignment), status="broken",
                                                 notes=[f"the grading worker failed: "
                                                        f"{type(err).__name__}: {str(err)[:300]}"]))
                    yield found, sid, result
            finished = True
        finally:
            _shutdown(pool, now=broken or not finished)
            pool = None
        if broken:
            held = _held_by_dead_workers(grader.out)
            for found, sid in list(queue):
                if found.key not in held:
                    continue
                attempts[found.key] = attempts.get(found.key, 0) + 1
                if attempts[found.key] >= MAX_ATTEMPTS:
                    queue.remove((found, sid))
                    yield found, sid, failed(GradeRow(
                        found.student, found.assignment, 0.0, grader._safe_max(found.assignment), status="broken",
                        notes=[f"the grading worker died {MAX_ATTEMPTS} times while grading this submission"]))
    shutil.rmtree(Path(grader.out) / RUNNING_DIR, ignore_errors=True)


def _shutdown(pool: ProcessPoolExecutor, now: bool) -> None:
    """Stop a pool; ``now`` (an error, an interrupt, a broken pool): without waiting for
    its workers, whose sandboxes die with them (bubblewrap's --die-with-parent)."""
    if not now:
        pool.shutdown(wait=True)
        return
    processes = list((getattr(pool, "_processes", None) or {}).values())   # no public handle on them
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        if process.is_alive():
            process.kill()
