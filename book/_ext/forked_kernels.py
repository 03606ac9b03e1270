"""The book's page kernels, forked from one process that has imported PyTorch, NumPy,
Matplotlib and ipykernel once: a page's kernel costs the machine about 0.8 CPU-s to its first
answer instead of 3.6 cold (benchmarks/book_kernels.py), and the book has about 40 pages
that run code.

The pages are the course's own code, so no sandbox is needed, only a fresh kernel per page:
the server imports those modules and runs no page, and each kernel is a fork of the server,
never of another kernel, so nothing of one page reaches the next. A kernel starts in its own
session, in its page's folder, with the environment the build gives it (the fork then runs
ipykernel's usual start, PYTHONSTARTUP included), so a page sees what a cold kernel sees.

Jupyter's kernel manager needs a process of its own to watch and signal: a small holder
(Python without site, a few milliseconds) that waits for the kernel, passes it the signals
the manager sends, and ends when it ends. The server ends with the build and takes any
kernel still running with it.

Where the server cannot start or fork (not Linux, ``COURSE_COLD_KERNELS=1``), kernels start
cold, as before.
"""

from __future__ import annotations

import atexit
import json
import os
import socket
import subprocess
import sys

SERVER = r"""
import json, os, signal, socket, sys

os.environ["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"     # as ipykernel sets it
import matplotlib, numpy, torch                                            # noqa: E401
import torch.fx.experimental.symbolic_shapes      # a first backward pass imports it (and SymPy)
import ipykernel.kernelapp

control = socket.socket(fileno=int(sys.argv[1]))
signal.signal(signal.SIGCHLD, signal.SIG_IGN)      # the kernels are reaped as they end
kernels = []
for line in control.makefile("rb"):
    request = json.loads(line)
    pid = os.fork()
    if pid == 0:
        try:
            control.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            os.setsid()
            os.chdir(request["cwd"])
            os.environ.clear()
            os.environ.update(request["env"])
            os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
            # ipykernel read JPY_PARENT_PID when the server imported it: give it again
            parent = request["env"].get("JPY_PARENT_PID")
            sys.argv = ["ipykernel_launcher", *request["argv"],
                        *([f"--IPKernelApp.parent_handle={int(parent)}"] if parent else [])]
            ipykernel.kernelapp.launch_new_instance()
        finally:
            os._exit(0)
    kernels.append(pid)
    control.sendall(json.dumps({"pid": pid}).encode() + b"\n")
for pid in kernels:          # the build has ended
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass
"""

HOLDER = r"""
import os, select, signal, sys
kernel = int(sys.argv[1])
for number in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
    signal.signal(number, lambda number, frame: os.kill(kernel, number))
try:
    waited = os.pidfd_open(kernel)
except ProcessLookupError:
    sys.exit(0)
except OSError:                # Linux before 5.3: look every 0.2 s instead
    waited = None
while True:
    try:
        if waited is not None and select.select([waited], [], [])[0]:
            break
        if waited is None:
            os.kill(kernel, 0)          # the server reaps its kernels as they end
            select.select([], [], [], 0.2)
    except InterruptedError:
        pass
    except ProcessLookupError:
        break
"""


class KernelServer:
    """The build's server: :meth:`fork` starts a page's kernel and returns its PID."""

    def __init__(self) -> None:
        ours, theirs = socket.socketpair()
        self.process = subprocess.Popen([sys.executable, "-c", SERVER, str(theirs.fileno())], pass_fds=[theirs.fileno()],
                                        stdin=subprocess.DEVNULL)
        theirs.close()
        self.control = ours
        self.replies = ours.makefile("rb")

    def fork(self, argv: list[str], cwd: str, env: dict[str, str]) -> int:
        self.control.sendall(json.dumps({"argv": argv, "cwd": cwd, "env": env}).encode() + b"\n")
        line = self.replies.readline()
        if not line:
            raise OSError(f"the book's kernel server ended (exit status {self.process.poll()})")
        return int(json.loads(line)["pid"])

    def close(self) -> None:
        self.replies.close()        # the socket stays open while its file does
        self.control.close()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()


_SERVER: list[KernelServer] = []


def usable() -> bool:
    return sys.platform.startswith("linux") and hasattr(os, "pidfd_open") \
        and os.environ.get("COURSE_COLD_KERNELS") != "1"


def server() -> KernelServer | None:
    """This build's server, started on first use; None where kernels start cold."""
    if not usable():
        return None
    if not _SERVER or _SERVER[0].process.poll() is not None:
        _SERVER[:] = [KernelServer()]
        atexit.register(_SERVER[0].close)
    return _SERVER[0]


def holder_command(pid: int) -> list[str]:
    return [sys.executable, "-S", "-c", HOLDER, str(pid)]
