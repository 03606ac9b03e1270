"""Difficulty labels that keep their promise (issue 28, item 4).

Each exercise's Difficulty dots equal the band of its measured work (tests/exercise_measure.py:
new solution lines plus the spec conditions its wrong answers check); warm-ups sit in the two
lowest bands; and the chapter's book page lists the same rungs and points as the notebook."""

from __future__ import annotations

import functools

import pytest

import exercise_measure as em
from exercise_measure import CHAPTERS, ROOT

WARM_UP = "Warm-up"


@functools.lru_cache(maxsize=1)
def _measured() -> dict[str, list[em.Exercise]]:
    return em.measure_chapters()


def _why(e: em.Exercise) -> str:
    return (f"{e.chapter} exercise {e.number}: labelled {em.dots(e.dots)}, measured {em.dots(e.band)} "
            f"({e.measure} = {e.lines} lines - {e.printed} printed - {e.earlier} written earlier "
            f"+ {e.conditions} conditions)")


def test_the_measure_counts_only_new_code_and_stated_bands():
    cell = ('def f(x):\n    """Given."""\n    ### BEGIN SOLUTION\n    """A docstring\n    on two lines."""\n'
            '    # a comment\n\n    y = x.float()  # why\n    z = y * 2\n    ### END SOLUTION\n'
            '    return z\n\n\nclass G:\n    def g(self):\n        ### BEGIN SOLUTION\n        return 1\n'
            '        ### END SOLUTION\n')
    assert em.solution_lines(cell) == ["y = x.float()", "z = y * 2", "return 1"]
    printed = em.printed_text(["```python\ny  =  x.float()\n```", "the hint: `return 1`."])
    assert [line for line in em.solution_lines(cell) if em._squeeze(line) in printed] == ["y = x.float()",
                                                                                           "return 1"]
    assert [em.band(m) for m in (0, 11, 12, 19, 20, 29, 30, 99)] == [1, 1, 2, 2, 3, 3, 4, 4]


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_every_exercise_has_a_label_and_a_measure(chapter):
    measured = {e.number: e for e in _measured()[chapter]}
    labelled = em.labels(em.notebook(chapter))
    assert sorted(labelled) == sorted(measured), (
        f"{chapter}: exercises with a Difficulty label {sorted(labelled)}, with an answer cell {sorted(measured)}")


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_difficulty_dots_match_the_measured_band(chapter):
    wrong = [_why(e) for e in _measured()[chapter] if e.dots != e.band]
    assert not wrong, ("\n".join(wrong) + "\nchange the label (or the exercise); the whole table: "
                       f".venv/bin/python tests/exercise_measure.py {chapter}")


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_warm_ups_sit_in_the_two_lowest_bands(chapter):
    heavy = [_why(e) for e in _measured()[chapter] if e.rung == WARM_UP and max(e.dots, e.band) > 2]
    assert not heavy, "a warm-up that needs this much work is a core exercise:\n" + "\n".join(heavy)


def _book_table(chapter: str) -> tuple[str, dict]:
    """(page, its rung table) from the chapter's exercises.md or index.md, whichever has one."""
    for page in ("exercises.md", "index.md"):
        path = ROOT / "book" / chapter / page
        found = em.rung_table(path.read_text(encoding="utf-8")) if path.exists() else {}
        if found:
            return f"book/{chapter}/{page}", found
    raise AssertionError(f"book/{chapter}: neither exercises.md nor index.md has a table of rungs and points")


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_the_book_table_agrees_with_the_notebook(chapter):
    page, book = _book_table(chapter)
    nb = em.notebook(chapter)
    ours = em.rung_table(nb.cells[0].source)
    assert sorted(book) == sorted(ours), f"{page} lists exercises {sorted(book)}, the notebook's table {sorted(ours)}"
    labelled = em.labels(nb)
    for n, (rung, points, dots) in book.items():
        assert (rung, points) == ours[n][:2], (
            f"{page}, exercise {n}: {rung}, {points} points; the notebook's table: {ours[n][0]}, {ours[n][1]} points")
        if dots is not None and n in labelled:
            assert dots == labelled[n][1], (
                f"{page}, exercise {n}: difficulty {em.dots(dots)}, the notebook's label {em.dots(labelled[n][1])}")
