"""The Chinese edition's part of the book's build (issue 30): a link at the top of every page
to the same page in the other language, and formulas shared by both languages.

The English book is at the root of _build/html and the Chinese one under _build/html/zh/
(locales/catalogs.py builds it), with the same page names, so the link is relative: it
works from file:// and served alike, without a script.
"""

from __future__ import annotations

from html import escape

from docutils import nodes
from sphinx import addnodes
from sphinx.application import Sphinx
from sphinx.locale import init as init_locale
from sphinx.search.zh import SearchChinese
from sphinx.transforms import SphinxTransform
from sphinx.util.i18n import docname_to_domain

SUBFOLDER = "zh"                       # locales/catalogs.py builds the Chinese book there
LABELS = {"en": ("zh", "中文"), "zh_CN": ("en", "English")}   # this book -> (other's lang, its label)


def other_language_href(pagename: str, language: str) -> str:
    """The relative link from a page (its Sphinx name, e.g. ``book/ch01_embeddings/index``)
    to the same page in the other language's book."""
    up = "../" * pagename.count("/")
    if language == "zh_CN":
        return f"{up}../{pagename}.html"
    return f"{up}{SUBFOLDER}/{pagename}.html"


def _switch(app: Sphinx, pagename: str, templatename: str, context: dict, doctree) -> None:
    language = app.config.language or "en"
    if language not in LABELS or "body" not in context:
        return
    lang, label = LABELS[language]
    href = escape(other_language_href(pagename, language))
    link = (f'<nav class="language-switch" aria-label="Language / 语言">'
            f'<a href="{href}" hreflang="{lang}" lang="{lang}">{label}</a></nav>')
    context["body"] = link + context["body"]


class SharedFormulas(SphinxTransform):
    """Display formulas are the same in both languages: not messages of the catalogs
    (the prose around them, with its inline maths, is)."""

    default_priority = 10      # before Sphinx's Locale transform (20) reads the catalogs

    def apply(self, **kwargs) -> None:
        for block in self.document.findall(nodes.math_block):
            block["translatable"] = False


class TranslatedPartCaptions(SphinxTransform):
    """The sidebar's part captions ("Building blocks") come from _toc.yml in toctrees that
    sphinx-external-toc inserts (priority 100) after Sphinx has translated the page (20):
    translate them from the page's catalog, where `make locales` put them."""

    default_priority = 101

    def apply(self, **kwargs) -> None:
        if not self.config.language or self.config.language == "en":
            return
        domain = docname_to_domain(self.env.docname, self.config.gettext_compact)
        folders = [str(self.env.srcdir / folder) for folder in self.config.locale_dirs]
        catalog, found = init_locale(folders, self.config.language, domain)
        if not found:
            return
        for toctree in self.document.findall(addnodes.toctree):
            if toctree.get("caption"):
                toctree["caption"] = catalog.gettext(toctree["caption"])


class _Words(set):
    """A set that takes words as a list does (``extend``)."""

    def extend(self, words) -> None:
        self.update(words)


class ChineseSearch(SearchChinese):
    """Sphinx's Chinese search index, its Latin words kept in a set. Sphinx 7 keeps every Latin
    word of the whole book in one list (a class attribute) and looks each word it stems up in
    that list: the Chinese build spent a third of its time there (py-spy, 2026-12-05: 700 of
    2,174 samples in ``SearchChinese.stem``). The index it writes is the same."""

    def init(self, options: dict) -> None:
        super().init(options)
        self.latin_terms = _Words()


def setup(app: Sphinx) -> dict:
    app.add_search_language(ChineseSearch)
    app.add_transform(SharedFormulas)
    app.add_transform(TranslatedPartCaptions)
    app.add_css_file("language.css")
    app.connect("html-page-context", _switch)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
