"""Checks for the capstone: unit checks of the parts, then grading of the trained models
on held-out data with the course's own loaders and metrics (never the student's).

Exercise 0 brings the student's tools from chapters 5 and 6 (``lr_at``, ``param_groups``,
``clip_grad_norm``, ``process_logits``, ``sample_next_token``, ``beam_search_core``); they are
checked here by those chapters' own checks. The capstone's ``train``, ``generate`` and
``beam_search`` call them: when one of those fails, the tools it calls are checked again, and
a wrong tool is named as the cause ("train calls your lr_at from chapter 5 ...")."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import random
from pathlib import Path
from typing import Iterator

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..capstone import data, metrics
from ..capstone.profiles import ClassifierConfig, LMConfig, Seq2SeqConfig, current_profile
from ..capstone.weights import save_checkpoint
from ..device import get_device
from . import ch05, ch06
from ._core import (CheckFailed, NotWrittenYet, call, earlier_first, expect, expect_close, expect_tensor, fail,
                    forbid, generator, not_written, own_fault, same)
from ._hidden import hidden_generator, hidden_rng, hidden_seed

CHECKPOINTS = Path("capstone_checkpoints")
TINY_LM = LMConfig(d_model=32, n_layers=2, n_heads=4, block_size=16, batch_size=4, steps=1, lr=1e-3, warmup_steps=1)
# d_model 48: the positional table (max_len 32 rows) is then the only parameter of shape (32, 48)
TINY_S2S = Seq2SeqConfig(d_model=48, n_layers=2, n_heads=4, batch_size=4, steps=1, lr=1e-3, warmup_steps=1)
S2S_MAX_LEN = 32                     # Seq2Seq's default max_len
TINY_CLS = ClassifierConfig(d_model=32, n_layers=2, n_heads=4, batch_size=4, steps=1, lr=1e-3, warmup_steps=1,
                            max_len=12)


def _tied(model: nn.Module) -> bool:
    embeddings = [m.weight for m in model.modules() if isinstance(m, nn.Embedding)]
    linears = [m.weight for m in model.modules() if isinstance(m, nn.Linear)]
    return any(e is w for e in embeddings for w in linears)


def _split(err: BaseException) -> tuple[str, str]:
    """A check's failure as (what happened, likely mistake)."""
    what, _, hint = str(err).partition("\nLikely mistake: ")
    return what.strip(), hint.strip()

# ----------------------------------------------------------------------------- exercise 0: the tools

# name -> (chapter, exercise there, runner(tools, hidden) calling that chapter's own check)
_TOOLS = {
    "lr_at": (5, 5, lambda t, h: ch05.check_lr_at(t["lr_at"], hidden=h)),
    "param_groups": (5, 4, lambda t, h: ch05.check_param_groups(t["param_groups"], hidden=h)),
    "clip_grad_norm": (5, 6, lambda t, h: ch05.check_clip_grad_norm(t["clip_grad_norm"], hidden=h)),
    "process_logits": (6, 1, lambda t, h: ch06.check_process_logits(t["process_logits"], hidden=h)),
    "sample_next_token": (6, 2, lambda t, h: ch06.check_sample_next_token(t["sample_next_token"], t["process_logits"],
                                                                          hidden=h)),
    "beam_search_core": (6, 5, lambda t, h: ch06.check_beam_search(t["beam_search_core"], hidden=h)),
}


def _tool_failure(name: str, tools: dict, hidden: bool) -> tuple[str, str] | None:
    """(what, hint) when the tool fails its own chapter's check, else None. For lr_at, a quick
    look first (:func:`_lr_at_agrees`); chapter 5's full check only when it finds a difference."""
    if name == "lr_at" and _lr_at_agrees(tools["lr_at"], hidden):
        return None
    try:
        _TOOLS[name][2](tools, hidden)
    except CheckFailed as err:
        return _split(err)
    if name == "lr_at":
        return ("lr_at differs from chapter 5's schedule where a piece of it starts or ends (step 0, the end of "
                "warm-up, max_steps or after it).",
                "lr = max_lr * (step + 1) / warmup_steps during warm-up, then min_lr + (max_lr - min_lr) * "
                "(1 + cos(pi p)) / 2 with p = (step - warmup) / (max_steps - warmup), then min_lr.")
    return None


def _lr_at_agrees(lr_at, hidden: bool) -> bool:
    """A quick look at lr_at: the steps where each piece of the schedule starts and ends, on
    fixed or drawn schedules. Chapter 5's own check sweeps every step of several schedules,
    hundreds of calls; the capstone runs it only when this look finds a difference."""
    configs = [(1.0, 0.1, 10, 100), (6e-4, 6e-5, 5, 30)]
    if hidden:
        rng = hidden_rng("capstone/lr_at")
        configs = [(3e-4, 0.0, 0, 20)]
        for _ in range(2):
            max_lr, warmup = float(f"{10 ** rng.uniform(-5, 0):.3g}"), rng.randrange(1, 40)
            configs.append((max_lr, max_lr * rng.choice([0.0, 0.01, 0.1, 0.5]), warmup,
                            warmup + rng.randrange(2, 200)))
    for max_lr, min_lr, warmup, max_steps in configs:
        middle = (warmup + max_steps) // 2
        for step in sorted({0, max(0, warmup - 1), warmup, warmup + 1, middle, max_steps - 1, max_steps,
                            max_steps + 7}):
            got = call(lr_at, step, max_lr, min_lr, warmup, max_steps, name="lr_at")
            want = ch05._lr_oracle(step, max_lr, min_lr, warmup, max_steps)
            if not (isinstance(got, (int, float)) and math.isclose(got, want, rel_tol=1e-6, abs_tol=1e-12)):
                return False
    return True


def check_tools(lr_at, param_groups, clip_grad_norm, process_logits, sample_next_token, beam_search_core,
                hidden: bool = False) -> None:
    """Chapter 5's and chapter 6's own checks (visible, or hidden) on the tools brought here;
    for lr_at, a quick look first, and chapter 5's full check only when it finds a difference."""
    tools = dict(lr_at=lr_at, param_groups=param_groups, clip_grad_norm=clip_grad_norm,
                 process_logits=process_logits, sample_next_token=sample_next_token,
                 beam_search_core=beam_search_core)
    for name, (chapter, exercise, _) in _TOOLS.items():
        found = _tool_failure(name, tools, hidden)
        if found is not None:
            fail(f"{name} (chapter {chapter}, exercise {exercise}) fails its chapter's test: {found[0]}",
                 f"in {name}: {found[1]}")


def _blame_tools(caller: str, tools: dict, hidden: bool, what: str) -> None:
    """Called when ``caller`` failed with ``what``: if a tool it calls is wrong, fail with a hint
    that names that tool and its chapter (a stub of the tool is left to its own test cell)."""
    for name in tools:
        try:
            found = _tool_failure(name, tools, hidden)
        except NotImplementedError:
            continue
        if found is not None:
            chapter, exercise, _ = _TOOLS[name]
            fail(what, f"{caller} calls your {name} from chapter {chapter}, which fails chapter {chapter}'s test "
                       f"(exercise {exercise} there): {found[0]} {found[1]} Fix {name} in exercise 0's cell first; "
                       f"{caller} itself may be right.")


@contextlib.contextmanager
def _blaming(caller: str, tools: dict, hidden: bool) -> Iterator[None]:
    """A CheckFailed inside the block is re-examined by :func:`_blame_tools`: a wrong tool is
    named as the cause; otherwise the failure stands."""
    try:
        yield
    except CheckFailed as err:
        _blame_tools(caller, tools, hidden, _split(err)[0])
        raise

# ----------------------------------------------------------------------------- exercise 1

_POST_LN = ("the block's output was normalised: x = LayerNorm(x + sublayer(x)) is Post-LN. A Pre-LN block "
            "normalises only what each sub-layer reads and adds its output to the stream as it is: "
            "x = x + attn(ln_1(x)), then x = x + mlp(ln_2(x)) (chapter 4, residuals).")
_COMBINED_MASK = ("build one boolean mask (True = may attend): the causal lower triangle "
                  "torch.ones(Tq, Tk, dtype=torch.bool).tril() & pad_mask, and pass it as attn_mask alone; "
                  "attn_mask together with is_causal=True is rejected by several PyTorch releases.")


