"""Checks for chapter 6: sampling, the KV cache, generation, beam search, int8 weights, memory estimates and
speculative decoding.

Oracles: the sampling pipeline written here in float64 (penalty, temperature, top-k, top-p) and
``torch.multinomial`` with a generator of the same seed; sliding-window grouped-query attention with RoPE over the
whole sequence in float64, uncached, for the rolling cache; a small decoder of our own, fed each prompt alone
without padding or cache, whose greedy choice every generated token of the batch must be (within 1e-4 of the
largest logit), with the inputs of every call recorded; a reference beam search; per-group int8 quantisation by
its definition; parameter counts checked against published totals (Llama-2-7B has 6,738,415,616 parameters);
and, for speculative decoding, chi-square tests of the emitted tokens against the target distribution, each
bounded at p = 1e-7: a hidden run makes one per emitted position of each case (besides the acceptance-rate tests
at 5.5 sigma), so a correct answer fails in a small multiple of one run in ten million.
"""

from __future__ import annotations

import copy
import functools
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..i18n import composed
from . import _core, ch03, ch04
from ._core import CheckFailed, call, earlier_first, expect_tensor, one_thread as _one_thread
from ._core import own_fault, unmeasured
from ._vocabulary import (call_on_copies, check_pasted, compare, diagnose, draw, earlier_chapter, expect, fail, matches,
                          passes, pasted_first, variants_of, when)

# A float32 answer against a float64 oracle: the rounding of a few float32 matmuls and a softmax.
_F32 = (1e-4, 1e-4)


def _under_two_global_seeds(d, run) -> list:
    """``run()`` twice, the global RNG (here and in the kernel) seeded differently each time: an
    answer that draws from the generator it is given returns the same thing both times."""
    results = []
    for name in ("global-a", "global-b"):
        with d.sub(name).seeded():
            results.append(run())
    return results

# ----------------------------------------------------------------------------- exercise 1: processing logits


def _penalise(logits: torch.Tensor, prev: torch.Tensor | None, r: float, mode: str = "ok") -> torch.Tensor:
    """Each seen token's positive logit divided by r, a negative one multiplied (the bugs: "divide" every
    one, or penalise "per_occurrence")."""
    out = logits.clone()
    for b in range(out.shape[0] if prev is not None and r != 1.0 else 0):
        for t in (prev[b].tolist() if mode == "per_occurrence" else sorted(set(prev[b].tolist()))):
            out[b, t] = out[b, t] / r if out[b, t] > 0 or mode == "divide" else out[b, t] * r
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
    before = _mass_before(x)
    if p is not None and inclusive:   # the bug: drop the token that crosses p (but the best stays)
        return ((before + torch.softmax(x.double(), dim=-1) <= p) | (before == 0)) & torch.isfinite(x)
    return (before < (p if p is not None else math.inf)) & torch.isfinite(x)


def _process(logits, temperature=1.0, top_k=None, top_p=None, penalty=1.0, prev=None, variant="ok"):
    x = _penalise(logits.double(), prev, penalty, mode=variant if variant in ("divide", "per_occurrence") else "ok")
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


def _sampler_case(d) -> dict:
    B, V = d.rng.randrange(1, 5), d.rng.randrange(2, 60)
    case = dict(logits=d.randn(B, V) * d.rng.choice([0.5, 2.0, 6.0]),
                temperature=d.rng.choice([0.3, 0.7, 1.0, 1.6, 3.0]))
    prev = d.randint(0, V, (B, d.rng.randrange(1, 12)))
    if d.rng.random() < 0.7:
        case["top_k"] = d.rng.randrange(1, V + 2)
    if d.rng.random() < 0.7:
        case["top_p"] = d.rng.choice([0.05, 0.3, 0.5, 0.75, 0.9, 0.97, 1.0])
    if d.rng.random() < 0.6:
        case.update(repetition_penalty=d.rng.choice([1.1, 1.3, 2.0]), prev_tokens=prev)
    return case


def _sampler_cases(d) -> list[dict]:
    base = d.randn(3, 12) * 2
    base[:, 3] = base[:, 3].abs() + 1.0      # a positive logit that was seen (divide it)
    base[:, 1] = -base[:, 1].abs() - 0.5     # a negative one (multiply it)
    prev = torch.tensor([[0, 3, 3, 7], [1, 1, 1, 2], [11, 5, 0, 4]])
    ties = torch.tensor([[2.0, 1.0, 1.0, 1.0, 0.0, -1.0], [0.5, 0.5, 0.5, 0.5, 0.5, 0.5]])
    cases = d.cases([dict(logits=base, temperature=1.0), dict(logits=base, temperature=0.7, top_k=5),
                     dict(logits=base, temperature=1.0, top_p=0.8), dict(logits=base, temperature=2.5, top_p=0.6),
                     dict(logits=base, temperature=0.5, top_p=0.7),
                     dict(logits=base, temperature=1.0, top_k=6, top_p=0.5),
                     dict(logits=base, temperature=1.0, repetition_penalty=1.5, prev_tokens=prev),
                     dict(logits=base, temperature=0.8, top_k=7, top_p=0.9, repetition_penalty=1.3, prev_tokens=prev),
                     dict(logits=ties, temperature=1.0, top_k=2),        # the k-th logit ties: every tied token stays
                     dict(logits=base, temperature=1.0, top_k=13),       # top_k above the vocabulary: nothing removed
                     dict(logits=d.randn(2, 12) * 1e4, temperature=0.05, top_k=6, top_p=0.9)],   # extreme range
                    _sampler_case, 10)
    if d.hidden:
        V = d.rng.randrange(8, 40)
        cases += [dict(logits=d.randn(2, V) * 1e4, temperature=0.05, top_p=0.9, top_k=V // 2),   # a stable softmax
                  dict(logits=torch.zeros(1, V), temperature=1.0, top_k=3),                     # every token ties
                  dict(logits=d.randn(2, V), temperature=1.0, top_p=1e-9),                      # only the best stays
                  dict(logits=d.randn(2, V) * 3, temperature=1.0, repetition_penalty=1.8,
                       prev_tokens=d.randint(0, V, (2, 30)))]                                   # many repeats
    return cases


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
_ORDER = ("follow the order: repetition penalty on the raw logits, divide by the temperature, top-k, then "
          "top-p; set removed tokens to -inf.")


def _label(case: dict) -> str:
    args = [f"{k}={v}" for k, v in case.items() if k not in ("logits", "prev_tokens")]
    top = float(case["logits"].abs().max())
    shape, rest = tuple(case["logits"].shape), ", ".join(args)
    if top > 100:
        return f"process_logits(logits of shape {shape} up to {top:.3g} in size, {rest})"
    return f"process_logits(logits of shape {shape}, {rest})"


def _compare_processed(got: torch.Tensor, case: dict) -> None:
    """The answer's processed logits (B, V) against the oracle's: first which tokens it kept, then their
    log-probabilities among the kept ones (top-p only removes tokens: the kept keep their values)."""
    logits, t, top_k, top_p = case["logits"], case.get("temperature", 1.0), case.get("top_k"), case.get("top_p")
    args = (t, top_k, top_p, case.get("repetition_penalty", 1.0), case.get("prev_tokens"))
    want = _process(logits, *args)
    before = _top_k(_penalise(logits.double(), args[4], args[3]) / t, top_k)    # (B, V): what top-p sees
    unsure = (_mass_before(before) - top_p).abs() < 1e-6 if top_p is not None else torch.zeros_like(want).bool()
    keep, want_keep = got.isfinite(), want.isfinite()

    def kept(x):                   # (B, V) bool; a token on the top-p boundary (within rounding) either way
        return x.isfinite() | unsure

    def logp(x):                   # (B, V) log-probabilities among the tokens the answer kept, 0 elsewhere
        return torch.log_softmax(x.double().masked_fill(~keep, -math.inf), -1).masked_fill(~keep, 0)

    def variants(view):            # the variants as ``view`` shows them
        return variants_of(lambda v: view(_process(logits, *args, variant=v)), _SAMPLER_VARIANTS)

    compare(kept(got), kept(want), f"{_label(case)} kept the wrong tokens (1: kept, 0: removed)", _ORDER, variants=[
        *variants(kept),
        (when(lambda _: top_k is not None and bool((keep.sum(-1) == min(top_k, keep.shape[-1])).all())
              and bool((keep <= want_keep).all()) and bool((want_keep.sum(-1) > top_k).any())),
         "tokens tied with the k-th largest logit stay: remove only logits strictly below the k-th largest "
         "(x < kth); the indices from topk break ties arbitrarily."),
        (when(lambda _: top_p is not None and float(before.nan_to_num(0, 0, 0).abs().max()) > 80
              and bool((keep >= want_keep).all())),
         "these logits reach e^80 and beyond: exp() overflows to inf, inf / inf is NaN, and a NaN probability is "
         "never removed by top-p. Subtract each row's maximum before exp (torch.softmax does).")])
    compare(logp(got), logp(before), f"{_label(case)} kept the right tokens with the wrong log-probabilities", _ORDER,
            variants=[*variants(logp), (when(lambda _: t != 1 and matches(logp(got * t), logp(want), _F32)),
                                        "divide the logits by the temperature (a low temperature sharpens the "
                                        "distribution).")], tol=_F32)


@_one_thread
def check_process_logits(process_logits, hidden: bool = False) -> None:
    for case in _sampler_cases(draw("sampler", hidden)):
        logits, label = case["logits"], _label(case)
        got = call(process_logits, given := logits.clone(), **{k: v for k, v in case.items() if k != "logits"},
                   name="process_logits")
        expect_tensor(got, tuple(logits.shape), label)
        expect(torch.equal(given, logits), "process_logits changed the logits it was given.",
               "work on a copy (logits.clone()) or with out-of-place operations; the caller may reuse them.")
        expect(not torch.isnan(got).any(), f"{label} returned NaN.",
               "use float('-inf') for removed tokens and never divide by zero.")
        expect(torch.isfinite(got).any(dim=-1).all(), f"{label} removed every token of a row.",
               "the most probable token must always stay, whatever top_k or top_p are: top-k keeps k tokens, and "
               "top-p keeps the token that crosses top_p.")
        _compare_processed(got.detach().double(), case)

# ----------------------------------------------------------------------------- exercise 2: sampling


@_one_thread
def check_sample_next_token(sample_next_token, process_logits, hidden: bool = False, per_request: bool = False) -> None:
    """Row b's draw must be that of torch.multinomial on the softmax of row b of the answer's own process_logits
    (checked on its own in exercise 1), with one generator for the batch (its rows in order) and, ``per_request``
    (chapter 6's notebook; the capstone passes one generator), with a list of generators, one per row. So this
    exercise is judged on the sampling step alone; a failure that a wrong process_logits explains (logits changed in
    place, every token removed) is blamed on it."""
    with earlier_first(("sample_next_token calls your process_logits, which fails exercise 1's tests",
                        lambda: check_process_logits(process_logits))):
        d = draw("sample_next_token", hidden)
        for i, case in enumerate(_sampler_cases(draw("sampler", hidden))):
            _check_draws(sample_next_token, process_logits, case, d.sub(f"draws{i}"), per_request)
        _check_greedy(sample_next_token, d.sub("greedy"))


_OWN_GENERATOR = ("given a list of generators, each row draws with its own, generators[b], and no other: with one "
                  "generator for the batch, a row's draw comes after those of the rows before it, so a request's "
                  "token would depend on the requests batched with it.")


def _check_draws(sample_next_token, process_logits, case: dict, d, per_request: bool) -> None:
    """One generator for the batch (seeded by d.sub("g0")) and, ``per_request``, one per row (row b's seeded by
    d.sub(f"g{b}")); each form called twice under two global seeds, then held against the oracle row by row."""
    logits, kwargs = case["logits"], {k: v for k, v in case.items() if k != "logits"}
    drawn, B = logits.clone(), logits.shape[0]
    args = ", ".join(f"{k}={v}" for k, v in kwargs.items() if k != "prev_tokens")
    probs = None
    for form in ("one generator", "a generator per row")[:1 + per_request]:
        def generators():          # fresh generators of the same seeds at every call
            gens = [d.sub(f"g{b}").gen for b in range(B)]
            return gens if form == "a generator per row" else gens[0]
        first, again = _under_two_global_seeds(d, lambda: call(sample_next_token, logits, generators(), **kwargs,
                                                               name="sample_next_token"))
        expect(torch.equal(logits, drawn), "sample_next_token changed the logits it was given.",
               "work on a copy of the logits; the caller may reuse them.")
        expect_tensor(first, (B,), "sample_next_token's result")
        expect(first.dtype == torch.long, f"sample_next_token returned {first.dtype}, expected torch.long.",
               "return token ids as int64 (what torch.multinomial gives), one per row.")
        expect(matches(again, first), f"sample_next_token with {form} gave different tokens for the same generator "
               "seeds when the global seed changed.", "draw with the generator you are given (one per row, given a "
               "list), never the global RNG: torch.multinomial takes a generator= argument; the global seed "
               "(torch.manual_seed) must not matter.")
        if probs is None:
            x = call(process_logits, drawn.clone(), **kwargs, name="process_logits").detach().float()
            probs = torch.softmax(x, -1)
        gens = generators()
        want = torch.cat([torch.multinomial(probs[b], 1, generator=gens[b] if isinstance(gens, list) else gens)
                          for b in range(B)])
        compare(first, want, f"sample_next_token with {args} and {form}: the tokens, against the rows drawn in order",
                "row b's token is one draw with torch.multinomial from the softmax of row b of process_logits(...), "
                "made with row b's generator (the batch's one, its rows in order, when a single one is given).",
                variants=[(when(lambda got: not (probs > 0).gather(-1, got.clamp(0, probs.shape[-1] - 1)[:, None])
                                .all()),
                           "a token that process_logits removed was sampled: sample from softmax of the processed "
                           "logits."),
                          (lambda: torch.multinomial(probs, 1, generator=d.sub("g0").gen).squeeze(-1), _OWN_GENERATOR)])


def _check_greedy(sample_next_token, d) -> None:
    """Temperature 0 means greedy, handled explicitly: no division by zero, no random draw."""
    logits = d.randn(3, 10)
    top = logits.argmax(-1)
    logits[torch.arange(3), (top + 1) % 10] = logits.max(-1).values - 0.05    # a close runner-up
    cases = [(d.randn(4, 9), None, 1.0), (logits, top[:, None].repeat(1, 2), 1.5)]   # the best was seen: penalised
    if d.hidden:
        V = d.rng.randrange(2, 50)
        cases.append((d.randn(d.rng.randrange(1, 5), V) * 5, d.randint(0, V, (1, 1)), 1.2))
    for logits, prev, penalty in cases:
        prev = None if prev is None else prev.expand(logits.shape[0], -1)
        compare(call(sample_next_token, logits.clone(), None, temperature=0.0, repetition_penalty=penalty,
                     prev_tokens=prev, name="sample_next_token"), _penalise(logits.double(), prev, penalty).argmax(-1),
                f"sample_next_token(..., temperature=0.0, repetition_penalty={penalty}): the greedy tokens",
                "with temperature 0 return the argmax of the (penalised) logits, without drawing at random.",
                variants=[(logits.argmax(-1), "apply the repetition penalty before the argmax too: greedy decoding "
                                              "repeats itself without it.")])

# ----------------------------------------------------------------------------- exercise 3: a rolling KV cache
# Oracles: sliding-window causal attention over the whole sequence, uncached, in float64 (the query at position p
# sees the keys at positions (p - window, p], every one rotated at its own position); the keys the ring must hold
# after each step, by their positions; and the rolling cache written again here in float64 with each bug of the
# hints (:class:`_Ring`), run on the same chunks to name the bug an answer's outputs or ring follow. The attention
# it calls is chapter 3's, pasted above it: chapter 3's own checks run on it first (``check_attention_tools``).

_SDPA_BUILTINS = ((F, "scaled_dot_product_attention"), (F, "multi_head_attention_forward"))   # the oracle's


def check_attention_tools(scaled_dot_product_attention, grouped_query_attention, hidden: bool = False) -> None:
    """Chapter 3's own checks (exercises 2 and 5) on the attention brought into this notebook."""
    check_pasted(ch03.PASTED_ATTENTION, _attention_tools(grouped_query_attention, scaled_dot_product_attention),
                 hidden)


def _attention_tools(grouped_query_attention, scaled_dot_product_attention) -> dict:
    return {"scaled_dot_product_attention": scaled_dot_product_attention,
            "grouped_query_attention": grouped_query_attention}


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor, tile: bool = False):
    """q (..., n_heads, T_q, d), k and v (..., n_kv_heads, T, d), allowed (T_q, T) or (B, 1, T_q, T): query head h
    reads kv head h // group (``tile``: h % n_kv_heads, the bug); a query that sees no key gives zeros."""
    group = q.shape[-3] // k.shape[-3]
    rep = (lambda t: t.tile(group, 1, 1)) if tile else (lambda t: t.repeat_interleave(group, dim=-3))
    scores = (q.double() @ rep(k).transpose(-2, -1) / math.sqrt(q.shape[-1])).masked_fill(~allowed, float("-inf"))
    probs = torch.where(allowed.any(-1, keepdim=True), scores.softmax(-1).nan_to_num(0.0), 0.0)
    return probs @ rep(v)


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


def _window_attention64(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int, base: float):
    """Uncached sliding-window attention in float64 over a whole sequence: q (B, n_heads, L, d), k and v
    (B, n_kv_heads, L, d) before RoPE; the query at position p sees the keys at positions (p - window, p]."""
    pos = torch.arange(q.shape[2])
    q, k = _rope64(q.double(), pos, base), _rope64(k.double(), pos, base)
    allowed = (pos[None, :] <= pos[:, None]) & (pos[None, :] > pos[:, None] - window)
    return torch.stack([_attend(q[b], k[b], v[b].double(), allowed) for b in range(len(q))])


