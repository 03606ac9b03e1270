"""What a process that may use CUDA must find in its environment before CUDA starts.

Kept free of torch, so that the grader can put it into a kernel's environment without
importing PyTorch itself (:mod:`course.device` uses it inside the kernel).
"""

from __future__ import annotations

# cuBLAS gives bitwise repeatable matrix products only with a fixed workspace configuration
# (PyTorch's notes on reproducibility); it is read when cuBLAS starts, so the grader puts it
# into the kernel's environment.
CUBLAS_WORKSPACE = ("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


def cuda_environment(device: str) -> dict[str, str]:
    """Environment variables a process that may use CUDA (``cuda``, ``cuda:N``, ``auto``)
    needs before CUDA starts, for deterministic results; none for ``cpu``. Harmless on a
    machine without a GPU."""
    wanted = str(device).strip().lower()
    return dict([CUBLAS_WORKSPACE]) if wanted.startswith("cuda") or wanted == "auto" else {}
