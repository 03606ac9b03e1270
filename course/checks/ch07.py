"""Checks for the capstone: unit checks of the parts, then grading of the trained models
on held-out data with the course's own loaders and metrics (never the student's).

Exercise 0 brings the student's tools from chapters 5 and 6 (``lr_at``, ``param_groups``,
``clip_grad_norm``, ``process_logits``, ``sample_next_token``, ``beam_search_core``); they are
checked here by those chapters' own checks. The capstone's ``train``, ``generate`` and
``beam_search`` call them: when one of those fails and a tool it calls fails too, the tool is
named as the cause ("train calls your lr_at from chapter 5 ...")."""

from __future__ import annotations

import dataclasses
import itertools
import math
import random
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..capstone import data, metrics
from ..capstone.profiles import ClassifierConfig, LMConfig, Seq2SeqConfig, current_profile
from ..capstone.weights import save_checkpoint
from ..device import get_device
from . import ch05, ch06
from ..i18n import composed
from ._core import (CheckFailed, NotWrittenYet, call, earlier_answers, earlier_first, expect_tensor, forbid,
                    not_written, one_thread, own_fault)
from ._vocabulary import EXACT, compare, draw, earlier_chapter, expect, fail, matches, when

CHECKPOINTS = Path("capstone_checkpoints")
TINY_LM = LMConfig(d_model=32, n_layers=2, n_heads=4, block_size=16, batch_size=4, steps=1, lr=1e-3, warmup_steps=1)
# d_model 48: the positional table (max_len 32 rows) is then the only parameter of shape (32, 48)
TINY_S2S = Seq2SeqConfig(d_model=48, n_layers=2, n_heads=4, batch_size=4, steps=1, lr=1e-3, warmup_steps=1)
S2S_MAX_LEN = 32                     # Seq2Seq's default max_len
TINY_CLS = ClassifierConfig(d_model=32, n_layers=2, n_heads=4, batch_size=4, steps=1, lr=1e-3, warmup_steps=1,
                            max_len=12)
# The reference answers keep these properties to 1e-6 in float32 (measured over 20 draws); 1e-4
# leaves room for other orders of summation.
PROPERTY_TOL = (1e-4, 1e-5)


def _tied(model: nn.Module) -> bool:
    embeddings = [m.weight for m in model.modules() if isinstance(m, nn.Embedding)]
    linears = [m.weight for m in model.modules() if isinstance(m, nn.Linear)]
    return any(e is w for e in embeddings for w in linears)


def _bumped(ids: torch.Tensor, at: int, low: int, vocab: int) -> torch.Tensor:
    """A copy of ``ids`` whose token at position ``at`` (last axis) is the next id in [low, vocab)."""
    out = ids.clone()
    out[..., at] = (out[..., at] + 1 - low) % (vocab - low) + low
    return out

# ----------------------------------------------------------------------------- exercise 0: the tools

# name -> (chapter, exercise there, runner(tools, hidden) calling that chapter's own check)
_TOOLS = {
    # the capstone's lr_at has the book's signature (no decay_steps, no stable phase): only those schedules
    "lr_at": (5, 5, lambda t, h: ch05.check_lr_at(t["lr_at"], hidden=h, stable_phase=False)),
    "param_groups": (5, 4, lambda t, h: ch05.check_param_groups(t["param_groups"], hidden=h)),
    "clip_grad_norm": (5, 6, lambda t, h: ch05.check_clip_grad_norm(t["clip_grad_norm"], hidden=h)),
    "process_logits": (6, 1, lambda t, h: ch06.check_process_logits(t["process_logits"], hidden=h)),
    "sample_next_token": (6, 2, lambda t, h: ch06.check_sample_next_token(t["sample_next_token"], t["process_logits"],
                                                                          hidden=h)),
    "beam_search_core": (6, 5, lambda t, h: ch06.check_beam_search(t["beam_search_core"], hidden=h)),
}


def _check_tool(name: str, tools: dict, hidden: bool) -> None:
    """The tool against its chapter's own check. For lr_at, a quick look first
    (:func:`_lr_at_agrees`); chapter 5's full check only when it finds a difference."""
    if name == "lr_at" and _lr_at_agrees(tools["lr_at"], hidden):
        return
    chapter, exercise, run = _TOOLS[name]

    def its_check() -> None:
        run(tools, hidden)
        if name == "lr_at":     # the quick look found a difference that the full check does not sweep
            fail("lr_at differs from chapter 5's schedule where a piece of it starts or ends (step 0, the end "
                 "of warm-up, max_steps or after it).",
                 "lr = max_lr * (step + 1) / warmup_steps during warm-up, then min_lr + (max_lr - min_lr) * "
                 "(1 + cos(pi p)) / 2 with p = (step - warmup_steps) / (max_steps - warmup_steps), then min_lr.")
    earlier_chapter(name, chapter, exercise, its_check)


def _lr_at_agrees(lr_at, hidden: bool) -> bool:
    """A quick look at lr_at: the steps where each piece of the schedule starts and ends, on
    fixed or drawn schedules. Chapter 5's own check sweeps every step of several schedules,
    hundreds of calls; the capstone runs it only when this look finds a difference."""
    def drawn(d):
        max_lr, warmup = float(f"{10 ** d.rng.uniform(-5, 0):.3g}"), d.rng.randrange(1, 40)
        return max_lr, max_lr * d.rng.choice([0.0, 0.01, 0.1, 0.5]), warmup, warmup + d.rng.randrange(2, 200)

    fixed = [(3e-4, 0.0, 0, 20)] if hidden else [(1.0, 0.1, 10, 100), (6e-4, 6e-5, 5, 30)]
    for max_lr, min_lr, warmup, max_steps in draw("capstone/lr_at", hidden).cases(fixed, drawn, 2):
        steps = {0, max(0, warmup - 1), warmup, warmup + 1, (warmup + max_steps) // 2, max_steps - 1, max_steps,
                 max_steps + 7}
        # the tolerance of chapter 5's own check, which decides when this look finds a difference
        if not all(matches(call(lr_at, s, max_lr, min_lr, warmup, max_steps, name="lr_at"),
                           ch05._lr_oracle(s, max_lr, min_lr, warmup, max_steps), (1e-12, 1e-6))
                   for s in sorted(steps)):
            return False
    return True


def check_tools(lr_at, param_groups, clip_grad_norm, process_logits, sample_next_token, beam_search_core,
                hidden: bool = False) -> None:
    """Chapter 5's and chapter 6's own checks (visible, or hidden) on the tools brought here."""
    tools = dict(zip(_TOOLS, (lr_at, param_groups, clip_grad_norm, process_logits, sample_next_token,
                              beam_search_core)))
    for name in tools:
        _check_tool(name, tools, hidden)


def _tools_first(caller: str, tools: dict, hidden: bool) -> list:
    """``earlier_first``'s pairs for the tools ``caller`` calls ("train calls your lr_at from
    chapter 5, which fails exercise 0's tests"); a stub of a tool is left to its own cell."""
    return earlier_answers(caller, *((f"calls your {name} from chapter {_TOOLS[name][0]}", 0, name,
                                      lambda n: _check_tool(n, tools, hidden)) for name in tools))

# ----------------------------------------------------------------------------- exercise 1

_POST_LN = ("the block's output was normalised: x = LayerNorm(x + sublayer(x)) is Post-LN. A Pre-LN block "
            "normalises only what each sub-layer reads and adds its output to the stream as it is: "
            "x = x + attn(ln_1(x)), then x = x + mlp(ln_2(x)) (chapter 4, residuals).")
_COMBINED_MASK = ("build one boolean mask (True = may attend): the causal lower triangle "
                  "torch.ones(Tq, Tk, dtype=torch.bool).tril() & pad_mask, and pass it as attn_mask alone; "
                  "attn_mask together with is_causal=True is rejected by several PyTorch releases.")
_CAUSAL = ("self-attention must be causal when causal=True: a lower-triangular boolean mask "
           "(torch.ones(Tq, Tk, dtype=torch.bool).tril()) as attn_mask, so position t sees only positions <= t.")


def _block_layout(d_model: int, cross: bool) -> dict[str, tuple[int, ...]]:
    """The Block's state_dict as the spec fixes it: key -> shape (d = d_model). The grader loads
    weights through these names, as CS336's adapters pin a layout."""
    d = d_model
    linear = lambda name, n_out, n_in: {f"{name}.weight": (n_out, n_in), f"{name}.bias": (n_out,)}  # noqa: E731
    norm = lambda name: {f"{name}.weight": (d,), f"{name}.bias": (d,)}  # noqa: E731
    layout = {**norm("ln_1"), **linear("qkv", 3 * d, d), **linear("proj", d, d)}
    if cross:
        layout |= {**norm("ln_x"), **linear("q_x", d, d), **linear("kv_x", 2 * d, d), **linear("proj_x", d, d)}
    return layout | norm("ln_2") | linear("mlp.0", 4 * d, d) | linear("mlp.2", d, 4 * d)


def _layout_hint(missing: set, unexpected: set, reshaped: set) -> str:
    """The hint for a state_dict that is not the spec's: the part that is missing or misshapen."""
    if any(k.startswith("mlp.") for k in reshaped) or (any(k.startswith("mlp.") for k in missing) and unexpected):
        return ("the MLP is Linear(d_model, 4 * d_model), GELU, Linear(4 * d_model, d_model), kept in an "
                "nn.Sequential named mlp (its Linear layers are then mlp.0 and mlp.2).")
    if {"proj.weight", "proj_x.weight"} & missing:
        return ("multi-head attention ends with an output projection: after the heads are joined back into "
                "d_model features, a Linear(d_model, d_model) (proj; proj_x for cross-attention) mixes them.")
    if {"ln_2.weight", "ln_x.weight"} & missing:
        return ("each sub-layer has a LayerNorm of its own (ln_1 before attention, ln_x before cross-attention, "
                "ln_2 before the MLP): one LayerNorm reused for two sub-layers shares its weight and bias.")
    return ("name the block's parts as the spec's table does (ln_1, qkv, proj, ln_x, q_x, kv_x, proj_x, ln_2, "
            "mlp): the grader loads weights into a block through these names.")


def _check_layout(block, d_model: int, cross: bool) -> None:
    want = _block_layout(d_model, cross)
    got = {k: tuple(v.shape) for k, v in dict(block.state_dict()).items()}
    missing, unexpected = set(want) - set(got), set(got) - set(want)
    reshaped = {k for k in set(want) & set(got) if got[k] != want[k]}
    if not (missing or unexpected or reshaped):
        return
    found = [f"missing {_names(sorted(missing))}" if missing else "",
             f"unexpected {_names(sorted(unexpected))}" if unexpected else "",
             "; ".join(f"{k} has shape {got[k]}, expected {want[k]}" for k in sorted(reshaped)[:3])]
    fail(f"Block(d_model={d_model}, cross={cross}).state_dict() is not the spec's: "
         + "; ".join(f for f in found if f) + ".", _layout_hint(missing, unexpected, reshaped))


