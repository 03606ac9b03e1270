"""Device selection: one place decides where tensors live.

The environment variable ``COURSE_DEVICE`` wins (``cpu``, ``cuda``, ``cuda:1`` or
``auto``); otherwise CUDA is used when available. The autograder sets the variable so that
a grading run on a GPU runner and one on a laptop differ only in this setting.

On CUDA, :func:`get_device` also makes PyTorch deterministic (:func:`determinism_for` says
what, :func:`make_deterministic` does it), so that the same submission gets the same score
on the same GPU; on the CPU nothing is changed.
"""

from __future__ import annotations

import os

import torch

from .cuda_env import CUBLAS_WORKSPACE, cuda_environment  # noqa: F401 (re-exported)

ENV_VAR = "COURSE_DEVICE"


def determinism_for(device: torch.device | str) -> dict[str, object]:
    """What grading sets on ``device`` so that the same code on the same GPU gives the same
    numbers: ``{}`` on the CPU (PyTorch's CPU kernels used by the course are already
    repeatable run to run with the same threads), else the cuBLAS workspace, deterministic
    algorithms (``warn_only``: an operation without a deterministic version warns on stderr,
    which costs no points, instead of failing the student's cell), cuDNN's deterministic
    mode and no cuDNN autotuning (the benchmark picks algorithms by timing)."""
    if torch.device(device).type != "cuda":
        return {}
    return {"env": dict([CUBLAS_WORKSPACE]), "use_deterministic_algorithms": True, "warn_only": True,
            "cudnn.deterministic": True, "cudnn.benchmark": False}


def make_deterministic(device: torch.device | str) -> dict[str, object]:
    """Apply :func:`determinism_for` ``device`` to this process; returns what was applied."""
    settings = determinism_for(device)
    if not settings:
        return settings
    for key, value in settings["env"].items():
        os.environ.setdefault(key, value)
    torch.use_deterministic_algorithms(settings["use_deterministic_algorithms"], warn_only=settings["warn_only"])
    torch.backends.cudnn.deterministic = settings["cudnn.deterministic"]
    torch.backends.cudnn.benchmark = settings["cudnn.benchmark"]
    return settings


def get_device() -> torch.device:
    """Return the device named by ``COURSE_DEVICE``, or the best available one; on CUDA,
    PyTorch is made deterministic first (:func:`make_deterministic`)."""
    device = _named_device()
    if device.type == "cuda":
        make_deterministic(device)
    return device


def _named_device() -> torch.device:
    wanted = os.environ.get(ENV_VAR, "auto").strip().lower() or "auto"
    if wanted == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if wanted.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError(
            f"{ENV_VAR}={wanted!r} asks for a GPU, but PyTorch sees none "
            f"(torch {torch.__version__}, CUDA build: {torch.version.cuda is not None}). "
            f"Unset {ENV_VAR} or set it to 'cpu'."
        )
    try:
        return torch.device(wanted)
    except RuntimeError as err:
        raise ValueError(f"{ENV_VAR}={wanted!r} is not a device name: use cpu, cuda or auto") from err


def seed_everything(seed: int) -> torch.Generator:
    """Seed Python, PyTorch (CPU and CUDA) and return a CPU generator with that seed."""
    import random

    random.seed(seed)
    torch.manual_seed(seed)
    return torch.Generator().manual_seed(seed)
