"""Where things are and how grading runs: repository paths, device, time limits."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

DEVICE_ENV = "COURSE_DEVICE"          # read by course.device inside the kernel
TIMEOUT_ENV = "COURSE_CELL_TIMEOUT"   # seconds per cell
PROFILE_ENV = "COURSE_PROFILE"        # capstone budgets: smoke, cpu or gpu
MEMORY_ENV = "COURSE_MEMORY_GB"       # memory limit of a sandboxed kernel
DRY_RUN_ENV = "COURSE_DRY_RUN"        # "1": a dry run of the profile (grade --dry-run only)
PROFILES = ("smoke", "cpu", "gpu")
DEFAULT_TIMEOUT = 300
COURSE_ID = "transformers-by-building"


def repo_root(start: Path | None = None) -> Path:
    """The course repository: the folder holding ``_config.yml`` and ``solutions/``."""
    candidates = [start] if start else [Path.cwd(), Path(__file__).resolve().parents[1]]
    for base in candidates:
        for folder in [base, *base.parents]:
            if (folder / "_config.yml").is_file() and (folder / "solutions").is_dir():
                return folder
    raise FileNotFoundError(
        "Cannot find the course repository (a folder with _config.yml and solutions/). "
        "Run from inside it or pass --root."
    )


@dataclass(frozen=True)
class GradingSettings:
    """What reaches the kernel: the device, the default per-cell time limit in seconds, and
    the capstone profile. Cells may carry their own limit per profile (cell metadata
    ``course.timeout``), read from the released notebook, never from the submission."""

    device: str = "cpu"
    cell_timeout: int = DEFAULT_TIMEOUT
    profile: str = "cpu"
    unsandboxed: bool = False        # grade without a sandbox (asked for explicitly; noted in every row)
    memory_gb: float = 4.0           # memory limit of one submission's kernel
    seed: int | None = None          # hidden-test inputs; None: drawn when grading starts
    dry_run: bool = False            # grade --dry-run: the profile's models, a few steps and items

    @classmethod
    def from_env(cls, device: str | None = None, cell_timeout: int | None = None,
                 profile: str | None = None, unsandboxed: bool = False, memory_gb: float | None = None,
                 seed: int | None = None, dry_run: bool = False) -> "GradingSettings":
        """CLI values win; then the environment; then the defaults (CPU, 300 s, cpu profile).
        A dry run comes from the command line only (``grade --dry-run``): a ``COURSE_DRY_RUN``
        left in the shell is overwritten, never read."""
        profile = (profile or os.environ.get(PROFILE_ENV) or "cpu").strip().lower()
        if profile not in PROFILES:
            raise ValueError(f"profile must be one of {', '.join(PROFILES)}, not {profile!r}")
        device = device or os.environ.get(DEVICE_ENV) or "cpu"
        if device not in ("cpu", "auto") and not device.startswith("cuda"):
            raise ValueError(f"device must be cpu, cuda, cuda:N or auto, not {device!r}")
        if cell_timeout is None:
            raw = os.environ.get(TIMEOUT_ENV, str(DEFAULT_TIMEOUT))
            try:
                cell_timeout = int(raw)
            except ValueError:
                raise ValueError(f"{TIMEOUT_ENV}={raw!r} is not a whole number of seconds") from None
        if cell_timeout <= 0:
            raise ValueError(f"the cell time limit must be positive, not {cell_timeout}")
        memory_gb = float(memory_gb if memory_gb is not None else os.environ.get(MEMORY_ENV, 4))
        if memory_gb <= 0:
            raise ValueError(f"the memory limit must be positive, not {memory_gb} GiB")
        return cls(device=device, cell_timeout=cell_timeout, profile=profile, unsandboxed=unsandboxed,
                   memory_gb=memory_gb, seed=seed, dry_run=bool(dry_run))

    def kernel_environment(self) -> dict[str, str]:
        """What a sandboxed kernel's environment holds of the settings (and, on a GPU, what
        CUDA must read before it starts: :func:`course.cuda_env.cuda_environment`)."""
        from course.cuda_env import cuda_environment

        return {DEVICE_ENV: self.device, TIMEOUT_ENV: str(self.cell_timeout), PROFILE_ENV: self.profile,
                DRY_RUN_ENV: "1" if self.dry_run else "0", **cuda_environment(self.device)}

    def apply_to_environment(self) -> None:
        """Kernels inherit this process's environment: put the settings there.

        The ``python3`` kernelspec runs ``python`` from PATH, so this environment's
        ``bin`` goes first (nbgrader's alembic call needs it too).
        """
        from course.cuda_env import cuda_environment

        os.environ[DEVICE_ENV] = self.device
        os.environ[TIMEOUT_ENV] = str(self.cell_timeout)
        os.environ[PROFILE_ENV] = self.profile
        os.environ[DRY_RUN_ENV] = "1" if self.dry_run else "0"
        for key, value in cuda_environment(self.device).items():
            os.environ.setdefault(key, value)
        bindir = str(Path(sys.executable).parent)
        if os.environ.get("PATH", "").split(os.pathsep)[0] != bindir:
            os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")
