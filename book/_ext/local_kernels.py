"""Sphinx extension: the book's kernels talk to the build over local sockets, and are shut
down without an interrupt, so that a successful build logs neither warnings nor errors.

- ipykernel 7 warns, once per kernel, "Kernel is running over TCP without encryption"
  (36 lines in a build of the book): the build and its kernels share one machine, so their
  sockets here are IPC sockets in Jupyter's runtime folder (a folder only its user can
  open), with nothing to warn about.
- jupyter_client's shutdown first interrupts the kernel (SIGINT) and then asks it to stop.
  A page's kernel is idle by then; when the signal lands while it handles a message, it logs
  ``ERROR | KeyboardInterrupt caught in kernel`` (once in a build of the book). The request
  to stop is enough (a kernel that does not stop is killed after it, as before).

The pages run through Jupyter Book's cache (jupyter-cache hands each page to nbclient), so
the kernel manager below is given to that call. It forks each page's kernel from the build's
kernel server (forked_kernels.py).
"""

from __future__ import annotations

import functools
import os
import sys
import uuid
from pathlib import Path

from jupyter_client import AsyncKernelManager
from traitlets import default


class LocalKernelManager(AsyncKernelManager):
    """A kernel over IPC sockets in Jupyter's runtime folder, shut down without SIGINT."""

    @default("transport")
    def _transport_default(self) -> str:
        return "ipc"

    @default("ip")
    def _ip_default(self) -> str:
        # an absolute path: the kernel starts in the page's folder, the build elsewhere
        from jupyter_core.paths import jupyter_runtime_dir

        runtime = jupyter_runtime_dir()
        os.makedirs(runtime, mode=0o700, exist_ok=True)
        return os.path.join(runtime, f"book-kernel-{uuid.uuid4().hex[:12]}")

    async def _async_launch_kernel(self, kernel_cmd: list[str], **kw) -> None:
        # A page's kernel forked from the build's kernel server (forked_kernels.py), its
        # holder the process this manager watches; cold where the server is not usable.
        import forked_kernels

        is_ipykernel = kernel_cmd[1:3] == ["-m", "ipykernel_launcher"] and \
            os.path.realpath(kernel_cmd[0]) == os.path.realpath(sys.executable)
        server = forked_kernels.server() if is_ipykernel else None
        if server is not None:
            try:
                env = {**(kw.get("env") or os.environ), "JPY_PARENT_PID": str(os.getpid())}     # as launch_kernel sets it
                pid = server.fork(kernel_cmd[3:], str(kw.get("cwd") or os.getcwd()), env)
            except OSError as err:
                self.log.warning("starting the page's kernel cold: %s", err)
            else:
                return await super()._async_launch_kernel(forked_kernels.holder_command(pid), **kw)
        return await super()._async_launch_kernel(kernel_cmd, **kw)

    async def _async_interrupt_kernel(self) -> None:
        if self.shutting_down:      # the shutdown request that follows is enough
            return
        await super()._async_interrupt_kernel()


# Run at the start of each kernel: the course's figure text size, and the size of each
# figure's smallest text recorded in its PNG (for the browser test)
FIGURES = Path(__file__).with_name("kernel_figures.py")


def install() -> None:
    """Execute the book's pages with LocalKernelManager (idempotent), each kernel started
    with kernel_figures.py (the kernels inherit the build's environment)."""
    from jupyter_cache.executors import utils

    os.environ["PYTHONSTARTUP"] = str(FIGURES)

    if getattr(utils.executenb, "local_kernels", False):
        return
    execute = functools.partial(utils.executenb, kernel_manager_class=LocalKernelManager)
    execute.local_kernels = True
    utils.executenb = execute


def setup(app):
    install()
    return {"parallel_read_safe": True, "parallel_write_safe": True}
