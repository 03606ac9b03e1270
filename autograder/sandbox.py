"""One sandbox per submission: the bubblewrap command line a kernel runs under.

What the kernel sees (everything else of the machine is absent):

- the Python installation and the course environment, read-only; of the course itself
  only ``course/`` (no ``solutions/``, ``autograder/``, gradebook, release or source trees,
  nor anyone else's submission);
- ``/etc``, ``/usr`` and the system libraries, read-only;
- an empty HOME (so no IPython start-up files from an earlier student), an empty /tmp and
  an empty working folder, all made for this submission alone and deleted afterwards;
- the folder of its kernel's sockets (Unix sockets: the network namespace is empty);
- GPU device nodes only when grading on a GPU (:func:`gpu_binds`), with ``/sys`` read-only,
  which the CUDA driver reads when it starts.

Namespaces: its own user, PID (it cannot see or signal the grader), network (none), IPC,
UTS and cgroup namespaces; ``--die-with-parent`` and ``--new-session``. Limits, set with
``prlimit`` before bubblewrap starts: memory (``RLIMIT_DATA``, which counts every
private allocation, so ``torch.empty`` fails instead of the machine swapping), processes
(``RLIMIT_NPROC``; as root, bubblewrap sets up the mounts and the kernel then drops to the
``nobody`` user with no capabilities, since root is exempt from process limits), the size of any file it writes, and open files. Output size is limited by the
executor, time by the per-cell limits.
"""

from __future__ import annotations

import os
import shutil
import sys
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

NOBODY = 65534
# Parallel workers run their kernels under distinct unprivileged ids (as root), so that one
# sandbox's processes never count against another's RLIMIT_NPROC.
WORKER_UIDS = 61000
SANDBOX_HOME = "/home/student"
SANDBOX_WORK = "/home/student/work"


class SandboxUnavailable(RuntimeError):
    """No way to isolate a kernel here; the message says how to install one."""


@dataclass(frozen=True)
class Limits:
    memory_bytes: int = 4 << 30          # RLIMIT_DATA
    processes: int = 256                 # RLIMIT_NPROC (per user: the kernel and its threads)
    file_bytes: int = 256 << 20          # RLIMIT_FSIZE: the largest file it may write
    open_files: int = 1024               # RLIMIT_NOFILE
    output_bytes: int = 2 << 20          # per cell, enforced by the executor


def bwrap_path() -> str | None:
    return shutil.which("bwrap")


