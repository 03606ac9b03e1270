"""Checks for chapter 3: softmax, scaled dot-product attention, masks, multi-head, grouped-query,
sliding-window, linear and tiled attention, and the KV-cache size.

Oracles: ``torch.softmax`` and the attention formula computed in float64 (here, never in the
answers), ``F.scaled_dot_product_attention`` (also with ``enable_gqa``), ``nn.MultiheadAttention``
with weights copied into the student's layers, hand-derived masks, and properties: rows sum to
one, masked weights are zero, causality (changing a future token changes no earlier output),
GQA with ``n_kv_heads == n_heads`` equals multi-head attention, and the largest tensor the
tiled and linear versions create (seen through a dispatch mode) is smaller than a
``(T_q, T_k)`` score matrix.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from ._core import CheckFailed, call, earlier_first, expect, expect_close, expect_tensor, fail, forbid, generator
from ._core import one_thread as _one_thread, same as _same
from ._hidden import hidden_generator, hidden_rng, hidden_seed

# ----------------------------------------------------------------------------- helpers






class _LargestTensor(TorchDispatchMode):
    """Records the largest storage (bytes) of any tensor an operation returns inside the block."""

    def __init__(self) -> None:
        super().__init__()
        self.nbytes, self.op = 0, ""
        self._remote = None

    # Judged outside the kernel, the student's code runs in the kernel: record there too,
    # and take the kernel's record after each call.
    def __enter__(self):
        from .. import probe

        self._remote = probe.kernel_context("course.checks.ch03:_LargestTensor", owner=self)
        self._remote.__enter__()
        return super().__enter__()

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            self._remote.__exit__(*exc)

    def remote_state(self) -> dict:
        return {"nbytes": self.nbytes, "op": self.op}

    def absorb(self, state: dict) -> None:
        if isinstance(state, dict) and int(state.get("nbytes", 0)) > self.nbytes:
            self.nbytes, self.op = int(state["nbytes"]), str(state.get("op", ""))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                n = t.untyped_storage().nbytes()
                if n > self.nbytes:
                    self.nbytes, self.op = n, str(func.overloadpacket.__name__)
        return out


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


def _attention_ref(q, k, v, mask=None, scale="sqrt", softmax_dim=-1, invert=False, mask_scores=True):
    """The contract in float64; variants reproduce common bugs for diagnosis."""
    q, k, v = (t.detach().to(torch.float64) for t in (q, k, v))
    d_k = q.shape[-1]
    factor = {"sqrt": 1 / math.sqrt(d_k), "none": 1.0, "d_k": 1 / d_k}[scale]
    scores = q @ k.transpose(-2, -1) * factor
    if mask is not None:
        allowed = ~mask if invert else mask
        if mask_scores:
            scores = scores.masked_fill(~allowed, torch.finfo(torch.float64).min)
    weights = torch.softmax(scores, dim=softmax_dim)
    if mask is not None:
        weights = weights.masked_fill(~allowed, 0.0)
    return weights @ v, weights


def _diagnose_attention(got_w, q, k, v, mask) -> str | None:
    """Name the bug when the weights match a common wrong variant; None when none matches."""
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
        _, w = _attention_ref(q, k, v, mask, scale, dim, invert)
        if _same(got_w, w, atol=1e-4, rtol=1e-4):
            return hint
    if mask is not None and _same(got_w, _attention_ref(q, k, v, mask, mask_scores=False)[1], 1e-4, 1e-4):
        return ("the mask was applied only after the softmax: zeroing weights afterwards leaves rows that no longer "
                "sum to 1. Fill the masked scores (masked_fill(~mask, torch.finfo(dtype).min)) before the softmax.")
    return None


def _run_attention(fn, q, k, v, mask):
    with forbid(*_SDPA, exercise="scaled dot-product attention"):
        result = call(fn, q, k, v, mask, name="scaled_dot_product_attention")
    expect(isinstance(result, tuple) and len(result) == 2,
           f"scaled_dot_product_attention should return a tuple (out, weights), got {type(result).__name__}.",
           "return both: `return weights @ v, weights`.")
    return result


def _check_attention_case(fn, q, k, v, mask, what: str) -> None:
    out, weights = _run_attention(fn, q, k, v, mask)
    batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2])
    T_q, T_k, d_v = q.shape[-2], k.shape[-2], v.shape[-1]
    w_shape = torch.broadcast_shapes((*batch, T_q, T_k), mask.shape) if mask is not None else (*batch, T_q, T_k)
    expect_tensor(weights, tuple(w_shape), f"weights for {what}")
    expect_tensor(out, (*w_shape[:-1], d_v), f"out for {what}")
    want_out, want_w = _attention_ref(q, k, v, mask)
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
            if w_e.abs().sum() > 0 and _same(weights.detach().masked_fill(rows_empty.unsqueeze(-1), 0.0), want_w):
                fail(f"{what}: a query whose mask row is all False got non-zero weights "
                     f"(their sum is {w_e.sum(-1).max().item():.3g}).",
                     "a fully masked row must get all-zero weights and a zero output, not a uniform average: "
                     "after the softmax, set the weights of masked positions to 0 (a finite fill such as -1e9 or "
                     "finfo.min alone spreads the row evenly over forbidden keys).")
        hint = _diagnose_attention(weights, q, k, v, mask)
        if hint:
            fail(f"{what}: the weights differ from softmax(q @ k^T / sqrt(d_k)).", hint)
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
                     "weights = softmax(q @ k^T / sqrt(d_k)) over the last axis, with masked entries excluded.")
    expect_close(out, want_out.to(out.dtype), f"out for {what}",
                 "out must be weights @ v: multiply the (T_q, T_k) weights by v (T_k, d_v).")


def _low_precision_case(fn, q, k, v, mask, what: str) -> None:
    """float16 / bfloat16 inputs: the fill must exist in the dtype, results keep the dtype."""
    dtype = q.dtype
    try:
        out, weights = _run_attention(fn, q, k, v, mask)
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
    want_out, want_w = _attention_ref(q, k, v, mask)
    tol = {torch.float16: 4e-3, torch.bfloat16: 3e-2}[dtype]
    expect_close(weights.float(), want_w.float(), f"weights for {what}",
                 "weights = softmax(q @ k^T / sqrt(d_k)) over the last axis, masked entries exactly 0, computed in "
                 "the input dtype.", atol=tol, rtol=tol)
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
    if hidden:
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
            cases.append((rh(B, H, T_q, d_k) * spread, rh(B, H, T_k, d_k) * spread, rh(B, H, T_k, d_v),
                          mask if rng.random() < 0.7 else None,
                          f"(B, n_heads, T_q, d_k) = {(B, H, T_q, d_k)} against {T_k} keys, d_v = {d_v}"))
    for q, k, v, mask, what in cases:
        _check_attention_case(fn, q, k, v, mask, what)
    # Extreme score ranges: every real score near -1e5, so only a fill below all of them works.
    far = torch.ones(2, 4, 6, dtype=torch.bool)
    far[:, :, 3:] = False
    far[1, 2] = False
    q_far = torch.full((2, 4, 1), 300.0)
    k_far = -(330.0 + torch.rand(2, 6, 1, generator=g) * 10)
    _extreme_case(fn, q_far, k_far, r(2, 6, 3), far, "scores around -1e5 with a partly and a fully masked row")
    # Reduced precision: the lesson of the masks page (a fill must exist in the dtype).
    low = [(torch.float16, 3, 5)] + ([(torch.bfloat16, 4, 6), (torch.float16, 6, 9)] if hidden else [])
    gl = generator(3020) if not hidden else hidden_generator("scaled_dot_product_attention/low")
    for dtype, T_q, T_k in low:
        m = torch.rand(2, 1, T_q, T_k, generator=gl) > 0.4
        m[..., 0, :] = False                      # a fully masked query row
        m[..., 1:, 0] = True
        q16, k16, v16 = (torch.randn(2, 2, T_q if i == 0 else T_k, 8, generator=gl).to(dtype) for i in range(3))
        _low_precision_case(fn, q16, k16, v16, m, f"{str(dtype)[6:]} inputs with a fully masked row")
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

# ----------------------------------------------------------------------------- exercise 3


@_one_thread
def check_masks(causal_mask, padding_mask, hidden: bool = False) -> None:
    rng = hidden_rng("masks")
    for T in ([1, 4, 6] + ([2, 17, rng.randrange(3, 40)] if hidden else [])):
        got = call(causal_mask, T)
        expect(isinstance(got, torch.Tensor) and got.dtype == torch.bool,
               f"causal_mask({T}) should be a bool tensor, got {getattr(got, 'dtype', type(got).__name__)}.",
               "build it from torch.ones(T, T, dtype=torch.bool), or compare positions, so that it stays boolean.")
        expect_tensor(got, (1, 1, T, T), f"causal_mask({T})")
        want = torch.ones(T, T, dtype=torch.bool).tril()
        if not torch.equal(got[0, 0], want):
            g2 = got[0, 0]
            if torch.equal(g2, want & ~torch.eye(T, dtype=torch.bool)):
                hint = "the diagonal is missing: a token may attend to itself (key j = i), so use tril(), not tril(-1)."
            elif torch.equal(g2, want.T):
                hint = ("the mask is transposed: query i (row) may attend to keys j <= i (columns), so True lies on and "
                        "below the diagonal: tril, not triu.")
            elif torch.equal(g2, ~want):
                hint = "the mask is inverted: True means 'may attend', and a query may attend to itself and the past."
            else:
                hint = "True exactly where key j <= query i: torch.ones(T, T, dtype=torch.bool).tril()."
            fail(f"causal_mask({T})[0, 0] is\n{g2.int()}\nexpected\n{want.int()}", hint)
    g = generator(303) if not hidden else hidden_generator("masks")
    shapes = [(2, 5), (3, 1)] + ([(4, 9), (1, 6), (rng.randrange(1, 6), rng.randrange(1, 13))] if hidden else [])
    for B, T in shapes:
        pad_id = 0 if (B + T) % 2 else 7
        ids = torch.randint(1, 20, (B, T), generator=g)
        ids[ids == pad_id] = 3
        lengths = torch.randint(1, T + 1, (B,), generator=g)
        for b in range(B):
            ids[b, lengths[b]:] = pad_id
        got = call(padding_mask, ids, pad_id)
        expect(isinstance(got, torch.Tensor) and got.dtype == torch.bool,
               "padding_mask should return a bool tensor.", "compare the ids with pad_id: (ids != pad_id).")
        want = (ids != pad_id).view(B, 1, 1, T)
        if tuple(got.shape) == (B, 1, T, 1) and T > 1:
            fail(f"padding_mask returned shape {tuple(got.shape)}, expected {(B, 1, 1, T)}.",
                 "this masks queries, not keys: padding keys must be hidden from every query, so the sequence axis "
                 "goes last, (B, 1, 1, T), and broadcasts over the query axis.")
        expect_tensor(got, (B, 1, 1, T), f"padding_mask of ids with shape {(B, T)}")
        if not torch.equal(got, want):
            hint = ("the mask is inverted: True marks real tokens (ids != pad_id), which may be attended to."
                    if torch.equal(got, ~want) else "True where ids != pad_id, at every position.")
            fail(f"padding_mask({ids.tolist()}, pad_id={pad_id}) gave {got.view(B, T).int().tolist()}.", hint)
        combined = call(causal_mask, T) & got
        expect(tuple(combined.shape) == (B, 1, T, T),
               f"causal_mask(T) & padding_mask(ids, pad_id) has shape {tuple(combined.shape)}, expected {(B, 1, T, T)}.",
               "causal_mask is (1, 1, T, T) and padding_mask (B, 1, 1, T): they broadcast to (B, 1, T, T).")
    # The masks must broadcast against per-head scores.
    scores = torch.zeros(2, 3, 4, 4)
    try:
        scores.masked_fill(~(call(causal_mask, 4) & call(padding_mask, torch.ones(2, 4, dtype=torch.long), 0)), 1.0)
    except RuntimeError as err:
        fail(f"the masks do not broadcast against scores of shape (B, n_heads, T, T) = (2, 3, 4, 4): {err}",
             "give both masks four dimensions: (1, 1, T, T) and (B, 1, 1, T).")

# ----------------------------------------------------------------------------- exercise 4


def _linear_params(layer: nn.Linear) -> tuple[torch.Tensor, torch.Tensor | None]:
    return layer.weight.detach().to(torch.float64), None if layer.bias is None else layer.bias.detach().to(torch.float64)


def _lin(x, params):
    w, b = params
    y = x @ w.T
    return y if b is None else y + b


def _mha_ref(module, x_q, x_kv, mask, n_heads, n_kv_heads=None, wrong_split="", merge=True, scale="d_head",
             out_proj=True, kv_from_q=False, grouping="interleave", use_mask=True, zero_masked=True):
    """Multi-head (or grouped-query) attention in float64 from the module's own weights."""
    n_kv_heads = n_kv_heads or n_heads
    x_q = x_q.detach().to(torch.float64)
    x_kv = x_q if x_kv is None or kv_from_q else x_kv.detach().to(torch.float64)
    B, T_q, d_model = x_q.shape
    T_kv, d_head = x_kv.shape[1], d_model // n_heads

    def heads(x, T, h, which):
        if which not in wrong_split:
            return x.view(B, T, h, d_head).transpose(1, 2)
        return x.reshape(B, h, T, d_head)

    q = heads(_lin(x_q, _linear_params(module.q_proj)), T_q, n_heads, "q")
    k = heads(_lin(x_kv, _linear_params(module.k_proj)), T_kv, n_kv_heads, "k")
    v = heads(_lin(x_kv, _linear_params(module.v_proj)), T_kv, n_kv_heads, "v")
    group = n_heads // n_kv_heads
    if group > 1:
        if grouping == "interleave":
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        else:
            k, v = k.repeat(1, group, 1, 1), v.repeat(1, group, 1, 1)
    scores = q @ k.transpose(-2, -1) / math.sqrt(d_head if scale == "d_head" else d_model)
    mask = mask if use_mask else None
    if mask is not None:
        scores = scores.masked_fill(~mask, torch.finfo(torch.float64).min)
    weights = torch.softmax(scores, dim=-1)
    if mask is not None and zero_masked:
        weights = weights.masked_fill(~mask, 0.0)
    out = weights @ v                                            # (B, n_heads, T_q, d_head)
    out = out.transpose(1, 2).reshape(B, T_q, d_model) if merge else out.reshape(B, T_q, d_model)
    return _lin(out, _linear_params(module.out_proj)) if out_proj else out


