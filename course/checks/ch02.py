"""Checks for chapter 2: positional encodings.

Oracles: float64 sinusoidal encodings written from the formula (powers, not logs) for any
positions, RoPE as multiplication by unit complex numbers (``torch.polar``) with per-sequence
positions, the ALiBi slope recipe of the reference implementation, a row permutation built
from index arithmetic, attention over the whole sequence (no cache) for the cached step, a
softmax over distances for ALiBi's reach, hand-derived values (the slopes of 8 heads, a 2 x 4
cached ALiBi bias, the reach of a slope of 1/8) and a property: a RoPE score depends only on
m - n. Every exercise runs on a second dtype (float64, or bfloat16/float16 where rounding is
the point). Oracles are computed in float64 and rounded to the dtype asked for, whose tolerance
applies. Each plausible bug is a variant (what it would produce), whose hint names the input.
"""

from __future__ import annotations

import math
import random
from typing import Any, Callable

import torch
import torch.nn as nn

from ..i18n import composed
from ._core import (CheckFailed, call, earlier_answers, earlier_first, error_hint, expect_tensor, judge_prediction,
                    not_written, own_fault)
from ._vocabulary import TOLERANCE, Draw, Pasted, compare, diagnose, draw, expect, fail, judge_configured, matches, when

F32, F64, F16, BF16 = torch.float32, torch.float64, torch.float16, torch.bfloat16

# What float32 arithmetic leaves of a float64 computation on these inputs (positions up to
# about 100): an answer this close to a float64 oracle, but not closer, computed in float32.
# Frequencies fall to 1e-6 (base 1e6), below float32's absolute tolerance: they are held to
# their dtype's relative tolerance only, and to this band relatively.
FLOAT32_BAND, FLOAT32_BAND_RELATIVE = (1e-4, 1e-4), (0.0, 1e-4)

# ----------------------------------------------------------------------------- oracles

def _freqs64(d: int, base: float) -> torch.Tensor:
    """theta_i = base^(-2i/d) for i = 0 .. d/2 - 1, in float64."""
    return base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)


def _span(start: int, count: int) -> str:
    """Positions ``start`` .. ``start + count - 1`` as the messages write them."""
    return f"{start}" if count == 1 else f"{start} .. {start + count - 1}"


def _interleave(even: torch.Tensor, odd: torch.Tensor) -> torch.Tensor:
    """Columns even[..., i] -> 2i and odd[..., i] -> 2i + 1."""
    return torch.stack((even, odd), dim=-1).flatten(-2)


def _sin_enc64(positions: torch.Tensor, d_model: int, base: float, freqs: torch.Tensor | None = None,
               swap: bool = False, halves: bool = False) -> torch.Tensor:
    """Sinusoidal encodings of positions (...,) -> (..., d_model) in float64; the options give what bugs produce."""
    angles = positions.double()[..., None] * (_freqs64(d_model, base) if freqs is None else freqs)   # (..., d/2)
    s, c = (angles.cos(), angles.sin()) if swap else (angles.sin(), angles.cos())
    return torch.cat((s, c), dim=-1) if halves else _interleave(s, c)


def _alibi_slopes_oracle(n: int) -> list[float]:
    """The recipe of the ALiBi reference code, in Python floats."""
    if math.log2(n).is_integer():
        return [(2.0 ** (-8.0 / n)) ** (h + 1) for h in range(n)]
    closest = 2 ** math.floor(math.log2(n))
    return _alibi_slopes_oracle(closest) + _alibi_slopes_oracle(2 * closest)[0::2][: n - closest]


def _call_explained(fn: Callable, *args: Any, name: str, explain: Callable[[BaseException], str | None],
                    **kwargs: Any) -> Any:  # vocabulary? call(..., explain=) for errors with a known cause
    """:func:`call`, where ``explain(err)`` may name the likely cause of an error the answer raised."""
    try:
        return fn(*args, **kwargs)
    except NotImplementedError as err:
        raise not_written(err, getattr(fn, "__name__", name))
    except CheckFailed:
        raise
    except Exception as err:
        raise CheckFailed.of(f"{name} raised {type(err).__name__}: {err}", explain(err) or error_hint(err)) from err


def _float32_only(want64: torch.Tensor, dtype: torch.dtype, hint: str,
                  band: tuple[float, float] = FLOAT32_BAND) -> tuple[when, str]:
    """The variant of a float64 answer computed in float32 and then converted."""
    return when(lambda got: dtype == F64 and matches(got, want64, band)), hint


def _base_ignored(make: Callable[[float], torch.Tensor], base: float) -> tuple[Callable, str]:
    """The variant of an answer that uses the default base 10000 instead of the one given."""
    return (lambda: make(10000.0) if base != 10000.0 else None, f"this case uses base={base:g}, and the answer "
            "matches base 10000: use the base argument, not a hard-coded 10000.")


def _draw_base(rng: random.Random) -> float:
    """A RoPE or sinusoid base, log-uniform between 10 and 10^6, rounded to 3 significant digits."""
    return float(f"{10 ** rng.uniform(1, 6):.3g}")


def _show(values: torch.Tensor, noun: str) -> str:
    """The values of a failing case in a few words: k = 5, k = [3, -2], 16 positions from 0 to 3015."""
    v = [int(x) if x == round(x) else round(x, 3) for x in values.detach().double().flatten().tolist()]
    name, many = ("k = ", "offsets k") if noun == "k" else (f"{noun} ", noun)
    return f"{name}{v[0] if values.dim() == 0 else v}" if len(v) <= 8 else f"{len(v)} {many} from {min(v)} to {max(v)}"


def _tensor_of(got: Any, shape: tuple[int, ...], dtype: torch.dtype, label: str, hint: str) -> None:
    expect_tensor(got, shape, label)
    expect(got.dtype == dtype, f"{label} returned dtype {got.dtype}, expected {dtype}.", hint)


# ----------------------------------------------------------------------------- exercise 1

def _attention_fn(weights: tuple[torch.Tensor, ...], causal: bool = False, positions: bool = False) -> Callable:
    """Single-head self-attention with the given (w_q, w_k, w_v), each (d, d): (B, T, d) -> (B, T, d)."""
    (w_q, w_k, w_v), d = weights, weights[0].shape[0]

    def attention(x: torch.Tensor) -> torch.Tensor:
        if positions:
            x = x + _sin_enc64(torch.arange(x.shape[1]), d, 10000.0).to(x.dtype)   # (B, T, d)
        q, k, v = x @ w_q.to(x.dtype), x @ w_k.to(x.dtype), x @ w_v.to(x.dtype)   # (B, T, d)
        scores = q @ k.transpose(-2, -1) / math.sqrt(d)                      # (B, T, T)
        if causal:
            scores = scores.masked_fill(torch.ones(x.shape[1], x.shape[1], dtype=torch.bool).triu(1), -math.inf)
        return scores.softmax(dim=-1) @ v                                    # (B, T, d)
    return attention


def _ex1_cases(hidden: bool) -> list[tuple[str, Callable, torch.Tensor, torch.Tensor, float, bool]]:
    """(name, fn, x (B, T, d), perm (T,), atol, whether fn is equivariant)."""
    def perm_of(T: int) -> torch.Tensor:                                     # not the identity
        perm = torch.randperm(T, generator=d.gen)
        return perm if not torch.equal(perm, torch.arange(T)) else perm_of(T)
    ramp = lambda x: torch.arange(x.shape[1], dtype=x.dtype)[None, :, None]  # noqa: E731 - (1, T, 1)
    leaky = lambda fn, size: lambda x: fn(x) + size * ramp(x)                # noqa: E731 - a position-dependent term
    weighted = lambda x: x.mean(dim=1, keepdim=True) * (ramp(x) + 1)        # noqa: E731 - order-blind, not equivariant
    mean = lambda x: x.mean(dim=1, keepdim=True).expand_as(x) + 0.0          # noqa: E731 - the same row everywhere
    qkv = lambda n: tuple(d.randn(n, n) / math.sqrt(n) for _ in range(3))    # noqa: E731
    mlp = lambda w1, w2: lambda x: torch.relu(x @ w1) @ w2                   # noqa: E731 - (B, T, d) -> (B, T, d_out)
    d = draw("is_permutation_equivariant", hidden)
    x, perm, w = d.randn(2, 5, 8), torch.tensor([2, 0, 3, 1, 4]), qkv(8)   # perm: not its own inverse
    cases = [("self-attention without positions", _attention_fn(w), x, perm, 1e-5, True),
             ("self-attention with sinusoidal positions added", _attention_fn(w, positions=True), x, perm, 1e-5, False),
             ("causal self-attention", _attention_fn(w, causal=True), x, perm, 1e-5, False),
             ("self-attention plus a position-dependent term of size 1e-7 (rounding-sized)",
              leaky(_attention_fn(w), 1e-7), x, perm, 1e-5, True),
             ("a per-token MLP", mlp(d.randn(8, 16), d.randn(16, 8)), x, perm, 1e-5, True),
             ("the sequence mean times the position index", weighted, x, perm, 1e-5, False),
             ("the sequence mean copied to every position", mean, x, perm, 1e-5, True)]
    if not hidden:
        return cases
    # At most 10 positions: a term of size 1e-4 then moves an entry by at most 9e-4 < atol = 1e-3.
    T, n = d.rng.randrange(5, 11), 2 * d.rng.randrange(2, 7)
    x7, perm7, perm8 = d.randn(d.rng.randrange(1, 5), T, n), perm_of(T), perm_of(T)
    attn = lambda **kw: _attention_fn(qkv(n), **kw)                          # noqa: E731 - fresh weights each time
    return cases + [
        ("a per-token MLP with 3 outputs", mlp(d.randn(n, 2 * n), d.randn(2 * n, 3)), x7, perm7, 1e-5, True),
        ("the sequence mean times the position index", weighted, x7, perm7, 1e-5, False),
        ("self-attention plus a position-dependent term of size 1e-3", leaky(attn(), 1e-3), x7, perm7, 1e-5, False),
        ("self-attention plus a term of size 1e-4, with atol=1e-3", leaky(attn(), 1e-4), x7, perm7, 1e-3, True),
        ("self-attention with positions, identity permutation", attn(positions=True), x7, torch.arange(T), 1e-5, True),
        ("causal self-attention, another permutation", attn(causal=True), x7, perm8, 1e-5, False),
        ("self-attention without positions, another permutation", attn(), x7, perm8, 1e-5, True),
        ("self-attention without positions, in float64 with atol=1e-12", attn(), x7.double(), perm7, 1e-12, True),
        ("self-attention plus a position-dependent term of size 1e-3, in float64",
         leaky(attn(), 1e-3), x7.double(), perm8, 1e-12, False)]


