"""The built book in headless Chromium, with every request to another host refused: what a
learner sees offline. Used by tests/test_book_browser.py; also runnable on a built book:

    python tests/book_browser.py _build/html [page.html ...]
"""

from __future__ import annotations

import functools
import http.server
import json
import os
import shutil
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--disable-quic",
                  # a second wall: no name resolves but this machine's
                  "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"]

# Text nodes that may hold a backslash or a dollar sign: code, and MathJax's own output.
SKIP_TEXT_INSIDE = "pre, code, script, style, mjx-container, .highlight, textarea"
VISIBLE_TEXT = """(skip) => {
  const out = [];
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  while (walker.nextNode()) {
    const node = walker.currentNode;
    const parent = node.parentElement;
    if (!parent || parent.closest(skip)) continue;
    out.push(node.textContent);
  }
  return out.join(" ");
}"""
RAW_LATEX = r"""(text) => {
  const found = text.match(/\\\(|\\\[|\$\$|\\(frac|sqrt|sum|mathbf|text|cdot|top|log|exp|tfrac|alpha|theta)\b/g);
  return found ? found.slice(0, 5) : [];
}"""
WIDGETS = """() => Array.from(document.querySelectorAll(
    'script[type="application/vnd.jupyter.widget-view+json"]')).map(tag => {
  const area = tag.parentElement.querySelector('.widget-subarea');
  const box = area ? area.getBoundingClientRect() : null;
  return {rendered: !!area, height: box ? box.height : 0,
          controls: area ? area.querySelectorAll('.jupyter-widgets').length : 0};
})"""
LOAD_EVERY_FONT = """() => Promise.all(Array.from(document.fonts).map(face => face.load().catch(() => null)))
    .then(() => document.fonts.ready).then(() => null)"""
BROKEN_IMAGES = """() => Array.from(document.images)
  .filter(img => !img.complete || img.naturalWidth === 0).map(img => img.src.slice(0, 80))"""
SHOWN_FIGURES = """(demo) => Array.from(demo.querySelectorAll('img'))
  .filter(img => img.offsetParent !== null).map(img => img.src)"""
# Code blocks and outputs wider than the column (or scrolling inside their own box), and widget
# labels cut short ("temperat..."): each as "what: how many px too wide".
TOO_WIDE = """() => {
  const article = document.querySelector('.bd-article');
  if (!article) return {blocks: 0, wide: [], labels: 0, cut: [], shrunk: []};
  const style = getComputedStyle(article);
  const right = article.getBoundingClientRect().right - parseFloat(style.paddingRight);
  const shown = Array.from(article.querySelectorAll('pre, .cell_output > *')).filter(el => el.offsetParent);
  const wide = shown.map(el => {
    const over = Math.max(el.scrollWidth - el.clientWidth, el.getBoundingClientRect().right - right);
    return over > 1 ? `${el.tagName.toLowerCase()} "${el.textContent.trim().slice(0, 40)}": ${Math.ceil(over)} px` : null;
  }).filter(Boolean);
  const labels = Array.from(article.querySelectorAll('.widget-label'))
    .filter(el => el.offsetParent && el.textContent.trim());
  const cut = labels.filter(el => el.scrollWidth > el.clientWidth)
    .map(el => `${el.textContent.trim()}: ${el.scrollWidth} px in ${el.clientWidth}`);
  // figures (not the demo frames, drawn at 1.5x on purpose) shown under 3/4 of their size
  const shrunk = Array.from(article.querySelectorAll('.cell_output img:not(.course-frames img)'))
    .filter(img => img.offsetParent && img.naturalWidth)
    .map(img => img.getBoundingClientRect().width / img.naturalWidth).filter(scale => scale < 0.75)
    .map(scale => `${Math.round(100 * scale)}%`);
  return {blocks: shown.filter(el => el.tagName === 'PRE').length, wide, labels: labels.length, cut, shrunk};
}"""
SMALLEST_TEXT_KEY = "course-smallest-text-px"      # book/_ext/kernel_figures.py writes it
# Each figure shown (inline images, the widgets' images and the demos' frames): the size of
# its smallest text in pixels of the PNG (the tEXt chunk that book/_ext/kernel_figures.py adds
# in the book's kernels: null when there is none, "none" for a figure without text) and the
# scale the page shows it at; and the body text's font size, in CSS px.
FIGURE_TEXT = """async (key) => {
  const article = document.querySelector('.bd-article');
  if (!article || location.protocol === 'file:') return {body: 0, figures: []};   // no fetch from file://
  const body = parseFloat(getComputedStyle(article.querySelector('p') || article).fontSize);
  const stamp = async src => {
    try {
      const bytes = new Uint8Array(await (await fetch(src)).arrayBuffer());
      const view = new DataView(bytes.buffer);
      for (let at = 8; at + 12 <= bytes.length; at += 12 + view.getUint32(at)) {
        if (String.fromCharCode(...bytes.subarray(at + 4, at + 8)) !== 'tEXt') continue;
        const [name, value] = new TextDecoder('latin1').decode(
          bytes.subarray(at + 8, at + 8 + view.getUint32(at))).split('\\0');
        if (name === key) return value;
      }
      return null;
    } catch (error) { return `unreadable: ${error}`; }
  };
  const images = Array.from(article.querySelectorAll('.cell_output img'))
    .filter(img => img.offsetParent && img.naturalWidth);
  const figures = [];
  for (const [i, img] of images.entries()) {
    const heading = img.closest('section')?.querySelector('h1, h2, h3');
    figures.push({figure: `figure ${i + 1}${img.closest('.course-frames') ? ' (demo frame)' : ''}`
                    + ` under "${heading ? heading.textContent.replace('#', '').trim() : ''}"`,
                  text_px: await stamp(img.src), scale: img.getBoundingClientRect().width / img.naturalWidth});
  }
  return {body, figures};
}"""
# The demos' frames in the page (a Stack renders only the frame it shows): pixels wide, and the
# width their layout asks for (CSS px).
FRAMES = """() => Array.from(document.querySelectorAll('.course-frames img')).map(img =>
  ({natural: img.naturalWidth, css: parseFloat(img.style.width) || img.naturalWidth}))"""
