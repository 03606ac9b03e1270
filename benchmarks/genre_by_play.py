"""Why the capstone's classifier does not classify genre: the measurement.

The task tried first: which kind of play a passage comes from, in the First Folio's three
kinds (comedy, history, tragedy), on six plays never seen in training (two of each kind),
with the speaker labels removed so that no character's name gives a play away. A
word-count naive Bayes and the capstone's encoder (the reference solution's
``build_classifier`` and ``train``, 2 blocks of width 128, the cpu profile's former budget
of 600 steps) are trained on the same passages and scored on the same held-out passages.

    .venv/bin/python benchmarks/genre_by_play.py [--seeds 0 1] [--steps 600]

Measured on 2 cores (2026-12-01): naive Bayes 0.715; the encoder 0.653 and 0.677 (seeds 0
and 1); the majority class 0.307. Which words occur decides the kind of a play; their
order adds little that a few thousand passages can teach, so a bag of words is the right
tool, and the capstone grades a task where order decides the answer instead (the stress
pattern of a word; see book/ch07_capstone/classifier.md).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# The First Folio's kinds; Pericles and Edward III, not in the Folio, by their usual reading.
KIND = {"comedies": 0, "problems": 0, "romances": 0, "histories": 1, "tragedies": 2, "roman": 2}
FOLIO_EXCEPTIONS = {"troilus-and-cressida": 2, "cymbeline": 2}     # printed among the tragedies
KINDS = ("comedy", "history", "tragedy")
TEST_PLAYS = ("twelfth-night", "measure-for-measure", "henry-v", "richard-ii", "macbeth", "coriolanus")
PASSAGE_CHARS, MAX_WORDS = 512, 96


def passages():
    """(train texts, train labels, test texts, test labels): 512-character passages of each
    play's speeches, speaker labels (lines ending with ':') removed."""
    from course.data.shakespeare import load_plays

    split = {True: ([], []), False: ([], [])}
    for play in load_plays():
        label = FOLIO_EXCEPTIONS.get(play.slug, KIND[play.genre])
        text = "\n".join(line for line in play.text.splitlines() if not line.endswith(":"))
        texts, labels = split[play.slug in TEST_PLAYS]
        for start in range(0, len(text) - PASSAGE_CHARS + 1, PASSAGE_CHARS):
            texts.append(text[start:start + PASSAGE_CHARS])
            labels.append(label)
    return (*split[False], *split[True])


def words(text: str) -> list[str]:
    return "".join(c.lower() if c.isalpha() or c == "'" else " " for c in text).split()


def letters_only(text: str) -> list[str]:
    return "".join(c.lower() if c.isalpha() else " " for c in text).split()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--steps", type=int, default=600)
    args = parser.parse_args()

    import torch
    import torch.nn.functional as F

    from autograder.extract import solution_namespace
    from course.capstone import metrics
    from course.capstone.profiles import ClassifierConfig

    train_texts, train_labels, test_texts, test_labels = passages()
    y_test = torch.tensor(test_labels)
    print(f"{len(train_texts):,} training passages, {len(test_texts):,} held-out passages of "
          f"{', '.join(TEST_PLAYS)}")
    acc = lambda pred: float((torch.as_tensor(pred) == y_test).float().mean())
    majority = Counter(train_labels).most_common(1)[0][0]
    rows = [("majority class", acc([majority] * len(test_texts))),
            ("naive Bayes over words", acc(metrics.naive_bayes(
                [(letters_only(t), y) for t, y in zip(train_texts, train_labels)],
                [letters_only(t) for t in test_texts], len(KINDS))))]
    counts = Counter(w for t in train_texts for w in words(t))
    index = {w: i + 2 for i, w in enumerate(sorted((w for w, c in counts.items() if c >= 2),
                                                   key=lambda w: (-counts[w], w))[:7998])}

    def encode(text):
        ids = [index.get(w, 1) for w in words(text)][:MAX_WORDS]
        return ids + [0] * (MAX_WORDS - len(ids))

    x_train = torch.tensor([encode(t) for t in train_texts])
    y_train = torch.tensor(train_labels)
    x_test = torch.tensor([encode(t) for t in test_texts])
    ns = solution_namespace(ROOT / "solutions" / "ch07_capstone" / "ch07_capstone.ipynb")
    cfg = ClassifierConfig(d_model=128, n_layers=2, n_heads=4, batch_size=32, steps=args.steps, lr=2e-3,
                           warmup_steps=args.steps // 10, min_lr=2e-4, max_len=MAX_WORDS)
    for seed in args.seeds:
        torch.manual_seed(seed)
        rng = torch.Generator().manual_seed(seed)
        model = ns["build_classifier"](cfg, len(index) + 2, len(KINDS))

        def batch(step):
            pick = torch.randint(0, len(x_train), (cfg.batch_size,), generator=rng)
            return x_train[pick], y_train[pick]

        start = time.perf_counter()
        ns["train"](model, batch, lambda m, x, y: F.cross_entropy(m(x).float(), y), cfg.steps, cfg.lr, cfg.min_lr,
                    cfg.warmup_steps, torch.device("cpu"), progress=False)
        model.eval()
        with torch.no_grad():
            pred = torch.cat([model(x_test[i:i + 256]).argmax(-1) for i in range(0, len(x_test), 256)])
        rows.append((f"encoder, seed {seed} ({time.perf_counter() - start:.0f} s)", acc(pred)))
    print(f"\n{'model':<36}{'accuracy':>9}")
    for name, value in rows:
        print(f"{name:<36}{value:>9.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
