"""The built book as a learner reads it offline: headless Chromium (Playwright driving Debian's
Chromium), every request to another host refused. Each page loads with no console error and no
outside request, its formulas are rendered by MathJax (no raw LaTeX left in the text, the
sidebars and headings included), each widget shows its controls, each image loads, and each
precomputed demo changes its figure when its control moves. At 1280x800 no code block or output
is wider than the column, no figure's text is smaller than the body text, and no widget label is
cut; a live-only widget's controls cannot move (its figure would not follow); in dark mode no
widget panel is light. On a phone (390x844, three device pixels per CSS pixel) the exercises
pages do not scroll sideways, and no demo frame is shown with fewer image pixels per CSS pixel
than it was drawn for. Screenshots of one page per chapter (light, and dark where it has a
widget) go to test-output/browser/ (COURSE_TEST_OUTPUT to change), with summary.json (the
counts)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from book_browser import PHONE, Browser, chromium, html_pages, visit_all
from notebook_tools import ROOT

pytestmark = pytest.mark.slow

OUTPUT = Path(os.environ.get("COURSE_TEST_OUTPUT", ROOT / "test-output")) / "browser"


def _browser_or_skip() -> str:
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        pytest.skip("the browser test needs the Python package playwright (pip install playwright)")
    executable = chromium()
    if executable is None:
        pytest.skip("the browser test needs Chromium: apt-get install chromium (make test does it as "
                    "root), or COURSE_CHROMIUM=/path/to/chrome")
    return executable


def _screenshot_pages(site: Path, pages: list[str]) -> dict[str, str]:
    """One page per chapter: the first with a widget, else the chapter's index."""
    chosen: dict[str, str] = {}
    with_widget = [p for p in pages if "widget-view+json" in (site / p).read_text(encoding="utf-8")]
    indexes = [p for p in pages if p.endswith("/index.html")]
    for page in with_widget + indexes:      # widget pages first: setdefault keeps them
        match = re.match(r"book/(ch\d\d)_[^/]+/", page)
        if match:
            chosen.setdefault(match.group(1), page)
    return chosen


@pytest.fixture(scope="module")
def site(book_build) -> Path:
    return book_build.html()


@pytest.fixture(scope="module")
def reports(site):
    executable = _browser_or_skip()
    pages = html_pages(site)
    shots = _screenshot_pages(site, pages)
    by_page = {page: chapter for chapter, page in shots.items()}
    found = visit_all(site, pages, executable, {page: OUTPUT / f"{chapter}.png" for page, chapter in by_page.items()})
    summary = {
        "pages": len(found),
        "formulas_rendered": sum(r.formulas for r in found.values()),
        "widgets": sum(r.widgets for r in found.values()),
        "widgets_rendered": sum(r.widgets_rendered for r in found.values()),
        "images": sum(r.images for r in found.values()),
        "precomputed_demos": sum(r.demos for r in found.values()),
        "external_requests": sum(len(r.external) for r in found.values()),
        "code_blocks": sum(r.code_blocks for r in found.values()),
        "too_wide_at_1280px": sum(len(r.too_wide) for r in found.values()),
        "widget_labels": sum(r.labels for r in found.values()),
        "cut_labels": sum(len(r.cut_labels) for r in found.values()),
        "live_only_widgets": sum(r.live_only for r in found.values()),
        "figures_shown_under_75_percent": {p: r.shrunk_figures for p, r in found.items() if r.shrunk_figures},
        "body_text_px": sorted({r.body_text_px for r in found.values() if r.figure_text}),
        "figures_measured": sum(len(r.figure_text) for r in found.values()),
        "figure_text_under_the_body_size": {p: r.small_figure_text() for p, r in found.items()
                                            if r.small_figure_text()},
        "screenshots": sorted(f"{c}.png" for c in shots),
    }
    OUTPUT.mkdir(parents=True, exist_ok=True)
    (OUTPUT / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary))
    return found


def test_every_page_loads_offline_with_no_error_and_no_outside_request(reports):
    problems = {page: r.problems() for page, r in reports.items() if r.problems()}
    assert not problems, json.dumps(problems, indent=1)[:6000]


def test_formulas_are_rendered_on_every_page_that_has_them(reports, site):
    for page, report in reports.items():
        source = (site / page).read_text(encoding="utf-8")
        if 'class="math' in source:
            assert report.formulas > 0, page
    assert sum(r.formulas for r in reports.values()) > 500


def test_every_widget_shows_its_controls_and_the_book_has_them(reports):
    assert sum(r.widgets for r in reports.values()) >= 19
    assert all(r.widgets_rendered == r.widgets for r in reports.values())


def test_precomputed_demos_change_their_figure_without_a_kernel(reports):
    demos = sum(r.demos for r in reports.values())
    assert demos >= 5
    assert sum(r.demos_that_change for r in reports.values()) == demos


