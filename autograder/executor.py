"""The one executor: runs a course notebook in a kernel, for grading and for self-check.

- Each cell gets the time limit the contract gives it (:mod:`autograder.contract`). A cell
  that runs past it is interrupted (self-check) or, in a sandbox, its kernel is stopped:
  the cells before keep their points, the later ones are marked "not run".
- A kernel that dies (killed for memory, ``os._exit``, a segfault) does not lose the
  notebook: the cell that was running gets an error, every later code cell a "not run"
  error, and the points earned before are kept.
- A cell's output is capped (``output_limit`` bytes); the rest is dropped with a note.
- When grading (``judge=True``), the kernel runs in its own sandbox
  (:mod:`autograder.sandbox`), and every graded test cell is judged in this process
  (:mod:`autograder.remote`): its code runs here, the student's objects stay in the
  kernel, and the cell's outputs (which nbgrader turns into points) are written here.
  The kernel never runs a graded test cell, so nothing it does can change a verdict.
"""

from __future__ import annotations

import ast
import atexit
import os
import signal
import sys
import time
from pathlib import Path
import zmq

from jupyter_client.manager import AsyncKernelManager
from jupyter_core.utils import run_sync
from nbclient.exceptions import DeadKernelError
from nbformat.notebooknode import NotebookNode, from_dict
from nbgrader.preprocessors import Execute
from traitlets import Any as AnyTrait
from traitlets import Bool, Dict, Enum, Integer, Unicode

from course import kernel_messages
from course.i18n import ENGLISH, known_language

from . import contract, zygote
from .sandbox import SANDBOX_WORK
from .contract import KERNEL_DIED, NOT_RUN, TIMED_OUT, Role  # noqa: F401 - the crash kinds, named in contract


def error_output(ename: str, evalue: str, traceback_text: str | None = None) -> NotebookNode:
    return from_dict({"output_type": "error", "ename": ename, "evalue": evalue,
                      "traceback": [traceback_text or f"{ename}: {evalue}"]})


def kernel_processes(root_pid: int) -> list[int]:
    """Host PIDs of the ipykernel processes below ``root_pid`` (bubblewrap's process)."""
    found = []
    for pid in zygote.descendants(root_pid):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if argv[1:3] == [b"-m", b"ipykernel_launcher"]:     # not the wrappers whose arguments name it
            found.append(pid)
    return found


MAX_MESSAGE_BYTES = 32 << 20   # one message from the kernel (a cell keeps at most output_limit of its output)
QUEUED_MESSAGES = 4            # waiting unread in the grader, per socket


def _bounded(client):
    """``client`` with its sockets (made when its channels start) refusing large messages."""
    client.context.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
    # ... and at most this many messages wait here unread (more wait in the kernel's queue).
    client.context.setsockopt(zmq.RCVHWM, QUEUED_MESSAGES)
    return client


