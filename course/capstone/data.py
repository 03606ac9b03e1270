"""Tokenisers and batches for the three capstone tasks.

All of it comes from the course's loaders, with their fixed splits:

- language model: characters of Shakespeare's plays (train plays / test plays);
- grapheme-to-phoneme: CMUdict words split by hash;
- classifier: which of the six kinds of play a passage comes from, with each play's text
  cut by position (first 80% train, next 10% validation, last 10% test).
"""

from __future__ import annotations

from functools import lru_cache

import torch

from ..data.cmudict import PHONEMES, load_g2p
from ..data.shakespeare import load_plays, load_shakespeare

PAD, BOS, EOS = 0, 1, 2
SPECIALS = ("<pad>", "<bos>", "<eos>")
GENRES = ("comedies", "histories", "problems", "roman", "romances", "tragedies")


class CharTokenizer:
    """Characters <-> ids over every character of the plays (fixed, sorted)."""

    def __init__(self, alphabet: str):
        self.chars = sorted(set(alphabet))
        self.index = {c: i for i, c in enumerate(self.chars)}

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> list[int]:
        unknown = set(text) - self.index.keys()
        if unknown:
            raise ValueError(f"characters not in the vocabulary: {''.join(sorted(unknown))!r}")
        return [self.index[c] for c in text]

    def decode(self, ids) -> str:
        return "".join(self.chars[int(i)] for i in ids)


@lru_cache(maxsize=1)
def char_tokenizer() -> CharTokenizer:
    return CharTokenizer(load_shakespeare("all"))


@lru_cache(maxsize=3)
def lm_ids(split: str) -> torch.Tensor:
    """The plays of a split as one LongTensor of character ids, shape (N,)."""
    return torch.tensor(char_tokenizer().encode(load_shakespeare(split)), dtype=torch.long)


