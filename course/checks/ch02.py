"""Checks for chapter 2: positional encodings.

Oracles: float64 sinusoidal encodings written from the formula (powers, not logs) for any
positions, RoPE as multiplication by unit complex numbers (``torch.polar``) with per-sequence
positions, the ALiBi slope recipe of the reference implementation, a row permutation built
from index arithmetic, attention over the whole sequence (no cache) for the cached step, a
softmax over distances for ALiBi's reach, hand-derived values (row 0 of the table, the slopes
of 8 heads, a 2 x 4 cached ALiBi bias, the reach of a slope of 1/8) and properties: PE(pos + k)
from PE(pos) alone, rotations keep norms, a RoPE score depends only on m - n. Every exercise
runs on a second dtype (float64, or bfloat16/float16 where rounding is the point). For each
plausible bug the check computes what that bug would produce and, when the answer matches
it, names it and the input that shows it.
"""

from __future__ import annotations

import math
import random
from typing import Callable

import torch
import torch.nn as nn

from ._core import CheckFailed, call, expect, expect_close, expect_tensor, fail, generator, not_written
from ._hidden import hidden_generator, hidden_rng, hidden_seed

# ----------------------------------------------------------------------------- oracles

def _freqs64(d: int, base: float) -> torch.Tensor:
    """theta_i = base^(-2i/d) for i = 0 .. d/2 - 1, in float64."""
    return base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)


def _interleave(even: torch.Tensor, odd: torch.Tensor) -> torch.Tensor:
    """Columns even[..., i] -> 2i and odd[..., i] -> 2i + 1."""
    return torch.stack((even, odd), dim=-1).flatten(-2)


def _sin_table64(seq_len: int, d_model: int, base: float, start: int = 0, freqs: torch.Tensor | None = None,
                 swap: bool = False, halves: bool = False) -> torch.Tensor:
    """The sinusoidal table (and, through the options, what common bugs produce)."""
    pos = torch.arange(start, start + seq_len, dtype=torch.float64)[:, None]   # (seq_len, 1)
    f = _freqs64(d_model, base) if freqs is None else freqs                    # (d_model/2,)
    s, c = torch.sin(pos * f), torch.cos(pos * f)                              # (seq_len, d_model/2)
    if swap:
        s, c = c, s
    return torch.cat((s, c), dim=-1) if halves else _interleave(s, c)


def _alibi_slopes_oracle(n: int) -> list[float]:
    """The recipe of the ALiBi reference code, in Python floats."""
    def power_of_two(n: int) -> list[float]:
        start = 2.0 ** (-8.0 / n)
        return [start ** (h + 1) for h in range(n)]
    if math.log2(n).is_integer():
        return power_of_two(n)
    closest = 2 ** math.floor(math.log2(n))
    return power_of_two(closest) + _alibi_slopes_oracle(2 * closest)[0::2][: n - closest]


def _matches(got: torch.Tensor, want: torch.Tensor, atol: float = 1e-5, rtol: float = 1e-5,
             equal_nan: bool = False) -> bool:
    got = got.detach().double()
    return got.shape == want.shape and bool(torch.allclose(got, want, atol=atol, rtol=rtol, equal_nan=equal_nan))


def _diagnose(got: torch.Tensor, variants: list[tuple[Callable[[], torch.Tensor], str]], default: str,
              atol: float = 1e-5) -> str:
    """The hint of the first buggy variant the answer reproduces, else the default hint."""
    for make, hint in variants:
        try:
            want = make()
            if want is not None and _matches(got, want, atol):
                return hint
        except (RuntimeError, ValueError, IndexError):
            continue
    return default


def _call_explained(fn: Callable, *args, name: str, explain: Callable[[BaseException], str | None]):
    """Call the student's function (name describes the call and its inputs); when it raises, explain(err) may name
    the likely cause (else the generic hint)."""
    try:
        return fn(*args)
    except NotImplementedError as err:
        raise not_written(err, getattr(fn, "__name__", name))
    except CheckFailed:
        raise
    except Exception as err:
        hint = explain(err) or ("read the traceback above this message; the inputs were valid for the signature in "
                             "the exercise.")
        raise CheckFailed(f"{name} raised {type(err).__name__}: {err}\nLikely mistake: {hint}") from err


def _show_positions(positions: torch.Tensor) -> str:
    """The positions of a failing case in a few words: a range, a short list, or a summary."""
    p = positions.detach().double().flatten()
    n = p.numel()
    fractional = bool((p != p.round()).any())
    if n and not fractional and (n == 1 or bool((p[1:] - p[:-1] == p[1] - p[0]).all())) and n > 6:
        step = int(p[1] - p[0])
        return f"positions {int(p[0])}, {int(p[1])}, ..., {int(p[-1])}" + (f" (step {step})" if step != 1 else "")
    if n <= 8:
        shown = [int(v) if v == round(v) else round(v, 3) for v in p.tolist()]
        return f"positions {shown}" + (" (fractional)" if fractional else "")
    return (f"{n} {'fractional ' if fractional else ''}positions from {p.min().item():.4g} to "
            f"{p.max().item():.4g}")


def _base_ignored(make: Callable[[float], torch.Tensor], base: float) -> list[tuple[Callable, str]]:
    """A variant for answers that use the default base 10000 instead of the one given."""
    if base == 10000.0:
        return []
    return [(lambda: make(10000.0),
             f"this case uses base={base:g}, and the answer matches base 10000: use the base argument, "
             "not a hard-coded 10000.")]


def _draw_base(rng: random.Random) -> float:
    """A RoPE or sinusoid base, log-uniform between 10 and 10^6, rounded to 3 significant digits."""
    return float(f"{10 ** rng.uniform(1, 6):.3g}")


# ----------------------------------------------------------------------------- exercise 1

def _attention_fn(d: int, seed: int, causal: bool = False, positions: bool = False) -> Callable:
    """Single-head self-attention with fixed random weights: (B, T, d) -> (B, T, d)."""
    g = generator(seed)
    w_q, w_k, w_v = (torch.randn(d, d, generator=g) / math.sqrt(d) for _ in range(3))

    def attention(x: torch.Tensor) -> torch.Tensor:
        if positions:
            x = x + _sin_table64(x.shape[1], d, 10000.0).to(x.dtype)        # (B, T, d)
        q, k, v = x @ w_q.to(x.dtype), x @ w_k.to(x.dtype), x @ w_v.to(x.dtype)   # (B, T, d)
        scores = q @ k.transpose(-2, -1) / math.sqrt(d)                      # (B, T, T)
        if causal:
            T = x.shape[1]
            scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
        return scores.softmax(dim=-1) @ v                                    # (B, T, d)
    return attention


def _mlp_fn(d: int, d_out: int, seed: int) -> Callable:
    g = generator(seed)
    w1, w2 = torch.randn(d, 2 * d, generator=g), torch.randn(2 * d, d_out, generator=g)
    return lambda x: torch.relu(x @ w1) @ w2                                 # (B, T, d_out)


def _mean_fn(x: torch.Tensor) -> torch.Tensor:
    return x.mean(dim=1, keepdim=True).expand_as(x) + 0.0                    # same row at every position


def _weighted_mean_fn(x: torch.Tensor) -> torch.Tensor:
    """Order-blind (invariant) but not equivariant: the mean, weighted by the position index."""
    weight = torch.arange(1, x.shape[1] + 1, dtype=x.dtype)[None, :, None]   # (1, T, 1)
    return x.mean(dim=1, keepdim=True) * weight


def _leaky_fn(inner: Callable, size: float) -> Callable:
    """inner(x) plus a tiny position-dependent term of the given size."""
    def fn(x: torch.Tensor) -> torch.Tensor:
        out = inner(x)
        ramp = torch.arange(x.shape[1], dtype=out.dtype)[None, :, None]     # (1, T, 1)
        return out + size * ramp
    return fn


def _ex1_cases(hidden: bool) -> list[tuple[str, Callable, torch.Tensor, torch.Tensor, float, bool]]:
    g = generator(61) if not hidden else hidden_generator("is_permutation_equivariant")
    d = 8
    x = torch.randn(2, 5, d, generator=g)
    perm = torch.tensor([2, 0, 3, 1, 4])                                     # not its own inverse
    attn = _attention_fn(d, 62)
    cases = [
        ("self-attention without positions", attn, x, perm, 1e-5, True),
        ("self-attention with sinusoidal positions added", _attention_fn(d, 62, positions=True), x, perm, 1e-5, False),
        ("causal self-attention", _attention_fn(d, 62, causal=True), x, perm, 1e-5, False),
        ("self-attention plus a position-dependent term of size 1e-7 (rounding-sized)",
         _leaky_fn(attn, 1e-7), x, perm, 1e-5, True),
        ("a per-token MLP", _mlp_fn(d, d, 63), x, perm, 1e-5, True),
        ("the sequence mean times the position index", _weighted_mean_fn, x, perm, 1e-5, False),
        ("the sequence mean copied to every position", _mean_fn, x, perm, 1e-5, True),
    ]
    if hidden:
        rng = hidden_rng("is_permutation_equivariant")
        # At most 10 positions: a term of size 1e-4 then moves an entry by at most 9e-4 < atol = 1e-3.
        T, d = rng.randrange(5, 11), 2 * rng.randrange(2, 7)
        x7 = torch.randn(rng.randrange(1, 5), T, d, generator=g)
        perm7, perm8 = _non_identity_perm(T, g), _non_identity_perm(T, g)
        seed = lambda: rng.randrange(2 ** 31)  # noqa: E731
        cases += [
            ("a per-token MLP with 3 outputs", _mlp_fn(d, 3, seed()), x7, perm7, 1e-5, True),
            ("the sequence mean times the position index", _weighted_mean_fn, x7, perm7, 1e-5, False),
            ("self-attention plus a position-dependent term of size 1e-3", _leaky_fn(_attention_fn(d, seed()), 1e-3),
             x7, perm7, 1e-5, False),
            ("self-attention plus a term of size 1e-4, with atol=1e-3", _leaky_fn(_attention_fn(d, seed()), 1e-4),
             x7, perm7, 1e-3, True),
            ("self-attention with positions, identity permutation", _attention_fn(d, seed(), positions=True),
             x7, torch.arange(T), 1e-5, True),
            ("causal self-attention, another permutation", _attention_fn(d, seed(), causal=True), x7,
             perm8, 1e-5, False),
            ("self-attention without positions, another permutation", _attention_fn(d, seed()), x7, perm8, 1e-5, True),
            ("self-attention without positions, in float64 with atol=1e-12", _attention_fn(d, seed()), x7.double(),
             perm7, 1e-12, True),
            ("self-attention plus a position-dependent term of size 1e-3, in float64",
             _leaky_fn(_attention_fn(d, seed()), 1e-3), x7.double(), perm8, 1e-12, False),
        ]
    return cases


def _non_identity_perm(T: int, g: torch.Generator) -> torch.Tensor:
    while True:
        perm = torch.randperm(T, generator=g)
        if not torch.equal(perm, torch.arange(T)):
            return perm


def _ex1_variants() -> list[tuple[Callable, str]]:
    def invariance(fn, x, perm, atol):
        return torch.allclose(fn(x[:, perm]), fn(x), atol=atol)

    def inverse(fn, x, perm, atol):
        return torch.allclose(fn(x[:, perm]), fn(x)[:, torch.argsort(perm)], atol=atol)

    def exact(fn, x, perm, atol):
        return torch.equal(fn(x[:, perm]), fn(x)[:, perm])

    def no_atol(fn, x, perm, atol):
        return torch.allclose(fn(x[:, perm]), fn(x)[:, perm])

    return [
        (invariance, "that tests invariance (the output does not change), not equivariance: the output of the "
                     "permuted input must equal the original output permuted the same way, fn(x)[:, perm]."),
        (inverse, "the output was permuted with the inverse permutation: x[:, perm] puts row perm[t] at t, so "
                  "compare with fn(x)[:, perm], the same indexing, not an argsort or a scatter."),
        (exact, "exact equality fails on rounding: summing in another order changes the last bits, so compare with "
                "torch.allclose(..., atol=atol), not torch.equal or ==."),
        (no_atol, "the atol argument was ignored: pass it on, torch.allclose(a, b, atol=atol)."),
    ]


