"""One training run of a capstone task, as the locked notebook cells do it, timed by phase.

Besides the reference solution (``variant="reference"``), a run can train:

- for the language model, the reference code at nanoGPT's CPU sizes (``nanogpt-size``: 4
  layers, 4 heads, width 128, block 64, batch 12, 2,000 steps), the same model built from
  PyTorch's ``nn.TransformerEncoderLayer`` (``torch-baseline``), and plausible broken models:
  ``no-positions`` (the positional table held at zero), ``no-causal-mask`` (every block
  sees the future), ``post-ln-no-final-norm`` (``x = LN(x + f(x))`` blocks and no final
  LayerNorm) and ``bigram`` (no transformer at all: the counts of each character's successor,
  with add-one smoothing, not trained);
- for G2P, the broken ``no-positions`` (the shared positional table held at zero),
  ``no-causal-mask`` (decoder blocks that see the phonemes they are asked to predict while
  training, and cannot at decoding) and ``causal-encoder`` (encoder blocks left causal, so a
  letter never sees the letters after it);
- for the classifier, ``from-scratch`` (the reference classifier without the G2P start, at
  the learning rate the profile trained it with from scratch, ``SCRATCH_LR``), and the broken
  ``no-positions`` and ``causal-encoder`` (blocks left causal).

Where the profile says so (``cls.from_g2p``), the classifier, reference and broken variants
alike, starts as the notebook's locked cell starts it: from the reference G2P model trained
first with the same seed, copied by the notebook's ``load_encoder`` (exercise 7: the letter
table, the first ``max_len`` rows of the position table, the encoder blocks and the encoder's
final LayerNorm). That G2P training is timed apart (``g2p training, not counted``): a notebook
has spent it already; it is trained once per seed and process, and a ``g2p`` task run before
in the same process is reused (the same model: same seed, batches and code).
"""

from __future__ import annotations

import copy
import time
import types
from functools import lru_cache
from dataclasses import replace

import torch
import torch.nn as nn
import torch.nn.functional as F

from course.capstone import data, metrics
from course.capstone.profiles import current_profile
from course.checks.ch07 import classifier_predictions, g2p_predictions

LM_VARIANTS = ("reference", "nanogpt-size", "torch-baseline", "no-positions", "no-causal-mask",
               "post-ln-no-final-norm", "bigram")
G2P_VARIANTS = ("reference", "no-positions", "no-causal-mask", "causal-encoder")
CLS_VARIANTS = ("reference", "from-scratch", "no-positions", "causal-encoder")
#: the classifier's (lr, min_lr) when it trained from scratch in each profile, before it started
#: from the G2P encoder: the from-scratch variant keeps them (benchmarks/capstone_thresholds.md)
SCRATCH_LR = {"smoke": (3e-3, 3e-4), "cpu": (3e-3, 3e-4), "gpu": (1e-3, 1e-4)}
#: nanoGPT's CPU recipe for character-level Shakespeare (its README), at the profile's learning rate
NANOGPT_SIZE = dict(n_layers=4, n_heads=4, d_model=128, block_size=64, batch_size=12, steps=2000,
                    warmup_steps=200, dropout=0.0)


class TorchBaselineLM(nn.Module):
    """The same language model built from nn.TransformerEncoderLayer (Pre-LN, causal mask)."""

    def __init__(self, cfg, vocab_size: int):
        super().__init__()
        self.tok = nn.Embedding(vocab_size, cfg.d_model)
        self.pos = nn.Embedding(cfg.block_size, cfg.d_model)
        layer = nn.TransformerEncoderLayer(cfg.d_model, cfg.n_heads, 4 * cfg.d_model, cfg.dropout,
                                           activation="gelu", batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, cfg.n_layers, enable_nested_tensor=False)
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, vocab_size, bias=False)
        self.head.weight = self.tok.weight

    def forward(self, ids):
        T = ids.shape[1]
        mask = nn.Transformer.generate_square_subsequent_mask(T, device=ids.device)
        x = self.tok(ids) + self.pos(torch.arange(T, device=ids.device))
        return self.head(self.ln_f(self.blocks(x, mask=mask, is_causal=True)))


def _post_ln_forward(self, x, pad_mask=None, memory=None, memory_mask=None):
    """The reference Block rewired as Post-LN: x = LN(x + attn(x)), x = LN(x + mlp(x))."""
    q, k, v = self.qkv(x).chunk(3, dim=-1)
    x = self.ln_1(x + self.proj(self.attend(q, k, v, mask=pad_mask, causal=self.causal)))
    return self.ln_2(x + self.mlp(x))


def _zero_positions(model: nn.Module) -> nn.Module:
    model.pos.weight.data.zero_()
    model.pos.weight.requires_grad_(False)
    return model


