"""The book builds with warnings as errors; every chapter carries figures and a widget;
code and printed output fit the text column."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from book_lines import WIDTH, stray_reprs, wide_lines
from notebook_tools import ROOT

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def html(book_build) -> Path:
    """The book built with warnings as errors (see tests/book_build.py)."""
    return book_build.html()


def _chapters() -> list[str]:
    toc = (ROOT / "_toc.yml").read_text()
    return sorted(set(re.findall(r"file:\s*book/(ch\d\d_[a-z_]+)/", toc)))


def _figures(page: Path) -> list[str]:
    text = page.read_text(encoding="utf-8")
    images = re.findall(r"<img [^>]*src=\"([^\"]+\.png)\"", text)
    for src in images:
        assert (page.parent / src).resolve().is_file(), (page, src)
    return images


@pytest.mark.parametrize("chapter", _chapters())
def test_every_chapter_has_figures_drawn_by_code_and_a_widget(html, chapter):
    pages = sorted((html / "book" / chapter).glob("*.html"))
    assert pages
    assert sum(len(_figures(p)) for p in pages) >= 3, chapter
    assert any("application/vnd.jupyter.widget-view+json" in p.read_text(encoding="utf-8") for p in pages), chapter
    for page in pages:
        assert "Traceback (most recent call last)" not in page.read_text(encoding="utf-8"), page


@pytest.mark.parametrize("page,figures", [("tokenization", 1), ("embeddings", 3), ("patches", 1)])
def test_chapter_1_pages_have_their_figures(html, page, figures):
    assert len(_figures(html / "book" / "ch01_embeddings" / f"{page}.html")) >= figures


def test_every_page_of_the_toc_is_rendered(html):
    toc = (ROOT / "_toc.yml").read_text()
    for name in re.findall(r"file:\s*(\S+)", toc) + re.findall(r"root:\s*(\S+)", toc):
        assert (html / f"{name}.html").is_file(), name


def test_code_and_output_fit_80_columns(html):
    """Code, printed output and the prose's code blocks fit the text column: no line
    scrolls sideways or reads as cut mid-word (tests/book_lines.py finds them)."""
    wide = wide_lines(html, WIDTH)
    assert not wide, f"{len(wide)} lines over {WIDTH} characters:\n" + "\n".join(
        f"{page} [{kind}, {len(line)}] {line}" for page, kind, line in wide)


def test_no_stray_reprs(html):
    """No cell shows the repr of an object it returned by accident
    (`<torch._C.Generator at 0x...>` from a last line `torch.manual_seed(0)`)."""
    strays = stray_reprs(html)
    assert not strays, "\n".join(f"{page}: {text}" for page, text in strays)