# How far the page scrolls sideways, the outermost elements that stick out of the window (not
# inside a box that scrolls or clips, nor fixed), and the width of the article's column.
PAGE_OVERFLOW = """() => {
  const width = document.documentElement.clientWidth;
  const sticksOut = el => el.getBoundingClientRect().right > width + 1;
  const contained = el => {     // inside a box that scrolls or clips, or out of the flow (fixed)
    for (let up = el; up && up !== document.body; up = up.parentElement) {
      const style = getComputedStyle(up);
      if ((up !== el && style.overflowX !== 'visible') || style.position === 'fixed') return true;
    }
    return false;
  };
  const out = Array.from(document.body.querySelectorAll('*'))
    .filter(el => sticksOut(el) && !sticksOut(el.parentElement) && !contained(el));
  const article = document.querySelector('.bd-article');
  const column = article ? article.clientWidth - parseFloat(getComputedStyle(article).paddingLeft)
                           - parseFloat(getComputedStyle(article).paddingRight) : 0;
  return {over: document.documentElement.scrollWidth - width, column,
          what: out.slice(0, 5).map(el => `${el.tagName.toLowerCase()} "${el.textContent.trim().slice(0, 50)}": `
                                           + `${Math.ceil(el.getBoundingClientRect().right - width)} px`)};
}"""
# Live-only widgets (ipywidgets' interactive: a kernel redraws their figure): how many, and the
# controls of theirs that a reader can still focus or move (book/_static/course.js makes them inert).
LIVE_ONLY = """() => {
  const boxes = Array.from(document.querySelectorAll('.widget-interact'))
    .filter(box => !box.closest('.course-demo'));
  const movable = [];
  for (const box of boxes) {
    for (const control of box.querySelectorAll('input, select, textarea, button, [tabindex]')) {
      if (control.closest('.widget-output')) continue;
      control.focus();
      if (document.activeElement !== control) continue;
      const widget = control.closest('.widget-inline-hbox, .widget-box, .jupyter-widgets');
      movable.push(widget.textContent.trim().slice(0, 40) || control.tagName);
    }
  }
  return {count: boxes.length, movable};
}"""
# In dark mode (pydata's html[data-theme=dark]) the background behind each widget panel and
# input, as its luma (0 black, 1 white): a light one is a light panel on a dark page.
DARK_PANELS = """async () => {
  document.documentElement.dataset.theme = 'dark';
  await new Promise(done => requestAnimationFrame(() => requestAnimationFrame(done)));
  const luminance = el => {
    for (let node = el; node; node = node.parentElement) {
      const rgba = getComputedStyle(node).backgroundColor.match(/[\\d.]+/g).map(Number);
      if (rgba.length === 3 || rgba[3] > 0.5)
        return rgba.slice(0, 3).reduce((sum, c, i) => sum + [0.2126, 0.7152, 0.0722][i] * c / 255, 0);
    }
    return 1;
  };
  const panels = document.querySelectorAll('.widget-subarea, .widget-subarea .widget-box, .widget-subarea .widget-output, '
    + '.widget-subarea select, .widget-subarea input[type=text], .widget-subarea textarea, .widget-subarea button');
  return Array.from(panels).filter(el => el.offsetParent && luminance(el) > 0.4)
    .map(el => `${el.tagName.toLowerCase()}.${[...el.classList].pop() || ''}: ${luminance(el).toFixed(2)}`);
}"""