def _check_block(Block, hidden: bool) -> None:
    """Pre-LN (a constant added to a token's features passes straight through) and one mask
    that is causal and hides PAD at once."""
    rng = hidden_rng("capstone/block")
    n_heads = 4 if not hidden else rng.choice([1, 2, 4])
    d = 32 if not hidden else n_heads * rng.choice([4, 6, 8])
    torch.manual_seed(74 if not hidden else hidden_seed("capstone/block/init"))
    block = call(Block, d, n_heads, dropout=0.0, causal=True, name="Block").eval()
    g = generator(75) if not hidden else hidden_generator("capstone/block")
    B, T = (2, 7) if not hidden else (rng.randrange(2, 4), rng.randrange(5, 11))
    x = torch.randn(B, T, d, generator=g)
    shift = torch.randn(B, T, 1, generator=g) * 3          # one number per token, added to all its features
    with torch.no_grad():
        out = call(block, x, name="Block.forward")
        expect_tensor(out, (B, T, d), "Block output")
        moved = block(x + shift)
    normalised = out.mean(-1).abs().max() < 1e-3 and (out.var(-1, unbiased=False) - 1).abs().max() < 1e-2
    if normalised and not same(moved, out + shift, atol=1e-4):
        fail("every token of the block's output has mean 0 and variance 1: the output itself was normalised.",
             _POST_LN)
    if not same(moved, out + shift, atol=1e-4):
        fail("adding the same number to every feature of a token did not add it to the block's output.",
             "in a Pre-LN block only the sub-layers' inputs are normalised (ln_1 before attention, ln_2 before "
             "the MLP) and the residual path carries x unchanged: x = x + attn(ln_1(x)); x = x + mlp(ln_2(x)).")
    t = T - 2
    z = x.clone()
    z[:, t] += torch.randn(B, d, generator=g)              # a change at a later position
    with torch.no_grad():
        later = block(z)
    if not same(later[:, :t], out[:, :t], atol=1e-5):
        fail(f"Block(causal=True): changing position {t} changed the outputs at earlier positions.",
             "self-attention must be causal when causal=True: a lower-triangular boolean mask "
             "(torch.ones(Tq, Tk, dtype=torch.bool).tril()) as attn_mask, so position t sees only positions <= t.")
    # Causal and padded at once: row 0 starts with n_pad PAD positions.
    n_pad = 2 if not hidden else rng.randrange(1, T - 3)
    pad = torch.ones(B, 1, 1, T, dtype=torch.bool)
    pad[0, :, :, :n_pad] = False
    try:
        with torch.no_grad():
            base = call(block, x, pad_mask=pad, name="Block.forward")
    except CheckFailed as err:
        if "causal" in str(err) or "attn_mask" in str(err):
            fail(f"Block(causal=True) with a pad_mask raised an error: {_split(err)[0]}", _COMBINED_MASK)
        raise
    y = x.clone()
    y[0, :n_pad] = torch.randn(n_pad, d, generator=g)      # other contents at the PAD positions
    with torch.no_grad():
        other_pad, later = block(y, pad_mask=pad), block(z, pad_mask=pad)
    if not same(other_pad[0, n_pad:], base[0, n_pad:], atol=1e-5):
        fail("with causal=True and a pad_mask, changing the PAD positions changed the outputs at real positions.",
             "PAD keys must be hidden while the block is causal: " + _COMBINED_MASK)
    if not (same(later[1:, :t], base[1:, :t], atol=1e-5) and same(later[0, n_pad:t], base[0, n_pad:t], atol=1e-5)):
        fail(f"with causal=True and a pad_mask, changing position {t} changed the outputs at earlier positions.",
             "the block stopped being causal when a pad_mask was given: " + _COMBINED_MASK)


@contextlib.contextmanager
def _block_first(Block, model_name: str, hidden: bool) -> Iterator[None]:
    """A failure inside is blamed on exercise 1's Block when Block fails its own test: the
    encoder-decoder and the classifier are built from it."""
    try:
        yield
    except CheckFailed as err:
        try:
            _check_block(Block, hidden)
        except NotImplementedError:
            raise err
        except CheckFailed as inner:
            what, hint = _split(inner)
            fail(_split(err)[0], f"{model_name} is built from your Block of exercise 1, which fails exercise 1's "
                                 f"test: {what} {hint} Fix Block first; {model_name} itself may be right.")
        raise


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
    rng = hidden_rng("decoder_lm")
    torch.manual_seed(71 if not hidden else hidden_seed("decoder_lm/init"))
    vocab = 30 if not hidden else rng.choice([v for v in range(20, 81) if v != TINY_LM.block_size])
    model = call(build_lm, TINY_LM, vocab, name="build_lm").eval()
    g = generator(72) if not hidden else hidden_generator("decoder_lm")
    B, T = (3, TINY_LM.block_size) if not hidden else (rng.randrange(1, 5), rng.randrange(8, TINY_LM.block_size + 1))
    x = torch.randint(0, vocab, (B, T), generator=g)
    if hidden and x[0, 0] == x[0, 1]:
        x[0, 1] = (x[0, 0] + 1) % vocab       # so that swapping the first two tokens below changes the input
    with torch.no_grad():
        logits = call(model, x, name="DecoderLM.forward")
    expect_tensor(logits, (B, T, vocab), "DecoderLM logits")
    expect(_tied(model), "the output projection does not share the token embedding's weight.",
           "tie them: self.head.weight = self.tok.weight (chapter 1, exercise 6).")
    for t in ([5, 9] if not hidden else [1, T - 1] + rng.sample(range(2, T - 1), 2)):
        y = x.clone()
        y[:, t] = (y[:, t] + 1) % vocab
        with torch.no_grad():
            changed = (model(y) - logits).abs().amax(dim=(0, 2))
        if changed[:t].max() > 1e-5:
            fail(f"changing the token at position {t} changed the logits at earlier positions.",
                 "self-attention must be causal in a language model: pass a lower-triangular boolean mask "
                 "(torch.ones(T, T, dtype=torch.bool).tril()) as attn_mask, so position t sees only positions <= t.")
    # Pre-LN blocks carry a constant added to the positional table to the end; the final
    # LayerNorm removes it, so the logits must not move.
    state, names = _position_tables(model, TINY_LM.block_size, TINY_LM.d_model)
    if names:
        moved = _shifted_logits(model, state, names, (x,), 2.0 if not hidden else rng.uniform(1.0, 3.0))
        expect(same(moved, logits, atol=1e-4),
               "adding the same number to every entry of the positional embedding changed the logits.",
               "a Pre-LN stack never normalises its residual stream, so the model needs a final LayerNorm before "
               "the output projection: logits = head(ln_f(x)).")
    # One causal layer without positions sees tokens 0..t as a set: swapping the first two
    # leaves every later output unchanged. (Deeper causal stacks can recover some order.)
    torch.manual_seed(73 if not hidden else hidden_seed("decoder_lm/shallow"))
    shallow = call(build_lm, dataclasses.replace(TINY_LM, n_layers=1), vocab, name="build_lm").eval()
    swapped = x.clone()
    swapped[:, [0, 1]] = x[:, [1, 0]]
    with torch.no_grad():
        unchanged = (shallow(swapped)[:, 2:] - shallow(x)[:, 2:]).abs().max() < 1e-5
    expect(not bool(unchanged), "swapping the first two tokens left every later output unchanged.",
           "the model has no sense of order: add a positional embedding to the token embedding.")

# ----------------------------------------------------------------------------- exercise 2

def _old_schedule(step, max_lr, warmup, total):
    """The schedule this capstone used before chapter 5 existed: 0.1 * max_lr at total - 1."""
    if step < warmup:
        return max_lr * (step + 1) / warmup
    progress = min((step - warmup) / max(1, total - 1 - warmup), 1.0)
    return max_lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def _train_oracle(model, batches, steps, lr, min_lr, warmup, clip, wd, variant="ok"):
    """Chapter 5's recipe with torch's AdamW and clip_grad_norm_; ``variant`` names one mistake."""
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    decay = {id(m.weight) for m in model.modules() if isinstance(m, nn.Linear)} - embeddings
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


