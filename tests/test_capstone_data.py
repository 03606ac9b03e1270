"""Capstone data and metrics against hand-derived values and properties."""

from __future__ import annotations

import math

import pytest
import torch

from course.capstone import data, metrics
from course.capstone.profiles import PROFILES, current_profile
from course.data.cmudict import PHONEMES, load_g2p, load_pronunciations, load_stress, split_of


def test_cmudict_split_is_by_word_fixed_and_disjoint():
    splits = {s: set(load_g2p(s)) for s in ("train", "validation", "test")}
    assert not (splits["train"] & splits["test"]) and not (splits["train"] & splits["validation"])
    total = sum(len(v) for v in splits.values())
    assert total == len(load_pronunciations()) > 100_000
    assert 0.77 < len(splits["train"]) / total < 0.83
    assert split_of("hello") == split_of("hello")
    assert load_pronunciations()["read"] == (("R", "EH", "D"), ("R", "IY", "D")) or \
        set(load_pronunciations()["read"]) == {("R", "EH", "D"), ("R", "IY", "D")}
    assert {p for prons in load_pronunciations().values() for pr in prons for p in pr} == set(PHONEMES)


def test_g2p_batches_are_shifted_and_padded():
    src, tgt_in, tgt_out = data.g2p_batch(data.g2p_pairs("train"), 8, torch.Generator().manual_seed(0))
    assert (tgt_in[:, 0] == data.BOS).all()
    for row_in, row_out in zip(tgt_in, tgt_out):
        n = int((row_out != data.PAD).sum())          # phonemes + EOS
        assert row_out[n - 1] == data.EOS
        assert torch.equal(row_in[1:n], row_out[:n - 1])
    assert ((src == data.EOS).sum(1) == 1).all()


def test_edit_distance_by_hand():
    assert metrics.edit_distance("kitten", "sitting") == 3
    assert metrics.edit_distance((), ("A", "B")) == 2
    assert metrics.edit_distance(("A",), ("A",)) == 0


def test_error_rates_use_the_closest_listed_pronunciation():
    refs = {"read": (("R", "EH", "D"), ("R", "IY", "D")), "cat": (("K", "AE", "T"),)}
    per, wer = metrics.g2p_error_rates({"read": ("R", "IY", "D"), "cat": ("K", "AH", "T")}, refs)
    assert wer == 0.5 and per == pytest.approx(1 / 6)


def test_lm_loss_of_a_uniform_model_is_log_vocab():
    class Uniform(torch.nn.Module):
        def forward(self, x):
            return torch.zeros(*x.shape, 50)

    ids = torch.randint(0, 50, (1000,), generator=torch.Generator().manual_seed(0))
    assert metrics.lm_loss(Uniform(), ids, 16, 500, torch.device("cpu")) == pytest.approx(math.log(50))


def test_stress_patterns_by_hand_and_split_by_word():
    stress = load_stress()
    # CMUdict's first pronunciations: PHO-to-graph, pho-TOG-ra-phy, pho-to-GRAPH-ic, a-BOUT
    assert [stress[w] for w in ("photograph", "photography", "photographic", "about")] == \
        ["102", "0100", "2010", "01"]
    cls = {w: data.PATTERNS[data.stress_class(stress[w])] for w in ("photograph", "photography", "photographic",
                                                                    "about", "table", "the", "understand")}
    assert cls == {"photograph": "/xx", "photography": "x/xx", "photographic": "xx/x", "about": "x/",
                   "table": "/x", "the": "/", "understand": "xx/"}
    assert data.PATTERNS[data.stress_class("01020")] == "5+" and data.stress_class("1010") is None
    words = {s: {w for w, _ in data.pattern_words(s)} for s in ("train", "validation", "test")}
    assert not words["train"] & words["test"] and not words["train"] & words["validation"]
    assert words["test"] <= set(load_g2p("test"))                     # the G2P split: no test word trained on
    ids, labels = data.classifier_eval_tensors()
    assert ids.shape == (len(words["test"]), data.MAX_LETTERS) and len(words["test"]) > 10_000
    assert data.decode_letters(data.encode_letters("o'clock", 16)) == "o'clock"
    assert sorted(data.decode_letters(row) for row in ids.tolist()) == sorted(words["test"])
    assert set(labels.tolist()) == set(range(len(data.PATTERNS)))


