"""Checks for chapter 6: sampling, the KV cache, generation, beam search, int8 weights,
memory estimates and speculative decoding.

Oracles: the sampling pipeline written here in float64 (penalty, temperature, top-k, top-p)
and ``torch.multinomial`` with the same seeded generator; grouped-query attention with RoPE
over the whole sequence in float64 (the uncached model); a small decoder of our own, fed each
prompt alone without padding or cache, whose greedy choice every generated token of the batch
must be (within 1e-4 of the largest logit), with the inputs of every call recorded; a
reference beam search; per-group int8 quantisation by its definition; parameter counts checked
against published totals (Llama-2-7B has 6,738,415,616 parameters); and, for speculative
decoding, chi-square tests of the emitted tokens against the target distribution, each
bounded at p = 1e-7: a hidden run makes one per emitted position of each case (besides the
acceptance-rate tests at 5.5 sigma), so a correct answer fails in a small multiple of one run
in ten million.
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from ._core import CheckFailed, call, earlier_first, expect, expect_close, expect_tensor, fail, generator
from ._core import judge_prediction, one_thread as _one_thread
from ._hidden import hidden_generator, hidden_rng, hidden_seed

# ----------------------------------------------------------------------------- helpers




def _same(a: torch.Tensor, b: torch.Tensor, atol: float = 1e-4, rtol: float = 1e-4) -> bool:
    a = a.detach()
    return a.shape == b.shape and torch.allclose(a.double(), b.double(), atol=atol, rtol=rtol, equal_nan=True)

# ----------------------------------------------------------------------------- exercise 1: processing logits


def _penalise(logits: torch.Tensor, prev: torch.Tensor | None, r: float, mode: str = "ok") -> torch.Tensor:
    out = logits.clone()
    if prev is None or r == 1.0:
        return out
    for b in range(out.shape[0]):
        tokens = prev[b].tolist()
        for t in (tokens if mode == "per_occurrence" else sorted(set(tokens))):
            v = out[b, t]
            if mode == "divide":
                out[b, t] = v / r
            else:
                out[b, t] = v / r if v > 0 else v * r
    return out


def _top_k(x: torch.Tensor, k: int | None, strict: bool = False) -> torch.Tensor:
    if k is None or k >= x.shape[-1]:
        return x
    kth = x.topk(k, dim=-1).values[..., -1:]
    return x.masked_fill(x <= kth if strict else x < kth, float("-inf"))


def _mass_before(x: torch.Tensor) -> torch.Tensor:
    """For each token, the probability of the tokens ranked above it (sorted by logit)."""
    probs = torch.softmax(x.double(), dim=-1)
    sorted_p, order = probs.sort(dim=-1, descending=True)
    before_sorted = sorted_p.cumsum(-1) - sorted_p
    return torch.empty_like(before_sorted).scatter_(-1, order, before_sorted)


def _top_p_keep(x: torch.Tensor, p: float | None, inclusive: bool = False) -> torch.Tensor:
    if p is None:
        return torch.isfinite(x)
    before = _mass_before(x)
    if inclusive:   # the bug: drop the token that crosses p (keep only cumsum <= p, but the best stays)
        probs = torch.softmax(x.double(), dim=-1)
        keep = before + probs <= p
        keep |= before == 0
        return keep & torch.isfinite(x)
    return (before < p) & torch.isfinite(x)


def _process(logits, temperature=1.0, top_k=None, top_p=None, penalty=1.0, prev=None, variant="ok"):
    x = _penalise(logits.double(), prev, penalty, mode={"divide": "divide", "per_occurrence": "per_occurrence"}
                  .get(variant, "ok"))
    if variant == "top_p_before_temperature":
        keep_p = _top_p_keep(_top_k(x, top_k), top_p)
        x = _top_k(x / temperature, top_k)
        return x.masked_fill(~keep_p, float("-inf"))
    x = x / temperature
    if variant == "top_p_before_top_k":
        keep_p = _top_p_keep(x, top_p)
        return _top_k(x.masked_fill(~keep_p, float("-inf")), top_k)
    x = _top_k(x, top_k, strict=variant == "top_k_strict")
    keep = _top_p_keep(x, top_p, inclusive=variant == "top_p_inclusive")
    return x.masked_fill(~keep, float("-inf"))


def _keep_sets_agree(got_keep: torch.Tensor, x_before_top_p: torch.Tensor, top_p: float | None,
                     want_keep: torch.Tensor) -> bool:
    """Kept sets equal, except tokens whose mass-before lies within 1e-6 of top_p (rounding)."""
    if top_p is None:
        return bool(torch.equal(got_keep, want_keep))
    before = _mass_before(x_before_top_p)
    unsure = (before - top_p).abs() < 1e-6
    return bool(torch.equal(got_keep | unsure, want_keep | unsure))


def _sampler_cases(hidden: bool) -> list[dict]:
    g = generator(601)
    base = torch.randn(3, 12, generator=g) * 2
    prev = torch.tensor([[0, 3, 3, 7], [1, 1, 1, 2], [11, 5, 0, 4]])
    base[:, 3] = base[:, 3].abs() + 1.0      # a positive logit that was seen (divide it)
    base[:, 1] = -base[:, 1].abs() - 0.5     # a negative one (multiply it)
    cases = [dict(logits=base, temperature=1.0),
             dict(logits=base, temperature=0.7, top_k=5),
             dict(logits=base, temperature=1.0, top_p=0.8),
             dict(logits=base, temperature=2.5, top_p=0.6),
             dict(logits=base, temperature=0.5, top_p=0.7),
             dict(logits=base, temperature=1.0, top_k=6, top_p=0.5),
             dict(logits=base, temperature=1.0, repetition_penalty=1.5, prev_tokens=prev),
             dict(logits=base, temperature=0.8, top_k=7, top_p=0.9, repetition_penalty=1.3, prev_tokens=prev)]
    ties = torch.tensor([[2.0, 1.0, 1.0, 1.0, 0.0, -1.0], [0.5, 0.5, 0.5, 0.5, 0.5, 0.5]])
    cases += [dict(logits=ties, temperature=1.0, top_k=2),       # the k-th logit ties: every tied token stays
              dict(logits=base, temperature=1.0, top_k=13),      # top_k above the vocabulary: nothing removed
              dict(logits=torch.randn(2, 12, generator=g) * 1e4, temperature=0.05, top_k=6, top_p=0.9)]  # extreme
    if not hidden:
        return cases
    rng, g = hidden_rng("sampler"), hidden_generator("sampler")
    out = []
    for _ in range(10):
        B, V = rng.randrange(1, 5), rng.randrange(2, 60)
        logits = torch.randn(B, V, generator=g) * rng.choice([0.5, 2.0, 6.0])
        prev = torch.randint(0, V, (B, rng.randrange(1, 12)), generator=g)
        case = dict(logits=logits, temperature=rng.choice([0.3, 0.7, 1.0, 1.6, 3.0]))
        if rng.random() < 0.7:
            case["top_k"] = rng.randrange(1, V + 2)
        if rng.random() < 0.7:
            case["top_p"] = rng.choice([0.05, 0.3, 0.5, 0.75, 0.9, 0.97, 1.0])
        if rng.random() < 0.6:
            case.update(repetition_penalty=rng.choice([1.1, 1.3, 2.0]), prev_tokens=prev)
        out.append(case)
    V = rng.randrange(8, 40)
    big = torch.randn(2, V, generator=g) * 1e4                     # extreme range: a stable softmax
    out.append(dict(logits=big, temperature=0.05, top_p=0.9, top_k=V // 2))
    ties = torch.zeros(1, V)                                         # a flat row: every token ties
    out.append(dict(logits=ties, temperature=1.0, top_k=3))
    out.append(dict(logits=torch.randn(2, V, generator=g), temperature=1.0, top_p=1e-9))   # only the best stays
    prev = torch.randint(0, V, (2, 30), generator=g)                  # many repeats of each token
    out.append(dict(logits=torch.randn(2, V, generator=g) * 3, temperature=1.0, repetition_penalty=1.8,
                    prev_tokens=prev))
    return cases + out


_SAMPLER_VARIANTS = [
    ("top_p_before_temperature", "apply the temperature before top-p: top-p must see the distribution that "
     "is sampled from, so order: repetition penalty, temperature, top-k, top-p."),
    ("top_p_before_top_k", "apply top-k first, then top-p on the renormalised distribution of what top-k kept "
     "(order: repetition penalty, temperature, top-k, top-p)."),
    ("top_p_inclusive", "keep the token that crosses top_p: keep a token when the probability of the tokens "
     "ranked above it is still below top_p (the best token always stays)."),
    ("top_k_strict", "keep k tokens: remove only logits strictly below the k-th largest (logits < kth)."),
    ("divide", "a repetition penalty divides positive logits but multiplies negative ones: dividing a negative "
     "logit by the penalty makes a repeated token MORE likely."),
    ("per_occurrence", "penalise each distinct previous token once, not once per occurrence (the penalty is "
     "not raised to the number of repeats)."),
]


def _first_difference(got: torch.Tensor, x_before: torch.Tensor, want_keep: torch.Tensor, ok_set: bool) -> str:
    """Where the processed logits first go wrong: a token kept or removed wrongly, or a kept
    token whose log-probability among the kept ones is wrong (row and token named)."""
    got_keep = torch.isfinite(got)
    if not ok_set:
        row = int((got_keep != want_keep).any(-1).nonzero()[0])
        extra = (got_keep[row] & ~want_keep[row]).nonzero().flatten().tolist()
        missing = (want_keep[row] & ~got_keep[row]).nonzero().flatten().tolist()
        parts = ([f"kept token(s) {extra[:5]} that should be removed"] if extra else []) + \
                ([f"removed token(s) {missing[:5]} that should stay"] if missing else [])
        return (f"kept the wrong tokens: in row {row} it {' and '.join(parts)} ({int(got_keep[row].sum())} kept, "
                f"expected {int(want_keep[row].sum())})")
    got_lp = torch.log_softmax(got.masked_fill(~got_keep, float("-inf")), -1)
    want_lp = torch.log_softmax(x_before.masked_fill(~got_keep, float("-inf")), -1)
    gap = (got_lp - want_lp).masked_fill(~got_keep, 0).abs()
    row, token = divmod(int(gap.argmax()), gap.shape[-1])
    return (f"kept the right tokens with the wrong logits: in row {row}, token {token} has log-probability "
            f"{got_lp[row, token].item():.4f} among the kept tokens, expected {want_lp[row, token].item():.4f}")


def _label(case: dict) -> str:
    args = [f"{k}={v}" for k, v in case.items() if k not in ("logits", "prev_tokens")]
    top = float(case["logits"].abs().max())
    size = f" up to {top:.3g} in size" if top > 100 else ""
    return f"process_logits(logits of shape {tuple(case['logits'].shape)}{size}, {', '.join(args)})"


@_one_thread
def check_process_logits(process_logits, hidden: bool = False) -> None:
    for case in _sampler_cases(hidden):
        logits = case["logits"]
        original = logits.clone()
        kwargs = {k: v for k, v in case.items() if k != "logits"}
        got = call(process_logits, logits, **kwargs, name="process_logits")
        expect_tensor(got, tuple(logits.shape), _label(case))
        expect(torch.equal(logits, original), "process_logits changed the logits it was given.",
               "work on a copy (logits.clone()) or with out-of-place operations; the caller may reuse them.")
        expect(not torch.isnan(got).any(), f"{_label(case)} returned NaN.",
               "use float('-inf') for removed tokens and never divide by zero.")
        expect(torch.isfinite(got).any(dim=-1).all(), f"{_label(case)} removed every token of a row.",
               "the most probable token must always stay, whatever top_k or top_p are: top-k keeps k tokens, and "
               "top-p keeps the token that crosses top_p.")
        temperature, top_k, top_p = case.get("temperature", 1.0), case.get("top_k"), case.get("top_p")
        penalty, prev = case.get("repetition_penalty", 1.0), case.get("prev_tokens")
        want = _process(logits, temperature, top_k, top_p, penalty, prev)
        x_before = _top_k(_penalise(logits.double(), prev, penalty) / temperature, top_k)
        got_keep = torch.isfinite(got)
        ok_set = _keep_sets_agree(got_keep, x_before, top_p, torch.isfinite(want))
        # Kept values: those before top-p (top-p only removes), compared up to a shift per row.
        ok_values = ok_set and _same(torch.log_softmax(got.double().masked_fill(~got_keep, float("-inf")), -1)
                                     .masked_fill(~got_keep, 0),
                                     torch.log_softmax(x_before.masked_fill(~got_keep, float("-inf")), -1)
                                     .masked_fill(~got_keep, 0), atol=1e-4)
        if ok_values:
            continue
        hint = ("follow the order: repetition penalty on the raw logits, divide by the temperature, top-k, then "
                "top-p; set removed tokens to -inf.")
        for variant, text in _SAMPLER_VARIANTS:
            alt = _process(logits, temperature, top_k, top_p, penalty, prev, variant=variant)
            same_set = torch.equal(got_keep, torch.isfinite(alt))
            if same_set and not torch.equal(alt.isfinite(), want.isfinite()):
                hint = text
                break
            if same_set and ok_set and _same(torch.log_softmax(got.double(), -1).masked_fill(~got_keep, 0),
                                             torch.log_softmax(alt, -1).masked_fill(~got_keep, 0)):
                hint = text
                break
        else:
            want_keep = torch.isfinite(want)
            if (top_k is not None and not ok_set and bool((got_keep.sum(-1) == min(top_k, got.shape[-1])).all())
                    and bool((got_keep <= want_keep).all()) and bool((want_keep.sum(-1) > top_k).any())):
                hint = ("tokens tied with the k-th largest logit stay: remove only logits strictly below the k-th "
                        "largest (x < kth); the indices from topk break ties arbitrarily.")
            elif (top_p is not None and float(x_before.masked_fill(~x_before.isfinite(), 0).abs().max()) > 80
                  and bool((got_keep >= want_keep).all())):
                hint = ("these logits reach e^80 and beyond: exp() overflows to inf, inf / inf is NaN, and a NaN "
                        "probability is never removed by top-p. Subtract each row's maximum before exp (torch.softmax "
                        "does).")
            elif ok_set and _same(torch.log_softmax(got.double() * temperature, -1).masked_fill(~got_keep, 0),
                                torch.log_softmax(want, -1).masked_fill(~got_keep, 0)) and temperature != 1:
                hint = "divide the logits by the temperature (a low temperature sharpens the distribution)."
        fail(f"{_label(case)} {_first_difference(got.double(), x_before, torch.isfinite(want), ok_set)}.", hint)

# ----------------------------------------------------------------------------- exercise 2: sampling


@_one_thread
def check_sample_next_token(sample_next_token, process_logits, hidden: bool = False) -> None:
    """The draws must be those of torch.multinomial with the given generator on the softmax of
    the answer's own process_logits (checked on its own in exercise 1), so this exercise is
    judged on the sampling step alone; a failure that a wrong process_logits explains (logits
    changed in place, every token removed) is blamed on it."""
    with earlier_first(("sample_next_token calls your process_logits, which fails exercise 1's tests",
                        lambda: check_process_logits(process_logits))):
        _check_sample_next_token(sample_next_token, process_logits, hidden)


def _check_sample_next_token(sample_next_token, process_logits, hidden: bool) -> None:
    cases = _sampler_cases(hidden)
    if hidden:
        cases = cases[len(_sampler_cases(False)):]
    rng = hidden_rng("sample_next_token")
    for i, case in enumerate(cases):
        kwargs = {k: v for k, v in case.items() if k != "logits"}
        seed = 6000 + i if not hidden else rng.randrange(2**40)
        torch.manual_seed(1)
        first = call(sample_next_token, case["logits"], generator(seed), **kwargs, name="sample_next_token")
        expect_tensor(first, (case["logits"].shape[0],), "sample_next_token's result")
        expect(first.dtype == torch.long, f"sample_next_token returned {first.dtype}, expected torch.long.",
               "return token ids: torch.multinomial(...) gives int64; squeeze the last dimension.")
        torch.manual_seed(2)
        again = call(sample_next_token, case["logits"], generator(seed), **kwargs, name="sample_next_token")
        if not torch.equal(first, again):
            fail("sample_next_token gave different tokens for the same generator seed when the global seed changed.",
                 "draw with the generator you are given: torch.multinomial(probs, 1, generator=generator); the global "
                 "RNG (torch.manual_seed) must not matter.")
        x = call(process_logits, case["logits"].clone(), **kwargs, name="process_logits").detach().float()
        want = torch.multinomial(torch.softmax(x, -1), 1, generator=generator(seed)).squeeze(-1)
        if not torch.equal(first, want):
            allowed = torch.isfinite(x).gather(-1, first.clamp(0, x.shape[-1] - 1)[:, None]).all()
            hint = ("one draw per row: probs = softmax(process_logits(...)), then "
                    "torch.multinomial(probs, 1, generator=generator).squeeze(-1).")
            if not allowed:
                hint = "a token that process_logits removed was sampled: sample from softmax of the processed logits."
            fail(f"sample_next_token with {', '.join(f'{k}={v}' for k, v in kwargs.items() if k != 'prev_tokens')} "
                 f"drew {first.tolist()}, expected {want.tolist()} with the same generator seed.", hint)
    # Temperature 0 means greedy, handled explicitly: no division by zero, no random draw.
    g = generator(602) if not hidden else hidden_generator("sample_next_token/greedy")
    greedy_cases = [(torch.randn(4, 9, generator=g), None, 1.0)]
    logits = torch.randn(3, 10, generator=g)
    top = logits.argmax(-1)
    logits[torch.arange(3), (top + 1) % 10] = logits.max(-1).values - 0.05    # a close runner-up
    greedy_cases.append((logits, top[:, None].repeat(1, 2), 1.5))              # the best was seen: penalised
    if hidden:
        V = rng.randrange(2, 50)
        greedy_cases.append((torch.randn(rng.randrange(1, 5), V, generator=g) * 5,
                             torch.randint(0, V, (1, 1), generator=g), 1.2))
    for logits, prev, penalty in greedy_cases:
        prev_b = None if prev is None else prev.expand(logits.shape[0], -1)
        got = call(sample_next_token, logits, None, temperature=0.0, repetition_penalty=penalty, prev_tokens=prev_b,
                   name="sample_next_token")
        want = _penalise(logits.double(), prev_b, penalty).argmax(-1)
        if not (isinstance(got, torch.Tensor) and torch.equal(got.long(), want)):
            hint = "with temperature 0 return the argmax of the (penalised) logits, without drawing at random."
            if isinstance(got, torch.Tensor) and torch.equal(got.long(), logits.argmax(-1)):
                hint = "apply the repetition penalty before the argmax too: greedy decoding repeats itself without it."
            fail(f"sample_next_token(..., temperature=0.0) gave {got.tolist() if isinstance(got, torch.Tensor) else got}, "
                 f"expected the greedy tokens {want.tolist()}.", hint)

# ----------------------------------------------------------------------------- exercise 3: the cached layer


def _rope64(x: torch.Tensor, positions: torch.Tensor, base: float) -> torch.Tensor:
    """Half-split RoPE of x (B, H, T, d) in float64 at positions (T,), or (B, T): one row per sequence."""
    d = x.shape[-1]
    freqs = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    angles = positions.double()[..., None] * freqs                             # (T, d/2) or (B, T, d/2)
    if positions.dim() == 2:
        angles = angles[:, None]                                               # (B, 1, T, d/2): every head
    angles = torch.cat((angles, angles), dim=-1)
    x1, x2 = x.chunk(2, dim=-1)
    return x * angles.cos() + torch.cat((-x2, x1), dim=-1) * angles.sin()


def _attend64(x, weights, n_heads, n_kv_heads, base, past_len=0, k_past=None, v_past=None, positions="abs",
              mask="bottom_right", repeat="interleave"):
    """Reference GQA self-attention with RoPE for new tokens x (B, T, d) after past_len cached ones.
    Returns out (B, T, d), k, v (B, n_kv_heads, past_len + T, d_head) (k after RoPE)."""
    wq, wk, wv, wo = (w.double() for w in weights)
    x = x.double()
    B, T, d = x.shape
    dh = d // n_heads
    pos = torch.arange(T) + (past_len if positions == "abs" else 0)
    q = _rope64((x @ wq.T).view(B, T, n_heads, dh).transpose(1, 2), pos, base)
    k = _rope64((x @ wk.T).view(B, T, n_kv_heads, dh).transpose(1, 2), pos, base)
    v = (x @ wv.T).view(B, T, n_kv_heads, dh).transpose(1, 2)
    if k_past is not None:
        k, v = torch.cat((k_past.double(), k), 2), torch.cat((v_past.double(), v), 2)
    group = n_heads // n_kv_heads
    rep = (lambda t: t.repeat_interleave(group, dim=1)) if repeat == "interleave" else (lambda t: t.repeat(1, group, 1, 1))
    T_k = k.shape[2]
    scores = q @ rep(k).transpose(-2, -1) / math.sqrt(dh)
    i, j = torch.arange(T)[:, None], torch.arange(T_k)[None, :]
    allowed = {"bottom_right": j <= i + (T_k - T), "top_left": j <= i, "none_with_cache":
               (j <= i + (T_k - T)) if T_k == T else torch.ones(T, T_k, dtype=torch.bool)}[mask]
    scores = scores.masked_fill(~allowed, float("-inf"))
    out = (scores.softmax(-1) @ rep(v)).transpose(1, 2).reshape(B, T, d) @ wo.T
    return out, k, v


def _cached_config(i: int, hidden: bool, rng) -> tuple:
    # A chunk of several tokens after a cache (the mask is bottom-right), and 6 heads over 2 (a group of
    # 3, so that repeat_interleave(n_kv_heads) or repeat cannot pass by chance).
    visible = [(24, 6, 2, 10000.0, 2, [5, 3, 1]), (12, 3, 3, 10000.0, 1, [3, 1, 1])]
    if not hidden:
        return visible[i] if i < len(visible) else None
    drawn = [(32, 4, 1, 500.0, 2, [4, 3, 1, 2]), (24, 6, 2, 10000.0, 1, [200, 1, 2])]   # chunks, long offset
    for _ in range(3):
        n_kv = rng.randrange(1, 4)
        n_heads = n_kv * rng.randrange(1, 4)
        d_model = n_heads * 2 * rng.randrange(1, 5)
        chunks = [rng.randrange(1, 8)] + [rng.randrange(1, 4) for _ in range(rng.randrange(2, 5))]
        drawn.append((d_model, n_heads, n_kv, rng.choice([100.0, 10000.0]), rng.randrange(1, 4), chunks))
    return drawn[i] if i < len(drawn) else None


def _weights(module, d_model, n_heads, n_kv_heads) -> list[torch.Tensor]:
    d_head = d_model // n_heads
    shapes = {"q_proj": (d_model, d_model), "k_proj": (n_kv_heads * d_head, d_model),
              "v_proj": (n_kv_heads * d_head, d_model), "out_proj": (d_model, d_model)}
    out = []
    for name, shape in shapes.items():
        layer = getattr(module, name, None)
        expect(isinstance(layer, nn.Linear), f"CachedSelfAttention needs an nn.Linear attribute `{name}`.",
               f"create self.{name} = nn.Linear(..., bias=False) in __init__ with exactly this name.")
        w = layer.weight.detach()
        expect(tuple(w.shape) == shape, f"{name}.weight has shape {tuple(w.shape)}, expected {shape}.",
               "q_proj and out_proj are (d_model, d_model); k_proj and v_proj produce n_kv_heads * d_head features.")
        out.append(w)
    return out


def _check_cache(cache, B, n_heads, n_kv_heads, T_total, d_head, want_k, want_v, unrotated_k, label) -> None:
    expect(isinstance(cache, (tuple, list)) and len(cache) == 2,
           f"{label} should return (out, (k, v)); the cache was {type(cache).__name__}.",
           "return the concatenated keys and values as a tuple (k, v).")
    k, v = cache
    if isinstance(k, torch.Tensor) and tuple(k.shape) == (B, n_heads, T_total, d_head) and n_heads != n_kv_heads:
        fail(f"{label}: the cached keys have shape {tuple(k.shape)}, one per query head.",
             "cache the n_kv_heads keys and values before repeating them for the query heads: storing "
             "(B, n_kv_heads, T, d_head) is the memory saving of grouped-query attention.")
    expect_tensor(k, (B, n_kv_heads, T_total, d_head), f"{label}: cached keys")
    expect_tensor(v, (B, n_kv_heads, T_total, d_head), f"{label}: cached values")
    if not _same(k, want_k):
        hint = "the cache holds the keys of every position so far, concatenated along time (dim=2)."
        if _same(k, unrotated_k):
            hint = ("cache the keys after RoPE: a cached key keeps the rotation of its own position, so old keys "
                    "never need rotating again.")
        fail(f"{label}: the cached keys differ from the expected ones.", hint)
    expect_close(v, want_v.float(), f"{label}: cached values",
                 "cache the values of every position so far, concatenated along time (dim=2).", atol=1e-4, rtol=1e-4)


@_one_thread
def check_cached_attention(CachedSelfAttention, hidden: bool = False) -> None:
    rng = hidden_rng("cached_attention")
    i = 0
    while (config := _cached_config(i, hidden, rng)) is not None:
        d_model, n_heads, n_kv_heads, base, B, chunks = config
        torch.manual_seed(611 + i if not hidden else hidden_seed(f"cached_attention/init{i}"))
        module = call(CachedSelfAttention, d_model, n_heads, n_kv_heads, rope_base=base, name="CachedSelfAttention(...)")
        weights = _weights(module, d_model, n_heads, n_kv_heads)
        d_head = d_model // n_heads
        T = sum(chunks)
        g = generator(612 + i) if not hidden else hidden_generator(f"cached_attention/x{i}")
        x = torch.randn(B, T, d_model, generator=g)
        tag = f"CachedSelfAttention(d_model={d_model}, n_heads={n_heads}, n_kv_heads={n_kv_heads})"
        # 1. The whole sequence at once, no cache: the uncached model.
        result = call(module, x, name=f"{tag}.forward")
        expect(isinstance(result, (tuple, list)) and len(result) == 2,
               f"{tag}.forward should return (out, (k, v)).", "return the output and the new cache as a pair.")
        out, cache = result
        want, want_k, want_v = _attend64(x, weights, n_heads, n_kv_heads, base)
        expect_tensor(out, (B, T, d_model), f"{tag} output")
        if not _same(out, want):
            hint = ("without a cache this is causal grouped-query attention with RoPE at positions 0..T-1: check the "
                    "head split, apply_rope on q and k, the causal mask and the 1/sqrt(d_head) scale.")
            if n_heads != n_kv_heads and n_kv_heads > 1 and _same(out, _attend64(x, weights, n_heads, n_kv_heads, base,
                                                                             repeat="tile")[0]):
                hint = ("query head h uses key/value head h // (n_heads // n_kv_heads): use repeat_interleave on the "
                        "head dimension, not repeat (which tiles the heads in the wrong order).")
            fail(f"{tag} without a cache differs from causal attention over the whole sequence.", hint)
        unrot = (x.double() @ weights[1].double().T).view(B, T, n_kv_heads, d_head).transpose(1, 2)
        _check_cache(cache, B, n_heads, n_kv_heads, T, d_head, want_k, want_v, unrot, f"{tag} without a cache")
        # 2. A prefill, then new tokens a chunk at a time, each step with the cache of the last.
        cache, start = None, 0
        for n in chunks:
            piece = x[:, start:start + n]
            step = f"{tag} on tokens {start}..{start + n - 1} with {start} cached"
            result = call(module, piece, cache, name=f"{tag}.forward")
            out, cache = result
            expect_tensor(out, (B, n, d_model), f"{step}: output")
            if not _same(out, want[:, start:start + n]):
                k_past, v_past = want_k[:, :, :start], want_v[:, :, :start]
                args = (piece, weights, n_heads, n_kv_heads, base, start, k_past, v_past)
                hint = ("with a cache the new tokens must give exactly the outputs of the uncached model at their "
                        "positions: rotate q and k at positions past_len + arange(T), attend to the cached and new "
                        "keys, and mask so that new token i sees keys j <= past_len + i.")
                if start and _same(out, _attend64(*args, positions="zero")[0]):
                    hint = ("the positions of new tokens must start at the cache length: RoPE for the new tokens uses "
                            "positions past_len, past_len + 1, ..., not 0, 1, ...")
                elif start and _same(out, _attend64(*args, mask="top_left")[0]):
                    hint = ("the causal mask is aligned top-left: with T_q new queries and T_k keys, query i may see "
                            "keys j <= i + (T_k - T_q). is_causal=True in F.scaled_dot_product_attention aligns it "
                            "top-left, which is wrong once keys are cached.")
                elif start and _same(out, _attend64(*args, mask="none_with_cache")[0]):
                    hint = ("several new tokens arrived with a cache and were not masked: each new token may see the "
                            "cache and the new tokens up to itself (j <= past_len + i), not the ones after it.")
                fail(f"{step}: the output differs from the uncached model's output at those positions.", hint)
            start += n
            _check_cache(cache, B, n_heads, n_kv_heads, start, d_head, want_k[:, :, :start], want_v[:, :, :start],
                         unrot[:, :, :start], step)
        i += 1

# ----------------------------------------------------------------------------- exercise 4: batched generation


def _attend_padded64(x, weights, n_heads, n_kv_heads, base, positions, key_mask, k_past=None, v_past=None):
    """GQA self-attention with RoPE at per-row positions (B, T) and a key mask (B, T_past + T), in float64.
    A query sees key j when j is in its causal past and key_mask[b, j]; a row with no such key gives 0."""
    wq, wk, wv, wo = (w.double() for w in weights)
    x = x.double()
    B, T, d = x.shape
    dh = d // n_heads
    q = (x @ wq.T).view(B, T, n_heads, dh).transpose(1, 2)
    k = (x @ wk.T).view(B, T, n_kv_heads, dh).transpose(1, 2)
    v = (x @ wv.T).view(B, T, n_kv_heads, dh).transpose(1, 2)
    q, k = _rope64(q, positions, base), _rope64(k, positions, base)
    if k_past is not None:
        k, v = torch.cat((k_past.double(), k), 2), torch.cat((v_past.double(), v), 2)
    group = n_heads // n_kv_heads
    T_k = k.shape[2]
    scores = q @ k.repeat_interleave(group, 1).transpose(-2, -1) / math.sqrt(dh)
    i, j = torch.arange(T)[:, None], torch.arange(T_k)[None, :]
    allowed = (j <= i + (T_k - T))[None, None] & key_mask[:, None, None, :]      # (B, 1, T, T_k)
    scores = scores.masked_fill(~allowed, float("-inf"))
    weights_ = torch.where(allowed.any(-1, keepdim=True), scores.softmax(-1).nan_to_num(0.0), 0.0)
    out = (weights_ @ v.repeat_interleave(group, 1)).transpose(1, 2).reshape(B, T, d) @ wo.T
    return out, k, v


class TinyDecoder(nn.Module):
    """A small decoder built by the checks: ids (B, T), caches, positions (B, T), attention_mask (B, T_past + T)
    -> logits (B, T, V), new caches.

    Token embeddings plus learned absolute position embeddings (so that a wrong position changes the
    output), then layers of grouped-query attention with RoPE and an MLP. Each layer caches (k, v) of
    shape (B, n_kv_heads, T_total, d_head). The model records the inputs of its first calls in buffers
    (the grader gets a module's state back from the student's kernel, not its Python attributes), which
    the check reads to say what went wrong."""

    MAX_CALLS, MAX_BATCH, MAX_KEYS = 16, 8, 64

    def __init__(self, vocab_size: int, d_model: int, n_layers: int, n_heads: int, n_kv_heads: int,
                 base: float = 10000.0, max_positions: int = 64):
        super().__init__()
        self.vocab_size, self.n_heads, self.n_kv_heads, self.base = vocab_size, n_heads, n_kv_heads, base
        d_head = d_model // n_heads
        self.embed = nn.Embedding(vocab_size, d_model)
        self.pos = nn.Embedding(max_positions, d_model)
        self.attn = nn.ModuleList(nn.ModuleList([nn.Linear(d_model, d_model, bias=False),
                                                 nn.Linear(d_model, n_kv_heads * d_head, bias=False),
                                                 nn.Linear(d_model, n_kv_heads * d_head, bias=False),
                                                 nn.Linear(d_model, d_model, bias=False)]) for _ in range(n_layers))
        self.mlp = nn.ModuleList(nn.Sequential(nn.LayerNorm(d_model), nn.Linear(d_model, 2 * d_model), nn.GELU(),
                                               nn.Linear(2 * d_model, d_model)) for _ in range(n_layers))
        self.norms = nn.ModuleList(nn.LayerNorm(d_model) for _ in range(n_layers))
        self.head = nn.Linear(d_model, vocab_size)
        C, Bm, K = self.MAX_CALLS, self.MAX_BATCH, self.MAX_KEYS
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))
        self.register_buffer("rec_shape", torch.zeros(C, 3, dtype=torch.long))         # B, T, cached tokens
        self.register_buffer("rec_ids", torch.zeros(C, Bm, K, dtype=torch.long))
        self.register_buffer("rec_pos", torch.zeros(C, Bm, K, dtype=torch.long))
        self.register_buffer("rec_mask", torch.zeros(C, Bm, K, dtype=torch.bool))

    def reset_record(self) -> None:
        self.calls.zero_()

    def records(self) -> list[dict]:
        """The inputs of the recorded calls: ids, positions (B, T), mask (B, cached + T), cached."""
        out = []
        for c in range(min(int(self.calls), self.MAX_CALLS)):
            B, T, cached = self.rec_shape[c].tolist()
            out.append({"ids": self.rec_ids[c, :B, :T].clone(), "positions": self.rec_pos[c, :B, :T].clone(),
                        "mask": self.rec_mask[c, :B, :cached + T].clone(), "cached": cached})
        return out

    @torch.no_grad()
    def forward(self, ids: torch.Tensor, kv_caches: list | None = None, positions: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, list]:
        B, T = ids.shape
        past_len = 0 if kv_caches is None else kv_caches[0][0].shape[2]
        if positions is None:
            positions = torch.arange(past_len, past_len + T).expand(B, T)
        if attention_mask is None:
            attention_mask = torch.ones(B, past_len + T, dtype=torch.bool)
        expect(kv_caches is None or T == 1,
               f"the model was called with ids of shape {tuple(ids.shape)} after a cache of {past_len} tokens.",
               "after the prefill, feed only the token each row just chose, shape (B, 1): the cache already holds "
               "the keys and values of everything before it.")
        expect(isinstance(positions, torch.Tensor) and positions.shape == (B, T),
               f"the model was called with ids of shape {tuple(ids.shape)} and positions of shape "
               f"{tuple(getattr(positions, 'shape', ()))}.", "positions has one entry per token fed: shape (B, T).")
        expect(isinstance(attention_mask, torch.Tensor) and attention_mask.shape == (B, past_len + T),
               f"the model was called with {T} new tokens after a cache of {past_len}, and an attention_mask of "
               f"shape {tuple(getattr(attention_mask, 'shape', ()))}, expected {(B, past_len + T)}.",
               "the mask covers every key: the cached tokens and the new ones. Append one True column per "
               "decode step.")
        c = int(self.calls)
        self.calls += 1
        if c < self.MAX_CALLS and B <= self.MAX_BATCH and past_len + T <= self.MAX_KEYS:
            self.rec_shape[c] = torch.tensor([B, T, past_len])
            self.rec_ids[c, :B, :T] = ids.detach().long().cpu()
            self.rec_pos[c, :B, :T] = positions.detach().long().cpu()
            self.rec_mask[c, :B, :past_len + T] = attention_mask.detach().bool().cpu()
        positions = positions.long().clamp(0, self.pos.num_embeddings - 1)
        x = self.embed(ids) + self.pos(positions)
        new = []
        for layer, (attn, mlp, norm) in enumerate(zip(self.attn, self.mlp, self.norms)):
            k_past, v_past = (None, None) if kv_caches is None else kv_caches[layer]
            out, k, v = _attend_padded64(norm(x), [m.weight for m in attn], self.n_heads, self.n_kv_heads,
                                         self.base, positions, attention_mask.bool(), k_past, v_past)
            x = x + out.to(x.dtype)
            x = x + mlp(x)
            new.append((k.to(x.dtype), v.to(x.dtype)))
        return self.head(x), new


def _tiny_model(seed: int, vocab_size: int, d_model: int, n_layers: int, n_heads: int, n_kv_heads: int,
                dtype: torch.dtype = torch.float32) -> TinyDecoder:
    torch.manual_seed(seed)
    model = TinyDecoder(vocab_size, d_model, n_layers, n_heads, n_kv_heads)
    with torch.no_grad():
        model.head.weight.mul_(4.0)    # sharper logits: clear argmax margins
    return model.to(dtype).eval()


def _greedy_alone(model: TinyDecoder, prompt: torch.Tensor, n_new: int) -> list[int]:
    """The uncached model, one unpadded prompt, greedy, no end token: n_new token ids."""
    seq = prompt.clone()
    for _ in range(n_new):
        logits, _ = model(seq[None])
        seq = torch.cat((seq, logits[0, -1].argmax()[None]))
    return seq[len(prompt):].tolist()


def _greedy_margins(model: TinyDecoder, prompt: torch.Tensor, new: list[int]) -> list[bool]:
    """For each new token: is it the argmax (within 1e-4) of the uncached logits that predicted it?"""
    if not new:
        return []
    seq = torch.cat((prompt, torch.tensor(new, dtype=torch.long)))[None]
    logits, _ = model(seq)
    want = logits[0, len(prompt) - 1:len(prompt) - 1 + len(new)].double()
    chosen = want.gather(1, torch.tensor(new)[:, None]).squeeze(1)
    return (chosen >= want.max(-1).values - 1e-4).tolist()


def _pick_eos(continuations: list[list[int]], vocab_size: int) -> int:
    """An end token that ends the rows at different steps, all before the last one where some token allows it."""
    def spread(t):
        firsts = [c.index(t) if t in c else len(c) for c in continuations]
        all_end_early = max(firsts) < len(continuations[0]) - 1          # then the loop must stop early
        return (all_end_early, len(set(firsts)), -t)
    return max(range(vocab_size), key=spread)


def _generation_cases(hidden: bool):
    """(model seeds to try, (vocab, d_model, n_layers, n_heads, n_kv_heads), prompt lengths, max_new_tokens,
    dtype, g). The first seed whose rows all end before the last step is used (or the last one tried), so
    that a loop that never stops early is seen."""
    if not hidden:
        return [([624], (20, 16, 2, 4, 2), [5, 1, 9], 6, torch.float32, generator(620))]
    rng, g = hidden_rng("generate"), hidden_generator("generate")
    cases = []
    for i in range(3):
        n_kv = rng.randrange(1, 3)
        n_heads = n_kv * rng.randrange(1, 3)
        cfg = (rng.randrange(8, 40), n_heads * 2 * rng.randrange(2, 5), rng.randrange(1, 3), n_heads, n_kv)
        lengths = [rng.randrange(1, 12) for _ in range(rng.randrange(2, 5))]
        if len(set(lengths)) == 1:
            lengths[0] += 1                                     # unequal lengths: some rows are padded
        dtype = torch.float64 if i == 2 else torch.float32      # a second dtype
        seeds = [hidden_seed(f"generate/model{i}/{j}") for j in range(20 if i == 0 else 1)]
        cases.append((seeds, cfg, lengths, rng.randrange(4, 9), dtype, g))
    return cases


def _check_prefill(rec: dict, prompts: list[torch.Tensor], label: str) -> None:
    B, T0 = len(prompts), max(len(p) for p in prompts)
    expect(rec["cached"] == 0 and tuple(rec["ids"].shape) == (B, T0),
           f"{label}: the first call fed ids of shape {tuple(rec['ids'].shape)} after a cache of {rec['cached']} "
           f"tokens, expected the padded prompts, ({B}, {T0}), with no cache.",
           "start with kv_caches=None and feed all prompts at once, left-padded to the longest one (the prefill).")
    ids, mask, pos = rec["ids"], rec["mask"], rec["positions"]
    for b, p in enumerate(prompts):
        L = len(p)
        if not torch.equal(ids[b, T0 - L:], p):
            right = torch.equal(ids[b, :L], p)
            fail(f"{label}: row {b} of the prefill (a prompt of {L} tokens, padded to {T0}) is {ids[b].tolist()}, "
                 f"expected the prompt at the right end.",
                 "pad on the LEFT: the last column must hold every row's last real token, since the next token "
                 "is read from logits[:, -1]." if right else "row b of the prefill holds prompt b, left-padded.")
        want_mask = torch.arange(T0) >= T0 - L
        if not torch.equal(mask[b], want_mask):
            fail(f"{label}: the prefill's attention_mask row {b} (prompt of {L} tokens, padded to {T0}) is "
                 f"{mask[b].int().tolist()}, expected {want_mask.int().tolist()}.",
                 "the mask is True for real tokens and False for pads, so that no token attends to a pad; the "
                 "model adds the causal part itself.")
        if not torch.equal(pos[b, T0 - L:].long(), torch.arange(L)):
            hint = "each sequence counts its positions from its own first real token: 0, 1, ..., len - 1."
            if torch.equal(pos[b, T0 - L:].long(), torch.arange(T0 - L, T0)):
                hint = ("the positions count from the first column of the padded batch; a left-padded prompt "
                        "starts at position 0 at its first real token (cumsum of the mask, minus 1).")
            fail(f"{label}: the prefill's positions for the real tokens of row {b} (prompt of {L} tokens, "
                 f"padded to {T0}) are {pos[b, T0 - L:].tolist()}, expected {list(range(L))}.", hint)


def _check_decode_calls(records: list[dict], prompts, tokens: torch.Tensor, eos_id: int, label: str) -> None:
    B, T0 = len(prompts), max(len(p) for p in prompts)
    lengths = torch.tensor([len(p) for p in prompts])
    prefill_mask = records[0]["mask"]
    for s, rec in enumerate(records[1:], start=1):                  # the call that chooses token s
        where = f"{label}: decode call {s}"
        expect(tuple(rec["ids"].shape) == (B, 1) and rec["cached"] == T0 + s - 1,
               f"{where} fed ids of shape {tuple(rec['ids'].shape)} after a cache of {rec['cached']} tokens, "
               f"expected ({B}, 1) after {T0 + s - 1}.",
               "after the prefill, feed only the token each row just chose, shape (B, 1), with the caches the "
               "previous call returned.")
        alive = torch.tensor([eos_id not in tokens[b, :s].tolist() for b in range(B)])
        fed = rec["ids"][:, 0]
        if not torch.equal(fed[alive], tokens[alive, s - 1]):
            fail(f"{where} fed {fed.tolist()}, but the rows still generating had just chosen "
                 f"{tokens[:, s - 1].tolist()}.", "feed back the tokens chosen at the previous step.")
        want_pos = lengths + s - 1
        got_pos = rec["positions"][:, 0].long()
        if not torch.equal(got_pos[alive], want_pos[alive]):
            b = int((got_pos != want_pos).logical_and(alive).nonzero()[0])
            hint = "the token fed at decode step s of row b sits at position len(prompt b) + s - 1."
            if int(got_pos[b]) == T0 + s - 1:
                hint = ("the new token's position is counted from the row's own first real token, not from the "
                        "padded batch's first column: len(prompt b) + s - 1.")
            elif int(got_pos[b]) == int(lengths[b]):
                hint = "the position must advance by one at every decode step: len(prompt b) + s - 1."
            fail(f"{where}: row {b} (prompt of {int(lengths[b])} tokens) got position {int(got_pos[b])}, "
                 f"expected {int(want_pos[b])}.", hint)
        want_mask = torch.cat((prefill_mask, torch.ones(B, s, dtype=torch.bool)), dim=1)
        if not torch.equal(rec["mask"], want_mask):
            fail(f"{where}: the attention_mask differs from the prefill's mask followed by {s} True column(s).",
                 "the pads stay masked at every step, and every generated token is a real key: append one True "
                 "column per step to the prefill's mask.")


@_one_thread
def check_generate(generate_batch, hidden: bool = False) -> None:
    for seeds, cfg, lengths, n_new, dtype, g in _generation_cases(hidden):
        vocab_size = cfg[0]
        prompts = [torch.randint(0, vocab_size, (T,), generator=g) for T in lengths]
        for seed in seeds:
            model = _tiny_model(seed, *cfg, dtype=dtype)
            alone = [_greedy_alone(model, p, n_new) for p in prompts]
            eos_id = _pick_eos(alone, vocab_size)
            if all(eos_id in a[:-1] for a in alone):
                break
        pad_id = (eos_id + 1) % vocab_size
        model.reset_record()
        label = (f"generate_batch(model, prompts of lengths {lengths}, max_new_tokens={n_new}, eos_id={eos_id}, "
                 f"pad_id={pad_id}) with a {str(dtype).replace('torch.', '')} model")
        tokens = call(generate_batch, model, [p.clone() for p in prompts], n_new, eos_id, pad_id,
                      name="generate_batch")
        n_calls = int(model.calls)
        records = model.records()
        B = len(prompts)
        expect_tensor(tokens, (B, n_new), f"{label}: the new tokens")
        expect(tokens.dtype == torch.long, f"{label}: the new tokens are {tokens.dtype}, expected torch.long.",
               "token ids are int64, like the prompts: build the output with torch.full(..., dtype=torch.long).")
        expect(n_calls > 0, f"{label} never called the model.", "call model(ids, kv_caches, positions, mask).")
        _check_prefill(records[0], prompts, label)
        tokens = tokens.detach().cpu()
        _check_decode_calls(records, prompts, tokens, eos_id, label)
        # Each row: greedy up to and including its end token, then pad_id.
        for b, p in enumerate(prompts):
            row = tokens[b].tolist()
            end = row.index(eos_id) + 1 if eos_id in row else n_new
            ok = _greedy_margins(model, p, row[:end])
            if not all(ok):
                s = ok.index(False)
                hint = ("each row's next token is the argmax of the logits at the LAST position, logits[:, -1]; "
                        "the pads must be masked and the positions counted per row.")
                if s > 0 and eos_id in alone[b][:s]:
                    hint = "a row is finished once it has produced eos_id: it continues with pad_id only."
                fail(f"{label}: row {b} (prompt of {len(p)} tokens) got {row}; its token {s} is not the greedy "
                     f"choice of the model fed that row alone without padding ({alone[b]} without an end token).",
                     hint)
            if any(t != pad_id for t in row[end:]):
                fail(f"{label}: row {b} got {row}: after its end token {eos_id} (step {end - 1}) it should hold "
                     f"pad_id={pad_id} only.", "a row is finished once it has produced eos_id: write pad_id in "
                     "its later places, whatever the model predicts for it.")
        finished = [t.index(eos_id) + 1 for t in tokens.tolist() if eos_id in t]
        steps = max(finished) if len(finished) == B else n_new
        if n_calls != steps:
            fail(f"{label} called the model {n_calls} times; every row had finished after {steps} step(s), "
                 f"so {steps} calls were needed.",
                 "stop as soon as every row has produced eos_id (or max_new_tokens tokens are chosen): the model "
                 "is not called to choose tokens that are padding anyway." if n_calls > steps else
                 "call the model once per chosen token: the prefill chooses the first, each decode call the next.")

# ----------------------------------------------------------------------------- exercise 5: beam search


def _markov_step(table: torch.Tensor, bias: torch.Tensor, prefixes: torch.Tensor) -> torch.Tensor:
    """A toy decoder: log-probs of the next token given the last one and the position."""
    return torch.log_softmax(table[prefixes[:, -1]] + bias[prefixes.shape[1] - 1], dim=-1)


def _beam_oracle(step_fn, bos, eos, beam_size, max_len, alpha, variant="ok"):
    alive, finished = [([bos], 0.0)], []
    for _ in range(max_len):
        logp = step_fn(torch.tensor([t for t, _ in alive])).double()
        cands = []
        for i, (toks, score) in enumerate(alive):
            for v in range(logp.shape[1]):
                base = 0.0 if variant == "no_parent" else score
                cands.append((base + logp[i, v].item(), i, v))
        cands.sort(key=lambda c: -c[0])
        new_alive = []
        for score, i, v in cands[:beam_size]:
            hyp = (alive[i][0] + [v], score)
            (finished if v == eos and variant != "eos_ignored" else new_alive).append(hyp)
        alive = new_alive
        if not alive:
            break
    if variant != "drop_alive":
        finished += alive

    def norm(toks, score):
        n = len(toks) - (0 if variant == "count_bos" else 1)
        return score if variant == "no_norm" else score / n ** alpha

    out = [(toks[1:], norm(toks, s)) for toks, s in finished]
    return sorted(out, key=lambda h: -h[1])


def _beam_cases(hidden: bool) -> list[tuple]:
    cases = []
    specs = [(7, 3, 5, 1.0, 1.5), (9, 4, 6, 1.0, 0.5), (6, 2, 4, 0.6, 2.0), (8, 3, 6, 1.0, 3.0)]
    if hidden:
        rng, g = hidden_rng("beam_search"), hidden_generator("beam_search")
        specs = [(rng.randrange(4, 12), rng.randrange(1, 6), rng.randrange(2, 8), rng.choice([0.0, 0.5, 0.8, 1.0]),
                  rng.choice([0.5, 1.0, 2.0, 3.0])) for _ in range(6)]
        specs += [(5, 1, 5, 1.0, 2.0), (6, 30, 3, 1.0, 2.0)]   # greedy; a beam wider than all candidates
    else:
        g = generator(630)
    for V, beam, max_len, alpha, sharp in specs:
        eos = V - 1
        table = torch.randn(V, V, generator=g) * sharp
        bias = torch.randn(max_len + 1, V, generator=g)
        bias[:, eos] += torch.linspace(-1.5, 1.5, max_len + 1)     # the end becomes likelier with length
        cases.append((functools.partial(_markov_step, table, bias), 0, eos, beam, max_len, alpha))
    return cases


_BEAM_VARIANTS = [
    ("no_norm", "rank finished hypotheses by score / length ** length_penalty: raw sums of log-probs favour short "
     "hypotheses (no length normalisation was applied)."),
    ("count_bos", "the length in the normalisation counts the generated tokens (eos included), not the bos token."),
    ("eos_ignored", "a hypothesis that emits eos is finished: move it out of the beam into the finished list and stop "
     "extending it."),
    ("no_parent", "a candidate's score is its parent's score plus the log-prob of the new token: rank the candidates "
     "by that sum, not by the last token's log-prob alone."),
    ("drop_alive", "at max_len the hypotheses still alive count as finished too: add them before ranking."),
]


@_one_thread
def check_beam_search(beam_search, hidden: bool = False) -> None:
    for step_fn, bos, eos, beam, max_len, alpha in _beam_cases(hidden):
        label = f"beam_search(beam_size={beam}, max_len={max_len}, length_penalty={alpha})"
        got = call(beam_search, step_fn, bos, eos, beam, max_len, alpha, name="beam_search")
        want = _beam_oracle(step_fn, bos, eos, beam, max_len, alpha)
        expect(isinstance(got, (list, tuple)) and all(isinstance(h, (list, tuple)) and len(h) == 2 for h in got),
               f"{label} should return a list of (tokens, score) pairs.",
               "return [(tokens, normalised_score), ...], best first.")
        got = [([int(t) for t in toks], float(s)) for toks, s in got]

        def same(a, b):
            return len(a) == len(b) and all(ta == tb and abs(sa - sb) < 1e-4 * max(1, abs(sb))
                                            for (ta, sa), (tb, sb) in zip(a, b))
        if same(got, want):
            continue
        hint = ("keep the beam_size best candidates (by summed log-prob) over all expansions of all alive "
                "hypotheses; move those ending in eos to the finished list; at the end add the alive ones, score "
                "each by sum / (number of tokens after bos) ** length_penalty and sort best first.")
        by_tokens = sorted(got)      # a wrong score can tie several hypotheses: compare those as sets
        for variant, text in _BEAM_VARIANTS:
            if same(by_tokens, sorted(_beam_oracle(step_fn, bos, eos, beam, max_len, alpha, variant))):
                hint = text
                break
        if got and want and got[0][0] == want[0][0] and len(got) != len(want):
            what = f"returned {len(got)} hypotheses, expected {len(want)} (the best one is right)"
        elif got and want and got[0][0] == want[0][0]:
            k = next(i for i, (a, b) in enumerate(zip(got, want)) if not same([a], [b]))
            what = (f"returned, at rank {k}, the tokens {got[k][0]} with score {got[k][1]:.4f}; expected "
                    f"{want[k][0]} with score {want[k][1]:.4f}")
        else:
            what = f"ranked {got[0][0] if got else None} first, expected {want[0][0]} (score {want[0][1]:.4f})"
        fail(f"{label} {what}.", hint)

# ----------------------------------------------------------------------------- exercise 6: int8 weights


def _groups(w: torch.Tensor, g: int) -> torch.Tensor:
    """(out, in) -> (out, in // g, g): consecutive columns in groups of g."""
    return w.float().reshape(w.shape[0], w.shape[1] // g, g)


def _quant_oracle(w: torch.Tensor, g: int) -> tuple[torch.Tensor, torch.Tensor]:
    wg = _groups(w, g)
    amax = wg.abs().amax(dim=-1)
    scale = torch.where(amax > 0, amax / 127, torch.ones_like(amax))
    return (wg / scale[..., None]).round().clamp(-127, 127).to(torch.int8).reshape(w.shape), scale


def _expand_scale(scale: torch.Tensor, g: int) -> torch.Tensor:
    """(out, n_groups) -> (out, n_groups * g): each scale over its group's columns."""
    return scale.float().repeat_interleave(g, dim=1)


def _weight_cases(hidden: bool) -> list[tuple[torch.Tensor, int]]:
    g = generator(640) if not hidden else hidden_generator("int8/weights")
    w = torch.randn(6, 12, generator=g) * 0.05
    w[1, 4:8] = 0.0                                       # an all-zero group
    w[2, 3] = 2.0                                         # an outlier: it should only coarsen its own group
    cases = [(w, 4), (torch.randn(5, 4, generator=g), 4), ((torch.randn(4, 6, generator=g) * 3).to(torch.bfloat16), 2)]
    if hidden:
        rng = hidden_rng("int8")
        for _ in range(4):
            size = rng.choice([1, 2, 3, 8, 16])
            w = torch.randn(rng.randrange(1, 30), size * rng.randrange(1, 6), generator=g) * rng.choice([1e-3, 1, 50])
            cases.append((w, size))
        n = rng.randrange(2, 8)
        sq = torch.randn(n, 4 * n, generator=g)
        sq *= torch.logspace(-6, 3, 4 * n)[None, :]       # columns from 1e-6 to 1e3: per-group scales matter
        cases += [(sq, 4), (torch.zeros(3, 6), 3), ((torch.randn(7, 16, generator=g) * 0.02).to(torch.bfloat16), 8)]
    return cases


def _diagnose_quant(w: torch.Tensor, g: int, q: torch.Tensor, scale: torch.Tensor) -> str:
    wg = _groups(w, g)
    amax = wg.abs().amax(dim=-1)                           # (out, n_groups)
    row_max = w.float().abs().amax(dim=1)                  # (out,)
    s = scale.float()
    if s.numel() == 1 and amax.numel() > 1:
        return ("use one scale per group of group_size consecutive columns in each row, not one for the whole "
                "tensor: an outlier then coarsens only its own group.")
    if amax.shape[1] > 1 and s.numel() == w.shape[0] and torch.allclose(
            s.reshape(-1), torch.where(row_max > 0, row_max / 127, torch.ones_like(row_max)), rtol=1e-5):
        return ("one scale per group of group_size consecutive columns, not one per row: the scale has shape "
                "(out, in // group_size).")
    if amax.shape[1] > 1 and s.shape == amax.shape:
        strided = w.float().reshape(w.shape[0], g, w.shape[1] // g).abs().amax(dim=1)
        if torch.allclose(s, torch.where(strided > 0, strided / 127, torch.ones_like(strided)), rtol=1e-5):
            return ("a group is group_size CONSECUTIVE columns: reshape to (out, in // group_size, group_size) and "
                    "take the max over the last axis; (out, group_size, in // group_size) mixes columns that are "
                    "in // group_size apart.")
    if s.shape == amax.shape and ((amax == 0) & (s == 0)).any():
        return ("an all-zero group gave a zero scale, so w / scale is 0/0 (NaN): use scale 1.0 where the group's max "
                "is 0.")
    nz = amax > 0
    if s.shape == amax.shape and nz.any() and torch.allclose(s[nz], amax[nz] / 128, rtol=1e-5):
        return "divide the max by 127, not 128: int8 goes to +127, and a symmetric range is -127..127."
    if s.shape == amax.shape and nz.any() and torch.allclose(s[nz], amax[nz] / 255, rtol=1e-5):
        return "symmetric int8 uses -127..127: scale = max|w| / 127 (255 levels belong to an asymmetric scheme)."
    safe = torch.where(amax > 0, amax / 127, torch.ones_like(amax))
    if q.shape == w.shape and torch.equal(q.to(torch.int8), (wg / safe[..., None]).trunc().to(torch.int8).reshape(w.shape)):
        return "round to the nearest integer before converting: .to(torch.int8) truncates toward zero."
    return ("scale = max|w| over each group of group_size consecutive columns / 127 (1.0 for an all-zero group), "
            "shape (out, in // group_size); q = round(w / scale), clamped to -127..127.")


@_one_thread
def check_quantize_int8(quantize_int8, dequantize_int8, hidden: bool = False) -> None:
    for w, g in _weight_cases(hidden):
        label = f"quantize_int8 of a {tuple(w.shape)} {str(w.dtype).replace('torch.', '')} weight, group_size={g}"
        result = call(quantize_int8, w.clone(), g, name="quantize_int8")
        expect(isinstance(result, (tuple, list)) and len(result) == 2, f"{label} should return (q, scale).",
               "return the int8 weight and the per-group scales as a tuple.")
        q, scale = result
        expect(isinstance(q, torch.Tensor) and q.dtype == torch.int8,
               f"{label}: q should be an int8 tensor, got {getattr(q, 'dtype', type(q).__name__)}.",
               "convert with .to(torch.int8) after rounding and clamping.")
        expect(isinstance(scale, torch.Tensor), f"{label}: scale should be a tensor.", "return scale as a tensor.")
        want_q, want_scale = _quant_oracle(w, g)
        ok = (tuple(scale.shape) == tuple(want_scale.shape) and scale.dtype == torch.float32
              and torch.allclose(scale, want_scale, rtol=1e-6, atol=0) and tuple(q.shape) == tuple(w.shape)
              and bool(((q.float() - w.float() / _expand_scale(want_scale, g)).abs() <= 0.5 + 1e-3).all())
              and int(q.min()) >= -127)
        if not ok:
            hint = _diagnose_quant(w, g, q, scale)
            if scale.dtype != torch.float32 and scale.shape == want_scale.shape and torch.allclose(
                    scale.float(), want_scale, rtol=1e-2):
                hint = "compute in float32 (w.float()) and return float32 scales, whatever the weight's dtype."
            fail(f"{label} is not the symmetric per-group int8 quantisation.", hint)
        back = call(dequantize_int8, q, scale, name="dequantize_int8")
        expect_tensor(back, tuple(w.shape), f"dequantize_int8 of {label}")
        expect(back.dtype == torch.float32, f"dequantize_int8 returned {back.dtype}, expected float32.",
               "convert q to float before multiplying by the scales.")
        want_back = q.float() * _expand_scale(scale, g)
        if not _same(back, want_back, atol=1e-7, rtol=1e-6):
            hint = ("each scale multiplies the group_size consecutive columns of its group: "
                    "scale.repeat_interleave(group_size, dim=1), with group_size = q.shape[1] // scale.shape[1].")
            if scale.shape[1] > 1 and _same(back, q.float() * scale.float().repeat(1, g), atol=1e-7, rtol=1e-6):
                hint = ("each scale covers group_size CONSECUTIVE columns: repeat_interleave each scale, not repeat "
                        "the whole row of scales (which gives column j the scale of group j % n_groups).")
            fail(f"dequantize_int8 of {label} differs from q times the scale of each column's group.", hint)
        err = (back - w.float()).abs()
        expect(bool((err <= _expand_scale(want_scale, g) / 2 * (1 + 1e-3) + 1e-12).all()),
               f"{label}: the round trip error exceeds half a step of its group.",
               "round to the nearest level; the error of each weight is at most scale / 2.")


@_one_thread
def check_int8_linear(Int8Linear, hidden: bool = False) -> None:
    shapes = [(12, 5, True, 4), (6, 6, False, 3)]
    if hidden:
        rng = hidden_rng("int8_linear")
        shapes = []
        for _ in range(3):
            size = rng.choice([1, 2, 4, 8])
            shapes.append((size * rng.randrange(1, 6), rng.randrange(1, 40), rng.random() < 0.5, size))
        n = rng.randrange(2, 6)
        shapes += [(4 * n, 4 * n, True, 4)]
    for i, (d_in, d_out, bias, gs) in enumerate(shapes):
        torch.manual_seed(641 + i if not hidden else hidden_seed(f"int8_linear/init{i}"))
        linear = nn.Linear(d_in, d_out, bias=bias)
        with torch.no_grad():
            linear.weight[0] *= 30                          # one large row
            linear.weight[:, 0] *= 10                       # one large input column: it coarsens only group 0
            if bias:
                linear.bias.add_(1.0)
        n_groups = d_in // gs
        label = f"Int8Linear(nn.Linear({d_in}, {d_out}, bias={bias}), group_size={gs})"
        module = call(Int8Linear, linear, gs, name="Int8Linear(...)")
        expect(isinstance(module, nn.Module), f"{label} should be an nn.Module.", "subclass nn.Module.")
        state = call(module.state_dict, name=f"{label}.state_dict")
        stored = sum(t.numel() * t.element_size() for t in state.values() if isinstance(t, torch.Tensor))
        limit = d_out * d_in + 4 * d_out * n_groups + (4 * d_out if bias else 0)
        floats = [k for k, t in state.items() if isinstance(t, torch.Tensor) and t.is_floating_point()
                  and t.numel() == d_in * d_out and gs > 1]
        if floats or stored > limit:
            fail(f"{label} stores {stored} bytes, expected at most {limit} (int8 weight, float32 scales and bias).",
                 f"store only the int8 weight and its scales (register_buffer), not the float weight as well"
                 f"{' (found ' + ', '.join(floats) + ')' if floats else ''}: that is the whole point of quantising.")
        buffers = dict(module.named_buffers())
        missing = [name for name in ("weight_int8", "scale") + (("bias",) if bias else ()) if name not in buffers]
        if missing:
            fail(f"{label} keeps {', '.join(missing)} outside its buffers.",
                 "register them with self.register_buffer(name, tensor): a buffer moves with .to(device) and is "
                 "saved by state_dict; a plain attribute (or a Parameter, for the bias) is not what the spec asks.")
        q = getattr(module, "weight_int8", None)
        scale = getattr(module, "scale", None)
        expect(isinstance(q, torch.Tensor) and q.dtype == torch.int8 and tuple(q.shape) == (d_out, d_in),
               f"{label}.weight_int8 should be an int8 tensor of shape {(d_out, d_in)}.",
               "keep the quantised weight in a buffer named weight_int8: self.register_buffer('weight_int8', q).")
        want_q, want_scale = _quant_oracle(linear.weight.detach(), gs)
        if not (isinstance(scale, torch.Tensor) and scale.shape == want_scale.shape
                and torch.allclose(scale.float(), want_scale, rtol=1e-6)):
            hint = "quantise the layer's weight with your quantize_int8 and keep its scale in a buffer named scale."
            if isinstance(scale, torch.Tensor) and n_groups > 1 and scale.numel() == d_out:
                hint = ("quantise with the layer's group_size: quantize_int8(weight, group_size), one scale per "
                        "group, shape (out, in // group_size), not one per row.")
            fail(f"{label}.scale is not the per-group scale of the weight, shape {(d_out, n_groups)}.", hint)
        g = generator(642 + i) if not hidden else hidden_generator(f"int8_linear/x{i}")
        w_hat = (q.double() * scale.double().repeat_interleave(gs, dim=1))
        for shape in ((3, d_in), (2, 4, d_in)):
            x = torch.randn(*shape, generator=g)
            got = call(module, x, name=f"{label}.forward")
            expect_tensor(got, (*shape[:-1], d_out), f"{label} output")
            ref = F.linear(x.double(), w_hat, None if linear.bias is None else linear.bias.detach().double())
            if not _same(got, ref, atol=1e-4, rtol=1e-4):
                hint = "forward is x @ dequantised_weight.T + bias, with each column times the scale of its group."
                if bias and _same(got, F.linear(x.double(), w_hat)):
                    hint = "add the layer's bias: quantisation replaces the weight only."
                elif _same(got, F.linear(x.double(), linear.weight.detach().double(),
                                         None if linear.bias is None else linear.bias.detach().double())):
                    hint = "forward used the original float weight: compute with the dequantised int8 weight."
                fail(f"{label} output differs from x @ dequantised_weight.T + bias.", hint)
            # Against the float layer: each weight is off by at most half a step of its group.
            full = linear(x).detach()
            bound = x.abs() @ _expand_scale(want_scale, gs).T / 2 * (1 + 1e-3) + 1e-5
            expect(bool(((got.detach() - full).abs() <= bound).all()),
                   f"{label}: the output is further from the float layer than int8 rounding allows.",
                   "quantise with round-to-nearest and per-group scales; each weight may move by at most scale / 2.")

# ----------------------------------------------------------------------------- exercise 7: memory


def _params_oracle(c: dict, variant: str = "ok") -> int:
    V, d, L, h, kv, ff = (c[k] for k in ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "d_ff"))
    dh = d // h
    kv_width = d if variant == "no_gqa" else kv * dh
    attn = 2 * d * d + 2 * d * kv_width
    mlp = (2 if variant == "two_mlp" else 3) * d * ff
    norms = 0 if variant == "no_norms" else 2 * d
    total = V * d + L * (attn + mlp + norms) + (0 if variant == "no_norms" else d)
    tied = c["tie_embeddings"]
    if variant == "head_flip":
        tied = not tied
    return total + (0 if tied else V * d)


PUBLISHED = {   # parameter totals of released checkpoints
    "Llama-2-7B": (dict(vocab_size=32000, d_model=4096, n_layers=32, n_heads=32, n_kv_heads=32, d_ff=11008,
                        tie_embeddings=False), 6_738_415_616),
    "Llama-3-8B": (dict(vocab_size=128256, d_model=4096, n_layers=32, n_heads=32, n_kv_heads=8, d_ff=14336,
                        tie_embeddings=False), 8_030_261_248),
    "Llama-2-70B": (dict(vocab_size=32000, d_model=8192, n_layers=80, n_heads=64, n_kv_heads=8, d_ff=28672,
                         tie_embeddings=False), 68_976_648_192),
    "Llama-3.2-1B": (dict(vocab_size=128256, d_model=2048, n_layers=16, n_heads=32, n_kv_heads=8, d_ff=8192,
                          tie_embeddings=True), 1_235_814_400),
}

_PARAM_HINTS = [
    ("no_gqa", "k_proj and v_proj produce n_kv_heads * d_head features (d_head = d_model // n_heads), not d_model: "
     "grouped-query attention shrinks them."),
    ("head_flip", "tied embeddings share one matrix between the input table and the output head: count it once "
     "when tie_embeddings is True, twice (table and head) when False."),
    ("no_norms", "count the RMSNorm weights too: two of d_model per layer and one final norm."),
    ("two_mlp", "a gated MLP (SwiGLU) has three matrices of d_model x d_ff: gate, up and down."),
]


def _memory_oracle(c: dict, seq_len: int, batch: int, wdt: torch.dtype, kvdt: torch.dtype | None,
                   variant: str = "ok") -> int:
    size = torch.empty((), dtype=wdt).element_size()
    kvsize = torch.empty((), dtype=kvdt or wdt).element_size()
    if variant == "kv_in_weight_dtype":
        kvsize = size
    if variant == "kv_two_bytes":
        kvsize = 2
    dh = c["d_model"] // c["n_heads"]
    heads = c["n_heads"] if variant == "kv_n_heads" else c["n_kv_heads"]
    two = 1 if variant == "kv_once" else 2
    b = 1 if variant == "no_batch" else batch
    return _params_oracle(c) * size + two * c["n_layers"] * b * seq_len * heads * dh * kvsize


_MEMORY_HINTS = [
    ("kv_once", "the cache holds keys and values: two tensors per layer, so multiply the KV part by 2."),
    ("kv_n_heads", "the cache stores n_kv_heads heads per layer, not n_heads: that is what grouped-query attention "
     "saves."),
    ("no_batch", "each sequence of the batch has its own cache: multiply the KV part by batch_size."),
    ("kv_in_weight_dtype", "the cache uses kv_dtype when it is given (weights and cache may differ)."),
    ("kv_two_bytes", "the cache's bytes per number are those of kv_dtype (of the weights' dtype when it is None): "
     "element_size(), not a fixed 2."),
]


def _memory_cases(hidden: bool) -> list[tuple]:
    cases = [(PUBLISHED["Llama-2-7B"][0], 4096, 1, torch.float16, None),
             (PUBLISHED["Llama-3-8B"][0], 8192, 4, torch.bfloat16, None),
             (PUBLISHED["Llama-3-8B"][0], 1000, 2, torch.int8, torch.float32)]
    if hidden:
        rng = hidden_rng("memory")
        for c in _random_configs(rng, 4):
            cases.append((c, rng.randrange(1, 100_000), rng.randrange(1, 16),
                          rng.choice([torch.float32, torch.bfloat16, torch.int8]),
                          rng.choice([None, torch.float16, torch.float32, torch.int8])))
        cases.append((PUBLISHED["Llama-2-70B"][0], 32_768, 8, torch.bfloat16, torch.float8_e4m3fn))
    return cases


def _random_configs(rng, n: int) -> list[dict]:
    out = []
    for _ in range(n):
        kv = rng.choice([1, 2, 4, 8])
        h = kv * rng.choice([1, 2, 4])
        d = h * rng.choice([16, 32, 64, 128])
        out.append(dict(vocab_size=rng.randrange(100, 200_000), d_model=d, n_layers=rng.randrange(1, 100),
                        n_heads=h, n_kv_heads=kv, d_ff=rng.randrange(d, 5 * d), tie_embeddings=rng.random() < 0.5))
    return out


# The prediction of exercise 7: the KV cache of Qwen2-7B (28 layers, 4 key/value heads of 128) for 8 sequences of
# 32,768 tokens, in bfloat16.
KV_PREDICTION = dict(n_layers=28, n_heads=28, n_kv_heads=4, d_head=128, seq_len=32768, batch_size=8, bytes=2)


def _kv_bytes(n_layers, n_heads, n_kv_heads, d_head, seq_len, batch_size, bytes) -> int:
    return 2 * n_layers * n_kv_heads * d_head * seq_len * batch_size * bytes


KV_ANSWER = _kv_bytes(**KV_PREDICTION)


def _check_kv_prediction(predicted_kv_cache_bytes) -> None:
    c = KV_PREDICTION
    guesses = [
        (KV_ANSWER / 2, "a factor 2 is missing: the cache holds a key AND a value per token, layer and key/value "
         "head, and each number takes 2 bytes in bfloat16."),
        (KV_ANSWER * c["n_heads"] / c["n_kv_heads"], "with grouped-query attention the cache holds the n_kv_heads = 4 "
         "key/value heads, not the 28 query heads (d_model = 28 x 128 is the query width)."),
        (KV_ANSWER * 2, "bfloat16 takes 2 bytes per number, not 4."),
        (KV_ANSWER / c["batch_size"], "8 sequences each keep their own cache: multiply by the batch size."),
        (KV_ANSWER / c["n_layers"], "every one of the 28 layers keeps its own keys and values."),
        (KV_ANSWER / 4, "both factors of 2 are missing: a key and a value, and 2 bytes per bfloat16 number."),
        (KV_ANSWER / 2 ** 30, "give the answer in bytes, not GiB."),
        (KV_ANSWER / 1e9, "give the answer in bytes, not GB."),
    ]
    judge_prediction(
        "predicted_kv_cache_bytes", call(predicted_kv_cache_bytes), KV_ANSWER,
        unit_hint="return your prediction as a number of bytes (an int, or the arithmetic that gives it).",
        asked="the size of the KV cache asked for (Qwen2-7B, 8 sequences of 32,768 tokens, bfloat16)",
        exact=0, close=0.01 * KV_ANSWER,
        close_hint="close, but not exact: a count of bytes is an integer; write the product, not a rounded reading.",
        guesses=guesses, near=1e-6, relative=True, shown=",.0f",
        fallback="bytes = 2 (a key and a value) x n_layers x n_kv_heads x d_head x tokens x sequences x bytes per "
                 "number.")


def kv_prediction_passes(predicted_kv_cache_bytes) -> bool:
    """For the exercise's measurement, shown only once the prediction passes its test."""
    try:
        _check_kv_prediction(predicted_kv_cache_bytes)
    except CheckFailed:
        return False
    return True


def check_memory(count_params, inference_memory_bytes, predicted_kv_cache_bytes=None, hidden: bool = False) -> None:
    if predicted_kv_cache_bytes is not None:
        _check_kv_prediction(predicted_kv_cache_bytes)
    configs = [(name, c, want) for name, (c, want) in PUBLISHED.items() if name != "Llama-2-70B"]
    configs.append(("tiny tied", dict(vocab_size=10, d_model=4, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=6,
                                      tie_embeddings=True), 10 * 4 + 2 * 16 + 2 * 4 * 2 + 3 * 4 * 6 + 2 * 4 + 4))
    if hidden:
        rng = hidden_rng("memory/configs")
        configs = [("Llama-2-70B", *PUBLISHED["Llama-2-70B"])]
        configs += [(f"config {c}", c, _params_oracle(c)) for c in _random_configs(rng, 5)]
    for name, c, want in configs:
        got = call(count_params, dict(c), name="count_params")
        if got != want:
            hint = ("per layer: q and o are d_model x d_model, k and v d_model x (n_kv_heads * d_head), a gated MLP "
                    "3 x d_model x d_ff, two norms of d_model; plus the embedding, a final norm and the head "
                    "(unless tied). No biases.")
            for variant, text in _PARAM_HINTS:
                if got == _params_oracle(c, variant):
                    hint = text
                    break
            fail(f"count_params({name}) gave {got:,}, expected {want:,}.", hint)
    passed = []          # cases already right: a slip that would have failed one of them is not the cause
    for c, seq_len, batch, wdt, kvdt in _memory_cases(hidden):
        want = _memory_oracle(c, seq_len, batch, wdt, kvdt)
        got = call(inference_memory_bytes, dict(c), seq_len, batch, wdt, kvdt, name="inference_memory_bytes")
        label = (f"inference_memory_bytes(seq_len={seq_len}, batch_size={batch}, weight_dtype={wdt}, "
                 f"kv_dtype={kvdt})")
        expect(isinstance(got, int) and not isinstance(got, bool), f"{label} returned {type(got).__name__}.",
               "return a Python int (element_size() is an int).")
        if got != want:
            hint = "bytes = count_params(config) * weight bytes + 2 * n_layers * batch_size * seq_len * n_kv_heads * d_head * KV bytes."
            for variant, text in _MEMORY_HINTS:
                if got == _memory_oracle(c, seq_len, batch, wdt, kvdt, variant) and all(
                        _memory_oracle(*case, variant) == _memory_oracle(*case) for case in passed):
                    hint = text
                    break
            else:
                if got == want * 8 or got - want == _params_oracle(c) * 7 * torch.empty((), dtype=wdt).element_size():
                    hint = "that is bits: use element_size() for bytes."
            fail(f"{label} gave {got:,}, expected {want:,}.", hint)
        passed.append((c, seq_len, batch, wdt, kvdt))

# ----------------------------------------------------------------------------- exercise 8: speculative decoding


@functools.lru_cache(maxsize=None)
def _chi2_critical(dof: int, p_value: float = 1e-7) -> float:
    """x with P(chi2_dof > x) = p_value, by bisection on the regularised upper gamma function."""
    lo, hi = 0.0, 1000.0 + 50.0 * dof
    a = torch.tensor(dof / 2, dtype=torch.float64)
    for _ in range(200):
        mid = (lo + hi) / 2
        if torch.special.gammaincc(a, torch.tensor(mid / 2, dtype=torch.float64)).item() > p_value:
            lo = mid
        else:
            hi = mid
    return hi


def _chi2(counts: torch.Tensor, probs: torch.Tensor) -> tuple[float, int, bool]:
    """Chi-square statistic of counts against probs; dof; whether an impossible token appeared.
    Tokens expected fewer than 5 times are pooled into one bin, as the test's approximation needs."""
    n = counts.sum().item()
    support = probs > 0
    impossible = bool((counts[~support] > 0).any())
    expected = probs[support].double() * n
    observed = counts[support].double()
    small = expected < 5
    if small.any():
        expected = torch.cat((expected[~small], expected[small].sum()[None]))
        observed = torch.cat((observed[~small], observed[small].sum()[None]))
    stat = ((observed - expected) ** 2 / expected).sum().item()
    return stat, len(expected) - 1, impossible


def _spec_setup(V: int, k: int, g: torch.Generator, sharp: float) -> tuple[torch.Tensor, torch.Tensor]:
    p = torch.softmax(torch.randn(k + 1, V, generator=g) * sharp, -1)
    q = torch.softmax(torch.log(p[:k]) + torch.randn(k, V, generator=g) * 0.8, -1)   # a draft close to the target
    return p, q


def _spec_cases(hidden: bool) -> list[tuple[torch.Tensor, torch.Tensor, int]]:
    g = generator(650) if not hidden else hidden_generator("speculative")
    p, q = _spec_setup(5, 3, g, 1.0)
    cases = [(p, q, 6000)]
    if hidden:
        rng = hidden_rng("speculative")
        V, k = rng.randrange(3, 8), rng.randrange(1, 5)
        cases = [(*_spec_setup(V, k, g, rng.choice([0.5, 1.0, 1.5])), 6000)]
        # Edge cases: zero-probability tokens on each side, a perfect draft, disjoint supports.
        V = rng.randrange(4, 7)
        p, q = _spec_setup(V, 2, g, 1.0)
        p[0, 0] = 0.0                   # the draft likes a token the target never emits
        q[0, 1] = 0.0                   # the target likes a token the draft never proposes
        q[1] = p[1]                     # a perfect draft at position 1: always accepted
        p, q = p / p.sum(-1, keepdim=True), q / q.sum(-1, keepdim=True)
        q[1] = p[1]
        cases.append((p, q, 5000))
        p = torch.zeros(2, 4); p[:, :2] = 0.5
        q = torch.zeros(1, 4); q[:, 2:] = 0.5    # disjoint: every draft rejected, the residual is the target
        cases.append((p, q, 2000))
    return cases


def _run_spec(speculative_accept, p, q, B, seed, g):
    k, V = q.shape
    draft = torch.stack([torch.multinomial(q[j], B, replacement=True, generator=g) for j in range(k)], dim=1)
    draft_probs = q.expand(B, k, V).contiguous()
    target_probs = p.expand(B, k + 1, V).contiguous()
    result = call(speculative_accept, draft, draft_probs, target_probs, generator(seed), name="speculative_accept")
    expect(isinstance(result, (tuple, list)) and len(result) == 2,
           "speculative_accept should return (n_accepted, next_token).", "return two (B,) long tensors.")
    n, nxt = result
    expect_tensor(n, (B,), "n_accepted")
    expect_tensor(nxt, (B,), "next_token")
    expect(not n.is_floating_point() and not nxt.is_floating_point(), "n_accepted and next_token should be integers.",
           "return long tensors (counts and token ids).")
    expect(bool(((n >= 0) & (n <= k)).all()), f"n_accepted must lie in 0..k={k}, got values {sorted(set(n.tolist()))}.",
           "n_accepted counts the draft tokens accepted before the first rejection.")
    if not bool(((nxt >= 0) & (nxt < V)).all()):
        fail(f"next_token holds ids outside 0..{V - 1}.",
             "after a rejection, sample from the residual max(0, p - q) renormalised to sum 1 "
             "(without renormalising, a cumulative-sum sampler runs past the last token).")
    return draft, n.long(), nxt.long()


_SPEC_RESIDUAL_HINT = ("after a rejection at position j, sample the replacement from max(0, p_j - q_j) renormalised "
                       "to sum 1 (the residual), not from p_j or q_j; it corrects exactly the mass the draft "
                       "over-proposed.")


@_one_thread
def check_speculative_accept(speculative_accept, expected_tokens_per_step, hidden: bool = False) -> None:
    rng = hidden_rng("speculative/seeds")
    for case_index, (p, q, B) in enumerate(_spec_cases(hidden)):
        k, V = q.shape
        g = generator(651 + case_index) if not hidden else hidden_generator(f"speculative/draft{case_index}")
        seed = 652 + case_index if not hidden else rng.randrange(2**40)
        draft, n, nxt = _run_spec(speculative_accept, p, q, B, seed, g)
        # The acceptance rate at position 0 is sum_x min(p, q); a wrong ratio shows here first.
        alpha = torch.minimum(p[0], q[0]).sum().item()
        acc = (n >= 1).double().mean().item()
        sigma = math.sqrt(max(alpha * (1 - alpha), 1e-12) / B)
        if abs(acc - alpha) > 5.5 * sigma + 3 / B:
            hint = "accept draft token x with probability min(1, p(x) / q(x)), with u = torch.rand(..., generator=generator)."
            inverted = (q[0] * torch.clamp(q[0] / p[0].clamp_min(1e-30), max=1)).sum().item()
            hard = q[0][p[0] >= q[0]].sum().item()
            alphas = torch.minimum(p[:k], q).sum(-1)
            any_accepted = 1 - torch.prod(1 - alphas).item()
            betas = (q * torch.clamp(q / p[:k].clamp_min(1e-30), max=1)).sum(-1)
            # Both slips raise the rate at position 0; the mean of n_accepted tells them apart.
            counts_all = abs(acc - any_accepted) <= 5.5 * math.sqrt(max(any_accepted * (1 - any_accepted), 1e-12) / B)
            if counts_all and abs(acc - inverted) <= 5.5 * math.sqrt(max(inverted * (1 - inverted), 1e-12) / B):
                mean_n = n.double().mean().item()
                counts_all = abs(mean_n - alphas.sum().item()) < abs(mean_n - torch.cumprod(betas, 0).sum().item())
            if counts_all:
                hint = ("stop at the first rejection: n_accepted counts the draft tokens accepted before the "
                        "first rejected one, not every draft token that passed its own test.")
            elif abs(acc - inverted) <= 5.5 * math.sqrt(max(inverted * (1 - inverted), 1e-12) / B):
                hint = "the acceptance ratio is inverted: accept with probability min(1, p(x) / q(x)), target over draft."
            elif abs(acc - hard) <= 5.5 * math.sqrt(max(hard * (1 - hard), 1e-12) / B):
                hint = ("a draft token with p(x) < q(x) is still accepted with probability p(x) / q(x): compare a "
                        "uniform draw with the ratio, do not accept only when p(x) >= q(x).")
            elif acc > 0.999:
                hint = "draft tokens are not always accepted: draw u uniformly and accept when u < p(x) / q(x)."
            fail(f"speculative_accept accepted the first draft token in {acc:.3f} of {B} rows; the rule gives "
                 f"{alpha:.3f} (sum of min(p, q)).", hint)
        # Every emitted position j (reached when n >= j) must follow the target p_j exactly.
        for j in range(k + 1):
            rows = n >= j
            if int(rows.sum()) < 200:
                continue
            if 0 < j < k:
                # Among the rows that reached j, the draft token at j is accepted with probability sum min(p_j, q_j).
                reached = int(rows.sum())
                rate = (n[rows] > j).double().mean().item()
                alpha_j = torch.minimum(p[j], q[j]).sum().item()
                if abs(rate - alpha_j) > 5.5 * math.sqrt(max(alpha_j * (1 - alpha_j), 1e-12) / reached) + 3 / reached:
                    fail(f"speculative_accept accepted the draft token at position {j} in {rate:.3f} of the {reached} "
                         f"rows that reached it; the rule gives {alpha_j:.3f} (sum of min(p_{j}, q_{j})).",
                         "every position has its own test: draw a fresh uniform for each position (u of shape (B, k)) "
                         "and accept draft_tokens[:, j] with probability min(1, p_j(x) / q_j(x)), p_j and q_j the "
                         "target and draft distributions at position j.")
            emitted = torch.where(n[rows] > j, draft[rows, min(j, k - 1)], nxt[rows])
            counts = torch.bincount(emitted, minlength=V)
            stat, dof, impossible = _chi2(counts, p[j])
            if dof == 0 and not impossible:
                continue
            if impossible or stat > _chi2_critical(dof):
                if j == k:
                    bonus = nxt[n == k]
                    stat_prev = _chi2(torch.bincount(bonus, minlength=V), p[k - 1])
                    hint = "when all k draft tokens are accepted, the extra token is sampled from target_probs[:, k]."
                    if not stat_prev[2] and stat_prev[0] <= _chi2_critical(max(stat_prev[1], 1)):
                        hint = ("the bonus token came from target_probs[:, k - 1]: when all k drafts are accepted "
                                "sample it from the target's next distribution, target_probs[:, k].")
                else:
                    rejected = nxt[n == j]
                    hint = _SPEC_RESIDUAL_HINT
                    if len(rejected) == 0:
                        hint = "accept with probability min(1, p(x) / q(x)) and stop at the first rejection."
                    elif len(rejected) >= 100:
                        residual = (p[j] - q[j]).clamp(min=0)
                        r_stat, r_dof, r_impossible = _chi2(torch.bincount(rejected, minlength=V),
                                                            residual / residual.sum())
                        if not r_impossible and r_stat <= _chi2_critical(max(r_dof, 1)):
                            # The replacements follow the residual: the tokens accepted at j are what is wrong.
                            hint = (f"the replacement tokens follow the residual, so the acceptance at position {j} "
                                    "is wrong: every position has its own test; draw a fresh uniform for each "
                                    "position and accept draft_tokens[:, j] with probability min(1, p_j(x) / q_j(x)).")
                fail(f"the tokens emitted at position {j} do not follow the target distribution "
                     f"(chi-square {stat:.1f} with {dof} degrees of freedom, bound {_chi2_critical(max(dof, 1)):.1f} "
                     f"at p = 1e-7{'; a token of probability 0 appeared' if impossible else ''}).", hint)
    # Reproducible for a given generator; the global RNG must not matter.
    p, q, _ = _spec_cases(hidden)[0]
    seed = 660 if not hidden else rng.randrange(2**40)
    outs = []
    for global_seed in (1, 2):
        torch.manual_seed(global_seed)
        outs.append(_run_spec(speculative_accept, p, q, 64, seed, generator(seed))[1:])
    if not (torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])):
        fail("speculative_accept gave different results for the same generator when the global seed changed.",
             "draw every uniform and every sample from the generator you are given: torch.rand(..., generator=generator), "
             "torch.multinomial(..., generator=generator).")
    # The expected number of tokens per target call.
    cases = [(0.8, 4), (0.0, 3), (1.0, 5), (0.5, 1)]
    if hidden:
        r = hidden_rng("speculative/expected")
        cases = [(r.random(), r.randrange(1, 12)) for _ in range(5)] + [(1.0, r.randrange(1, 9)), (0.0, 1)]
    for a, k in cases:
        want = k + 1 if a == 1.0 else (1 - a ** (k + 1)) / (1 - a)
        got = call(expected_tokens_per_step, a, k, name="expected_tokens_per_step")
        if not (isinstance(got, (int, float)) and abs(got - want) <= 1e-9 * max(1, want)):
            hint = "E = 1 + a + a^2 + ... + a^k = (1 - a^(k+1)) / (1 - a), and k + 1 when a == 1."
            if a != 1.0 and isinstance(got, (int, float)) and abs(got - (1 - a ** k) / (1 - a)) < 1e-9:
                hint = ("count the extra token the target model gives in every call: the sum runs to a^k, so the "
                        "numerator is 1 - a^(k+1).")
            fail(f"expected_tokens_per_step({a}, {k}) gave {got}, expected {want}.", hint)