_RING_BUGS = [   # (variant, hint): a cache with this bug gives the same outputs, or ring
    ("wide", "the window is (p - window, p]: the query at position p sees window keys, its own included, and the "
     "key at p - window is already out of it (>, not >=)."),
    ("strict", "a query sees its own key too: the keys at positions (p - window, p], p included (<=, not <)."),
    ("write_first", "attend before you write: once a chunk's keys are written, the ring no longer holds the older "
     "keys that the chunk's first queries still see. Attend over [ring ; new keys], then write the last "
     "min(T, window) new ones."),
    ("rope_chunk", "rotate the new queries and keys at their absolute positions seen, seen + 1, ..., not at 0, 1, "
     "... within the chunk: a cached key keeps the rotation of its own position."),
    ("rope_slot", "RoPE uses a token's absolute position p, not its slot p % window: once the ring wraps, the "
     "rotations no longer follow the distances between positions."),
    ("empty_slots", "until window tokens have been seen, some slots of the ring hold no token yet: mask them out "
     "(the position a slot would hold is negative)."),
    ("ring_in_order", "the ring is not in the order of positions: slot s holds the latest position before seen "
     "that leaves remainder s, seen - 1 - (seen - 1 - s) % window, not seen - window + s."),
    ("first_keys", "a chunk longer than the window leaves its last window keys in the ring (positions up to "
     "seen + T - 1), not its first."),
    ("values_from_keys", "the ring of values is filled with the chunk's values v, not its keys."),
    ("shifted", "the ring is written in place, each key at slot p % window, the oldest overwritten: not shifted "
     "along with a concatenation, which copies the whole window at every step."),
    ("keys_before_rope", "store the keys after RoPE: a key in the ring keeps the rotation of its own position, and "
     "later queries read it as it is."),
    ("chunk_not_causal", "the new tokens are causal among themselves: the query at position p sees the chunk's keys "
     "up to p, not the later ones."),
    ("inverted", "the mask says where a query may attend (True: it may), as your chapter 3 attention reads it; "
     "this one was inverted."),
]
_RING = ("the query at position p = seen + i attends to the keys at positions (p - window, p]: those of the ring "
         "still inside its window and the chunk's own up to p, every key rotated at its own position.")
_SLOT = ("the ring has window slots: the token at position p goes to slot p % window, so that once p reaches the "
         "window, the ring wraps around and overwrites the oldest key.")
_BOUNDED = ("the ring keeps exactly window slots, however many tokens have been seen: write each kept key into "
            "slot p % window of self.k and self.v (index assignment), never a longer tensor.")


class _Ring:
    """The rolling cache in float64, as the reference writes it; ``variant`` makes one of the bugs of
    :data:`_RING_BUGS`."""

    def __init__(self, shape: tuple, window: int, base: float, variant: str = "ok") -> None:
        self.k, self.v = torch.zeros(shape, dtype=torch.float64), torch.zeros(shape, dtype=torch.float64)
        self.window, self.base, self.variant, self.seen = window, base, variant, 0

    def step(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        T, W, bug = q.shape[2], self.window, self.variant
        new = self.seen + torch.arange(T)
        at = {"rope_chunk": torch.arange(T), "rope_slot": new % W}.get(bug, new)
        q, rotated, v = _rope64(q.double(), at, self.base), _rope64(k.double(), at, self.base), v.double()
        if bug == "write_first":
            self._write(new, rotated, v)
            keys, ring_k, ring_v = self._held(self.seen + T), self.k, self.v
        else:
            keys = torch.cat((self._held(self.seen), new))
            ring_k, ring_v = torch.cat((self.k, rotated), dim=2), torch.cat((self.v, v), dim=2)
        key, query = keys[None, :], new[:, None]
        allowed = {"chunk_not_causal": torch.ones(T, len(keys), dtype=torch.bool),
                   "strict": key < query}.get(bug, key <= query)
        allowed = allowed & (key > query - W - int(bug == "wide")) & ((keys >= 0) | (bug == "empty_slots"))
        allowed = ~allowed if bug == "inverted" else allowed
        out = torch.stack([_attend(q[b], ring_k[b], ring_v[b], allowed) for b in range(len(q))])
        if bug != "write_first":
            self._write(new, k.double() if bug == "keys_before_rope" else rotated, v)
        self.seen += T
        return out

    def _held(self, seen: int) -> torch.Tensor:
        """(window,) the position each slot holds after ``seen`` tokens; negative: the slot is empty."""
        slots = torch.arange(self.window)
        if self.variant in ("ring_in_order", "shifted"):
            return seen - self.window + slots
        return seen - 1 - (seen - 1 - slots) % self.window

    def _write(self, new: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        if self.variant == "shifted":
            self.k, self.v = (torch.cat(pair, dim=2)[:, :, -self.window:] for pair in ((self.k, k), (self.v, v)))
            return
        kept = slice(None, self.window) if self.variant == "first_keys" else slice(-self.window, None)
        slots = new[kept] % self.window
        self.k[:, :, slots] = k[:, :, kept]
        self.v[:, :, slots] = (k if self.variant == "values_from_keys" else v)[:, :, kept]


def _ring_runs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int, base: float, chunks: list) -> dict:
    """variant -> [(output, ring keys, ring values) after each chunk], for the reference ("ok") and each bug of
    :data:`_RING_BUGS`."""
    runs = {}
    for variant in ["ok", *(bug for bug, _ in _RING_BUGS)]:
        ring, runs[variant], start = _Ring(tuple(k.shape[:2]) + (window, k.shape[3]), window, base, variant), [], 0
        for n in chunks:
            part = (t[:, :, start:start + n] for t in (q, k, v))
            out = ring.step(*part).to(q.dtype)
            runs[variant].append((out, ring.k.to(q.dtype, copy=True), ring.v.to(q.dtype, copy=True)))
            start += n
    return runs


def _rolling_case(d, B: int, n_heads: int, n_kv: int, d_head: int, window: int, chunks: list, base: float,
                  dtype: torch.dtype) -> tuple:
    L = sum(chunks)
    q, k, v = (d.randn(B, n, L, d_head, dtype=torch.float64).to(dtype) for n in (n_heads, n_kv, n_kv))
    label = (f"RollingKVCache(batch_size={B}, n_kv_heads={n_kv}, window={window}, d_head={d_head}, "
             f"dtype={str(dtype)[6:]}, rope_base={base}) with n_heads={n_heads}, fed chunks of {chunks} tokens")
    return q, k, v, window, chunks, base, label


def _rolling_cases(d) -> list[tuple]:
    f32, f64 = torch.float32, torch.float64

    def drawn(d):
        n_kv, window = d.rng.randrange(1, 4), d.rng.randrange(1, 9)
        chunks = [d.rng.randrange(1, 12)] + [d.rng.randrange(1, 10) for _ in range(d.rng.randrange(2, 6))]
        return _rolling_case(d, d.rng.randrange(1, 4), n_kv * d.rng.randrange(1, 4), n_kv, d.rng.choice([4, 8, 16]),
                             window, chunks, d.rng.choice([100.0, 10000.0]), d.rng.choice([f32, f64]))

    if d.hidden:       # a long prompt, then decoding, float64; a window of 1 (where RoPE at slot 0 is no rotation)
        fixed = [_rolling_case(d, 1, 6, 3, 8, 16, [150, 1, 20, 1], 10000.0, f64),
                 _rolling_case(d, 2, 4, 2, 8, 1, [3, 1, 2], 10000.0, f32)]
    else:              # a prefill shorter than the window, decoding past the wrap, a chunk longer than the window;
        fixed = [_rolling_case(d, 2, 6, 2, 8, 4, [3, 2, 1, 1, 6, 1], 10000.0, f32),    # a prompt longer than it
                 _rolling_case(d, 1, 4, 1, 8, 5, [7, 1, 3, 1], 100.0, f32)]
    return d.cases(fixed, drawn, 4)


@_one_thread
def check_rolling_cache(RollingKVCache, grouped_query_attention=None, scaled_dot_product_attention=None,
                        hidden: bool = False) -> None:
    """A prefill and chunks of any size through the ring, against uncached sliding-window attention; after each
    step the ring's shape (bounded by the window), its count of tokens and the keys and values it holds. A failure
    that chapter 3's attention pasted here also has is blamed on it."""
    d = draw("rolling_cache", hidden)
    with earlier_first(*pasted_first("RollingKVCache.step", ch03.PASTED_ATTENTION,
                                     _attention_tools(grouped_query_attention, scaled_dot_product_attention), hidden)):
        for q, k, v, window, chunks, base, label in _rolling_cases(d):
            B, n_kv, d_head = k.shape[0], k.shape[1], k.shape[3]
            cache = call(RollingKVCache, B, n_kv, window, d_head, dtype=q.dtype, rope_base=base, name=label)
            want, runs, start = _window_attention64(q, k, v, window, base).to(q.dtype), _ring_runs(
                q, k, v, window, base, chunks), 0
            for i, n in enumerate(chunks):
                where = f"{label}: step {i + 1}, the tokens at positions {start}..{start + n - 1}"
                out = _rolling_step(cache, *(t[:, :, start:start + n] for t in (q, k, v)), where, start + n > window)
                _check_ring(cache, where, (B, n_kv, window, d_head), q.dtype, start, n)
                compare(out, want[:, :, start:start + n], f"{where}: the output, against sliding-window attention "
                        f"over the whole sequence", _RING, variants=[(runs[bug][i][0], hint) for bug, hint in
                                                                     _RING_BUGS], tol=_F32)
                _check_ring_contents(cache, where, runs, i, start + n, window)
                start += n


def _rolling_step(cache, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, where: str, wraps: bool):
    """The answer's step on copies of the chunk, the attention built-ins forbidden; a step that raises once the
    positions reach the window is taken for writing at slot p."""
    try:
        with _core.forbid(*_SDPA_BUILTINS, exercise="sliding-window attention over a ring"):
            out = cache.step(q.clone(), k.clone(), v.clone())
    except NotImplementedError as err:
        raise _core.not_written(err, where) from err
    except CheckFailed:
        raise
    except Exception as err:  # noqa: BLE001 - judged here
        raise CheckFailed.of(f"{where}: step raised {type(err).__name__}: {_core.capped(str(err), 300)}",
                             _SLOT if wraps else "read the traceback above this message; the chunk was valid for "
                             "the spec.") from err
    expect_tensor(out, tuple(q.shape), f"{where}: the output")
    expect(out.dtype == q.dtype, f"{where}: the output is {out.dtype}.", "keep the dtype of q.")
    return out


def _check_ring(cache, where: str, shape: tuple, dtype: torch.dtype, start: int, n: int) -> None:
    """The ring keeps its shape and dtype, and seen counts the tokens so far."""
    with own_fault():
        for name in ("k", "v"):
            ring = getattr(cache, name, None)
            if isinstance(ring, torch.Tensor) and tuple(ring.shape) == shape and ring.dtype == dtype:
                continue
            grown = isinstance(ring, torch.Tensor) and ring.dim() == 4 and ring.shape[2] > shape[2]
            fail(f"{where}: the ring self.{name} is {_core.describe(ring)}, expected a {dtype} tensor of shape "
                 f"{shape}.", _BOUNDED if grown else "keep self.k and self.v as __init__ creates them, (batch_size, "
                 "n_kv_heads, window, d_head) in the dtype given, with n_kv_heads heads, and write into them.")
        compare(getattr(cache, "seen", None), start + n, f"{where}: self.seen, the tokens seen so far",
                "seen counts every token the sequences have had: step adds T, the chunk's length.", variants=[
                    (start + min(n, shape[2]), "seen counts every token the sequences have had, T more after each "
                     "step, not only those the ring keeps.")])


def _check_ring_contents(cache, where: str, runs: dict, i: int, end: int, window: int) -> None:
    """The slots of the last min(end, window) positions hold their keys after RoPE and their values."""
    slots = torch.arange(max(0, end - window), end) % window
    with own_fault():
        for name, column in (("k", 1), ("v", 2)):
            got = getattr(cache, name)[:, :, slots]
            compare(got, runs["ok"][i][column][:, :, slots], f"{where}: the ring self.{name} at the slots of "
                    f"positions {max(0, end - window)}..{end - 1} (slot p % window)",
                    "after a step, slot p % window holds the key (after RoPE) and the value of position p, for the "
                    "last min(seen, window) positions.",
                    variants=[(runs[bug][i][column][:, :, slots], hint) for bug, hint in _RING_BUGS], tol=_F32)

# ----------------------------------------------------------------------------- exercise 4: batched generation


def _causal(T: int, T_k: int) -> torch.Tensor:
    """(T, T_k) bool: query i sees key j <= i + T_k - T (aligned bottom-right)."""
    return torch.arange(T_k)[None, :] <= torch.arange(T)[:, None] + (T_k - T)


def _attend64(x, weights, n_heads, n_kv_heads, base, positions, allowed, past=None):
    """Reference GQA self-attention with RoPE, in float64, for new tokens x (B, T, d) at positions (B, T) after
    the cached (k, v) in ``past``; allowed (B, 1, T, T_k) says which keys each query sees (:func:`_attend`).
    Returns out (B, T, d), k, v (B, n_kv_heads, T_k, d_head), k after RoPE."""
    wq, wk, wv, wo = (w.double() for w in weights)
    x = x.double()
    B, T, d = x.shape
    dh = d // n_heads
    q = _rope64((x @ wq.T).view(B, T, n_heads, dh).transpose(1, 2), positions, base)
    k = _rope64((x @ wk.T).view(B, T, n_kv_heads, dh).transpose(1, 2), positions, base)
    v = (x @ wv.T).view(B, T, n_kv_heads, dh).transpose(1, 2)
    if past is not None:
        k, v = torch.cat((past[0].double(), k), 2), torch.cat((past[1].double(), v), 2)
    return _attend(q, k, v, allowed).transpose(1, 2).reshape(B, T, d) @ wo.T, k, v


class TinyDecoder(nn.Module):
    """A small decoder built by the checks: ids (B, T), caches, positions (B, T), attention_mask (B, T_past + T) ->
    logits (B, T, V), new caches.

    Token embeddings plus learned absolute position embeddings (so that a wrong position changes the output), then
    layers of grouped-query attention with RoPE and an MLP. Each layer caches (k, v) of shape (B, n_kv_heads,
    T_total, d_head). The model records the inputs of its first calls in buffers (the grader gets a module's state
    back from the student's kernel, not its Python attributes), which the check reads to say what went wrong. It
    runs in the kernel, so it fails with ``_core.expect`` (the kernel's course has ``_core``)."""

    MAX_CALLS, MAX_BATCH, MAX_KEYS = 16, 8, 64

    def __init__(self, vocab_size: int, d_model: int, n_layers: int, n_heads: int, n_kv_heads: int,
                 base: float = 10000.0, max_positions: int = 64):
        super().__init__()
        self.vocab_size, self.n_heads, self.n_kv_heads, self.base = vocab_size, n_heads, n_kv_heads, base
        kv_width = n_kv_heads * (d_model // n_heads)
        self.embed, self.pos = nn.Embedding(vocab_size, d_model), nn.Embedding(max_positions, d_model)
        self.attn = nn.ModuleList(nn.ModuleList(nn.Linear(d_model, width, bias=False)       # q, k, v, out
                                                for width in (d_model, kv_width, kv_width, d_model))
                                  for _ in range(n_layers))
        self.mlp = nn.ModuleList(nn.Sequential(nn.LayerNorm(d_model), nn.Linear(d_model, 2 * d_model), nn.GELU(),
                                               nn.Linear(2 * d_model, d_model)) for _ in range(n_layers))
        self.norms = nn.ModuleList(nn.LayerNorm(d_model) for _ in range(n_layers))
        self.head = nn.Linear(d_model, vocab_size)
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))
        self.register_buffer("rec_shape", torch.zeros(self.MAX_CALLS, 3, dtype=torch.long))   # B, T, cached tokens
        # Per call, batch row and token: the id, the position, and the mask (of the key at that index).
        self.register_buffer("rec", torch.zeros(self.MAX_CALLS, self.MAX_BATCH, self.MAX_KEYS, 3, dtype=torch.long))

    def records(self) -> list[dict]:
        """The inputs of the recorded calls: ids, positions (B, T), mask (B, cached + T), cached."""
        out = []
        for c in range(min(int(self.calls), self.MAX_CALLS)):
            B, T, cached = self.rec_shape[c].tolist()
            rec = self.rec[c, :B]
            out.append({"ids": rec[:, :T, 0], "positions": rec[:, :T, 1], "mask": rec[:, :cached + T, 2].bool(),
                        "cached": cached})
        return out

    @torch.no_grad()
    def forward(self, ids: torch.Tensor, kv_caches: list | None = None, positions: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, list]:
        B, T = ids.shape
        past_len = 0 if kv_caches is None else kv_caches[0][0].shape[2]
        positions = torch.arange(past_len, past_len + T).expand(B, T) if positions is None else positions
        attention_mask = torch.ones(B, past_len + T, dtype=torch.bool) if attention_mask is None else attention_mask
        _core.expect(kv_caches is None or T == 1,
                     f"the model was called with ids of shape {tuple(ids.shape)} after a cache of {past_len} tokens.",
                     "after the prefill, feed only the token each row just chose, shape (B, 1): the cache already "
                     "holds the keys and values of everything before it.")
        _core.expect(isinstance(positions, torch.Tensor) and positions.shape == (B, T),
                     f"the model was called with ids of shape {tuple(ids.shape)} and positions of shape "
                     f"{tuple(getattr(positions, 'shape', ()))}.",
                     "positions has one entry per token fed: shape (B, T).")
        _core.expect(isinstance(attention_mask, torch.Tensor) and attention_mask.shape == (B, past_len + T),
                     f"the model was called with {T} new tokens after a cache of {past_len}, and an attention_mask "
                     f"of shape {tuple(getattr(attention_mask, 'shape', ()))}, expected {(B, past_len + T)}.",
                     "the mask covers every key: the cached tokens and the new ones. Append one True column per "
                     "decode step.")
        c = int(self.calls)
        self.calls += 1
        if c < self.MAX_CALLS and B <= self.MAX_BATCH and past_len + T <= self.MAX_KEYS:
            self.rec_shape[c] = torch.tensor([B, T, past_len])
            self.rec[c, :B, :T, 0], self.rec[c, :B, :T, 1] = ids.detach().long().cpu(), positions.detach().long().cpu()
            self.rec[c, :B, :past_len + T, 2] = attention_mask.detach().long().cpu()
        positions = positions.long().clamp(0, self.pos.num_embeddings - 1)
        x = self.embed(ids) + self.pos(positions)
        allowed = _causal(T, past_len + T)[None, None] & attention_mask.bool()[:, None, None, :]   # (B, 1, T, T_k)
        new = []
        for layer, (attn, mlp, norm) in enumerate(zip(self.attn, self.mlp, self.norms)):
            out, k, v = _attend64(norm(x), [m.weight for m in attn], self.n_heads, self.n_kv_heads, self.base,
                                  positions, allowed, None if kv_caches is None else kv_caches[layer])
            x = x + out.to(x.dtype)
            x = x + mlp(x)
            new.append((k.to(x.dtype), v.to(x.dtype)))
        return self.head(x), new