def test_code_and_outputs_fit_the_column_at_1280px(reports):
    """Every code block and output at most the column's width on a 1280 px desktop (lines of
    up to 80 characters: book/_static/course.css), so nothing needs sideways scrolling."""
    assert sum(r.code_blocks for r in reports.values()) > 400
    wide = {page: r.too_wide for page, r in reports.items() if r.too_wide}
    assert not wide, json.dumps(wide, indent=1)[:4000]


def test_figure_text_is_no_smaller_than_the_body_text_at_1280px(reports):
    """Each figure's smallest text (its size in the PNG, recorded by book/_ext/kernel_figures.py,
    times the scale the page shows the PNG at) is at least the article's body text size."""
    measured = [f for r in reports.values() for f in r.figure_text]
    assert len(measured) > 60 and all(r.body_text_px >= 14 for r in reports.values() if r.figure_text)
    assert sum(1 for f in measured if "demo frame" in f["figure"]) >= 5
    small = {page: r.small_figure_text() for page, r in reports.items() if r.small_figure_text()}
    assert not small, json.dumps(small, indent=1)[:6000]


@pytest.fixture(scope="module")
def phone_reports(site, reports):       # after the desktop visits: one set of browsers at a time
    executable = _browser_or_skip()
    pages = [p for p in html_pages(site) if p.endswith("/exercises.html")]
    found = visit_all(site, pages, executable, device=PHONE)
    print(json.dumps({p: [r.page_overflow_px, r.column_px, r.page_overflow] for p, r in found.items()}))
    return found


def test_exercises_pages_fit_a_phone(phone_reports):
    """At 390x844 (device pixel ratio 3) an exercises page never scrolls sideways: the link to
    its notebook wraps. Its tables and code blocks scroll inside their own boxes."""
    assert len(phone_reports) >= 7
    assert all(not r.problems() for r in phone_reports.values()), {p: r.problems() for p, r in phone_reports.items()}
    wide = {page: [f"{r.page_overflow_px} px", *r.page_overflow] for page, r in phone_reports.items()
            if r.page_overflow_px > 0}
    assert not wide, wide


def test_demo_frames_keep_their_resolution_on_a_phone(reports, phone_reports):
    """A demo's frame (course/book_demo.py) is drawn at FRAME_DPI and laid out at SHOWN_PPI
    CSS px per inch, at most the column's width: on a 390 px phone (a 358 px column) each
    shown frame has at least FRAME_DPI / SHOWN_PPI image pixels per CSS pixel: 3 at 300 dpi,
    as many as a phone's 3x screen has device pixels (more for a frame the column narrows)."""
    from course.book_demo import FRAME_DPI, SHOWN_PPI

    column = min(r.column_px for r in phone_reports.values())
    frames = [f for r in reports.values() for f in r.frames]
    assert len(frames) >= 8 and 300 < column < 390
    density = sorted(f["natural"] / min(f["css"], column) for f in frames)
    print(f"phone column {column:g} px; frame pixels per CSS px: {[round(d, 2) for d in density]}")
    assert density[0] >= FRAME_DPI / SHOWN_PPI - 0.01, density


def test_widget_labels_are_not_cut(reports):
    assert sum(r.labels for r in reports.values()) >= 20
    cut = {page: r.cut_labels for page, r in reports.items() if r.cut_labels}
    assert not cut, cut


def test_live_only_controls_cannot_move_so_each_value_matches_its_figure(reports):
    """A widget only a kernel can redraw shows its controls disabled in the static page."""
    assert sum(r.live_only for r in reports.values()) >= 5
    movable = {page: r.movable_live_controls for page, r in reports.items() if r.movable_live_controls}
    assert not movable, movable


def test_widget_panels_are_dark_in_dark_mode(reports):
    assert sum(1 for r in reports.values() if r.widgets) >= 10
    light = {page: r.light_dark_mode_panels[:5] for page, r in reports.items() if r.light_dark_mode_panels}
    assert not light, light


def test_a_screenshot_per_chapter(reports):
    shots = sorted(OUTPUT.glob("ch??.png"))
    assert len(shots) >= 7, shots
    assert all(s.stat().st_size > 10_000 for s in shots)


def test_a_page_opened_as_a_file_renders_its_maths_and_widgets(reports, site):
    """`_build/html` opened from disk, with no server at all."""
    executable = _browser_or_skip()
    page = next(p for p, r in sorted(reports.items()) if r.demos and r.formulas)
    browser = Browser(executable)
    try:
        report = browser.visit((site / page).as_uri(), allowed_origin=None)
    finally:
        browser.close()
    assert not report.problems(), report.problems()
    assert report.formulas and report.widgets_rendered == report.widgets and report.demos_that_change
