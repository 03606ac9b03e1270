"""Checks for chapter 2: positional encodings.

Oracles: a float64 sinusoidal table written from the formula (powers, not logs), RoPE as
multiplication by unit complex numbers (``torch.polar``) in both pairings, the ALiBi slope
recipe of the reference implementation, hand-derived values (row 0 of the table, the slopes
of 8 heads, a 3 x 3 ALiBi bias) and properties: PE(pos + k) = PE(pos) M_k, rotations keep
norms, a RoPE score depends only on m - n, the NTK rule divides the lowest frequency by the
scale. For each plausible bug the check computes what that bug would produce and, when the
answer matches it, names it.
"""

from __future__ import annotations

import math
import random
from typing import Callable

import torch
import torch.nn as nn

from ._core import CheckFailed, call, earlier_first, expect, expect_close, expect_tensor, fail, generator
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


def _shift64(k: int, d_model: int, base: float) -> torch.Tensor:
    """M with PE(pos + k) = PE(pos) @ M: one 2 x 2 rotation block per (sin, cos) pair."""
    b = k * _freqs64(d_model, base)
    M = torch.zeros(d_model, d_model, dtype=torch.float64)
    i = torch.arange(0, d_model, 2)
    M[i, i], M[i + 1, i + 1] = torch.cos(b), torch.cos(b)
    M[i, i + 1], M[i + 1, i] = -torch.sin(b), torch.sin(b)
    return M


