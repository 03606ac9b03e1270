"""``exercises/`` from ``solutions/``: nbgrader's generate_assignment, wrapped."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from .book_pages import write_linked_pages
from .coursetree import CourseTree
from .settings import GradingSettings


def generate_exercises(solutions_dir: Path, exercises_dir: Path) -> list[str]:
    """Write one release folder per assignment under ``exercises_dir``; return their names.

    Folders in ``exercises_dir`` that no longer have a solution are removed, so the two
    trees always match. The book's pages that the notebooks link to are written beside the
    folders (:mod:`autograder.book_pages`).
    """
    exercises_dir = Path(exercises_dir)
    with tempfile.TemporaryDirectory(prefix="course-generate-") as tmp:
        tree = CourseTree(Path(tmp), solutions_dir, GradingSettings.from_env(), grading=False)
        assignments = tree.assignments()
        exercises_dir.mkdir(parents=True, exist_ok=True)
        for stale in exercises_dir.iterdir():
            if stale.is_dir() and stale.name not in assignments:
                shutil.rmtree(stale)
        for assignment in assignments:
            release = tree.generate(assignment)
            target = exercises_dir / assignment
            if target.exists():
                shutil.rmtree(target)
            shutil.copytree(release, target)
    write_linked_pages(solutions_dir, exercises_dir)    # the book's pages they link to, beside them
    return assignments
