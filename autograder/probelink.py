"""The judge's line to the probe in a kernel, for one graded test cell.

A test cell makes hundreds of calls into the student's code, and a kernel request costs a
few milliseconds each (IPython's execute machinery, ZeroMQ, status messages). So one
request per test cell starts :func:`course.probe.serve_loop` in the kernel, which connects
back to a Unix socket this side listens on; each call is then one line naming a request
file and a reply file (both in the sandbox's ``io`` folder), answered by ``ok`` once the
reply is written. What the student's code prints still belongs to that one kernel request.

Nothing the kernel sends is trusted beyond "a reply may be ready": a line other than
``ok``, a hang-up, or silence past the deadline is a failed call, never a verdict.
"""

from __future__ import annotations

import itertools
import os
import socket
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

_NUMBERS = itertools.count()
MAX_LINE = 64


class ProbeLink:
    """``serve(request_path, reply_path, timeout)`` for one test cell; :meth:`close` after it.

    ``client`` is a blocking kernel client; ``socket_dir`` a folder both sides see at the
    same path (None: a private temporary folder, for a kernel outside a sandbox); ``uid``
    the kernel's user id when it differs from ours; ``alive()`` says whether the kernel
    process runs; ``collect(client, msg_id, timeout)`` keeps what the kernel printed and
    says whether the kernel went idle after ``msg_id`` (then all its output has come).
    """

    def __init__(self, client, socket_dir: Path | None, uid: int | None, alive: Callable[[], bool],
                 collect: Callable[[object, str, float], bool]) -> None:
        self.client, self.uid, self.alive, self.collect = client, uid, alive, collect
        self._own_dir = None
        if socket_dir is None:     # AF_UNIX paths are short (108 bytes): a short private folder
            self._own_dir = tempfile.mkdtemp(prefix="judge-")
            socket_dir = Path(self._own_dir)
        self.path = Path(socket_dir) / f"judge-{os.getpid()}-{next(_NUMBERS)}.sock"
        self.msg_id: str | None = None
        self.conn: socket.socket | None = None
        self.reply: dict | None = None        # the kernel's reply to the loop's request
        self.idle = False                      # the kernel went idle after it: all output is in

    # ------------------------------------------------------------------ one call
    def serve(self, request_path: Path, reply_path: Path, timeout: float) -> str | None:
        from .remote import CellTimedOut

        deadline = time.monotonic() + timeout
        if self.conn is None:
            error = self._open(deadline)
            if error is not None:
                return error
        try:
            self.conn.sendall(f"{request_path}\t{reply_path}\n".encode("utf-8"))
        except OSError:
            return self._ended_error()
        buffer = b""
        while True:
            self._collect()
            self._check_alive()
            if time.monotonic() > deadline:
                raise CellTimedOut("ran past the time limit")
            try:
                chunk = self.conn.recv(MAX_LINE)
            except socket.timeout:
                continue
            except OSError:
                return self._ended_error()
            if not chunk:
                return self._ended_error()
            buffer += chunk
            if b"\n" in buffer:
                line, _, rest = buffer.partition(b"\n")
                return None if line == b"ok" and not rest else "the kernel's probe answered out of turn"
            if len(buffer) > MAX_LINE:
                return "the kernel's probe answered out of turn"

    def _open(self, deadline: float) -> str | None:
        """Start the loop in the kernel and take its connection."""
        from .remote import CellTimedOut

        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.path.unlink(missing_ok=True)
            server.bind(str(self.path))
            if self.uid is not None and os.geteuid() == 0:
                os.chown(self.path, self.uid, self.uid)
            server.listen(1)
            server.settimeout(0.25)
            self.msg_id = self.client.execute(
                f"__import__('course.probe').probe.serve_loop({str(self.path)!r})",
                silent=True, store_history=False, allow_stdin=False)
            while True:
                try:
                    self.conn, _ = server.accept()
                    self.conn.settimeout(0.25)
                    return None
                except socket.timeout:
                    pass
                self._check_alive()
                if self._poll_reply(0) is not None:     # the loop ended before it connected
                    return self._ended_error()
                if time.monotonic() > deadline:
                    raise CellTimedOut("ran past the time limit")
        finally:
            server.close()
            self.path.unlink(missing_ok=True)

    # ------------------------------------------------------------------ the end of the cell
    def close(self, timeout: float = 10) -> bool:
        """Hang up and wait for the loop's request to finish; False if it did not."""
        if self.conn is not None:
            try:
                self.conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self.conn.close()
            self.conn = None
        ended = True
        if self.msg_id is not None and self.reply is None:
            ended = self._poll_reply(timeout) is not None
        if self._own_dir is not None:
            import shutil

            shutil.rmtree(self._own_dir, ignore_errors=True)
        return ended

    def _poll_reply(self, timeout: float) -> dict | None:
        """The loop request's reply, waiting up to ``timeout`` seconds for it."""
        deadline = time.monotonic() + timeout
        while self.reply is None:
            self._collect()
            try:
                msg = self.client.get_shell_msg(timeout=min(0.25, max(0.0, deadline - time.monotonic())) or 0)
            except Exception:  # noqa: BLE001 - queue.Empty: nothing yet
                msg = None
            if msg is not None and msg.get("parent_header", {}).get("msg_id") == self.msg_id:
                self.reply = msg.get("content", {})
                # Output travels apart from the reply: it has all come when the kernel says idle.
                idle_by = time.monotonic() + 5
                while not self.idle and time.monotonic() < idle_by:
                    self._collect(0.1)
                break
            if time.monotonic() >= deadline or not self.alive():
                break
        return self.reply

    def _collect(self, timeout: float = 0) -> None:
        if self.msg_id is not None and self.collect(self.client, self.msg_id, timeout):
            self.idle = True

    def _ended_error(self) -> str:
        reply = self._poll_reply(2) or {}
        if reply.get("status") == "error":
            return f"{reply.get('ename', 'Error')}: {reply.get('evalue', '')}"
        self._check_alive()
        return "the kernel's probe stopped"

    def _check_alive(self) -> None:
        from .remote import KernelLost

        if not self.alive():
            raise KernelLost("the kernel died")
