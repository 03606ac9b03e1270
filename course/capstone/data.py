"""Tokenisers and batches for the three capstone tasks.

All of it comes from the course's loaders, with their fixed splits:

- language model: characters of Shakespeare's plays (train plays / test plays);
- grapheme-to-phoneme: CMUdict words split by hash;
- classifier: a word's stress pattern (its syllables, and which one carries the primary
  stress) from its letters, on the same split of CMUdict by word as G2P.
"""

from __future__ import annotations

from functools import lru_cache

import torch

from ..data.cmudict import PHONEMES, load_g2p
from ..data.heldout import refuse
from ..data.shakespeare import load_shakespeare

PAD, BOS, EOS = 0, 1, 2
SPECIALS = ("<pad>", "<bos>", "<eos>")


class CharTokenizer:
    """Characters <-> ids over a fixed alphabet (sorted)."""

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
    """Over the characters of the train and validation plays (a graded kernel cannot read the
    test plays): the test plays use no other (tests/test_capstone_data.py checks it)."""
    return CharTokenizer(load_shakespeare("train") + load_shakespeare("validation"))


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

#: The stress pattern of a word, in scansion marks: one mark per syllable, ``/`` for the one
#: with the primary stress, ``x`` for the others; every word of five syllables or more is
#: one class. ``x/`` is an iamb (*a-BOUT*), ``/x`` a trochee (*TA-ble*).
PATTERNS = ("/", "/x", "x/", "/xx", "x/x", "xx/", "/xxx", "x/xx", "xx/x", "xxx/", "5+")
MAX_LETTERS = 16                        # the longest word of the dictionary's plain words


def stress_class(stress: str) -> int | None:
    """Class index (into ``PATTERNS``) of a word's stress digits (``"102"`` for *photograph*),
    or None when a word of two or more syllables has no primary stress or several."""
    if len(stress) == 1:
        return 0
    if len(stress) >= 5:
        return PATTERNS.index("5+")
    if stress.count("1") != 1:
        return None
    return PATTERNS.index("".join("/" if d == "1" else "x" for d in stress))


@lru_cache(maxsize=3)
def pattern_words(split: str) -> tuple[tuple[str, int], ...]:
    """(word, class) for the words of a CMUdict split (the G2P split, by word), sorted; the
    class is that of the word's first listed pronunciation."""
    from ..data.cmudict import load_stress, split_of

    if split not in ("train", "validation", "test"):
        raise ValueError(f"split must be train, validation or test, not {split!r}")
    if split == "test":
        refuse(f"pattern_words({split!r})")
    out = []
    for word, stress in load_stress().items():
        label = stress_class(stress)
        if label is not None and split_of(word) == split:
            out.append((word, label))
    return tuple(out)


def encode_letters(word: str, length: int) -> list[int]:
    """A word's letters as ids of ``SRC_VOCAB`` (no EOS), right-padded with PAD to ``length``."""
    ids = [_SRC_INDEX[c] for c in word][:length]
    return ids + [PAD] * (length - len(ids))


def decode_letters(ids) -> str:
    """Letter ids -> the word (PAD and the other special ids skipped)."""
    return "".join(SRC_VOCAB[int(i)] for i in ids if int(i) > EOS)


@lru_cache(maxsize=8)
def classifier_tensors(split: str, max_len: int = MAX_LETTERS) -> tuple[torch.Tensor, torch.Tensor]:
    """The words of a split as letter ids (N, max_len), PAD-padded, and pattern classes (N,)."""
    pairs = pattern_words(split)
    return (torch.tensor([encode_letters(w, max_len) for w, _ in pairs], dtype=torch.long),
            torch.tensor([y for _, y in pairs], dtype=torch.long))


def classifier_eval_tensors(max_len: int = MAX_LETTERS, n: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The held-out words the classifier is scored on: every test word, or ``n`` of them spread
    evenly over the (alphabetical) test words (a dry run's few items)."""
    ids, labels = classifier_tensors("test", max_len)
    if n is None or n >= len(ids):
        return ids, labels
    pick = torch.linspace(0, len(ids) - 1, n).long()
    return ids[pick], labels[pick]
