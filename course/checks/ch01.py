"""Checks for chapter 1: byte-pair encoding, embeddings, tying, counting, patches.

Oracles: ``collections.Counter`` and ``str.replace`` for the BPE helpers, GPT-2's
pre-tokenisation pattern and an incremental trainer for training (whose work is measured by
counting the updates to the pair counts it is handed), UTF-8 round trips,
``torch.nn.functional.one_hot`` and ``F.embedding`` for the lookup and its gradient,
``F.unfold`` and ``nn.Conv2d`` for patches, and hand-derived counts.
"""

from __future__ import annotations

import functools
import math
import re
from collections import Counter

import torch
import torch.nn as nn
import torch.nn.functional as F

from ._core import (CheckFailed, call, capped, earlier_answers, earlier_first, expect_tensor, forbid, meta_table,
                    own_fault)
from ._recorders import PairCountsRecord
from ._vocabulary import compare, diagnose, draw, expect, fail, matches, when

Pair = tuple[int, int]

# ----------------------------------------------------------------------------- oracles

def _pair_counts_oracle(ids: list[int]) -> Counter:
    return Counter(zip(ids, ids[1:]))


def _merge_oracle(ids: list[int], pair: Pair, new_id: int) -> list[int]:
    """Non-overlapping, left-to-right replacement, done by ``str.replace`` on code points."""
    offset = 0x4E00  # map ids to printable code points so str.replace does the work
    text = "".join(chr(offset + i) for i in ids)
    out = text.replace(chr(offset + pair[0]) + chr(offset + pair[1]), chr(offset + new_id))
    return [ord(c) - offset for c in out]


def _merge_keeping_second(ids: list[int], pair: Pair, new_id: int) -> list[int]:
    """The result of a common bug (i += 1 after a merge), used only to name that bug."""
    out = []
    for i, token in enumerate(ids):
        out.append(new_id if i + 1 < len(ids) and (token, ids[i + 1]) == pair else token)
    return out


SAMPLE = ("To be, or not to be, that is the question: whether 'tis nobler in the mind to suffer "
          "the slings and arrows of outrageous fortune, or to take arms against a sea of troubles.")

# ----------------------------------------------------------------------------- exercise 1

def _random_ids(d, low: int = 2) -> list[int]:
    alphabet = d.rng.randrange(1, 9)
    return [d.rng.randrange(alphabet) for _ in range(d.rng.randrange(low, 60))]


def check_get_pair_counts(get_pair_counts, hidden: bool = False) -> None:
    cases = draw("get_pair_counts", hidden).cases([[1, 2, 1, 2, 1], [7, 7, 7, 7], [5, 3, 1, 3, 5], [5], []],
                                                  _random_ids, 20)
    for ids in cases:
        got = call(get_pair_counts, list(ids))
        expect(isinstance(got, dict), f"get_pair_counts should return a dict, got {type(got).__name__}.",
               "build a dict (or Counter) mapping (a, b) tuples to counts.")
        want = _pair_counts_oracle(ids)
        compare(dict(got), dict(want), f"get_pair_counts({ids})",
                "count every adjacent pair ids[i], ids[i+1] for i in range(len(ids) - 1).",
                variants=[(dict(Counter(zip(ids[::2], ids[1::2]))),
                           "pairs may overlap when counting: [7, 7, 7, 7] holds the pair (7, 7) three "
                           "times (positions 0, 1 and 2).")])
        # The docstring promises first-appearance order (ties in train_bpe go by the pair's value).
        if list(got) != list(want):
            fail(f"get_pair_counts({ids}) has the right counts in the order {list(got)}, but the pairs must come "
                 f"in order of first appearance: {list(want)}.",
                 "keep the pairs in order of first appearance, scanning left to right: fill a plain dict as you "
                 "go, and do not sort it: the docstring promises that order.")


def check_merge_pair(merge_pair, hidden: bool = False, counts: bool = True) -> None:
    """merge_pair without counts, then (unless ``counts`` is False) the counts update."""
    def drawn(d):
        alphabet = d.rng.randrange(1, 6)
        ids = [d.rng.randrange(alphabet) for _ in range(d.rng.randrange(0, 50))]
        return ids, (d.rng.randrange(alphabet), d.rng.randrange(alphabet)), 256 + d.rng.randrange(100)

    cases = draw("merge_pair", hidden).cases([([1, 2, 3, 1, 2], (1, 2), 9), ([1, 1, 1], (1, 1), 9),
                                              ([1, 1, 1, 1], (1, 1), 9), ([3, 4], (4, 3), 9), ([], (1, 2), 9)],
                                             drawn, 30)
    for ids, pair, new_id in cases:
        original = list(ids)
        got = call(merge_pair, ids, pair, new_id)
        expect(ids == original, "merge_pair changed the list it was given.",
               "build and return a new list; do not edit ids in place.")
        want = _merge_oracle(original, pair, new_id)
        compare(list(got), want, f"merge_pair({original}, {pair}, {new_id})",
                "scan left to right; when ids[i], ids[i+1] equals pair, emit new_id and skip both.", variants=[
                    (_merge_keeping_second(original, pair, new_id),
                     "after emitting new_id, move past both tokens of the pair (i += 2): the second token "
                     "of each merged pair was kept."),
                    ([9, 9] if original == [1, 1, 1] else None,
                     "occurrences must not overlap: in [1, 1, 1] the pair (1, 1) is merged once, giving "
                     "[9, 1]; after a merge, jump past both tokens (i += 2)."),
                    (want[:-1] if original else None,
                     "the last token was dropped: when the loop ends on a single leftover token, append it.")])
    if counts:
        _check_merge_pair_counts(merge_pair, hidden)


SENTINEL = (9999, 9998)   # a pair that occurs in no test input: an update must leave it alone


def _check_merge_pair_counts(merge_pair, hidden: bool) -> None:
    """merge_pair(ids, pair, new_id, counts) returns (new ids, counts updated locally)."""
    # [1, 2, 1, 2, 5, 2, 1]: the pair between two neighbouring occurrences, (2, 1), also occurs
    # elsewhere, so subtracting it twice leaves a wrong count rather than a missing key.
    def drawn(d):
        alphabet = d.rng.randrange(1, 5)
        ids = [d.rng.randrange(alphabet) for _ in range(d.rng.randrange(2, 50))]
        k = d.rng.randrange(len(ids) - 1)
        return ids, (ids[k], ids[k + 1]), 256 + d.rng.randrange(100)

    cases = draw("merge_pair/counts", hidden).cases(
        [([1, 2, 3, 1, 2], (1, 2), 9), ([5, 1, 2, 1, 2, 7], (1, 2), 9), ([7, 7, 7, 7, 7], (7, 7), 9),
         ([1, 2, 1, 2, 5, 2, 1], (1, 2), 9), ([4, 7, 7, 7, 7, 4], (7, 7), 9), ([3, 4], (4, 3), 9), ([2, 2], (2, 2), 9)],
        drawn, 30)
    for ids, pair, new_id in cases:
        original = list(ids)
        counts = dict(_pair_counts_oracle(ids))
        counts[SENTINEL] = 5
        before = dict(counts)
        result = call(merge_pair, ids, pair, new_id, dict(counts))
        expect(ids == original, "merge_pair changed the list it was given.",
               "build and return a new list; do not edit ids in place.")
        expect(isinstance(result, tuple) and len(result) == 2 and isinstance(result[1], dict),
               f"merge_pair(ids, pair, new_id, counts) returned {type(result).__name__}, expected a tuple "
               "(new_ids, counts).", "when counts is given, return both: the new list and the updated counts.")
        got, got_counts = result
        got_counts = dict(got_counts)
        want_ids = _merge_oracle(original, pair, new_id)
        expect(list(got) == want_ids, f"merge_pair({original}, {pair}, {new_id}, counts) returned {list(got)}, "
               f"expected {want_ids}.", "with counts given, the returned list must be the same as without.")
        want = dict(_pair_counts_oracle(want_ids))
        want[SENTINEL] = 5
        compare(got_counts, want, f"merge_pair({original}, {pair}, {new_id}, counts)'s counts",
                "each merged occurrence removes the pairs of ids it overlaps (its left neighbour's pair, the "
                "pair itself, its right neighbour's pair) and adds the pairs new_id forms in the result.",
                variants=_counts_variants(original, tuple(pair), before, want))


