"""Checks for chapter 3: softmax; attention with a bias and a mask in any dtype; decoder masks for
left-padded batches after a cache; multi-head attention from a fused per-head projection;
grouped-query attention by broadcasting; the entropy of attention (predict, then measure);
sliding-window attention in O(T * window); causal linear attention in chunks; tiled attention
with query and key tiles, a causal mask and the log-sum-exp; and one decoder attention step
(token embeddings, RoPE at a cache offset, grouped-query attention).

Oracles: ``torch.softmax`` / ``torch.logsumexp`` and the attention formula computed in float64
(here, never in the answers), ``F.scaled_dot_product_attention`` (also with ``enable_gqa``),
``nn.MultiheadAttention`` with weights copied into the student's layer, masks derived by loops,
a RoPE written with complex numbers, and properties: rows sum to one, masked weights are zero,
causality, merging two halves of the keys through the log-sum-exp gives the whole, and the
largest tensor an answer creates (seen through a dispatch mode) is smaller than what the
exercise forbids (a (T, T) score matrix, expanded key/value heads, (T, d_k, d_v) prefix sums).
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from ._core import CheckFailed, call, earlier_first, expect, expect_close, expect_tensor, fail, forbid, generator
from ._core import judge_prediction
from ._core import one_thread as _one_thread, same as _same
from ._hidden import hidden_generator, hidden_rng, hidden_seed
from ._recorders import LargestTensor as _LargestTensor

# ----------------------------------------------------------------------------- helpers






_SDPA = ((F, "scaled_dot_product_attention"), (F, "multi_head_attention_forward"))


def _no_mha_module(module: nn.Module, exercise: str) -> None:
    for name, sub in module.named_modules():
        if isinstance(sub, nn.MultiheadAttention):
            fail(f"{exercise} contains an nn.MultiheadAttention ({name or 'the module itself'}).",
                 "this exercise asks you to build the layer from four nn.Linear layers; "
                 "nn.MultiheadAttention is the oracle the tests compare against.")


# ----------------------------------------------------------------------------- exercise 1

_SOFTMAX_BUILTINS = ((torch, "softmax"), (F, "softmax"), (torch.Tensor, "softmax"), (torch.special, "softmax"),
                     (torch, "log_softmax"), (F, "log_softmax"), (torch.Tensor, "log_softmax"),
                     (torch, "logsumexp"), (torch.Tensor, "logsumexp"))


def _softmax_global_max(x: torch.Tensor, dim: int) -> torch.Tensor:
    e = torch.exp(x - x.max())
    return e / e.sum(dim=dim, keepdim=True)


def _softmax_no_keepdim(x: torch.Tensor, dim: int) -> torch.Tensor | None:
    try:
        e = torch.exp(x - x.max(dim=dim).values)
        return e / e.sum(dim=dim, keepdim=True)
    except RuntimeError:
        return None


@_one_thread
def check_softmax(softmax, hidden: bool = False) -> None:
    g = generator(301) if not hidden else hidden_generator("softmax")
    cases = [  # (x, dim, what)
        (torch.tensor([[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]]), -1, "a small example"),
        (torch.randn(3, 5, generator=g), -1, "a (3, 5) input along dim=-1"),
        (torch.randn(4, 4, generator=g), -1, "a (4, 4) input along dim=-1"),
        (torch.randn(4, 6, generator=g), 0, "a (4, 6) input along dim=0"),
        (torch.tensor([[0.0, 1.0, 2.0], [1000.0, 1001.0, 1002.0]]), -1, "rows far apart in size"),
        (torch.tensor([[10_000.0, 0.0, -10_000.0]]), -1, "entries of +-1e4"),
        (torch.tensor([[0.5, float("-inf"), 1.5, float("-inf")]]), -1, "a row with -inf entries (masked scores)"),
        (torch.randn(3, 4, generator=g, dtype=torch.float64) * 20 + 300, -1, "a float64 (3, 4) input around 300"),
    ]
    if hidden:
        cases += [(torch.randn(2, 3, 7, generator=g) * 30, 1, "a (2, 3, 7) input along dim=1"),
                  (torch.randn(2, 3, 7, generator=g) * 30 + 500, -1, "a (2, 3, 7) input with large values"),
                  (torch.randn(5, generator=g, dtype=torch.float64), 0, "a float64 vector"),
                  (torch.randn(3, 1, generator=g), -1, "a single column"),
                  (-torch.rand(6, 6, generator=g) * 1e4, -2, "large negative entries along dim=-2")]
        rng = hidden_rng("softmax")
        for _ in range(2):
            shape = tuple(rng.randrange(1, 7) for _ in range(rng.randrange(1, 4)))
            dim = rng.randrange(-len(shape), len(shape))
            scale, offset = rng.choice([1.0, 10.0, 30.0]), rng.choice([0.0, 200.0, -500.0, 1000.0])
            cases.append((torch.randn(shape, generator=g) * scale + offset, dim,
                          f"a {shape} input (scale {scale:g}, offset {offset:g}) along dim={dim}"))
    for x, dim, what in cases:
        original = x.clone()
        with forbid(*_SOFTMAX_BUILTINS, exercise="the softmax"):
            got = call(softmax, x, dim)
        expect_tensor(got, tuple(x.shape), f"softmax of {what}")
        expect(torch.equal(x, original), "softmax changed its input tensor.",
               "avoid in-place operations such as x -= ... or x.exp_(): compute a new tensor.")
        expect(got.dtype == x.dtype, f"softmax of a {x.dtype} input returned {got.dtype}.",
               "keep the input's dtype: do not convert with .float() or build constants in another dtype.")
        want = torch.softmax(x.to(torch.float64), dim=dim).to(x.dtype)
        if _same(got, want):
            continue
        finite = torch.isfinite(x).all(dim=dim)
        if not torch.isfinite(got).all():
            if _same(got, _softmax_global_max(x, dim)):
                hint = ("take the maximum along dim (x.max(dim=dim, keepdim=True)), not over the whole tensor: "
                        "a global maximum makes exp underflow to 0 in rows far below it, and 0/0 is NaN.")
            elif finite.all():
                hint = ("subtract the maximum along dim before exp: exp(1000.0) overflows to inf, and inf/inf is "
                        "NaN. softmax(x) = softmax(x - max(x)) exactly.")
            else:
                hint = ("a -inf entry must give weight exactly 0: exp(-inf - max) = 0. Subtract the maximum along "
                        "dim (it is finite when the row has a finite entry), then exponentiate.")
        elif _same(got, _softmax_global_max(x, dim)):
            hint = "take the maximum along dim (keepdim=True), not over the whole tensor."
        elif (nk := _softmax_no_keepdim(x, dim)) is not None and _same(got, nk):
            hint = ("x.max(dim=dim) drops that axis, so x - m broadcasts along the wrong axis: use "
                    "x.max(dim=dim, keepdim=True).values.")
        elif any(_same(got, torch.softmax(x.to(torch.float64), dim=other).to(x.dtype))
                 for other in range(x.dim()) if other != dim % x.dim()):
            hint = "normalise along the axis `dim` that was passed in, for both the maximum and the sum."
        elif torch.allclose(got.sum(dim=dim), torch.ones((), dtype=got.dtype), atol=1e-5):
            hint = "the result sums to 1 but has the wrong values: compute exp(x - max) / sum(exp(x - max))."
        else:
            hint = ("divide by the sum of the exponentials along dim (keepdim=True), so that every slice sums "
                    "to 1.")
        expect_close(got, want, f"softmax of {what} (dim={dim})", hint)

# ----------------------------------------------------------------------------- exercise 2


def _attention_ref(q, k, v, mask=None, scale="sqrt", softmax_dim=-1, invert=False, mask_scores=True,
                   bias=None, bias_mode="add"):
    """The contract in float64; variants reproduce common bugs for diagnosis."""
    q, k, v = (t.detach().to(torch.float64) for t in (q, k, v))
    d_k = q.shape[-1]
    factor = {"sqrt": 1 / math.sqrt(d_k), "none": 1.0, "d_k": 1 / d_k}[scale]
    scores = q @ k.transpose(-2, -1)
    if bias is not None and bias_mode == "before_scale":
        scores = scores + bias.detach().to(torch.float64)
    scores = scores * factor
    if bias is not None and bias_mode in ("add", "subtract"):
        scores = scores + (1 if bias_mode == "add" else -1) * bias.detach().to(torch.float64)
    if mask is not None:
        allowed = ~mask if invert else mask
        if mask_scores:
            scores = scores.masked_fill(~allowed, torch.finfo(torch.float64).min)
    weights = torch.softmax(scores, dim=softmax_dim)
    if mask is not None:
        weights = weights.masked_fill(~allowed, 0.0)
    return weights @ v, weights


def _diagnose_attention(got_w, q, k, v, mask, bias=None) -> str | None:
    """Name the bug when the weights match a common wrong variant; None when none matches."""
    if bias is not None:
        for mode, hint in (("ignored", "the bias was ignored: add it to the scaled scores, scores = q @ k^T / "
                            "sqrt(d_k) + bias, before the mask and the softmax."),
                           ("before_scale", "the bias was divided by sqrt(d_k) with the scores: the bias is added "
                            "after the scaling, q @ k^T / sqrt(d_k) + bias."),
                           ("subtract", "the bias was subtracted: add it (it already holds the sign it needs, "
                            "for example -slope * distance for ALiBi).")):
            _, w = _attention_ref(q, k, v, mask, bias=bias, bias_mode=mode)
            if _same(got_w, w, atol=1e-4, rtol=1e-4):
                return hint
    variants = [("none", -1, False, "the scores were not scaled: divide q @ k^T by sqrt(d_k), the size of the "
                 "last axis of q."),
                ("d_k", -1, False, "the scores were divided by d_k; divide by sqrt(d_k) (math.sqrt(q.shape[-1]))."),
                ("sqrt", -2, False, "the softmax ran over the queries (dim=-2); it must run over the keys, the last "
                 "axis (dim=-1), so that each query's weights sum to 1."),
                ("sqrt", -1, True, "the mask is inverted: True means 'may attend', so fill where the mask is False "
                 "(masked_fill(~mask, ...)).")]
    for scale, dim, invert, hint in variants:
        if invert and mask is None:
            continue
        _, w = _attention_ref(q, k, v, mask, scale, dim, invert, bias=bias)
        if _same(got_w, w, atol=1e-4, rtol=1e-4):
            return hint
    if mask is not None and _same(got_w, _attention_ref(q, k, v, mask, mask_scores=False, bias=bias)[1], 1e-4, 1e-4):
        return ("the mask was applied only after the softmax: zeroing weights afterwards leaves rows that no longer "
                "sum to 1. Fill the masked scores (masked_fill(~mask, torch.finfo(dtype).min)) before the softmax.")
    return None


def _run_attention(fn, q, k, v, mask, bias=None):
    with forbid(*_SDPA, exercise="scaled dot-product attention"):
        if bias is None:
            result = call(fn, q, k, v, mask, name="scaled_dot_product_attention")
        else:
            result = call(fn, q, k, v, mask, bias=bias, name="scaled_dot_product_attention")
    expect(isinstance(result, tuple) and len(result) == 2,
           f"scaled_dot_product_attention should return a tuple (out, weights), got {type(result).__name__}.",
           "return both: `return weights @ v, weights`.")
    return result


def _check_attention_case(fn, q, k, v, mask, what: str, bias=None) -> None:
    out, weights = _run_attention(fn, q, k, v, mask, bias)
    batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2])
    T_q, T_k, d_v = q.shape[-2], k.shape[-2], v.shape[-1]
    w_shape = torch.broadcast_shapes((*batch, T_q, T_k), *[t.shape for t in (mask, bias) if t is not None])
    expect_tensor(weights, tuple(w_shape), f"weights for {what}")
    expect_tensor(out, (*w_shape[:-1], d_v), f"out for {what}")
    want_out, want_w = _attention_ref(q, k, v, mask, bias=bias)
    rows_empty = (~mask).all(dim=-1) if mask is not None else torch.zeros((), dtype=torch.bool)
    if torch.isnan(out).any() or torch.isnan(weights).any():
        if mask is not None and rows_empty.any():
            fail(f"{what}: a query whose mask row is all False got NaN.",
                 "a fully masked row gives NaN: filled with -inf, the row's maximum is -inf and the softmax's shift "
                 "computes -inf - (-inf) = NaN. "
                 "Fill with torch.finfo(scores.dtype).min and set the weights of masked positions to 0 after the "
                 "softmax; the contract asks for zero weights and a zero output in such a row.")
        fail(f"{what}: the output contains NaN.", "check the fill value and that the softmax runs over the last axis.")
    if not _same(weights, want_w):
        if mask is not None and rows_empty.any():
            w_e = weights.detach()[rows_empty.expand(weights.shape[:-1])]
            if w_e.abs().sum() > 0 and _same(weights.detach().masked_fill(rows_empty.unsqueeze(-1), 0.0), want_w,
                                             1e-5, 1e-4):
                fail(f"{what}: a query whose mask row is all False got non-zero weights "
                     f"(their sum is {w_e.sum(-1).max().item():.3g}).",
                     "a fully masked row must get all-zero weights and a zero output, not a uniform average: "
                     "after the softmax, set the weights of masked positions to 0 (a finite fill such as -1e9 or "
                     "finfo.min alone spreads the row evenly over forbidden keys).")
        hint = _diagnose_attention(weights, q, k, v, mask, bias)
        if hint:
            fail(f"{what}: the weights differ from softmax(q @ k^T / sqrt(d_k){' + bias' if bias is not None else ''}).",
                 hint)
        if mask is not None:
            leaked = weights.detach().masked_select(~mask.expand(weights.shape))
            if leaked.numel() and leaked.abs().max() > 0:
                fail(f"{what}: masked positions got weight up to {leaked.abs().max().item():.3g}.",
                     "masked positions must get weight exactly 0: fill their scores with a very negative value "
                     "(torch.finfo(dtype).min) before the softmax, where the mask is False.")
        sums = weights.detach().sum(dim=-1)
        live = ~rows_empty.expand(sums.shape) if mask is not None else torch.ones_like(sums, dtype=torch.bool)
        expect(torch.allclose(sums[live], torch.ones_like(sums[live]), atol=1e-4),
               f"{what}: the weights of a query should sum to 1, got sums from {sums[live].min().item():.4g} to "
               f"{sums[live].max().item():.4g}.", "normalise with a softmax over the keys, the last axis (dim=-1).")
        expect_close(weights, want_w.to(weights.dtype), f"weights for {what}",
                     "weights = softmax(q @ k^T / sqrt(d_k) + bias) over the last axis, with masked entries excluded.",
                     rtol=1e-4)
    expect_close(out, want_out.to(out.dtype), f"out for {what}",
                 "out must be weights @ v: multiply the (T_q, T_k) weights by v (T_k, d_v).", rtol=1e-4)


def _low_precision_case(fn, q, k, v, mask, what: str, bias=None) -> None:
    """float16 / bfloat16 inputs: the fill must exist in the dtype, results keep the dtype."""
    dtype = q.dtype
    try:
        out, weights = _run_attention(fn, q, k, v, mask, bias)
    except CheckFailed as err:
        if "overflow" in str(err) or "cannot be converted" in str(err):
            fail(f"{what}: scaled_dot_product_attention raised on {dtype} input: {str(err).splitlines()[0]}",
                 f"a fixed fill such as -1e9 does not exist in {dtype} (float16's largest magnitude is 65504): "
                 "masked_fill refuses it, and a conversion turns it into -inf. Fill with "
                 "torch.finfo(scores.dtype).min, which exists in every dtype.")
        if "scalar type" in str(err) or "dtype" in str(err):
            fail(f"{what}: scaled_dot_product_attention raised on {dtype} input: {str(err).splitlines()[0]}",
                 "keep the input dtype: a float32 tensor in the mask arithmetic (torch.zeros(...) without a "
                 "dtype) promotes the scores to float32, which then meet v in float16. Fill with "
                 "scores.masked_fill(~mask, torch.finfo(scores.dtype).min).")
        raise
    for name, t in (("out", out), ("weights", weights)):
        expect(isinstance(t, torch.Tensor) and t.dtype == dtype,
               f"{what}: {name} has dtype {getattr(t, 'dtype', type(t).__name__)}, expected {dtype}.",
               "keep the input dtype: a float32 tensor or a Python-float tensor in the mask arithmetic promotes "
               "the scores; fill with scores.masked_fill(~mask, torch.finfo(scores.dtype).min).")
    if torch.isnan(out).any() or torch.isnan(weights).any():
        fail(f"{what}: the output contains NaN in {dtype}, although float32 inputs were fine.",
             f"the fill value became -inf in {dtype}: a constant such as -1e9 overflows float16 (its largest "
             "magnitude is 65504), and a fully masked row then gives NaN. Fill with torch.finfo(scores.dtype).min.")
    want_out, want_w = _attention_ref(q, k, v, mask, bias=bias)
    tol = {torch.float16: 4e-3, torch.bfloat16: 3e-2}[dtype]
    expect_close(weights.float(), want_w.float(), f"weights for {what}",
                 "weights = softmax(q @ k^T / sqrt(d_k) + bias) over the last axis, masked entries exactly 0, "
                 "computed in the input dtype.", atol=tol, rtol=tol)
    expect_close(out.float(), want_out.float(), f"out for {what}", "out must be weights @ v.", atol=tol, rtol=tol)


def _extreme_case(fn, q, k, v, mask, what: str) -> None:
    """Scores far below zero: a fixed fill such as -1e4 is then above the real scores."""
    out, weights = _run_attention(fn, q, k, v, mask)
    _, want_w = _attention_ref(q, k, v, mask)
    live = mask.expand(want_w.shape).any(dim=-1)
    sums = weights.detach().to(torch.float64).sum(dim=-1)
    leaked = weights.detach().masked_select(~mask.expand(weights.shape))
    if (live & (sums - 1).abs().gt(1e-3)).any() or (leaked.numel() and leaked.abs().max() > 0):
        fail(f"{what}: with scores around -1e5, the weights of the allowed keys sum to "
             f"{sums[live].min().item():.3g} instead of 1 (masked keys got up to "
             f"{leaked.abs().max().item() if leaked.numel() else 0:.3g}).",
             "the fill value is not below every real score: a fixed constant such as -1e4 is larger than a score "
             "of -1e5, so the masked keys win the softmax. Fill with torch.finfo(scores.dtype).min.")
    _check_attention_case(fn, q, k, v, mask, what)


@_one_thread
def check_scaled_dot_product_attention(scaled_dot_product_attention, softmax=None, hidden: bool = False) -> None:
    """softmax, when given, is the exercise 1 answer the attention may call: a failure it causes is
    blamed on it."""
    earlier = [] if softmax is None else [
        ("scaled_dot_product_attention may call your softmax, which fails exercise 1's tests",
         lambda: check_softmax(softmax))]
    with earlier_first(*earlier):
        _check_scaled_dot_product_attention(scaled_dot_product_attention, hidden)


def _check_scaled_dot_product_attention(scaled_dot_product_attention, hidden: bool) -> None:
    fn = scaled_dot_product_attention
    g = generator(302 if not hidden else 3302)   # the hand-picked cases: their tolerances were checked on these
    r = lambda *shape, **kw: torch.randn(*shape, generator=g, **kw)  # noqa: E731
    cases = []
    cases.append((r(2, 5, 8), r(2, 5, 8), r(2, 5, 8), None, "q, k, v of shape (2, 5, 8), no mask"))
    cases.append((r(2, 3, 4, 16) * 3, r(2, 3, 6, 16) * 3, r(2, 3, 6, 5), None,
                  "(B, n_heads, T_q, d_k) = (2, 3, 4, 16) against 6 keys, d_v = 5"))
    mask = torch.rand(2, 1, 4, 6, generator=g) > 0.4
    mask[..., 0] = True
    cases.append((r(2, 3, 4, 16), r(2, 3, 6, 16), r(2, 3, 6, 5), mask, "a random mask of shape (2, 1, 4, 6)"))
    T = 5
    causal = torch.ones(T, T, dtype=torch.bool).tril().view(1, 1, T, T)
    cases.append((r(1, 2, T, 8), r(1, 2, T, 8), r(1, 2, T, 8), causal, "a causal mask (1, 1, 5, 5)"))
    empty = torch.ones(1, 1, 3, 4, dtype=torch.bool)
    empty[..., 1, :] = False
    cases.append((r(1, 2, 3, 8), r(1, 2, 4, 8), r(1, 2, 4, 8), empty, "a mask whose second query row is all False"))
    # An additive bias (ALiBi, relative positions) together with a boolean mask.
    slopes = torch.tensor([0.5, 0.25]).view(1, 2, 1, 1)
    distance = (torch.arange(T).view(-1, 1) - torch.arange(T).view(1, -1)).float()
    cases.append((r(1, 2, T, 8), r(1, 2, T, 8), r(1, 2, T, 8), causal,
                  "a causal mask (1, 1, 5, 5) and an ALiBi bias -slope_h * (i - j) of shape (1, 2, 5, 5)",
                  -slopes * distance))
    blind = torch.rand(2, 1, 4, 6, generator=g) > 0.4
    blind[..., 0] = True
    blind[1, 0, 2] = False
    cases.append((r(2, 3, 4, 8), r(2, 3, 6, 8), r(2, 3, 6, 5), blind,
                  "a bias (2, 3, 4, 6) and a mask (2, 1, 4, 6) in which query 2 of batch 1 sees no key",
                  r(2, 3, 4, 6) * 2))
    after_cache = torch.arange(6)[None, :] <= torch.arange(2, 6)[:, None]           # 4 queries after 2 cached keys
    cases.append((r(1, 2, 4, 8, dtype=torch.float64), r(1, 2, 6, 8, dtype=torch.float64),
                  r(1, 2, 6, 3, dtype=torch.float64), after_cache,
                  "float64 inputs (1, 2, 4/6, 8) with a (4, 6) causal mask after a cache and a (4, 6) bias",
                  r(4, 6, dtype=torch.float64) * 2))
    if hidden:
        bias64 = torch.randn(3, 7, generator=g, dtype=torch.float64) * 3
        causal7 = torch.ones(7, 7, dtype=torch.bool).tril()[:3]
        causal7[0] = False
        cases.append((r(2, 2, 3, 4, dtype=torch.float64), r(2, 2, 7, 4, dtype=torch.float64),
                      r(2, 2, 7, 3, dtype=torch.float64), causal7,
                      "float64 inputs with a (3, 7) bias and a (3, 7) mask whose first row is all False", bias64))
        cases.append((r(2, 4, 6) * 2, r(2, 6, 6) * 2, r(2, 6, 2), None, "a (1, 4, 6) bias and no mask",
                      r(1, 4, 6) * 4))
        padding = torch.ones(3, 1, 1, 7, dtype=torch.bool)
        padding[0, ..., 5:] = False
        padding[2, ..., 1:] = False
        cases.append((r(3, 4, 7, 8), r(3, 4, 7, 8), r(3, 4, 7, 8), padding, "a padding mask (3, 1, 1, 7)"))
        cases.append((r(2, 9, 1, dtype=torch.float64) * 5, r(2, 11, 1, dtype=torch.float64) * 5,
                      r(2, 11, 3, dtype=torch.float64), None, "float64 inputs with d_k = 1"))
        cases.append((r(4, 1, 32), r(4, 1, 32), r(4, 1, 2), None, "a single key"))
        cases.append((r(2, 2, 6, 64) * 4, r(2, 2, 6, 64) * 4, r(2, 2, 6, 64), None, "d_k = 64 with large scores"))
        per_head = torch.rand(2, 3, 5, 5, generator=g) > 0.5
        per_head[:, 1, 2, :] = False
        cases.append((r(2, 3, 5, 8), r(2, 3, 5, 8), r(2, 3, 5, 8), per_head,
                      "a per-head mask (2, 3, 5, 5) with an empty row"))
        causal_x = torch.ones(6, 6, dtype=torch.bool).tril()
        cases.append((r(6, 8), r(6, 8), r(6, 8), causal_x, "2-D inputs (T, d) and a (T, T) mask"))
        rng, gh = hidden_rng("scaled_dot_product_attention"), hidden_generator("scaled_dot_product_attention")
        rh = lambda *shape: torch.randn(*shape, generator=gh)  # noqa: E731
        for _ in range(2):
            # Scores of spread up to 2 (d_k <= 64): float32 rounding stays well inside the tolerance.
            B, H, T_q, T_k = rng.randrange(1, 4), rng.randrange(1, 5), rng.randrange(1, 10), rng.randrange(1, 10)
            d_k, d_v, spread = rng.randrange(1, 65), rng.randrange(1, 17), rng.choice([0.5, 1.0, 2.0])
            mask = torch.rand(B, rng.choice([1, H]), T_q, T_k, generator=gh) > rng.uniform(0.2, 0.8)
            with_bias = rng.random() < 0.6
            cases.append((rh(B, H, T_q, d_k) * spread, rh(B, H, T_k, d_k) * spread, rh(B, H, T_k, d_v),
                          mask if rng.random() < 0.7 else None,
                          f"(B, n_heads, T_q, d_k) = {(B, H, T_q, d_k)} against {T_k} keys, d_v = {d_v}"
                          + (f", a bias (1, {H}, {T_q}, {T_k})" if with_bias else ""),
                          rh(1, H, T_q, T_k) * 2 if with_bias else None))
    for q, k, v, mask, what, *bias in cases:
        _check_attention_case(fn, q, k, v, mask, what, bias[0] if bias else None)
    # Extreme score ranges: every real score near -1e5, so only a fill below all of them works.
    far = torch.ones(2, 4, 6, dtype=torch.bool)
    far[:, :, 3:] = False
    far[1, 2] = False
    q_far = torch.full((2, 4, 1), 300.0)
    k_far = -(330.0 + torch.rand(2, 6, 1, generator=g) * 10)
    _extreme_case(fn, q_far, k_far, r(2, 6, 3), far, "scores around -1e5 with a partly and a fully masked row")
    # Reduced precision: the lesson of the masks page (a fill must exist in the dtype).
    low = [(torch.float16, 3, 5, False), (torch.bfloat16, 4, 6, True)]
    if hidden:
        low += [(torch.float16, 6, 9, True), (torch.bfloat16, 5, 3, False)]
    gl = generator(3020) if not hidden else hidden_generator("scaled_dot_product_attention/low")
    for dtype, T_q, T_k, with_bias in low:
        m = torch.rand(2, 1, T_q, T_k, generator=gl) > 0.4
        m[..., 0, :] = False                      # a fully masked query row
        m[..., 1:, 0] = True
        q16, k16, v16 = (torch.randn(2, 2, T_q if i == 0 else T_k, 8, generator=gl).to(dtype) for i in range(3))
        bias = (torch.randn(1, 2, T_q, T_k, generator=gl) * 3).to(dtype) if with_bias else None
        _low_precision_case(fn, q16, k16, v16, m, f"{str(dtype)[6:]} inputs (2, 2, {T_q}/{T_k}, 8) with a fully "
                            f"masked row{' and a ' + str(dtype)[6:] + ' bias (1, 2, %d, %d)' % (T_q, T_k) if with_bias else ''}",
                            bias)
    # Rows with no allowed key must also be safe to train through.
    q, k, v = r(1, 2, 3, 8).requires_grad_(), r(1, 2, 4, 8).requires_grad_(), r(1, 2, 4, 8).requires_grad_()
    out, _ = _run_attention(fn, q, k, v, empty)
    expect(out.requires_grad, "the output of scaled_dot_product_attention carries no gradient.",
           "do not detach anything (and do not wrap the computation in torch.no_grad()).")
    out.pow(2).sum().backward()
    for name, t in (("q", q), ("k", k), ("v", v)):
        expect(t.grad is not None, f"no gradient reached {name}.", "do not detach anything inside the function.")
        if not torch.isfinite(t.grad).all():
            fail(f"the output is right, but the gradient with respect to {name} contains NaN when a query row is fully "
                 "masked.",
                 "a row of -inf scores has a NaN softmax, and its backward pass is NaN too; with an additive mask "
                 "(scores + a tensor holding -inf) that NaN flows back into q and k even though the weights are zeroed "
                 "afterwards. Fill the scores with torch.finfo(scores.dtype).min (masked_fill), then zero the masked "
                 "weights.")


# ----------------------------------------------------------------------------- shared by the layers


def _linear_params(layer: nn.Linear) -> tuple[torch.Tensor, torch.Tensor | None]:
    return layer.weight.detach().to(torch.float64), None if layer.bias is None else layer.bias.detach().to(torch.float64)


def _lin(x, params):
    w, b = params
    y = x @ w.T
    return y if b is None else y + b



def _forward(module, *args, name: str, **kwargs):
    with forbid(*_SDPA, exercise=name.split(".")[0]):
        return call(module, *args, name=f"{name}.forward", **kwargs)


def _check_linear(module, attr: str, d_in: int, d_out: int, bias: bool, cls: str) -> nn.Linear:
    layer = getattr(module, attr, None)
    expect(isinstance(layer, nn.Linear), f"{cls} needs an nn.Linear attribute `{attr}`.",
           f"create self.{attr} = nn.Linear(...) in __init__ with exactly this name: the tests copy weights into it.")
    expect(tuple(layer.weight.shape) == (d_out, d_in),
           f"{cls}.{attr}.weight has shape {tuple(layer.weight.shape)}, expected {(d_out, d_in)}.",
           f"{attr} maps {d_in} features to {d_out}: nn.Linear({d_in}, {d_out}).")
    expect((layer.bias is not None) == bias, f"{cls}.{attr} should {'have' if bias else 'not have'} a bias.",
           "pass bias=bias to every nn.Linear.")
    return layer



# ----------------------------------------------------------------------------- exercise 3


def _decoder_mask_oracle(key_is_real: torch.Tensor, q_len: int, offset_shift: int = 0, causal: bool = True,
                         padding: bool = True, pad_queries: bool = False, strict: bool = False) -> torch.Tensor:
    """The contract by loops; the keyword arguments reproduce common bugs for diagnosis."""
    B, k_len = key_is_real.shape
    out = torch.zeros(B, 1, q_len, k_len, dtype=torch.bool)
    for b in range(B):
        for i in range(q_len):
            p = k_len - q_len + i + offset_shift
            for j in range(k_len):
                ok = (j < p if strict else j <= p) if causal else True
                if padding:
                    ok = ok and bool(key_is_real[b, j])
                if pad_queries:
                    ok = ok and bool(key_is_real[b, k_len - q_len + i])
                out[b, 0, i, j] = ok
    return out


@_one_thread
def check_decoder_mask(decoder_mask, hidden: bool = False) -> None:
    # (left padding per sequence, k_len, q_len): prefill (q_len == k_len) and decoding after a cache.
    cases = [([2, 0], 6, 6), ([3, 0, 1], 7, 2), ([1, 4], 5, 1)]
    free = []                        # key_is_real given as is (padding anywhere)
    if hidden:
        rng = hidden_rng("decoder_mask")
        cases += [([0], 1, 1), ([5, 0], 9, 3), ([0, 0, 2, 7], 8, 8)]
        for _ in range(3):
            B, k_len = rng.randrange(1, 5), rng.randrange(2, 15)
            q_len = rng.randrange(1, k_len + 1)
            cases.append(([rng.randrange(0, k_len) for _ in range(B)], k_len, q_len))
        middle = torch.tensor([[True, False, True, True, False, True], [False, True, True, False, True, True]])
        free.append((middle, 4, "padding in the middle of the sequences"))
        g = hidden_generator("decoder_mask")
        for _ in range(2):
            B, k_len = rng.randrange(1, 4), rng.randrange(3, 12)
            q_len = rng.randrange(1, k_len + 1)
            real = torch.rand(B, k_len, generator=g) > 0.3
            free.append((real, q_len, "padding at random places"))
    inputs = []
    for pads, k_len, q_len in cases:
        real = torch.ones(len(pads), k_len, dtype=torch.bool)
        for b, n in enumerate(pads):
            real[b, :n] = False
        inputs.append((real, q_len, f"left padding of {pads} tokens"))
    for real, q_len, how in inputs + free:
        B, k_len = real.shape
        label = (f"decoder_mask(key_is_real of shape {(B, k_len)} with {how}, q_len={q_len}) "
                 f"(the queries are positions {k_len - q_len} .. {k_len - 1})")
        before = real.clone()
        got = call(decoder_mask, real, q_len)
        expect(torch.equal(real, before), f"{label} changed key_is_real in place.", "build a new tensor.")
        expect(isinstance(got, torch.Tensor) and got.dtype == torch.bool,
               f"{label} should return a bool tensor, got {getattr(got, 'dtype', type(got).__name__)}.",
               "combine comparisons of positions with & so that the result stays boolean.")
        if tuple(got.shape) == (B, q_len, k_len) and (B, q_len) != (1, 1):
            fail(f"{label} has shape {tuple(got.shape)}, expected {(B, 1, q_len, k_len)}.",
                 "the mask needs a head axis of size 1, (B, 1, q_len, k_len), so that it broadcasts against "
                 "scores of shape (B, n_heads, q_len, k_len).")
        expect_tensor(got, (B, 1, q_len, k_len), label)
        want = _decoder_mask_oracle(real, q_len)
        if torch.equal(got.cpu(), want):
            continue
        variants = [
            (dict(offset_shift=-(k_len - q_len)),
             f"the causal part is aligned to the top left: with {k_len - q_len} earlier positions in the cache, query "
             f"i is at position {k_len - q_len} + i and sees every key up to it (a bottom-right alignment). "
             "tril() of a (q_len, k_len) matrix, or is_causal=True, puts query 0 at position 0."),
            (dict(strict=True), "the diagonal is missing: a token may attend to itself (key j equal to the query's "
                                "position), so compare with <=, not <."),
            (dict(offset_shift=1), "off by one: query i is at position k_len - q_len + i, not k_len - q_len + i + 1."),
            (dict(offset_shift=-1), "off by one: query i is at position k_len - q_len + i, not k_len - q_len + i - 1."),
            (dict(padding=False), "the padding was ignored: a key with key_is_real False is hidden from every query."),
            (dict(causal=False), "the mask is not causal: a query may not see keys after its own position."),
            (dict(pad_queries=True), "padding queries were masked too: only keys are hidden. The row of a padding "
                                     "query keeps what it may see (often nothing: exercise 2 then gives it a zero "
                                     "output, and the loss ignores it)."),
        ]
        hint = next((h for kw, h in variants if torch.equal(got.cpu(), _decoder_mask_oracle(real, q_len, **kw))),
                    "True where key j is real and j <= k_len - q_len + i (query i's position), for every sequence.")
        if hint.startswith("the causal part is aligned") and k_len == q_len:
            hint = "True where key j is real and j <= k_len - q_len + i (query i's position), for every sequence."
        fail(f"{label} gave, for sequence 0,\n{got[0, 0].int()}\nexpected\n{want[0, 0].int()}" if
             not torch.equal(got[0].cpu(), want[0]) else
             f"{label} is wrong for a sequence after the first (key_is_real = {real.int().tolist()}).", hint)

# ----------------------------------------------------------------------------- exercise 4


def _mha_layout_ref(module, x, mask, n_heads, layout="per_head", split="transpose", merge=True, scale="d_head",
                    out_proj=True, use_mask=True, zero_masked=True):
    """Multi-head self-attention in float64 from the module's own fused weights; keyword arguments
    reproduce common bugs for diagnosis."""
    x = x.detach().to(torch.float64)
    B, T, d_model = x.shape
    d_head = d_model // n_heads
    y = _lin(x, _linear_params(module.qkv))                              # (B, T, 3 d_model)
    if layout == "per_head":
        parts = y.view(B, T, n_heads, 3, d_head).unbind(3)               # each (B, T, n_heads, d_head)
    elif layout == "chunks":
        parts = [t.view(B, T, n_heads, d_head) for t in y.split(d_model, dim=-1)]
    else:  # "interleaved": q, k, v alternate feature by feature
        parts = y.view(B, T, n_heads, d_head, 3).unbind(4)
    if split == "transpose":
        q, k, v = (t.transpose(1, 2) for t in parts)
    else:
        q, k, v = (t.reshape(B, n_heads, T, d_head) for t in parts)
    scores = q @ k.transpose(-2, -1) / math.sqrt(d_head if scale == "d_head" else d_model)
    mask = mask if use_mask else None
    if mask is not None:
        scores = scores.masked_fill(~mask, torch.finfo(torch.float64).min)
    weights = torch.softmax(scores, dim=-1)
    if mask is not None and zero_masked:
        weights = weights.masked_fill(~mask, 0.0)
    out = weights @ v                                                    # (B, n_heads, T, d_head)
    out = out.transpose(1, 2).reshape(B, T, d_model) if merge else out.reshape(B, T, d_model)
    return _lin(out, _linear_params(module.out_proj)) if out_proj else out


def _diagnose_fused_mha(got, module, x, mask, n_heads) -> str:
    variants = [
        (dict(layout="chunks"), "the fused output was split as [all queries | all keys | all values], the layout of "
         "nn.MultiheadAttention's in_proj_weight (and of the book's FusedSelfAttention). This layer keeps, for each "
         "head, its query, key and value next to each other: view the output as (B, T, n_heads, 3, d_head)."),
        (dict(layout="interleaved"), "q, k and v were taken feature by feature (view (..., d_head, 3)); each head "
         "holds three blocks of d_head consecutive features: view (B, T, n_heads, 3, d_head)."),
        (dict(split="reshape"), "the heads were split in the wrong order: after taking q, k and v as "
         "(B, T, n_heads, d_head), transpose(1, 2) to (B, n_heads, T, d_head); a reshape straight to "
         "(B, n_heads, T, d_head) mixes positions and features across heads."),
        (dict(merge=False), "the heads were merged in the wrong order: transpose (B, n_heads, T, d_head) back to "
         "(B, T, n_heads, d_head) before reshape(B, T, d_model)."),
        (dict(scale="d_model"), "the scores were divided by sqrt(d_model); each head has d_head = d_model // n_heads "
         "features, so divide by sqrt(d_head)."),
        (dict(out_proj=False), "out_proj was not applied: the merged heads go through self.out_proj."),
        (dict(use_mask=False), "the mask was ignored: pass it on to the attention of every head."),
    ]
    for kwargs, hint in variants:
        if "use_mask" in kwargs and mask is None:
            continue
        try:
            want = _mha_layout_ref(module, x, mask, n_heads, **kwargs)
        except RuntimeError:
            continue
        if _same(got, want, 1e-4, 1e-4):
            return hint
    return ("view qkv(x) as (B, T, n_heads, 3, d_head), take q, k, v and move the head axis before the sequence "
            "axis, attend with a 1/sqrt(d_head) scale, merge back (transpose, reshape) and apply out_proj.")


def _copy_into_fused(module, ref: nn.MultiheadAttention, d_model: int, n_heads: int) -> None:
    """nn.MultiheadAttention's [q | k | v] rows, reordered into the per-head layout [q_h, k_h, v_h]."""
    d_head = d_model // n_heads
    with torch.no_grad():
        module.qkv.weight.copy_(ref.in_proj_weight.view(3, n_heads, d_head, d_model).transpose(0, 1)
                                .reshape(3 * d_model, d_model))
        if ref.in_proj_bias is not None:
            module.qkv.bias.copy_(ref.in_proj_bias.view(3, n_heads, d_head).transpose(0, 1).reshape(3 * d_model))
        module.out_proj.weight.copy_(ref.out_proj.weight)
        if ref.out_proj.bias is not None:
            module.out_proj.bias.copy_(ref.out_proj.bias)