def check_train(train, lr_at, param_groups, clip_grad_norm, hidden: bool = False) -> None:
    rng = hidden_rng("capstone/train")
    seed = 81 if not hidden else hidden_seed("capstone/train/init")
    if not hidden:
        steps, lr, min_lr, warmup, clip, wd = 12, 0.05, 0.005, 3, 0.5, 0.1
        n_batch, T, vocab, d, width = 6, 5, 11, 8, 16
    else:
        steps, lr, warmup = rng.randrange(10, 21), rng.uniform(0.01, 0.05), rng.randrange(1, 6)
        min_lr, clip, wd = lr * rng.choice([0.05, 0.1, 0.3]), rng.uniform(0.05, 0.5), rng.uniform(0.02, 0.3)
        n_batch, T, vocab, d, width = rng.randrange(3, 9), rng.randrange(3, 8), rng.randrange(7, 20), \
            rng.randrange(4, 13), rng.randrange(8, 25)
    g = generator(seed) if not hidden else hidden_generator("capstone/train/batches")
    # Targets: logits far from their size-10 targets give gradient norms far above clip <= 0.5.
    batches = [(torch.randint(0, vocab, (n_batch, T), generator=g), torch.randn(n_batch, T, vocab, generator=g) * 10)
               for _ in range(steps)]

    def fresh():
        torch.manual_seed(seed)
        return _TrainProbe(vocab, d, width)

    student = fresh()
    try:
        with forbid(*ch05._CLIP_BUILTINS, exercise="global-norm clipping"):
            losses = call(train, student, lambda step: batches[step], lambda m, x, y: F.mse_loss(m(x), y), steps, lr,
                          min_lr, warmup, "cpu", use_bf16=False, weight_decay=wd, clip=clip, progress=False,
                          name="train")
    except CheckFailed as err:
        if "was called, but this exercise asks" not in str(err):
            raise
        fail(f"train called PyTorch's clipping ({_split(err)[0].split(' was called')[0]}).",
             "train must clip with your clip_grad_norm from exercise 0 (chapter 5), not PyTorch's: clipped, _ = "
             "clip_grad_norm([p.grad for the parameters that have one], clip), then p.grad = g.")
    tools = dict(lr_at=lr_at, param_groups=param_groups, clip_grad_norm=clip_grad_norm)
    with _blaming("train", tools, hidden):
        expect(isinstance(losses, list) and len(losses) == steps, f"train should return a list of {steps} losses.",
               "append loss.item() once per step.")
    want = fresh()
    want_losses = _train_oracle(want, batches, steps, lr, min_lr, warmup, clip, wd)
    got_params = torch.cat([p.detach().flatten() for p in student.parameters()])
    want_params = torch.cat([p.detach().flatten() for p in want.parameters()])
    if torch.allclose(got_params, want_params, atol=1e-5) and torch.allclose(torch.tensor(losses),
                                                                               torch.tensor(want_losses), atol=1e-4):
        return
    _blame_tools("train", tools, hidden, "after training a small model, its weights differ from chapter 5's recipe.")
    for variant, hint in _TRAIN_VARIANTS:
        other = fresh()
        _train_oracle(other, batches, steps, lr, min_lr, warmup, clip, wd, variant)
        if torch.allclose(got_params, torch.cat([p.detach().flatten() for p in other.parameters()]), atol=1e-5):
            fail("after training a small model, its weights differ from chapter 5's recipe.", hint)
    fail("after training a small model, its weights differ from chapter 5's recipe.",
         "use AdamW(param_groups(model, weight_decay), betas=(0.9, 0.95)), lr_at(step, lr, min_lr, warmup_steps, "
         "steps) for the rate, then zero_grad, backward, clip_grad_norm, step, in that order.")

# ----------------------------------------------------------------------------- exercise 3

class _ScriptedLM(nn.Module):
    """Logits that favour token (last + 1) % V; refuses inputs longer than block_size."""

    def __init__(self, vocab: int, block_size: int):
        super().__init__()
        self.vocab, self.block_size = vocab, block_size
        self.seen_lengths: list[int] = []

    def forward(self, ids):
        self.seen_lengths.append(ids.shape[1])
        if ids.shape[1] > self.block_size:
            raise IndexError(f"sequence of {ids.shape[1]} is longer than block_size {self.block_size}")
        logits = torch.zeros(ids.shape[0], ids.shape[1], self.vocab)
        logits.scatter_(2, ((ids + 1) % self.vocab)[..., None], 3.0)
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
    """generate's own behaviour; when it fails, the sampler it calls (chapter 6) is checked first."""
    with _blaming("generate", dict(process_logits=process_logits, sample_next_token=sample_next_token), hidden):
        _check_generate(generate, hidden)


def _check_generate(generate, hidden: bool) -> None:
    vocab, block = 10, 4
    model = _ScriptedLM(vocab, block)
    prompt = torch.tensor([[3, 4, 5]])
    try:
        out = generate(model, prompt.clone(), 8, block, 1.0, 1)
    except IndexError as err:
        fail(f"generate fed the model more than block_size tokens ({err}).",
             "crop the context to the last block_size ids before each forward pass: ids[:, -block_size:].")
    except NotImplementedError as err:
        raise not_written(err, "generate")
    expect_tensor(out, (1, 11), "generate output")
    expect(torch.equal(out[:, :3], prompt), "the output must start with the prompt.", "concatenate new ids after it.")
    expect(out[0, 3:].tolist() == [6, 7, 8, 9, 0, 1, 2, 3],
           f"with top_k=1 the continuation should be the argmax chain 6, 7, 8, ...; got {out[0, 3:].tolist()}.",
           "draw from the last position's logits: model(ids[:, -block_size:])[:, -1, :], with top_k passed on.")
    # Temperature: sample many tokens from fixed logits and compare the frequency of the top one.
    flat = _ConstantLM(torch.tensor([2.0, 1.0] + [0.0] * 8))
    for temperature in (0.5, 2.0):
        sample = call(generate, flat, torch.zeros(1, 1, dtype=torch.long), 2000, block, temperature, None,
                      generator(94))[0, 1:]
        share = (sample == 0).float().mean().item()
        want = torch.softmax(flat.logits / temperature, dim=0)[0].item()
        expect(abs(share - want) < 0.04,
               f"at temperature {temperature} the most likely token was sampled {share:.1%} of the time, "
               f"expected {want:.1%}.",
               "pass temperature on to sample_next_token(logits, generator, temperature, top_k).")
    a = call(generate, model, prompt, 20, block, 1.0, None, generator(91))
    b = call(generate, model, prompt, 20, block, 1.0, None, generator(91))
    expect(torch.equal(a, b), "two runs with generators of the same seed gave different samples.",
           "pass the generator on: sample_next_token(logits, generator, temperature, top_k).")
    cold = call(generate, model, prompt, 30, block, 0.05, None, generator(92))
    expect((cold[0, 3:] == (cold[0, 2:-1] + 1) % vocab).float().mean() > 0.95,
           "at temperature 0.05 sampling should almost always pick the most likely token.",
           "pass temperature on to sample_next_token(logits, generator, temperature, top_k).")
    if hidden:
        _check_generate_drawn(generate)


