"""Feedback pages checked as a student opens them: the markup read for anything live, and the
page loaded from disk in headless Chromium with every request off this machine refused.
Used by tests/test_feedback_page.py and tests/test_adversarial.py."""

from __future__ import annotations

import html.parser
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

from book_browser import CHROMIUM_FLAGS

# The only scripts a feedback page may load (autograder/feedback.py).
OWN_SCRIPTS = ("_static/mathjax-config.js", "_static/mathjax/tex-chtml.js")
# Attacks record that they ran in window.ran (see the adversarial suite and test_feedback_page).
RAN = "() => window.ran === undefined ? [] : Array.from(window.ran)"
OVERFLOW = """() => {
  const root = document.documentElement;
  const wide = Array.from(document.querySelectorAll('pre, p, li, td, div.highlight'))
    .filter(el => el.scrollWidth > el.clientWidth + 1).map(el => el.textContent.slice(0, 60));
  return {page: root.scrollWidth - root.clientWidth, elements: wide};
}"""


class _Live(html.parser.HTMLParser):
    """What could run: script tags, event-handler attributes, javascript: URLs, frames."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.found: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag == "script":
            src = dict(attrs).get("src") or ""
            if src not in OWN_SCRIPTS:
                self.found.append(f"<script src={src!r}>")
        if tag in ("iframe", "object", "embed", "frame", "base", "form", "svg", "math", "style", "link"):
            self.found.append(f"<{tag}>")
        for name, value in attrs:
            squeezed = "".join((value or "").split()).lower()
            if name.startswith("on"):
                self.found.append(f"<{tag} {name}=...>")
            elif squeezed.startswith(("javascript:", "vbscript:")) or (name == "href" and squeezed.startswith("data:")):
                self.found.append(f"<{tag} {name}={value[:40]!r}>")


def chromium_or_skip() -> str:
    """Chromium's path, or the test skipped with what to install."""
    import pytest

    from autograder.feedback import mathjax_available
    from book_browser import chromium

    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        pytest.skip("the feedback page's browser test needs the Python package playwright")
    executable = chromium()
    if executable is None:
        pytest.skip("the feedback page's browser test needs Chromium (apt-get install chromium)")
    if not mathjax_available():
        pytest.skip("MathJax is not in node_modules/: run `make vendor`")
    return executable


def live_markup(page_html: str) -> list[str]:
    """Everything in the page's markup that could run a script, beyond the page's own two."""
    parser = _Live()
    parser.feed(page_html)
    # the page's own <style> (its CSS) is one; a second would be a submission's
    styles = [f for f in parser.found if f == "<style>"]
    return [f for f in parser.found if f != "<style>"] + styles[1:]


@dataclass
class Visit:
    ran: list[str] = field(default_factory=list)        # markers the attacks would have pushed
    title: str = ""
    formulas: int = 0
    errors: list[str] = field(default_factory=list)     # console errors other than CSP refusals
    blocked: list[str] = field(default_factory=list)    # what the CSP refused
    external: list[str] = field(default_factory=list)
    overflow: dict = field(default_factory=dict)
    summary_links: list[tuple[str, str]] = field(default_factory=list)
    hints: list[dict] = field(default_factory=list)
    text: str = ""


def visit(page: Path, executable: str, width: int = 1280, click: str | None = None) -> Visit:
    """One page: see :func:`visit_pages`."""
    return visit_pages([page], executable, width, click)[0]


def visit_pages(pages: list[Path], executable: str, width: int = 1280, click: str | None = None) -> list[Visit]:
    """Open each page from disk at ``width`` px in one Chromium (a tab each), wait for MathJax,
    click every link whose text is ``click`` (the attacks' javascript: links), then open the
    first hint."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, args=CHROMIUM_FLAGS)
        try:
            context = browser.new_context(viewport={"width": width, "height": 900})
            return [_visit(context.new_page(), page, click) for page in pages]
        finally:
            browser.close()


def _visit(tab, page: Path, click: str | None) -> Visit:
    found = Visit()

    def route(request_route) -> None:
        if urlparse(request_route.request.url).scheme in ("file", "data", "blob"):
            request_route.continue_()
        else:
            found.external.append(request_route.request.url)
            request_route.abort()

    def console(message) -> None:
        if message.type == "error":
            (found.blocked if "Content Security Policy" in message.text else found.errors).append(message.text)

    tab.route("**/*", route)
    tab.on("console", console)
    tab.on("pageerror", lambda error: found.errors.append(f"uncaught: {error}"))
    tab.goto(page.resolve().as_uri(), wait_until="load", timeout=60_000)
    tab.wait_for_function("window.MathJax && MathJax.startup && MathJax.startup.promise", timeout=30_000)
    tab.evaluate("MathJax.startup.promise")
    if click:
        for link in tab.get_by_text(click, exact=True).all():
            link.click()
        tab.wait_for_timeout(300)
    found.ran = tab.evaluate(RAN)
    found.title = tab.title()
    found.formulas = tab.locator("mjx-container").count()
    found.overflow = tab.evaluate(OVERFLOW)
    found.summary_links = tab.evaluate("() => Array.from(document.querySelectorAll('.fb-summary a'))"
                                       ".map(a => [a.textContent, a.getAttribute('href')])")
    found.text = tab.evaluate("() => document.body.innerText")
    found.hints = _open_first_hint(tab)
    tab.close()
    return found


def _open_first_hint(tab) -> list[dict]:
    """The first hint's disclosure before and after a click on its summary."""
    hint = tab.locator("details", has=tab.locator("summary", has_text="Hint 1")).first
    if not hint.count():
        return []
    states = []
    for _ in range(2):
        states.append(hint.evaluate("d => ({open: d.open, height: d.getBoundingClientRect().height,"
                                    " display: getComputedStyle(d.querySelector('summary')).display})"))
        hint.locator("summary").click()
    return states