# What a wrong test answers for fn, x, perm, atol, with its hint; the first that answers as the student did names it.
_EX1_VARIANTS = [
    (lambda fn, x, perm, atol: torch.allclose(fn(x[:, perm]), fn(x), atol=atol),
     "that tests invariance (the output does not change), not equivariance: the output of the "
     "permuted input must equal the original output permuted the same way, fn(x)[:, perm]."),
    (lambda fn, x, perm, atol: torch.allclose(fn(x[:, perm]), fn(x)[:, torch.argsort(perm)], atol=atol),
     "the output was permuted with the inverse permutation: x[:, perm] puts row perm[t] at t, so "
     "compare with fn(x)[:, perm], the same indexing, not an argsort or a scatter."),
    (lambda fn, x, perm, atol: torch.equal(fn(x[:, perm]), fn(x)[:, perm]),
     "exact equality fails on rounding: summing in another order changes the last bits, so compare with "
     "torch.allclose(..., atol=atol), not torch.equal or ==."),
    (lambda fn, x, perm, atol: torch.allclose(fn(x[:, perm]), fn(x)[:, perm]),
     "the atol argument was ignored: pass it on, torch.allclose(a, b, atol=atol)."),
]


def check_is_permutation_equivariant(is_permutation_equivariant, hidden: bool = False) -> None:
    cases, answers = _ex1_cases(hidden), []
    batch_axis = ("perm reorders positions, which are dimension 1 of x (B, T, d_model): permute with x[:, perm], not "
                  "x[perm] (that reorders the batch).")
    for name, fn, x, perm, atol, _ in cases:
        x_before = x.clone()
        answers.append(_call_explained(
            is_permutation_equivariant, fn, x, perm, atol=atol, name=f"is_permutation_equivariant on {name}",
            explain=lambda err: batch_axis if isinstance(err, (IndexError, RuntimeError)) else None))
        expect(torch.equal(x, x_before), "is_permutation_equivariant changed the input x.",
               "build the permuted copy with x[:, perm]; do not edit x in place.")
        expect(isinstance(answers[-1], bool), f"is_permutation_equivariant returned {type(answers[-1]).__name__}, "
               "expected a Python bool.", "return bool(torch.allclose(...)): a bool, not a tensor.")
    wrong = [case for case, got in zip(cases, answers) if got != case[5]]
    if wrong:
        hint = diagnose(answers, [(lambda rule=rule: [bool(rule(*case[1:5])) for case in cases], h)
                                  for rule, h in _EX1_VARIANTS] + [
            (when(lambda got: len(set(got)) == 1),
             f"the function returned {answers[0]} for every case: it must run fn on both inputs and compare.")],
            "compare fn(x[:, perm]) with fn(x)[:, perm] using torch.allclose(..., atol=atol).")
        fail(f"is_permutation_equivariant answered {not wrong[0][5]} for {wrong[0][0]}, expected {wrong[0][5]} "
             f"({len(wrong)} of {len(cases)} cases wrong).", hint)


# ----------------------------------------------------------------------------- exercise 2