class SandboxedKernelManager(AsyncKernelManager):
    """A kernel manager whose kernel runs under the sandbox's command line, talking over
    Unix sockets in the sandbox's socket folder (its network namespace is empty)."""

    sandbox = AnyTrait(None, allow_none=True)
    forked_pid = None       # a kernel forked by the zygote: its host PID (None: started cold)
    _forked_namespace = None
    _own_cmd: list[str] = []

    @classmethod
    def in_sandbox(cls, sandbox) -> "SandboxedKernelManager":
        """A manager whose kernel will run in ``sandbox``."""
        km = cls()
        km.use_sandbox(sandbox)
        return km

    def use_sandbox(self, sandbox) -> None:
        """Launch the kernel in ``sandbox``, connected over Unix sockets in its socket folder."""
        self.sandbox = sandbox
        self.transport = "ipc"
        self.connection_file = str(sandbox.socket_dir / "kernel.json")
        self.ip = str(sandbox.socket_dir / "kernel")

    def format_kernel_cmd(self, extra_arguments=None):
        cmd = self._own_cmd = super().format_kernel_cmd(extra_arguments)
        return self.sandbox.prefix() + cmd if self.sandbox is not None else cmd

    # The kernel is hostile: a message over MAX_MESSAGE_BYTES (output, a reply) drops its
    # connection instead of being read into the grader whole; every client of ours bounds it.
    def client(self, **kwargs):
        return _bounded(super().client(**kwargs))

    def blocking_client(self):
        return _bounded(super().blocking_client())

    def write_connection_file(self, **kwargs):
        result = super().write_connection_file(**kwargs)
        if self.sandbox is not None:
            import os

            if os.geteuid() == 0:
                os.chown(self.connection_file, self.sandbox.uid, self.sandbox.uid)
        return result

    async def _async_launch_kernel(self, kernel_cmd, **kw):
        # The kernel's own start-up chatter goes to a log in the sandbox folder, not the
        # instructor's terminal.
        if self.sandbox is not None:
            log = open(self.sandbox.root / "kernel.log", "ab")   # closed with the sandbox folder
            kw.setdefault("stdout", log)
            kw.setdefault("stderr", log)
            own = self._own_cmd
            # Not with a GPU: a CUDA runtime touched before a fork is not usable after it.
            if zygote.usable() and not self.sandbox.gpu and not zygote.failed_before(self.sandbox.environment()) \
                    and own[:3] == [sys.executable, "-m", "ipykernel_launcher"]:
                try:
                    return await self._fork_kernel(own[3:], **kw)
                except zygote.ZygoteUnavailable as err:
                    self.log.warning("starting the kernel cold: %s", err)
                    zygote.forget(self.sandbox.environment())
        return await super()._async_launch_kernel(kernel_cmd, **kw)

    async def _fork_kernel(self, argv: list[str], **kw) -> None:
        """The sandbox made as for a cold kernel, with the holder as its command, and the
        kernel forked into it by this process's zygote (:mod:`autograder.zygote`)."""
        box = self.sandbox
        limits = box.rlimits()
        limits["RLIMIT_NPROC"] += 1        # the holder runs under the kernel's id too
        await super()._async_launch_kernel(box.prefix() + zygote.holder_command(), **kw)
        try:
            holder = zygote.find_holder(self.provisioner.process.pid)
            self.forked_pid = zygote.zygote_for(box.environment()).spawn({
                "holder": holder, "holder_started": zygote.started(holder), "argv": argv, "uid": box.uid,
                "cwd": SANDBOX_WORK, "limits": limits,
                "log": str(box.root / "kernel.log"),
                "seccomp": str(box.root / "seccomp.bpf") if (box.root / "seccomp.bpf").exists() else ""})
            self._forked_namespace = zygote.pid_namespace(holder)
        except BaseException:
            self.provisioner.process.kill()
            self.provisioner.process.wait()
            raise

    def _kernel_pids(self) -> list[int]:
        """Host PIDs of this manager's kernel: below bubblewrap, or forked into its sandbox
        (and still there: a PID is signalled only while it is in the sandbox's namespace)."""
        if self.forked_pid is None:
            return kernel_processes(self.provisioner.process.pid)
        inside = self._forked_namespace is not None and zygote.pid_namespace(self.forked_pid) == self._forked_namespace
        return [self.forked_pid] if inside else []

    async def _async_interrupt_kernel(self) -> None:
        # The process we started is bubblewrap; the kernel runs further down, in its own PID
        # namespace. From outside, it still has a PID of ours: signal that process.
        if self.sandbox is not None and self.has_kernel:
            for pid in self._kernel_pids():
                try:
                    os.kill(pid, signal.SIGINT)
                except OSError:
                    pass
            return
        await super()._async_interrupt_kernel()


VERDICT_LIMIT = 20_000     # characters of a failed test's message kept in the graded notebook

# The kernel started ahead for the next notebook this process grades: (kernel name, manager,
# sandbox). It imports PyTorch and the set-up cell's modules (course/kernel_warmup.py) while the
# current notebook is graded, holds nothing of any student, and serves one notebook only.
_SPARE: list[tuple[str, "SandboxedKernelManager", object]] = []