def _check_generate_drawn(generate) -> None:
    """Other vocabularies, context sizes and prompts; only properties that hold for every sample."""
    rng = hidden_rng("generate")
    vocab, block = rng.randrange(5, 31), rng.randrange(2, 9)
    model = _ScriptedLM(vocab, block)
    prompt = torch.randint(0, vocab, (1, rng.randrange(1, block + 4)), generator=hidden_generator("generate/prompt"))
    n_new, P = rng.randrange(5, 30), prompt.shape[1]
    try:
        out = generate(model, prompt.clone(), n_new, block, 1.0, 1)
    except IndexError as err:
        fail(f"generate fed the model more than block_size tokens ({err}).",
             "crop the context to the last block_size ids before each forward pass: ids[:, -block_size:].")
    except NotImplementedError as err:
        raise not_written(err, "generate")
    expect_tensor(out, (1, P + n_new), "generate output")
    expect(torch.equal(out[:, :P], prompt), "the output must start with the prompt.", "concatenate new ids after it.")
    chain = [(int(prompt[0, -1]) + 1 + i) % vocab for i in range(n_new)]
    expect(out[0, P:].tolist() == chain,
           f"with top_k=1 the continuation should be the argmax chain {chain[:3]}, ...; got {out[0, P:].tolist()}.",
           "draw from the last position's logits: model(ids[:, -block_size:])[:, -1, :], with top_k passed on.")
    # top_k=2: after token t only (t + 1) % vocab and 0 may follow (unless (t + 1) % vocab is 0 itself: ties).
    two = call(generate, model, prompt, 60, block, rng.uniform(0.5, 3.0), 2, hidden_generator("generate/top2"))[0]
    for prev, nxt in zip(two[P - 1:-1].tolist(), two[P:].tolist()):
        if (prev + 1) % vocab != 0 and nxt not in ((prev + 1) % vocab, 0):
            fail(f"with top_k=2 the token {nxt} followed {prev}, but only {(prev + 1) % vocab} and 0 had the two "
                 f"largest logits.", "pass top_k on to sample_next_token(logits, generator, temperature, top_k).")
    seed = rng.randrange(2 ** 31)
    a = call(generate, model, prompt, 20, block, 1.0, None, generator(seed))
    b = call(generate, model, prompt, 20, block, 1.0, None, generator(seed))
    expect(torch.equal(a, b), "two runs with generators of the same seed gave different samples.",
           "pass the generator on: sample_next_token(logits, generator, temperature, top_k).")
    # At temperature 5 every token has probability >= 1/12 at each step: 400 samples reach all of them
    # except with probability below 1e-13.
    hot = call(generate, _ScriptedLM(10, 4), torch.tensor([[3, 4, 5]]), 400, 4, 5.0, None,
               hidden_generator("generate/hot"))
    expect(len(set(hot[0].tolist())) == 10, "at temperature 5 sampling should reach every token.",
           "pass temperature on to sample_next_token: a high temperature flattens the distribution.")

# ----------------------------------------------------------------------------- exercise 4

def check_seq2seq(build_g2p, Block, hidden: bool = False) -> None:
    with _block_first(Block, "Seq2Seq", hidden):
        _check_seq2seq(build_g2p, hidden)


def _check_seq2seq(build_g2p, hidden: bool) -> None:
    rng = hidden_rng("seq2seq")
    torch.manual_seed(101 if not hidden else hidden_seed("seq2seq/init"))
    src_vocab, tgt_vocab = (20, 15) if not hidden else (rng.choice([v for v in range(8, 41) if v != S2S_MAX_LEN]),
                                                        rng.choice([v for v in range(6, 31)]))
    model = call(build_g2p, TINY_S2S, src_vocab, tgt_vocab, name="build_g2p").eval()
    g = generator(102) if not hidden else hidden_generator("seq2seq")
    B, S, T, n_pad = (2, 7, 6, 5) if not hidden else (rng.randrange(1, 4), rng.randrange(3, 11), rng.randrange(5, 9),
                                                      rng.randrange(1, 7))
    src = torch.randint(3, src_vocab, (B, S), generator=g)
    tgt = torch.randint(3, tgt_vocab, (B, T), generator=g)
    tgt[:, 0] = data.BOS
    if hidden and src[0, 0] == src[0, -1]:
        src[0, -1] = (src[0, 0] - 3 + 1) % (src_vocab - 3) + 3   # so that reversing the source changes it
    with torch.no_grad():
        logits = call(model, src, tgt, name="Seq2Seq.forward")
    expect_tensor(logits, (B, T, tgt_vocab), "Seq2Seq logits")
    expect(_tied(model), "the output projection does not share the phoneme embedding's weight.",
           "tie them: self.head.weight = self.tgt_tok.weight (the target-side embedding).")
    with torch.no_grad():
        memory, memory_mask = call(model.encode, src, name="Seq2Seq.encode")
        last = src.clone()
        last[:, -1] = (last[:, -1] + 1 - 3) % (src_vocab - 3) + 3
        memory_last, _ = model.encode(last)
    expect_tensor(memory, (B, S, TINY_S2S.d_model), "encode's memory")
    expect((memory_last[:, 0] - memory[:, 0]).abs().max() > 1e-5,
           "changing the last letter of the source left the encoder's output at the first letter unchanged.",
           "the encoder reads the whole word: its blocks are not causal (Block(..., causal=False)); only the "
           "decoder's self-attention is.")
    changed = tgt.clone()
    changed[:, 4] = (changed[:, 4] + 1 - 3) % (tgt_vocab - 3) + 3
    with torch.no_grad():
        diff = (model(src, changed) - logits).abs().amax(dim=(0, 2))
    expect(diff[:4].max() < 1e-5, "changing target token 4 changed the decoder's outputs at positions 0-3.",
           "the decoder's self-attention must be causal (causal=True: the lower-triangular mask); "
           "cross-attention needs no causal mask.")
    padded = torch.cat([src, torch.full((B, n_pad), data.PAD)], dim=1)
    with torch.no_grad():
        diff = (model(padded, tgt) - logits).abs().max()
    expect(diff < 1e-4, "adding PAD tokens to the end of the source changed the outputs.",
           "mask PAD in the source: encoder self-attention and decoder cross-attention both take "
           "mask = (src != PAD)[:, None, None, :].")
    with torch.no_grad():
        other = model(src.flip(1), tgt)
    expect((other - logits).abs().max() > 1e-4, "reversing the source left the outputs unchanged.",
           "the encoder needs positional embeddings too.")
    # Pre-LN blocks carry a constant added to the positional tables along the residual stream;
    # the encoder's and the decoder's final LayerNorms remove it.
    state, names = _position_tables(model, S2S_MAX_LEN, TINY_S2S.d_model)
    if names:
        shift = 2.0 if not hidden else rng.uniform(1.0, 3.0)
        moved_memory = _shifted_logits(model, state, names, (src,), shift, run=model.encode)[0]
        expect(same(moved_memory, memory, atol=1e-4),
               "adding the same number to every entry of the positional embedding changed encode's memory.",
               "the encoder's blocks are Pre-LN, so its output needs a final LayerNorm: return ln_enc(x), mask.")
        moved = _shifted_logits(model, state, names, (src, tgt), shift)
        expect(same(moved, logits, atol=1e-4),
               "adding the same number to every entry of the positional embedding changed the logits.",
               "the decoder's blocks are Pre-LN, so the logits need a final LayerNorm before the output "
               "projection: head(ln_dec(x)).")

# ----------------------------------------------------------------------------- exercise 5

class _ScriptedSeq2Seq(nn.Module):
    """Greedy picks A (0.6) then EOS (0.55): probability 0.33; beam finds B (0.4) then EOS (1.0): 0.4."""

    A, B, C = 3, 4, 5
    a, b, e, vocab = 0.6, 0.4, 0.55, 6      # P(A), P(B) first; P(EOS) after A

    def encode(self, src):
        return torch.zeros(src.shape[0], 1, 1), torch.ones(src.shape[0], 1, 1, 1, dtype=torch.bool)

    def decode(self, tgt_in, memory, mask):
        B_, T = tgt_in.shape
        probs = torch.full((B_, T, self.vocab), 1e-6)
        for b in range(B_):
            for t in range(T):
                prefix = tgt_in[b, : t + 1].tolist()
                if prefix == [data.BOS]:
                    probs[b, t, self.A], probs[b, t, self.B] = self.a, self.b
                elif prefix == [data.BOS, self.A]:
                    probs[b, t, data.EOS], probs[b, t, self.C] = self.e, 1 - self.e
                else:                                  # after B or C: end
                    probs[b, t, data.EOS] = 1.0
        return probs.log()

    def forward(self, src, tgt_in):
        return self.decode(tgt_in, *self.encode(src))


