"""Checks for the capstone: unit checks of the parts, then grading of the trained models
on held-out data with the course's own loaders and metrics (never the student's)."""

from __future__ import annotations

import dataclasses
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
from ._core import call, expect, expect_close, expect_tensor, fail, generator
from ._hidden import hidden_generator, hidden_rng, hidden_seed

CHECKPOINTS = Path("capstone_checkpoints")
TINY_LM = LMConfig(d_model=32, n_layers=2, n_heads=4, block_size=16, batch_size=4, steps=1, lr=1e-3, warmup_steps=1)
TINY_S2S = Seq2SeqConfig(d_model=32, n_layers=2, n_heads=4, batch_size=4, steps=1, lr=1e-3, warmup_steps=1)
TINY_CLS = ClassifierConfig(d_model=32, n_layers=2, n_heads=4, passage_chars=64, max_words=12, batch_size=4,
                            steps=1, lr=1e-3, warmup_steps=1)


def _tied(model: nn.Module) -> bool:
    embeddings = [m.weight for m in model.modules() if isinstance(m, nn.Embedding)]
    linears = [m.weight for m in model.modules() if isinstance(m, nn.Linear)]
    return any(e is w for e in embeddings for w in linears)

# ----------------------------------------------------------------------------- exercise 1

def check_decoder_lm(build_lm, hidden: bool = False) -> None:
    rng = hidden_rng("decoder_lm")
    torch.manual_seed(71 if not hidden else hidden_seed("decoder_lm/init"))
    vocab = 30 if not hidden else rng.randrange(20, 81)
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
                 "self-attention must be causal in a language model: pass is_causal=True (or a lower-triangular "
                 "mask) so position t sees only positions <= t.")
    # One causal layer without positions sees tokens 0..t as a set: swapping the first two
    # leaves every later output unchanged. (Deeper causal stacks can recover some order.)
    torch.manual_seed(73 if not hidden else hidden_seed("decoder_lm/shallow"))
    shallow = call(build_lm, dataclasses.replace(TINY_LM, n_layers=1), vocab, name="build_lm").eval()
    swapped = x.clone()
    swapped[:, [0, 1]] = x[:, [1, 0]]
    with torch.no_grad():
        same = (shallow(swapped)[:, 2:] - shallow(x)[:, 2:]).abs().max() < 1e-5
    expect(not bool(same), "swapping the first two tokens left every later output unchanged.",
           "the model has no sense of order: add a positional embedding to the token embedding.")

# ----------------------------------------------------------------------------- exercise 2

def _lr_oracle(step, max_lr, warmup, total):
    if step < warmup:
        return max_lr * (step + 1) / warmup
    progress = min((step - warmup) / max(1, total - 1 - warmup), 1.0)
    return max_lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def check_lr_at(lr_at, hidden: bool = False) -> None:
    cases = [(0, 1.0, 10, 100), (9, 1.0, 10, 100), (10, 1.0, 10, 100), (99, 1.0, 10, 100), (55, 2.0, 10, 100)]
    if hidden:
        rng = hidden_rng("lr_at")
        cases += [(s, 3e-4, 7, 53) for s in range(53)]
        for _ in range(2):
            max_lr, warmup = float(f"{10 ** rng.uniform(-5, 0):.3g}"), rng.randrange(1, 30)
            total = warmup + rng.randrange(2, 150)
            cases += [(s, max_lr, warmup, total) for s in range(total)]
    for step, max_lr, warmup, total in cases:
        got = call(lr_at, step, max_lr, warmup, total)
        want = _lr_oracle(step, max_lr, warmup, total)
        if not math.isclose(got, want, rel_tol=1e-6, abs_tol=1e-12):
            if step < warmup and math.isclose(got, max_lr * step / warmup, rel_tol=1e-6):
                hint = "warm-up counts from step + 1: step 0 already uses max_lr / warmup_steps, never 0."
            elif step < warmup:
                hint = "during warm-up the rate rises linearly: max_lr * (step + 1) / warmup_steps."
            elif math.isclose(got, max_lr * 0.5 * (1 + math.cos(math.pi * min((step - warmup) / max(1, total - 1 - warmup), 1))), rel_tol=1e-6):
                hint = "the cosine decays to 0.1 * max_lr, not to 0: lr = 0.1*max_lr + 0.9*max_lr*(1 + cos(pi*p))/2."
            else:
                hint = "after warm-up, p = (step - warmup_steps) / (total_steps - 1 - warmup_steps) goes 0 -> 1 under the cosine."
            fail(f"lr_at({step}, {max_lr}, {warmup}, {total}) = {got:.6g}, expected {want:.6g}.", hint)


