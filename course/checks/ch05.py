"""Checks for chapter 5: the loss, batches, AdamW, parameter groups, the schedule, clipping,
gradient accumulation, dynamic loss scaling, exact resumption from a checkpoint, the tiny model
of chapters 1-4, the loss at initialisation, perplexity and bits per byte, the compute of a training run.

Each check draws its inputs (``draw``), calls the answer and compares with an oracle (``compare``);
a table of wrong variants (``variants_of``) only names the likely mistake. Oracles:
``F.cross_entropy``, ``torch.optim.AdamW``, ``torch.nn.utils.clip_grad_norm_``, the update
``torch.amp.GradScaler`` runs, one backward pass over the whole batch, hand-derived formulas,
the student's own uninterrupted run (for resumption), and ``FlopCounterMode`` on a model of the
spec run here (for the FLOPs of a training token).

Objects that must live where the student's code runs (the model trained by ``train``, the
problem that ``AdamW`` optimises) are modules built here: when grading happens outside the
kernel they are mirrored there, and their state comes back after every call.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import importlib
import math
import random

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.nn.utils.clip_grad
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import FlopCounterMode

from ._core import (CheckFailed, call, earlier_answers, earlier_first, expect_tensor, forbid, judge_prediction, own_fault,
                    unmeasured)
from ._vocabulary import (TOLERANCE, Draw, call_on_copies, compare, diagnose, draw, expect, expect_number,
                          expect_tuple, fail, judge_configured, matches, passes, variants_of, when)

# ----------------------------------------------------------------------------- shared models

class TinyLM(nn.Module):
    """Embedding, dropout, a GELU layer, LayerNorm and an output layer: logits (B, T, V)."""

    def __init__(self, vocab_size: int = 16, d_model: int = 12, dropout: float = 0.0):
        super().__init__()
        self.tok = nn.Embedding(vocab_size, d_model)
        self.drop = nn.Dropout(dropout)
        self.fc = nn.Linear(d_model, d_model)
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.drop(self.tok(ids))                 # (B, T, d_model)
        x = self.norm(x + F.gelu(self.fc(x)))        # (B, T, d_model)
        return self.head(x)                          # (B, T, vocab_size)


def _cat(tensors) -> torch.Tensor:
    """The tensors (a model's parameters, a list of gradients) flattened into one."""
    return torch.cat([t.detach().flatten() for t in tensors])

# ----------------------------------------------------------------------------- exercise 1

_CE_BUILTINS = ((F, "cross_entropy"), (F, "nll_loss"), (F, "log_softmax"), (F, "softmax"), (torch, "log_softmax"),
                (torch, "logsumexp"), (torch, "softmax"), (torch.special, "log_softmax"), (torch.special, "logsumexp"))


def _ce_oracle(logits, targets, ignore_index, eps, z_coef):
    """F.cross_entropy plus the z-loss term, z_coef * mean over kept positions of logsumexp(z)**2."""
    V = logits.shape[-1]
    z, t = logits.reshape(-1, V), targets.reshape(-1)
    loss = F.cross_entropy(z, t, ignore_index=ignore_index, label_smoothing=eps)
    if z_coef:
        keep = t != ignore_index
        lse = torch.logsumexp(z, dim=-1)
        loss = loss + z_coef * torch.where(keep, lse ** 2, torch.zeros_like(lse)).sum() / keep.sum()
    return loss


def _ce_variant(logits, targets, ignore_index, eps, z_coef, variant):
    """The loss with one known mistake (:data:`_CE_HINTS`), computed in float64, returned in the logits' dtype."""
    V = logits.shape[-1]
    z, t = logits.reshape(-1, V).double(), targets.reshape(-1)
    keep = t != ignore_index
    lse = z.logsumexp(-1)
    zterm = {"z_not_squared": lse, "z_without_max": (z - z.max(-1, keepdim=True).values).logsumexp(-1) ** 2,
             }.get(variant, lse ** 2) * z_coef
    lp = z - z.logsumexp(-1, keepdim=True)
    nll = -lp.gather(1, torch.where(keep, t, 0)[:, None]).squeeze(1)
    uniform = -lp.mean(-1)
    if variant == "uniform_skips_ignore_class" and 0 <= ignore_index < V:
        uniform = -lp[:, torch.arange(V) != ignore_index].mean(-1)
    per = {"smooth_v_minus_1": (1 - eps) * nll + eps * (-lp.sum(-1) - nll) / (V - 1),
           "no_one_minus": nll + eps * uniform}.get(variant, (1 - eps) * nll + eps * uniform)
    n = keep.sum()
    loss = {"z_on_ignored": lambda: torch.where(keep, per, 0).sum() / n + zterm.mean(),
            "mean_all": lambda: torch.where(keep, per + zterm, 0).sum() / len(t),
            "ignored_counted": lambda: (per + zterm).mean(),
            "smooth_on_ignored": lambda: (torch.where(keep, (1 - eps) * nll + zterm, 0).sum() + eps * uniform.sum()) / n,
            }.get(variant, lambda: torch.where(keep, per + zterm, 0).sum() / n)()
    return loss.to(logits.dtype)


_CE_HINTS = [
    ("ignored_counted", "positions whose target is ignore_index must not contribute at all: mask them out of the "
                        "sum and out of the count."),
    ("mean_all", "divide by the number of targets that are not ignore_index, not by all B*T positions."),
    ("smooth_on_ignored", "the smoothing term must skip ignored positions too: label smoothing spread mass onto "
                          "positions whose target is ignore_index."),
    ("smooth_v_minus_1", "PyTorch spreads label_smoothing uniformly over all V classes, the target included: "
                         "loss = (1 - eps) * nll + eps * mean over classes of -log p."),
    ("no_one_minus", "the true class keeps weight (1 - label_smoothing): loss = (1 - eps) * nll + eps * uniform term."),
    ("uniform_skips_ignore_class", "ignore_index only decides which positions count; when it is also a class id, "
                                   "the smoothing term still averages -log p over all V classes, that one included."),
    ("z_without_max", "the z-loss squares log Z = logsumexp of the logits themselves: after subtracting the row's "
                      "maximum for stability, add it back (log Z = max + log sum exp(z - max))."),
    ("z_not_squared", "the z-loss is z_loss * (log Z)**2: square the log-partition, so that it pulls log Z to 0 "
                      "from both sides."),
    ("z_on_ignored", "the z-loss term, too, counts only kept positions: average (log Z)**2 over the positions whose "
                     "target is not ignore_index."),
]
_CE_OVERFLOW = (when(lambda value: not torch.isfinite(value)), "exp overflowed: subtract each row's maximum before exp "
                "(the log-sum-exp trick); the result does not change, and exp never sees a positive number.")


def _ce_cases(d: Draw) -> list:
    """(logits, targets, ignore_index, label_smoothing, z_loss, what): the visible tests; hidden, drawn ones and
    extremes (logits near 5000 with padding, large negative logits, float64)."""
    t = torch.tensor([[1, 4, 0], [2, -100, 3]])
    huge = torch.tensor([[1000.0, 0.0, -1000.0], [0.0, 1001.0, 1000.0]])
    cases = d.cases([(d.randn(2, 3, 5), t, -100, 0.0, 0.0, "(B, T, V) = (2, 3, 5) logits, one padded target"),
                     (d.randn(6, 7), torch.arange(6), -100, 0.0, 0.0, "(N, V) logits"),
                     (d.randn(2, 3, 5), t, -100, 0.1, 0.0, "label_smoothing=0.1"),
                     (huge, torch.tensor([0, 2]), -100, 0.0, 0.0, "logits of size 1000"),
                     (d.randn(2, 3, 5), torch.tensor([[1, 0, 4], [0, 2, 3]]), 0, 0.2, 0.0,
                      "ignore_index=0 (also a class id) with label_smoothing=0.2"),
                     (d.randn(2, 3, 5) * 3 + 4, t, -100, 0.0, 0.01, "z_loss=0.01, one padded target"),
                     (torch.cat([huge, torch.full((1, 3), 5.0)]), torch.tensor([0, 2, -100]), -100, 0.1, 1e-4,
                      "logits of size 1000, z_loss=1e-4, label_smoothing=0.1")], _ce_drawn, 3)
    if not d.hidden:
        return cases
    V = d.rng.randrange(3, 12)
    padded = d.randint(0, V, (4, 5))
    padded[:, -2:] = -1                                 # several padded positions, a custom ignore_index
    return cases + [(d.randn(4, 5, V) * 20 + 5000, padded, -1, 0.2, 1e-6,
                     "logits near 5000 with padding, label_smoothing=0.2 and z_loss=1e-6"),
                    (-d.uniform(0, 1e4, 3, V), d.randint(0, V, (3,)), -100, 0.0, 0.0, "large negative logits"),
                    (d.randn(5, V, dtype=torch.float64) + 2, d.randint(0, V, (5,)), -100, 0.1, 0.01,
                     "float64 logits, z_loss=0.01")]


def _ce_drawn(d: Draw) -> tuple:
    B, T, V = d.rng.randrange(1, 5), d.rng.randrange(2, 9), d.rng.randrange(2, 40)
    targets = d.randint(0, V, (B, T))
    pad = d.rng.choice([-100, 0, V - 1])               # an ignore_index that may also be a real class id
    targets[d.uniform(0, 1, B, T) < 0.3] = pad
    targets[0, 0] = (pad + 1) % V if pad >= 0 else 0   # at least one real target
    eps, scale, zc = d.rng.choice([0.0, 0.05, 0.1, 0.3]), d.rng.choice([1.0, 5.0, 30.0]), d.rng.choice([0.0, 1e-4, 1e-3, 0.05])
    return (d.randn(B, T, V) * scale + d.rng.choice([0.0, 3.0]), targets, pad, eps, zc,
            f"(B, T, V) = {(B, T, V)}, ignore_index={pad}, label_smoothing={eps}, z_loss={zc}")


def check_cross_entropy(cross_entropy, hidden: bool = False) -> None:
    for logits, targets, ignore_index, eps, z, what in _ce_cases(draw("cross_entropy", hidden)):
        leaf, ref = logits.clone().requires_grad_(True), logits.clone().requires_grad_(True)
        with forbid(*_CE_BUILTINS, exercise="cross-entropy"):
            got = call(cross_entropy, leaf, targets.clone(), ignore_index, eps, name="cross_entropy",
                       **({"z_loss": z} if z else {}))
        expect(isinstance(got, torch.Tensor) and got.numel() == 1,
               f"cross_entropy on {what} should return a scalar tensor.", "return the mean over kept positions.")
        expect(got.dtype == logits.dtype, f"cross_entropy on {what} ({str(logits.dtype)[6:]} logits) returned a "
               f"{str(got.dtype)[6:]} loss.", "return the loss in the logits' dtype, as F.cross_entropy does: "
               "a float64 copy of float32 logits doubles the memory of the largest tensor of a training step "
               "(N x V), and its gradient flows back in float64.")
        want = _ce_oracle(ref, targets, ignore_index, eps, z)
        base = TOLERANCE[want.dtype][0]      # logits near 5000 carry their rounding: the tolerance grows with the loss
        compare(got.detach().reshape(()), want, f"cross_entropy on {what} (F.cross_entropy"
                f"{' + z_loss * mean (log Z)**2' if z else ''})",
                "loss = mean over kept positions of -(log p of the target), with log p = z - logsumexp(z).",
                [_CE_OVERFLOW, *variants_of(lambda v: _ce_variant(logits, targets, ignore_index, eps, z, v),
                                            _CE_HINTS)],
                tol=(base * max(1.0, abs(want.item())), base * 10))
        # The gradient must flow back to the logits, and equal PyTorch's.
        expect(got.requires_grad, f"cross_entropy on {what} carries no gradient.",
               "do not detach, and do not call .item() inside the loss: training needs its gradient.")
        got.backward()
        want.backward()
        expect(leaf.grad is not None, "no gradient reached the logits.", "compute the loss from the logits tensor itself.")
        compare(leaf.grad, ref.grad, f"the gradient of cross_entropy on {what}",
                "ignored positions must get zero gradient; only the mean over kept positions counts.")

# ----------------------------------------------------------------------------- exercise 2

def _batch_from(tokens, B, T, g: torch.Generator | int, high_shift=0):
    """random_batch's draw from the generator g (or one seeded with g): B windows of T tokens and their targets."""
    g = torch.Generator().manual_seed(g) if isinstance(g, int) else g
    starts = torch.randint(0, len(tokens) - T + high_shift, (B,), generator=g)
    idx = starts[:, None] + torch.arange(T)
    return tokens[idx], tokens[(idx + 1).clamp(max=len(tokens) - 1)]


def _random_batch_cases(d: Draw) -> list:
    """(tokens, batch_size, block_size, seed of the generator random_batch is given)."""
    def drawn(d: Draw) -> tuple:
        T = d.rng.randrange(1, 12)
        return torch.randperm(1000, generator=d.gen)[:T + d.rng.randrange(2, 60)], d.rng.randrange(1, 40), T, \
            d.rng.randrange(2**31)

    cases = d.cases([(torch.arange(40) * 3 + 1, 6, 5, 511), (torch.arange(12) + 100, 50, 8, 512)], drawn, 3)
    if d.hidden:
        T = d.rng.randrange(2, 6)
        cases.append((torch.randperm(500, generator=d.gen)[:T + 2], 64, T, d.rng.randrange(2**31)))  # two windows
    return cases


def check_random_batch(random_batch, hidden: bool = False) -> None:
    for tokens, B, T, seed in _random_batch_cases(draw("random_batch", hidden)):
        what = f"random_batch(tokens of length {len(tokens)}, batch_size={B}, block_size={T})"
        x, y = expect_tuple(call(random_batch, tokens.clone(), B, T, torch.Generator().manual_seed(seed),
                                 name="random_batch"), "x, y", what, "return x, y.")
        xy = torch.stack([expect_tensor(x, (B, T), f"x of {what}"), expect_tensor(y, (B, T), f"y of {what}")])
        want_x, want_y = _batch_from(tokens, B, T, seed)
        compare(xy, torch.stack([want_x, want_y]), f"the windows (x, y) of {what}",
                "draw the batch_size starts with one call of torch.randint on the generator, from 0 to the last start "
                "whose targets fit (randint's upper bound is excluded), and make no other draw from it; then take "
                "the windows tokens[s : s+T] and tokens[s+1 : s+T+1].", variants=[
                    (when(lambda xy: torch.equal(xy[1], xy[0])),
                     "the targets are the inputs: y must be the same window moved one token on, tokens[s+1 : s+T+1]."),
                    (when(lambda xy: T > 1 and torch.equal(xy[1, :, :-1], xy[0, :, 1:])
                          and torch.equal(xy[1, :, -1], xy[0, :, 0])),
                     "the last target of each row wrapped around to the row's first token (a roll of x): the target "
                     "of the last position is the token after the window, tokens[s + T]."),
                    (lambda: torch.stack(_batch_from(tokens, B, T, seed, -1)) if len(tokens) - T - 1 > 0 else None,
                     "the last window is never drawn: torch.randint's upper bound is exclusive, and the last start "
                     "whose targets fit is len(tokens) - block_size - 1."),
                    (when(lambda xy: torch.equal(xy[0], want_x)),
                     "x is right but y is not: y = tokens[s+1 : s+T+1] for each start s.")])


def _sequential_variants(tokens, B, T, gw: list, ww: list, got: list, want: list) -> list:
    """The known slips, given the windows of the batches returned (``gw``) and expected (``ww``)."""
    return [
        (when(lambda _: len(got) == len(want) - 1 and gw == ww[:len(gw)] and len(want[-1][0]) < B),
         "the last, smaller batch was dropped: when the windows do not divide into batches evenly, the last batch "
         "holds the windows that are left (an epoch covers every window once)."),
        (when(lambda _: len(gw) > len(ww)), "a window whose target runs past the end of the stream was included: "
                                            "a window starting at s needs s + block_size + 1 <= len(tokens)."),
        (when(lambda _: gw == ww[:-1]), "the last full window was dropped: a window starting at s fits when s + "
                                        "block_size + 1 <= len(tokens), so starts run over range(0, len(tokens) - "
                                        "block_size, block_size)."),
        (when(lambda _: len(tokens) > T + 1 and len(gw) > 1 and gw[0] == ww[0] and gw[1][0] == tokens[T + 1].item()),
         "consecutive windows start block_size apart (their targets overlap by one token): a stride of "
         "block_size + 1 skips a token of the stream between windows."),
        (when(lambda _: gw == ww), "the windows are right but not grouped as asked: batch_size windows per batch, in "
                                   "order, the last batch smaller when they do not divide evenly.")]


def check_sequential_batches(sequential_batches, hidden: bool = False) -> None:
    def drawn(d: Draw) -> tuple:
        T, B = d.rng.randrange(1, 9), d.rng.randrange(1, 6)
        N = T * d.rng.randrange(1, 12) + d.rng.choice([1, 2, 0, d.rng.randrange(0, T + 1)])
        return torch.randperm(1000, generator=d.gen)[:max(N, T + 1)], B, T

    cases = draw("sequential_batches", hidden).cases([(torch.arange(23) + 50, 2, 5), (torch.arange(21) + 7, 2, 5),
                                                      (torch.arange(31), 3, 3)], drawn, 4)
    for tokens, B, T in cases:
        got = call(sequential_batches, tokens.clone(), B, T, name="sequential_batches")
        what = f"sequential_batches(tokens of length {len(tokens)}, batch_size={B}, block_size={T})"
        expect(isinstance(got, (list, tuple)) and all(isinstance(b, (list, tuple)) and len(b) == 2 for b in got),
               f"{what} should return a list of (x, y) pairs.", "collect the batches in a list.")
        # as lists: the windows at 0, T, 2T, ... whose targets fit, batch_size per batch
        got = [(x.tolist(), y.tolist()) for x, y in got]
        windows = [(tokens[s:s + T].tolist(), tokens[s + 1:s + T + 1].tolist()) for s in range(0, len(tokens) - T, T)]
        want = [([x for x, _ in windows[i:i + B]], [y for _, y in windows[i:i + B]]) for i in range(0, len(windows), B)]
        gw, ww = [row for x, _ in got for row in x], [x for x, _ in windows]
        compare(got, want, f"{what} ({len(got)} batches holding {len(gw)} windows, expected {len(want)} holding "
                f"{len(ww)})", "x holds the windows tokens[s : s+T] for s = 0, T, 2T, ... and y the same windows one "
                "token on; group batch_size of them per batch, in order.",
                variants=_sequential_variants(tokens, B, T, gw, ww, got, want))

# ----------------------------------------------------------------------------- exercise 3

_ADAMW_BUILTINS = ((torch.optim, "AdamW"), (torch.optim, "Adam"), (importlib.import_module("torch.optim.adam"), "adam"),
                   (importlib.import_module("torch.optim.adamw"), "adamw"), (torch.optim, "SGD"))


class AdamProblem(nn.Module):
    """A small regression whose parameters come in groups. Iterating it gives the param
    groups (pass it where an optimizer expects params); calling it is an optimizer closure:
    it clears the gradients, computes the loss, runs backward and returns the loss."""

    def __init__(self, d_in: int, d_hidden: int, d_out: int, groups: list[dict], seed: int, plain: bool = False):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.w1 = nn.Parameter(torch.randn(d_hidden, d_in, generator=g) * 0.5)
        self.b1 = nn.Parameter(torch.randn(d_hidden, generator=g) * 0.1)
        self.gain = nn.Parameter(torch.ones(d_hidden))
        self.w2 = nn.Parameter(torch.randn(d_out, d_hidden, generator=g) * 0.5)
        self.unused = nn.Parameter(torch.randn(3, generator=g))       # never gets a gradient
        self.late = nn.Parameter(torch.ones(d_out))                   # a gradient on odd calls only
        self.calls = 0
        self.register_buffer("x", torch.randn(32, d_in, generator=g))
        self.register_buffer("y", torch.randn(32, d_out, generator=g))
        self.groups, self.plain = [dict(gr) for gr in groups], plain

    def __iter__(self):
        if self.plain:
            return iter([self.w1, self.b1, self.gain, self.w2, self.unused, self.late])
        return iter([{**{k: v for k, v in gr.items() if k != "names"}, "params": [getattr(self, n) for n in gr["names"]]}
                     for gr in self.groups])

    def forward(self) -> torch.Tensor:
        for p in self.parameters():
            p.grad = None
        self.calls += 1
        hidden = torch.tanh(self.x @ self.w1.T + self.b1) * self.gain      # (32, d_hidden)
        out = hidden @ self.w2.T
        if self.calls % 2:     # so a parameter's step count differs from the number of calls to step()
            out = out * self.late
        loss = ((out - self.y) ** 2).mean()
        loss.backward()
        return loss.detach()



def _adamw_variant(problem: AdamProblem, steps: int, opts: dict, variant: str) -> torch.Tensor:
    """A hand-written AdamW with one known mistake (:data:`_ADAMW_HINTS`); returns the final parameters."""
    groups = [{"params": list(problem)}] if problem.plain else [dict(gr) for gr in problem]
    state, updates = {}, 0
    for call_index in range(1, steps + 1):
        problem()
        with torch.no_grad():
            for gr in groups:
                own = {} if variant == "defaults_only" else gr           # the group's settings, or none of them
                lr = opts["lr"] if variant == "group_lr_ignored" else own.get("lr", opts["lr"])
                wd, (b1, b2) = own.get("weight_decay", opts["weight_decay"]), own.get("betas", opts["betas"])
                for p in gr["params"]:
                    if p.grad is None:
                        if variant == "decay_unused":
                            p.mul_(1 - lr * wd)
                        continue
                    if variant == "fresh_state" or p not in state:
                        state[p] = [0, torch.zeros_like(p), torch.zeros_like(p)]
                    s = state[p]
                    updates, s[0] = updates + 1, s[0] + 1
                    t = {"global_counter": updates, "step_counter": call_index}.get(variant, s[0])
                    grad = p.grad + wd * p if variant == "l2" else p.grad
                    if variant != "l2":
                        p.mul_(1 - wd if variant == "decay_without_lr" else 1 - lr * wd)
                    s[1].mul_(b1).add_(grad, alpha=1 - b1)
                    s[2].mul_(b2).addcmul_(grad, grad, value=1 - b2)
                    m_hat, v_hat = (s[1], s[2]) if variant == "no_bias_correction" else \
                        (s[1] / (1 - b1 ** t), s[2] / (1 - b2 ** t))
                    denom = (v_hat + opts["eps"]).sqrt() if variant == "eps_inside" else v_hat.sqrt() + opts["eps"]
                    p.sub_(lr * m_hat / denom)
    return _cat(problem.parameters())


_ADAMW_HINTS = [
    ("fresh_state", "the optimizer state is re-created every step: the moments and step count must persist in "
                    "self.state between calls to step(), created once per parameter."),
    ("no_bias_correction", "the bias correction is missing: divide m by (1 - beta1**t) and v by (1 - beta2**t), "
                           "t counting this parameter's steps from 1."),
    ("l2", "that is L2 regularisation (weight_decay * p added to the gradient), not AdamW's decoupled decay: "
           "shrink the parameter directly, p *= 1 - lr * weight_decay, and keep the gradient as it is."),
    ("decay_without_lr", "the decoupled decay is multiplied by the learning rate: p *= 1 - lr * weight_decay."),
    ("eps_inside", "eps is added after the square root: sqrt(v_hat) + eps, not sqrt(v_hat + eps)."),
    ("group_lr_ignored", "each param group's own lr overrides the constructor's default lr: read group['lr'] at "
                         "every step (the groups' other settings were used)."),
    ("defaults_only", "each param group's own settings (lr, weight_decay, betas) override the constructor's "
                      "defaults; read them from the group at every step."),
    ("global_counter", "the step count t is per parameter and per call to step(): a counter increased for every "
                       "parameter update makes the bias correction wrong."),
    ("step_counter", "the step count t is per parameter (kept in its state): a parameter that had no gradient on "
                     "some calls has taken fewer steps than step() was called, and its bias correction uses its own "
                     "count."),
    ("decay_unused", "parameters whose .grad is None are skipped entirely, weight decay included (as in "
                     "torch.optim.AdamW)."),
]
# A float32 AdamW written another way drifts from PyTorch's by up to ~1e-5 over 100 steps.
_ADAMW_TOL = (2e-5, 1e-4)
# The calls of the protocol case, in order: (what each asks, how it is made from the optimizer, the closure and
# a zero_grad); a closure's step computes the gradients.
_PROTOCOL = (("step(closure)", lambda opt, closure, zero_grad: opt.step(closure)),
             ("step() (no closure: the gradients the closure left in .grad)", lambda opt, *_: opt.step()),
             ("zero_grad() then step() (no gradient: nothing may change)",
              lambda opt, closure, zero_grad: (zero_grad(opt), opt.step())[1]),
             ("step(closure) again", lambda opt, closure, zero_grad: opt.step(closure)))
# PyTorch's zero_grad, and the known slips of one.
_ZERO_GRAD = {"none": lambda opt: opt.zero_grad(set_to_none=True),
              "zeros": lambda opt: opt.zero_grad(set_to_none=False), "kept": lambda opt: None}
_ZERO_GRAD_HINTS = {"kept": "zero_grad() must set every parameter's .grad to None: after it, step() found the old "
                            "gradients and updated the parameters again.",
                    "zeros": "zero_grad() sets .grad to None, not to zeros: a zero gradient still counts as a step "
                             "(the decay, the moments and the step count change), a None one is skipped."}


def _adamw_step(what: str, run, *args, said: str = "step(closure)"):
    """One call of your AdamW's step, ``said`` naming it; a step that mishandles its closure is named as such."""
    try:
        return call(run, *args, name="AdamW.step")
    except CheckFailed as err:
        if "does not require grad" in err.what:
            fail(f"{what}: AdamW.step(closure) raised when it ran the closure: its backward found no gradient to "
                 "compute.", "step runs under @torch.no_grad(), so call the closure inside `with torch.enable_grad():` "
                 "(the closure computes a loss and calls backward).")
        if said.startswith(("step()", "zero_grad()")) and "not callable" in err.what:
            fail(f"{what}: {said} raised: it called the closure, which was None.", "step() may be called without a "
                 "closure (the training loop of exercise 9 does): call the closure only when one is given, and "
                 "otherwise update from the .grad already there.")
        raise


def _adamw_case(AdamW, make, opts: dict, steps: int, what: str) -> None:
    """``steps`` steps of your AdamW on the problem ``make`` builds, against PyTorch's after steps 1, 2, 10, last."""
    problem, got = make(), {}
    with forbid(*_ADAMW_BUILTINS, exercise="AdamW"):
        opt = call(AdamW, problem, **opts, name="AdamW(...)")
        expect(getattr(opt, "step", None) is not None, "your AdamW has no step method.",
               "define step(self, closure=None).")
        for i in range(1, steps + 1):
            _adamw_step(what, opt.step, problem)
            if i in (1, 2, 10, steps):
                got[i] = _cat(problem.parameters())
    reference = make()
    optimizer = torch.optim.AdamW(list(reference), **opts)
    for i in range(1, steps + 1):
        optimizer.step(reference)
        if i in got:
            compare(got[i], _cat(reference.parameters()),
                    f"{what}: the parameters after {i} step(s), against PyTorch's",
                    "follow the update of torch.optim.AdamW: p *= 1 - lr*wd; m = b1 m + (1-b1) g; "
                    "v = b2 v + (1-b2) g^2; p -= lr * m_hat / (sqrt(v_hat) + eps).",
                    variants_of(lambda v: _adamw_variant(make(), i, opts, v), _ADAMW_HINTS), tol=_ADAMW_TOL)


def _protocol(opt, problem: AdamProblem, zero_grad=lambda opt: opt.zero_grad(), run=lambda step, said: step()) -> list:
    """(what each call of :data:`_PROTOCOL` returned, the parameters after it)."""
    return [(run(lambda: step(opt, problem, zero_grad), said), _cat(problem.parameters())) for said, step in _PROTOCOL]


def _number(value):
    """A returned loss as a float when it is one number (a tensor of one element), else as it is."""
    try:
        return float(value) if isinstance(value, (int, float, torch.Tensor)) and not isinstance(value, bool) else value
    except (TypeError, ValueError, RuntimeError):
        return value


def _adamw_protocol(AdamW, make, opts: dict, what: str) -> None:
    """The rules around the update: step() without a closure uses the gradients in .grad, zero_grad()
    leaves them None (a step after it changes nothing), step(closure) returns the closure's loss."""
    problem = make()
    with forbid(*_ADAMW_BUILTINS, exercise="AdamW"):
        opt = call(AdamW, problem, **opts, name="AdamW(...)")
        got = _protocol(opt, problem, run=lambda step, said: _adamw_step(what, step, said=said))

    def pytorch(zero_grad: str) -> list:     # outside the block that forbids it
        return _protocol(torch.optim.AdamW(list(fresh := make()), **opts), fresh, _ZERO_GRAD[zero_grad])

    want = pytorch("none")
    for k, ((returned, params), (said, _)) in enumerate(zip(got, _PROTOCOL)):
        if k in (0, 3):
            compare(_number(returned), float(want[k][0]), f"{what}: the value {said} returned",
                    "step(closure) returns what the closure returns (the loss); step() without one returns None.",
                    tol=_ADAMW_TOL)
        compare(params, want[k][1], f"{what}: the parameters after {said}, against PyTorch's",
                "step() without a closure updates from the gradients already in .grad.",
                variants_of(lambda v: pytorch(v)[k][1], _ZERO_GRAD_HINTS.items()), tol=_ADAMW_TOL)


def _adamw_drawn(d: Draw, k: int) -> tuple:
    """A problem with drawn groups, defaults and sizes: (make, opts, steps, what)."""
    rng, names = d.rng, ["w1", "b1", "gain", "w2", "unused", "late"]
    rng.shuffle(names)
    cut = sorted(rng.sample(range(1, 6), rng.randrange(1, 3)))
    groups = [{"names": part, **({"weight_decay": rng.choice([0.0, 0.01, 0.1, 0.5])} if rng.random() < 0.7 else {}),
               **({"lr": float(f"{10 ** rng.uniform(-3.3, -1.5):.3g}")} if rng.random() < 0.5 else {}),
               **({"betas": rng.choice([(0.8, 0.99), (0.9, 0.9), (0.5, 0.999)])} if rng.random() < 0.3 else {})}
              for part in (names[a:b] for a, b in zip([0] + cut, cut + [6]))]
    opts = {"lr": float(f"{10 ** rng.uniform(-3, -1.5):.3g}"), "betas": rng.choice([(0.9, 0.999), (0.9, 0.95)]),
            "eps": rng.choice([1e-8, 1e-6, 1e-3]), "weight_decay": rng.choice([0.01, 0.1, 0.3])}
    dims, seed, steps = (rng.randrange(2, 7), rng.randrange(2, 9), rng.randrange(1, 4)), d.sub(f"problem{k}").seed, \
        rng.randrange(40, 81)
    return lambda: AdamProblem(*dims, groups, seed), opts, steps, f"AdamW over {steps} steps with groups {groups}"


def check_adamw(AdamW, hidden: bool = False) -> None:
    d = draw("adamw", hidden)
    groups = [{"names": ["w1", "w2", "unused"], "weight_decay": 0.1},
              {"names": ["b1", "gain", "late"], "weight_decay": 0.0, "lr": 0.003}]
    opts = {"lr": 0.01, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.05}
    seed = d.sub("problem").seed
    _adamw_case(AdamW, lambda: AdamProblem(4, 6, 2, groups, seed), opts, 100, "AdamW over 100 steps, two param groups")
    if not hidden:
        _adamw_protocol(AdamW, lambda: AdamProblem(4, 6, 2, groups, seed), opts, "AdamW with two param groups")
        return
    for k in range(3):
        _adamw_case(AdamW, *_adamw_drawn(d, k))
    opts = {"lr": 0.005, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": d.rng.choice([0.1, 0.5])}
    seed = d.sub("plain").seed
    _adamw_case(AdamW, lambda: AdamProblem(3, 5, 2, [], seed, plain=True), opts, 30,
                "AdamW given a plain list of parameters (no groups)")
    make, opts, _, what = _adamw_drawn(d, 3)      # last: the update itself was checked above
    _adamw_protocol(AdamW, make, opts, "AdamW with groups " + what.split(" with groups ", 1)[-1])

# ----------------------------------------------------------------------------- exercise 4

class _GroupsModel(nn.Module):
    def __init__(self, tied: bool = True):
        super().__init__()
        self.tok, self.pos, self.fc = nn.Embedding(11, 8), nn.Embedding(6, 8), nn.Linear(8, 8)
        self.ln, self.head = nn.LayerNorm(8), nn.Linear(8, 11, bias=False)
        if tied:
            self.head.weight = self.tok.weight


class _GroupsTables(nn.Module):
    """2-D parameters that are not nn.Linear weights: a bare position table and attention's packed
    input projection (whose out_proj is an nn.Linear subclass)."""

    def __init__(self, d: int = 8, heads: int = 2, rows: int = 6):
        super().__init__()
        self.tok, self.pos = nn.Embedding(13, d), nn.Parameter(torch.zeros(rows, d))
        self.attn, self.ln, self.head = nn.MultiheadAttention(d, heads), nn.LayerNorm(d), nn.Linear(d, 13)


class _GroupsDrawn(nn.Module):
    def __init__(self, rng: random.Random):
        super().__init__()
        vocab, d = rng.randrange(5, 40), rng.randrange(1, 7) * 2
        self.tok = nn.Embedding(vocab, d)
        layers: list[nn.Module] = [nn.Linear(d, d, bias=rng.random() < 0.5)]
        for _ in range(rng.randrange(1, 4)):
            layers.append(rng.choice([nn.Linear(d, d, bias=rng.random() < 0.5), nn.LayerNorm(d), nn.GELU(),
                                      nn.Embedding(rng.randrange(2, 9), d), nn.MultiheadAttention(d, 2)]))
        self.body = nn.ModuleList(layers)
        if rng.random() < 0.5:
            self.table = nn.Parameter(torch.zeros(rng.randrange(2, 9), d))
        self.norm = nn.LayerNorm(d, bias=rng.random() < 0.5)
        self.head = nn.Linear(d, vocab, bias=rng.random() < 0.4)
        if rng.random() < 0.6 and self.head.bias is None:
            self.head.weight = self.tok.weight


def _groups_case(param_groups, model: nn.Module, wd: float) -> None:
    groups = call(param_groups, model, wd, name="param_groups")
    expect(isinstance(groups, list) and len(groups) == 2 and all(isinstance(g, dict) for g in groups),
           "param_groups should return a list of two dicts.",
           "return [{'params': decay, 'weight_decay': weight_decay}, {'params': no_decay, 'weight_decay': 0.0}].")
    decay, plain = groups
    expect(math.isclose(float(decay.get("weight_decay", -1)), wd) and float(plain.get("weight_decay", -1)) == 0.0,
           f"the groups have weight_decay {decay.get('weight_decay')} and {plain.get('weight_decay')}, expected "
           f"{wd} (the argument) and 0.0.",
           "set 'weight_decay' in each dict: the first group gets the weight_decay passed in, the second 0.0.")
    params, ids = list(model.parameters()), [id(p) for g in groups for p in g["params"]]
    expect(len(ids) == len(set(ids)), "a parameter appears twice in the groups.",
           "a tied weight is one Parameter: model.parameters() lists it once; build the groups from that list "
           "(named_modules visits it once per module that holds it).")
    expect(set(ids) == {id(p) for p in params},
           f"the groups hold {len(set(ids))} distinct parameters, the model has {len(params)}.",
           "every parameter of the model goes in exactly one of the two groups.")
    named = {id(p): (n, p) for n, p in model.named_parameters()}
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    linear = {id(m.weight) for m in model.modules() if isinstance(m, nn.Linear)}
    decayed = {id(p) for p in decay["params"]}
    for wrong, what, hint in [
            (decayed & embeddings, "an embedding table is in the decayed group.",
             "this course does not decay embeddings, even when the table is tied to the output layer (a convention: "
             "nanoGPT decays every matrix, embeddings included; decide per module type, not by ndim alone)."),
            ({i for i in decayed - linear if named[i][1].ndim < 2},
             "LayerNorm parameters or biases are in the decayed group ({}).",
             "decay only matrices of nn.Linear layers: biases and norm gains are 1-D and should not be pulled to 0."),
            (decayed - linear, "2-D parameters that are not nn.Linear weights are in the decayed group ({}).",
             "decide by the module, not by the shape: only the weights of nn.Linear layers are decayed; a bare "
             "nn.Parameter (a position table) or nn.MultiheadAttention's in_proj_weight stays in the second group."),
            (linear - embeddings - decayed, "nn.Linear weights are missing from the decayed group ({}).",
             "every nn.Linear weight that is not also an embedding table is decayed, subclasses of nn.Linear too "
             "(nn.MultiheadAttention's out_proj): test with isinstance, not type(...) is nn.Linear.")]:
        expect(not wrong, what.format(", ".join(sorted(named[i][0] for i in wrong)[:4])), hint)


def check_param_groups(param_groups, hidden: bool = False) -> None:
    _groups_case(param_groups, _GroupsModel(tied=True), 0.1)
    _groups_case(param_groups, _GroupsTables(), 0.05)
    if hidden:
        rng = draw("param_groups", hidden).rng
        _groups_case(param_groups, _GroupsModel(tied=False), float(f"{rng.uniform(0.01, 0.3):.3g}"))
        _groups_case(param_groups, _GroupsTables(rng.randrange(1, 6) * 4, 4, rng.randrange(2, 30)),
                     float(f"{rng.uniform(0.01, 0.3):.3g}"))
        for _ in range(4):
            _groups_case(param_groups, _GroupsDrawn(rng), float(f"{rng.uniform(0.01, 0.5):.3g}"))

# ----------------------------------------------------------------------------- exercise 5

def _lr_oracle(step, max_lr, min_lr, warmup, max_steps, decay_steps=None):
    if step < warmup:
        return max_lr * (step + 1) / warmup
    if step >= max_steps:
        return min_lr
    decay = max_steps - warmup if decay_steps is None else decay_steps
    start = max_steps - decay
    if step < start:
        return max_lr
    progress = (step - start) / decay
    return min_lr + (max_lr - min_lr) * 0.5 * (1 + math.cos(math.pi * progress))


def _lr_variants(step, max_lr, min_lr, warmup, max_steps, decay_steps):
    """The rates of the known slips at ``step``, with their hints (lazily: only a wrong rate needs them)."""
    decay = max_steps - warmup if decay_steps is None else decay_steps
    start, given, warming = max_steps - decay, decay_steps is not None, step < warmup
    cos = lambda p: 0.5 * (1 + math.cos(math.pi * p))  # noqa: E731
    default = lambda: _lr_oracle(step, max_lr, min_lr, warmup, max_steps)  # noqa: E731
    yield (max_lr if warming else None,
           "the schedule is at its peak at step 0: warm up linearly, max_lr * (step + 1) / warmup_steps.")
    yield (max_lr * step / warmup if warming else None,
           "warm-up counts from step + 1: step 0 already uses max_lr / warmup_steps, never 0.")
    yield when(lambda _: warming), "during warm-up the rate rises linearly: max_lr * (step + 1) / warmup_steps."
    yield (default if decay_steps == 0 else None,
           "decay_steps=0 was taken for the default: 0 means no decay (max_lr up to max_steps); only None means every "
           "step after warm-up.")
    yield (when(lambda got: step >= max_steps and not matches(got, min_lr)),
           "after max_steps the rate stays at min_lr (the cosine must not come back up).")
    yield (default if given and step < start else None,
           "decay_steps was ignored: the rate holds at max_lr after warm-up and the cosine runs only over the last "
           "decay_steps steps, from step max_steps - decay_steps.")
    yield ((lambda: min_lr + (max_lr - min_lr) * cos((step - start) / max(1, decay - 1))) if given and step >= start
           else None, "the decay reaches min_lr one step early: p = (step - (max_steps - decay_steps)) / decay_steps, "
                      "which is 1 at max_steps, not at max_steps - 1.")
    yield ((lambda: min_lr + (max_lr - min_lr) * cos((step - warmup) / (max_steps - warmup))) if given and
           step >= start else None, "the cosine's progress must start where the decay starts, not after warm-up: "
                                    "p = (step - (max_steps - decay_steps)) / decay_steps, so the rate leaves max_lr "
                                    "smoothly.")
    yield (when(lambda _: warmup <= step < start),
           "between warm-up and max_steps - decay_steps the rate is constant: max_lr (the stable phase).")
    yield (lambda: max_lr * cos((step - start) / decay),
           "the cosine decays to min_lr, not to 0: lr = min_lr + (max_lr - min_lr) * (1 + cos(pi p)) / 2.")
    yield ((lambda: min_lr + (max_lr - min_lr) * cos(step / max_steps)) if not given else None,
           "the cosine's progress starts after warm-up: p = (step - warmup_steps) / (max_steps - warmup_steps), so "
           "that p = 0 right after warm-up and 1 at max_steps.")


def _lr_call(lr_at, step, max_lr, min_lr, warmup, max_steps, decay_steps):
    """One call of lr_at; an lr_at without a decay_steps parameter is named as such."""
    try:
        return call(lr_at, step, max_lr, min_lr, warmup, max_steps, name="lr_at",
                    **({} if decay_steps is None else {"decay_steps": decay_steps}))
    except CheckFailed as err:
        if decay_steps is not None and "decay_steps" in err.what and "TypeError" in err.what:
            fail(f"lr_at(..., decay_steps={decay_steps}) was rejected: your lr_at takes no decay_steps (every step "
                 "of the schedules without one was right).", "exercise 5's signature is lr_at(step, max_lr, min_lr, "
                 "warmup_steps, max_steps, decay_steps=None): add the parameter and the stable phase it asks for "
                 "(the book's schedule, which has no stable phase, has no such parameter).")
        raise


# A schedule without decay_steps is the book's; its hint does not speak of a stable phase.
_LR_HINT = ("after the warm-up, lr = min_lr + (max_lr - min_lr) * (1 + cos(pi p)) / 2 with "
            "p = (step - warmup_steps) / (max_steps - warmup_steps), and min_lr after max_steps.")
_LR_HINT_STABLE = ("lr = min_lr + (max_lr - min_lr) * (1 + cos(pi p)) / 2 with p = (step - start) / decay_steps "
                   "and start = max_steps - decay_steps (decay_steps = max_steps - warmup_steps by default).")


def check_lr_at(lr_at, hidden: bool = False, stable_phase: bool = True) -> None:
    """Every step of several schedules, those without decay_steps first; ``stable_phase=False`` checks
    only those (an lr_at of the book's signature, without decay_steps)."""
    configs = [(1.0, 0.1, 10, 100, None), (6e-4, 6e-5, 5, 30, None), (1.0, 0.1, 4, 40, 10), (3e-3, 0.0, 2, 12, 10),
               (1.0, 0.1, 3, 12, 0)]
    if hidden:
        rng = draw("lr_at", hidden).rng
        configs += [(3e-4, 0.0, 0, 20, None), (3e-4, 3e-5, 0, 20, 5)]     # no warm-up; no warm-up, stable, decay
        for _ in range(4):
            max_lr, warmup = float(f"{10 ** rng.uniform(-5, 0):.3g}"), rng.randrange(1, 40)
            max_steps = warmup + rng.randrange(2, 200)
            decay = rng.choice([None, 0, rng.randrange(1, max_steps - warmup + 1)])
            configs.append((max_lr, max_lr * rng.choice([0.0, 0.01, 0.1, 0.5]), warmup, max_steps, decay))
    configs = [c for c in configs if c[-1] is None] + [c for c in configs if c[-1] is not None and stable_phase]
    for max_lr, min_lr, warmup, max_steps, decay_steps in configs:
        for step in range(0, max_steps + 15):
            shown = (f"lr_at({step}, max_lr={max_lr}, min_lr={min_lr}, warmup_steps={warmup}, max_steps={max_steps}"
                     + (")" if decay_steps is None else f", decay_steps={decay_steps})"))
            got = expect_number(_lr_call(lr_at, step, max_lr, min_lr, warmup, max_steps, decay_steps), shown,
                                "return a Python float (math.cos, not torch.cos).")
            compare(got, float(_lr_oracle(step, max_lr, min_lr, warmup, max_steps, decay_steps)), shown,
                    _LR_HINT if decay_steps is None else _LR_HINT_STABLE,
                    variants=_lr_variants(step, max_lr, min_lr, warmup, max_steps, decay_steps))

# ----------------------------------------------------------------------------- exercise 6

_CLIP_BUILTINS = ((torch.nn.utils, "clip_grad_norm_"), (torch.nn.utils, "clip_grad_norm"),
                  (torch.nn.utils, "get_total_norm"), (torch.nn.utils, "clip_grads_with_norm_"),
                  (torch.nn.utils.clip_grad, "clip_grad_norm_"), (torch.nn.utils.clip_grad, "_get_total_norm"),
                  (torch.nn.utils.clip_grad, "_clip_grads_with_norm_"))
_LOW = (torch.float16, torch.bfloat16)


def _clip_oracle(grads, max_norm):
    """(clipped, norm): PyTorch's global norm in float64, each clipped gradient rounded back to its own dtype."""
    norm = float(torch.nn.utils.get_total_norm([t.double() for t in grads if t is not None]))
    factor = min(1.0, max_norm / (norm + 1e-6))
    return [None if t is None else (t.double() * factor).to(t.dtype) for t in grads], norm


def _clip_cases(d: Draw) -> list:
    """(gradients, max_norm, what): the visible cases, and drawn ones for the hidden tests."""
    h = torch.float16
    cases = [([d.randn(4, 3) * 2, d.randn(3)], 1.0, "a norm above max_norm"),
             ([d.randn(5) * 0.01, d.randn(2, 2) * 0.01], 1.0, "a norm below max_norm"),
             ([torch.full((3,), 10.0), torch.zeros(2)], 0.5, "one large gradient and one zero gradient"),
             ([d.randn(3, 2), None, d.randn(4)], 0.5, "a None gradient (a parameter that got no gradient) in second place"),
             ([(d.randn(2, 3) * 300).to(h), d.randn(4)], 1.0,
              "a float16 gradient with entries near 300 (squares above float16's max, 65504) and a float32 one")]
    if not d.hidden:
        return cases
    rng = d.rng
    cases += [([torch.zeros(3, 2), None, torch.zeros(4)], 1.0, "all-zero gradients and a None"),
              ([d.randn(7, dtype=torch.float64) * 100], 2.0, "a single float64 gradient"),
              ([None, (d.randn(5) * 1e3).to(torch.bfloat16), d.randn(3).to(h)], float(f"{10 ** rng.uniform(-1, 1):.3g}"),
               "None first, then bfloat16 and float16 gradients")]
    for _ in range(3):
        shapes = [tuple(rng.randrange(1, 6) for _ in range(rng.randrange(1, 4))) for _ in range(rng.randrange(2, 6))]
        scale = rng.choice([1e-3, 0.1, 1.0, 30.0, 500.0])
        dtypes = [rng.choice([torch.float32, torch.float32, torch.float16, torch.bfloat16]) for _ in shapes]
        grads = [None if rng.random() < 0.2 else (d.randn(*s) * scale * rng.random()).to(dt) for s, dt in zip(shapes, dtypes)]
        cases.append((grads, float(f"{10 ** rng.uniform(-2, 1):.3g}"), f"{len(shapes)} gradients of shapes {shapes}, "
                      f"dtypes {[None if t is None else str(t.dtype)[6:] for t in grads]}"))
    return cases


_CLIP_LOW_PRECISION = ("the norm was computed in the gradients' own low precision: squares of float16 entries above 256 "
                       "overflow (inf), and float16/bfloat16 sums lose digits; convert each gradient with g.float() "
                       "before squaring and summing.")
# The exercise computes the norm in float32: good to ~1e-7 of its value, not to float64's 1e-8.
_CLIP_NORM_TOL = (1e-7, 1e-4)


def _check_clip_norm(norm, grads, max_norm, want_norm, what) -> None:
    present = [t for t in grads if t is not None]
    compare(float(norm), want_norm, f"the norm clip_grad_norm returned on {what}",
            "the global norm is sqrt(sum over all tensors of (g.float() ** 2).sum()), skipping None.", variants=[
                (when(lambda n: not math.isfinite(n)), _CLIP_LOW_PRECISION),
                ((lambda: math.sqrt(sum(float(t.pow(2).sum()) for t in present)))      # summed in their own dtypes
                 if any(t.dtype in _LOW for t in present) else None, _CLIP_LOW_PRECISION),
                (max_norm if want_norm > max_norm else None,
                 "return the global norm measured before clipping (what clip_grad_norm_ returns), not after."),
                (lambda: sum(float(t.double().norm()) for t in present),
                 "the global norm is sqrt of the sum of squares of all entries (the norm of the per-tensor norms), not "
                 "the sum of the per-tensor norms.")], tol=_CLIP_NORM_TOL)


def _check_clipped(clipped, grads, max_norm, want, want_norm, what) -> None:
    n = len(clipped) if isinstance(clipped, (list, tuple)) else "?"
    expect(n == len(grads), f"clip_grad_norm on {what} returned {n} gradients, expected {len(grads)}.",
           "one gradient out per gradient in, in the same order: a None gradient stays None in its place "
           "(the list lines up with the parameters).")
    for i, (c, t) in enumerate(zip(clipped, grads)):
        expect((c is None) == (t is None) and (t is None or isinstance(c, torch.Tensor)),
               f"clip_grad_norm on {what}: entry {i} was {'None' if t is None else 'a tensor'} and came back as "
               f"{type(c).__name__}.", "a None gradient stays None in its place; every other entry is a tensor.")
        expect(t is None or (c.dtype == t.dtype and c.shape == t.shape), f"clip_grad_norm on {what}: entry {i} came "
               f"back as {getattr(c, 'dtype', None)} {tuple(getattr(c, 'shape', ()))}, expected "
               f"{getattr(t, 'dtype', None)} {tuple(getattr(t, 'shape', ()))}.", "each clipped gradient keeps its own "
               "dtype and shape: compute the norm in float32, but multiply each gradient by the factor in its own "
               "dtype (g * factor).")
    present = [(c, w, t) for c, w, t in zip(clipped, want, grads) if t is not None]
    variants = [(when(lambda _: want_norm < max_norm and not all(matches(c, t, (1e-7, 1e-2)) for c, _, t in present)),
                 "gradients whose global norm is already below max_norm must be left unchanged: never scale up."),
                (when(lambda _: len(present) > 1 and all(float(c.double().norm()) <= max_norm * (1 + 1e-2)
                                                         for c, _, _ in present)),
                 "each tensor was clipped on its own: clip by the global norm of all gradients together, "
                 "multiplying every gradient by the same factor max_norm / (norm + 1e-6).")]
    for c, w, t in present:
        compare(c, w, f"the clipped gradients on {what}, against clip_grad_norm_'s",
                "multiply every gradient by min(1, max_norm / (norm + 1e-6)).", variants,
                # the factor comes from a float32 norm: a float64 gradient is clipped to float32's precision
                tol=(1e-6, 1e-6) if t.dtype == torch.float64 else None)


def check_clip_grad_norm(clip_grad_norm, hidden: bool = False) -> None:
    for grads, max_norm, what in _clip_cases(draw("clip_grad_norm", hidden)):
        with forbid(*_CLIP_BUILTINS, exercise="global-norm clipping"):
            got = call(clip_grad_norm, [None if t is None else t.clone() for t in grads], max_norm,
                       name="clip_grad_norm")
        clipped, norm = expect_tuple(got, "clipped, norm", f"clip_grad_norm on {what}",
                                     "return the list of clipped gradients and the norm.")
        want, want_norm = _clip_oracle(grads, max_norm)
        _check_clip_norm(norm, grads, max_norm, want_norm, what)
        _check_clipped(clipped, grads, max_norm, want, want_norm, what)

# ----------------------------------------------------------------------------- exercise 7

def _accumulated_oracle(model, micro_batches) -> torch.Tensor:
    """The gradients (flattened, concatenated) of one backward pass over the whole batch."""
    x, y = (torch.cat(parts) for parts in zip(*micro_batches))
    model.zero_grad()
    F.cross_entropy(model(x).flatten(0, 1), y.flatten(), ignore_index=-100).backward()
    return _cat(p.grad.clone() for p in model.parameters())


def _kept(micro_batches) -> int:
    return sum(int((y != -100).sum()) for _, y in micro_batches)


def _accum_variant(model, micro_batches, variant) -> torch.Tensor:
    """The gradients (flattened, concatenated) of accumulation with one known mistake (:data:`_ACCUM_HINTS`)."""
    model = copy.deepcopy(model)
    model.zero_grad()
    total, count = _kept(micro_batches), sum(my.numel() for _, my in micro_batches)
    for x, y in micro_batches:
        logits = model(x).flatten(0, 1)
        summed = F.cross_entropy(logits, y.flatten(), ignore_index=-100, reduction="sum")
        {"mean_of_means": lambda: F.cross_entropy(logits, y.flatten(), ignore_index=-100) / len(micro_batches),
         "no_division": lambda: summed, "count_padding": lambda: summed / count,
         }.get(variant, lambda: summed / total)().backward()
    return _cat(p.grad for p in model.parameters())


_ACCUM_HINTS = [
    ("mean_of_means", "averaging the micro-batches' mean losses weights a small micro-batch as much as a large one: "
                      "weight each micro-batch by its number of (non-ignored) target tokens, i.e. sum the token losses "
                      "and divide by the total count."),
    ("no_division", "the token losses were summed but never divided by the total number of target tokens."),
    ("count_padding", "padding targets (-100) do not count: divide by the number of targets that are not -100."),
]
_ONLY_LAST = ("only the last micro-batch's gradient survived: zero the gradients once before the loop, never between "
              "micro-batches; backward adds into .grad.")
_ACCUM_NOTHING = (when(lambda got: not got.abs().max() > 0), "no gradient was accumulated: the micro-batches come from "
                  "an iterator that can be read only once (a data loader), so count the tokens in the same pass that "
                  "runs backward.")


class OnceLoader:
    """The micro-batches of one step as a data loader hands them over: iterable once, no len().
    (A class rather than a generator, so that it can travel to the kernel when grading.)"""

    def __init__(self, micro) -> None:
        self._items, self._used = [(x.clone(), y.clone()) for x, y in micro], False

    def __iter__(self):
        if self._used:
            return iter(())
        self._used = True
        return iter(self._items)

    def __repr__(self) -> str:
        return f"OnceLoader({len(self._items)} micro-batches)"



class GradsInStateLM(TinyLM):
    """TinyLM whose state_dict also carries each parameter's .grad (an empty tensor for None),
    so that a grader outside the kernel, which receives module state only, sees the gradients.
    Its buffers count the forward passes whose graph is still waiting for its backward, and the
    most of them at any one time (one, when each micro-batch is backwarded before the next)."""

    def __init__(self, vocab_size: int = 16, d_model: int = 12, dropout: float = 0.0):
        super().__init__(vocab_size, d_model, dropout)
        self.register_buffer("open_graphs", torch.zeros((), dtype=torch.long))
        self.register_buffer("most_open_graphs", torch.zeros((), dtype=torch.long))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        out = super().forward(ids)
        if out.requires_grad:
            with torch.no_grad():
                self.open_graphs.add_(1)
                self.most_open_graphs.copy_(torch.maximum(self.most_open_graphs, self.open_graphs))
            out.register_hook(self._graph_closed)
        return out

    def _graph_closed(self, grad: torch.Tensor) -> None:
        with torch.no_grad():
            self.open_graphs.sub_(1)

    def state_dict(self, *args, **kwargs):
        state, prefix = super().state_dict(*args, **kwargs), kwargs.get("prefix", "")
        state.update({f"{prefix}grad::{name}": torch.empty(0, dtype=p.dtype) if p.grad is None
                      else p.grad.detach().clone() for name, p in self.named_parameters()})
        return state

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        state = dict(state_dict)
        grads = {k[len("grad::"):]: state.pop(k) for k in list(state) if k.startswith("grad::")}
        out = super().load_state_dict(state, strict=strict, assign=assign)
        for name, p in self.named_parameters():
            if name in grads:
                p.grad = None if grads[name].numel() == 0 else grads[name].clone()
        return out


def _accum_call(accumulate_gradients, model, micro, want: torch.Tensor, what: str, hint: str, variants=()) -> None:
    """One call of accumulate_gradients on the model, held against ``want`` (flattened gradients)."""
    with torch.no_grad():
        model.open_graphs.zero_()
        model.most_open_graphs.zero_()
    weights, n = _cat(model.parameters()), len(list(model.parameters()))
    got = call(accumulate_gradients, model, OnceLoader(micro), name="accumulate_gradients")
    expect(isinstance(got, (list, tuple)) and len(got) == n,
           f"accumulate_gradients should return {n} gradients (one per parameter).",
           "return [p.grad.clone() for p in model.parameters()].")
    compare(_cat(got), want, what, hint, variants=variants)
    left = [p.grad for p in model.parameters()]
    expect(all(t is not None for t in left) and matches(_cat(left), want),
           f"{what}: the right gradients came back, but the parameters' .grad do not hold them.",
           "the optimizer's step reads p.grad: divide the summed gradients in place (p.grad.div_(total)) "
           "and return copies of them.")
    expect(matches(_cat(model.parameters()), weights, (0.0, 0.0)), f"{what}: the right gradients came back, but "
           "the model's weights changed.", "accumulate_gradients only fills .grad: the optimizer's step, later, "
           "updates the weights (the loop calls it once per accumulated batch).")
    held = int(model.most_open_graphs)
    expect(held <= 1, f"{what}: the right gradients came back, but it held the graphs of {held} micro-batches at once "
                      f"before calling backward.",
           "backward each micro-batch's loss before reading the next one: a graph keeps its activations alive, so "
           "holding them all costs the memory that accumulation exists to save.")


def check_accumulate_gradients(accumulate_gradients, hidden: bool = False) -> None:
    d = draw("accumulate_gradients", hidden)
    V, T, sizes, pad_rows = 16, 6, [3, 1, 2], [(0, 4), (2, 2)]   # pad_rows: (micro-batch, padded final positions)
    if hidden:
        V, T = d.rng.randrange(5, 30), d.rng.randrange(2, 9)
        sizes = [d.rng.randrange(1, 5) for _ in range(d.rng.randrange(2, 6))]
        sizes[-1] = max(1, sizes[0] - 1) if sizes[0] > 1 else sizes[-1] + 1      # unequal micro-batches
        pad_rows = [(d.rng.randrange(len(sizes)), d.rng.randrange(1, T)) for _ in range(2)]
    micro = [(d.randint(0, V, (b, T)), d.randint(0, V, (b, T))) for b in sizes]
    for i, n in pad_rows:
        micro[i][1][0, T - n:] = -100
    for dtype in [torch.float32] + ([torch.float64] if hidden else []):
        with d.sub("init").seeded():
            model = GradsInStateLM(V, 8).to(dtype)
        reference = TinyLM(V, 8).to(dtype)
        reference.load_state_dict({k: v for k, v in TinyLM.state_dict(model).items() if not k.endswith("open_graphs")})
        want = _accumulated_oracle(reference, micro)
        last = lambda: _accum_variant(reference, micro[-1:], "token")  # noqa: E731
        what = (f"accumulate_gradients on micro-batches of sizes {sizes} (block_size {T}, some targets -100), read "
                f"once from an iterator, a {str(dtype)[6:]} model")
        _accum_call(accumulate_gradients, model, micro, want, f"{what}, against one backward pass over the whole batch",
                    "the accumulated gradient must equal the gradient of the mean loss over all target tokens of all "
                    "micro-batches: backward each micro-batch's summed token loss, count the kept tokens as they come, "
                    "and divide the gradients by the total at the end.",
                    [*variants_of(lambda v: _accum_variant(reference, micro, v), _ACCUM_HINTS),
                     (lambda: last() * (_kept(micro[-1:]) / _kept(micro)), _ONLY_LAST), (last, _ONLY_LAST),
                     _ACCUM_NOTHING])
        _accum_call(accumulate_gradients, model, micro, want, f"{what}, called a second time on the same model",
                    "gradients from the previous call were still there: zero the gradients (model.zero_grad()) before "
                    "the first micro-batch, not only after the step.")

# ----------------------------------------------------------------------------- exercise 8

_SCALER_BUILTINS = ((torch.amp, "GradScaler"), (torch.cuda.amp, "GradScaler"), (torch, "_amp_update_scale_"),
                    (torch, "_amp_foreach_non_finite_check_and_unscale_"))


def _scaler_configs(d: Draw) -> list:
    """(init_scale, growth_factor, backoff_factor, growth_interval, events): "ok" is a finite step."""
    if not d.hidden:
        return [(2.0 ** 10, 2.0, 0.5, 3, ["ok"] * 4 + ["inf", "ok", "ok", "nan"] + ["ok"] * 7 + ["inf", "inf"] +
                 ["ok"] * 4)]
    short = ["nan", "ok", "ok", "inf", "ok", "ok", "ok", "inf", "ok"]
    rng = d.rng
    return [(2.0 ** 10, 2.0, 0.5, 3, short), (2.0 ** 16, 2.0, 0.5, 1, short)] + [
        (2.0 ** rng.randrange(4, 17), rng.choice([2.0, 4.0, 1.5]), rng.choice([0.5, 0.25, 0.125]), rng.randrange(1, 6),
         [rng.choice(["ok"] * 6 + ["inf", "nan", "-inf"]) for _ in range(40)]) for _ in range(2)]


def _scale_variant(events, init, growth, backoff, interval, variant="ok"):
    """The scale after ``events`` under GradScaler's rule (torch._amp_update_scale_), or with one known mistake."""
    scale, count = init, 0
    for event in events:
        if event != "ok":
            scale *= 1.0 if variant == "no_backoff" else backoff
            count = count if variant == "no_reset" else 0
            continue
        count += 1
        if variant == "every_step" or count == interval:
            scale *= 1.0 if variant == "never_grow" else growth
            count = 0
    return scale


_SCALER_HINTS = [
    ("never_grow", "the scale did not grow on the growth_interval-th finite step in a row (it grew later, or never): "
                   "when the count of good steps reaches growth_interval (==, not >), multiply the scale by "
                   "growth_factor and start counting again."),
    ("every_step", "grow only after growth_interval consecutive finite steps, not after every step."),
    ("no_reset", "an overflow resets the count of good steps: after a skipped step, the scale grows only after "
                 "growth_interval new finite steps."),
    ("no_backoff", "back off after an overflow: multiply the scale by backoff_factor."),
]


def _scaler_step(scaler, d: Draw, history: list, rule: tuple, what: str) -> None:
    """One step whose gradients overflow unless history[-1] is "ok": scale_loss, then step."""
    event, scale, after = history[-1], _scale_variant(history[:-1], *rule), _scale_variant(history, *rule)
    loss = torch.rand((), generator=d.gen) + 0.5
    scaled = call(scaler.scale_loss, loss.clone(), name="scale_loss")
    compare(torch.as_tensor(scaled).detach().reshape(()), loss * scale, f"scale_loss after events {history[:-1]}",
            "scale_loss multiplies the loss by the current scale.")
    # Small fp16 gradients, as backward of the scaled loss would give them.
    true = [d.randn(3, 4) * 1e-5, d.randn(5) * 1e-3]
    grads = [(t * scale).clamp(-6e4, 6e4).half() for t in true]
    i = len(history) - 1
    if event != "ok":
        grads[i % 2].view(-1)[i % grads[i % 2].numel()] = float(event)
    got = call(scaler.step, [g.clone() for g in grads], name="DynamicLossScaler.step")
    if event != "ok":
        expect(got is None, f"{what}: step returned gradients although one was "
                            f"{'NaN' if event == 'nan' else 'an infinite gradient'} (events {history}).",
               "skip the step when a gradient is NaN too (return None): NaN is not finite either; test with "
               "torch.isfinite, not only isinf." if event == "nan" else
               "skip the step when any gradient is inf or NaN: return None.")
        return
    expect(got is not None, f"{what}: step skipped a step whose gradients were all finite (events {history}).",
           "skip only when some gradient is inf or NaN.")
    expect(isinstance(got, (list, tuple)) and len(got) == len(grads),
           f"{what}: step should return one gradient per gradient given.", "return the list of unscaled gradients.")
    for a, g in zip(got, grads):
        expect(a.dtype == torch.float32, f"{what}: step returned {a.dtype} gradients.",
               "return float32 gradients: convert before dividing (g.float() / scale).")
        want = g.float() / scale
        # No absolute tolerance: the true gradients are of size 1e-5, and fp16's rounding of them is the mistake.
        compare(a.detach(), want, f"{what}: the unscaled gradients (events {history})",
                "convert the fp16 gradients to float32 before dividing: small gradients divided in fp16 lose their "
                "precision (they underflow).", variants=[
                    (want * scale * scale, "the gradients were multiplied by the scale: unscale by dividing by the "
                                           "scale, grad / scale."),
                    (want * scale / after if after != scale else None,
                     "unscale with the scale the loss was multiplied by, before changing the scale.")],
                tol=(0.0, 1e-3))


def check_loss_scaler(DynamicLossScaler, hidden: bool = False) -> None:
    d = draw("loss_scaler", hidden)
    for *rule, events in _scaler_configs(d):
        what = ("DynamicLossScaler(init_scale={:g}, growth_factor={:g}, backoff_factor={:g}, growth_interval={})"
                .format(*rule))
        with forbid(*_SCALER_BUILTINS, exercise="the dynamic loss scaler"):
            scaler = call(DynamicLossScaler, *rule, name="DynamicLossScaler(...)")
            for i in range(len(events)):
                history = events[:i + 1]
                _scaler_step(scaler, d, history, rule, what)
                compare(float(scaler.scale), _scale_variant(history, *rule),
                        f"{what}: the scale after the events {history}", "count consecutive finite steps; when the "
                        "count reaches growth_interval, multiply the scale by growth_factor and reset the count; an "
                        "overflow resets it too.",
                        variants_of(lambda v: _scale_variant(history, *rule, v), _SCALER_HINTS))

# ----------------------------------------------------------------------------- exercise 9

def _round_trip(checkpoint, what: str) -> dict:
    """torch.save then torch.load(weights_only=True): what a real resumption goes through."""
    import io

    expect(isinstance(checkpoint, dict), f"{what}: the checkpoint should be a dict, got {type(checkpoint).__name__}.",
           "return (losses, checkpoint) with checkpoint a dict of tensors, numbers, lists and dicts.")
    buffer = io.BytesIO()
    try:
        torch.save(checkpoint, buffer)
        buffer.seek(0)
        return torch.load(buffer, weights_only=True)
    except Exception as err:  # noqa: BLE001 - any failure here is the answer's
        fail(f"{what}: the checkpoint could not be saved and loaded back ({type(err).__name__}: {err}).",
             "keep only tensors, numbers, strings, lists and dicts in the checkpoint (state_dict(), "
             "generator.get_state(), torch.get_rng_state(), plain ints).")


def _train_call(train, model, tokens, steps, rng: Draw, what: str, expected: int, **kwargs) -> tuple[list, object]:
    """Your train on the model, the global RNG (dropout's masks) seeded from ``rng``: (losses, checkpoint)."""
    with rng.seeded():
        out = call(train, model, tokens.clone(), steps, name="train", **kwargs)
    losses, checkpoint = expect_tuple(out, "losses, checkpoint", "train",
                                      "return the list of losses and the checkpoint dict.")
    losses = list(losses)
    expect(len(losses) == expected, f"{what} ran {len(losses)} steps, expected {expected}.",
           "store the step number in the checkpoint and continue from it; with stop_at, the last step run is "
           "stop_at - 1." if "stop_at" in kwargs else "append loss.item() once per step and return the list.")
    return losses, checkpoint


class _GoesOn:
    """The grader's side of :class:`course.goes_on.GoesOn`, around a call that returns a checkpoint: once it
    returns, the model's parameters are negated (in the kernel before the checkpoint is sent, when grading;
    here otherwise), as if training went on; :meth:`restore` puts them back once the checkpoint is saved."""

    def __init__(self, model: nn.Module) -> None:
        self.model, self.kernel = model, False

    def absorb(self, state: dict) -> None:
        self.kernel = self.kernel or bool(isinstance(state, dict) and state.get("touched"))

    @contextlib.contextmanager
    def around(self):
        from .. import probe
        from ..goes_on import negate

        with probe.kernel_context("course.goes_on:GoesOn", owner=self):
            yield self
        negate(self.model)                # the kernel's negation came back to our copy: undo it; or do it here

    def restore(self) -> None:
        from ..goes_on import negate

        if not self.kernel:
            negate(self.model)


def _aliased(checkpoint, model: nn.Module) -> bool:
    """Whether the checkpoint holds a parameter as it was after the model was negated: a live tensor."""
    params = [p.detach() for p in model.parameters() if p.detach().abs().sum() > 0]
    tensors = [t for t in tree_leaves(checkpoint) if isinstance(t, torch.Tensor) and t.is_floating_point()]
    return any(t.shape == p.shape and torch.equal(t, -p) and not torch.equal(t, p) for t in tensors for p in params)


def _tiny_lm(d: Draw, vocab: int, dropout: float) -> TinyLM:
    with d.seeded():
        return TinyLM(vocab, 12, dropout)


def _resume_experiment(train, d: Draw, tokens, vocab, dropout, lr_pair, steps, stops, kw):
    """An uninterrupted run, and a run stopped at each of ``stops`` then resumed on a fresh model:
    (full losses, resumed losses, the two final models, (the first stop's checkpoint as the resumed
    call left it, a copy of it as saved))."""
    full_model, model = _tiny_lm(d.sub("init"), vocab, dropout), _tiny_lm(d.sub("init"), vocab, dropout)
    args = dict(max_lr=lr_pair[0], min_lr=lr_pair[1], **kw)
    full, _ = _train_call(train, full_model, tokens, steps, d.sub("rng0"), f"train(..., num_steps={steps})", steps,
                          **args)
    pieces, checkpoint, start, first = [], None, 0, None
    for k, stop in enumerate(stops + [None]):
        if k > 0:
            model = _tiny_lm(d.sub(f"init{k}"), vocab, dropout)      # a fresh model: resuming must restore it
        end = stop if stop is not None else steps
        # after a stop, another global RNG (d.sub("rng{k}")): resuming must restore it
        with _GoesOn(model).around() as goes_on:
            part, saved = _train_call(train, model, tokens, steps, d.sub(f"rng{k}"),
                                      f"train({'resume_from=<checkpoint of step ' + str(start) + '>, ' if k else ''}"
                                      f"stop_at={stop}) (steps {start} to {end - 1})", end - start,
                                      resume_from=checkpoint, stop_at=stop, **args)
        checkpoint = _round_trip(saved, f"the checkpoint after step {end}")
        goes_on.restore()
        expect(not _aliased(checkpoint, model), f"the checkpoint after step {end} changed when the model was "
               "trained on after train returned: it holds the model's own tensors.", "state_dict() returns the "
               "model's live tensors, which the next step changes: clone them into the checkpoint "
               "({k: v.clone() for k, v in model.state_dict().items()}).")
        first = (checkpoint, copy.deepcopy(checkpoint)) if first is None else first     # as given, and as saved
        pieces += part
        start = end
    return full, pieces, full_model, model, first


def check_train_resume(train, cross_entropy=None, random_batch=None, AdamW=None, param_groups=None, lr_at=None,
                       hidden: bool = False) -> None:
    """The earlier answers, when given, are those train calls: a failure that one of them explains
    (an optimizer whose step counts cannot be saved, for example) is blamed on it."""
    with earlier_first(*earlier_answers("train", ("calls your cross_entropy", 1, cross_entropy, check_cross_entropy),
                                        ("calls your random_batch", 2, random_batch, check_random_batch),
                                        ("calls your AdamW", 3, AdamW, check_adamw),
                                        ("calls your param_groups", 4, param_groups, check_param_groups),
                                        ("calls your lr_at", 5, lr_at, check_lr_at))):
        _check_train_resume(train, hidden)


_TRAIN_HINTS = [
    ("default_betas", "the optimizer's betas are (0.9, 0.95) in this loop, not AdamW's default (0.9, 0.999)."),
    ("constant_lr", "the learning rate never changed: set every group's lr to lr_at(step, ...) at the start of each "
                    "step."),
    ("eval_mode", "the model ran without dropout: call model.train() before the steps (the loss is measured with "
                  "dropout on)."),
]


def _reference_losses(model: nn.Module, tokens, vocab, lr_pair, steps, rng: Draw, kw, variant: str = "ok"):
    """The losses (steps,) of exercise 9's steps on ``model``, run with PyTorch's AdamW and cross-entropy,
    the course's groups (nn.Linear matrices decayed by 0.1, the rest not), the schedule, random_batch's
    draw and the global RNG seeded from ``rng``; or with one known slip (``variant``, used to name it)."""
    options = {"batch_size": 4, "block_size": 8, "warmup_steps": 3, "seed": 0, **kw}
    decayed = ({id(m.weight) for m in model.modules() if isinstance(m, nn.Linear)} -
               {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)})
    groups = [{"params": [p for p in model.parameters() if id(p) in decayed], "weight_decay": 0.1},
              {"params": [p for p in model.parameters() if id(p) not in decayed], "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=lr_pair[0],
                                  betas=(0.9, 0.999) if variant == "default_betas" else (0.9, 0.95))
    batches = torch.Generator().manual_seed(options["seed"])      # the run's own, as train makes it
    model.train(variant != "eval_mode")
    losses = []
    with rng.seeded():
        for step in range(steps):
            for group in optimizer.param_groups:
                group["lr"] = (lr_pair[0] if variant == "constant_lr" else
                               _lr_oracle(step, lr_pair[0], lr_pair[1], options["warmup_steps"], steps))
            x, y = _batch_from(tokens, options["batch_size"], options["block_size"], batches)
            loss = F.cross_entropy(model(x).reshape(-1, vocab), y.reshape(-1))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    return torch.tensor(losses)


def _resume_hint(train, d: Draw, tokens, vocab, steps, stops, kw, first_bad: int) -> str:
    """Which part of the state the resumed run lost: runs in which only some of it matters, no dropout."""
    same = torch.zeros(300, dtype=torch.long)      # every window is the same: the data position cannot matter
    runs = {"constant_lr": (same, (5e-3, 5e-3), {**kw, "warmup_steps": 0}),
            "schedule": (same, (1e-2, 1e-3), {**kw, "warmup_steps": 0}), "data": (tokens, (1e-2, 1e-3), kw)}
    done: dict = {}

    def differs(name: str, at: int | None = None) -> bool:
        if name not in done:
            data, lr_pair, options = runs[name]
            done[name] = _resume_experiment(train, d, data, vocab, 0.0, lr_pair, steps, stops, options)[:2]
        full, pieces = done[name]
        return pieces != full if at is None else pieces[at] != full[at]

    return diagnose(first_bad, [
        (when(lambda bad: bad < stops[0]), "the run must be a function of its arguments: create the data generator "
                                           "with torch.Generator().manual_seed(seed) inside train, and do not draw "
                                           "from it anywhere else."),
        (when(lambda _: differs("constant_lr", stops[0])),
         "the model's weights were not restored: save model.state_dict() and load it with model.load_state_dict() "
         "when resuming."),
        (when(lambda _: differs("constant_lr")), "the optimizer's state was not restored: the moments (exp_avg, "
                                                 "exp_avg_sq) and step counts of every parameter must be saved and "
                                                 "loaded, or the resumed steps differ."),
        (when(lambda _: differs("schedule")), "the schedule restarted: save the step number and continue "
                                              "lr_at(step, ...) from it."),
        (when(lambda _: differs("data")), "the data position was not restored: save the batch generator's state "
                                          "(generator.get_state()) and restore it (generator.set_state(...)) so the "
                                          "resumed run draws the same batches.")],
        "the global RNG (dropout's masks) was not restored: save torch.get_rng_state() and restore it with "
        "torch.set_rng_state() when resuming.")


def _train_resume_setup(d: Draw) -> tuple:
    """(tokens, vocab, steps, stops, options of train) of the visible or the hidden test."""
    if not d.hidden:
        return d.randint(0, 16, (300,)), 16, 12, [5], {}
    rng = d.rng
    vocab = rng.randrange(8, 40)
    tokens, steps = d.randint(0, vocab, (rng.randrange(60, 400),)), rng.randrange(9, 16)
    a = rng.randrange(1, steps - 3)
    stops = [a, rng.randrange(a + 1, steps - 1)]           # interrupted twice
    return tokens, vocab, steps, stops, {"batch_size": rng.randrange(2, 6), "block_size": rng.randrange(3, 10),
                                         "warmup_steps": rng.randrange(1, 5), "seed": rng.randrange(1000)}


def _first_difference(xs: list, ys: list) -> int:
    """The first index where two runs' losses differ (the shorter one's length when one is a prefix)."""
    return next((i for i, (a, b) in enumerate(zip(xs, ys)) if a != b), min(len(xs), len(ys)))


def _check_train_resume(train, hidden: bool) -> None:
    d = draw("train_resume", hidden)
    tokens, vocab, steps, stops, kw = _train_resume_setup(d)
    with forbid(*_ADAMW_BUILTINS, exercise="the training loop with your own AdamW"):
        full, pieces, full_model, resumed, first = _resume_experiment(train, d, tokens, vocab, 0.2, (1e-2, 1e-3),
                                                                      steps, stops, kw)
    # The uninterrupted run is the spec's loop: compared with one built from PyTorch's parts.
    reference = lambda variant="ok": _reference_losses(_tiny_lm(d.sub("init"), vocab, 0.2), tokens, vocab,  # noqa: E731
                                                       (1e-2, 1e-3), steps, d.sub("rng0"), kw, variant)
    compare(torch.tensor(full), reference(), "the uninterrupted run's losses (by step), against the spec's loop run "
            "with PyTorch's AdamW and cross-entropy",
            "follow the spec's step in order: the groups' lr from lr_at(step, ..., num_steps), then the batch from "
            "random_batch with the run's own generator, the loss in train mode, zero_grad, backward, step; the "
            "optimizer is AdamW(param_groups(model, 0.1), lr=max_lr, betas=(0.9, 0.95)).",
            variants_of(reference, _TRAIN_HINTS))
    if pieces == full and matches(_cat(resumed.parameters()), _cat(full_model.parameters()), (0.0, 0.0)):  # bit for bit
        expect(len(set(full)) > 1, "the losses did not change during training.", "call optimizer.step() every step.")
        expect(_same_data(*first), f"resuming from the checkpoint of step {stops[0]} changed that checkpoint (the "
               "tensors it was given were updated in place).", "clone what you load from the checkpoint (the "
               "optimizer's moments): a checkpoint is resumed again after a failed run, and must not change.")
        with forbid(*_ADAMW_BUILTINS, exercise="the training loop with your own AdamW"):
            _check_checkpoint_alone(train, d, tokens, vocab, steps, stops[0], kw, full, first[1])
        return
    first_bad = _first_difference(pieces, full)
    saved_at = max([s for s in stops if s <= first_bad] or stops[:1])
    where = (f"the run stopped at step {stops[0]} gave other losses than the uninterrupted run before stopping"
             if first_bad < stops[0] else
             f"resuming from the checkpoint saved at step {saved_at} did not continue the run exactly")
    got, want = (xs[first_bad] if first_bad < len(xs) else None for xs in (pieces, full))
    with forbid(*_ADAMW_BUILTINS, exercise="the training loop with your own AdamW"):
        fail(f"{where}: the first different loss is at step {first_bad} ({got!r} instead of {want!r}).",
             _resume_hint(train, d, tokens, vocab, steps, stops, kw, first_bad))

# Of a checkpoint, what is state (taken from the run being resumed) rather than a label: tensors,
# and sequences of numbers longer than this (a generator's state written out as a list).
_STATE_LENGTH = 16


def _same_data(a, b) -> bool:
    """Whether two checkpoints hold the same data, tensors bit for bit."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype and \
            a.shape == b.shape and bool(torch.equal(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return list(a) == list(b) and all(_same_data(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and type(a) is type(b):
        return len(a) == len(b) and all(_same_data(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def _is_state(value) -> bool:
    return isinstance(value, torch.Tensor) or (isinstance(value, (list, tuple, bytes)) and len(value) > _STATE_LENGTH
                                               and all(isinstance(v, (int, float)) for v in value))


def _transplant(labels, state, path: str = "checkpoint"):
    """``labels``' layout and its numbers and strings, with the state (:func:`_is_state`) of
    ``state`` at the same places: two checkpoints of runs stopped at the same step."""
    if _is_state(labels) or _is_state(state):
        if not (_is_state(labels) and _is_state(state)):
            raise ValueError(path)
        return state
    if isinstance(labels, dict) and isinstance(state, dict) and len(labels) == len(state):
        return {k: _transplant(v, w, f"{path}[{k!r}]") for (k, v), w in zip(labels.items(), state.values())}
    if isinstance(labels, (list, tuple)) and type(labels) is type(state) and len(labels) == len(state):
        return type(labels)(_transplant(v, w, f"{path}[{i}]") for i, (v, w) in enumerate(zip(labels, state)))
    if isinstance(labels, (dict, list, tuple)) or isinstance(state, (dict, list, tuple)):
        raise ValueError(path)
    return labels


_OUTSIDE = ("the resumed run continued state kept outside the checkpoint it was given (a module-level dict, a "
            "global, a function or class attribute, a default argument, found through an id or key that the "
            "checkpoint holds): a real resumption starts in a new process, where none of that exists. Put the "
            "state itself in the checkpoint (tensors: the weights, the optimizer's moments, the generators' "
            "states) and restore everything from it.")


def _check_checkpoint_alone(train, d: Draw, tokens, vocab, steps, stop, kw, full, first) -> None:
    """Nothing but the checkpoint carries the run: a second run B (other weights, data seed and
    dropout stream) stops at the same step; resumed from B's checkpoint with run A's tensors put
    in (B's numbers, strings and layout kept), the run must continue A's run bit for bit. State
    held in the kernel between calls (found through a key in B's checkpoint, or the last run's)
    continues B's run instead."""
    args = dict(max_lr=1e-2, min_lr=1e-3, **kw)
    _, saved = _train_call(train, _tiny_lm(d.sub("initB"), vocab, 0.2), tokens, steps, d.sub("rngB"),
                           f"train(stop_at={stop}) of a second run", stop, stop_at=stop,
                           **{**args, "seed": kw.get("seed", 0) + 1})
    labels = _round_trip(saved, f"the checkpoint of a second run after step {stop}")
    try:
        mixed = _transplant(labels, first)
    except ValueError as err:
        fail(f"two runs of the same model and settings stopped at step {stop} gave checkpoints of different layouts "
             f"(they differ at {str(err)[:200]}).", "the checkpoint's layout (its keys, the lengths of its lists) "
             "should depend only on the model and the step; keep ids and run labels out of its structure.")
    part, _ = _train_call(train, _tiny_lm(d.sub("initH"), vocab, 0.2), tokens, steps, d.sub("rngH"),
                          f"train(resume_from=<checkpoint of step {stop}>) (steps {stop} to {steps - 1})", steps - stop,
                          resume_from=mixed, **args)
    if part != full[stop:]:
        bad = _first_difference(part, full[stop:]) + stop
        fail(f"resumed from the checkpoint of step {stop} of one run, whose numbers, strings and layout came from "
             f"another run's checkpoint of the same step, the run gave another loss at step {bad} "
             f"({part[bad - stop]!r} instead of {full[bad]!r}).", _OUTSIDE)

# ----------------------------------------------------------------------------- exercise 10

_TINY_PARTS = (("tok", nn.Embedding), ("drop", nn.Dropout), ("ln1", nn.LayerNorm), ("qkv", nn.Linear),
               ("proj", nn.Linear), ("ln2", nn.LayerNorm), ("up", nn.Linear), ("down", nn.Linear),
               ("ln_f", nn.LayerNorm))


def _sinusoids(T: int, d: int, dtype: torch.dtype, variant: str = "ok") -> torch.Tensor:
    """Chapter 2's table, written independently: PE[t, 2i] = sin(t w_i), PE[t, 2i+1] = cos(t w_i)."""
    t = torch.arange(T, dtype=torch.float64)[:, None]
    w = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    angles = t * w                                                        # (T, d/2)
    if variant == "halves":
        return torch.cat([angles.sin(), angles.cos()], dim=-1).to(dtype)
    return torch.stack([angles.sin(), angles.cos()], dim=-1).reshape(T, d).to(dtype)


def _tiny_lm_oracle(m: nn.Module, ids: torch.Tensor, variant: str = "ok", drop: float = 0.0) -> torch.Tensor:
    """The spec's forward pass from the module's own parameters, with PyTorch's functional parts
    (``variant``: one known mistake, used to name it); ``drop``: train mode's dropout, its mask
    drawn from the global RNG as nn.Dropout draws it."""
    W, T = m.tok.weight, ids.shape[1]
    d = W.shape[1]
    x = F.embedding(ids, W) * (1.0 if variant == "no_sqrt_d" else math.sqrt(d)) + _sinusoids(T, d, W.dtype, variant)
    x = F.dropout(x, drop) if drop else x                                          # (B, T, d)
    ln = lambda mod, h: F.layer_norm(h, (d,), mod.weight, mod.bias, mod.eps)     # noqa: E731

    def attend(h):                                                                 # proj(attention(h))
        q, k, v = F.linear(h, m.qkv.weight, m.qkv.bias).split(d, dim=-1)       # (B, T, d) each
        scale = {"scale": 1.0} if variant == "no_attention_scale" else {}
        out = F.scaled_dot_product_attention(q, k, v, is_causal=variant != "not_causal", **scale)
        return F.linear(out, m.proj.weight, m.proj.bias)

    def mlp(h):
        up = F.gelu(F.linear(h, m.up.weight, m.up.bias), approximate="tanh" if variant == "tanh_gelu" else "none")
        return F.linear(up, m.down.weight, m.down.bias)

    for norm, branch in ((m.ln1, attend), (m.ln2, mlp)):
        if variant == "post_ln":
            x = ln(norm, x + branch(x))
        elif variant == "residual_from_norm":
            x = (h := ln(norm, x)) + branch(h)
        else:
            x = x + branch(ln(norm, x))
    return F.linear(ln(m.ln_f, x), W)                                              # (B, T, V), tied

_TINY_HINTS = [
    ("not_causal", "position t saw later tokens: mask the scores above the diagonal with -inf before the softmax "
                   "(chapter 3), so that token t attends to tokens 0..t only."),
    ("no_sqrt_d", "the embedding rows are multiplied by sqrt(d_model) before the positions are added (chapter 1)."),
    ("halves", "the sinusoids interleave: PE[t, 2i] = sin(t w_i), PE[t, 2i+1] = cos(t w_i) (chapter 2), not all "
               "sines then all cosines."),
    ("no_attention_scale", "divide the attention scores by sqrt(d_model) (one head of d_model features) before the "
                           "softmax."),
    ("post_ln", "the block is Pre-LN (chapter 4): x = x + attn(ln1(x)), then x = x + mlp(ln2(x)); the norms act on "
                "the branch's input, and the residual stream itself is never normalised inside the block."),
    ("residual_from_norm", "the residual adds the branch to x itself, not to the normalised x: h = ln1(x), then "
                           "x = x + proj(attention(h)) (and the same with ln2 for the MLP)."),
    ("tanh_gelu", "the spec's GELU is the exact one, x * Phi(x) with the normal CDF (F.gelu's default), not the "
                  "tanh approximation."),
]


class _TinyReference(nn.Module):
    """The spec's layers, here in the grader: a copy of the student's weights runs the oracle."""

    def __init__(self, vocab: int, d: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.ln1, self.ln2, self.ln_f = nn.LayerNorm(d), nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.up, self.down = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return _tiny_lm_oracle(self, ids)


def _tiny_copy(model: nn.Module) -> _TinyReference:
    """The student's weights, read through the spec's names, in a module of the grader's own."""
    ref = _TinyReference(*model.tok.weight.shape).to(model.tok.weight.detach().dtype)   # the weight's current dtype
    ref.load_state_dict({k: v for k, v in model.state_dict().items() if k in ref.state_dict()})
    return ref


def _build_tiny(TinyCausalLM, vocab: int, d: int, block: int, init: Draw, dropout: float = 0.0) -> nn.Module:
    with init.seeded():    # the cases below were chosen on the weights this seed gives
        model = call(TinyCausalLM, vocab, d, block, name="TinyCausalLM", **({"dropout": dropout} if dropout else {}))
    name = f"TinyCausalLM(vocab_size={vocab}, d_model={d}, block_size={block})"
    expect(isinstance(model, nn.Module), "TinyCausalLM(...) should build an nn.Module.",
           "subclass nn.Module and call super().__init__() first.")
    for part, kind in _TINY_PARTS:
        expect(isinstance(getattr(model, part, None), kind), f"{name} has no {kind.__name__} named {part!r}.",
               "keep the attribute names of the spec (the tests read the weights through them).")
    expect(tuple(model.qkv.weight.shape) == (3 * d, d) and tuple(model.up.weight.shape) == (4 * d, d) and
           tuple(model.down.weight.shape) == (d, 4 * d) and tuple(model.tok.weight.shape) == (vocab, d),
           f"{name} has layers of other shapes than the spec's.", "qkv: nn.Linear(d_model, 3 * d_model); up: "
           "nn.Linear(d_model, 4 * d_model); down: nn.Linear(4 * d_model, d_model); tok: nn.Embedding(vocab_size, "
           "d_model).")
    want = vocab * d + 3 * 2 * d + (3 * d * d + 3 * d) + (d * d + d) + (4 * d * d + 4 * d) + (4 * d * d + d)
    compare(sum(p.numel() for p in model.parameters()), want,
            f"the number of parameters of TinyCausalLM(vocab_size={vocab}, d_model={d})",
            "build exactly the layers of the spec, with biases (PyTorch's defaults), and no output matrix of its own.",
            variants=[(v, "the output layer is tied to the embedding (chapter 1): logits = ln_f(x) @ tok.weight.T, no "
                          "separate head matrix.") for v in (want + vocab * d, want + vocab * d + vocab)])
    std = float(model.tok.weight.detach().double().std())
    expect(0.7 < std * math.sqrt(d) < 1.3,
           f"the embedding table of TinyCausalLM(vocab_size={vocab}, d_model={d}) has std {std:.3g}, expected about "
           f"d_model ** -0.5 = {d ** -0.5:.3g}.",
           "initialise tok.weight with nn.init.normal_(..., std=d_model ** -0.5): multiplied by sqrt(d_model) its "
           "rows have unit size, and the tied output layer starts with small logits (a loss near log V).")
    return model


_TINY_NAN = (when(lambda logits: not torch.isfinite(logits).all()), "a query row whose keys are all masked gives a "
             "softmax of 0/0: token t attends to tokens 0..t, itself included, so mask only the scores strictly above "
             "the diagonal (triu with diagonal=1).")


def _tiny_forward_case(model: nn.Module, ids: torch.Tensor, what: str, dtype: torch.dtype = torch.float32) -> None:
    model.eval()
    got = call(model, ids.clone(), name="TinyCausalLM.forward")
    expect_tensor(got, (*ids.shape, model.tok.weight.shape[0]), f"the logits of {what}")
    expect(got.dtype == dtype, f"the logits of {what} are {got.dtype}, expected {dtype} (the model's dtype).",
           "build the position table in the model's dtype (a buffer registered in __init__ follows model.to(...)).")
    ref = _tiny_copy(model)
    with torch.no_grad():
        compare(got.detach(), _tiny_lm_oracle(ref, ids),
                f"the logits of {what}, against the spec's forward (PyTorch's functional parts on your weights)",
                "follow the spec's forward in order: tok(ids) * sqrt(d_model) + PE, dropout, "
                "x + proj(attention(ln1(x))), x + down(gelu(up(ln2(x)))), ln_f, then the tied output tok.weight.T.",
                [_TINY_NAN, *variants_of(lambda v: _tiny_lm_oracle(ref, ids, v), _TINY_HINTS)],
                # float64: 1e-6, so that a position table built in float32 and converted with the model still passes
                tol=None if dtype == torch.float32 else (1e-6, 1e-6))


_DROP_HINTS = {False: "dropout stayed on in eval mode: use self.drop (nn.Dropout follows model.train() and "
                      "model.eval()), or F.dropout(x, p, training=self.training).",
               True: "dropout was never applied in train mode: x = self.drop(tok(ids) * sqrt(d_model) + PE[:T]) "
                     "(step 1 of the spec)."}


def _tiny_dropout_case(model: nn.Module, ids: torch.Tensor, p: float, masks: Draw, what: str) -> None:
    """With dropout p: eval mode is the spec's forward without it; train mode drops x once, after the
    positions are added, with the mask the global RNG (seeded from ``masks``) gives nn.Dropout."""
    ref = _tiny_copy(model)

    def oracle(drop: float) -> torch.Tensor:
        with torch.no_grad(), masks.seeded():
            return _tiny_lm_oracle(ref, ids, drop=drop)

    for training in (False, True):
        model.train(training)
        with masks.seeded():
            got = call(model, ids.clone(), name="TinyCausalLM.forward")
        compare(got.detach() if isinstance(got, torch.Tensor) else got, oracle(p if training else 0.0),
                f"the logits of {what} (dropout={p}) in {'train' if training else 'eval'} mode",
                "dropout acts once, on x right after the positions are added, through self.drop (step 1 of the "
                "spec), and only in train mode; forward has no other randomness.",
                variants=[(lambda: oracle(0.0 if training else p), _DROP_HINTS[training])])


def _tiny_run(TinyCausalLM, train, d: Draw, config: tuple, earlier: tuple) -> None:
    """Your train on a fresh model of yours, next to the spec's loop with PyTorch's AdamW on a copy of its
    weights; a failure that exercise 9's tests explain is blamed on train."""
    vocab, width, block, init = config
    with own_fault():
        student = _build_tiny(TinyCausalLM, vocab, width, block, init.sub("run"))
    fresh = _tiny_copy(student).train()
    tokens = d.randint(0, vocab, (d.rng.randrange(80, 200) if d.hidden else 120,))
    steps = 6 if not d.hidden else d.rng.randrange(5, 9)
    kw = {"block_size": block, "batch_size": 3, "warmup_steps": 2, "seed": init.seed % 1000}
    with earlier_first(*earlier_answers("the run of your TinyCausalLM", (
            "calls your train", 9, train, lambda t: check_train_resume(t, *earlier)))):
        with forbid(*_ADAMW_BUILTINS, exercise="the training loop with your own AdamW"):
            losses, _ = _train_call(train, student, tokens, steps, init.sub("rng"), f"train(..., num_steps={steps})",
                                    steps, max_lr=1e-2, min_lr=1e-3, **kw)
        compare(torch.tensor(losses), _reference_losses(fresh, tokens, vocab, (1e-2, 1e-3), steps, init.sub("rng"), kw),
                f"the losses (by step) of train on your TinyCausalLM(vocab_size={vocab}, d_model={width}, "
                f"block_size={block}), against the spec's loop with PyTorch's AdamW on the same model",
                "the model must be a pure function of its weights and input: no randomness of its own in forward "
                "(dropout only through self.drop), and no state kept between calls.")


def check_tiny_lm(TinyCausalLM, train=None, cross_entropy=None, random_batch=None, AdamW=None, param_groups=None,
                  lr_at=None, hidden: bool = False) -> None:
    """The model first (its own spec, an oracle from its weights), then a short run of your train on it
    next to the spec's loop built from PyTorch's parts; a failure of the run that exercise 9's tests
    explain is blamed on train."""
    d = draw("tiny_lm", hidden)
    configs = [(13, 16, 8, d.sub("init"))] if not hidden else [
        (d.rng.randrange(5, 40), d.rng.choice([8, 12, 24]), d.rng.randrange(4, 12), d.sub(f"init{k}"))
        for k in range(2)]
    for vocab, width, block, init in configs:
        with own_fault():
            model = _build_tiny(TinyCausalLM, vocab, width, block, init)
            name = f"TinyCausalLM(vocab_size={vocab}, d_model={width}, block_size={block})"
            for B, T in ((2, block), (3, max(1, block // 2))):
                _tiny_forward_case(model, d.randint(0, vocab, (B, T)), f"{name} on ids of shape {(B, T)}")
            p = d.rng.choice([0.1, 0.3, 0.5]) if hidden else 0.25
            _tiny_dropout_case(_build_tiny(TinyCausalLM, vocab, width, block, init, p), d.randint(0, vocab, (2, block)),
                               p, init.sub("masks"), name)
            if hidden:
                _tiny_forward_case(model.double(), d.randint(0, vocab, (2, block)), f"{name} in float64", torch.float64)
        if train is not None:
            _tiny_run(TinyCausalLM, train, d, (vocab, width, block, init),
                      (cross_entropy, random_batch, AdamW, param_groups, lr_at))

# ----------------------------------------------------------------------------- exercise 11

_INITIAL_VARIANTS = [   # the loss of all-zero logits with one known slip, and its hint
    (lambda V, eps, z: math.log2(V) + z * math.log2(V) ** 2,
     "the loss is in nats: use the natural logarithm (math.log), not log2."),
    (lambda V, eps, z: (1 - eps) * math.log(V) + z * math.log(V) ** 2,
     "label smoothing changes nothing here: with all logits equal, -log p_j = log V for every class j, the target "
     "and the uniform term alike, so (1 - eps) and eps add back to 1."),
    (lambda V, eps, z: math.log(V), "the z-loss is not 0 at initialisation: log Z = log sum_j exp(0) = log V, so it "
                                    "adds z_loss * (log V)**2."),
    (lambda V, eps, z: math.log(V) + z * math.log(V),
     "the z-loss squares log Z: z_loss * (log V)**2, not z_loss * log V."),
]


def check_initial_loss(predicted_initial_loss, cross_entropy=None, hidden: bool = False) -> None:
    """The prediction is graded against the hand-derived value; the measurement (your cross_entropy
    on all-zero logits) is printed by the notebook's next cell, once the prediction passes."""
    cases = draw("initial_loss", hidden).cases([(50257, 0.0, 0.0), (50257, 0.1, 1e-4), (65, 0.2, 0.01)], lambda d: (
        d.rng.randrange(2, 300_000), d.rng.choice([0.0, 0.05, 0.1, 0.3]), d.rng.choice([0.0, 1e-4, 1e-3, 0.1])), 4)
    for V, eps, z in cases:
        shown = f"predicted_initial_loss(V={V}, label_smoothing={eps}, z_loss={z})"
        with unmeasured("predicted_initial_loss"):
            got = call(predicted_initial_loss, V, eps, z, name="predicted_initial_loss")
        want = math.log(V) + z * math.log(V) ** 2           # -log(1/V), plus z_loss * (log Z)**2 with Z = V
        compare(expect_number(got, shown, "return a Python number computed with math (math.log), not a tensor."),
                want, shown, "at initialisation every logit is 0, so every class has probability 1/V: "
                "work out -log p, then log Z, as expressions in V.", variants=[
                    *variants_of(lambda slip: slip(V, eps, z), _INITIAL_VARIANTS),
                    (when(lambda value: math.isclose(value, want, rel_tol=1e-4)),
                     "close, but rounded: return the expression itself (math.log(V) ...), not a decimal or a float32 "
                     "measurement.")])


def measure_initial_loss(cross_entropy, V: int = 50257, eps: float = 0.1, z: float = 1e-4) -> float:
    """Your cross_entropy on all-zero logits (B, T, V) = (2, 8, V), a quarter of the targets padding."""
    targets = draw("initial_loss/measure", False).randint(0, V, (2, 8))
    targets[:, -2:] = -100
    return float(cross_entropy(torch.zeros(2, 8, V, dtype=torch.float64), targets, -100, eps, z_loss=z))

# ----------------------------------------------------------------------------- exercise 12

# (vocab_size, n_tokens, n_bytes): the case the notebook asks about (GPT-2's vocabulary on a text of 4,200 bytes cut
# into 1,000 tokens), and a character-level one where a character is a byte.
UNIFORM_CASE = (50257, 1000, 4200)
_UNIFORM_CHARS = (65, 1000, 1000)
LN2 = math.log(2)


def uniform_bpb_answer(vocab_size: int, n_tokens: int, n_bytes: int) -> float:
    """Bits per byte of a model that gives each of ``vocab_size`` tokens probability 1/V: log2 V bits per token."""
    return n_tokens * math.log2(vocab_size) / n_bytes


def _uniform_judge(config: tuple, value) -> None:
    V, n, b = config
    guesses = [
        (n * math.log(V) / b, "that is in nats per byte: bits use log2 (a loss in nats divided by ln 2)."),
        (math.log2(V), f"that is bits per *token*: the text has {n} tokens for {b} bytes, so the bits of all the tokens "
                       "are shared among the bytes (times n_tokens / n_bytes)."),
        (math.log(V), "that is the loss per token in nats (log V): bits per byte counts bits (log2), per byte of text."),
        (b * math.log2(V) / n, "the ratio is upside down: the total is n_tokens * log2(V) bits, divided by n_bytes."),
        (float(V), "that is the uniform model's perplexity (V equally likely tokens); bits per byte is the information "
                   "per byte: log2(V) bits per token, spread over the bytes."),
        (n * math.log2(V) / b / 8, "bits, not bytes of information: do not divide by 8."),
    ]
    judge_prediction("predicted_uniform_bits_per_byte", value, uniform_bpb_answer(V, n, b),
                     unit_hint="return your prediction as a number of bits per byte.",
                     asked=f"the bits per byte of a uniform model (V = {V}, {n} tokens, {b} bytes)", exact=1e-9,
                     close=0.01, close_hint="a rounded decimal is not the prediction: return the arithmetic that gives "
                     "it, as a Python expression (math.log2(...) and the like), exact to float precision.",
                     guesses=guesses, near=0.0, fallback="a uniform model gives each token probability 1/V: its loss "
                     "per token is log V nats; turn the loss of all the tokens into bits, then divide by the bytes.")


def _uniform_configs(hidden: bool) -> list[tuple]:
    def drawn(d: Draw) -> tuple:
        n = d.rng.randrange(1, 5000)
        return d.rng.randrange(2, 300_000), n, max(1, round(n * d.rng.uniform(0.9, 6.0)))
    return draw("uniform_bits_per_byte", hidden).cases([UNIFORM_CASE, _UNIFORM_CHARS], drawn, 4)


def _check_uniform_prediction(predicted_uniform_bits_per_byte, hidden: bool = False) -> None:
    judge_configured("predicted_uniform_bits_per_byte", predicted_uniform_bits_per_byte, _uniform_configs(hidden),
                     uniform_bpb_answer, _uniform_judge, shown=lambda c: "vocab_size={}, n_tokens={}, "
                     "n_bytes={}".format(*c))


def uniform_prediction_passes(predicted_uniform_bits_per_byte) -> bool:
    """For the exercise's demo, which shows the measurement only once the prediction passes its visible test."""
    return passes(_check_uniform_prediction, predicted_uniform_bits_per_byte)


_ALPHABET = "abcdefghij klmnop,.\n" + "éüñçø" + "αβγωλ" + "жщ" + "中文字" + "🙂🚀"    # 1, 2, 3 and 4 bytes in UTF-8


def _as_number(got, what: str) -> float:
    return expect_number(got.item() if isinstance(got, torch.Tensor) and got.numel() == 1 else got, what,
                         "return a Python float (float(...) of a 0-d tensor, or math on Python numbers).")


def _reporting_cases(d: Draw) -> list[tuple]:
    """(per-token losses, text): ASCII and not, float32 and float64; hidden, drawn texts and losses."""
    def drawn(d: Draw) -> tuple:
        text = "".join(d.rng.choice(_ALPHABET) for _ in range(d.rng.randrange(1, 400)))
        n = d.rng.randrange(1, len(text.encode("utf-8")) + 3)
        return d.uniform(0.0, 6.0, n, dtype=d.rng.choice([torch.float32, torch.float64])), text
    return d.cases([(d.uniform(0.5, 4.0, 12), "To be, or not to be: that is the question."),
                    (d.uniform(0.5, 4.0, 9, dtype=torch.float64), "naïve café, Straße, ἀρχή"),
                    (d.uniform(0.1, 2.0, 30), "中文 and 🙂 cost 3 and 4 bytes")], drawn, 4)


def check_perplexity_and_bpb(perplexity, bits_per_byte, predicted_uniform_bits_per_byte=None,
                             hidden: bool = False) -> None:
    """The prediction against the hand-derived value; perplexity and bits per byte of per-token losses against
    float64 formulas (the text's bytes in UTF-8)."""
    if predicted_uniform_bits_per_byte is not None:
        _check_uniform_prediction(predicted_uniform_bits_per_byte, hidden)
    for losses, text in _reporting_cases(draw("perplexity_bpb", hidden)):
        x, n, n_bytes, n_chars = losses.double(), losses.numel(), len(text.encode("utf-8")), len(text)
        what = f"{n} per-token losses ({str(losses.dtype)[6:]}) of the text {text[:40]!r} ({n_chars} characters, " \
               f"{n_bytes} bytes)"
        ppl = _as_number(call_on_copies(perplexity, losses, name="perplexity", hint="build new tensors."),
                         f"perplexity of {what}")
        compare(ppl, math.exp(x.mean().item()), f"perplexity of {what}", "perplexity is e to the mean loss per token "
                "(the losses are in nats).", variants=[
                    (lambda: math.exp(x.sum().item()), "the exponential of the *mean* loss per token, not of the sum: "
                                                        "perplexity does not grow with the length of the text."),
                    (lambda: 2 ** x.mean().item(), "the losses are in nats (natural log): perplexity is e ** mean, "
                                                    "not 2 ** mean."),
                    (lambda: x.exp().mean().item(), "exponentiate the mean loss; the mean of the per-token exp(loss) "
                                                     "is larger (Jensen's inequality)."),
                    (lambda: x.mean().item(), "that is the mean loss itself: perplexity is its exponential.")],
                tol=(1e-9, 1e-5))
        bpb = _as_number(call(bits_per_byte, losses.clone(), text, name="bits_per_byte"), f"bits_per_byte of {what}")
        total_bits = x.sum().item() / LN2
        compare(bpb, total_bits / n_bytes, f"bits_per_byte of {what}", "the sum of the losses (nats) over ln 2 gives "
                "bits; divide by the number of bytes of the text in UTF-8.", variants=[
                    (total_bits / n_chars, f"len(text) counts characters ({n_chars}); the text has {n_bytes} bytes "
                                           "in UTF-8: len(text.encode('utf-8'))."),
                    (x.sum().item() / n_bytes, "that is nats per byte: the losses are in nats, divide by ln 2 for "
                                               "bits (log2 vs ln)."),
                    (total_bits / n, f"that is bits per token: divide the bits of all {n} tokens by the {n_bytes} "
                                     "bytes of the text, so that models with different tokenizers compare."),
                    (x.mean().item() / LN2 / n_bytes, "the bits of *all* the tokens (their sum, not their mean) are "
                                                       "divided by the bytes.")],
                tol=(1e-9, 1e-5))

# ----------------------------------------------------------------------------- exercise 13

class _FlopBlock(nn.Module):
    """The spec's Pre-LN block: grouped-query attention over the whole (T, T) score matrix, masked; a GELU MLP."""

    def __init__(self, d: int, heads: int, kv_heads: int, d_ff: int) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.d_head = heads, kv_heads, d // heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv = nn.Linear(d, (heads + 2 * kv_heads) * self.d_head)
        self.proj = nn.Linear(d, d)
        self.up, self.down = nn.Linear(d, d_ff), nn.Linear(d_ff, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, d = x.shape
        kv = self.kv_heads * self.d_head
        q, k, v = self.qkv(self.ln1(x)).split([d, kv, kv], dim=-1)
        q = q.view(B, T, self.heads, self.d_head).transpose(1, 2)                      # (B, H, T, dh)
        k, v = (t.view(B, T, self.kv_heads, self.d_head).transpose(1, 2)               # (B, H_kv, T, dh)
                .repeat_interleave(self.heads // self.kv_heads, dim=1) for t in (k, v))  # (B, H, T, dh)
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_head)                    # (B, H, T, T)
        causal = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        attention = scores.masked_fill(~causal, float("-inf")).softmax(dim=-1) @ v     # (B, H, T, dh)
        x = x + self.proj(attention.transpose(1, 2).reshape(B, T, d))
        return x + self.down(F.gelu(self.up(self.ln2(x))))


class _FlopModel(nn.Module):
    """Exercise 10's model with n_layers blocks, grouped-query heads, any d_ff, tied or untied output."""

    def __init__(self, vocab: int, d: int, layers: int, heads: int, kv_heads: int, d_ff: int, tied: bool) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(_FlopBlock(d, heads, kv_heads, d_ff) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.head = None if tied else nn.Linear(d, vocab, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.tok(ids) * math.sqrt(self.tok.weight.shape[1])                           # (B, T, d)
        for block in self.blocks:
            x = block(x)
        x = self.ln_f(x)
        return x @ self.tok.weight.T if self.head is None else self.head(x)               # (B, T, V)


@functools.lru_cache(maxsize=64)
def counted_train_flops(vocab_size: int, d_model: int, n_layers: int, n_heads: int, n_kv_heads: int, d_ff: int,
                        seq_len: int, tied: bool) -> float:
    """The oracle: FlopCounterMode's count of one training step's forward and backward passes of the spec's
    model (on the meta device: shapes only, so any size is cheap), per token of a batch of 2 sequences."""
    B = 2
    with torch.device("meta"):
        model = _FlopModel(vocab_size, d_model, n_layers, n_heads, n_kv_heads, d_ff, tied)
        ids = torch.zeros(B, seq_len, dtype=torch.long)
    counter = FlopCounterMode(display=False)
    with counter:
        F.cross_entropy(model(ids).flatten(0, 1), ids.flatten()).backward()
    return counter.get_total_flops() / (B * seq_len)


def _flops_slip(config: tuple, slip: str) -> float:
    """The FLOPs per training token that one known slip gives (only to name it: the oracle counts)."""
    V, d, L, H, kv, d_ff, T, tied = config
    kv_width = d if slip == "gqa_ignored" else kv * (d // H)
    width = 4 * d if slip == "d_ff_ignored" else d_ff
    per_layer = d * (d + 2 * kv_width) + d * d + 2 * d * width                   # weights of qkv, proj, up, down
    if slip == "biases":
        per_layer += (d + 2 * kv_width) + d + width + d + 4 * d                   # biases, and ln1, ln2's two vectors
    weights = (1 if slip == "one_layer" else L) * per_layer + (2 * d if slip == "biases" else 0)   # ln_f
    head = {"no_head": 0, "head_twice": 2 * V * d, "embedding_counted": (1 if tied else 2) * V * d}.get(slip, V * d)
    attention = {"no_attention": 0, "attention_half": 2 * L * T * d, "attention_per_sequence": 4 * L * T * T * d,
                 "attention_kv_scaled": 4 * L * T * kv_width, "one_layer": 4 * T * d}.get(slip, 4 * L * T * d)
    forward = 2 * (weights + head) + attention
    if slip == "attention_forward_only":
        return 3 * 2 * (weights + head) + attention
    return {"forward_only": 1, "backward_equal": 2, "macs": 1.5}.get(slip, 3) * forward


_FLOPS_SLIPS = [
    ("forward_only", "that is the forward pass alone: a training step also runs the backward pass, which costs about "
                     "twice the forward (every matmul's gradient for its input and for its weight)."),
    ("backward_equal", "the backward pass of a matmul is two matmuls of the forward's size (the gradient for its input "
                       "and the one for its weight), so a training token costs three forward passes, not two."),
    ("macs", "that counts multiply-adds: a multiply-add is 2 FLOPs (FlopCounterMode counts 2 * m * n * k for an "
             "(m, k) @ (k, n) product)."),
    ("no_attention", "the attention matmuls are missing: the scores q @ k^T and the weighted sum of the values have "
                     "no weights, yet every token computes them over all seq_len positions, in every layer."),
    ("attention_forward_only", "the attention matmuls have a backward pass too, twice their forward like every "
                               "other matmul: count them three times, as the weights' matmuls."),
    ("attention_half", "the attention term is half what the model computes: it builds the whole (seq_len, seq_len) "
                       "score matrix of every head before masking it, and runs two matmuls over it (the scores and "
                       "the weighted sum of the values)."),
    ("attention_per_sequence", "the attention term is counted per sequence, not per token: each token's query meets "
                               "seq_len keys, so per token the term grows with seq_len, not with its square."),
    ("attention_kv_scaled", "n_kv_heads does not shrink the attention matmuls: every one of the n_heads query heads "
                            "still scores all seq_len keys and sums their values; shared key/value heads shrink the K "
                            "and V projections only."),
    ("gqa_ignored", "with n_kv_heads < n_heads the K and V projections are smaller: qkv maps d_model to "
                    "(n_heads + 2 * n_kv_heads) * d_head features, not 3 * d_model."),
    ("d_ff_ignored", "the MLP's width is d_ff, which need not be 4 * d_model: up and down are d_model x d_ff "
                     "matrices."),
    ("one_layer", "count every one of the n_layers blocks: the projections, the MLP and the attention matmuls of "
                  "each."),
    ("no_head", "the output layer is missing: logits = ln_f(x) @ W.T is a (d_model x vocab_size) matmul on every "
                "token, tied or not."),
    ("biases", "only matmuls count: a bias addition and the norms' gains and shifts are elementwise (FlopCounterMode "
               "counts 0 for them), so 6 FLOPs per parameter and token holds for the weight matrices only."),
]
_FLOPS_TIED = ("head_twice", "a tied table is one matrix, used once per token as a matmul (the output layer): the "
               "lookup at the input is a gather with no FLOPs, so the table is counted once, not twice.")
_FLOPS_UNTIED = ("embedding_counted", "the embedding lookup is a gather, not a matmul: it costs no FLOPs; untied, "
                 "only the separate output matrix multiplies each token, not the embedding table.")


def _flops_slips(config: tuple) -> list[tuple[str, str]]:
    return [*_FLOPS_SLIPS, _FLOPS_TIED if config[-1] else _FLOPS_UNTIED]


# (vocab_size, d_model, n_layers, n_heads, n_kv_heads, d_ff, seq_len, tied): exercise 10's model as the notebook
# trains it on Shakespeare's characters, GPT-2 small, and a grouped-query model with its own output matrix.
_FLOPS_VISIBLE = [(65, 48, 1, 1, 1, 192, 32, True), (50257, 768, 12, 12, 12, 3072, 1024, True),
                  (32000, 512, 6, 8, 2, 1408, 2048, False)]


def _flops_drawn(d: Draw, k: int) -> tuple:
    """A configuration where (for the first two, one tied and one not) every slip changes the count."""
    while True:
        heads = d.rng.choice([4, 8, 16, 32] if k < 2 else [1, 2, 4, 6, 8, 12, 16, 32])
        d_model = heads * d.rng.choice([8, 16, 32, 64, 128])
        kv = d.rng.choice([h for h in range(1, heads + 1) if heads % h == 0 and (k >= 2 or 4 * h <= heads)])
        d_ff = d.rng.choice([4 * d_model, 8 * d_model // 3, d.rng.randrange(d_model, 6 * d_model)])
        config = (d.rng.randrange(2, 300_000), d_model, d.rng.randrange(2 if k < 2 else 1, 48), heads, kv, d_ff,
                  d.rng.randrange(2, 8193), k % 2 == 0)
        values = [_flops_slip(config, slip) for slip, _ in _flops_slips(config)] + [_flops_slip(config, "ok")]
        if k >= 2 or len(set(values)) == len(values):
            return config


def _flops_configs(hidden: bool) -> list[tuple]:
    d = draw("train_flops", hidden)
    return [_flops_drawn(d, k) for k in range(4)] if hidden else list(_FLOPS_VISIBLE)


def _flops_judge(config: tuple, value) -> None:
    want = counted_train_flops(*config)
    shown = f"train_flops_per_token({_shown_config(config)})"
    got = expect_number(value, shown, "return your prediction as a number of FLOPs (an int or a float).")
    compare(got, want, shown, "go through one token's forward pass matmul by matmul (each weight matrix, the two "
            "attention products, the output layer), 2 FLOPs per multiply-add, then add the backward pass.", variants=[
                *variants_of(lambda slip: _flops_slip(config, slip), _flops_slips(config)),
                (when(lambda v: abs(v - want) <= 1e-3 * want), "close, but not the count: the matmuls give an exact "
                 "number of FLOPs; return the arithmetic that gives it from the arguments, not a rounded or "
                 "approximate value (6N alone is an approximation).")],
            tol=(0.0, 1e-9))


def _shown_config(config: tuple) -> str:
    return ("vocab_size={}, d_model={}, n_layers={}, n_heads={}, n_kv_heads={}, d_ff={}, seq_len={}, "
            "tied={}".format(*config))


def _check_flops_prediction(train_flops_per_token, hidden: bool = False) -> None:
    judge_configured("train_flops_per_token", train_flops_per_token, _flops_configs(hidden),
                     counted_train_flops, _flops_judge, shown=_shown_config)


def flops_prediction_passes(train_flops_per_token) -> bool:
    """For the exercise's demo, which measures only once the prediction passes its visible test."""
    return passes(_check_flops_prediction, train_flops_per_token)


def _mfu_cases(hidden: bool) -> list[tuple]:
    """(tokens_per_second, flops_per_token, peak_flops): a laptop's CPU, a GPU, and drawn ones."""
    def drawn(d: Draw) -> tuple:
        return (d.rng.uniform(10.0, 1e6), d.rng.uniform(1e5, 1e13), d.rng.uniform(1e10, 1e18))
    d = draw("mfu", hidden)
    return [drawn(d) for _ in range(4)] if hidden else [(4_000.0, 2.6e6, 5e10), (12_500.0, 1.6e10, 9.9e14)]


def _check_mfu(mfu, hidden: bool) -> None:
    for rate, flops, peak in _mfu_cases(hidden):
        shown = f"mfu(tokens_per_second={rate:.6g}, flops_per_token={flops:.6g}, peak_flops={peak:.6g})"
        got = expect_number(call(mfu, rate, flops, peak, name="mfu"), shown,
                            "return a Python number: the fraction of the peak that the run achieves.")
        want = rate * flops / peak
        compare(got, want, shown, "MFU is the model FLOPs per second achieved (tokens per second times FLOPs per "
                "token) divided by the peak FLOPs per second.", variants=[
                    (100 * want, "that is a percentage: return the fraction (0.5 for half the peak)."),
                    (1 / want, "the ratio is upside down: achieved FLOPs per second over the peak, not the peak over "
                               "them."),
                    (3 * want, "flops_per_token is already the cost of a training token (forward and backward): do "
                               "not multiply it by 3 again."),
                    (rate / peak, "the achieved FLOPs per second are tokens per second times the FLOPs of a token.")],
                tol=(0.0, 1e-9))


def check_training_flops(train_flops_per_token, mfu=None, hidden: bool = False) -> None:
    """The prediction against FlopCounterMode's count of the spec's model run here, on the visible
    configurations or (hidden) four drawn ones; then MFU against its definition."""
    _check_flops_prediction(train_flops_per_token, hidden)
    if mfu is not None:
        _check_mfu(mfu, hidden)
