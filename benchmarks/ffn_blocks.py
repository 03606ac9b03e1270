"""Chapter 4 measurements, as tables: Pre-LN against Post-LN, and SwiGLU against the GELU FFN.

1. Pre-LN / Post-LN: a causal LM of 12 blocks (d_model 32, 4 heads, d_ff 128) on a synthetic
   task (token t = token t-3 plus one, mod 16), Adam at a peak learning rate of 1e-2, with and
   without a linear warm-up, several seeds. For each setting: the median over seeds of the
   final loss (mean of the last 20 steps), the ratio of the last layer's to the first layer's
   FFN gradient norm at initialisation, the median time per step, and the final loss as a
   ratio to the Pre-LN run without warm-up (the baseline, measured in the same run).
2. SwiGLU / GELU FFN at equal parameters (d_hidden = 8/3 d against d_ff = 4 d): the bytes of
   activations autograd keeps for the backward pass, and the median time of a forward and
   backward pass, each as a ratio to the GELU FFN of the same run.

Usage (from the repository root):

    .venv/bin/python benchmarks/ffn_blocks.py                 # 200 steps, seeds 0 1 2
    .venv/bin/python benchmarks/ffn_blocks.py --steps 60 --seeds 0 --quick
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB, SEQ, LAG = 16, 16, 3

# ----------------------------------------------------------------------------- Pre-LN / Post-LN


class CausalSelfAttention(nn.Module):
    def __init__(self, d: int, n_heads: int):
        super().__init__()
        self.n_heads = n_heads
        self.qkv, self.out = nn.Linear(d, 3 * d), nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:          # (B, T, d)
        B, T, d = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.n_heads, d // self.n_heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(B, T, d))


class Block(nn.Module):
    def __init__(self, d: int, pre_ln: bool):
        super().__init__()
        self.pre_ln = pre_ln
        self.attn = CausalSelfAttention(d, 4)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.pre_ln:
            x = x + self.attn(self.norm1(x))
            return x + self.mlp(self.norm2(x))
        x = self.norm1(x + self.attn(x))
        return self.norm2(x + self.mlp(x))


class TinyLM(nn.Module):
    def __init__(self, pre_ln: bool, n_layers: int = 12, d: int = 32):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, d)
        self.pos = nn.Parameter(torch.randn(SEQ, d) * 0.02)
        self.blocks = nn.ModuleList(Block(d, pre_ln) for _ in range(n_layers))
        self.final_norm = nn.LayerNorm(d) if pre_ln else nn.Identity()
        self.head = nn.Linear(d, VOCAB)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids) + self.pos[: ids.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.final_norm(x))


def make_batch(g: torch.Generator, batch_size: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(0, VOCAB, (batch_size, SEQ + 1), generator=g)
    for t in range(LAG, SEQ + 1):
        ids[:, t] = (ids[:, t - LAG] + 1) % VOCAB
    return ids[:, :-1], ids[:, 1:]


def lm_loss(model: nn.Module, batch) -> torch.Tensor:
    x, y = batch
    return F.cross_entropy(model(x).reshape(-1, VOCAB), y.reshape(-1))


def grad_ratio_at_init(pre_ln: bool, seed: int) -> float:
    torch.manual_seed(seed)
    model = TinyLM(pre_ln)
    lm_loss(model, make_batch(torch.Generator().manual_seed(seed))).backward()
    norms = [b.mlp[0].weight.grad.norm().item() for b in model.blocks]
    return norms[-1] / norms[0]


def train(pre_ln: bool, warmup: int, steps: int, seed: int, lr: float = 1e-2) -> tuple[float, float]:
    """(mean loss of the last 20 steps, seconds per step)."""
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    model = TinyLM(pre_ln)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    losses = []
    start = time.perf_counter()
    for step in range(steps):
        scale = min(1.0, (step + 1) / warmup) if warmup else 1.0
        for group in opt.param_groups:
            group["lr"] = lr * scale
        loss = lm_loss(model, make_batch(g))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    tail = losses[-min(20, len(losses)):]
    return sum(tail) / len(tail), (time.perf_counter() - start) / steps


def pre_post_table(steps: int, seeds: list[int], warmup: int) -> None:
    print(f"Pre-LN / Post-LN: 12 blocks, d_model 32, Adam lr 1e-2, {steps} steps, seeds {seeds}, "
          f"warm-up {warmup} steps; medians over seeds")
    rows = []
    for pre_ln in (True, False):
        ratio = statistics.median(grad_ratio_at_init(pre_ln, s) for s in seeds)
        for w in (0, warmup):
            runs = [train(pre_ln, w, steps, s) for s in seeds]
            rows.append((f"{'Pre-LN' if pre_ln else 'Post-LN'}", f"{w}", statistics.median(r[0] for r in runs),
                         ratio, statistics.median(r[1] for r in runs)))
    base = rows[0][2]
    print(f"{'design':<9}{'warm-up':>8}{'final loss':>12}{'vs baseline':>13}{'grad last/first':>17}{'ms/step':>9}")
    for design, w, loss, ratio, sec in rows:
        print(f"{design:<9}{w:>8}{loss:>12.3f}{loss / base:>13.2f}{ratio:>17.2f}{sec * 1e3:>9.1f}")
    print(f"(uniform guess: {math.log(VOCAB):.3f} nats; perfect model: {3 * math.log(VOCAB) / SEQ:.3f})\n")

# ----------------------------------------------------------------------------- SwiGLU / GELU


class GeluFFN(nn.Module):
    def __init__(self, d: int, d_ff: int):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d, d_ff, bias=False), nn.Linear(d_ff, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class SwiGLUFFN(nn.Module):
    def __init__(self, d: int, d_hidden: int):
        super().__init__()
        self.gate = nn.Linear(d, d_hidden, bias=False)
        self.up = nn.Linear(d, d_hidden, bias=False)
        self.down = nn.Linear(d_hidden, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


def kept_bytes(module: nn.Module, x: torch.Tensor) -> int:
    weights = {p.untyped_storage().data_ptr() for p in module.parameters()}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        ptr = t.untyped_storage().data_ptr()
        if ptr not in weights:
            seen[ptr] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        module(x)
    return sum(seen.values())


def step_time(module: nn.Module, x: torch.Tensor, repeats: int) -> float:
    def once() -> None:
        module.zero_grad(set_to_none=True)
        module(x).square().mean().backward()

    once()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        once()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def swiglu_table(sizes: list[int], batch: int, seq_len: int, repeats: int) -> None:
    print(f"SwiGLU vs GELU FFN at equal parameters: batch {batch} x {seq_len} tokens, float32, "
          f"median of {repeats} forward+backward passes")
    print(f"{'d_model':>8}{'FFN':>8}{'hidden':>8}{'weights':>12}{'kept MiB':>10}{'vs GELU':>9}{'ms':>9}{'vs GELU':>9}")
    for d in sizes:
        if d % 3:
            raise SystemExit(f"d_model {d} must be a multiple of 3 so that 8/3 d_model is exact")
        torch.manual_seed(0)
        x = torch.randn(batch, seq_len, d, requires_grad=True)
        base_bytes = base_ms = None
        for name, module in (("GELU", GeluFFN(d, 4 * d)), ("SwiGLU", SwiGLUFFN(d, 8 * d // 3))):
            n = sum(p.numel() for p in module.parameters())
            kept = kept_bytes(module, x)
            ms = step_time(module, x, repeats) * 1e3
            base_bytes, base_ms = base_bytes or kept, base_ms or ms
            hidden = module.fc1.out_features if name == "GELU" else module.gate.out_features
            print(f"{d:>8}{name:>8}{hidden:>8}{n:>12,}{kept / 2**20:>10.1f}{kept / base_bytes:>9.2f}"
                  f"{ms:>9.1f}{ms / base_ms:>9.2f}")
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--sizes", type=int, nargs="+", default=[384, 768])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--quick", action="store_true", help="smaller SwiGLU sizes and fewer repeats")
    args = parser.parse_args()
    if args.quick:
        args.sizes, args.repeats = [96, 192], 3
    threads = torch.get_num_threads()
    torch.set_num_threads(1)   # the LM is tiny; one thread gives steadier timings
    pre_post_table(args.steps, args.seeds, args.warmup)
    torch.set_num_threads(threads)
    swiglu_table(args.sizes, batch=8, seq_len=256, repeats=args.repeats)


if __name__ == "__main__":
    main()
