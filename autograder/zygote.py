"""Kernels forked from a zygote instead of started cold: the grader's side.

A cold kernel spends about two seconds of CPU importing PyTorch and ipykernel before the
notebook's first cell (``benchmarks/grading.py``). As root, each grading process keeps one
zygote (``zygote_main.py``): a process, outside any sandbox and holding nothing of any
student or of the grader, that has imported them once. A notebook's sandbox is made by
bubblewrap exactly as for a cold kernel, but its command is the holder
(``zygote_holder.py``); the zygote then forks the kernel into the holder's namespaces,
where it takes the sandbox's limits, user id, seccomp program and session, as the cold
path's ``prlimit``, bubblewrap and ``setpriv`` give them. Every kernel is still a new
process in a new sandbox: nothing is reused from one notebook to the next.

Without root (a learner's self-check) the zygote is not used: joining a sandbox's
namespaces takes privileges the grader then does not have. Nor with a GPU: a CUDA runtime
that a process touched before a fork is not usable after it. When a zygote cannot start or
answer, the kernel starts cold (:class:`ZygoteUnavailable`).
"""

from __future__ import annotations

import atexit
import json
import os
import select
import socket
import subprocess
import sys
import time
from pathlib import Path

ZYGOTE = Path(__file__).with_name("zygote_main.py")
HOLDER = Path(__file__).with_name("zygote_holder.py")
MARKER = "course-kernel-zygote"         # on the zygote's command line, so on each kernel's
HOLDER_MARKER = "course-kernel-holder"
COLD_SWITCH = "COURSE_COLD_KERNELS"     # "1": each kernel started cold when its notebook comes
NO_ZYGOTE_SWITCH = "COURSE_NO_ZYGOTE"   # "1": kernels started ahead, each importing on its own
ANSWER_SECONDS = 120                    # for the zygote's imports, on a busy machine


class ZygoteUnavailable(RuntimeError):
    """The zygote could not start or fork this kernel: start it cold."""


def usable() -> bool:
    """Whether this process forks its kernels from a zygote: as root, on Linux, unless turned off."""
    off = any(os.environ.get(switch, "") == "1" for switch in (COLD_SWITCH, NO_ZYGOTE_SWITCH))
    return sys.platform.startswith("linux") and os.geteuid() == 0 and not off


class Zygote:
    """One zygote process, started with ``env`` (a kernel's whole environment)."""

    def __init__(self, env: dict[str, str]):
        ours, theirs = socket.socketpair()
        self.env = dict(env)
        self.process = subprocess.Popen(
            [sys.executable, "-s", "-c", ZYGOTE.read_text(encoding="utf-8"), str(theirs.fileno()), MARKER],
            env=self.env, cwd="/", pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        theirs.close()
        self.socket = ours
        self.lines = ours.makefile("rb")
        self.ready: bool | None = None

    def _answer(self) -> dict:
        ready, _, _ = select.select([self.socket], [], [], ANSWER_SECONDS)
        line = self.lines.readline() if ready else b""
        if not line:
            raise ZygoteUnavailable("the kernel zygote did not answer")
        return json.loads(line)

    def spawn(self, request: dict) -> int:
        """Fork a kernel for ``request`` (see zygote_main.py); its host PID."""
        if self.ready is None:
            self.ready = bool(self._answer().get("ready"))
        if not self.ready:
            raise ZygoteUnavailable("the kernel zygote runs threads: forking it is not safe")
        self.socket.sendall(json.dumps(request).encode() + b"\n")
        answer = self._answer()
        if "pid" not in answer:
            raise ZygoteUnavailable(f"the kernel zygote could not fork the kernel: {answer.get('error')}")
        return int(answer["pid"])

    def close(self) -> None:
        self.socket.close()
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()


# This process's zygotes, by the kernels' environment; None: it failed, kernels start cold.
_ZYGOTES: dict[tuple, Zygote | None] = {}


def _key(env: dict[str, str]) -> tuple:
    return tuple(sorted(env.items()))


def zygote_for(env: dict[str, str]) -> Zygote:
    """This process's zygote for kernels with environment ``env`` (started on first use; a
    dead one is replaced)."""
    zygote = _ZYGOTES.get(_key(env))
    if zygote is None or zygote.process.poll() is not None:
        _ZYGOTES[_key(env)] = zygote = Zygote(env)
    return zygote


def forget(env: dict[str, str]) -> None:
    """Stop using the zygote for ``env`` (it failed): later kernels start cold."""
    zygote = _ZYGOTES.get(_key(env))
    if zygote is not None:
        zygote.close()
    _ZYGOTES[_key(env)] = None


def failed_before(env: dict[str, str]) -> bool:
    key = _key(env)
    return key in _ZYGOTES and _ZYGOTES[key] is None


@atexit.register
def _close_all() -> None:
    for zygote in _ZYGOTES.values():
        if zygote is not None:
            zygote.close()
    _ZYGOTES.clear()


def holder_command() -> list[str]:
    """The sandbox's command in place of the kernel's."""
    return [sys.executable, "-I", "-S", "-c", HOLDER.read_text(encoding="utf-8"), HOLDER_MARKER, MARKER]


def find_holder(root_pid: int, seconds: float = 30) -> int:
    """The host PID of the holder below ``root_pid`` (bubblewrap's process), once it runs
    (the zygote checks, by :func:`started`, that it is still that process when it joins it)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for pid in descendants(root_pid):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    argv = f.read().split(b"\0")
                # the holder itself (python -I -S -c TEXT HOLDER_MARKER MARKER), not a set-up step
                # still running as root whose arguments name it
                if argv[4:6] == [HOLDER.read_bytes(), HOLDER_MARKER.encode()]:
                    return pid
            except OSError:
                pass
        time.sleep(0.005)
    raise ZygoteUnavailable("the sandbox's holder did not start")


def descendants(root_pid: int) -> list[int]:
    """Host PIDs of every process below ``root_pid``."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [root_pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def started(pid: int) -> int:
    """When ``pid`` started (clock ticks since boot; ``zygote_main.started`` reads the same)."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        return int(f.read().rsplit(b")", 1)[1].split()[19])


def pid_namespace(pid: int) -> int | None:
    """The inode of ``pid``'s PID namespace (None once it has ended)."""
    try:
        return os.stat(f"/proc/{pid}/ns/pid").st_ino
    except OSError:
        return None
