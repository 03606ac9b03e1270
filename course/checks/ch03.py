"""Checks for chapter 3: softmax; attention with a bias and a mask in any dtype; decoder masks after a
cache; fused multi-head attention; grouped-query attention; the entropy of attention (predict, then
measure); sliding-window, chunked linear and tiled attention; one decoder attention step with RoPE.

Oracles: ``torch.softmax`` and the attention formula in float64, ``F.scaled_dot_product_attention``,
``nn.MultiheadAttention``, masks derived by loops, RoPE with complex numbers; properties (rows sum
to one, masked weights are zero, causality, merging two halves of the keys through the log-sum-exp);
and the largest tensor an answer creates, seen through a dispatch mode, against what the exercise
forbids. Oracles and wrong variants see the inputs as drawn: the answers get copies.
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from . import ch02
from ._core import CheckFailed, call, earlier_answers, earlier_first, expect_tensor, forbid, judge_prediction
from ._core import one_thread as _one_thread
from ._recorders import LargestTensor as _LargestTensor
from ._vocabulary import (Pasted, call_on_copies, compare, diagnose, draw, earlier_chapter, expect, expect_tensor_of,
                          expect_tuple, fail, judge_configured, matches, passes, when)

# ----------------------------------------------------------------------------- helpers

_SDPA = ((F, "scaled_dot_product_attention"), (F, "multi_head_attention_forward"))
_IN_PLACE = ("build new tensors (q = q / s, not q /= s or q.div_(s); F.elu(q), not F.elu_(q)): the caller reads its "
             "tensors again (a cache, the residual stream), and the spec says no input is changed.")


def _run(fn, *args, name: str, exercise: str, hint: str = _IN_PLACE, **kwargs):
    """The answer's result on copies of its tensor arguments (the oracle and the variants see the inputs as drawn;
    the chapter's rule: no input is changed in place), the built-in attention forbidden; and the largest tensor
    it created."""
    largest = _LargestTensor()
    with forbid(*_SDPA, exercise=exercise), largest:
        return call_on_copies(fn, *args, name=name, hint=hint, **kwargs), largest


def _blame_attention_answer(who: str, scaled_dot_product_attention):
    """A failure of ``who`` blamed on exercise 2's answer when that answer fails its own tests."""
    return earlier_first(*earlier_answers(who, ("may call your scaled_dot_product_attention", 2,
                                                scaled_dot_product_attention, check_scaled_dot_product_attention)))


def _expect_small(largest, limit: float, who: str, as_large_as: str, hint: str) -> None:
    """The largest tensor the answer created (``largest``, a LargestTensor) stays below ``limit`` bytes."""
    expect(largest.nbytes < limit, f"{who} created a tensor of {largest.nbytes:,} bytes (in {largest.op}), as large "
           f"as {as_large_as}.", hint)


def _full_matrix(T_q: int, T_k: int) -> str:
    return f"the full (T_q, T_k) = ({T_q}, {T_k}) score matrix for every batch entry"


# ----------------------------------------------------------------------------- exercise 1

_SOFTMAX_BUILTINS = ((torch, "softmax"), (F, "softmax"), (torch.Tensor, "softmax"), (torch.special, "softmax"),
                     (torch, "log_softmax"), (F, "log_softmax"), (torch.Tensor, "log_softmax"),
                     (torch, "logsumexp"), (torch.Tensor, "logsumexp"))


def _softmax_variants(x: torch.Tensor, dim: int) -> list:
    """The results of common bugs, in the order their hints are tried."""
    def shifted(m):             # exp(x - m) normalised along dim; raises where m does not broadcast: no variant
        e = torch.exp(x - m)
        return e / e.sum(dim=dim, keepdim=True)

    finite_input, global_max = bool(torch.isfinite(x).all()), shifted(x.max())
    broken = lambda got: not bool(torch.isfinite(got).all())  # noqa: E731
    return [
        (when(lambda got: broken(got) and matches(got, global_max)),
         "take the maximum along dim (x.max(dim=dim, keepdim=True)), not over the whole tensor: a global maximum "
         "makes exp underflow to 0 in rows far below it, and 0/0 is NaN."),
        (when(lambda got: broken(got) and finite_input),
         "subtract the maximum along dim before exp: exp(1000.0) overflows to inf, and inf/inf is NaN. "
         "softmax(x) = softmax(x - max(x)) exactly."),
        (when(broken), "a -inf entry must give weight exactly 0: exp(-inf - max) = 0. Subtract the maximum along "
                       "dim (it is finite when the row has a finite entry), then exponentiate."),
        (global_max, "take the maximum along dim (keepdim=True), not over the whole tensor."),
        (lambda: shifted(x.max(dim=dim).values), "x.max(dim=dim) drops that axis, so x - m broadcasts along the wrong "
                                                 "axis: use x.max(dim=dim, keepdim=True).values."),
        *[(lambda other=other: torch.softmax(x.double(), dim=other).to(x.dtype),
           "normalise along the axis `dim` that was passed in, for both the maximum and the sum.")
          for other in range(x.dim()) if other != dim % x.dim()],
        (when(lambda got: matches(got.sum(dim=dim), torch.ones_like(got.sum(dim=dim)), tol=(1e-5, 0.0))),
         "the result sums to 1 but has the wrong values: compute exp(x - max) / sum(exp(x - max))."),
    ]


def _drawn_softmax_case(d) -> tuple:
    shape = tuple(d.rng.randrange(1, 7) for _ in range(d.rng.randrange(1, 4)))
    dim = d.rng.randrange(-len(shape), len(shape))
    scale, offset = d.rng.choice([1.0, 10.0, 30.0]), d.rng.choice([0.0, 200.0, -500.0, 1000.0])
    what = f"a {shape} input (scale {scale:g}, offset {offset:g}) along dim={dim}"
    return d.randn(*shape) * scale + offset, dim, what


@_one_thread
def check_softmax(softmax, hidden: bool = False) -> None:
    d, t = draw("softmax", hidden), torch.tensor
    # (x, dim, what): small, overflowing, -inf and float64 inputs; more shapes and offsets when hidden.
    cases = [(t([[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]]), -1, "a small example"),
             (d.randn(3, 5), -1, "a (3, 5) input along dim=-1"), (d.randn(4, 4), -1, "a (4, 4) input along dim=-1"),
             (d.randn(4, 6), 0, "a (4, 6) input along dim=0"),
             (t([[0.0, 1.0, 2.0], [1000.0, 1001.0, 1002.0]]), -1, "rows far apart in size"),
             (t([[10_000.0, 0.0, -10_000.0]]), -1, "entries of +-1e4"),
             (t([[0.5, -math.inf, 1.5, -math.inf]]), -1, "a row with -inf entries (masked scores)"),
             (d.randn(3, 4, dtype=torch.float64) * 20 + 300, -1, "a float64 (3, 4) input around 300")]
    if d.hidden:
        cases += [(d.randn(2, 3, 7) * 30, 1, "a (2, 3, 7) input along dim=1"),
                  (d.randn(2, 3, 7) * 30 + 500, -1, "a (2, 3, 7) input with large values"),
                  (d.randn(5, dtype=torch.float64), 0, "a float64 vector"), (d.randn(3, 1), -1, "a single column"),
                  (-d.uniform(0, 1e4, 6, 6), -2, "large negative entries along dim=-2")]
    for x, dim, what in d.cases(cases, _drawn_softmax_case, 2):
        with forbid(*_SOFTMAX_BUILTINS, exercise="the softmax"):
            got = call_on_copies(softmax, x, dim, name="softmax", hint="avoid in-place operations such as x -= ... "
                                 "or x.exp_(): compute a new tensor.")
        expect_tensor_of(got, x.shape, x.dtype, f"softmax of {what}", "keep the input's dtype: do not convert with "
                         ".float() or build constants in another dtype.")
        compare(got, torch.softmax(x.double(), dim=dim).to(x.dtype), f"softmax of {what} (dim={dim})",
                "divide by the sum of the exponentials along dim (keepdim=True), so that every slice sums to 1.",
                variants=_softmax_variants(x, dim))

# ----------------------------------------------------------------------------- exercise 2


def _attention_ref(q, k, v, mask=None, scale="sqrt", softmax_dim=-1, invert=False, mask_scores=True,
                   bias=None, bias_mode="add"):
    """The contract in float64: (out, weights); the keyword arguments reproduce common bugs."""
    q, k, v, bias = (None if t is None else t.detach().to(torch.float64) for t in (q, k, v, bias))
    scores = q @ k.transpose(-2, -1)
    if bias is not None and bias_mode == "before_scale":
        scores = scores + bias
    scores = scores * {"sqrt": 1 / math.sqrt(q.shape[-1]), "none": 1.0, "d_k": 1 / q.shape[-1]}[scale]
    if bias is not None and bias_mode in ("add", "subtract"):
        scores = scores + (1 if bias_mode == "add" else -1) * bias
    allowed = None if mask is None else ~mask if invert else mask
    if allowed is not None and mask_scores:
        scores = scores.masked_fill(~allowed, torch.finfo(torch.float64).min)
    weights = torch.softmax(scores, dim=softmax_dim)
    if allowed is not None:
        weights = weights.masked_fill(~allowed, 0.0)
    return weights @ v, weights


def _nan_variants(q, mask) -> list:
    """The hints for NaN in the weights or the output, by what produced it."""
    nan = lambda got: bool(torch.isnan(got).any())  # noqa: E731
    return [
        (when(lambda got: q.dtype in _HALF_TOLERANCE and nan(got)), f"the fill value became -inf in {q.dtype}: a "
         "constant such as -1e9 overflows float16 (its largest magnitude is 65504), and a fully masked row then gives "
         "NaN. Fill with torch.finfo(scores.dtype).min."),
        (when(lambda got: nan(got) and mask is not None and bool((~mask).all(dim=-1).any())), "a fully masked row "
         "gives NaN: filled with -inf, the row's maximum is -inf and the softmax's shift computes -inf - (-inf) = NaN. "
         "Fill with torch.finfo(scores.dtype).min and set the weights of masked positions to 0 after the softmax; the "
         "contract asks for zero weights and a zero output in such a row."),
        (when(nan), "the output contains NaN: check the fill value and that the softmax runs over the last axis."),
    ]


def _weight_variants(q, k, v, mask, bias, want: torch.Tensor) -> list:
    """The weights of common bugs (in the answer's dtype), in the order their hints are tried."""
    def ref(**kwargs):
        return lambda: _attention_ref(q, k, v, mask, bias=bias, **kwargs)[1].to(want.dtype)

    masked, biased = mask is not None, bias is not None
    empty = (~mask).all(dim=-1) if masked else torch.zeros((), dtype=torch.bool)       # queries that see no key
    lowest = (q.double() @ k.double().transpose(-2, -1)).amin().item() / math.sqrt(q.shape[-1])

    def uniform_empty_rows(got):
        return (bool(empty.any()) and got.detach()[empty.expand(got.shape[:-1])].abs().sum() > 0
                and matches(got.detach().masked_fill(empty.unsqueeze(-1), 0.0), want))

    def sums_off(got):
        sums = got.detach().sum(dim=-1)[~empty.expand(got.shape[:-1])]
        return not matches(sums, torch.ones_like(sums), tol=(1e-4, 0.0))

    def leaked(got):
        return masked and bool(got.detach().masked_select(~mask.expand(got.shape)).ne(0).any())

    return [
        (when(uniform_empty_rows), "a fully masked row must get all-zero weights and a zero output, not a uniform "
         "average: after the softmax, set the weights of masked positions to 0 (a finite fill such as -1e9 or "
         "finfo.min alone spreads the row evenly over forbidden keys)."),
        (when(lambda got: masked and lowest < -1e4 and (leaked(got) or sums_off(got))), "the fill value is not below "
         "every real score: a fixed constant such as -1e4 is larger than a score of -1e5, so the masked keys win the "
         "softmax. Fill with torch.finfo(scores.dtype).min."),
        (ref(bias_mode="ignored") if biased else None, "the bias was ignored: add it to the scaled scores, scores = "
         "q @ k^T / sqrt(d_k) + bias, before the mask and the softmax."),
        (ref(bias_mode="before_scale") if biased else None, "the bias was divided by sqrt(d_k) with the scores: the "
         "bias is added after the scaling, q @ k^T / sqrt(d_k) + bias."),
        (ref(bias_mode="subtract") if biased else None, "the bias was subtracted: add it (it already holds the sign "
         "it needs, for example -slope * distance for ALiBi)."),
        (ref(scale="none"), "the scores were not scaled: divide q @ k^T by sqrt(d_k), the size of the last axis of q."),
        (ref(scale="d_k"), "the scores were divided by d_k; divide by sqrt(d_k) (math.sqrt(q.shape[-1]))."),
        (ref(softmax_dim=-2), "the softmax ran over the queries (dim=-2); it must run over the keys, the last axis "
         "(dim=-1), so that each query's weights sum to 1."),
        (ref(invert=True) if masked else None, "the mask is inverted: True means 'may attend', so fill where the mask "
         "is False (masked_fill(~mask, ...))."),
        (ref(mask_scores=False) if masked else None, "the mask was applied only after the softmax: zeroing weights "
         "afterwards leaves rows that no longer sum to 1. Fill the masked scores (masked_fill(~mask, "
         "torch.finfo(dtype).min)) before the softmax."),
        (when(leaked),
         "masked positions must get weight exactly 0: fill their scores with a very negative value "
         "(torch.finfo(dtype).min) before the softmax, where the mask is False."),
        (when(sums_off), "normalise with a softmax over the keys, the last axis (dim=-1)."),
    ]