class _DrawnTrap(_ScriptedSeq2Seq):
    """_ScriptedSeq2Seq with drawn token ids and probabilities, the same trap for greedy decoding.

    Greedy: A (a) then EOS (e > 1/2); beam: B (b) then EOS (1), where b > 1.1 a e, so [B] beats [A]
    by a clear margin and [A, C] (A, then C, then EOS) scores lower than [B] whatever the search does
    after both have finished."""

    def __init__(self, rng: random.Random):
        super().__init__()
        self.vocab = rng.randrange(6, 41)
        self.A, self.B, self.C = rng.sample(range(3, self.vocab), 3)
        while True:
            self.a, self.e = rng.uniform(0.5, 0.7), rng.uniform(0.52, 0.8)
            self.b = rng.uniform(0.25, min(self.a - 0.05, 0.98 - self.a))
            if (self.b > 1.1 * self.a * self.e
                    and math.log(self.a * (1 - self.e)) / 3 < math.log(self.b) / 2 - 0.05):
                break


class _PathsSeq2Seq(nn.Module):
    """Each source row has a path (0 to 6 tokens) that is far the most likely: each next token of
    the path (then EOS) has probability 0.9 to 0.97, any other token at most 0.1 while on the path
    and at most 3 / vocab <= 0.3 once off it (vocab >= 10). Greedy decoding and beam search (any
    beam size, max_len >= path length + 2) both return exactly the path: its mean log-probability
    is above log(0.9) = -0.11, any other hypothesis's (finished or cut at max_len) below -0.38."""

    def __init__(self, rng: random.Random, g: torch.Generator, rows: int, vocab: int, max_len: int):
        super().__init__()
        self.vocab = vocab
        sources: list[tuple[int, ...]] = []
        while len(sources) < rows:
            row = tuple(rng.randrange(3, vocab) for _ in range(rng.randrange(2, 8)))
            if row not in sources:
                sources.append(row)
        width = max(map(len, sources))
        self.src = torch.tensor([list(r) + [data.PAD] * (width - len(r)) for r in sources])   # (rows, S)
        self.paths = [[rng.randrange(3, vocab) for _ in range(rng.randrange(0, 7))] for _ in range(rows)]
        self.p = torch.empty(rows, max_len + 8).uniform_(0.9, 0.97, generator=g)
        self.rest = torch.rand(rows, max_len + 8, vocab, generator=g) + 0.5          # off-path weights

    def encode(self, src):
        return src.float()[:, :, None], (src != data.PAD)[:, None, None, :]

    def decode(self, tgt_in, memory, mask):
        B_, T = tgt_in.shape
        keys = [tuple(row) for row in self.src.tolist()]
        probs = torch.empty(B_, T, self.vocab)
        for b in range(B_):
            r = keys.index(tuple(int(v) for v in memory[b, :, 0].tolist()))      # the source row picks the path
            want = [data.BOS] + self.paths[r] + [data.EOS]
            prefix = tgt_in[b].tolist()
            for t in range(T):
                rest = self.rest[r, t].clone()
                if t + 1 < len(want) and prefix[: t + 1] == want[: t + 1]:
                    rest[want[t + 1]] = 0.0
                    probs[b, t] = rest / rest.sum() * (1 - self.p[r, t])
                    probs[b, t, want[t + 1]] = self.p[r, t]
                else:
                    probs[b, t] = rest / rest.sum()
        return probs.log()

    def forward(self, src, tgt_in):
        return self.decode(tgt_in, *self.encode(src))


def _greedy_rows(greedy_decode, model, src, max_len: int, want_first: int | None = None,
                 want: list[list[int]] | None = None) -> None:
    out = call(greedy_decode, model, src, max_len, name="greedy_decode")
    expect(isinstance(out, list) and len(out) == src.shape[0],
           "greedy_decode should return one list of ids per source row.",
           "return a Python list of lists (one per batch row).")
    for i, row in enumerate(out):
        row = list(row)
        if row[:1] == [data.BOS]:
            fail("the decoded ids start with BOS.", "drop the BOS you started from: return ys[:, 1:].")
        expect(data.EOS not in row, f"a decoded row contains EOS: {row}.",
               "cut each row at its first EOS, and do not include the EOS.")
        if want_first is not None:
            expect(row[:1] == [want_first], f"greedy decoding should take the most likely first token; got {row}.",
                   "take argmax over the last position's logits at each step.")
        if want is not None and row != want[i]:
            hint = "take argmax over the last position's logits at each step."
            if len(row) < len(want[i]) and row == want[i][:len(row)]:
                hint = ("this row stopped before its own EOS: keep decoding until every row has produced EOS (or "
                        "max_len is reached), then cut each row at its first EOS.")
            fail(f"greedy decoding of row {i} gave {row}, expected the most likely path {want[i]}.", hint)


def check_greedy_decode(greedy_decode, hidden: bool = False) -> None:
    model = _ScriptedSeq2Seq()
    _greedy_rows(greedy_decode, model, torch.ones(3, 4, dtype=torch.long), 10, want_first=_ScriptedSeq2Seq.A)
    if hidden:
        rng, g = hidden_rng("greedy_decode"), hidden_generator("greedy_decode")
        trap = _DrawnTrap(rng)
        src = torch.randint(3, trap.vocab, (rng.randrange(1, 5), rng.randrange(1, 9)), generator=g)
        _greedy_rows(greedy_decode, trap, src, rng.randrange(3, 25), want_first=trap.A)
        max_len = rng.randrange(8, 25)
        paths = _PathsSeq2Seq(rng, g, rng.randrange(2, 6), rng.randrange(10, 41), max_len)
        # Rows must end at least two steps apart: a row cut one step early (before its EOS) looks whole.
        longest = max(range(len(paths.paths)), key=lambda r: len(paths.paths[r]))
        other = (longest + 1) % len(paths.paths)
        if len(paths.paths[longest]) < 2:
            paths.paths[longest] = paths.paths[longest] + [3, 4]
        if len(paths.paths[longest]) - min(map(len, paths.paths)) < 2:
            paths.paths[other] = paths.paths[other][:len(paths.paths[longest]) - 2]
        _greedy_rows(greedy_decode, paths, paths.src, max_len, want=paths.paths)


def _beam_trap(beam_search, greedy_decode, model, src, max_len: int, beam_size: int) -> None:
    one = call(beam_search, model, src, 1, max_len, name="beam_search")
    greedy = call(greedy_decode, model, src, max_len)[0]
    expect(list(one) == list(greedy), f"beam_size=1 gave {list(one)}, greedy gave {list(greedy)}.",
           "with one beam, beam search must reduce to greedy decoding.")
    best = call(beam_search, model, src, beam_size, max_len, name="beam_search")
    expect(data.EOS not in list(best) and data.BOS not in list(best),
           f"beam_search returned {list(best)}, which contains BOS or EOS.", "strip BOS and EOS from the result.")
    if list(best) == [model.A]:
        fail(f"beam_size={beam_size} returned [A] (probability {model.a * model.e:.2g}) instead of [B] "
             f"(probability {model.b:.2g}).",
             "keep beam_size candidates at every step and compare finished hypotheses by their summed log-prob "
             "divided by their length (EOS included).")
    expect(list(best) == [model.B], f"beam_size={beam_size} returned {list(best)}, expected [{model.B}].",
           "score = sum of log-probabilities / number of generated tokens, EOS included.")


class _TableSeq2Seq(nn.Module):
    """Next-token probabilities looked up by prefix (BOS first): ``table[prefix] = {id: p}``; the
    rest of the mass is spread evenly over the other ids (never PAD or BOS). A prefix not in
    the table ends: EOS with probability ``end``. The source is ignored."""

    def __init__(self, vocab: int, table: dict, end: float = 0.6):
        super().__init__()
        self.vocab, self.table, self.end = vocab, table, end

    def _row(self, prefix: tuple) -> torch.Tensor:
        chosen = self.table.get(prefix, {data.EOS: self.end})
        others = [i for i in range(3, self.vocab) if i not in chosen] + ([data.EOS] if data.EOS not in chosen else [])
        row = torch.full((self.vocab,), 1e-9)
        for i in others:
            row[i] = (1 - sum(chosen.values())) / len(others)
        for i, p in chosen.items():
            row[i] = p
        return row

    def encode(self, src):
        return torch.zeros(src.shape[0], 1, 1), torch.ones(src.shape[0], 1, 1, 1, dtype=torch.bool)

    def decode(self, tgt_in, memory, mask):
        rows = [[self._row(tuple(r[: t + 1])) for t in range(len(r))] for r in tgt_in.tolist()]
        return torch.stack([torch.stack(r) for r in rows]).log()              # (B, T, vocab)

    def forward(self, src, tgt_in):
        return self.decode(tgt_in, *self.encode(src))