def _rope64(x: torch.Tensor, positions: torch.Tensor, base: float, pairing: str = "half", sign: float = 1.0,
            freqs: torch.Tensor | None = None, out_layout: str | None = None) -> torch.Tensor:
    """RoPE as complex multiplication, in float64.

    pairing "half": entry j pairs with j + d/2; "interleaved": 2j pairs with 2j + 1.
    out_layout (default: the pairing's own) says how the rotated pairs are written back.
    """
    x = x.double()
    d = x.shape[-1]
    f = _freqs64(d, base) if freqs is None else freqs
    angles = sign * positions.double()[:, None] * f                          # (T, d/2)
    rot = torch.polar(torch.ones_like(angles), angles)                       # (T, d/2), |rot| = 1
    if pairing == "half":
        z = torch.complex(x[..., : d // 2], x[..., d // 2:]) * rot           # (..., T, d/2)
    else:
        z = torch.complex(x[..., 0::2], x[..., 1::2]) * rot                  # (..., T, d/2)
    layout = out_layout or pairing
    return torch.cat((z.real, z.imag), dim=-1) if layout == "half" else _interleave(z.real, z.imag)


def _rope_mixed64(x: torch.Tensor, positions: torch.Tensor, base: float) -> torch.Tensor:
    """rotate_half with an interleaved (repeat_interleave) cos/sin table: the classic mix-up."""
    x = x.double()
    d = x.shape[-1]
    angles = (positions.double()[:, None] * _freqs64(d, base)).repeat_interleave(2, dim=-1)   # (T, d)
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return x * angles.cos() + torch.cat((-x2, x1), dim=-1) * angles.sin()


def _alibi_slopes_oracle(n: int) -> list[float]:
    """The recipe of the ALiBi reference code, in Python floats."""
    def power_of_two(n: int) -> list[float]:
        start = 2.0 ** (-8.0 / n)
        return [start ** (h + 1) for h in range(n)]
    if math.log2(n).is_integer():
        return power_of_two(n)
    closest = 2 ** math.floor(math.log2(n))
    return power_of_two(closest) + _alibi_slopes_oracle(2 * closest)[0::2][: n - closest]


def _matches(got: torch.Tensor, want: torch.Tensor, atol: float = 1e-5) -> bool:
    got = got.detach().double()
    return got.shape == want.shape and bool(torch.allclose(got, want, atol=atol, rtol=1e-5))


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
            x = x + _sin_table64(x.shape[1], d, 10000.0).float()           # (B, T, d)
        q, k, v = x @ w_q, x @ w_k, x @ w_v                                  # (B, T, d)
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
        except NotImplementedError:
            raise
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


def check_sinusoidal_table(sinusoidal_table, hidden: bool = False) -> None:
    cases = [(6, 8, 10000.0), (50, 16, 100.0)]
    if hidden:
        rng = hidden_rng("sinusoidal_table")
        cases += [(1, 4, 10000.0), (128, 512, 10000.0), (33, 10, 500.0), (100, 64, 1e6), (7, 2, 10000.0)]
        cases += [(rng.randrange(1, 129), 2 * rng.randrange(1, 129), _draw_base(rng)) for _ in range(3)]
    for seq_len, d_model, base in cases:
        got = call(sinusoidal_table, seq_len, d_model, base)
        label = f"sinusoidal_table({seq_len}, {d_model}, base={base:g})"
        expect_tensor(got, (seq_len, d_model), label)
        expect(got.dtype == torch.float32, f"{label} has dtype {got.dtype}, expected torch.float32.",
               "build the positions and frequencies as float32 (torch.arange(..., dtype=torch.float32)).")
        want = _sin_table64(seq_len, d_model, base)
        if _matches(got, want, atol=2e-5):
            continue
        hint = _diagnose(got, _base_ignored(lambda b: _sin_table64(seq_len, d_model, b), base)
                         + _sinusoidal_variants(seq_len, d_model, base),
                         f"for seq_len={seq_len}, d_model={d_model}, base={base:g}: PE[pos, 2i] = sin(pos * w_i) "
                         "and PE[pos, 2i+1] = cos(pos * w_i) with w_i = exp(-2i * ln(base) / d_model), "
                         "pos = 0 .. seq_len - 1.", atol=2e-5)
        row0 = torch.tensor([0.0, 1.0] * (d_model // 2), dtype=torch.float64)
        if not _matches(got[0], row0, atol=1e-6):
            fail(f"{label}: row 0 (position 0) is {[round(v, 3) for v in got[0, :6].tolist()]}..., expected "
                 f"[0, 1, 0, 1, ...] (sin 0 = 0, cos 0 = 1).", hint)
        expect_close(got.double(), want, label, hint, atol=2e-5)


def check_sinusoidal_shift_matrix(sinusoidal_shift_matrix, hidden: bool = False) -> None:
    cases = [(1, 8, 10000.0), (5, 16, 100.0), (0, 6, 10000.0)]
    if hidden:
        rng = hidden_rng("sinusoidal_shift_matrix")
        cases += [(37, 64, 10000.0), (-3, 10, 10000.0), (12, 2, 10000.0), (20, 128, 1e6)]
        cases += [(rng.randrange(-40, 41), 2 * rng.randrange(1, 65), _draw_base(rng)) for _ in range(3)]
    for k, d_model, base in cases:
        got = call(sinusoidal_shift_matrix, k, d_model, base)
        label = f"sinusoidal_shift_matrix({k}, {d_model}, base={base:g})"
        expect_tensor(got, (d_model, d_model), label)
        want = _shift64(k, d_model, base)
        if _matches(got, want):
            table = _sin_table64(40 + abs(k), d_model, base)                   # property: rows shift by k
            lo = max(0, -k)
            expect_close((table[lo:lo + 20] @ got.double()), table[lo + k:lo + k + 20],
                         f"PE(pos) @ {label}", "each block must rotate its (sin, cos) pair by k * w_i.")
            continue
        if k < 0:   # the cases with k >= 0 passed before: the block is right, the sign of k is lost
            flipped = (f"this case has a negative shift, k = {k}, and the answer shifts by +{-k}: keep the sign of k "
                       f"(b = k * w_i, no abs(k)); M_k for k < 0 moves PE(pos) back to PE(pos - {-k}), "
                       "the transpose of M_|k|.")
        else:
            flipped = ("the matrix shifts by -k: with row vectors, PE(pos + k) = PE(pos) @ M, so the block is "
                       "[[cos b, -sin b], [sin b, cos b]] (the transpose of the column-vector rotation).")
        hint = _diagnose(got, [
            (lambda: _shift64(-k, d_model, base), flipped),
            (lambda: torch.eye(d_model, dtype=torch.float64),
             f"the matrix is the identity (k = {k}): each block must rotate by the angle b = k * w_i."),
        ] + _base_ignored(lambda b: _shift64(k, d_model, b), base),
            f"for k={k}, d_model={d_model}, base={base:g}: M is block diagonal; the 2 x 2 block on rows and "
            "columns (2i, 2i+1) is [[cos b, -sin b], [sin b, cos b]] with b = k * w_i and w_i = base^(-2i/d_model).")
        expect_close(got.double(), want, label, hint)


# ----------------------------------------------------------------------------- exercise 4

def check_learned_positional_embedding(LearnedPositionalEmbedding, hidden: bool = False) -> None:
    configs = [(24, 64, 25)]
    if hidden:
        rng = hidden_rng("learned_positional_embedding")
        configs += [(37, 24, 50), (512, 16, 513)]
        for _ in range(2):
            # At least 1500 entries, so that the std of the initial table is measured within 3%.
            max_len = rng.randrange(2, 300)
            d_model = rng.randrange(max(4, -(-1500 // max_len)), max(5, -(-1500 // max_len)) + 64)
            configs.append((max_len, d_model, max_len + rng.randrange(1, 20)))
    g = generator(71) if not hidden else hidden_generator("learned_positional_embedding")
    for i, (max_len, d_model, too_long) in enumerate(configs):
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
        lengths = [1, max_len // 2 + 1, max_len]
        for T in lengths:
            x = torch.randn(2, T, d_model, generator=g)
            x_before = x.clone()
            try:
                out = module(x)
            except NotImplementedError:
                raise
            except ValueError as err:
                if T == max_len:
                    fail(f"a sequence of length {T} = max_len raised ValueError: {err}",
                         "a sequence of exactly max_len positions fits (positions 0 .. max_len - 1): raise only "
                         "when T > max_len, not T >= max_len.")
                raise CheckFailed(f"a sequence of length {T} (max_len {max_len}) raised ValueError: {err}\n"
                                  f"Likely mistake: raise only when T > max_len.") from err
            except Exception as err:
                raise CheckFailed(f"LearnedPositionalEmbedding.forward raised {type(err).__name__}: {err}\n"
                                  "Likely mistake: read the traceback above this message.") from err
            expect(torch.equal(x, x_before), "forward changed its input x in place.",
                   "return x + self.weight[:T]; do not use += on x.")
            expect_tensor(out, (2, T, d_model), f"LearnedPositionalEmbedding output for T={T}")
            want = x_before + weight.detach()[:T]
            if not _matches(out, want.double()):
                hint = "forward returns x + weight[:T]: row t of the table is added at position t."
                if _matches(out, weight.detach()[:T].expand(2, T, d_model).double()):
                    hint = "forward must add the positions to x (x + weight[:T]), not return the positions alone."
                fail(f"LearnedPositionalEmbedding output for T={T} is wrong.", hint)
        module.zero_grad()
        T = max_len // 2 + 1
        out = module(torch.randn(3, T, d_model, generator=g))
        expect(isinstance(out, torch.Tensor) and out.requires_grad,
               "the output of LearnedPositionalEmbedding carries no gradient: weight cannot be trained.",
               "do not detach or copy the table in forward: add self.weight[:T] itself.")
        out.sum().backward()
        expect(weight.grad is not None, "no gradient reached weight.", "do not detach or copy the table in forward.")
        used = weight.grad.abs().sum(dim=1) > 0
        expect(used[:T].all().item() and not used[T:].any().item(),
               f"with T={T}, the gradient should reach rows 0 .. {T - 1} of weight and no others.",
               "add weight[:T], the first T rows, one per position.")
        try:
            module(torch.randn(1, too_long, d_model, generator=g))
        except NotImplementedError:
            raise
        except ValueError as err:
            message = str(err)
            expect(str(too_long) in message and str(max_len) in message,
                   f"the ValueError for length {too_long} > max_len {max_len} says {message!r}: it should name both.",
                   "name both lengths in the message, e.g. f'sequence length {T} exceeds max_len {self.max_len}'.")
        except Exception as err:
            fail(f"a sequence of length {too_long} > max_len {max_len} raised {type(err).__name__} ({err}), "
                 f"not ValueError.",
                 "check the length yourself before indexing and raise ValueError naming both lengths.")
        else:
            fail(f"a sequence of length {too_long} > max_len {max_len} did not raise ValueError.",
                 "check the length yourself before indexing and raise ValueError naming both lengths "
                 "(slicing weight[:T] silently returns only max_len rows).")


# ----------------------------------------------------------------------------- exercise 5

def check_rope_frequencies(rope_frequencies, hidden: bool = False) -> None:
    cases = [(8, 10000.0), (64, 500.0)]
    if hidden:
        rng = hidden_rng("rope_frequencies")
        cases += [(2, 10000.0), (128, 1e6), (6, 10.0)] + [(2 * rng.randrange(1, 129), _draw_base(rng)) for _ in range(3)]
    for d_head, base in cases:
        got = call(rope_frequencies, d_head, base)
        label = f"rope_frequencies({d_head}, base={base:g})"
        expect_tensor(got, (d_head // 2,), label)
        want = _freqs64(d_head, base)
        if _matches(got, want, atol=1e-7):
            continue
        j = torch.arange(d_head // 2, dtype=torch.float64)
        hint = _diagnose(got, [
            (lambda: base ** (-j / d_head), "the exponent is 2j/d_head (j = 0 .. d_head/2 - 1), not j/d_head: "
                                            "use torch.arange(0, d_head, 2)."),
            (lambda: base ** (2 * j / d_head), "the frequencies must decrease: theta_j = base^(-2j/d_head)."),
        ] + _base_ignored(lambda b: _freqs64(d_head, b), base),
            f"for d_head={d_head}, base={base:g}: theta_j = base^(-2j/d_head) = exp(-2j * ln(base) / d_head), "
            "j = 0 .. d_head/2 - 1.", atol=1e-7)
        expect_close(got.double(), want, label, hint, atol=1e-7)


def check_rotate_half(rotate_half, hidden: bool = False) -> None:
    shapes = [(2, 3, 8), (4,)]
    if hidden:
        rng = hidden_rng("rotate_half")
        shapes += [(2, 2, 5, 16), (1, 2)]
        shapes += [(*(rng.randrange(1, 5) for _ in range(rng.randrange(0, 3))), 2 * rng.randrange(1, 17))
                   for _ in range(2)]
    g = generator(81) if not hidden else hidden_generator("rotate_half")
    for shape in shapes:
        x = torch.randn(*shape, generator=g)
        x_before = x.clone()
        got = call(rotate_half, x)
        expect(torch.equal(x, x_before), "rotate_half changed its input in place.", "build a new tensor with torch.cat.")
        expect_tensor(got, shape, f"rotate_half of shape {shape}")
        d = shape[-1]
        x1, x2 = x[..., : d // 2], x[..., d // 2:]
        want = torch.cat((-x2, x1), dim=-1).double()
        if _matches(got, want, atol=0):
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


def _rope_variants(x: torch.Tensor, positions: torch.Tensor, base: float, pairing: str) -> list[tuple[Callable, str]]:
    d = x.shape[-1]
    j = torch.arange(d // 2, dtype=torch.float64)
    other = "interleaved" if pairing == "half" else "half"
    if pairing == "half":
        pairing_hints = [
            (lambda: _rope64(x, positions, base, "interleaved"),
             "this is the interleaved pairing (2j with 2j + 1); apply_rope uses the half-split pairing: entry j pairs "
             "with entry j + d_head/2, as rotate_half does."),
            (lambda: _rope_mixed64(x, positions, base),
             "the two RoPE pairings are mixed: rotate_half pairs j with j + d_head/2, so both halves need the same "
             "angles, torch.cat((angles, angles), dim=-1); repeat_interleave(2) is the layout of the interleaved "
             "pairing."),
        ]
    else:
        pairing_hints = [
            (lambda: _rope64(x, positions, base, "half"),
             "this is the half-split pairing (j with j + d_head/2); apply_rope_interleaved pairs neighbouring entries "
             "2j and 2j + 1 (x[..., 0::2] with x[..., 1::2])."),
            (lambda: _rope64(x, positions, base, "half", out_layout="interleaved"),
             "this is the half-split pairing (j with j + d_head/2) written back in interleaved order; "
             "apply_rope_interleaved pairs neighbouring entries 2j and 2j + 1 (x[..., 0::2] with x[..., 1::2])."),
            (lambda: _rope64(x, positions, base, "interleaved", out_layout="half"),
             "the pairs were rotated correctly but written back in half-split order (all first members, then all "
             "second members): in the interleaved pairing, rotated pair j goes back to entries 2j and 2j + 1 "
             "(torch.stack(..., dim=-1).flatten(-2), not torch.cat)."),
        ]
    return pairing_hints + [
        (lambda: _rope64(x, positions, base, pairing, sign=-1.0),
         "every pair turns the wrong way (by -m * theta_j): the rotated pair is (a cos - b sin, a sin + b cos); "
         "for rotate_half that means cat(-x2, x1)."),
        (lambda: _rope64(x, positions, base, pairing, freqs=base ** (-j / d)),
         "the exponent of theta_j is 2j/d_head, not j/d_head."),
        (lambda: _rope64(x, positions + 1, base, pairing),
         "the positions were shifted by one: use the given positions as they are."),
        (lambda: _rope64(x, positions.double().trunc(), base, pairing) if _fractional(positions) else None,
         f"the positions here are fractional ({_show_positions(positions)}) and the answer rounded them to "
         "integers: keep them as floats (positions.to(x.dtype)), not .long() or .int(); interpolated positions "
         "are fractional."),
        (lambda: _rope64(x, positions, 10000.0, pairing) if base != 10000.0 else None,
         f"this case uses base={base:g}, and the answer matches base 10000: use the base argument, "
         "not a hard-coded 10000."),
        (lambda: _rope64(x, positions, base, other, sign=-1.0),
         f"wrong pairing and wrong direction: see the exercise text for the {pairing} pairing."),
    ]


def _fractional(positions: torch.Tensor) -> bool:
    p = positions.double()
    return bool((p != p.round()).any())


def _check_rope(apply_fn: Callable, name: str, pairing: str, hidden: bool) -> None:
    g = generator(91 if pairing == "half" else 92)
    cases = [((6, 8), torch.arange(6), 10000.0),
             ((2, 3, 5, 16), torch.tensor([0, 3, 7, 12, 40]), 100.0)]
    if hidden:
        g = hidden_generator(name)
        rng = hidden_rng(name)
        cases += [((4, 2), torch.arange(4), 10000.0),
                  ((3, 2, 7, 64), torch.arange(7) * 5, 10000.0),
                  ((2, 9, 32), torch.tensor([0.0, 0.5, 1.25, 2.0, 7.5, 10.0, 11.0, 30.25, 31.0]), 10000.0),
                  ((1, 4, 6, 10), torch.arange(10, 16), 1e6)]
        for _ in range(2):
            # Positions up to 40, as in the cases above: float32 angles stay within the tolerance.
            T = rng.randrange(1, 13)
            shape = (*(rng.randrange(1, 4) for _ in range(rng.randrange(0, 3))), T, 2 * rng.randrange(1, 33))
            if rng.random() < 0.5:
                positions = torch.arange(T) * rng.randrange(1, 4) + rng.randrange(0, 4)
            else:
                positions = (torch.rand(T, generator=g) * 40).sort().values
            cases.append((shape, positions, _draw_base(rng)))
    for shape, positions, base in cases:
        x = torch.randn(*shape, generator=g)
        x_before = x.clone()
        got = call(apply_fn, x, positions, base)
        label = f"{name} on x of shape {shape}, {_show_positions(positions)}, base={base:g}"
        expect(torch.equal(x, x_before), f"{name} changed its input x in place.", "return a new tensor.")
        expect_tensor(got, shape, label)
        want = _rope64(x, positions, base, pairing)
        if _matches(got, want, atol=2e-5):
            expect_close(got.double().norm(dim=-1), x.double().norm(dim=-1), f"the norms of {label}",
                         "a rotation keeps the length of every vector.", atol=1e-4)
            continue
        default = ("rotate pair j by the angle position * theta_j with theta_j = base^(-2j/d_head); "
                   + ("pairs are (j, j + d_head/2): x * cos + rotate_half(x) * sin with cos/sin of "
                      "torch.cat((angles, angles), -1)." if pairing == "half" else
                      "pairs are (2j, 2j + 1): (a cos - b sin, a sin + b cos) written back to 2j, 2j + 1."))
        hint = _diagnose(got, _rope_variants(x, positions, base, pairing), default, atol=2e-5)
        if hint is default:
            zero = positions == 0
            if zero.any() and not _matches(got[..., zero, :], x[..., zero, :].double(), atol=1e-6):
                fail(f"{label}: at position 0 the vectors changed.", "at position 0 every angle is 0 and the "
                     "rotation is the identity. " + default)
            if not torch.allclose(got.double().norm(dim=-1), x.double().norm(dim=-1), atol=1e-4, rtol=1e-4):
                fail(f"{label}: the vectors' norms changed; a rotation keeps them.",
                     "both members of a pair must be rotated by the same angle with cos and sin of that angle. "
                     + default)
        expect_close(got.double(), want, label, hint, atol=2e-5)
    # The property RoPE exists for: the score of q at m and k at n depends only on m - n.
    d = 16
    q, k = torch.randn(d, generator=g), torch.randn(d, generator=g)
    for shift in (3, 17):
        m, n = torch.tensor([5, 2, 9]), torch.tensor([1, 2, 14])
        s0 = (call(apply_fn, q.repeat(3, 1), m, 10000.0) * call(apply_fn, k.repeat(3, 1), n, 10000.0)).sum(-1)
        s1 = (call(apply_fn, q.repeat(3, 1), m + shift, 10000.0) * call(apply_fn, k.repeat(3, 1), n + shift, 10000.0)).sum(-1)
        expect_close(s1, s0.detach(), f"the scores after shifting both positions by {shift}",
                     "a RoPE score must depend only on m - n: rotate q and k by position * theta_j, the same "
                     "theta_j for both.", atol=1e-4)


def check_apply_rope(apply_rope, hidden: bool = False) -> None:
    _check_rope(apply_rope, "apply_rope", "half", hidden)


# ----------------------------------------------------------------------------- exercise 6

def check_apply_rope_interleaved(apply_rope_interleaved, rope_frequencies=None, hidden: bool = False) -> None:
    """rope_frequencies, when given, is the exercise 5 answer it may call: a failure it causes is
    blamed on it."""
    earlier = [] if rope_frequencies is None else [
        ("apply_rope_interleaved may call your rope_frequencies, which fails exercise 5's tests",
         lambda: check_rope_frequencies(rope_frequencies))]
    with earlier_first(*earlier):
        _check_rope(apply_rope_interleaved, "apply_rope_interleaved", "interleaved", hidden)


def _row_order(n_heads: int, d_head: int, kind: str) -> torch.Tensor:
    perm = torch.cat((torch.arange(0, d_head, 2), torch.arange(1, d_head, 2)))      # (d_head,)
    if kind == "inverse":
        perm = torch.argsort(perm)
    if kind == "global":
        return torch.cat((torch.arange(0, n_heads * d_head, 2), torch.arange(1, n_heads * d_head, 2)))
    return (torch.arange(n_heads)[:, None] * d_head + perm).flatten()                  # (n_heads * d_head,)


def _rope_scores(w_q: torch.Tensor, w_k: torch.Tensor, x: torch.Tensor, n_heads: int, pairing: str) -> torch.Tensor:
    T = x.shape[0]
    positions = torch.arange(T)
    q = (x.double() @ w_q.double().T).view(T, n_heads, -1).transpose(0, 1)     # (n_heads, T, d_head)
    k = (x.double() @ w_k.double().T).view(T, n_heads, -1).transpose(0, 1)     # (n_heads, T, d_head)
    q, k = _rope64(q, positions, 10000.0, pairing), _rope64(k, positions, 10000.0, pairing)
    return q @ k.transpose(-2, -1)                                              # (n_heads, T, T)


def check_interleaved_to_half_split(interleaved_to_half_split, hidden: bool = False) -> None:
    configs = [(2, 8, 12)]
    if hidden:
        rng = hidden_rng("interleaved_to_half_split")
        configs += [(4, 16, 24), (3, 6, 18), (1, 32, 32), (8, 2, 16)]
        configs += [(rng.randrange(1, 9), 2 * rng.randrange(1, 17), rng.randrange(2, 49)) for _ in range(2)]
    g = generator(101) if not hidden else hidden_generator("interleaved_to_half_split")
    for n_heads, d_head, d_model in configs:
        d_out = n_heads * d_head
        w_q, w_k = torch.randn(d_out, d_model, generator=g), torch.randn(d_out, d_model, generator=g)
        before = w_q.clone()
        new_q = call(interleaved_to_half_split, w_q, n_heads)
        new_k = call(interleaved_to_half_split, w_k, n_heads)
        label = f"interleaved_to_half_split(weight of shape {(d_out, d_model)}, n_heads={n_heads})"
        expect(torch.equal(w_q, before), "interleaved_to_half_split changed the weight it was given.",
               "return a new tensor; do not edit weight in place.")
        expect_tensor(new_q, (d_out, d_model), label)
        want_q = w_q[_row_order(n_heads, d_head, "forward")]
        if torch.equal(new_q, want_q):
            x = torch.randn(5, d_model, generator=g)
            expect_close(_rope_scores(new_q, new_k, x, n_heads, "half"), _rope_scores(w_q, w_k, x, n_heads, "interleaved"),
                         "half-split scores with the converted weights", "permute the rows of both W_q and W_k.",
                         atol=1e-8)
            continue
        x = torch.randn(5, d_model, generator=g)
        same_scores = _matches(_rope_scores(new_q, new_k, x, n_heads, "half"),
                               _rope_scores(w_q, w_k, x, n_heads, "interleaved"), atol=1e-8)
        if torch.equal(new_q, w_q):
            hint = ("the rows were not reordered: within each head, rows 0, 2, 4, ... must come first, then rows "
                    "1, 3, 5, ...")
        elif torch.equal(new_q, w_q[_row_order(n_heads, d_head, "inverse")]):
            hint = ("that is the inverse permutation (half-split to interleaved): within each head, the new row order "
                    "is [0, 2, 4, ..., d_head - 2, 1, 3, ..., d_head - 1], i.e. view(n_heads, d_head // 2, 2, d_model)"
                    ".transpose(1, 2).")
        elif n_heads > 1 and torch.equal(new_q, w_q[_row_order(n_heads, d_head, "global")]):
            hint = ("the rows were reordered across the whole matrix, mixing the heads: reorder within each head's "
                    "block of d_head rows (view(n_heads, d_head // 2, 2, d_model)).")
        elif d_out == d_model and torch.equal(new_q, w_q[:, _row_order(n_heads, d_head, "forward")]):
            hint = "permute the rows (the outputs q = x @ W.T), not the columns (the inputs)."
        elif same_scores:
            hint = ("the scores agree, but the rows are not in the order the exercise asks for: "
                    "[0, 2, 4, ..., 1, 3, 5, ...] within each head.")
        else:
            hint = ("within each head, the interleaved pair (2j, 2j + 1) must move to rows (j, j + d_head/2): new row "
                    "order [0, 2, 4, ..., 1, 3, 5, ...] per head.")
        fail(f"{label} put the rows in the wrong order: half-split RoPE on the converted weights should give "
             f"exactly the scores of interleaved RoPE on the original ones"
             f"{' (they do)' if same_scores else ' (they do not)'}.", hint)


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


def check_alibi_bias(alibi_bias, hidden: bool = False) -> None:
    cases = [(torch.tensor([0.5]), 3), (torch.tensor(_alibi_slopes_oracle(4), dtype=torch.float32), 6)]
    if hidden:
        g, rng = hidden_generator("alibi_bias"), hidden_rng("alibi_bias")
        cases += [(torch.rand(3, generator=g) + 0.1, 1), (torch.tensor(_alibi_slopes_oracle(12), dtype=torch.float32), 9),
                  (torch.rand(5, generator=g), 17)]
        # seq_len 4 and up: the hand-derived 3 x 3 bias above belongs to the slope 0.5.
        cases += [(torch.rand(rng.randrange(1, 13), generator=g), rng.randrange(4, 33)),
                  (torch.tensor(_alibi_slopes_oracle(rng.randrange(1, 17)), dtype=torch.float32), rng.randrange(4, 33))]
    hand = torch.tensor([[[0.0, -0.5, -1.0], [-0.5, 0.0, -0.5], [-1.0, -0.5, 0.0]]], dtype=torch.float64)
    for slopes, seq_len in cases:
        before = slopes.clone()
        got = call(alibi_bias, slopes, seq_len)
        n = slopes.shape[0]
        label = f"alibi_bias(slopes of {n} head{'s' if n != 1 else ''}, seq_len={seq_len})"
        expect(torch.equal(slopes, before), "alibi_bias changed the slopes it was given.", "do not edit slopes in place.")
        expect_tensor(got, (n, seq_len, seq_len), label)
        i = torch.arange(seq_len, dtype=torch.float64)
        signed = i[:, None] - i[None, :]                                              # (seq_len, seq_len): i - j
        m = slopes.double()[:, None, None]                                            # (n_heads, 1, 1)
        want = hand if seq_len == 3 and n == 1 else -m * signed.abs()
        if _matches(got, want, atol=1e-6):
            continue
        hint = _diagnose(got, [
            (lambda: m * signed.abs(), "the bias must be a penalty: -m_h * |i - j| is zero on the diagonal and "
                                       "negative elsewhere (mind the minus sign)."),
            (lambda: -m * signed, "use the distance |i - j|: with -m_h * (i - j) the entries above the diagonal "
                                  "(j > i) become positive, a bonus for distance."),
            (lambda: m * signed, "use the distance |i - j|, with a minus sign: bias[h, i, j] = -m_h * |i - j|."),
            (lambda: -signed.abs().expand(n, seq_len, seq_len), "multiply the distance by the slope of each head: "
                                                                 "slopes[:, None, None] * |i - j|."),
        ], f"for {n} slope{'s' if n != 1 else ''} and seq_len={seq_len}: bias[h, i, j] = -slopes[h] * |i - j|: "
           "slopes[:, None, None] times the (seq_len, seq_len) distance matrix.", atol=1e-6)
        expect_close(got.double(), want, label, hint, atol=1e-6)


# ----------------------------------------------------------------------------- exercise 8

def check_interpolate_positions(interpolate_positions, hidden: bool = False) -> None:
    cases = [(torch.arange(8), 2.0), (torch.arange(6), 1.0)]
    if hidden:
        g, rng = hidden_generator("interpolate_positions"), hidden_rng("interpolate_positions")
        cases += [(torch.arange(4096), 4.0), (torch.tensor([0.0, 2.5, 7.0]), 1.5), (torch.arange(10, 30), 8.0),
                  (torch.arange(5), 3.0)]
        start = rng.randrange(0, 100)
        cases += [(torch.arange(start, start + rng.randrange(1, 2000)), round(rng.uniform(1.0, 16.0), 2)),
                  ((torch.rand(rng.randrange(1, 50), generator=g) * 100).sort().values, round(rng.uniform(1.0, 16.0), 2))]
    for positions, scale in cases:
        before = positions.clone()
        got = call(interpolate_positions, positions, scale)
        label = f"interpolate_positions({_show_positions(positions)}, scale={scale:g})"
        expect(torch.equal(positions, before), "interpolate_positions changed the positions it was given.",
               "return a new tensor (positions / scale), do not divide in place.")
        expect_tensor(got, tuple(positions.shape), label)
        expect(got.is_floating_point(), f"{label} has dtype {got.dtype}: interpolated positions are fractional.",
               "convert to float before dividing: positions.float() / scale (integer division drops the fractions).")
        want = positions.double() / scale
        if _matches(got, want, atol=1e-5):
            continue
        hint = _diagnose(got, [
            (lambda: positions.double() * scale,
             "the scale is inverted: position interpolation squeezes the longer range into the trained one, "
             "positions / scale, so that target_len positions land in [0, train_len)."),
            (lambda: torch.floor(positions.double() / scale),
             "keep the fractional positions: positions.float() / scale, not // (RoPE angles accept any real position)."),
        ] + ([(lambda: positions.double().trunc() / scale,
               f"the positions here are fractional ({_show_positions(positions)}) and the answer rounded them "
               "first: divide the given positions as floats, positions.float() / scale.")]
             if _fractional(positions) else []),
            f"for {_show_positions(positions)} and scale={scale:g}: return positions / scale as floats.")
        expect_close(got.double(), want, label, hint)


def check_ntk_scaled_base(ntk_scaled_base, hidden: bool = False) -> None:
    cases = [(10000.0, 4.0, 128), (10000.0, 1.0, 64), (500000.0, 8.0, 64)]
    if hidden:
        rng = hidden_rng("ntk_scaled_base")
        cases += [(10000.0, 2.0, 4), (10000.0, 16.0, 256), (1e6, 1.5, 96), (100.0, 3.0, 8)]
        cases += [(_draw_base(rng), round(rng.uniform(1.0, 32.0), 2), 2 * rng.randrange(2, 129)) for _ in range(3)]
    for base, scale, d_head in cases:
        got = call(ntk_scaled_base, base, scale, d_head)
        label = f"ntk_scaled_base({base:g}, scale={scale:g}, d_head={d_head})"
        try:
            value = float(got)
        except (TypeError, ValueError):
            fail(f"{label} returned {type(got).__name__}, expected a number.", "return a float: the new base.")
        want = base * scale ** (d_head / (d_head - 2))
        if math.isclose(value, want, rel_tol=1e-6):
            # The property the rule is built for: the lowest frequency is divided by exactly `scale`,
            # the highest (j = 0) stays 1.
            old, new = _freqs64(d_head, base), _freqs64(d_head, value)
            expect(math.isclose(new[-1].item(), old[-1].item() / scale, rel_tol=1e-6),
                   f"{label}: the lowest frequency is not divided by the scale.", "new base = base * scale ** (d_head / (d_head - 2)).")
            continue
        variants = [
            (base * scale, "the NTK rule raises the scale to the power d_head / (d_head - 2): base * scale ** "
                           "(d_head / (d_head - 2)), so that the lowest frequency is divided by exactly scale."),
            (base * scale ** ((d_head - 2) / d_head), "the exponent is d_head / (d_head - 2), not its inverse."),
            (base / scale ** (d_head / (d_head - 2)), "the base must grow (longer wavelengths): multiply by "
                                                      "scale ** (d_head / (d_head - 2)), do not divide."),
            (base * scale ** (d_head / (d_head - 1)), "the exponent is d_head / (d_head - 2): the lowest frequency is "
                                                      "theta = base^(-(d_head - 2)/d_head)."),
        ]
        hint = next((h for v, h in variants if math.isclose(value, v, rel_tol=1e-6) and not math.isclose(v, want)),
                    f"for base={base:g}, scale={scale:g}, d_head={d_head}: new base = base * scale ** "
                    "(d_head / (d_head - 2)).")
        fail(f"{label} returned {value:.6g}, expected {want:.6g}.", hint)