def _attention(q, k, v, n_heads: int, mask) -> torch.Tensor:
    """Scaled dot-product attention over heads: q (B, Tq, d), k/v (B, Tk, d), mask broadcast to
    (B, 1, Tq, Tk) with True = may attend -> (B, Tq, d). Feature j belongs to head j // d_head."""
    split = lambda t: t.unflatten(-1, (n_heads, -1)).transpose(1, 2)              # noqa: E731 (B, h, T, d_head)
    scores = split(q) @ split(k).transpose(-1, -2) / math.sqrt(q.shape[-1] // n_heads)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return (scores.softmax(-1).nan_to_num(0.0) @ split(v)).transpose(1, 2).flatten(2)


def _reference_block(w: dict, x, n_heads: int, causal: bool, pad_mask=None, memory=None, memory_mask=None,
                     variant: str = "ok") -> torch.Tensor:
    """The spec's Pre-LN block from its state_dict ``w``, in float64: x (B, T, d) -> (B, T, d).
    ``variant`` names one wrong sublayer (the value a diagnosis tries)."""
    w = {k: v.double() for k, v in w.items()}
    x = x.double()
    lin = lambda name, t: t @ w[f"{name}.weight"].T + w[f"{name}.bias"]           # noqa: E731
    norm = lambda name, t: F.layer_norm(t, t.shape[-1:], w[f"{name}.weight"], w[f"{name}.bias"])  # noqa: E731
    mask = pad_mask
    if causal:
        tri = torch.ones(x.shape[1], x.shape[1], dtype=torch.bool).tril()
        mask = tri if mask is None else mask & tri
    q, k, v = lin("qkv", norm("ln_1", x)).chunk(3, dim=-1)
    heads = _attention(q, k, v, n_heads, mask)
    x = x + (heads if variant == "no_proj" else lin("proj", heads))
    if memory is not None:
        memory_mask = None if variant == "no_memory_mask" else memory_mask
        k, v = lin("kv_x", memory.double()).chunk(2, dim=-1)
        x = x + lin("proj_x", _attention(lin("q_x", x if variant == "cross_no_norm" else norm("ln_x", x)), k, v,
                                         n_heads, memory_mask))
    hidden = lin("mlp.0", norm("ln_1" if variant == "one_norm" else "ln_2", x))
    return x + lin("mlp.2", F.relu(hidden) if variant == "relu" else F.gelu(hidden))


_BLOCK_VARIANTS = [
    ("relu", "the MLP's activation is GELU (nn.GELU(), the exact form), not ReLU."),
    ("one_norm", "the MLP read ln_1's output: each sub-layer normalises with its own LayerNorm, ln_2 before the "
                 "MLP."),
    ("no_proj", "attention's output projection proj was not applied: after the heads are joined back into "
                "d_model features, proj mixes them before the result is added to the stream."),
    ("cross_no_norm", "cross-attention's queries come from ln_x(x), the stream normalised by the block's own "
                      "LayerNorm for that sub-layer."),
    ("no_memory_mask", "cross-attention attended to the memory's PAD positions: pass memory_mask (True = may "
                       "attend) as the mask of cross-attention."),
]


def _check_against_reference(Block, d, n_heads: int, width: int) -> None:
    """The block with random weights loaded through the spec's names against the reference block:
    self-attention (causal, with PAD) and, with cross=True, cross-attention to a padded memory."""
    B, T, S = (d.rng.randrange(1, 4), d.rng.randrange(3, 9), d.rng.randrange(2, 8)) if d.hidden else (2, 5, 4)
    x, memory = d.randn(B, T, width) * 2 + 1, d.randn(B, S, width)
    pad, memory_mask = torch.ones(B, 1, 1, T, dtype=torch.bool), torch.ones(B, 1, 1, S, dtype=torch.bool)
    pad[0, ..., :1], memory_mask[-1, ..., S // 2:] = False, False
    for cross in (False, True):
        with d.seeded():
            block = call(Block, width, n_heads, dropout=0.0, causal=True, cross=cross, name="Block").eval()
        _check_layout(block, width, cross)
        state = _random_state({k: v.detach().clone() for k, v in dict(block.state_dict()).items()}, d)
        block.load_state_dict(state)
        kept = dict(block.state_dict())
        shared = [k for k in state if not matches(kept[k], state[k], EXACT)]
        expect(not shared, f"after loading different values into every entry of Block's state_dict, {_names(shared)} "
               f"held another entry's values: two parts of the block share one tensor.",
               "each sub-layer has a LayerNorm of its own (ln_1 before attention, ln_x before cross-attention, ln_2 "
               "before the MLP): make a new nn.LayerNorm for each instead of assigning one module twice.")
        inputs = dict(pad_mask=pad) | (dict(memory=memory, memory_mask=memory_mask) if cross else {})
        with torch.no_grad():
            out = call(block, x, name="Block.forward", **inputs)
        expect_tensor(out, (B, T, width), "Block output")
        ref = lambda variant="ok": _reference_block(state, x, n_heads, True, variant=variant, **inputs)  # noqa: E731
        compare(out, ref().float(), f"Block(d_model={width}, n_heads={n_heads}, cross={cross}) with random weights "
                f"loaded through the spec's names, against the reference block", "the block computes x = x + "
                "proj(attention(ln_1(x))), then (cross=True) x = x + proj_x(attention(q_x(ln_x(x)), memory)), then "
                "x = x + mlp(ln_2(x)); q, k, v are the three thirds of qkv's output in that order (k, v of kv_x's), "
                "and feature j belongs to head j // d_head.",
                variants=[(lambda v=v: ref(v), hint) for v, hint in _BLOCK_VARIANTS], tol=(1e-4, 1e-4))


def _check_block(Block, hidden: bool) -> None:
    """Pre-LN (a constant added to a token's features passes straight through) and one mask
    that is causal and hides PAD at once; then the spec's layout and values against a
    reference block, and dropout only while training."""
    _check_block_properties(Block, hidden)
    _check_block_reference(Block, hidden)


def _check_block_reference(Block, hidden: bool) -> None:
    """The spec's layout, values against the reference block, dropout only while training. The
    models of exercises 4 and 6 run it too: their blocks are exercise 1's."""
    d = draw("capstone/block reference", hidden)
    n_heads = d.rng.choice([1, 2, 4]) if hidden else 2
    width = n_heads * d.rng.choice([3, 4, 6]) if hidden else 12
    _check_against_reference(Block, d, n_heads, width)
    _check_block_dropout(Block, d.sub("dropout"), n_heads, width)


_DROPOUT_EVAL = ("dropout acts only while training: in eval mode (model.eval()) the block must compute exactly what "
                 "it computes with dropout=0. nn.Dropout follows the mode by itself; a dropout probability given to "
                 "a function (scaled_dot_product_attention's dropout_p, F.dropout) must be 0 when not "
                 "self.training.")


def _check_block_dropout(Block, d, n_heads: int, width: int) -> None:
    """Block(dropout=p): in eval mode exactly the reference block; in training mode each
    sub-layer's output is random (with the other sub-layer's output projection set to zero, so
    that what moves can only come from the sub-layer under test)."""
    p = round(d.rng.uniform(0.2, 0.6), 2) if d.hidden else 0.5
    B, T = 2, 6
    with d.seeded():
        block = call(Block, width, n_heads, dropout=p, causal=True, name="Block").eval()
    state = _random_state({k: v.detach().clone() for k, v in dict(block.state_dict()).items()}, d)
    block.load_state_dict(state)
    x = d.randn(B, T, width)
    with torch.no_grad():
        out = call(block, x, name="Block.forward")
    compare(out, _reference_block(state, x, n_heads, True).float(), f"Block(dropout={p}) in eval mode, against the "
            "same block without dropout", _DROPOUT_EVAL, tol=(1e-4, 1e-4))
    for silenced, where, hint in (
            ("mlp.2", "attention", "pass the dropout probability to attention when training (scaled_dot_product_"
                                   "attention(..., dropout_p=...), 0 in eval mode): the attention sub-layer was "
                                   "never dropped out."),
            ("proj", "MLP", "end the MLP with nn.Dropout(dropout) (it acts only in training mode): the MLP's output "
                            "was never dropped out.")):
        quiet = {k: torch.zeros_like(v) if k.startswith(silenced + ".") else v for k, v in state.items()}
        block.load_state_dict(quiet)
        block.train()
        with torch.no_grad():
            moved = call(block, x, name="Block.forward")
        block.eval()
        expect(not matches(moved, _reference_block(quiet, x, n_heads, True).float(), (1e-4, 1e-4)),
               f"Block(dropout={p}) in training mode computed exactly what it computes without dropout when only "
               f"its {where} sub-layer adds to the stream.", hint)


def _check_block_properties(Block, hidden: bool) -> None:
    d = draw("capstone/block", hidden)
    n_heads = d.rng.choice([1, 2, 4]) if hidden else 4
    width = n_heads * d.rng.choice([4, 6, 8]) if hidden else 32
    B, T = (d.rng.randrange(2, 4), d.rng.randrange(5, 11)) if hidden else (2, 7)
    t, n_pad = T - 2, d.rng.randrange(1, T - 3) if hidden else 2
    with d.seeded():
        block = call(Block, width, n_heads, dropout=0.0, causal=True, name="Block").eval()
    x, shift = d.randn(B, T, width), d.randn(B, T, 1) * 3      # shift: one number per token, on all its features
    z, y = x.clone(), x.clone()
    z[:, t] += d.randn(B, width)                                # a change at a later position
    y[0, :n_pad] = d.randn(n_pad, width)                        # other contents at the PAD positions of row 0
    with torch.no_grad():
        out = call(block, x, name="Block.forward")
        expect_tensor(out, (B, T, width), "Block output")
        moved, later = block(x + shift), block(z)
    normalised = when(lambda _: out.mean(-1).abs().max() < 1e-3
                      and (out.var(-1, unbiased=False) - 1).abs().max() < 1e-2)
    compare(moved, out + shift, "the block's output after adding one number to every feature of each token (it "
            "should move by that number)", "in a Pre-LN block only the sub-layers' inputs are normalised (ln_1 "
            "before attention, ln_2 before the MLP) and the residual path carries x unchanged: x = x + attn(ln_1(x)); "
            "x = x + mlp(ln_2(x)).", variants=[(normalised, _POST_LN)], tol=PROPERTY_TOL)
    compare(later[:, :t], out[:, :t], f"Block(causal=True): the outputs before position {t} after a change at "
            f"position {t}", _CAUSAL)
    # Causal and padded at once: row 0 starts with n_pad PAD positions.
    pad = torch.ones(B, 1, 1, T, dtype=torch.bool)
    pad[0, :, :, :n_pad] = False
    try:
        with torch.no_grad():
            base = call(block, x, pad_mask=pad, name="Block.forward")
    except CheckFailed as err:
        if "causal" in err.what or "attn_mask" in err.what:
            fail(f"Block(causal=True) with a pad_mask raised an error: {err.what}", _COMBINED_MASK)
        raise
    with torch.no_grad():
        other_pad, later = block(y, pad_mask=pad), block(z, pad_mask=pad)
    compare(other_pad[0, n_pad:], base[0, n_pad:], "with causal=True and a pad_mask, the outputs at real positions "
            "after a change at the PAD positions",
            composed("PAD keys must be hidden while the block is causal: {how}", how=_COMBINED_MASK))
    real = torch.ones(B, t, dtype=torch.bool)
    real[0, :n_pad] = False                                     # a PAD query sees no key: its output is arbitrary
    compare(later[:, :t][real], base[:, :t][real], f"with causal=True and a pad_mask, the outputs at real positions "
            f"before {t} after a change at position {t}",
            composed("the block stopped being causal when a pad_mask was given: {how}", how=_COMBINED_MASK))


def _check_model_dropout(build, builder: str, cfg, args: tuple, runs: dict, who: str) -> None:
    """A model built with cfg.dropout > 0 gives two different outputs for one input in training
    mode (its blocks drop out); eval mode is the blocks' own test. ``runs``: what -> run(model),
    for each stack of blocks that must drop out (a Seq2Seq's encode, then the whole model)."""
    with draw(f"capstone/{who} dropout", False).seeded():
        model = call(build, dataclasses.replace(cfg, dropout=0.5), *args, name=builder).train()
    for what, run in runs.items():
        with torch.no_grad():
            first, second = call(run, model, name=who), call(run, model, name=who)
        # not own_fault: a Block that never drops out is exercise 1's fault, and earlier_first names it
        expect(not matches(second, first, EXACT), f"{who} built with cfg.dropout=0.5 gave the same {what} twice "
               "for one input in training mode: nothing in it dropped out.",
               f"pass cfg.dropout on to every Block that {who} builds (Block(d_model, n_heads, cfg.dropout, ...)).")
    model.eval()


def _block_parameters(d: int, cross: bool = False) -> int:
    return sum(math.prod(shape) for shape in _block_layout(d, cross).values())


def _check_parameter_count(build, builder: str, cfg, args: tuple, fixed: tuple[int, ...], who: str, parts: str,
                           stacks: dict[str, int]) -> None:
    """The model's parameters (each shared one once) against the spec's count: one of ``fixed``
    (the counts the spec allows outside the blocks) plus cfg.n_layers blocks in each of
    ``stacks`` (name -> parameters of one of its blocks). A count that other numbers of blocks
    explain names the stack whose depth is not cfg.n_layers."""
    with draw(f"capstone/{who} size", False).seeded():
        model = call(build, cfg, *args, name=builder)
    got, n = sum(p.numel() for p in model.parameters()), cfg.n_layers
    if got in {f + n * sum(stacks.values()) for f in fixed}:
        return
    # not marked own_fault: a block of the wrong size is exercise 1's fault, and earlier_first names it
    for f in fixed:
        for depths in itertools.product(range(9), repeat=len(stacks)):
            if f + sum(k * size for k, size in zip(depths, stacks.values())) == got:
                found = ", ".join(f"{k} block(s) in {name}" for k, name in zip(depths, stacks))
                fail(f"{who} built with n_layers={n} has {got:,} parameters, the count of {found}.",
                     f"build cfg.n_layers blocks in {' and in '.join(stacks)} "
                     "(nn.ModuleList(Block(...) for _ in range(cfg.n_layers))), not a fixed number.")
    fail(f"{who} built with d_model={cfg.d_model} and n_layers={n} has {got:,} parameters; the spec's parts "
         f"have {fixed[0] + n * sum(stacks.values()):,}.",
         f"{who} holds exactly {parts}, and cfg.n_layers blocks with the parameters of the spec's table.")


def _built_from_block(who: str, Block, hidden: bool) -> list:
    """``earlier_first``'s pair for a model built from exercise 1's Block."""
    return earlier_answers(who, ("is built from your Block of exercise 1", 1, Block, lambda b: _check_block(b, hidden)))

def _position_tables(model, n_positions: int, d_model: int) -> tuple[dict, list[str]]:
    """The model's state and the names of its positional tables: entries of shape
    (n_positions, d_model) (the tests choose vocabulary sizes that differ from n_positions)."""
    state = dict(model.state_dict())
    names = [k for k, v in state.items() if isinstance(v, torch.Tensor) and v.is_floating_point()
             and tuple(v.shape[-2:]) == (n_positions, d_model) and v.numel() == n_positions * d_model]
    return state, names


def _shifted_logits(model, state: dict, names: list[str], inputs: tuple, shift: float | None, run=None):
    """``run(*inputs)`` (default: the model) after adding ``shift`` to every entry of the model's
    positional tables (``None``: after setting them to zero); the weights are restored afterwards."""
    moved = {k: ((v + shift if shift is not None else torch.zeros_like(v)) if k in names else v)
             for k, v in state.items()}
    model.load_state_dict(moved)
    try:
        with torch.no_grad():
            return (run or model)(*inputs)
    finally:
        model.load_state_dict(state)


def check_decoder_lm(build_lm, Block, hidden: bool = False) -> None:
    _check_block(Block, hidden)
    d = draw("decoder_lm", hidden)
    vocab = d.rng.choice([v for v in range(20, 81) if v != TINY_LM.block_size]) if hidden else 30
    B, T = (d.rng.randrange(1, 5), d.rng.randrange(8, TINY_LM.block_size + 1)) if hidden else (3, TINY_LM.block_size)
    with d.seeded():
        model = call(build_lm, TINY_LM, vocab, name="build_lm").eval()
    x = d.randint(0, vocab, (B, T))
    if x[0, 0] == x[0, 1]:
        x[0, 1] = (x[0, 0] + 1) % vocab       # so that swapping the first two tokens below changes the input
    with torch.no_grad():
        logits = call(model, x, name="DecoderLM.forward")
        expect_tensor(logits, (B, T, vocab), "DecoderLM logits")
        expect(_tied(model), "the output projection does not share the token embedding's weight.",
               "tie them: self.head.weight = self.tok.weight (chapter 1, exercise 6).")
        for t in [1, T - 1] + d.rng.sample(range(2, T - 1), 2):
            compare(model(_bumped(x, t, 0, vocab))[:, :t], logits[:, :t], f"the logits before position {t} after "
                    f"a change of the token at position {t}", "self-attention must be causal in a language model: "
                    "pass a lower-triangular boolean mask (torch.ones(T, T, dtype=torch.bool).tril()) as attn_mask, "
                    "so position t sees only positions <= t.")
    # Pre-LN blocks carry a constant added to the positional table to the end; the final
    # LayerNorm removes it, so the logits must not move.
    state, names = _position_tables(model, TINY_LM.block_size, TINY_LM.d_model)
    if names:
        compare(_shifted_logits(model, state, names, (x,), d.rng.uniform(1.0, 3.0)), logits,
                "the logits after adding the same number to every entry of the positional embedding",
                "a Pre-LN stack never normalises its residual stream, so the model needs a final LayerNorm before "
                "the output projection: logits = head(ln_f(x)).", tol=PROPERTY_TOL)
    # One causal layer without positions sees tokens 0..t as a set: swapping the first two
    # leaves every later output unchanged. (Deeper causal stacks can recover some order.)
    with d.sub("shallow").seeded():
        shallow = call(build_lm, dataclasses.replace(TINY_LM, n_layers=1), vocab, name="build_lm").eval()
    with torch.no_grad():
        unchanged = matches(shallow(x[:, [1, 0] + list(range(2, T))])[:, 2:], shallow(x)[:, 2:])
    expect(not unchanged, "swapping the first two tokens left every later output unchanged.",
           "the model has no sense of order: add a positional embedding to the token embedding.")
    _check_model_dropout(build_lm, "build_lm", TINY_LM, (vocab,), {"logits": lambda m: m(x)}, "DecoderLM")
    depth = dataclasses.replace(TINY_LM, n_layers=d.rng.choice([1, 4]) if hidden else 3)
    d_model = depth.d_model
    _check_parameter_count(build_lm, "build_lm", depth, (vocab,), ((vocab + depth.block_size + 2) * d_model,),
                           "DecoderLM", f"a token table ({vocab}, {d_model}) whose weight the output projection "
                           f"shares (it has no bias), a positional table ({depth.block_size}, {d_model}), a final "
                           "LayerNorm", {"the model": _block_parameters(d_model)})

# ----------------------------------------------------------------------------- exercise 2

def _old_schedule(step, max_lr, warmup, total):
    """The schedule this capstone used before chapter 5 existed: 0.1 * max_lr at total - 1."""
    if step < warmup:
        return max_lr * (step + 1) / warmup
    progress = min((step - warmup) / max(1, total - 1 - warmup), 1.0)
    return max_lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def _train_oracle(model, batches, steps, lr, min_lr, warmup, clip, wd, variant="ok", autocast=None):
    """Chapter 5's recipe with torch's AdamW and clip_grad_norm_; ``variant`` names one mistake;
    ``autocast``, a dtype: the loss computed under CPU autocast to it."""
    decay = {id(m.weight) for m in model.modules() if isinstance(m, nn.Linear)} - {id(model.tok.weight)}
    params = list(model.parameters())
    opt = torch.optim.AdamW([{"params": [p for p in params if id(p) in decay], "weight_decay": wd},
                             {"params": [p for p in params if id(p) not in decay], "weight_decay": 0.0}],
                            lr=lr, betas=(0.9, 0.95))
    schedules = {"no_schedule": lambda s: lr, "no_floor": lambda s: ch05._lr_oracle(s, lr, 0.0, warmup, steps),
                 "old_schedule": lambda s: _old_schedule(s, lr, warmup, steps)}
    rate = schedules.get(variant, lambda s: ch05._lr_oracle(s, lr, min_lr, warmup, steps))
    losses = []
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = rate(step)
            if variant == "default_decay" and group["weight_decay"] > 0:
                group["weight_decay"] = 0.1
        x, y = batches[step]
        with torch.autocast("cpu", dtype=autocast or torch.bfloat16, enabled=autocast is not None):
            loss = F.mse_loss(model(x), y)
        if variant != "no_zero_grad":
            opt.zero_grad()
        loss.backward()
        if variant != "no_clip":
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        losses.append(loss.item())
    return losses


_TRAIN_VARIANTS = [
    ("no_clip", "gradients were not clipped: after backward, clipped, _ = clip_grad_norm([p.grad ...], clip), then "
                "p.grad = g for each parameter, before step."),
    ("no_zero_grad", "gradients accumulate across steps: call optimizer.zero_grad() every step, before backward."),
    ("no_schedule", "the learning rate never changed: set group['lr'] = lr_at(step, lr, min_lr, warmup_steps, steps) "
                    "for every param group at every step."),
    ("no_floor", "the cosine decayed to 0: pass min_lr to lr_at (lr_at(step, lr, min_lr, warmup_steps, steps)); the "
                 "profile sets the floor explicitly."),
    ("old_schedule", "the rate reached its floor at steps - 1 with a 0.1 * lr floor: use lr_at(step, lr, min_lr, "
                     "warmup_steps, steps), chapter 5's schedule, with the min_lr passed in."),
    ("default_decay", "the weight decay was not the weight_decay passed in: give it to param_groups(model, "
                      "weight_decay)."),
]


class _TrainProbe(nn.Module):
    """Embedding, Linear layers with biases, a LayerNorm and a tied output layer: every kind of
    parameter that param_groups sorts. ids (B, T) -> logits (B, T, V)."""

    def __init__(self, vocab: int, d: int, hidden: int):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.fc = nn.Linear(d, hidden)
        self.out = nn.Linear(hidden, d)
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.tok.weight

    def forward(self, ids):
        x = self.tok(ids)                                     # (B, T, d)
        return self.head(self.norm(x + self.out(F.gelu(self.fc(x)))))


@one_thread          # tiny tensors: under load, a second thread made each oracle's training 15 times slower
def check_train(train, lr_at, param_groups, clip_grad_norm, hidden: bool = False) -> None:
    """train against chapter 5's recipe run with torch's AdamW on a small model."""
    tools = dict(lr_at=lr_at, param_groups=param_groups, clip_grad_norm=clip_grad_norm)
    with earlier_first(*_tools_first("train", tools, hidden)):
        _check_train(train, hidden)


def _train_case(d) -> tuple[tuple, tuple]:
    """(steps, lr, min_lr, warmup, clip, weight decay), (batch, T, vocab, d_model, MLP width)."""
    if not d.hidden:
        return (12, 0.05, 0.005, 3, 0.5, 0.1), (6, 5, 11, 8, 16)
    steps, lr, warmup = d.rng.randrange(10, 21), d.rng.uniform(0.01, 0.05), d.rng.randrange(1, 6)
    recipe = (steps, lr, lr * d.rng.choice([0.05, 0.1, 0.3]), warmup, d.rng.uniform(0.05, 0.5),
              d.rng.uniform(0.02, 0.3))
    return recipe, tuple(d.rng.randrange(*r) for r in ((3, 9), (3, 8), (7, 20), (4, 13), (8, 25)))


def _check_train(train, hidden: bool) -> None:
    d = draw("capstone/train", hidden)
    recipe, (n_batch, T, vocab, width, inner) = _train_case(d)
    steps, lr, min_lr, warmup, clip, wd = recipe
    # Targets: logits far from their size-10 targets give gradient norms far above clip <= 0.5.
    batches = [(d.randint(0, vocab, (n_batch, T)), d.randn(n_batch, T, vocab) * 10) for _ in range(steps)]

    def trained(variant: str | None) -> tuple[nn.Module, list]:
        with d.seeded():                      # the same initial weights each time
            model = _TrainProbe(vocab, width, inner)
        return model, (_train_oracle(model, batches, *recipe, variant) if variant else [])

    student, _ = trained(None)
    try:
        with forbid(*ch05._CLIP_BUILTINS, exercise="global-norm clipping"):
            losses = call(train, student, lambda step: batches[step], lambda m, x, y: F.mse_loss(m(x), y), steps, lr,
                          min_lr, warmup, "cpu", use_bf16=False, weight_decay=wd, clip=clip, progress=False,
                          name="train")
    except CheckFailed as err:
        if " was called, but this exercise asks" not in err.what:
            raise
        with own_fault():
            fail(f"train called PyTorch's clipping ({err.what.split(' was called')[0]}).",
                 "train must clip with your clip_grad_norm from exercise 0 (chapter 5), not PyTorch's: clipped, _ = "
                 "clip_grad_norm([p.grad for the parameters that have one], clip), then p.grad = g.")
    expect(isinstance(losses, list) and len(losses) == steps, f"train should return a list of {steps} losses.",
           "append loss.item() once per step.")
    want, want_losses = trained("ok")
    flat = lambda model: nn.utils.parameters_to_vector(model.parameters()).detach()  # noqa: E731
    compare(flat(student), flat(want), "after training a small model, its weights (flattened) against chapter 5's "
            "recipe", "use AdamW(param_groups(model, weight_decay), betas=(0.9, 0.95)), lr_at(step, lr, min_lr, "
            "warmup_steps, steps) for the rate, then zero_grad, backward, clip_grad_norm, step, in that order.",
            variants=[(lambda v=v: flat(trained(v)[0]), hint) for v, hint in _TRAIN_VARIANTS])
    # a loss is a mean of a few hundred float32 squares of size about 100
    compare(torch.tensor(losses, dtype=torch.float64), torch.tensor(want_losses, dtype=torch.float64),
            "the losses train returned", "append loss.item() once per step: the loss of that step's batch, "
            "computed before its update.", tol=(1e-4, 1e-5))
    _check_train_bf16(train, trained, batches, recipe)


# The first two losses of the same recipe under bf16 autocast, student and oracle, were equal
# on 11 draws; in float32 or float16 they differ by 3e-5 to 4e-4 of the loss (measured on the
# same draws). Two steps: later ones may round a weight to the other side in bf16.
BF16_TOL = (0.0, 5e-6)


def _check_train_bf16(train, trained, batches: list, recipe: tuple) -> None:
    """use_bf16=True on the CPU: the losses of two steps of the same recipe, computed under bf16 autocast."""
    _, lr, min_lr, _, clip, wd = recipe
    steps = 2
    student, _ = trained(None)
    losses = call(train, student, lambda step: batches[step], lambda m, x, y: F.mse_loss(m(x), y), steps, lr,
                  min_lr, 1, "cpu", use_bf16=True, weight_decay=wd, clip=clip, progress=False, name="train")

    def oracle(dtype):
        model, _ = trained(None)
        return torch.tensor(_train_oracle(model, batches, steps, lr, min_lr, 1, clip, wd, autocast=dtype),
                            dtype=torch.float64)

    got = torch.tensor(losses, dtype=torch.float64) if isinstance(losses, list) else losses
    compare(got, oracle(torch.bfloat16), "the losses train returned with use_bf16=True on the CPU, against chapter "
            "5's recipe with the loss computed under bf16 autocast",
            "under use_bf16, run the forward pass and the loss inside torch.autocast(device_type, "
            "dtype=torch.bfloat16), with device_type the type of the device train is given (here the CPU); the "
            "backward pass and the optimizer step stay outside it.", tol=BF16_TOL, variants=[
                (lambda: oracle(None), "use_bf16=True changed nothing: on any device, not only on CUDA, the forward "
                                       "pass and the loss run under bf16 autocast (torch.autocast with the "
                                       "device's type) when use_bf16 is set."),
                (lambda: oracle(torch.float16), "the autocast dtype was float16: use_bf16 asks for "
                                                "dtype=torch.bfloat16.")])

# ----------------------------------------------------------------------------- exercise 3

def _favoured(window: list[int], vocab: int) -> int:
    """The token :class:`_ScriptedLM` favours after ``window``, the ids it was given."""
    return (sum(window) + 1) % vocab


def _argmax_chain(prompt: list[int], n_new: int, vocab: int, context: int) -> list[int]:
    """The ``n_new`` ids that follow ``prompt`` when each step gives the model the last ``context`` ids."""
    ids = list(prompt)
    for _ in range(n_new):
        ids.append(_favoured(ids[-context:], vocab))
    return ids[len(prompt):]


class _ScriptedLM(nn.Module):
    """Logits at position t that favour token (sum of the ids up to t + 1) % V, and token 0 a
    little less: the next token depends on every id the model is given, not only the last one.
    Refuses inputs longer than block_size. ids (B, T) -> logits (B, T, V)."""

    def __init__(self, vocab: int, block_size: int):
        super().__init__()
        self.vocab, self.block_size = vocab, block_size

    def forward(self, ids):
        if ids.shape[1] > self.block_size:
            raise IndexError(f"sequence of {ids.shape[1]} is longer than block_size {self.block_size}")
        logits = torch.zeros(ids.shape[0], ids.shape[1], self.vocab)
        logits.scatter_(2, ((ids.cumsum(1) + 1) % self.vocab)[..., None], 3.0)
        logits[..., 0] += 2.5
        return logits


class _ConstantLM(nn.Module):
    """The same logits at every position, whatever the input."""

    def __init__(self, logits: torch.Tensor):
        super().__init__()
        self.logits = logits

    def forward(self, ids):
        return self.logits.expand(ids.shape[0], ids.shape[1], -1).clone()


def check_generate(generate, sample_next_token, process_logits, hidden: bool = False) -> None:
    """generate's own behaviour, on scripted models whose every sample can be told."""
    tools = dict(process_logits=process_logits, sample_next_token=sample_next_token)
    with earlier_first(*_tools_first("generate", tools, hidden)):
        _check_generate(generate, hidden)


def _generate_case(d) -> tuple:
    vocab, block = d.rng.randrange(5, 31), d.rng.randrange(2, 9)
    return vocab, block, d.randint(0, vocab, (1, d.rng.randrange(1, block + 4))), d.rng.randrange(5, 30)


def _check_generate(generate, hidden: bool) -> None:
    d = draw("generate", hidden)
    for vocab, block, prompt, n_new in d.cases([(10, 4, torch.tensor([[3, 4, 5]]), 8)], _generate_case, 1):
        _check_continuation(generate, _ScriptedLM(vocab, block), prompt, n_new, d)
    # Temperature: many tokens from fixed logits, on a fixed stream (a right answer must not fail
    # by chance under some grading seed); the share of the top token is within 3.6 sigma.
    flat = _ConstantLM(torch.tensor([2.0, 1.0] + [0.0] * 8))
    for temperature in (0.5, 2.0):
        sample = call(generate, flat, torch.zeros(1, 1, dtype=torch.long), 2000, 4, temperature, None,
                      draw("generate/temperature", False).gen)[0, 1:]
        share, want = (sample == 0).float().mean().item(), torch.softmax(flat.logits / temperature, dim=0)[0].item()
        expect(abs(share - want) < 0.04, f"at temperature {temperature} the most likely token was sampled "
               f"{share:.1%} of the time, expected {want:.1%}.",
               "pass temperature on to sample_next_token(logits, generator, temperature, top_k).")
    model, prompt = _ScriptedLM(10, 4), torch.tensor([[3, 4, 5]])
    a, b = (call(generate, model, prompt, 20, 4, 1.0, None, d.sub("same seed").gen) for _ in range(2))
    compare(b, a, "the second of two runs with generators of the same seed (expected: the first run)",
            "pass the generator on: sample_next_token(logits, generator, temperature, top_k).")
    cold = call(generate, model, prompt, 30, 4, 0.05, None, d.sub("cold").gen)
    chain = [_favoured(cold[0, max(0, t - 4):t].tolist(), 10) for t in range(3, cold.shape[1])]
    expect((cold[0, 3:] == torch.tensor(chain)).float().mean() > 0.95,
           "at temperature 0.05 sampling should almost always pick the most likely token.",
           "pass temperature on to sample_next_token(logits, generator, temperature, top_k).")
    if hidden:
        # At temperature 5 every token has probability >= 1/12 at each step: 400 samples reach
        # all of them except with probability below 1e-13.
        hot = call(generate, model, prompt, 400, 4, 5.0, None, d.sub("hot").gen)
        expect(len(set(hot[0].tolist())) == 10, "at temperature 5 sampling should reach every token.",
               "pass temperature on to sample_next_token: a high temperature flattens the distribution.")


def _check_continuation(generate, model: _ScriptedLM, prompt: torch.Tensor, n_new: int, d) -> None:
    """The context cropped to block_size, the prompt kept, top_k=1 following the argmax chain
    and top_k=2 keeping to the two largest logits; prompt (1, P) -> output (1, P + n_new)."""
    P, vocab, block = prompt.shape[1], model.vocab, model.block_size
    try:
        out = generate(model, prompt.clone(), n_new, block, 1.0, 1)
    except IndexError as err:
        fail(f"generate fed the model more than block_size tokens ({err}).",
             "the model reads at most block_size ids (its position table has block_size rows): crop the context "
             "to the most recent block_size ids before each forward pass.")
    except NotImplementedError as err:
        raise not_written(err, "generate")
    expect_tensor(out, (1, P + n_new), "generate output")
    compare(out[:, :P], prompt, "the start of the output (the prompt)", "concatenate new ids after it.")
    start = prompt[0].tolist()
    compare(out[0, P:].tolist(), _argmax_chain(start, n_new, vocab, block),
            f"with top_k=1, the continuation of {start} by a model whose next token depends on all {block} ids it "
            f"is given (the argmax chain)", "draw from the logits of the last position the model was given, with "
            "top_k passed on.", variants=[
                (_argmax_chain(start, n_new, vocab, 1), "generate gave the model only the last id: the model "
                 "predicts from all the context it is given, so give it the most recent block_size ids (all of "
                 "them while there are fewer)."),
                (lambda: _argmax_chain(start, n_new, vocab, block - 1), "the model was given one id fewer than "
                 "block_size: the context is the most recent block_size ids, the newest included.")])
    # top_k=2: only the favoured token and 0 may follow (unless the favoured one is 0 itself: ties).
    two = call(generate, model, prompt, 60, block, d.rng.uniform(0.5, 3.0), 2, d.sub("top2").gen)[0].tolist()
    for t in range(P, len(two)):
        best = _favoured(two[max(0, t - block):t], vocab)
        expect(best == 0 or two[t] in (best, 0), f"with top_k=2 the token {two[t]} followed {two[max(0, t - 3):t]}, but "
               f"only {best} and 0 had the two largest logits.",
               "pass top_k on to sample_next_token(logits, generator, temperature, top_k).")

# ----------------------------------------------------------------------------- exercise 4

def check_seq2seq(build_g2p, Block, hidden: bool = False) -> None:
    with earlier_first(*_built_from_block("Seq2Seq", Block, hidden)):
        _check_seq2seq(build_g2p, hidden)
        _check_block_reference(Block, hidden)


def _check_seq2seq(build_g2p, hidden: bool) -> None:
    d = draw("seq2seq", hidden)
    # vocabularies other than max_len: the positional table is told apart by its shape
    src_vocab, tgt_vocab, B, S, T, n_pad = 20, 15, 2, 7, 6, 5
    if hidden:
        src_vocab = d.rng.choice([v for v in range(8, 41) if v != S2S_MAX_LEN])
        tgt_vocab, B, S, T, n_pad = (d.rng.randrange(*r) for r in ((6, 31), (1, 4), (3, 11), (5, 9), (1, 7)))
    with d.seeded():
        model = call(build_g2p, TINY_S2S, src_vocab, tgt_vocab, name="build_g2p").eval()
    src, tgt = d.randint(3, src_vocab, (B, S)), d.randint(3, tgt_vocab, (B, T))
    tgt[:, 0] = data.BOS
    if src[0, 0] == src[0, -1]:
        src[0, -1] = (src[0, 0] - 3 + 1) % (src_vocab - 3) + 3   # so that reversing the source changes it
    with torch.no_grad():
        logits = call(model, src, tgt, name="Seq2Seq.forward")
        expect_tensor(logits, (B, T, tgt_vocab), "Seq2Seq logits")
        expect(_tied(model), "the output projection does not share the phoneme embedding's weight.",
               "tie them: self.head.weight = self.tgt_tok.weight (the target-side embedding).")
        memory = call(model.encode, src, name="Seq2Seq.encode")[0]
        expect_tensor(memory, (B, S, TINY_S2S.d_model), "encode's memory")
        expect(not matches(model.encode(_bumped(src, -1, 3, src_vocab))[0][:, 0], memory[:, 0]),
               "changing the last letter of the source left the encoder's output at the first letter unchanged.",
               "the encoder reads the whole word: its blocks are not causal (Block(..., causal=False)); only the "
               "decoder's self-attention is.")
        compare(model(src, _bumped(tgt, 4, 3, tgt_vocab))[:, :4], logits[:, :4], "the decoder's outputs at "
                "positions 0-3 after a change of target token 4", "the decoder's self-attention must be causal "
                "(causal=True: the lower-triangular mask); cross-attention needs no causal mask.")
        compare(model(torch.cat([src, torch.full((B, n_pad), data.PAD)], dim=1), tgt), logits,
                "the outputs after adding PAD tokens to the end of the source", "mask PAD in the source: encoder "
                "self-attention and decoder cross-attention both take mask = (src != PAD)[:, None, None, :].",
                tol=PROPERTY_TOL)
        expect((model(src.flip(1), tgt) - logits).abs().max() > 1e-4, "reversing the source left the outputs "
               "unchanged.", "the encoder needs positional embeddings too.")
    _check_model_dropout(build_g2p, "build_g2p", TINY_S2S, (src_vocab, tgt_vocab),
                         {"memory (encode)": lambda m: m.encode(src)[0], "logits": lambda m: m(src, tgt)}, "Seq2Seq")
    depth = dataclasses.replace(TINY_S2S, n_layers=d.rng.choice([1, 4]) if hidden else 3)
    width = depth.d_model
    fixed = (src_vocab + tgt_vocab + S2S_MAX_LEN + 4) * width
    _check_parameter_count(build_g2p, "build_g2p", depth, (src_vocab, tgt_vocab), (fixed, fixed + S2S_MAX_LEN * width),
                           "Seq2Seq",
                           f"a letter table ({src_vocab}, {width}), a phoneme table ({tgt_vocab}, {width}) whose weight "
                           f"the output projection shares (it has no bias), a positional table ({S2S_MAX_LEN}, {width}) "
                           "(or one for each side), the encoder's and the decoder's final LayerNorms",
                           {"the encoder": _block_parameters(width), "the decoder": _block_parameters(width, True)})
    # Pre-LN blocks carry a constant added to the positional tables along the residual stream;
    # the encoder's and the decoder's final LayerNorms remove it.
    state, names = _position_tables(model, S2S_MAX_LEN, TINY_S2S.d_model)
    if names:
        shift = d.rng.uniform(1.0, 3.0)
        compare(_shifted_logits(model, state, names, (src,), shift, run=model.encode)[0], memory,
                "encode's memory after adding the same number to every entry of the positional embedding",
                "the encoder's blocks are Pre-LN, so its output needs a final LayerNorm: return ln_enc(x), mask.",
                tol=PROPERTY_TOL)
        compare(_shifted_logits(model, state, names, (src, tgt), shift), logits, "the logits after adding the "
                "same number to every entry of the positional embedding", "the decoder's blocks are Pre-LN, so the "
                "logits need a final LayerNorm before the output projection: head(ln_dec(x)).", tol=PROPERTY_TOL)

# ----------------------------------------------------------------------------- exercise 5

class _ScriptedSeq2Seq(nn.Module):
    """A scripted encoder-decoder: a constant memory without PAD, and ``decode`` in each subclass."""

    def encode(self, src):
        return torch.zeros(src.shape[0], 1, 1), torch.ones(src.shape[0], 1, 1, 1, dtype=torch.bool)

    def forward(self, src, tgt_in):
        return self.decode(tgt_in, *self.encode(src))


class _TableSeq2Seq(_ScriptedSeq2Seq):
    """Next-token probabilities looked up by prefix (BOS first): ``table[prefix] = {id: p}``; the
    rest of the mass is spread evenly over the other ids (never PAD or BOS), at least 1e-6 each.
    A prefix not in the table ends: EOS with probability ``end``. The source is ignored."""

    def __init__(self, vocab: int, table: dict, end: float = 0.6, offsets: dict | None = None):
        super().__init__()
        self.vocab, self.table, self.end, self.offsets = vocab, table, end, offsets or {}

    def _row(self, prefix: tuple) -> torch.Tensor:
        chosen = self.table.get(prefix, {data.EOS: self.end})
        others = [i for i in range(3, self.vocab) if i not in chosen] + ([data.EOS] if data.EOS not in chosen else [])
        row = torch.full((self.vocab,), 1e-9)
        row[others] = max((1 - sum(chosen.values())) / len(others), 1e-6)
        row[list(chosen)] = torch.tensor(list(chosen.values()))
        return row

    def decode(self, tgt_in, memory, mask):
        """Log-probabilities, plus ``offsets[prefix]`` on a prefix's whole row: unnormalised scores
        with the same softmax. tgt_in (B, T) -> (B, T, vocab)."""
        rows = [[self._row(p).log() + self.offsets.get(p, 0.0) for p in (tuple(r[: t + 1]) for t in range(len(r)))]
                for r in tgt_in.tolist()]
        return torch.stack([torch.stack(r) for r in rows])


def _trap(vocab: int = 6, A: int = 3, B: int = 4, C: int = 5, a: float = 0.6, b: float = 0.4,
          e: float = 0.55) -> _TableSeq2Seq:
    """Greedy picks A (probability a) then EOS (e > 1/2): a e = 0.33; beam search finds B (b) then
    EOS (1): b = 0.4. After A, C (1 - e) then EOS."""
    model = _TableSeq2Seq(vocab, {(data.BOS,): {A: a, B: b}, (data.BOS, A): {data.EOS: e, C: 1 - e}}, end=1.0)
    model.A, model.B, model.a, model.b, model.e = A, B, a, b, e
    return model


def _unnormalised(trap: _TableSeq2Seq, shift: float) -> _TableSeq2Seq:
    """``trap`` whose scores after [A] are raised by ``shift`` and after [B] lowered by it: the
    same probabilities, but summed raw scores then rank [A] (or [A, C]) above [B]."""
    A, B = trap.A, trap.B
    trap.offsets = {(data.BOS, A): shift, (data.BOS, B): -shift, (data.BOS,): -shift / 2}
    return trap


def _drawn_trap(rng: random.Random) -> _TableSeq2Seq:
    """:func:`_trap` with drawn ids and probabilities, where b > 1.1 a e, so [B] beats [A] by a
    clear margin and [A, C] scores lower than [B] whatever the search does after both end."""
    vocab = rng.randrange(6, 41)
    A, B, C = rng.sample(range(3, vocab), 3)
    while True:
        a, e = rng.uniform(0.5, 0.7), rng.uniform(0.52, 0.8)
        b = rng.uniform(0.25, min(a - 0.05, 0.98 - a))
        if b > 1.1 * a * e and math.log(a * (1 - e)) / 3 < math.log(b) / 2 - 0.05:
            return _trap(vocab, A, B, C, a, b, e)


class _PathsSeq2Seq(_ScriptedSeq2Seq):
    """Each source row has a path (0 to 6 tokens) that is far the most likely: each next token of
    the path (then EOS) has probability 0.9 to 0.97, any other token at most 0.1 while on the path
    and at most 3 / vocab <= 0.3 once off it (vocab >= 10). Greedy decoding and beam search (any
    beam size, max_len >= path length + 2) both return exactly the path: its mean log-probability
    is above log(0.9) = -0.11, any other hypothesis's (finished or cut at max_len) below -0.38."""

    def __init__(self, d, rows: int, vocab: int, max_len: int):
        super().__init__()
        self.vocab = vocab
        sources: list[tuple[int, ...]] = []
        while len(sources) < rows:
            row = tuple(d.rng.randrange(3, vocab) for _ in range(d.rng.randrange(2, 8)))
            if row not in sources:
                sources.append(row)
        width = max(map(len, sources))
        self.src = torch.tensor([list(r) + [data.PAD] * (width - len(r)) for r in sources])   # (rows, S)
        self.paths = [[d.rng.randrange(3, vocab) for _ in range(d.rng.randrange(0, 7))] for _ in range(rows)]
        self.p = d.uniform(0.9, 0.97, rows, max_len + 8)
        self.rest = d.uniform(0.5, 1.5, rows, max_len + 8, vocab)                  # off-path weights

    def encode(self, src):
        return src.float()[:, :, None], (src != data.PAD)[:, None, None, :]

    def decode(self, tgt_in, memory, mask):
        keys = [tuple(row) for row in self.src.tolist()]
        probs = torch.empty(*tgt_in.shape, self.vocab)
        for b, prefix in enumerate(tgt_in.tolist()):
            r = keys.index(tuple(int(v) for v in memory[b, :, 0].tolist()))      # the source row picks the path
            want = [data.BOS] + self.paths[r] + [data.EOS]
            for t in range(len(prefix)):
                rest = self.rest[r, t].clone()
                if t + 1 < len(want) and prefix[: t + 1] == want[: t + 1]:
                    rest[want[t + 1]] = 0.0
                    probs[b, t] = rest / rest.sum() * (1 - self.p[r, t])
                    probs[b, t, want[t + 1]] = self.p[r, t]
                else:
                    probs[b, t] = rest / rest.sum()
        return probs.log()


def _greedy_rows(greedy_decode, model, src, max_len: int, want_first: int | None = None,
                 want: list[list[int]] | None = None) -> None:
    out = call(greedy_decode, model, src, max_len, name="greedy_decode")
    expect(isinstance(out, list) and len(out) == src.shape[0], "greedy_decode should return one list of ids per "
           "source row.", "return a Python list of lists (one per batch row).")
    for i, row in enumerate(map(list, out)):
        expect(row[:1] != [data.BOS], "the decoded ids start with BOS.",
               "drop the BOS you started from: return ys[:, 1:].")
        expect(data.EOS not in row, f"a decoded row contains EOS: {row}.",
               "cut each row at its first EOS, and do not include the EOS.")
        if want_first is not None:
            expect(row[:1] == [want_first], f"greedy decoding should take the most likely first token; got {row}.",
                   "take argmax over the last position's logits at each step.")
        if want is not None:
            compare(row, want[i], f"greedy decoding of row {i} (its most likely path)",
                    "take argmax over the last position's logits at each step.", variants=[
                        (when(lambda got: len(got) < len(want[i]) and got == want[i][:len(got)]),
                         "this row stopped before its own EOS: keep decoding until every row has produced EOS (or "
                         "max_len is reached), then cut each row at its first EOS.")])


def _chain(rng: random.Random | None) -> tuple[_TableSeq2Seq, list[int]]:
    """A model whose most likely output is a chain of 3 to 6 ids, each next id with probability
    0.9 (then EOS): (model, chain)."""
    vocab, chain = 9, [3, 4, 5, 6]
    if rng is not None:
        vocab = rng.randrange(9, 31)
        chain = rng.sample(range(3, vocab), rng.randrange(3, 7))
    steps = [data.BOS, *chain]
    table = {tuple(steps[:i + 1]): {nxt: 0.9} for i, nxt in enumerate(chain)} | {tuple(steps): {data.EOS: 0.9}}
    return _TableSeq2Seq(vocab, table), chain


_MAX_LEN = ("stop after max_len steps even when no EOS was produced: max_len bounds the generated ids (EOS "
            "included), and the search must use the max_len it is given.")


def _check_max_len(greedy_decode, beam_search, rng: random.Random | None) -> None:
    """max_len bounds the generated ids: a chain longer than max_len comes back cut after max_len ids."""
    model, chain = _chain(rng)
    max_len = rng.randrange(1, len(chain)) if rng is not None else 2
    src = torch.full((1, 3), 3)
    hint = _MAX_LEN
    if beam_search is None:
        compare(list(call(greedy_decode, model, src, max_len, name="greedy_decode")[0]), chain[:max_len],
                f"greedy_decode with max_len={max_len} on a model whose most likely output is {chain}", hint)
    else:
        compare(_beam(beam_search, greedy_decode, model, src, 2, max_len), chain[:max_len],
                f"beam_search with beam_size=2 and max_len={max_len} on a model whose most likely output is {chain}",
                hint)


def check_greedy_decode(greedy_decode, hidden: bool = False) -> None:
    _greedy_rows(greedy_decode, _trap(), torch.ones(3, 4, dtype=torch.long), 10, want_first=_trap().A)
    _check_max_len(greedy_decode, None, draw("greedy_decode/max_len", hidden).rng if hidden else None)
    if not hidden:
        return
    d = draw("greedy_decode", hidden)
    trap = _drawn_trap(d.rng)
    src = d.randint(3, trap.vocab, (d.rng.randrange(1, 5), d.rng.randrange(1, 9)))
    _greedy_rows(greedy_decode, trap, src, d.rng.randrange(3, 25), want_first=trap.A)
    max_len = d.rng.randrange(8, 25)
    model = _PathsSeq2Seq(d, d.rng.randrange(2, 6), d.rng.randrange(10, 41), max_len)
    # Rows must end at least two steps apart: a row cut one step early (before its EOS) looks whole.
    paths = model.paths
    longest = max(range(len(paths)), key=lambda r: len(paths[r]))
    paths[longest] += [3, 4] if len(paths[longest]) < 2 else []
    if len(paths[longest]) - min(map(len, paths)) < 2:
        other = (longest + 1) % len(paths)
        paths[other] = paths[other][:len(paths[longest]) - 2]
    _greedy_rows(greedy_decode, model, model.src, max_len, want=paths)


def _beam(beam_search, greedy_decode, model, src, beam_size: int, max_len: int) -> list:
    """beam_search's best hypothesis, checked to hold no BOS or EOS, after checking that one
    beam gives greedy decoding's result."""
    one = list(call(beam_search, model, src, 1, max_len, name="beam_search"))
    compare(one, list(call(greedy_decode, model, src, max_len)[0]), "beam_search with beam_size=1 (expected: what "
            "greedy_decode gives)", "with one beam, beam search must reduce to greedy decoding.",
            variants=[(when(lambda got: len(got) > max_len), _MAX_LEN)])
    best = list(call(beam_search, model, src, beam_size, max_len, name="beam_search"))
    expect(data.EOS not in best and data.BOS not in best, f"beam_search returned {best}, which contains BOS or EOS.",
           "strip BOS and EOS from the result.")
    return best


def _beam_trap(beam_search, greedy_decode, model, src, max_len: int, beam_size: int) -> None:
    compare(_beam(beam_search, greedy_decode, model, src, beam_size, max_len), [model.B],
            f"beam_search with beam_size={beam_size}, where [{model.A}] has probability {model.a * model.e:.2g} and "
            f"[{model.B}] {model.b:.2g},", "score = sum of log-probabilities / number of generated tokens, EOS "
            "included.", variants=[([model.A], "keep beam_size candidates at every step and compare finished "
                                    "hypotheses by their summed log-prob divided by their length (EOS included).")])


def _check_scores_normalised(beam_search, greedy_decode, d) -> None:
    """The trap with a decoder that returns unnormalised scores (its rows' softmax unchanged):
    only a step_fn that turns them into log-probabilities still finds [B]."""
    trap = _unnormalised(_drawn_trap(d.rng) if d.hidden else _trap(), round(d.rng.uniform(2.0, 5.0), 2))
    src = d.randint(3, trap.vocab, (1, d.rng.randrange(1, 9))) if d.hidden else torch.ones(1, 4, dtype=torch.long)
    compare(_beam(beam_search, greedy_decode, trap, src, 2, 10), [trap.B], "beam_search with beam_size=2 on the "
            "model of the test above, whose decode now returns scores that are not log-probabilities (the same "
            "softmax: each row moved by a constant),",
            "the decoder's logits are scores, not log-probabilities: step_fn must normalise the last position's "
            "logits (log_softmax over the vocabulary) before beam_search_core adds them up.")


def _length_trap(rng: random.Random | None) -> tuple[_TableSeq2Seq, list[int], list[int], int, int]:
    """A model where the best hypothesis by mean log-probability is long ([Y, chain...]) and the
    best by summed log-probability is short ([X]): (model, long, short, beam_size, max_len).
    Both facts are verified with chapter 6's beam search oracle before the trap is used."""
    for _ in range(200):
        vocab, m, beam, (X, Y, *chain), px, e, py, q = 12, 2, 2, [3, 4, 5, 6], 0.5, 0.5, 0.22, 0.96
        if rng is not None:
            vocab, m, beam = rng.randrange(12, 31), rng.randrange(1, 4), rng.randrange(2, 5)
            X, Y, *chain = rng.sample(range(3, vocab), 2 + m)
            px, e = rng.uniform(0.45, 0.6), rng.uniform(0.45, 0.6)
            py, q = rng.uniform(0.12, 0.3), rng.uniform(0.9, 0.98)
        table = {(data.BOS,): {X: px, Y: py}, (data.BOS, X): {data.EOS: e}}
        prefix = (data.BOS, Y)
        for token in chain + [data.EOS]:
            table[prefix] = {token: q}
            prefix += (token,)
        model = _TableSeq2Seq(vocab, table)
        max_len = m + 3 + (0 if rng is None else rng.randrange(0, 4))

        def best(beam_size, variant="ok", model=model):
            return ch06._beam_oracle(lambda prefixes: model.decode(prefixes, None, None)[:, -1], data.BOS, data.EOS,
                                     beam_size, max_len, 1.0, variant)[0][0]

        if best(beam) == [Y, *chain, data.EOS] and best(beam, "no_norm") == best(1) == [X, data.EOS]:
            return model, [Y, *chain], [X], beam, max_len
    raise RuntimeError("could not draw a length trap")   # pragma: no cover - the draws above always succeed


def _check_length_trap(beam_search, greedy_decode, rng) -> None:
    model, long, short, beam_size, max_len = _length_trap(rng)
    compare(_beam(beam_search, greedy_decode, model, torch.full((1, 3), 3), beam_size, max_len), long,
            f"beam_search with beam_size={beam_size}, where {short} (2 tokens with EOS) has the larger summed "
            f"log-probability and {long} ({len(long) + 1} tokens) the larger mean per token,",
            "return the first hypothesis of beam_search_core(step_fn, BOS, EOS, beam_size, max_len, 1.0), without "
            "its EOS.", variants=[(short, "the hypotheses were ranked by their summed log-probability, which favours "
                                   "short ones: rank them by sum / number of generated tokens (EOS included): "
                                   "beam_search_core(..., length_penalty=1.0), and return its first (best) "
                                   "hypothesis.")])


def check_beam_search(beam_search, greedy_decode, beam_search_core, hidden: bool = False) -> None:
    """beam_search's own behaviour, on scripted models whose best hypothesis is known."""
    with earlier_first(*_tools_first("beam_search", dict(beam_search_core=beam_search_core), hidden)):
        _check_beam_search(beam_search, greedy_decode, hidden)


def _check_beam_search(beam_search, greedy_decode, hidden: bool) -> None:
    d = draw("capstone/beam_search", hidden)
    _beam_trap(beam_search, greedy_decode, _trap(), torch.ones(1, 4, dtype=torch.long), 10, 2)
    _check_scores_normalised(beam_search, greedy_decode, d.sub("unnormalised"))
    _check_max_len(greedy_decode, beam_search, d.sub("max_len").rng if hidden else None)
    _check_length_trap(beam_search, greedy_decode, d.sub("length").rng if hidden else None)
    if not hidden:
        return
    trap = _drawn_trap(d.rng)
    _beam_trap(beam_search, greedy_decode, trap, d.randint(3, trap.vocab, (1, d.rng.randrange(1, 9))),
               d.rng.randrange(4, 25), d.rng.choice([2, 3]))
    max_len = d.rng.randrange(9, 25)
    paths = _PathsSeq2Seq(d, 1, d.rng.randrange(10, 41), max_len)
    beam_size = d.rng.randrange(2, 5)
    compare(_beam(beam_search, greedy_decode, paths, paths.src, beam_size, max_len), paths.paths[0],
            f"beam_search with beam_size={beam_size} on a model whose most likely sequence is known",
            "score = sum of log-probabilities / number of generated tokens, EOS included.")

# ----------------------------------------------------------------------------- exercise 6

def check_classifier(build_classifier, Block, hidden: bool = False) -> None:
    with earlier_first(*_built_from_block("EncoderClassifier", Block, hidden)):
        _check_classifier(build_classifier, hidden)
        _check_block_reference(Block, hidden)


def _check_classifier(build_classifier, hidden: bool) -> None:
    d = draw("classifier", hidden)
    vocab, n_classes, B, n = 40, 6, 3, 8
    if hidden:   # a vocabulary other than max_len; n + 2 < max_len: the inputs below differ in their PAD count
        vocab = d.rng.choice([v for v in range(10, 61) if v != TINY_CLS.max_len])
        n_classes, B, n = d.rng.randrange(2, 9), d.rng.randrange(1, 5), d.rng.randrange(3, TINY_CLS.max_len - 2)
    with d.seeded():
        model = call(build_classifier, TINY_CLS, vocab, n_classes, name="build_classifier").eval()
    ids = d.randint(2, vocab, (B, n))
    if ids[0, 0] == ids[0, -1]:
        ids[0, -1] = (ids[0, 0] - 2 + 1) % (vocab - 2) + 2   # so that reversing the words changes them
    padded = torch.cat([ids, torch.zeros(B, TINY_CLS.max_len - n, dtype=torch.long)], dim=1)
    flipped = torch.cat([ids.flip(1), padded[:, n:]], dim=1)
    with torch.no_grad():
        logits = call(model, padded, name="EncoderClassifier.forward")
        expect_tensor(logits, (B, n_classes), "classifier logits")
        compare(model(torch.cat([ids, torch.zeros(B, 2, dtype=torch.long)], dim=1)), logits, "the logits for the "
                "same words with less padding", "PAD must change nothing: mask it in attention (pad_mask) and leave "
                "it out of the mean (sum the real positions, divide by their count).", tol=PROPERTY_TOL)
        expect((model(flipped) - logits).abs().max() > 1e-4, "reversing the words left the logits unchanged.",
               "add positional embeddings: without them the encoder cannot see word order.")
    _check_model_dropout(build_classifier, "build_classifier", TINY_CLS, (vocab, n_classes),
                         {"logits": lambda m: m(padded)}, "EncoderClassifier")
    _check_classifier_count(build_classifier, dataclasses.replace(TINY_CLS, n_layers=d.rng.choice([1, 4])
                                                                  if hidden else 3), vocab, n_classes)
    state, names = _position_tables(model, TINY_CLS.max_len, TINY_CLS.d_model)
    if names:
        compare(_shifted_logits(model, state, names, (padded,), d.rng.uniform(1.0, 3.0)), logits,
                "the logits after adding the same number to every entry of the positional embedding",
                "the Pre-LN blocks pass that constant along the residual stream: apply the final LayerNorm to the "
                "encoder's states before pooling them.", tol=PROPERTY_TOL)
    _check_pooling(build_classifier, vocab, n_classes, d.sub("pooling"))
    if names:
        # Without positions, attention over all words and the mean over them ignore word order.
        plain, reversed_ = (_shifted_logits(model, state, names, (batch,), None) for batch in (padded, flipped))
        compare(reversed_, plain, "with the positional table set to zero, the logits for the words reversed",
                "the encoder's blocks must not be causal (Block(..., causal=False)): in a classifier every word "
                "attends to every real word, before and after it.", tol=PROPERTY_TOL)


def _check_classifier_count(build_classifier, cfg, vocab: int, n_classes: int) -> None:
    width = cfg.d_model
    _check_parameter_count(build_classifier, "build_classifier", cfg, (vocab, n_classes),
                           ((vocab + cfg.max_len + 2 + n_classes) * width + n_classes,), "EncoderClassifier",
                           f"a token table ({vocab}, {width}), a positional table ({cfg.max_len}, {width}), a final "
                           f"LayerNorm and a Linear({width}, {n_classes}) head with its bias",
                           {"the encoder": _block_parameters(width)})


def _check_pooling(build_classifier, vocab: int, n_classes: int, d) -> None:
    """With no blocks (n_layers=0) each final state depends on its own word only, so the mean
    over n real words moves by exactly 1/n of what the first word alone moves it."""
    _check_classifier_count(build_classifier, dataclasses.replace(TINY_CLS, n_layers=0), vocab, n_classes)
    with d.seeded():
        flat = call(build_classifier, dataclasses.replace(TINY_CLS, n_layers=0), vocab, n_classes,
                    name="build_classifier").eval()
    n = d.rng.randrange(3, TINY_CLS.max_len - 1) if d.hidden else 5
    a, b = (torch.randperm(vocab - 2, generator=d.gen)[:2] + 2).tolist()
    rest = d.randint(2, vocab, (n - 1,))

    def row(words):
        return list(words) + [data.PAD] * (TINY_CLS.max_len - len(words))

    batch = torch.tensor([row([a, *rest.tolist()]), row([b, *rest.tolist()]), row([a]), row([b]),
                          row([a, *_bumped(rest, -1, 2, vocab).tolist()])])
    with torch.no_grad():
        out = call(flat, batch, name="EncoderClassifier.forward").double()
    both, alone = out[0] - out[1], out[2] - out[3]
    compare(both * n, alone, f"with no blocks, {n} x the change of the logits when the first of {n} words changes "
            f"(it should equal the change for that word alone)", "pool the mean over the real positions only: "
            "(states * mask).sum(1) / mask.sum(1), with mask = (ids != PAD)[..., None].", variants=[
                (when(lambda _: (out[4] - out[0]).abs().max() < 1e-6),
                 "the logits were read from the first position only (changing the last word changed nothing): pool "
                 "the mean of the final states over all real (non-PAD) positions."),
                (when(lambda _: matches(both, alone, (1e-4, 1e-3))), "the real positions were summed, not averaged: "
                 "divide the sum by their number, (ids != PAD).sum(1, keepdim=True).")], tol=(1e-4, 1e-3))

# ----------------------------------------------------------------------------- exercise 7

_ENCODER_PARTS = ("the letter table, the first max_len rows of the position table, each encoder block into the "
                  "block at the same depth, and the encoder's final LayerNorm (the one encode applies last)")
_SHARED = ("load_encoder must copy values: assigning a module or a parameter of the G2P model to the classifier "
           "(classifier.blocks = g2p_model.encoder), or an nn.Parameter made from a slice of its table, shares "
           "memory, so training the classifier would change the graded G2P model. Copy with load_state_dict, or "
           "with weight.copy_(...) under torch.no_grad().")
TRANSFER_TOLERANCE = 1e-3      # relative residual of the affine fit; float32 round-off gives about 1e-6


def check_load_encoder(load_encoder, build_g2p, build_classifier, Block, hidden: bool = False) -> None:
    """After load_encoder(classifier, g2p), the classifier's pooled vector is the masked mean of
    g2p.encode(ids)[0]: its logits are an affine function of that mean, the same function (its
    own head) for two G2P models with other random weights. The G2P model is left unchanged, shares
    nothing with the classifier, and the head is not touched. A failure is blamed on exercise 4
    or 6 when their own tests fail (load_encoder copies from the one into the other)."""
    earlier = earlier_answers("load_encoder", ("copies from your Seq2Seq of exercise 4", 4, build_g2p,
                                               lambda b: check_seq2seq(b, Block, hidden)),
                              ("copies into your EncoderClassifier of exercise 6", 6, build_classifier,
                               lambda b: check_classifier(b, Block, hidden)))
    with earlier_first(*earlier):
        _check_load_encoder(load_encoder, build_g2p, build_classifier, hidden)


def _transfer_case(inputs) -> dict:
    """Sizes for one test: width, depth, heads, the classifier's max_len, both vocabularies and
    the number of classes, all different from each other where a tensor's shape must tell them
    apart (the letter table from the phoneme table, the head from everything else)."""
    if not inputs.hidden:
        return dict(d=20, heads=4, layers=2, max_len=TINY_CLS.max_len, src=22, tgt=27, classes=9, extra=12)
    rng = inputs.rng
    heads = rng.choice([1, 2, 4])
    # the blocks' matrices are (k d, d) and (d, k d) for k = 1 to 4: none may look like a table
    d = rng.choice([heads * k for k in (3, 4, 5, 6) if S2S_MAX_LEN not in (heads * k * m for m in range(1, 5))])
    max_len = rng.choice([n for n in range(5, S2S_MAX_LEN - 3) if n not in (d, 2 * d, 3 * d, 4 * d)])
    taken = {d, 2 * d, 3 * d, 4 * d, max_len, S2S_MAX_LEN}
    src = rng.choice([v for v in range(8, 41) if v not in taken])
    tgt = rng.choice([v for v in range(src + 1, src + 21) if v not in taken])
    classes = rng.choice([c for c in range(2, 16) if c not in taken | {src, tgt}])
    # at least two blocks: copying only the first must show
    return dict(d=d, heads=heads, layers=rng.randrange(2, 4), max_len=max_len, src=src, tgt=tgt, classes=classes,
                extra=rng.randrange(12, 25))


def _buffers(model) -> set[str]:
    return {name for name, _ in model.named_buffers()}



def _random_state(state: dict, d, buffers: set[str] = frozenset()) -> dict:
    """Every floating tensor of a state but its buffers replaced by random values: matrices and
    tables with standard deviation 1/sqrt(last dim), vectors (biases, LayerNorm weights) with 0.5."""
    return {k: (d.randn(*v.shape, dtype=torch.float64) * (v.shape[-1] ** -0.5 if v.dim() >= 2 else 0.5)).to(v.dtype)
            if isinstance(v, torch.Tensor) and v.is_floating_point() and k not in buffers else v
            for k, v in state.items()}

def _snapshot(model) -> dict:
    """The model's state as copies (in-process, state_dict holds the live tensors)."""
    return {k: v.detach().clone() if isinstance(v, torch.Tensor) else v for k, v in dict(model.state_dict()).items()}


def _changed(before: dict, after: dict) -> list[str]:
    return [k for k, v in before.items() if isinstance(v, torch.Tensor) and v.is_floating_point()
            and not (k in after and matches(after[k], v, EXACT))]

def _names(keys: list[str], limit: int = 4) -> str:
    shown = ", ".join(keys[:limit])
    return shown + (f" and {len(keys) - limit} more" if len(keys) > limit else "")


def _pooled_memory(g2p, ids: torch.Tensor) -> torch.Tensor:
    """The mean of g2p.encode(ids)[0] over the real (non-PAD) positions, in float64: (B, d)."""
    with torch.no_grad():
        memory = call(g2p.encode, ids, name="Seq2Seq.encode")[0]
    real = (ids != data.PAD).double()[..., None]
    return (memory.double() * real).sum(1) / real.sum(1)


def _affine_residual(pooled: torch.Tensor, logits: torch.Tensor) -> float:
    """How far logits (B, C) are from an affine function of pooled (B, d): the least-squares
    residual relative to the logits' spread (0 for an exact fit)."""
    x = torch.cat([pooled, torch.ones(len(pooled), 1, dtype=torch.float64)], dim=1)
    y = logits.double()
    residual = y - x @ torch.linalg.lstsq(x, y).solution
    return float(residual.norm() / (y - y.mean(0)).norm().clamp_min(1e-12))


def _transfer_run(load_encoder, g2p, classifier, g_state: dict, c_state: dict, ids: torch.Tensor,
                  head: list[str]) -> dict:
    """Load the two random states, call load_encoder, and check what cannot be an earlier
    exercise's fault: the G2P model unchanged, the head untouched. Returns the states and the
    classifier's logits."""
    g2p.load_state_dict(g_state)
    classifier.load_state_dict(c_state)
    g_before, c_before = _snapshot(g2p), _snapshot(classifier)
    try:
        out = call(load_encoder, classifier, g2p, name="load_encoder")
    except CheckFailed as err:
        if "leaf Variable that requires grad" in err.what:
            with own_fault():
                fail(f"load_encoder raised an error: {err.what.splitlines()[0]}",
                     "copying into a parameter with copy_ is an in-place change that autograd refuses: do it "
                     "inside with torch.no_grad(): (load_state_dict does that for you).")
        raise
    g_after, c_after = _snapshot(g2p), _snapshot(classifier)
    with own_fault():
        moved = _changed(g_before, g_after)
        expect(not moved, f"load_encoder changed the G2P model: {_names(moved)}.",
               "copy from g2p_model into the classifier, never the other way: load_encoder(classifier, g2p_model) "
               "writes only into the classifier, and the G2P model was graded already.")
        touched = [k for k in _changed(c_before, c_after) if k in head]
        expect(not touched, f"load_encoder changed the classifier's {_names(touched)}, whose shape holds the "
               f"number of classes: its head.",
               composed("leave the head as build_classifier made it: the G2P model has nothing to give it, so only the "
                        "encoder's parts are copied ({parts}).", parts=_ENCODER_PARTS))
        expect(_changed(c_before, c_after),
               f"after load_encoder, every weight of the classifier still had the value it had before (load_encoder "
               f"returned {out.__class__.__name__} instead)." if out is not None else
               "after load_encoder, every weight of the classifier still had the value it had before.",
               composed("copy into the classifier that load_encoder receives, in place (it returns None; the training "
                        "cell ignores what it returns): {parts}.", parts=_ENCODER_PARTS))
    with torch.no_grad():
        logits = call(classifier, ids, name="EncoderClassifier.forward")
    expect_tensor(logits, (ids.shape[0], logits.shape[-1]), "classifier logits")
    return dict(g=g_after, c_before=c_before, c=c_after, logits=logits.double(), pooled=_pooled_memory(g2p, ids))



def _check_load_encoder(load_encoder, build_g2p, build_classifier, hidden: bool) -> None:
    d = draw("capstone/load_encoder", hidden)
    case = _transfer_case(d)
    width, max_len, src_vocab, n_classes = case["d"], case["max_len"], case["src"], case["classes"]
    shape = dict(d_model=width, n_layers=case["layers"], n_heads=case["heads"])
    with d.sub("init").seeded():
        g2p = call(build_g2p, dataclasses.replace(TINY_S2S, **shape), src_vocab, case["tgt"], name="build_g2p").eval()
        classifier = call(build_classifier, dataclasses.replace(TINY_CLS, **shape, max_len=max_len), src_vocab,
                          n_classes, name="build_classifier").eval()
    B = width + 1 + case["extra"]           # more words than unknowns of the affine fit per class
    lengths = d.randint(1, max_len + 1, (B,))
    lengths[0] = max_len                    # every position is used
    ids = d.randint(3, src_vocab, (B, max_len))
    ids[torch.arange(max_len)[None, :] >= lengths[:, None]] = data.PAD
    g_shape, c_shape = _snapshot(g2p), _snapshot(classifier)
    g_buffers, c_buffers = _buffers(g2p), _buffers(classifier)
    head = [k for k, v in c_shape.items() if isinstance(v, torch.Tensor) and n_classes in tuple(v.shape)]
    c_state = _random_state(c_shape, d, c_buffers)
    first = _transfer_run(load_encoder, g2p, classifier, _random_state(g_shape, d, g_buffers), c_state, ids, head)
    # No sharing: new values in every weight of the classifier leave the G2P model as it was.
    classifier.load_state_dict(_random_state(c_shape, d, c_buffers))
    with own_fault():
        moved = _changed(first["g"], _snapshot(g2p))
        expect(not moved, f"after load_encoder, changing the classifier's weights changed the G2P model's "
               f"{_names(moved)}: the two models share tensors.", _SHARED)
    second = _transfer_run(load_encoder, g2p, classifier, _random_state(g_shape, d, g_buffers), c_state, ids, head)
    own = [_affine_residual(run["pooled"], run["logits"]) for run in (first, second)]
    both = _affine_residual(torch.cat([first["pooled"], second["pooled"]]),
                            torch.cat([first["logits"], second["logits"]]))
    if max(own) <= TRANSFER_TOLERANCE and both <= TRANSFER_TOLERANCE:
        return
    _diagnose_transfer(first, g2p, ids, dict(case, head=head, buffers=c_buffers))
    where = f"{B} words of up to {max_len} letters, d_model {width}, {case['layers']} block(s)"
    if max(own) > TRANSFER_TOLERANCE:
        fail(f"after load_encoder, the classifier's logits are not an affine function of the mean of "
             f"g2p_model.encode(ids)[0] over the real letters ({where}; relative residual {max(own):.2g}): "
             f"its encoder does not compute what the G2P encoder computes.",
             composed("copy {parts}; the classifier must add the same positions to the same letters and run the "
                      "same blocks in the same order.", parts=_ENCODER_PARTS))
    fail(f"after load_encoder, the classifier's logits are an affine function of the G2P encoder's pooled states "
         f"for each of two G2P models, but not the same function ({where}; relative residual {both:.2g}): the "
         f"classifier's final LayerNorm does not hold the G2P encoder's final norm.",
         "copy the encoder's final LayerNorm (the one encode applies to the blocks' output before returning it), "
         "not the decoder's or a block's, into the classifier's final LayerNorm.")


def _shaped(state: dict, *shape: int) -> list[str]:
    return [k for k, v in state.items() if isinstance(v, torch.Tensor) and tuple(v.shape) == shape]


def _diagnose_transfer(run: dict, g2p, ids: torch.Tensor, case: dict) -> None:
    """Called when the classifier does not compute what the G2P encoder computes: name what
    load_encoder copied wrongly, from the values it wrote (the classifier's tensors are told
    apart by shape: the tests choose sizes that differ)."""
    after = run["c"]
    positions, letters = _shaped(after, case["max_len"], case["d"]), _shaped(after, case["src"], case["d"])
    _diagnose_tables(run, positions, letters, case)
    rest = [k for k in after if k not in positions + letters + case["head"] and k not in case["buffers"]
            and isinstance(after[k], torch.Tensor) and after[k].is_floating_point()]
    kept = [k for k in rest if matches(after[k], run["c_before"][k], EXACT)]
    if kept:          # whole blocks (matrices among them), a LayerNorm (a weight and a bias), parts of blocks
        fail(f"load_encoder left {_names(kept)} of the classifier as build_classifier made them.",
             "copy every encoder block of the G2P model into the classifier's block at the same depth "
             "(all cfg.n_layers of them), not only the tables." if any(after[k].dim() >= 2 for k in kept) else
             "the final LayerNorm was not copied: copy the encoder's final LayerNorm (the one encode applies "
             "last) into the classifier's final LayerNorm." if len(kept) == 2 else
             "copy each encoder block whole, its LayerNorms and biases too (block.load_state_dict copies them "
             "all), and the encoder's final LayerNorm.")
    _diagnose_unused(run, g2p, ids, rest)


def _diagnose_tables(run: dict, positions: list[str], letters: list[str], case: dict) -> None:
    """The classifier's position and letter tables: left as they were, or copied from the wrong rows or table."""
    after, before, G, max_len = run["c"], run["c_before"], run["g"], case["max_len"]
    g_positions, phonemes = _shaped(G, S2S_MAX_LEN, case["d"]), _shaped(G, case["tgt"], case["d"])
    for k in positions:
        if matches(after[k], before[k], EXACT):
            fail(f"load_encoder left the classifier's position table {k} as build_classifier made it.",
                 "copy the first max_len rows of the G2P model's position table: pos.weight[:max_len].")
        if any(matches(after[k], G[j][-max_len:], EXACT) for j in g_positions) and \
                not any(matches(after[k], G[j][:max_len], EXACT) for j in g_positions):
            fail(f"the classifier's position table {k} holds the last {max_len} rows of the G2P model's {S2S_MAX_LEN}.",
                 "a word's first letter sits at position 0 in both models: copy the first max_len rows, "
                 "pos.weight[:max_len], not the last ones.")
    for k in letters:
        if matches(after[k], before[k], EXACT):
            fail(f"load_encoder left the classifier's letter table {k} as build_classifier made it.",
                 "copy the G2P model's letter table (the embedding encode looks the source letters up in).")
        if any(matches(after[k], G[j][:case["src"]], EXACT) for j in phonemes):
            fail(f"the classifier's letter table {k} holds the first rows of the G2P model's phoneme table "
                 f"({_names(phonemes)}).",
                 "copy the encoder's letter table (the embedding encode looks the source letters up in), not the "
                 "decoder's phoneme table: the classifier reads letters.")


def _diagnose_unused(run: dict, g2p, ids: torch.Tensor, rest: list[str]) -> None:
    """Values copied from parts of the G2P model that encode does not use (its decoder): moving
    such a source tensor leaves encode's output as it was."""
    after, G = run["c"], run["g"]
    sources = {k: found for k in rest
               if (found := [j for j, v in G.items() if isinstance(v, torch.Tensor) and matches(after[k], v, EXACT)])}
    unused = []
    try:
        g2p.load_state_dict(G)              # the G2P model of this run (the second run loaded another)
        with torch.no_grad():
            memory = call(g2p.encode, ids, name="Seq2Seq.encode")[0]
            for k, found in sources.items():
                g2p.load_state_dict({j: (v + 1.0 if j in found else v) for j, v in G.items()})
                if matches(g2p.encode(ids)[0], memory, EXACT):
                    unused.append((k, found[0]))
    finally:
        g2p.load_state_dict(G)
    if unused:
        fail("load_encoder copied parts of the G2P model that encode never uses into the classifier: "
             + "; ".join(f"{j} into {k}" for k, j in unused[:4]) + (" ..." if len(unused) > 4 else "") + ".",
             "those are the decoder's: copy the encoder's blocks (the ones encode runs) and the encoder's final "
             "LayerNorm, not the decoder's.")

# ----------------------------------------------------------------------------- grading the trained models

def _result(name: str, value: float, limit: float, better: str, baseline: str, also: str = "") -> None:
    ok = value <= limit if better == "lower" else value >= limit
    print(f"{name}: {value:.4f} (needs {'<=' if better == 'lower' else '>='} {limit}; {baseline})")
    expect(ok, f"{name} {value:.4f} misses the threshold {limit} of the {current_profile().name} profile.",
           composed("check the unit tests above first; then the training loss curve: it should fall steadily. "
                    "A flat curve points at the learning rate or the optimizer; a curve that falls while the held-out "
                    "metric stays poor points at a mismatch between training and evaluation (masks, shifting).{also}",
                    also=also))


def _trained(model, exercises: str, then: str = ""):
    if model is None:
        raise NotWrittenYet(f"nothing was trained: finish exercises {exercises} first.{then}")
    return model


def _check_trained_causal(model, ids: torch.Tensor, block_size: int, device) -> None:
    """A held-out loss means something only for a model that cannot see the next character:
    changing the second half of a window must leave the first half's logits unchanged. The
    window is drawn when grading runs, so a model cannot recognise it."""
    T = min(block_size, (len(ids) - 1) // 2)
    start = draw("capstone/causal", hidden=True).rng.randrange(len(ids) - 2 * T)
    x = ids[start:start + T].to(device)[None]
    y = x.clone()
    y[0, T // 2:] = ids[start + T:start + 2 * T - T // 2].to(device)   # other real text in the second half
    with torch.no_grad():
        a, b = model(x).float()[0, :T // 2], model(y).float()[0, :T // 2]
    # atol 1e-3: a GPU need not give bit-identical logits for two batches, in reduced precision less so
    expect(matches(a, b, (1e-3, 1e-5)), "the trained model's logits at the first positions changed when only later "
           "characters changed: it sees the future, so its held-out loss says nothing.",
           "the language model's blocks must be causal (Block(..., causal=True)): check the mask in exercise 1.")


def grade_lm(model, generate) -> None:
    model = _trained(model, "0-3")
    profile, device = current_profile(), get_device()
    cfg = profile.lm
    model = model.to(device).eval()
    _check_trained_causal(model, data.lm_ids("test"), cfg.block_size, device)
    loss = metrics.lm_loss(model, data.lm_ids("test"), cfg.block_size, cfg.eval_tokens, device)
    tok = data.char_tokenizer()
    base = metrics.unigram_loss(data.lm_ids("train"), data.lm_ids("test"), tok.vocab_size)
    path = save_checkpoint(model, "lm", profile.name, CHECKPOINTS / "lm.pt", dry_run=profile.dry_run)
    sample = generate(model, torch.tensor([tok.encode("ROMEO:\n")], device=device), cfg.sample_chars, cfg.block_size,
                      0.8, 20, draw("capstone/lm sample", hidden=False).gen)
    print(tok.decode(sample[0].tolist()))
    print(f"saved {path}")
    _result("held-out loss (nats/char)", loss, profile.thresholds.lm_max_val_loss, "lower",
            f"unigram baseline {base:.3f}")


def g2p_predictions(model, greedy_decode, beam_search, words, beam_words, beam_size, device):
    greedy, beam = {}, {}
    for i in range(0, len(words), 256):
        chunk = words[i:i + 256]
        src = data.pad([data.encode_word(w) for w in chunk]).to(device)
        for w, ids in zip(chunk, greedy_decode(model, src)):
            greedy[w] = data.decode_phonemes(ids)
    for w in words[:beam_words]:
        ids = beam_search(model, torch.tensor([data.encode_word(w)], device=device), beam_size)
        beam[w] = data.decode_phonemes(ids)
    return greedy, beam


def grade_g2p(model, greedy_decode, beam_search) -> None:
    from ..data.cmudict import load_g2p

    model = _trained(model, "0-2, 4 and 5")
    profile, device = current_profile(), get_device()
    cfg = profile.g2p
    model = model.to(device).eval()
    test = load_g2p("test")
    words = data.g2p_eval_words(cfg.eval_words)
    greedy, beam = g2p_predictions(model, greedy_decode, beam_search, words, cfg.beam_words, cfg.beam_size, device)
    per, wer = metrics.g2p_error_rates(greedy, test)
    bper, bwer = metrics.g2p_error_rates(beam, test)
    gper, gwer = metrics.g2p_error_rates({w: greedy[w] for w in beam}, test)
    for w in words[:5]:
        print(f"{w:>14}  greedy {' '.join(greedy[w]):<28} reference {' '.join(test[w][0])}")
    print(f"beam search (size {cfg.beam_size}) on {len(beam)} words: PER {bper:.4f} WER {bwer:.4f} "
          f"(greedy on the same words: PER {gper:.4f} WER {gwer:.4f})")
    print(f"saved {save_checkpoint(model, 'g2p', profile.name, CHECKPOINTS / 'g2p.pt', dry_run=profile.dry_run)}")
    _result(f"phoneme error rate on {len(words)} held-out words", per, profile.thresholds.g2p_max_per, "lower",
            "an empty prediction scores 1.0")
    _result("word error rate", wer, profile.thresholds.g2p_max_wer, "lower", "trivial baseline 1.0")


def classifier_predictions(model, ids: torch.Tensor, device) -> torch.Tensor:
    model = model.to(device).eval()
    with torch.no_grad():
        return torch.cat([model(ids[i:i + 256].to(device)).argmax(-1).cpu() for i in range(0, len(ids), 256)])


def grade_classifier(model) -> None:
    model = _trained(model, "0-2 and 6", " Exercises 4 and 7 then give it the G2P encoder to start from.")
    profile, device = current_profile(), get_device()
    cfg = profile.cls
    ids, labels = data.classifier_eval_tensors(cfg.max_len, cfg.eval_words)
    predicted = classifier_predictions(model, ids, device)
    acc = metrics.accuracy(predicted, labels)
    train_labels = data.classifier_tensors("train", cfg.max_len)[1]
    majority = metrics.majority_accuracy(train_labels, labels)
    words = [data.decode_letters(row) for row in ids.tolist()]
    rules = metrics.accuracy(metrics.stress_rule_baseline(data.pattern_words("train"), words, data.PATTERNS), labels)
    print("confusion matrix (rows: true pattern, columns: predicted):", " ".join(data.PATTERNS))
    print(metrics.confusion_matrix(predicted, labels, len(data.PATTERNS)))
    print(f"saved {save_checkpoint(model, 'cls', profile.name, CHECKPOINTS / 'cls.pt', dry_run=profile.dry_run)}")
    start = (" In this profile the classifier starts from your G2P model's encoder (exercise 7; the training cell "
             "said whether it did): trained from scratch, it most likely stays below the mark.") if cfg.from_g2p else ""
    _result(f"stress-pattern accuracy on {len(labels):,} held-out words", acc, profile.thresholds.cls_min_accuracy,
            "higher", f"majority class {majority:.3f}; syllable rules with a suffix table {rules:.3f}", start)