def available() -> bool:
    """True when bubblewrap exists and can create the namespaces we ask for."""
    import subprocess

    path = bwrap_path()
    if not path or not sys.platform.startswith("linux"):
        return False
    probe = [path, "--ro-bind", "/", "/", *_namespaces(), "--proc", "/proc", "--dev", "/dev",
             *_drop_privileges(), "true"]
    try:
        return subprocess.run(probe, capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def explain_unavailable() -> str:
    if not sys.platform.startswith("linux"):
        return "the grading sandbox (bubblewrap) needs Linux"
    if not bwrap_path():
        return ("bubblewrap is not installed: `sudo apt-get install bubblewrap` (Debian/Ubuntu) or "
                "`sudo dnf install bubblewrap`")
    return ("bubblewrap cannot create namespaces here (user namespaces disabled?); try "
            "`sysctl kernel.unprivileged_userns_clone=1` or run the grader as root")


def sandbox_uid(worker: int | None) -> int:
    """The id a kernel runs under as root: ``nobody`` for a single grader, else one id per
    worker (no file on the host belongs to these ids)."""
    return NOBODY if worker is None else WORKER_UIDS + worker


def _drop_privileges(uid: int = NOBODY) -> list[str]:
    """As root, the kernel drops to an unprivileged id inside the sandbox (bubblewrap needs
    root to read the host paths it binds; process limits do not apply to root)."""
    if os.geteuid() == 0:
        return [shutil.which("setpriv") or "/usr/bin/setpriv", f"--reuid={uid}", f"--regid={uid}",
                "--clear-groups", "--bounding-set=-all", "--inh-caps=-all"]
    return []


def _namespaces() -> list[str]:
    if os.geteuid() == 0:   # root needs no user namespace, and nobody must stay unmapped-free
        return ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try"]
    return ["--unshare-all"]


def _process_allowance(limit: int) -> int:
    """RLIMIT_NPROC counts every process of the user: as root the kernel is ``nobody``
    alone, otherwise the user's other processes count too."""
    if os.geteuid() == 0:
        return limit
    uid, mine = os.getuid(), 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                mine += os.stat(f"/proc/{entry}").st_uid == uid
            except OSError:
                pass
    return mine + limit


def _python_roots() -> list[Path]:
    """Folders the interpreter and the installed packages live in."""
    roots = {Path(sys.prefix), Path(sys.base_prefix), Path(sys.exec_prefix), Path(sys.base_exec_prefix)}
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        roots.add(Path(sysconfig.get_paths()[key]))
    real = {Path(os.path.realpath(sys.executable)).parent.parent}
    return sorted(roots | real)


def _system_dirs() -> list[str]:
    return [d for d in ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/etc") if os.path.exists(d)]


#: The NVIDIA driver's device nodes a CUDA process opens, besides one ``nvidiaN`` per GPU:
#: the control node, unified memory (and its tools node, which profilers and driver 570+
#: open), the mode-setting node, and ``nvidia-caps/`` (MIG instances' capabilities).
NVIDIA_NODES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset", "nvidia-caps")


def gpu_devices(dev: Path | str = "/dev") -> list[str]:
    """The GPU device nodes present under ``dev``: ``nvidia0``, ``nvidia1``, ... (one per GPU),
    the :data:`NVIDIA_NODES` that exist, and ``dri/`` (render nodes) when present. Paths
    under ``dev``; nodes that are absent are left out."""
    dev = Path(dev)
    gpus = sorted((p for p in dev.glob("nvidia*") if p.name[len("nvidia"):].isdigit()),
                  key=lambda p: int(p.name[len("nvidia"):]))
    others = [dev / name for name in (*NVIDIA_NODES, "dri") if (dev / name).exists()]
    return [str(p) for p in [*gpus, *others]]


def gpu_binds(dev: Path | str = "/dev", sys_dir: Path | str = "/sys") -> list[str]:
    """bubblewrap arguments that give a sandbox the GPU: each device node of
    :func:`gpu_devices` with ``--dev-bind`` (a plain bind on the sandbox's ``/dev`` is not
    usable as a device), at its place under ``/dev``, and ``sys_dir`` read-only at ``/sys``
    (without it the driver's ``cuInit`` fails with CUDA_ERROR_OPERATING_SYSTEM)."""
    args: list[str] = []
    for node in gpu_devices(dev):
        args += ["--dev-bind", node, "/dev/" + str(Path(node).relative_to(dev))]
    if args and Path(sys_dir).is_dir():
        args += ["--ro-bind", str(sys_dir), "/sys"]
    return args


@dataclass
class Sandbox:
    """The folders of one submission's sandbox, and the command that runs a kernel in it.

    ``root`` is a fresh folder on the host: ``home/``, ``tmp/``, ``io/`` (requests and
    replies of the trusted side) and ``sockets/`` (the kernel's connection). ``course_dir``
    is the ``course`` package, the only part of the repository the kernel may read.
    """

    root: Path
    course_dir: Path
    limits: Limits = field(default_factory=Limits)
    gpu: bool = False
    env: dict[str, str] = field(default_factory=dict)
    uid: int = NOBODY                    # as root: the id the kernel runs under

    def __post_init__(self) -> None:
        self.root = Path(self.root).resolve()
        for name in ("home", "home/work", "tmp", "io", "sockets"):
            (self.root / name).mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:  # the kernel runs as nobody: let it write its own folders
            for name in ("home", "home/work", "tmp", "io", "sockets"):
                os.chown(self.root / name, self.uid, self.uid)
            os.chmod(self.root, 0o755)

    @property
    def io_dir(self) -> Path:
        """Seen at the same path inside and outside."""
        return self.root / "io"

    @property
    def socket_dir(self) -> Path:
        return self.root / "sockets"

    def prefix(self) -> list[str]:
        """Everything before the kernel's own command line."""
        bwrap = bwrap_path()
        if not bwrap:
            raise SandboxUnavailable(explain_unavailable())
        lim = self.limits
        cmd = [shutil.which("prlimit") or "prlimit", f"--data={lim.memory_bytes}", f"--nproc={_process_allowance(lim.processes)}",
               f"--fsize={lim.file_bytes}", f"--nofile={lim.open_files}", "--core=0", "--"]
        cmd += [bwrap, *_namespaces(), "--die-with-parent", "--new-session", "--clearenv",
                "--proc", "/proc", "--dev", "/dev"]
        for d in _system_dirs():
            cmd += ["--ro-bind", d, d]
        course = Path(self.course_dir).resolve()
        binds = [d for d in _python_roots() if d.exists() and not any(str(d).startswith(s + "/") for s in _system_dirs())]
        # Folders above a bound path are made by bubblewrap; as nobody the kernel must be able
        # to pass through them (on the host, /root is closed to it).
        # /tmp and HOME first: the folders below may live under the host's /tmp.
        cmd += ["--bind", str(self.root / "tmp"), "/tmp", "--perms", "0755", "--dir", "/home",
                "--bind", str(self.root / "home"), SANDBOX_HOME]
        parents = sorted({p for d in [*binds, course, self.io_dir, self.socket_dir] for p in d.parents
                          if str(p) not in ("/", "/tmp", "/home", *_system_dirs())}, key=lambda p: len(p.parts))
        for p in parents:
            cmd += ["--perms", "0755", "--dir", str(p)]
        for d in binds:
            cmd += ["--ro-bind", str(d), str(d)]
        cmd += ["--ro-bind", str(course), str(course)]
        cmd += ["--bind", str(self.io_dir), str(self.io_dir),
                "--bind", str(self.socket_dir), str(self.socket_dir),
                "--chdir", SANDBOX_WORK]
        if self.gpu:
            cmd += gpu_binds()
        for key, value in self.environment().items():
            cmd += ["--setenv", key, value]
        # Its own process group: ipykernel interrupts a running cell by signalling its group
        # (the sandbox's first process belongs to root, out of the kernel's reach).
        return cmd + ["--"] + _drop_privileges(self.uid) + [shutil.which("setsid") or "/usr/bin/setsid"]

    def environment(self) -> dict[str, str]:
        """The kernel's whole environment: nothing of the grader's leaks in."""
        bindir = str(Path(sys.executable).parent)
        env = {"PATH": f"{bindir}:/usr/local/bin:/usr/bin:/bin", "HOME": SANDBOX_HOME, "TMPDIR": "/tmp",
               "IPYTHONDIR": f"{SANDBOX_HOME}/.ipython", "MPLCONFIGDIR": "/tmp/matplotlib",
               "XDG_CACHE_HOME": "/tmp/cache", "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1",
               "PYDEVD_DISABLE_FILE_VALIDATION": "1"}
        if self.gpu:
            env["CUDA_CACHE_PATH"] = "/tmp/cuda-cache"
            if os.environ.get("LD_LIBRARY_PATH"):   # where some images keep the driver's libcuda
                env["LD_LIBRARY_PATH"] = os.environ["LD_LIBRARY_PATH"]
        env.update(self.env)
        return env

    def cleanup(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
