"""The Chinese edition's catalogs (issue 30, locales/): in step with the English book, complete
on the pages declared translated, faithful to the glossary, code and formulas left as they are.

After changing English text, `make locales` brings the catalogs in step (new messages
untranslated, changed ones fuzzy), and every catalog must be complete again: the book's pages,
the exercise notebooks' (notebooks/<chapter>.po) and the checks' messages (messages/<name>.po)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from babel.messages.pofile import read_po

from notebook_tools import ROOT

LOCALES = ROOT / "locales"
MESSAGES = LOCALES / "zh_CN" / "LC_MESSAGES"
GLOSSARY = LOCALES / "zh_CN" / "glossary.md"

# Every catalog: the book's pages (Sphinx names), the exercise notebooks' Markdown
# (notebooks/<chapter>) and the checks' messages (messages/<name>); each is translated whole.
TRANSLATED = sorted(path.relative_to(MESSAGES).with_suffix("").as_posix() for path in MESSAGES.rglob("*.po"))


def catalog(page: str):
    with open(MESSAGES / f"{page}.po", "rb") as handle:
        return read_po(handle)


def translated_messages():
    """(page, English, Chinese) of every translated, not fuzzy message of every catalog."""
    for path in sorted(MESSAGES.rglob("*.po")):
        page = path.relative_to(MESSAGES).with_suffix("").as_posix()
        for message in catalog(page):
            if message.id and message.string and not message.fuzzy:
                yield page, message.id, message.string


def glossary() -> list[tuple[str, str]]:
    """(English, Chinese) rows of the glossary's table, longest English term first."""
    rows = re.findall(r"^\| ([^|]+?) \| ([^|]+?) \|", GLOSSARY.read_text(encoding="utf-8"), re.M)
    terms = [(en, zh) for en, zh in rows if en != "English" and not set(en) <= set("-")]
    assert len(terms) >= 12, f"{GLOSSARY} lists {len(terms)} terms: its table could not be read"
    return sorted(terms, key=lambda row: -len(row[0]))


ROLE = re.compile(r"\{[\w:-]+\}`([^`]*)`")      # {doc}`text <target>` or {doc}`target`
CODE = re.compile(r"`[^`]+`")
MATHS = re.compile(r"\$\$.+?\$\$|\$[^$]+\$", re.S)


def _role_text(role: re.Match) -> str:
    """A role's text is prose ({doc}`Tokens <ch01/index>`), a bare target is not."""
    text = re.match(r"(.*?)\s*<[^>]*>$", role.group(1), re.S)
    return f" {text.group(1)} " if text else " "


def without_roles(text: str) -> str:
    return ROLE.sub(_role_text, text)


def prose(text: str) -> str:
    """A message's text without its inline code and formulas (a role keeps its text)."""
    return MATHS.sub(" ", CODE.sub(" ", without_roles(text)))


def test_catalogs_are_in_step_with_the_book(tmp_path):
    """Every page has its catalog, holding exactly the page's messages: otherwise an English
    change has not reached the catalogs (run `make locales`)."""
    sys.path.insert(0, str(LOCALES))
    import catalogs

    pot = catalogs.extract(tmp_path)
    stale = []
    for template in sorted(pot.rglob("*.pot")):
        page = template.relative_to(pot).with_suffix("").as_posix()
        with open(template, "rb") as handle:
            wanted = {m.id for m in read_po(handle) if m.id}
        path = MESSAGES / f"{page}.po"
        held = {m.id for m in catalog(page) if m.id} if path.is_file() else set()
        if wanted != held:
            stale.append(f"{page}: {len(wanted - held)} new, {len(held - wanted)} gone")
    assert not stale, "catalogs behind the English text (run `make locales`): " + "; ".join(stale)


@pytest.mark.parametrize("page", TRANSLATED)
def test_page_declared_translated_is_complete(page):
    missing = [m.id[:70] for m in catalog(page) if m.id and (not m.string or m.fuzzy)]
    assert not missing, (f"{page}: {len(missing)} messages untranslated or fuzzy (after an English change, "
                         f"update locales/zh_CN/LC_MESSAGES/{page}.po): " + " | ".join(missing[:5]))


def test_translations_use_the_glossary():
    terms = glossary()
    wrong = []
    from course.i18n import _PLACEHOLDER

    for page, english, chinese in translated_messages():
        if page.startswith("messages/"):   # a template's fields are code: {save_checkpoint(...)}
            english = _PLACEHOLDER.sub(" ", english)
        text = prose(english).lower()
        for en, zh in terms:
            pattern = re.compile(rf"(?<![\w-]){re.escape(en.lower())}(?:e?s)?(?![\w-])")
            if pattern.search(text):
                text = pattern.sub(" ", text)      # "multi-head attention" is not also "attention"
                if zh not in chinese:
                    wrong.append(f"{page}: '{en}' is {zh} in {GLOSSARY.name}: {chinese[:60]}")
    assert not wrong, "\n".join(wrong)


def test_translations_keep_code_and_formulas():
    """Inline code and formulas are copied as they are (only the prose is translated)."""
    changed = []
    for page, english, chinese in translated_messages():
        en, zh = without_roles(english), without_roles(chinese)
        same_code = sorted(CODE.findall(en)) == sorted(CODE.findall(zh))
        # formulas outside inline code: a `$` in code (`phy$`) opens no formula
        same_maths = sorted(MATHS.findall(CODE.sub(" ", en))) == sorted(MATHS.findall(CODE.sub(" ", zh)))
        if not (same_code and same_maths):
            changed.append(f"{page}: {english[:60]}")
    assert not changed, "code or formulas differ from the English:\n" + "\n".join(changed)


def test_translations_keep_their_emphasis_and_code():
    """Bold, emphasis and inline code render in the Chinese as in the English. CommonMark does
    not close `**` between full-width punctuation and a Chinese character (`**标题。**正文`
    shows its asterisks): write `**标题**。正文`."""
    from markdown_it import MarkdownIt

    inline = MarkdownIt("commonmark").renderInline
    count = lambda text: [len(re.findall(f"<{tag}>", inline(text))) for tag in ("strong", "em", "code")]  # noqa: E731
    lost = [f"{page}: {chinese[:70]}" for page, english, chinese in translated_messages()
            if count(english) != count(chinese)]
    assert not lost, "emphasis or code rendered differently from the English:\n" + "\n".join(lost)


def test_message_templates_keep_their_placeholders():
    """A translated f-string template (the checks' messages) has the English's placeholders,
    each as written (course/i18n.py fills them by their text); the order may change."""
    from course.i18n import _PLACEHOLDER, _has_fields

    fields = lambda text: sorted(m.group(0) for m in _PLACEHOLDER.finditer(text))  # noqa: E731
    changed = []
    for path in sorted((MESSAGES / "messages").glob("*.po")):
        for message in catalog(path.relative_to(MESSAGES).with_suffix("").as_posix()):
            if (message.id and message.string and not message.fuzzy and _has_fields(message.id)
                    and fields(message.id) != fields(message.string)):
                changed.append(f"{path.name}: {message.id[:60]} -> {message.string[:60]}")
    assert not changed, "placeholders changed in translation:\n" + "\n".join(changed)
