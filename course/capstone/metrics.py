"""How the capstone is scored: the course's code, run by the test cells on held-out data."""

from __future__ import annotations

import re
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


def bigram_loss(train_ids: torch.Tensor, eval_ids: torch.Tensor, vocab_size: int) -> float:
    """The loss of predicting each character from the one before it alone, with the counts of
    ``train_ids`` (add-one smoothing): the best any model that sees one character of context
    can do, up to the smoothing."""
    pairs = train_ids[:-1] * vocab_size + train_ids[1:]
    counts = torch.bincount(pairs, minlength=vocab_size * vocab_size).double().view(vocab_size, vocab_size) + 1.0
    logp = (counts / counts.sum(1, keepdim=True)).log()
    return float(-logp[eval_ids[:-1], eval_ids[1:]].mean())


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


def syllable_rule(word: str) -> int:
    """Syllables of a written word by hand-written rules (no learning): one per run of vowel
    letters (``y`` included), less a silent final ``e`` (not ``-le`` after a consonant), a
    silent ``-ed`` (not after ``t`` or ``d``) and a silent ``-es`` (not after a sibilant), plus
    one for each pair of vowel letters that usually stand for two vowels (``ia`` and ``io``
    except after ``t``, ``c``, ``s``, ``g`` or ``x``; ``eo``, ``ua``, ``uo``, ``iu``). At least one."""
    n = len(re.findall(r"[aeiouy]+", word))
    if n > 1 and word.endswith("e") and not re.search(r"[^aeiouy]le$", word):
        n -= 1
    if n > 1 and re.search(r"[^aeiouytd]ed$", word):
        n -= 1
    if n > 1 and re.search(r"[^aeiouy]es$", word) and not re.search(r"(ch|sh|[sxzc])es$", word):
        n -= 1
    n += len(re.findall(r"(?<![tcsgx])(ia|io)|eo|ua|uo|iu", word))   # not -tion, -cial, -sion, -gion
    return max(n, 1)


def stress_rule_baseline(train: Sequence[tuple[str, int]], eval_words: Sequence[str], patterns: Sequence[str],
                         suffix: int = 3, min_count: int = 3) -> torch.Tensor:
    """The strongest simple baseline we found for stress patterns (no neural network): the
    syllable count from :func:`syllable_rule`, then the pattern seen most often in training
    among words of that count ending in the same ``suffix`` letters (at least ``min_count`` of
    them), else among all words of that count (``suffix=0``: always the latter). ``train`` holds (word, class) pairs,
    ``patterns`` the class names (``"/x"``, ..., ``"5+"``). Returns predicted classes."""
    def count_of(label: int) -> int:
        name = patterns[label]
        return 5 if name.endswith("+") else len(name)

    by_count: dict[int, Counter] = {}
    by_suffix: dict[tuple[int, str], Counter] = {}
    for word, label in train:
        n = min(syllable_rule(word), 5)
        by_count.setdefault(n, Counter())[label] += 1
        if suffix:
            by_suffix.setdefault((n, word[-suffix:]), Counter())[label] += 1
    fallback = {n: Counter(y for w, y in train if count_of(y) == n) for n in range(1, 6)}
    preds = []
    for word in eval_words:
        n = min(syllable_rule(word), 5)
        votes = by_suffix.get((n, word[-suffix:])) if suffix else None
        if not votes or sum(votes.values()) < min_count:
            votes = by_count.get(n) or fallback[n]
        preds.append(votes.most_common(1)[0][0])
    return torch.tensor(preds)


def naive_bayes(train: Sequence[tuple[Sequence[str], int]], eval_items: Sequence[Sequence[str]],
                n_classes: int) -> torch.Tensor:
    """Multinomial naive Bayes with add-one smoothing: ``train`` holds (tokens, class) pairs,
    ``eval_items`` the tokens of each item to classify. Returns predicted classes."""
    vocab: dict[str, int] = {}
    for tokens, _ in train:
        for t in tokens:
            vocab.setdefault(t, len(vocab))
    counts = torch.ones(n_classes, len(vocab) + 1, dtype=torch.float64)   # add-one; last = unseen
    for tokens, label in train:
        for t in tokens:
            counts[label, vocab[t]] += 1
    log_like = (counts / counts.sum(1, keepdim=True)).log()
    prior = torch.bincount(torch.tensor([y for _, y in train]), minlength=n_classes).double().add(1).log()
    return torch.tensor([int((prior + log_like[:, [vocab.get(t, len(vocab)) for t in tokens]].sum(1)).argmax())
                         for tokens in eval_items])


def letter_bayes_baseline(train: Sequence[tuple[str, int]], eval_words: Sequence[str], n_classes: int,
                          max_n: int = 5) -> torch.Tensor:
    """:func:`naive_bayes` over the letter n-grams (1 to ``max_n``, with ``^`` and ``$`` marking
    the word's ends) of each word: a bag of n-grams that ignores where they occur. Returns
    predicted classes for ``eval_words``."""
    def grams(word: str) -> list[str]:
        s = "^" + word + "$"
        return [s[i:i + k] for k in range(1, max_n + 1) for i in range(len(s) - k + 1)]

    return naive_bayes([(grams(w), y) for w, y in train], [grams(w) for w in eval_words], n_classes)
