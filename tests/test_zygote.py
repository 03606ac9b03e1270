"""Kernels forked from the zygote: each is what a cold kernel is (its own sandbox, id,
limits, seccomp program, no capability, no network), nothing passes from one to the next,
only the kernel in its sandbox is ever signalled, and a zygote that fails leaves the kernel
to start cold."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest

import course
from autograder import zygote
from autograder.sandbox import Limits, Sandbox, available
from kernel_tools import run_in_kernel

pytestmark = [pytest.mark.slow,   # real sandboxes and kernels
              pytest.mark.skipif(not available() or os.geteuid() != 0,
                                 reason="the zygote joins a sandbox's namespaces: bubblewrap and root")]

COURSE = Path(course.__file__).parent

# What a kernel can see of itself: the parts that must not depend on how it was started.
LOOK = r"""
import json, os, resource, socket, sys
status = dict(line.split(":", 1) for line in open("/proc/self/status") if ":" in line)
try:
    socket.create_connection(("1.1.1.1", 80), timeout=1)
    network = "reached"
except OSError as error:
    network = type(error).__name__
limits = {name: resource.getrlimit(getattr(resource, name)) for name in
          ("RLIMIT_DATA", "RLIMIT_NPROC", "RLIMIT_FSIZE", "RLIMIT_NOFILE", "RLIMIT_CORE")}