def test_classifier_baselines_by_hand():
    assert [metrics.syllable_rule(w) for w in ("cat", "table", "shine", "jumped", "wanted", "boxes", "piano",
                                               "nation", "made")] == [1, 2, 1, 1, 2, 2, 3, 2, 1]
    train = [("tion", 1), ("nation", 1), ("station", 1), ("ration", 1), ("motion", 1), ("button", 2)]
    names = ("/", "/x", "x/", "5+")
    # lotion: two syllables by the rules, and four training words of two syllables end in "ion"
    assert metrics.stress_rule_baseline(train, ["lotion", "cotton"], names).tolist() == [1, 1]
    assert metrics.stress_rule_baseline([("button", 2), ("cotton", 2), ("nation", 1)], ["mutton"], names,
                                        min_count=2).tolist() == [2]
    # naive Bayes on letter n-grams: a word made of one class's n-grams gets that class
    nb = metrics.letter_bayes_baseline([("aaaa", 0), ("aaa", 0), ("bbbb", 1), ("bbb", 1)], ["aa", "bb"], 2)
    assert nb.tolist() == [0, 1]


def test_profile_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("COURSE_PROFILE", "gpu")
    assert current_profile() is PROFILES["gpu"]
    monkeypatch.setenv("COURSE_PROFILE", "laptop")
    with pytest.raises(ValueError, match="not a profile"):
        current_profile()


def test_thresholds_are_far_better_than_trivial_baselines():
    unigram = metrics.unigram_loss(data.lm_ids("train"), data.lm_ids("test"), data.char_tokenizer().vocab_size)
    majority = metrics.majority_accuracy(data.classifier_tensors("train")[1], data.classifier_eval_tensors()[1])
    for profile in PROFILES.values():
        t = profile.thresholds
        assert t.lm_max_val_loss < unigram - 0.4, profile.name
        assert t.g2p_max_per < 0.7, profile.name
        assert t.cls_min_accuracy > majority + 0.15, profile.name


def test_bigram_loss_by_hand():
    # after 0 always 1, after 1 always 0: counts (0->1) = 2, (1->0) = 2, add-one smoothing over 2 symbols
    train = torch.tensor([0, 1, 0, 1, 0])
    assert metrics.bigram_loss(train, torch.tensor([0, 1]), 2) == pytest.approx(-math.log(3 / 4))
    assert metrics.bigram_loss(train, torch.tensor([0, 0]), 2) == pytest.approx(-math.log(1 / 4))


def test_grading_rejects_a_language_model_that_sees_the_future():
    from course.checks._core import CheckFailed
    from course.checks.ch07 import _check_trained_causal

    class Model(torch.nn.Module):
        def __init__(self, causal: bool):
            super().__init__()
            self.causal = causal

        def forward(self, ids):                               # (B, T) -> (B, T, 8)
            x = torch.nn.functional.one_hot(ids % 8, 8).float()
            # each position: its own token plus the running (causal) or total (non-causal) sum
            context = x.cumsum(1) if self.causal else x.sum(1, keepdim=True).expand_as(x)
            return x + context

    ids = torch.arange(100) % 7
    _check_trained_causal(Model(causal=True), ids, 16, torch.device("cpu"))
    with pytest.raises(CheckFailed, match="sees the future"):
        _check_trained_causal(Model(causal=False), ids, 16, torch.device("cpu"))


def test_the_classifier_has_the_g2p_encoders_shape_wherever_it_starts_from_it():
    """The notebook's locked cell copies the G2P encoder into the classifier (exercise 7) when
    the profile says so: in every such profile, and in its dry run, the two have the same
    width, depth and heads, the classifier no more positions than the G2P model's table, and
    the reference load_encoder copies one profile's models into each other."""
    from autograder.extract import solution_namespace
    from course.capstone.profiles import dry_run
    from course.checks.ch07 import S2S_MAX_LEN
    from notebook_tools import ROOT

    ns = solution_namespace(ROOT / "solutions" / "ch07_capstone" / "ch07_capstone.ipynb")
    assert PROFILES["cpu"].cls.from_g2p and PROFILES["gpu"].cls.from_g2p
    for profile in [*PROFILES.values(), *(dry_run(p) for p in PROFILES.values())]:
        cls, g2p = profile.cls, profile.g2p
        if not cls.from_g2p:
            continue
        assert (cls.d_model, cls.n_layers, cls.n_heads) == (g2p.d_model, g2p.n_layers, g2p.n_heads), profile.name
        assert cls.max_len <= S2S_MAX_LEN, profile.name
        with torch.device("meta"):        # shapes only
            classifier = ns["build_classifier"](cls, len(data.SRC_VOCAB), len(data.PATTERNS))
            model = ns["build_g2p"](g2p, len(data.SRC_VOCAB), len(data.TGT_VOCAB))
            ns["load_encoder"](classifier, model)


def test_the_character_vocabulary_covers_the_held_out_plays():
    """It is built without the test plays (a graded kernel cannot read them), yet encodes them."""
    from course.data.shakespeare import load_shakespeare

    tok = data.char_tokenizer()
    assert tok.decode(tok.encode(load_shakespeare("test"))) == load_shakespeare("test")
