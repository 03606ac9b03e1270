"""Demos that work in the static book: every figure is drawn while the page is built, and
the controls pick among them in the browser (no kernel needed).

    demo = frames(draw, d_k=[4, 16, 64], scaled=[True, False])

draws `draw(d_k=..., scaled=...)` for every combination, shows the controls, and links them
to nested `Stack` widgets on the page's side (`jslink`), so that moving a control shows
another precomputed figure, in the built HTML as in JupyterLab. Keep the combinations few:
each is a figure in the page.
"""

from __future__ import annotations

import io
import itertools
from typing import Any, Callable

import ipywidgets as widgets
import matplotlib.pyplot as plt

MAX_FRAMES = 48
FRAME_DPI = 80


def _png(figure) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=FRAME_DPI, bbox_inches="tight")
    plt.close(figure)
    return buffer.getvalue()


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
        return widgets.Image(value=_png(draw(**fixed)), format="png")
    name, rest = names[0], names[1:]
    children = [_stack(draw, rest, choices, {**fixed, name: value}, controls) for value in choices[name]]
    stack = widgets.Stack(children=children, selected_index=0)
    stack.add_class("course-frames")     # the book's browser test finds the demos by it
    widgets.jslink((controls[name], "index"), (stack, "selected_index"))
    return stack


def frames(draw: Callable[..., Any], **choices: list) -> widgets.VBox:
    """Controls over `choices` and the figure `draw(**values)` returns for each combination.

    draw: returns a matplotlib Figure (it is closed after being drawn into the page).
    choices: control name -> the values it offers (the first is shown first).
    """
    count = 1
    for name, values in choices.items():
        if not values:
            raise ValueError(f"control {name!r} offers no values")
        count *= len(values)
    if count > MAX_FRAMES:
        raise ValueError(f"{count} figures to precompute (at most {MAX_FRAMES}): offer fewer values")
    controls = {name: _control(name, list(values)) for name, values in choices.items()}
    figure = _stack(draw, list(choices), {k: list(v) for k, v in choices.items()}, {}, controls)
    demo = widgets.VBox([*controls.values(), figure])
    demo.add_class("course-demo")
    return demo


def combinations(**choices: list) -> list[dict]:
    """Every combination `frames` draws, in its order (for tests and timing)."""
    names = list(choices)
    return [dict(zip(names, values)) for values in itertools.product(*choices.values())]