def check_is_permutation_equivariant(is_permutation_equivariant, hidden: bool = False) -> None:
    cases = _ex1_cases(hidden)
    answers, wanted = [], []
    for name, fn, x, perm, atol, want in cases:
        x_before = x.clone()
        try:
            got = is_permutation_equivariant(fn, x, perm, atol=atol)
        except NotImplementedError as err:
            raise not_written(err, "is_permutation_equivariant")
        except (IndexError, RuntimeError) as err:
            raise CheckFailed(
                f"is_permutation_equivariant raised {type(err).__name__} on {name}: {err}\n"
                f"Likely mistake: perm reorders positions, which are dimension 1 of x (B, T, d_model): "
                f"permute with x[:, perm], not x[perm] (that reorders the batch).") from err
        except Exception as err:
            raise CheckFailed(f"is_permutation_equivariant raised {type(err).__name__}: {err}\n"
                              f"Likely mistake: read the traceback above this message.") from err
        expect(torch.equal(x, x_before), "is_permutation_equivariant changed the input x.",
               "build the permuted copy with x[:, perm]; do not edit x in place.")
        expect(isinstance(got, bool), f"is_permutation_equivariant returned {type(got).__name__}, expected a Python bool.",
               "return bool(torch.allclose(...)): a bool, not a tensor.")
        answers.append(got)
        wanted.append(want)
    if answers == wanted:
        return
    wrong = [c[0] for c, a, w in zip(cases, answers, wanted) if a != w]
    hint = "compare fn(x[:, perm]) with fn(x)[:, perm] using torch.allclose(..., atol=atol)."
    for variant, variant_hint in _ex1_variants():
        if [bool(variant(fn, x, perm, atol)) for _, fn, x, perm, atol, _ in cases] == answers:
            hint = variant_hint
            break
    else:
        if all(answers) or not any(answers):
            hint = f"the function returned {answers[0]} for every case: it must run fn on both inputs and compare."
    first = next(c for c, a, w in zip(cases, answers, wanted) if a != w)
    fail(f"is_permutation_equivariant answered {not first[5]} for {first[0]}, expected {first[5]} "
         f"({len(wrong)} of {len(cases)} cases wrong).", hint)


# ----------------------------------------------------------------------------- exercise 2