def _length_trap(rng: random.Random | None) -> tuple[_TableSeq2Seq, list[int], list[int], int, int]:
    """A model where the best hypothesis by mean log-probability is long ([Y, chain...]) and the
    best by summed log-probability is short ([X]): (model, long, short, beam_size, max_len).
    Both facts are verified with chapter 6's beam search oracle before the trap is used."""
    for _ in range(200):
        if rng is None:
            vocab, m, beam, (X, Y, *chain) = 12, 2, 2, [3, 4, 5, 6]
            px, e, py, q = 0.5, 0.5, 0.22, 0.96
        else:
            vocab, m, beam = rng.randrange(12, 31), rng.randrange(1, 4), rng.randrange(2, 5)
            X, Y, *chain = rng.sample(range(3, vocab), 2 + m)
            px, e = rng.uniform(0.45, 0.6), rng.uniform(0.45, 0.6)
            py, q = rng.uniform(0.12, 0.3), rng.uniform(0.9, 0.98)
        B = data.BOS
        table = {(B,): {X: px, Y: py}, (B, X): {data.EOS: e}}
        prefix = (B, Y)
        for token in chain + [data.EOS]:
            table[prefix] = {token: q}
            prefix += (token,)
        model = _TableSeq2Seq(vocab, table)
        max_len = m + 3 + (0 if rng is None else rng.randrange(0, 4))

        def step_fn(prefixes, model=model):
            return model.decode(prefixes, None, None)[:, -1]

        best = ch06._beam_oracle(step_fn, B, data.EOS, beam, max_len, 1.0)[0][0]
        raw = ch06._beam_oracle(step_fn, B, data.EOS, beam, max_len, 1.0, "no_norm")[0][0]
        greedy = ch06._beam_oracle(step_fn, B, data.EOS, 1, max_len, 1.0)[0][0]
        if best == [Y] + chain + [data.EOS] and raw == [X, data.EOS] and greedy == [X, data.EOS]:
            return model, [Y] + chain, [X], beam, max_len
    raise RuntimeError("could not draw a length trap")   # pragma: no cover - the draws above always succeed


def _check_length_trap(beam_search, greedy_decode, rng) -> None:
    model, long, short, beam_size, max_len = _length_trap(rng)
    src = torch.full((1, 3), 3)
    one = call(beam_search, model, src, 1, max_len, name="beam_search")
    greedy = call(greedy_decode, model, src, max_len)[0]
    expect(list(one) == list(greedy), f"beam_size=1 gave {list(one)}, greedy gave {list(greedy)}.",
           "with one beam, beam search must reduce to greedy decoding.")
    best = [int(i) for i in call(beam_search, model, src, beam_size, max_len, name="beam_search")]
    if best == short:
        fail(f"beam_size={beam_size} returned the short hypothesis {short} (2 tokens with EOS) instead of {long} "
             f"({len(long) + 1} tokens), whose mean log-probability per token is higher.",
             "the hypotheses were ranked by their summed log-probability, which favours short ones: rank them by "
             "sum / number of generated tokens (EOS included): beam_search_core(..., length_penalty=1.0), and return "
             "its first (best) hypothesis.")
    expect(best == long, f"beam_size={beam_size} returned {best}, expected {long}.",
           "return the first hypothesis of beam_search_core(step_fn, BOS, EOS, beam_size, max_len, 1.0), "
           "without its EOS.")


def check_beam_search(beam_search, greedy_decode, beam_search_core, hidden: bool = False) -> None:
    """beam_search's own behaviour; when it fails, chapter 6's beam search it calls is checked first."""
    with _blaming("beam_search", dict(beam_search_core=beam_search_core), hidden):
        _check_beam_search(beam_search, greedy_decode, hidden)


def _check_beam_search(beam_search, greedy_decode, hidden: bool) -> None:
    _beam_trap(beam_search, greedy_decode, _ScriptedSeq2Seq(), torch.ones(1, 4, dtype=torch.long), 10, 2)
    _check_length_trap(beam_search, greedy_decode, None if not hidden else hidden_rng("capstone/beam_search/length"))
    if hidden:
        rng, g = hidden_rng("capstone/beam_search"), hidden_generator("capstone/beam_search")
        trap = _DrawnTrap(rng)
        src = torch.randint(3, trap.vocab, (1, rng.randrange(1, 9)), generator=g)
        _beam_trap(beam_search, greedy_decode, trap, src, rng.randrange(4, 25), rng.choice([2, 3]))
        max_len = rng.randrange(9, 25)
        paths = _PathsSeq2Seq(rng, g, 1, rng.randrange(10, 41), max_len)
        beam_size = rng.randrange(2, 5)
        best = call(beam_search, paths, paths.src, beam_size, max_len, name="beam_search")
        expect(data.EOS not in list(best) and data.BOS not in list(best),
               f"beam_search returned {list(best)}, which contains BOS or EOS.", "strip BOS and EOS from the result.")
        expect(list(best) == paths.paths[0],
               f"beam_size={beam_size} returned {list(best)}, expected the most likely sequence {paths.paths[0]}.",
               "score = sum of log-probabilities / number of generated tokens, EOS included.")

# ----------------------------------------------------------------------------- exercise 6

def check_classifier(build_classifier, Block, hidden: bool = False) -> None:
    with _block_first(Block, "EncoderClassifier", hidden):
        _check_classifier(build_classifier, hidden)


def _check_classifier(build_classifier, hidden: bool) -> None:
    rng = hidden_rng("classifier")
    torch.manual_seed(111 if not hidden else hidden_seed("classifier/init"))
    vocab, n_classes = (40, 6) if not hidden else (rng.choice([v for v in range(10, 61) if v != TINY_CLS.max_len]),
                                                   rng.randrange(2, 9))
    model = call(build_classifier, TINY_CLS, vocab, n_classes, name="build_classifier").eval()
    g = generator(112) if not hidden else hidden_generator("classifier")
    # n + 2 < max_words: the two inputs below differ in their number of PAD tokens.
    B, n = (3, 8) if not hidden else (rng.randrange(1, 5), rng.randrange(3, TINY_CLS.max_len - 2))
    ids = torch.randint(2, vocab, (B, n), generator=g)
    if hidden and ids[0, 0] == ids[0, -1]:
        ids[0, -1] = (ids[0, 0] - 2 + 1) % (vocab - 2) + 2   # so that reversing the words changes them
    padded = torch.cat([ids, torch.zeros(B, TINY_CLS.max_len - n, dtype=torch.long)], dim=1)
    with torch.no_grad():
        logits = call(model, padded, name="EncoderClassifier.forward")
        expect_tensor(logits, (B, n_classes), "classifier logits")
        fewer = model(torch.cat([ids, torch.zeros(B, 2, dtype=torch.long)], dim=1))
    expect_close(fewer, logits, "logits for the same words with less padding",
                 "PAD must change nothing: mask it in attention (pad_mask) and leave it out of the mean "
                 "(sum the real positions, divide by their count).", atol=1e-4)
    with torch.no_grad():
        shuffled = model(torch.cat([ids.flip(1), padded[:, n:]], dim=1))
    expect((shuffled - logits).abs().max() > 1e-4, "reversing the words left the logits unchanged.",
           "add positional embeddings: without them the encoder cannot see word order.")
    state, names = _position_tables(model, TINY_CLS.max_len, TINY_CLS.d_model)
    if names:
        moved = _shifted_logits(model, state, names, (padded,), 2.0 if not hidden else rng.uniform(1.0, 3.0))
        expect(same(moved, logits, atol=1e-4),
               "adding the same number to every entry of the positional embedding changed the logits.",
               "the Pre-LN blocks pass that constant along the residual stream: apply the final LayerNorm to the "
               "encoder's states before pooling them.")
    _check_pooling(build_classifier, vocab, n_classes, hidden, rng)
    if names:
        # Without positions, attention over all words and the mean over them ignore word order.
        flipped = torch.cat([ids.flip(1), padded[:, n:]], dim=1)
        plain, reversed_ = (_shifted_logits(model, state, names, (batch,), None) for batch in (padded, flipped))
        expect(same(reversed_, plain, atol=1e-4),
               "with the positional table set to zero, reversing the words changed the logits.",
               "the encoder's blocks must not be causal (Block(..., causal=False)): in a classifier every word "
               "attends to every real word, before and after it.")