def _run_attention(fn, *tensors, copies: bool = True):
    """The answer's (out, weights) for copies of (q, k, v, mask[, bias]), which it must leave unchanged
    (``copies=False``: the tensors themselves, for a gradient read off them)."""
    name, exercise = "scaled_dot_product_attention", "scaled dot-product attention"
    if copies:
        result, _ = _run(fn, *tensors, name=name, exercise=exercise)
    else:
        with forbid(*_SDPA, exercise=exercise):
            result = call(fn, *tensors, name=name)
    expect(isinstance(result, tuple) and len(result) == 2,
           f"scaled_dot_product_attention should return a tuple (out, weights), got {type(result).__name__}.",
           "return both: `return weights @ v, weights`.")
    return result


# PyTorch's words when a fill does not fit the dtype, or a float32 tensor meets a half-precision one.
_LOW_PRECISION_ERRORS = [
    (("overflow", "cannot be converted"), "a fixed fill such as -1e9 does not exist in {dtype} (float16's largest "
     "magnitude is 65504): masked_fill refuses it, and a conversion turns it into -inf. Fill with "
     "torch.finfo(scores.dtype).min, which exists in every dtype."),
    (("scalar type", "dtype"), "keep the input dtype: a float32 tensor in the mask arithmetic (torch.zeros(...) "
     "without a dtype) promotes the scores to float32, which then meet v in float16. Fill with "
     "scores.masked_fill(~mask, torch.finfo(scores.dtype).min)."),
]
# A softmax and two products rounded in half precision (unit roundoff 4.9e-4 in float16, 3.9e-3 in
# bfloat16) stay within these of the exact values on the exercise's sizes (d_k = 8, up to 9 keys).
_HALF_TOLERANCE = {torch.float16: (4e-3, 4e-3), torch.bfloat16: (3e-2, 3e-2)}


def _check_attention_case(fn, q, k, v, mask, what: str, bias=None) -> None:
    """Shapes and dtype, then weights and output against the formula (a fully masked row gets zeros); in half
    precision, PyTorch's error names a fill that does not exist in the dtype."""
    half = _HALF_TOLERANCE.get(q.dtype)
    try:
        out, weights = _run_attention(fn, q, k, v, mask, *(() if bias is None else (bias,)))
    except CheckFailed as err:
        hint = next((h for words, h in _LOW_PRECISION_ERRORS if any(w in err.what for w in words)), None)
        if half is None or hint is None:
            raise
        fail(f"{what}: scaled_dot_product_attention raised on {q.dtype} input: {err.what.splitlines()[0]}",
             hint.format(dtype=q.dtype))
    batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2])
    w_shape = torch.broadcast_shapes((*batch, q.shape[-2], k.shape[-2]), *[t.shape for t in (mask, bias) if t is not None])
    for name, got, shape in (("weights", weights, w_shape), ("out", out, (*w_shape[:-1], v.shape[-1]))):
        expect_tensor_of(got, shape, q.dtype, f"{name} for {what}", "keep the input dtype: a float32 tensor or a "
                         "Python-float tensor in the mask arithmetic promotes the scores; fill with "
                         "scores.masked_fill(~mask, torch.finfo(scores.dtype).min).")
    want_out, want_w = (t.to(q.dtype) for t in _attention_ref(q, k, v, mask, bias=bias))
    compare(weights, want_w, f"weights for {what}", "weights = softmax(q @ k^T / sqrt(d_k) + bias) over the last "
            "axis, masked entries exactly 0, computed in the input dtype.", tol=half,
            variants=_nan_variants(q, mask) + ([] if half else _weight_variants(q, k, v, mask, bias, want_w)))
    compare(out, want_out, f"out for {what}", "out must be weights @ v: multiply the (T_q, T_k) weights by v "
            "(T_k, d_v).", tol=half, variants=_nan_variants(q, mask))


def _low_precision_cases(d) -> list:
    """float16 / bfloat16 inputs with a fully masked row: the fill must exist in the dtype, results keep it."""
    cases = []
    for dtype, T_q, T_k, with_bias in [(torch.float16, 3, 5, False), (torch.bfloat16, 4, 6, True)] + (
            [(torch.float16, 6, 9, True), (torch.bfloat16, 5, 3, False)] if d.hidden else []):
        mask = d.uniform(0, 1, 2, 1, T_q, T_k) > 0.4
        mask[..., 0, :] = False                                    # a fully masked query row
        mask[..., 1:, 0] = True
        q, k, v = (d.randn(2, 2, T, 8).to(dtype) for T in (T_q, T_k, T_k))
        bias, name = (d.randn(1, 2, T_q, T_k) * 3).to(dtype) if with_bias else None, str(dtype)[6:]
        cases.append((q, k, v, mask, f"{name} inputs (2, 2, {T_q}/{T_k}, 8) with a fully masked row"
                      + (f" and a {name} bias (1, 2, {T_q}, {T_k})" if with_bias else ""), bias))
    return cases


def _extreme_case(d) -> tuple:
    """Scores around -1e5, so that only a fill below all of them works (a fixed -1e4 is above them). The keys are
    multiples of 1/8, so that every score is exact in float32: a rounded score near -1e5 is off by up to 0.004, which
    moves a weight by more than the tolerance (a correct answer failed on such a draw)."""
    mask = torch.ones(2, 4, 6, dtype=torch.bool)
    mask[:, :, 3:] = False
    mask[1, 2] = False
    k = -(330.0 + (d.uniform(0, 10, 2, 6, 1) * 8).round() / 8)
    q, v = torch.full((2, 4, 1), 300.0), d.randn(2, 6, 3)
    return q, k, v, mask, "scores around -1e5 with a partly and a fully masked row", None


def _attention_cases(d) -> list:
    """(q, k, v, mask, what, bias): shapes, random and causal masks, an empty row, biases, a cache offset."""
    r, T, f64 = d.randn, 5, torch.float64
    causal = torch.ones(T, T, dtype=torch.bool).tril().view(1, 1, T, T)
    empty = torch.ones(1, 1, 3, 4, dtype=torch.bool)
    empty[..., 1, :] = False
    random_mask = lambda: (d.uniform(0, 1, 2, 1, 4, 6) > 0.4) | (torch.arange(6) == 0)  # noqa: E731 - key 0 seen
    blind = random_mask()
    blind[1, 0, 2] = False
    alibi = -torch.tensor([0.5, 0.25]).view(1, 2, 1, 1) * (torch.arange(T).view(-1, 1) - torch.arange(T)).float()
    after_cache = torch.arange(6)[None, :] <= torch.arange(2, 6)[:, None]       # 4 queries after 2 cached keys
    return [
        (r(2, 5, 8), r(2, 5, 8), r(2, 5, 8), None, "q, k, v of shape (2, 5, 8), no mask", None),
        (r(2, 3, 4, 16) * 3, r(2, 3, 6, 16) * 3, r(2, 3, 6, 5), None,
         "(B, n_heads, T_q, d_k) = (2, 3, 4, 16) against 6 keys, d_v = 5", None),
        (r(2, 3, 4, 16), r(2, 3, 6, 16), r(2, 3, 6, 5), random_mask(),
         "a random mask of shape (2, 1, 4, 6)", None),
        (r(1, 2, T, 8), r(1, 2, T, 8), r(1, 2, T, 8), causal, "a causal mask (1, 1, 5, 5)", None),
        (r(1, 2, 3, 8), r(1, 2, 4, 8), r(1, 2, 4, 8), empty, "a mask whose second query row is all False", None),
        (r(1, 2, T, 8), r(1, 2, T, 8), r(1, 2, T, 8), causal,
         "a causal mask (1, 1, 5, 5) and an ALiBi bias -slope_h * (i - j) of shape (1, 2, 5, 5)", alibi),
        (r(2, 3, 4, 8), r(2, 3, 6, 8), r(2, 3, 6, 5), blind,
         "a bias (2, 3, 4, 6) and a mask (2, 1, 4, 6) in which query 2 of batch 1 sees no key", r(2, 3, 4, 6) * 2),
        (r(1, 2, 4, 8, dtype=f64), r(1, 2, 6, 8, dtype=f64), r(1, 2, 6, 3, dtype=f64), after_cache,
         "float64 inputs (1, 2, 4/6, 8) with a (4, 6) causal mask after a cache and a (4, 6) bias", r(4, 6, dtype=f64) * 2),
    ]


def _hidden_attention_cases(d) -> list:
    """More of the same: an empty first row, padding, d_k = 1, one key, large scores, per-head and 2-D masks."""
    r, f64 = d.randn, torch.float64
    causal7 = torch.ones(7, 7, dtype=torch.bool).tril()[:3]
    causal7[0] = False
    padding = torch.ones(3, 1, 1, 7, dtype=torch.bool)
    padding[0, ..., 5:] = False
    padding[2, ..., 1:] = False
    per_head = d.uniform(0, 1, 2, 3, 5, 5) > 0.5
    per_head[:, 1, 2, :] = False
    return [
        (r(2, 2, 3, 4, dtype=f64), r(2, 2, 7, 4, dtype=f64), r(2, 2, 7, 3, dtype=f64), causal7,
         "float64 inputs with a (3, 7) bias and a (3, 7) mask whose first row is all False", r(3, 7, dtype=f64) * 3),
        (r(2, 4, 6) * 2, r(2, 6, 6) * 2, r(2, 6, 2), None, "a (1, 4, 6) bias and no mask", r(1, 4, 6) * 4),
        (r(3, 4, 7, 8), r(3, 4, 7, 8), r(3, 4, 7, 8), padding, "a padding mask (3, 1, 1, 7)", None),
        (r(2, 9, 1, dtype=f64) * 5, r(2, 11, 1, dtype=f64) * 5, r(2, 11, 3, dtype=f64), None,
         "float64 inputs with d_k = 1", None),
        (r(4, 1, 32), r(4, 1, 32), r(4, 1, 2), None, "a single key", None),
        (r(2, 2, 6, 64) * 4, r(2, 2, 6, 64) * 4, r(2, 2, 6, 64), None, "d_k = 64 with large scores", None),
        (r(2, 3, 5, 8), r(2, 3, 5, 8), r(2, 3, 5, 8), per_head, "a per-head mask (2, 3, 5, 5) with an empty row", None),
        (r(6, 8), r(6, 8), r(6, 8), torch.ones(6, 6, dtype=torch.bool).tril(), "2-D inputs (T, d) and a (T, T) mask",
         None),
    ]


def _drawn_attention_case(d) -> tuple:
    # Scores of spread up to 2 (d_k <= 64): float32 rounding stays well inside the tolerance.
    B, H, T_q, T_k = (d.rng.randrange(1, n) for n in (4, 5, 10, 10))
    d_k, d_v, spread = d.rng.randrange(1, 65), d.rng.randrange(1, 17), d.rng.choice([0.5, 1.0, 2.0])
    mask = d.uniform(0, 1, B, d.rng.choice([1, H]), T_q, T_k) > d.rng.uniform(0.2, 0.8)
    bias = d.randn(1, H, T_q, T_k) * 2 if d.rng.random() < 0.6 else None
    what = (f"(B, n_heads, T_q, d_k) = {(B, H, T_q, d_k)} against {T_k} keys, d_v = {d_v}"
            + (f", a bias (1, {H}, {T_q}, {T_k})" if bias is not None else ""))
    return (d.randn(B, H, T_q, d_k) * spread, d.randn(B, H, T_k, d_k) * spread, d.randn(B, H, T_k, d_v),
            mask if d.rng.random() < 0.7 else None, what, bias)


def _check_attention_gradient(fn, d) -> None:
    """Rows with no allowed key must also be safe to train through."""
    empty = torch.ones(1, 1, 3, 4, dtype=torch.bool)
    empty[..., 1, :] = False
    q, k, v = (d.randn(1, 2, T, 8).requires_grad_() for T in (3, 4, 4))
    out, _ = _run_attention(fn, q, k, v, empty, copies=False)   # the leaves themselves: their .grad is read below
    expect(out.requires_grad, "the output of scaled_dot_product_attention carries no gradient.",
           "do not detach anything (and do not wrap the computation in torch.no_grad()).")
    out.pow(2).sum().backward()
    for name, t in (("q", q), ("k", k), ("v", v)):
        expect(t.grad is not None, f"no gradient reached {name}.", "do not detach anything inside the function.")
        expect(torch.isfinite(t.grad).all(), f"the output is right, but the gradient with respect to {name} contains "
               "NaN when a query row is fully masked.", "a row of -inf scores has a NaN softmax, and its backward pass "
               "is NaN too; with an additive mask (scores + a tensor holding -inf) that NaN flows back into q and k "
               "even though the weights are zeroed afterwards. Fill the scores with torch.finfo(scores.dtype).min "
               "(masked_fill), then zero the masked weights.")