class _GroupsProbe(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(11, 8)
        self.ln = nn.LayerNorm(8)
        self.fc = nn.Linear(8, 8)
        self.head = nn.Linear(8, 11, bias=False)
        self.head.weight = self.tok.weight


class _GroupsDrawn(nn.Module):
    """A model of drawn layout: embedding, Linear layers with or without bias, norms, maybe a tied head."""

    def __init__(self, rng: random.Random):
        super().__init__()
        vocab, d = rng.randrange(5, 50), rng.randrange(2, 17)
        self.tok = nn.Embedding(vocab, d)
        layers: list[nn.Module] = [nn.Linear(d, d, bias=rng.random() < 0.5)]
        for _ in range(rng.randrange(0, 4)):
            layers.append(rng.choice([nn.Linear(d, d, bias=rng.random() < 0.5), nn.LayerNorm(d), nn.GELU()]))
        rng.shuffle(layers)
        self.body = nn.Sequential(*layers)
        self.norm = nn.LayerNorm(d, bias=rng.random() < 0.5)
        self.head = nn.Linear(d, vocab, bias=rng.random() < 0.3)
        if rng.random() < 0.5 and self.head.bias is None:
            self.head.weight = self.tok.weight


def _check_groups(param_groups, model: nn.Module, wd: float, hidden: bool) -> None:
    groups = call(param_groups, model, wd)
    expect(isinstance(groups, list) and len(groups) == 2, "param_groups should return a list of two dicts.",
           "return [{'params': [...], 'weight_decay': wd}, {'params': [...], 'weight_decay': 0.0}].")
    decay = next((g for g in groups if g.get("weight_decay", 0) > 0), None)
    plain = next((g for g in groups if g.get("weight_decay", 1) == 0), None)
    expect(decay is not None and plain is not None, "one group needs weight_decay=wd and the other 0.0.",
           "set 'weight_decay' in each group dict.")
    if hidden:
        expect(math.isclose(decay["weight_decay"], wd), f"the decayed group has weight_decay "
               f"{decay['weight_decay']}, expected the weight_decay passed in, {wd}.",
               "use the argument: {'params': [...], 'weight_decay': weight_decay}.")
    decayed = {id(p) for p in decay["params"]}
    all_ids = [id(p) for g in groups for p in g["params"]]
    expect(len(all_ids) == len(set(all_ids)) == len(list(model.parameters())),
           "every parameter must be in exactly one group, once.",
           "a tied weight appears once in model.parameters(): build the groups from that list.")
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    norms = {id(p) for m in model.modules() if isinstance(m, nn.LayerNorm) for p in m.parameters()}
    biases = {id(m.bias) for m in linears if m.bias is not None}
    if decayed & (norms | biases):
        fail("LayerNorm weights or biases are in the decayed group.",
             "decay only the weights of nn.Linear layers; norms and biases should not shrink toward zero.")
    if decayed & embeddings:
        fail("the (tied) embedding table is decayed.", "embeddings get no weight decay, even when tied to the head.")
    expect(decayed == {id(m.weight) for m in linears} - embeddings,
           "the decayed group should hold exactly the untied Linear weights.",
           "collect m.weight for every nn.Linear m, minus the embedding weights.")


def check_param_groups(param_groups, hidden: bool = False) -> None:
    _check_groups(param_groups, _GroupsProbe(), 0.1, hidden)
    if hidden:
        rng = hidden_rng("param_groups")
        for _ in range(4):
            _check_groups(param_groups, _GroupsDrawn(rng), float(f"{rng.uniform(0.01, 0.5):.3g}"), hidden)


def _train_oracle(model, batches, steps, lr, warmup, clip, zero_grad=True, use_clip=True, schedule=True):
    decay = {id(m.weight) for m in model.modules() if isinstance(m, nn.Linear)}
    params = list(model.parameters())
    opt = torch.optim.AdamW([{"params": [p for p in params if id(p) in decay], "weight_decay": 0.1},
                             {"params": [p for p in params if id(p) not in decay], "weight_decay": 0.0}],
                            lr=lr, betas=(0.9, 0.95))
    losses = []
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = _lr_oracle(step, lr, warmup, steps) if schedule else lr
        x, y = batches[step]
        loss = F.mse_loss(model(x), y)
        if zero_grad:
            opt.zero_grad()
        loss.backward()
        if use_clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        losses.append(loss.item())
    return losses


def check_train(train, hidden: bool = False) -> None:
    rng = hidden_rng("train")
    seed = 81 if not hidden else hidden_seed("train/init")
    if not hidden:
        steps, lr, warmup, clip = 12, 0.05, 3, 0.5
        n_batch, n_in, n_hidden, n_out = 16, 4, 8, 2
    else:
        # Targets of size 10 give gradient norms far above clip <= 0.5, so clipping always matters.
        steps, lr, warmup, clip = rng.randrange(10, 21), rng.uniform(0.01, 0.05), rng.randrange(1, 6), rng.uniform(0.1, 0.5)
        n_batch, n_in, n_hidden, n_out = rng.randrange(8, 17), rng.randrange(2, 7), rng.randrange(4, 13), rng.randrange(1, 4)
    g = generator(seed) if not hidden else hidden_generator("train/batches")
    batches = [(torch.randn(n_batch, n_in, generator=g), torch.randn(n_batch, n_out, generator=g) * 10)
               for _ in range(steps)]

    def fresh():
        torch.manual_seed(seed)
        return nn.Sequential(nn.Linear(n_in, n_hidden), nn.LayerNorm(n_hidden), nn.Linear(n_hidden, n_out))

    student = fresh()
    losses = call(train, student, lambda step: batches[step], lambda m, x, y: F.mse_loss(m(x), y), steps, lr, warmup,
                  "cpu", use_bf16=False, clip=clip, progress=False, name="train")
    expect(isinstance(losses, list) and len(losses) == steps, f"train should return a list of {steps} losses.",
           "append loss.item() once per step.")
    want = fresh()
    want_losses = _train_oracle(want, batches, steps, lr, warmup, clip)
    got_params = torch.cat([p.detach().flatten() for p in student.parameters()])
    want_params = torch.cat([p.detach().flatten() for p in want.parameters()])
    if torch.allclose(got_params, want_params, atol=1e-5) and torch.allclose(torch.tensor(losses),
                                                                               torch.tensor(want_losses), atol=1e-4):
        return
    for variant, hint in [(dict(use_clip=False), "gradients were not clipped: call "
                           "torch.nn.utils.clip_grad_norm_(model.parameters(), clip) after backward, before step."),
                          (dict(zero_grad=False), "gradients accumulate across steps: call optimizer.zero_grad() "
                           "every step, before backward."),
                          (dict(schedule=False), "the learning rate never changed: set group['lr'] = lr_at(step, ...) "
                           "for every param group at every step.")]:
        other = fresh()
        _train_oracle(other, batches, steps, lr, warmup, clip, **variant)
        if torch.allclose(got_params, torch.cat([p.detach().flatten() for p in other.parameters()]), atol=1e-5):
            fail("after training a small model, its weights differ from the expected run.", hint)
    fail("after training a small model, its weights differ from the expected run.",
         "use AdamW(param_groups(model, weight_decay), betas=(0.9, 0.95)), lr_at for the rate, "
         "zero_grad, backward, clip_grad_norm_, step, in that order.")

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


def check_generate(generate, hidden: bool = False) -> None:
    vocab, block = 10, 4
    model = _ScriptedLM(vocab, block)
    prompt = torch.tensor([[3, 4, 5]])
    try:
        out = generate(model, prompt.clone(), 8, block, 1.0, 1)
    except IndexError as err:
        fail(f"generate fed the model more than block_size tokens ({err}).",
             "crop the context to the last block_size ids before each forward pass: ids[:, -block_size:].")
    except NotImplementedError:
        raise
    expect_tensor(out, (1, 11), "generate output")
    expect(torch.equal(out[:, :3], prompt), "the output must start with the prompt.", "concatenate new ids after it.")
    expect(out[0, 3:].tolist() == [6, 7, 8, 9, 0, 1, 2, 3],
           f"with top_k=1 the continuation should be the argmax chain 6, 7, 8, ...; got {out[0, 3:].tolist()}.",
           "keep only the top_k logits (set the rest to -inf) before softmax, and sample from the last position.")
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
               "divide the logits by temperature before softmax (not the probabilities after it).")
    a = call(generate, model, prompt, 20, block, 1.0, None, generator(91))
    b = call(generate, model, prompt, 20, block, 1.0, None, generator(91))
    expect(torch.equal(a, b), "two runs with generators of the same seed gave different samples.",
           "pass generator=generator to torch.multinomial.")
    cold = call(generate, model, prompt, 30, block, 0.05, None, generator(92))
    expect((cold[0, 3:] == (cold[0, 2:-1] + 1) % vocab).float().mean() > 0.95,
           "at temperature 0.05 sampling should almost always pick the most likely token.",
           "divide the logits by temperature before softmax (not the probabilities).")
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
    except NotImplementedError:
        raise
    expect_tensor(out, (1, P + n_new), "generate output")
    expect(torch.equal(out[:, :P], prompt), "the output must start with the prompt.", "concatenate new ids after it.")
    chain = [(int(prompt[0, -1]) + 1 + i) % vocab for i in range(n_new)]
    expect(out[0, P:].tolist() == chain,
           f"with top_k=1 the continuation should be the argmax chain {chain[:3]}, ...; got {out[0, P:].tolist()}.",
           "keep only the top_k logits (set the rest to -inf) before softmax, and sample from the last position.")
    # top_k=2: after token t only (t + 1) % vocab and 0 may follow (unless (t + 1) % vocab is 0 itself: ties).
    two = call(generate, model, prompt, 60, block, rng.uniform(0.5, 3.0), 2, hidden_generator("generate/top2"))[0]
    for prev, nxt in zip(two[P - 1:-1].tolist(), two[P:].tolist()):
        if (prev + 1) % vocab != 0 and nxt not in ((prev + 1) % vocab, 0):
            fail(f"with top_k=2 the token {nxt} followed {prev}, but only {(prev + 1) % vocab} and 0 had the two "
                 f"largest logits.", "keep only the top_k logits (set the rest to -inf) before softmax.")
    seed = rng.randrange(2 ** 31)
    a = call(generate, model, prompt, 20, block, 1.0, None, generator(seed))
    b = call(generate, model, prompt, 20, block, 1.0, None, generator(seed))
    expect(torch.equal(a, b), "two runs with generators of the same seed gave different samples.",
           "pass generator=generator to torch.multinomial.")
    # At temperature 5 every token has probability >= 1/12 at each step: 400 samples reach all of them
    # except with probability below 1e-13.
    hot = call(generate, _ScriptedLM(10, 4), torch.tensor([[3, 4, 5]]), 400, 4, 5.0, None,
               hidden_generator("generate/hot"))
    expect(len(set(hot[0].tolist())) == 10, "at temperature 5 sampling should reach every token.",
           "divide the logits by temperature: a high temperature flattens the distribution.")

