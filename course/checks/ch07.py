"""Checks for the capstone: unit checks of the parts, then grading of the trained models
on held-out data with the course's own loaders and metrics (never the student's)."""

from __future__ import annotations

import math
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..capstone import data, metrics
from ..capstone.profiles import ClassifierConfig, LMConfig, Seq2SeqConfig, current_profile
from ..capstone.weights import save_checkpoint
from ..device import get_device
from ._core import call, expect, expect_close, expect_tensor, fail, generator

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
    torch.manual_seed(71 if not hidden else 7171)
    vocab = 30 if not hidden else 57
    model = call(build_lm, TINY_LM, vocab, name="build_lm").eval()
    g = generator(72 if not hidden else 7272)
    x = torch.randint(0, vocab, (3, TINY_LM.block_size), generator=g)
    with torch.no_grad():
        logits = call(model, x, name="DecoderLM.forward")
    expect_tensor(logits, (3, TINY_LM.block_size, vocab), "DecoderLM logits")
    expect(_tied(model), "the output projection does not share the token embedding's weight.",
           "tie them: self.head.weight = self.tok.weight (chapter 1, exercise 6).")
    for t in ([5, 9] if not hidden else [1, 7, 12, 15]):
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
    import dataclasses

    torch.manual_seed(73)
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
        cases += [(s, 3e-4, 7, 53) for s in range(53)]
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


def check_param_groups(param_groups, hidden: bool = False) -> None:
    model = _GroupsProbe()
    groups = call(param_groups, model, 0.1)
    expect(isinstance(groups, list) and len(groups) == 2, "param_groups should return a list of two dicts.",
           "return [{'params': [...], 'weight_decay': wd}, {'params': [...], 'weight_decay': 0.0}].")
    decay = next((g for g in groups if g.get("weight_decay", 0) > 0), None)
    plain = next((g for g in groups if g.get("weight_decay", 1) == 0), None)
    expect(decay is not None and plain is not None, "one group needs weight_decay=wd and the other 0.0.",
           "set 'weight_decay' in each group dict.")
    decayed = {id(p) for p in decay["params"]}
    all_ids = [id(p) for g in groups for p in g["params"]]
    expect(len(all_ids) == len(set(all_ids)) == len(list(model.parameters())),
           "every parameter must be in exactly one group, once.",
           "a tied weight appears once in model.parameters(): build the groups from that list.")
    if id(model.ln.weight) in decayed or id(model.fc.bias) in decayed:
        fail("LayerNorm weights or biases are in the decayed group.",
             "decay only the weights of nn.Linear layers; norms and biases should not shrink toward zero.")
    if id(model.tok.weight) in decayed:
        fail("the (tied) embedding table is decayed.", "embeddings get no weight decay, even when tied to the head.")
    expect(decayed == {id(model.fc.weight)}, "the decayed group should hold exactly the untied Linear weights.",
           "collect m.weight for every nn.Linear m, minus the embedding weights.")


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
    seed = 81 if not hidden else 8181
    steps, lr, warmup, clip = (12, 0.05, 3, 0.5) if not hidden else (20, 0.03, 5, 0.2)
    g = generator(seed)
    batches = [(torch.randn(16, 4, generator=g), torch.randn(16, 2, generator=g) * 10) for _ in range(steps)]

    def fresh():
        torch.manual_seed(seed)
        return nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8), nn.Linear(8, 2))

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
        hot = call(generate, model, prompt, 200, block, 5.0, None, generator(93))
        expect(len(set(hot[0].tolist())) == vocab, "at temperature 5 sampling should reach every token.",
               "divide the logits by temperature: a high temperature flattens the distribution.")

# ----------------------------------------------------------------------------- exercise 4

