"""Nothing shared between two sandboxes, in one grading run or in two: process allowance,
locks, disk. Real bubblewrap; the second run is a second Python process."""

from __future__ import annotations

import asyncio
import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import course
from autograder import sandbox_filter, sandbox_ids
from autograder.sandbox import Limits, Sandbox, available
from kernel_tools import run_in_kernel

pytestmark = [pytest.mark.slow,   # real sandboxes and kernels
              pytest.mark.skipif(not available(), reason="bubblewrap is not usable here")]
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="ids of their own and bounded files need root")

COURSE = Path(course.__file__).parent

# Forks until the process limit refuses, says how many it made, and keeps them all alive.
HOG = r"""
import os, sys, time
made = 0
while True:
    try:
        if os.fork() == 0:
            time.sleep(120)
            os._exit(0)
        made += 1
    except OSError:
        break
print(json.dumps({"uid": os.getuid(), "made": made}), flush=True)
time.sleep(120)
""".replace("import os", "import json, os", 1)

# A second grading run: its own process, its own sandbox, the hog inside it.
OTHER_RUN = r"""
import subprocess, sys
from pathlib import Path
import course
from autograder import scratch
from autograder.sandbox import Sandbox
box = Sandbox(scratch.folder("sandbox-"), Path(course.__file__).parent)     # swept if this run is killed
try:
    subprocess.run(box.prefix() + [sys.executable, "-c", sys.argv[1]])
finally:
    box.cleanup()
"""


def _box(tmp_path: Path, name: str, limits: Limits = Limits()) -> Sandbox:
    return Sandbox(tmp_path / name, COURSE, limits, env={"COURSE_DEVICE": "cpu"})