def _causality(module, x, mask, name, t: int) -> None:
    x2 = x.clone()
    x2[:, t:] = x2[:, t:] + torch.randn(x2[:, t:].shape, generator=generator(t), dtype=x.dtype)
    y1, y2 = _forward(module, x, mask=mask, name=name), _forward(module, x2, mask=mask, name=name)
    if not _same(y1[:, :t], y2[:, :t]):
        fail(f"{name} with a causal mask is not causal: changing tokens from position {t} on changed the outputs at "
             f"positions before {t}.", "pass the mask down to the attention of every head, so that query i only sees "
             "keys j <= i; do not mix positions anywhere else.")


def _blame_attention_answer(layer: str, scaled_dot_product_attention):
    """A failure of ``layer`` blamed on exercise 2's answer when that answer fails its own tests."""
    earlier = [] if scaled_dot_product_attention is None else [
        (f"{layer} may call your scaled_dot_product_attention, which fails exercise 2's tests",
         lambda: check_scaled_dot_product_attention(scaled_dot_product_attention))]
    return earlier_first(*earlier)


def check_multi_head_attention(MultiHeadAttention, scaled_dot_product_attention=None, hidden: bool = False) -> None:
    """scaled_dot_product_attention, when given, is the exercise 2 answer the layer may call: a
    failure it causes is blamed on it."""
    with _blame_attention_answer("MultiHeadAttention", scaled_dot_product_attention):
        _check_multi_head_attention(MultiHeadAttention, hidden)


