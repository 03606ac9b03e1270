"""A sandboxed kernel's start: started cold (it imports PyTorch and ipykernel itself) against
forked from the zygote (autograder/zygote.py), in the same run.

Each start makes a fresh sandbox and kernel as the grader does, with chapter 1's set-up
imports as its warm-up, waits until the kernel answers, runs one cell that uses PyTorch,
and ends it. The table gives the median seconds until the kernel answered and the CPU the
whole machine spent per kernel (busy time read from /proc/stat: a forked kernel is the
zygote's child, not this process's), and the zygote's resident memory. Needs root and
bubblewrap; nothing here asserts a time.

    sudo .venv/bin/python benchmarks/kernel_start.py --kernels 6
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SETUP_IMPORTS = "import torch\nimport torch.nn as nn\nfrom course.checks import ch01 as checks\nfrom course.data import load_shakespeare"


def busy_seconds() -> float:
    with open("/proc/stat", encoding="ascii") as f:
        fields = [int(v) for v in f.readline().split()[1:]]
    return (sum(fields[:3]) + sum(fields[5:8])) / os.sysconf("SC_CLK_TCK")


async def one_kernel() -> float:
    """Seconds from asking for a kernel to its first answer (a fresh sandbox each time)."""
    import course
    from autograder.executor import SandboxedKernelManager, warmup_arguments
    from autograder.sandbox import Limits, Sandbox

    box = Sandbox(Path(tempfile.mkdtemp(prefix="course-sandbox-")), Path(course.__file__).parent, Limits(),
                  env={"COURSE_DEVICE": "cpu"})
    km = SandboxedKernelManager.in_sandbox(box)
    try:
        started = time.perf_counter()
        await km.start_kernel(extra_arguments=warmup_arguments(SETUP_IMPORTS))
        client = km.client()
        client.start_channels()
        await client.wait_for_ready(timeout=300)
        answered = time.perf_counter() - started
        await client.execute_interactive("import torch; torch.ones(3).sum()", timeout=120, output_hook=lambda m: None)
        client.stop_channels()
        return answered
    finally:
        await km.shutdown_kernel(now=True)
        box.cleanup()


def measure(kernels: int, forked: bool) -> tuple[float, float]:
    """Median seconds to answer, and machine CPU seconds per kernel."""
    from autograder import zygote

    os.environ[zygote.NO_ZYGOTE_SWITCH] = "0" if forked else "1"
    if forked:      # the zygote's own start is paid once per grading process: not counted here
        asyncio.run(one_kernel())
    before = busy_seconds()
    answers = [asyncio.run(one_kernel()) for _ in range(kernels)]
    return statistics.median(answers), (busy_seconds() - before) / kernels


def zygote_memory_mb() -> float:
    from autograder import zygote

    for process in [z.process for z in zygote._ZYGOTES.values() if z is not None]:
        with open(f"/proc/{process.pid}/status", encoding="ascii") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024
    return float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernels", type=int, default=6)
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("the zygote forks kernels only as root")
    cold = measure(args.kernels, forked=False)
    forked = measure(args.kernels, forked=True)
    print(f"{args.kernels} kernels each, {os.cpu_count()} CPU cores; zygote resident memory {zygote_memory_mb():.0f} MB\n")
    print("| kernel | seconds to answer (median) | machine CPU s per kernel |")
    print("| ------ | -------------------------- | ------------------------ |")
    for name, (seconds, cpu) in (("cold", cold), ("forked from the zygote", forked)):
        print(f"| {name} | {seconds:.2f} | {cpu:.2f} |")
    print(f"\ncold / forked: {cold[0] / forked[0]:.1f}x the wait, {cold[1] / forked[1]:.1f}x the CPU")


if __name__ == "__main__":
    main()