def _counts_variants(original: list[int], pair: Pair, before: dict, want: dict) -> list:
    """The updates of counts that common slips produce, each with the hint that names it."""
    neighbours = any(original[i:i + 2] == list(pair) and original[i + 2:i + 4] == list(pair)
                     for i in range(len(original) - 3))
    return [
        (before, "the counts came back unchanged: subtract the pairs that the merge removes and add the ones "
                 "it creates (counts[p] -= 1, counts[q] = counts.get(q, 0) + 1), then return the dict."),
        (when(lambda got: got.get(SENTINEL) != 5),
         "counts was rebuilt instead of updated: an entry for a pair that is nowhere near a merge must "
         "be left as it is (the test put such an entry in counts). Change only the pairs that overlap a "
         "merged occurrence, and the pairs the new token forms with its neighbours."),
        (when(lambda got: {k: v for k, v in got.items() if v != 0} == want),
         "remove a pair from counts when its count falls to 0, so that every key is a pair that occurs."),
        (when(lambda got: got.get(pair, 0) == before.get(pair, 0) and want.get(pair, 0) != before[pair]),
         "the merged pair itself disappears at every merged occurrence: subtract it too, along with the "
         "pairs each occurrence formed with its left and right neighbours."),
        (when(lambda got: neighbours),
         "two merged occurrences can be neighbours (in [7, 7, 7, 7] the pair (7, 7) is merged at 0 and "
         "2): the pair between them is one pair, subtracted once, and the new pair they form is "
         "(new_id, new_id). Compare the pairs of ids that touch a merged position with the pairs of the "
         "result that touch new_id."),
    ]


# ----------------------------------------------------------------------------- exercise 2

# GPT-2's pre-tokenisation (openai/gpt-2, src/encoder.py, `self.pat`) in Python's re: its \p{L}
# (a letter) is [^\W\d_] here and its \p{N} is \d; the texts drawn below hold no character
# on which the two differ.
PRETOKENIZE = re.compile(r"'(?:[sdmt]|ll|ve|re)| ?[^\W\d_]+| ?\d+| ?(?:[^\s\w]|_)+|\s+(?!\S)|\s+")
# Chapter 1's tokenization page cuts with this simpler pattern (ASCII letters, no contractions).
BOOK_CHUNK = re.compile(r" ?[A-Za-z]+| ?[0-9]+| ?[^\sA-Za-z0-9]+|\s+")

# A pattern that each slip of pre-tokenisation amounts to, with the hint that names it.
_CUT_VARIANTS = [
    (re.compile(r" ?[^\W\d_]+| ?\d+| ?(?:[^\s\w]|_)+|\s+(?!\S)|\s+"),
     "split off the contractions 's 't 're 've 'm 'll 'd as chunks of their own (\"don't\" is \"don\" + \"'t\"), "
     "before any other rule."),
    (re.compile(r"'(?:[sdmt]|ll|ve|re)| ?[^\W\d_]+| ?\d+| ?(?:[^\s\w]|_)+|\s+"),
     "a run of spaces before a word leaves its last space to the word: \"a   b\" is \"a\", \"  \", \" b\" "
     "(whitespace followed by a non-space gives up one space; only whitespace at the end, or before more "
     "whitespace, stays whole)."),
    (re.compile(r"'(?:[sdmt]|ll|ve|re)| ?[A-Za-z]+| ?\d+| ?[^\sA-Za-z\d]+|\s+(?!\S)|\s+"),
     "letters are the letters of every alphabet ('é', '日' are letters: str.isalpha), not only A-Z."),
    (re.compile(r"'(?:[sdmt]|ll|ve|re)|[^\W\d_]+|\d+|(?:[^\s\w]|_)+|\s+"),
     "a run of letters, digits or other symbols takes the one space before it: \" the\" is one chunk."),
    (re.compile(r"'(?:[sdmt]|ll|ve|re)| ?[^\W_]+| ?(?:[^\s\w]|_)+|\s+(?!\S)|\s+"),
     "letters and digits are separate runs: \"abc123\" is \"abc\" + \"123\"."),
    (BOOK_CHUNK, "that is the book page's simpler pattern; this exercise asks for GPT-2's: contractions split "
                 "off, letters of every alphabet, and a space run before a word leaving its last space."),
]

_WORDS = ["the", "The", "café", "naïve", "日本", "don", "it", "we", "abc", "x", "42", "2024", "7", "—", "!!", ",",
          ".", "?", "_", "'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'", "\"", "é"]


def _drawn_text(d) -> str:
    """Words, numbers, symbols and contractions glued by runs of spaces and newlines."""
    parts = []
    for _ in range(d.rng.randrange(4, 25)):
        parts.append(d.rng.choice(_WORDS))
        parts.append(d.rng.choice(["", "", " ", " ", " ", "  ", "   ", "\n", " \n", "\n\n  "]))
    return "".join(parts)


def check_pretokenize(pretokenize, hidden: bool = False) -> None:
    cases = draw("pretokenize", hidden).cases(
        ["Hello  world, don't   stop", "it's 2024!!  ok\n\n  end  ", "naïve café 日本 abc123 x_y", ""],
        _drawn_text, 12)
    for text in cases:
        got = call(pretokenize, text)
        expect(isinstance(got, list) and all(isinstance(c, str) for c in got),
               f"pretokenize({text!r}) should return a list of strings, got {type(got).__name__}.",
               "return the chunks as a list of str (re.findall returns one).")
        expect("".join(got) == text, f"pretokenize({text!r}) gave chunks that do not add up to the text: {got}.",
               "every character belongs to exactly one chunk: the chunks, joined, give the text back.")
        compare(got, PRETOKENIZE.findall(text), f"pretokenize({text!r})",
                "cut in this order of preference: a contraction; an optional space and letters; an optional "
                "space and digits; an optional space and other symbols; whitespace not followed by a "
                "non-space; any other whitespace.",
                variants=[(pattern.findall(text), hint) for pattern, hint in _CUT_VARIANTS])


def _chunk_ids(text: str, pattern=PRETOKENIZE) -> tuple[list[list[int]], list[int]]:
    """The distinct chunks of ``text`` as byte lists, in order of first appearance, and their counts."""
    counts = Counter(pattern.findall(text)) if pattern is not None else Counter([text] if text else [])
    return [list(c.encode("utf-8")) for c in counts], list(counts.values())


def _merge_counts(ids: list[int], pair: Pair, new_id: int) -> tuple[list[int], Counter]:
    """The chunk after the merge, and the change of its pair counts (new minus old)."""
    out = _merge_oracle(ids, pair, new_id)
    change = Counter(zip(out, out[1:]))
    change.subtract(Counter(zip(ids, ids[1:])))
    return out, change