def check_sinusoidal_table(sinusoidal_table, hidden: bool = False) -> None:
    d = draw("sinusoidal_table", hidden)
    cases = d.cases([(6, 8, 10000.0, F32), (50, 16, 100.0, F32), (12, 8, 1000.0, F64), (100, 16, 10000.0, F16)]
                    + ([(1, 4, 10000.0, F32), (128, 512, 10000.0, F32), (33, 10, 500.0, F32), (100, 64, 1e6, F64),
                        (7, 2, 10000.0, F32), (300, 32, 1000.0, F16), (200, 24, 10000.0, BF16)] if hidden else []),
                    lambda d: (d.rng.randrange(1, 129), 2 * d.rng.randrange(1, 129), _draw_base(d.rng),
                               d.rng.choice([F32, F64])), 3)
    for seq_len, d_model, base, dtype in cases:
        label = (f"sinusoidal_table({seq_len}, {d_model}, base={base:g})" if dtype == F32
                 else f"sinusoidal_table({seq_len}, {d_model}, base={base:g}, dtype={dtype})")
        got = call(sinusoidal_table, seq_len, d_model, base, **({} if dtype == F32 else {"dtype": dtype}))
        _tensor_of(got, (seq_len, d_model), dtype, label,
                   "create the table with the dtype argument (float32 by default), not a fixed dtype.")
        half, pos = torch.arange(d_model // 2, dtype=torch.float64), torch.arange(seq_len)
        table = lambda p=pos, b=base, **kw: _sin_enc64(p, d_model, b, **kw).to(dtype)  # noqa: E731
        want = _sin_enc64(pos, d_model, base)
        compare(got, want.to(dtype), label, f"for seq_len={seq_len}, d_model={d_model}, base={base:g}: PE[pos, 2i] = "
                "sin(pos * w_i) and PE[pos, 2i+1] = cos(pos * w_i) with w_i = exp(-2i * ln(base) / d_model), pos = 0 "
                ".. seq_len - 1.", variants=[
                    _float32_only(want, dtype, "the float64 table was computed in float32 and then converted: compute "
                                  "the positions, the frequencies and the angles in float64, then cast the finished "
                                  "table to dtype (.to(dtype))."),
                    (when(lambda got: dtype in (F16, BF16) and matches(got, want, (0.3, 0.0))),
                     f"the table was computed in {dtype}: with so few bits of mantissa the frequencies and the angles "
                     "pos * w_i are off by far more than the rounding of the final entries. Compute in float64 (at "
                     "least float32), then cast the finished table to dtype (.to(dtype))."),
                    _base_ignored(lambda b: table(b=b), base),
                    (lambda: table(swap=True), "sin and cos are swapped: even columns (0, 2, 4, ...) hold sin(pos * "
                     "w_i), odd columns hold cos(pos * w_i); row 0 is [0, 1, 0, 1, ...]."),
                    (lambda: table(pos + 1), "positions start at 0, not 1: use torch.arange(seq_len), so that row 0 is "
                     "[0, 1, 0, 1, ...]."),
                    (lambda: table(freqs=base ** (-half / d_model)), "the exponent of the frequencies is 2i/d_model (i "
                     "= 0 .. d_model/2 - 1), not i/d_model: the column index 2i comes from torch.arange(0, d_model, "
                     "2)."),
                    (lambda: table(freqs=base ** (-half)), "the exponent of the frequencies is 2i/d_model, not i: w_i "
                     "= base^(-2i/d_model) = exp(-2i * ln(base) / d_model)."),
                    (lambda: table(freqs=base ** (2 * half / d_model)), "the frequencies must decrease with i: w_i = "
                     "base^(-2i/d_model) (a minus sign in the exponent)."),
                    (lambda: table(freqs=torch.exp(-2 * half * math.log10(base) / d_model)), "use the natural "
                     "logarithm, math.log(base), in exp(-2i * ln(base) / d_model); log10 gives other frequencies."),
                    (lambda: table(halves=True), "interleave the columns: sin in even columns and cos in odd columns "
                     "(pe[:, 0::2] and pe[:, 1::2]), not all sines followed by all cosines.")])


# ----------------------------------------------------------------------------- exercise 3

def _shift_rot64(pe: torch.Tensor, k: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """Each (sin, cos) pair of pe rotated by k * freqs (what an answer with other frequencies does)."""
    b, pe = k.double()[..., None, None] * freqs, pe.double()                    # b: (..., 1, d_model/2)
    s, c = pe[..., 0::2], pe[..., 1::2]
    return _interleave(s * b.cos() + c * b.sin(), c * b.cos() - s * b.sin())


def _explain_shift_error(pe_shape: tuple[int, ...], k_shape: tuple[int, ...], err: BaseException) -> str | None:
    """When k with a single trailing axis cannot broadcast against pe's pairs, that is the likely error; on a 0-d k,
    an index error comes from indexing k as if it had a batch axis."""
    pairs = pe_shape[:-1] + (pe_shape[-1] // 2,)                                 # (..., T, d_model/2)
    if not k_shape:
        return (f"pe has shape {pe_shape} = (T, d_model), so k is 0-d (one offset, shape ()): k may be 0-d, and k[:, "
                "None, None] (or k.shape[0]) assumes a batch axis that it does not have. Index with k[..., None, "
                "None], which adds the two trailing axes to any number of leading ones."
                if isinstance(err, IndexError) or "dimension 0" in str(err) or "0-d" in str(err) else None)
    try:
        torch.broadcast_shapes(k_shape + (pe_shape[-1] // 2,), pairs)
        return None
    except RuntimeError:
        return (f"k holds one offset per sequence, shape {k_shape}, and pe's pairs are {pairs} = (..., T, d_model/2): "
                "with one trailing axis (k[..., None]) the angles are (..., d_model/2) and their sequence axis meets "
                "the T axis of pe. Give k two trailing axes, k[..., None, None], so that each offset reaches every "
                "position and every pair of its own sequence.")


def _shift_variants(positions: torch.Tensor, pe: torch.Tensor, k: torch.Tensor, base: float,
                    dtype: torch.dtype) -> list[tuple[Any, str]]:
    """What common bugs give for pe (..., T, d_model) at positions (..., T) shifted by k (...,)."""
    d_model, shift, negative = pe.shape[-1], k.double()[..., None], bool((k < 0).any())   # shift: (..., 1)
    enc = lambda p, **kw: _sin_enc64(p, d_model, base, **kw).to(dtype)  # noqa: E731
    per_position = k.double().reshape(-1)[None, :] if k.dim() == 1 and k.numel() == positions.shape[-1] else None
    return [
        (lambda: enc(positions + shift.abs()) if negative and bool((k > 0).any()) else None,
         f"the sequences with k >= 0 are right, but those with a negative k ({_show(k, 'k')}) were shifted by +|k|: "
         "the rotation itself is right; keep the sign of k (b = k * w_i, no abs(k))."),
        (lambda: enc(positions - shift), "every pair turns the wrong way (the result is PE(pos - k)): sin(a + b) = "
         "sin a cos b + cos a sin b and cos(a + b) = cos a cos b - sin a sin b."),
        (lambda: enc(positions + shift.abs()) if negative else None, f"this case has a negative shift "
         f"({_show(k, 'k')}) and the answer shifts by +|k|: keep the sign of k (b = k * w_i, no abs(k))."),
        (lambda: enc(positions + shift, halves=True), "the shifted pairs were written back as all sines then all "
         "cosines: pair i goes back to columns 2i (sin) and 2i + 1 (cos)."),
        (lambda: _shift_rot64(pe, k, base ** (-torch.arange(d_model // 2, dtype=torch.float64) / d_model)).to(dtype),
         "the exponent of w_i is 2i/d_model (i = 0 .. d_model/2 - 1), not i/d_model."),
        (lambda: enc(positions + per_position) if per_position is not None else None, "k holds one offset per "
         "sequence (shape pe.shape[:-2]): it must broadcast over the T positions and the pairs, k[..., None, None]."),
        _base_ignored(lambda b: _shift_rot64(pe, k, _freqs64(d_model, b)).to(dtype), base),
    ]


def check_shift_encodings(shift_encodings, hidden: bool = False) -> None:
    def drawn(d: Draw) -> tuple:     # (start positions of each sequence (...,), T, d_model, k (...,), base, dtype)
        lead = tuple(d.rng.randrange(1, 4) for _ in range(d.rng.randrange(0, 3)))
        starts, k = d.randint(0, 30, lead).double(), torch.rand(lead, generator=d.gen, dtype=F64) * 40 - 20
        k = k.round() if d.rng.random() < 0.5 else k
        return starts, d.rng.randrange(1, 9), 2 * d.rng.randrange(1, 33), k, _draw_base(d.rng), d.rng.choice([F32, F64])

    t = torch.tensor
    for starts, T, d_model, k_drawn, base, dtype in draw("shift_encodings", hidden).cases(
            [(t([0.0, 7.0]), 5, 8, t([3.0, -2.0]), 10000.0, F32), (t(4.0), 6, 6, t(5.0), 100.0, F32),
             (t([3.0, 40.0]), 4, 8, t([-6.0, 2.5]), 10000.0, F64)]
            + ([(t([[0.0, 3.0], [10.0, 2.0]]), 4, 16, t([[1.5, -0.25], [-7.0, 12.0]]), 10000.0, F32),
                (t([20.0, 5.0, 0.0]), 3, 10, t([-4.0, -1.0, -9.0]), 500.0, F32),
                (t([1000.0, 2500.0]), 7, 64, t([-37.0, 41.5]), 10000.0, F64)] if hidden else []), drawn, 2):
        positions = starts.double()[..., None] + torch.arange(T, dtype=torch.float64)      # (..., T)
        pe_before, k_before = _sin_enc64(positions, d_model, base).to(dtype), k_drawn.to(dtype)   # (..., T, d_model)
        pe, k = pe_before.clone(), k_before.clone()
        label = f"shift_encodings(pe of shape {tuple(pe.shape)} ({dtype}), {_show(k, 'k')}, base={base:g})"
        got = _call_explained(shift_encodings, pe, k, base, name=label,
                              explain=lambda err: _explain_shift_error(tuple(pe.shape), tuple(k.shape), err))
        expect(torch.equal(pe, pe_before) and torch.equal(k, k_before), "shift_encodings changed its inputs in place.",
               "build new tensors; do not write into pe or k.")
        _tensor_of(got, tuple(pe.shape), dtype, label, "create every new tensor with pe's dtype and device (the "
                   "angles too).")
        want = _sin_enc64(positions + k_before.double()[..., None], d_model, base)
        compare(got, want.to(dtype), label, f"for {_show(k_before, 'k')} and base={base:g}: with (s, c) = (pe[..., "
                "2i], pe[..., 2i+1]) and b = k * w_i, the pair becomes (s cos b + c sin b, c cos b - s sin b), with k "
                "broadcast over the positions of its sequence.",
                variants=[_float32_only(want, dtype, "these encodings are float64 and the answer computed the angles "
                                        "in float32: build the frequencies and k * w_i in pe's dtype.")]
                + _shift_variants(positions, pe_before, k_before, base, dtype))


# ----------------------------------------------------------------------------- exercise 4

def check_learned_positional_embedding(LearnedPositionalEmbedding, hidden: bool = False) -> None:
    def drawn(d: Draw) -> tuple[int, int]:
        # At least 1500 entries, so that the std of the initial table is measured within 3%.
        max_len = d.rng.randrange(4, 300)
        return max_len, d.rng.randrange(-(-1500 // max_len), -(-1500 // max_len) + 64)

    d = draw("learned_positional_embedding", hidden)
    for i, (max_len, d_model) in enumerate(d.cases([(24, 64)] + ([(37, 48), (512, 16)] if hidden else []), drawn, 2)):
        with d.sub(f"init{i}").seeded():
            module = call(LearnedPositionalEmbedding, max_len, d_model, name="LearnedPositionalEmbedding(...)")
        weight = getattr(module, "weight", None)
        expect(isinstance(weight, nn.Parameter), "LearnedPositionalEmbedding should have an attribute `weight` that "
               "is an nn.Parameter.", "wrap the table in nn.Parameter(...) so that it is trained.")
        expect(tuple(weight.shape) == (max_len, d_model), f"weight has shape {tuple(weight.shape)}, expected (max_len, "
               f"d_model) = {(max_len, d_model)}.", "one row per position: (max_len, d_model).")
        std = weight.detach().std().item()
        expect(0.017 < std < 0.023, f"the initial weights have std {std:.4f}, expected about 0.02.",
               "initialise with nn.init.normal_(weight, mean=0.0, std=0.02) (torch.randn has std 1).")
        # (T, offset): from the start, an exact fit, a continuation after a cache of `offset` positions.
        for T, offset in [(1, 0), (max_len // 2 + 1, 0), (max_len, 0), (3, max_len - 3), (2, max_len // 3 + 1)]:
            _check_learned_forward(module, weight, d.randn(2, T, d_model), offset, max_len)
        if i == 0 or hidden:    # a second dtype: the module converted to float64 works on float64 inputs
            out64 = call(module.double(), d.randn(2, 3, d_model, dtype=F64), 1,
                         name="LearnedPositionalEmbedding(...).double()")
            expect(isinstance(out64, torch.Tensor) and out64.dtype == F64, "after .double(), a float64 input gave "
                   f"{getattr(out64, 'dtype', type(out64).__name__)}, expected float64.", "keep the table as a "
                   "registered nn.Parameter (so .double() converts it) and add it as it is.")
            module.float()
        _check_learned_gradient(module, weight, d.randn(3, max_len // 2, d_model), max_len // 4)
        # Too long: past max_len from position 0, and past max_len only because of the offset.
        for T, offset in [(max_len + 1 + (i % 3), 0), (max_len - 1, 2)]:
            _check_too_long(module, d.randn(1, T, d_model), offset, max_len)


def _check_learned_forward(module: nn.Module, weight: torch.Tensor, x: torch.Tensor, offset: int, max_len: int) -> None:
    (_, T, d_model), x_before, table = x.shape, x.clone(), weight.detach()
    where = f"T={T}" + (f", offset={offset}" if offset else "")
    fits = ("positions offset .. offset + T - 1 fit when offset + T <= max_len (the last row is max_len - 1): "
            if offset + T == max_len else "")
    out = _call_explained(module, x, *([offset] if offset else []),
                          name=f"LearnedPositionalEmbedding.forward with {where} (max_len {max_len})",
                          explain=lambda err: f"{fits}raise only when offset + T > max_len." if isinstance(
                              err, ValueError) else "forward(x, offset=0) adds rows offset .. offset + T - 1; read the "
                          "traceback above this message.")
    expect(torch.equal(x, x_before), "forward changed its input x in place.",
           "return x + the rows of the table; do not use += on x.")
    expect_tensor(out, (2, T, d_model), f"LearnedPositionalEmbedding output for {where}")
    compare(out, x_before + table[offset:offset + T], f"LearnedPositionalEmbedding output for {where}",
            f"with {where}: position t of the input is absolute position offset + t: add weight[offset:offset + T].",
            variants=[(x_before + table[:T] if offset else None, f"the offset was ignored (here {where}): the input "
                       f"continues a sequence whose first {offset} positions came before, so add weight[offset:offset "
                       "+ T], not weight[:T]."),
                      (table[offset:offset + T].expand(2, T, d_model),
                       "forward must add the positions to x, not return the positions alone.")])


def _check_learned_gradient(module: nn.Module, weight: torch.Tensor, x: torch.Tensor, offset: int) -> None:
    T = x.shape[1]
    module.zero_grad()
    out = module(x, offset)
    expect(isinstance(out, torch.Tensor) and out.requires_grad,
           "the output of LearnedPositionalEmbedding carries no gradient: weight cannot be trained.",
           "do not detach or copy the table in forward: add the slice of self.weight itself.")
    out.sum().backward()
    expect(weight.grad is not None, "no gradient reached weight.", "do not detach or copy the table in forward.")
    used = weight.grad.abs().sum(dim=1) > 0
    expect(bool(used[offset:offset + T].all()) and not used[:offset].any() and not used[offset + T:].any(),
           f"with T={T} and offset={offset}, the gradient should reach rows {offset} .. {offset + T - 1} of "
           "weight and no others.", "add weight[offset:offset + T], one row per absolute position.")


def _check_too_long(module: nn.Module, x: torch.Tensor, offset: int, max_len: int) -> None:
    T = x.shape[1]
    case = f"a sequence needing positions up to {offset + T - 1} (T={T}, offset={offset}, max_len {max_len})"
    # whole sentences (the raised error's hint, then the silent one's): each one message to translate
    if offset:
        hints = (f"here T={T} fits on its own but offset + T = {offset + T} > max_len = {max_len}: the length check "
                 "must include the offset (offset + T > max_len), before indexing.",
                 f"here T={T} fits on its own but offset + T = {offset + T} > max_len = {max_len}: the length check "
                 "must include the offset (offset + T > max_len).")
    else:
        hints = ("check the length yourself before indexing and raise ValueError naming offset + T and max_len.",
                 "check the length yourself before indexing and raise ValueError naming offset + T and max_len "
                 "(slicing the table silently returns fewer rows).")
    try:
        module(x, offset) if offset else module(x)
    except NotImplementedError:
        raise
    except ValueError as err:
        expect(str(offset + T) in str(err) and str(max_len) in str(err),
               f"the ValueError for positions up to {offset + T - 1} (offset {offset}, T {T}) with max_len {max_len} "
               f"says {str(err)!r}: it should name both offset + T = {offset + T} and max_len.",
               "name both numbers in the message, e.g. f'positions up to {offset + T} exceed max_len {self.max_len}'.")
    except Exception as err:
        fail(f"{case} raised {type(err).__name__} ({str(err).splitlines()[0] if str(err) else ''}), not ValueError.",
             hints[0])
    else:
        fail(f"{case} did not raise ValueError.", hints[1])


# ----------------------------------------------------------------------------- exercise 5

def check_rope_frequencies(rope_frequencies, hidden: bool = False) -> None:
    d = draw("rope_frequencies", hidden)
    cases = d.cases([(8, 10000.0, None), (64, 500.0, None)]
                    + ([(2, 10000.0, None), (128, 1e6, F64), (6, 10.0, None)] if hidden else []),
                    lambda d: (2 * d.rng.randrange(1, 129), _draw_base(d.rng), d.rng.choice([None, F64])), 3)
    for d_head, base, asked in cases:
        got, dtype = call(rope_frequencies, d_head, base, **({} if asked is None else {"dtype": asked})), asked or F32
        label = f"rope_frequencies({d_head}, base={base:g}" + (")" if asked is None else f", dtype={dtype})")
        _tensor_of(got, (d_head // 2,), dtype, label, "create the frequencies with the dtype argument (float32 by "
                   "default).")
        j, want = torch.arange(d_head // 2, dtype=torch.float64), _freqs64(d_head, base)
        compare(got, want.to(dtype), label, f"for d_head={d_head}, base={base:g}: theta_j = base^(-2j/d_head) = "
                "exp(-2j * ln(base) / d_head), j = 0 .. d_head/2 - 1.", tol=(0.0, TOLERANCE[dtype][1]), variants=[
                    _float32_only(want, dtype, "the float64 frequencies were computed in float32 and converted: build "
                                  "torch.arange(0, d_head, 2, dtype=dtype) and compute in that dtype.",
                                  FLOAT32_BAND_RELATIVE),
                    (base ** (-j / d_head), "the exponent is 2j/d_head (j = 0 .. d_head/2 - 1), not j/d_head: use "
                     "torch.arange(0, d_head, 2)."),
                    (base ** (2 * j / d_head), "the frequencies must decrease: theta_j = base^(-2j/d_head)."),
                    _base_ignored(lambda b: _freqs64(d_head, b), base)])


def check_rotate_half(rotate_half, hidden: bool = False) -> None:
    d = draw("rotate_half", hidden)
    shapes = d.cases([(2, 3, 8), (4,)] + ([(2, 2, 5, 16), (1, 2)] if hidden else []),
                     lambda d: (*(d.rng.randrange(1, 5) for _ in range(d.rng.randrange(0, 3))),
                                2 * d.rng.randrange(1, 17)), 2)
    for n, shape in enumerate(shapes):
        x_before = d.randn(*shape, dtype=F64 if n % 2 else F32)
        got = call(rotate_half, x := x_before.clone())
        expect(torch.equal(x, x_before), "rotate_half changed its input in place.", "build a new tensor (torch.cat).")
        _tensor_of(got, shape, x.dtype, f"rotate_half of a {x.dtype} tensor of shape {shape}",
                   "keep the input's dtype: torch.cat of its own halves does.")
        x1, x2 = x_before[..., : shape[-1] // 2], x_before[..., shape[-1] // 2:]
        compare(got, torch.cat((-x2, x1), dim=-1), f"rotate_half of shape {shape}",
                "split the last dimension into halves x1, x2 and return cat(-x2, x1).", variants=[
                    (torch.cat((x2, -x1), dim=-1), "the sign is on the wrong half: rotate_half returns cat(-x2, x1); "
                     "with cat(x2, -x1) every pair turns the wrong way (by -angle)."),
                    (torch.cat((x2, x1), dim=-1), "one half must be negated: rotate_half returns cat(-x2, x1)."),
                    (lambda: _interleave(-x_before[..., 1::2], x_before[..., 0::2]), "rotate_half works on halves, not "
                     "on neighbouring entries: x1 = x[..., :d/2], x2 = x[..., d/2:], return cat(-x2, x1).")])


def _rope_b64(x: torch.Tensor, positions: torch.Tensor, base: float, pairing: str = "half", sign: float = 1.0,
              freqs: torch.Tensor | None = None, heads_as_batch: bool = False) -> torch.Tensor:
    """RoPE of x (B, H, T, d) at positions (T,) or (B, T) in float64, as complex multiplication. heads_as_batch:
    (B, T, d) angles broadcast against x when B == H; "mixed": rotate_half with a repeat_interleave'd cos/sin table."""
    x, d = x.double(), x.shape[-1]
    angles = sign * positions.double()[..., None] * (_freqs64(d, base) if freqs is None else freqs)   # (.., T, d/2)
    if angles.dim() == 3 and not heads_as_batch:
        angles = angles[:, None]                                                # (B, 1, T, d/2)
    if pairing == "mixed":
        a = angles.repeat_interleave(2, dim=-1)
        return x * a.cos() + torch.cat((-x[..., d // 2:], x[..., : d // 2]), dim=-1) * a.sin()
    rot = torch.polar(torch.ones_like(angles), angles)
    if pairing == "half":
        z = torch.complex(x[..., : d // 2], x[..., d // 2:]) * rot
        return torch.cat((z.real, z.imag), dim=-1)
    z = torch.complex(x[..., 0::2], x[..., 1::2]) * rot
    return _interleave(z.real, z.imag)


def _rope_cases(hidden: bool) -> list[tuple[tuple[int, ...], torch.Tensor, float, torch.dtype]]:
    """(shape of x (B, H, T, d_head), positions (T,) or (B, T), base, dtype)."""
    def drawn(d: Draw) -> tuple:
        # Positions up to 40 in float32, as above: float32 angles stay within the tolerance.
        B, H, T = d.rng.randrange(1, 4), d.rng.randrange(1, 4), d.rng.randrange(1, 13)
        shape = (B, H, T, 2 * d.rng.randrange(1, 33))
        positions = (torch.arange(T)[None] * d.rng.randrange(1, 3) + d.randint(0, 20, (B, 1)) if d.rng.random() < 0.5
                     else (torch.rand(T, generator=d.gen) * 40).sort().values)
        return shape, positions, _draw_base(d.rng), d.rng.choice([F32, F64])

    d, t = draw("apply_rope/positions", hidden), torch.tensor
    return d.cases([((2, 2, 4, 8), t([[0, 1, 2, 3], [5, 6, 7, 8]]), 10000.0, F32),
                    ((2, 3, 5, 16), t([0, 3, 7, 12, 40]), 100.0, F32),
                    ((2, 1, 3, 8), t([[0.0, 2.5, 7.0], [100.0, 101.0, 102.0]]), 10000.0, F64),
                    ((1, 2, 6, 16), torch.arange(1500, 1506), 10000.0, BF16)] + ([
        ((1, 1, 4, 2), torch.arange(4), 10000.0, F32),
        ((3, 2, 7, 64), torch.arange(7)[None] * 5 + t([[0], [2], [30]]), 10000.0, F32),
        ((2, 1, 9, 32), t([0.0, 0.5, 1.25, 2.0, 7.5, 10.0, 11.0, 30.25, 31.0]), 10000.0, F32),
        ((2, 3, 6, 32), (torch.rand(2, 6, generator=d.gen, dtype=F64) * 900).sort().values, 500.0, F64),
        ((2, 4, 16, 64), torch.arange(16)[None] + t([[0], [3000]]), 10000.0, BF16)] if hidden else []), drawn, 2)


def _rope_tol(dtype: torch.dtype) -> tuple[float, float] | None:
    """bfloat16: cos and sin are rounded to 8 bits before they multiply x, and the products again: the reference
    answer is off by up to 1.2 times bfloat16's own tolerance on these cases (measured over 30 grading seeds)."""
    return (4e-2, 2e-2) if dtype == BF16 else None


def check_apply_rope(apply_rope, hidden: bool = False) -> None:
    d = draw("apply_rope", hidden)
    for shape, positions, base, dtype in _rope_cases(hidden):
        _check_rope_case(apply_rope, d.randn(*shape).to(dtype), positions, base)
    # The property RoPE exists for: the score of q at m and k at n depends only on m - n.
    q, k = d.randn(1, 1, 1, 16).expand(1, 1, 3, 16), d.randn(1, 1, 1, 16).expand(1, 1, 3, 16)
    m, n = torch.tensor([5, 2, 9]), torch.tensor([1, 2, 14])
    scores = lambda s: (call(apply_rope, q, m + s, 10000.0) * call(apply_rope, k, n + s, 10000.0)).sum(-1)  # noqa: E731
    at_zero = scores(0).detach()
    for shift in (3, 17):
        compare(scores(shift), at_zero, f"the scores after shifting both positions by {shift}", "a RoPE score must "
                "depend only on m - n: rotate q and k by position * theta_j, the same theta_j for both.")


def _check_rope_case(apply_rope, x_before: torch.Tensor, positions: torch.Tensor, base: float) -> None:
    shape, dtype, x = tuple(x_before.shape), x_before.dtype, x_before.clone()
    got = call(apply_rope, x, positions.clone(), base)
    label = (f"apply_rope on x of shape {shape} ({dtype}), {_show(positions, 'positions')}"
             + (f" (shape {tuple(positions.shape)}, one row per sequence)" if positions.dim() == 2 else "")
             + f", base={base:g}")
    expect(torch.equal(x, x_before), "apply_rope changed its input x in place.", "return a new tensor.")
    _tensor_of(got, shape, dtype, label, "return the result in x's dtype: compute the angles in float32 (float64 for "
               "float64 x), then cast cos and sin, or the result, to x.dtype.")
    want, zero = _rope_b64(x_before, positions, base), positions == 0
    fallback = (f"for {_show(positions, 'positions')} and base={base:g}: rotate pair j (entries j and j + d_head/2) of "
                "position t by positions[..., t] * theta_j: x * cos + rotate_half(x) * sin, with cos and sin of shape "
                "(T, d_head) for positions (T,) and (B, 1, T, d_head) for positions (B, T).")
    moved = lambda got: positions.dim() == 1 and not matches(got[..., zero, :], x_before[..., zero, :])  # noqa: E731
    compare(got, want.to(dtype), label, fallback, tol=_rope_tol(dtype), variants=_rope_variants(x_before, positions,
                                                                                               base, want) + [
        (when(lambda got: bool(zero.any()) and moved(got)),
         composed("at position 0 every angle is 0 and the rotation is the identity. {fallback}", fallback=fallback)),
        (when(lambda got: dtype != BF16 and not matches(got.norm(dim=-1), x_before.norm(dim=-1), (1e-4, 1e-4))),
         composed("both members of a pair must be rotated by the same angle with cos and sin of that angle. {fallback}",
                  fallback=fallback))])


def _rope_variants(x: torch.Tensor, positions: torch.Tensor, base: float, want: torch.Tensor) -> list[tuple[Any, str]]:
    """What common bugs give for x (B, H, T, d_head) at positions (T,) or (B, T), and their hints."""
    (B, H, _, d), dtype, p = x.shape, x.dtype, positions.double().flatten()
    rope = lambda at=positions, **kw: _rope_b64(x, at, base, **kw).to(dtype)  # noqa: E731
    moved = p[p.to(BF16).double() != p]                                         # positions bfloat16 cannot store
    example = f" ({int(moved[0])} becomes {int(moved[0].to(BF16))})" if moved.numel() and moved[0] % 1 == 0 else ""
    return [
        _float32_only(want, dtype, "for float64 x, compute the frequencies and angles in float64 (rope_frequencies("
                      "..., dtype=x.dtype)), not in float32."),
        (when(lambda got: dtype == BF16 and matches(got, want, (8.0, 0.0)) and not matches(got, want, (0.2, 0.0))),
         f"the angles were computed in bfloat16: with 8 bits of precision it cannot store every position above "
         f"256{example}, and the angles are off by radians. Compute the positions, positions * theta, cos and sin in "
         "float32 (float64 for float64 x), then cast cos and sin, or the result, to x.dtype."),
        (lambda: rope(heads_as_batch=True) if positions.dim() == 2 and B == H else None,
         f"positions has one row per sequence, shape {tuple(positions.shape)} = (B, T), and here B = H = {B}: the "
         "angles (B, T, d_head) were broadcast against x (B, H, T, d_head) from the right, so row b rotated head b of "
         "every sequence. Insert the head axis: angles of shape (B, 1, T, d_head)."),
        (lambda: rope(pairing="interleaved"), "this is the interleaved pairing (2j with 2j + 1); apply_rope uses the "
         "half-split pairing: entry j pairs with entry j + d_head/2, as rotate_half does."),
        (lambda: rope(pairing="mixed"), "the two RoPE pairings are mixed: rotate_half pairs j with j + d_head/2, so "
         "both halves need the same angles, torch.cat((angles, angles), dim=-1); repeat_interleave(2) is the layout "
         "of the interleaved pairing."),
        (lambda: rope(sign=-1.0), "every pair turns the wrong way (by -m * theta_j): the rotated pair is (a cos - b "
         "sin, a sin + b cos); for rotate_half that means cat(-x2, x1)."),
        (lambda: rope(freqs=base ** (-torch.arange(d // 2, dtype=torch.float64) / d)),
         "the exponent of theta_j is 2j/d_head, not j/d_head."),
        (lambda: rope(positions + 1), "the positions were shifted by one: use the given positions as they are."),
        (lambda: rope(positions.double().trunc()) if bool((p % 1 != 0).any()) else None,
         f"the positions here are fractional ({_show(positions, 'positions')}) and the answer rounded them to "
         "integers: keep them as floats (positions.float()), not .long() or .int(); interpolated positions are "
         "fractional."),
        _base_ignored(lambda b: _rope_b64(x, positions, b).to(dtype), base),
    ]


# ----------------------------------------------------------------------------- exercise 6

def _conversion_order(n_heads: int, n_kv_heads: int, d_head: int, kind: str = "right") -> torch.Tensor:
    """Row order of the fused (q, k, v) weight after the conversion (and what common bugs give)."""
    half = d_head // 2
    to_interleaved = torch.stack((torch.arange(half), torch.arange(half) + half), dim=-1).flatten()   # [0, h, 1, ...]
    to_half = torch.cat((torch.arange(0, d_head, 2), torch.arange(1, d_head, 2)))                      # [0, 2, .., 1]
    per_head = to_half if kind == "opposite" else to_interleaved
    rows_q, rows_kv = n_heads * d_head, n_kv_heads * d_head

    def across(rows: int) -> torch.Tensor:                   # pairs (r, r + rows/2) across a whole block
        return torch.stack((torch.arange(rows // 2), torch.arange(rows // 2) + rows // 2), dim=-1).flatten()

    q = across(rows_q) if kind == "whole_block" else (torch.arange(n_heads)[:, None] * d_head + per_head).flatten()
    k = rows_q + (across(rows_kv) if kind == "whole_block" else
                  (torch.arange(n_kv_heads)[:, None] * d_head + per_head).flatten())
    v = rows_q + rows_kv + (torch.arange(n_kv_heads)[:, None] * d_head + per_head).flatten()
    blocks = [q, torch.arange(rows_q, rows_q + rows_kv) if kind == "k_untouched" else k,
              v if kind == "v_permuted" else torch.arange(rows_q + rows_kv, rows_q + 2 * rows_kv)]
    if kind == "q_and_k_as_one_head":                    # q and k rows converted together, as one head
        blocks[:2] = [across(rows_q + rows_kv)]
    return torch.cat(blocks)


def _conversion_variants(w: torch.Tensor, n_heads: int, n_kv_heads: int, d_head: int) -> list[tuple[Any, str]]:
    order = lambda kind: w[_conversion_order(n_heads, n_kv_heads, d_head, kind)]  # noqa: E731
    return [
        (w, "nothing was reordered: the q and k rows of every head must move (new row 2j is old row j)."),
        (lambda: order("opposite"),
         "that is the opposite conversion (interleaved to half-split, [0, 2, 4, ..., 1, 3, ...]): here the weight "
         "is half-split, and its pair (j, j + d_head/2) must move to rows (2j, 2j + 1): new order [0, d_head/2, 1, "
         "d_head/2 + 1, ...] within each head."),
        (lambda: order("v_permuted"), "the v rows were reordered too: values are never rotated, so their rows stay as "
         "they are; convert only the q and k blocks."),
        (lambda: order("k_untouched"), f"the k rows ({n_kv_heads} head{'s' if n_kv_heads > 1 else ''}, after the "
         f"{n_heads * d_head} q rows) were left as they are: keys are rotated as well, so their rows need the same "
         "conversion."),
        (lambda: order("whole_block") if n_heads > 1 else None,
         "the rows were reordered across each whole block, mixing the heads: reorder within each head's d_head rows."),
        (lambda: order("q_and_k_as_one_head"),
         f"the q and k rows ({n_heads * d_head} + {n_kv_heads * d_head}) were converted together, as if they "
         f"were one head of {(n_heads + n_kv_heads) * d_head} rows: that pairs rows of different heads, and "
         "of q with k. Each of the n_heads query heads and n_kv_heads key heads has its own d_head rows and "
         "its own pairs (j, j + d_head/2): convert the q block and the k block separately, head by head."),
    ]


def check_qkv_half_split_to_interleaved(qkv_half_split_to_interleaved, hidden: bool = False) -> None:
    """Configs: (n_heads, n_kv_heads, d_head, trailing shape: (d_model,) for a weight, () for a bias, dtype)."""
    def drawn(d: Draw) -> tuple:
        n_kv = d.rng.randrange(1, 5)
        return n_kv * d.rng.randrange(1, 5), n_kv, 2 * d.rng.randrange(1, 17), (d.rng.randrange(2, 33),), \
            d.rng.choice([F32, BF16])

    # Multi-head first: an answer that works there and raises on grouped-query weights (n_kv_heads < n_heads)
    # most likely took the key and value blocks to have n_heads heads each.
    d = draw("qkv_half_split_to_interleaved", hidden)
    for n_heads, n_kv_heads, d_head, trailing, dtype in d.cases(
            [(2, 2, 4, (), F32), (4, 2, 8, (12,), F32)] + ([(8, 1, 16, (24,), F32), (6, 3, 6, (10,), BF16),
                                                           (3, 3, 10, (), F64), (1, 1, 32, (32,), F16)] if hidden
                                                          else []),
            drawn, 2):
        before = d.randn((n_heads + 2 * n_kv_heads) * d_head, *trailing).to(dtype)
        w = before.clone()
        label = (f"qkv_half_split_to_interleaved({'weight' if trailing else 'bias'} of shape {tuple(w.shape)} "
                 f"({dtype}), n_heads={n_heads}, n_kv_heads={n_kv_heads})")
        rows = w.shape[0]       # an error here after the multi-head case passed: d_head taken as rows // (3 * n_heads)
        got = _call_explained(qkv_half_split_to_interleaved, w, n_heads, n_kv_heads, name=label, explain=lambda err:
                              None if n_kv_heads == n_heads else f"the multi-head case passed and this grouped-query "
                              f"weight (n_kv_heads={n_kv_heads} < n_heads={n_heads}) raised. Its {rows} rows are "
                              f"(n_heads + 2 * n_kv_heads) * d_head = {n_heads + 2 * n_kv_heads} * {d_head}, so d_head "
                              f"= rows // (n_heads + 2 * n_kv_heads) = {d_head}. d_head computed as if the key and "
                              f"value blocks had n_heads heads too, rows // (3 * n_heads) = {rows // (3 * n_heads)}, "
                              "cuts the blocks at the wrong rows.")
        expect(torch.equal(w, before), "qkv_half_split_to_interleaved changed the tensor it was given.",
               "return a new tensor; do not edit the weight in place.")
        _tensor_of(got, tuple(w.shape), dtype, label,
                   "reordering rows never changes the dtype: index or reshape the tensor itself.")
        compare(got, before[_conversion_order(n_heads, n_kv_heads, d_head)], f"{label} put the rows in the wrong order",
                f"for n_heads={n_heads}, n_kv_heads={n_kv_heads} (d_head={d_head}): the rows are q ({n_heads} heads), "
                f"then k ({n_kv_heads} heads), then v ({n_kv_heads} heads); within each q and k head the new row "
                "order is [0, d_head/2, 1, d_head/2 + 1, ...]; v stays as it is.",
                variants=_conversion_variants(before, n_heads, n_kv_heads, d_head))


# ----------------------------------------------------------------------------- exercise 7

def check_alibi_slopes(alibi_slopes, hidden: bool = False) -> None:
    hand = {8: [2.0 ** -h for h in range(1, 9)], 4: [2.0 ** -h for h in (2, 4, 6, 8)],
            6: [2.0 ** -h for h in (2, 4, 6, 8, 1, 3)]}
    counts = draw("alibi_slopes", hidden).cases([8, 4, 6] + ([1, 2, 3, 5, 7, 12, 16, 20, 24, 32, 40, 64, 96] if hidden
                                                             else []), lambda d: d.rng.randrange(1, 129), 3)
    for n in counts:
        got, label, closest = call(alibi_slopes, n), f"alibi_slopes({n})", 2 ** math.floor(math.log2(n))
        h, lower, upper = torch.arange(1, n + 1, dtype=F64), _alibi_slopes_oracle(closest), _alibi_slopes_oracle(
            2 * closest)
        expect(isinstance(got, torch.Tensor), f"{label} should return a tensor, got {type(got).__name__}.",
               "return torch.tensor(slopes) (float32).")
        expect(got.is_floating_point(), f"{label} has dtype {got.dtype}; slopes are fractions.",
               "compute the slopes in floating point: 2.0 ** (-8.0 * h / n).")
        expect(got.shape == (n,) or n == closest, f"{label} returned shape {tuple(got.shape)}, expected ({n},).",
               f"for {n} heads take all slopes of the closest lower power of two, {closest}, then only the first "
               f"{n - closest} of the every-other slopes of the next power of two ([0::2][:n - closest]).")
        expect_tensor(got, (n,), label)
        compare(got, torch.tensor(hand.get(n) or _alibi_slopes_oracle(n)), label,
                f"for n = {n} heads ({'a power of two' if n == closest else 'not a power of two'}): for a power of "
                "two n the slopes are 2^(-8h/n), h = 1 .. n; otherwise the slopes of the closest lower power of two "
                "followed by every other slope ([0::2]) of twice that, as many as are missing.",
                variants=[
                    ((2.0 ** (-8.0 * h / n)).float(), f"{n} is not a power of two, so the formula 2^(-8h/n) does not "
                     f"apply directly: take the slopes of the closest lower power of two ({closest}), then every other "
                     f"slope of the next one ({2 * closest}), starting with the first ([0::2]), until there are {n}."),
                    ((2.0 ** (-8.0 * (h - 1) / n)).float(), "h runs from 1 to n: the first slope is 2^(-8/n), not 2^0 "
                     "= 1."),
                    (torch.tensor(lower + upper[1::2][: n - closest]), f"take every other slope of {2 * closest} heads "
                     f"starting with the first ([0::2]): these are the ones not already in the {closest}-head list."),
                    (torch.tensor(upper[0::2][: n - closest] + lower), f"the {closest} slopes of the lower power of "
                     "two come first, then the extra ones.")])


def _alibi_oracle(slopes: torch.Tensor, q_len: int, k_len: int, ignore_offset: bool = False, sign: float = -1.0,
                  mask: bool = True) -> torch.Tensor:
    """bias[h, i, j] = -m_h (p_i - j) for j <= p_i, -inf after; p_i = k_len - q_len + i (float64)."""
    p = torch.arange(q_len, dtype=torch.float64) + (0 if ignore_offset else k_len - q_len)   # (q_len,)
    j = torch.arange(k_len, dtype=torch.float64)
    distance = p[:, None] - j[None, :]                                                        # (q_len, k_len)
    bias = sign * slopes.double()[:, None, None] * distance                                    # (n_heads, q_len, k_len)
    return bias.masked_fill(distance < 0, float("-inf")) if mask else bias


def _alibi_bias_variants(slopes: torch.Tensor, q_len: int, k_len: int, where: str) -> list[tuple[Any, str]]:
    offset, dtype = k_len - q_len, slopes.dtype
    bias = lambda s=slopes, **kw: _alibi_oracle(s, q_len, k_len, **kw).to(dtype)  # noqa: E731
    return [
        (lambda: bias(ignore_offset=True) if offset else None,
         f"the queries were placed at positions 0 .. {q_len - 1}, but they are the last q_len of the k_len positions "
         f"({where}): query i is at position k_len - q_len + i, and the causal mask is aligned to the bottom right."),
        (lambda: bias(sign=1.0),
         "the bias must be a penalty: -m_h * (distance), zero for the query's own position and negative for "
         "earlier keys (mind the minus sign)."),
        (lambda: bias(mask=False) if q_len > 1 or offset == 0 else None,
         f"the keys after each query were not masked ({where}): set bias[h, i, j] = -inf where j is after the "
         "query's position, so that softmax gives them no weight."),
        (lambda: bias().clamp(min=-1e9),
         "masked entries must be exactly -inf: a large finite value such as -1e9 overflows in float16 and is "
         "not a mask in every dtype; use float('-inf')."),
        (lambda: bias().clamp(min=torch.finfo(dtype).min),
         "masked entries must be exactly -inf, not the dtype's most negative finite number."),
        (lambda: bias(torch.ones_like(slopes)), "multiply the distance by the slope of each head: slopes[:, None, "
         "None] * distance."),
    ]


def check_alibi_bias(alibi_bias, hidden: bool = False) -> None:
    def drawn(d: Draw) -> tuple:
        k_len = d.rng.randrange(2, 40)
        return torch.tensor(_alibi_slopes_oracle(d.rng.randrange(1, 17)), dtype=d.rng.choice([F32, F64])), \
            d.rng.randrange(1, k_len + 1), k_len

    d, hand = draw("alibi_bias", hidden), torch.tensor([[[-1.0, -0.5, 0.0, float("-inf")], [-1.5, -1.0, -0.5, 0.0]]])
    cases = d.cases([(torch.tensor([0.5]), 2, 4), (torch.tensor(_alibi_slopes_oracle(4)), 5, 5)] + (
        [(d.uniform(0.1, 1.1, 3), 1, 9), (torch.tensor(_alibi_slopes_oracle(12), dtype=F64), 4, 17),
         (d.uniform(0, 1, 5), 1, 1), (d.uniform(0, 1, 2, dtype=F64), 6, 6)] if hidden else []), drawn, 2)
    for k, (before, q_len, k_len) in enumerate(cases):
        slopes, n = before.clone(), before.shape[0]
        got = call(alibi_bias, slopes, q_len, k_len)
        label = f"alibi_bias(slopes of {n} head{'s' if n != 1 else ''} ({before.dtype}), q_len={q_len}, k_len={k_len})"
        expect(torch.equal(slopes, before), "alibi_bias changed the slopes it was given.", "do not edit them in place.")
        _tensor_of(got, (n, q_len, k_len), before.dtype, label, "create the positions with slopes' dtype and "
                   "device, so that the bias follows them.")
        want = hand if k == 0 else _alibi_oracle(before, q_len, k_len).to(before.dtype)   # the first by hand
        if matches(got, want):
            continue
        where = f"here the {q_len} queries are at positions {k_len - q_len} .. {k_len - 1} of {k_len} keys"
        hint = diagnose(got, _alibi_bias_variants(before, q_len, k_len, where),
                        f"for {n} slope{'s' if n != 1 else ''}, q_len={q_len}, k_len={k_len} ({where}): bias[h, i, j] "
                        "= -slopes[h] * (p_i - j) for j <= p_i and -inf for j > p_i, with p_i = k_len - q_len + i.")
        # The entry named: masked in one and not the other, else the worst (compare's would show a matching -inf).
        bad = (got.isneginf() != want.isneginf()) | (~want.isneginf() & ~torch.isclose(
            got.double(), want.double().nan_to_num(neginf=0.0), atol=1e-6))
        at = tuple(int(v) for v in bad.nonzero()[0])
        fail(f"{label}: entry {list(at)} is {got[at].item():.6g}, expected {want[at].item():.6g}.", hint)


# ----------------------------------------------------------------------------- exercise 8

def _by_parts64(d_head: int, base: float, scale: float, train_len: int, alpha: float, beta: float,
                kind: str = "right") -> torch.Tensor:
    theta = _freqs64(d_head, base)
    turns = {"no_two_pi": train_len * theta, "inverted_ratio": 2 * math.pi / (theta * train_len)}.get(
        kind, train_len * theta / (2 * math.pi))                        # turns made within train_len, not rounded
    turns = turns.floor() if kind == "floor" else turns.round() if kind == "round" else turns
    ramp = (turns - alpha) / (beta - alpha)
    ramp = ramp if kind == "no_clamp" else ramp.clamp(0.0, 1.0)
    slow = theta * scale if kind == "times_scale" else theta / scale
    return (1 - ramp) * theta + ramp * slow if kind == "reversed" else ramp * theta + (1 - ramp) * slow


def _by_parts_variants(case: tuple, dtype: torch.dtype, where: str) -> list[tuple[Any, str]]:
    d_head, base, scale, train_len, alpha, beta = case
    parts = lambda kind, *args: _by_parts64(*(args or case), kind).to(dtype)  # noqa: E731
    rounded = ("r_j was rounded {} to a whole number: the number of turns is not rounded. r_j = train_len * theta_j "
               "/ (2 pi) is a real number (a pair that makes 10.2 turns has r_j = 10.2), so the ramp grows smoothly "
               "between alpha and beta instead of in steps.")
    return [
        (lambda: parts("reversed"), f"the ramp is reversed ({where}): the fast pairs (many turns, ramp 1) keep "
         "theta_j, and the slow pairs (few turns, ramp 0) are interpolated, theta_j / scale."),
        (lambda: parts("no_two_pi"), "r_j counts turns of 2 pi radians: train_len * theta_j / (2 pi), the positions "
         "divided by the wavelength 2 pi / theta_j; without the 2 pi it counts radians."),
        (lambda: parts("floor"), rounded.format("down")),
        (lambda: parts("round"), rounded.format("off")),
        (lambda: parts("inverted_ratio"), "r_j = train_len / wavelength_j (turns made in training), not wavelength_j "
         "/ train_len."),
        (lambda: parts("no_clamp"), f"clamp the ramp to [0, 1] ({where}): outside the ramp, pairs are either kept or "
         "interpolated, never extrapolated beyond."),
        (lambda: parts("times_scale"), "interpolating slows a pair down: theta_j / scale, not theta_j * scale."),
        (lambda: parts("right", d_head, base, scale, train_len, 1.0, 32.0) if (alpha, beta) != (1.0, 32.0) else None,
         f"this case uses alpha={alpha:g}, beta={beta:g}, and the answer matches the defaults 1 and 32: use "
         "the arguments."),
        _base_ignored(lambda b: parts("right", d_head, b, scale, train_len, alpha, beta), base),
    ]


def check_ntk_by_parts_frequencies(ntk_by_parts_frequencies, hidden: bool = False) -> None:
    def drawn(d: Draw) -> tuple:
        return (2 * d.rng.randrange(4, 129), _draw_base(d.rng), round(d.rng.uniform(1.5, 32.0), 2),
                d.rng.choice([256, 1024, 2048, 4096, 8192]), 1.0, float(d.rng.choice([8, 16, 32, 64])),
                d.rng.choice([None, F64]))

    for *case, asked in draw("ntk_by_parts_frequencies", hidden).cases(
            [(64, 10000.0, 4.0, 2048, 1.0, 32.0, None), (16, 100.0, 2.0, 64, 1.0, 8.0, None)]
            + ([(128, 500000.0, 8.0, 8192, 1.0, 32.0, None), (32, 10000.0, 1.0, 512, 1.0, 32.0, None),
                (64, 10000.0, 16.0, 4096, 2.0, 16.0, F64)] if hidden else []), drawn, 2):
        d_head, base, scale, train_len, alpha, beta = case
        kwargs = ({} if (alpha, beta) == (1.0, 32.0) else {"alpha": alpha, "beta": beta}) | (
            {} if asked is None else {"dtype": asked})
        got, dtype = call(ntk_by_parts_frequencies, d_head, base, scale, train_len, **kwargs), asked or F32
        label = (f"ntk_by_parts_frequencies({d_head}, base={base:g}, scale={scale:g}, train_len={train_len}"
                 + "".join(f", {k}={v if not isinstance(v, float) else f'{v:g}'}" for k, v in kwargs.items()) + ")")
        _tensor_of(got, (d_head // 2,), dtype, label, "create the result with the dtype argument (float32 by default).")
        turns = train_len * _freqs64(d_head, base) / (2 * math.pi)
        where = (f"here {int((turns >= beta).sum())} pair(s) turn at least beta={beta:g} times within {train_len} "
                 f"positions, {int((turns <= alpha).sum())} at most alpha={alpha:g} times")
        want, relative = _by_parts64(*case), (0.0, TOLERANCE[dtype][1])     # see FLOAT32_BAND_RELATIVE
        compare(got, want.to(dtype), label, f"for d_head={d_head}, base={base:g}, scale={scale:g}, train_len="
                f"{train_len} ({where}): r_j = train_len * theta_j / (2 pi), ramp = clamp((r_j - alpha) / (beta - "
                "alpha), 0, 1), new theta_j = ramp * theta_j + (1 - ramp) * theta_j / scale.", tol=relative,
                variants=[_float32_only(want, dtype, "the float64 frequencies were computed in float32: compute "
                                        "theta_j, the turns and the ramp in dtype.", FLOAT32_BAND_RELATIVE)]
                + _by_parts_variants(tuple(case), dtype, where))


# ----------------------------------------------------------------------------- exercise 9

REACH_SLOPE, REACH_THRESHOLD = 1 / 8, 0.01     # the case the notebook measures


def reach_answer(slope: float, threshold: float) -> int:
    """The first whole distance d with e^(-slope d) < threshold: d > ln(1/threshold) / slope."""
    return math.floor(math.log(1 / threshold) / slope) + 1


def _reach_oracle(slopes: torch.Tensor, threshold: float, n_keys: int, ratio: bool = True, shift: int = 0,
                  no_key: int = -1, strict: bool = True) -> torch.Tensor:
    d = torch.arange(n_keys, dtype=torch.float64)
    weights = torch.softmax(-slopes.double()[:, None] * d, dim=-1)             # (n_heads, n_keys)
    bound = threshold * (weights[:, :1] if ratio else 1.0)
    below = weights < bound if strict else weights <= bound
    return torch.where(below.any(dim=-1), below.double().argmax(dim=-1).long() + shift, torch.tensor(no_key))


def _reach_judge(config: tuple, value: Any) -> None:
    slope, threshold = config
    exact, want = math.log(1 / threshold) / slope, reach_answer(slope, threshold)
    case = f"slope {slope:.4g}, {threshold:.4g} of the weight at d = 0"
    judge_prediction(
        "predicted_reach", value, want, unit_hint="return your prediction as a number: the distance d.",
        asked=f"the distance asked for ({case})", exact=0.0, close=0.99,
        close_hint=f"e^(-m d) falls below {threshold:.4g} at d = {exact:.2f} here, but keys sit at whole distances d = "
        "0, 1, 2, ... (a distance is a whole number of tokens): the answer is the first whole distance past that point.",
        near=0.5,
        guesses=[(want - 1, "that rounds down: at that distance the weight is still above the threshold; the question asks "
                            "for the first distance at which it is below.")] + [
            (value_of(x), hint) for x, hint in (
                (math.log10(1 / threshold) / slope, "use the natural logarithm: weights come from exp, so e^(-m d) < "
                                                    "threshold means d > ln(1 / threshold) / m."),
                (math.log(1 / threshold) * slope, "the slope multiplies the distance: e^(-m d) < threshold means d > "
                                                  "ln(1 / threshold) / m, a division by m."),
                (1 / (threshold * slope), "the weight falls exponentially with distance, not as 1/d: the ratio of the "
                                          "weights at distance d and 0 is e^(-m d)."))
            for value_of in (lambda x: x, lambda x: math.floor(x) + 1)],
        fallback="with equal content scores, the softmax weights of two keys differ by the factor e^(bias "
        "difference): the key at distance d has e^(-m d) times the weight of distance 0. Solve e^(-m d) < threshold "
        "for the smallest whole d.")


def _reach_configs(hidden: bool) -> list[tuple[float, float]]:
    """(slope, threshold): the notebook's case and one more; hidden, drawn ones that no cell of the notebook
    measures (any slope, a threshold other than 1%), away from a tie (ln(1/threshold) / slope near a whole d)."""
    def drawn(d: Draw) -> tuple[float, float]:
        while True:
            slope, threshold = round(2 ** d.rng.uniform(-9, 1), 6), round(10 ** d.rng.uniform(-5, -0.3), 6)
            x = math.log(1 / threshold) / slope
            if abs(x - round(x)) > 1e-3 and abs(threshold - REACH_THRESHOLD) > 1e-3:
                return slope, threshold
    return draw("predicted_reach", hidden).cases([(REACH_SLOPE, REACH_THRESHOLD), (0.5, 0.05)], drawn, 4)


def _check_prediction(predicted_reach, hidden: bool = False) -> None:
    judge_configured("predicted_reach", predicted_reach, _reach_configs(hidden), reach_answer, _reach_judge,
                     shown=lambda c: f"slope={c[0]:.6g}, threshold={c[1]:.6g}")


def _reach_variants(slopes: torch.Tensor, threshold: float, n_keys: int, got: torch.Tensor,
                    want: torch.Tensor) -> list[tuple[Any, str]]:
    none, given = want == -1, set(got.long()[want == -1].tolist())
    heads = none.nonzero().flatten().tolist()
    why = ("argmax of a row with no True is 0, the same answer as a first key at distance 0: tell the two apart "
           "with .any(dim=-1)" if given == {0} else "n_keys is no distance; -1 says that there is none"
           if given == {n_keys} else "-1 says that there is no such distance")
    return [
        # Before the "last one above" slip: at a tie (threshold 1) both give d = 0, and the tie is what differs.
        (_reach_oracle(slopes, threshold, n_keys, strict=False),
         f"below means strictly below: a key whose weight equals {threshold:.4g} times the weight at d = 0 is not "
         "below it (compare with <, not <=)."),
        (when(lambda got: bool(none.any()) and matches(got.long()[~none], want[~none])),
         f"the heads with a key below the threshold are right; for head{'s' if len(heads) > 1 else ''} "
         f"{', '.join(map(str, heads))} no key of these {n_keys} is below it, and such a head must give -1: "
         f"return -1 for them ({why})."),
        (_reach_oracle(slopes, threshold, n_keys, ratio=False),
         f"the threshold is relative ({threshold:.4g} of the weight at distance 0), not an absolute weight: "
         "compare weights[d] with threshold * weights[0]."),
        (_reach_oracle(slopes, threshold, n_keys, shift=1),
         "distances start at 0 (the query's own position): the key at distance d is index d of the weights, "
         "so the answer is that index, not index + 1."),
        (_reach_oracle(slopes, threshold, n_keys, shift=-1),
         "the answer is the first distance whose weight is below the threshold, not the last one above it."),
        (_reach_oracle(slopes, threshold, n_keys, no_key=n_keys),
         f"no key of these {n_keys} is below the threshold for some heads: return -1 for them, not n_keys."),
    ]


def check_alibi_reach(predicted_reach, alibi_reach, hidden: bool = False) -> None:
    def drawn(d: Draw) -> tuple[torch.Tensor, float, int]:
        while True:   # no case near a tie: the weight ratio must not sit at the threshold
            slopes = (torch.rand(d.rng.randrange(1, 9), generator=d.gen, dtype=F64) * 0.9 + 0.02).to(
                d.rng.choice([F32, F64]))
            threshold = 10 ** d.rng.uniform(-4, -0.5)
            at = math.log(1 / threshold) / slopes.double()
            if bool(((at - at.round()).abs() > 1e-3).all()):
                return slopes, threshold, d.rng.randrange(20, 600)
    def tie(d: Draw) -> tuple[torch.Tensor, float, int]:
        # "Below" is strict. A weight lands exactly on threshold * weight[0] for threshold < 1 only by the
        # rounding of one computation (softmax's exp and sum, float32 or float64), which an answer need not
        # share; threshold 1 gives the one tie every computation reaches: weight[0] == 1 * weight[0], so d = 0
        # is below with <= and not with < (where the answer is d = 1, for any slope well above 0).
        slopes = torch.rand(d.rng.randrange(1, 7), generator=d.gen, dtype=F64) * 0.9 + 0.02
        return slopes.to(d.rng.choice([F32, F64])), 1.0, d.rng.randrange(2, 80)

    _check_prediction(predicted_reach, hidden)
    d = draw("alibi_reach", hidden)
    for before, threshold, n_keys in d.cases(
            [(torch.tensor([0.5, 0.125, 1 / 256]), 0.01, 2048), (torch.tensor([1.0, 0.01]), 0.2, 50)]
            + ([(torch.tensor(_alibi_slopes_oracle(6), dtype=F64), 0.05, 300),
                (torch.tensor([1 / 256, 1 / 64]), 0.001, 1000), tie(d.sub("tie"))] if hidden else []), drawn, 2):
        slopes, n = before.clone(), before.shape[0]
        got = call(alibi_reach, slopes, threshold, n_keys)
        label = (f"alibi_reach(slopes of {n} head{'s' if n > 1 else ''} ({before.dtype}), threshold={threshold:.4g}, "
                 f"n_keys={n_keys})")
        expect(torch.equal(slopes, before), "alibi_reach changed the slopes it was given.", "do not edit them.")
        expect_tensor(got, (n,), label)
        expect(not got.is_floating_point() and not got.is_complex(),
               f"{label} returned dtype {got.dtype}, expected an integer tensor of distances.",
               "return the distances as a LongTensor (argmax or nonzero give integer indices).")
        want = _reach_oracle(before, threshold, n_keys)
        compare(got.long(), want, label,
                f"for threshold={threshold:.4g} and n_keys={n_keys}: softmax over the distances d = 0 .. n_keys - 1 "
                "of the scores -m_h * d (equal content scores), then for each head the first d with weight[d] < "
                "threshold * weight[0], or -1.", variants=_reach_variants(before, threshold, n_keys, got, want))


# ----------------------------------------------------------------------------- exercise 10

def _cached_attention64(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_past: torch.Tensor,
                        v_past: torch.Tensor, base: float, kind: str = "right") -> tuple[torch.Tensor, torch.Tensor]:
    """The oracle: RoPE at absolute positions, keys of the past rotated once, causal mask aligned bottom-right.

    k_past holds the past keys before rotation. Returns (out, all rotated keys), in float64."""
    T_past, T_new, d = k_past.shape[-2], q.shape[-2], q.shape[-1]
    new_pos = torch.arange(T_new) + (0 if kind in ("no_offset", "no_offset_both") else T_past)
    q_rot = _rope_b64(q, torch.arange(T_new) if kind == "query_from_zero" else new_pos, base)
    past = _rope_b64(k_past, torch.arange(T_past), base)
    past = _rope_b64(past, torch.arange(T_past), base) if kind == "cache_rotated_twice" else past
    keys = torch.cat((past, _rope_b64(k, new_pos, base)), dim=-2)                 # (B, H, T_all, d)
    values = torch.cat((v_past.double(), _rope_b64(v, new_pos, base) if kind == "values_rotated" else v.double()), -2)
    scores = q_rot @ keys.transpose(-2, -1) / (1 if kind == "no_scale" else math.sqrt(d))
    key_at = torch.arange(T_past + T_new)[None, :]
    query_at = torch.arange(T_new)[:, None] + (0 if kind in ("top_left", "no_offset_both") else T_past)
    if kind != "no_mask":   # hides_diagonal: >= for >
        scores = scores.masked_fill(key_at >= query_at if kind == "hides_diagonal" else key_at > query_at, -math.inf)
    return scores.softmax(dim=-1) @ values, keys


def check_rope_attention_step(rope_attention_step, apply_rope=None, hidden: bool = False) -> None:
    """apply_rope, when given, is the exercise 5 answer it calls. A failing case is blamed on it when it fails
    exercise 5's tests and rotates this case's inputs wrongly; when it rotates them right, the cause is here."""
    def drawn(d: Draw) -> tuple:
        return (d.rng.randrange(1, 3), d.rng.randrange(1, 4), d.rng.randrange(0, 30), d.rng.randrange(1, 6),
                2 * d.rng.randrange(2, 17), _draw_base(d.rng), d.rng.choice([F32, F64]))
    earlier = earlier_answers("rope_attention_step", ("calls your apply_rope", 5, apply_rope,
                                                      lambda answer: check_apply_rope(answer, hidden=hidden)))
    d = draw("rope_attention_step", hidden)
    # Cases: (B, n_heads, T_past, T_new, d_head, base, dtype).
    for case in d.cases([(1, 2, 5, 1, 8, 10000.0, F32), (2, 2, 3, 4, 16, 100.0, F32)]
                        + ([(2, 1, 0, 3, 8, 10000.0, F32), (1, 3, 37, 2, 32, 10000.0, F64),
                            (2, 2, 12, 1, 16, 500.0, F32)] if hidden else []), drawn, 2):
        with earlier_first(*earlier):
            try:
                _check_attention_case(rope_attention_step, case, d)
            except CheckFailed:
                if apply_rope is not None and _rotates_right(apply_rope, case, d.sub("apply_rope")):
                    with own_fault():      # its apply_rope rotates this case right: the cause is in this exercise
                        raise
                raise


def _rotates_right(apply_rope, case: tuple, d: Draw) -> bool:
    """Whether apply_rope passes exercise 5's check on tensors of this case: the new tokens at T_past .. T_past +
    T_new - 1, and every position up to the last, in this dtype."""
    B, H, T_past, T_new, width, base, dtype = case
    try:
        for T in (T_new, T_past + T_new):
            x = d.randn(B, H, T, width, dtype=F64).to(dtype)
            _check_rope_case(apply_rope, x, torch.arange(T_past + T_new - T, T_past + T_new), base)
    except (CheckFailed, NotImplementedError):
        return False
    return True


def _check_attention_case(rope_attention_step, case: tuple, d: Draw) -> None:
    B, H, T_past, T_new, width, base, dtype = case
    q, k, v, k_past, v_cache = (d.randn(B, H, T, width, dtype=F64).to(dtype) for T in [T_new] * 3 + [T_past] * 2)
    k_cache = _rope_b64(k_past, torch.arange(T_past), base).to(dtype)              # rotated when cached
    inputs = [t.clone() for t in (q, k, v, k_cache, v_cache)]
    got = call(rope_attention_step, *inputs, base)
    label = (f"rope_attention_step with {T_new} new token{'s' if T_new > 1 else ''} after a cache of {T_past} "
             f"(B={B}, n_heads={H}, d_head={width}, base={base:g}, {dtype})")
    expect(all(torch.equal(a, b) for a, b in zip(inputs, (q, k, v, k_cache, v_cache))), f"{label} changed one of its "
           "inputs in place.", "build new tensors (torch.cat makes the new cache); do not write into q, k, v or the "
           "cache.")
    expect(isinstance(got, (tuple, list)) and len(got) == 3,
           f"{label} returned {type(got).__name__}, expected a tuple (out, k_cache, v_cache).",
           "return three tensors: the attention output and the two grown caches.")
    out, new_k, new_v = got
    expect_tensor(out, (B, H, T_new, width), f"the output of {label}")
    expect_tensor(new_k, (B, H, T_past + T_new, width), f"the new k_cache of {label}")
    expect_tensor(new_v, (B, H, T_past + T_new, width), f"the new v_cache of {label}")
    expect(out.dtype == dtype and new_k.dtype == dtype, f"{label} returned dtype {out.dtype}, expected {dtype}.",
           "keep the dtype of q: create every new tensor with q's dtype and device.")
    want_out, want_keys = _cached_attention64(q, k, v, k_past, v_cache, base)
    keys_ok = matches(new_k, want_keys.to(dtype))
    cache_ok = keys_ok and matches(new_v, torch.cat((v_cache, v), -2))
    if cache_ok and matches(out, want_out.to(dtype)):
        return
    hint = diagnose(out, _attention_variants(case, (q, k, v, k_past, v_cache), cache_ok, new_k, want_out, keys_ok),
                    f"with T_past={T_past}, T_new={T_new}: rotate q and k by positions T_past .. T_past + T_new - 1, "
                    "append k and v to the caches, scores = q @ keys^T / sqrt(d_head) with key j masked (-inf) for "
                    "query t when j > T_past + t, softmax over the keys, times the values.")
    what = "the output" if cache_ok else "the new k_cache" if not keys_ok else "the new v_cache"
    fail(f"{label}: {what} is not what attention over the whole sequence, with RoPE at absolute positions, gives.",
         hint)


def _attention_variants(case: tuple, tensors: tuple, cache_ok: bool, new_k: torch.Tensor, want_out: torch.Tensor,
                        keys_ok: bool) -> list[tuple[Any, str]]:
    """What common bugs give for the output of one cached step; a bug that changes what is cached can explain a
    wrong cache, the others cannot."""
    _, _, T_past, T_new, _, base, dtype = case
    q, k, v, k_past, v_cache = tensors
    k_cache = _rope_b64(k_past, torch.arange(T_past), base).to(dtype)

    def bug(kind: str, changes_cache: bool, applies: bool = True) -> Callable:
        return lambda: (_cached_attention64(q, k, v, k_past, v_cache, base, kind)[0].to(dtype)
                        if applies and changes_cache != cache_ok else None)

    new = "position 0" if T_new == 1 else f"positions 0 .. {T_new - 1}"
    return [
        (bug("no_offset_both", True, T_past > 0), f"the new tokens were treated as {new}, for the rotation and for the "
         f"mask, but they come after {T_past} cached ones: rotate new token t by its absolute position T_past + t, "
         "and let it see the keys up to that position."),
        (bug("no_offset", True, T_past > 0), f"the new tokens were rotated as positions 0 .. {T_new - 1}, but they "
         f"come after {T_past} cached ones: rotate new token t by its absolute position T_past + t."),
        # New keys appended as they came (the cache rotated at attention time instead): not the form of the cache.
        (when(lambda out: not keys_ok and matches(new_k, torch.cat((k_cache, k), dim=-2))),
         "the returned k_cache holds the new keys unrotated. The cache it was given holds keys already rotated at "
         "their own positions, and the next step will use the returned one as it is: it must hold the new keys "
         "rotated at T_past + t, in the same form as the cached ones. Rotate the new keys once, append them, and "
         "never rotate the cache again (rotating it at attention time rotates the cached keys twice)."),
        (bug("query_from_zero", False, T_past > 0),
         f"the new keys and the mask are right, but the queries were rotated as {new}: a query is rotated at its "
         f"own absolute position, T_past + t (here {_span(T_past, T_new)}), like "
         "the key of the same token; otherwise its scores measure the distance from the wrong place."),
        (bug("cache_rotated_twice", True, T_past > 0), "the cached keys were rotated again: the cache holds keys "
         "already rotated at their own positions; rotate only the new keys, then append them."),
        (bug("values_rotated", True), "the values were rotated: RoPE rotates only queries and keys."),
        (bug("top_left", False, T_past > 0),
         f"the causal mask is aligned to the top left: new query t is at position {T_past} + t and sees every cached "
         "key and the new keys up to itself (a bottom-right mask; is_causal=True in scaled_dot_product_attention "
         "aligns it to the top left when q_len < k_len)."),
        (bug("hides_diagonal", False), "the mask hides the diagonal: query t must see its own key (j = T_past + t), so "
         "mask key j only when j > T_past + t (>, not >=). A query with no earlier key then sees nothing at all, and "
         "its softmax is NaN." if T_past == 0 else "the mask hides the diagonal: query t must see its own key "
         "(j = T_past + t), so mask key j only when j > T_past + t (>, not >=)."),
        (bug("no_mask", False, T_new > 1), "the new queries saw later new tokens: mask key j for query t when j > "
         "T_past + t."),
        (bug("no_scale", False), "divide the scores by sqrt(d_head) before the softmax."),
        (when(lambda out: not cache_ok), "the new cache must be cat((k_cache, apply_rope(k, positions)), dim=-2) with "
         "positions T_past .. T_past + T_new - 1, and cat((v_cache, v), dim=-2)."),
        (when(lambda out: dtype == F64 and matches(out, want_out, FLOAT32_BAND)),
         "right to float32 accuracy only: for float64 inputs compute everything in float64 (the scores, the mask "
         "and the angles of your apply_rope)."),
    ]


# ----------------------------------------------------------------------------- pasted into later chapters
PASTED_ROPE: Pasted = {"apply_rope": (2, 5, lambda tools, hidden: check_apply_rope(tools["apply_rope"], hidden=hidden))}