def build_variant(ns: dict, task: str, variant: str, cfg, *sizes, start: nn.Module | None = None) -> nn.Module:
    """The model of ``variant`` for ``task`` (see the module's docstring); a classifier given
    ``start`` (a trained G2P model) starts from its encoder, copied by the notebook's
    ``load_encoder``, before a broken variant breaks it."""
    if task == "lm" and variant == "torch-baseline":
        return TorchBaselineLM(cfg, *sizes)
    model = ns[{"lm": "build_lm", "g2p": "build_g2p", "cls": "build_classifier"}[task]](cfg, *sizes)
    if start is not None:
        ns["load_encoder"](model, start)
    if variant == "no-positions":
        return _zero_positions(model)
    if variant in ("no-causal-mask", "causal-encoder"):
        blocks = model.blocks if task != "g2p" else (      # which stack the mistake is in
            model.decoder if variant == "no-causal-mask" else model.encoder)
        for block in blocks:
            block.causal = variant == "causal-encoder"
    elif variant == "post-ln-no-final-norm":
        for block in model.blocks:
            block.forward = types.MethodType(_post_ln_forward, block)
        model.ln_f = nn.Identity()
    elif variant not in ("reference", "nanogpt-size", "from-scratch"):
        raise ValueError(f"no variant {variant!r} for task {task!r}")
    return model


def g2p_loss(model: nn.Module, src, tgt_in, tgt_out) -> torch.Tensor:
    """The notebook's G2P loss: cross-entropy over the target phonemes, PAD ignored."""
    return F.cross_entropy(model(src, tgt_in).flatten(0, 1).float(), tgt_out.flatten(), ignore_index=data.PAD)


def _timed(phases: dict, name: str, fn):
    start = time.perf_counter()
    out = fn()
    phases[name] = time.perf_counter() - start
    return out


