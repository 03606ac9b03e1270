"""What a demo frame's resolution costs: bytes and drawing time of a PNG frame at the old and
the current FRAME_DPI (course/book_demo.py), for the two kinds of figure the book's demos draw
(curves with a legend; a heat map), as a table with the ratio to 150 dpi in the same run.

    .venv/bin/python benchmarks/frame_resolution.py
"""

from __future__ import annotations

import io
import time

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from course.book_demo import FRAME_DPI  # noqa: E402

REPEATS = 5


def curves() -> plt.Figure:
    figure, (left, right) = plt.subplots(1, 2, figsize=(8, 3.2))
    x = np.linspace(0, 10, 400)
    for k in range(5):
        left.plot(x, np.sin(x * (k + 1) / 3), label=f"pair {k}")
    left.legend()
    left.set_title("angle by position")
    right.plot(x, np.cos(x))
    return figure


def heat_map() -> plt.Figure:
    figure, (left, right) = plt.subplots(1, 2, figsize=(8, 3.2))
    rng = np.random.default_rng(0)
    left.imshow(rng.random((32, 32)))
    right.imshow(np.tril(rng.random((64, 64))))
    return figure


def measure(figure: plt.Figure, dpi: int) -> tuple[int, float]:
    """(bytes, milliseconds) of one frame saved as the demos save theirs."""
    start = time.perf_counter()
    for _ in range(REPEATS):
        buffer = io.BytesIO()
        figure.savefig(buffer, format="png", dpi=dpi, bbox_inches="tight")
    return len(buffer.getvalue()), (time.perf_counter() - start) / REPEATS * 1000


def main() -> None:
    print(f"{'figure':<10} {'dpi':>4} {'KB':>7} {'x bytes':>8} {'ms':>6} {'x time':>7}")
    for name, make in (("curves", curves), ("heat map", heat_map)):
        figure = make()
        measure(figure, 150)                      # a first save warms up the renderer
        base_bytes, base_ms = measure(figure, 150)
        for dpi in sorted({150, FRAME_DPI}):
            size, ms = measure(figure, dpi)
            print(f"{name:<10} {dpi:>4} {size / 1024:>7.0f} {size / base_bytes:>8.2f} {ms:>6.0f} {ms / base_ms:>7.2f}")
        plt.close(figure)


if __name__ == "__main__":
    main()