def chromium() -> str | None:
    """Debian's Chromium (or COURSE_CHROMIUM); None when there is none."""
    for candidate in (os.environ.get("COURSE_CHROMIUM"), "chromium", "chromium-browser", "google-chrome"):
        if candidate and shutil.which(candidate):
            return shutil.which(candidate)
    return None


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


class Server:
    """The built HTML served on 127.0.0.1 (a learner's `python -m http.server`)."""

    def __init__(self, folder: Path) -> None:
        handler = functools.partial(_QuietHandler, directory=str(folder))
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.origin = f"127.0.0.1:{self.httpd.server_port}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def url(self, page: str) -> str:
        return f"http://{self.origin}/{page}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@dataclass
class PageReport:
    page: str
    formulas: int = 0
    widgets: int = 0
    widgets_rendered: int = 0
    images: int = 0
    errors: list[str] = field(default_factory=list)
    external: list[str] = field(default_factory=list)
    raw_latex: list[str] = field(default_factory=list)
    broken_images: list[str] = field(default_factory=list)
    unrendered_widgets: int = 0
    demos: int = 0
    demos_that_change: int = 0
    code_blocks: int = 0                                   # <pre>: code cells, outputs, listings
    too_wide: list[str] = field(default_factory=list)      # code or output wider than the column
    labels: int = 0
    cut_labels: list[str] = field(default_factory=list)
    shrunk_figures: list[str] = field(default_factory=list)    # shown at under 75% of their size
    body_text_px: float = 0                                # the article's font size
    figure_text: list[dict] = field(default_factory=list)  # FIGURE_TEXT: figure, text_px, scale
    frames: list[dict] = field(default_factory=list)       # FRAMES: natural and CSS width
    page_overflow_px: int = 0                              # how far the page scrolls sideways
    page_overflow: list[str] = field(default_factory=list)     # what sticks out
    column_px: float = 0                                   # the article's content width
    live_only: int = 0                                     # widgets only a kernel can redraw
    movable_live_controls: list[str] = field(default_factory=list)
    light_dark_mode_panels: list[str] = field(default_factory=list)

    def small_figure_text(self) -> list[str]:
        """The figures whose smallest text, at the scale the page shows them, is smaller than
        the body text, or whose text size is not recorded."""
        found = []
        for figure in self.figure_text:
            if figure["text_px"] == "none":         # a figure without text
                continue
            try:
                shown = float(figure["text_px"]) * figure["scale"]
            except (TypeError, ValueError):
                found.append(f"{figure['figure']}: no text size recorded ({figure['text_px']}): was it "
                             "drawn by the book's kernels (book/_ext/kernel_figures.py)?")
                continue
            if shown < self.body_text_px - 0.01:
                found.append(f"{figure['figure']}: smallest text {float(figure['text_px']):.1f} px shown at "
                             f"{100 * figure['scale']:.0f}% = {shown:.1f} px, body text {self.body_text_px:g} px")
        return found

    def problems(self) -> list[str]:
        found = [f"console: {e}" for e in self.errors]
        found += [f"request to another host: {u}" for u in self.external]
        found += [f"raw LaTeX in the text: {t}" for t in self.raw_latex]
        found += [f"image not loaded: {s}" for s in self.broken_images]
        if self.unrendered_widgets:
            found.append(f"{self.unrendered_widgets} of {self.widgets} widgets not rendered")
        if self.demos_that_change < self.demos:
            found.append(f"{self.demos - self.demos_that_change} of {self.demos} precomputed demos "
                         "do not change their figure when their control moves")
        return found