# ----------------------------------------------------------------------------- exercise 4

def check_seq2seq(build_g2p, hidden: bool = False) -> None:
    rng = hidden_rng("seq2seq")
    torch.manual_seed(101 if not hidden else hidden_seed("seq2seq/init"))
    src_vocab, tgt_vocab = (20, 15) if not hidden else (rng.randrange(8, 41), rng.randrange(6, 31))
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
    changed = tgt.clone()
    changed[:, 4] = (changed[:, 4] + 1 - 3) % (tgt_vocab - 3) + 3
    with torch.no_grad():
        diff = (model(src, changed) - logits).abs().amax(dim=(0, 2))
    expect(diff[:4].max() < 1e-5, "changing target token 4 changed the decoder's outputs at positions 0-3.",
           "the decoder's self-attention must be causal (is_causal=True); cross-attention needs no causal mask.")
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
        if want is not None:
            expect(row == want[i], f"greedy decoding of row {i} gave {row}, expected the most likely path {want[i]}.",
                   "take argmax over the last position's logits at each step.")


def check_greedy_decode(greedy_decode, hidden: bool = False) -> None:
    model = _ScriptedSeq2Seq()
    _greedy_rows(greedy_decode, model, torch.ones(3, 4, dtype=torch.long), 10, want_first=_ScriptedSeq2Seq.A)
    if hidden:
        rng, g = hidden_rng("greedy_decode"), hidden_generator("greedy_decode")
        trap = _DrawnTrap(rng)
        src = torch.randint(3, trap.vocab, (rng.randrange(1, 5), rng.randrange(1, 9)), generator=g)
        _greedy_rows(greedy_decode, trap, src, rng.randrange(3, 25), want_first=trap.A)
        max_len = rng.randrange(8, 25)
        paths = _PathsSeq2Seq(rng, g, rng.randrange(1, 6), rng.randrange(10, 41), max_len)
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