print(json.dumps({
    "uid": os.getuid(), "gid": os.getgid(), "groups": os.getgroups(),
    "caps": [status[k].strip() for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")],
    "no_new_privs": status["NoNewPrivs"].strip(), "seccomp": status["Seccomp"].strip(),
    "session_leader": os.getsid(0) == os.getpid(), "cwd": os.getcwd(), "env": dict(os.environ),
    "processes": sorted(int(e) for e in os.listdir("/proc") if e.isdigit()), "pid": os.getpid(),
    "limits": limits, "network": network, "tmp": sorted(os.listdir("/tmp")), "home": sorted(os.listdir(os.environ["HOME"])),
    "left_by_another": globals().get("LEFT", None), "dumpable_proc": os.stat("/proc/self/status").st_uid,
    "symbolic_shapes": "torch.fx.experimental.symbolic_shapes" in sys.modules,
}))
LEFT = "a value of this kernel"
open("/tmp/left-behind", "w").write("x")
"""


def _box(root: Path, name: str) -> Sandbox:
    return Sandbox(root / name, COURSE, Limits(), env={"COURSE_DEVICE": "cpu"})


async def _look(box: Sandbox, code: str = LOOK) -> tuple[dict, int | None]:
    """Start a kernel in ``box`` as the grader does, run ``code``; what it printed (JSON), and
    the host PID of the kernel if the zygote forked it."""
    ran = await run_in_kernel(box, code)
    return json.loads(ran["printed"]), ran["forked_pid"]


def _started(root: Path, name: str, monkeypatch=None, cold: bool = False) -> tuple[dict, int | None]:
    if monkeypatch is not None:
        monkeypatch.setenv(zygote.NO_ZYGOTE_SWITCH, "1" if cold else "0")
    box = _box(root, name)
    try:
        return asyncio.run(_look(box))
    finally:
        box.cleanup()


def test_a_forked_kernel_is_what_a_cold_kernel_is(tmp_path, monkeypatch):
    cold, cold_pid = _started(tmp_path, "cold", monkeypatch, cold=True)
    forked, forked_pid = _started(tmp_path, "forked", monkeypatch)
    assert cold_pid is None and forked_pid is not None
    # the ids are each sandbox's own lease; the rest is the same, but for the holder
    assert cold["uid"] != forked["uid"] and forked["uid"] == forked["gid"] and forked["groups"] == []
    for key in ("caps", "no_new_privs", "seccomp", "session_leader", "cwd", "env", "network", "home",
                "left_by_another"):
        assert forked[key] == cold[key], (key, forked[key], cold[key])
    assert forked["caps"] == ["0000000000000000"] * 5 and forked["seccomp"] == "2" and forked["network"] != "reached"
    assert forked["dumpable_proc"] == forked["uid"]          # its /proc files are its own, as after exec
    # its own PID namespace: bubblewrap's init, the holder, the kernel
    assert forked["processes"] == [1, 2, 3] and forked["pid"] == 3
    assert cold["processes"] == [1, 2]
    nproc = forked["limits"].pop("RLIMIT_NPROC")
    assert nproc[0] == cold["limits"].pop("RLIMIT_NPROC")[0] + 1    # the holder counts under its id
    assert forked["limits"] == cold["limits"]
    # what a first backward pass imports (SymPy with it) came with the fork, not paid per kernel
    assert forked["symbolic_shapes"] and not cold["symbolic_shapes"]


def test_nothing_passes_from_one_forked_kernel_to_the_next(tmp_path, monkeypatch):
    first, first_pid = _started(tmp_path, "one", monkeypatch)
    second, second_pid = _started(tmp_path, "two", monkeypatch)
    assert first_pid and second_pid and first_pid != second_pid
    assert second["left_by_another"] is None and "left-behind" not in second["tmp"]
    assert first["uid"] != second["uid"]


def test_only_the_forked_kernel_is_signalled_and_only_while_it_is_in_its_sandbox(tmp_path, monkeypatch):
    """The PID an interrupt signals: the kernel's, which is PID 3 of the sandbox's namespace;
    none once the kernel has ended (its host PID may then be another process's)."""
    from autograder.executor import SandboxedKernelManager

    monkeypatch.setenv(zygote.NO_ZYGOTE_SWITCH, "0")
    box = _box(tmp_path, "signalled")

    async def run() -> tuple[list[int], str, list[int]]:
        km = SandboxedKernelManager.in_sandbox(box)
        await km.start_kernel()
        try:
            alive = km._kernel_pids()
            with open(f"/proc/{km.forked_pid}/status", encoding="utf-8") as f:
                nspid = next(line for line in f if line.startswith("NSpid:"))
        finally:
            await km.shutdown_kernel(now=True)
        for _ in range(100):
            if not km._kernel_pids():
                break
            await asyncio.sleep(0.05)
        return alive, nspid, km._kernel_pids()

    try:
        alive, nspid, after = asyncio.run(run())
    finally:
        box.cleanup()
    assert alive and len(alive) == 1 and nspid.split()[-1] == "3", (alive, nspid)
    assert after == []


def test_a_zygote_that_cannot_start_leaves_the_kernel_cold(tmp_path, monkeypatch):
    """A zygote that ends before it is ready (here: its program exits at once) is given up;
    the kernel starts cold and runs, and so do the next ones in this process."""
    monkeypatch.setenv(zygote.NO_ZYGOTE_SWITCH, "0")
    broken = tmp_path / "zygote_main.py"
    broken.write_text("import sys\nsys.exit(3)\n", encoding="utf-8")
    monkeypatch.setattr(zygote, "ZYGOTE", broken)
    saved = dict(zygote._ZYGOTES)
    zygote._ZYGOTES.clear()
    box = _box(tmp_path, "broken")
    try:
        seen, forked_pid = asyncio.run(_look(box, "import json, os; print(json.dumps(os.getuid()))"))
        assert forked_pid is None and seen == box.uid
        assert zygote.failed_before(box.environment())
    finally:
        box.cleanup()
        zygote._ZYGOTES.clear()
        zygote._ZYGOTES.update(saved)


def test_the_zygote_forks_only_into_the_holder_it_was_told_of_and_never_into_the_hosts_namespaces(tmp_path):
    """A request naming a process that is not a sandbox's holder: one whose PID now belongs
    to another process (another start time), or one that shares the zygote's namespaces
    (this test's own process, as a PID reused by a host process would), forks nothing."""
    box = _box(tmp_path, "requests")
    fork = zygote.Zygote(box.environment())
    try:
        request = {"argv": [], "uid": box.uid, "cwd": "/", "limits": box.rlimits(), "log": str(box.root / "kernel.log"),
                   "seccomp": ""}
        me = os.getpid()
        with pytest.raises(zygote.ZygoteUnavailable, match="no longer the sandbox's holder"):
            fork.spawn({**request, "holder": me, "holder_started": zygote.started(me) + 1})
        with pytest.raises(zygote.ZygoteUnavailable, match="shares this process's"):
            fork.spawn({**request, "holder": me, "holder_started": zygote.started(me)})
    finally:
        fork.close()
        box.cleanup()