def _diagnose_mha(got, module, x_q, x_kv, mask, n_heads, n_kv_heads=None) -> str:
    split_hint = ("the heads were split in the wrong order: view the projection as (B, T, n_heads, d_head), "
                  "then transpose(1, 2) to (B, n_heads, T, d_head). Reshaping straight to (B, n_heads, T, d_head) mixes "
                  "positions and features across heads.")
    empty_rows = mask is not None and bool((~mask).all(dim=-1).any())
    if empty_rows:   # a wrong empty row changes nothing else: name it before any other part
        try:
            uniform = _mha_ref(module, x_q, x_kv, mask, n_heads, n_kv_heads, zero_masked=False)
        except RuntimeError:
            uniform = None
        if uniform is not None and _same(got, uniform, 1e-4, 1e-4):
            return ("a query that may see no key (its mask row is all False) must get a zero output from that head, "
                    "and it got the average of all the values: the weights of masked keys must be set to 0 after "
                    "the softmax. Your scaled_dot_product_attention from exercise 2 does this; call it instead "
                    "of writing the softmax again. The head split and out_proj are right.")
    variants = [
        (dict(wrong_split="qkv"), split_hint), (dict(wrong_split="q"), split_hint), (dict(wrong_split="kv"), split_hint),
        (dict(merge=False), "the heads were merged in the wrong order: transpose (B, n_heads, T, d_head) back to "
         "(B, T, n_heads, d_head) before reshape(B, T, d_model)."),
        (dict(wrong_split="qkv", merge=False), "the heads were split and merged by plain reshapes: view as (B, T, n_heads, "
         "d_head) and transpose(1, 2); undo both when merging."),
        (dict(scale="d_model"), "the scores were divided by sqrt(d_model); each head has d_head = d_model // n_heads "
         "features, so divide by sqrt(d_head)."),
        (dict(out_proj=False), "out_proj was not applied: the merged heads go through self.out_proj."),
        (dict(use_mask=False), "the mask was ignored: pass it on to the attention of every head "
         "(scaled_dot_product_attention(q, k, v, mask))."),
        (dict(kv_from_q=True), "keys and values must come from x_kv in cross-attention: k_proj(x_kv) and v_proj(x_kv); "
         "only the queries come from x_q."),
        (dict(grouping="tile"), "query head h must share key/value head h // (n_heads // n_kv_heads): "
         "use repeat_interleave(group, dim=1). .repeat tiles the heads as 0, 1, 0, 1, ... instead of 0, 0, 1, 1, ..."),
    ]
    for kwargs, hint in variants:
        if kwargs.get("grouping") and (n_kv_heads or n_heads) == n_heads:
            continue
        if (kwargs.get("kv_from_q") and x_kv is None) or ("use_mask" in kwargs and mask is None):
            continue
        try:
            want = _mha_ref(module, x_q, x_kv, mask, n_heads, n_kv_heads, **kwargs)
        except RuntimeError:
            continue
        if _same(got, want, 1e-4, 1e-4):
            return hint
    if empty_rows:
        return ("this mask has a query row that is all False, and that query must get a zero output from that "
                "head (then out_proj adds only its bias). Check that your attention gives zero weights to every "
                "masked key, also when all of a row's keys are masked; then the split into heads, the "
                "1/sqrt(d_head) scale, the merge and out_proj.")
    return ("project, split into heads (view (B, T, n_heads, d_head), transpose(1, 2)), attend with a 1/sqrt(d_head) "
            "scale, merge back (transpose, reshape) and apply out_proj.")


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
           f"pass bias=bias to every nn.Linear.")
    return layer


