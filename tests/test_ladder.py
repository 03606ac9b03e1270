"""The chapters written as a ladder (README, "For authors") say so in their notebooks, and keep
its rules: warm-ups hold at most a quarter of the points, core exercises are the bulk, a chapter
after the first has a synthesis exercise, and each exercise's heading names the rung that the
notebook's table gives it, with the points its graded cells carry."""

from __future__ import annotations

import re

import nbformat
import pytest

from notebook_tools import ROOT

# The capstone is one project, not a ladder of exercises.
LADDER_CHAPTERS = ("ch01_embeddings", "ch02_positions", "ch03_attention", "ch04_ffn", "ch05_training",
                   "ch06_inference")
RUNGS = {"warm-up": "Warm-up", "core": "Core", "predict, then measure": "Predict, then measure",
         "synthesis": "Synthesis"}


def _notebook(assignment: str):
    return nbformat.read(ROOT / "solutions" / assignment / f"{assignment}.ipynb", as_version=4)


def _table(nb) -> dict[int, tuple[str, int]]:
    """{exercise: (rung, points)} from the first cell's table."""
    rows = re.findall(r"^\| (\d+) \| .+? \| ([a-z ,-]+) \| (\d+) \|$", nb.cells[0].source, flags=re.M)
    return {int(n): (rung, int(points)) for n, rung, points in rows}


def _headings_and_points(nb) -> dict[int, tuple[str, float]]:
    """{exercise: (rung named in its heading, points of its graded cells)}."""
    out, exercise = {}, None
    for cell in nb.cells:
        heading = re.match(r"## Exercise (\d+)", cell.source) if cell.cell_type == "markdown" else None
        if heading:
            exercise = int(heading.group(1))
            out[exercise] = ("", 0.0)
        if exercise is None:
            continue
        label = re.search(r"^> \*\*([A-Za-z ,-]+)\*\* · \*\*Difficulty", cell.source, flags=re.M)
        if cell.cell_type == "markdown" and label:
            out[exercise] = (label.group(1), out[exercise][1])
        points = cell.metadata.get("nbgrader", {}).get("points") if cell.metadata.get("nbgrader", {}).get("grade") else 0
        out[exercise] = (out[exercise][0], out[exercise][1] + float(points or 0))
    return out


@pytest.mark.parametrize("assignment", LADDER_CHAPTERS)
def test_a_ladder_chapter_keeps_the_rules(assignment):
    nb = _notebook(assignment)
    table = _table(nb)
    assert table, f"{assignment}: the first cell has no table with a rung column"
    assert {rung for rung, _ in table.values()} <= set(RUNGS), table
    total = sum(points for _, points in table.values())
    warm = sum(points for rung, points in table.values() if rung == "warm-up")
    core = sum(points for rung, points in table.values() if rung == "core")
    assert warm <= total / 4, f"{assignment}: warm-ups hold {warm} of {total} points, more than a quarter"
    assert core >= total / 2, f"{assignment}: core exercises hold {core} of {total} points, less than half"
    if assignment != LADDER_CHAPTERS[0]:
        assert "synthesis" in {rung for rung, _ in table.values()}, f"{assignment} has no synthesis exercise"
    headings = _headings_and_points(nb)
    assert sorted(headings) == sorted(table), (assignment, sorted(headings), sorted(table))
    for exercise, (rung, points) in table.items():
        named, graded = headings[exercise]
        assert named == RUNGS[rung], f"{assignment} exercise {exercise}: the heading says {named!r}, the table {rung!r}"
        assert graded == points, f"{assignment} exercise {exercise}: the table gives {points} points, its cells {graded}"