def _greedy_alone(model: TinyDecoder, prompt: torch.Tensor, n_new: int) -> list[int]:
    """The uncached model, one unpadded prompt, greedy, no end token: n_new token ids."""
    seq = prompt.clone()
    for _ in range(n_new):
        logits, _ = model(seq[None])
        seq = torch.cat((seq, logits[0, -1].argmax()[None]))
    return seq[len(prompt):].tolist()


def _greedy_margins(model: TinyDecoder, prompt: torch.Tensor, new: list[int]) -> list[bool]:
    """For each new token: is it the argmax (within 1e-4) of the uncached logits that predicted it?"""
    seq = torch.cat((prompt, torch.tensor(new, dtype=torch.long)))[None]
    want = model(seq)[0][0, len(prompt) - 1:len(prompt) - 1 + len(new)].double()
    chosen = want.gather(1, torch.tensor(new, dtype=torch.long)[:, None]).squeeze(1)
    return (chosen >= want.max(-1).values - 1e-4).tolist()


def _pick_eos(continuations: list[list[int]], vocab_size: int) -> int:
    """An end token that ends the rows at different steps, all before the last one where some token allows it."""
    def spread(t):
        firsts = [c.index(t) if t in c else len(c) for c in continuations]
        all_end_early = max(firsts) < len(continuations[0]) - 1          # then the loop must stop early
        return (all_end_early, len(set(firsts)), -t)
    return max(range(vocab_size), key=spread)


def _generation_case(d) -> tuple:
    n_kv = d.rng.randrange(1, 3)
    n_heads = n_kv * d.rng.randrange(1, 3)
    cfg = (d.rng.randrange(8, 40), n_heads * 2 * d.rng.randrange(2, 5), d.rng.randrange(1, 3), n_heads, n_kv)
    lengths = [d.rng.randrange(1, 12) for _ in range(d.rng.randrange(2, 5))]
    lengths[0] += len(set(lengths)) == 1                       # unequal lengths: some rows are padded
    return cfg, lengths, d.rng.randrange(4, 9)


def _model_that_stops(d, cfg: tuple, dtype: torch.dtype, prompts: list, n_new: int) -> tuple:
    """The first of 20 models (else the last) with an end token that every row's greedy continuation
    reaches before the last step, at different steps: then a loop that never stops early is seen.
    Returns (model, each row's continuation alone, eos_id)."""
    for j in range(20):
        with d.sub(str(j)).seeded():
            model = TinyDecoder(*cfg)
        with torch.no_grad():
            model.head.weight.mul_(4.0)    # sharper logits: clear argmax margins
        model = model.to(dtype).eval()
        alone = [_greedy_alone(model, p, n_new) for p in prompts]
        eos_id = _pick_eos(alone, cfg[0])
        if all(eos_id in a[:-1] for a in alone):
            break
    return model, alone, eos_id


def _check_calls(records: list[dict], prompts: list[torch.Tensor], tokens: torch.Tensor, eos_id: int,
                 label: str) -> None:
    """The inputs of the model's calls: the left-padded prefill, then each row's last token at its position."""
    B, T0, rec = len(prompts), max(len(p) for p in prompts), records[0]
    expect(rec["cached"] == 0 and tuple(rec["ids"].shape) == (B, T0),
           f"{label}: the first call fed ids of shape {tuple(rec['ids'].shape)} after a cache of {rec['cached']} "
           f"tokens, expected the padded prompts, ({B}, {T0}), with no cache.",
           "start with kv_caches=None and feed all prompts at once, left-padded to the longest one (the prefill).")
    for b, p in enumerate(prompts):
        row, L = f"{label}: the prefill's row {b} (a prompt of {len(p)} tokens, padded to {T0})", len(p)
        compare(rec["ids"][b, T0 - L:], p, f"{row}: its last {L} ids, the prompt", "row b of the prefill holds prompt "
                "b, left-padded.", variants=[(when(lambda _: torch.equal(rec["ids"][b, :L], p)), "pad on the LEFT: "
                                              "the last column must hold every row's last real token, since the next "
                                              "token is read from logits[:, -1].")])
        compare(rec["mask"][b], torch.arange(T0) >= T0 - L, f"{row}: its attention_mask (1: a real token, 0: a pad)",
                "the mask is True for real tokens and False for pads, so that no token attends to a pad; the "
                "model adds the causal part itself.")
        compare(rec["positions"][b, T0 - L:], torch.arange(L), f"{row}: the positions of its real tokens",
                "each sequence counts its positions from its own first real token: 0, 1, ..., len - 1.", variants=[
                    (torch.arange(T0 - L, T0), "the positions count from the first column of the padded batch; a "
                     "left-padded prompt starts at position 0 at its first real token (cumsum of the mask, minus 1).")])
    lengths = torch.tensor([len(p) for p in prompts])
    for s, rec in enumerate(records[1:], start=1):                  # the call that chooses token s
        where = f"{label}: decode call {s}"
        expect(tuple(rec["ids"].shape) == (B, 1) and rec["cached"] == T0 + s - 1,
               f"{where} fed ids of shape {tuple(rec['ids'].shape)} after a cache of {rec['cached']} tokens, "
               f"expected ({B}, 1) after {T0 + s - 1}.",
               "after the prefill, feed only the token each row just chose, shape (B, 1), with the caches the "
               "previous call returned.")
        alive = torch.tensor([eos_id not in tokens[b, :s].tolist() for b in range(B)])
        compare(rec["ids"][alive, 0], tokens[alive, s - 1], f"{where}: the tokens fed to the rows still generating",
                "feed back the tokens chosen at the previous step.")
        compare(rec["positions"][alive, 0], (lengths + s - 1)[alive],
                f"{where}: the positions of the rows still generating (prompts of {lengths[alive].tolist()} tokens)",
                "the token fed at decode step s of row b sits at position len(prompt b) + s - 1.", variants=[
                    (torch.full((int(alive.sum()),), T0 + s - 1), "the new token's position is counted from the "
                     "row's own first real token, not from the padded batch's first column: len(prompt b) + s - 1."),
                    (lengths[alive], "the position must advance by one at every decode step: len(prompt b) + s - 1.")])
        compare(rec["mask"], torch.cat((records[0]["mask"], torch.ones(B, s, dtype=torch.bool)), dim=1),
                f"{where}: the attention_mask, against the prefill's mask followed by {s} True column(s)",
                "the pads stay masked at every step, and every generated token is a real key: append one True "
                "column per step to the prefill's mask.")


@_one_thread
def check_generate(generate_batch, hidden: bool = False) -> None:
    d = draw("generate", hidden)
    for i, (cfg, lengths, n_new) in enumerate(d.cases([((20, 16, 2, 4, 2), [5, 1, 9], 6)], _generation_case, 3)):
        prompts = [d.randint(0, cfg[0], (T,)) for T in lengths]
        dtype = torch.float64 if i == 2 else torch.float32       # a second dtype
        _check_generation(generate_batch, *_model_that_stops(d.sub(f"model{i}"), cfg, dtype, prompts, n_new),
                          prompts, n_new)


def _check_generation(generate_batch, model: TinyDecoder, alone: list, eos_id: int, prompts: list, n_new: int) -> None:
    B, pad_id = len(prompts), (eos_id + 1) % model.vocab_size
    label = (f"generate_batch(model, prompts of lengths {[len(p) for p in prompts]}, max_new_tokens={n_new}, "
             f"eos_id={eos_id}, pad_id={pad_id}) with a {str(model.head.weight.dtype).replace('torch.', '')} model")
    model.calls.zero_()
    tokens = call(generate_batch, model, [p.clone() for p in prompts], n_new, eos_id, pad_id, name="generate_batch")
    n_calls, records = int(model.calls), model.records()     # before the check's own calls below
    expect_tensor(tokens, (B, n_new), f"{label}: the new tokens")
    expect(tokens.dtype == torch.long, f"{label}: the new tokens are {tokens.dtype}, expected torch.long.",
           "token ids are int64, like the prompts: build the output with torch.full(..., dtype=torch.long).")
    expect(n_calls > 0, f"{label} never called the model.", "call model(ids, kv_caches, positions, mask).")
    _check_calls(records, prompts, tokens := tokens.detach().cpu(), eos_id, label)
    for b, p in enumerate(prompts):                # each row: greedy up to and including its end token, then pad_id
        row = tokens[b].tolist()
        end = row.index(eos_id) + 1 if eos_id in row else n_new
        s = next((s for s, ok in enumerate(_greedy_margins(model, p, row[:end])) if not ok), None)
        expect(s is None, f"{label}: row {b} (prompt of {len(p)} tokens) got {row}; its token {s} is not the greedy "
               f"choice of the model fed that row alone without padding ({alone[b]} without an end token).",
               "a row is finished once it has produced eos_id: it continues with pad_id only."
               if s and eos_id in alone[b][:s] else "each row's next token is the argmax of the logits at the LAST "
               "position, logits[:, -1]; the pads must be masked and the positions counted per row.")
        expect(all(t == pad_id for t in row[end:]), f"{label}: row {b} got {row}: after its end token {eos_id} "
               f"(step {end - 1}) it should hold pad_id={pad_id} only.", "a row is finished once it has produced "
               "eos_id: write pad_id in its later places, whatever the model predicts for it.")
    finished = [t.index(eos_id) + 1 for t in tokens.tolist() if eos_id in t]
    steps = max(finished) if len(finished) == B else n_new
    expect(n_calls == steps, f"{label} called the model {n_calls} times; every row had finished after {steps} "
           f"step(s), so {steps} calls were needed.",
           "stop as soon as every row has produced eos_id (or max_new_tokens tokens are chosen): the model "
           "is not called to choose tokens that are padding anyway." if n_calls > steps else
           "call the model once per chosen token: the prefill chooses the first, each decode call the next.")

# ----------------------------------------------------------------------------- exercise 5: beam search


class _MarkovStep(nn.Module):
    """A toy decoder: prefixes (N, t) -> log-probs (N, V) of the next token given the last one and the position.
    It counts its calls in a buffer (the grader gets a module's state back from the student's kernel)."""

    def __init__(self, table: torch.Tensor, bias: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("table", table)
        self.register_buffer("bias", bias)
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))

    @torch.no_grad()
    def forward(self, prefixes: torch.Tensor) -> torch.Tensor:
        _core.expect(prefixes.dim() == 2 and len(prefixes) > 0, f"step_fn was called with prefixes of shape "
                     f"{tuple(prefixes.shape)}, expected (N, t) with N >= 1.", "stop as soon as no hypothesis is "
                     "alive: once every kept candidate has ended in eos, there is nothing left to expand.")
        self.calls += 1
        return torch.log_softmax(self.table[prefixes[:, -1]] + self.bias[prefixes.shape[1] - 1], dim=-1)


def _beam_oracle(step_fn, bos, eos, beam_size, max_len, alpha, variant="ok", steps=None):
    """Beam search by its definition, best first: [(tokens after bos, normalised score)]; ``variant`` a known bug;
    one step appended to ``steps`` per call of step_fn."""
    alive, finished = [([bos], 0.0)], []
    while alive and len(alive[0][0]) <= max_len:
        (steps if steps is not None else []).append(len(alive))
        logp = step_fn(torch.tensor([t for t, _ in alive])).double()
        cands = sorted((((0.0 if variant == "no_parent" else score) + logp[i, v].item(), i, v)
                        for i, (_, score) in enumerate(alive) for v in range(logp.shape[1])), key=lambda c: -c[0])
        if variant == "refill":       # the bug: a candidate ending in eos takes no place, the beam is topped up
            cands = [c for j, c in enumerate(cands) if sum(x[2] != eos for x in cands[:j]) < beam_size]
        kept = cands if variant == "refill" else cands[:beam_size]
        new = [(alive[i][0] + [v], score) for score, i, v in kept]
        ended = [v == eos and variant != "eos_ignored" for _, _, v in kept]
        finished += [h for h, e in zip(new, ended) if e]
        alive = [h for h, e in zip(new, ended) if not e]
    finished += alive if variant != "drop_alive" else []
    length = (lambda toks: len(toks)) if variant == "count_bos" else (lambda toks: len(toks) - 1)
    out = [(toks[1:], s if variant == "no_norm" else s / length(toks) ** alpha) for toks, s in finished]
    return sorted(out, key=lambda h: -h[1])


def _beam_cases(d) -> list[tuple]:
    def drawn(d):
        return (d.rng.randrange(4, 12), d.rng.randrange(1, 6), d.rng.randrange(2, 8),
                d.rng.choice([0.0, 0.5, 0.8, 1.0]),
                d.rng.choice([0.5, 1.0, 2.0, 3.0]))

    specs = d.cases([(7, 3, 5, 1.0, 1.5), (9, 4, 6, 1.0, 0.5), (6, 2, 4, 0.6, 2.0), (8, 3, 6, 1.0, 3.0)] +
                    ([(5, 1, 5, 1.0, 2.0), (6, 30, 3, 1.0, 2.0)] if d.hidden else []),   # greedy; a beam wider than all
                    drawn, 6)
    cases = []
    for V, beam, max_len, alpha, sharp in specs:
        table, bias = d.randn(V, V) * sharp, d.randn(max_len + 1, V)
        bias[:, V - 1] += torch.linspace(-1.5, 1.5, max_len + 1)     # the end (V - 1) becomes likelier with length
        cases.append((_MarkovStep(table, bias), 0, V - 1, beam, max_len, alpha))
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
    ("refill", "a candidate that ends in eos takes one of the beam_size places of its step: keep the beam_size best "
     "candidates, then move those ending in eos out; the beam shrinks, it is not topped up with lower candidates."),
]


def _hypotheses(hyps: list, width: int) -> torch.Tensor:
    """(n, 1 + width) float64: one row per hypothesis, its score, then its tokens padded with -1."""
    rows = [[s] + [float(t) for t in toks] + [-1.0] * (width - len(toks)) for toks, s in hyps]
    return torch.tensor(rows, dtype=torch.float64).reshape(len(rows), 1 + width)


@_one_thread
def check_beam_search(beam_search, hidden: bool = False) -> None:
    for step_fn, bos, eos, beam, max_len, alpha in _beam_cases(draw("beam_search", hidden)):
        label = f"beam_search(beam_size={beam}, max_len={max_len}, length_penalty={alpha})"
        got = call(beam_search, step_fn, bos, eos, beam, max_len, alpha, name="beam_search")
        n_calls = int(step_fn.calls)          # before the oracles below call step_fn themselves
        expect(isinstance(got, (list, tuple)) and all(isinstance(h, (list, tuple)) and len(h) == 2 for h in got),
               f"{label} should return a list of (tokens, score) pairs.",
               "return [(tokens, normalised_score), ...], best first.")
        got = [([int(t) for t in toks], float(s)) for toks, s in got]
        width = max([max_len] + [len(toks) for toks, _ in got])

        def table(variant="ok", order=lambda hyps: hyps):
            return _hypotheses(order(_beam_oracle(step_fn, bos, eos, beam, max_len, alpha, variant)), width)
        # A wrong score can tie several hypotheses: a mistake is recognised by the set of hypotheses it gives.
        compare(_hypotheses(got, width), table(), f"{label}: the hypotheses best first, one row each (score, then "
                "the tokens after bos, padded with -1)", "keep the beam_size best candidates (by summed log-prob) "
                "over all expansions of all alive hypotheses; move those ending in eos to the finished list; at the "
                "end add the alive ones, score each by sum / (number of tokens after bos) ** length_penalty and sort "
                "best first.", variants=[(when(lambda _, v=v: matches(_hypotheses(sorted(got), width),
                                                                      table(v, sorted), _F32)), text)
                                         for v, text in _BEAM_VARIANTS], tol=_F32)
        _beam_oracle(step_fn, bos, eos, beam, max_len, alpha, steps=(steps := []))
        expect(n_calls == len(steps), f"{label} called step_fn {n_calls} times for a search of {len(steps)} steps "
               f"(alive hypotheses at each step: {steps}).", "score every alive hypothesis of a step in one call of "
               "step_fn: the decoder takes the (N, t) prefixes of all N of them at once, once per step.")

# ----------------------------------------------------------------------------- exercise 6: int8 weights


def _scale_oracle(w: torch.Tensor, g: int, levels: int = 127) -> torch.Tensor:
    """(out, in) -> (out, in // g): max |w| over each group of g consecutive columns / levels (1.0 for a zero group)."""
    amax = w.float().reshape(w.shape[0], -1, g).abs().amax(dim=-1)
    return torch.where(amax > 0, amax / levels, torch.ones_like(amax))


def _expand_scale(scale: torch.Tensor, g: int) -> torch.Tensor:
    """(out, n_groups) -> (out, n_groups * g): each scale over its group's columns."""
    return scale.float().repeat_interleave(g, dim=1)


def _weight_cases(d) -> list[tuple[torch.Tensor, int]]:
    def drawn(d):
        size = d.rng.choice([1, 2, 3, 8, 16])
        return d.randn(d.rng.randrange(1, 30), size * d.rng.randrange(1, 6)) * d.rng.choice([1e-3, 1, 50]), size

    w = d.randn(6, 12) * 0.05
    w[1, 4:8] = 0.0                                       # an all-zero group
    w[2, 3] = 2.0                                         # an outlier: it should only coarsen its own group
    cases = d.cases([(w, 4), (d.randn(5, 4), 4), ((d.randn(4, 6) * 3).to(torch.bfloat16), 2)], drawn, 4)
    if d.hidden:
        n = d.rng.randrange(2, 8)
        wide = d.randn(n, 4 * n) * torch.logspace(-6, 3, 4 * n)[None, :]   # columns from 1e-6 to 1e3
        cases += [(wide, 4), (torch.zeros(3, 6), 3), ((d.randn(7, 16) * 0.02).to(torch.bfloat16), 8)]
    return cases