def _copy_from_torch_mha(module, ref: nn.MultiheadAttention, d_model: int) -> None:
    with torch.no_grad():
        for i, name in enumerate(("q_proj", "k_proj", "v_proj")):
            getattr(module, name).weight.copy_(ref.in_proj_weight[i * d_model:(i + 1) * d_model])
            if ref.in_proj_bias is not None:
                getattr(module, name).bias.copy_(ref.in_proj_bias[i * d_model:(i + 1) * d_model])
        module.out_proj.weight.copy_(ref.out_proj.weight)
        if ref.out_proj.bias is not None:
            module.out_proj.bias.copy_(ref.out_proj.bias)


def _causality(module, x, mask, name, t: int) -> None:
    x2 = x.clone()
    x2[:, t:] = x2[:, t:] + torch.randn(x2[:, t:].shape, generator=generator(t))
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
    configs = [(16, 4, True), (12, 3, False)]
    rng = hidden_rng("multi_head_attention")
    if hidden:
        configs += [(24, 8, True), (10, 1, True), (8, 8, False)]
        for _ in range(2):
            n_heads = rng.randrange(1, 7)
            configs.append((n_heads * rng.randrange(1, 9), n_heads, rng.random() < 0.5))
    for i, (d_model, n_heads, bias) in enumerate(configs):
        torch.manual_seed(304 + d_model if not hidden else hidden_seed(f"multi_head_attention/init{i}"))
        module = call(MultiHeadAttention, d_model, n_heads, bias=bias, name="MultiHeadAttention(...)")
        _no_mha_module(module, "MultiHeadAttention")
        for attr in ("q_proj", "k_proj", "v_proj", "out_proj"):
            _check_linear(module, attr, d_model, d_model, bias, "MultiHeadAttention")
        ref = nn.MultiheadAttention(d_model, n_heads, bias=bias, batch_first=True)
        _copy_from_torch_mha(module, ref, d_model)
        g = generator(3040 + d_model) if not hidden else hidden_generator(f"multi_head_attention/{i}")
        B, T, T_kv = (2, 5, 7) if not hidden else (rng.randrange(2, 4), rng.randrange(4, 9), rng.randrange(5, 10))
        x = torch.randn(B, T, d_model, generator=g)
        y = _forward(module, x, name="MultiHeadAttention")
        expect_tensor(y, (B, T, d_model), "MultiHeadAttention output (self-attention)")
        with torch.no_grad():
            want = ref(x, x, x, need_weights=False)[0]
        if not _same(y, want):
            fail(f"self-attention output (d_model={d_model}, n_heads={n_heads}) differs from nn.MultiheadAttention "
                 "with the same weights.", _diagnose_mha(y, module, x, None, None, n_heads))
        # Causal self-attention.
        causal = torch.ones(T, T, dtype=torch.bool).tril().view(1, 1, T, T)
        y = _forward(module, x, mask=causal, name="MultiHeadAttention")
        with torch.no_grad():
            want = ref(x, x, x, attn_mask=~causal[0, 0], need_weights=False)[0]
        if not _same(y, want):
            fail(f"causal self-attention (d_model={d_model}, n_heads={n_heads}, T={T}) differs from "
                 "nn.MultiheadAttention with the same weights and mask.",
                 _diagnose_mha(y, module, x, None, causal, n_heads))
        _causality(module, x, causal, "MultiHeadAttention", t=3)
        # Cross-attention, without and with a key padding mask.
        x_kv = torch.randn(B, T_kv, d_model, generator=g)
        y = _forward(module, x, x_kv, name="MultiHeadAttention")
        expect_tensor(y, (B, T, d_model), f"MultiHeadAttention output (cross-attention, T_q={T}, T_kv={T_kv})")
        with torch.no_grad():
            want = ref(x, x_kv, x_kv, need_weights=False)[0]
        if not _same(y, want):
            fail(f"cross-attention forward(x_q, x_kv) (d_model={d_model}, n_heads={n_heads}, T_q={T}, T_kv={T_kv}) "
                 "differs from nn.MultiheadAttention(x_q, x_kv, x_kv).",
                 _diagnose_mha(y, module, x, x_kv, None, n_heads))
        keep = torch.ones(B, T_kv, dtype=torch.bool)
        keep[1, 4:] = False
        y = _forward(module, x, x_kv, mask=keep.view(B, 1, 1, T_kv), name="MultiHeadAttention")
        expect_tensor(y, (B, T, d_model), f"MultiHeadAttention output (cross-attention, T_q={T}, T_kv={T_kv})")
        with torch.no_grad():
            want = ref(x, x_kv, x_kv, key_padding_mask=~keep, need_weights=False)[0]
        if not _same(y, want):
            fail(f"cross-attention forward(x_q, x_kv, mask) with a key padding mask (d_model={d_model}, "
                 f"n_heads={n_heads}, keys 4.. of batch 1 masked) differs from "
                 "nn.MultiheadAttention(x_q, x_kv, x_kv).",
                 _diagnose_mha(y, module, x, x_kv, keep.view(B, 1, 1, T_kv), n_heads))
        # A query that may see no key: the contract promises it a zero output from every head,
        # so the layer's output there is out_proj's bias.
        blind = torch.ones(B, 1, T, T_kv, dtype=torch.bool)
        blind[0, 0, 1, :] = False
        y = _forward(module, x, x_kv, mask=blind, name="MultiHeadAttention")
        expect_tensor(y, (B, T, d_model), f"MultiHeadAttention output (cross-attention, T_q={T}, T_kv={T_kv})")
        expect(torch.isfinite(y).all(),
               f"with a mask that lets query 1 of batch 0 see no key (d_model={d_model}, n_heads={n_heads}), "
               "MultiHeadAttention gave NaN.",
               "a query that may see no key must get a zero output from every head: use your "
               "scaled_dot_product_attention from exercise 2, which returns zeros for such rows.")
        want = _mha_ref(module, x, x_kv, blind, n_heads)
        if not _same(y, want):
            fail(f"with a mask that lets query 1 of batch 0 see no key (d_model={d_model}, n_heads={n_heads}), "
                 "the output is wrong" + (" for that query" if _same(y[1:], want[1:]) and
                                          _same(y[0, [i for i in range(T) if i != 1]],
                                                want[0, [i for i in range(T) if i != 1]]) else "") + ".",
                 _diagnose_mha(y, module, x, x_kv, blind, n_heads))
        if hidden:
            # A different mask for every head, and a query row with nothing to attend to.
            per_head = torch.rand(B, n_heads, T, T_kv, generator=g) > 0.5
            per_head[:, :, :, 0] = True
            per_head[0, 0, 1, :] = False
            y = _forward(module, x, x_kv, mask=per_head, name="MultiHeadAttention")
            want = _mha_ref(module, x, x_kv, per_head, n_heads)
            expect(torch.isfinite(y).all(), f"a query row with nothing to attend to (query 1 of batch 0, head 0, "
                   f"d_model={d_model}, n_heads={n_heads}) gave NaN in MultiHeadAttention.",
                   "use your scaled_dot_product_attention from exercise 2, which returns zeros for such rows.")
            if not _same(y, want):
                fail(f"with a per-head mask of shape (B, n_heads, T_q, T_kv) = {tuple(per_head.shape)} the output is "
                     "wrong.",
                     _diagnose_mha(y, module, x, x_kv, per_head, n_heads))
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


