"""HTML from a submission made safe to show: an allowlist of tags and attributes.

What a student's notebook holds (Markdown cells, ``text/html`` outputs) reaches the feedback
page only through :func:`clean`: no script, no event handler, no ``style``, no ``id`` (it
could take over the page's own anchors), no ``javascript:`` or ``data:`` link. Images
keep only ``data:image/...`` sources, so nothing is fetched. A tag that is not allowed is
shown as text (``&lt;script&gt;``): the student sees what their notebook held.

The page's Content-Security-Policy (:mod:`autograder.feedback`) is the second wall: even
HTML that got past this module could not run a script the page did not ship.
"""

from __future__ import annotations

import functools
import re
from typing import Callable

import bleach

TAGS = frozenset({
    "a", "abbr", "b", "blockquote", "br", "caption", "code", "col", "colgroup", "dd", "del", "details",
    "div", "dl", "dt", "em", "figcaption", "figure", "h1", "h2", "h3", "h4", "h5", "h6", "hr", "i",
    "img", "ins", "kbd", "li", "mark", "ol", "p", "pre", "q", "s", "samp", "small", "span", "strong",
    "sub", "summary", "sup", "table", "tbody", "td", "tfoot", "th", "thead", "tr", "u", "ul",
})
# Links to the web and to mail; a link with no scheme (``#part``, ``page.html``) stays relative.
PROTOCOLS = frozenset({"http", "https", "mailto", "data"})
_ATTRIBUTES = {
    "a": {"href", "title"},
    "img": {"src", "alt", "title", "width", "height"},
    "td": {"colspan", "rowspan", "align"},
    "th": {"colspan", "rowspan", "align", "scope"},
    "ol": {"start"},
    "details": {"open"},
    "abbr": {"title"},
}
# Pygments' classes in highlighted code are one to three letters and a digit ("k", "nf", "s1"):
# the page's own classes all start with "fb-", so a submission cannot dress up as a verdict.
_CLASS = re.compile(r"(highlight|hll|[a-z]{1,3}\d?)")
_IMAGE = re.compile(r"data:image/(png|jpeg|gif|webp|svg\+xml);base64,[A-Za-z0-9+/=\s]*", re.IGNORECASE)
_ANCHOR_LINK = re.compile(r'<a class="anchor-link" href="[^"]*">(?:&#182;|¶)</a>')


def _allowed(tag: str, name: str, value: str) -> bool:
    if name == "class":
        return tag in ("span", "div", "pre", "code") and all(_CLASS.fullmatch(c) for c in value.split())
    if tag == "img" and name == "src":
        return bool(_IMAGE.fullmatch(value.strip()))
    if name == "href" and value.strip().lower().startswith("data:"):
        return False
    return name in _ATTRIBUTES.get(tag, ())


_CLEANER = bleach.Cleaner(tags=TAGS, attributes=_allowed, protocols=PROTOCOLS, strip=False,
                          strip_comments=True)


def clean(fragment: str) -> str:
    """``fragment`` with only allowed tags and attributes; the rest escaped as text."""
    return _CLEANER.clean(fragment)


def remembered(render: Callable[[str], str]) -> Callable[[str], str]:
    """``render`` keeping what it made of short texts: a grading worker renders the same released
    cells (instructions, tests) on every page of an assignment. Long texts, which only a
    submission makes, are rendered each time, so what is kept stays near ten megabytes."""
    kept = functools.lru_cache(maxsize=256)(render)

    @functools.wraps(render)
    def rendered(text: str) -> str:
        return kept(text) if len(text) <= 4_000 else render(text)

    return rendered


@remembered
def markdown(source: str) -> str:
    """A Markdown cell as safe HTML. Formulas stay as ``$...$`` text for MathJax."""
    from nbconvert.filters.markdown_mistune import markdown2html_mistune

    return clean(_ANCHOR_LINK.sub("", markdown2html_mistune(source)))
