"""Run at the start of every kernel that executes a page of the book (its PYTHONSTARTUP:
book/_ext/local_kernels.py for the build, book/_ext/live.py for `make live`):

- one text size for the course's figures, TEXT_POINTS, titles included (matplotlib's "large"
  titles made long titles wider than a figure that fits the column), unless a page asks for
  a larger one: at the inline backend's 100 dots per inch, 12 points are 16.7 px, and the
  book's body text is 16 px (tests/test_book_browser.py measures both). A figure then fits
  the 688 px column at 1280 px, unshrunk, when it is at most about 6.6 inches wide;
- every PNG a figure is saved as (the inline figures, and the frames of course/book_demo.py)
  records in a tEXt chunk, SMALLEST_TEXT_KEY, the font size of the smallest text drawn in it,
  in pixels of that PNG, so that the browser test can compare it, times the scale the page
  shows the image at, with the body text.

Nothing here is needed to run a page's code: a page run elsewhere draws the same figures with
matplotlib's 10-point default and no tEXt chunk. A change here re-executes every page in the
tests' build (tests/book_build.py keys its cache on book/_ext); `make book` keeps its executed
pages until _build/.jupyter_cache is deleted.
"""

TEXT_POINTS = 12
SMALLEST_TEXT_KEY = "course-smallest-text-px"


def _install(points: float, key: str) -> None:
    import functools
    import math

    import matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg, RendererAgg

    matplotlib.rcParams.update({"font.size": points, "axes.titlesize": "medium",
                                "figure.titlesize": "medium"})
    draw_text = RendererAgg.draw_text

    @functools.wraps(draw_text)
    def recording_draw_text(self, gc, x, y, s, prop, angle, ismath=False, mtext=None):
        if s.strip():       # an empty label draws nothing
            px = prop.get_size_in_points() * self.dpi / 72
            self.course_smallest_text_px = min(getattr(self, "course_smallest_text_px", math.inf), px)
        return draw_text(self, gc, x, y, s, prop, angle, ismath=ismath, mtext=mtext)

    # wraps: savefig passes its optional arguments only to matplotlib's own print methods
    @functools.wraps(FigureCanvasAgg.print_png)
    def print_png(self, filename_or_obj, *, metadata=None, pil_kwargs=None):
        # FigureCanvasAgg.print_png (draw, then imsave), the smallest text added to the metadata
        self.get_renderer().course_smallest_text_px = math.inf
        FigureCanvasAgg.draw(self)
        smallest = self.get_renderer().course_smallest_text_px
        stamp = {key: "none" if smallest == math.inf else f"{smallest:.2f}"}
        matplotlib.image.imsave(filename_or_obj, self.buffer_rgba(), format="png", origin="upper",
                                dpi=self.figure.dpi, metadata={**(metadata or {}), **stamp},
                                pil_kwargs=pil_kwargs)

    RendererAgg.draw_text = recording_draw_text
    FigureCanvasAgg.print_png = print_png


def _quiet_shutdown_race() -> None:
    """ipykernel 7, asked to stop, may still publish its "idle" status after its I/O thread has
    closed its sockets: tornado then logs "ERROR ... ZMQError: Socket operation on non-socket"
    for a kernel that is stopping anyway (seen once in three fresh-clone test runs). That one
    error, and nothing else, is left out of the kernel's log."""
    import logging

    def keep(record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        return not (type(error).__name__ == "ZMQError" and "non-socket" in str(error))

    logging.getLogger("tornado.general").addFilter(keep)


if __name__ == "__main__":      # a kernel's startup file: it leaves no name in the page's namespace
    _install(TEXT_POINTS, SMALLEST_TEXT_KEY)
    try:
        _quiet_shutdown_race()
    except Exception:  # noqa: BLE001 - a quieter log is never worth a page that does not run
        pass
    del _install, _quiet_shutdown_race, TEXT_POINTS, SMALLEST_TEXT_KEY
