"""``python -m autograder doctor [--device cuda]``: can a sandboxed kernel run here, and does
it see the GPU?

It checks, in order, and prints one line per check (``ok`` or ``FAIL`` with the reason):

1. PyTorch in this environment: its version, its CUDA build, and (``--device cuda``) that it
   sees a GPU;
2. the GPU's device nodes that the sandbox passes through (:func:`autograder.sandbox.gpu_devices`);
3. that bubblewrap can make a sandbox here;
4. inside a sandbox made exactly as for grading (same limits, same environment), that
   Python starts and imports torch and the course, and with ``--device cuda`` that
   ``torch.cuda.is_available()``, a bf16 training step on the GPU runs, and the kernel set-up
   made PyTorch deterministic (:func:`course.device.make_deterministic`).

Exit status 0 when every check passed, 1 otherwise. Run it first on a new GPU runner.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

from . import sandbox as sb
from .settings import GradingSettings

PROBE = r"""
import json, os, sys
found = {"python": sys.version.split()[0]}
import torch
import course
from course.device import get_device
found.update(torch=torch.__version__, cuda_build=torch.version.cuda, cuda=torch.cuda.is_available(),
             cublas=os.environ.get("CUBLAS_WORKSPACE_CONFIG"))
if os.environ.get("COURSE_DEVICE", "cpu").startswith("cuda") and found["cuda"]:
    device = get_device()
    found.update(gpus=torch.cuda.device_count(), name=torch.cuda.get_device_name(device),
                 deterministic=torch.are_deterministic_algorithms_enabled(),
                 bf16=torch.cuda.is_bf16_supported())
    model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 256)).to(device)
    x = torch.randn(64, 256, device=device)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(x).float().pow(2).mean()
    loss.backward()
    torch.cuda.synchronize()
    found["step"] = bool(torch.isfinite(loss).item())
    found["memory_gib"] = round(torch.cuda.get_device_properties(device).total_memory / 2**30, 1)
print("DOCTOR " + json.dumps(found))
"""


def _line(ok: bool, what: str, detail: str = "") -> bool:
    print(f"{'ok  ' if ok else 'FAIL'}  {what}" + (f": {detail}" if detail else ""), flush=True)
    return ok


def probe_in_sandbox(settings: GradingSettings, timeout: float = 300) -> tuple[dict | None, str]:
    """Run :data:`PROBE` in a sandbox made as for grading; (what it found, or None, and its
    error output)."""
    import course

    root = Path(tempfile.mkdtemp(prefix="course-doctor-"))
    box = sb.Sandbox(root, Path(course.__file__).parent, sb.Limits(memory_bytes=int(settings.memory_gb * (1 << 30))),
                     gpu=settings.device.startswith("cuda") or settings.device == "auto",
                     env=settings.kernel_environment())
    try:
        done = subprocess.run(box.prefix() + [sys.executable, "-c", PROBE], capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, f"no answer within {timeout:.0f} s"
    finally:
        box.cleanup()
    for line in done.stdout.splitlines():
        if line.startswith("DOCTOR "):
            return json.loads(line[len("DOCTOR "):]), done.stderr
    return None, (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]


def run_doctor(settings: GradingSettings) -> int:
    import torch

    cuda = settings.device.startswith("cuda")
    ok = _line(True, "PyTorch here", f"{torch.__version__}, CUDA build {torch.version.cuda or 'none (a CPU build)'}")
    if cuda:
        seen = torch.cuda.is_available()
        ok &= _line(seen, "PyTorch sees a GPU here",
                    torch.cuda.get_device_name(0) if seen else
                    "no: install a CUDA build of PyTorch and the NVIDIA driver (README: Grading on a GPU runner)")
        nodes = sb.gpu_devices()
        ok &= _line(any(Path(n).name.startswith("nvidia") and Path(n).name[6:].isdigit() for n in nodes)
                    and "/dev/nvidiactl" in nodes, "GPU device nodes passed to the sandbox",
                    ", ".join(nodes) or "none under /dev")
    if not settings.unsandboxed:
        usable = sb.available()
        ok &= _line(usable, "bubblewrap sandbox", sb.bwrap_path() if usable else sb.explain_unavailable())
        if not usable or (cuda and not ok):
            return _summary(ok)
        found, error = probe_in_sandbox(settings)
        if found is None:
            return _summary(_line(False, "a sandboxed Python with torch", error))
        ok &= _line(True, "a sandboxed Python with torch",
                    f"torch {found['torch']}, memory limit {settings.memory_gb:g} GiB")
        if cuda:
            ok &= _line(bool(found.get("cuda")), "the sandboxed kernel sees the GPU",
                        f"{found.get('gpus')} x {found.get('name')}, {found.get('memory_gib')} GiB"
                        if found.get("cuda") else "torch.cuda.is_available() is False inside: " + error[-300:])
            if found.get("cuda"):
                ok &= _line(bool(found.get("step")), "a bf16 training step on the GPU inside the sandbox")
                ok &= _line(bool(found.get("deterministic")) and found.get("cublas") == ":4096:8",
                            "deterministic CUDA set-up in the kernel",
                            f"use_deterministic_algorithms {found.get('deterministic')}, "
                            f"CUBLAS_WORKSPACE_CONFIG {found.get('cublas')}")
    return _summary(ok)


def _summary(ok: bool) -> int:
    print("doctor: every check passed" if ok else "doctor: some checks failed (FAIL lines above)")
    return 0 if ok else 1
