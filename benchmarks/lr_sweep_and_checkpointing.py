"""Chapter 5's two measurements, at a size beyond what a book page may spend:

1. Gradient checkpointing: memory kept for backward and time of forward + backward for a
   stack of pre-LN MLP blocks, with and without ``torch.utils.checkpoint``, at several
   depths. Memory is the bytes autograd saves for backward (a saved-tensor hook, so it works
   on CPU), and on CUDA also the peak allocated during the step. Time is the median of
   --repeats runs after one warm-up; the ratio column is checkpointed / plain in the same run.
2. Learning-rate sensitivity: the small character-level transformer of the chapter
   (``book/ch05_training/optimizer.md``) trained for --steps steps at each peak rate, warm-up
   plus cosine, for each of --seeds; the table shows the median validation loss over seeds,
   its spread, and its ratio to the best rate's median.

    .venv/bin/python benchmarks/lr_sweep_and_checkpointing.py
    .venv/bin/python benchmarks/lr_sweep_and_checkpointing.py --device cuda --depths 8 16 32 64

Nothing here asserts a time; close other work first (on 2 cores a second busy process
doubles wall times, the ratios hold up better).
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from course.data import load_shakespeare

# ----------------------------------------------------------------------------- checkpointing


class MLPBlock(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.ln, self.up, self.down = nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.gelu(self.up(self.ln(x))))


def checkpoint_row(depth: int, d: int, tokens: int, use_checkpoint: bool, repeats: int, device: str):
    torch.manual_seed(0)
    blocks = nn.ModuleList(MLPBlock(d) for _ in range(depth)).to(device)
    x = torch.randn(tokens, d, device=device, requires_grad=True)
    saved: list[int] = []

    def pack(t):
        saved.append(t.numel() * t.element_size())
        return t

    def step():
        saved.clear()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            h = x
            for block in blocks:
                h = checkpoint(block, h, use_reentrant=False) if use_checkpoint else block(h)
            h.pow(2).mean().backward()
        x.grad = None
        blocks.zero_grad(set_to_none=True)

    step()                                                      # warm-up
    times, peak = [], float("nan")
    for _ in range(repeats):
        if device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
        start = time.perf_counter()
        step()
        if device == "cuda":
            torch.cuda.synchronize()
            peak = (torch.cuda.max_memory_allocated() - before) / 2**20
        times.append(time.perf_counter() - start)
    return sum(saved) / 2**20, peak, statistics.median(times)


def checkpoint_table(args) -> None:
    print(f"\nGradient checkpointing: pre-LN MLP blocks, d_model {args.d_model}, {args.tokens} tokens, "
          f"{args.device}, median of {args.repeats}")
    print(f"{'depth':>5} {'mode':>12} {'saved MiB':>10} {'peak MiB':>9} {'time ms':>9} {'time ratio':>10} "
          f"{'memory ratio':>12}")
    for depth in args.depths:
        plain = checkpoint_row(depth, args.d_model, args.tokens, False, args.repeats, args.device)
        ckpt = checkpoint_row(depth, args.d_model, args.tokens, True, args.repeats, args.device)
        for mode, (mib, peak, seconds) in (("plain", plain), ("checkpoint", ckpt)):
            peak_text = "n/a" if math.isnan(peak) else f"{peak:.1f}"     # peak: CUDA only
            print(f"{depth:>5} {mode:>12} {mib:>10.1f} {peak_text:>9} {seconds * 1e3:>9.1f} "
                  f"{seconds / plain[2]:>10.2f} {mib / plain[0]:>12.3f}")

# ----------------------------------------------------------------------------- learning-rate sweep


def lr_at(step: int, max_lr: float, min_lr: float, warmup: int, max_steps: int) -> float:
    if step < warmup:
        return max_lr * (step + 1) / warmup
    if step >= max_steps:
        return min_lr
    p = (step - warmup) / (max_steps - warmup)
    return min_lr + 0.5 * (max_lr - min_lr) * (1 + math.cos(math.pi * p))


class TinyGPT(nn.Module):
    def __init__(self, vocab: int, block: int, d_model: int):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d_model), nn.Embedding(block, d_model)
        self.block = nn.TransformerEncoderLayer(d_model, 4, 4 * d_model, dropout=0.0, activation="gelu",
                                                batch_first=True, norm_first=True)
        self.norm, self.head = nn.LayerNorm(d_model), nn.Linear(d_model, vocab)
        self.register_buffer("mask", torch.triu(torch.full((block, block), float("-inf")), diagonal=1))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:       # (B, T) -> (B, T, V)
        t = ids.shape[1]
        x = self.tok(ids) + self.pos(torch.arange(t, device=ids.device))
        x = self.block(x, src_mask=self.mask[:t, :t], is_causal=True)
        return self.head(self.norm(x))


def sweep_table(args) -> None:
    text = load_shakespeare("train", max_chars=300_000)
    val_text = load_shakespeare("validation", max_chars=50_000)
    chars = sorted(set(text) | set(val_text))
    stoi = {c: i for i, c in enumerate(chars)}
    train_ids = torch.tensor([stoi[c] for c in text], device=args.device)
    val_ids = torch.tensor([stoi[c] for c in val_text], device=args.device)
    T, B = args.block, args.batch

    def batch(ids, g):
        starts = torch.randint(0, len(ids) - T, (B,), generator=g).to(args.device)
        idx = starts[:, None] + torch.arange(T, device=args.device)
        return ids[idx], ids[idx + 1]

    def run(peak: float, seed: int) -> float:
        torch.manual_seed(seed)
        model = TinyGPT(len(chars), T, args.sweep_d_model).to(args.device)
        opt = torch.optim.AdamW(model.parameters(), lr=peak, betas=(0.9, 0.95), weight_decay=0.1)
        g = torch.Generator().manual_seed(seed)
        for step in range(args.steps):
            for group in opt.param_groups:
                group["lr"] = lr_at(step, peak, peak / 10, max(1, args.steps // 10), args.steps)
            x, y = batch(train_ids, g)
            loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
        g = torch.Generator().manual_seed(123)
        with torch.no_grad():
            return statistics.mean(F.cross_entropy(model(x).flatten(0, 1), y.flatten()).item()
                                   for x, y in (batch(val_ids, g) for _ in range(16)))

    print(f"\nLearning-rate sweep: d_model {args.sweep_d_model}, block {T}, batch {B}, {args.steps} steps, "
          f"seeds {args.seeds}, {args.device}; log V = {math.log(len(chars)):.3f}")
    start = time.perf_counter()
    results = {peak: [run(peak, s) for s in args.seeds] for peak in args.peaks}
    medians = {peak: statistics.median(v) for peak, v in results.items()}
    best = min(medians, key=medians.get)
    print(f"{'peak lr':>9} {'median val loss':>16} {'min':>7} {'max':>7} {'ratio to best':>14}")
    for peak, losses in results.items():
        mark = "  <- best" if peak == best else ""
        print(f"{peak:>9g} {medians[peak]:>16.3f} {min(losses):>7.3f} {max(losses):>7.3f} "
              f"{medians[peak] / medians[best]:>14.3f}{mark}")
    print(f"({time.perf_counter() - start:.0f} s)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1, help="torch threads on CPU (1 is repeatable)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--depths", type=int, nargs="+", default=[4, 8, 16, 32])
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--peaks", type=float, nargs="+", default=[1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--sweep-d-model", type=int, default=64)
    parser.add_argument("--block", type=int, default=32)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--skip-sweep", action="store_true")
    parser.add_argument("--skip-checkpointing", action="store_true")
    args = parser.parse_args()
    if args.device == "cpu":
        torch.set_num_threads(args.threads)
    if not args.skip_checkpointing:
        checkpoint_table(args)
    if not args.skip_sweep:
        sweep_table(args)


if __name__ == "__main__":
    main()