def check_grouped_query_attention(GroupedQueryAttention, scaled_dot_product_attention=None, hidden: bool = False) -> None:
    """scaled_dot_product_attention, when given, is the exercise 2 answer the layer may call: a
    failure it causes is blamed on it."""
    with _blame_attention_answer("GroupedQueryAttention", scaled_dot_product_attention):
        _check_grouped_query_attention(GroupedQueryAttention, hidden)


@_one_thread
def _check_grouped_query_attention(GroupedQueryAttention, hidden: bool) -> None:
    configs = [(16, 4, 2), (16, 4, 1), (16, 4, 4)]
    rng = hidden_rng("grouped_query_attention")
    if hidden:
        configs += [(48, 6, 3), (32, 8, 2), (24, 6, 6), (12, 3, 1)]
        for _ in range(2):
            n_kv_heads = rng.randrange(1, 5)
            n_heads = n_kv_heads * rng.randrange(1, 4)
            configs.append((n_heads * rng.randrange(1, 9), n_heads, n_kv_heads))
    for i, (d_model, n_heads, n_kv_heads) in enumerate(configs):
        torch.manual_seed(305 + d_model + n_kv_heads if not hidden else hidden_seed(f"grouped_query_attention/init{i}"))
        module = call(GroupedQueryAttention, d_model, n_heads, n_kv_heads, name="GroupedQueryAttention(...)")
        _no_mha_module(module, "GroupedQueryAttention")
        d_head = d_model // n_heads
        _check_linear(module, "q_proj", d_model, d_model, False, "GroupedQueryAttention")
        for attr in ("k_proj", "v_proj"):
            _check_linear(module, attr, d_model, n_kv_heads * d_head, False, "GroupedQueryAttention")
        _check_linear(module, "out_proj", d_model, d_model, False, "GroupedQueryAttention")
        g = (generator(3050 + d_model + n_kv_heads) if not hidden
             else hidden_generator(f"grouped_query_attention/{i}"))
        B, T = (2, 6) if not hidden else (rng.randrange(1, 4), rng.randrange(3, 9))
        x = torch.randn(B, T, d_model, generator=g)
        causal = torch.ones(T, T, dtype=torch.bool).tril().view(1, 1, T, T)
        for mask in (None, causal):
            y = _forward(module, x, mask=mask, name="GroupedQueryAttention")
            expect_tensor(y, (B, T, d_model), f"GroupedQueryAttention output (n_heads={n_heads}, n_kv_heads={n_kv_heads})")
            # Oracle: PyTorch's built-in with enable_gqa, on the module's own projections.
            with torch.no_grad():
                q = module.q_proj(x).view(B, T, n_heads, d_head).transpose(1, 2)
                k = module.k_proj(x).view(B, T, n_kv_heads, d_head).transpose(1, 2)
                v = module.v_proj(x).view(B, T, n_kv_heads, d_head).transpose(1, 2)
                o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
                want = module.out_proj(o.transpose(1, 2).reshape(B, T, d_model))
            if not _same(y, want):
                fail(f"GroupedQueryAttention(d_model={d_model}, n_heads={n_heads}, n_kv_heads={n_kv_heads}) "
                     f"{'with a causal mask ' if mask is not None else ''}differs from the reference.",
                     _diagnose_mha(y, module, x, None, mask, n_heads, n_kv_heads))
        _causality(module, x, causal, "GroupedQueryAttention", t=2)
        if n_kv_heads == n_heads:
            # The MHA end of the family: same numbers as nn.MultiheadAttention with copied weights.
            ref = nn.MultiheadAttention(d_model, n_heads, bias=False, batch_first=True)
            with torch.no_grad():
                ref.in_proj_weight.copy_(torch.cat([module.q_proj.weight, module.k_proj.weight, module.v_proj.weight]))
                ref.out_proj.weight.copy_(module.out_proj.weight)
                want = ref(x, x, x, need_weights=False)[0]
            y = _forward(module, x, name="GroupedQueryAttention")
            expect_close(y, want, "GroupedQueryAttention with n_kv_heads == n_heads, against nn.MultiheadAttention",
                         "with one key/value head per query head this is plain multi-head attention: check the head "
                         "split, the 1/sqrt(d_head) scale and the merge.")
    for bad in ((16, 4, 3), (10, 4, 2)):
        try:
            GroupedQueryAttention(*bad)
        except ValueError:
            pass
        except NotImplementedError:
            raise
        else:
            fail(f"GroupedQueryAttention(d_model={bad[0]}, n_heads={bad[1]}, n_kv_heads={bad[2]}) did not raise ValueError.",
                 "raise ValueError when n_heads is not a multiple of n_kv_heads or d_model not a multiple of n_heads.")

