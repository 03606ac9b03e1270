"""How the capstone is scored: the course's code, run by the test cells on held-out data."""

from __future__ import annotations

from collections import Counter
from typing import Callable, Sequence

import torch
import torch.nn.functional as F


@torch.no_grad()
def lm_loss(model: torch.nn.Module, ids: torch.Tensor, block_size: int, max_tokens: int,
            device: torch.device, batch_size: int = 32) -> float:
    """Mean next-character cross-entropy (nats) over about ``max_tokens`` characters of
    ``ids``: windows of ``block_size`` spread evenly over the whole text (both test plays,
    not just the start of one). ``model(x (B, T)) -> logits (B, T, V)``."""
    model.eval()
    n_windows = max(1, min(max_tokens, len(ids) - 1) // block_size)
    starts = torch.linspace(0, len(ids) - block_size - 1, n_windows).long()
    xs = torch.stack([ids[s:s + block_size] for s in starts.tolist()])
    ys = torch.stack([ids[s + 1:s + 1 + block_size] for s in starts.tolist()])
    total, count = 0.0, 0
    for i in range(0, n_windows, batch_size):
        x, y = xs[i:i + batch_size].to(device), ys[i:i + batch_size].to(device)
        logits = model(x).float()
        total += F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1), reduction="sum").item()
        count += y.numel()
    return total / count


def unigram_loss(train_ids: torch.Tensor, eval_ids: torch.Tensor, vocab_size: int) -> float:
    """The loss of predicting every character from its training frequency (a trivial baseline)."""
    counts = torch.bincount(train_ids, minlength=vocab_size).double() + 1.0
    logp = (counts / counts.sum()).log()
    return float(-logp[eval_ids].mean())


def edit_distance(a: Sequence, b: Sequence) -> int:
    """Levenshtein distance between two sequences."""
    prev = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        cur = [i]
        for j, y in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (x != y)))
        prev = cur
    return prev[-1]


def g2p_error_rates(predictions: dict[str, tuple[str, ...]],
                    references: dict[str, tuple[tuple[str, ...], ...]]) -> tuple[float, float]:
    """(phoneme error rate, word error rate) over the words in ``predictions``.

    Each word is scored against its closest listed pronunciation: PER adds that edit
    distance over the length of that pronunciation; a word is right when it equals any.
    """
    errors = length = wrong = 0
    for word, predicted in predictions.items():
        best = min(references[word], key=lambda ref: (edit_distance(predicted, ref), len(ref)))
        distance = edit_distance(predicted, best)
        errors += distance
        length += len(best)
        wrong += distance > 0
    return errors / max(length, 1), wrong / max(len(predictions), 1)


def accuracy(predicted: torch.Tensor, labels: torch.Tensor) -> float:
    return float((predicted.cpu() == labels.cpu()).float().mean())


def majority_accuracy(train_labels: torch.Tensor, eval_labels: torch.Tensor) -> float:
    majority = Counter(train_labels.tolist()).most_common(1)[0][0]
    return float((eval_labels == majority).float().mean())


def confusion_matrix(predicted: torch.Tensor, labels: torch.Tensor, n_classes: int) -> torch.Tensor:
    """(n_classes, n_classes): rows are true classes, columns predicted."""
    m = torch.zeros(n_classes, n_classes, dtype=torch.long)
    for t, p in zip(labels.tolist(), predicted.tolist()):
        m[t, p] += 1
    return m


def word_bag_baseline(train_texts, train_labels, eval_texts, n_classes: int) -> torch.Tensor:
    """Multinomial naive Bayes over lower-cased words: a simple non-transformer baseline.
    Returns predicted labels for ``eval_texts``."""
    def words(t: str) -> list[str]:
        return "".join(c.lower() if c.isalpha() else " " for c in t).split()

    vocab: dict[str, int] = {}
    for t in train_texts:
        for w in words(t):
            vocab.setdefault(w, len(vocab))
    counts = torch.ones(n_classes, len(vocab) + 1, dtype=torch.float64)  # add-one smoothing; last = unknown
    for t, y in zip(train_texts, train_labels.tolist()):
        for w in words(t):
            counts[y, vocab[w]] += 1
    log_like = (counts / counts.sum(1, keepdim=True)).log()
    prior = torch.bincount(train_labels, minlength=n_classes).double().add(1).log()
    preds = []
    for t in eval_texts:
        idx = [vocab.get(w, len(vocab)) for w in words(t)]
        preds.append(int((prior + log_like[:, idx].sum(1)).argmax()))
    return torch.tensor(preds)

