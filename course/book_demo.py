"""Demos that work in the static book: every figure is drawn while the page is built, and
the controls pick among them in the browser (no kernel needed).

    demo = frames(draw, d_k=[4, 16, 64], scaled=[True, False], start={"d_k": 64})

draws `draw(d_k=..., scaled=...)` for every combination, shows the controls, and links them
to nested `Stack` widgets on the page's side (`jslink`), so that moving a control shows
another precomputed figure, in the built HTML as in JupyterLab. `draw` may return its
figure or end with `plt.show()` (then the current figure is taken); what it prints is shown
under the figure. Keep the combinations few: each is a figure in the page.
"""

from __future__ import annotations

import contextlib
import html
import io
import struct
from typing import Any, Callable

import ipywidgets as widgets
import matplotlib.pyplot as plt

MAX_FRAMES = 48
# Drawn at 300 dots per inch and shown at 100 CSS pixels per inch (the column caps wider ones):
# 3 image pixels per CSS pixel, sharp on a phone's 3x screen, and a 10-point label is 14 px, near
# the 16 px body text. (At 80 dpi shown 1:1 a 7-point legend was 8 px and blurred on a phone; at
# 150 dpi a frame had 1.5 pixels for a 3x screen's 3. A frame at 300 dpi is about twice the bytes
# of one at 150: benchmarks/frame_resolution.py.)
FRAME_DPI = 300
SHOWN_PPI = 100


def _frame(draw: Callable[..., Any], values: dict) -> widgets.Widget:
    """One combination drawn into an Image (and what it printed, below it)."""
    printed = io.StringIO()
    show = plt.show
    plt.show = lambda *args, **kwargs: None      # keep the figure: the frame is its picture
    try:
        with contextlib.redirect_stdout(printed):
            figure = draw(**values)
        if not isinstance(figure, plt.Figure):
            figure = plt.gcf()
        buffer = io.BytesIO()
        figure.savefig(buffer, format="png", dpi=FRAME_DPI, bbox_inches="tight")
    finally:
        plt.show = show
        plt.close("all")
    image = widgets.Image(value=buffer.getvalue(), format="png", layout=_shown_size(buffer.getvalue()))
    if not printed.getvalue().strip():
        return image
    text = widgets.HTML(f"<pre>{html.escape(printed.getvalue().rstrip())}</pre>")
    return widgets.VBox([image, text])


def _shown_size(png: bytes) -> widgets.Layout:
    """The frame at SHOWN_PPI pixels per inch of figure, never wider than the column."""
    width = struct.unpack(">I", png[16:20])[0]          # the PNG header's IHDR width
    return widgets.Layout(width=f"{round(width * SHOWN_PPI / FRAME_DPI)}px", max_width="100%", height="auto")


def _control(name: str, values: list) -> widgets.Widget:
    labels = [str(v) for v in values]
    if all(isinstance(v, bool) for v in values):
        return widgets.ToggleButtons(options=labels, description=name)
    if all(isinstance(v, (int, float)) for v in values):
        return widgets.SelectionSlider(options=labels, description=name)
    return widgets.Dropdown(options=labels, description=name)


def _stack(draw: Callable[..., Any], names: list[str], choices: dict[str, list], fixed: dict,
           controls: dict[str, widgets.Widget]) -> widgets.Widget:
    """A Stack over the first control's values, each child the stack of the rest."""
    if not names:
        return _frame(draw, fixed)
    name, rest = names[0], names[1:]
    children = [_stack(draw, rest, choices, {**fixed, name: value}, controls) for value in choices[name]]
    stack = widgets.Stack(children=children, selected_index=controls[name].index)
    stack.add_class("course-frames")     # the book's browser test finds the demos by it
    widgets.jslink((controls[name], "index"), (stack, "selected_index"))
    return stack


def frames(draw: Callable[..., Any], start: dict | None = None, **choices: list) -> widgets.VBox:
    """Controls over `choices` and the figure `draw(**values)` makes for each combination.

    draw: returns a matplotlib Figure, or draws one and calls plt.show().
    start: the values shown first (default: the first of each list).
    choices: control name -> the values it offers.
    """
    start = start or {}
    count = 1
    for name, values in choices.items():
        if not values:
            raise ValueError(f"control {name!r} offers no values")
        count *= len(values)
    if count > MAX_FRAMES:
        raise ValueError(f"{count} figures to precompute (at most {MAX_FRAMES}): offer fewer values")
    controls = {name: _control(name, list(values)) for name, values in choices.items()}
    for name, value in start.items():
        controls[name].index = list(choices[name]).index(value)
    figure = _stack(draw, list(choices), {k: list(v) for k, v in choices.items()}, {}, controls)
    demo = widgets.VBox([*controls.values(), figure])
    demo.add_class("course-demo")
    return demo