def _check_pooling(build_classifier, vocab: int, n_classes: int, hidden: bool, rng: random.Random) -> None:
    """With no blocks (n_layers=0) each final state depends on its own word only, so the mean
    over n real words moves by exactly 1/n of what the first word alone moves it."""
    torch.manual_seed(113 if not hidden else hidden_seed("classifier/pooling"))
    flat = call(build_classifier, dataclasses.replace(TINY_CLS, n_layers=0), vocab, n_classes,
                name="build_classifier").eval()
    g = generator(114) if not hidden else hidden_generator("classifier/pooling")
    n = 5 if not hidden else rng.randrange(3, TINY_CLS.max_len - 1)
    a, b = (torch.randperm(vocab - 2, generator=g)[:2] + 2).tolist()
    rest = torch.randint(2, vocab, (n - 1,), generator=g)
    later = rest.clone()
    later[-1] = (later[-1] - 2 + 1) % (vocab - 2) + 2

    def row(words):
        return list(words) + [data.PAD] * (TINY_CLS.max_len - len(words))

    batch = torch.tensor([row([a] + rest.tolist()), row([b] + rest.tolist()), row([a]), row([b]),
                          row([a] + later.tolist())])
    with torch.no_grad():
        out = call(flat, batch, name="EncoderClassifier.forward").double()
    if (out[4] - out[0]).abs().max() < 1e-6:
        fail(f"changing the last of {n} words left the logits unchanged (a classifier with no blocks).",
             "the logits were read from the first position only: pool the mean of the final states over all real "
             "(non-PAD) positions.")
    both, alone = out[0] - out[1], out[2] - out[3]
    if not torch.allclose(both * n, alone, atol=1e-4, rtol=1e-3):
        if torch.allclose(both, alone, atol=1e-4, rtol=1e-3):
            hint = ("the real positions were summed, not averaged: divide the sum by their number, "
                    "(ids != PAD).sum(1, keepdim=True).")
        else:
            hint = ("pool the mean over the real positions only: (states * mask).sum(1) / mask.sum(1), with "
                    "mask = (ids != PAD)[..., None].")
        fail(f"with no blocks, changing the first of {n} words moved the logits by {float(both.abs().max()):.3g}, "
             f"expected 1/{n} of what it does alone ({float(alone.abs().max() / n):.3g}).", hint)

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
    earlier = [("load_encoder copies from your Seq2Seq of exercise 4, which fails exercise 4's tests",
                lambda: check_seq2seq(build_g2p, Block, hidden)),
               ("load_encoder copies into your EncoderClassifier of exercise 6, which fails exercise 6's tests",
                lambda: check_classifier(build_classifier, Block, hidden))]
    with earlier_first(*earlier):
        _check_load_encoder(load_encoder, build_g2p, build_classifier, hidden)


def _transfer_case(hidden: bool) -> dict:
    """Sizes for one test: width, depth, heads, the classifier's max_len, both vocabularies and
    the number of classes, all different from each other where a tensor's shape must tell them
    apart (the letter table from the phoneme table, the head from everything else)."""
    if not hidden:
        return dict(d=20, heads=4, layers=2, max_len=TINY_CLS.max_len, src=22, tgt=27, classes=9, extra=12)
    rng = hidden_rng("capstone/load_encoder")
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


def _random_state(state: dict, g: torch.Generator, buffers: set[str] = frozenset()) -> dict:
    """Every floating tensor of a state but its buffers replaced by random values: matrices and
    tables with standard deviation 1/sqrt(last dim), vectors (biases, LayerNorm weights) with 0.5."""
    out = {}
    for k, v in state.items():
        if isinstance(v, torch.Tensor) and v.is_floating_point() and k not in buffers:
            scale = v.shape[-1] ** -0.5 if v.dim() >= 2 else 0.5
            out[k] = (torch.randn(tuple(v.shape), generator=g, dtype=torch.float64) * scale).to(v.dtype)
        else:
            out[k] = v
    return out


def _snapshot(model) -> dict:
    """The model's state as copies (in-process, state_dict holds the live tensors)."""
    return {k: v.detach().clone() if isinstance(v, torch.Tensor) else v for k, v in dict(model.state_dict()).items()}


def _changed(before: dict, after: dict) -> list[str]:
    return [k for k, v in before.items() if isinstance(v, torch.Tensor) and v.is_floating_point()
            and not (k in after and _equal(after[k], v))]


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
        if "leaf Variable that requires grad" in str(err):
            with own_fault():
                fail(f"load_encoder raised an error: {_split(err)[0].splitlines()[0]}",
                     "copying into a parameter with copy_ is an in-place change that autograd refuses: do it "
                     "inside with torch.no_grad(): (load_state_dict does that for you).")
        raise
    g_after, c_after = _snapshot(g2p), _snapshot(classifier)
    with own_fault():
        moved = _changed(g_before, g_after)
        expect(not moved, f"load_encoder changed the G2P model: {_names(moved)}.",
               "copy from g2p_model into the classifier, never the other way: load_encoder(classifier, g2p_model) "
               "writes only into the classifier, and the G2P model was graded already.")
        touched = [k for k in head if k in _changed({k: c_before[k]}, c_after)]
        expect(not touched, f"load_encoder changed the classifier's {_names(touched)}, whose shape holds the "
               f"number of classes: its head.",
               "leave the head as build_classifier made it: the G2P model has nothing to give it, so only the "
               "encoder's parts are copied (" + _ENCODER_PARTS + ").")
        unchanged = not _changed(c_before, c_after)
        expect(not unchanged, "after load_encoder, every weight of the classifier still had the value it had "
               "before" + (f" (load_encoder returned {out.__class__.__name__} instead)." if out is not None else "."),
               "copy into the classifier that load_encoder receives, in place (it returns None; the training cell "
               "ignores what it returns): " + _ENCODER_PARTS + ".")
    with torch.no_grad():
        logits = call(classifier, ids, name="EncoderClassifier.forward")
    expect_tensor(logits, (ids.shape[0], logits.shape[-1]), "classifier logits")
    return dict(g=g_after, c_before=c_before, c=c_after, logits=logits.double(), pooled=_pooled_memory(g2p, ids))


