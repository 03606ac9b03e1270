"""Build student submissions from the solution notebooks, for grading tests.

A "student" notebook is the released exercise with its answer cells filled in from the
solution (markers removed), optionally with one answer mutated into a common mistake.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import nbformat

from autograder.extract import strip_markers

ROOT = Path(__file__).resolve().parents[1]



def grade_id(cell) -> str | None:
    return cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")


@functools.cache
def solution_notebook(assignment: str):
    """The solution notebook, read once per test process: callers only read it (copy it to change it)."""
    return nbformat.read(ROOT / "solutions" / assignment / f"{assignment}.ipynb", as_version=4)


def solution_answers(assignment: str) -> dict[str, str]:
    """grade_id -> answer code (markers stripped) for every answer cell of the solution (a new
    dict each time: callers change theirs)."""
    return {grade_id(c): strip_markers(c.source) for c in solution_notebook(assignment).cells
            if c.get("metadata", {}).get("nbgrader", {}).get("solution")}


def release_notebook(assignment: str):
    return nbformat.read(ROOT / "exercises" / assignment / f"{assignment}.ipynb", as_version=4)


def student_notebook(assignment: str, answers: dict[str, str]):
    """The released notebook with answer cells replaced by ``answers``."""
    nb = release_notebook(assignment)
    for cell in nb.cells:
        if grade_id(cell) in answers:
            cell.source = answers[grade_id(cell)]
    return nb


@dataclass(frozen=True)
class Mistake:
    """A realistic wrong answer: replace ``old`` by ``new`` in one answer cell."""

    name: str
    cell: str
    old: str
    new: str
    failing: tuple[str, ...]   # test cells that must score zero
    hint: str                  # words from the hint this mistake must get
    e2e: bool = True           # also graded through the real autograder (see tests/test_grading_e2e.py)

    def apply(self, answers: dict[str, str]) -> dict[str, str]:
        source = answers[self.cell]
        if self.old not in source:
            raise AssertionError(f"mistake {self.name!r}: {self.old!r} is not in {self.cell}; update the case")
        return {**answers, self.cell: source.replace(self.old, self.new, 1)}


@dataclass(frozen=True)
class TwoMistakes(Mistake):
    """A wrong answer in two cells: ``old2`` replaced by ``new2`` in ``cell2`` as well."""

    cell2: str = ""
    old2: str = ""
    new2: str = ""

    def apply(self, answers: dict[str, str]) -> dict[str, str]:
        answers = super().apply(answers)
        return Mistake(self.name, self.cell2, self.old2, self.new2, self.failing, self.hint).apply(answers)


def write_notebook(nb, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)
    return path