# ----------------------------------------------------------------------------- exercise 6


@_one_thread
def check_sliding_window_mask(sliding_window_mask, hidden: bool = False) -> None:
    cases = [(6, 3, 0), (5, 1, 0), (7, 2, 2), (4, 10, 0)]
    if hidden:
        rng = hidden_rng("sliding_window_mask")
        cases += [(rng.randrange(1, 30), rng.randrange(1, 8), rng.randrange(0, 4)) for _ in range(8)]
        cases += [(12, 4, 12)]
    for T, window, n_global in cases:
        got = call(sliding_window_mask, T, window, n_global) if n_global else call(sliding_window_mask, T, window)
        expect(isinstance(got, torch.Tensor) and got.dtype == torch.bool,
               "sliding_window_mask should return a bool tensor.", "combine comparisons of positions with & and |.")
        expect_tensor(got, (1, 1, T, T), f"sliding_window_mask({T}, {window}, n_global={n_global})")
        i, j = torch.arange(T).view(-1, 1), torch.arange(T).view(1, -1)
        want = (j <= i) & ((i - j < window) | (j < n_global))
        m = got[0, 0]
        if torch.equal(m, want):
            continue
        if torch.equal(m, (j <= i) & ((i - j <= window) | (j < n_global))):
            hint = ("off by one: each query sees `window` keys, itself included, so keep i - window < j <= i "
                    "(i - j < window), not i - j <= window.")
        elif torch.equal(m, ((i - j).abs() < window) | (j < n_global)) or (m & ~(j <= i)).any():
            hint = "the window looks back only: keys after the query (j > i) stay masked, global ones too."
        elif n_global and torch.equal(m, (j <= i) & (i - j < window)):
            hint = "the first n_global keys are global: every later query may attend to them, however far back."
        elif torch.equal(m, ~want):
            hint = "the mask is inverted: True means 'may attend'."
        else:
            hint = "True where j <= i and (i - j < window or j < n_global)."
        fail(f"sliding_window_mask({T}, {window}, n_global={n_global})[0, 0] is\n{m.int()}\nexpected\n{want.int()}", hint)

