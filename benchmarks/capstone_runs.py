"""One training run of a capstone task, as the locked notebook cells do it, timed."""

from __future__ import annotations

import time

import torch
import torch.nn as nn
import torch.nn.functional as F

from course.capstone import data, metrics
from course.capstone.profiles import current_profile
from course.checks.ch07 import classifier_predictions, g2p_predictions


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


def run_task(ns: dict, task: str, variant: str, seed: int, device: torch.device) -> dict:
    profile = current_profile()
    torch.manual_seed(seed)
    rng = torch.Generator().manual_seed(1000 + seed)
    train = ns["train"]
    if task == "lm":
        cfg, tok = profile.lm, data.char_tokenizer()
        ids = data.lm_ids("train")
        model = ns["build_lm"](cfg, tok.vocab_size) if variant == "reference" else TorchBaselineLM(cfg, tok.vocab_size)
        items, get = cfg.batch_size * cfg.block_size, (lambda s: data.lm_batch(ids, cfg.batch_size, cfg.block_size, rng))
        loss_fn = lambda m, x, y: F.cross_entropy(m(x).flatten(0, 1).float(), y.flatten())
    elif task == "g2p":
        cfg, pairs = profile.g2p, data.g2p_pairs("train")
        model = ns["build_g2p"](cfg, len(data.SRC_VOCAB), len(data.TGT_VOCAB))
        items, get = cfg.batch_size, (lambda s: data.g2p_batch(pairs, cfg.batch_size, rng))

        def loss_fn(m, src, tgt_in, tgt_out):
            return F.cross_entropy(m(src, tgt_in).flatten(0, 1).float(), tgt_out.flatten(), ignore_index=data.PAD)
    else:
        cfg = profile.cls
        x_all, y_all = data.classifier_tensors("train", cfg.passage_chars, cfg.max_words)
        model = ns["build_classifier"](cfg, data.word_tokenizer(cfg.passage_chars).vocab_size, len(data.GENRES))
        items = cfg.batch_size

        def get(step):
            pick = torch.randint(0, len(x_all), (cfg.batch_size,), generator=rng)
            return x_all[pick], y_all[pick]

        loss_fn = lambda m, x, y: F.cross_entropy(m(x).float(), y)
    start = time.perf_counter()
    curve = train(model, get, loss_fn, cfg.steps, cfg.lr, cfg.min_lr, cfg.warmup_steps, device,
                  use_bf16=profile.use_bf16, progress=False)
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    result = {"task": task, "variant": variant, "seed": seed, "steps": cfg.steps, "seconds": seconds,
              "items_per_s": items * cfg.steps / seconds, "curve": curve[:: max(1, len(curve) // 300)], "extras": {}}
    model.eval()
    start = time.perf_counter()
    if task == "lm":
        loss = metrics.lm_loss(model, data.lm_ids("test"), cfg.block_size, cfg.eval_tokens, device)
        result.update(metric_name="test loss", metric=loss, lower_is_better=True)
        sample = ns["generate"](model, torch.tensor([tok.encode("ROMEO:\n")], device=device), 300, cfg.block_size,
                                0.8, 20, torch.Generator().manual_seed(seed))
        result["extras"] = {"sample": tok.decode(sample[0].tolist()),
                            "unigram_loss": metrics.unigram_loss(ids, data.lm_ids("test"), tok.vocab_size)}
    elif task == "g2p":
        from course.data.cmudict import load_g2p

        test = load_g2p("test")
        words = data.g2p_eval_words(cfg.eval_words)
        greedy, beam = g2p_predictions(model, ns["greedy_decode"], ns["beam_search"], words, cfg.beam_words,
                                       cfg.beam_size, device)
        per, wer = metrics.g2p_error_rates(greedy, test)
        bper, bwer = metrics.g2p_error_rates(beam, test)
        result.update(metric_name="PER", metric=per, lower_is_better=True, wer=wer, beam_per=bper, beam_wer=bwer)
        result["extras"] = {"examples": [[w, " ".join(greedy[w]), " ".join(beam.get(w, ())), " ".join(test[w][0])]
                                         for w in words[:12]]}
    else:
        ids, labels = data.classifier_eval_tensors(cfg.passage_chars, cfg.max_words, cfg.eval_passages)
        predicted = classifier_predictions(model, ids, device)
        acc = metrics.accuracy(predicted, labels)
        train_texts, train_labels = data.passages("train", cfg.passage_chars)
        test_texts, _ = data.passages("test", cfg.passage_chars)
        baseline = metrics.accuracy(metrics.word_bag_baseline(train_texts, train_labels, test_texts,
                                                              len(data.GENRES)), labels)
        result.update(metric_name="accuracy", metric=acc, lower_is_better=False,
                      majority=metrics.majority_accuracy(train_labels, labels), naive_bayes=baseline)
        result["extras"] = {"confusion": metrics.confusion_matrix(predicted, labels, len(data.GENRES)).tolist(),
                            "genres": list(data.GENRES), "majority": result["majority"], "naive_bayes": baseline}
    result["eval_seconds"] = time.perf_counter() - start      # with the baselines' and the extras' time
    return result