def _train_oracle(text: str, num_merges: int, pattern=PRETOKENIZE, weighted: bool = True,
                  largest_on_ties: bool = False, base: int = 256) -> tuple[dict, dict]:
    """Byte-level BPE on the chunks of ``pattern`` (None: the whole text), counted once and then
    updated through an index from each pair to the chunks holding it. Returns (merges, the pair
    counts at the end). The keyword arguments give the results of slips, to name them."""
    chunks, weights = _chunk_ids(text, pattern)
    weights = weights if weighted else [1] * len(chunks)
    counts: Counter = Counter()
    where: dict[Pair, set[int]] = {}
    for k, ids in enumerate(chunks):
        for pair in zip(ids, ids[1:]):
            counts[pair] += weights[k]
            where.setdefault(pair, set()).add(k)
    merges: dict[Pair, int] = {}
    for step in range(num_merges):
        if not counts:
            break
        order = (lambda p: (counts[p], p)) if largest_on_ties else (lambda p: (counts[p], -p[0], -p[1]))
        best = max(counts, key=order)
        merges[best] = base + step
        for k in sorted(where.pop(best, ())):
            chunks[k], change = _merge_counts(chunks[k], best, base + step)
            for pair, delta in change.items():
                counts[pair] += delta * weights[k]
                if counts[pair] <= 0:
                    del counts[pair]
                elif delta > 0:
                    where.setdefault(pair, set()).add(k)
    return merges, dict(counts)


# Updates allowed per pair position of the distinct chunks. Counting once takes one per
# position; each merged occurrence (at most one per position, as each shortens its chunk)
# changes at most five pairs, each at most two updates (a set, then a delete).
UPDATES_PER_POSITION = 10


def check_train_bpe(train_bpe, pretokenize=None, merge_pair=None, hidden: bool = False) -> None:
    """train_bpe on drawn texts and on a whole play. ``pretokenize`` (exercise 2) and
    ``merge_pair`` (exercise 1), which it may call, are blamed for a failure they cause."""
    earlier = earlier_answers("train_bpe", ("calls your merge_pair", 1, merge_pair,
                                            lambda answer: check_merge_pair(answer, counts=False)))
    if pretokenize is not None:
        earlier.insert(0, ("train_bpe cuts the text with your pretokenize, which fails its test",
                           lambda: check_pretokenize(pretokenize)))
    with earlier_first(*earlier):
        _check_train_bpe(train_bpe, hidden)
    _check_training_work(train_bpe, hidden)


def _train_variants(text: str, n: int) -> list:
    """The merges of slips, each with its hint (computed only when the answer is wrong)."""
    def merges_of(**slip):
        return lambda: list(_train_oracle(text, n, **slip)[0].items())

    return [
        (merges_of(base=255), "byte ids use 0..255, so the first new token is 256, then 257, ... (256 + step)."),
        (merges_of(base=257), "give merge number `step` the id 256 + step: the first new token is 256."),
        (merges_of(largest_on_ties=True), "ties go to the smallest pair (compare (a, b) tuples), not to the largest "
                                          "as on the book page."),
        (merges_of(pattern=None), "merges never cross a chunk boundary: count the pairs inside the chunks of "
                                  "pretokenize(text), not over the whole text."),
        (merges_of(pattern=BOOK_CHUNK), "cut the text with your pretokenize (GPT-2's pattern), not with the book "
                                        "page's simpler one."),
        (merges_of(weighted=False), "a chunk that occurs k times contributes each of its pairs k times: weight the "
                                    "pairs of each distinct chunk by its count."),
    ]


def _check_train_bpe(train_bpe, hidden: bool) -> None:
    def drawn(d):
        return _drawn_text(d) * d.rng.randrange(1, 4), d.rng.randrange(3, 40)

    cases = draw("train_bpe", hidden).cases([("aaabdaaabac", 3), (SAMPLE, 30), ("ab", 5), ("don't  stop, don't!", 8)],
                                           drawn, 6)
    for text, n in cases:
        with PairCountsRecord() as pair_counts:
            merges = call(train_bpe, text, n, pair_counts.mapping)
        expect(isinstance(merges, dict), f"train_bpe should return a dict, got {type(merges).__name__}.",
               "return a dict mapping (a, b) pairs to new ids, in the order they were learned.")
        want, want_counts = _train_oracle(text, n)
        got = [(tuple(p), i) for p, i in merges.items()]
        if got != list(want.items()):
            step = next((k for k, (g, w) in enumerate(zip(got, want.items())) if g != w), min(len(got), len(want)))
            shown = got[step] if step < len(got) else "nothing"
            expected = list(want.items())[step] if step < len(want) else "no more merges"
            zeros = [(when(lambda _: 0 in pair_counts.data.values()),
                      "remove a pair from pair_counts when its count falls to 0: a pair of count 0 is no pair, and "
                      "must not be merged again.")]
            fail(f"train_bpe({text[:30]!r}..., {n}): merge {step} was {shown}, expected {expected}.",
                 diagnose(got, zeros + _train_variants(text, n),
                          "each step merges the pair with the largest count over all chunks (each weighted by how "
                          "often it occurs); ties go to the smallest pair."))
        _check_final_counts(pair_counts, want_counts, f"train_bpe({text[:30]!r}..., {n})")


def _check_final_counts(pair_counts: PairCountsRecord, want: dict, label: str) -> None:
    expect(pair_counts.odd == 0, f"after {label}, pair_counts holds keys that are not pairs of ints.",
           "keep pair_counts as {(a, b): count} with int token ids and int counts.")
    compare(dict(pair_counts.data), want, f"after {label}, pair_counts",
            "pair_counts must end as the pair counts of the chunks after the last merge (weighted by each chunk's "
            "count): update it after each merge, and keep every count there, not in a dict of your own.",
            variants=[({}, "pair_counts was left empty: keep the counts in the pair_counts you are given (a new "
                           "dict only when it is None), and update them there."),
                      (when(lambda got: {k: v for k, v in got.items() if v} == want),
                       "remove a pair from pair_counts when its count falls to 0.")])


@functools.lru_cache(maxsize=4)
def _play_oracle(slug: str, n: int) -> tuple[dict, dict]:
    """The oracle's training on a whole play (a second, kept: a grader checks many notebooks)."""
    from course.data import load_plays

    return _train_oracle(next(p for p in load_plays() if p.slug == slug).text, n)


def _check_training_work(train_bpe, hidden: bool) -> None:
    """A whole play: the right merges, with a number of updates to pair_counts that only an
    incremental update keeps under the bound (recounting costs about one per position per merge)."""
    from course.data import load_plays

    d = draw("train_bpe/play", hidden)
    plays = [p for p in load_plays() if p.split == "train"]
    play = d.rng.choice(plays) if hidden else next(p for p in plays if p.slug == "the-comedy-of-errors")
    n = d.rng.randrange(100, 201) if hidden else 100
    chunks, _ = _chunk_ids(play.text)
    positions = sum(len(c) - 1 for c in chunks)
    bound = UPDATES_PER_POSITION * positions
    label = f"train_bpe on {play.title} ({len(play.text):,} characters, {n} merges)"
    try:
        with PairCountsRecord(budget=bound) as pair_counts:
            merges = call(train_bpe, play.text, n, pair_counts.mapping)
    except CheckFailed:
        if pair_counts.updates <= bound:
            raise
        merges = None
    if pair_counts.updates > bound:          # stopped there (or the stop was caught, and it went on)
        _fail_work(label, pair_counts.updates, bound, len(chunks), positions)
    want, want_counts = _play_oracle(play.slug, n)
    expect(isinstance(merges, dict) and [(tuple(p), i) for p, i in merges.items()] == list(want.items()),
           f"{label} learned different merges from the expected ones.",
           "the short texts above pass, so look at what only a long text has: many chunks holding the same pair, "
           "counts that fall to 0, and pairs that a merge creates inside chunks merged before.")
    _check_final_counts(pair_counts, want_counts, label)


