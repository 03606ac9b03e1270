"""Grade a folder of submissions: nbgrader autograde, the gradebook, a CSV and feedback.

Layout of the submissions folder::

    <submissions>/<student>/<assignment>/<notebook>.ipynb

A folder laid out like ``solutions/`` or ``exercises/`` (``<assignment>/<notebook>.ipynb``)
is graded as one student named after the folder.
"""

from __future__ import annotations

import csv
import html
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from nbgrader.api import Gradebook, MissingEntry
from tqdm.auto import tqdm

from .coursetree import CourseTree
from .settings import GradingSettings
from .submission import inspect_submission, restore_deleted_cells

CSV_COLUMNS = ["student", "assignment", "score", "max_score", "status", "notes"]


@dataclass
class GradeRow:
    """One student's result on one assignment."""

    student: str
    assignment: str
    score: float
    max_score: float
    status: str = "graded"          # graded | broken (scored zero, see notes)
    notes: list[str] = field(default_factory=list)
    feedback: list[Path] = field(default_factory=list)

    def csv_row(self) -> dict[str, object]:
        return {"student": self.student, "assignment": self.assignment,
                "score": f"{self.score:g}", "max_score": f"{self.max_score:g}",
                "status": self.status, "notes": "; ".join(self.notes)}


def find_submissions(folder: Path, assignments: list[str]) -> list[tuple[str, str, Path]]:
    """(student, assignment, folder) for every submission under ``folder``."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"No submissions folder at {folder}")
    if any((folder / a).is_dir() for a in assignments):   # a solutions/ or exercises/ tree
        return [(folder.resolve().name, a, folder / a) for a in assignments if (folder / a).is_dir()]
    found = []
    for student_dir in sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".")):
        for assignment_dir in sorted(p for p in student_dir.iterdir() if p.is_dir()):
            if assignment_dir.name in assignments:
                found.append((student_dir.name, assignment_dir.name, assignment_dir))
    return found


class Grader:
    """Grades submissions into ``out``: ``gradebook.db``, ``grades.csv``, ``feedback/``."""

    def __init__(self, solutions_dir: Path, out: Path, settings: GradingSettings):
        self.out = Path(out)
        self.course_root = self.out / "nbgrader"
        if self.course_root.exists():   # a fresh gradebook each run: same input, same output
            shutil.rmtree(self.course_root)
        self.course_root.mkdir(parents=True)
        self.tree = CourseTree(self.course_root, solutions_dir, settings)
        self.assignments = self.tree.assignments()
        for assignment in self.assignments:
            self.tree.generate(assignment)

    def max_score(self, assignment: str) -> float:
        with Gradebook(self.tree.db_url) as gb:
            return float(gb.find_assignment(assignment).max_score)

    def grade_all(self, submissions: Path, show_progress: bool = True) -> list[GradeRow]:
        todo = find_submissions(submissions, self.assignments)
        if not todo:
            raise FileNotFoundError(
                f"No submissions under {submissions}: expected <student>/<assignment>/<notebook>.ipynb "
                f"with assignments {', '.join(self.assignments)}")
        rows = []
        bar = tqdm(todo, desc="grading", unit="submission", disable=not show_progress)
        tqdm.write(f"{'student':<24} {'assignment':<22} {'score':>7} {'max':>5}  status")
        for student, assignment, folder in bar:
            bar.set_postfix_str(f"{student}/{assignment}")
            row = self.grade_one(student, assignment, folder)
            rows.append(row)
            tqdm.write(f"{student:<24} {assignment:<22} {row.score:>7g} {row.max_score:>5g}  {row.status}"
                       + (f"  ({'; '.join(row.notes)})" if row.notes else ""))
        self.write_csv(rows)
        return rows

    def grade_one(self, student: str, assignment: str, folder: Path) -> GradeRow:
        row = GradeRow(student, assignment, 0.0, self.max_score(assignment))
        submitted = self.course_root / "submitted" / student / assignment
        if submitted.exists():
            shutil.rmtree(submitted)
        submitted.mkdir(parents=True)
        gradable = []
        for notebook in self.tree.notebooks(assignment):
            source = Path(folder) / f"{notebook}.ipynb"
            found = inspect_submission(source, self.tree.release_path(assignment, notebook))
            if not found.readable:
                row.notes.append(f"{notebook}: {found.problem}")
                continue
            row.notes.extend(f"{notebook}: {n}" for n in found.notes())
            shutil.copy(source, submitted / source.name)
            restore_deleted_cells(submitted / source.name, self.tree.release_path(assignment, notebook),
                                  found.deleted_cells)
            gradable.append(notebook)
        if not gradable:
            row.status = "broken"
            self._write_plain_feedback(row)
            return row

        result = self.tree.api.autograde(assignment, student, force=True, create=True)
        if not result.get("success"):
            row.status = "broken"
            row.notes.append("nbgrader could not grade it: " + _last_line(result.get("error") or result.get("log")))
            self._write_plain_feedback(row)
            return row
        self._read_scores(row)
        self._note_crashes(row, gradable)
        if len(gradable) < len(self.tree.notebooks(assignment)):
            row.status = "broken"
        self._write_feedback(row)
        return row

    def _read_scores(self, row: GradeRow) -> None:
        with Gradebook(self.tree.db_url) as gb:
            try:
                submission = gb.find_submission(row.assignment, row.student)
            except MissingEntry:
                return
            row.score = float(submission.score)

    def _note_crashes(self, row: GradeRow, notebooks: list[str]) -> None:
        """Record kernel deaths and time-outs found in the autograded notebooks."""
        import nbformat

        for notebook in notebooks:
            path = self.course_root / "autograded" / row.student / row.assignment / f"{notebook}.ipynb"
            if not path.exists():
                continue
            nb = nbformat.read(path, as_version=4)
            for cell in nb.cells:
                for output in cell.get("outputs", []):
                    if output.get("output_type") != "error":
                        continue
                    if output.ename == "KernelDied":
                        row.notes.append(f"{notebook}: {output.evalue}; later cells scored zero")
                    elif output.ename == "CellTimeoutError":
                        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id", "a cell")
                        row.notes.append(f"{notebook}: {grade_id} ran past the time limit and was stopped")

    def _write_feedback(self, row: GradeRow) -> None:
        result = self.tree.api.generate_feedback(row.assignment, row.student, force=True)
        src = self.course_root / "feedback" / row.student / row.assignment
        dest = self.out / "feedback" / row.student / row.assignment
        if dest.exists():
            shutil.rmtree(dest)
        if not result.get("success") or not src.is_dir():
            row.notes.append("feedback could not be generated: " + _last_line(result.get("error")))
            self._write_plain_feedback(row)
            return
        shutil.copytree(src, dest)
        for page in sorted(dest.glob("*.html")):
            if row.notes:
                _insert_notes(page, row.notes)
            row.feedback.append(page)

    def _write_plain_feedback(self, row: GradeRow) -> None:
        dest = self.out / "feedback" / row.student / row.assignment
        dest.mkdir(parents=True, exist_ok=True)
        page = dest / "feedback.html"
        items = "".join(f"<li>{html.escape(n)}</li>" for n in row.notes)
        page.write_text(
            f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(row.assignment)}</title>"
            f"</head><body><h1>{html.escape(row.assignment)}: {row.score:g} / {row.max_score:g}</h1>"
            f"<p>This submission could not be graded, so it scored zero:</p><ul>{items}</ul></body></html>",
            encoding="utf-8")
        row.feedback.append(page)

    def write_csv(self, rows: list[GradeRow]) -> Path:
        path = self.out / "grades.csv"
        with open(path, "w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
            writer.writeheader()
            for row in rows:
                writer.writerow(row.csv_row())
        return path


def _last_line(text: str | None) -> str:
    lines = [ln.strip() for ln in (text or "").strip().splitlines() if ln.strip()]
    return lines[-1][:300] if lines else "no details"


def _insert_notes(page: Path, notes: list[str]) -> None:
    """Put the grader's notes at the top of an nbgrader feedback page."""
    items = "".join(f"<li>{html.escape(n)}</li>" for n in notes)
    banner = ("<div class='course-grading-notes' style='border:2px solid #c60;padding:0.5em 1em;margin:1em'>"
              f"<strong>Notes from the grader</strong><ul>{items}</ul></div>")
    text = page.read_text(encoding="utf-8")
    at = text.find("<body")
    at = text.find(">", at) + 1 if at >= 0 else 0
    page.write_text(text[:at] + banner + text[at:], encoding="utf-8")


def grade_folder(submissions: Path, out: Path, solutions_dir: Path, settings: GradingSettings,
                 show_progress: bool = True) -> list[GradeRow]:
    """Grade every submission under ``submissions``; write ``out/grades.csv`` and feedback."""
    grader = Grader(solutions_dir, out, settings)
    return grader.grade_all(submissions, show_progress=show_progress)
