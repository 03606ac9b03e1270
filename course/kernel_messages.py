"""Waiting for a kernel's reply no longer than it takes to come.

jupyter_client's asyncio channels wait for a message with one zmq poll over the whole time
limit. Now and then the socket's wake-up is missed: the reply sits in the socket while the
poll sleeps on, until the limit fires and pyzmq's last check finds it. Nothing fails and
nothing is logged; the cell just takes its whole limit. Measured 2026-12-02 in the book's
build (nbclient 0.11, jupyter_client 8.10, pyzmq 27.3): the page on tokenization, 19 s of
work, took 315 s (the book's 300 s cell limit) with its kernel idle and the build waiting,
and the test suite's build sat at 0 % CPU for 100 s; the same page executed outside the
Sphinx process never stalled.

:func:`install` makes every wait poll in slices of at most :data:`SLICE` seconds, so a
missed wake-up costs at most that; ``get_msg`` keeps its contract (a message, or
``queue.Empty`` once ``timeout`` has passed). Whatever runs the course's notebooks installs
it: the grader's executor and the book's build (book/_ext/kernel_messages.py).
"""

from __future__ import annotations

import time
from queue import Empty

SLICE = 1.0       # seconds: the longest a missed wake-up can delay a message


def install() -> None:
    """Patch jupyter_client's asyncio channel in this process (idempotent)."""
    from jupyter_client.channels import AsyncZMQSocketChannel

    if getattr(AsyncZMQSocketChannel.get_msg, "sliced", False):
        return
    whole = AsyncZMQSocketChannel.get_msg

    async def get_msg(self, timeout: float | None = None):
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                return await whole(self, timeout=SLICE if left is None else min(SLICE, left))
            except Empty:
                if left is not None and left <= SLICE:
                    raise

    get_msg.sliced = True
    get_msg.__doc__ = whole.__doc__
    AsyncZMQSocketChannel.get_msg = get_msg
