"""What a grading process costs before it grades anything: the CPU of starting Python with
what each kind of process imports, and of the interpreter's teardown at exit.

Every kernel, grading worker and preflight imports PyTorch; a spawned worker also imports
nbgrader and the grader. This runs each start-up as a fresh process, ``--repeats`` times,
once ending as Python normally does and once with ``os._exit`` right after the imports,
and prints the median user+system CPU seconds of each (read from ``RUSAGE_CHILDREN``).
The gap is what a process that is killed, or ends with ``os._exit``, does not pay
(autograder/executor.py kills a graded kernel; autograder/preflight.py ends with os._exit);
the grader's imports are what a worker forked from the fork server does not pay again
(autograder/workers.py). Nothing here asserts a time.

    .venv/bin/python benchmarks/process_costs.py --repeats 5
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STARTS = {"nothing": "pass", "PyTorch (a kernel, the preflight)": "import torch",
          "the grader (a spawned worker)": "import autograder.grade"}


def cpu_seconds(code: str) -> float:
    """User+system CPU seconds of one ``python -c code``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    rows = []
    for label, code in STARTS.items():
        normal = statistics.median(cpu_seconds(code) for _ in range(args.repeats))
        skipped = statistics.median(cpu_seconds(f"{code}\nimport os\nos._exit(0)") for _ in range(args.repeats))
        rows.append((label, normal, skipped))
    width = max(len(label) for label, _, _ in rows)
    print(f"median of {args.repeats} run(s), CPU seconds (user + system)\n")
    print(f"| {'start-up':<{width}} | exits normally | ends with os._exit | teardown | with teardown / without |")
    print(f"| {'-' * width} | -------------- | ------------------ | -------- | ---------------------- |")
    for label, normal, skipped in rows:
        print(f"| {label:<{width}} | {normal:14.2f} | {skipped:18.2f} | {normal - skipped:8.2f} | "
              f"{normal / max(skipped, 1e-9):21.2f}x |")


if __name__ == "__main__":
    main()