@_one_thread
def check_scaled_dot_product_attention(scaled_dot_product_attention, softmax=None, hidden: bool = False) -> None:
    """softmax, when given, is the exercise 1 answer the attention may call: a failure it causes is blamed on it."""
    fn, d = scaled_dot_product_attention, draw("scaled_dot_product_attention", hidden)
    with earlier_first(*earlier_answers("scaled_dot_product_attention",
                                        ("may call your softmax", 1, softmax, check_softmax))):
        visible = _attention_cases(d) + (_hidden_attention_cases(d) if hidden else [])
        cases = d.cases(visible, _drawn_attention_case, 2) + [_extreme_case(d)] + _low_precision_cases(d.sub("low"))
        for case in cases:
            _check_attention_case(fn, *case)
        _check_attention_gradient(fn, d)

# ----------------------------------------------------------------------------- exercise 3


def _decoder_mask_oracle(key_is_real: torch.Tensor, q_len: int, offset_shift: int = 0, causal: bool = True,
                         padding: bool = True, pad_queries: bool = False, strict: bool = False) -> torch.Tensor:
    """The contract by loops, (B, 1, q_len, k_len); the keyword arguments reproduce common bugs."""
    B, k_len = key_is_real.shape
    out = torch.zeros(B, 1, q_len, k_len, dtype=torch.bool)
    for b, i, j in ((b, i, j) for b in range(B) for i in range(q_len) for j in range(k_len)):
        p = k_len - q_len + i + offset_shift                      # the position of query i
        ok = (j < p if strict else j <= p) if causal else True
        ok = ok and (not padding or bool(key_is_real[b, j]))
        out[b, 0, i, j] = ok and (not pad_queries or bool(key_is_real[b, k_len - q_len + i]))
    return out


def _decoder_mask_variants(real: torch.Tensor, q_len: int) -> list:
    """The masks of common bugs, in the order their hints are tried (without a cache, the first is the contract)."""
    past = real.shape[1] - q_len
    return [(lambda kw=kw: _decoder_mask_oracle(real, q_len, **kw), hint) for kw, hint in [
        (dict(offset_shift=-past), f"the causal part is aligned to the top left: with {past} earlier positions in the "
         f"cache, query i is at position {past} + i and sees every key up to it (a bottom-right alignment). tril() of "
         "a (q_len, k_len) matrix, or is_causal=True, puts query 0 at position 0."),
        (dict(strict=True), "the diagonal is missing: a token may attend to itself (key j equal to the query's "
                            "position), so compare with <=, not <."),
        (dict(offset_shift=1), "off by one: query i is at position k_len - q_len + i, not k_len - q_len + i + 1."),
        (dict(offset_shift=-1), "off by one: query i is at position k_len - q_len + i, not k_len - q_len + i - 1."),
        (dict(padding=False), "the padding was ignored: a key with key_is_real False is hidden from every query."),
        (dict(causal=False), "the mask is not causal: a query may not see keys after its own position."),
        (dict(pad_queries=True), "padding queries were masked too: only keys are hidden. The row of a padding query "
         "keeps what it may see (often nothing: exercise 2 then gives it a zero output, and the loss ignores it)."),
    ]]


def _left_padded(pads: list[int], k_len: int, q_len: int) -> tuple:
    return torch.arange(k_len)[None, :] >= torch.tensor(pads)[:, None], q_len, f"left padding of {pads} tokens"


@_one_thread
def check_decoder_mask(decoder_mask, hidden: bool = False) -> None:
    d = draw("decoder_mask", hidden)
    # (key_is_real, q_len, how): left padding for prefill and after a cache; hidden, padding anywhere.
    def drawn(d):
        B, k_len = d.rng.randrange(1, 5), d.rng.randrange(2, 15)
        return [d.rng.randrange(0, k_len) for _ in range(B)], k_len, d.rng.randrange(1, k_len + 1)

    extra = [([0], 1, 1), ([5, 0], 9, 3), ([0, 0, 2, 7], 8, 8)] if d.hidden else []
    cases = [_left_padded(*c) for c in d.cases([([2, 0], 6, 6), ([3, 0, 1], 7, 2), ([1, 4], 5, 1)] + extra, drawn, 3)]
    if d.hidden:
        middle = torch.tensor([[True, False, True, True, False, True], [False, True, True, False, True, True]])
        cases += [(middle, 4, "padding in the middle of the sequences")] + [
            (d.uniform(0, 1, B, k_len) > 0.3, d.rng.randrange(1, k_len + 1), "padding at random places")
            for B, k_len in ((d.rng.randrange(1, 4), d.rng.randrange(3, 12)) for _ in range(2))]
    for real, q_len, how in cases:
        B, k_len = real.shape
        label = (f"decoder_mask(key_is_real of shape {(B, k_len)} with {how}, q_len={q_len}) "
                 f"(the queries are positions {k_len - q_len} .. {k_len - 1})")
        got = call_on_copies(decoder_mask, real, q_len, name=label, hint="build a new tensor.")
        expect(tuple(getattr(got, "shape", ())) != (B, q_len, k_len) or (B, q_len) == (1, 1), f"{label} has shape "
               f"{tuple(got.shape)}, expected {(B, 1, q_len, k_len)}.", "the mask needs a head axis of size 1, "
               "(B, 1, q_len, k_len), so that it broadcasts against scores of shape (B, n_heads, q_len, k_len).")
        expect_tensor_of(got, (B, 1, q_len, k_len), torch.bool, label, "combine comparisons of positions with & so "
                         "that the result stays boolean.")
        compare(got, _decoder_mask_oracle(real, q_len), label, "True where key j is real and j <= k_len - q_len + i "
                "(query i's position), for every sequence.", variants=_decoder_mask_variants(real, q_len))

# ----------------------------------------------------------------------------- exercise 4


def _forward(module, x, mask=None):
    return _run(module, x, **({} if mask is None else {"mask": mask}), name="MultiHeadAttention.forward",
                exercise="MultiHeadAttention")[0]


def _check_linear(module, attr: str, d_in: int, d_out: int, bias: bool) -> None:
    layer = getattr(module, attr, None)
    expect(isinstance(layer, nn.Linear), f"MultiHeadAttention needs an nn.Linear attribute `{attr}`.",
           f"create self.{attr} = nn.Linear(...) in __init__ with exactly this name: the tests copy weights into it.")
    expect(tuple(layer.weight.shape) == (d_out, d_in),
           f"MultiHeadAttention.{attr}.weight has shape {tuple(layer.weight.shape)}, expected {(d_out, d_in)}.",
           f"{attr} maps {d_in} features to {d_out}: nn.Linear({d_in}, {d_out}).")
    expect((layer.bias is not None) == bias, f"MultiHeadAttention.{attr} should {'have' if bias else 'not have'} a "
           "bias.", "pass bias=bias to every nn.Linear.")


def _mha_layout_ref(params, x, mask, n_heads, layout="per_head", split="transpose", merge=True, scale="d_head",
                    out_proj=True, use_mask=True):
    """Multi-head self-attention in float64 from the layer's own fused weights ``params`` (the weight and
    bias of qkv, then of out_proj); keyword arguments reproduce common bugs."""
    x = x.detach().to(torch.float64)
    B, T, d_model = x.shape
    d_head = d_model // n_heads
    y = F.linear(x, *params[:2])                                         # (B, T, 3 d_model)
    parts = {"per_head": lambda: y.view(B, T, n_heads, 3, d_head).unbind(3),      # each (B, T, n_heads, d_head)
             "chunks": lambda: [t.view(B, T, n_heads, d_head) for t in y.split(d_model, dim=-1)],
             "interleaved": lambda: y.view(B, T, n_heads, d_head, 3).unbind(4)}[layout]()
    q, k, v = (t.transpose(1, 2) if split == "transpose" else t.reshape(B, n_heads, T, d_head) for t in parts)
    q = q if scale == "d_head" else q * math.sqrt(d_head / d_model)      # scores over sqrt(d_model)
    out = _attention_ref(q, k, v, mask if use_mask else None)[0]          # (B, n_heads, T, d_head)
    out = out.transpose(1, 2).reshape(B, T, d_model) if merge else out.reshape(B, T, d_model)
    return F.linear(out, *params[2:]) if out_proj else out


_MHA_HINT = ("view qkv(x) as (B, T, n_heads, 3, d_head), take q, k, v and move the head axis before the sequence "
             "axis, attend with a 1/sqrt(d_head) scale, merge back (transpose, reshape) and apply out_proj.")


def _mha_variants(params, x, mask, n_heads) -> list:
    """The outputs of common bugs (in x's dtype), in the order their hints are tried."""
    def ref(**kwargs):
        return lambda: _mha_layout_ref(params, x, mask, n_heads, **kwargs).to(x.dtype)

    return [
        (ref(layout="chunks"), "the fused output was split as [all queries | all keys | all values], the layout of "
         "nn.MultiheadAttention's in_proj_weight (and of the book's FusedSelfAttention). This layer keeps, for each "
         "head, its query, key and value next to each other: view the output as (B, T, n_heads, 3, d_head)."),
        (ref(layout="interleaved"), "q, k and v were taken feature by feature (view (..., d_head, 3)); each head "
         "holds three blocks of d_head consecutive features: view (B, T, n_heads, 3, d_head)."),
        (ref(split="reshape"), "the heads were split in the wrong order: after taking q, k and v as (B, T, n_heads, "
         "d_head), transpose(1, 2) to (B, n_heads, T, d_head); a reshape straight to (B, n_heads, T, d_head) mixes "
         "positions and features across heads."),
        (ref(merge=False), "the heads were merged in the wrong order: transpose (B, n_heads, T, d_head) back to "
         "(B, T, n_heads, d_head) before reshape(B, T, d_model)."),
        (ref(scale="d_model"), "the scores were divided by sqrt(d_model); each head has d_head = d_model // n_heads "
         "features, so divide by sqrt(d_head)."),
        (ref(out_proj=False), "out_proj was not applied: the merged heads go through self.out_proj."),
        (ref(use_mask=False) if mask is not None else None, "the mask was ignored: pass it on to the attention of "
                                                            "every head."),
    ]


def _reference_layer(module, d, d_model: int, n_heads: int, bias: bool, dtype: torch.dtype) -> nn.MultiheadAttention:
    """nn.MultiheadAttention with weights drawn from ``d``, copied into ``module``: its [q | k | v] rows
    reordered into the per-head layout [q_h, k_h, v_h] of the layer's qkv."""
    ref = nn.MultiheadAttention(d_model, n_heads, bias=bias, batch_first=True)    # its own init is overwritten
    per_head = lambda t: t.view(3, n_heads, -1).transpose(0, 1).reshape(t.shape)  # noqa: E731
    with torch.no_grad():
        for p in ref.parameters():
            p.copy_(d.uniform(-1, 1, *p.shape) / math.sqrt(d_model))
        module.qkv.weight.copy_(per_head(ref.in_proj_weight))
        module.out_proj.weight.copy_(ref.out_proj.weight)
        if bias:
            module.qkv.bias.copy_(per_head(ref.in_proj_bias))
            module.out_proj.bias.copy_(ref.out_proj.bias)
    module.to(dtype)
    return ref.to(dtype)


def _check_blind_query(module, params, x, causal, n_heads: int, cfg: str, hidden: bool) -> None:
    """A query that may see no key: the contract promises it a zero output from every head, so the
    layer's output there is out_proj's bias (or zero). Its other queries must be untouched."""
    B, T, d_model = x.shape
    blind = causal.expand(B, n_heads if hidden else 1, T, T).clone()
    blind[0, :, 1, :] = False
    if hidden:
        blind[-1, -1, T - 1, :] = False
    what = (f"MultiHeadAttention with a {'per-head ' if hidden else ''}causal mask of shape {tuple(blind.shape)} in "
            f"which query 1 of sequence 0 sees no key ({cfg})")
    want, seen = _mha_layout_ref(params, x, blind, n_heads).to(x.dtype), blind.any(dim=-1).all(dim=1)   # seen: (B, T)
    compare(_forward(module, x, blind), want, what, _MHA_HINT, variants=[
        (when(lambda got: not bool(torch.isfinite(got).all())), "a query that may see no key must get a zero output "
         "from every head: call your scaled_dot_product_attention from exercise 2, which returns zeros for such rows."),
        (when(lambda got: matches(got[seen], want[seen])), "a query that may see no key must get a zero output from "
         "that head, not an average of the values: after the softmax, the weights of masked keys must be 0 (your "
         "scaled_dot_product_attention from exercise 2 does this). The head split, the merge and out_proj are right."),
        *_mha_variants(params, x, blind, n_heads)])