def check_seq2seq(build_g2p, hidden: bool = False) -> None:
    torch.manual_seed(101 if not hidden else 10101)
    model = call(build_g2p, TINY_S2S, 20, 15, name="build_g2p").eval()
    g = generator(102)
    src = torch.randint(3, 20, (2, 7), generator=g)
    tgt = torch.randint(3, 15, (2, 6), generator=g)
    tgt[:, 0] = data.BOS
    with torch.no_grad():
        logits = call(model, src, tgt, name="Seq2Seq.forward")
    expect_tensor(logits, (2, 6, 15), "Seq2Seq logits")
    changed = tgt.clone()
    changed[:, 4] = (changed[:, 4] + 1 - 3) % 12 + 3
    with torch.no_grad():
        diff = (model(src, changed) - logits).abs().amax(dim=(0, 2))
    expect(diff[:4].max() < 1e-5, "changing target token 4 changed the decoder's outputs at positions 0-3.",
           "the decoder's self-attention must be causal (is_causal=True); cross-attention needs no causal mask.")
    padded = torch.cat([src, torch.full((2, 5), data.PAD)], dim=1)
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

    def encode(self, src):
        return torch.zeros(src.shape[0], 1, 1), torch.ones(src.shape[0], 1, 1, 1, dtype=torch.bool)

    def decode(self, tgt_in, memory, mask):
        B_, T = tgt_in.shape
        probs = torch.full((B_, T, 6), 1e-6)
        for b in range(B_):
            for t in range(T):
                prefix = tgt_in[b, : t + 1].tolist()
                if prefix == [data.BOS]:
                    probs[b, t, self.A], probs[b, t, self.B] = 0.6, 0.4
                elif prefix == [data.BOS, self.A]:
                    probs[b, t, data.EOS], probs[b, t, self.C] = 0.55, 0.45
                else:                                  # after B or C: end
                    probs[b, t, data.EOS] = 1.0
        return probs.log()

    def forward(self, src, tgt_in):
        return self.decode(tgt_in, *self.encode(src))


def check_greedy_decode(greedy_decode, hidden: bool = False) -> None:
    model = _ScriptedSeq2Seq()
    out = call(greedy_decode, model, torch.ones(3, 4, dtype=torch.long), 10, name="greedy_decode")
    expect(isinstance(out, list) and len(out) == 3, "greedy_decode should return one list of ids per source row.",
           "return a Python list of lists (one per batch row).")
    for row in out:
        row = list(row)
        if row[:1] == [data.BOS]:
            fail("the decoded ids start with BOS.", "drop the BOS you started from: return ys[:, 1:].")
        expect(data.EOS not in row, f"a decoded row contains EOS: {row}.",
               "cut each row at its first EOS, and do not include the EOS.")
        expect(row[:1] == [_ScriptedSeq2Seq.A], f"greedy decoding should take the most likely first token; got {row}.",
               "take argmax over the last position's logits at each step.")


def check_beam_search(beam_search, greedy_decode, hidden: bool = False) -> None:
    model = _ScriptedSeq2Seq()
    src = torch.ones(1, 4, dtype=torch.long)
    one = call(beam_search, model, src, 1, 10, name="beam_search")
    greedy = call(greedy_decode, model, src, 10)[0]
    expect(list(one) == list(greedy), f"beam_size=1 gave {list(one)}, greedy gave {list(greedy)}.",
           "with one beam, beam search must reduce to greedy decoding.")
    best = call(beam_search, model, src, 2, 10, name="beam_search")
    expect(data.EOS not in list(best) and data.BOS not in list(best),
           f"beam_search returned {list(best)}, which contains BOS or EOS.", "strip BOS and EOS from the result.")
    if list(best) == [_ScriptedSeq2Seq.A]:
        fail("beam_size=2 returned [A] (probability 0.33) instead of [B] (probability 0.4).",
             "keep beam_size candidates at every step and compare finished hypotheses by their summed log-prob "
             "divided by their length (EOS included).")
    expect(list(best) == [_ScriptedSeq2Seq.B], f"beam_size=2 returned {list(best)}, expected [{_ScriptedSeq2Seq.B}].",
           "score = sum of log-probabilities / number of generated tokens, EOS included.")

# ----------------------------------------------------------------------------- exercise 6

def check_classifier(build_classifier, hidden: bool = False) -> None:
    torch.manual_seed(111 if not hidden else 11111)
    model = call(build_classifier, TINY_CLS, 40, 6, name="build_classifier").eval()
    g = generator(112)
    ids = torch.randint(2, 40, (3, 8), generator=g)
    padded = torch.cat([ids, torch.zeros(3, TINY_CLS.max_words - 8, dtype=torch.long)], dim=1)
    with torch.no_grad():
        logits = call(model, padded, name="EncoderClassifier.forward")
        expect_tensor(logits, (3, 6), "classifier logits")
        fewer = model(torch.cat([ids, torch.zeros(3, 2, dtype=torch.long)], dim=1))
    expect_close(fewer, logits, "logits for the same words with less padding",
                 "PAD must change nothing: mask it in attention (pad_mask) and leave it out of the mean "
                 "(sum the real positions, divide by their count).", atol=1e-4)
    with torch.no_grad():
        shuffled = model(torch.cat([ids.flip(1), padded[:, 8:]], dim=1))
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
