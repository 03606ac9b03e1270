"""``exercises/`` from ``solutions/``: nbgrader's generate_assignment, wrapped."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from .book_pages import write_linked_pages
from .coursetree import CourseTree
from .settings import GradingSettings
from .translation import write_translated_releases


def generate_exercises(solutions_dir: Path, exercises_dir: Path,
                       translated: dict[str, Path] | None = None) -> list[str]:
    """Write one release folder per assignment under ``exercises_dir``; return their names.

    Folders in ``exercises_dir`` that no longer have a solution are removed, so the two
    trees always match. The book's pages that the notebooks link to are written beside the
    folders (:mod:`autograder.book_pages`). ``translated`` (language -> folder) also writes
    each release in that language, laid out the same way (:mod:`autograder.translation`).
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
    for language, folder in (translated or {}).items():
        write_translated_releases(Path(solutions_dir).parent, exercises_dir, language, folder, assignments)
        write_linked_pages(solutions_dir, folder)
    return assignments