class Browser:
    """One headless Chromium; each page opened in a fresh tab with the network walled off."""

    def __init__(self, executable: str, viewport: tuple[int, int] = (1280, 800), pixel_ratio: float = 1) -> None:
        from playwright.sync_api import sync_playwright

        self._playwright = sync_playwright().start()
        self.browser = self._playwright.chromium.launch(executable_path=executable, args=CHROMIUM_FLAGS)
        width, height = viewport
        self.context = self.browser.new_context(viewport={"width": width, "height": height},
                                                device_scale_factor=pixel_ratio)

    def close(self) -> None:
        self.context.close()
        self.browser.close()
        self._playwright.stop()

    def visit(self, url: str, allowed_origin: str | None, screenshot: Path | None = None) -> PageReport:
        """Open `url`, wait for MathJax and the widgets, and report what a reader would meet.
        allowed_origin: host:port that may be asked (None: only file:// and data: URLs)."""
        page = self.context.new_page()
        report = PageReport(page=url)

        def route(request_route) -> None:
            parts = urlparse(request_route.request.url)
            local = parts.scheme in ("data", "blob", "file") or (allowed_origin and parts.netloc == allowed_origin)
            if local:
                request_route.continue_()
            else:
                report.external.append(request_route.request.url)
                request_route.abort()

        page.route("**/*", route)
        page.on("console", lambda message: report.errors.append(message.text) if message.type == "error" else None)
        page.on("pageerror", lambda error: report.errors.append(f"uncaught: {error}"))
        # the console says only "404"; this names the address
        page.on("response", lambda response: report.errors.append(f"HTTP {response.status}: {response.url}")
                if response.status >= 400 else None)
        try:
            page.goto(url, wait_until="load", timeout=60_000)
            page.wait_for_function("window.MathJax && MathJax.startup && MathJax.startup.promise", timeout=30_000)
            page.evaluate("MathJax.startup.promise")
            views = page.locator('script[type="application/vnd.jupyter.widget-view+json"]').count()
            if views:
                page.wait_for_function(
                    "n => document.querySelectorAll('.widget-subarea .jupyter-widgets').length >= n",
                    arg=views, timeout=30_000, polling=200)
                page.evaluate("MathJax.startup.promise.then(() => MathJax.typesetPromise())")
            # a browser fetches a font only when some text needs it, which depends on timing;
            # ask for every declared one, so that a wrong font address fails every run
            page.evaluate(LOAD_EVERY_FONT)
            page.wait_for_function("() => Array.from(document.images).every(img => img.complete)",
                                   timeout=30_000, polling=200)
            report.formulas = page.locator("mjx-container").count()
            text = page.evaluate(VISIBLE_TEXT, SKIP_TEXT_INSIDE)
            report.raw_latex = page.evaluate(RAW_LATEX, text)
            widgets = page.evaluate(WIDGETS)
            report.widgets = len(widgets)
            report.widgets_rendered = sum(1 for w in widgets if w["rendered"] and w["height"] > 0 and w["controls"])
            report.unrendered_widgets = report.widgets - report.widgets_rendered
            report.images = page.evaluate("() => document.images.length")
            report.broken_images = page.evaluate(BROKEN_IMAGES)
            self._measure_fit(page, report)
            self._drive_demos(page, report)
            if screenshot is not None:
                screenshot.parent.mkdir(parents=True, exist_ok=True)
                target = page.locator(".widget-subarea").first
                if target.count():
                    target.scroll_into_view_if_needed()
                page.screenshot(path=str(screenshot))
            if report.widgets:      # last: it leaves the page in dark mode
                report.light_dark_mode_panels = page.evaluate(DARK_PANELS)
                if screenshot is not None:
                    page.screenshot(path=str(screenshot.with_name(screenshot.stem + "-dark.png")))
        except Exception as error:      # a page that hangs is a finding, not a crash of the test
            report.errors.append(f"{type(error).__name__}: {str(error).splitlines()[0]}")
        finally:
            page.close()
        return report

    @staticmethod
    def _measure_fit(page, report: PageReport) -> None:
        """What does not fit at this width (code, outputs, widget labels, the page itself), the
        size of the figures' text as shown, and the live-only controls a reader could still move."""
        fit = page.evaluate(TOO_WIDE)
        report.code_blocks, report.too_wide = fit["blocks"], fit["wide"]
        report.labels, report.cut_labels = fit["labels"], fit["cut"]
        report.shrunk_figures = fit["shrunk"]
        figures = page.evaluate(FIGURE_TEXT, SMALLEST_TEXT_KEY)
        report.body_text_px, report.figure_text = figures["body"], figures["figures"]
        report.frames = page.evaluate(FRAMES)
        overflow = page.evaluate(PAGE_OVERFLOW)
        report.page_overflow_px, report.page_overflow = overflow["over"], overflow["what"]
        report.column_px = overflow["column"]
        live = page.evaluate(LIVE_ONLY)
        report.live_only, report.movable_live_controls = live["count"], live["movable"]

    @staticmethod
    def _drive_demos(page, report: PageReport) -> None:
        """Move the first control of every precomputed demo (course/book_demo.py): the figure
        shown must change, with no kernel."""
        demos = page.locator(".widget-subarea:has(.course-frames)")
        report.demos = demos.count()
        for i in range(report.demos):
            demo = demos.nth(i)
            before = demo.evaluate(SHOWN_FIGURES)
            handle = demo.locator(".noUi-handle").first
            toggle = demo.locator(".widget-toggle-button:not(.mod-active)").first
            select = demo.locator("select").first
            if handle.count():        # one step, towards the side with room
                at_end = handle.get_attribute("aria-valuenow") == handle.get_attribute("aria-valuemax")
                handle.focus()
                page.keyboard.press("ArrowLeft" if at_end else "ArrowRight")
            elif toggle.count():
                toggle.click()
            elif select.count():
                current = select.evaluate("s => s.selectedIndex")
                count = select.locator("option").count()
                select.select_option(index=(current + 1) % max(count, 1))
            page.wait_for_timeout(300)
            after = demo.evaluate(SHOWN_FIGURES)
            if after and before and after != before:
                report.demos_that_change += 1


