"""Inference costs (chapter 6): time per generated token with and without a KV cache, and
int8 weight quantisation (size and error).

    .venv/bin/python benchmarks/inference.py
    .venv/bin/python benchmarks/inference.py --lengths 128 512 2048 --d-model 256 --layers 6
    .venv/bin/python benchmarks/inference.py --device cuda

Table 1 times one decode step of a small decoder at several context lengths L: without a
cache the model runs on all L tokens; with a cache it runs on one token and attends to the
L - 1 cached keys and values. Each setting runs --repeats times after a warm-up; the table
shows the median, and the ratio of the two medians measured in the same run (so it compares
methods, not machines). It also checks that the cached step's logits equal the uncached
ones (max |difference|).

Table 2 quantises weight matrices to int8 (symmetric; one scale per tensor, or per output
row) and reports bytes, and the relative error ||W_hat - W|| / ||W||: for Gaussian matrices
of common transformer shapes, the same with 0.1% of the weights made 20 times larger
(outliers), and the time of a dequantise-then-matmul linear layer against the float one.
Nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Attention(nn.Module):
    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        self.n_heads, self.d_head = n_heads, d_model // n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.out = nn.Linear(d_model, d_model, bias=False)

    def forward(self, x, cache=None):
        B, T, d = x.shape
        q, k, v = (t.view(B, T, self.n_heads, self.d_head).transpose(1, 2)
                   for t in self.qkv(x).split(d, dim=-1))            # (B, n_heads, T, d_head)
        if cache is not None:
            k, v = torch.cat((cache[0], k), 2), torch.cat((cache[1], v), 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=cache is None)
        return self.out(y.transpose(1, 2).reshape(B, T, d)), (k, v)


class Decoder(nn.Module):
    def __init__(self, vocab: int, d_model: int, n_layers: int, n_heads: int, max_len: int):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d_model), nn.Embedding(max_len, d_model)
        self.attn = nn.ModuleList(Attention(d_model, n_heads) for _ in range(n_layers))
        self.mlp = nn.ModuleList(nn.Sequential(nn.LayerNorm(d_model), nn.Linear(d_model, 4 * d_model), nn.GELU(),
                                               nn.Linear(4 * d_model, d_model)) for _ in range(n_layers))
        self.norm = nn.ModuleList(nn.LayerNorm(d_model) for _ in range(n_layers))
        self.head = nn.Linear(d_model, vocab)

    def forward(self, ids, caches=None):
        past = 0 if caches is None else caches[0][0].shape[2]
        x = self.tok(ids) + self.pos(torch.arange(past, past + ids.shape[1], device=ids.device))
        new = []
        for i, (attn, mlp, norm) in enumerate(zip(self.attn, self.mlp, self.norm)):
            a, c = attn(norm(x), None if caches is None else caches[i])
            x = x + a
            x = x + mlp(x)
            new.append(c)
        return self.head(x), new


def median_time(fn, repeats: int, device: torch.device) -> float:
    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()
    fn()
    sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


@torch.no_grad()
def kv_cache_table(args, device: torch.device) -> None:
    torch.manual_seed(0)
    model = Decoder(1000, args.d_model, args.layers, args.heads, max(args.lengths) + 1).to(device).eval()
    print(f"\nTime per generated token, decoder d_model={args.d_model}, {args.layers} layers, {args.heads} heads, "
          f"{device}, median of {args.repeats}")
    print(f"{'L':>6s} {'no cache (ms)':>14s} {'cache (ms)':>11s} {'ratio':>7s} {'max |dlogit|':>13s}")
    for L in args.lengths:
        ids = torch.randint(0, 1000, (1, L), device=device)
        _, caches = model(ids[:, :-1])
        full = median_time(lambda: model(ids), args.repeats, device)
        step = median_time(lambda: model(ids[:, -1:], caches), args.repeats, device)
        diff = (model(ids)[0][:, -1] - model(ids[:, -1:], caches)[0][:, -1]).abs().max().item()
        print(f"{L:6d} {1e3 * full:14.3f} {1e3 * step:11.3f} {full / step:7.1f} {diff:13.2e}")


def fake_quant(w: torch.Tensor, per_channel: bool) -> torch.Tensor:
    amax = w.abs().amax(dim=1, keepdim=True) if per_channel else w.abs().max()
    s = torch.where(amax > 0, amax / 127, torch.ones_like(amax))
    return (w / s).round().clamp(-127, 127) * s


@torch.no_grad()
def int8_table(args, device: torch.device) -> None:
    print(f"\nint8 weights (symmetric), {device}; time: x @ W.T for x of shape (8, in), median of {args.repeats}")
    print(f"{'matrix':>18s} {'fp32 MB':>8s} {'int8 MB':>8s} {'err/tensor':>11s} {'err/row':>9s} "
          f"{'float ms':>9s} {'int8 ms':>8s} {'ratio':>6s}")
    g = torch.Generator().manual_seed(0)
    for out_f, in_f in [(768, 768), (3072, 768), (4096, 4096), (11008, 4096)]:
        for outliers in (False, True):
            w = torch.randn(out_f, in_f, generator=g) * 0.02
            if outliers:
                idx = torch.randperm(w.numel(), generator=g)[: w.numel() // 1000]
                w.view(-1)[idx] *= 20
            errs = [((fake_quant(w, pc) - w).norm() / w.norm()).item() for pc in (False, True)]
            amax = w.abs().amax(dim=1)
            scale = torch.where(amax > 0, amax / 127, torch.ones_like(amax))
            q = (w / scale[:, None]).round().clamp(-127, 127).to(torch.int8).to(device)
            scale, wd = scale.to(device), w.to(device)
            x = torch.randn(8, in_f, device=device)
            t_float = median_time(lambda: x @ wd.T, args.repeats, device)
            t_int8 = median_time(lambda: x @ (q.float() * scale[:, None]).T, args.repeats, device)
            name = f"{out_f}x{in_f}{' +outl' if outliers else ''}"
            print(f"{name:>18s} {4 * w.numel() / 1e6:8.1f} {(w.numel() + 4 * out_f) / 1e6:8.1f} "
                  f"{errs[0]:11.2e} {errs[1]:9.2e} {1e3 * t_float:9.3f} {1e3 * t_int8:8.3f} "
                  f"{t_int8 / t_float:6.1f}")
    print("The int8 layer here dequantises before a float matmul (memory saved, not time); fast int8 kernels "
          "fuse the two.")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[64, 128, 256, 512, 1024, 2048])
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=0, help="torch threads on CPU (0: PyTorch's default)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    kv_cache_table(args, device)
    int8_table(args, device)


if __name__ == "__main__":
    main()