def warmup_arguments(imports: str) -> list[str]:
    """The kernel's start-up line: import the modules of ``imports`` (a set-up cell's import
    statements, contract.setup_imports) and bind no name (course/kernel_warmup.py)."""
    modules = []
    for node in ast.parse(imports).body:
        if isinstance(node, ast.Import):
            modules += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            modules += [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
    listed = ",".join(dict.fromkeys(modules))
    return [f"--IPKernelApp.exec_lines=import course.kernel_warmup as _warm; _warm.warm({listed!r}); del _warm"]


def _kernel_process(km):
    return getattr(km.provisioner, "process", None) if km.has_kernel else None


def _shut_down(km, sandbox) -> None:
    """A spare kernel no notebook will use: killed (bubblewrap's --die-with-parent would too at
    exit), its sandbox removed."""
    process = _kernel_process(km)
    if process is not None and process.poll() is None:
        process.kill()
        process.wait()
    km.cleanup_resources()
    sandbox.cleanup()


def _shut_down_spare() -> None:
    while _SPARE:
        _shut_down(*_SPARE.pop()[1:])


atexit.register(_shut_down_spare)


class CourseExecute(Execute):
    """nbgrader's Execute step with the course's contract (see the module docstring)."""

    release_limits = Dict({}, help="'notebook/grade_id' -> seconds, read from the released "
                                   "notebooks (a submission cannot change them)").tag(config=True)
    judge = Bool(False, help="judge graded test cells in this process").tag(config=True)
    output_limit = Integer(2 << 20, help="bytes of output kept per cell").tag(config=True)
    sandbox_factory = AnyTrait(None, allow_none=True, help="callable() -> Sandbox, or None").tag(config=True)
    grading_seed = Integer(0, help="the grading secret: with a submission's answers, the seed of its hidden "
                                   "tests' inputs (contract.submission_seed)").tag(config=True)

    death_reason = Unicode("")
    # After a cell's reply, its last outputs (a figure, a progress bar) may lag on a busy
    # machine: wait for them a while ...
    iopub_timeout = Integer(15).tag(config=True)
    # ... and when they never come (a message over MAX_MESSAGE_BYTES dropped the connection),
    # the notebook goes on: the cell keeps what was read of its output.
    raise_on_iopub_timeout = Bool(False).tag(config=True)
    warm_kernels = Bool(True, help="start the next notebook's sandboxed kernel while this one is graded"
                        ).tag(config=True)
    # A graded notebook's kernel is killed once its last cell has run, not asked to exit: its
    # outputs are all in by then, its sandbox is removed next, and an interpreter that has
    # loaded PyTorch spends about half a second of CPU tearing itself down (benchmarks/process_costs.py).
    shutdown_kernel = Enum(["graceful", "immediate"], default_value="immediate").tag(config=True)

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("kernel_manager_class", SandboxedKernelManager)
        super().__init__(*args, **kwargs)
        self._sandbox = None
        self._judge_client = None
        self._imports = ""
        self._submission_seed = 0
        self._language = ENGLISH
        self._output_monitor = None
        self._output_bytes = 0
        self._judge_printed, self._judge_printed_bytes = [], 0

    # ------------------------------------------------------------------ the kernel

    def create_kernel_manager(self):
        km = super().create_kernel_manager()        # also settles self.kernel_name
        spare = self._take_spare()
        if spare is not None:                       # started ahead: this notebook is its only one
            self.km, self._sandbox = spare
            return self.km
        self._sandbox = self._sandboxed(km)
        return km

    def _sandboxed(self, km):
        """``km`` set to launch its kernel in a new sandbox (returned), or None unsandboxed."""
        if self.sandbox_factory is None:
            return None
        sandbox = self.sandbox_factory()
        km.use_sandbox(sandbox)
        return sandbox

    def _take_spare(self):
        """The kernel started ahead, if it is of this notebook's kind and still alive."""
        if not _SPARE:
            return None
        name, km, sandbox = _SPARE.pop()
        process = _kernel_process(km)
        if name == self.kernel_name and process is not None and process.poll() is None:
            return km, sandbox
        _shut_down(km, sandbox)
        return None

    async def async_start_new_kernel_client(self):
        kc = await super().async_start_new_kernel_client()
        if self.warm_kernels and self.sandbox_factory is not None and not _SPARE:
            current = self.km
            try:    # the next notebook's kernel: launched now, it warms up while this one runs
                km = super().create_kernel_manager()
                self.km = current
                sandbox = self._sandboxed(km)
                await km.start_kernel(extra_arguments=warmup_arguments(self._imports))
                _SPARE.append((self.kernel_name, km, sandbox))
            except Exception as err:  # noqa: BLE001 - the next notebook then starts its own
                self.log.warning("could not start the next kernel ahead: %s", err)
            finally:
                self.km = current
        return kc

    # nbconvert's preprocess enters nbclient's synchronous setup_kernel, which calls this name:
    # nbclient binds it to its own coroutine, so without this line the override above never ran
    start_new_kernel_client = run_sync(async_start_new_kernel_client)

    def preprocess(self, nb, resources=None, km=None):
        kernel_messages.install()       # a missed wake-up must not hold a cell to its time limit
        self.death_reason = ""
        self._imports = contract.setup_imports(nb)
        self._submission_seed = contract.submission_seed(self.grading_seed, nb)
        # a check's message in the notebook's language (a Chinese release says zh_CN)
        self._language = known_language(nb.metadata.get("course", {}).get("language"))
        try:
            return super().preprocess(nb, resources, km)
        finally:
            if self._output_monitor is not None:
                self._output_monitor.close(linger=0)
                self._output_monitor = None
            if self._judge_client is not None:
                self._judge_client.stop_channels()
                self._judge_client = None
            if self._sandbox is not None:
                self._sandbox.cleanup()
                self._sandbox = None

    def _limit_for(self, cell, resources) -> int:
        notebook = (resources or {}).get("nbgrader", {}).get("notebook", "")
        grade_id = contract.grade_id(cell)
        declared = self.release_limits.get(f"{notebook}/{grade_id}") if grade_id else None
        return int(declared or self.timeout or 300)

    # ------------------------------------------------------------------ cells

    def preprocess_cell(self, cell, resources, index):
        if cell.cell_type != "code":
            return cell, resources
        if self.death_reason:
            cell.outputs = [error_output(NOT_RUN, f"not run: {self.death_reason}")]
            return cell, resources
        self._output_bytes = 0
        limit = self._limit_for(cell, resources)
        if self.judge and contract.role(cell) in contract.JUDGED:
            cell.outputs = self._judge_cell(cell, limit, resources)
            self._drain_iopub()
            return cell, resources
        default = self.timeout
        monitor = self._watch_output_stream()
        try:
            self.timeout = limit
            return super().preprocess_cell(cell, resources, index)
        except DeadKernelError as err:
            self._kernel_died(cell, index, str(err))
            return cell, resources
        finally:
            self.timeout = default
            if monitor is not None and monitor.getsockopt(zmq.EVENTS) & zmq.POLLIN and self._still_alive(2):
                # A message over MAX_MESSAGE_BYTES cut the output stream for good: stop here.
                grade_id = contract.grade_id(cell) or f"cell {index}"
                self._stop_kernel(f"{grade_id} sent output in one message of more than "
                                  f"{MAX_MESSAGE_BYTES >> 20} MiB, which the grader does not read; the kernel was stopped")

    def _still_alive(self, grace: float) -> bool:
        """Whether the kernel runs after ``grace`` seconds: a kernel that is ending (shut down,
        exited) also cuts its output stream, and is a death, not a flood."""
        deadline = time.monotonic() + grace
        while self._kernel_alive() and time.monotonic() < deadline:
            time.sleep(0.1)
        return self._kernel_alive()

    def _watch_output_stream(self):
        """A monitor of the notebook client's output stream: readable once it was cut."""
        if self._output_monitor is None and self.kc is not None and self.kc.iopub_channel is not None:
            self._output_monitor = self.kc.iopub_channel.socket.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        return self._output_monitor

    async def _async_handle_timeout(self, timeout, cell=None):
        # A sandboxed kernel does not reliably stop on an interrupt (seen with ipykernel 7
        # under bubblewrap: the signal arrives, the cell runs on), so it is stopped: the
        # cells before keep their points, the later ones are not run.
        if self._sandbox is not None and self.km is not None and self.km.has_kernel:
            self.km.provisioner.process.kill()
            if cell is not None:
                cell.outputs.append(error_output(TIMED_OUT, f"ran past its time limit of {timeout} s"))
            raise DeadKernelError(f"stopped at its time limit of {timeout} s")
        return await super()._async_handle_timeout(timeout, cell)

    def _kernel_died(self, cell, index, detail: str) -> None:
        grade_id = contract.grade_id(cell) or f"cell {index}"
        self.death_reason = f"the kernel died while running {grade_id} ({detail})"
        self.log.warning("Kernel died in %s; later cells are not run", grade_id)
        cell.outputs.append(error_output(KERNEL_DIED, self.death_reason))

    def output(self, outs, msg, display_id, cell_index):
        """Keep at most ``output_limit`` bytes of a cell's output."""
        size = len(str(msg.get("content", "")))
        self._output_bytes += size
        if self._output_bytes > self.output_limit:
            if self._output_bytes - size <= self.output_limit:
                outs.append(from_dict({"output_type": "stream", "name": "stdout",
                                       "text": f"\n[output stopped here: more than {self.output_limit:,} bytes]\n"}))
            return None
        return super().output(outs, msg, display_id, cell_index)

    # ------------------------------------------------------------------ trusted verdicts

    def _kernel_alive(self) -> bool:
        process = getattr(getattr(self.km, "provisioner", None), "process", None)
        return process is not None and process.poll() is None

    def _judge_client_started(self):
        if self._judge_client is None:
            client = self.km.blocking_client()
            client.start_channels(shell=True, iopub=True, stdin=False, hb=False, control=True)
            self._judge_client = client
        return self._judge_client

    def _collect_kernel_output(self, client, msg_id: str, timeout: float = 0) -> bool:
        """What the student's code printed while the grader called it (kept within the
        output limit; shown under visible tests only, since hidden inputs are the grader's).
        True once the kernel said it is idle after ``msg_id``: all its output has come."""
        while True:
            try:
                msg = client.get_iopub_msg(timeout=timeout)
            except Exception:  # noqa: BLE001 - queue.Empty: nothing more now
                return False
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            if msg.get("msg_type") == "status" and msg["content"].get("execution_state") == "idle":
                return True
            if msg.get("msg_type") != "stream":
                continue
            text = str(msg["content"].get("text", ""))
            if self._judge_printed_bytes + len(text) <= self.output_limit:
                self._judge_printed.append((msg["content"].get("name", "stdout"), text))
            self._judge_printed_bytes += len(text)

    def _judge_cell(self, cell, limit: int, resources) -> list[NotebookNode]:
        """Run a graded test cell here; its outputs are the verdict."""
        from course.checks import _hidden
        from course.checks._core import capped
        from course.i18n import error_text

        from .probelink import ProbeLink
        from .remote import CellTimedOut, Channel, KernelLost, run_judged

        alive = self.km is not None and self._kernel_alive()
        if self.km is not None and not alive and not self.death_reason:
            # It ended after the cell before had answered (a shutdown or exit that the
            # kernel finished after its reply): a death, whichever side of the reply it fell.
            grade_id = contract.grade_id(cell) or "a test cell"
            self.death_reason = f"the kernel died before {grade_id}, after the cell before it had answered"
            return [error_output(KERNEL_DIED, self.death_reason)]
        if not alive:
            self.death_reason = self.death_reason or "the kernel is not running"
            return [error_output(NOT_RUN, f"not run: {self.death_reason}")]
        io_dir = self._sandbox.io_dir if self._sandbox is not None else Path(resources["metadata"]["path"])
        link = ProbeLink(self._judge_client_started(), self._sandbox.socket_dir if self._sandbox else None,
                         self._sandbox.uid if self._sandbox else None, self._kernel_alive,
                         self._collect_kernel_output)
        channel = Channel(link.serve, io_dir, time.monotonic() + limit)
        timed_out = False
        cwd = Path((resources or {}).get("metadata", {}).get("path") or ".")
        _hidden.set_grading_seed(self._submission_seed)
        verdict = []
        self._judge_printed, self._judge_printed_bytes = [], 0
        try:
            printed = run_judged(cell.source, channel, self._imports, cwd)
            if printed:
                verdict.append(from_dict({"output_type": "stream", "name": "stdout", "text": printed[-20000:]}))
        except KernelLost as err:
            self._kernel_died(cell, 0, str(err))
            return [error_output(KERNEL_DIED, self.death_reason)]
        except CellTimedOut:
            grade_id = contract.grade_id(cell) or "a test cell"
            verdict.append(error_output(TIMED_OUT, f"{grade_id} ran past the time limit of {limit} s and was stopped"))
            timed_out = True
        except BaseException as err:  # noqa: BLE001 - every failure of a check is a verdict
            if isinstance(err, (KeyboardInterrupt, SystemExit)):
                raise
            message = capped(error_text(err, self._language), VERDICT_LIMIT)
            verdict.append(error_output(type(err).__name__, message, f"{type(err).__name__}: {message}"))
        finally:
            _hidden.set_grading_seed(None)
            self._end_judging(link, channel, timed_out)   # the kernel's last output arrives here
        if contract.role(cell) is not Role.VISIBLE:
            return verdict
        # What the student's code printed, first (a visible test's inputs are the student's to see).
        return [from_dict({"output_type": "stream", "name": name, "text": text})
                for name, text in self._judge_printed] + verdict

    def _end_judging(self, link, channel, timed_out: bool) -> None:
        """Let go of the kernel's objects and end the probe's loop; a kernel still running the
        student's code after its time limit is stopped (the later cells are then not run)."""
        if timed_out and self._kernel_alive():
            if self._sandbox is not None:   # an interrupt does not reliably stop a sandboxed kernel
                self._stop_kernel()
            else:
                client = self._judge_client
                client.control_channel.send(client.session.msg("interrupt_request", content={}))
        elif self._kernel_alive() and link.conn is not None:
            channel.deadline = time.monotonic() + 10
            try:
                channel.request("release", None)
            except Exception:  # noqa: BLE001 - cleaning up kernel references is best effort
                pass
        if not link.close(10) and self._kernel_alive():
            if timed_out:
                self.log.warning("the kernel did not stop after its time limit; killing it")
                self._stop_kernel()
            else:   # it hung up on the grader (or never answered) and kept running
                self.log.warning("the kernel stopped answering the grader; killing it")
                self._stop_kernel("the kernel stopped answering the grader and was stopped")
        # Let go of the kernel's output stream until the next judged cell: what an answer cell
        # prints would otherwise pile up, unread, in this process.
        if self._judge_client is not None:
            self._judge_client.stop_channels()
            self._judge_client = None

    def _stop_kernel(self, reason: str = "the kernel did not stop after its time limit") -> None:
        self.km.provisioner.process.send_signal(signal.SIGKILL)
        self.death_reason = reason

    def _drain_iopub(self) -> None:
        """Each request of a judged cell leaves status messages on the notebook client's
        IOPub queue; past its high-water mark ZMQ would drop the next cell's messages, so
        the queue is emptied here."""
        async def drain() -> None:
            channel = self.kc.iopub_channel
            while await channel.msg_ready():
                await channel.get_msg(timeout=0)

        if self.kc is not None:
            try:
                run_sync(drain)()
            except Exception as err:  # noqa: BLE001 - an empty or closed queue is fine
                self.log.debug("IOPub drain: %s", err)

