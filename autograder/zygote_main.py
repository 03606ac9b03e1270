"""The kernel zygote: one process per grading process that imports what every kernel imports
(PyTorch and ipykernel) once, then forks each notebook's kernel into that notebook's own
sandbox.

Run by :mod:`autograder.zygote` as ``python -s -c <this file's text> FD course-kernel-zygote``,
as root, outside any sandbox, with the kernel's whole environment (its ``PYTHONPATH`` is the
kernel's view of the course: nothing of the grader is importable here). Only the text
travels. It holds nothing of any student and nothing of the grader: PyTorch and ipykernel,
imported as a cold kernel imports them, and the socket ``FD`` it is asked on.

For each request (a JSON line: the host PID of a sandbox's holder, see
``zygote_holder.py``, and what bubblewrap and ``prlimit`` would have given the kernel) it
forks a child that joins the holder's namespaces (cgroup, IPC, UTS, network, PID, mount),
then forks the kernel, which is born in the sandbox's PID namespace. The kernel then does
what the cold path's ``prlimit``, bubblewrap (``--new-session``, ``--seccomp``) and
``setpriv`` (``--clear-groups --bounding-set=-all --inh-caps=-all``) do: its own session,
the limits, no capability, the sandbox's user id, no new privileges, the seccomp program;
it closes every descriptor but the kernel log, and becomes ``ipykernel_launcher``.
The child reports the kernel's host PID and exits; this process reaps it (and, as the
kernels' subreaper, the kernels when they end).
"""

import ctypes
import json
import os
import resource
import signal
import sys

PR_SET_DUMPABLE, PR_SET_SECCOMP, PR_CAPBSET_DROP, PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS = 4, 22, 24, 36, 38
PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 47, 4
SECCOMP_MODE_FILTER = 2
# the mount namespace last: the holder's /proc/PID/ns files are read in the host's
NAMESPACES = ("cgroup", "ipc", "uts", "net", "pid", "mnt")

libc = ctypes.CDLL(None, use_errno=True)


class _Program(ctypes.Structure):                      # struct sock_fprog
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]


