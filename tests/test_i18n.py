"""The checks' messages in the learner's language (issue 30, item 4): course/i18n.py finds a
finished English message among the catalog's plain messages and f-string templates, and
locales/messages.py extracts those templates from the checks' source."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest
from babel.messages.catalog import Catalog
from babel.messages.pofile import write_po

from course import i18n
from course.checks._core import CheckFailed

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "locales"))
import messages  # noqa: E402 - locales/messages.py, a script's module

TRANSLATIONS = [
    ("merge_pair changed the list it was given.", "merge_pair 修改了传给它的列表。", False),
    ("{label} returned {got!r}, expected {want!r}.", "{label} 返回了 {got!r}，应为 {want!r}。", True),
    ("the counts of {name}", "{name} 的计数", True),
    ("{what}: got shape {tuple(got.shape)}, expected {tuple(want.shape)}.",
     "{what}：形状为 {tuple(got.shape)}，应为 {tuple(want.shape)}。", True),
    ("build and return a new list; do not edit ids in place.", "构建并返回一个新列表；不要就地修改 ids。", False),
    ("Likely mistake: ", "可能的错误：", False),
    ("a fuzzy one", "模糊的", False),
]


@pytest.fixture
def chinese(tmp_path) -> i18n._Catalog:
    catalog = Catalog(locale="zh_CN")
    for english, translated, template in TRANSLATIONS:
        flags = ["python-brace-format"] if template else []
        if english == "a fuzzy one":
            flags.append("fuzzy")
        catalog.add(english, translated, flags=flags)
    with open(tmp_path / "ch01.po", "wb") as handle:
        write_po(handle, catalog)
    return i18n.load_catalog(tmp_path)


def test_plain_message_and_template_are_translated(chinese):
    assert chinese.translate("merge_pair changed the list it was given.", 3) == "merge_pair 修改了传给它的列表。"
    assert chinese.translate("f(3) returned [1, 2], expected [1, 3].", 3) == "f(3) 返回了 [1, 2]，应为 [1, 3]。"


def test_a_field_that_is_a_message_is_translated_too(chinese):
    english = "the counts of merge_pair: got shape (2, 3), expected (3, 2)."
    assert chinese.translate(english, 3) == "merge_pair 的计数：形状为 (2, 3)，应为 (3, 2)。"


def test_what_matches_nothing_stays_english(chinese):
    for english in ("a message no catalog holds.", "a fuzzy one", "merge_pair changed the list it was given"):
        assert chinese.translate(english, 3) == english


def test_failure_translates_what_and_hint_each(chinese, monkeypatch):
    monkeypatch.setattr(i18n, "_catalog", lambda into: chinese)
    err = CheckFailed.of("merge_pair changed the list it was given.",
                         "build and return a new list; do not edit ids in place.")
    assert i18n.error_text(err, "zh_CN") == "merge_pair 修改了传给它的列表。\n可能的错误：构建并返回一个新列表；不要就地修改 ids。"
    assert i18n.error_text(err, "en") == str(err)
    with i18n.use_language("zh_CN"):
        assert err._render_traceback_()[0] == "CheckFailed: merge_pair 修改了传给它的列表。"


def test_only_a_language_with_messages_is_taken():
    assert i18n.known_language("zh_CN") == "zh_CN"
    for name in ("fr_FR", "../../etc", "zh_CN/../..", None, 3, "en"):
        assert i18n.known_language(name) == "en"


def test_learner_setting_chooses_the_language(monkeypatch, tmp_path):
    monkeypatch.delenv("COURSE_LANGUAGE", raising=False)
    monkeypatch.setattr(i18n, "SETTING_FILE", tmp_path / ".course-language")
    assert i18n.language() == "en"
    (tmp_path / ".course-language").write_text("zh_CN\n")
    assert i18n.language() == "zh_CN"
    monkeypatch.setenv("COURSE_LANGUAGE", "en")
    assert i18n.language() == "en"
    with i18n.use_language("zh_CN"):
        assert i18n.language() == "zh_CN"


def test_f_strings_become_templates_and_docstrings_are_not_messages(tmp_path):
    source = tmp_path / "checks.py"
    source.write_text(textwrap.dedent('''
        def f(x, got):
            """A docstring is not a message at all."""
            label = "short"
            fail(f"the sum of {x!r} was {got:.3f} where {{braces}} stay", "add the rows one by one, then divide.")
    '''))
    found = {text: template for _, text, template in messages.messages_of(source)}
    assert found == {"the sum of {x!r} was {got:.3f} where {{braces}} stay": True,
                     "add the rows one by one, then divide.": False}


def test_a_template_fills_braces_and_formats_back(tmp_path):
    template = i18n._Template("the sum of {x!r} was {got:.3f} where {{braces}} stay",
                              "{x!r} 的和是 {got:.3f}，{{braces}} 不变")
    x, got = [1, 2], 2.0
    assert template.fill(f"the sum of {x!r} was {got:.3f} where {{braces}} stay", str) == "[1, 2] 的和是 2.000，{braces} 不变"


def test_no_template_of_the_checks_has_two_fields_side_by_side():
    """``{a}{b}`` cannot be read back from a finished message (where does a end?): such a
    message would stay English. Write text between them, or two messages."""
    import re

    side_by_side = []
    for sources in messages.SOURCES.values():
        for source in sources:
            for line, text, template in messages.messages_of(ROOT / source):
                if template and re.search(r"\}\{", text.replace("{{", "").replace("}}", "")):
                    side_by_side.append(f"{source}:{line}: {text[:80]}")
    assert not side_by_side, "\n".join(side_by_side)


def test_a_composed_message_translates_its_parts_not_its_text(chinese):
    """A label template ending in a field ("the counts of {name}") must not swallow the rest of
    a failure made by putting that label into a wrapper: the wrapper knows its parts."""
    label = "the counts of merge_pair"
    message = i18n.composed("{what}: got shape {tuple(got.shape)}, expected {tuple(want.shape)}.",
                            what=label, **{"tuple(got.shape)": "(2, 3)", "tuple(want.shape)": "(3, 2)"})
    assert message == "the counts of merge_pair: got shape (2, 3), expected (3, 2)."
    assert chinese.translate(message, 3) == "merge_pair 的计数：形状为 (2, 3)，应为 (3, 2)。"


def test_unnamed_fields_are_filled_in_their_order():
    template = i18n._Template("seq_len={}, head_dim={}, bytes={:g}", "seq_len={}，head_dim={}，字节={:g}")
    assert template.fill("seq_len=1024, head_dim=64, bytes=2", str) == "seq_len=1024，head_dim=64，字节=2"


def test_composed_templates_are_extracted_however_short(tmp_path):
    source = tmp_path / "checks.py"
    source.write_text('fail(composed("{what}: {difference}", what=w, difference=d), "a hint of some words.")\n')
    found = {text: template for _, text, template in messages.messages_of(source)}
    assert found == {"{what}: {difference}": True, "a hint of some words.": False}
