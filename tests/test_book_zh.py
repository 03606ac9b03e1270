"""The Chinese book (issue 30) as a learner reads it offline, in headless Chromium with every
request to another host refused (tests/book_browser.py): its pages load with no console error
and no outside request, formulas are rendered, the language switch lands on the same page in
the other language and back (from file:// and served), the pages declared translated show
Chinese, and Chinese search finds a Chinese word.

The Chinese build reads the English build's executed pages (locales/catalogs.py), so it
executes nothing; with COURSE_BOOK_HTML set to a `make book` output it is not rebuilt."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from book_browser import Browser, Server, chromium, html_pages, visit_all
from notebook_tools import ROOT
from test_locales import TRANSLATED as CATALOGS

pytestmark = pytest.mark.slow

ZH = "zh"                       # locales/catalogs.py's SUBFOLDER
CJK = re.compile(r"[\u4e00-\u9fff]")
PAGES = [page for page in CATALOGS if page.startswith("book/")]   # not the notebooks' catalogs
SEARCHED = "注意力"              # on the translated front page


def _browser_or_skip() -> str:
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        pytest.skip("the browser test needs the Python package playwright (pip install playwright)")
    executable = chromium()
    if executable is None:
        pytest.skip("the browser test needs Chromium: apt-get install chromium, or COURSE_CHROMIUM=/path")
    return executable


@pytest.fixture(scope="module")
def site(book_build) -> Path:
    """The built HTML folder, English at its root and Chinese under zh/."""
    html = book_build.html()
    if not (html / ZH / "index.html").is_file():
        started = time.monotonic()
        done = subprocess.run([sys.executable, str(ROOT / "locales" / "catalogs.py"), "build", str(html.parent)],
                              capture_output=True, text=True, timeout=1200)
        assert done.returncode == 0, (done.stdout + done.stderr)[-5000:]
        print(f"Chinese build: {time.monotonic() - started:.0f} s")
    return html


@pytest.fixture(scope="module")
def pages(site) -> list[str]:
    """The Chinese pages declared translated (tests/test_locales.py), then one of each chapter."""
    translated = [f"{ZH}/{page}.html" for page in PAGES]
    chapters = [p for p in html_pages(site / ZH) if p.endswith("index.html") and p.startswith("book/")]
    return translated + [f"{ZH}/{p}" for p in chapters if f"{ZH}/{p}" not in translated]


@pytest.fixture(scope="module")
def reports(site, pages):
    return visit_all(site, pages, _browser_or_skip())


def test_chinese_pages_load_offline_with_no_error_and_no_outside_request(reports):
    problems = {page: r.problems() for page, r in reports.items() if r.problems()}
    assert not problems, json.dumps(problems, indent=1, ensure_ascii=False)[:6000]


def test_formulas_are_rendered(reports, site):
    with_maths = [page for page in reports if 'class="math' in (site / page).read_text(encoding="utf-8")]
    assert with_maths
    assert all(reports[page].formulas > 0 for page in with_maths), with_maths


def _switch(page: str, site: Path) -> Path:
    html = (site / page).read_text(encoding="utf-8")
    found = re.search(r'<nav class="language-switch"[^>]*><a href="([^"]+)"', html)
    assert found, f"{page} has no language switch"
    return (site / page).parent.joinpath(found.group(1)).resolve()


def test_every_page_switches_to_the_same_page_in_the_other_language_and_back(site):
    """Every page of both books (not only those visited; index.html is a redirect)."""
    chinese = [page for page in html_pages(site / ZH) if page.startswith("book/")]
    assert len(chinese) >= 40
    for page in chinese:
        english = _switch(f"{ZH}/{page}", site)
        assert english == (site / page).resolve(), page
        assert _switch(page, site) == (site / ZH / page).resolve(), page


@pytest.fixture(scope="module")
def browser(site):
    """One Chromium and one server for the tests that drive pages themselves."""
    chromium_browser, server = Browser(_browser_or_skip()), Server(site)
    yield chromium_browser, server
    chromium_browser.close()
    server.close()


def _follow_switch(browser: Browser, url: str) -> tuple[str, str]:
    tab = browser.context.new_page()
    try:
        tab.goto(url, wait_until="load")
        tab.click(".language-switch a")
        tab.wait_for_load_state("load")
        return tab.url, tab.evaluate("document.documentElement.lang")
    finally:
        tab.close()


def test_the_switch_lands_on_the_same_page_from_file_and_served(site, browser):
    chromium_browser, server = browser
    page = "book/ch01_embeddings/index.html"
    for url in ((site / ZH / page).as_uri(), server.url(f"{ZH}/{page}")):
        landed, lang = _follow_switch(chromium_browser, url)
        assert landed == url.replace(f"/{ZH}/", "/") and lang == "en", (url, landed, lang)
        back, lang = _follow_switch(chromium_browser, landed)
        assert back == url and lang == "zh-CN", (landed, back, lang)


# each text without its inline code (names such as `attention_mask` are not translated)
ARTICLE_TEXT = """() => Array.from(document.querySelectorAll('.bd-article h1, .bd-article p, .bd-article li'))
  .filter(e => !e.closest('.cell_output, pre, .highlight'))
  .map(e => { const c = e.cloneNode(true); c.querySelectorAll('code').forEach(x => x.remove());
              return c.textContent.replace(/\\s+/g, ' ').trim(); }).filter(t => t)"""


def test_translated_pages_show_chinese(browser):
    """Each heading, paragraph and list item of a page declared translated holds Chinese,
    unless it has no words to translate (only code, formulas or numbers)."""
    chromium_browser, server = browser
    english = []
    tab = chromium_browser.context.new_page()
    try:
        for page in PAGES:
            tab.goto(server.url(f"{ZH}/{page}.html"), wait_until="load")
            texts = tab.evaluate(ARTICLE_TEXT)
            assert len(texts) >= 5, page
            english += [f"{page}: {t[:80]}" for t in texts
                        if not CJK.search(t) and re.search(r"[A-Za-z]{4,}\s+[A-Za-z]{3,}\s+[A-Za-z]{3,}", t)]
    finally:
        tab.close()
    assert not english, "English left on translated pages:\n" + "\n".join(english)


def test_chinese_search_finds_a_chinese_word(browser):
    chromium_browser, server = browser
    tab = chromium_browser.context.new_page()
    try:
        tab.goto(server.url(f"{ZH}/search.html?q={SEARCHED}"), wait_until="load")
        # results are listed one by one; the summary gets the count of pages when the last is in
        tab.wait_for_function("/[0-9]/.test(document.querySelector('#search-results .search-summary')"
                              "?.innerText || '')", timeout=60_000)
        found = tab.evaluate("Array.from(document.querySelectorAll('#search-results li a')).map(a => a.href)")
    finally:
        tab.close()
    assert any(link.split("?")[0].endswith("/zh/book/intro.html") for link in found), found