def _fail_work(label: str, updates: int, bound: int, n_chunks: int, positions: int) -> None:
    fail(f"{label} made more than {bound:,} updates to pair_counts ({updates:,} when it was stopped), "
         f"the most allowed: {UPDATES_PER_POSITION} per pair position of its {n_chunks:,} distinct chunks "
         f"({positions:,} positions).",
         "pair_counts was rebuilt after every merge, or more counts were set than each merge changes (a rebuild "
         "costs about one update per position, so the bound is passed within a few merges): count the pairs of the "
         "distinct chunks once, then after each merge change only the counts of the chunks that hold the merged "
         "pair (an index from each pair to those chunks finds them).")


# ----------------------------------------------------------------------------- exercise 3

def check_encode_decode(encode, decode, train_bpe, pretokenize=None, merge_pair=None, hidden: bool = False) -> None:
    """encode/decode, with merges learned by the student's train_bpe. A failure of encode caused
    by a wrong pretokenize, merge_pair or train_bpe is blamed on those; decode only ever
    receives ids already checked, so its failures are its own."""
    earlier = [] if pretokenize is None else [
        ("encode cuts the text with your pretokenize, which fails its test", lambda: check_pretokenize(pretokenize))]
    earlier += earlier_answers("encode", ("calls your merge_pair", 1, merge_pair,
                                          lambda answer: check_merge_pair(answer, counts=False)))
    earlier.append(("the merges come from your train_bpe, which fails exercise 2's tests",
                    lambda: _check_train_bpe(train_bpe, False)))
    with earlier_first(*earlier):
        _check_encode_decode(encode, decode, train_bpe, hidden)


def _trained(train_bpe, text: str, n: int) -> dict:
    """The student's merges for ``text``; they must be the expected ones (else exercise 2 is at fault)."""
    merges = call(train_bpe, text, n)
    want, _ = _train_oracle(text, n)
    expect(isinstance(merges, dict) and [(tuple(p), i) for p, i in merges.items()] == list(want.items()),
           f"train_bpe({text[:30]!r}..., {n}) learned other merges than the expected ones.",
           "fix exercise 2 first: encode is tested with the merges your train_bpe learns.")
    return merges


def _check_encode_decode(encode, decode, train_bpe, hidden: bool) -> None:
    def drawn(d):
        return _drawn_text(d) * d.rng.randrange(1, 3)

    # The third text's merges begin with (32, 32), learned inside whitespace chunks: across the
    # chunks " " + " or" of its last line it must not apply.
    texts = draw("encode_decode", hidden).cases([SAMPLE, "héllo wörld ✓ — naïve café, don't",
                                                 "to be    \nor not    \nto be  or not"], drawn, 8)
    for text in texts:
        merges = _trained(train_bpe, text, 10)
        ids = call(encode, text, merges)
        expect(isinstance(ids, list) and all(isinstance(i, int) for i in ids),
               "encode should return a list of Python ints.",
               "convert with list(...) and int(...), not a tensor or bytes object.")
        _expect_encoded(ids, text, merges, "the training text")
        with own_fault():
            _check_decoded(call(decode, ids, merges), text, "decode(encode(text))")
    # Text unseen in training: the learned merges, applied in order, to any text.
    merges = _trained(train_bpe, SAMPLE, 40)
    words = SAMPLE.split() + ["naïve", "日本", "xyz", "don't", "it's"]
    unseen = draw("encode_decode/unseen", hidden).cases(
        ["the nobler question — héllo, arrows!", "zzz   qqq's", ""],
        lambda d: "".join(d.rng.choice(["", " ", "  ", "\n"]) + w for w in d.rng.sample(words, d.rng.randrange(2, 12))),
        4)
    for text in unseen:
        ids = call(encode, text, merges)
        _expect_encoded(ids, text, merges, "a text unseen in training",
                        "encode must apply the given merges, in the order they were learned, to any text: it worked "
                        "on the training text but not on this one.")
        with own_fault():
            _check_decoded(call(decode, ids, merges), text, "decode(encode(text, merges learned on another text))")
    _check_special_tokens(encode, decode, train_bpe, hidden)


def _encode_oracle(text: str, merges: dict, pattern=PRETOKENIZE) -> list[int]:
    """Each chunk of ``pattern`` (None: the whole text) with the merges applied in training order."""
    out = []
    for chunk in (pattern.findall(text) if pattern is not None else [text]):
        ids = list(chunk.encode("utf-8"))
        for pair, new_id in merges.items():
            if len(ids) < 2:
                break
            ids = _merge_oracle(ids, tuple(pair), new_id)
        out += ids
    return out


def _expect_encoded(ids: list, text: str, merges: dict, what: str,
                    otherwise: str = "apply the merges in the order they were learned (lowest new id first), each "
                                     "over the whole chunk.") -> None:
    want = _encode_oracle(text, merges)
    if list(ids) == want:
        return
    hint = diagnose(list(ids), [
        (list(text.encode("utf-8")), "encode returned raw bytes: apply the learned merges to each chunk."),
        (lambda: _encode_oracle(text, merges, pattern=None),
         "cut the text with pretokenize first, as training did, and apply the merges inside each chunk: a "
         "merge must never join the end of one chunk to the start of the next."),
        (lambda: _encode_oracle(text, dict(reversed(list(merges.items())))),
         "apply the merges in the order they were learned (lowest new id first), not the last one first."),
    ], otherwise)
    fail(f"encode({text[:40]!r}, merges) on {what} gave {capped(repr(list(ids)), 200)}, expected "
         f"{capped(repr(want), 200)}.", hint)


def _encode_special_oracle(text: str, merges: dict, special: dict[str, int], longest: bool = True) -> list[int]:
    """Longest special string first at each position (shortest first: a slip); the pieces
    between encoded alone."""
    out, piece, i = [], "", 0
    names = sorted(special, key=len, reverse=longest)
    while i < len(text):
        name = next((s for s in names if text.startswith(s, i)), None)
        if name is None:
            piece += text[i]
            i += 1
            continue
        out += _encode_oracle(piece, merges) + [special[name]]
        piece, i = "", i + len(name)
    return out + _encode_oracle(piece, merges)