def run_task(ns: dict, task: str, variant: str, seed: int, device: torch.device, baselines: bool = True) -> dict:
    """Train and score one model; ``phases`` holds the seconds of training and of each part of
    the evaluation (the baselines' time is kept apart)."""
    profile = current_profile()
    torch.manual_seed(seed)
    rng = torch.Generator().manual_seed(1000 + seed)
    train = ns["train"]
    if task == "lm":
        cfg, tok = profile.lm, data.char_tokenizer()
        if variant == "nanogpt-size":
            cfg = replace(cfg, **NANOGPT_SIZE)
        ids = data.lm_ids("train")
        if variant == "bigram":     # counted, not trained: the best one-character-context model
            phases: dict[str, float] = {}
            loss = _timed(phases, "count", lambda: metrics.bigram_loss(ids, data.lm_ids("test"), tok.vocab_size))
            return {"task": task, "variant": variant, "seed": seed, "steps": 0, "seconds": phases["count"],
                    "items_per_s": 0.0, "curve": [], "extras": {}, "phases": phases, "metric_name": "test loss",
                    "metric": loss, "lower_is_better": True, "block_size": cfg.block_size, "tokens": len(ids)}
        model = build_variant(ns, task, variant, cfg, tok.vocab_size)
        items, get = cfg.batch_size * cfg.block_size, (lambda s: data.lm_batch(ids, cfg.batch_size, cfg.block_size, rng))
        loss_fn = lambda m, x, y: F.cross_entropy(m(x).flatten(0, 1).float(), y.flatten())
    elif task == "g2p":
        cfg, pairs = profile.g2p, data.g2p_pairs("train")
        model = build_variant(ns, task, variant, cfg, len(data.SRC_VOCAB), len(data.TGT_VOCAB))
        items, get, loss_fn = cfg.batch_size, (lambda s: data.g2p_batch(pairs, cfg.batch_size, rng)), g2p_loss
    else:
        cfg = profile.cls
        x_all, y_all = data.classifier_tensors("train", cfg.max_len)
        g2p_phases, start = {}, None
        if variant == "from-scratch":
            lr, min_lr = SCRATCH_LR[profile.name]
            cfg = replace(cfg, lr=lr, min_lr=min_lr)
        elif cfg.from_g2p:           # as the notebook's locked cell does
            start = _timed(g2p_phases, "g2p training, not counted", lambda: _trained_g2p(ns, seed, device))
            torch.manual_seed(seed)
        model = build_variant(ns, task, variant, cfg, len(data.SRC_VOCAB), len(data.PATTERNS), start=start)
        items = cfg.batch_size

        def get(step):
            pick = torch.randint(0, len(x_all), (cfg.batch_size,), generator=rng)
            return x_all[pick], y_all[pick]

        loss_fn = lambda m, x, y: F.cross_entropy(m(x).float(), y)
    phases: dict[str, float] = {}

    def fit():
        curve = train(model, get, loss_fn, cfg.steps, cfg.lr, cfg.min_lr, cfg.warmup_steps, device,
                      use_bf16=profile.use_bf16, progress=False)
        if device.type == "cuda":
            torch.cuda.synchronize()
        return curve

    curve = _timed(phases, "train", fit)
    seconds = phases["train"]
    if task == "g2p" and variant == "reference":      # the classifier of this seed starts from it
        _G2P_STATES[_g2p_key(seed, device)] = copy.deepcopy(model.state_dict())
    if task == "cls":
        phases.update(g2p_phases)
    result = {"task": task, "variant": variant, "seed": seed, "steps": cfg.steps, "seconds": seconds,
              "items_per_s": items * cfg.steps / seconds, "curve": curve[:: max(1, len(curve) // 300)],
              "extras": {}, "phases": phases}
    model.eval()
    if task == "lm":
        loss = _timed(phases, "eval: held-out loss", lambda: metrics.lm_loss(
            model, data.lm_ids("test"), cfg.block_size, cfg.eval_tokens, device))
        result.update(metric_name="test loss", metric=loss, lower_is_better=True, block_size=cfg.block_size,
                      tokens=items * cfg.steps)
        if variant == "reference":
            sample = _timed(phases, "eval: sample", lambda: ns["generate"](
                model, torch.tensor([tok.encode("ROMEO:\n")], device=device), 300, cfg.block_size, 0.8, 20,
                torch.Generator().manual_seed(seed)))
            result["extras"] = {"sample": tok.decode(sample[0].tolist()),
                                "unigram_loss": metrics.unigram_loss(ids, data.lm_ids("test"), tok.vocab_size)}
    elif task == "g2p":
        from course.data.cmudict import load_g2p

        test = load_g2p("test")
        words = data.g2p_eval_words(cfg.eval_words)
        greedy, _ = _timed(phases, "eval: greedy", lambda: g2p_predictions(
            model, ns["greedy_decode"], ns["beam_search"], words, 0, cfg.beam_size, device))
        _, beam = _timed(phases, f"eval: beam ({cfg.beam_words} words)", lambda: g2p_predictions(
            model, ns["greedy_decode"], ns["beam_search"], words[:cfg.beam_words], cfg.beam_words, cfg.beam_size,
            device))
        per, wer = metrics.g2p_error_rates(greedy, test)
        bper, bwer = metrics.g2p_error_rates(beam, test)
        result.update(metric_name="PER", metric=per, lower_is_better=True, wer=wer, beam_per=bper, beam_wer=bwer)
        result["extras"] = {"examples": [[w, " ".join(greedy[w]), " ".join(beam.get(w, ())), " ".join(test[w][0])]
                                         for w in words[:12]]}
    else:
        ids, labels = data.classifier_eval_tensors(cfg.max_len, cfg.eval_words)
        predicted = _timed(phases, "eval: accuracy", lambda: classifier_predictions(model, ids, device))
        result.update(metric_name="accuracy", metric=metrics.accuracy(predicted, labels), lower_is_better=False)
        result["extras"] = {"confusion": metrics.confusion_matrix(predicted, labels, len(data.PATTERNS)).tolist(),
                            "patterns": list(data.PATTERNS)}
        if baselines and variant == "reference":
            result["baselines"] = dict(_timed(phases, "baselines", lambda: classifier_baselines(
                cfg.max_len, cfg.eval_words)))
            result["extras"].update(result["baselines"])
    return result


_G2P_STATES: dict[tuple, dict] = {}     # trained reference G2P weights, by (profile, dry run, seed, device)


def _g2p_key(seed: int, device: torch.device) -> tuple:
    profile = current_profile()
    return profile.name, profile.dry_run, seed, str(device)


def _trained_g2p(ns: dict, seed: int, device: torch.device) -> nn.Module:
    """The reference G2P model of the profile, trained by :func:`run_task` (once per seed and
    process; a G2P task of the same seed run before is reused)."""
    key = _g2p_key(seed, device)
    if key not in _G2P_STATES:
        run_task(ns, "g2p", "reference", seed, device)     # keeps its trained weights (and scores them)
    model = ns["build_g2p"](current_profile().g2p, len(data.SRC_VOCAB), len(data.TGT_VOCAB)).to(device)
    model.load_state_dict(_G2P_STATES[key])
    return model.eval()


@lru_cache(maxsize=4)
def classifier_baselines(max_len: int, n: int | None) -> dict[str, float]:
    """Accuracy of the simple baselines on the classifier's held-out words."""
    ids, labels = data.classifier_eval_tensors(max_len, n)
    words = [data.decode_letters(row) for row in ids.tolist()]
    train = data.pattern_words("train")
    return {"majority": metrics.majority_accuracy(data.classifier_tensors("train", max_len)[1], labels),
            "syllable_rules": metrics.accuracy(
                metrics.stress_rule_baseline(train, words, data.PATTERNS, suffix=0), labels),
            "rules_and_suffixes": metrics.accuracy(metrics.stress_rule_baseline(train, words, data.PATTERNS), labels),
            "letter_naive_bayes": metrics.accuracy(
                metrics.letter_bayes_baseline(train, words, len(data.PATTERNS)), labels)}
