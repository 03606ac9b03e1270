"""Grading on a Ray cluster: each submission is a Ray task.

``grade --cluster ADDRESS`` connects to a running Ray cluster (``ray start --head`` on one
machine, ``ray start --address=HEAD:6379`` on the others, or a KubeRay cluster) and sends
each submission to it as a task: a chapter notebook asks for one CPU, an assignment with
training cells graded in the ``gpu`` profile on CUDA for one GPU as well, so Ray places it
on a GPU machine. Every machine needs this repository at the same path, set up with
``make env`` (the task checks that its ``solutions/`` match the caller's, and refuses to
grade with other tests), and bubblewrap for the sandbox.

On the worker, the task grades as a local worker does (:mod:`autograder.workers`): its own
sandbox and kernel per notebook, the verdicts decided by the trusted judge in the task's
process, never in the kernel. It sends back its result (:class:`autograder.result.GradeResult`:
the row, the feedback pages, the autograded notebooks and each test cell's score), which the
caller records as it records every other runner's, so the results look as if graded here.

A task whose worker or machine dies is sent again (at most ``workers.MAX_ATTEMPTS`` times,
then the row says so); a row is written once, when its task's result arrives.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from . import scratch
from .result import failed
from .rows import Found, GradeRow
from .workers import KILL_ENV, MAX_ATTEMPTS

_node: dict = {}          # per Ray worker process: its graders and its sandbox id slot


# ====================================================================== on a worker machine

def _claim_slot() -> int:
    """A number no other grading process on this machine holds (a lock held for life), so
    that concurrent tasks' kernels run under distinct ids."""
    if "slot" not in _node:
        for number in range(1, 512):
            handle = open(Path(tempfile.gettempdir()) / f"course-grader-slot-{number}.lock", "a")
            try:
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                handle.close()
                continue
            _node["slot"], _node["slot_handle"] = number, handle
            break
        else:
            raise RuntimeError("no free grading slot on this machine")
    return _node["slot"]


def _node_grader(payload: dict):
    """This process's grader for the caller's solutions and settings (its course tree is
    generated once per assignment and kept for the next tasks)."""
    from .runlog import fingerprint

    solutions = Path(payload["solutions_dir"])
    key = (str(solutions), payload["solutions_fingerprint"], repr(payload["settings"]))
    if key not in _node:
        if not solutions.is_dir() or fingerprint(solutions) != payload["solutions_fingerprint"]:
            raise RuntimeError(f"{socket.gethostname()}: {solutions} is missing or differs from the caller's "
                               f"solutions/; update the course repository on this machine")
        out = scratch.folder("ray-grader-")
        grader = payload["grader_class"](solutions, out, payload["settings"])
        grader._open_tree([])
        grader.tree.worker, grader.tree.threads = _claim_slot(), payload["threads"]
        _node[key] = (grader, set())
    grader, generated = _node[key]
    if payload["assignment"] not in generated:
        grader.tree.generate(payload["assignment"])
        generated.add(payload["assignment"])
    return grader


def grade_task(payload: dict):
    """Grade one submission on this machine: its :class:`~autograder.result.GradeResult`."""
    student, assignment, sid = payload["student"], payload["assignment"], payload["sid"]
    if payload["attempt"] == 0 and payload.get("kill") == f"{student}/{assignment}":
        os.kill(os.getpid(), signal.SIGKILL)        # testing hook: a worker that dies mid-task
    from .coursetree import thread_environment

    os.environ.update(thread_environment(payload["threads"]))
    grader = _node_grader(payload)
    folder = scratch.folder("ray-sub-") / assignment
    folder.mkdir()
    try:
        for name, (kind, content) in payload["files"].items():
            if kind == "link":
                (folder / name).symlink_to(content)
            else:
                (folder / name).write_bytes(content)
        return grader.grade_submission(Found(student, assignment, folder=folder), sid)
    finally:
        shutil.rmtree(folder.parent, ignore_errors=True)


# ====================================================================== on the caller

def _files(folder: Path) -> dict[str, tuple[str, object]]:
    """The submission's notebooks as sent: bytes, or a link's target (never followed)."""
    files = {}
    for path in sorted(Path(folder).iterdir(), key=lambda p: p.name):
        if path.suffix != ".ipynb":
            continue
        if path.is_symlink():
            files[path.name] = ("link", os.readlink(path))
        elif path.is_file():
            files[path.name] = ("file", path.read_bytes())
    return files