def _check_load_encoder(load_encoder, build_g2p, build_classifier, hidden: bool) -> None:
    case = _transfer_case(hidden)
    d, max_len, src_vocab, tgt_vocab, n_classes = case["d"], case["max_len"], case["src"], case["tgt"], case["classes"]
    torch.manual_seed(121 if not hidden else hidden_seed("load_encoder/init"))
    g2p = call(build_g2p, dataclasses.replace(TINY_S2S, d_model=d, n_layers=case["layers"], n_heads=case["heads"]),
               src_vocab, tgt_vocab, name="build_g2p").eval()
    cls_cfg = dataclasses.replace(TINY_CLS, d_model=d, n_layers=case["layers"], n_heads=case["heads"], max_len=max_len)
    classifier = call(build_classifier, cls_cfg, src_vocab, n_classes, name="build_classifier").eval()
    g = generator(122) if not hidden else hidden_generator("capstone/load_encoder")
    B = d + 1 + case["extra"]               # more words than unknowns of the affine fit per class
    lengths = torch.randint(1, max_len + 1, (B,), generator=g)
    lengths[0] = max_len                    # every position is used
    ids = torch.randint(3, src_vocab, (B, max_len), generator=g)
    ids[torch.arange(max_len)[None, :] >= lengths[:, None]] = data.PAD
    g_shape, c_shape = _snapshot(g2p), _snapshot(classifier)
    g_buffers, c_buffers = _buffers(g2p), _buffers(classifier)
    head = [k for k, v in c_shape.items() if isinstance(v, torch.Tensor) and n_classes in tuple(v.shape)]
    c_state = _random_state(c_shape, g, c_buffers)
    first = _transfer_run(load_encoder, g2p, classifier, _random_state(g_shape, g, g_buffers), c_state, ids, head)
    # No sharing: new values in every weight of the classifier leave the G2P model as it was.
    classifier.load_state_dict(_random_state(c_shape, g, c_buffers))
    with own_fault():
        moved = _changed(first["g"], _snapshot(g2p))
        expect(not moved, f"after load_encoder, changing the classifier's weights changed the G2P model's "
               f"{_names(moved)}: the two models share tensors.", _SHARED)
    second = _transfer_run(load_encoder, g2p, classifier, _random_state(g_shape, g, g_buffers), c_state, ids, head)
    own = [_affine_residual(run["pooled"], run["logits"]) for run in (first, second)]
    both = _affine_residual(torch.cat([first["pooled"], second["pooled"]]),
                            torch.cat([first["logits"], second["logits"]]))
    if max(own) <= TRANSFER_TOLERANCE and both <= TRANSFER_TOLERANCE:
        return
    _diagnose_transfer(first, g2p, ids, dict(case, head=head, buffers=c_buffers))
    where = f"{B} words of up to {max_len} letters, d_model {d}, {case['layers']} block(s)"
    if max(own) > TRANSFER_TOLERANCE:
        fail(f"after load_encoder, the classifier's logits are not an affine function of the mean of "
             f"g2p_model.encode(ids)[0] over the real letters ({where}; relative residual {max(own):.2g}): "
             f"its encoder does not compute what the G2P encoder computes.",
             "copy " + _ENCODER_PARTS + "; the classifier must add the same positions to the same letters and run "
             "the same blocks in the same order.")
    fail(f"after load_encoder, the classifier's logits are an affine function of the G2P encoder's pooled states "
         f"for each of two G2P models, but not the same function ({where}; relative residual {both:.2g}): the "
         f"classifier's final LayerNorm does not hold the G2P encoder's final norm.",
         "copy the encoder's final LayerNorm (the one encode applies to the blocks' output before returning it), "
         "not the decoder's or a block's, into the classifier's final LayerNorm.")


def _equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return same(a, b, atol=0, rtol=0)


def _diagnose_transfer(run: dict, g2p, ids: torch.Tensor, case: dict) -> None:
    """Called when the classifier does not compute what the G2P encoder computes: name what
    load_encoder copied wrongly, from the values it wrote (the classifier's tensors are told
    apart by shape: the tests choose sizes that differ)."""
    d, max_len, G, before, after = case["d"], case["max_len"], run["g"], run["c_before"], run["c"]

    def keys(state, shape):
        return [k for k, v in state.items() if isinstance(v, torch.Tensor) and tuple(v.shape) == shape]

    positions, g_positions = keys(after, (max_len, d)), keys(G, (S2S_MAX_LEN, d))
    for k in positions:
        if _equal(after[k], before[k]):
            fail(f"load_encoder left the classifier's position table {k} as build_classifier made it.",
                 "copy the first max_len rows of the G2P model's position table: pos.weight[:max_len].")
        if any(_equal(after[k], G[j][-max_len:]) for j in g_positions) and \
                not any(_equal(after[k], G[j][:max_len]) for j in g_positions):
            fail(f"the classifier's position table {k} holds the last {max_len} rows of the G2P model's {S2S_MAX_LEN}.",
                 "a word's first letter sits at position 0 in both models: copy the first max_len rows, "
                 "pos.weight[:max_len], not the last ones.")
    letters, phonemes = keys(after, (case["src"], d)), keys(G, (case["tgt"], d))
    for k in letters:
        if _equal(after[k], before[k]):
            fail(f"load_encoder left the classifier's letter table {k} as build_classifier made it.",
                 "copy the G2P model's letter table (the embedding encode looks the source letters up in).")
        if any(_equal(after[k], G[j][:case["src"]]) for j in phonemes):
            fail(f"the classifier's letter table {k} holds the first rows of the G2P model's phoneme table "
                 f"({_names(phonemes)}).",
                 "copy the encoder's letter table (the embedding encode looks the source letters up in), not the "
                 "decoder's phoneme table: the classifier reads letters.")
    rest = [k for k in after if k not in positions + letters + case["head"] and k not in case["buffers"]
            and isinstance(after[k], torch.Tensor) and after[k].is_floating_point()]
    kept = [k for k in rest if _equal(after[k], before[k])]
    if any(after[k].dim() >= 2 for k in kept):
        fail(f"load_encoder left {_names(kept)} of the classifier as build_classifier made them.",
             "copy every encoder block of the G2P model into the classifier's block at the same depth "
             "(all cfg.n_layers of them), not only the tables.")
    if len(kept) == 2:                      # a LayerNorm's weight and bias
        fail(f"load_encoder left {_names(kept)} of the classifier as build_classifier made them.",
             "the final LayerNorm was not copied: copy the encoder's final LayerNorm (the one encode applies "
             "last) into the classifier's final LayerNorm.")
    if kept:
        fail(f"load_encoder left {_names(kept)} of the classifier as build_classifier made them.",
             "copy each encoder block whole, its LayerNorms and biases too (block.load_state_dict copies them "
             "all), and the encoder's final LayerNorm.")
    # Values taken from parts of the G2P model that encode does not use (its decoder).
    sources = {}
    for k in rest:
        found = [j for j, v in G.items() if isinstance(v, torch.Tensor) and _equal(after[k], v)]
        if found:
            sources[k] = found
    unused = []
    try:
        g2p.load_state_dict(G)              # the G2P model of this run (the second run loaded another)
        with torch.no_grad():
            memory = call(g2p.encode, ids, name="Seq2Seq.encode")[0]
        for k, found in sources.items():
            moved = {j: (v + 1.0 if j in found else v) for j, v in G.items()}
            g2p.load_state_dict(moved)
            with torch.no_grad():
                if same(g2p.encode(ids)[0], memory, atol=0, rtol=0):
                    unused.append((k, found[0]))
    finally:
        g2p.load_state_dict(G)
    if unused:
        fail(f"load_encoder copied parts of the G2P model that encode never uses into the classifier: "
             + "; ".join(f"{j} into {k}" for k, j in unused[:4]) + (" ..." if len(unused) > 4 else "") + ".",
             "those are the decoder's: copy the encoder's blocks (the ones encode runs) and the encoder's final "
             "LayerNorm, not the decoder's.")

# ----------------------------------------------------------------------------- grading the trained models

def _result(name: str, value: float, limit: float, better: str, baseline: str, also: str = "") -> None:
    ok = value <= limit if better == "lower" else value >= limit
    print(f"{name}: {value:.4f} (needs {'<=' if better == 'lower' else '>='} {limit}; {baseline})")
    expect(ok, f"{name} {value:.4f} misses the threshold {limit} of the {current_profile().name} profile.",
           "check the unit tests above first; then the training loss curve: it should fall steadily. "
           "A flat curve points at the learning rate or the optimizer; a curve that falls while the held-out "
           "metric stays poor points at a mismatch between training and evaluation (masks, shifting)." + also)


def _trained(model, exercises: str, then: str = ""):
    if model is None:
        raise NotWrittenYet(f"nothing was trained: finish exercises {exercises} first.{then}")
    return model


def _check_trained_causal(model, ids: torch.Tensor, block_size: int, device) -> None:
    """A held-out loss means something only for a model that cannot see the next character:
    changing the second half of a window must leave the first half's logits unchanged. The
    window is drawn when grading runs, so a model cannot recognise it."""
    T = min(block_size, (len(ids) - 1) // 2)
    start = hidden_rng("capstone/causal").randrange(len(ids) - 2 * T)
    x = ids[start:start + T].to(device)[None]
    y = x.clone()
    y[0, T // 2:] = ids[start + T:start + 2 * T - T // 2].to(device)   # other real text in the second half
    with torch.no_grad():
        a, b = model(x).float()[0, :T // 2], model(y).float()[0, :T // 2]
    expect(same(a, b, atol=1e-3), "the trained model's logits at the first positions changed when only later "
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
                      0.8, 20, generator(0))
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
            "copying nothing scores 1.0")
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