def lm_batch(ids: torch.Tensor, batch_size: int, block_size: int,
             generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Random windows: inputs (B, T) and next-character targets (B, T)."""
    starts = torch.randint(0, len(ids) - block_size - 1, (batch_size,), generator=generator)
    x = torch.stack([ids[s:s + block_size] for s in starts.tolist()])
    y = torch.stack([ids[s + 1:s + 1 + block_size] for s in starts.tolist()])
    return x, y


# ----------------------------------------------------------------------------- G2P

LETTERS = tuple("'abcdefghijklmnopqrstuvwxyz")
SRC_VOCAB = SPECIALS + LETTERS          # ids: 0 pad, 1 bos, 2 eos, then letters
TGT_VOCAB = SPECIALS + PHONEMES
_SRC_INDEX = {c: i for i, c in enumerate(SRC_VOCAB)}
_TGT_INDEX = {p: i for i, p in enumerate(TGT_VOCAB)}


def encode_word(word: str) -> list[int]:
    return [_SRC_INDEX[c] for c in word] + [EOS]


def encode_phonemes(phonemes) -> list[int]:
    return [_TGT_INDEX[p] for p in phonemes]


def decode_phonemes(ids) -> tuple[str, ...]:
    """Ids -> phonemes, stopping at the first EOS and skipping PAD/BOS."""
    out = []
    for i in ids:
        i = int(i)
        if i == EOS:
            break
        if i > EOS:
            out.append(TGT_VOCAB[i])
    return tuple(out)


@lru_cache(maxsize=3)
def g2p_pairs(split: str) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """(word, pronunciation) pairs: one per pronunciation, words sorted."""
    return tuple((w, p) for w, prons in load_g2p(split).items() for p in prons)


def g2p_eval_words(n: int) -> list[str]:
    """``n`` test words in a fixed pseudo-random order (md5 of the word), not alphabetical."""
    import hashlib

    words = sorted(load_g2p("test"), key=lambda w: hashlib.md5(("eval:" + w).encode()).hexdigest())
    return words[:n]


def pad(seqs: list[list[int]]) -> torch.Tensor:
    """Right-pad with PAD: (B, max_len)."""
    width = max(len(s) for s in seqs)
    return torch.tensor([s + [PAD] * (width - len(s)) for s in seqs], dtype=torch.long)


def g2p_batch(pairs, batch_size: int, generator: torch.Generator):
    """src (B, S) letters+EOS; tgt_in (B, T) BOS+phonemes; tgt_out (B, T) phonemes+EOS; PAD-padded."""
    picks = torch.randint(0, len(pairs), (batch_size,), generator=generator).tolist()
    words = [pairs[i][0] for i in picks]
    prons = [encode_phonemes(pairs[i][1]) for i in picks]
    src = pad([encode_word(w) for w in words])
    tgt_in = pad([[BOS] + p for p in prons])
    tgt_out = pad([p + [EOS] for p in prons])
    return src, tgt_in, tgt_out


# ----------------------------------------------------------------------------- classifier

@lru_cache(maxsize=8)
def passages(split: str, passage_chars: int) -> tuple[tuple[str, ...], torch.Tensor]:
    """Non-overlapping passages of each play's region for ``split``, and genre labels (N,)."""
    bounds = {"train": (0.0, 0.8), "validation": (0.8, 0.9), "test": (0.9, 1.0)}
    if split not in bounds:
        raise ValueError(f"split must be train, validation or test, not {split!r}")
    lo, hi = bounds[split]
    texts, labels = [], []
    for play in load_plays():
        region = play.text[int(lo * len(play.text)):int(hi * len(play.text))]
        for start in range(0, len(region) - passage_chars + 1, passage_chars):
            texts.append(region[start:start + passage_chars])
            labels.append(GENRES.index(play.genre))
    return tuple(texts), torch.tensor(labels, dtype=torch.long)


class WordTokenizer:
    """Lower-cased words <-> ids, from the training passages: 0 is PAD, 1 is UNK, then every
    word seen at least ``min_count`` times, most frequent first (ties alphabetical)."""

    UNK = 1

    def __init__(self, texts, min_count: int = 2, max_words: int = 8000):
        from collections import Counter

        counts = Counter(w for t in texts for w in self.split(t))
        kept = sorted((w for w, c in counts.items() if c >= min_count), key=lambda w: (-counts[w], w))
        self.words = ["<pad>", "<unk>"] + kept[: max_words - 2]
        self.index = {w: i for i, w in enumerate(self.words)}

    @staticmethod
    def split(text: str) -> list[str]:
        return "".join(c.lower() if c.isalpha() or c == "'" else " " for c in text).split()

    @property
    def vocab_size(self) -> int:
        return len(self.words)

    def encode(self, text: str, length: int) -> list[int]:
        """The first ``length`` words as ids, right-padded with PAD."""
        ids = [self.index.get(w, self.UNK) for w in self.split(text)][:length]
        return ids + [PAD] * (length - len(ids))


@lru_cache(maxsize=4)
def word_tokenizer(passage_chars: int) -> WordTokenizer:
    return WordTokenizer(passages("train", passage_chars)[0])


def classifier_tensors(split: str, passage_chars: int, max_words: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Passages of a split as word ids (N, max_words), PAD-padded, and genre labels (N,)."""
    texts, labels = passages(split, passage_chars)
    tok = word_tokenizer(passage_chars)
    return torch.tensor([tok.encode(t, max_words) for t in texts], dtype=torch.long), labels


def classifier_eval_tensors(passage_chars: int, max_words: int,
                            n: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The held-out passages the classifier is scored on: every test passage, or ``n`` of
    them spread evenly over the test plays (a dry run's few items)."""
    ids, labels = classifier_tensors("test", passage_chars, max_words)
    if n is None or n >= len(ids):
        return ids, labels
    pick = torch.linspace(0, len(ids) - 1, n).long()
    return ids[pick], labels[pick]