def check_beam_search(beam_search, greedy_decode, hidden: bool = False) -> None:
    _beam_trap(beam_search, greedy_decode, _ScriptedSeq2Seq(), torch.ones(1, 4, dtype=torch.long), 10, 2)
    if hidden:
        rng, g = hidden_rng("beam_search"), hidden_generator("beam_search")
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

def check_classifier(build_classifier, hidden: bool = False) -> None:
    rng = hidden_rng("classifier")
    torch.manual_seed(111 if not hidden else hidden_seed("classifier/init"))
    vocab, n_classes = (40, 6) if not hidden else (rng.randrange(10, 61), rng.randrange(2, 9))
    model = call(build_classifier, TINY_CLS, vocab, n_classes, name="build_classifier").eval()
    g = generator(112) if not hidden else hidden_generator("classifier")
    # n + 2 < max_words: the two inputs below differ in their number of PAD tokens.
    B, n = (3, 8) if not hidden else (rng.randrange(1, 5), rng.randrange(3, TINY_CLS.max_words - 2))
    ids = torch.randint(2, vocab, (B, n), generator=g)
    if hidden and ids[0, 0] == ids[0, -1]:
        ids[0, -1] = (ids[0, 0] - 2 + 1) % (vocab - 2) + 2   # so that reversing the words changes them
    padded = torch.cat([ids, torch.zeros(B, TINY_CLS.max_words - n, dtype=torch.long)], dim=1)
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