def _sinusoidal_variants(seq_len: int, d_model: int, base: float) -> list[tuple[Callable, str]]:
    half = torch.arange(d_model // 2, dtype=torch.float64)
    return [
        (lambda: _sin_table64(seq_len, d_model, base, swap=True),
         "sin and cos are swapped: even columns (0, 2, 4, ...) hold sin(pos * w_i), odd columns hold cos(pos * w_i); "
         "row 0 is [0, 1, 0, 1, ...]."),
        (lambda: _sin_table64(seq_len, d_model, base, start=1),
         "positions start at 0, not 1: use torch.arange(seq_len), so that row 0 is [0, 1, 0, 1, ...]."),
        (lambda: _sin_table64(seq_len, d_model, base, freqs=base ** (-half / d_model)),
         "the exponent of the frequencies is 2i/d_model (i = 0 .. d_model/2 - 1), not i/d_model: the column index "
         "2i comes from torch.arange(0, d_model, 2)."),
        (lambda: _sin_table64(seq_len, d_model, base, freqs=base ** (-half)),
         "the exponent of the frequencies is 2i/d_model, not i: w_i = base^(-2i/d_model) = "
         "exp(-2i * ln(base) / d_model)."),
        (lambda: _sin_table64(seq_len, d_model, base, freqs=base ** (torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)),
         "the frequencies must decrease with i: w_i = base^(-2i/d_model) (a minus sign in the exponent)."),
        (lambda: _sin_table64(seq_len, d_model, base, freqs=torch.exp(
            -torch.arange(0, d_model, 2, dtype=torch.float64) * math.log10(base) / d_model)),
         "use the natural logarithm, math.log(base), in exp(-2i * ln(base) / d_model); log10 gives other frequencies."),
        (lambda: _sin_table64(seq_len, d_model, base, halves=True),
         "interleave the columns: sin in even columns and cos in odd columns (pe[:, 0::2] and pe[:, 1::2]), "
         "not all sines followed by all cosines."),
    ]


# (atol, rtol) against the exact table: about one rounding step of the dtype (entries lie in [-1, 1]).
_TABLE_TOLERANCE = {torch.float32: (2e-5, 1e-5), torch.float64: (1e-12, 1e-12), torch.float16: (1e-3, 1e-3),
                    torch.bfloat16: (8e-3, 8e-3)}


def check_sinusoidal_table(sinusoidal_table, hidden: bool = False) -> None:
    cases = [(6, 8, 10000.0, torch.float32), (50, 16, 100.0, torch.float32), (12, 8, 1000.0, torch.float64),
             (100, 16, 10000.0, torch.float16)]
    if hidden:
        rng = hidden_rng("sinusoidal_table")
        cases += [(1, 4, 10000.0, torch.float32), (128, 512, 10000.0, torch.float32), (33, 10, 500.0, torch.float32),
                  (100, 64, 1e6, torch.float64), (7, 2, 10000.0, torch.float32), (300, 32, 1000.0, torch.float16),
                  (200, 24, 10000.0, torch.bfloat16)]
        cases += [(rng.randrange(1, 129), 2 * rng.randrange(1, 129), _draw_base(rng), dtype)
                  for dtype in (torch.float32, torch.float64, torch.float32)]
    for seq_len, d_model, base, dtype in cases:
        got = call(sinusoidal_table, seq_len, d_model, base, **({} if dtype == torch.float32 else {"dtype": dtype}))
        label = (f"sinusoidal_table({seq_len}, {d_model}, base={base:g}"
                 + ("" if dtype == torch.float32 else f", dtype={dtype}") + ")")
        expect_tensor(got, (seq_len, d_model), label)
        expect(got.dtype == dtype, f"{label} has dtype {got.dtype}, expected {dtype}.",
               "create the table with the dtype argument (float32 by default), not a fixed dtype.")
        want = _sin_table64(seq_len, d_model, base)
        atol, rtol = _TABLE_TOLERANCE[dtype]
        if _matches(got, want, atol=atol, rtol=rtol):
            continue
        err = (got.double() - want).abs().max().item()
        if dtype == torch.float64 and _matches(got, want, atol=2e-5):
            fail(f"{label} is right only to float32 accuracy (largest error {err:.1e}; float64 allows about 1e-15).",
                 "the float64 table was computed in float32 and then converted: compute the positions, the "
                 "frequencies and the angles in float64, then cast the finished table to dtype (.to(dtype)).")
        if dtype in (torch.float16, torch.bfloat16) and _matches(got, want, atol=0.3):
            fail(f"{label} is off by up to {err:.2g}: far more than {dtype} rounding (about {atol / 2:.0e}).",
                 f"the table was computed in {dtype}: with so few bits of mantissa the frequencies and the "
                 "angles pos * w_i are off by far more than the rounding of the final entries. Compute in float64 "
                 "(at least float32), then cast the finished table to dtype (.to(dtype)).")
        hint = _diagnose(got, _base_ignored(lambda b: _sin_table64(seq_len, d_model, b), base)
                         + _sinusoidal_variants(seq_len, d_model, base),
                         f"for seq_len={seq_len}, d_model={d_model}, base={base:g}: PE[pos, 2i] = sin(pos * w_i) "
                         "and PE[pos, 2i+1] = cos(pos * w_i) with w_i = exp(-2i * ln(base) / d_model), "
                         "pos = 0 .. seq_len - 1.", atol=2e-5)
        row0 = torch.tensor([0.0, 1.0] * (d_model // 2), dtype=torch.float64)
        if not _matches(got[0], row0, atol=1e-6):
            fail(f"{label}: row 0 (position 0) is {[round(v, 3) for v in got[0, :6].tolist()]}..., expected "
                 f"[0, 1, 0, 1, ...] (sin 0 = 0, cos 0 = 1).", hint)
        expect_close(got.double(), want, label, hint, atol=atol, rtol=rtol)


# ----------------------------------------------------------------------------- exercise 3

def _sin_enc64(positions: torch.Tensor, d_model: int, base: float, freqs: torch.Tensor | None = None,
               halves: bool = False) -> torch.Tensor:
    """Sinusoidal encodings of any positions (...,) -> (..., d_model), in float64."""
    f = _freqs64(d_model, base) if freqs is None else freqs
    angles = positions.double()[..., None] * f                                  # (..., d_model/2)
    s, c = angles.sin(), angles.cos()
    return torch.cat((s, c), dim=-1) if halves else _interleave(s, c)


def _shift_rot64(pe: torch.Tensor, k: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """Each (sin, cos) pair of pe rotated by k * freqs (what an answer with other frequencies does)."""
    pe = pe.double()
    b = k.double()[..., None, None] * freqs                                      # (..., 1, d_model/2)
    s, c = pe[..., 0::2], pe[..., 1::2]
    return _interleave(s * b.cos() + c * b.sin(), c * b.cos() - s * b.sin())


def _show_k(k: torch.Tensor) -> str:
    values = [int(v) if v == round(v) else round(v, 3) for v in k.double().flatten().tolist()]
    if k.dim() == 0:
        return f"k = {values[0]}"
    return f"k = {values}" if len(values) <= 6 else f"{len(values)} offsets k from {min(values)} to {max(values)}"


def _explain_shift_error(pe_shape: tuple[int, ...], k_shape: tuple[int, ...], err: BaseException) -> str | None:
    """When k with a single trailing axis cannot broadcast against pe's pairs, that is the likely error; on a 0-d k,
    an index error comes from indexing k as if it had a batch axis."""
    if not k_shape:
        if isinstance(err, IndexError) or "dimension 0" in str(err) or "0-d" in str(err):
            return (f"pe has shape {pe_shape} = (T, d_model), so k is 0-d (one offset, shape ()): k may be 0-d, "
                    "and k[:, None, None] (or k.shape[0]) assumes a batch axis that it does not have. Index with "
                    "k[..., None, None], which adds the two trailing axes to any number of leading ones.")
        return None
    pairs = pe_shape[:-1] + (pe_shape[-1] // 2,)                                 # (..., T, d_model/2)
    try:
        torch.broadcast_shapes(k_shape + (pe_shape[-1] // 2,), pairs)
        return None
    except RuntimeError:
        return (f"k holds one offset per sequence, shape {k_shape}, and pe's pairs are {pairs} = (..., T, "
                "d_model/2): with one trailing axis (k[..., None]) the angles are (..., d_model/2) and their "
                "sequence axis meets the T axis of pe. Give k two trailing axes, k[..., None, None], so that each "
                "offset reaches every position and every pair of its own sequence.")


def check_shift_encodings(shift_encodings, hidden: bool = False) -> None:
    """Cases: (start positions of each sequence (...,), T, d_model, k (...,), base, dtype)."""
    cases = [(torch.tensor([0.0, 7.0]), 5, 8, torch.tensor([3.0, -2.0]), 10000.0, torch.float32),
             (torch.tensor(4.0), 6, 6, torch.tensor(5.0), 100.0, torch.float32),
             (torch.tensor([3.0, 40.0]), 4, 8, torch.tensor([-6.0, 2.5]), 10000.0, torch.float64)]
    if hidden:
        g, rng = hidden_generator("shift_encodings"), hidden_rng("shift_encodings")
        cases += [
            (torch.tensor([[0.0, 3.0], [10.0, 2.0]]), 4, 16, torch.tensor([[1.5, -0.25], [-7.0, 12.0]]), 10000.0,
             torch.float32),
            (torch.tensor([20.0, 5.0, 0.0]), 3, 10, torch.tensor([-4.0, -1.0, -9.0]), 500.0, torch.float32),
            (torch.tensor([1000.0, 2500.0]), 7, 64, torch.tensor([-37.0, 41.5]), 10000.0, torch.float64),
        ]
        for dtype in (torch.float32, torch.float64):
            lead = tuple(rng.randrange(1, 4) for _ in range(rng.randrange(0, 3)))
            starts = torch.randint(0, 30, lead, generator=g).double()
            k = (torch.rand(lead, generator=g, dtype=torch.float64) * 40 - 20)
            if rng.random() < 0.5:
                k = k.round()
            cases.append((starts, rng.randrange(1, 9), 2 * rng.randrange(1, 33), k, _draw_base(rng), dtype))
    for starts, T, d_model, k, base, dtype in cases:
        positions = starts.double()[..., None] + torch.arange(T, dtype=torch.float64)      # (..., T)
        pe = _sin_enc64(positions, d_model, base).to(dtype)                                 # (..., T, d_model)
        k = k.to(dtype)
        pe_before, k_before = pe.clone(), k.clone()
        label = (f"shift_encodings(pe of shape {tuple(pe.shape)} ({dtype}), {_show_k(k)}, base={base:g})")
        got = _call_explained(shift_encodings, pe, k, base, name=label,
                              explain=lambda err: _explain_shift_error(tuple(pe.shape), tuple(k.shape), err))
        expect(torch.equal(pe, pe_before) and torch.equal(k, k_before), "shift_encodings changed its inputs in place.",
               "build new tensors; do not write into pe or k.")
        expect_tensor(got, tuple(pe.shape), label)
        expect(got.dtype == dtype, f"{label} returned dtype {got.dtype}, expected {dtype} (that of pe).",
               "create every new tensor with pe's dtype and device (the angles too).")
        shift = k.double()[..., None]                                                        # (..., 1)
        want = _sin_enc64(positions + shift, d_model, base)
        atol, rtol = (2e-5, 1e-5) if dtype == torch.float32 else (1e-10, 1e-10)
        if _matches(got, want, atol=atol, rtol=rtol):
            continue
        if dtype == torch.float64 and _matches(got, want, atol=1e-4):
            fail(f"{label} is right only to float32 accuracy (largest error "
                 f"{(got.double() - want).abs().max().item():.1e}).",
                 "these encodings are float64 and the answer computed the angles in float32: build the "
                 "frequencies and k * w_i in pe's dtype.")
        negative = bool((k < 0).any())
        variants = [
            (lambda: _sin_enc64(positions + shift.abs(), d_model, base) if negative and bool((k > 0).any()) else None,
             f"the sequences with k >= 0 are right, but those with a negative k ({_show_k(k)}) were shifted by +|k|: "
             "the rotation itself is right; keep the sign of k (b = k * w_i, no abs(k))."),
            (lambda: _sin_enc64(positions - shift, d_model, base),
             "every pair turns the wrong way (the result is PE(pos - k)): sin(a + b) = sin a cos b + cos a sin b and "
             "cos(a + b) = cos a cos b - sin a sin b."),
            (lambda: _sin_enc64(positions + shift.abs(), d_model, base) if negative else None,
             f"this case has a negative shift ({_show_k(k)}) and the answer shifts by +|k|: keep the sign of k "
             "(b = k * w_i, no abs(k))."),
            (lambda: _sin_enc64(positions + shift, d_model, base, halves=True),
             "the shifted pairs were written back as all sines then all cosines: pair i goes back to columns 2i "
             "(sin) and 2i + 1 (cos)."),
            (lambda: _shift_rot64(pe, k, base ** (-torch.arange(d_model // 2, dtype=torch.float64) / d_model)),
             "the exponent of w_i is 2i/d_model (i = 0 .. d_model/2 - 1), not i/d_model."),
            (lambda: _sin_enc64(positions + (k.double().reshape(-1)[None, :] if k.dim() == 1 and
                                             k.numel() == positions.shape[-1] else float("nan")), d_model, base),
             "k holds one offset per sequence (shape pe.shape[:-2]): it must broadcast over the T positions and "
             "the pairs, k[..., None, None]."),
        ] + _base_ignored(lambda b: _shift_rot64(pe, k, _freqs64(d_model, b)), base)
        hint = _diagnose(got, variants,
                         f"for {_show_k(k)} and base={base:g}: with (s, c) = (pe[..., 2i], pe[..., 2i+1]) and "
                         "b = k * w_i, the pair becomes (s cos b + c sin b, c cos b - s sin b), with k broadcast "
                         "over the positions of its sequence.", atol=atol if dtype == torch.float32 else 1e-5)
        expect_close(got.double(), want, label, hint, atol=atol, rtol=rtol)


# ----------------------------------------------------------------------------- exercise 4

def check_learned_positional_embedding(LearnedPositionalEmbedding, hidden: bool = False) -> None:
    configs = [(24, 64)]
    if hidden:
        rng = hidden_rng("learned_positional_embedding")
        configs += [(37, 48), (512, 16)]
        for _ in range(2):
            # At least 1500 entries, so that the std of the initial table is measured within 3%.
            max_len = rng.randrange(4, 300)
            configs.append((max_len, rng.randrange(max(4, -(-1500 // max_len)), max(5, -(-1500 // max_len)) + 64)))
    g = generator(71) if not hidden else hidden_generator("learned_positional_embedding")
    for i, (max_len, d_model) in enumerate(configs):
        torch.manual_seed(72 + max_len if not hidden else hidden_seed(f"learned_positional_embedding/init{i}"))
        module = call(LearnedPositionalEmbedding, max_len, d_model, name="LearnedPositionalEmbedding(...)")
        weight = getattr(module, "weight", None)
        expect(isinstance(weight, nn.Parameter),
               "LearnedPositionalEmbedding should have an attribute `weight` that is an nn.Parameter.",
               "wrap the table in nn.Parameter(...) so that it is trained.")
        expect(tuple(weight.shape) == (max_len, d_model),
               f"weight has shape {tuple(weight.shape)}, expected (max_len, d_model) = {(max_len, d_model)}.",
               "one row per position: (max_len, d_model).")
        std = weight.detach().std().item()
        expect(0.017 < std < 0.023, f"the initial weights have std {std:.4f}, expected about 0.02.",
               "initialise with nn.init.normal_(weight, mean=0.0, std=0.02) (torch.randn has std 1).")
        # (T, offset): from the start, an exact fit, a continuation after a cache of `offset` positions.
        runs = [(1, 0), (max_len // 2 + 1, 0), (max_len, 0), (3, max_len - 3), (2, max_len // 3 + 1)]
        for T, offset in runs:
            x = torch.randn(2, T, d_model, generator=g)
            x_before = x.clone()
            where = f"T={T}" + (f", offset={offset}" if offset else "")
            try:
                out = module(x, offset) if offset else module(x)
            except NotImplementedError:
                raise
            except ValueError as err:
                if offset + T == max_len:
                    fail(f"a sequence ending exactly at max_len ({where}, max_len={max_len}) raised ValueError: {err}",
                         "positions offset .. offset + T - 1 fit when offset + T <= max_len (the last row is "
                         "max_len - 1): raise only when offset + T > max_len.")
                raise CheckFailed(f"LearnedPositionalEmbedding with {where} (max_len {max_len}) raised ValueError: "
                                  f"{err}\nLikely mistake: raise only when offset + T > max_len.") from err
            except Exception as err:
                raise CheckFailed(f"LearnedPositionalEmbedding.forward with {where} raised {type(err).__name__}: "
                                  f"{err}\nLikely mistake: forward(x, offset=0) adds rows offset .. offset + T - 1; "
                                  f"read the traceback above this message.") from err
            expect(torch.equal(x, x_before), "forward changed its input x in place.",
                   "return x + the rows of the table; do not use += on x.")
            expect_tensor(out, (2, T, d_model), f"LearnedPositionalEmbedding output for {where}")
            want = x_before + weight.detach()[offset:offset + T]
            if not _matches(out, want.double()):
                hint = f"with {where}: position t of the input is absolute position offset + t: add weight[offset:offset + T]."
                if offset and _matches(out, (x_before + weight.detach()[:T]).double()):
                    hint = (f"the offset was ignored (here {where}): the input continues a sequence whose first "
                            f"{offset} positions came before, so add weight[offset:offset + T], not weight[:T].")
                elif _matches(out, weight.detach()[offset:offset + T].expand(2, T, d_model).double()):
                    hint = "forward must add the positions to x, not return the positions alone."
                fail(f"LearnedPositionalEmbedding output for {where} is wrong.", hint)
        # A second dtype: the module converted to float64 works on float64 inputs.
        if i == 0 or hidden:
            module64 = module.double()
            x64 = torch.randn(2, 3, d_model, generator=g, dtype=torch.float64)
            out64 = call(module64, x64, 1, name="LearnedPositionalEmbedding(...).double()")
            expect(isinstance(out64, torch.Tensor) and out64.dtype == torch.float64,
                   f"after .double(), a float64 input gave {getattr(out64, 'dtype', type(out64).__name__)}, "
                   "expected float64.",
                   "keep the table as a registered nn.Parameter (so .double() converts it) and add it as it is.")
            module.float()
        module.zero_grad()
        T, offset = max_len // 2, max_len // 4
        out = module(torch.randn(3, T, d_model, generator=g), offset)
        expect(isinstance(out, torch.Tensor) and out.requires_grad,
               "the output of LearnedPositionalEmbedding carries no gradient: weight cannot be trained.",
               "do not detach or copy the table in forward: add the slice of self.weight itself.")
        out.sum().backward()
        expect(weight.grad is not None, "no gradient reached weight.", "do not detach or copy the table in forward.")
        used = weight.grad.abs().sum(dim=1) > 0
        expect(used[offset:offset + T].all().item() and not used[:offset].any().item()
               and not used[offset + T:].any().item(),
               f"with T={T} and offset={offset}, the gradient should reach rows {offset} .. {offset + T - 1} of "
               "weight and no others.", "add weight[offset:offset + T], one row per absolute position.")
        # Too long: past max_len from position 0, and past max_len only because of the offset.
        for T, offset in [(max_len + 1 + (i % 3), 0), (max_len - 1, 2)]:
            try:
                module(torch.randn(1, T, d_model, generator=g), offset) if offset else \
                    module(torch.randn(1, T, d_model, generator=g))
            except NotImplementedError:
                raise
            except ValueError as err:
                message = str(err)
                expect(str(offset + T) in message and str(max_len) in message,
                       f"the ValueError for positions up to {offset + T - 1} (offset {offset}, T {T}) with max_len "
                       f"{max_len} says {message!r}: it should name both offset + T = {offset + T} and max_len.",
                       "name both numbers in the message, e.g. f'positions up to {offset + T} exceed max_len "
                       "{self.max_len}'.")
            except Exception as err:
                hint = ("check the length yourself before indexing and raise ValueError naming offset + T and "
                        "max_len.")
                if offset:
                    hint = (f"here T={T} fits on its own but offset + T = {offset + T} > max_len = {max_len}: the "
                            "length check must include the offset (offset + T > max_len), before indexing.")
                fail(f"a sequence needing positions up to {offset + T - 1} (T={T}, offset={offset}, max_len "
                     f"{max_len}) raised {type(err).__name__} ({str(err).splitlines()[0]}), not ValueError.", hint)
            else:
                hint = ("check the length yourself before indexing and raise ValueError naming both numbers "
                        "(slicing the table silently returns fewer rows).")
                if offset:
                    hint = (f"here T={T} fits on its own but offset + T = {offset + T} > max_len = {max_len}: the "
                            "length check must include the offset (offset + T > max_len).")
                fail(f"a sequence needing positions up to {offset + T - 1} (T={T}, offset={offset}, max_len "
                     f"{max_len}) did not raise ValueError.", hint)


# ----------------------------------------------------------------------------- exercise 5

def check_rope_frequencies(rope_frequencies, hidden: bool = False) -> None:
    cases = [(8, 10000.0, None), (64, 500.0, None)]
    if hidden:
        rng = hidden_rng("rope_frequencies")
        cases += [(2, 10000.0, None), (128, 1e6, torch.float64), (6, 10.0, None)]
        cases += [(2 * rng.randrange(1, 129), _draw_base(rng), dtype) for dtype in (None, torch.float64, None)]
    for d_head, base, dtype in cases:
        got = call(rope_frequencies, d_head, base, **({} if dtype is None else {"dtype": dtype}))
        dtype = dtype or torch.float32
        label = f"rope_frequencies({d_head}, base={base:g}" + (")" if dtype == torch.float32 else f", dtype={dtype})")
        expect_tensor(got, (d_head // 2,), label)
        expect(got.dtype == dtype, f"{label} has dtype {got.dtype}, expected {dtype}.",
               "create the frequencies with the dtype argument (float32 by default).")
        want = _freqs64(d_head, base)
        atol, rtol = (1e-7, 1e-5) if dtype == torch.float32 else (1e-15, 1e-12)
        if torch.allclose(got.double(), want, atol=atol, rtol=rtol):
            continue
        if dtype == torch.float64 and _matches(got, want, atol=1e-7):
            fail(f"{label} is right only to float32 accuracy.", "the float64 frequencies were computed in float32 "
                 "and converted: build torch.arange(0, d_head, 2, dtype=dtype) and compute in that dtype.")
        j = torch.arange(d_head // 2, dtype=torch.float64)
        hint = _diagnose(got, [
            (lambda: base ** (-j / d_head), "the exponent is 2j/d_head (j = 0 .. d_head/2 - 1), not j/d_head: "
                                            "use torch.arange(0, d_head, 2)."),
            (lambda: base ** (2 * j / d_head), "the frequencies must decrease: theta_j = base^(-2j/d_head)."),
        ] + _base_ignored(lambda b: _freqs64(d_head, b), base),
            f"for d_head={d_head}, base={base:g}: theta_j = base^(-2j/d_head) = exp(-2j * ln(base) / d_head), "
            "j = 0 .. d_head/2 - 1.", atol=1e-7)
        expect_close(got.double(), want, label, hint, atol=atol, rtol=rtol)


def check_rotate_half(rotate_half, hidden: bool = False) -> None:
    shapes = [(2, 3, 8), (4,)]
    if hidden:
        rng = hidden_rng("rotate_half")
        shapes += [(2, 2, 5, 16), (1, 2)]
        shapes += [(*(rng.randrange(1, 5) for _ in range(rng.randrange(0, 3))), 2 * rng.randrange(1, 17))
                   for _ in range(2)]
    g = generator(81) if not hidden else hidden_generator("rotate_half")
    for n, shape in enumerate(shapes):
        x = torch.randn(*shape, generator=g, dtype=torch.float64 if n % 2 else torch.float32)
        x_before = x.clone()
        got = call(rotate_half, x)
        expect(torch.equal(x, x_before), "rotate_half changed its input in place.", "build a new tensor with torch.cat.")
        expect_tensor(got, shape, f"rotate_half of shape {shape}")
        d = shape[-1]
        x1, x2 = x[..., : d // 2], x[..., d // 2:]
        want = torch.cat((-x2, x1), dim=-1).double()
        if _matches(got, want, atol=0):
            expect(got.dtype == x.dtype, f"rotate_half of a {x.dtype} tensor returned {got.dtype}.",
                   "keep the input's dtype: torch.cat of its own halves does.")
            continue
        hint = _diagnose(got, [
            (lambda: torch.cat((x2, -x1), dim=-1).double(),
             "the sign is on the wrong half: rotate_half returns cat(-x2, x1); with cat(x2, -x1) every pair turns "
             "the wrong way (by -angle)."),
            (lambda: torch.cat((x2, x1), dim=-1).double(), "one half must be negated: rotate_half returns cat(-x2, x1)."),
            (lambda: _interleave(-x[..., 1::2], x[..., 0::2]).double(),
             "rotate_half works on halves, not on neighbouring entries: x1 = x[..., :d/2], x2 = x[..., d/2:], "
             "return cat(-x2, x1)."),
        ], "split the last dimension into halves x1, x2 and return cat(-x2, x1).", atol=0)
        fail(f"rotate_half of shape {shape} gave the wrong values.", hint)


def _rope_b64(x: torch.Tensor, positions: torch.Tensor, base: float, pairing: str = "half", sign: float = 1.0,
              freqs: torch.Tensor | None = None, heads_as_batch: bool = False) -> torch.Tensor:
    """RoPE of x (B, H, T, d) with positions (T,) or (B, T), in float64 (complex multiplication).

    heads_as_batch: what broadcasting (B, T, d) angles against (B, H, T, d) does when B == H."""
    x = x.double()
    d = x.shape[-1]
    f = _freqs64(d, base) if freqs is None else freqs
    angles = sign * positions.double()[..., None] * f                          # (T, d/2) or (B, T, d/2)
    if angles.dim() == 3 and not heads_as_batch:
        angles = angles[:, None]                                                # (B, 1, T, d/2)
    rot = torch.polar(torch.ones_like(angles), angles)
    if pairing == "half":
        z = torch.complex(x[..., : d // 2], x[..., d // 2:]) * rot
        return torch.cat((z.real, z.imag), dim=-1)
    z = torch.complex(x[..., 0::2], x[..., 1::2]) * rot
    return _interleave(z.real, z.imag)


def _rope_mixed_b64(x: torch.Tensor, positions: torch.Tensor, base: float) -> torch.Tensor:
    """rotate_half with an interleaved (repeat_interleave) cos/sin table: the classic mix-up."""
    x = x.double()
    d = x.shape[-1]
    angles = (positions.double()[..., None] * _freqs64(d, base)).repeat_interleave(2, dim=-1)
    if angles.dim() == 3:
        angles = angles[:, None]
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return x * angles.cos() + torch.cat((-x2, x1), dim=-1) * angles.sin()


def _fractional(positions: torch.Tensor) -> bool:
    p = positions.double()
    return bool((p != p.round()).any())


def _rope_cases(hidden: bool) -> list[tuple[tuple[int, ...], torch.Tensor, float, torch.dtype]]:
    """(shape of x (B, H, T, d_head), positions (T,) or (B, T), base, dtype)."""
    cases = [((2, 2, 4, 8), torch.tensor([[0, 1, 2, 3], [5, 6, 7, 8]]), 10000.0, torch.float32),
             ((2, 3, 5, 16), torch.tensor([0, 3, 7, 12, 40]), 100.0, torch.float32),
             ((2, 1, 3, 8), torch.tensor([[0.0, 2.5, 7.0], [100.0, 101.0, 102.0]]), 10000.0, torch.float64),
             ((1, 2, 6, 16), torch.arange(1500, 1506), 10000.0, torch.bfloat16)]
    if hidden:
        g, rng = hidden_generator("apply_rope/positions"), hidden_rng("apply_rope")
        cases += [((1, 1, 4, 2), torch.arange(4), 10000.0, torch.float32),
                  ((3, 2, 7, 64), torch.arange(7)[None] * 5 + torch.tensor([[0], [2], [30]]), 10000.0, torch.float32),
                  ((2, 1, 9, 32), torch.tensor([0.0, 0.5, 1.25, 2.0, 7.5, 10.0, 11.0, 30.25, 31.0]), 10000.0,
                   torch.float32),
                  ((2, 3, 6, 32), (torch.rand(2, 6, generator=g, dtype=torch.float64) * 900).sort().values, 500.0,
                   torch.float64),
                  ((2, 4, 16, 64), torch.arange(16)[None] + torch.tensor([[0], [3000]]), 10000.0, torch.bfloat16)]
        for dtype in (torch.float32, torch.float64):
            # Positions up to 40 in float32, as above: float32 angles stay within the tolerance.
            B, H, T = rng.randrange(1, 4), rng.randrange(1, 4), rng.randrange(1, 13)
            shape = (B, H, T, 2 * rng.randrange(1, 33))
            if rng.random() < 0.5:
                positions = torch.arange(T)[None] * rng.randrange(1, 3) + torch.randint(0, 20, (B, 1), generator=g)
            else:
                positions = (torch.rand(T, generator=g) * 40).sort().values
            cases.append((shape, positions, _draw_base(rng), dtype))
    return cases


_TOLERANCE = {torch.float32: 2e-5, torch.float64: 1e-10, torch.bfloat16: 4e-2, torch.float16: 1e-2}


_RTOL = {torch.float32: 1e-5, torch.float64: 1e-10, torch.bfloat16: 2e-2, torch.float16: 2e-2}


def _rope_close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> bool:
    return got.shape == want.shape and bool(torch.allclose(got.detach().double(), want, atol=_TOLERANCE[dtype],
                                                           rtol=_RTOL[dtype]))


def check_apply_rope(apply_rope, hidden: bool = False) -> None:
    g = generator(91) if not hidden else hidden_generator("apply_rope")
    for shape, positions, base, dtype in _rope_cases(hidden):
        x = torch.randn(*shape, generator=g).to(dtype)
        x_before = x.clone()
        got = call(apply_rope, x, positions, base)
        label = (f"apply_rope on x of shape {shape} ({dtype}), {_show_positions(positions)}"
                 + (f" (shape {tuple(positions.shape)}, one row per sequence)" if positions.dim() == 2 else "")
                 + f", base={base:g}")
        expect(torch.equal(x, x_before), "apply_rope changed its input x in place.", "return a new tensor.")
        expect_tensor(got, shape, label)
        expect(got.dtype == dtype, f"{label} returned dtype {got.dtype}, expected {dtype} (that of x).",
               "return the result in x's dtype: compute the angles in float32 (float64 for float64 x), then cast "
               "cos and sin, or the result, to x.dtype.")
        want = _rope_b64(x, positions, base)
        if _rope_close(got, want, dtype):
            if dtype != torch.bfloat16:
                expect_close(got.double().norm(dim=-1), x.double().norm(dim=-1), f"the norms of {label}",
                             "a rotation keeps the length of every vector.", atol=1e-4)
            continue
        if dtype == torch.float64 and _matches(got, want, atol=1e-4):
            fail(f"{label} is right only to float32 accuracy (largest error "
                 f"{(got.double() - want).abs().max().item():.1e}).",
                 "for float64 x, compute the frequencies and angles in float64 (rope_frequencies(..., "
                 "dtype=x.dtype)), not in float32.")
        if dtype == torch.bfloat16 and _matches(got, want, atol=8.0):
            err = (got.double() - want).abs().max().item()
            if err > 0.2:
                p = positions.double().flatten()
                moved = p[p.to(torch.bfloat16).double() != p]
                example = (f" ({int(moved[0])} becomes {int(moved[0].to(torch.bfloat16))})"
                           if moved.numel() and moved[0] == moved[0].round() else "")
                fail(f"{label} is off by up to {err:.2f}: far more than bfloat16 rounding (about 0.02).",
                     f"the angles were computed in bfloat16: with 8 bits of precision it cannot store every position "
                     f"above 256{example}, and the angles are off by radians. Compute the positions, positions * "
                     "theta, cos and sin in float32 (float64 for float64 x), then cast cos and sin, or the result, "
                     "to x.dtype.")
        d = shape[-1]
        j = torch.arange(d // 2, dtype=torch.float64)
        B, H = shape[0], shape[1]
        hint = _diagnose(got, [
            (lambda: _rope_b64(x, positions, base, heads_as_batch=True) if positions.dim() == 2 and B == H else None,
             f"positions has one row per sequence, shape {tuple(positions.shape)} = (B, T), and here B = H = {B}: "
             "the angles (B, T, d_head) were broadcast against x (B, H, T, d_head) from the right, so row b "
             "rotated head b of every sequence. Insert the head axis: angles of shape (B, 1, T, d_head)."),
            (lambda: _rope_b64(x, positions, base, "interleaved"),
             "this is the interleaved pairing (2j with 2j + 1); apply_rope uses the half-split pairing: entry j pairs "
             "with entry j + d_head/2, as rotate_half does."),
            (lambda: _rope_mixed_b64(x, positions, base),
             "the two RoPE pairings are mixed: rotate_half pairs j with j + d_head/2, so both halves need the same "
             "angles, torch.cat((angles, angles), dim=-1); repeat_interleave(2) is the layout of the interleaved "
             "pairing."),
            (lambda: _rope_b64(x, positions, base, sign=-1.0),
             "every pair turns the wrong way (by -m * theta_j): the rotated pair is (a cos - b sin, a sin + b cos); "
             "for rotate_half that means cat(-x2, x1)."),
            (lambda: _rope_b64(x, positions, base, freqs=base ** (-j / d)),
             "the exponent of theta_j is 2j/d_head, not j/d_head."),
            (lambda: _rope_b64(x, positions + 1, base),
             "the positions were shifted by one: use the given positions as they are."),
            (lambda: _rope_b64(x, positions.double().trunc(), base) if _fractional(positions) else None,
             f"the positions here are fractional ({_show_positions(positions)}) and the answer rounded them to "
             "integers: keep them as floats (positions.float()), not .long() or .int(); interpolated positions "
             "are fractional."),
            (lambda: _rope_b64(x, positions, 10000.0) if base != 10000.0 else None,
             f"this case uses base={base:g}, and the answer matches base 10000: use the base argument, "
             "not a hard-coded 10000."),
        ], f"for {_show_positions(positions)} and base={base:g}: rotate pair j (entries j and j + d_head/2) of "
           "position t by positions[..., t] * theta_j: x * cos + rotate_half(x) * sin, with cos and sin of shape "
           "(T, d_head) for positions (T,) and (B, 1, T, d_head) for positions (B, T).",
            atol=max(_TOLERANCE[dtype], 2e-5))
        if hint.startswith("for "):
            zero = positions == 0
            if positions.dim() == 1 and zero.any() and not _matches(got[..., zero, :], x[..., zero, :].double(), 1e-6):
                fail(f"{label}: at position 0 the vectors changed.", "at position 0 every angle is 0 and the "
                     "rotation is the identity. " + hint)
            if dtype != torch.bfloat16 and not torch.allclose(got.double().norm(dim=-1), x.double().norm(dim=-1),
                                                              atol=1e-4, rtol=1e-4):
                fail(f"{label}: the vectors' norms changed; a rotation keeps them.",
                     "both members of a pair must be rotated by the same angle with cos and sin of that angle. "
                     + hint)
        expect_close(got.double(), want, label, hint, atol=_TOLERANCE[dtype], rtol=_RTOL[dtype])
    # The property RoPE exists for: the score of q at m and k at n depends only on m - n.
    d = 16
    q, k = torch.randn(1, 1, 1, d, generator=g), torch.randn(1, 1, 1, d, generator=g)
    for shift in (3, 17):
        m, n = torch.tensor([5, 2, 9]), torch.tensor([1, 2, 14])
        qs, ks = q.expand(1, 1, 3, d), k.expand(1, 1, 3, d)
        s0 = (call(apply_rope, qs, m, 10000.0) * call(apply_rope, ks, n, 10000.0)).sum(-1)
        s1 = (call(apply_rope, qs, m + shift, 10000.0) * call(apply_rope, ks, n + shift, 10000.0)).sum(-1)
        expect_close(s1, s0.detach(), f"the scores after shifting both positions by {shift}",
                     "a RoPE score must depend only on m - n: rotate q and k by position * theta_j, the same "
                     "theta_j for both.", atol=1e-4)


# ----------------------------------------------------------------------------- exercise 6

def _conversion_order(n_heads: int, n_kv_heads: int, d_head: int, kind: str = "right") -> torch.Tensor:
    """Row order of the fused (q, k, v) weight after the conversion (and what common bugs give)."""
    half = d_head // 2
    to_interleaved = torch.stack((torch.arange(half), torch.arange(half) + half), dim=-1).flatten()   # [0, h, 1, h+1, ...]
    to_half = torch.cat((torch.arange(0, d_head, 2), torch.arange(1, d_head, 2)))                      # [0, 2, ..., 1, 3, ...]
    per_head = to_half if kind == "opposite" else to_interleaved
    rows_q, rows_kv = n_heads * d_head, n_kv_heads * d_head
    blocks = []
    q = (torch.arange(n_heads)[:, None] * d_head + per_head).flatten()
    if kind == "whole_block":
        q = torch.stack((torch.arange(rows_q // 2), torch.arange(rows_q // 2) + rows_q // 2), dim=-1).flatten()
    blocks.append(q)
    k = rows_q + (torch.arange(n_kv_heads)[:, None] * d_head + per_head).flatten()
    if kind == "whole_block":
        k = rows_q + torch.stack((torch.arange(rows_kv // 2), torch.arange(rows_kv // 2) + rows_kv // 2), dim=-1).flatten()
    blocks.append(torch.arange(rows_q, rows_q + rows_kv) if kind == "k_untouched" else k)
    v = rows_q + rows_kv + (torch.arange(n_kv_heads)[:, None] * d_head + per_head).flatten()
    blocks.append(v if kind == "v_permuted" else torch.arange(rows_q + rows_kv, rows_q + 2 * rows_kv))
    if kind == "q_and_k_as_one_head":                    # q and k rows converted together, as one head
        rows_qk = rows_q + rows_kv
        blocks[:2] = [torch.stack((torch.arange(rows_qk // 2), torch.arange(rows_qk // 2) + rows_qk // 2),
                                  dim=-1).flatten()]
    return torch.cat(blocks)


def _gqa_rope_scores(w: torch.Tensor, x: torch.Tensor, n_heads: int, n_kv_heads: int, pairing: str) -> torch.Tensor:
    """Scores (n_heads, T, T) of a fused (q, k, v) weight with RoPE of the given pairing, keys shared by groups."""
    T = x.shape[0]
    d_head = w.shape[0] // (n_heads + 2 * n_kv_heads)
    w = w.double()
    q = (x.double() @ w[: n_heads * d_head].T).view(T, n_heads, d_head).transpose(0, 1)[None]
    k = (x.double() @ w[n_heads * d_head: (n_heads + n_kv_heads) * d_head].T).view(T, n_kv_heads, d_head)
    k = k.transpose(0, 1)[None].repeat_interleave(n_heads // n_kv_heads, dim=1)
    positions = torch.arange(T)
    return (_rope_b64(q, positions, 10000.0, pairing) @ _rope_b64(k, positions, 10000.0, pairing).transpose(-2, -1))[0]


def check_qkv_half_split_to_interleaved(qkv_half_split_to_interleaved, hidden: bool = False) -> None:
    """Configs: (n_heads, n_kv_heads, d_head, trailing shape: (d_model,) for a weight, () for a bias, dtype)."""
    # Multi-head first: an answer that works there and raises on grouped-query weights (n_kv_heads < n_heads)
    # most likely took the key and value blocks to have n_heads heads each.
    configs = [(2, 2, 4, (), torch.float32), (4, 2, 8, (12,), torch.float32)]
    if hidden:
        rng = hidden_rng("qkv_half_split_to_interleaved")
        configs += [(8, 1, 16, (24,), torch.float32), (6, 3, 6, (10,), torch.bfloat16), (3, 3, 10, (), torch.float64),
                    (1, 1, 32, (32,), torch.float16)]
        for dtype in (torch.float32, torch.bfloat16):
            n_kv = rng.randrange(1, 5)
            configs.append((n_kv * rng.randrange(1, 5), n_kv, 2 * rng.randrange(1, 17), (rng.randrange(2, 33),), dtype))
    g = generator(101) if not hidden else hidden_generator("qkv_half_split_to_interleaved")
    for n_heads, n_kv_heads, d_head, trailing, dtype in configs:
        rows = (n_heads + 2 * n_kv_heads) * d_head
        w = torch.randn(rows, *trailing, generator=g).to(dtype)
        before = w.clone()
        what = "bias" if not trailing else "weight"
        label = (f"qkv_half_split_to_interleaved({what} of shape {tuple(w.shape)} ({dtype}), n_heads={n_heads}, "
                 f"n_kv_heads={n_kv_heads})")
        got = _call_explained(
            qkv_half_split_to_interleaved, w, n_heads, n_kv_heads, name=label,
            explain=lambda err: None if n_kv_heads == n_heads else (
                f"the multi-head case passed and this grouped-query weight (n_kv_heads={n_kv_heads} < "
                f"n_heads={n_heads}) raised. Its {rows} rows are "
                f"(n_heads + 2 * n_kv_heads) * d_head = {n_heads + 2 * n_kv_heads} * {d_head}, so d_head = "
                f"rows // (n_heads + 2 * n_kv_heads) = {d_head}. d_head computed as if the key and value blocks had "
                f"n_heads heads too, rows // (3 * n_heads) = {rows // (3 * n_heads)}, cuts the blocks at the wrong "
                "rows."))
        expect(torch.equal(w, before), "qkv_half_split_to_interleaved changed the tensor it was given.",
               "return a new tensor; do not edit the weight in place.")
        expect_tensor(got, tuple(w.shape), label)
        expect(got.dtype == dtype, f"{label} returned dtype {got.dtype}, expected {dtype}.",
               "reordering rows never changes the dtype: index or reshape the tensor itself.")
        want = w[_conversion_order(n_heads, n_kv_heads, d_head)]
        if torch.equal(got, want):
            if trailing and dtype == torch.float32:
                x = torch.randn(5, trailing[0], generator=g)
                expect_close(_gqa_rope_scores(got, x, n_heads, n_kv_heads, "interleaved"),
                             _gqa_rope_scores(w, x, n_heads, n_kv_heads, "half"),
                             "interleaved scores with the converted weight",
                             "permute the rows of the q and k blocks, each head on its own.", atol=1e-8)
            continue
        hint = (f"for n_heads={n_heads}, n_kv_heads={n_kv_heads} (d_head={d_head}): the rows are q ({n_heads} heads), "
                f"then k ({n_kv_heads} heads), then v ({n_kv_heads} heads); within each q and k head the new row "
                "order is [0, d_head/2, 1, d_head/2 + 1, ...]; v stays as it is.")
        if torch.equal(got, w):
            hint = "nothing was reordered: the q and k rows of every head must move (new row 2j is old row j)."
        else:
            for kind, text in [
                ("opposite", "that is the opposite conversion (interleaved to half-split, [0, 2, 4, ..., 1, 3, ...]): "
                             "here the weight is half-split, and its pair (j, j + d_head/2) must move to rows "
                             "(2j, 2j + 1): new order [0, d_head/2, 1, d_head/2 + 1, ...] within each head."),
                ("v_permuted", "the v rows were reordered too: values are never rotated, so their rows stay as they "
                               "are; convert only the q and k blocks."),
                ("k_untouched", f"the k rows ({n_kv_heads} head{'s' if n_kv_heads > 1 else ''}, after the "
                                f"{n_heads * d_head} q rows) were left as they are: keys are rotated as well, so "
                                "their rows need the same conversion."),
                ("whole_block", "the rows were reordered across each whole block, mixing the heads: reorder within "
                                "each head's d_head rows."),
                ("q_and_k_as_one_head",
                 f"the q and k rows ({n_heads * d_head} + {n_kv_heads * d_head}) were converted together, as if they "
                 f"were one head of {(n_heads + n_kv_heads) * d_head} rows: that pairs rows of different heads, and "
                 "of q with k. Each of the n_heads query heads and n_kv_heads key heads has its own d_head rows and "
                 "its own pairs (j, j + d_head/2): convert the q block and the k block separately, head by head."),
            ]:
                if (n_heads > 1 or kind != "whole_block") and torch.equal(got, w[_conversion_order(n_heads, n_kv_heads,
                                                                                                  d_head, kind)]):
                    hint = text
                    break
        fail(f"{label} put the rows in the wrong order.", hint)


# ----------------------------------------------------------------------------- exercise 7

def check_alibi_slopes(alibi_slopes, hidden: bool = False) -> None:
    hand = {8: [2.0 ** -h for h in range(1, 9)],
            4: [2.0 ** -2, 2.0 ** -4, 2.0 ** -6, 2.0 ** -8],
            6: [2.0 ** -2, 2.0 ** -4, 2.0 ** -6, 2.0 ** -8, 2.0 ** -1, 2.0 ** -3]}
    counts = [8, 4, 6]
    if hidden:
        rng = hidden_rng("alibi_slopes")
        counts += [1, 2, 3, 5, 7, 12, 16, 20, 24, 32, 40, 64, 96] + [rng.randrange(1, 129) for _ in range(3)]
    for n in counts:
        want = torch.tensor(hand.get(n) or _alibi_slopes_oracle(n), dtype=torch.float64)
        got = call(alibi_slopes, n)
        label = f"alibi_slopes({n})"
        expect(isinstance(got, torch.Tensor), f"{label} should return a tensor, got {type(got).__name__}.",
               "return torch.tensor(slopes) (float32).")
        expect(got.is_floating_point(), f"{label} has dtype {got.dtype}; slopes are fractions.",
               "compute the slopes in floating point: 2.0 ** (-8.0 * h / n).")
        if got.shape != (n,) and n & (n - 1):
            fail(f"{label} returned shape {tuple(got.shape)}, expected ({n},).",
                 f"for {n} heads take all slopes of the closest lower power of two, "
                 f"{2 ** math.floor(math.log2(n))}, then only the first {n - 2 ** math.floor(math.log2(n))} of the "
                 f"every-other slopes of the next power of two ([0::2][:n - closest]).")
        expect_tensor(got, (n,), label)
        if _matches(got, want, atol=1e-7):
            continue
        h = torch.arange(1, n + 1, dtype=torch.float64)
        closest = 2 ** math.floor(math.log2(n))
        hint = _diagnose(got, [
            (lambda: 2.0 ** (-8.0 * h / n),
             f"{n} is not a power of two, so the formula 2^(-8h/n) does not apply directly: take the slopes of the "
             f"closest lower power of two ({closest}), then every other slope of the next one ({2 * closest}), "
             f"starting with the first ([0::2]), until there are {n}."),
            (lambda: 2.0 ** (-8.0 * (h - 1) / n), "h runs from 1 to n: the first slope is 2^(-8/n), not 2^0 = 1."),
            (lambda: torch.tensor(_alibi_slopes_oracle(closest) + _alibi_slopes_oracle(2 * closest)[1::2][: n - closest],
                                  dtype=torch.float64),
             f"take every other slope of {2 * closest} heads starting with the first ([0::2]): these are the ones not "
             f"already in the {closest}-head list."),
            (lambda: torch.tensor(_alibi_slopes_oracle(2 * closest)[0::2][: n - closest] + _alibi_slopes_oracle(closest),
                                  dtype=torch.float64),
             f"the {closest} slopes of the lower power of two come first, then the extra ones."),
        ], f"for n = {n} heads ({'a power of two' if n == closest else 'not a power of two'}): for a power of two "
           "n the slopes are 2^(-8h/n), h = 1 .. n; otherwise the slopes of the closest lower power "
           "of two followed by every other slope ([0::2]) of twice that, as many as are missing.", atol=1e-7)
        fail(f"{label} returned {[round(v, 6) for v in got.tolist()]}, expected "
             f"{[round(v, 6) for v in want.tolist()]}.", hint)


def _alibi_oracle(slopes: torch.Tensor, q_len: int, k_len: int, ignore_offset: bool = False, sign: float = -1.0,
                  mask: bool = True) -> torch.Tensor:
    """bias[h, i, j] = -m_h (p_i - j) for j <= p_i, -inf after; p_i = k_len - q_len + i (float64)."""
    p = torch.arange(q_len, dtype=torch.float64) + (0 if ignore_offset else k_len - q_len)   # (q_len,)
    j = torch.arange(k_len, dtype=torch.float64)
    distance = p[:, None] - j[None, :]                                                        # (q_len, k_len)
    bias = sign * slopes.double()[:, None, None] * distance                                    # (n_heads, q_len, k_len)
    return bias.masked_fill(distance < 0, float("-inf")) if mask else bias


def check_alibi_bias(alibi_bias, hidden: bool = False) -> None:
    cases = [(torch.tensor([0.5]), 2, 4), (torch.tensor(_alibi_slopes_oracle(4), dtype=torch.float32), 5, 5)]
    if hidden:
        g, rng = hidden_generator("alibi_bias"), hidden_rng("alibi_bias")
        cases += [(torch.rand(3, generator=g) + 0.1, 1, 9), (torch.tensor(_alibi_slopes_oracle(12), dtype=torch.float64), 4, 17),
                  (torch.rand(5, generator=g), 1, 1), (torch.rand(2, generator=g, dtype=torch.float64), 6, 6)]
        for dtype in (torch.float32, torch.float64):
            k_len = rng.randrange(2, 40)
            cases.append((torch.tensor(_alibi_slopes_oracle(rng.randrange(1, 17)), dtype=dtype),
                          rng.randrange(1, k_len + 1), k_len))
    hand = torch.tensor([[[-1.0, -0.5, 0.0, float("-inf")], [-1.5, -1.0, -0.5, 0.0]]], dtype=torch.float64)
    for slopes, q_len, k_len in cases:
        before = slopes.clone()
        got = call(alibi_bias, slopes, q_len, k_len)
        n = slopes.shape[0]
        label = (f"alibi_bias(slopes of {n} head{'s' if n != 1 else ''} ({slopes.dtype}), q_len={q_len}, "
                 f"k_len={k_len})")
        expect(torch.equal(slopes, before), "alibi_bias changed the slopes it was given.", "do not edit slopes in place.")
        expect_tensor(got, (n, q_len, k_len), label)
        expect(got.dtype == slopes.dtype, f"{label} returned dtype {got.dtype}, expected {slopes.dtype} (that of "
               "slopes).", "create the positions with slopes' dtype and device, so that the bias follows them.")
        want = hand if (n, q_len, k_len) == (1, 2, 4) and float(slopes[0]) == 0.5 else _alibi_oracle(slopes, q_len, k_len)
        got64 = got.detach().double()
        masked = torch.isneginf(want)
        if torch.equal(torch.isneginf(got64), masked) and torch.allclose(got64[~masked], want[~masked], atol=1e-6):
            continue
        offset = k_len - q_len
        where = f"here the {q_len} queries are at positions {offset} .. {k_len - 1} of {k_len} keys"
        hint = _diagnose(got, [
            (lambda: _alibi_oracle(slopes, q_len, k_len, ignore_offset=True) if offset else None,
             f"the queries were placed at positions 0 .. {q_len - 1}, but they are the last q_len of the k_len "
             f"positions ({where}): query i is at position k_len - q_len + i, and the causal mask is aligned to "
             "the bottom right."),
            (lambda: _alibi_oracle(slopes, q_len, k_len, sign=1.0),
             "the bias must be a penalty: -m_h * (distance), zero for the query's own position and negative for "
             "earlier keys (mind the minus sign)."),
            (lambda: _alibi_oracle(slopes, q_len, k_len, mask=False) if q_len > 1 or offset == 0 else None,
             f"the keys after each query were not masked ({where}): set bias[h, i, j] = -inf where j is after the "
             "query's position, so that softmax gives them no weight."),
            (lambda: _alibi_oracle(slopes, q_len, k_len).clamp(min=-1e9),
             "masked entries must be exactly -inf: a large finite value such as -1e9 overflows in float16 and is "
             "not a mask in every dtype; use float('-inf')."),
            (lambda: _alibi_oracle(slopes, q_len, k_len).masked_fill(masked, torch.finfo(got.dtype).min),
             "masked entries must be exactly -inf, not the dtype's most negative finite number."),
            (lambda: _alibi_oracle(torch.ones_like(slopes), q_len, k_len),
             "multiply the distance by the slope of each head: slopes[:, None, None] * distance."),
        ], f"for {n} slope{'s' if n != 1 else ''}, q_len={q_len}, k_len={k_len} ({where}): bias[h, i, j] = "
           "-slopes[h] * (p_i - j) for j <= p_i and -inf for j > p_i, with p_i = k_len - q_len + i.", atol=1e-6)
        bad = (torch.isneginf(got64) != masked) | (~masked & ~torch.isclose(got64, want.nan_to_num(neginf=0.0),
                                                                         atol=1e-6))
        at = [int(v) for v in bad.nonzero()[0]]
        fail(f"{label}: entry {at} is {got64[tuple(at)].item():.6g}, expected {want[tuple(at)].item():.6g}.", hint)


# ----------------------------------------------------------------------------- exercise 8

def _by_parts64(d_head: int, base: float, scale: float, train_len: int, alpha: float, beta: float,
                kind: str = "right") -> torch.Tensor:
    theta = _freqs64(d_head, base)
    turns = train_len * theta / (2 * math.pi)                           # turns made within train_len, not rounded
    if kind in ("floor", "round"):
        turns = turns.floor() if kind == "floor" else turns.round()
    if kind == "no_two_pi":
        turns = train_len * theta
    if kind == "inverted_ratio":
        turns = 2 * math.pi / (theta * train_len)
    ramp = (turns - alpha) / (beta - alpha)
    if kind != "no_clamp":
        ramp = ramp.clamp(0.0, 1.0)
    slow = theta * scale if kind == "times_scale" else theta / scale
    if kind == "reversed":
        return (1 - ramp) * theta + ramp * slow
    return ramp * theta + (1 - ramp) * slow


def check_ntk_by_parts_frequencies(ntk_by_parts_frequencies, hidden: bool = False) -> None:
    cases = [(64, 10000.0, 4.0, 2048, 1.0, 32.0, None), (16, 100.0, 2.0, 64, 1.0, 8.0, None)]
    if hidden:
        rng = hidden_rng("ntk_by_parts_frequencies")
        cases += [(128, 500000.0, 8.0, 8192, 1.0, 32.0, None), (32, 10000.0, 1.0, 512, 1.0, 32.0, None),
                  (64, 10000.0, 16.0, 4096, 2.0, 16.0, torch.float64)]
        for dtype in (None, torch.float64):
            cases.append((2 * rng.randrange(4, 129), _draw_base(rng), round(rng.uniform(1.5, 32.0), 2),
                          rng.choice([256, 1024, 2048, 4096, 8192]), 1.0, float(rng.choice([8, 16, 32, 64])), dtype))
    for d_head, base, scale, train_len, alpha, beta, dtype in cases:
        kwargs = {} if (alpha, beta) == (1.0, 32.0) else {"alpha": alpha, "beta": beta}
        if dtype is not None:
            kwargs["dtype"] = dtype
        got = call(ntk_by_parts_frequencies, d_head, base, scale, train_len, **kwargs)
        dtype = dtype or torch.float32
        label = (f"ntk_by_parts_frequencies({d_head}, base={base:g}, scale={scale:g}, train_len={train_len}"
                 + "".join(f", {k}={v if not isinstance(v, float) else f'{v:g}'}" for k, v in kwargs.items()) + ")")
        expect_tensor(got, (d_head // 2,), label)
        expect(got.dtype == dtype, f"{label} has dtype {got.dtype}, expected {dtype}.",
               "create the result with the dtype argument (float32 by default).")
        want = _by_parts64(d_head, base, scale, train_len, alpha, beta)
        rtol = 1e-5 if dtype == torch.float32 else 1e-12
        if torch.allclose(got.double(), want, rtol=rtol, atol=0):
            continue
        if dtype == torch.float64 and torch.allclose(got.double(), want, rtol=1e-5, atol=0):
            fail(f"{label} is right only to float32 accuracy.",
                 "the float64 frequencies were computed in float32: compute theta_j, the turns and the ramp in dtype.")
        theta = _freqs64(d_head, base)
        turns = train_len * theta / (2 * math.pi)
        n_fast, n_slow = int((turns >= beta).sum()), int((turns <= alpha).sum())
        where = (f"here {n_fast} pair(s) turn at least beta={beta:g} times within {train_len} positions, "
                 f"{n_slow} at most alpha={alpha:g} times")
        hint = _diagnose(got, [
            (lambda: _by_parts64(d_head, base, scale, train_len, alpha, beta, "reversed"),
             f"the ramp is reversed ({where}): the fast pairs (many turns, ramp 1) keep theta_j, and the slow pairs "
             "(few turns, ramp 0) are interpolated, theta_j / scale."),
            (lambda: _by_parts64(d_head, base, scale, train_len, alpha, beta, "no_two_pi"),
             "r_j counts turns of 2 pi radians: train_len * theta_j / (2 pi), the positions divided by the "
             "wavelength 2 pi / theta_j; without the 2 pi it counts radians."),
        ] + [
            (lambda kind=kind: _by_parts64(d_head, base, scale, train_len, alpha, beta, kind),
             f"r_j was rounded {how} to a whole number: the number of turns is not rounded. r_j = train_len * "
             "theta_j / (2 pi) is a real number (a pair that makes 10.2 turns has r_j = 10.2), so the ramp grows "
             "smoothly between alpha and beta instead of in steps.") for kind, how in (("floor", "down"),
                                                                                       ("round", "off"))
        ] + [

            (lambda: _by_parts64(d_head, base, scale, train_len, alpha, beta, "inverted_ratio"),
             "r_j = train_len / wavelength_j (turns made in training), not wavelength_j / train_len."),
            (lambda: _by_parts64(d_head, base, scale, train_len, alpha, beta, "no_clamp"),
             f"clamp the ramp to [0, 1] ({where}): outside the ramp, pairs are either kept or interpolated, never "
             "extrapolated beyond."),
            (lambda: _by_parts64(d_head, base, scale, train_len, alpha, beta, "times_scale"),
             "interpolating slows a pair down: theta_j / scale, not theta_j * scale."),
            (lambda: _by_parts64(d_head, base, scale, train_len, 1.0, 32.0) if (alpha, beta) != (1.0, 32.0) else None,
             f"this case uses alpha={alpha:g}, beta={beta:g}, and the answer matches the defaults 1 and 32: use "
             "the arguments."),
        ] + _base_ignored(lambda b: _by_parts64(d_head, b, scale, train_len, alpha, beta), base),
            f"for d_head={d_head}, base={base:g}, scale={scale:g}, train_len={train_len} ({where}): r_j = "
            "train_len * theta_j / (2 pi), ramp = clamp((r_j - alpha) / (beta - alpha), 0, 1), new theta_j = "
            "ramp * theta_j + (1 - ramp) * theta_j / scale.", atol=1e-7)
        expect_close(got.double(), want, label, hint, atol=1e-7 if dtype == torch.float32 else 1e-15)


# ----------------------------------------------------------------------------- exercise 9

REACH_SLOPE, REACH_THRESHOLD = 1 / 8, 0.01
REACH_ANSWER = math.ceil(math.log(1 / REACH_THRESHOLD) / REACH_SLOPE)       # 37: e^(-d/8) < 1/100 from d = 36.84


def _reach_oracle(slopes: torch.Tensor, threshold: float, n_keys: int, ratio: bool = True, shift: int = 0,
                  no_key: int = -1) -> torch.Tensor:
    d = torch.arange(n_keys, dtype=torch.float64)
    weights = torch.softmax(-slopes.double()[:, None] * d, dim=-1)             # (n_heads, n_keys)
    below = weights < threshold * (weights[:, :1] if ratio else 1.0)
    first = torch.where(below.any(dim=-1), below.double().argmax(dim=-1).long() + shift, torch.tensor(no_key))
    return first


def _check_prediction(predicted_reach) -> None:
    value = call(predicted_reach)
    try:
        value = float(value)
    except (TypeError, ValueError):
        fail(f"predicted_reach() returned {type(value).__name__}, expected a number.",
             "return your prediction as a number: the distance d.")
    if value == REACH_ANSWER:
        return
    exact = math.log(1 / REACH_THRESHOLD) / REACH_SLOPE
    if value != round(value) and abs(value - exact) < 1:
        fail(f"predicted_reach() is {value:g}, not a whole number of tokens.",
             f"e^(-d/8) falls below 1% at d = {exact:.2f}, but keys sit at whole distances d = 0, 1, 2, ... (a "
             "distance is a whole number of tokens): the answer is the first whole distance past that point.")
    guesses = [
        (math.floor(exact), "that rounds down: at that distance the weight is still above 1% (e^(-36/8) = 1.1%); "
                            "the question asks for the first distance at which it is below."),
        (math.log10(1 / REACH_THRESHOLD) / REACH_SLOPE, "use the natural logarithm: weights come from exp, so "
                                                        "e^(-m d) < 0.01 means d > ln(100) / m."),
        (math.log(1 / REACH_THRESHOLD) * REACH_SLOPE, "the slope multiplies the distance: e^(-m d) < 0.01 means "
                                                      "d > ln(100) / m, a division by m = 1/8."),
        (1 / (REACH_THRESHOLD * REACH_SLOPE), "the weight falls exponentially with distance, not as 1/d: the ratio "
                                              "of the weights at distance d and 0 is e^(-m d)."),
    ]
    hint = next((h for v, h in guesses if abs(value - v) <= 0.5 or (v > 2 and abs(value - math.ceil(v)) <= 0.5
                                                                    and abs(math.ceil(v) - REACH_ANSWER) > 0.5)),
                "with equal content scores, the softmax weights of two keys differ by the factor e^(bias difference): "
                "the key at distance d has e^(-m d) times the weight of distance 0. Solve e^(-m d) < 0.01 for the "
                "smallest integer d.")
    fail(f"predicted_reach() is {value:g}, which is not the distance asked for (slope 1/8, 1%).", hint)


def check_alibi_reach(predicted_reach, alibi_reach, hidden: bool = False) -> None:
    _check_prediction(predicted_reach)
    cases = [(torch.tensor([0.5, 0.125, 1 / 256]), 0.01, 2048), (torch.tensor([1.0, 0.01]), 0.2, 50)]
    if hidden:
        g, rng = hidden_generator("alibi_reach"), hidden_rng("alibi_reach")
        cases += [(torch.tensor(_alibi_slopes_oracle(6), dtype=torch.float64), 0.05, 300),
                  (torch.tensor([1 / 256, 1 / 64]), 0.001, 1000)]
        for dtype in (torch.float32, torch.float64):
            while True:   # no case near a tie: the weight ratio must not sit at the threshold
                n = rng.randrange(1, 9)
                slopes = (torch.rand(n, generator=g, dtype=torch.float64) * 0.9 + 0.02).to(dtype)
                threshold = 10 ** rng.uniform(-4, -0.5)
                at = math.log(1 / threshold) / slopes.double()
                if bool(((at - at.round()).abs() > 1e-3).all()):
                    break
            cases.append((slopes, threshold, rng.randrange(20, 600)))
    for slopes, threshold, n_keys in cases:
        before = slopes.clone()
        got = call(alibi_reach, slopes, threshold, n_keys)
        n = slopes.shape[0]
        label = f"alibi_reach(slopes of {n} head{'s' if n > 1 else ''} ({slopes.dtype}), threshold={threshold:.4g}, n_keys={n_keys})"
        expect(torch.equal(slopes, before), "alibi_reach changed the slopes it was given.", "do not edit slopes in place.")
        expect_tensor(got, (n,), label)
        expect(not got.is_floating_point() and not got.is_complex(),
               f"{label} returned dtype {got.dtype}, expected an integer tensor of distances.",
               "return the distances as a LongTensor (argmax or nonzero give integer indices).")
        want = _reach_oracle(slopes, threshold, n_keys)
        if torch.equal(got.long(), want):
            continue
        shown = f"got {got.tolist()}, expected {want.tolist()}"
        none = want == -1
        if bool(none.any()) and torch.equal(got.long()[~none], want[~none]):
            heads = none.nonzero().flatten().tolist()
            given = set(got.long()[none].tolist())
            why = ("argmax of a row with no True is 0, the same answer as a first key at distance 0: tell the two "
                   "apart with .any(dim=-1)" if given == {0} else
                   "n_keys is no distance; -1 says that there is none" if given == {n_keys} else
                   "-1 says that there is no such distance")
            fail(f"{label}: {shown}.",
                 f"the heads with a key below the threshold are right; for head{'s' if len(heads) > 1 else ''} "
                 f"{', '.join(map(str, heads))} no key of these {n_keys} is below it, and such a head must give -1: "
                 f"return -1 for them ({why}).")
        hint = next((h for v, h in [
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
        ] if torch.equal(got.long(), v)),
            f"for threshold={threshold:.4g} and n_keys={n_keys}: softmax over the distances d = 0 .. n_keys - 1 of "
            "the scores -m_h * d (equal content scores), then for each head the first d with weight[d] < "
            "threshold * weight[0], or -1.")
        fail(f"{label}: {shown}.", hint)


# ----------------------------------------------------------------------------- exercise 10

def _cached_attention64(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_past: torch.Tensor,
                        v_past: torch.Tensor, base: float, kind: str = "right") -> tuple[torch.Tensor, torch.Tensor]:
    """The oracle: RoPE at absolute positions, keys of the past rotated once, causal mask aligned bottom-right.

    k_past holds the past keys before rotation. Returns (out, all rotated keys), in float64."""
    T_past, T_new, d = k_past.shape[-2], q.shape[-2], q.shape[-1]
    new_pos = torch.arange(T_past, T_past + T_new) if kind not in ("no_offset", "no_offset_both") else torch.arange(T_new)
    q_rot, k_rot = _rope_b64(q, new_pos, base), _rope_b64(k, new_pos, base)
    if kind == "query_from_zero":
        q_rot = _rope_b64(q, torch.arange(T_new), base)
    past = _rope_b64(k_past, torch.arange(T_past), base)
    if kind == "cache_rotated_twice":
        past = _rope_b64(past, torch.arange(T_past), base)
    keys = torch.cat((past, k_rot), dim=-2)                                        # (B, H, T_all, d)
    values = torch.cat((v_past.double(), v.double()), dim=-2)
    if kind == "values_rotated":
        values = torch.cat((v_past.double(), _rope_b64(v, new_pos, base)), dim=-2)
    scores = q_rot @ keys.transpose(-2, -1)
    if kind != "no_scale":
        scores = scores / math.sqrt(d)
    T_all = T_past + T_new
    query_at = torch.arange(T_new)[:, None] + (0 if kind in ("top_left", "no_offset_both") else T_past)
    if kind == "hides_diagonal":
        scores = scores.masked_fill(torch.arange(T_all)[None, :] >= query_at, float("-inf"))
    elif kind != "no_mask":
        scores = scores.masked_fill(torch.arange(T_all)[None, :] > query_at, float("-inf"))
    return scores.softmax(dim=-1) @ values, keys


def check_rope_attention_step(rope_attention_step, apply_rope=None, hidden: bool = False) -> None:
    """apply_rope, when given, is the exercise 5 answer it calls. When a case fails and that answer fails exercise
    5's tests, the failure is blamed on it only if it also rotates this case's inputs wrongly; otherwise this
    exercise's own cause is given (diagnosed against a reference rotation), followed by a note about exercise 5."""
    _check_rope_attention_step(rope_attention_step, hidden, _Exercise5(apply_rope, hidden))


class _Exercise5:
    """What is known of the student's apply_rope: its exercise 5 failure (checked once, when first needed) and
    whether it rotates the inputs of one case of this exercise right."""

    WHAT = "rope_attention_step calls your apply_rope, which fails exercise 5's tests"

    def __init__(self, apply_rope, hidden: bool):
        self.apply_rope, self.hidden, self._failure = apply_rope, hidden, False

    def failure(self) -> str | None:
        """The hint of exercise 5's failing test, or None (no apply_rope, a stub, or it passes)."""
        if self._failure is False:
            self._failure = None
            if self.apply_rope is not None:
                try:
                    check_apply_rope(self.apply_rope, hidden=self.hidden)
                except NotImplementedError:
                    pass
                except CheckFailed as inner:
                    self._failure = str(inner).split("\nLikely mistake: ", 1)[-1]
        return self._failure

    def right_on(self, B: int, H: int, T_past: int, T_new: int, d: int, base: float, dtype: torch.dtype) -> bool:
        """Whether apply_rope rotates tensors of this case (the new tokens at T_past .. T_past + T_new - 1, and
        every position up to the last) like the reference, in this dtype."""
        g = generator(113)
        T_all = T_past + T_new
        for T, positions in ((T_new, torch.arange(T_past, T_all)), (T_all, torch.arange(T_all))):
            x = torch.randn(B, H, T, d, generator=g, dtype=torch.float64).to(dtype)
            try:
                got = self.apply_rope(x, positions, base)
                if got.dtype != dtype or not _rope_close(got, _rope_b64(x, positions, base), dtype):
                    return False
            except Exception:  # noqa: BLE001 - any error means it cannot be trusted on this case
                return False
        return True

    def blame(self, err: CheckFailed, case: tuple) -> CheckFailed:
        """The failure of a case, with exercise 5 blamed or mentioned as the facts say."""
        inner = self.failure()
        if inner is None:
            return err
        found, _, own = str(err).partition("\nLikely mistake: ")
        if not self.right_on(*case):
            return CheckFailed(f"{found}\nLikely mistake: {self.WHAT}: fix that exercise first. Its test says: "
                               f"{inner}")
        B, H, T_past, T_new, d, base, dtype = case
        note = (f"Also: your apply_rope (exercise 5), which rope_attention_step calls, fails exercise 5's tests on "
                f"inputs that this case does not use: it rotates this case's positions 0 .. {T_past + T_new - 1} in "
                f"{dtype} right, so the cause above is in rope_attention_step itself. Fix exercise 5 too; its test "
                f"says: {inner}")
        return CheckFailed(f"{found}\nLikely mistake: {own}\n{note}" if own else f"{found}\n{note}")


def _check_rope_attention_step(rope_attention_step, hidden: bool, exercise5: _Exercise5) -> None:
    """Cases: (B, n_heads, T_past, T_new, d_head, base, dtype)."""
    cases = [(1, 2, 5, 1, 8, 10000.0, torch.float32), (2, 2, 3, 4, 16, 100.0, torch.float32)]
    if hidden:
        rng = hidden_rng("rope_attention_step")
        cases += [(2, 1, 0, 3, 8, 10000.0, torch.float32), (1, 3, 37, 2, 32, 10000.0, torch.float64),
                  (2, 2, 12, 1, 16, 500.0, torch.float32)]
        for dtype in (torch.float32, torch.float64):
            cases.append((rng.randrange(1, 3), rng.randrange(1, 4), rng.randrange(0, 30), rng.randrange(1, 6),
                          2 * rng.randrange(2, 17), _draw_base(rng), dtype))
    g = generator(111) if not hidden else hidden_generator("rope_attention_step")
    for case in cases:
        try:
            _check_attention_case(rope_attention_step, case, g)
        except CheckFailed as err:
            blamed = exercise5.blame(err, case)
            if blamed is err:
                raise
            raise blamed from err


def _check_attention_case(rope_attention_step, case: tuple, g: torch.Generator) -> None:
    B, H, T_past, T_new, d, base, dtype = case
    q, k, v = (torch.randn(B, H, T_new, d, generator=g, dtype=torch.float64).to(dtype) for _ in range(3))
    k_past = torch.randn(B, H, T_past, d, generator=g, dtype=torch.float64).to(dtype)
    v_cache = torch.randn(B, H, T_past, d, generator=g, dtype=torch.float64).to(dtype)
    k_cache = _rope_b64(k_past, torch.arange(T_past), base).to(dtype)              # rotated when cached
    inputs = [q, k, v, k_cache, v_cache]
    saved = [t.clone() for t in inputs]
    got = call(rope_attention_step, q, k, v, k_cache, v_cache, base)
    label = (f"rope_attention_step with {T_new} new token{'s' if T_new > 1 else ''} after a cache of {T_past} "
             f"(B={B}, n_heads={H}, d_head={d}, base={base:g}, {dtype})")
    expect(all(torch.equal(a, b) for a, b in zip(inputs, saved)), f"{label} changed one of its inputs in place.",
           "build new tensors (torch.cat makes the new cache); do not write into q, k, v or the cache.")
    expect(isinstance(got, (tuple, list)) and len(got) == 3,
           f"{label} returned {type(got).__name__}, expected a tuple (out, k_cache, v_cache).",
           "return three tensors: the attention output and the two grown caches.")
    out, new_k, new_v = got
    expect_tensor(out, (B, H, T_new, d), f"the output of {label}")
    expect_tensor(new_k, (B, H, T_past + T_new, d), f"the new k_cache of {label}")
    expect_tensor(new_v, (B, H, T_past + T_new, d), f"the new v_cache of {label}")
    expect(out.dtype == dtype and new_k.dtype == dtype, f"{label} returned dtype {out.dtype}, expected {dtype}.",
           "keep the dtype of q: create every new tensor with q's dtype and device.")
    want_out, want_keys = _cached_attention64(q, k, v, k_past, v_cache, base)
    atol = 1e-4 if dtype == torch.float32 else 1e-10
    cache_ok = _matches(new_k, want_keys, atol=atol) and _matches(new_v, torch.cat((v_cache, v), -2).double(), atol=0)
    out_ok = _matches(out, want_out, atol=atol)
    if cache_ok and out_ok:
        return
    variants = [
        ("no_offset_both", f"the new tokens were treated as positions {'0' if T_new == 1 else f'0 .. {T_new - 1}'}, "
                           f"for the rotation and for "
                           f"the mask, but they come after {T_past} cached ones: rotate new token t by its "
                           f"absolute position T_past + t, and let it see the keys up to that position."),
        ("no_offset", f"the new tokens were rotated as positions 0 .. {T_new - 1}, but they come after "
                      f"{T_past} cached ones: rotate new token t by its absolute position T_past + t."),
        ("query_from_zero", "the new keys and the mask are right, but the queries were rotated as "
                            + ("position 0" if T_new == 1 else f"positions 0 .. {T_new - 1}")
                            + f": a query is rotated at its own absolute position, T_past + t (here {T_past}"
                            f"{'' if T_new == 1 else f' .. {T_past + T_new - 1}'}), like the key of the same "
                            "token; otherwise its scores measure the distance from the wrong place."),
        ("cache_rotated_twice", "the cached keys were rotated again: the cache holds keys already rotated at "
                                "their own positions; rotate only the new keys, then append them."),
        ("values_rotated", "the values were rotated: RoPE rotates only queries and keys."),
        ("top_left", f"the causal mask is aligned to the top left: new query t is at position {T_past} + t and "
                     "sees every cached key and the new keys up to itself (a bottom-right mask; "
                     "is_causal=True in scaled_dot_product_attention aligns it to the top left when "
                     "q_len < k_len)."),
        ("hides_diagonal", "the mask hides the diagonal: query t must see its own key (j = T_past + t), so mask "
                           "key j only when j > T_past + t (>, not >=)."
                           + (" A query with no earlier key then sees nothing at all, and its softmax is NaN."
                              if T_past == 0 else "")),
        ("no_mask", "the new queries saw later new tokens: mask key j for query t when j > T_past + t."),
        ("no_scale", "divide the scores by sqrt(d_head) before the softmax."),
    ]
    # A variant that changes what is cached can explain a wrong cache; the others cannot.
    changes_cache = {"no_offset", "no_offset_both", "cache_rotated_twice", "values_rotated"}
    kind = next((kind for kind, _ in variants
                 if (kind in changes_cache) != cache_ok
                 and (kind != "no_mask" or T_new > 1) and (kind != "top_left" or T_past > 0)
                 and (kind not in ("no_offset", "no_offset_both", "cache_rotated_twice", "query_from_zero")
                      or T_past > 0)
                 and _matches(out, _cached_attention64(q, k, v, k_past, v_cache, base, kind)[0], atol=atol,
                              equal_nan=True)),
                None)
    hint = dict(variants)[kind] if kind else None
    # New keys appended as they came (the cache rotated at attention time instead): not the form of the cache. A
    # single new key rotated at position 0 is unrotated too; the output then tells the offset bug apart.
    if (kind not in ("no_offset", "no_offset_both") and not _matches(new_k, want_keys, atol=atol)
            and _matches(new_k, torch.cat((k_cache, k), dim=-2).double(), atol=atol)):
        hint = ("the returned k_cache holds the new keys unrotated. The cache it was given holds keys already "
                "rotated at their own positions, and the next step will use the returned one as it is: it must hold "
                "the new keys rotated at T_past + t, in the same form as the cached ones. Rotate the new keys once, "
                "append them, and never rotate the cache again (rotating it at attention time rotates the cached "
                "keys twice).")
    if hint is None and not cache_ok:
        hint = ("the new cache must be cat((k_cache, apply_rope(k, positions)), dim=-2) with positions T_past .. "
                "T_past + T_new - 1, and cat((v_cache, v), dim=-2).")
    if hint is None and dtype == torch.float64 and _matches(out, want_out, atol=1e-4):
        hint = ("right to float32 accuracy only: for float64 inputs compute everything in float64 (the scores, "
                "the mask and the angles of your apply_rope).")
    if hint is None:
        hint = (f"with T_past={T_past}, T_new={T_new}: rotate q and k by positions T_past .. T_past + T_new - 1, "
                "append k and v to the caches, scores = q @ keys^T / sqrt(d_head) with key j masked (-inf) for "
                "query t when j > T_past + t, softmax over the keys, times the values.")
    what = "the output" if cache_ok else "the new k_cache" if not _matches(new_k, want_keys, atol=atol) else "the new v_cache"
    fail(f"{label}: {what} is not what attention over the whole sequence, with RoPE at absolute positions, "
         "gives.", hint)
