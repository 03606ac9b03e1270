"""A book page's kernel: started cold (it imports PyTorch, NumPy, Matplotlib and ipykernel
itself) against forked from the build's kernel server (book/_ext/forked_kernels.py), in the
same run.

Each start runs what a page's first cell typically runs (PyTorch, Matplotlib's pyplot,
a small tensor) in a fresh kernel managed as the build manages it
(book/_ext/local_kernels.LocalKernelManager), then ends it. The table gives the median
seconds from asking for the kernel to the first cell's answer, and the CPU the whole
machine spent per page kernel (busy time from /proc/stat: a forked kernel is the server's
child, not this process's); the server's own start is paid once per build and shown apart.
Nothing here asserts a time.

    .venv/bin/python benchmarks/book_kernels.py --kernels 6
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "book" / "_ext"))

FIRST_CELL = "import matplotlib.pyplot as plt\nimport torch\nprint(torch.ones(3).sum().item())"


def busy_seconds() -> float:
    fields = [int(v) for v in open("/proc/stat").readline().split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def one_page() -> float:
    """Seconds from asking for a kernel to the first cell's answer."""
    import nbformat
    from nbclient import NotebookClient

    import local_kernels

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(FIRST_CELL)])
    started = time.perf_counter()
    client = NotebookClient(nb, timeout=120, kernel_name="python3",
                            kernel_manager_class=local_kernels.LocalKernelManager)
    with client.setup_kernel():
        client.execute_cell(nb.cells[0], 0)
        answered = time.perf_counter() - started
    assert nb.cells[0].outputs[0]["text"].strip() == "3.0", nb.cells[0].outputs
    return answered


def measure(kernels: int) -> tuple[float, float, float]:
    """Median seconds to answer and CPU-s per kernel, after a first kernel (whose CPU, the
    server's start included when forking, is the third number)."""
    before = busy_seconds()
    one_page()
    first = busy_seconds() - before
    before = busy_seconds()
    answers = [one_page() for _ in range(kernels)]
    return statistics.median(answers), (busy_seconds() - before) / kernels, first


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernels", type=int, default=6)
    args = parser.parse_args()
    os.environ.update({name: "1" for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")})
    os.environ["COURSE_COLD_KERNELS"] = "1"
    cold = measure(args.kernels)
    del os.environ["COURSE_COLD_KERNELS"]
    forked = measure(args.kernels)
    print(f"| page kernel ({args.kernels} each) | seconds to the first cell's answer (median) | CPU-s per kernel |")
    print("|---|---|---|")
    print(f"| cold | {cold[0]:.2f} | {cold[1]:.2f} |")
    print(f"| forked | {forked[0]:.2f} | {forked[1]:.2f} |")
    print(f"| ratio | {cold[0] / forked[0]:.1f}x | {cold[1] / forked[1]:.1f}x |")
    print(f"\nthe server's start, once per build: about {forked[2] - forked[1]:.1f} CPU-s "
          f"(the first forked kernel cost {forked[2]:.2f})")


if __name__ == "__main__":
    main()