def _scale_variants(w: torch.Tensor, g: int) -> list:
    """The scales the usual mistakes give, with their hints."""
    out, n_groups = w.shape[0], w.shape[1] // g
    zero = w.float().reshape(out, n_groups, g).abs().amax(dim=-1) == 0                # (out, n_groups)
    strided = w.float().reshape(out, g, n_groups).transpose(1, 2).reshape(out, -1)    # groups of columns n_groups apart
    return [
        (when(lambda s: s.dtype != torch.float32 and matches(s, _scale_oracle(w, g), (0, 1e-2))),
         "compute in float32 (w.float()) and return float32 scales, whatever the weight's dtype."),
        (when(lambda s: s.numel() == 1 and out * n_groups > 1), "use one scale per group of group_size consecutive "
         "columns in each row, not one for the whole tensor: an outlier then coarsens only its own group."),
        (when(lambda s: n_groups > 1 and s.numel() == out and matches(s.reshape(-1, 1), _scale_oracle(w, w.shape[1]))),
         "one scale per group of group_size consecutive columns, not one per row: the scale has shape "
         "(out, in // group_size)."),
        (_scale_oracle(strided, g) if n_groups > 1 else None, "a group is group_size CONSECUTIVE columns: reshape to "
         "(out, in // group_size, group_size) and take the max over the last axis; (out, group_size, in // "
         "group_size) mixes columns that are in // group_size apart."),
        (when(lambda s: s.shape == (out, n_groups) and bool((zero & (s == 0)).any())), "an all-zero "
         "group gave a zero scale, so w / scale is 0/0 (NaN): use scale 1.0 where the group's max is 0."),
        (_scale_oracle(w, g, 128), "divide the max by 127, not 128: int8 goes to +127, and a symmetric range is "
         "-127..127."),
        (_scale_oracle(w, g, 255), "symmetric int8 uses -127..127: scale = max|w| / 127 (255 levels belong to an "
         "asymmetric scheme)."),
    ]


_QUANT = ("scale = max|w| over each group of group_size consecutive columns / 127 (1.0 for an all-zero group), "
          "shape (out, in // group_size); q = round(w / scale), clamped to -127..127.")


@_one_thread
def check_quantize_int8(quantize_int8, dequantize_int8, hidden: bool = False) -> None:
    for w, g in _weight_cases(draw("int8", hidden)):
        label = f"quantize_int8 of a {tuple(w.shape)} {str(w.dtype).replace('torch.', '')} weight, group_size={g}"
        result = call(quantize_int8, w.clone(), g, name="quantize_int8")
        expect(isinstance(result, (tuple, list)) and len(result) == 2, f"{label} should return (q, scale).",
               "return the int8 weight and the per-group scales as a tuple.")
        q, scale = result
        expect(isinstance(q, torch.Tensor) and q.dtype == torch.int8,
               f"{label}: q should be an int8 tensor, got {getattr(q, 'dtype', type(q).__name__)}.",
               "convert with .to(torch.int8) after rounding and clamping.")
        want_scale = _scale_oracle(w, g)
        compare(scale, want_scale, f"{label}: the scales", _QUANT, variants=_scale_variants(w, g))
        expect(scale.dtype == torch.float32, f"{label}: the scales are {scale.dtype}, expected float32.",
               "compute in float32 (w.float()) and return float32 scales, whatever the weight's dtype.")
        exact = w.float() / _expand_scale(want_scale, g)
        # q is w / scale rounded: within half a step of it (a tie may go either way).
        compare(q, exact, f"{label}: q, against w / scale", _QUANT, tol=(0.5 + 1e-3, 0.0), variants=[
            (exact.trunc(), "round to the nearest integer before converting: .to(torch.int8) truncates toward zero.")])
        back = call(dequantize_int8, q, scale, name="dequantize_int8")
        expect(isinstance(back, torch.Tensor) and back.dtype == torch.float32,
               f"dequantize_int8 returned {getattr(back, 'dtype', type(back).__name__)}, expected a float32 tensor.",
               "convert q to float before multiplying by the scales.")
        compare(back, q.float() * _expand_scale(scale, g), f"dequantize_int8 of {label}, against q times the scale "
                "of each column's group", "each scale multiplies the group_size consecutive columns of its group: "
                "scale.repeat_interleave(group_size, dim=1), with group_size = q.shape[1] // scale.shape[1].",
                variants=[(q.float() * scale.float().repeat(1, g) if scale.shape[1] > 1 else None,
                           "each scale covers group_size CONSECUTIVE columns: repeat_interleave each scale, not repeat "
                           "the whole row of scales (which gives column j the scale of group j % n_groups).")])
        expect(bool(((back - w.float()).abs() <= _expand_scale(want_scale, g) / 2 * (1 + 1e-3) + 1e-12).all()),
               f"{label}: the round trip error exceeds half a step of its group.",
               "round to the nearest level; the error of each weight is at most scale / 2.")


@_one_thread
def check_int8_linear(Int8Linear, hidden: bool = False) -> None:
    def drawn(d):
        size = d.rng.choice([1, 2, 4, 8])
        return size * d.rng.randrange(1, 6), d.rng.randrange(1, 40), d.rng.random() < 0.5, size

    d = draw("int8_linear", hidden)
    cases = d.cases([(12, 5, True, 4), (6, 6, False, 3)], drawn, 3)
    if hidden:
        n = 4 * d.rng.randrange(2, 6)
        cases.append((n, n, True, 4))
    for i, (d_in, d_out, bias, gs) in enumerate(cases):
        with d.sub(f"layer{i}").seeded():
            linear = nn.Linear(d_in, d_out, bias=bias)
        with torch.no_grad():
            linear.weight[0] *= 30                      # one large row
            linear.weight[:, 0] *= 10                   # one large input column: it coarsens only group 0
            if bias:
                linear.bias.add_(1.0)
        reference = copy.deepcopy(linear)              # the oracle sees the layer as drawn
        label = f"Int8Linear(nn.Linear({d_in}, {d_out}, bias={bias}), group_size={gs})"
        module = call(Int8Linear, linear, gs, name="Int8Linear(...)")
        q, scale = _check_int8_storage(module, reference, gs, label)
        w_hat = q.double() * scale.double().repeat_interleave(gs, dim=1)
        for shape in ((3, d_in), (2, 4, d_in)):
            _check_int8_forward(module, reference, w_hat, d.randn(*shape), gs, label)
        _check_int8_holdings(module, reference, gs, label)     # after forward: a copy made there counts too
        _check_int8_own_tensors(module, linear, w_hat, reference, d.randn(2, d_in), label)


