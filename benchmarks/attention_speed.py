"""Time and peak memory of three ways to compute exact softmax attention, against sequence length:

- naive: scores = q k^T / sqrt(d_head), softmax, @ v; it holds the whole (L, L) score matrix;
- tiled: the keys in blocks of --block-size with an online softmax (chapter 3, exercise 9),
  written in plain PyTorch with a Python loop over blocks; it holds one (L, block) tile;
- sdpa: PyTorch's built-in F.scaled_dot_product_attention (a fused kernel where one exists).

    .venv/bin/python benchmarks/attention_speed.py                       # CPU, float32
    .venv/bin/python benchmarks/attention_speed.py --device cuda --dtype float16 \\
        --lengths 1024 2048 4096 8192 16384 32768

Every setting is run --repeats times after one warm-up run; the table shows the median time and
its ratio to the naive version measured in the same run (so the numbers compare methods, not
machines). Peak memory is what the call allocates on top of its inputs:

- on CUDA, torch.cuda.max_memory_allocated() after resetting the peak, minus what was allocated
  before the call;
- on CPU, the peak of the running sum of the allocations and frees that torch.profiler records
  during one call (profile_memory=True). This includes the built-in kernel's internal buffers,
  because they come from the same allocator; it is measured, not computed from shapes.

The column "L x L scores" is the analytic size of one score matrix, B * n_heads * L^2 elements,
for reference. A setting that runs out of memory is shown as "OOM". Outputs of the three methods
are compared at every length (max |difference| against sdpa); nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import statistics
import sys
import time
from typing import Callable

import torch
import torch.nn.functional as F


def naive_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])          # (B, n_heads, L, L)
    return torch.softmax(scores, dim=-1) @ v                           # (B, n_heads, L, d_head)


def tiled_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_size: int = 256) -> torch.Tensor:
    """Online softmax over key blocks; the running statistics are float32, as in fused kernels."""
    scale = 1 / math.sqrt(q.shape[-1])
    stats = dict(dtype=torch.float32, device=q.device)
    m = torch.full((*q.shape[:-1], 1), float("-inf"), **stats)                        # (B, n_heads, L, 1)
    l = torch.zeros_like(m)
    acc = torch.zeros((*q.shape[:-1], v.shape[-1]), **stats)                           # (B, n_heads, L, d_head)
    for start in range(0, k.shape[-2], block_size):
        s = (q @ k[..., start:start + block_size, :].transpose(-2, -1)).float() * scale   # (B, n_heads, L, block)
        m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))
        p = torch.exp(s - m_new)
        correction = torch.exp(m - m_new)
        l = l * correction + p.sum(dim=-1, keepdim=True)
        acc = acc * correction + (p.to(v.dtype) @ v[..., start:start + block_size, :]).float()
        m = m_new
    return (acc / l).to(q.dtype)


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_time(fn: Callable[[], torch.Tensor], device: torch.device, repeats: int) -> float:
    """Median wall time of fn() in seconds, after one warm-up call."""
    fn()
    _sync(device)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


@contextlib.contextmanager
def _quiet_stderr():
    """The profiler's tracing backend prints status lines straight to file descriptor 2; hide them."""
    try:
        saved = os.dup(2)
    except OSError:
        yield
        return
    with open(os.devnull, "w") as devnull:
        os.dup2(devnull.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def cpu_peak_bytes(fn: Callable[[], torch.Tensor]) -> int:
    """Peak of the bytes allocated (minus freed) during one call, from torch.profiler's memory events."""
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    with _quiet_stderr(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out = fn()
        del out
    events: list[tuple[int, int]] = []

    def walk(nodes) -> None:
        for node in nodes:
            if node.tag == _EventType.Allocation:
                events.append((node.start_time_ns, node.extra_fields.alloc_size))
            walk(node.children)

    walk(prof.profiler.kineto_results.experimental_event_tree())
    current = peak = 0
    for _, size in sorted(events):
        current += size
        peak = max(peak, current)
    return peak


def cuda_peak_bytes(fn: Callable[[], torch.Tensor], device: torch.device) -> int:
    _sync(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    out = fn()
    _sync(device)
    peak = torch.cuda.max_memory_allocated(device) - before
    del out
    return peak


def run(args: argparse.Namespace) -> list[dict]:
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    if args.threads:
        torch.set_num_threads(args.threads)
    methods = {"naive": naive_attention,
               "tiled": lambda q, k, v: tiled_attention(q, k, v, args.block_size),
               "sdpa": sdpa}
    rows = []
    g = torch.Generator(device="cpu").manual_seed(0)
    for L in args.lengths:
        shape = (args.batch, args.heads, L, args.d_head)
        q, k, v = (torch.randn(shape, generator=g).to(device=device, dtype=dtype) for _ in range(3))
        outputs, base_time, base_mem = {}, None, None
        for name, method in methods.items():
            fn = lambda: method(q, k, v)  # noqa: E731
            try:
                with torch.no_grad():
                    seconds = median_time(fn, device, args.repeats)
                    peak = cuda_peak_bytes(fn, device) if device.type == "cuda" else cpu_peak_bytes(fn)
                    outputs[name] = fn().float()
            except (torch.cuda.OutOfMemoryError, RuntimeError) as err:
                if not isinstance(err, torch.cuda.OutOfMemoryError) and "memory" not in str(err).lower():
                    raise
                rows.append(dict(L=L, method=name, seconds=None, peak=None, time_ratio=None, mem_ratio=None, diff=None))
                if device.type == "cuda":
                    torch.cuda.empty_cache()
                continue
            if name == "naive":
                base_time, base_mem = seconds, peak
            rows.append(dict(L=L, method=name, seconds=seconds, peak=peak,
                             time_ratio=seconds / base_time if base_time else None,
                             mem_ratio=peak / base_mem if base_mem else None, diff=None))
        for row in rows:
            if row["L"] == L and row["method"] in outputs and "sdpa" in outputs:
                row["diff"] = (outputs[row["method"]] - outputs["sdpa"]).abs().max().item()
        del q, k, v, outputs
    return rows


def print_table(rows: list[dict], args: argparse.Namespace) -> None:
    element = torch.empty((), dtype=getattr(torch, args.dtype)).element_size()
    how = "torch.cuda.max_memory_allocated" if args.device.startswith("cuda") else "torch.profiler allocation events"
    print(f"device {args.device}, {args.dtype}, B={args.batch}, n_heads={args.heads}, d_head={args.d_head}, "
          f"block_size={args.block_size}, median of {args.repeats} runs; peak memory from {how}")
    header = (f"{'L':>6} {'method':<6} {'median ms':>10} {'x naive':>8} {'peak MiB':>10} {'x naive':>8} "
              f"{'L x L scores MiB':>17} {'max |diff|':>11}")
    print(header)
    print("-" * len(header))
    for r in rows:
        scores = args.batch * args.heads * r["L"] ** 2 * element / 2**20
        if r["seconds"] is None:
            print(f"{r['L']:>6} {r['method']:<6} {'OOM':>10} {'':>8} {'OOM':>10} {'':>8} {scores:>17.1f}")
            continue
        t_ratio = f"{r['time_ratio']:.2f}" if r["time_ratio"] is not None else "-"
        m_ratio = f"{r['mem_ratio']:.3f}" if r["mem_ratio"] is not None else "-"
        diff = f"{r['diff']:.1e}" if r["diff"] is not None else "-"
        print(f"{r['L']:>6} {r['method']:<6} {r['seconds'] * 1e3:>10.2f} {t_ratio:>8} {r['peak'] / 2**20:>10.2f} "
              f"{m_ratio:>8} {scores:>17.1f} {diff:>11}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", help="cpu or cuda (default: cpu)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    parser.add_argument("--lengths", type=int, nargs="+", default=[256, 512, 1024, 2048, 4096])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--d-head", type=int, default=64)
    parser.add_argument("--block-size", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=0, help="CPU threads (default: PyTorch's choice)")
    args = parser.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("--device cuda was asked for, but PyTorch sees no GPU.", file=sys.stderr)
        return 2
    if args.device == "cpu" and args.dtype != "float32":
        print("note: half precision on CPU is slow and not what this benchmark is about.", file=sys.stderr)
    print_table(run(args), args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