def _needs_gpu(grader, assignment: str) -> bool:
    """An assignment that trains models, graded in the gpu profile on CUDA."""
    from . import contract
    from .contract import Role

    settings = grader.settings
    if settings.profile != "gpu" or not settings.device.startswith("cuda"):
        return False
    for notebook in grader.tree.notebooks(assignment):
        released = contract.read(grader.tree.release_path(assignment, notebook))
        if any(contract.role(cell) is Role.TRAINING for cell in released.cells):
            return True
    return False


def grade_on_cluster(grader, tasks: list, address: str) -> Iterator[tuple[object, object, object]]:
    """Yield ``(found, sid, result)`` for each ``(found, sid)`` of ``tasks`` as the cluster
    finishes them; the caller records each result."""
    import ray
    from ray.exceptions import RayTaskError

    from .runlog import fingerprint

    settings = dataclasses.replace(grader.settings, seed=grader.tree.api.config.CourseExecute.grading_seed)
    common = {"solutions_dir": str(grader.solutions_dir.resolve()), "settings": settings,
              "grader_class": type(grader),     # built where the task runs: this module needs no grader
              "solutions_fingerprint": fingerprint(grader.solutions_dir), "threads": 1,
              "kill": os.environ.get(KILL_ENV)}
    ray.init(address=address, logging_level="ERROR", log_to_driver=False, configure_logging=False)
    task = ray.remote(max_retries=0)(grade_task)
    pending: dict = {}

    def submit(found, sid: str, attempt: int) -> None:
        gpus = 1 if _needs_gpu(grader, found.assignment) else 0
        payload = {**common, "student": found.student, "assignment": found.assignment, "sid": sid,
                   "attempt": attempt, "files": _files(found.folder)}
        pending[task.options(num_cpus=1, num_gpus=gpus).remote(payload)] = (found, sid, attempt)

    try:
        for found, sid in tasks:
            submit(found, sid, 0)
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            found, sid, attempt = pending.pop(ready[0])
            try:
                result = ray.get(ready[0])
            except RayTaskError as err:     # the grader itself failed there: as a local failure
                yield found, sid, failed(GradeRow(
                    found.student, found.assignment, 0.0, grader._safe_max(found.assignment), status="broken",
                    notes=[f"the grader failed on a cluster worker: {str(err).strip().splitlines()[-1][:300]}"]))
                continue
            except ray.exceptions.RayError:   # the worker or its machine died: send it again
                if attempt + 1 < MAX_ATTEMPTS:
                    submit(found, sid, attempt + 1)
                    continue
                yield found, sid, failed(GradeRow(
                    found.student, found.assignment, 0.0, grader._safe_max(found.assignment), status="broken",
                    notes=[f"the cluster worker died {MAX_ATTEMPTS} times while grading this submission"]))
                continue
            yield found, sid, result
    finally:
        for ref in pending:
            ray.cancel(ref, force=True)
        ray.shutdown()


# ====================================================================== a cluster for tests

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def local_cluster(folder: Path, workers: int = 2) -> Iterator[str]:
    """A real Ray cluster on this machine with ``workers`` CPUs (for tests and benchmarks);
    its address. Stopped, with every process it started, on exit."""
    port = _free_port()
    temp = Path(tempfile.mkdtemp(prefix="ray-", dir="/tmp"))      # Ray's sockets need a short path
    Path(folder).mkdir(parents=True, exist_ok=True)
    log = open(Path(folder) / "ray-head.log", "ab")
    ray_cli = str(Path(sys.executable).parent / "ray")
    head = subprocess.Popen([ray_cli, "start", "--head", "--block", f"--port={port}", f"--num-cpus={workers}",
                             "--num-gpus=0", "--include-dashboard=false", "--disable-usage-stats",
                             f"--temp-dir={temp}"], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    address = f"127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            if head.poll() is not None:
                raise RuntimeError(f"ray start failed; see {Path(folder) / 'ray-head.log'}")
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError("the Ray head did not start within 120 s")
            time.sleep(0.5)
        time.sleep(2)     # the raylet registers just after the head's port opens
        yield address
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(head.pid, signal.SIGTERM)
        try:
            head.wait(timeout=30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(head.pid, signal.SIGKILL)
        _kill_leftovers(temp)
        log.close()
        shutil.rmtree(temp, ignore_errors=True)


def _kill_leftovers(temp: Path) -> None:
    """Ray's own processes started for this cluster (they name its temp folder)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if str(temp).encode() in cmdline:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(entry), signal.SIGKILL)