def _check_special_tokens(encode, decode, train_bpe, hidden: bool) -> None:
    merges = call(train_bpe, SAMPLE, 30)
    first = 256 + len(merges)
    words = SAMPLE.split()

    def drawn(d):
        rng = d.rng
        names = rng.sample(["<|endoftext|>", "<|pad|>", "<s>", "</s>", "<s>>", "<|im_start|>", "<|im_end|>"],
                           rng.randrange(1, 5))
        base = first + rng.randrange(0, 50)
        parts = [rng.choice(names) if rng.random() < 0.35 else " ".join(rng.sample(words, rng.randrange(1, 5)))
                 for _ in range(rng.randrange(3, 9))]
        return {name: base + k for k, name in enumerate(names)}, "".join(parts)

    cases = draw("encode_decode/special", hidden).cases(
        [({"<|endoftext|>": 1000}, "to be<|endoftext|>or not"),
         ({"<|endoftext|>": first, "<|pad|>": first + 1},
          "<|pad|>whether 'tis nobler<|endoftext|><|endoftext|> the slings<|pad|>"),
         ({"<s>": first, "<s>>": first + 1}, "<s>>to be<s> or<s>>>not<s>")], drawn, 4)
    for special, text in cases:
        ids = call(encode, text, merges, dict(special))
        want = _encode_special_oracle(text, merges, special)
        expect(isinstance(ids, list) and all(isinstance(i, int) for i in ids),
               "encode should return a list of Python ints.", "convert with list(...) and int(...).")
        if list(ids) != want:
            counts = {name: want.count(i) for name, i in special.items()}
            got_counts = {name: list(ids).count(i) for name, i in special.items()}
            shortest_first = {name: special[name] for name in sorted(special, key=len)}
            if list(ids) == _encode_special_oracle(text, merges, shortest_first, longest=False):
                hint = ("one special string begins another here: at each position the longest one that matches "
                        "wins (try the longer strings first).")
            elif got_counts != counts:
                hint = ("split the text on every special-token string first (all of them, each occurrence), map "
                        "each to its id, and encode only the pieces between.")
            elif len(ids) - sum(counts.values()) == len(text.encode("utf-8")) - sum(
                    len(n.encode("utf-8")) * c for n, c in counts.items()):
                hint = ("the special tokens are right, but the text between them was left as raw bytes: encode each "
                        "piece with the merges, exactly as encode(piece, merges) would.")
            else:
                hint = ("the special tokens are right, but a piece between them was encoded differently from "
                        "encode(piece, merges) on its own: apply the merges in training order to each piece.")
            fail(f"encode({text!r}, merges, special_tokens={special}) gave {list(ids)}, expected {want}.", hint)
        with own_fault():
            back = call(decode, ids, merges, dict(special))
            expect(back == text, f"decode did not restore the text with special tokens: got {back!r}, expected "
                   f"{text!r}.", "decode ids found in special_tokens to their strings (invert the dict).")
    text = "to be<|endoftext|>or not"
    plain = call(encode, text, merges)
    expect(list(plain) == _encode_oracle(text, merges),
           "without special_tokens, '<|endoftext|>' must be encoded as ordinary text.",
           "only treat strings as special when special_tokens is given.")
    with own_fault():
        _check_decoded(call(decode, plain, merges), text, "decode(encode(text)) without special_tokens")


def _check_decoded(back: str, text: str, label: str) -> None:
    if back != text:
        hint = "expand each id to its bytes recursively (new id -> its pair), join, then decode UTF-8 once."
        if "\ufffd" in back:
            hint = ("decode must join the bytes of all tokens first and decode UTF-8 once: a character such "
                    "as 'é' is two bytes, which can sit in two different tokens.")
        fail(f"{label} != text for {text[:40]!r}: got {back[:40]!r}.", hint)

# ----------------------------------------------------------------------------- exercise 4

def _no_embedding_shortcut(module: nn.Module, exercise: str) -> None:
    for name, sub in module.named_modules():
        if isinstance(sub, nn.Embedding):
            fail(f"{exercise} contains an nn.Embedding ({name or 'the module itself'}).",
                 "this exercise asks for a bare nn.Parameter and indexing; nn.Embedding is the oracle.")


def _embedding_forward(module: nn.Module, ids: torch.Tensor, exercise: str) -> torch.Tensor:
    with forbid((F, "embedding"), (torch, "embedding"), exercise=exercise):
        return call(module, ids, name=f"{exercise}.forward")


def check_embedding(Embedding, hidden: bool = False, init: bool = True) -> None:
    """The table, its initialisation (unless ``init`` is False: exercises that only look rows
    up ask for the rest), the lookup and its gradient."""
    d = draw("embedding", hidden)
    vocab_size, d_model = (1000, 64) if not hidden else (d.rng.randrange(1000, 4000), d.rng.randrange(16, 129))
    with d.sub("init").seeded():
        emb = call(Embedding, vocab_size, d_model, name="Embedding(...)")
    _no_embedding_shortcut(emb, "Embedding")
    weight = getattr(emb, "weight", None)
    expect(isinstance(weight, nn.Parameter), "Embedding should have an attribute `weight` that is an nn.Parameter.",
           "wrap the table in nn.Parameter(...) so that it is trained and listed by .parameters().")
    expect(tuple(weight.shape) == (vocab_size, d_model),
           f"weight has shape {tuple(weight.shape)}, expected (vocab_size, d_model) = {(vocab_size, d_model)}.",
           "one row per token: torch.empty(vocab_size, d_model).")
    std = weight.detach().std().item()
    if init and not 0.018 < std < 0.022:
        hint = ("initialise with std 0.02: nn.init.normal_(w, mean=0.0, std=0.02). torch.randn has std 1."
                if 0.9 < std < 1.1 else "initialise with nn.init.normal_(weight, mean=0.0, std=0.02).")
        fail(f"the initial weights have std {std:.4f}, expected about 0.02.", hint)
    expect(not init or abs(weight.detach().mean().item()) < 0.002, "the initial weights are not centred on zero.",
           "use a normal distribution with mean 0.")
    shapes = d.cases([(2, 7), (5,)] + ([(3, 4, 2)] if hidden else []),
                     lambda d: tuple(d.rng.randrange(1, 6) for _ in range(d.rng.randrange(1, 4))), 2)
    for shape in shapes:
        ids = d.randint(0, vocab_size, shape)
        ids[..., 0] = vocab_size - 1  # the last row must be reachable
        oracle = F.one_hot(ids, vocab_size).to(weight.dtype) @ weight.detach()
        out = _embedding_forward(emb, ids.clone(), "Embedding")
        expect_tensor(out, (*shape, d_model), f"Embedding output for ids of shape {shape}")
        compare(out, oracle, "Embedding output",
                "row i of the output is weight[i]: index the table with the ids (weight[ids]).")
    # Gradients reach exactly the rows that were used.
    emb.zero_grad()
    ids = torch.tensor([[3, 5, 3]])
    out = _embedding_forward(emb, ids, "Embedding")
    expect(out.requires_grad, "the output of Embedding carries no gradient: weight cannot be trained.",
           "do not detach or copy the table in forward; index the Parameter itself.")
    out.sum().backward()
    expect(weight.grad is not None, "no gradient reached weight.",
           "do not detach or copy the table in forward; index the Parameter itself.")
    used = weight.grad.abs().sum(dim=1) > 0
    expect(used.nonzero().flatten().tolist() == [3, 5], "the gradient reached rows that were not looked up.",
           "forward should only index the rows named by ids.")
    compare(weight.grad[3], torch.full((d_model,), 2.0), "the gradient of a row used twice",
            "a token that appears twice gets the sum of both gradients: plain indexing does this.")
    if init:
        _check_padding_row(Embedding, d)


