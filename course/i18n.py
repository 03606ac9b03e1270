"""The checks' messages in the learner's language (issue 30, item 4).

English is the source and the msgid. ``locales/<language>/LC_MESSAGES/messages/<module>.po``
holds the translations of the messages written in the checks (``make locales`` extracts them,
:mod:`locales.messages`): a plain string is a message as it is; an f-string is a *template*
whose placeholders are the source of its replaced fields (``{label} returned {got!r}``).

A finished English message is translated as a whole: first as a plain message, then against
the templates, longest literal text first; the text a template's placeholder stood for is
translated the same way (a hint built from a shorter message gets that message's
translation), then put where the translation has that placeholder. A message that matches
nothing stays English, so a missing translation never hides what went wrong.

The language: :func:`use_language` (the grader sets the graded notebook's), else the
environment's ``COURSE_LANGUAGE``, else the file ``.course-language`` at the top of the course
(``make language L=zh_CN`` writes it once), else English.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import os
import re
from pathlib import Path
from typing import Iterator

ROOT = Path(__file__).resolve().parents[1]
ENGLISH = "en"
SETTING_FILE = ROOT / ".course-language"
LIKELY_MISTAKE = "Likely mistake: "          # the label of a hint, a message of its own

_CHOSEN: contextvars.ContextVar[str | None] = contextvars.ContextVar("course_language", default=None)
_PLACEHOLDER = re.compile(r"\{\{|\}\}|\{((?:[^{}]|\{[^{}]*\})*)\}")
_DEPTH = 6                                   # templates inside templates (a hint quoting an earlier one)


def language() -> str:
    """The language messages are shown in now (``"en"`` or a catalog's, e.g. ``"zh_CN"``)."""
    chosen = _CHOSEN.get()
    if chosen:
        return chosen
    named = os.environ.get("COURSE_LANGUAGE", "").strip()
    if not named and SETTING_FILE.is_file():
        named = SETTING_FILE.read_text(encoding="utf-8").strip()
    return known_language(named)


@contextlib.contextmanager
def use_language(name: str | None) -> Iterator[None]:
    """Messages in ``name`` (``None`` or ``"en"``: English) inside the block."""
    token = _CHOSEN.set(name or ENGLISH)
    try:
        yield
    finally:
        _CHOSEN.reset(token)


def known_language(name: object) -> str:
    """``name`` if it names a language the course has messages in, else English: a notebook's
    metadata says which, and a submission's metadata is the student's to write."""
    if (isinstance(name, str) and re.fullmatch(r"[a-z]{2}(_[A-Z]{2})?", name)
            and (ROOT / "locales" / name / "LC_MESSAGES" / "messages").is_dir()):
        return name
    return ENGLISH


def every_form(message: str) -> set[str]:
    """``message`` in English and in every language the course has messages in."""
    forms = {message}
    for folder in sorted((ROOT / "locales").glob("*/LC_MESSAGES/messages")):
        forms.add(translate(message, folder.parents[1].name))
    return forms


def error_text(err: BaseException, into: str | None = None) -> str:
    """The text of an error a check raised, in ``into``: a failure's ``what`` and ``hint``
    translated each, any other error's message as a whole."""
    what = getattr(err, "what", None)
    if isinstance(what, str):
        return failure_text(what, getattr(err, "hint", "") or "", into)
    return translate(str(err), into)


def translate(message: str, into: str | None = None) -> str:
    """``message`` in ``into`` (default: :func:`language`), English where no translation fits."""
    into = into or language()
    if into == ENGLISH or not message:
        return message
    return _catalog(into).translate(message, _DEPTH)


def failure_text(what: str, hint: str, into: str | None = None) -> str:
    """A failure's text, ``what`` then the hint on a line of its own, in ``into``."""
    into = into or language()
    if not hint:
        return translate(what, into)
    english = f"{what}\n{LIKELY_MISTAKE}{hint}"
    if into != ENGLISH:
        # a message written whole, hint included: only a message that holds the label itself
        # (a template ending in a field would otherwise swallow the hint line)
        whole = _catalog(into).translate(english, _DEPTH, holding=f"\n{LIKELY_MISTAKE}")
        if whole != english:
            return whole
    return f"{translate(what, into)}\n{translate(LIKELY_MISTAKE, into)}{translate(hint, into)}"


class Composed(str):
    """A message made by putting messages into a template, ``composed("{what}: {difference}",
    what=..., difference=...)``: its text is the English, and :func:`translate` translates each
    field, then the template, instead of reading the parts back from the finished text (where
    a label ending in a field could swallow the rest)."""

    template: str
    fields: dict[str, str]


def composed(template: str, **fields: object) -> Composed:
    """The message ``template`` with its ``{name}`` fields filled from ``fields`` (as ``str``)."""
    values = {name: value if isinstance(value, str) else str(value) for name, value in fields.items()}
    message = Composed(_PLACEHOLDER.sub(lambda m: m.group(0)[0] if m.group(1) is None else values[m.group(1)],
                                        template))
    message.template, message.fields = template, values
    return message


def _has_fields(text: str) -> bool:
    return any(found.group(1) is not None for found in _PLACEHOLDER.finditer(text))


def _unnamed(field: str) -> bool:
    return re.match(r"[!:]|$", field) is not None


class _Template:
    """One f-string's English and its translation: a pattern that finds the replaced fields
    in a finished message, and the translation to put them into."""

    def __init__(self, english: str, translated: str) -> None:
        pieces, self.fields = [], []
        at = 0
        for found in _PLACEHOLDER.finditer(english):
            pieces.append(re.escape(english[at:found.start()]))
            if found.group(1) is None:                     # {{ or }}: a brace
                pieces.append(re.escape(found.group(0)[0]))
            else:
                pieces.append("(.*?)")
                self.fields.append(found.group(1))
            at = found.end()
        pieces.append(re.escape(english[at:]))
        self.pattern = re.compile("".join(pieces), re.DOTALL)
        self.literal = re.sub(r"\\(.)", r"\1", "".join(p for p in pieces if p != "(.*?)"))
        self.prefix = re.sub(r"\\(.)", r"\1", pieces[0]) if pieces else ""
        self.translated = translated

    def fill(self, message: str, translate_field) -> str | None:
        found = self.pattern.fullmatch(message)
        if found is None:
            return None
        values = dict(zip(self.fields, found.groups()))
        # unnamed fields ({}, {:g}) by their order; named ones by their text, wherever they are
        unnamed = iter([v for f, v in zip(self.fields, found.groups()) if _unnamed(f)])

        def put(match: re.Match) -> str:
            if match.group(1) is None:
                return match.group(0)[0]
            field = match.group(1)
            if _unnamed(field):
                return translate_field(next(unnamed, ""))
            return translate_field(values[field]) if field in values else match.group(0)

        return _PLACEHOLDER.sub(put, self.translated)


class _Catalog:
    """The translations of one language: plain messages by their English, and templates."""

    def __init__(self, plain: dict[str, str], templates: list[_Template]) -> None:
        self.plain = plain
        # the most specific first: a template with more fixed text leaves less to chance
        self.templates = sorted(templates, key=lambda t: -len(t.literal))

    def translate(self, message: str, depth: int, holding: str = "") -> str:
        """``message`` translated; ``holding``: only by a template whose English holds it."""
        if isinstance(message, Composed) and not holding:
            fields = {name: self.translate(value, depth) for name, value in message.fields.items()}
            template = self.plain.get(message.template, message.template)
            return _PLACEHOLDER.sub(lambda m: m.group(0)[0] if m.group(1) is None else fields.get(m.group(1), m.group(0)),
                                    template)
        known = self.plain.get(message)
        if known is not None:
            return known
        if depth <= 0:
            return message
        for template in self.templates:
            if not message.startswith(template.prefix) or len(template.literal) > len(message):
                continue
            if holding and holding not in template.literal:
                continue
            filled = template.fill(message, lambda value: self.translate(value, depth - 1))
            if filled is not None:
                return filled
        return message


@functools.lru_cache(maxsize=None)
def _catalog(into: str) -> _Catalog:
    return load_catalog(ROOT / "locales" / into / "LC_MESSAGES" / "messages")


def load_catalog(folder: Path) -> _Catalog:
    """Every translated, not fuzzy message of the catalogs (``*.po``) in ``folder``."""
    plain: dict[str, str] = {}
    templates: list[_Template] = []
    try:
        from babel.messages.pofile import read_po
    except ImportError:      # no Babel: English, as with no catalog
        return _Catalog(plain, templates)
    for path in sorted(folder.glob("*.po")):
        with open(path, "rb") as handle:
            for message in read_po(handle):
                if not message.id or not message.string or message.fuzzy:
                    continue
                plain[message.id] = message.string
                # an f-string's template (Babel's flag is not kept where its parser fails)
                if "python-brace-format" in message.flags or _has_fields(message.id):
                    templates.append(_Template(message.id, message.string))
    return _Catalog(plain, templates)