class _CapHeader(ctypes.Structure):                    # struct __user_cap_header_struct
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):                      # struct __user_cap_data_struct
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def _ok(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def started(pid: int) -> int:
    """When ``pid`` started (clock ticks since boot): with its PID, a process's identity."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        return int(f.read().rsplit(b")", 1)[1].split()[19])


def _join(holder: int, holder_started: int) -> None:
    """Enter the namespaces of the sandbox whose holder is host PID ``holder``, started at
    ``holder_started``: the same process before and after its namespaces are opened (a PID
    taken by another process meanwhile is refused), and namespaces that are not this
    process's own (only the cgroup one may be: --unshare-cgroup-try)."""
    own = {ns: os.stat(f"/proc/self/ns/{ns}").st_ino for ns in NAMESPACES if os.path.exists(f"/proc/self/ns/{ns}")}
    if started(holder) != holder_started:
        raise OSError(f"process {holder} is no longer the sandbox's holder")
    opened = [(ns, os.open(f"/proc/{holder}/ns/{ns}", os.O_RDONLY)) for ns in own]
    if started(holder) != holder_started:
        raise OSError(f"process {holder} is no longer the sandbox's holder")
    for ns, fd in opened:
        if os.fstat(fd).st_ino != own[ns]:
            _ok(libc.setns(fd, 0), f"setns {ns}")
        elif ns != "cgroup":
            raise OSError(f"the sandbox shares this process's {ns} namespace")
        os.close(fd)


def _drop_privileges(uid: int) -> None:
    """setpriv's --clear-groups --bounding-set=-all --inh-caps=-all, then the user id."""
    cap = 0
    while libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) == 0:
        cap += 1
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)          # from root to another id: permitted and effective emptied
    libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)   # as after setpriv's exec: its /proc files are its own
    libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    data = (_CapData * 2)()
    _ok(libc.capset(ctypes.byref(_CapHeader(0x20080522, 0)), data), "capset")
    _ok(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")


def _filter(program: bytes) -> None:
    if program:
        fprog = _Program(len(program) // 8, program)
        _ok(libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0), "seccomp")


def _become_kernel(request: dict, log: int, program: bytes) -> None:
    """In the sandbox's PID namespace: the rest of the sandbox, then ipykernel (never returns)."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    null = os.open("/dev/null", os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.setsid()
    os.chdir(request["cwd"])
    os.environ["PWD"] = request["cwd"]       # as bubblewrap's --chdir sets it
    for name, value in request["limits"].items():
        resource.setrlimit(getattr(resource, name), (value, value))
    _drop_privileges(request["uid"])
    _filter(program)
    os.closerange(3, os.sysconf("SC_OPEN_MAX"))
    sys.argv = ["ipykernel_launcher", *request["argv"]]
    from ipykernel import kernelapp

    kernelapp.launch_new_instance()
    os._exit(0)


def _spawn(request: dict, report: int) -> None:
    """The forked child: join the sandbox, fork the kernel, report its PID (or why not), exit."""
    try:
        log = os.open(request["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        program = b""
        if request.get("seccomp"):
            with open(request["seccomp"], "rb") as f:
                program = f.read()
        _join(request["holder"], request["holder_started"])
        pid = os.fork()
        if pid == 0:
            try:
                _become_kernel(request, log, program)
            except BaseException:  # noqa: BLE001 - said in the kernel log; the grader sees the kernel die
                import traceback

                os.write(log, traceback.format_exc().encode())
            os._exit(70)
        os.write(report, json.dumps({"pid": pid}).encode() + b"\n")
    except BaseException as error:  # noqa: BLE001 - said to the grader, which starts the kernel cold
        os.write(report, json.dumps({"error": f"{type(error).__name__}: {error}"}).encode() + b"\n")
    os._exit(0)


def main() -> None:
    control = int(sys.argv[1])
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)            # the kernels, once their child exits
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)             # ... and are reaped without a wait
    sys.path[:] = [p for p in sys.path if p]                  # as ipykernel_launcher: not the cwd
    # NumPy's OpenBLAS starts its threads as it loads, and a fork keeps only the calling
    # thread: loaded here with none, it runs single-threaded in the kernels (PyTorch, which
    # the notebooks compute with, starts its own threads in each kernel, after the fork).
    blas = os.environ.get("OPENBLAS_NUM_THREADS")
    os.environ["OPENBLAS_NUM_THREADS"] = "1"
    # Only what comes with Python's installation, read-only in every sandbox: nothing of
    # the course runs here (its modules, and any data they read, are imported in the
    # sandbox by the kernel's warm-up, where the held-out files are replaced).
    import torch  # noqa: F401 - every notebook's set-up cell imports it
    # The first backward pass given a gradient imports this (and SymPy with it): half a
    # CPU-second in every kernel that trains anything, paid here once instead.
    import torch.fx.experimental.symbolic_shapes  # noqa: F401
    from ipykernel import kernelapp  # noqa: F401

    if blas is None:                                           # the kernel's environment as given
        del os.environ["OPENBLAS_NUM_THREADS"]
    else:
        os.environ["OPENBLAS_NUM_THREADS"] = blas
    threads = len(os.listdir("/proc/self/task"))             # fork keeps only the calling thread
    requests = os.fdopen(control, "rb", buffering=0)
    os.write(control, json.dumps({"ready": threads == 1, "threads": threads}).encode() + b"\n")
    while True:
        line = requests.readline()
        if not line:                # the grading process closed the socket, or ended
            os._exit(0)
        request = json.loads(line)
        report_r, report_w = os.pipe()
        if os.fork() == 0:
            os.close(report_r)
            requests.close()
            _spawn(request, report_w)
        os.close(report_w)
        with os.fdopen(report_r, "rb") as reported:
            os.write(control, reported.readline() or b'{"error": "the zygote\'s child died"}\n')


if __name__ == "__main__":
    main()