def _check_mha_config(MultiHeadAttention, d, d_model: int, n_heads: int, bias: bool, dtype: torch.dtype) -> None:
    """One layer, its weights those of an nn.MultiheadAttention: without a mask, causal, causality, a blind query."""
    module = call(MultiHeadAttention, d_model, n_heads, bias=bias, name="MultiHeadAttention(...)")
    for name, sub in module.named_modules():
        expect(not isinstance(sub, nn.MultiheadAttention), f"MultiHeadAttention contains an nn.MultiheadAttention "
               f"({name or 'the module itself'}).", "this exercise asks you to build the layer from two nn.Linear "
               "layers, qkv and out_proj; nn.MultiheadAttention is the oracle the tests compare against.")
    for attr, d_out in (("qkv", 3 * d_model), ("out_proj", d_model)):
        _check_linear(module, attr, d_model, d_out, bias)
    ref = _reference_layer(module, d, d_model, n_heads, bias, dtype)
    params = [None if p is None else p.detach().double() for layer in (module.qkv, module.out_proj)
              for p in (layer.weight, layer.bias)]
    B, T = (d.rng.randrange(2, 4), d.rng.randrange(4, 9)) if d.hidden else (2, 5)
    x, causal = d.randn(B, T, d_model, dtype=dtype), torch.ones(T, T, dtype=torch.bool).tril().view(1, 1, T, T)
    cfg = f"d_model={d_model}, n_heads={n_heads}, bias={bias}, {str(dtype)[6:]}"
    y = _forward(module, x)
    expect_tensor_of(y, (B, T, d_model), dtype, f"MultiHeadAttention output ({cfg})", "keep the dtype of x.")
    with torch.no_grad():
        want, want_causal = (ref(x, x, x, attn_mask=m, need_weights=False)[0] for m in (None, ~causal[0, 0]))
    compare(y, want, f"self-attention output ({cfg}, input (B, T) = {(B, T)}) against nn.MultiheadAttention "
            "with the same weights", _MHA_HINT, variants=_mha_variants(params, x, None, n_heads))
    compare(_forward(module, x, causal), want_causal, f"causal self-attention ({cfg}, T={T}) against "
            "nn.MultiheadAttention with the same weights and mask", _MHA_HINT,
            variants=_mha_variants(params, x, causal, n_heads))
    x2 = x.clone()                       # causality: later tokens change no earlier output
    x2[:, 3:] += d.randn(B, T - 3, d_model, dtype=dtype)
    expect(matches(_forward(module, x2, causal)[:, :3], _forward(module, x, causal)[:, :3]),
           "MultiHeadAttention with a causal mask is not causal: changing tokens from position 3 on changed "
           "the outputs at positions before 3.", "pass the mask down to the attention of every head, so "
           "that query i only sees keys j <= i; do not mix positions anywhere else.")
    _check_blind_query(module, params, x, causal, n_heads, cfg, d.hidden)


@_one_thread
def check_multi_head_attention(MultiHeadAttention, scaled_dot_product_attention=None, hidden: bool = False) -> None:
    """scaled_dot_product_attention, when given, is the exercise 2 answer the layer may call: a
    failure it causes is blamed on it."""
    def drawn(d):
        n_heads = d.rng.randrange(1, 7)
        return n_heads * d.rng.randrange(1, 9), n_heads, d.rng.random() < 0.5, d.rng.choice([torch.float32, torch.float64])

    def indivisible(d) -> tuple[int, int]:        # sizes that do not divide, other than the visible ones
        n_heads = d.rng.randrange(5, 13)
        return n_heads * d.rng.randrange(4, 17) + d.rng.randrange(1, n_heads), n_heads

    d = draw("multi_head_attention", hidden)
    configs = [(16, 4, True, torch.float32), (12, 3, False, torch.float32), (8, 2, True, torch.float64)]
    configs += [(24, 8, True, torch.float64), (10, 1, True, torch.float32), (8, 8, False, torch.float64)] if hidden else []
    with _blame_attention_answer("MultiHeadAttention", scaled_dot_product_attention):
        for config in d.cases(configs, drawn, 2):
            _check_mha_config(MultiHeadAttention, d, *config)
    for d_model, n_heads in d.cases([(10, 3)], indivisible, 1):
        _check_indivisible(MultiHeadAttention, d_model, n_heads)


def _check_indivisible(MultiHeadAttention, d_model: int, n_heads: int) -> None:
    try:
        MultiHeadAttention(d_model, n_heads)
    except ValueError as err:
        expect(str(d_model) in str(err) and str(n_heads) in str(err),
               f"the ValueError for d_model={d_model}, n_heads={n_heads} should name both.",
               "say which sizes do not divide, e.g. f'd_model {d_model} is not divisible by n_heads {n_heads}'.")
    else:
        fail(f"MultiHeadAttention(d_model={d_model}, n_heads={n_heads}) did not raise ValueError.",
             "check d_model % n_heads == 0 in __init__ and raise ValueError naming both sizes.")

# ----------------------------------------------------------------------------- exercise 5