def _check_padding_row(Embedding, d) -> None:
    """Embedding(..., padding_idx=p): row p starts at zero, is looked up as it is, and never
    receives a gradient; compared with F.embedding(..., padding_idx=p) under autograd."""
    for k, (vocab_size, d_model) in enumerate(d.cases([(50, 8)], lambda d: (d.rng.randrange(5, 300),
                                                                           d.rng.randrange(2, 40)), 1)):
        pad = d.rng.randrange(vocab_size) if d.hidden else 3
        with d.sub(f"pad{k}").seeded():
            emb = call(Embedding, vocab_size, d_model, padding_idx=pad, name=f"Embedding(..., padding_idx={pad})")
        weight = getattr(emb, "weight", None)
        expect(isinstance(weight, nn.Parameter) and tuple(weight.shape) == (vocab_size, d_model),
               "Embedding(..., padding_idx=...) should keep its table in `weight` (vocab_size, d_model).",
               "the padding row is a row of the same table, not a table of its own.")
        expect(torch.equal(weight.detach()[pad], torch.zeros(d_model)),
               f"with padding_idx={pad}, row {pad} of the table does not start at zero.",
               "after initialising the table, set the row padding_idx to zero (in place, without gradient).")
        std = weight.detach()[torch.arange(vocab_size) != pad].std().item()
        expect(0.015 < std < 0.025 or vocab_size * d_model < 200,
               f"with padding_idx given, the other rows have std {std:.4f}, expected about 0.02.",
               "only the padding row starts at zero; the others are drawn with std 0.02 as before.")
        ids = d.randint(0, vocab_size, (2, 6))
        ids[0, :3] = pad                                   # padding, and a real token twice
        ids[1, 0] = ids[1, 1] = (pad + 1) % vocab_size
        grad_output = d.randn(2, 6, d_model)
        emb.zero_grad()
        out = _embedding_forward(emb, ids.clone(), "Embedding")
        expect_tensor(out, (2, 6, d_model), "Embedding output with a padding_idx")
        table = weight.detach().clone().requires_grad_(True)
        want = F.embedding(ids, table, padding_idx=pad)
        want.backward(grad_output)
        compare(out, want, f"Embedding output with padding_idx={pad}",
                "the lookup is unchanged by padding_idx: row ids[...] of the table, the padding row included.")
        expect(out.requires_grad, "the output of Embedding carries no gradient.",
               "detach only the padding positions, not the whole lookup.")
        out.backward(grad_output)
        compare(weight.grad, table.grad, f"the table's gradient with padding_idx={pad}",
                "row padding_idx receives no gradient; every other row collects its gradients as before.",
                variants=[
                    (when(lambda got: got[pad].abs().sum() > 0 and matches(got[torch.arange(vocab_size) != pad],
                                                                          table.grad[torch.arange(vocab_size) != pad])),
                     f"row {pad}, the padding row, received a gradient: use its values in forward without their "
                     "gradient at the padding positions (detach them there).")])

def _backward_oracle(ids: torch.Tensor, grad_output: torch.Tensor, vocab_size: int,
                     padding_idx: int | None = None) -> torch.Tensor:
    table = torch.zeros(vocab_size, grad_output.shape[-1], dtype=grad_output.dtype, requires_grad=True)
    F.embedding(ids, table, padding_idx=padding_idx).backward(grad_output)
    return table.grad


