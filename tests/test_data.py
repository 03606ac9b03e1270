"""The Shakespeare loader: real plays, plain text, a fixed split by play."""

from __future__ import annotations

import pytest

from course.data import SPLITS, load_plays, load_shakespeare
from course.data.shakespeare import markdown_to_text


def test_all_38_plays_with_titles_and_genres():
    plays = load_plays()
    assert len(plays) == 38
    assert {p.genre for p in plays} == {"comedies", "histories", "problems", "romances", "roman", "tragedies"}
    hamlet = next(p for p in plays if p.slug == "hamlet")
    assert "Hamlet" in hamlet.title and "To be, or not to be" in hamlet.text


def test_text_is_plain_no_markdown_left():
    text = load_shakespeare("all")
    assert len(text) > 4_500_000
    for mark in ("**", "_", "#", "\\", "[", "  \n"):
        assert mark not in text, mark


def test_splits_are_disjoint_fixed_and_cover_everything():
    by_split = {s: {p.slug for p in load_plays() if p.split == s} for s in ("train", "validation", "test")}
    assert by_split["validation"] == set(SPLITS["validation"]) and by_split["test"] == set(SPLITS["test"])
    assert len(by_split["train"]) == 34
    val = load_shakespeare("validation")
    assert val[:2000] not in load_shakespeare("train")
    assert load_shakespeare("train", max_chars=1000) == load_shakespeare("train")[:1000]


def test_bad_split_is_named():
    with pytest.raises(ValueError, match="split must be"):
        load_shakespeare("dev")


def test_markdown_normalisation_by_hand():
    md = ("# A Play\n\n## ACT I\n\n_Enter ONE and\nTWO_\n\n**ONE**  \nHello,  \n[Aside]_  \nthere\\--friend.\n\n"
          "*Exit.*\n\n**TWO**  \nBye.\n")
    title, text = markdown_to_text(md)
    assert title == "A Play"
    assert text == "ONE:\nHello,\nthere--friend.\n\nTWO:\nBye.\n"