def _gqa_ref(q, k, v, mask, grouping="interleave", mask_grouping="interleave"):
    """Grouped-query attention in float64: query head h uses key/value head h // group ("tile": h % n_kv_heads)."""
    H, n_kv = q.shape[1], k.shape[1]
    repeat = (lambda t: t.repeat_interleave(H // n_kv, dim=1)) if grouping == "interleave" else (
        lambda t: t.repeat(1, H // n_kv, 1, 1))
    if mask is not None and mask_grouping != "interleave" and mask.shape[1] == H:
        mask = mask.unflatten(1, (H // n_kv, n_kv)).transpose(1, 2).reshape(mask.shape)
    return _attention_ref(q, repeat(k), repeat(v), mask)[0]


def _gqa_mask(d, B: int, H: int, T_q: int, T_k: int, kind: str | None) -> torch.Tensor | None:
    if kind == "causal":                                 # the queries are the last T_q positions
        return (torch.arange(T_k)[None, :] <= torch.arange(T_k - T_q, T_k)[:, None]).view(1, 1, T_q, T_k)
    if kind == "padding":
        mask = torch.ones(B, 1, 1, T_k, dtype=torch.bool)
        mask[0, ..., : T_k // 3] = False
        return mask
    if kind == "per_head":
        mask = d.uniform(0, 1, B, H, T_q, T_k) > 0.5
        mask[..., -1] = True
        mask[0, H - 1, 0] = False                        # head H-1 of sequence 0: query 0 sees no key
        return mask
    return None


def _drawn_gqa_case(d) -> tuple:
    n_kv = d.rng.randrange(1, 4)
    H, dh = n_kv * d.rng.randrange(2, 5), d.rng.choice([16, 24, 32])
    return (d.rng.randrange(1, 4), H, n_kv, d.rng.randrange(1, 5), d.rng.randrange(12, 40), dh,
            d.rng.choice([None, "causal", "per_head", "padding"]), d.rng.choice([torch.float32, torch.float64]))


@_one_thread
def check_grouped_query_attention(grouped_query_attention, scaled_dot_product_attention=None,
                                  hidden: bool = False) -> None:
    """scaled_dot_product_attention, when given, is the exercise 2 answer it may call: a failure it
    causes is blamed on it."""
    d = draw("grouped_query_attention", hidden)
    # (B, n_heads, n_kv_heads, T_q, T_k, d_head, mask kind, dtype): decoding shapes (T_q < d_head).
    cases = [(2, 4, 2, 1, 24, 16, None, torch.float32), (2, 6, 2, 3, 20, 16, "causal", torch.float32),
             (1, 8, 2, 2, 18, 16, "per_head", torch.float32), (2, 4, 4, 3, 10, 8, "padding", torch.float32),
             (1, 6, 3, 2, 16, 16, "causal", torch.float64)]
    extra = [(2, 8, 1, 2, 30, 32, "causal", torch.float64), (1, 12, 3, 4, 16, 16, "per_head", torch.float64),
             (3, 4, 2, 1, 40, 8, "padding", torch.float32)] if d.hidden else []
    with _blame_attention_answer("grouped_query_attention", scaled_dot_product_attention):
        for B, H, n_kv, T_q, T_k, dh, kind, dtype in d.cases(cases + extra, _drawn_gqa_case, 3):
            mask = _gqa_mask(d, B, H, T_q, T_k, kind)
            q, k, v = (d.randn(B, n, T, dh, dtype=dtype) for n, T in ((H, T_q), (n_kv, T_k), (n_kv, T_k)))
            label = (f"grouped_query_attention with n_heads={H}, n_kv_heads={n_kv}, B={B}, T_q={T_q}, T_k={T_k}, "
                     f"d_head={dh}, {str(dtype)[6:]}, "
                     + ("no mask" if mask is None else f"a {kind.replace('_', '-')} mask {tuple(mask.shape)}"))
            got, largest = _run(grouped_query_attention, q, k, v, mask, name="grouped_query_attention",
                                exercise="grouped-query attention")
            expect_tensor_of(got, (B, H, T_q, dh), dtype, label, "keep the dtype of q.")
            ref = lambda m=mask, **kw: lambda: _gqa_ref(q, k, v, m, **kw).to(dtype)  # noqa: E731
            compare(got, ref()(), label, "out[:, h] = softmax(q[:, h] @ k[:, h // group]^T / sqrt(d_head), masked) @ "
                    "v[:, h // group], with the mask of head h.", variants=[
                        (ref(grouping="tile"), "query head h must use key/value head h // group (heads 0 .. group-1 "
                         "share kv head 0): the heads were grouped as h % n_kv_heads. The head axis of q splits as "
                         "(n_kv_heads, group), kv head first, not (group, n_kv_heads)."),
                        (ref(mask_grouping="tile") if mask is not None else None, "the queries are grouped right but "
                         "the per-head mask is not: regroup its head axis exactly as the queries' (kv head first, then "
                         "the group), after expanding it to (B, n_heads, T_q, T_k)."),
                        (ref(None) if mask is not None else None,
                         "the mask was ignored: pass it, regrouped like the queries, to the attention.")])
            expanded = B * H * T_k * dh * q.element_size()
            _expect_small(largest, expanded if n_kv < H else math.inf, label, f"the keys expanded to all {H} query "
                          f"heads ({expanded:,} bytes)", "expanding the keys and values to n_heads copies them "
                          "(repeat_interleave, expand followed by reshape, or a matmul that broadcasts k over a group "
                          "axis, which expands it internally): during generation that is a copy of the whole cache at "
                          "every step. Move the group into the query axis instead, so that each key matrix is "
                          "multiplied once: q as (B, n_kv_heads, group * T_q, d_head), the mask regrouped the same "
                          "way.")

# ----------------------------------------------------------------------------- exercise 6

ENTROPY_CASE = (1024, 511)          # (seq_len, position): the case the notebook measures


def entropy_answer(seq_len: int, position: int) -> float:
    """The limit, temperature -> infinity, of the entropy of the causal query at ``position``: ln(position + 1)."""
    return math.log(position + 1)


def _entropy_oracle(scores, mask=None, temperature=1.0, base=math.e, ignore_mask=False, multiply=False):
    s = scores.detach().to(torch.float64)
    s = s * temperature if multiply else s / temperature
    if mask is not None and not ignore_mask:
        s = s.masked_fill(~mask, float("-inf"))
    logp = torch.log_softmax(s, dim=-1)
    h = torch.where(logp.exp() > 0, -logp.exp() * logp, torch.zeros_like(logp)).sum(dim=-1)
    return torch.nan_to_num(h, nan=0.0) / math.log(base)            # a row with no allowed key has entropy 0


def entropy_prediction_passes(predicted_entropy) -> bool:
    """For the exercise's demo, which shows the measurement only once the prediction passes its visible test."""
    return passes(_check_entropy_prediction, predicted_entropy)


def _entropy_judge(config: tuple[int, int], value) -> None:
    seq_len, position = config
    keys = position + 1
    guesses = [
        (math.log(seq_len) if seq_len != keys else None, f"the query at position {position} of a causal sequence "
         f"sees only keys 0 .. {position}: the causal mask leaves {keys} keys, not {seq_len}."),
        (math.log2(keys), "entropy in nats uses the natural logarithm: ln, not log2."),
        (math.log2(seq_len), f"entropy in nats uses the natural logarithm, and the causal query sees {keys} keys."),
        (math.log(position) if position > 0 else None, f"positions 0 .. {position} are {keys} keys: the query sees "
                                                       "itself too."),
        (0.0 if keys > 1 else None, "that is the limit temperature -> 0 (all the weight on the largest score). As the "
                                    "temperature grows, scores / temperature all go to 0 and the weights become "
                                    "uniform."),
        (float(keys), "that is the number of keys; the entropy of a uniform distribution over n keys is ln(n)."),
    ]
    judge_prediction("predicted_entropy", value, entropy_answer(seq_len, position),
                     unit_hint="return your prediction as a number of nats.",
                     asked=f"the entropy asked for (causal query at position {position} of {seq_len} tokens, "
                           "temperature -> infinity)",
                     exact=1e-9, close=0.01, close_hint="a rounded decimal (or a value read off a measurement) is "
                     "not the prediction: return the arithmetic that gives it, as a Python expression (math.log(...) "
                     "and the like), exact to float precision.",
                     guesses=[(v, h) for v, h in guesses if v is not None], near=0.01,
                     fallback="scores / temperature all go to 0 as the temperature grows, so the weights become "
                              "uniform over the keys the query may see; the entropy of a uniform distribution over n "
                              "outcomes is ln(n) nats.")


def _check_entropy_prediction(predicted_entropy, hidden: bool = False) -> None:
    """On (seq_len, position): the notebook's case and one more; hidden, drawn ones that no cell measures."""
    def drawn(d) -> tuple[int, int]:
        seq_len = d.rng.choice([d.rng.randrange(2, 64), d.rng.randrange(64, 200_000)])
        return seq_len, d.rng.choice([seq_len - 1, d.rng.randrange(0, seq_len)])
    configs = draw("predicted_entropy", hidden).cases([ENTROPY_CASE, (10, 6)], drawn, 4)
    judge_configured("predicted_entropy", predicted_entropy, configs, entropy_answer, _entropy_judge,
                     shown=lambda c: f"seq_len={c[0]}, position={c[1]}")


def _entropy_variants(scores, mask, temperature, want: torch.Tensor) -> list:
    """The entropies of common bugs (in the scores' dtype), in the order their hints are tried."""
    def ref(**kwargs):
        return lambda: _entropy_oracle(scores, mask, temperature, **kwargs).to(scores.dtype)

    empty = (~mask).all(dim=-1) if mask is not None else torch.zeros((), dtype=torch.bool)   # rows with no key
    broken = lambda got: not bool(torch.isfinite(got).all())  # noqa: E731
    ratio = ("that is the entropy divided by its largest value ln(n) (the attention-maps page's ratio); return the "
             "entropy itself, in nats.")
    return [
        (when(lambda got: bool(empty.any()) and matches(got.detach().masked_fill(empty, 0.0), want)),
         "a row with no allowed key has entropy 0 (there is no choice to make): a finite fill such as -1e9 (or "
         "finfo.min) spreads such a row evenly over its forbidden keys. Fill masked scores with -inf and set that "
         "row's result to 0."),
        (lambda: want / math.log(scores.shape[-1]), ratio),
        (lambda: (want.double() / mask.expand(scores.shape).sum(-1).clamp_min(2).double().log()).to(want.dtype)
         if mask is not None else None, ratio),
        (when(lambda got: broken(got) and bool(empty.any()) and bool(torch.isfinite(got[..., :1]).all())),
         "a row with no allowed key has entropy 0 (no choice to make), never NaN: its softmax is -inf - (-inf) = NaN, "
         "so replace that row's result (torch.nan_to_num, or torch.where on mask.any(-1))."),
        (when(broken), "a weight of exactly 0 (a masked key, or one that underflowed) contributes 0 * log(0) = "
                       "0 * -inf = NaN: its term must count as 0 (torch.where(p > 0, ..., 0), or torch.xlogy / "
                       "log_softmax with the masked terms removed)."),
        (ref(base=2), "that is in bits: the entropy in nats uses the natural logarithm, torch.log."),
        (ref(multiply=True) if temperature != 1.0 else None,
         "divide the scores by the temperature (softmax(scores / temperature)); it was multiplied."),
        (ref(ignore_mask=True) if mask is not None else None,
         "the mask was ignored: masked keys get weight 0 and contribute nothing to the entropy."),
    ]


def _drawn_entropy_case(d) -> tuple:
    shape = (*(d.rng.randrange(1, 4) for _ in range(d.rng.randrange(0, 3))), d.rng.randrange(1, 6),
             d.rng.randrange(1, 12))
    dtype = d.rng.choice([torch.float32, torch.float64])
    mask = (d.uniform(0, 1, *shape[-2:]) > 0.4) if d.rng.random() < 0.6 else None
    temperature = 10 ** d.rng.uniform(-2, 2)
    return ((d.randn(*shape) * 3).to(dtype), mask, temperature, f"{str(dtype)[6:]} scores {shape}, "
            f"{'a mask, ' if mask is not None else ''}temperature {temperature:.3g}")


@_one_thread
def check_attention_entropy(predicted_entropy, attention_entropy, hidden: bool = False) -> None:
    _check_entropy_prediction(predicted_entropy, hidden)
    d = draw("attention_entropy", hidden)
    # (scores, mask, temperature, what): masks with an empty row, tiny and large temperatures, float64.
    causal, blind = torch.ones(6, 6, dtype=torch.bool).tril(), d.uniform(0, 1, 3, 5) > 0.3
    blind[1], blind[0, 0] = False, True
    extra = [(d.randn(4, 7, dtype=torch.float64) * 5, None, 3.0, "float64 scores (4, 7)"),
             (d.randn(2, 2, 6, 6, dtype=torch.float64), causal, 1e-4, "float64 scores (2, 2, 6, 6), causal mask, "
              "temperature 1e-4"), (d.randn(1, 8) + 500.0, None, 1.0, "scores around 500")] if d.hidden else []
    cases = d.cases([
        (torch.zeros(1, 4), None, 1.0, "equal scores over 4 keys"),
        (d.randn(2, 3, 5) * 2, None, 1.0, "random scores (2, 3, 5), temperature 1"),
        (d.randn(6, 6) * 3, causal, 0.5, "random scores (6, 6) with a causal mask, temperature 0.5"),
        (d.randn(2, 4) * 10, None, 1e-3, "distinct scores at temperature 1e-3 (every weight but one underflows to 0)"),
        (d.randn(3, 5), blind, 2.0, "a (3, 5) mask whose second row is all False, temperature 2"),
        (d.randn(2, 6, dtype=torch.float64) * 4, causal[-2:], 0.7,
         "float64 scores (2, 6) with the last two rows of a causal mask, temperature 0.7")] + extra,
        _drawn_entropy_case, 3)
    for scores, mask, temperature, what in cases:
        label = f"attention_entropy of {what}"
        got = call_on_copies(attention_entropy, scores, mask, temperature, name="attention_entropy",
                             hint="build new tensors.")
        expect_tensor_of(got, scores.shape[:-1], scores.dtype, label, "compute in the dtype of the scores.")
        want = _entropy_oracle(scores, mask, temperature).to(scores.dtype)
        compare(got, want, label, "H = -sum_j p_j ln p_j over the keys (the last axis), p = softmax(scores / "
                "temperature) with masked keys at weight 0; 0 ln 0 counts as 0.",
                variants=_entropy_variants(scores, mask, temperature, want))

# ----------------------------------------------------------------------------- exercise 7


def _window_ref(q, k, v, window: int, extra: int = 0, scale: str = "sqrt", padded: bool = False) -> torch.Tensor:
    """Each query attends to its last ``window + extra`` keys (float64); ``padded``: the common bug of
    zero keys padded before the sequence that take part in the softmax."""
    if not padded:
        i, j = torch.arange(q.shape[-2]).view(-1, 1), torch.arange(k.shape[-2]).view(1, -1)
        return _attention_ref(q, k, v, (j <= i) & (i - j < window + extra), scale=scale)[0]
    q, k, v = (t.detach().to(torch.float64) for t in (q, k, v))
    kp, vp = (F.pad(t, (0, 0, window - 1, 0)).unfold(-2, window, 1) for t in (k, v))    # (..., T, d, window)
    s = (q.unsqueeze(-2) @ kp).squeeze(-2) / math.sqrt(q.shape[-1])                      # (..., T, window)
    return (torch.softmax(s, -1).unsqueeze(-2) @ vp.transpose(-2, -1)).squeeze(-2)


def _blockwise_cases(d, cases: list, lengths: tuple[int, int], widths: tuple[int, int], blocks, scales=(1.0,) * 3):
    """Cases (batch, T, d_k, d_v, block, dtype) with q, k, v drawn (times ``scales``): ``cases``, and hidden, three
    drawn with T in ``lengths``, d_k and d_v in ``widths`` and the block (window or chunk) in ``blocks(T)``."""
    def drawn(d):
        T = d.rng.randrange(*lengths)
        batch = tuple(d.rng.randrange(1, 3) for _ in range(d.rng.randrange(1, 3)))
        return (batch, T, d.rng.randrange(*widths), d.rng.randrange(*widths), d.rng.randrange(*blocks(T)),
                d.rng.choice([torch.float32, torch.float64]))
    for batch, T, d_k, d_v, block, dtype in d.cases(cases, drawn, 3):
        yield (batch, T, d_k, d_v, block, dtype, *(d.randn(*batch, T, n, dtype=dtype) * s
                                                   for n, s in zip((d_k, d_k, d_v), scales)))


@_one_thread
def check_sliding_window_attention(sliding_window_attention, scaled_dot_product_attention=None,
                                   hidden: bool = False) -> None:
    d, f32, f64 = draw("sliding_window_attention", hidden), torch.float32, torch.float64
    extra = [((1,), 64, 4, 4, 1, f32), ((2,), 30, 8, 2, 30, f64), ((3,), 7, 2, 3, 12, f32)] if d.hidden else []
    cases = [((2,), 48, 4, 3, 4, f32), ((1, 2), 40, 6, 6, 5, f32), ((2,), 5, 3, 2, 8, f32), ((1,), 24, 4, 3, 3, f64)]
    with _blame_attention_answer("sliding_window_attention", scaled_dot_product_attention):
        for batch, T, d_k, d_v, window, dtype, q, k, v in _blockwise_cases(
                d, cases + extra, (8, 80), (1, 7), lambda T: (1, max(2, T // 4)), (1.5, 1.5, 1.0)):
            label = (f"sliding_window_attention(q, k, v, window={window}) for q {(*batch, T, d_k)}, d_v={d_v}, "
                     f"{str(dtype)[6:]}")
            got, largest = _run(sliding_window_attention, q, k, v, window, name="sliding_window_attention",
                                exercise="sliding-window attention")
            expect_tensor_of(got, (*batch, T, d_v), dtype, label, "keep the dtype of q.")
            ref = lambda **kw: lambda: _window_ref(q, k, v, window, **kw).to(dtype)  # noqa: E731
            compare(got, ref()(), label, "out_i = softmax over keys j in [i - window + 1, i] (j >= 0) of q_i . k_j / "
                    "sqrt(d_k), times v_j.", variants=[
                        (ref(padded=True) if window > 1 else None, f"the first {window - 1} queries have fewer than "
                         "window keys before them: the padding positions you added before the sequence must be "
                         "masked, or their zero keys take part in the softmax (a score of 0 is not a weight of 0)."),
                        (ref(extra=1), f"off by one: each query sees window = {window} keys, itself included (keys "
                         "i - window + 1 .. i), not window + 1."),
                        (ref(extra=-1) if window > 1 else None, f"off by one: each query sees window = {window} keys, "
                         "itself included (keys i - window + 1 .. i), not window - 1."),
                        (ref(scale="none"), "the scores were not scaled: divide them by sqrt(d_k).")])
            full = math.prod(batch) * T * T * q.element_size()
            _expect_small(largest, math.inf if 2 * window * max(d_k, d_v, 1) >= T else full, "sliding_window_attention",
                          _full_matrix(T, T), f"sliding-window attention needs only (T, window) = ({T}, {window}) "
                          "scores: gather, for each query, its window of keys (pad window - 1 positions before the "
                          "sequence, then unfold), never the (T, T) matrix.")

# ----------------------------------------------------------------------------- exercise 8


def _linear_ref(q, k, v, causal=True, feature=lambda x: F.elu(x) + 1, normalise=True, scale_q=False, diagonal=0,
                chunk=None):
    """Linear attention in float64 by the quadratic form (only for the oracle). ``chunk`` with
    ``causal=False`` reproduces an answer whose chunks see their own future."""
    q, k, v = (t.detach().to(torch.float64) for t in (q, k, v))
    fq, fk = feature(q / math.sqrt(q.shape[-1]) if scale_q else q), feature(k)
    a = fq @ fk.transpose(-2, -1)                     # (..., T, T)
    i, j = torch.arange(a.shape[-1]).view(-1, 1), torch.arange(a.shape[-1]).view(1, -1)
    if chunk is not None:
        a = a * ((j // chunk <= i // chunk) & ((j // chunk < i // chunk) | (j - i <= -diagonal) | (not causal)))
    elif causal:
        a = a * (j - i <= -diagonal)
    return a @ v / a.sum(dim=-1, keepdim=True) if normalise else a @ v


def _matches_where_stable(got, q, k, v, variant: dict) -> bool:
    """got matches a variant of linear attention, or does on the rows whose normaliser is not near
    zero (phi = elu alone can make it vanish, and float32 and float64 then part ways)."""
    exact = _linear_ref(q, k, v, **variant)
    if (found := matches(got, exact.to(q.dtype))) or variant.get("feature") is None:
        return found
    stable = ((_linear_ref(q, k, v, **{**variant, "normalise": False}) / exact).abs() > 0.5).all(dim=-1)
    # Dividing by a normaliser down to 0.5 doubles float32's rounding of it, and more where it nears 0.5.
    return bool(stable.float().mean() > 0.5) and matches(got.detach()[stable], exact[stable].to(q.dtype),
                                                         tol=(1e-3, 1e-3))


def _chunked_variants(C: int) -> list:
    """(keyword arguments of _linear_ref, hint) for common bugs with chunks of ``C``."""
    return [
        (dict(chunk=C, causal=False), "inside a chunk every query saw the whole chunk, later keys included: the "
         "within-chunk part needs the causal mask (tril), and the running state must be updated only after the "
         "chunk's outputs are computed, so that it holds earlier chunks only."),
        (dict(chunk=C, diagonal=1), "the diagonal is missing inside the chunks: position i sees its own key (tril(), "
         "not tril(-1))."),
        (dict(diagonal=1), "every position missed its own key: the sums run over j <= i, the diagonal included."),
        (dict(normalise=False), "the normaliser is missing: divide phi(q_i) . S_i by phi(q_i) . z_i, with z summing "
         "phi(k_j) over the same keys as S."),
        (dict(feature=F.elu), "the feature map is elu(x) + 1, not elu(x): the +1 keeps every feature positive, so the "
         "normaliser cannot be zero or negative."),
        (dict(scale_q=True), "linear attention here has no 1/sqrt(d_k) scale: apply phi to q and k as they are."),
        (dict(causal=False), "the output is that of non-causal linear attention: position i may only use keys "
         "j <= i."),
    ]


@_one_thread
def check_chunked_linear_attention(chunked_linear_attention, hidden: bool = False) -> None:
    d, f32, f64 = draw("chunked_linear_attention", hidden), torch.float32, torch.float64
    run = lambda *args: _run(chunked_linear_attention, *args, name="chunked_linear_attention",  # noqa: E731
                             exercise="chunked linear attention")
    # T * d_k * d_v well above T * T / 2 is avoided: both limits bind.
    extra = [((2,), 64, 8, 8, 1, f64), ((1,), 40, 3, 4, 64, f32), ((3,), 71, 5, 6, 10, f64)] if d.hidden else []
    cases = [((2,), 96, 6, 6, 16, f32), ((1, 2), 50, 4, 5, 8, f32), ((1,), 40, 4, 4, 8, f64)]
    for batch, T, d_k, d_v, C, dtype, q, k, v in _blockwise_cases(d, cases + extra, (20, 120), (3, 9),
                                                                   lambda T: (2, max(3, T // 3))):
        label = (f"chunked_linear_attention(q, k, v, chunk_size={C}) for q {(*batch, T, d_k)}, d_v={d_v}, "
                 f"{str(dtype)[6:]}")
        got, largest = run(q, k, v, C)
        expect_tensor_of(got, (*batch, T, d_v), dtype, label, "keep the dtype of q.")
        compare(got, _linear_ref(q, k, v).to(dtype), label, "out_i = phi(q_i) . S_i / (phi(q_i) . z_i) with S_i = "
                "sum_{j<=i} phi(k_j) v_j^T and z_i = sum_{j<=i} phi(k_j), phi(x) = elu(x) + 1: earlier chunks through "
                "the carried state, the current one through its own masked (C, C) product.",
                variants=[(when(lambda got, kw=kw: _matches_where_stable(got, q, k, v, kw)), hint)
                          for kw, hint in _chunked_variants(C)])
        n_batch, elem = math.prod(batch), q.element_size()
        prefix_sums = n_batch * T * d_k * d_v * elem if C < T and d_k * d_v > 2 * max(d_k, d_v, C) else math.inf
        _expect_small(largest, prefix_sums, label, f"the prefix sums S_i of every position, (T, d_k, d_v) = ({T}, "
                      f"{d_k}, {d_v})", "keep one running state S (d_k, d_v) and z (d_k,) from chunk to chunk (or one "
                      "per chunk), not one per position: that is what chunking saves over cumsum.")
        _expect_small(largest, n_batch * T * T * elem if C < T // 2 else math.inf, label, _full_matrix(T, T), "only "
                      "the (chunk_size, chunk_size) products inside one chunk are quadratic; earlier chunks enter "
                      "through the state S = sum phi(k_j) v_j^T.")
    # Causality as a property: changing late keys and values changes no earlier output.
    q, k, v = (d.randn(2, 24, 4) for _ in range(3))
    a, b = (run(q, k + shift, v - 2 * shift, 8)[0] for shift in (0.0, (torch.arange(24) >= 13).float()[:, None]))
    expect(matches(b[:, :13], a[:, :13]), "chunked_linear_attention(chunk_size=8) is not causal: changing keys and "
           "values from position 13 on changed earlier outputs.",
           "inside a chunk mask the future (tril); update the state after the chunk.")

# ----------------------------------------------------------------------------- exercise 9


def _flash_ref(q, k, v, causal, shift=0, strict=False):
    """Exact attention in float64, its log-sum-exp and the row maxima of the scores; the causal mask
    aligned bottom-right (``shift`` and ``strict`` reproduce common bugs)."""
    q, k, v = (t.detach().to(torch.float64) for t in (q, k, v))
    T_q, T_k = q.shape[-2], k.shape[-2]
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if causal:
        i, j = torch.arange(T_k - T_q, T_k).view(-1, 1) + shift, torch.arange(T_k).view(1, -1)
        s = s.masked_fill(j >= i if strict else j > i, float("-inf"))
    return torch.softmax(s, dim=-1) @ v, torch.logsumexp(s, dim=-1), s.amax(dim=-1)


def _tiled(q, k, v, q_block: int, k_block: int, causal: bool = False, mem=None, rescale_sum=True, rescale_acc=True,
           early_break=False) -> torch.Tensor:
    """Tiled attention, the loop of FlashAttention, causal aligned bottom-right; the keyword arguments reproduce
    common bugs. With ``mem``, a :class:`SlowMemory` holding q, k and v (2-D), every tile is loaded from it and
    every output tile stored to it."""
    T_q, T_k = q.shape[-2], k.shape[-2]
    rows = (lambda name, t, a, b: mem.load(name, a, b)) if mem else (lambda name, t, a, b: t[..., a:b, :])
    outs = []
    for qs in range(0, T_q, q_block):
        qb = rows("q", q, qs, qs + q_block)                               # (n, d), stays in fast memory
        n, first = qb.shape[-2], T_k - T_q + qs                           # first: the first query's position
        m = qb.new_full((*qb.shape[:-1], 1), float("-inf"))
        l, acc = torch.zeros_like(m), qb.new_zeros((*qb.shape[:-1], v.shape[-1]))
        for ks in range(0, T_k, k_block):
            if causal and ks > first + (0 if early_break else n - 1):
                break
            kb, vb = rows("k", k, ks, ks + k_block), rows("v", v, ks, ks + k_block)
            s = qb @ kb.transpose(-2, -1) / math.sqrt(q.shape[-1])       # (n, k_block), in fast memory only
            if causal:
                s = s.masked_fill(torch.arange(ks, ks + s.shape[-1]) > torch.arange(first, first + n).view(-1, 1),
                                  float("-inf"))
            m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))
            p, c = torch.exp(s - m_new), torch.exp(m - m_new)
            l = (l * c if rescale_sum else l) + p.sum(dim=-1, keepdim=True)
            acc, m = (acc * c if rescale_acc else acc) + p @ vb, m_new
        outs.append(acc / l)
        if mem:
            mem.store("o", outs[-1], qs)
    return torch.cat(outs, -2)


def _flash_variants(q, k, v, q_block, k_block, causal) -> list:
    """The outputs of common bugs (float32), in the order their hints are tried."""
    T_q, T_k = q.shape[-2], k.shape[-2]
    ref = lambda **kw: lambda: _flash_ref(q, k, v, **{"causal": causal, **kw})[0].float()  # noqa: E731
    exact = [t.detach().double() for t in (q, k, v)]
    tiled = lambda **kw: lambda: _tiled(*exact, q_block, k_block, causal, **kw).float()  # noqa: E731
    return [
        (when(lambda got: not bool(torch.isfinite(got).all())), "the output has inf/NaN: subtract the running maximum "
         "before exp, p = exp(s - m_new) with m_new = max(m, rowmax(s)) over all key tiles so far."),
        (ref(shift=-(T_k - T_q)) if causal else None, f"the causal mask is aligned to the top left: with {T_k} keys "
         f"and {T_q} queries, query i is at position {T_k - T_q} + i and sees keys up to it."),
        (ref(strict=True) if causal else None, "the diagonal is masked: a query sees the key at its own position "
         "(mask key j only when j > the query's position)."),
        (tiled(early_break=True), "tiles were skipped too early: a key tile may be skipped only when it lies after "
         "the *last* query of the query tile; the first query's position skips tiles that later queries of the tile "
         "see."),
        (tiled(rescale_sum=False), "the running sum l was not rescaled: when the maximum grows from m to m_new, "
         "multiply the old sum by exp(m - m_new), like the accumulator."),
        (tiled(rescale_acc=False), "the accumulator was not rescaled: when the maximum grows from m to m_new, "
         "multiply the old accumulator by exp(m - m_new) before adding p @ v_tile."),
        (ref(causal=False) if causal else None, "the causal mask was ignored: mask, inside each tile, the keys after "
         "each query's position."),
    ]


def _run_flash(fn, q, k, v, q_block, k_block, causal, label):
    got, largest = _run(fn, q, k, v, q_block, k_block, causal=causal, name="flash_attention",
                        exercise="tiled attention")
    out, lse = expect_tuple(got, "out, lse", label, "return the output and the log-sum-exp of each query's scores: "
                            "`return out, lse`.")
    return out, lse, largest


@_one_thread
def check_flash_attention(flash_attention, hidden: bool = False) -> None:
    d = draw("flash_attention", hidden)
    # (batch, T_q, T_k, d_k, d_v, q_block, k_block, causal, spread).
    def drawn(d):
        T_q = d.rng.randrange(8, 65)
        T_k = d.rng.randrange(T_q, 97)
        return ((*(d.rng.randrange(1, 3) for _ in range(d.rng.randrange(1, 3))),), T_q, T_k, d.rng.randrange(1, 5),
                d.rng.randrange(1, 5), d.rng.randrange(1, T_q + 4), d.rng.randrange(1, T_k + 4), d.rng.random() < 0.6,
                d.rng.choice([1.0, 2.0, -3.0]))

    extra = [((3,), 10, 70, 4, 4, 3, 7, True, 1.0), ((1,), 64, 64, 4, 4, 64, 64, True, 2.0),
              ((2,), 33, 65, 4, 4, 10, 64, False, -6.0), ((1,), 24, 24, 2, 2, 1, 1, True, 1.0)] if d.hidden else []
    cases = d.cases([((2,), 64, 64, 4, 4, 8, 16, False, 1.0), ((1, 2), 40, 56, 4, 3, 16, 24, True, 2.0),
                     ((2,), 48, 48, 4, 4, 8, 16, True, 6.0)] + extra, drawn, 3)
    for case in cases:
        _check_flash_case(flash_attention, d, *case)
    _check_flash_merge(flash_attention, d)
    _check_flash_dtypes(flash_attention, d)


def _check_flash_case(fn, d, batch, T_q, T_k, d_k, d_v, qb, kb, causal, spread) -> None:
    growth = torch.linspace(0.3, 1.5, T_k) if spread > 0 else torch.linspace(1.5, 0.3, T_k)
    q, k = d.randn(*batch, T_q, d_k) * abs(spread), d.randn(*batch, T_k, d_k) * abs(spread) * growth.view(-1, 1)
    v = d.randn(*batch, T_k, d_v)
    label = (f"flash_attention(q_block={qb}, k_block={kb}, causal={causal}) for q {(*batch, T_q, d_k)} against "
             f"{T_k} keys, d_v={d_v}")
    out, lse, largest = _run_flash(fn, q, k, v, qb, kb, causal, label)
    expect_tensor(out, (*batch, T_q, d_v), f"the output of {label}")
    expect_tensor(lse, (*batch, T_q), f"the log-sum-exp of {label}")
    want, want_lse, row_max = _flash_ref(q, k, v, causal)
    # exp turns a float32 score's rounding (its size s_max times 6e-8) into a relative error of the weights.
    s_max = (q.double() @ k.double().transpose(-2, -1)).abs().max().item() / math.sqrt(d_k)
    atol = 1e-5 * max(1.0, s_max / 20)
    compare(out, want.float(), f"the output of {label}", "for each query tile keep a running maximum m, a running sum "
            "l and an accumulator; for each key tile: scores / sqrt(d_k), masked, m_new = max(m, rowmax(s)), p = "
            "exp(s - m_new), l = l*exp(m - m_new) + rowsum(p), acc = acc*exp(m - m_new) + p @ v_tile; out = acc / l.",
            variants=_flash_variants(q, k, v, qb, kb, causal), tol=(atol, 1e-4))
    compare(lse, want_lse.float(), f"the log-sum-exp of {label}", "lse_i = log sum_j exp(s_ij) over the keys query i "
            "may see, with s = q . k / sqrt(d_k): m + log(l) at the end of the loop.", variants=[
                ((want_lse - row_max).float(), "the log-sum-exp is m + log(l): log(l) alone is relative to the "
                 "running maximum m; add it back."),
                (lambda: _flash_ref(q * math.sqrt(d_k), k, v, causal)[1].float(), "the log-sum-exp is of the scaled "
                 "scores q . k / sqrt(d_k), the ones the softmax sees.")], tol=(atol * 10, 1e-5))
    n_batch, elem = math.prod(batch), q.element_size()
    _expect_small(largest, n_batch * T_q * T_k * elem if kb < T_k else math.inf, label, _full_matrix(T_q, T_k),
                  "compute the scores one (q_block, k_block) tile at a time and fold each into the running statistics.")
    bound = n_batch * T_q * min(kb, T_k) * elem
    others = max(t.untyped_storage().nbytes() for t in (q, k, v)) + n_batch * T_q * max(d_v, 1) * elem
    _expect_small(largest, bound if qb < T_q and bound > others else math.inf, label, f"the scores of all {T_q} "
                  f"queries against a key tile of {min(kb, T_k)}", f"the queries were not tiled: take the queries "
                  f"q_block = {qb} at a time (an outer loop), so that one tile of scores is (q_block, k_block).")


def _check_flash_merge(fn, d) -> None:
    """Merging across devices: two halves of the keys, merged through their log-sum-exps, give the whole."""
    q, k, v = d.randn(2, 12, 4), d.randn(2, 30, 4), d.randn(2, 30, 3)
    o1, l1, _ = _run_flash(fn, q, k[:, :11], v[:, :11], 4, 5, False, "flash_attention on keys 0 .. 10")
    o2, l2, _ = _run_flash(fn, q, k[:, 11:], v[:, 11:], 4, 5, False, "flash_attention on keys 11 .. 29")
    lse = torch.logaddexp(l1.double(), l2.double())
    merged = o1.double() * (l1.double() - lse).exp().unsqueeze(-1) + o2.double() * (l2.double() - lse).exp().unsqueeze(-1)
    compare(merged.float(), _flash_ref(q, k, v, False)[0].float(), "the outputs of two halves of 30 keys (11 and 19), "
            "merged with weights exp(lse_half - lse_all)", "each half's lse must be the log-sum-exp of that half's "
            "scores, so that exp(lse_half - lse_all) is the share of the softmax mass in that half.")


def _check_flash_dtypes(fn, d) -> None:
    """float64 in, float64 accuracy out; half precision in, the same dtype out."""
    for T_q, T_k, qb, kb in ([(20, 33, 6, 8)] if d.hidden else [(12, 18, 5, 4)]):
        q, k, v = (d.randn(2, T, 8, dtype=torch.float64) * 4 for T in (T_q, T_k, T_k))
        what = f"flash_attention(q_block={qb}, k_block={kb}, causal=True) for float64 q (2, {T_q}, 8) against {T_k} keys"
        out, lse, _ = _run_flash(fn, q, k, v, qb, kb, True, what)
        want, want_lse, _ = _flash_ref(q, k, v, True)
        expect(out.dtype == torch.float64 and lse.dtype == torch.float64, f"{what} returned {out.dtype}.",
               "return the dtype of the inputs: create m, l and acc with dtype=q.dtype, device=q.device (float64 "
               "here), and do not convert the results.")
        compare(out, want, f"the output of {what}", "right to float32 accuracy only: create m, l and the "
                "accumulator in q's dtype (float64 here).")
        compare(lse, want_lse, f"the log-sum-exp of {what}", "right to float32 accuracy only: keep m and l in q's dtype.")
    # Tiles rounded at every step to 3 (float16) or 2 (bfloat16) digits: what the reference answer keeps.
    for dtype, atol in ([(torch.float16, 2e-2)] + ([(torch.bfloat16, 8e-2)] if d.hidden else [])):
        q, k, v = d.randn(2, 24, 8).to(dtype), d.randn(2, 40, 8).to(dtype), d.randn(2, 40, 6).to(dtype)
        what = f"flash_attention(q_block=8, k_block=16, causal=True) for {str(dtype)[6:]} q, k, v (2, 24/40, 8)"
        out, lse, _ = _run_flash(fn, q, k, v, 8, 16, True, what)
        expect_tensor(out, (2, 24, 6), what)
        expect(out.dtype == dtype and lse.dtype == dtype, f"{what} returned {str(out.dtype)[6:]} and "
               f"{str(getattr(lse, 'dtype', '?'))[6:]}.", "return the dtype of the inputs: create m, l and acc with "
               "dtype=q.dtype, device=q.device, or cast the results back with .to(q.dtype).")
        compare(out, _flash_ref(q, k, v, True)[0].to(dtype), what, "the result is right in float32 but not in half "
                "precision: keep the running maximum subtracted before exp (p = exp(s - m_new)), so nothing "
                "overflows.", tol=(atol, atol))

# ----------------------------------------------------------------------------- exercise 10
# The step rotates with chapter 2's apply_rope (exercise 5), pasted above it: chapter 2's own check runs on it
# first (``check_rope_tools``), and a failing case is blamed on it when it fails that check and rotates this case's
# queries and keys wrongly; when it rotates them right, the cause is in the step.


def check_rope_tools(apply_rope, hidden: bool = False) -> None:
    """Chapter 2's own check (exercise 5) on the apply_rope brought into this notebook."""
    earlier_chapter("apply_rope", 2, 5, lambda: ch02.check_apply_rope(apply_rope, hidden=hidden))


def _rotates_right(apply_rope, d, B: int, H: int, n_kv: int, dh: int, T_past: int, T_new: int, base: float,
                   dtype: torch.dtype) -> bool:
    """Whether apply_rope passes chapter 2's check on tensors of this case: queries and keys at T_past .. T_past +
    T_new - 1, and every position up to the last, in this dtype."""
    try:
        for heads in {H, n_kv}:
            for T in (T_new, T_past + T_new):
                x = d.randn(B, heads, T, dh, dtype=torch.float64).to(dtype)
                ch02._check_rope_case(apply_rope, x, torch.arange(T_past + T_new - T, T_past + T_new), base)
    except (CheckFailed, NotImplementedError):
        return False
    return True


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
    (B, T_new), d, T_past = ids.shape, w_q.shape[0] // H, k_past.shape[-2]
    x = F.embedding(ids, f(emb))
    q, k, v = (F.linear(x, f(w)).view(B, T_new, n, d).transpose(1, 2) for w, n in ((w_q, H), (w_k, n_kv), (w_v, n_kv)))
    pos = torch.arange(T_past, T_past + T_new) if kind != "no_offset" else torch.arange(T_new)
    pairing = "interleaved" if kind == "interleaved" else "half"
    q, k = _rope_complex(q, pos, base, pairing), _rope_complex(k, pos, base, pairing)
    past = _rope_complex(k_past, torch.arange(T_past), base)
    if kind == "cache_rotated_twice":
        past = _rope_complex(past, torch.arange(T_past), base)
    if kind == "values_rotated":
        v = _rope_complex(v, pos, base)
    keys, values, T_all = torch.cat((past, k), -2), torch.cat((f(v_cache), v), -2), T_past + T_new
    if kind == "top_left":
        allowed = torch.ones(T_new, T_all, dtype=torch.bool).tril()
    else:
        allowed = torch.arange(T_all)[None, :] <= (T_all - T_new + torch.arange(T_new))[:, None]
    out = F.scaled_dot_product_attention(q, keys, values, attn_mask=allowed, enable_gqa=True)
    out = out.transpose(1, 2).reshape(B, T_new, H * d)
    return (out @ f(w_o) if kind == "w_o_untransposed" else F.linear(out, f(w_o))), keys


def _step_variants(oracle, T_past: int, T_new: int, cache_ok: bool) -> list:
    """The outputs of common bugs (kinds of _step_oracle), each tried only where the new k_cache agrees (wrong for a
    bug that changes it too, right for one that does not) and, for a bug that changes nothing without a cache, after
    one."""
    return [(lambda kind=kind, tried=wrong_cache != cache_ok and (T_past > 0 or not needs_cache): oracle(kind)[0]
             if tried else None, hint) for kind, wrong_cache, needs_cache, hint in [
        ("no_offset", True, True, f"the new tokens were rotated as positions "
         f"{'0' if T_new == 1 else f'0 .. {T_new - 1}'}, but they come after {T_past} cached ones: rotate new token t "
         "by its absolute position T_past + t."),
        ("cache_rotated_twice", True, True, "the cached keys were rotated again: the cache holds keys already rotated "
         "at their own positions; rotate only the new keys, then append them."),
        ("interleaved", True, False, "RoPE was applied with interleaved pairs (x_2j, x_2j+1); this model uses the "
         "half-split pairing of chapter 2, entry j with entry j + d_head/2 (rotate_half)."),
        ("values_rotated", False, False, "the values were rotated: RoPE rotates only queries and keys."),
        ("top_left", False, True, f"the causal mask is aligned to the top left: new query t is at position {T_past} + "
         "t and sees every cached key and the new keys up to itself (your decoder_mask of exercise 3 with q_len = "
         "T_new gives this)."),
        ("w_o_untransposed", False, False, "w_o is stored like nn.Linear's weight, (d_model, n_heads * d_head): apply "
         "it as out @ w_o.T, as for w_q, w_k and w_v."),
    ]]


@_one_thread
def check_decoder_attention_step(decoder_attention_step, decoder_mask=None, grouped_query_attention=None,
                                 apply_rope=None, hidden: bool = False) -> None:
    """decoder_mask and grouped_query_attention, when given, are the answers of exercises 3 and 5 it may
    call, apply_rope chapter 2's, pasted: a failure they cause is blamed on them, chapter 2's RoPE first."""
    d, f32, f64 = draw("decoder_attention_step", hidden), torch.float32, torch.float64
    # (B, n_heads, n_kv_heads, d_head, T_past, T_new, vocab, base, dtype); d_model = n_heads * d_head.
    cases = [(1, 4, 2, 8, 5, 1, 11, 10000.0, f32), (2, 4, 1, 8, 3, 4, 13, 100.0, f32),
             (1, 2, 1, 8, 4, 2, 10, 10000.0, f64)]
    if d.hidden:
        cases += [(2, 2, 2, 16, 0, 3, 9, 10000.0, f64), (1, 6, 3, 4, 17, 2, 20, 500.0, f64)] + [
            (d.rng.randrange(1, 3), n_kv * d.rng.randrange(1, 4), n_kv, 2 * d.rng.randrange(2, 9),
             d.rng.randrange(0, 25), d.rng.randrange(1, 6), d.rng.randrange(5, 40),
             d.rng.choice([100.0, 1000.0, 10000.0]), dtype)
            for dtype, n_kv in ((t, d.rng.randrange(1, 4)) for t in (f32, f64))]
    earlier = earlier_answers(
        "decoder_attention_step", ("may call your decoder_mask", 3, decoder_mask, check_decoder_mask),
        ("may call your grouped_query_attention", 5, grouped_query_attention, check_grouped_query_attention))
    for case in cases:
        rope = [("decoder_attention_step calls your apply_rope from chapter 2, which fails that chapter's tests "
                 "(exercise 5)", functools.partial(_rope_at_fault, apply_rope, d.sub("apply_rope"), case, hidden))]
        with earlier_first(*(rope if apply_rope is not None else []), *earlier):
            _check_step_case(decoder_attention_step, d, *case)


def _rope_at_fault(apply_rope, d, case: tuple, hidden: bool) -> None:
    """Chapter 2's check on the pasted apply_rope, for a case of the step that failed: it is at fault only when it
    rotates this case's queries or keys wrongly; when it rotates them right, the cause is in the step."""
    B, H, n_kv, dh, T_past, T_new, _, base, dtype = case
    if not _rotates_right(apply_rope, d, B, H, n_kv, dh, T_past, T_new, base, dtype):
        check_rope_tools(apply_rope, hidden)


def _check_step_case(fn, d, B, H, n_kv, dh, T_past, T_new, vocab, base, dtype) -> None:
    r = lambda *shape: d.randn(*shape, dtype=torch.float64).to(dtype)  # noqa: E731
    d_model = H * dh
    ids, emb = d.randint(0, vocab, (B, T_new)), r(vocab, d_model)
    w_q, w_k, w_v = (r(n * dh, d_model) / math.sqrt(d_model) for n in (H, n_kv, n_kv))
    w_o, k_past, v_cache = r(d_model, H * dh) / math.sqrt(d_model), r(B, n_kv, T_past, dh), r(B, n_kv, T_past, dh)
    k_cache = _rope_complex(k_past, torch.arange(T_past), base).to(dtype)      # rotated when cached
    label = (f"decoder_attention_step with {T_new} new token{'s' if T_new > 1 else ''} after a cache of {T_past} "
             f"(B={B}, n_heads={H}, n_kv_heads={n_kv}, d_head={dh}, base={base:g}, {str(dtype)[6:]})")
    got, _ = _run(fn, ids, emb, w_q, w_k, w_v, w_o, H, n_kv, k_cache, v_cache, base, name="decoder_attention_step",
                  exercise="the attention step", hint="build new tensors (torch.cat makes the new cache); do not write "
                  "into the inputs.")
    y, new_k, new_v = expect_tuple(got, "y, k_cache, v_cache", label, "return three tensors: the layer's output and "
                                   "the two grown caches.")
    for name, t, what in (("k_cache", new_k, "keys"), ("v_cache", new_v, "values")):
        expect(not (isinstance(t, torch.Tensor) and t.dim() == 4 and t.shape[-2] == T_past),
               f"the new {name} of {label} holds {T_past} positions, as many as before the step.",
               f"the {name} came back as it was given: append the new tokens' {what} to it (torch.cat along dim -2) "
               "and return the grown cache.")
    for name, t, shape in (("output", y, (B, T_new, d_model)), ("new k_cache", new_k, (B, n_kv, T_past + T_new, dh)),
                           ("new v_cache", new_v, (B, n_kv, T_past + T_new, dh))):
        expect_tensor_of(t, shape, dtype, f"the {name} of {label}", "keep the dtype of the weights: create every new "
                         "tensor with their dtype and device.")
    oracle = lambda kind="right": [t.to(dtype) for t in _step_oracle(  # noqa: E731
        ids, emb, w_q, w_k, w_v, w_o, H, n_kv, k_past, v_cache, base, kind)]
    want, want_keys = oracle()
    cache_ok = matches(new_k, want_keys)
    variants = _step_variants(oracle, T_past, T_new, cache_ok)
    if not cache_ok:
        compare(new_k, want_keys, f"the new k_cache of {label}", diagnose(y, variants, (
            "the new k_cache must be cat((k_cache, apply_rope(k_new, positions)), dim=-2) with positions T_past .. "
            "T_past + T_new - 1 (half-split pairs), and v_cache cat((v_cache, v_new), dim=-2).")))
    compare(y, want, f"the output of {label}", f"with T_past={T_past}, T_new={T_new}: x = emb[ids]; q, k, v = x @ "
            "w.T split into heads; rotate q and k at positions T_past + t; append to the caches; grouped-query "
            "attention (query head h uses kv head h // group) with a bottom-right causal mask; merge heads; @ w_o.T.",
            variants=variants)
    v_new = F.linear(F.embedding(ids, emb.double()), w_v.double()).view(B, T_new, n_kv, dh).transpose(1, 2)
    compare(new_v, torch.cat((v_cache.double(), v_new), -2).to(dtype), f"the new v_cache of {label}",
            "the new v_cache must be cat((v_cache, v_new), dim=-2): the cached values, then the new tokens' values "
            "(x @ w_v.T split into kv heads, not rotated), so that the next step sees them.")

# ----------------------------------------------------------------------------- exercise 11

# (seq_len, head_dim, q_tile, k_tile, bytes_per_number): the case the notebook measures (fp16, FlashAttention-sized
# tiles), and one whose tiles do not divide the sequence.
IO_CASE = (1024, 64, 128, 64, 2)
_IO_RAGGED = (1000, 48, 96, 128, 4)


def standard_io_answer(seq_len: int, head_dim: int, bytes_per_number: int) -> int:
    """Bytes moved by standard attention under the notebook's model: read Q, K, write S; read S, write P; read P, V,
    write O: four passes over T x T numbers and four over T x d."""
    return bytes_per_number * (4 * seq_len * seq_len + 4 * seq_len * head_dim)


def tiled_io_answer(seq_len: int, head_dim: int, q_tile: int, k_tile: int, bytes_per_number: int) -> int:
    """Bytes moved by tiled attention: Q read once, K and V once per query tile, O written once."""
    query_tiles = -(-seq_len // q_tile)
    return bytes_per_number * seq_len * head_dim * (2 + 2 * query_tiles)


def _judge_bytes(name: str, value, answer: int, asked: str, guesses: list, fallback: str) -> None:
    """A count of bytes: exact, else the hint of the slip it equals, else ``fallback`` (how to count)."""
    judge_prediction(name, value, answer, unit_hint="return your prediction as a number of bytes.", asked=asked,
                     exact=0.5, close=0.0, close_hint="", guesses=guesses, near=0.0, fallback=fallback)


def _standard_io_judge(config: tuple, value) -> None:
    T, d, b = config
    guesses = [
        (b * (3 * T * T + 4 * T * d), "the softmax writes P back to slow memory, and the product with V reads it: "
                                      "S and P are each written once and read once, four passes of T x T numbers."),
        (b * (2 * T * T + 4 * T * d), "S and P are each written to slow memory and then read back: T x T numbers move "
                                      "four times (S written, S read, P written, P read), not twice."),
        (4 * T * T + 4 * T * d, "that is a count of numbers: the question asks for bytes, so multiply by "
                                "bytes_per_number."),
        (b * (4 * T * T + 3 * T * d), "Q, K and V are each read once and the output O is written once: four "
                                      "seq_len x head_dim matrices move."),
        (b * 4 * T * T, "Q, K and V are read and O is written too: add their seq_len x head_dim numbers."),
    ]
    _judge_bytes("standard_attention_bytes", value, standard_io_answer(T, d, b), f"the bytes standard attention moves "
                 f"(seq_len {T}, head_dim {d}, {b} bytes per number)", guesses, "follow the three steps of the model: "
                 "each reads its inputs from slow memory and writes its result there; count the numbers of each "
                 "matrix, then multiply by bytes_per_number.")


def _tiled_io_judge(config: tuple, value) -> None:
    T, d, qt, kt, b = config
    n_q, n_k = -(-T // qt), -(-T // kt)
    guesses = [
        (b * 4 * T * d, "each query tile reads all of K and V again (the tiles of K and V do not stay in fast memory "
                        "from one query tile to the next): K and V are read once per query tile."),
        (b * T * d * (2 + 2 * (T // qt)), f"{T} rows in tiles of {qt} make ceil({T} / {qt}) = {n_q} query tiles: the "
                                          "last, shorter tile is read too (integer division drops it)."),
        (b * T * d * (2 + 2 * (T // qt + 1)), f"when {qt} divides {T} there are exactly {T} / {qt} query tiles: "
                                              "ceil(seq_len / q_tile), not seq_len // q_tile + 1."),
        (T * d * (2 + 2 * n_q), "that is a count of numbers: the question asks for bytes, so multiply by "
                                "bytes_per_number."),
        (b * T * d * (2 + 2 * n_k), "K and V are read once per *query* tile (the outer loop): the number of query "
                                    "tiles, ceil(seq_len / q_tile), not that of key tiles."),
        (b * T * d * (1 + n_k + 2 * n_q), "a query tile is read once and stays in fast memory while the key tiles go "
                                          "by: Q is read once in all, not once per key tile."),
        (b * (2 * T * d + 2 * n_q * n_k * kt * d), f"the last key tile is shorter ({T - (n_k - 1) * kt} rows here): "
                                                   "across the key tiles, each query tile reads exactly seq_len rows "
                                                   "of K and of V."),
        (b * T * d * (1 + 2 * n_q), "the output O is written once, seq_len x head_dim numbers."),
    ]
    _judge_bytes("tiled_attention_bytes", value, tiled_io_answer(T, d, qt, kt, b), f"the bytes tiled attention moves "
                 f"(seq_len {T}, head_dim {d}, q_tile {qt}, k_tile {kt}, {b} bytes per number)", guesses, "follow the "
                 "loop of the model: for each query tile, its Q rows once, then every K and V tile; then its O rows "
                 "once. Count the numbers, then multiply by bytes_per_number.")


def check_attention_io(standard_attention_bytes, tiled_attention_bytes, hidden: bool = False) -> None:
    """Both predictions against the model's counts, on the notebook's case and a ragged one (visible); hidden, on
    drawn ones with tiles that divide or not, every byte width."""
    def drawn(d) -> tuple:
        q_tile, k_tile = d.rng.choice([16, 32, 64, 128, 256]), d.rng.choice([16, 32, 64, 128])
        seq_len = d.rng.randrange(1, 64) * q_tile + d.rng.choice([0, d.rng.randrange(1, q_tile)])
        return seq_len, d.rng.choice([32, 64, 80, 96, 128, 256]), q_tile, k_tile, d.rng.choice([1, 2, 4, 8])

    configs = draw("attention_io", hidden).cases([IO_CASE, _IO_RAGGED], drawn, 6)
    judge_configured("standard_attention_bytes", standard_attention_bytes, [(T, d, b) for T, d, _, _, b in configs],
                     standard_io_answer, _standard_io_judge, shown=lambda c: "seq_len={}, head_dim={}, "
                     "bytes_per_number={}".format(*c))
    judge_configured("tiled_attention_bytes", tiled_attention_bytes, configs, tiled_io_answer, _tiled_io_judge,
                     shown=lambda c: "seq_len={}, head_dim={}, q_tile={}, k_tile={}, bytes_per_number={}".format(*c))


def attention_io_predictions_pass(standard_attention_bytes, tiled_attention_bytes) -> bool:
    """For the exercise's demo, which shows the measurement only once the predictions pass their visible test."""
    return passes(check_attention_io, standard_attention_bytes, tiled_attention_bytes)


class SlowMemory:
    """The exercise's memory model made runnable: named matrices in slow memory; ``load`` copies rows into fast
    memory and counts them as read, ``store`` writes rows back and counts them as written (bytes)."""

    def __init__(self, **matrices: torch.Tensor) -> None:
        self.matrices, self.read, self.written = dict(matrices), 0, 0

    def load(self, name: str, start: int = 0, stop: int | None = None) -> torch.Tensor:
        rows = self.matrices[name][start:stop].clone()
        self.read += rows.numel() * rows.element_size()
        return rows

    def store(self, name: str, rows: torch.Tensor, start: int = 0) -> None:
        self.written += rows.numel() * rows.element_size()
        if start == 0 and name not in self.matrices:
            self.matrices[name] = rows.new_empty((0, *rows.shape[1:]))
        self.matrices[name] = torch.cat((self.matrices[name][:start], rows, self.matrices[name][start + len(rows):]))


def _standard_through(mem: SlowMemory) -> torch.Tensor:
    q, k = mem.load("q"), mem.load("k")
    mem.store("s", q @ k.T / math.sqrt(q.shape[-1]))                      # (T, T)
    mem.store("p", torch.softmax(mem.load("s"), dim=-1))                  # (T, T)
    mem.store("o", mem.load("p") @ mem.load("v"))                         # (T, d)
    return mem.matrices["o"]


def measure_attention_io(seq_len: int, head_dim: int, q_tile: int, k_tile: int, dtype=torch.float16) -> tuple[int, int]:
    """Run both versions on random Q, K, V of ``dtype`` through :class:`SlowMemory` (in float64 for the arithmetic,
    counted at ``dtype``'s width); check that they agree with softmax attention; return the bytes each moved."""
    g = torch.Generator().manual_seed(seq_len * 7919 + head_dim)
    q, k, v = (torch.randn(seq_len, head_dim, generator=g, dtype=torch.float64) for _ in range(3))
    want = torch.softmax(q @ k.T / math.sqrt(head_dim), dim=-1) @ v
    moved = []
    for run in (_standard_through, lambda mem: _tiled(q, k, v, q_tile, k_tile, mem=mem)):
        mem = SlowMemory(q=q, k=k, v=v)
        out = run(mem)
        assert torch.allclose(out, want, atol=1e-9), "the instrumented attention disagrees with softmax attention"
        width = torch.empty((), dtype=dtype).element_size() / q.element_size()
        moved.append(round((mem.read + mem.written) * width))
    return moved[0], moved[1]


# ----------------------------------------------------------------------------- pasted into later chapters
PASTED_ATTENTION: Pasted = {
    "scaled_dot_product_attention": (3, 2, lambda tools, hidden: check_scaled_dot_product_attention(
        tools["scaled_dot_product_attention"], hidden=hidden)),
    "grouped_query_attention": (3, 5, lambda tools, hidden: check_grouped_query_attention(
        tools["grouped_query_attention"], tools["scaled_dot_product_attention"], hidden=hidden)),
}
