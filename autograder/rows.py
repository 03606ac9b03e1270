"""What grading is about: an entry of the submissions folder, and the row it gets.

Shared by the grader (:mod:`autograder.grade`) and the runners that grade in other processes
(:mod:`autograder.workers`, :mod:`autograder.cluster`), which therefore need nothing of the
grader's module: it hands them its class to build one where they run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .runlog import row_key


@dataclass
class GradeRow:
    """One student's result on one assignment."""

    student: str
    assignment: str
    score: float
    max_score: float
    status: str = "graded"          # graded | broken | refused | skipped (see the module docstring)
    notes: list[str] = field(default_factory=list)
    feedback: list[Path] = field(default_factory=list)

    def csv_row(self) -> dict[str, object]:
        return {"student": self.student, "assignment": self.assignment,
                "score": f"{self.score:g}", "max_score": f"{self.max_score:g}",
                "status": self.status, "notes": "; ".join(self.notes)}

    @classmethod
    def from_csv(cls, row: dict) -> "GradeRow":
        return cls(row["student"], row["assignment"], float(row["score"]), float(row["max_score"]),
                   row["status"], [row["notes"]] if row["notes"] else [])


@dataclass
class Found:
    """An entry of the submissions folder: a submission to grade, or a row to report as is."""

    student: str
    assignment: str
    folder: Path | None = None
    status: str = ""                # "" to grade; else skipped | refused
    reason: str = ""

    @property
    def key(self) -> tuple[str, str]:
        """The row's key in this run and the next (a non-UTF-8 name as grades.csv stores it)."""
        return row_key(self.student, self.assignment)