# ----------------------------------------------------------------------------- grading the trained models

def _result(name: str, value: float, limit: float, better: str, baseline: str) -> None:
    ok = value <= limit if better == "lower" else value >= limit
    print(f"{name}: {value:.4f} (needs {'<=' if better == 'lower' else '>='} {limit}; {baseline})")
    expect(ok, f"{name} {value:.4f} misses the threshold {limit} of the {current_profile().name} profile.",
           "check the unit tests above first; then the training loss curve: it should fall steadily. "
           "A flat curve points at the learning rate or the optimizer; a curve that falls while the held-out "
           "metric stays poor points at a mismatch between training and evaluation (masks, shifting).")


def _trained(model, exercises: str):
    if model is None:
        raise NotImplementedError(f"nothing was trained: finish exercises {exercises} first.")
    return model


def grade_lm(model, generate) -> None:
    model = _trained(model, "1-3")
    profile, device = current_profile(), get_device()
    cfg = profile.lm
    model = model.to(device)
    loss = metrics.lm_loss(model, data.lm_ids("test"), cfg.block_size, cfg.eval_tokens, device)
    tok = data.char_tokenizer()
    base = metrics.unigram_loss(data.lm_ids("train"), data.lm_ids("test"), tok.vocab_size)
    path = save_checkpoint(model, "lm", profile.name, CHECKPOINTS / "lm.pt")
    sample = generate(model, torch.tensor([tok.encode("ROMEO:\n")], device=device), 200, cfg.block_size, 0.8, 20,
                      generator(0))
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

    model = _trained(model, "4-5")
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
    print(f"saved {save_checkpoint(model, 'g2p', profile.name, CHECKPOINTS / 'g2p.pt')}")
    _result(f"phoneme error rate on {len(words)} held-out words", per, profile.thresholds.g2p_max_per, "lower",
            "copying nothing scores 1.0")
    _result("word error rate", wer, profile.thresholds.g2p_max_wer, "lower", "trivial baseline 1.0")


def classifier_predictions(model, ids: torch.Tensor, device) -> torch.Tensor:
    model = model.to(device).eval()
    with torch.no_grad():
        return torch.cat([model(ids[i:i + 256].to(device)).argmax(-1).cpu() for i in range(0, len(ids), 256)])


def grade_classifier(model) -> None:
    model = _trained(model, "6")
    profile, device = current_profile(), get_device()
    cfg = profile.cls
    ids, labels = data.classifier_tensors("test", cfg.passage_chars, cfg.max_words)
    predicted = classifier_predictions(model, ids, device)
    acc = metrics.accuracy(predicted, labels)
    train_texts, train_labels = data.passages("train", cfg.passage_chars)
    majority = metrics.majority_accuracy(train_labels, labels)
    print("confusion matrix (rows: true genre, columns: predicted):", data.GENRES)
    print(metrics.confusion_matrix(predicted, labels, len(data.GENRES)))
    print(f"saved {save_checkpoint(model, 'cls', profile.name, CHECKPOINTS / 'cls.pt')}")
    _result("held-out genre accuracy", acc, profile.thresholds.cls_min_accuracy, "higher",
            f"majority class {majority:.3f}")