def check_embedding_backward(embedding_backward, hidden: bool = False) -> None:
    """Compared with autograd through F.embedding; repeated ids must add up."""
    def drawn(d):
        V = d.rng.randrange(2, 60)
        shape = tuple(d.rng.randrange(1, 6) for _ in range(d.rng.randrange(1, 4)))
        ids = d.randint(0, max(1, V // d.rng.choice([1, 4])), shape)   # often repeated ids
        ids.view(-1)[0] = V - 1
        pad = int(ids.view(-1)[d.rng.randrange(ids.numel())]) if d.rng.random() < 0.5 else None
        return ids, V, d.rng.randrange(1, 33), pad

    d = draw("embedding_backward", hidden)
    cases = d.cases([(torch.tensor([[3, 5, 3], [0, 9, 3]]), 10, 4, None), (torch.tensor([2, 2, 2, 2]), 3, 2, None),
                     (torch.tensor([[0, 4, 0, 0], [4, 7, 0, 1]]), 8, 3, 0)], drawn, 4)
    for k, (ids_before, V, width, pad) in enumerate(cases):
        dtype = torch.float64 if k == 1 else torch.float32
        grad_before = d.randn(*ids_before.shape, width, dtype=dtype)
        ids, grad_output = ids_before.clone(), grad_before.clone()     # the oracle sees the inputs as drawn
        with forbid((torch.Tensor, "backward"), (torch.autograd, "grad"), (torch.autograd, "backward"),
                    (F, "one_hot"), (F, "embedding"), exercise="the backward pass of the lookup"):
            try:
                padding = {} if pad is None else {"padding_idx": pad}
                got = call(embedding_backward, ids, grad_output, V, **padding, name="embedding_backward")
            except CheckFailed as err:
                if "same scalar type" in str(err) or "same dtype" in str(err):
                    fail(f"embedding_backward raised on a {dtype} grad_output: {str(err).splitlines()[0]}",
                         "create the zero table with grad_output's dtype (grad_output.new_zeros(vocab_size, "
                         "d_model)): a torch.zeros table is float32.")
                raise
        expect(torch.equal(ids, ids_before) and torch.equal(grad_output, grad_before),
               "embedding_backward changed its inputs.", "build a new zero table and add into it; leave ids and "
               "grad_output as they are.")
        expect(isinstance(got, torch.Tensor) and got.dtype == dtype,
               f"the gradient is {getattr(got, 'dtype', type(got).__name__)}, expected a {dtype} tensor "
               f"(that of grad_output).",
               "create the zero table with grad_output's dtype: grad_output.new_zeros(vocab_size, d_model).")
        want = _backward_oracle(ids_before, grad_before, V, pad)
        last = torch.zeros(V, width, dtype=dtype)
        last[ids_before.reshape(-1)] = grad_before.reshape(-1, width)
        if pad is not None:
            last[pad] = 0
        rows = f"ids {ids_before.tolist() if ids_before.numel() <= 12 else tuple(ids_before.shape)}"
        padded = "" if pad is None else f", padding_idx={pad}"
        compare(got, want, f"embedding_backward for {rows} (a ({V}, {width}) table{padded})",
                "row i of the gradient is the sum of grad_output over the positions where ids == i (0 for rows "
                "never looked up, and for the padding row).", variants=[
                    (last, "a token that occurs several times must receive the sum of its gradients; assignment "
                           "(table[ids] = grad) keeps only one of them: use an in-place method that adds rows "
                           "into chosen rows."),
                    (lambda: _backward_oracle(ids_before, grad_before, V) if pad is not None else None,
                     f"row {pad} is the padding row (padding_idx={pad}): its gradient is zero, wherever it occurs."),
                    (when(lambda got: not torch.equal(got.abs().sum(1).gt(0), want.abs().sum(1).gt(0))),
                     "the wrong rows received gradient: row i collects the gradients of the positions where "
                     "ids == i, and rows that were not looked up stay 0 (add along dim 0, the rows).")])


# ----------------------------------------------------------------------------- exercise 5

def check_scaled_embedding(ScaledEmbedding, Embedding=None, hidden: bool = False) -> None:
    """Embedding, when given, is the exercise 4 answer that ScaledEmbedding extends."""
    earlier = [] if Embedding is None else [
        ("ScaledEmbedding extends your Embedding, whose lookup fails exercise 4's tests",
         lambda: check_embedding(Embedding, init=False))]
    with earlier_first(*earlier):
        _check_scaled_embedding(ScaledEmbedding, hidden)


def _check_scaled_embedding(ScaledEmbedding, hidden: bool) -> None:
    """The output is the rows times sqrt(d_model), and the table's std 1/sqrt(d_model), so
    that the scaled entries have std 1 (sizes keep vocab_size * d_model >= 2,000 entries:
    the sample std is then within 6% of the true one with overwhelming probability)."""
    d = draw("scaled_embedding", hidden)
    sizes = d.cases([(50, 64), (200, 16)] + ([(77, 300), (2500, 1)] if hidden else []),
                    lambda d: (d.rng.randrange(40, 500), d.rng.randrange(50, 400)), 2)
    for i, (vocab_size, d_model) in enumerate(sizes):
        with d.sub(f"init{i}").seeded():
            emb = call(ScaledEmbedding, vocab_size, d_model, name="ScaledEmbedding(...)")
        _no_embedding_shortcut(emb, "ScaledEmbedding")
        weight = getattr(emb, "weight", None)
        expect(isinstance(weight, nn.Parameter) and tuple(weight.shape) == (vocab_size, d_model),
               "ScaledEmbedding should expose its table as `weight` (vocab_size, d_model).",
               "subclass your Embedding, or keep one and expose its weight.")
        ids = d.randint(0, vocab_size, (2, 6))
        out = _embedding_forward(emb, ids.clone(), "ScaledEmbedding")
        expect_tensor(out, (2, 6, d_model), "ScaledEmbedding output")
        raw = weight.detach()[ids]
        ratio = (out.detach().norm() / raw.norm()).item()
        scale = math.sqrt(d_model)
        compare(ratio, scale, f"with d_model={d_model}, the output over the table rows",
                "multiply the looked-up rows by sqrt(d_model), once.", tol=(0.0, 1e-4), variants=[  # float32 norms
                    (float(d_model) if d_model != 1 else None,
                     "the scale is sqrt(d_model), not d_model: use math.sqrt(d_model)."),
                    (1 / scale if d_model != 1 else None,
                     "multiply by sqrt(d_model); dividing shrinks the embeddings instead."),
                    (math.sqrt(vocab_size), "the scale is sqrt(d_model), the width of a row, not sqrt(vocab_size), "
                                            "the number of rows: weight.shape[1], not weight.shape[0]."),
                    (1.0 if d_model != 1 else None,
                     "the output is not scaled at all: multiply the looked-up rows by sqrt(d_model).")])
        compare(out, raw * scale, "ScaledEmbedding output", "scale every entry by the same factor.")
        std = weight.detach().std().item()
        if abs(std * scale - 1) > 0.06:
            hint = diagnose(std, [(0.02, "the table kept Embedding's std 0.02: with the sqrt(d_model) factor, "
                                        "that makes the scaled entries' std 0.02 * sqrt(d_model), not 1."),
                                  (1.0, "a table of std 1 scaled by sqrt(d_model) has entries of std sqrt(d_model): "
                                        "the table's std must undo the factor.")],
                            "choose the table's std so that std * sqrt(d_model) = 1.", tol=(0.0, 0.06))
            fail(f"with d_model={d_model}, the table has std {std:.4f}, so the scaled entries have std "
                 f"{std * scale:.3f}; expected 1 (a table std of {1 / scale:.4f}).", hint)


# ----------------------------------------------------------------------------- exercise 6

def check_tied_lm(TiedLanguageModel, Embedding=None, hidden: bool = False) -> None:
    """Embedding, when given, is the exercise 4 answer that TiedLanguageModel uses."""
    earlier = [] if Embedding is None else [
        ("TiedLanguageModel uses your Embedding, whose lookup fails exercise 4's tests",
         lambda: check_embedding(Embedding, init=False))]
    with earlier_first(*earlier):
        _check_tied_lm(TiedLanguageModel, hidden)


def _check_tied_lm(TiedLanguageModel, hidden: bool) -> None:
    d = draw("tied_lm", hidden)
    vocab_size, d_model = (40, 16) if not hidden else (d.rng.randrange(20, 300), d.rng.randrange(4, 65))
    with d.sub("init").seeded():
        model = call(TiedLanguageModel, vocab_size, d_model, name="TiedLanguageModel(...)")
    embed, head = getattr(model, "embed", None), getattr(model, "head", None)
    expect(embed is not None and head is not None, "TiedLanguageModel needs attributes `embed` and `head`.",
           "keep the names from the exercise: self.embed and self.head.")
    expect(isinstance(head, nn.Linear) and head.bias is None, "`head` should be nn.Linear(d_model, vocab_size, bias=False).",
           "the tied projection has no bias: bias=False.")
    params = list(model.parameters())
    if head.weight is not embed.weight:
        if head.weight.data_ptr() == embed.weight.data_ptr():
            hint = ("the two share storage but are two Parameter objects with separate gradients; assign the "
                    "Parameter itself: self.head.weight = self.embed.weight.")
        else:
            hint = ("the head holds a copy of the table, not the table: assign the same Parameter object "
                    "(self.head.weight = self.embed.weight), never a clone.")
        fail("head.weight and embed.weight are not the same Parameter.", hint)
    expect(sum(p.numel() for p in params) == vocab_size * d_model,
           "the model has parameters besides the one shared table.",
           "this model is only the tied table: embed -> head, nothing else.")
    shape = (2, 5) if not hidden else (d.rng.randrange(1, 5), d.rng.randrange(1, 9))
    ids = d.randint(0, vocab_size, shape)
    w = embed.weight.detach().clone()
    logits = call(model, ids.clone(), name="TiedLanguageModel.forward")
    expect_tensor(logits, (*shape, vocab_size), "logits")
    compare(logits, w[ids] @ w.T, "logits",
            "logits = embed(ids) @ embed.weight.T (the head uses the same matrix, transposed by nn.Linear).")
    # One gradient, accumulated from both uses of the table.
    expect(logits.requires_grad, "the logits carry no gradient.", "do not detach anything in forward.")
    model.zero_grad()
    logits.pow(2).mean().backward()
    expect(embed.weight.grad is not None, "no gradient reached the shared table.",
           "do not detach anything in forward.")

# ----------------------------------------------------------------------------- exercise 7

def _gpt2_oracle(vocab_size: int, n_positions: int, d_model: int, n_layers: int, tied: bool) -> int:
    """Build the GPT-2 layout on the meta device (no memory) and count what nn.Module counts.

    ``device=`` on each layer, not ``with torch.device("meta")``, and tables given their
    (empty) weight: initialising an embedding on the meta device imports TorchDynamo (2 s)."""
    meta = {"device": "meta"}
    d = d_model
    parts = nn.ModuleList([meta_table(vocab_size, d), meta_table(n_positions, d)])
    for _ in range(n_layers):
        parts.extend([nn.LayerNorm(d, **meta), nn.Linear(d, 3 * d, **meta), nn.Linear(d, d, **meta),
                      nn.LayerNorm(d, **meta), nn.Linear(d, 4 * d, **meta), nn.Linear(4 * d, d, **meta)])
    parts.append(nn.LayerNorm(d, **meta))
    if not tied:
        parts.append(nn.Linear(d, vocab_size, bias=False, **meta))
    return sum(p.numel() for p in parts.parameters())


def _gpt2_variants(V: int, P: int, d: int, L: int, tied: bool) -> list[tuple[int, str]]:
    """Counts produced by common slips, each with the hint that names it."""
    block = 2 * 2 * d + (3 * d * d + 3 * d) + (d * d + d) + (4 * d * d + 4 * d) + (4 * d * d + d)
    right = V * d + P * d + L * block + 2 * d + (0 if tied else V * d)
    untied_bias = [] if tied else [(right + V, "the untied output layer has no bias: nn.Linear(d_model, "
                                             "vocab_size, bias=False) holds vocab_size * d_model numbers.")]
    return untied_bias + [
        (right + V * d if tied else right - V * d,
         "the output layer shares the token table when tied=True (count it once) and is a separate "
         "(vocab_size, d_model) matrix, without bias, when tied=False."),
        (right - P * d, "GPT-2 also has a learned position table: n_positions x d_model."),
        (right - 2 * d, "the final LayerNorm after the last block has a weight and a bias too (2 * d_model)."),
        (right - L * 2 * d - d, "a LayerNorm has two vectors of d_model: a weight (gain) and a bias."),
        (right - L * (3 * d + d + 4 * d + d), "every Linear in a block has a bias: nn.Linear(a, b) holds a*b + b."),
        (right - L * (8 * d * d + 5 * d) + L * (2 * d * d + 2 * d), "the MLP widens to 4 * d_model: "
         "Linear(d_model, 4 d_model) then Linear(4 d_model, d_model)."),
        (right - L * (3 * d * d + 3 * d) + L * (d * d + d), "the attention input projection makes queries, keys "
         "and values at once: Linear(d_model, 3 d_model)."),
        (right - L * block + block, "every one of the n_layers blocks has its own weights: multiply a block's "
         "count by n_layers."),
    ]


def check_gpt2_parameter_count(gpt2_parameter_count, hidden: bool = False) -> None:
    def drawn(d):
        return (d.rng.randrange(100, 60_000), d.rng.randrange(16, 4097), 8 * d.rng.randrange(1, 200),
                d.rng.randrange(1, 50), d.rng.random() < 0.6)

    visible = [(50257, 1024, 768, 12, True), (50257, 1024, 768, 12, False), (100, 16, 8, 2, True)]
    d = draw("gpt2_parameter_count", hidden)
    cases = d.cases(visible + ([(50257, 1024, 1024, 24, True), (50257, 1024, 1600, 48, True)] if hidden else []),
                    drawn, 4)
    for V, P, width, L, tied in cases:
        compare(call(gpt2_parameter_count, V, P, width, L, tied), _gpt2_oracle(V, P, width, L, tied),
                f"gpt2_parameter_count(vocab_size={V}, n_positions={P}, d_model={width}, n_layers={L}, tied={tied})",
                "add up every tensor of the layout in the exercise: the two tables, n_layers blocks "
                "(two LayerNorms, four Linear layers with biases), the final LayerNorm, and the output "
                "layer only when it is not tied.", variants=_gpt2_variants(V, P, width, L, tied))


def check_embedding_memory_bytes(embedding_memory_bytes, hidden: bool = False) -> None:
    dtypes = [torch.float16, torch.float64, torch.float32, torch.bfloat16, torch.int8]
    cases = [(50_000, 4096, torch.float32), (50_000, 4096, torch.bfloat16), (32_000, 4096, torch.int8)]
    if hidden:
        rng = draw("embedding_memory_bytes", hidden).rng
        cases += [(rng.randrange(1000, 200_000), rng.randrange(16, 8192), dtype) for dtype in rng.sample(dtypes, 3)]
    for v, width, dtype in cases:
        want = v * width * torch.empty(0, dtype=dtype).element_size()
        compare(call(embedding_memory_bytes, v, width, dtype), want, f"embedding_memory_bytes({v}, {width}, {dtype})",
                "bytes = vocab_size * d_model * bytes per element of dtype.", variants=[
                    (want * 8, "that is bits: a float32 is 4 bytes (torch.finfo(dtype).bits // 8, or "
                               "tensor.element_size())."),
                    (v * width * 4 if dtype != torch.float32 else None,
                     f"{dtype} does not take 4 bytes per number: look the size up from the dtype.")])

# ----------------------------------------------------------------------------- exercise 8

def check_patchify(patchify, hidden: bool = False) -> None:
    def drawn(d):
        p = d.rng.randrange(1, 6)
        return d.rng.randrange(1, 4), d.rng.randrange(1, 5), p * d.rng.randrange(1, 5), p * d.rng.randrange(1, 5), p

    d = draw("patchify", hidden)
    shapes = d.cases([(2, 3, 8, 8, 4), (1, 1, 6, 9, 3)] + ([(3, 2, 12, 8, 4), (2, 3, 5, 5, 5)] if hidden else []),
                     drawn, 3)
    for B, C, H, W, p in shapes:
        images = d.randn(B, C, H, W)
        with forbid((F, "unfold"), (F, "conv2d"), exercise="patchify with view and permute"):
            got = call(patchify, images.clone(), p)
        n = (H // p) * (W // p)
        expect_tensor(got, (B, n, C * p * p), f"patchify of {(B, C, H, W)} with patch_size={p}")
        oracle = F.unfold(images, kernel_size=p, stride=p).transpose(1, 2)
        column_major = oracle.reshape(B, H // p, W // p, C * p * p).transpose(1, 2).reshape(B, n, C * p * p)
        compare(got, oracle, f"patchify of {(B, C, H, W)} with patch_size={p} put the wrong pixels in the patches",
                "a plain reshape mixes pixels from different patches: view as (B, C, H/p, p, W/p, p), "
                "permute to (B, H/p, W/p, C, p, p), then reshape to (B, N, C*p*p).", variants=[
                    (column_major if H // p > 1 and W // p > 1 else None,
                     "each patch is right, but the patches come column by column: number them row by row, "
                     "left to right along the first row of the grid, then the next row (the grid axes in the "
                     "order (H/p, W/p) before flattening)."),
                    (when(lambda got: matches(got.sort(dim=-1).values, oracle.sort(dim=-1).values)),
                     "each patch has the right pixels in the wrong order: flatten in (channel, row, col) order, "
                     "i.e. permute to (B, H/p, W/p, C, p, p) before the final reshape.")])


def check_patch_embedding(PatchEmbedding, hidden: bool = False) -> None:
    def drawn(d):
        p = d.rng.randrange(1, 6)
        return p * d.rng.randrange(1, 5), p, d.rng.randrange(1, 4), d.rng.randrange(2, 25)

    d = draw("patch_embedding", hidden)
    configs = d.cases([(8, 4, 3, 16)] + ([(12, 4, 2, 10), (6, 3, 1, 5)] if hidden else []), drawn, 2)
    for i, (image_size, p, C, d_model) in enumerate(configs):
        with d.sub(f"init{i}").seeded():
            module = call(PatchEmbedding, image_size, p, C, d_model, name="PatchEmbedding(...)")
        proj = getattr(module, "proj", None)
        expect(isinstance(proj, nn.Linear) and tuple(proj.weight.shape) == (d_model, C * p * p),
               "PatchEmbedding needs `proj`, an nn.Linear(in_channels * patch_size**2, d_model).",
               "the projection maps one flattened patch to d_model numbers.")
        expect(getattr(module, "num_patches", None) == (image_size // p) ** 2,
               f"num_patches should be (image_size // patch_size)**2 = {(image_size // p) ** 2}.",
               "store self.num_patches in __init__.")
        images = d.randn(2, C, image_size, image_size)
        with forbid((F, "unfold"), (F, "conv2d"), exercise="patchify with view and permute"):
            out = call(module, images.clone(), name="PatchEmbedding.forward")
        expect_tensor(out, (2, (image_size // p) ** 2, d_model), "PatchEmbedding output")
        conv = nn.Conv2d(C, d_model, kernel_size=p, stride=p)
        with torch.no_grad():
            conv.weight.copy_(proj.weight.view(d_model, C, p, p))
            conv.bias.copy_(proj.bias)
            oracle = conv(images).flatten(2).transpose(1, 2)
        compare(out, oracle, "PatchEmbedding output (compared with a Conv2d, kernel = stride = patch_size)",
                "patchify the images in (channel, row, col) order, then apply self.proj.")
    _check_misfit_sizes(PatchEmbedding, d)


def _check_misfit_sizes(PatchEmbedding, d) -> None:
    """An image size that patch_size does not divide raises a ValueError naming both."""
    def misfit(d):
        p = d.rng.randrange(2, 8)
        return p * d.rng.randrange(1, 5) + d.rng.randrange(1, p), p, d.rng.randrange(1, 4), d.rng.randrange(2, 25)

    for image_size, p, C, d_model in d.cases([(10, 4, 3, 8)], misfit, 1):
        try:
            PatchEmbedding(image_size, p, C, d_model)
        except ValueError as err:
            expect(str(image_size) in str(err) and str(p) in str(err), "the ValueError should name both sizes.",
                   "say which image size and patch size do not fit, e.g. f'image_size {image_size} ...'.")
        except NotImplementedError:
            raise
        else:
            fail(f"PatchEmbedding(image_size={image_size}, patch_size={p}, ...) did not raise ValueError.",
                 "check image_size % patch_size == 0 in __init__ and raise ValueError naming both sizes.")
