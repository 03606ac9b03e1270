"""One sandbox per submission: the bubblewrap command line a kernel runs under.

What the kernel sees (everything else of the machine is absent):

- the Python installation and the course environment, read-only; of the course itself
  only ``course/`` (no ``solutions/``, ``autograder/``, gradebook, release or source trees,
  nor anyone else's submission);
- ``/etc``, ``/usr`` and the system libraries, read-only;
- an empty HOME (so no IPython start-up files from an earlier student) holding an empty
  working folder, and an empty /tmp: two fresh tmpfs, each bounded in bytes and in files
  (:attr:`Limits.disk_bytes`, :attr:`Limits.disk_files`; set by :mod:`.sandbox_init`), gone
  with the sandbox;
- the folder of its kernel's sockets (Unix sockets: the network namespace is empty);
- GPU device nodes only when grading on a GPU (:func:`gpu_binds`), with ``/sys`` read-only,
  which the CUDA driver reads when it starts.

Namespaces: its own user, PID (it cannot see or signal the grader), network (none), IPC,
UTS and cgroup namespaces; ``--die-with-parent`` and ``--new-session``; no locks, file
notifications or new namespaces (:mod:`.sandbox_filter`), so that files two sandboxes
both read carry nothing from one to the other. Limits, set with ``prlimit`` before
bubblewrap starts: memory (``RLIMIT_DATA``, which counts every private allocation, so
``torch.empty`` fails instead of the machine swapping), processes (``RLIMIT_NPROC``, which
Linux counts per user id: as root, bubblewrap sets up the mounts and the kernel then drops,
with no capabilities, to a user id that no other live sandbox on the machine holds,
:mod:`.sandbox_ids`), the size of any file it writes, and open files. Output size is
limited by the executor, time by the per-cell limits.
"""

from __future__ import annotations

import functools
import os
import shutil
import sys
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

from . import sandbox_filter, sandbox_ids

SETUP = Path(__file__).with_name("sandbox_init.py")   # the sandbox's first process (its text)
SANDBOX_HOME = "/home/student"
SANDBOX_WORK = "/home/student/work"


class SandboxUnavailable(RuntimeError):
    """No way to isolate a kernel here; the message says how to install one."""


@dataclass(frozen=True)
class Limits:
    memory_bytes: int = 4 << 30          # RLIMIT_DATA
    processes: int = 256                 # RLIMIT_NPROC (per user id: the kernel and its threads)
    file_bytes: int = 256 << 20          # RLIMIT_FSIZE: the largest file it may write
    disk_bytes: int = 512 << 20          # HOME and /tmp together (tmpfs: held in memory)
    disk_files: int = 1 << 15            # files and folders in HOME and /tmp together
    open_files: int = 1024               # RLIMIT_NOFILE


def bwrap_path() -> str | None:
    return shutil.which("bwrap")