# ----------------------------------------------------------------------------- exercise 7


def _linear_ref(q, k, v, causal, feature=lambda x: F.elu(x) + 1, normalise=True, scale_q=False):
    q, k, v = (t.detach().to(torch.float64) for t in (q, k, v))
    if scale_q:
        q = q / math.sqrt(q.shape[-1])
    fq, fk = feature(q), feature(k)
    a = fq @ fk.transpose(-2, -1)                     # (..., T, T), only for the oracle
    if causal:
        a = a * torch.ones(a.shape[-2:], dtype=torch.bool).tril()
    out = a @ v
    return out / a.sum(dim=-1, keepdim=True) if normalise else out


def _full_matrix_hint(exercise: str, largest, T_q: int, T_k: int) -> str:
    return (f"{exercise} created a tensor of {largest.nbytes:,} bytes (in {largest.op}), as large as the full "
            f"(T_q, T_k) = ({T_q}, {T_k}) score matrix for every batch entry.")


@_one_thread
def check_linear_attention(linear_attention, hidden: bool = False) -> None:
    # The hand-picked shapes keep the values their hints were checked on; the drawn ones are fresh.
    g = generator(307 if not hidden else 3307)
    shapes = [((2, 64, 4, 4), g), ((3, 40, 3, 5), g)]
    if hidden:
        rng, gh = hidden_rng("linear_attention"), hidden_generator("linear_attention")
        shapes += [((2, 2, 100, 6, 5), g), ((1, 50, 1, 1), g), ((4, 1, 3, 3), g)]
        for _ in range(2):
            # d_k * d_v <= T / 2: the (T, d_k, d_v) prefix sums stay well below a (T, T) matrix.
            T = rng.randrange(1, 121)
            d_k = rng.randrange(1, max(2, min(9, T // 2)))
            d_v = rng.randrange(1, max(2, min(9, T // (2 * d_k) + 1)))
            shapes.append(((*(rng.randrange(1, 4) for _ in range(rng.randrange(1, 3))), T, d_k, d_v), gh))
    for shape, gen in shapes:
        *batch, T, d_k, d_v = shape
        q, k = torch.randn(*batch, T, d_k, generator=gen), torch.randn(*batch, T, d_k, generator=gen)
        v = torch.randn(*batch, T, d_v, generator=gen)
        for causal in (False, True):
            largest = _LargestTensor()
            with forbid(*_SDPA, exercise="linear attention"), largest:
                got = call(linear_attention, q, k, v, causal=causal, name="linear_attention")
            what = f"linear_attention(causal={causal}) for q of shape {tuple(q.shape)}"
            expect_tensor(got, (*batch, T, d_v), what)
            want = _linear_ref(q, k, v, causal)
            if not _same(got, want, 1e-5, 1e-4):
                if causal and _same(got, _linear_ref(q, k, v, False), 1e-5, 1e-4):
                    hint = ("the causal version summed over all positions: position i may only use keys j <= i, so "
                            "keep prefix sums (cumsum along the T axis) of phi(k_j) v_j^T and of phi(k_j).")
                elif _same(got, _linear_ref(q, k, v, causal, normalise=False), 1e-5, 1e-4):
                    hint = ("the normaliser is missing: divide phi(q_i) . S by phi(q_i) . z, where z sums phi(k_j) over "
                            "the same keys as S.")
                elif _same(got, _linear_ref(q, k, v, causal, feature=F.elu), 1e-5, 1e-4):
                    hint = ("the feature map is elu(x) + 1, not elu(x): the +1 keeps every feature positive, so the "
                            "normaliser cannot be zero or negative.")
                elif _same(got, _linear_ref(q, k, v, causal, feature=torch.relu), 1e-5, 1e-4):
                    hint = "the feature map is phi(x) = elu(x) + 1, not relu."
                elif _same(got, _linear_ref(q, k, v, causal, scale_q=True), 1e-5, 1e-4):
                    hint = ("linear attention here has no 1/sqrt(d_k) scale: apply phi to q and k as they are "
                            "(the normaliser already makes the weights sum to 1).")
                else:
                    hint = ("out_i = phi(q_i) . S / (phi(q_i) . z) with S = sum_j phi(k_j) v_j^T and z = sum_j phi(k_j) "
                            "(j <= i when causal), phi(x) = elu(x) + 1, applied to q and k only.")
                expect_close(got, want.to(got.dtype), what, hint, atol=1e-5, rtol=1e-4)
            n_batch = math.prod(batch)
            if T >= 40 and largest.nbytes >= n_batch * T * T * q.element_size():
                fail(_full_matrix_hint("linear_attention", largest, T, T),
                     "linear attention never forms the (T, T) matrix phi(Q) phi(K)^T: use associativity, "
                     "phi(Q) (phi(K)^T V), and prefix sums for the causal case. Its memory then grows as T d_k d_v.")
    # Causality as a property: changing a late key/value changes no earlier output.
    q, k, v = (torch.randn(2, 12, 4, generator=g) for _ in range(3))
    k2, v2 = k.clone(), v.clone()
    k2[:, 8:] += 1.0
    v2[:, 8:] -= 2.0
    a = call(linear_attention, q, k, v, causal=True, name="linear_attention")
    b = call(linear_attention, q, k2, v2, causal=True, name="linear_attention")
    if not _same(a[:, :8], b[:, :8]):
        fail("causal linear attention is not causal: changing keys and values from position 8 on changed earlier outputs.",
             "use prefix sums (cumsum along the T axis) so that position i only sees keys j <= i.")

# ----------------------------------------------------------------------------- exercise 8


def _tiled_variant(q, k, v, block, rescale_sum=True, rescale_acc=True, scaled=True):
    """Online softmax in float64, optionally without one of the two rescalings (for diagnosis)."""
    q, k, v = (t.detach().to(torch.float64) for t in (q, k, v))
    scale = 1 / math.sqrt(q.shape[-1]) if scaled else 1.0
    m = torch.full((*q.shape[:-1], 1), float("-inf"), dtype=torch.float64)
    l = torch.zeros_like(m)
    acc = torch.zeros((*q.shape[:-1], v.shape[-1]), dtype=torch.float64)
    for s0 in range(0, k.shape[-2], block):
        s = q @ k[..., s0:s0 + block, :].transpose(-2, -1) * scale
        m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))
        p = torch.exp(s - m_new)
        c = torch.exp(m - m_new)
        l = (l * c if rescale_sum else l) + p.sum(dim=-1, keepdim=True)
        acc = (acc * c if rescale_acc else acc) + p @ v[..., s0:s0 + block, :]
        m = m_new
    return acc / l


@_one_thread
def check_tiled_attention(tiled_attention, hidden: bool = False) -> None:
    g = generator(308) if not hidden else hidden_generator("tiled_attention")
    cases = [((2, 64, 8), 64, 8, 16, 1.0), ((1, 2, 40, 8), 50, 6, 16, 3.0)]   # (q shape, T_k, d_v, block, spread)
    if hidden:
        cases += [((3, 96, 16), 96, 16, 32, 2.0), ((2, 10, 4), 70, 4, 7, 1.0), ((1, 48, 8), 48, 3, 48, 1.0),
                  ((2, 33, 8), 65, 8, 64, 1.0), ((1, 64, 8), 64, 8, 1, 2.0)]
        rng = hidden_rng("tiled_attention")
        for _ in range(2):
            # d_k, d_v < T_q <= T_k: no input, slice or output is as large as the (T_q, T_k) scores.
            T_q = rng.randrange(9, 65)
            T_k, d_k, d_v = rng.randrange(T_q, 97), rng.randrange(1, 9), rng.randrange(1, 9)
            q_shape = (*(rng.randrange(1, 4) for _ in range(rng.randrange(1, 3))), T_q, d_k)
            cases.append((q_shape, T_k, d_v, rng.randrange(1, T_k + 8), rng.choice([1.0, 2.0, 3.0, -2.0])))
    cases.append(((2, 48, 8), 48, 8, 12, 6.0))    # scores in the hundreds: exp needs the running maximum
    cases.append(((2, 48, 8), 48, 8, 12, -6.0))   # ... and the largest scores come first
    for q_shape, T_k, d_v, block, spread in cases:
        kv_shape = (*q_shape[:-2], T_k, q_shape[-1])
        q = torch.randn(*q_shape, generator=g) * spread
        # Keys grow along the sequence, so that the running maximum changes from block to block.
        growth = torch.linspace(0.3, 1.5, T_k) if spread > 0 else torch.linspace(1.5, 0.3, T_k)
        spread = abs(spread)
        k = torch.randn(*kv_shape, generator=g) * spread * growth.view(-1, 1)
        v = torch.randn(*q_shape[:-2], T_k, d_v, generator=g)
        largest = _LargestTensor()
        with forbid(*_SDPA, exercise="tiled attention with an online softmax"), largest:
            got = call(tiled_attention, q, k, v, block, name="tiled_attention")
        T_q = q_shape[-2]
        what = f"tiled_attention for q {q_shape}, {T_k} keys, d_v={d_v}, block_size={block}"
        expect_tensor(got, (*q_shape[:-1], d_v), what)
        want = _tiled_variant(q, k, v, T_k)                 # one block = the plain softmax
        # float32 scores near 200 carry rounding errors of about 1e-5, and exp turns them into relative errors.
        s_max = (q.double() @ k.double().transpose(-2, -1)).abs().max().item() / math.sqrt(q_shape[-1])
        atol = 1e-5 * max(1.0, s_max / 20)
        if not _same(got, want, atol=atol):
            if not torch.isfinite(got).all():
                hint = ("the output has inf/NaN: subtract the running maximum before exp, p = exp(s - m_new) with "
                        "m_new = max(m, rowmax(s)) over all blocks so far. Without a maximum, or with only the current "
                        "block's maximum, exp overflows float32 once scores differ by more than about 88.")
            elif _same(got, _tiled_variant(q, k, v, T_k, scaled=False), 1e-4, 1e-4):
                hint = "the scores were not scaled: multiply q @ k_block^T by 1/sqrt(d_k), d_k = q.shape[-1]."
            elif _same(got, _tiled_variant(q, k, v, block, rescale_sum=False), 1e-4, 1e-4):
                hint = ("the running sum l was not rescaled: when the maximum grows from m to m_new, the old sum must "
                        "be multiplied by exp(m - m_new), like the accumulator (online softmax without rescaling the "
                        "running sum).")
            elif _same(got, _tiled_variant(q, k, v, block, rescale_acc=False), 1e-4, 1e-4):
                hint = ("the accumulator was not rescaled: when the maximum grows from m to m_new, multiply the old "
                        "accumulator by exp(m - m_new) before adding p @ v_block.")
            elif _same(got, _tiled_variant(q, k, v, block, False, False), 1e-4, 1e-4):
                hint = ("neither the running sum nor the accumulator was rescaled: both must be multiplied by "
                        "exp(m - m_new) whenever the running maximum changes.")
            elif T_k % block and _same(got[..., :], _tiled_variant(q, k[..., :T_k - T_k % block, :],
                                                                   v[..., :T_k - T_k % block, :], block), 1e-4, 1e-4):
                hint = "the last, shorter block was skipped: loop with range(0, T_k, block_size) and slice to the end."
            else:
                hint = ("keep, per query, a running maximum m, a running sum l and an accumulator; for each block: "
                        "m_new = max(m, rowmax(s)), p = exp(s - m_new), l = l*exp(m - m_new) + rowsum(p), "
                        "acc = acc*exp(m - m_new) + p @ v_block; return acc / l. Scale scores by 1/sqrt(d_k).")
            expect_close(got, want.to(got.dtype), what, hint, atol=atol)
        n_batch = math.prod(q_shape[:-2])
        if block < T_k and largest.nbytes >= n_batch * T_q * T_k * q.element_size():
            fail(_full_matrix_hint("tiled_attention", largest, T_q, T_k),
                 f"the point of tiling is never to hold all T_q x T_k scores: compute them one block of "
                 f"block_size keys at a time, (T_q, block_size), and fold each block into the running statistics.")
    # Half precision in, the same dtype out: a float32 result would silently change the dtype of
    # the model the function sits in.
    for dtype, atol in ([(torch.float16, 2e-2)] + ([(torch.bfloat16, 8e-2)] if hidden else [])):
        q = torch.randn(2, 24, 8, generator=g).to(dtype)
        k = torch.randn(2, 40, 8, generator=g).to(dtype)
        v = torch.randn(2, 40, 6, generator=g).to(dtype)
        with forbid(*_SDPA, exercise="tiled attention with an online softmax"):
            got = call(tiled_attention, q, k, v, 16, name="tiled_attention")
        what = f"tiled_attention for {str(dtype).replace('torch.', '')} q, k, v (2, 24/40, 8), block_size=16"
        expect_tensor(got, (2, 24, 6), what)
        expect(got.dtype == dtype, f"{what} returned {str(got.dtype).replace('torch.', '')}.",
               "return the dtype of the inputs: create m, l and acc with dtype=q.dtype, device=q.device, or, "
               "if you keep the running statistics in float32 for accuracy, cast the result back with "
               ".to(q.dtype) at the end.")
        want = _tiled_variant(q.float(), k.float(), v.float(), 40)
        expect_close(got.float(), want, what, "the result is right in float32 but not in half precision: keep "
                     "the running maximum subtracted before exp (p = exp(s - m_new)), so nothing overflows.",
                     atol=atol, rtol=atol)

# ----------------------------------------------------------------------------- exercise 9


@_one_thread
def check_kv_cache_bytes(kv_cache_bytes, hidden: bool = False) -> None:
    cases = [((32, 32, 128, 4096), {}, 2_147_483_648),
             ((32, 8, 128, 4096), {}, 536_870_912),
             ((32, 1, 128, 4096), {}, 67_108_864),
             ((2, 4, 16, 10), dict(batch_size=3, dtype=torch.float64), 2 * 2 * 4 * 16 * 10 * 3 * 8),
             ((1, 1, 64, 100), dict(dtype=torch.int8), 2 * 64 * 100)]
    if hidden:
        rng = hidden_rng("kv_cache_bytes")
        for dtype, size in ((torch.bfloat16, 2), (torch.float32, 4), (torch.int8, 1), (torch.float64, 8)):
            n_layers, n_kv, d_head = rng.randrange(1, 96), rng.randrange(1, 64), rng.choice([64, 80, 96, 128, 256])
            seq_len, batch = rng.randrange(1, 200_000), rng.randrange(1, 64)
            cases.append(((n_layers, n_kv, d_head, seq_len), dict(batch_size=batch, dtype=dtype),
                          2 * n_layers * n_kv * d_head * seq_len * batch * size))
        cases.append(((80, 8, 128, 32_768), dict(batch_size=8), 2 * 80 * 8 * 128 * 32_768 * 8 * 2))
    for args, kwargs, want in cases:
        got = call(kv_cache_bytes, *args, **kwargs)
        label = f"kv_cache_bytes{args}{', ' if kwargs else ''}{', '.join(f'{k}={v}' for k, v in kwargs.items())}"
        expect(isinstance(got, int) and not isinstance(got, bool),
               f"{label} returned {type(got).__name__}, expected a Python int.",
               "return an int: use element_size() (an int) rather than a float division, or wrap the result in int().")
        if got != want:
            dtype = kwargs.get("dtype", torch.float16)
            size = torch.empty((), dtype=dtype).element_size()
            if got * 2 == want:
                hint = "the cache holds keys and values: two tensors per layer, so multiply by 2."
            elif got == want * 8:
                hint = "that is bits: divide by 8, or use torch.empty((), dtype=dtype).element_size() for bytes."
            elif size != 2 and got == want // size * 2:
                hint = f"{dtype} does not take 2 bytes per number: look the size up from the dtype."
            elif kwargs.get("batch_size", 1) > 1 and got * kwargs["batch_size"] == want:
                hint = "every sequence in the batch has its own cache: multiply by batch_size."
            else:
                hint = "bytes = 2 (K and V) * n_layers * batch_size * seq_len * n_kv_heads * d_head * bytes per element."
            fail(f"{label} gave {got:,}, expected {want:,}.", hint)