DESKTOP = ((1280, 800), 1)      # window (CSS px) and device pixels per CSS px
PHONE = ((390, 844), 3)


def visit_all(folder: Path, pages: list[str], executable: str, screenshots: dict[str, Path] | None = None,
              browsers: int | None = None, device: tuple = DESKTOP) -> dict[str, PageReport]:
    """page -> its report, for every page of ``pages`` (paths relative to ``folder``), visited
    by ``browsers`` Chromiums at once (default: one per core, at most two), each in a process
    with its own server, on a screen of ``device`` (DESKTOP or PHONE). One browser drives one
    tab at a time, and its page work runs mostly on one core: the other idled for the 80-110 s
    of the visits at the end of the suite."""
    count = max(1, min(browsers or min(2, len(os.sched_getaffinity(0))), len(pages)))
    chunks = [pages[i::count] for i in range(count)]
    if count == 1:
        found = _visit_pages(folder, pages, executable, screenshots or {}, device)
    else:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(count, mp_context=multiprocessing.get_context("spawn")) as pool:
            found = {}
            for part in pool.map(_visit_pages, [folder] * count, chunks, [executable] * count,
                                 [screenshots or {}] * count, [device] * count):
                found.update(part)
    return {page: found[page] for page in pages}


def _visit_pages(folder: Path, pages: list[str], executable: str, screenshots: dict[str, Path],
                 device: tuple = DESKTOP) -> dict[str, PageReport]:
    server, browser = Server(folder), Browser(executable, *device)
    try:
        return {page: browser.visit(server.url(page), server.origin, screenshots.get(page)) for page in pages}
    finally:
        browser.close()
        server.close()


def html_pages(folder: Path) -> list[str]:
    """Every page of the book, as paths relative to the built folder."""
    skip = {"genindex.html", "search.html", "py-modindex.html"}
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*.html")
                  if p.name not in skip and "_static" not in p.parts and "_sources" not in p.parts
                  and "_downloads" not in p.parts)


def main(argv: list[str]) -> int:
    folder = Path(argv[0])
    pages = argv[1:] or html_pages(folder)
    executable = chromium()
    if executable is None:
        print("no Chromium found (apt-get install chromium, or set COURSE_CHROMIUM)")
        return 2
    reports = visit_all(folder, pages, executable).values()
    for report in reports:
        print(json.dumps({k: v for k, v in report.__dict__.items() if v}, ensure_ascii=False))
    return 1 if any(r.problems() for r in reports) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