@_one_thread
def _check_multi_head_attention(MultiHeadAttention, hidden: bool) -> None:
    configs = [(16, 4, True, torch.float32), (12, 3, False, torch.float32), (8, 2, True, torch.float64)]
    rng = hidden_rng("multi_head_attention")
    if hidden:
        configs += [(24, 8, True, torch.float64), (10, 1, True, torch.float32), (8, 8, False, torch.float64)]
        for _ in range(2):
            n_heads = rng.randrange(1, 7)
            configs.append((n_heads * rng.randrange(1, 9), n_heads, rng.random() < 0.5,
                            rng.choice([torch.float32, torch.float64])))
    for i, (d_model, n_heads, bias, dtype) in enumerate(configs):
        torch.manual_seed(304 + d_model if not hidden else hidden_seed(f"multi_head_attention/init{i}"))
        module = call(MultiHeadAttention, d_model, n_heads, bias=bias, name="MultiHeadAttention(...)")
        _no_mha_module(module, "MultiHeadAttention")
        _check_linear(module, "qkv", d_model, 3 * d_model, bias, "MultiHeadAttention")
        _check_linear(module, "out_proj", d_model, d_model, bias, "MultiHeadAttention")
        ref = nn.MultiheadAttention(d_model, n_heads, bias=bias, batch_first=True)
        _copy_into_fused(module, ref, d_model, n_heads)
        module.to(dtype)
        ref.to(dtype)
        g = generator(3040 + d_model) if not hidden else hidden_generator(f"multi_head_attention/{i}")
        B, T = (2, 5) if not hidden else (rng.randrange(2, 4), rng.randrange(4, 9))
        x = torch.randn(B, T, d_model, generator=g, dtype=dtype)
        cfg = f"d_model={d_model}, n_heads={n_heads}, bias={bias}, {str(dtype)[6:]}"
        y = _forward(module, x, name="MultiHeadAttention")
        expect_tensor(y, (B, T, d_model), f"MultiHeadAttention output ({cfg})")
        expect(y.dtype == dtype, f"MultiHeadAttention ({cfg}) returned {y.dtype}.", "keep the dtype of x.")
        with torch.no_grad():
            want = ref(x, x, x, need_weights=False)[0]
        if not _same(y, want):
            fail(f"self-attention output ({cfg}, input (B, T) = {(B, T)}) differs from nn.MultiheadAttention with "
                 "the same weights.", _diagnose_fused_mha(y, module, x, None, n_heads))
        causal = torch.ones(T, T, dtype=torch.bool).tril().view(1, 1, T, T)
        y = _forward(module, x, mask=causal, name="MultiHeadAttention")
        with torch.no_grad():
            want = ref(x, x, x, attn_mask=~causal[0, 0], need_weights=False)[0]
        if not _same(y, want):
            fail(f"causal self-attention ({cfg}, T={T}) differs from nn.MultiheadAttention with the same weights "
                 "and mask.", _diagnose_fused_mha(y, module, x, causal, n_heads))
        _causality(module, x, causal, "MultiHeadAttention", t=3)
        # A query that may see no key: the contract promises it a zero output from every head, so the
        # layer's output there is out_proj's bias (or zero). Its other queries must be untouched.
        blind = causal.expand(B, 1, T, T).clone()
        blind[0, 0, 1, :] = False
        if hidden:
            blind = blind.expand(B, n_heads, T, T).clone()
            blind[-1, -1, T - 1, :] = False
        y = _forward(module, x, mask=blind, name="MultiHeadAttention")
        what = (f"with a {'per-head ' if hidden else ''}causal mask of shape {tuple(blind.shape)} in which query 1 "
                f"of sequence 0 sees no key ({cfg})")
        expect_tensor(y, (B, T, d_model), f"MultiHeadAttention output {what}")
        expect(bool(torch.isfinite(y).all()), f"MultiHeadAttention {what} gave NaN.",
               "a query that may see no key must get a zero output from every head: call your "
               "scaled_dot_product_attention from exercise 2, which returns zeros for such rows.")
        want = _mha_layout_ref(module, x, blind, n_heads)
        if _same(y, want):
            continue
        seen = (blind.any(dim=-1).all(dim=1))                          # (B, T): queries that see a key in every head
        if _same(y[seen], want[seen]):
            fail(f"MultiHeadAttention {what}: the outputs of the queries that see keys are right; the query that "
                 "sees no key is wrong.",
                 "a query that may see no key must get a zero output from that head, not an average of the values: "
                 "after the softmax, the weights of masked keys must be 0 (your scaled_dot_product_attention from "
                 "exercise 2 does this). The head split, the merge and out_proj are right.")
        fail(f"MultiHeadAttention {what} differs from the expected output.",
             _diagnose_fused_mha(y, module, x, blind, n_heads))
    try:
        MultiHeadAttention(10, 3)
    except ValueError as err:
        expect("10" in str(err) and "3" in str(err), "the ValueError should name d_model and n_heads.",
               "say which sizes do not divide, e.g. f'd_model {d_model} is not divisible by n_heads {n_heads}'.")
    except NotImplementedError:
        raise
    else:
        fail("MultiHeadAttention(d_model=10, n_heads=3) did not raise ValueError.",
             "check d_model % n_heads == 0 in __init__ and raise ValueError naming both sizes.")