def available() -> bool:
    """True when bubblewrap exists and a sandbox made as for grading runs a command."""
    import subprocess
    import tempfile

    if not bwrap_path() or not sys.platform.startswith("linux"):
        return False
    try:   # any folder will do as the course here: the probe only runs `true`
        box = Sandbox(Path(tempfile.mkdtemp(prefix="course-sandbox-probe-")), Path(__file__).parent)
    except (OSError, RuntimeError):
        return False
    try:
        return subprocess.run([*box.prefix(), "true"], capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False
    finally:
        box.cleanup()


def explain_unavailable() -> str:
    if not sys.platform.startswith("linux"):
        return "the grading sandbox (bubblewrap) needs Linux"
    if not bwrap_path():
        return ("bubblewrap is not installed: `sudo apt-get install bubblewrap` (Debian/Ubuntu) or "
                "`sudo dnf install bubblewrap`")
    return ("bubblewrap cannot create namespaces here (user namespaces disabled?); try "
            "`sysctl kernel.unprivileged_userns_clone=1` or run the grader as root")


def _drop_privileges(uid: int) -> list[str]:
    """As root, the kernel drops to an unprivileged id inside the sandbox (bubblewrap needs
    root to read the host paths it binds; process limits do not apply to root)."""
    if os.geteuid() == 0:
        return [shutil.which("setpriv") or "/usr/bin/setpriv", f"--reuid={uid}", f"--regid={uid}",
                "--clear-groups", "--bounding-set=-all", "--inh-caps=-all"]
    return []


def _namespaces() -> list[str]:
    if os.geteuid() == 0:   # root needs no user namespace: the kernel's id is a real one
        return ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try"]
    return ["--unshare-all"]


@functools.cache
def _sizes_tmpfs() -> bool:
    """Whether this bubblewrap sizes a tmpfs (``--size``; 0.8.0 does)."""
    import subprocess

    try:
        shown = subprocess.run([bwrap_path(), "--help"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return "--size" in shown


def _setup_step(uid: int, limits: Limits) -> list[str]:
    """As root, the sandbox's first process (:mod:`.sandbox_init`) bounds its two tmpfs in
    bytes and in files, then drops to ``uid``. Without root, only bubblewrap's ``--size``
    bounds them (a user namespace may not remount them), and the ids are the user's."""
    if os.geteuid() != 0:
        return []
    return [sys.executable, "-I", "-S", "-c", SETUP.read_text(encoding="utf-8"), str(uid),
            str(limits.disk_bytes // 2), str(limits.disk_files // 2), SANDBOX_HOME, SANDBOX_WORK, "--",
            *_drop_privileges(uid)]


def _process_allowance(limit: int) -> int:
    """RLIMIT_NPROC counts every process of the user id: as root the kernel's id is the
    sandbox's alone, otherwise the user's other processes count too."""
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

    ``root`` is a fresh folder on the host: ``io/`` (requests and replies of the trusted
    side), ``sockets/`` (the kernel's connection) and the seccomp program. ``course_dir``
    is the ``course`` package, the only part of the repository the kernel may read. As
    root, the sandbox holds a user id of its own (``uid``) from creation to :meth:`cleanup`.
    """

    root: Path
    course_dir: Path
    limits: Limits = field(default_factory=Limits)
    gpu: bool = False
    env: dict[str, str] = field(default_factory=dict)
    # host file -> what the kernel reads at its path instead (the held-out test data)
    replaced: dict[Path, Path] = field(default_factory=dict)
    uid: int = field(init=False)         # the id the kernel runs under
    _lease: sandbox_ids.IdLease | None = field(init=False, default=None, repr=False)

    def __post_init__(self) -> None:
        self.root = Path(self.root).resolve()
        for name in ("io", "sockets"):
            (self.root / name).mkdir(parents=True, exist_ok=True)
        self.uid = os.getuid()
        if os.geteuid() == 0:  # the kernel runs under its own id: let it write its own folders
            self._lease = sandbox_ids.lease()
            self.uid = self._lease.uid
            for name in ("io", "sockets"):
                os.chown(self.root / name, self.uid, self.uid)
            os.chmod(self.root, 0o755)
        program = sandbox_filter.program()
        if program is not None:
            (self.root / "seccomp.bpf").write_bytes(program)

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
        lim, program = self.limits, self.root / "seccomp.bpf"
        cmd = [shutil.which("prlimit") or "prlimit",
               *(f"--{name.removeprefix('RLIMIT_').lower()}={value}" for name, value in self.rlimits().items()), "--"]
        if program.exists():   # bubblewrap reads the program from a descriptor: open it as 3
            cmd = ["/bin/sh", "-c", 'exec "$@" 3<"$0"', str(program), *cmd]
        cmd += [bwrap, *_namespaces(), "--die-with-parent", "--new-session", "--clearenv",
                "--proc", "/proc", "--dev", "/dev"]
        if program.exists():
            cmd += ["--seccomp", "3"]
        for d in _system_dirs():
            cmd += ["--ro-bind", d, d]
        cmd += self._binds()
        cmd += ["--chdir", SANDBOX_WORK]
        if self.gpu:
            cmd += gpu_binds()
        for key, value in self.environment().items():
            cmd += ["--setenv", key, value]
        # Its own process group: ipykernel interrupts a running cell by signalling its group
        # (the sandbox's first process belongs to root, out of the kernel's reach).
        return cmd + ["--", *_setup_step(self.uid, lim), shutil.which("setsid") or "/usr/bin/setsid"]

    def rlimits(self) -> dict[str, int]:
        """The kernel's resource limits (``prlimit`` sets them on the cold path)."""
        lim = self.limits
        return {"RLIMIT_DATA": lim.memory_bytes, "RLIMIT_NPROC": _process_allowance(lim.processes),
                "RLIMIT_FSIZE": lim.file_bytes, "RLIMIT_NOFILE": lim.open_files, "RLIMIT_CORE": 0}

    def _binds(self) -> list[str]:
        """The sandbox's own tmpfs at /tmp and HOME, then the host folders it reads or
        shares with the grader."""
        course = Path(self.course_dir).resolve()
        binds = [d for d in _python_roots() if d.exists() and not any(str(d).startswith(s + "/") for s in _system_dirs())]
        # /tmp and HOME first: the folders below may live under the host's /tmp.
        size = ["--size", str(self.limits.disk_bytes // 2)] if _sizes_tmpfs() else []
        cmd = [*size, "--tmpfs", "/tmp", "--dir", "/home", *size, "--tmpfs", SANDBOX_HOME, "--dir", SANDBOX_WORK]
        # Folders above a bound path are made by bubblewrap; the kernel must be able to pass
        # through them (on the host, /root is closed to it).
        parents = sorted({p for d in [*binds, course, self.io_dir, self.socket_dir] for p in d.parents
                          if str(p) not in ("/", "/tmp", "/home", *_system_dirs())}, key=lambda p: len(p.parts))
        for p in parents:
            cmd += ["--perms", "0755", "--dir", str(p)]
        for d in binds:
            cmd += ["--ro-bind", str(d), str(d)]
        cmd += ["--ro-bind", str(course), str(course)]
        for hidden, shown in sorted(self.replaced.items()):   # after the folders that hold them
            cmd += ["--ro-bind", str(shown), str(hidden)]
        return cmd + ["--bind", str(self.io_dir), str(self.io_dir), "--bind", str(self.socket_dir), str(self.socket_dir)]

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
        """Remove the folders, then give the user id back (its kernel has ended)."""
        shutil.rmtree(self.root, ignore_errors=True)
        if self._lease is not None:
            self._lease.release()
            self._lease = None