def _run(box: Sandbox, code: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(box.prefix() + [sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=timeout)


async def _kernel_starts_and_forks(box: Sandbox) -> dict:
    """A real kernel in ``box``: it answers kernel_info, then runs a cell that starts a
    thread and a child process."""
    code = ("import os, subprocess, sys, threading\nt = threading.Thread(target=len, args=((),)); t.start(); t.join()\n"
            "print(os.getuid(), subprocess.run([sys.executable, '-c', 'print(7)'], capture_output=True).stdout)")
    return await run_in_kernel(box, code)


@as_root
def test_a_student_who_fills_the_process_limit_in_another_run_leaves_this_kernel_its_own(tmp_path):
    """The attack: a second grading run forks until its kernel's process limit refuses;
    a kernel of this run, started meanwhile, still starts, runs a thread and a process."""
    hog = subprocess.Popen([sys.executable, "-c", OTHER_RUN, HOG], stdout=subprocess.PIPE, text=True,
                           cwd=Path(__file__).parent.parent)
    try:
        full = json.loads(hog.stdout.readline())
        assert full["made"] >= Limits().processes - 2, full     # it did reach its limit
        box = _box(tmp_path, "mine")
        try:
            assert box.uid != full["uid"] and box.uid >= sandbox_ids.FIRST_ID
            found = asyncio.run(_kernel_starts_and_forks(box))
        finally:
            box.cleanup()
    finally:
        hog.kill()
        hog.wait()
    assert found["status"] == "ok", found
    assert found["printed"].split()[:2] == [str(box.uid), "b'7\\n'"], found


LOCKER = r"""
import fcntl, json, os, sys, time
import course
mine = open(course.__file__)
null = open("/dev/null", "w")
fcntl.flock(mine, fcntl.LOCK_EX | fcntl.LOCK_NB)
fcntl.lockf(null, fcntl.LOCK_EX | fcntl.LOCK_NB)
print("held", flush=True)
time.sleep(60)
"""

PROBE_LOCKS = r"""
import ctypes, errno, fcntl, json, os
import course
found = {}
for name, take in (("flock", lambda: fcntl.flock(open(course.__file__), fcntl.LOCK_EX | fcntl.LOCK_NB)),
                   ("lockf", lambda: fcntl.lockf(open("/dev/null", "w"), fcntl.LOCK_EX | fcntl.LOCK_NB))):
    try:
        take()
        found[name] = "free"
    except OSError as err:
        found[name] = errno.errorcode[err.errno]
libc = ctypes.CDLL(None, use_errno=True)
found["inotify"] = libc.inotify_init1(0) >= 0 or errno.errorcode[ctypes.get_errno()]
found["userns"] = libc.unshare(0x10000000) == 0 or errno.errorcode[ctypes.get_errno()]
print(json.dumps(found))
"""


def test_a_lock_taken_in_one_sandbox_is_not_seen_in_another(tmp_path):
    """``course/__init__.py`` (bound read-only into both) and ``/dev/null`` (the host's node)
    are the same files in two sandboxes: a lock on them would be a channel."""
    one, two = _box(tmp_path, "one"), _box(tmp_path, "two")
    holder = subprocess.Popen(one.prefix() + [sys.executable, "-c", LOCKER], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        done = _run(two, PROBE_LOCKS)
    finally:
        holder.kill()
        holder.wait()
        one.cleanup()
        two.cleanup()
    assert done.returncode == 0, done.stderr[-2000:]
    found = json.loads(done.stdout)
    assert found["flock"] == found["lockf"] == "free", found
    # Nor a watch on a shared file (a read in one is an event in the other), nor a user
    # namespace of its own (where a tmpfs past the disk bound could be mounted).
    assert found["inotify"] == found["userns"] == "EPERM", found


# Writes 1 MiB at a time, then empty files, into /tmp and the work folder, each until
# refused or past the whole sandbox's bound (argv: bytes, files).
FILL = r"""
import errno, json, os, sys
most_bytes, most_files = int(sys.argv[1]), int(sys.argv[2])
found = {}
for where in ("/tmp", os.environ["HOME"] + "/work"):
    seen = {"bytes": 0, "files": 0, "error": None, "files_error": None}
    try:
        with open(f"{where}/big", "wb") as f:
            while seen["bytes"] <= most_bytes:
                f.write(b"x" * (1 << 20))
                f.flush()
                seen["bytes"] += 1 << 20
    except OSError as err:
        seen["error"] = errno.errorcode[err.errno]
    try:
        while seen["files"] <= most_files:
            open(f"{where}/{seen['files']}", "wb").close()
            seen["files"] += 1
    except OSError as err:
        seen["files_error"] = errno.errorcode[err.errno]
    found[where] = seen
print(json.dumps(found))
"""


@as_root
def test_a_sandbox_writing_past_its_disk_bound_gets_enospc_and_the_host_nothing(tmp_path):
    limits = Limits(disk_bytes=64 << 20, disk_files=2000)
    box = _box(tmp_path, "full", limits)
    try:
        done = subprocess.run(box.prefix() + [sys.executable, "-c", FILL, str(limits.disk_bytes),
                                              str(limits.disk_files)], capture_output=True, text=True, timeout=120)
        on_host = sum(p.stat().st_size for p in box.root.rglob("*") if p.is_file())
    finally:
        box.cleanup()
    assert done.returncode == 0, done.stderr[-2000:]
    found = json.loads(done.stdout)
    for where, seen in found.items():
        assert seen["error"] == seen["files_error"] == "ENOSPC", (where, seen)
        assert 0 < seen["bytes"] <= limits.disk_bytes // 2, (where, seen)
        assert seen["files"] < limits.disk_files // 2, (where, seen)
    assert on_host < 64 << 10, f"{on_host} bytes of the sandbox's writes landed on the host"


def test_ids_are_unique_while_held_and_released_after(tmp_path):
    """20 sandboxes alive at once hold 20 ids; once each has run and ended, none is held and
    no process runs under any of them."""
    boxes = [_box(tmp_path, f"b{i}") for i in range(20)]
    ids = [box.uid for box in boxes]
    try:
        if os.geteuid() == 0:
            assert len(set(ids)) == 20 and min(ids) >= sandbox_ids.FIRST_ID, ids
            assert set(ids) <= set(sandbox_ids.leased_ids())
        for box in boxes:
            assert _run(box, "import os; print(os.getuid())").stdout.split() == [str(box.uid)]
    finally:
        for box in boxes:
            box.cleanup()
    assert not set(ids) & set(sandbox_ids.leased_ids()) - {os.getuid()}
    assert not set(ids) & sandbox_ids._live_ids() - {os.getuid()}


def test_a_lease_held_by_another_process_is_never_taken(tmp_path):
    path = tmp_path / "1000000001"
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, sys, time; f = open(sys.argv[1], 'w'); "
                               "fcntl.flock(f, fcntl.LOCK_EX); print('held', flush=True); time.sleep(60)", str(path)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert sandbox_ids._lock(path) is None
    finally:
        holder.kill()
        holder.wait()
    mine = sandbox_ids.IdLease(1000000001, path, sandbox_ids._lock(path))   # free once its holder died
    assert mine.fd is not None
    mine.release()
    assert not path.exists()


def test_the_filter_exists_for_the_machines_the_course_runs_on():
    for machine in ("x86_64", "aarch64"):
        code = sandbox_filter.program(machine)
        assert code and len(code) % 8 == 0 and len(code) // 8 < 255
    assert sandbox_filter.program("riscv64") is None
    assert errno.ENOLCK == sandbox_filter.ENOLCK and errno.EPERM == sandbox_filter.EPERM