# ----------------------------------------------------------------------------- exercise 5


def _gqa_ref(q, k, v, mask, grouping="interleave", mask_grouping="interleave"):
    """Grouped-query attention in float64: query head h uses key/value head h // group."""
    H, n_kv = q.shape[1], k.shape[1]
    group = H // n_kv
    if grouping == "interleave":
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    else:
        k, v = k.repeat(1, group, 1, 1), v.repeat(1, group, 1, 1)
    if mask is not None and mask_grouping != "interleave" and mask.shape[1] == H:
        B, _, T_q, T_k = mask.shape
        mask = mask.view(B, group, n_kv, T_q, T_k).transpose(1, 2).reshape(B, H, T_q, T_k)
    return _attention_ref(q, k, v, mask)[0]


def check_grouped_query_attention(grouped_query_attention, scaled_dot_product_attention=None,
                                  hidden: bool = False) -> None:
    """scaled_dot_product_attention, when given, is the exercise 2 answer it may call: a failure it
    causes is blamed on it."""
    with _blame_attention_answer("grouped_query_attention", scaled_dot_product_attention):
        _check_grouped_query_attention(grouped_query_attention, hidden)


@_one_thread
def _check_grouped_query_attention(grouped_query_attention, hidden: bool) -> None:
    # (B, n_heads, n_kv_heads, T_q, T_k, d_head, mask kind, dtype): decoding shapes (T_q < d_head), where
    # expanded keys would be the largest tensor of the call.
    cases = [(2, 4, 2, 1, 24, 16, None, torch.float32), (2, 6, 2, 3, 20, 16, "causal", torch.float32),
             (1, 8, 2, 2, 18, 16, "per_head", torch.float32), (2, 4, 4, 3, 10, 8, "padding", torch.float32),
             (1, 6, 3, 2, 16, 16, "causal", torch.float64)]
    if hidden:
        rng = hidden_rng("grouped_query_attention")
        cases += [(2, 8, 1, 2, 30, 32, "causal", torch.float64), (1, 12, 3, 4, 16, 16, "per_head", torch.float64),
                  (3, 4, 2, 1, 40, 8, "padding", torch.float32)]
        for _ in range(3):
            n_kv = rng.randrange(1, 4)
            H = n_kv * rng.randrange(2, 5)
            d = rng.choice([16, 24, 32])
            cases.append((rng.randrange(1, 4), H, n_kv, rng.randrange(1, 5), rng.randrange(12, 40), d,
                          rng.choice([None, "causal", "per_head", "padding"]),
                          rng.choice([torch.float32, torch.float64])))
    g = generator(305) if not hidden else hidden_generator("grouped_query_attention")
    for B, H, n_kv, T_q, T_k, d, kind, dtype in cases:
        q = torch.randn(B, H, T_q, d, generator=g, dtype=dtype)
        k, v = (torch.randn(B, n_kv, T_k, d, generator=g, dtype=dtype) for _ in range(2))
        if kind is None:
            mask = None
        elif kind == "causal":           # the queries are the last T_q positions
            mask = (torch.arange(T_k)[None, :] <= torch.arange(T_k - T_q, T_k)[:, None]).view(1, 1, T_q, T_k)
        elif kind == "padding":
            mask = torch.ones(B, 1, 1, T_k, dtype=torch.bool)
            mask[0, ..., : T_k // 3] = False
        else:
            mask = torch.rand(B, H, T_q, T_k, generator=g) > 0.5
            mask[..., -1] = True
            mask[0, H - 1, 0] = False                # head H-1 of sequence 0: query 0 sees no key
        label = (f"grouped_query_attention with n_heads={H}, n_kv_heads={n_kv}, B={B}, T_q={T_q}, T_k={T_k}, "
                 f"d_head={d}, {str(dtype)[6:]}, "
                 + ("no mask" if mask is None else f"a {kind.replace('_', '-')} mask {tuple(mask.shape)}"))
        largest = _LargestTensor()
        with forbid(*_SDPA, exercise="grouped-query attention"), largest:
            got = call(grouped_query_attention, q, k, v, mask, name="grouped_query_attention")
        expect_tensor(got, (B, H, T_q, d), label)
        expect(got.dtype == dtype, f"{label} returned {got.dtype}.", "keep the dtype of q.")
        want = _gqa_ref(q, k, v, mask)
        if not _same(got, want):
            if _same(got, _gqa_ref(q, k, v, mask, grouping="tile")):
                hint = ("query head h must use key/value head h // group (heads 0 .. group-1 share kv head 0): the "
                        "heads were grouped as h % n_kv_heads. The head axis of q splits as (n_kv_heads, group), "
                        "kv head first, not (group, n_kv_heads).")
            elif mask is not None and _same(got, _gqa_ref(q, k, v, mask, mask_grouping="tile")):
                hint = ("the queries are grouped right but the per-head mask is not: regroup its head axis exactly "
                        "as the queries' (kv head first, then the group), after expanding it to (B, n_heads, T_q, "
                        "T_k).")
            elif mask is not None and _same(got, _gqa_ref(q, k, v, None)):
                hint = "the mask was ignored: pass it, regrouped like the queries, to the attention."
            else:
                hint = ("out[:, h] = softmax(q[:, h] @ k[:, h // group]^T / sqrt(d_head), masked) @ v[:, h // group], "
                        "with the mask of head h.")
            expect_close(got, want.to(got.dtype), label, hint, rtol=1e-4)
        expanded = B * H * T_k * d * q.element_size()
        if n_kv < H and largest.nbytes >= expanded:
            fail(f"{label} created a tensor of {largest.nbytes:,} bytes (in {largest.op}), as large as the keys "
                 f"expanded to all {H} query heads ({expanded:,} bytes).",
                 "expanding the keys and values to n_heads copies them (repeat_interleave, expand followed by "
                 "reshape, or a matmul that broadcasts k over a group axis, which expands it internally): during "
                 "generation that is a copy of the whole cache at every step. Move the group into the query axis "
                 "instead, so that each key matrix is multiplied once: q as (B, n_kv_heads, group * T_q, d_head), "
                 "the mask regrouped the same way.")

# ----------------------------------------------------------------------------- exercise 6

ENTROPY_ANSWER = math.log(512)


def _entropy_oracle(scores, mask=None, temperature=1.0, base=math.e, ignore_mask=False, multiply=False):
    s = scores.detach().to(torch.float64)
    s = s * temperature if multiply else s / temperature
    if mask is not None and not ignore_mask:
        s = s.masked_fill(~mask, float("-inf"))
    logp = torch.log_softmax(s, dim=-1)
    p = logp.exp()
    h = torch.where(p > 0, -p * logp, torch.zeros_like(p)).sum(dim=-1)
    h = torch.nan_to_num(h, nan=0.0)             # a row with no allowed key has entropy 0
    return h / math.log(base)


def entropy_prediction_passes(predicted_entropy) -> bool:
    """For the exercise's demo, which shows the measurement only once the prediction passes its test."""
    try:
        _check_entropy_prediction(predicted_entropy)
    except CheckFailed:
        return False
    return True


def _check_entropy_prediction(predicted_entropy) -> None:
    guesses = [
        (math.log(1024), "the query at position 511 of a causal sequence sees only keys 0 .. 511: the causal mask "
                         "leaves 512 keys, not 1024."),
        (math.log2(512), "entropy in nats uses the natural logarithm: ln, not log2."),
        (math.log2(1024), "entropy in nats uses the natural logarithm, and the causal query sees 512 keys."),
        (math.log(511), "positions 0 .. 511 are 512 keys: the query sees itself too."),
        (0.0, "that is the limit temperature -> 0 (all the weight on the largest score). As the temperature grows, "
              "scores / temperature all go to 0 and the weights become uniform."),
        (512.0, "that is the number of keys; the entropy of a uniform distribution over n keys is ln(n)."),
    ]
    judge_prediction("predicted_entropy", call(predicted_entropy), ENTROPY_ANSWER,
                     unit_hint="return your prediction as a number of nats.",
                     asked="the entropy asked for (causal query at position 511 of 1024 tokens, temperature -> "
                           "infinity)",
                     exact=1e-9, close=0.01, close_hint=_ROUNDED_HINT, guesses=guesses, near=0.01,
                     fallback="scores / temperature all go to 0 as the temperature grows, so the weights become "
                              "uniform over the keys the query may see; the entropy of a uniform distribution over n "
                              "outcomes is ln(n) nats.")


_ROUNDED_HINT = ("a rounded decimal (or a value read off a measurement) is not the prediction: return the arithmetic "
                 "that gives it, as a Python expression (math.log(...) and the like), exact to float precision.")


@_one_thread
def check_attention_entropy(predicted_entropy, attention_entropy, hidden: bool = False) -> None:
    _check_entropy_prediction(predicted_entropy)
    g = generator(306) if not hidden else hidden_generator("attention_entropy")
    T = 6
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    cases = [(torch.zeros(1, 4), None, 1.0, "equal scores over 4 keys"),
             (torch.randn(2, 3, 5, generator=g) * 2, None, 1.0, "random scores (2, 3, 5), temperature 1"),
             (torch.randn(T, T, generator=g) * 3, causal, 0.5, "random scores (6, 6) with a causal mask, "
                                                                "temperature 0.5"),
             (torch.randn(2, 4, generator=g) * 10, None, 1e-3, "distinct scores at temperature 1e-3 "
                                                                "(every weight but one underflows to 0)")]
    blind = torch.rand(3, 5, generator=g) > 0.3
    blind[1] = False
    blind[0, 0] = True
    cases.append((torch.randn(3, 5, generator=g), blind, 2.0, "a (3, 5) mask whose second row is all False, "
                                                              "temperature 2"))
    cases.append((torch.randn(2, 6, generator=g, dtype=torch.float64) * 4, causal[-2:], 0.7,
                  "float64 scores (2, 6) with the last two rows of a causal mask, temperature 0.7"))
    if hidden:
        gh, rng = hidden_generator("attention_entropy/drawn"), hidden_rng("attention_entropy")
        cases += [(torch.randn(4, 7, generator=g, dtype=torch.float64) * 5, None, 3.0, "float64 scores (4, 7)"),
                  (torch.randn(2, 2, 6, 6, generator=g, dtype=torch.float64), causal, 1e-4,
                   "float64 scores (2, 2, 6, 6), causal mask, temperature 1e-4"),
                  (torch.randn(1, 8, generator=g) + 500.0, None, 1.0, "scores around 500")]
        for _ in range(3):
            shape = (*(rng.randrange(1, 4) for _ in range(rng.randrange(0, 3))), rng.randrange(1, 6),
                     rng.randrange(1, 12))
            dtype = rng.choice([torch.float32, torch.float64])
            mask = (torch.rand(shape[-2:], generator=gh) > 0.4) if rng.random() < 0.6 else None
            temperature = 10 ** rng.uniform(-2, 2)
            cases.append(((torch.randn(shape, generator=gh) * 3).to(dtype), mask, temperature,
                          f"{str(dtype)[6:]} scores {shape}, {'a mask, ' if mask is not None else ''}"
                          f"temperature {temperature:.3g}"))
    for scores, mask, temperature, what in cases:
        before = scores.clone()
        got = call(attention_entropy, scores, mask, temperature, name="attention_entropy")
        label = f"attention_entropy of {what}"
        expect(torch.equal(scores, before), f"{label} changed the scores in place.", "build new tensors.")
        expect_tensor(got, tuple(scores.shape[:-1]), label)
        expect(got.dtype == scores.dtype, f"{label} returned {got.dtype}, expected {scores.dtype}.",
               "compute in the dtype of the scores.")
        want = _entropy_oracle(scores, mask, temperature)
        if _same(got, want, 1e-5, 1e-4):
            continue
        empty = (~mask).all(dim=-1).expand(got.shape) if mask is not None else None
        if empty is not None and bool(empty.any()) and _same(got.detach().masked_fill(empty, 0.0), want, 1e-5, 1e-4):
            hint = ("a row with no allowed key has entropy 0 (there is no choice to make); it got "
                    f"{got.detach()[empty].max().item():.4g}: a finite fill such as -1e9 (or finfo.min) spreads such "
                    "a row evenly over its forbidden keys. Fill masked scores with -inf and set that row's result to 0.")
        elif _same(got, want / torch.log(torch.tensor(float(scores.shape[-1]))), 1e-5, 1e-4) or (
                mask is not None and _same(got, want / mask.expand(scores.shape).sum(-1).clamp_min(2).double().log(),
                                           1e-5, 1e-4)):
            hint = ("that is the entropy divided by its largest value ln(n) (the attention-maps page's ratio); return "
                    "the entropy itself, in nats.")
        elif not torch.isfinite(got).all():
            if mask is not None and bool((~mask).all(dim=-1).any()) and torch.isfinite(got[..., :1]).all():
                hint = ("a row with no allowed key has entropy 0 (no choice to make), never NaN: its softmax is "
                        "-inf - (-inf) = NaN, so replace that row's result (torch.nan_to_num, or torch.where on "
                        "mask.any(-1)).")
            else:
                hint = ("a weight of exactly 0 (a masked key, or one that underflowed) contributes 0 * log(0) = "
                        "0 * -inf = NaN: its term must count as 0 (torch.where(p > 0, ..., 0), or torch.xlogy / "
                        "log_softmax with the masked terms removed).")
        elif _same(got, _entropy_oracle(scores, mask, temperature, base=2), 1e-5, 1e-4):
            hint = "that is in bits: the entropy in nats uses the natural logarithm, torch.log."
        elif temperature != 1.0 and _same(got, _entropy_oracle(scores, mask, temperature, multiply=True), 1e-5, 1e-4):
            hint = "divide the scores by the temperature (softmax(scores / temperature)); it was multiplied."
        elif mask is not None and _same(got, _entropy_oracle(scores, mask, temperature, ignore_mask=True), 1e-5, 1e-4):
            hint = "the mask was ignored: masked keys get weight 0 and contribute nothing to the entropy."
        else:
            hint = ("H = -sum_j p_j ln p_j over the keys (the last axis), p = softmax(scores / temperature) with "
                    "masked keys at weight 0; 0 ln 0 counts as 0.")
        expect_close(got, want.to(got.dtype), label, hint, rtol=1e-4)

# ----------------------------------------------------------------------------- exercise 7


def _window_mask(T: int, window: int, extra: int = 0) -> torch.Tensor:
    i, j = torch.arange(T).view(-1, 1), torch.arange(T).view(1, -1)
    return (j <= i) & (i - j < window + extra)


def _window_unmasked_padding(q, k, v, window):
    """The common bug: zero keys padded before the sequence take part in the softmax."""
    q, k, v = (t.detach().to(torch.float64) for t in (q, k, v))
    kp = F.pad(k, (0, 0, window - 1, 0)).unfold(-2, window, 1)          # (..., T, d, window)
    vp = F.pad(v, (0, 0, window - 1, 0)).unfold(-2, window, 1)
    s = (q.unsqueeze(-2) @ kp).squeeze(-2) / math.sqrt(q.shape[-1])   # (..., T, window)
    return (torch.softmax(s, -1).unsqueeze(-2) @ vp.transpose(-2, -1)).squeeze(-2)


def check_sliding_window_attention(sliding_window_attention, scaled_dot_product_attention=None,
                                   hidden: bool = False) -> None:
    with _blame_attention_answer("sliding_window_attention", scaled_dot_product_attention):
        _check_sliding_window_attention(sliding_window_attention, hidden)


@_one_thread
def _check_sliding_window_attention(sliding_window_attention, hidden: bool) -> None:
    cases = [((2,), 48, 4, 3, 4, torch.float32), ((1, 2), 40, 6, 6, 5, torch.float32), ((2,), 5, 3, 2, 8, torch.float32),
             ((1,), 24, 4, 3, 3, torch.float64)]
    if hidden:
        rng = hidden_rng("sliding_window_attention")
        cases += [((1,), 64, 4, 4, 1, torch.float32), ((2,), 30, 8, 2, 30, torch.float64), ((3,), 7, 2, 3, 12,
                                                                                            torch.float32)]
        for _ in range(3):
            T = rng.randrange(8, 80)
            cases.append(((*(rng.randrange(1, 3) for _ in range(rng.randrange(1, 3))),), T, rng.randrange(1, 7),
                          rng.randrange(1, 7), rng.randrange(1, max(2, T // 4)),
                          rng.choice([torch.float32, torch.float64])))
    g = generator(307) if not hidden else hidden_generator("sliding_window_attention")
    for batch, T, d, d_v, window, dtype in cases:
        q, k = (torch.randn(*batch, T, d, generator=g, dtype=dtype) * 1.5 for _ in range(2))
        v = torch.randn(*batch, T, d_v, generator=g, dtype=dtype)
        label = (f"sliding_window_attention(q, k, v, window={window}) for q {(*batch, T, d)}, d_v={d_v}, "
                 f"{str(dtype)[6:]}")
        largest = _LargestTensor()
        with forbid(*_SDPA, exercise="sliding-window attention"), largest:
            got = call(sliding_window_attention, q, k, v, window, name="sliding_window_attention")
        expect_tensor(got, (*batch, T, d_v), label)
        expect(got.dtype == dtype, f"{label} returned {got.dtype}.", "keep the dtype of q.")
        want = _attention_ref(q, k, v, _window_mask(T, window))[0]
        if not _same(got, want, 1e-5, 1e-4):
            if window > 1 and _same(got, _window_unmasked_padding(q, k, v, window), 1e-5, 1e-4):
                hint = (f"the first {window - 1} queries have fewer than window keys before them: the padding "
                        "positions you added before the sequence must be masked, or their zero keys take part in the "
                        "softmax (a score of 0 is not a weight of 0).")
            elif _same(got, _attention_ref(q, k, v, _window_mask(T, window, 1))[0], 1e-5, 1e-4):
                hint = (f"off by one: each query sees window = {window} keys, itself included (keys i - window + 1 .. "
                        "i), not window + 1.")
            elif window > 1 and _same(got, _attention_ref(q, k, v, _window_mask(T, window, -1))[0], 1e-5, 1e-4):
                hint = (f"off by one: each query sees window = {window} keys, itself included (keys i - window + 1 .. "
                        "i), not window - 1.")
            elif _same(got, _attention_ref(q, k, v, _window_mask(T, window), scale="none")[0], 1e-5, 1e-4):
                hint = "the scores were not scaled: divide them by sqrt(d_k)."
            else:
                hint = ("out_i = softmax over keys j in [i - window + 1, i] (j >= 0) of q_i . k_j / sqrt(d_k), "
                        "times v_j.")
            expect_close(got, want.to(got.dtype), label, hint, rtol=1e-4)
        n_batch = math.prod(batch)
        if 2 * window * max(d, d_v, 1) < T and largest.nbytes >= n_batch * T * T * q.element_size():
            fail(_full_matrix_hint("sliding_window_attention", largest, T, T),
                 f"sliding-window attention needs only (T, window) = ({T}, {window}) scores: gather, for each query, "
                 "its window of keys (pad window - 1 positions before the sequence, then unfold), never the (T, T) "
                 "matrix.")

# ----------------------------------------------------------------------------- exercise 8


def _linear_ref(q, k, v, causal=True, feature=lambda x: F.elu(x) + 1, normalise=True, scale_q=False, diagonal=0,
                chunk=None):
    """Linear attention in float64 by the quadratic form (only for the oracle). ``chunk`` with
    ``causal=False`` reproduces an answer whose chunks see their own future."""
    q, k, v = (t.detach().to(torch.float64) for t in (q, k, v))
    if scale_q:
        q = q / math.sqrt(q.shape[-1])
    fq, fk = feature(q), feature(k)
    a = fq @ fk.transpose(-2, -1)                     # (..., T, T)
    T = a.shape[-1]
    i, j = torch.arange(T).view(-1, 1), torch.arange(T).view(1, -1)
    if chunk is not None:
        a = a * ((j // chunk <= i // chunk) & ((j // chunk < i // chunk) | (j - i <= -diagonal) | (not causal)))
    elif causal:
        a = a * (j - i <= -diagonal)
    out = a @ v
    return out / a.sum(dim=-1, keepdim=True) if normalise else out


def _same_where_stable(got, q, k, v, variant: dict) -> bool:
    """got matches a variant of linear attention on the rows whose normaliser is not near zero (phi = elu
    alone can make it vanish, and float32 and float64 then part ways)."""
    want = _linear_ref(q, k, v, **variant)
    if _same(got, want, 1e-5, 1e-4):
        return True
    if variant.get("feature") is None:
        return False
    den = _linear_ref(q, k, v, **{**variant, "normalise": False}) / want          # (..., T, d_v): the normaliser
    stable = (den.abs() > 0.5).all(dim=-1)
    return bool(stable.float().mean() > 0.5) and _same(got.detach()[stable], want[stable], 1e-3, 1e-3)


def _full_matrix_hint(exercise: str, largest, T_q: int, T_k: int) -> str:
    return (f"{exercise} created a tensor of {largest.nbytes:,} bytes (in {largest.op}), as large as the full "
            f"(T_q, T_k) = ({T_q}, {T_k}) score matrix for every batch entry.")


@_one_thread
def check_chunked_linear_attention(chunked_linear_attention, hidden: bool = False) -> None:
    # (batch, T, d_k, d_v, chunk_size, dtype); T * d_k * d_v well above T * T / 2 is avoided: both limits bind.
    cases = [((2,), 96, 6, 6, 16, torch.float32), ((1, 2), 50, 4, 5, 8, torch.float32), ((1,), 40, 4, 4, 8, torch.float64)]
    if hidden:
        rng = hidden_rng("chunked_linear_attention")
        cases += [((2,), 64, 8, 8, 1, torch.float64), ((1,), 40, 3, 4, 64, torch.float32),
                  ((3,), 71, 5, 6, 10, torch.float64)]
        for _ in range(3):
            T = rng.randrange(20, 120)
            cases.append(((*(rng.randrange(1, 3) for _ in range(rng.randrange(1, 3))),), T, rng.randrange(3, 9),
                          rng.randrange(3, 9), rng.randrange(2, max(3, T // 3)),
                          rng.choice([torch.float32, torch.float64])))
    g = generator(308) if not hidden else hidden_generator("chunked_linear_attention")
    for batch, T, d_k, d_v, C, dtype in cases:
        q, k = (torch.randn(*batch, T, d_k, generator=g, dtype=dtype) for _ in range(2))
        v = torch.randn(*batch, T, d_v, generator=g, dtype=dtype)
        label = (f"chunked_linear_attention(q, k, v, chunk_size={C}) for q {(*batch, T, d_k)}, d_v={d_v}, "
                 f"{str(dtype)[6:]}")
        largest = _LargestTensor()
        with forbid(*_SDPA, exercise="chunked linear attention"), largest:
            got = call(chunked_linear_attention, q, k, v, C, name="chunked_linear_attention")
        expect_tensor(got, (*batch, T, d_v), label)
        expect(got.dtype == dtype, f"{label} returned {got.dtype}.", "keep the dtype of q.")
        want = _linear_ref(q, k, v)
        if not _same(got, want, 1e-5, 1e-4):
            variants = [
                (dict(chunk=C, causal=False), "inside a chunk every query saw the whole chunk, later keys included: "
                 "the within-chunk part needs the causal mask (tril), and the running state must be updated only "
                 "after the chunk's outputs are computed, so that it holds earlier chunks only."),
                (dict(chunk=C, diagonal=1), "the diagonal is missing inside the chunks: position i sees its own key "
                 "(tril(), not tril(-1))."),
                (dict(diagonal=1), "every position missed its own key: the sums run over j <= i, the diagonal "
                 "included."),
                (dict(normalise=False), "the normaliser is missing: divide phi(q_i) . S_i by phi(q_i) . z_i, with z "
                 "summing phi(k_j) over the same keys as S."),
                (dict(feature=F.elu), "the feature map is elu(x) + 1, not elu(x): the +1 keeps every feature positive, "
                 "so the normaliser cannot be zero or negative."),
                (dict(scale_q=True), "linear attention here has no 1/sqrt(d_k) scale: apply phi to q and k as they "
                 "are."),
                (dict(causal=False), "the output is that of non-causal linear attention: position i may only use keys "
                 "j <= i."),
            ]
            hint = next((h for kw, h in variants if _same_where_stable(got, q, k, v, kw)),
                        "out_i = phi(q_i) . S_i / (phi(q_i) . z_i) with S_i = sum_{j<=i} phi(k_j) v_j^T and "
                        "z_i = sum_{j<=i} phi(k_j), phi(x) = elu(x) + 1: earlier chunks through the carried state, the "
                        "current one through its own masked (C, C) product.")
            expect_close(got, want.to(got.dtype), label, hint, atol=1e-5, rtol=1e-4)
        n_batch, elem = math.prod(batch), q.element_size()
        if C < T and largest.nbytes >= n_batch * T * d_k * d_v * elem and d_k * d_v > 2 * max(d_k, d_v, C):
            fail(f"chunked_linear_attention ({label}) created a tensor of {largest.nbytes:,} bytes (in {largest.op}), "
                 f"as large as the prefix sums S_i of every position, (T, d_k, d_v) = ({T}, {d_k}, {d_v}).",
                 "keep one running state S (d_k, d_v) and z (d_k,) from chunk to chunk (or one per chunk), not one "
                 "per position: that is what chunking saves over cumsum.")
        if C < T // 2 and largest.nbytes >= n_batch * T * T * elem:
            fail(_full_matrix_hint("chunked_linear_attention", largest, T, T),
                 "only the (chunk_size, chunk_size) products inside one chunk are quadratic; earlier chunks enter "
                 "through the state S = sum phi(k_j) v_j^T.")
    # Causality as a property: changing late keys and values changes no earlier output.
    q, k, v = (torch.randn(2, 24, 4, generator=g) for _ in range(3))
    k2, v2 = k.clone(), v.clone()
    k2[:, 13:] += 1.0
    v2[:, 13:] -= 2.0
    a = call(chunked_linear_attention, q, k, v, 8, name="chunked_linear_attention")
    b = call(chunked_linear_attention, q, k2, v2, 8, name="chunked_linear_attention")
    if not _same(a[:, :13], b[:, :13]):
        fail("chunked_linear_attention(chunk_size=8) is not causal: changing keys and values from position 13 on "
             "changed earlier outputs.", "inside a chunk mask the future (tril); update the state after the chunk.")

# ----------------------------------------------------------------------------- exercise 9


def _flash_ref(q, k, v, causal, shift=0, strict=False):
    """Exact attention in float64 and its log-sum-exp; the causal mask aligned bottom-right
    (``shift`` and ``strict`` reproduce common bugs)."""
    q, k, v = (t.detach().to(torch.float64) for t in (q, k, v))
    T_q, T_k = q.shape[-2], k.shape[-2]
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if causal:
        i = torch.arange(T_k - T_q, T_k).view(-1, 1) + shift
        j = torch.arange(T_k).view(1, -1)
        s = s.masked_fill(j >= i if strict else j > i, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    return torch.softmax(s, dim=-1) @ v, lse


def _flash_variant(q, k, v, q_block, k_block, causal, rescale_sum=True, rescale_acc=True, early_break=False):
    """The tiled loop in float64, optionally with a common bug."""
    q, k, v = (t.detach().to(torch.float64) for t in (q, k, v))
    T_q, T_k = q.shape[-2], k.shape[-2]
    off, scale = T_k - T_q, 1 / math.sqrt(q.shape[-1])
    outs, lses = [], []
    for qs in range(0, T_q, q_block):
        qb = q[..., qs:qs + q_block, :]
        n = qb.shape[-2]
        m = torch.full((*qb.shape[:-1], 1), float("-inf"), dtype=torch.float64)
        l, acc = torch.zeros_like(m), torch.zeros((*qb.shape[:-1], v.shape[-1]), dtype=torch.float64)
        for ks in range(0, T_k, k_block):
            if causal and ks > off + qs + (0 if early_break else n - 1):
                break
            s = qb @ k[..., ks:ks + k_block, :].transpose(-2, -1) * scale
            if causal:
                s = s.masked_fill(torch.arange(ks, ks + s.shape[-1]).view(1, -1)
                                  > torch.arange(off + qs, off + qs + n).view(-1, 1), float("-inf"))
            m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))
            p, c = torch.exp(s - m_new), torch.exp(m - m_new)
            l = (l * c if rescale_sum else l) + p.sum(dim=-1, keepdim=True)
            acc = (acc * c if rescale_acc else acc) + p @ v[..., ks:ks + k_block, :]
            m = m_new
        outs.append(acc / l)
        lses.append((m + l.log()).squeeze(-1))
    return torch.cat(outs, -2), torch.cat(lses, -1)


def _run_flash(fn, q, k, v, q_block, k_block, causal, label):
    largest = _LargestTensor()
    with forbid(*_SDPA, exercise="tiled attention"), largest:
        got = call(fn, q, k, v, q_block, k_block, causal=causal, name="flash_attention")
    expect(isinstance(got, (tuple, list)) and len(got) == 2,
           f"{label} returned {type(got).__name__}, expected a tuple (out, lse).",
           "return the output and the log-sum-exp of each query's scores: `return out, lse`.")
    return got[0], got[1], largest


@_one_thread
def check_flash_attention(flash_attention, hidden: bool = False) -> None:
    # (batch, T_q, T_k, d_k, d_v, q_block, k_block, causal, spread)
    cases = [((2,), 64, 64, 4, 4, 8, 16, False, 1.0), ((1, 2), 40, 56, 4, 3, 16, 24, True, 2.0),
             ((2,), 48, 48, 4, 4, 8, 16, True, 6.0)]
    if hidden:
        rng = hidden_rng("flash_attention")
        cases += [((3,), 10, 70, 4, 4, 3, 7, True, 1.0), ((1,), 64, 64, 4, 4, 64, 64, True, 2.0),
                  ((2,), 33, 65, 4, 4, 10, 64, False, -6.0), ((1,), 24, 24, 2, 2, 1, 1, True, 1.0)]
        for _ in range(3):
            T_q = rng.randrange(8, 65)
            T_k = rng.randrange(T_q, 97)
            cases.append(((*(rng.randrange(1, 3) for _ in range(rng.randrange(1, 3))),), T_q, T_k,
                          rng.randrange(1, 5), rng.randrange(1, 5), rng.randrange(1, T_q + 4),
                          rng.randrange(1, T_k + 4), rng.random() < 0.6, rng.choice([1.0, 2.0, -3.0])))
    g = generator(309) if not hidden else hidden_generator("flash_attention")
    for batch, T_q, T_k, d_k, d_v, qb, kb, causal, spread in cases:
        q = torch.randn(*batch, T_q, d_k, generator=g) * abs(spread)
        growth = torch.linspace(0.3, 1.5, T_k) if spread > 0 else torch.linspace(1.5, 0.3, T_k)
        k = torch.randn(*batch, T_k, d_k, generator=g) * abs(spread) * growth.view(-1, 1)
        v = torch.randn(*batch, T_k, d_v, generator=g)
        label = (f"flash_attention(q_block={qb}, k_block={kb}, causal={causal}) for q {(*batch, T_q, d_k)} against "
                 f"{T_k} keys, d_v={d_v}")
        out, lse, largest = _run_flash(flash_attention, q, k, v, qb, kb, causal, label)
        expect_tensor(out, (*batch, T_q, d_v), f"the output of {label}")
        expect_tensor(lse, (*batch, T_q), f"the log-sum-exp of {label}")
        want, want_lse = _flash_ref(q, k, v, causal)
        s_max = (q.double() @ k.double().transpose(-2, -1)).abs().max().item() / math.sqrt(d_k)
        atol = 1e-5 * max(1.0, s_max / 20)
        if not _same(out, want, atol=atol, rtol=1e-4):
            variants = [
                (lambda: _flash_ref(q, k, v, causal, shift=-(T_k - T_q))[0],
                 f"the causal mask is aligned to the top left: with {T_k} keys and {T_q} queries, query i is at "
                 f"position {T_k - T_q} + i and sees keys up to it."),
                (lambda: _flash_ref(q, k, v, causal, strict=True)[0],
                 "the diagonal is masked: a query sees the key at its own position (mask key j only when j > "
                 "the query's position)."),
                (lambda: _flash_variant(q, k, v, qb, kb, causal, early_break=True)[0],
                 "tiles were skipped too early: a key tile may be skipped only when it lies after the *last* query "
                 "of the query tile; the first query's position skips tiles that later queries of the tile see."),
                (lambda: _flash_variant(q, k, v, qb, kb, causal, rescale_sum=False)[0],
                 "the running sum l was not rescaled: when the maximum grows from m to m_new, multiply the old sum "
                 "by exp(m - m_new), like the accumulator."),
                (lambda: _flash_variant(q, k, v, qb, kb, causal, rescale_acc=False)[0],
                 "the accumulator was not rescaled: when the maximum grows from m to m_new, multiply the old "
                 "accumulator by exp(m - m_new) before adding p @ v_tile."),
                (lambda: _flash_ref(q, k, v, False)[0],
                 "the causal mask was ignored: mask, inside each tile, the keys after each query's position."),
            ]
            hint = None
            if not torch.isfinite(out).all():
                hint = ("the output has inf/NaN: subtract the running maximum before exp, p = exp(s - m_new) with "
                        "m_new = max(m, rowmax(s)) over all key tiles so far.")
            for make, h in variants:
                if hint is None and (causal or "causal" not in h) and _same(out, make(), 1e-4, 1e-4):
                    hint = h
            hint = hint or ("for each query tile keep a running maximum m, a running sum l and an accumulator; for "
                            "each key tile: scores / sqrt(d_k), masked, m_new = max(m, rowmax(s)), p = exp(s - "
                            "m_new), l = l*exp(m - m_new) + rowsum(p), acc = acc*exp(m - m_new) + p @ v_tile; "
                            "out = acc / l.")
            expect_close(out, want.to(out.dtype), f"the output of {label}", hint, atol=atol, rtol=1e-4)
        if not _same(lse, want_lse, atol=atol * 10, rtol=1e-5):
            got_lse = lse.detach().double()
            if _same(got_lse, want_lse - _flash_max(q, k, causal), 1e-4, 1e-4):
                hint = ("the log-sum-exp is m + log(l): log(l) alone is relative to the running maximum m; add it "
                        "back.")
            elif _same(got_lse, _flash_ref(q * math.sqrt(d_k), k, v, causal)[1], 1e-4, 1e-4):
                hint = "the log-sum-exp is of the scaled scores q . k / sqrt(d_k), the ones the softmax sees."
            else:
                hint = ("lse_i = log sum_j exp(s_ij) over the keys query i may see, with s = q . k / sqrt(d_k): "
                        "m + log(l) at the end of the loop.")
            expect_close(lse, want_lse.to(lse.dtype), f"the log-sum-exp of {label}", hint, atol=atol * 10, rtol=1e-5)
        n_batch, elem = math.prod(batch), q.element_size()
        if kb < T_k and largest.nbytes >= n_batch * T_q * T_k * elem:
            fail(_full_matrix_hint("flash_attention", largest, T_q, T_k),
                 "compute the scores one (q_block, k_block) tile at a time and fold each into the running statistics.")
        bound = n_batch * T_q * min(kb, T_k) * elem
        others = max(t.untyped_storage().nbytes() for t in (q, k, v)) + n_batch * T_q * max(d_v, 1) * elem
        if qb < T_q and bound > others and largest.nbytes >= bound:
            fail(f"{label} created a tensor of {largest.nbytes:,} bytes (in {largest.op}): the scores of all "
                 f"{T_q} queries against a key tile of {min(kb, T_k)}.",
                 f"the queries were not tiled: take the queries q_block = {qb} at a time (an outer loop), so that "
                 "one tile of scores is (q_block, k_block).")
    # Merging across devices: two halves of the keys, merged through their log-sum-exps, give the whole.
    q, k, v = torch.randn(2, 12, 4, generator=g), torch.randn(2, 30, 4, generator=g), torch.randn(2, 30, 3, generator=g)
    o1, l1, _ = _run_flash(flash_attention, q, k[:, :11], v[:, :11], 4, 5, False, "flash_attention on keys 0 .. 10")
    o2, l2, _ = _run_flash(flash_attention, q, k[:, 11:], v[:, 11:], 4, 5, False, "flash_attention on keys 11 .. 29")
    lse = torch.logaddexp(l1.double(), l2.double())
    merged = (o1.double() * torch.exp(l1.double() - lse).unsqueeze(-1) + o2.double() * torch.exp(l2.double() - lse)
              .unsqueeze(-1))
    expect_close(merged, _flash_ref(q, k, v, False)[0], "the outputs of two halves of 30 keys (11 and 19), merged "
                 "with weights exp(lse_half - lse_all)",
                 "each half's lse must be the log-sum-exp of that half's scores, so that exp(lse_half - lse_all) is "
                 "the share of the softmax mass in that half.", atol=1e-5, rtol=1e-4)
    # float64 in, float64 accuracy out.
    for T_q, T_k, qb, kb in ([(20, 33, 6, 8)] if hidden else [(12, 18, 5, 4)]):
        q, k, v = (torch.randn(2, T, 8, generator=g, dtype=torch.float64) * 4 for T in (T_q, T_k, T_k))
        what = f"flash_attention(q_block={qb}, k_block={kb}, causal=True) for float64 q (2, {T_q}, 8) against {T_k} keys"
        out, lse, _ = _run_flash(flash_attention, q, k, v, qb, kb, True, what)
        want, want_lse = _flash_ref(q, k, v, True)
        expect(out.dtype == torch.float64 and lse.dtype == torch.float64, f"{what} returned {out.dtype}.",
               "return the dtype of the inputs: create m, l and acc with dtype=q.dtype, device=q.device (float64 "
               "here), and do not convert the results.")
        expect_close(out, want, f"the output of {what}", "right to float32 accuracy only: create m, l and the "
                     "accumulator in q's dtype (float64 here).", atol=1e-10, rtol=1e-10)
        expect_close(lse, want_lse, f"the log-sum-exp of {what}", "right to float32 accuracy only: keep m and l in "
                     "q's dtype.", atol=1e-10, rtol=1e-10)
    # Half precision in, the same dtype out.
    for dtype, atol in ([(torch.float16, 2e-2)] + ([(torch.bfloat16, 8e-2)] if hidden else [])):
        q = torch.randn(2, 24, 8, generator=g).to(dtype)
        k = torch.randn(2, 40, 8, generator=g).to(dtype)
        v = torch.randn(2, 40, 6, generator=g).to(dtype)
        what = (f"flash_attention(q_block=8, k_block=16, causal=True) for {str(dtype)[6:]} q, k, v (2, 24/40, 8)")
        out, lse, _ = _run_flash(flash_attention, q, k, v, 8, 16, True, what)
        expect_tensor(out, (2, 24, 6), what)
        expect(out.dtype == dtype and lse.dtype == dtype,
               f"{what} returned {str(out.dtype)[6:]} and {str(getattr(lse, 'dtype', '?'))[6:]}.",
               "return the dtype of the inputs: create m, l and acc with dtype=q.dtype, device=q.device, or cast "
               "the results back with .to(q.dtype).")
        want, want_lse = _flash_ref(q.float(), k.float(), v.float(), True)
        expect_close(out.float(), want.float(), what, "the result is right in float32 but not in half precision: "
                     "keep the running maximum subtracted before exp (p = exp(s - m_new)), so nothing overflows.",
                     atol=atol, rtol=atol)


def _flash_max(q, k, causal):
    """The row maxima of the scaled, masked scores (float64)."""
    s = q.detach().double() @ k.detach().double().transpose(-2, -1) / math.sqrt(q.shape[-1])
    if causal:
        T_q, T_k = q.shape[-2], k.shape[-2]
        s = s.masked_fill(torch.arange(T_k).view(1, -1) > torch.arange(T_k - T_q, T_k).view(-1, 1), float("-inf"))
    return s.amax(dim=-1)

# ----------------------------------------------------------------------------- exercise 10


def _rope_complex(x: torch.Tensor, positions: torch.Tensor, base: float, pairing: str = "half") -> torch.Tensor:
    """RoPE in float64 as a product of complex numbers: pair j is (x_j, x_{j + d/2}) (half-split), or
    (x_{2j}, x_{2j+1}) for ``pairing="interleaved"`` (a common mix-up)."""
    x = x.detach().to(torch.float64)
    d = x.shape[-1]
    theta = base ** (-torch.arange(d // 2, dtype=torch.float64) * 2 / d)
    turn = torch.polar(torch.ones(len(positions), d // 2, dtype=torch.float64),
                       positions.to(torch.float64)[:, None] * theta)                 # (T, d/2)
    if pairing == "half":
        z = torch.complex(x[..., : d // 2], x[..., d // 2:]) * turn
        return torch.cat((z.real, z.imag), dim=-1)
    z = torch.view_as_complex(x.reshape(*x.shape[:-1], d // 2, 2).contiguous()) * turn
    return torch.view_as_real(z).flatten(-2)


def _step_oracle(ids, emb, w_q, w_k, w_v, w_o, H, n_kv, k_past, v_cache, base, kind="right"):
    """The contract in float64 from PyTorch built-ins: embedding lookup, projections, RoPE (complex),
    F.scaled_dot_product_attention with enable_gqa and a bottom-right causal mask. k_past holds the past
    keys before rotation. Returns (y, all rotated keys)."""
    f = lambda t: t.detach().to(torch.float64)  # noqa: E731
    B, T_new = ids.shape
    d = w_q.shape[0] // H
    T_past = k_past.shape[-2]
    x = F.embedding(ids, f(emb))
    q = F.linear(x, f(w_q)).view(B, T_new, H, d).transpose(1, 2)
    k = F.linear(x, f(w_k)).view(B, T_new, n_kv, d).transpose(1, 2)
    v = F.linear(x, f(w_v)).view(B, T_new, n_kv, d).transpose(1, 2)
    pos = torch.arange(T_past, T_past + T_new) if kind != "no_offset" else torch.arange(T_new)
    pairing = "interleaved" if kind == "interleaved" else "half"
    q, k = _rope_complex(q, pos, base, pairing), _rope_complex(k, pos, base, pairing)
    past = _rope_complex(k_past, torch.arange(T_past), base)
    if kind == "cache_rotated_twice":
        past = _rope_complex(past, torch.arange(T_past), base)
    if kind == "values_rotated":
        v = _rope_complex(v, pos, base)
    keys, values = torch.cat((past, k), -2), torch.cat((f(v_cache), v), -2)
    T_all = T_past + T_new
    if kind == "top_left":
        allowed = torch.ones(T_new, T_all, dtype=torch.bool).tril()
    else:
        allowed = torch.arange(T_all)[None, :] <= (T_all - T_new + torch.arange(T_new))[:, None]
    out = F.scaled_dot_product_attention(q, keys, values, attn_mask=allowed, enable_gqa=True)
    out = out.transpose(1, 2).reshape(B, T_new, H * d)
    y = out @ f(w_o) if kind == "w_o_untransposed" else F.linear(out, f(w_o))
    return y, keys


def check_decoder_attention_step(decoder_attention_step, decoder_mask=None, grouped_query_attention=None,
                                 hidden: bool = False) -> None:
    """decoder_mask and grouped_query_attention, when given, are the answers of exercises 3 and 5 it may
    call: a failure they cause is blamed on them."""
    earlier = []
    if decoder_mask is not None:
        earlier.append(("decoder_attention_step may call your decoder_mask, which fails exercise 3's tests",
                        lambda: check_decoder_mask(decoder_mask)))
    if grouped_query_attention is not None:
        earlier.append(("decoder_attention_step may call your grouped_query_attention, which fails exercise 5's "
                        "tests", lambda: check_grouped_query_attention(grouped_query_attention)))
    with earlier_first(*earlier):
        _check_decoder_attention_step(decoder_attention_step, hidden)


@_one_thread
def _check_decoder_attention_step(decoder_attention_step, hidden: bool) -> None:
    # (B, n_heads, n_kv_heads, d_head, T_past, T_new, vocab, base, dtype); d_model = n_heads * d_head
    cases = [(1, 4, 2, 8, 5, 1, 11, 10000.0, torch.float32), (2, 4, 1, 8, 3, 4, 13, 100.0, torch.float32),
             (1, 2, 1, 8, 4, 2, 10, 10000.0, torch.float64)]
    if hidden:
        rng = hidden_rng("decoder_attention_step")
        cases += [(2, 2, 2, 16, 0, 3, 9, 10000.0, torch.float64), (1, 6, 3, 4, 17, 2, 20, 500.0, torch.float64)]
        for dtype in (torch.float32, torch.float64):
            n_kv = rng.randrange(1, 4)
            cases.append((rng.randrange(1, 3), n_kv * rng.randrange(1, 4), n_kv, 2 * rng.randrange(2, 9),
                          rng.randrange(0, 25), rng.randrange(1, 6), rng.randrange(5, 40),
                          rng.choice([100.0, 1000.0, 10000.0]), dtype))
    g = generator(310) if not hidden else hidden_generator("decoder_attention_step")
    for B, H, n_kv, d, T_past, T_new, vocab, base, dtype in cases:
        r = lambda *shape: torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype)  # noqa: E731
        d_model = H * d
        ids = torch.randint(0, vocab, (B, T_new), generator=g)
        emb = r(vocab, d_model)
        w_q, w_k, w_v = r(H * d, d_model) / math.sqrt(d_model), r(n_kv * d, d_model), r(n_kv * d, d_model)
        w_k, w_v = w_k / math.sqrt(d_model), w_v / math.sqrt(d_model)
        w_o = r(d_model, H * d) / math.sqrt(d_model)
        k_past, v_cache = r(B, n_kv, T_past, d), r(B, n_kv, T_past, d)
        k_cache = _rope_complex(k_past, torch.arange(T_past), base).to(dtype)      # rotated when cached
        inputs = [ids, emb, w_q, w_k, w_v, w_o, k_cache, v_cache]
        saved = [t.clone() for t in inputs]
        label = (f"decoder_attention_step with {T_new} new token{'s' if T_new > 1 else ''} after a cache of {T_past} "
                 f"(B={B}, n_heads={H}, n_kv_heads={n_kv}, d_head={d}, base={base:g}, {str(dtype)[6:]})")
        with forbid(*_SDPA, exercise="the attention step"):
            got = call(decoder_attention_step, ids, emb, w_q, w_k, w_v, w_o, H, n_kv, k_cache, v_cache, base,
                       name="decoder_attention_step")
        expect(all(torch.equal(a, b) for a, b in zip(inputs, saved)), f"{label} changed one of its inputs in place.",
               "build new tensors (torch.cat makes the new cache); do not write into the inputs.")
        expect(isinstance(got, (tuple, list)) and len(got) == 3,
               f"{label} returned {type(got).__name__}, expected a tuple (y, k_cache, v_cache).",
               "return three tensors: the layer's output and the two grown caches.")
        y, new_k, new_v = got
        expect_tensor(y, (B, T_new, d_model), f"the output of {label}")
        expect_tensor(new_k, (B, n_kv, T_past + T_new, d), f"the new k_cache of {label}")
        expect_tensor(new_v, (B, n_kv, T_past + T_new, d), f"the new v_cache of {label}")
        expect(y.dtype == dtype and new_k.dtype == dtype, f"{label} returned dtype {y.dtype}, expected {dtype}.",
               "keep the dtype of the weights: create every new tensor with their dtype and device.")
        want, want_keys = _step_oracle(ids, emb, w_q, w_k, w_v, w_o, H, n_kv, k_past, v_cache, base)
        atol = 1e-4 if dtype == torch.float32 else 1e-10
        cache_ok = _same(new_k, want_keys, atol=atol, rtol=1e-4)
        if cache_ok and _same(y, want, atol=atol, rtol=1e-4):
            continue
        variants = [
            ("no_offset", f"the new tokens were rotated as positions {'0' if T_new == 1 else f'0 .. {T_new - 1}'}, "
                          f"but they come after {T_past} cached ones: rotate new token t by its absolute position "
                          "T_past + t."),
            ("cache_rotated_twice", "the cached keys were rotated again: the cache holds keys already rotated at "
                                    "their own positions; rotate only the new keys, then append them."),
            ("interleaved", "RoPE was applied with interleaved pairs (x_2j, x_2j+1); this model uses the half-split "
                            "pairing of chapter 2, entry j with entry j + d_head/2 (rotate_half)."),
            ("values_rotated", "the values were rotated: RoPE rotates only queries and keys."),
            ("top_left", f"the causal mask is aligned to the top left: new query t is at position {T_past} + t and "
                         "sees every cached key and the new keys up to itself (your decoder_mask of exercise 3 with "
                         "q_len = T_new gives this)."),
            ("w_o_untransposed", "w_o is stored like nn.Linear's weight, (d_model, n_heads * d_head): apply it as "
                                 "out @ w_o.T, as for w_q, w_k and w_v."),
        ]
        changes_cache = {"no_offset", "cache_rotated_twice", "interleaved"}
        hint = next((h for kind, h in variants
                     if (kind in changes_cache) != cache_ok and (T_past > 0 or kind not in (
                         "no_offset", "cache_rotated_twice", "top_left"))
                     and _same(y, _step_oracle(ids, emb, w_q, w_k, w_v, w_o, H, n_kv, k_past, v_cache, base, kind)[0],
                               atol=atol, rtol=1e-4)), None)
        if hint is None and not cache_ok:
            hint = ("the new k_cache must be cat((k_cache, rope(k_new, positions)), dim=-2) with positions T_past .. "
                    "T_past + T_new - 1 (half-split pairs), and v_cache cat((v_cache, v_new), dim=-2).")
        if hint is None:
            hint = (f"with T_past={T_past}, T_new={T_new}: x = emb[ids]; q, k, v = x @ w.T split into heads; rotate "
                    "q and k at positions T_past + t; append to the caches; grouped-query attention (query head h "
                    "uses kv head h // group) with a bottom-right causal mask; merge heads; @ w_o.T.")
        if not cache_ok:
            expect_close(new_k, want_keys.to(new_k.dtype), f"the new k_cache of {label}", hint, atol=atol, rtol=1e-4)
        expect_close(y, want.to(y.dtype), f"the output of {label}", hint, atol=atol, rtol=1e-4)
