"""Capstone data and metrics against hand-derived values and properties."""

from __future__ import annotations

import math

import pytest
import torch

from course.capstone import data, metrics
from course.capstone.profiles import PROFILES, current_profile
from course.data.cmudict import PHONEMES, load_g2p, load_pronunciations, split_of


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


def test_classifier_passages_split_by_position_and_baselines():
    texts, labels = data.passages("test", 256)
    assert len(texts) == len(labels) > 1000 and all(len(t) == 256 for t in texts)
    assert not set(texts) & set(data.passages("train", 256)[0])
    ids, _ = data.classifier_tensors("test", 256, 64)
    assert ids.shape == (len(texts), 64)
    _, train_labels = data.passages("train", 256)
    assert metrics.majority_accuracy(train_labels, labels) < 0.35


def test_profile_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("COURSE_PROFILE", "gpu")
    assert current_profile() is PROFILES["gpu"]
    monkeypatch.setenv("COURSE_PROFILE", "laptop")
    with pytest.raises(ValueError, match="not a profile"):
        current_profile()


def test_thresholds_are_far_better_than_trivial_baselines():
    unigram = metrics.unigram_loss(data.lm_ids("train"), data.lm_ids("test"), data.char_tokenizer().vocab_size)
    _, train_labels = data.passages("train", 256)
    majority = metrics.majority_accuracy(train_labels, data.passages("test", 256)[1])
    for profile in PROFILES.values():
        t = profile.thresholds
        assert t.lm_max_val_loss < unigram - 0.4, profile.name
        assert t.g2p_max_per < 0.7, profile.name
        assert t.cls_min_accuracy > majority + 0.15, profile.name