def _check_int8_storage(module, reference: nn.Linear, gs: int, label: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The int8 weight and its scales, kept as buffers (what else the module holds: _check_int8_holdings)."""
    (d_out, d_in), bias = reference.weight.shape, reference.bias is not None
    expect(isinstance(module, nn.Module), f"{label} should be an nn.Module.", "subclass nn.Module.")
    missing = [name for name in ("weight_int8", "scale") + (("bias",) if bias else ())
               if name not in dict(module.named_buffers())]
    expect(not missing, f"{label} keeps {', '.join(missing)} outside its buffers.",
           "register them with self.register_buffer(name, tensor): a buffer moves with .to(device) and is "
           "saved by state_dict; a plain attribute (or a Parameter, for the bias) is not what the spec asks.")
    q, scale = getattr(module, "weight_int8", None), getattr(module, "scale", None)
    expect(isinstance(q, torch.Tensor) and q.dtype == torch.int8 and tuple(q.shape) == (d_out, d_in),
           f"{label}.weight_int8 should be an int8 tensor of shape {(d_out, d_in)}.",
           "keep the quantised weight in a buffer named weight_int8: self.register_buffer('weight_int8', q).")
    compare(scale, _scale_oracle(reference.weight.detach(), gs), f"{label}.scale, the per-group scale of the weight",
            "quantise the layer's weight with your quantize_int8 and keep its scale in a buffer named scale.",
            variants=[(when(lambda s: d_in // gs > 1 and s.numel() == d_out), "quantise with the layer's group_size: "
                       "quantize_int8(weight, group_size), one scale per group, shape (out, in // group_size), not one "
                       "per row.")])
    return q, scale


def _holdings(module: nn.Module, args, output) -> list[tuple[str, str, str, list, int]]:
    """A forward hook, run where the module lives (the student's kernel while grading): in place of the output,
    every tensor the module holds, reached through its attributes (parameters, buffers, plain attributes),
    submodules and containers, each storage once: (path, kind, dtype, shape, bytes of its storage)."""
    import types

    found, seen, storages = [], set(), set()
    kinds = {"_parameters": "a parameter", "_buffers": "a buffer", "_modules": ""}

    def walk(obj, path: str, kind: str, depth: int) -> None:
        if id(obj) in seen or depth > 8:
            return
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            if (obj.device.type, obj.untyped_storage().data_ptr()) not in storages:
                storages.add((obj.device.type, obj.untyped_storage().data_ptr()))
                found.append((path, kind, str(obj.dtype).replace("torch.", ""), list(obj.shape),
                              int(obj.untyped_storage().nbytes())))
            return
        if isinstance(obj, (types.ModuleType, types.FunctionType, types.MethodType, type)):
            return
        items = (obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, (list, tuple, set))
                 else vars(obj).items() if hasattr(obj, "__dict__") else ())
        for key, value in list(items):
            inner = kinds.get(key) if isinstance(obj, nn.Module) else None
            if inner is not None:       # a module's own tables: their entries are named as attributes
                walk(value, path, inner or kind, depth + 1)
            else:
                walk(value, f"{path}.{key}" if path else str(key), kind or "a plain attribute", depth + 1)
    walk(module, "", "", 0)
    return found


def _check_int8_holdings(module, reference: nn.Linear, gs: int, label: str) -> None:
    """Storage by what the module holds, not by its state_dict: the int8 weight, the float32 scales and the bias,
    and no float copy of the weight (a plain attribute is not in state_dict, but it is in memory)."""
    (d_out, d_in), bias = reference.weight.shape, reference.bias is not None
    handle = call(module.register_forward_hook, _holdings, name=f"{label}.register_forward_hook")
    try:
        held = call(module, torch.zeros(1, d_in), name=f"{label}.forward")
    finally:
        handle.remove()
    expect(isinstance(held, list), f"{label}: its forward hooks did not run, so what it holds could not be listed.",
           "define forward(x) and call the layer as layer(x); do not override __call__.")
    limit = d_out * d_in + 4 * d_out * (d_in // gs) + (4 * d_out if bias else 0)
    stored = sum(nbytes for *_, nbytes in held)
    copies = [f"{path} ({kind}, {dtype} {tuple(shape)})" for path, kind, dtype, shape, _ in held
              if not dtype.startswith("int") and math.prod(shape) >= d_out * d_in and path != "scale"
              # the bias itself, as large as the weight when in_features is 1 (any extra bytes fail the limit)
              and not (path == "bias" and tuple(shape) == (d_out,))]
    shown = ", ".join(f"{path}: {dtype} {tuple(shape)}" for path, _, dtype, shape, _ in held)
    expect(not copies and stored <= limit,
           f"{label} holds {stored} bytes of tensors, expected at most {limit} (int8 weight, float32 scales and "
           f"bias): {shown}.",
           "store only the int8 weight and its scales (register_buffer), not the float weight as well"
           f"{' (found ' + ', '.join(copies) + ')' if copies else ''}: dequantise inside forward and keep nothing "
           "else, as a parameter, a buffer or a plain attribute; what the layer holds stays in memory, whether "
           "state_dict saves it or not.")


_SOURCE_BIAS_SHIFT = 7.0      # what the float layer's bias gains after the int8 layer is built


def _change_source_layer(module, args, kwargs):
    """A forward pre-hook, run where the module lives (the student's kernel while grading): the float layer the
    int8 layer was built from, passed as ``source_layer``, is changed in place before the forward runs."""
    source = kwargs.pop("source_layer")
    with torch.no_grad():
        source.weight.mul_(-1.0)
        if source.bias is not None:
            source.bias.add_(_SOURCE_BIAS_SHIFT)
    return args, kwargs


def _check_int8_own_tensors(module, linear: nn.Linear, w_hat: torch.Tensor, reference: nn.Linear, x: torch.Tensor,
                            label: str) -> None:
    """The int8 layer owns its tensors: changing the float layer after construction changes nothing of it."""
    handle = call(module.register_forward_pre_hook, _change_source_layer, with_kwargs=True,
                  name=f"{label}.register_forward_pre_hook")
    try:
        got = call(module, x.clone(), source_layer=linear, name=f"{label}.forward")
    finally:
        handle.remove()
    b = None if reference.bias is None else reference.bias.detach().double()
    compare(got, F.linear(x.double(), w_hat, b), f"{label}: the output after the float layer it was built from "
            "changed in place", "the int8 layer must not change when the float layer does: keep copies of what you "
            "take from it, not references to its tensors.", variants=[
                (None if b is None else F.linear(x.double(), w_hat, b + _SOURCE_BIAS_SHIFT),
                 "the bias is the float layer's own tensor (linear.bias.detach() or .data share its storage): copy "
                 "it, linear.bias.detach().clone(), so that changing the float layer leaves the int8 layer as it "
                 "was.")], tol=_F32)


def _check_int8_forward(module, reference: nn.Linear, w_hat: torch.Tensor, x: torch.Tensor, gs: int,
                        label: str) -> None:
    got = call(module, x.clone(), name=f"{label}.forward")
    b = None if reference.bias is None else reference.bias.detach().double()
    compare(got, F.linear(x.double(), w_hat, b), f"{label}: the output, against x @ dequantised_weight.T + bias",
            "forward is x @ dequantised_weight.T + bias, with each column times the scale of its group.", variants=[
                (F.linear(x.double(), w_hat) if b is not None else None,
                 "add the layer's bias: quantisation replaces the weight only."),
                (F.linear(x.double(), reference.weight.detach().double(), b),
                 "forward used the original float weight: compute with the dequantised int8 weight.")], tol=_F32)
    # Against the float layer: each weight is off by at most half a step of its group.
    bound = x.abs() @ _expand_scale(_scale_oracle(reference.weight.detach(), gs), gs).T / 2 * (1 + 1e-3) + 1e-5
    expect(bool(((got.detach() - reference(x).detach()).abs() <= bound).all()),
           f"{label}: the output is further from the float layer than int8 rounding allows.",
           "quantise with round-to-nearest and per-group scales; each weight may move by at most scale / 2.")

# ----------------------------------------------------------------------------- exercise 7: memory


def _params_oracle(c: dict, variant: str = "ok") -> int:
    V, d, L, h, kv, ff, tied, qkv_bias = (c[k] for k in _CONFIG)
    kv_width = kv * (d // h)
    attn = 2 * d * d + 2 * d * (d if variant == "no_gqa" else kv_width)
    mlp = (2 if variant == "two_mlp" else 3) * d * ff
    norm = 0 if variant == "no_norms" else d                  # two per layer and a final one
    biases = {"no_qkv_bias": 0, "qkv_bias_full": 3 * d, "every_bias": 2 * d + 2 * kv_width + 2 * ff + d}.get(
        variant, d + 2 * kv_width) if qkv_bias else 0          # q, k and v only (every_bias: chapter 4's bias=True)
    return V * d + L * (attn + mlp + 2 * norm + biases) + norm + (0 if tied != (variant == "head_flip") else V * d)


_CONFIG = ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "d_ff", "tie_embeddings", "qkv_bias")
PUBLISHED = {name: (dict(zip(_CONFIG, config)), total) for name, config, total in [   # released checkpoints' totals
    ("Llama-2-7B", (32000, 4096, 32, 32, 32, 11008, False, False), 6_738_415_616),
    ("Llama-3-8B", (128256, 4096, 32, 32, 8, 14336, False, False), 8_030_261_248),
    ("Llama-2-70B", (32000, 8192, 80, 64, 8, 28672, False, False), 68_976_648_192),
    ("Llama-3.2-1B", (128256, 2048, 16, 32, 8, 8192, True, False), 1_235_814_400),
    ("Qwen2-7B", (152064, 3584, 28, 28, 4, 18944, False, True), 7_615_616_512),
    ("Qwen2-0.5B", (151936, 896, 24, 14, 2, 4864, True, True), 494_032_768)]}

_PARAM_HINTS = [
    ("no_gqa", "k_proj and v_proj produce n_kv_heads * d_head features (d_head = d_model // n_heads), not d_model: "
     "grouped-query attention shrinks them."),
    ("head_flip", "tied embeddings share one matrix between the input table and the output head: count it once "
     "when tie_embeddings is True, twice (table and head) when False."),
    ("no_norms", "count the RMSNorm weights too: two of d_model per layer and one final norm."),
    ("two_mlp", "a gated MLP (SwiGLU) has three matrices of d_model x d_ff: gate, up and down."),
    ("no_qkv_bias", "when qkv_bias is True (Qwen2), q_proj, k_proj and v_proj each have a bias as wide as their "
     "output: add those three biases in every layer."),
    ("qkv_bias_full", "the biases of k_proj and v_proj are as wide as their outputs, n_kv_heads * d_head, not "
     "d_model: grouped-query attention shrinks them too."),
    ("every_bias", "Qwen2 has biases on q_proj, k_proj and v_proj only: chapter 4's bias=True puts one on every "
     "linear layer of the blocks (o_proj and the MLP too), so count the three biases yourself."),
]


def _memory_oracle(c: dict, seq_len: int, batch: int, wdt: torch.dtype, kvdt: torch.dtype | None,
                   variant: str = "ok") -> int:
    """The weights' bytes and the cache's (:func:`_kv_oracle`, whose slips ``variant`` may also name)."""
    size, kvsize = (torch.empty((), dtype=t).element_size() for t in (wdt, kvdt or wdt))
    kvsize = size if variant == "kv_in_weight_dtype" else kvsize
    return _params_oracle(c) * size + _kv_oracle(c, seq_len, batch, kvsize, variant)


_MEMORY_HINTS = [
    ("keys_only", "the cache holds keys and values: two tensors per layer, so multiply the KV part by 2."),
    ("n_heads", "the cache stores n_kv_heads heads per layer, not n_heads: that is what grouped-query attention "
     "saves."),
    ("no_batch", "each sequence of the batch has its own cache: multiply the KV part by batch_size."),
    ("kv_in_weight_dtype", "the cache uses kv_dtype when it is given (weights and cache may differ)."),
    ("two_bytes", "the cache's bytes per number are those of kv_dtype (of the weights' dtype when it is None): "
     "element_size(), not a fixed 2."),
]


def _random_config(d) -> tuple[str, dict, int]:
    """(name, config, its parameter count)."""
    kv = d.rng.choice([1, 2, 4, 8])
    h = kv * d.rng.choice([1, 2, 4])
    width = h * d.rng.choice([16, 32, 64, 128])
    c = dict(vocab_size=d.rng.randrange(100, 200_000), d_model=width, n_layers=d.rng.randrange(1, 100),
             n_heads=h, n_kv_heads=kv, d_ff=d.rng.randrange(width, 5 * width), tie_embeddings=d.rng.random() < 0.5,
             qkv_bias=d.rng.random() < 0.5)
    return f"config {c}", c, _params_oracle(c)


def _memory_cases(d) -> list[tuple]:
    def drawn(d):
        return (_random_config(d)[1], d.rng.randrange(1, 100_000), d.rng.randrange(1, 16),
                d.rng.choice([torch.float32, torch.bfloat16, torch.int8]),
                d.rng.choice([None, torch.float16, torch.float32, torch.int8]))

    cases = d.cases([(PUBLISHED["Llama-2-7B"][0], 4096, 1, torch.float16, None),
                     (PUBLISHED["Llama-3-8B"][0], 8192, 4, torch.bfloat16, None),
                     (PUBLISHED["Llama-3-8B"][0], 1000, 2, torch.int8, torch.float32)], drawn, 4)
    return cases + ([(PUBLISHED["Llama-2-70B"][0], 32_768, 8, torch.bfloat16, torch.float8_e4m3fn)] if d.hidden else [])


# The prediction of exercise 7: the KV cache of a configuration. Visible, Qwen2-7B for 8 sequences of 32,768 tokens in
# bfloat16 (the case asked on paper, and the one the notebook measures), a model without grouping and a one-byte cache;
# hidden, configurations drawn at grading time, none of them a visible case.
QWEN2_7B = PUBLISHED["Qwen2-7B"][0]
MEASURED = (QWEN2_7B, 32768, 8, 2)         # (config, seq_len, batch_size, bytes_per_number)


def _kv_oracle(c: dict, seq_len: int, batch: int, nbytes: int, variant: str = "ok") -> int:
    """Bytes of the keys and values of ``batch`` sequences of ``seq_len`` tokens; ``variant`` a known slip."""
    heads = c["n_heads"] if variant == "n_heads" else c["n_kv_heads"]
    per_token = (1 if variant == "keys_only" else 2) * (1 if variant == "one_layer" else c["n_layers"]) * heads
    per_token *= c["d_model"] // c["n_heads"] * (2 if variant == "two_bytes" else nbytes)
    return per_token * seq_len * (1 if variant == "no_batch" else batch)


_KV_SLIPS = [
    ("keys_only", "a factor 2 is missing: the cache holds a key AND a value per token, layer and key/value head."),
    ("n_heads", "with grouped-query attention the cache holds the n_kv_heads key/value heads, not the n_heads query "
     "heads (d_model = n_heads x d_head is the query width)."),
    ("two_bytes", "each number takes bytes_per_number bytes: use the argument, not a fixed 2."),
    ("no_batch", "each of the batch_size sequences keeps its own cache: multiply by the batch size."),
    ("one_layer", "every one of the n_layers layers keeps its own keys and values."),
]


def _kv_cases(d) -> list[tuple]:
    visible = [MEASURED, (PUBLISHED["Llama-2-7B"][0], 4096, 1, 2), (PUBLISHED["Llama-3-8B"][0], 8192, 4, 1)]
    answers = {_kv_oracle(*case) for case in visible}

    def drawn(d):      # a configuration no visible case (and so no measurement of the notebook) covers
        case = (_random_config(d)[1], d.rng.randrange(1, 200_000), d.rng.randrange(1, 33), d.rng.choice([1, 2, 4]))
        return case if _kv_oracle(*case) not in answers else drawn(d)
    return d.cases(visible, drawn, 4)


def _check_kv_prediction(predicted_kv_cache_bytes, hidden: bool = False) -> None:
    """Run with no tensor operation allowed (``unmeasured``): the prediction is arithmetic on the configuration."""
    seen = []                       # (answer, expected) of the cases before: a constant answers them all alike
    for c, seq_len, batch, nbytes in _kv_cases(draw("kv_prediction", hidden)):
        with unmeasured("predicted_kv_cache_bytes"):
            got = call(predicted_kv_cache_bytes, dict(c), seq_len, batch, nbytes, name="predicted_kv_cache_bytes")
        label = (f"predicted_kv_cache_bytes({c['n_layers']} layers, {c['n_heads']} heads of which {c['n_kv_heads']} "
                 f"key/value, d_model={c['d_model']}; seq_len={seq_len}, batch_size={batch}, "
                 f"bytes_per_number={nbytes})")
        expect(isinstance(got, (int, float)) and not isinstance(got, bool), f"{label} returned {type(got).__name__}, "
               "expected a number.", "return the number of bytes as a Python int: arithmetic on the arguments.")
        want = _kv_oracle(c, seq_len, batch, nbytes)
        compare(got, want, label, "count what the cache keeps: for every layer, key/value head, token and sequence, "
                "one key and one value vector of d_head = d_model // n_heads numbers, of bytes_per_number bytes each.",
                variants=[
                    (when(lambda v: v == _kv_oracle(*MEASURED)), "that is the cache of Qwen2-7B for 8 sequences of "
                     "32,768 tokens, the case the notebook measures: compute the bytes from the configuration and "
                     "sizes you are given, not a number read off one measurement."),
                    (when(lambda v: any(v == old and w != want for old, w in seen)), "the same number came back for "
                     "another configuration: compute the bytes from the arguments, not a number read off one case."),
                    *variants_of(lambda v: _kv_oracle(c, seq_len, batch, nbytes, v), _KV_SLIPS),
                    (want / 2 ** 30, "give the answer in bytes, not GiB."), (want / 1e9, "give the answer in bytes, "
                                                                                 "not GB."),
                    (when(lambda v: abs(v - want) <= 0.01 * want), "close, but not exact: a count of bytes is an "
                     "integer; write the product, not a rounded reading.")])
        seen.append((got, want))


def kv_prediction_passes(predicted_kv_cache_bytes) -> bool:
    """For the exercise's measurement, shown only once the prediction passes its visible test."""
    return passes(_check_kv_prediction, predicted_kv_cache_bytes)


def check_counting_tool(count_params, hidden: bool = False) -> None:
    """Chapter 4's own check (exercise 7) on the count_params brought into this notebook."""
    earlier_chapter("count_params", 4, 7, lambda: ch04.check_count_params(count_params, hidden=hidden))


def check_memory(count_config_params, inference_memory_bytes, predicted_kv_cache_bytes=None, count_params=None,
                 hidden: bool = False) -> None:
    """The prediction, the parameters of configurations (published checkpoints' totals and drawn ones) and the
    memory of weights and cache; a count that chapter 4's count_params, pasted here, also gets wrong is blamed on
    it."""
    if predicted_kv_cache_bytes is not None:
        _check_kv_prediction(predicted_kv_cache_bytes, hidden)
    d = draw("memory", hidden)
    tiny = dict(vocab_size=10, d_model=4, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=6, tie_embeddings=True,
                qkv_bias=False)
    configs = [(name, c, want) for name, (c, want) in PUBLISHED.items() if hidden or name != "Llama-2-70B"]
    configs.append(("tiny tied", tiny, 10 * 4 + 2 * 16 + 2 * 4 * 2 + 3 * 4 * 6 + 2 * 4 + 4))
    configs.append(("tiny tied, q/k/v biases", {**tiny, "qkv_bias": True}, 172 + 4 + 2 + 2))
    earlier = [] if count_params is None else [
        ("count_config_params calls your count_params from chapter 4, which fails that chapter's tests (exercise 7)",
         functools.partial(check_counting_tool, count_params, hidden))]
    with earlier_first(*earlier):
        for name, c, want in d.sub("configs").cases(configs, _random_config, 5):
            compare(call(count_config_params, dict(c), name="count_config_params"), want,
                    f"count_config_params({name})", "per layer: q and o are d_model x d_model, k and v d_model x "
                    "(n_kv_heads * d_head), a gated MLP 3 x d_model x d_ff, two norms of d_model, and biases on q, k "
                    "and v when qkv_bias is True; plus the embedding, a final norm and the head (unless tied).",
                    variants=variants_of(lambda v: _params_oracle(c, v), _PARAM_HINTS))
    passed = []          # cases already right: a slip that would have failed one of them is not the cause
    for case in _memory_cases(d):
        c, seq_len, batch, wdt, kvdt = case
        want = _memory_oracle(*case)
        got = call(inference_memory_bytes, dict(c), seq_len, batch, wdt, kvdt, name="inference_memory_bytes")
        label = (f"inference_memory_bytes(seq_len={seq_len}, batch_size={batch}, weight_dtype={wdt}, "
                 f"kv_dtype={kvdt})")
        expect(isinstance(got, int) and not isinstance(got, bool), f"{label} returned {type(got).__name__}.",
               "return a Python int (element_size() is an int).")
        slips = [(v, text) for v, text in _MEMORY_HINTS
                 if all(_memory_oracle(*p, v) == _memory_oracle(*p) for p in passed)]
        bits = want + _params_oracle(c) * 7 * torch.empty((), dtype=wdt).element_size()   # weights counted in bits
        compare(got, want, label, "bytes = count_config_params(config) * weight bytes + 2 * n_layers * batch_size "
                "* seq_len * n_kv_heads * d_head * KV bytes.",
                variants=[(_memory_oracle(*case, v), text) for v, text in slips] +
                [(want * 8, "that is bits: use element_size() for bytes."), (bits, "that is bits: use element_size() "
                                                                                     "for bytes.")])
        passed.append(case)

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
    support = probs > 0
    expected, observed = probs[support].double() * counts.sum().item(), counts[support].double()
    if (small := expected < 5).any():
        expected = torch.cat((expected[~small], expected[small].sum()[None]))
        observed = torch.cat((observed[~small], observed[small].sum()[None]))
    return ((observed - expected) ** 2 / expected).sum().item(), len(expected) - 1, bool((counts[~support] > 0).any())


def _follows(tokens: torch.Tensor, probs: torch.Tensor) -> bool:
    """Whether the tokens (N,) pass the chi-square test against probs (V,) at p = 1e-7."""
    stat, dof, impossible = _chi2(torch.bincount(tokens, minlength=len(probs)), probs)
    return not impossible and stat <= _chi2_critical(max(dof, 1))


def _near(rate: float, prob: float, n: int, slack: float = 0.0) -> bool:
    """A rate within 5.5 standard errors (plus slack) of the probability of n Bernoulli draws."""
    return abs(rate - prob) <= 5.5 * math.sqrt(max(prob * (1 - prob), 1e-12) / n) + slack


def _spec_setup(d, V: int, k: int, sharp: float) -> tuple[torch.Tensor, torch.Tensor]:
    p = torch.softmax(d.randn(k + 1, V) * sharp, -1)
    q = torch.softmax(torch.log(p[:k]) + d.randn(k, V) * 0.8, -1)   # a draft close to the target
    return p, q


def _spec_cases(d) -> list[tuple[torch.Tensor, torch.Tensor, int]]:
    """(target p (k + 1, V), draft q (k, V), batch size); hidden, with fresh sizes and edge cases."""
    if not d.hidden:
        return [(*_spec_setup(d, 5, 3, 1.0), 6000)]
    cases = [(*_spec_setup(d, d.rng.randrange(3, 8), d.rng.randrange(1, 5), d.rng.choice([0.5, 1.0, 1.5])), 6000)]
    p, q = _spec_setup(d, d.rng.randrange(4, 7), 2, 1.0)
    p[0, 0], q[0, 1] = 0.0, 0.0     # the draft likes a token the target never emits, and the other way round
    p, q = p / p.sum(-1, keepdim=True), q / q.sum(-1, keepdim=True)
    q[1] = p[1]                     # a perfect draft at position 1: always accepted
    cases.append((p, q, 5000))
    p, _ = _spec_setup(d, d.rng.randrange(3, 7), 2, 1.0)
    q = F.one_hot(p[:2].argmax(-1), p.shape[1]).float()   # a draft sure of one token: a shared uniform shows at j = 1
    disjoint = torch.tensor([[0.5, 0.5, 0, 0], [0.5, 0.5, 0, 0]]), torch.tensor([[0, 0, 0.5, 0.5]])   # all rejected
    return cases + [(p, q, 5000), (*disjoint, 2000)]


def _run_spec(speculative_accept, p, q, B, d):
    """B rows of draft tokens drawn from q, judged by the answer with the generator d.sub("accept").gen:
    draft (B, k), n_accepted (B,), next_token (B,)."""
    k, V = q.shape
    draft = torch.stack([torch.multinomial(q[j], B, replacement=True, generator=d.gen) for j in range(k)], dim=1)
    given = (draft.clone(), q.expand(B, k, V).contiguous(), p.expand(B, k + 1, V).contiguous())
    result = call(speculative_accept, *given, d.sub("accept").gen, name="speculative_accept")
    changed = [name for name, mine, want in zip(("draft_tokens", "draft_probs", "target_probs"), given,
                                                (draft, q.expand(B, k, V), p.expand(B, k + 1, V)))
               if not torch.equal(mine, want)]
    expect(not changed, f"speculative_accept changed {', '.join(changed)} in place.", "leave the inputs as they "
           "are (the caller keeps the draft's and the target's distributions for the next step): compute the "
           "residual out of place, max(0, p - q) as a new tensor.")
    expect(isinstance(result, (tuple, list)) and len(result) == 2,
           "speculative_accept should return (n_accepted, next_token).", "return two (B,) long tensors.")
    n, nxt = result
    expect_tensor(n, (B,), "n_accepted")
    expect_tensor(nxt, (B,), "next_token")
    expect(not n.is_floating_point() and not nxt.is_floating_point(), "n_accepted and next_token should be integers.",
           "return long tensors (counts and token ids).")
    expect(bool(((n >= 0) & (n <= k)).all()), f"n_accepted must lie in 0..k={k}, got values {sorted(set(n.tolist()))}.",
           "n_accepted counts the draft tokens accepted before the first rejection.")
    expect(bool(((nxt >= 0) & (nxt < V)).all()), f"next_token holds ids outside 0..{V - 1}.",
           "after a rejection, sample from the residual max(0, p - q) renormalised to sum 1 "
           "(without renormalising, a cumulative-sum sampler runs past the last token).")
    return draft, n.long(), nxt.long()


@_one_thread
def check_speculative_accept(speculative_accept, expected_tokens_per_step, hidden: bool = False) -> None:
    d = draw("speculative", hidden)
    cases = _spec_cases(d)
    for i, (p, q, B) in enumerate(cases):
        draft, n, nxt = _run_spec(speculative_accept, p, q, B, d.sub(f"case{i}"))
        _check_first_acceptance(p, q, n)
        for j in range(q.shape[0] + 1):
            _check_position(p, q, draft, n, nxt, j)
    # Reproducible for a given generator; the global RNG must not matter.
    p, q, _ = cases[0]
    first, again = _under_two_global_seeds(d, lambda: _run_spec(speculative_accept, p, q, 64, d.sub("again"))[1:])
    expect(torch.equal(first[0], again[0]) and torch.equal(first[1], again[1]),
           "speculative_accept gave different results for the same generator when the global seed changed.",
           "draw every uniform and every sample from the generator you are given: "
           "torch.rand(..., generator=generator), "
           "torch.multinomial(..., generator=generator).")
    _check_expected_tokens(expected_tokens_per_step, d.sub("expected"))


def _check_first_acceptance(p: torch.Tensor, q: torch.Tensor, n: torch.Tensor) -> None:
    """The first draft token is accepted with probability sum_x min(p_0, q_0): a wrong ratio shows here first."""
    B, k = len(n), q.shape[0]
    alpha, acc = torch.minimum(p[0], q[0]).sum().item(), (n >= 1).double().mean().item()
    if _near(acc, alpha, B, 3 / B):
        return
    inverted = (q[0] * torch.clamp(q[0] / p[0].clamp_min(1e-30), max=1)).sum().item()
    alphas, betas = torch.minimum(p[:k], q).sum(-1), (q * torch.clamp(q / p[:k].clamp_min(1e-30), max=1)).sum(-1)
    mean_n = n.double().mean().item()
    # Both slips raise the rate at position 0; the mean of n_accepted tells them apart.
    counts_all = _near(acc, 1 - torch.prod(1 - alphas).item(), B) and not (_near(acc, inverted, B) and abs(
        mean_n - alphas.sum().item()) >= abs(mean_n - torch.cumprod(betas, 0).sum().item()))
    fail(f"speculative_accept accepted the first draft token in {acc:.3f} of {B} rows; the rule gives {alpha:.3f} "
         f"(sum of min(p, q)).", diagnose(acc, [
             (when(lambda _: counts_all), "stop at the first rejection: n_accepted counts the draft tokens accepted "
              "before the first rejected one, not every draft token that passed its own test."),
             (when(lambda a: _near(a, inverted, B)), "the acceptance ratio is inverted: accept with probability "
              "min(1, p(x) / q(x)), target over draft."),
             (when(lambda a: _near(a, q[0][p[0] >= q[0]].sum().item(), B)), "a draft token with p(x) < q(x) is still "
              "accepted with probability p(x) / q(x): compare a uniform draw with the ratio, do not accept only when "
              "p(x) >= q(x)."),
             (when(lambda a: a > 0.999), "draft tokens are not always accepted: draw u uniformly and accept when "
              "u < p(x) / q(x).")],
             "accept draft token x with probability min(1, p(x) / q(x)), with u = "
             "torch.rand(..., generator=generator)."))


_FRESH_UNIFORM = ("every position has its own test: draw a fresh uniform for each position (u of shape (B, k)) and "
                  "accept draft_tokens[:, j] with probability min(1, p_j(x) / q_j(x)), p_j and q_j the target and "
                  "draft distributions at position j.")


def _check_position(p, q, draft, n, nxt, j: int) -> None:
    """The tokens emitted at position j by the rows that reached it (n >= j) follow the target p_j exactly."""
    k, V = q.shape
    rows = n >= j
    reached = int(rows.sum())
    if reached < 200:
        return
    if 0 < j < k:
        # Among the rows that reached j, the draft token at j is accepted with probability sum min(p_j, q_j).
        rate, alpha = (n[rows] > j).double().mean().item(), torch.minimum(p[j], q[j]).sum().item()
        expect(_near(rate, alpha, reached, 3 / reached), f"speculative_accept accepted the draft token at position "
               f"{j} in {rate:.3f} of the {reached} rows that reached it; the rule gives {alpha:.3f} (sum of "
               f"min(p_{j}, q_{j})).", _FRESH_UNIFORM)
    emitted = torch.where(n[rows] > j, draft[rows, min(j, k - 1)], nxt[rows])
    stat, dof, impossible = _chi2(torch.bincount(emitted, minlength=V), p[j])
    if not impossible and (dof == 0 or stat <= _chi2_critical(dof)):
        return
    if j == k:
        hint = diagnose(nxt[n == k], [(when(lambda bonus: _follows(bonus, p[k - 1])), "the bonus token came from "
                                       "target_probs[:, k - 1]: when all k drafts are accepted sample it from the "
                                       "target's next distribution, target_probs[:, k].")],
                        "when all k draft tokens are accepted, the extra token is sampled from target_probs[:, k].")
    else:
        residual = (p[j] - q[j]).clamp(min=0)
        hint = diagnose(nxt[n == j], [
            (when(lambda r: len(r) == 0),
             "accept with probability min(1, p(x) / q(x)) and stop at the first rejection."),
            (when(lambda r: len(r) >= 100 and _follows(r, residual / residual.sum())), "the replacement tokens follow "
             f"the residual, so the acceptance at position {j} is wrong: {_FRESH_UNIFORM}")],
            "after a rejection at position j, sample the replacement from max(0, p_j - q_j) renormalised to sum 1 "
            "(the residual), not from p_j or q_j; it supplies exactly the mass the draft under-proposed (where p > q).")
    fail(f"the tokens emitted at position {j} do not follow the target distribution (chi-square {stat:.1f} with {dof} "
         f"degrees of freedom, bound {_chi2_critical(max(dof, 1)):.1f} at p = 1e-7"
         f"{'; a token of probability 0 appeared' if impossible else ''}).", hint)


def _check_expected_tokens(expected_tokens_per_step, d) -> None:
    """The expected number of tokens per target call: E = 1 + a + ... + a^k."""
    cases = d.cases([(0.8, 4), (0.0, 3), (1.0, 5), (0.5, 1)], lambda d: (d.rng.random(), d.rng.randrange(1, 12)), 5)
    for a, k in cases + ([(1.0, d.rng.randrange(1, 9)), (0.0, 1)] if d.hidden else []):
        compare(call(expected_tokens_per_step, a, k, name="expected_tokens_per_step"),
                float(k + 1) if a == 1.0 else (1 - a ** (k + 1)) / (1 - a), f"expected_tokens_per_step({a}, {k})",
                "E = 1 + a + a^2 + ... + a^k = (1 - a^(k+1)) / (1 - a), and k + 1 when a == 1.",
                variants=[((1 - a ** k) / (1 - a) if a != 1.0 else None, "count the extra token the target model "
                           "gives in every call: the sum runs to a^k, so the numerator is 1 - a^(k+1).")])

# ----------------------------------------------------------------------------- exercise 9: a paged KV cache
# Oracles: the contiguous cache (one (L, n_kv_heads, d_head) tensor of keys and one of values per sequence,
# extended by concatenation, copied whole by a fork); a bookkeeping of abstract blocks (which blocks each sequence
# holds, how many tables hold each block) that says how many blocks a correct cache uses and which of them are
# shared, run again with each bug to name it; and attention over each sequence's contiguous keys, row by row in
# float64, for the paged attention (chapter 3's attention pasted above exercise 3, checked there).


class _Blocks:
    """The bookkeeping of a paged cache with abstract block ids: the blocks each sequence holds, in order, and how
    many tables hold each block. ``variant`` makes one of the bugs the hints name (see :data:`_BOOKKEEPING_BUGS`)."""

    def __init__(self, block_size: int, variant: str = "ok") -> None:
        self.size, self.variant = block_size, variant
        self.tables: dict[int, list[int]] = {}
        self.lengths: dict[int, int] = {}
        self.counts: dict[int, int] = {}

    def _new(self) -> int:
        self.counts[len(self.counts)] = 1
        return len(self.counts) - 1

    def append(self, s: int, n: int) -> None:
        table, start = self.tables.setdefault(s, []), self.lengths.get(s, 0)
        if start % self.size and self.counts[table[-1]] > 1 and self.variant != "no_cow":   # copy-on-write
            self.counts[table[-1]] -= self.variant != "cow_keeps_count"
            table[-1] = self._new()
        if self.variant == "block_per_append":
            table += [self._new() for _ in range(-(-n // self.size))]
        while len(table) * self.size < start + n + (self.variant == "alloc_at_boundary"):
            table.append(self._new())
        self.lengths[s] = start + n

    def fork(self, parent: int, child: int) -> None:
        if self.variant == "fork_copies":
            self.tables[child] = [self._new() for _ in self.tables[parent]]
        else:
            self.tables[child] = list(self.tables[parent])
            for block in self.tables[child]:
                self.counts[block] += 1
        self.lengths[child] = self.lengths[parent]

    def free(self, s: int) -> None:
        for block in self.tables.pop(s):
            self.counts[block] = 0 if self.variant == "free_ignores_count" else self.counts[block] - 1
        del self.lengths[s]

    def run(self, op: tuple) -> None:
        getattr(self, op[0])(*op[1:])

    def seen(self, num_blocks: int) -> tuple:
        """What the check reads of a cache in this state: free blocks, and the length of each block table."""
        used = sum(count > 0 for count in self.counts.values())
        return num_blocks - used, tuple(sorted((s, len(t)) for s, t in self.tables.items()))


_BOOKKEEPING_BUGS = [
    ("block_per_append", "an append fills the free slots of the sequence's last block before it takes a new block: "
     "a sequence of L tokens holds ceil(L / block_size) blocks, however its tokens arrived."),
    ("alloc_at_boundary", "off by one in allocation: a sequence of L tokens holds ceil(L / block_size) blocks, so a "
     "sequence that ends exactly at a block boundary has no empty block after it (take a block while "
     "len(table) * block_size < L, not <=)."),
    ("fork_copies", "fork shares the parent's blocks: the child's table lists the same block ids and each of those "
     "blocks is now held once more; nothing is copied until one of them appends into a shared partial block."),
    ("no_cow", "copy-on-write: before an append writes into a last block that another sequence also holds (its "
     "count is above 1), give the appending sequence a copy of that block in a fresh one, and write there; "
     "otherwise one sequence's new tokens overwrite the other's."),
    ("cow_keeps_count", "a sequence that copies a shared block (copy-on-write) no longer holds the old one: "
     "decrement the old block's count, or it is never freed (and its last holder copies it again)."),
    ("free_ignores_count", "free gives a block back to the pool only when no other sequence holds it: decrement "
     "its count and return it at 0. A block shared after a fork is still in use by the other sequence."),
]
_CACHE_STATE = ("num_free_blocks() counts the blocks no sequence holds; block_tables[s] lists ceil(lengths[s] / "
                "block_size) blocks. Take a block only when a token has no free slot, share blocks on fork, copy a "
                "shared block before writing into it, and give a block back when no table holds it any more.")
_WHERE = ("token p of a sequence lives in block block_tables[s][p // block_size], at slot p % block_size of "
          "k_pool and v_pool.")
_NO_BLOCK = ("when no block is free, append raises RuntimeError (a server then waits, or preempts a sequence), "
             "and only then: an append that fits in the free slots of the last block needs no new block.")


def _op_text(op: tuple) -> str:
    # an operation as code, like fork(0, 2): its words are in a field, so that its translation is the same text
    return {"append": lambda s, n: f"append({s}, {n} {'tokens' if n > 1 else 'token'})",
            "fork": lambda p, c: f"fork({p}, {c})", "free": lambda s: f"free({s})"}[op[0]](*op[1:])


def _cache_script(d) -> tuple[int, list[tuple]]:
    """A drawn workload: (block_size, operations). A prefix whose last block is partial is forked, both sides
    append, a sequence is freed and its blocks reused; then random operations; then every sequence is freed."""
    size = d.rng.choice([1, 2, 3, 4, 5, 8])
    first = size * d.rng.randrange(0, 3) + d.rng.randrange(1, size + 1)
    ops = [("append", 0, first), ("append", 1, d.rng.randrange(1, 2 * size + 2)), ("fork", 0, 2),
           ("append", 2, d.rng.randrange(1, size + 2)), ("append", 0, d.rng.randrange(1, size + 2)), ("free", 1)]
    live, fresh = [0, 2], 3
    tokens = lambda: 1 if d.rng.random() < 0.6 else d.rng.randrange(1, 2 * size + 2)  # noqa: E731 - mostly decoding
    for _ in range(d.rng.randrange(10, 18)):
        kind = d.rng.choices(["append", "new", "fork", "free"], [5, 1, 2, 2])[0]
        if kind == "free" and len(live) > 1:
            ops.append(("free", live.pop(d.rng.randrange(len(live)))))
        elif kind == "fork":
            ops.append(("fork", d.rng.choice(live), fresh))
            live, fresh = live + [fresh], fresh + 1
        elif kind == "new":
            ops.append(("append", fresh, d.rng.randrange(1, 3 * size)))
            live, fresh = live + [fresh], fresh + 1
        else:
            ops.append(("append", d.rng.choice(live), tokens()))
    return size, ops + [("free", s) for s in live]


# bs 4: a fork while the last block is partial (7 tokens), appends on both sides, a free, blocks reused, a fork of
# the fork, a free of a sequence whose blocks are shared, sequences that end on a block boundary.
_VISIBLE_SCRIPT = [("append", 0, 6), ("append", 1, 3), ("append", 0, 1), ("fork", 0, 2), ("append", 2, 2),
                   ("append", 0, 1), ("free", 1), ("append", 3, 5), ("fork", 2, 4), ("free", 2), ("append", 4, 3),
                   ("append", 0, 4), ("free", 0), ("free", 3), ("free", 4)]


def _cache_cases(d) -> list[tuple]:
    """(num_blocks, block_size, n_kv_heads, d_head, dtype, operations): the pool holds what a correct cache needs
    at its fullest, and a little more."""
    def sized(size, ops, n_kv, d_head, dtype, slack):
        peak, model = 0, _Blocks(size)
        for op in ops:
            model.run(op)
            peak = max(peak, sum(c > 0 for c in model.counts.values()))
        return peak + slack, size, n_kv, d_head, dtype, ops

    def drawn(d):
        return sized(*_cache_script(d), d.rng.randrange(1, 4), d.rng.choice([2, 4, 8]),
                     d.rng.choice([torch.float32, torch.bfloat16, torch.float64]), d.rng.randrange(2, 5))

    fixed = [sized(4, _VISIBLE_SCRIPT, 2, 4, torch.float32, 2)]
    if d.hidden:       # three sequences on one partial block, in bfloat16
        fixed = [sized(3, [("append", 0, 2), ("fork", 0, 1), ("fork", 0, 2), ("append", 1, 1), ("append", 2, 4),
                               ("append", 0, 1), ("free", 0), ("append", 3, 7), ("free", 1), ("append", 2, 1),
                               ("free", 2), ("free", 3)], 3, 2, torch.bfloat16, 2)]
    return d.cases(fixed, drawn, 3)


@_one_thread
def check_paged_kv_cache(PagedKVCache, hidden: bool = False) -> None:
    """The cache's state after every operation of a workload: lengths, block tables, free blocks, which blocks
    are shared, and the keys and values read through the tables, against the contiguous cache."""
    d = draw("paged_kv_cache", hidden)
    with own_fault():
        for i, (num_blocks, size, n_kv, d_head, dtype, ops) in enumerate(_cache_cases(d)):
            shape = (num_blocks, size, n_kv, d_head)
            label = f"PagedKVCache({', '.join(map(str, shape))}, dtype={str(dtype)[6:]})"
            cache = call(PagedKVCache, *shape, dtype=dtype, name=label)
            for name in ("k_pool", "v_pool"):
                pool = getattr(cache, name, None)
                expect(isinstance(pool, torch.Tensor) and tuple(pool.shape) == shape and pool.dtype == dtype,
                       f"{label}.{name} is {_core.describe(pool)}, expected a {dtype} tensor of shape {shape}.",
                       "create k_pool and v_pool in __init__ as (num_blocks, block_size, n_kv_heads, d_head) "
                       "tensors of the dtype given.")
            _run_workload(cache, label, ops, d.sub(f"tokens{i}"), shape, dtype)
        _check_out_of_blocks(PagedKVCache, d.sub("full"))


def _traces(ops: list, size: int, num_blocks: int) -> dict[str, list[tuple]]:
    """variant -> what the check reads after each operation (:meth:`_Blocks.seen`), for the correct bookkeeping
    ("ok") and each bug's."""
    traces = {}
    for variant in ["ok", *(v for v, _ in _BOOKKEEPING_BUGS)]:
        model, traces[variant] = _Blocks(size, variant), []
        for op in ops:
            model.run(op)
            traces[variant].append(model.seen(num_blocks))
    return traces


def _run_workload(cache, label: str, ops: list, d, shape: tuple, dtype: torch.dtype) -> None:
    num_blocks, size, n_kv, d_head = shape
    traces, model = _traces(ops, size, num_blocks), _Blocks(size)
    keys: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}     # the contiguous cache
    seen, before = [], {}
    for step, op in enumerate(ops):
        done = ", ".join(_op_text(o) for o in ops[max(0, step - 7):step + 1])
        where = (f"{label} after {done} (the last 8 of {step + 1} operations)" if step >= 8 else
                 f"{label} after {done}")
        model.run(op)
        if op[0] == "append":
            new = tuple(d.randn(op[2], n_kv, d_head, dtype=torch.float64).to(dtype) for _ in range(2))
            old = keys.get(op[1], (new[0][:0], new[1][:0]))
            keys[op[1]] = (torch.cat((old[0], new[0])), torch.cat((old[1], new[1])))
        elif op[0] == "fork":
            keys[op[2]] = keys[op[1]]
        else:
            del keys[op[1]]
        _call_op(cache, op, where, traces, seen, shape, dtype, new if op[0] == "append" else None)
        tables = _check_tables(cache, where, op, model, before, num_blocks)
        seen.append(_seen(cache, tables, where))
        if seen[-1] != traces["ok"][step]:
            _blame_bookkeeping(cache, where, ops, seen, traces, shape, dtype)
        _check_sharing(where, tables, model.tables)
        _check_contents(cache, where, tables, keys)
        before = tables


def _seen(cache, tables: dict, where: str) -> tuple:
    free = call(cache.num_free_blocks, name="PagedKVCache.num_free_blocks")
    expect(isinstance(free, int) and not isinstance(free, bool), f"{where}: num_free_blocks() returned "
           f"{_core.describe(free)}, expected an int.", "return the number of free blocks as a Python int.")
    return free, tuple(sorted((s, len(t)) for s, t in tables.items()))


def _apply(cache, op: tuple, shape: tuple, dtype: torch.dtype, new: tuple | None = None) -> None:
    """One operation on the student's cache (``new``: the keys and values of an append; zeros if None)."""
    if op[0] == "append":
        k, v = new if new is not None else (torch.zeros(op[2], *shape[2:], dtype=dtype) for _ in range(2))
        cache.append(op[1], k.clone(), v.clone())
    else:
        getattr(cache, op[0])(*op[1:])


def _call_op(cache, op: tuple, where: str, traces: dict, seen: list, shape: tuple, dtype: torch.dtype,
             new: tuple | None) -> None:
    """One operation on the student's cache; running out of blocks where a correct cache does not is blamed on
    the bug whose bookkeeping runs out there."""
    try:
        _apply(cache, op, shape, dtype, new)
    except NotImplementedError as err:
        raise _core.not_written(err, where) from err
    except Exception as err:  # noqa: BLE001 - judged below
        step = len(seen)
        if not isinstance(err, RuntimeError) or traces["ok"][step][0] < 0:
            raise CheckFailed.of(f"{where}: it raised {type(err).__name__}: {_core.capped(str(err), 300)}",
                                 "read the traceback above this message; the operation was valid for the spec.") \
                from err
        hint = next((h for v, h in _BOOKKEEPING_BUGS if traces[v][:step] == seen and traces[v][step][0] < 0),
                    _CACHE_STATE)
        raise CheckFailed.of(f"{where}: it ran out of blocks (RuntimeError: {_core.capped(str(err), 200)}), but a "
                             f"correct cache has {traces['ok'][step][0]} of the {shape[0]} blocks free here.",
                             hint) from err


def _blame_bookkeeping(cache, where: str, ops: list, seen: list, traces: dict, shape: tuple,
                       dtype: torch.dtype) -> None:
    """The first difference from a correct cache's bookkeeping, with the hint of the bug whose bookkeeping the
    cache follows. When several bugs agree so far, the workload goes on until the cache's own readings tell them
    apart (or it fails)."""
    (free, lengths), (want_free, want_lengths) = seen[-1], traces["ok"][len(seen) - 1]
    what = (f"{where}: the block tables have lengths {dict(lengths)}, expected {dict(want_lengths)}." if lengths !=
            want_lengths else f"{where}: num_free_blocks() is {free}, expected {want_free} of {shape[0]}.")
    follows = lambda: [(v, h) for v, h in _BOOKKEEPING_BUGS if traces[v][:len(seen)] == seen]  # noqa: E731
    bugs = follows()
    for op in ops[len(seen):] if len(bugs) > 1 else []:
        try:
            _apply(cache, op, shape, dtype)
            tables = {int(s): list(t) for s, t in dict(cache.block_tables).items()}
            seen.append(_seen(cache, tables, where))
        except Exception:  # noqa: BLE001 - the readings so far decide
            break
        if not follows():
            break
        bugs = follows()
        if len(bugs) == 1:
            break
    fail(what, bugs[0][1] if bugs else _CACHE_STATE)


def _check_tables(cache, where: str, op: tuple, model: _Blocks, before: dict,
                  num_blocks: int) -> dict[int, list[int]]:
    """The student's lengths and block tables as plain data, after checking the lengths, the ids, and that the
    operation changed no table but its own sequence's."""
    lengths, tables = getattr(cache, "lengths", None), getattr(cache, "block_tables", None)
    expect(isinstance(lengths, dict) and isinstance(tables, dict), f"{where}: lengths is {_core.describe(lengths)} "
           f"and block_tables {_core.describe(tables)}, expected two dicts keyed by sequence id.",
           "keep self.lengths = {seq_id: tokens stored} and self.block_tables = {seq_id: [block ids]}.")
    compare(dict(lengths), model.lengths, f"{where}: lengths", "lengths[s] is the number of tokens sequence s holds: "
            "append adds the new tokens, fork gives the child the parent's length, free removes the sequence.")
    try:
        tables = {int(s): [int(b) for b in t] for s, t in tables.items()}
    except (TypeError, ValueError):
        fail(f"{where}: block_tables is not a dict of lists of block ids.", "block_tables[s] is a list of ints.")
    compare(sorted(tables), sorted(model.tables), f"{where}: the sequences in block_tables",
            "block_tables has one entry per live sequence: append to a new seq_id creates it, fork adds the child, "
            "free removes the sequence.")
    touched = op[2] if op[0] == "fork" else op[1]        # the one sequence whose table may change
    for s, table in tables.items():
        expect(s == touched or s not in before or table == before[s], f"{where}: the block table of sequence {s} "
               f"changed from {before.get(s)} to {table}, but the operation was on sequence {touched}.",
               "the child's table must be a list of its own (list(parent_table)), not the parent's list itself: "
               "otherwise a block the child appends or copies lands in the parent's table too.")
        expect(len(set(table)) == len(table) and all(0 <= b < num_blocks for b in table),
               f"{where}: block_tables[{s}] is {table}.", "a table lists distinct block ids in range(num_blocks).")
    return tables


def _check_sharing(where: str, tables: dict, model_tables: dict) -> None:
    """Blocks shared exactly where the bookkeeping shares them: a one-to-one map between block ids."""
    ours, theirs = {}, {}
    for s, table in tables.items():
        for index, (block, abstract) in enumerate(zip(table, model_tables[s])):
            if ours.setdefault(block, (abstract, s, index))[0] != abstract:
                fail(f"{where}: block {block} is held by sequence {ours[block][1]} (entry {ours[block][2]}) and by "
                     f"sequence {s} (entry {index}), where a correct cache holds two blocks.",
                     dict(_BOOKKEEPING_BUGS)["no_cow"])
            if theirs.setdefault(abstract, (block, s, index))[0] != block:
                fail(f"{where}: sequences {theirs[abstract][1]} and {s} hold blocks {theirs[abstract][0]} and "
                     f"{block} at entry {index}, where a correct cache shares one block.",
                     dict(_BOOKKEEPING_BUGS)["fork_copies"])


def _check_contents(cache, where: str, tables: dict, keys: dict) -> None:
    """What the pools hold through each table: the keys and values appended, in order, exactly."""
    for pool_name, part in (("k_pool", 0), ("v_pool", 1)):
        pool = getattr(cache, pool_name).detach()
        for s, table in tables.items():
            want = keys[s][part]
            got = pool[torch.tensor(table, dtype=torch.long)].flatten(0, 1)[:len(want)]
            compare(got, want, f"{where}: sequence {s}'s {'keys' if part == 0 else 'values'} read through its block "
                    f"table, (L, n_kv_heads, d_head) with L = {len(want)}",
                    ("the keys are right but not the values: whatever append and copy-on-write do to k_pool, they do "
                     "to v_pool." if part == 1 else _WHERE), tol=(0.0, 0.0))


def _check_out_of_blocks(PagedKVCache, d) -> None:
    """A pool of num_blocks blocks filled but for one slot: one more token fits, a new sequence does not."""
    num_blocks, size = (d.rng.randrange(2, 5), d.rng.randrange(2, 6)) if d.hidden else (3, 2)
    label, full = f"PagedKVCache({num_blocks}, {size}, 1, 2)", num_blocks * size
    cache = call(PagedKVCache, num_blocks, size, 1, 2, dtype=torch.float32, name=label)
    steps = ((0, full - 1, "nothing", f"{num_blocks} blocks of {size} hold {full} tokens"),
             (0, 1, f"{full - 1} tokens of sequence 0", "the last block of sequence 0 has a free slot"),
             (1, 1, f"{full} tokens of sequence 0", None))
    for seq, n, before, why in steps:
        what = f"{label} holding {before}: append({seq}, {n} token{'s' * (n > 1)})"
        try:
            cache.append(seq, torch.ones(n, 1, 2), torch.ones(n, 1, 2))
        except NotImplementedError as err:
            raise _core.not_written(err, f"{label}.append") from err
        except Exception as err:  # noqa: BLE001 - judged here
            raised, message = type(err).__name__, _core.capped(str(err), 200)
            expect(why is None and isinstance(err, RuntimeError),
                   f"{what} raised {raised}: {message}, but {why}." if why else
                   f"{what} raised {raised}: {message}, expected RuntimeError.", _NO_BLOCK)
            return
        expect(why is not None, f"{what} returned, but every block was held.", _NO_BLOCK)


def _row_keys(pool: torch.Tensor, row: torch.Tensor, layout: str = "ok") -> torch.Tensor:
    """The keys (or values) of one table row, block after block: (n_kv_heads, len(row) * block_size, d_head) in
    float64. ``layout="reshaped"``: the bug of a reshape to (n_kv_heads, -1, d_head) without moving the head axis."""
    blocks = torch.stack([pool[int(b)] for b in row]).double()            # (n_blocks, block_size, n_kv, d_head)
    n_blocks, size, n_kv, d_head = blocks.shape
    if layout == "reshaped":
        return blocks.reshape(n_kv, n_blocks * size, d_head)
    return blocks.reshape(n_blocks * size, n_kv, d_head).transpose(0, 1)


def _paged_reference(q, k_pool, v_pool, tables, lengths, order="table", layout="ok", values="v", padded=False,
                     shift=0, top_left=False, causal=True, tile=False) -> torch.Tensor:
    """Attention of each row's last T_q tokens over its keys read through its table row, one row at a time, in
    float64, in q's dtype. The keywords make the bugs the hints name."""
    T_q, out = q.shape[2], []
    for b in range(q.shape[0]):
        row = tables[b].sort().values if order == "sorted" else tables[b]
        k = _row_keys(k_pool, row, layout)
        v = _row_keys(k_pool if values == "k" else v_pool, row, layout)
        keys = torch.arange(k.shape[1])
        end = k.shape[1] if padded else int(lengths[b])
        position = torch.arange(T_q) if top_left else end - T_q + torch.arange(T_q) + shift     # of each query
        allowed = keys[None] <= position[:, None] if causal else (keys < end)[None].expand(T_q, -1)
        out.append(_attend(q[b], k, v, allowed, tile))
    return torch.stack(out).to(q.dtype)


def _paged_case(d, B: int, n_heads: int, n_kv: int, T_q: int, size: int, lengths: list[int], dtype: torch.dtype,
                spare_columns: int = 1, d_head: int = 8) -> tuple:
    """Pools of random numbers everywhere (a slot past a sequence's end holds another's old token), table rows in
    no particular order that share row 0's first full block where they can, padded with blocks of other rows."""
    counts = [-(-L // size) for L in lengths]
    width, num_blocks = max(counts) + spare_columns, sum(counts) + 3
    free = torch.randperm(num_blocks, generator=d.gen).tolist()
    rows = []
    for b, count in enumerate(counts):
        shared = rows[0][:min(1, count - 1, counts[0] - 1)] if b else []
        row = shared + [free.pop() for _ in range(count - len(shared))]
        if b == 0 and count > 1 and row == sorted(row):
            row.reverse()                                         # read in table order, not by block id
        rows.append(row + [int(i) for i in torch.randint(0, num_blocks, (width - count,), generator=d.gen)])
    pools = [d.randn(num_blocks, size, n_kv, d_head, dtype=torch.float64).to(dtype) for _ in range(2)]
    q = d.randn(B, n_heads, T_q, d_head, dtype=torch.float64).to(dtype)
    label = (f"paged_attention with n_heads={n_heads}, n_kv_heads={n_kv}, block_size={size}, T_q={T_q}, lengths="
             f"{lengths}, block_tables={rows}, {str(dtype)[6:]}")
    return q, *pools, torch.tensor(rows), torch.tensor(lengths), label


def _paged_cases(d) -> list[tuple]:
    f32 = torch.float32

    def drawn(d):
        n_kv, T_q, size = d.rng.randrange(1, 4), d.rng.randrange(1, 5), d.rng.choice([1, 2, 3, 4, 5, 8, 16])
        lengths = [d.rng.randrange(T_q, 40) for _ in range(d.rng.randrange(1, 5))]
        return _paged_case(d, len(lengths), n_kv * d.rng.randrange(1, 4), n_kv, T_q, size, lengths,
                           d.rng.choice([f32, torch.float64]), d.rng.randrange(0, 3), d.rng.choice([4, 8, 16]))

    if d.hidden:       # a block of 16 that most sequences do not fill, float64; a block of 1 token, MQA
        fixed = [_paged_case(d, 2, 8, 2, 2, 16, [3, 40], torch.float64),
                 _paged_case(d, 3, 6, 1, 1, 1, [1, 6, 2], f32)]
    else:              # decoding (T_q = 1) with a spare column; chunks of 3 and 2 new tokens; MQA with 4 queries
        fixed = [_paged_case(d, 3, 4, 2, 1, 4, [7, 13, 4], f32), _paged_case(d, 2, 6, 2, 3, 3, [5, 10], f32),
                 _paged_case(d, 2, 2, 2, 2, 5, [2, 9], f32, 0), _paged_case(d, 1, 3, 1, 4, 2, [7], f32)]
    return d.cases(fixed, drawn, 4)


_PAGED_VARIANTS = [
    (dict(order="sorted"), "read a sequence's blocks in the order of its table row (block_tables[b, 0], then "
     "block_tables[b, 1], ...), not sorted by block id: blocks are taken from the pool in any order, and reused."),
    (dict(layout="reshaped"), "heads and positions got mixed: k_pool[block_tables] is (B, max_blocks, block_size, "
     "n_kv_heads, d_head); merge the block and slot axes into positions, then move the head axis before them "
     "(transpose), not a reshape to (B, n_kv_heads, -1, d_head)."),
    (dict(values="k"), "the values come from v_pool, read through the same table as the keys."),
    (dict(padded=True), "the keys past lengths[b] were attended: the slots after a sequence's last token in its last "
     "block, and the padding entries of its table row, hold other data. Hide them with lengths[b], not with the "
     "padded width max_blocks * block_size."),
    (lambda T_q: dict(shift=T_q), "lengths[b] counts the new tokens too: query i of row b is at position lengths[b] "
     "- T_q + i and sees the keys at positions 0 .. lengths[b] - T_q + i."),
    (dict(shift=1), "off by one: query i of row b sees the keys at positions up to lengths[b] - T_q + i, not one "
     "further (that slot holds a later token, or another sequence's old one)."),
    (dict(shift=-1), "off by one: a query sees its own key (position lengths[b] - T_q + i itself): compare with <=, "
     "not <."),
    (dict(top_left=True), "the causal mask is aligned top-left: query i is at position lengths[b] - T_q + i "
     "(bottom-right), so it sees the whole past of its sequence, not only keys 0..i."),
    (dict(causal=False), "the new queries must be causal among themselves: query i sees the keys up to its own "
     "position, not the later new tokens of its row."),
    (dict(tile=True), "query head h reads key/value head h // (n_heads // n_kv_heads); call your "
     "grouped_query_attention, which groups them so."),
]


@_one_thread
def check_paged_attention(paged_attention, grouped_query_attention=None, scaled_dot_product_attention=None,
                          hidden: bool = False) -> None:
    """Attention read through block tables against each sequence's keys in a row of their own; a failure that
    chapter 3's attention pasted here also has is blamed on it."""
    d = draw("paged_attention", hidden)
    with earlier_first(*pasted_first("paged_attention", ch03.PASTED_ATTENTION,
                                     _attention_tools(grouped_query_attention, scaled_dot_product_attention), hidden)):
        for q, k_pool, v_pool, tables, lengths, label in _paged_cases(d):
            with _core.forbid(*_SDPA_BUILTINS, exercise="attention through a block table"):
                got = call_on_copies(paged_attention, q, k_pool, v_pool, tables, lengths, name="paged_attention")
            expect_tensor(got, tuple(q.shape), label)
            expect(got.dtype == q.dtype, f"{label} returned {got.dtype}.", "keep the dtype of q.")
            reference = functools.partial(_paged_reference, q, k_pool, v_pool, tables, lengths)
            compare(got, reference(), label, "row b's keys are the first lengths[b] slots of its blocks, in table "
                    "order; query i is at position lengths[b] - T_q + i and sees keys 0 up to it.",
                    variants=variants_of(lambda kw: reference(**(kw(q.shape[2]) if callable(kw) else kw)),
                                         _PAGED_VARIANTS), tol=_F32 if q.dtype == torch.float32 else None)

# ----------------------------------------------------------------------------- exercise 10: continuous batching
# Oracles: each request run alone, greedy, by a one-layer model of our own over its whole sequence in float64 (no
# cache, no batch), which gives every token a request may emit; and a scheduler of abstract sequences (a waiting
# queue, a running batch, the cached length of each sequence and the blocks it holds) fed those tokens, which says
# what a correct step returns and leaves in the cache, run again with each bug of the hints to name it. The model
# records the tokens and positions of its calls, read after each step.


class BatchLM(nn.Module):
    """The one-layer decoder the scheduler runs: ``model(tokens, positions)`` with tokens and positions (B, T) long
    -> q (B, n_heads, T, d_head), k and v (B, T, n_kv_heads, d_head) (a key and a value per token, as
    ``PagedKVCache.append`` takes them); ``model.logits(attention)`` with attention (B, n_heads, T, d_head) -> logits
    (B, T, vocab_size). Token and learned position embeddings, then the projections; the logits read the attention
    output alone, so every token depends on the keys and values its query reads. It records the tokens and
    positions of its calls in buffers (the grader gets a module's state back from the kernel, not its attributes)."""

    MAX_CALLS, MAX_ROWS, MAX_T = 96, 8, 12

    def __init__(self, vocab_size: int, d_model: int, n_heads: int, n_kv_heads: int, max_positions: int = 32):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.d_head = n_heads, n_kv_heads, d_model // n_heads
        kv_width = n_kv_heads * self.d_head
        self.embed, self.pos = nn.Embedding(vocab_size, d_model), nn.Embedding(max_positions, d_model)
        self.wq, self.wk, self.wv = (nn.Linear(d_model, width, bias=False) for width in (d_model, kv_width, kv_width))
        self.head = nn.Linear(d_model, vocab_size, bias=False)
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))
        self.register_buffer("rec_shape", torch.zeros(self.MAX_CALLS, 2, dtype=torch.long))          # B, T
        self.register_buffer("rec", torch.zeros(self.MAX_CALLS, self.MAX_ROWS, self.MAX_T, 2, dtype=torch.long))

    def records(self, start: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(tokens (B, T), positions (B, T)) of the recorded calls from ``start`` on."""
        out = []
        for c in range(start, min(int(self.calls), self.MAX_CALLS)):
            B, T = self.rec_shape[c].tolist()
            out.append((self.rec[c, :B, :T, 0], self.rec[c, :B, :T, 1]))
        return out

    @torch.no_grad()
    def forward(self, tokens: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        _core.expect(isinstance(tokens, torch.Tensor) and isinstance(positions, torch.Tensor) and tokens.dim() == 2
                     and tuple(positions.shape) == tuple(tokens.shape),
                     f"the model was called with tokens {_core.describe(tokens)} and positions "
                     f"{_core.describe(positions)}.",
                     "call model(tokens, positions) with two long tensors of the same shape (B, T): (1, len(prompt)) "
                     "for a prefill, (B, 1) for a decode step.")
        B, T = tokens.shape
        c = int(self.calls)
        self.calls += 1
        if c < self.MAX_CALLS and B <= self.MAX_ROWS and T <= self.MAX_T:
            self.rec_shape[c] = torch.tensor([B, T])
            self.rec[c, :B, :T, 0], self.rec[c, :B, :T, 1] = tokens.long().cpu(), positions.long().cpu()
        x = self.embed(tokens.long()) + self.pos(positions.long().clamp(0, self.pos.num_embeddings - 1))
        q = self.wq(x).view(B, T, self.n_heads, self.d_head).transpose(1, 2)      # (B, n_heads, T, d_head)
        k = self.wk(x).view(B, T, self.n_kv_heads, self.d_head)                   # (B, T, n_kv_heads, d_head)
        return q, k, self.wv(x).view(B, T, self.n_kv_heads, self.d_head)

    @torch.no_grad()
    def logits(self, attention: torch.Tensor) -> torch.Tensor:
        _core.expect(isinstance(attention, torch.Tensor) and attention.dim() == 4
                     and tuple(attention.shape[1::2]) == (self.n_heads, self.d_head),
                     f"model.logits was called with {_core.describe(attention)}, expected (B, {self.n_heads}, T, "
                     f"{self.d_head}).", "pass model.logits what paged_attention returns: (B, n_heads, T, d_head).")
        B, _, T, _ = attention.shape
        return self.head(attention.to(self.head.weight.dtype).transpose(1, 2).reshape(B, T, -1))


def _alone(model: BatchLM, prompt: list[int], n_new: int) -> tuple[list[int], float]:
    """Request ``prompt`` alone, greedy, no end token: its n_new tokens, each from attention over the whole
    sequence so far in float64; and the smallest gap between the best and the second logit."""
    w = {name: t.double() for name, t in model.state_dict().items() if t.is_floating_point()}
    H, n_kv, D = model.n_heads, model.n_kv_heads, model.d_head
    seq, gap = list(prompt), math.inf
    for _ in range(n_new):
        x = w["embed.weight"][torch.tensor(seq)] + w["pos.weight"][:len(seq)]          # (T, d_model)
        q = (x[-1] @ w["wq.weight"].T).view(H, D)
        k, v = ((x @ w[name].T).view(len(seq), n_kv, D).repeat_interleave(H // n_kv, dim=1) for name in
                ("wk.weight", "wv.weight"))                                    # (T, H, D): head h reads kv h // g
        p = (torch.einsum("hd,thd->ht", q, k) / math.sqrt(D)).softmax(-1)
        logits = w["head.weight"] @ torch.einsum("ht,thd->hd", p, v).reshape(-1)
        top = logits.topk(2).values
        gap = min(gap, float(top[0] - top[1]))
        seq.append(int(logits.argmax()))
    return seq[len(prompt):], gap


_SAME_STEP = ("a sequence that emits eos_id or its max_new_tokens-th token leaves in the same step: return it in "
              "finished and free its blocks in that step, so that the next step can admit a waiting request into its "
              "slot and blocks.")
_SCHEDULE_BUGS = [   # (variant, hint): a scheduler with this bug gives the same readings
    ("lifo", "first come, first served: admit from the front of waiting (the request that arrived first), not from "
     "its end."),
    ("overtake", "admission stops at the first waiting request that does not fit: a later, smaller request does not "
     "overtake it (first come, first served), or a long prompt could wait for ever."),
    ("no_reservation", "the free blocks are not all free to admit into: each running sequence may still grow to "
     "len(prompt) + max_new_tokens - 1 tokens, and the blocks it will take by then are promised to it. Admit only "
     "into the free blocks less those promised."),
    ("double_count", "a running sequence is promised only the blocks it may still take: ceil(its largest length / "
     "block_size) less the blocks it holds already (len(cache.block_tables[s])), which num_free_blocks() no longer "
     "counts as free."),
    ("reserve_last", "the last token a request emits is never fed back, so it is never stored: a request holds at "
     "most len(prompt) + max_new_tokens - 1 tokens in the cache, and needs the blocks of that many."),
    ("no_free", "a finished sequence gives its blocks back: call cache.free(seq_id) when it leaves the batch, or the "
     "pool runs dry and no request is admitted again."),
    ("retire_first", _SAME_STEP),
    ("retire_after_admit", _SAME_STEP),
    ("eos_hidden", "the end token is part of the output: a sequence that emits eos_id keeps it as its last token, "
     "then leaves the batch."),
    ("no_eos", "a sequence stops at eos_id: once it has emitted the end token it leaves the batch, even before "
     "max_new_tokens tokens."),
    ("batch_plus_one", "at most max_batch sequences run at once: admit while len(running) < max_batch."),
]
_STEP = ("each step, in this order: admit the waiting requests from the front while a slot is free and the blocks "
         "they may need fit, prefilling each; decode the sequences that were running before the step in one call; "
         "then retire those that emitted eos_id or max_new_tokens tokens, freeing their blocks.")
_DECODED_AGAIN = ("a finished sequence leaves running: return it in finished only, or the next step decodes it again "
                  "after its blocks were freed.")
_ONE_CALL = ("decode every running sequence in one batched call of the model, tokens of shape (B, 1): one decode call "
             "per step, not one per sequence.")
_ADMITTED_DECODED = ("a request admitted in this step has its first token from its prefill already: the decode call "
                     "feeds only the sequences that were running before the step.")
_CALL_ORDER = ("call the model once per admitted request (its prompt, tokens of shape (1, L)), then once for the "
               "decode of the sequences that were running before the step, in that order.")
_FEED = "the decode feeds each running sequence's last emitted token, running[s][-1], one per row."
_FREED_EARLY = ("a sequence was fed at position 0, as if it were new: its blocks were freed before its last token "
                "was decoded. Free a sequence only when it leaves running, after the decode.")
_POSITION = ("the token fed for sequence s sits at position cache.lengths[s], the number of tokens cached before it: "
             "read it before appending the token's key and value.")
_PREFILL = "the prefill feeds the whole prompt in one call: tokens of shape (1, L) at positions 0, 1, ..., L - 1."
_OWN_ID = ("each request is a sequence of its own in the cache, under its own seq_id: append its prompt and tokens "
           "with cache.append(seq_id, ...), not under a row or slot number.")
_ALONE = ("a request's tokens must be those it gets alone: row b of q reads its own sequence, so row b of "
          "block_tables and lengths belongs to the sequence of row b of q (build them in the same order), and "
          "each request's keys and values go to its own sequence.")


def _blocks(n: int, size: int) -> int:
    return -(-n // size)


def _schedule(case: dict, variant: str = "ok") -> list:
    """What the scheduler's readings are after each step (:func:`_reading`), for a correct scheduler ("ok") or
    one with a bug of :data:`_SCHEDULE_BUGS`; "raised" where it runs out of blocks (and the trace ends)."""
    size, max_new, eos, num_blocks = case["block_size"], case["max_new_tokens"], case["eos_id"], case["num_blocks"]
    waiting, running, lengths, hidden_end, trace, done = [], {}, {}, set(), [], 0
    free = lambda: num_blocks - sum(_blocks(n, size) for n in lengths.values())  # noqa: E731

    def ended(s):
        tokens = running[s]
        return (len(tokens) == max_new or s in hidden_end or
                (variant != "no_eos" and bool(tokens) and tokens[-1] == eos))

    def emit(s, token):
        if variant == "eos_hidden" and token == eos:
            hidden_end.add(s)
        else:
            running[s].append(token)

    def retire(finished):
        for s in [s for s in running if ended(s)]:
            finished[s] = running.pop(s)
            if variant != "no_free":
                del lengths[s]

    for step in range(case["steps"]):
        waiting += [r for at, r in case["arrivals"] if at == step]
        finished, j = {}, 0
        if variant == "retire_first":       # retires what ended in the last step, before admitting
            retire(finished)
        decoding = list(running)
        while j < len(waiting) and len(running) < case["max_batch"] + (variant == "batch_plus_one"):
            r = waiting[-1] if variant == "lifo" else waiting[j]
            promised = sum(_blocks(lengths[s] + max_new - len(t), size) -
                           (0 if variant == "double_count" else _blocks(lengths[s], size)) for s, t in running.items())
            need = _blocks(len(case["prompts"][r]) + max_new - (variant != "reserve_last"), size)
            if need > free() - (0 if variant == "no_reservation" else promised):
                if variant == "overtake":
                    j += 1
                    continue
                break
            waiting.remove(r)
            lengths[r], running[r] = len(case["prompts"][r]), []
            emit(r, case["alone"][r][0])
        if variant == "retire_after_admit":        # retires what ended in the last step, after admitting
            retire(finished)
            decoding = [s for s in decoding if s in running]
        for s in decoding:
            if lengths[s] % size == 0 and free() == 0:
                return trace + ["raised"]
            lengths[s] += 1
            emit(s, case["alone"][s][len(running[s])])
        if not variant.startswith("retire_"):
            retire(finished)
        done += len(finished)
        trace.append(_reading(running, [r for r in waiting], finished, lengths, free()))
        if done == len(case["prompts"]):
            break
    return trace


def _reading(running: dict, waiting: list, finished: dict, lengths: dict, free: int) -> tuple:
    """What the check reads after a step: the waiting ids in order, the running and finished sequences with their
    tokens, the cache's lengths and its number of free blocks."""
    return (tuple(waiting), tuple(sorted((s, tuple(t)) for s, t in running.items())),
            tuple(sorted((s, tuple(t)) for s, t in finished.items())), tuple(sorted(lengths.items())), free)


def _shown_reading(reading) -> str:
    if reading == "raised":
        return "it ran out of blocks"
    waiting, running, finished, lengths, free = reading
    return (f"running {dict((s, list(t)) for s, t in running)}, waiting ids {list(waiting)}, finished "
            f"{dict((s, list(t)) for s, t in finished)}; the cache holds lengths {dict(lengths)} with {free} free "
            "blocks")


def _batching_case(d, dtype: torch.dtype) -> dict:
    """A drawn workload: a model whose greedy choices are clear (redrawn until every gap between the best two
    logits is above 1e-3), 5 to 8 requests with ids in no order, prompts of 1 to 10 tokens arriving over the first
    8 steps (3 in a rush), an end token that ends some requests before max_new_tokens and not others, and a pool
    from the largest request's need to twice that (where the blocks decide who is admitted) or one of room for
    max_batch + 1 of the largest (where the batch size does)."""
    for _ in range(20):
        n_kv, d_head = d.rng.randrange(1, 3), d.rng.choice([4, 8])
        n_heads, vocab = n_kv * d.rng.randrange(1, 3), d.rng.randrange(10, 24)
        with d.seeded():
            model = BatchLM(vocab, n_heads * d_head, n_heads, n_kv)
        with torch.no_grad():
            model.head.weight.mul_(4.0)     # sharper logits
        ids = d.rng.sample(range(10, 100), d.rng.randrange(5, 9))   # never a row or slot number
        prompts = {r: d.randint(0, vocab, (d.rng.randrange(1, 11),)) for r in ids}
        max_new = d.rng.randrange(3, 8)
        runs = {r: _alone(model, prompts[r].tolist(), max_new) for r in ids}
        if min(gap for _, gap in runs.values()) > 1e-3:
            break
    alone = {r: tokens for r, (tokens, _) in runs.items()}

    def spread(t):   # ends some requests early and not all: both ways of leaving are seen
        firsts = [a.index(t) for a in alone.values() if t in a[:-1]]
        return (0 < len(firsts) < len(ids), len(set(firsts)), d.rng.random())
    eos = max(range(vocab), key=spread)
    size = d.rng.choice([1, 2, 3, 4, 5, 8])
    largest = max(_blocks(len(p) + max_new - 1, size) for p in prompts.values())
    roomy = d.rng.random() < 0.3            # a pool where the batch fills before the blocks run out, and a rush
    arrivals, max_batch = sorted(d.rng.randrange(0, 3 if roomy else 8) for _ in ids), d.rng.randrange(2, 5)
    case = dict(model=model.to(dtype), prompts=prompts, alone=alone, eos_id=eos, max_new_tokens=max_new,
                max_batch=max_batch, block_size=size,
                num_blocks=(max_batch + 1) * largest if roomy else largest + d.rng.randrange(0, largest + 1),
                arrivals=list(zip([0] + arrivals[1:], ids)), dtype=dtype, steps=200)
    case["traces"] = {v: _schedule(case, v) for v in ["ok", *(v for v, _ in _SCHEDULE_BUGS)]}
    return case


def _batching_cases(d) -> list[dict]:
    """Workloads drawn until each bug of :data:`_SCHEDULE_BUGS` changes the readings of one of them (at most 24
    drawn): one or more for the visible test, three or more for the hidden one, float32 and float64 in turn."""
    cases, missing = [], {v for v, _ in _SCHEDULE_BUGS}
    for i in range(24):
        case = _batching_case(d.sub(f"case{i}"), (torch.float64, torch.float32)[i % 2] if d.hidden else torch.float32)
        changed = {v for v in missing if case["traces"][v] != case["traces"]["ok"]}
        if changed or len(cases) < (3 if d.hidden else 1):
            cases.append(case)
            missing -= changed
        if not missing and len(cases) >= (3 if d.hidden else 1):
            break
    return cases


@_one_thread
def check_batch_step(batch_step, PagedKVCache, paged_attention=None, grouped_query_attention=None,
                     scaled_dot_product_attention=None, hidden: bool = False) -> None:
    """Workloads of requests arriving over time, run step by step by the answer on its own PagedKVCache: after each
    step, what it returns, what its cache holds and what it fed the model, against a correct scheduler fed each
    request's tokens alone; a failure that exercise 9's cache or attention also has is blamed on it."""
    d = draw("batch_step", hidden)
    earlier = [("batch_step runs on your PagedKVCache (exercise 9), which fails its tests",
                functools.partial(check_paged_kv_cache, PagedKVCache, hidden))]
    if paged_attention is not None:
        earlier.append(("batch_step calls your paged_attention (exercise 9), which fails its tests",
                        functools.partial(check_paged_attention, paged_attention, grouped_query_attention,
                                          scaled_dot_product_attention, hidden=hidden)))
    with earlier_first(*earlier):
        for case in _batching_cases(d):
            _run_batching(batch_step, PagedKVCache, case)


def _describe_case(case: dict) -> str:
    ids = [r for _, r in case["arrivals"]]
    return (f"{len(ids)} requests (ids {ids}, prompts of {[len(case['prompts'][r]) for r in ids]} tokens, arriving "
            f"at steps {[at for at, _ in case['arrivals']]}), max_batch={case['max_batch']}, "
            f"eos_id={case['eos_id']}, max_new_tokens={case['max_new_tokens']}, a PagedKVCache of "
            f"{case['num_blocks']} blocks of {case['block_size']} tokens, {str(case['dtype'])[6:]}")


class _Scheduler:
    """The answer's scheduler run on one workload, one step at a time, with what the check read after each."""

    def __init__(self, batch_step, PagedKVCache, case: dict) -> None:
        self.batch_step, self.case, self.model = batch_step, case, case["model"]
        model = self.model
        shape = (case["num_blocks"], case["block_size"], model.n_kv_heads, model.d_head)
        self.label = _describe_case(case)
        self.cache = call(PagedKVCache, *shape, dtype=case["dtype"], name=f"PagedKVCache{shape}")
        self.running, self.waiting, self.lengths, self.seen, self.calls = {}, [], {}, [], 0
        self.step = -1

    def next(self) -> tuple:
        """Run the next step; returns (what, before, finished, error): ``before`` the running sequences and the
        cache's lengths before it; the reading is appended to ``seen`` ("raised" when it ran out of blocks)."""
        self.step += 1
        case = self.case
        self.waiting += [r for at, r in case["arrivals"] if at == self.step]
        what = f"batch_step at step {self.step} of a workload of {self.label}"
        before = (dict(self.running), dict(self.lengths))
        waiting = [(r, case["prompts"][r].clone()) for r in self.waiting]
        try:
            out = self.batch_step(self.model, self.cache, {s: list(t) for s, t in self.running.items()}, waiting,
                                  case["max_batch"], case["eos_id"], case["max_new_tokens"])
        except NotImplementedError as err:
            raise _core.not_written(err, "batch_step") from err
        except CheckFailed:
            raise
        except Exception as err:  # noqa: BLE001 - judged by the caller
            self.seen.append("raised")
            return what, before, {}, err
        finished = self._read(out, what)
        self.seen.append(_reading(self.running, self.waiting, finished, self.lengths, self.free))
        return what, before, finished, None

    def _read(self, out, what: str) -> dict:
        shape_hint = ("return (running, waiting, finished): running {seq_id: [tokens emitted]}, waiting [(seq_id, "
                      "prompt)] in arrival order, finished {seq_id: [tokens emitted]} of the sequences that left in "
                      "this step.")
        with own_fault():
            expect(isinstance(out, (tuple, list)) and len(out) == 3, f"{what} returned {_core.describe(out)}, "
                   "expected a tuple (running, waiting, finished).", shape_hint)
            running, waiting, finished = out
            try:
                self.running = {int(s): [int(t) for t in tokens] for s, tokens in dict(running).items()}
                finished = {int(s): [int(t) for t in tokens] for s, tokens in dict(finished).items()}
                self.waiting = [int(item[0]) for item in waiting]
            except (TypeError, ValueError, IndexError, KeyError):
                fail(f"{what} returned running {_core.describe(running)}, waiting {_core.describe(waiting)} and "
                     f"finished {_core.describe(finished)}.", shape_hint)
        lengths = call(getattr, self.cache, "lengths", name="PagedKVCache.lengths")
        self.lengths = {int(s): int(n) for s, n in dict(lengths).items()}
        self.free = int(call(self.cache.num_free_blocks, name="PagedKVCache.num_free_blocks"))
        return finished

    def new_calls(self) -> list | None:
        """The model's calls since the last time this was asked; None when there were more than it records."""
        n = int(self.model.calls)
        calls = self.model.records(self.calls) if n <= self.model.MAX_CALLS else None
        self.calls = n
        return calls


def _run_batching(batch_step, PagedKVCache, case: dict) -> None:
    run = _Scheduler(batch_step, PagedKVCache, case)
    for want in case["traces"]["ok"]:
        what, before, finished, error = run.next()
        calls = run.new_calls()
        if run.seen[-1] != want:
            _blame_schedule(run, what, before, finished, error, calls)
        _check_step_calls(what, before, (run.running, finished), calls, case["prompts"])


def _blame_schedule(run: _Scheduler, what: str, before: tuple, finished: dict, error, calls) -> None:
    """The step's readings differ from a correct scheduler's: the bug whose scheduler gives the same readings so
    far (the workload goes on while several do), else what the step itself shows."""
    traces, seen = run.case["traces"], run.seen
    want = traces["ok"][len(seen) - 1]
    got = f"it raised {type(error).__name__}: {_core.capped(str(error), 200)}" if error is not None else \
        _shown_reading(seen[-1])
    problem = composed("{what}: {got}; expected {want}.", what=what, got=got, want=_shown_reading(want))
    after, lengths = (dict(run.running), finished), dict(run.lengths)
    follows = lambda: [(v, h) for v, h in _SCHEDULE_BUGS if traces[v][:len(seen)] == seen]  # noqa: E731
    bugs = follows()
    while len(bugs) > 1 and seen[-1] != "raised" and len(seen) < max(len(traces[v]) for v, _ in bugs):
        run.next()
        run.new_calls()
        if not follows():
            break
        bugs = follows()
    with own_fault():
        if len(bugs) > 1:           # the whole workload fits two bugs: both are named
            fail(problem, composed("{first} Or else: {second}", first=bugs[0][1], second=bugs[1][1]))
        if bugs:
            fail(problem, bugs[0][1])
    if error is not None:
        try:
            foreign = set(dict(getattr(run.cache, "lengths"))) - set(run.case["prompts"])
        except Exception:  # noqa: BLE001 - a cache that cannot be read says nothing more
            foreign = set()
        hint = _OWN_ID if foreign else _STEP if isinstance(error, RuntimeError) else \
            "read the traceback above this message; the inputs were valid for the spec."
        raise CheckFailed.of(problem, hint) from error
    expect(not set(after[0]) & set(after[1]), problem, _DECODED_AGAIN)
    _check_step_calls(what, before, after, calls, run.case["prompts"])
    expect(set(lengths) <= set(run.case["prompts"]), problem, _OWN_ID)
    alone = run.case["alone"]
    expect(all(t == alone[s][:len(t)] for s, t in [*after[0].items(), *after[1].items()] if s in alone), problem,
           _ALONE)
    fail(problem, _STEP)


def _check_step_calls(what: str, before: tuple, after: tuple, calls: list | None, prompts: dict) -> None:
    """The model's calls in one step: a prefill per admitted request, then one decode call for the sequences that
    were running before the step. ``before``: (running, cache lengths) before the step; ``after``: (running,
    finished) after it."""
    (running, lengths), n = before, len(before[0])
    new = [s for s in [*after[0], *after[1]] if s not in running]
    count = (f"{what}: the model was called {'more than 96' if calls is None else len(calls)} times for "
             f"{len(new)} admitted request(s) and {n} sequence(s) running before the step.")
    expect(calls is not None, count, _ONE_CALL)
    expect(len(calls) <= len(new) + 1 or n < 2 or not all(tuple(t.shape) == (1, 1) for t, _ in calls[-n:]), count,
           _ONE_CALL)
    last = tuple(calls[-1][0].shape) if calls else None
    expect(not new or len(calls) != len(new) + 1 or last != (n + len(new), 1), f"{what}: the last call of the model "
           f"fed tokens of shape {last}, for {len(new)} admitted request(s) and {n} sequence(s) running before the "
           "step.", _ADMITTED_DECODED)
    expect(len(calls) == len(new) + bool(n) and (not n or last == (n, 1)), count, _CALL_ORDER)
    if n:
        tokens, positions = calls[-1]
        want = sorted((running[s][-1], lengths[s]) for s in running)
        got = sorted(zip(tokens[:, 0].tolist(), positions[:, 0].tolist()))
        row = f"{what}: the decode call fed (token, position) pairs {got}, expected {want} (in any row order)."
        expect(sorted(t for t, _ in got) == sorted(t for t, _ in want), row, _FEED)
        expect(all(p > 0 for _, p in got), row, _FREED_EARLY)
        expect(got == want, row, _POSITION)
    fed = sorted((t[0].tolist(), p[0].tolist()) for t, p in (calls[:-1] if n else calls))
    expect(fed == sorted((prompts[s].tolist(), list(range(len(prompts[s])))) for s in new),
           f"{what}: the prefill calls fed (tokens, positions) {fed}; the prompts admitted were "
           f"{[prompts[s].tolist() for s in new]}.", _PREFILL)
