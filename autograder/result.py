"""One graded submission as data, and the one place that writes it into ``--out``.

Every runner (the grading run's own process, a local worker, a Ray task) grades an entry in
a course tree of its own and hands back a :class:`GradeResult`: the row, each test cell's
score, the autograded files and the feedback pages. Only the grading run's process writes
results into its ``--out`` and its gradebook (:func:`record`), so no two processes ever
write the same file or the same database, and a row looks the same whoever graded it.
"""

from __future__ import annotations

import shutil
from contextlib import closing
from dataclasses import dataclass, field, replace
from pathlib import Path

from .rows import Found, GradeRow

WORK_DIR = ".grading-workers"     # in --out, while a run lasts: each runner's own tree, and what it holds


def copy_tree(source: Path, root: Path) -> None:
    """A runner's own course tree at ``root``: a copy of what the run's process generated at
    ``source`` (the released and source notebooks, the gradebook, the grading secret)."""
    import sqlite3

    from .coursetree import SECRET_FILE

    root.mkdir(parents=True, exist_ok=True)
    for step in ("source", "release"):
        if (source / step).is_dir():
            shutil.copytree(source / step, root / step, dirs_exist_ok=True)
    if (source / SECRET_FILE).is_file():
        shutil.copyfile(source / SECRET_FILE, root / SECRET_FILE)
        (root / SECRET_FILE).chmod(0o600)
    if (source / "gradebook.db").is_file():   # SQLite's own copy: the run's gradebook is in WAL mode
        with closing(sqlite3.connect(source / "gradebook.db")) as src, \
                closing(sqlite3.connect(root / "gradebook.db")) as dst:
            src.backup(dst)


@dataclass
class GradeResult:
    """What grading one entry leaves behind, as plain data (it travels between processes)."""

    row: GradeRow
    scores: dict[str, dict[str, float]] = field(default_factory=dict)   # notebook -> test cell -> points
    autograded: dict[str, bytes] = field(default_factory=dict)          # path under autograded/<sid>/<assignment>/
    feedback: dict[str, bytes] = field(default_factory=dict)            # path under the row's feedback folder
    scripts: bool = False       # the pages load the course's scripts (MathJax): put them beside


def failed(row: GradeRow) -> GradeResult:
    """The result of an entry no runner could grade (a worker that died, a cluster error):
    the row, and a page that says why."""
    from .feedback import render_plain

    page = render_plain(row.assignment or row.student, row.score, row.max_score, row.notes)
    return GradeResult(row, feedback={"feedback.html": page.encode("utf-8", "backslashreplace")})


def collect(grader, found: Found, sid: str | None, row: GradeRow) -> GradeResult:
    """The result of ``row``, read out of ``grader``'s own tree, which then keeps nothing of it."""
    from nbgrader.api import Gradebook, MissingEntry

    from .feedback import asset_files

    root = grader.course_root
    autograded = root / "autograded" / (sid or "") / found.assignment
    pages = grader._feedback_dir(row)
    scripts = set(asset_files())
    result = GradeResult(replace(row, feedback=[]))
    if sid and found.assignment and autograded.is_dir():
        result.autograded = _files(autograded)
        with Gradebook(grader.tree.db_url) as gb:
            try:
                for notebook in gb.find_submission(found.assignment, sid).notebooks:
                    result.scores[notebook.name] = {g.name: float(g.auto_score or 0) for g in notebook.grades}
            except MissingEntry:
                pass
    if pages.is_dir():
        every = _files(pages) if row.assignment else {n: b for n, b in _files(pages).items() if "/" not in n}
        result.feedback = {n: b for n, b in every.items() if n not in scripts}
        result.scripts = len(result.feedback) < len(every)
    for leftover in ([root / step / sid for step in ("submitted", "autograded", "feedback")] if sid else []) + [pages]:
        shutil.rmtree(leftover, ignore_errors=True)
    return result


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file() and not p.is_symlink()}


def record(grader, found: Found, sid: str | None, result: GradeResult) -> GradeRow:
    """Write ``result`` into ``grader``'s ``--out`` and gradebook (this process only); the row."""
    from .feedback import install_assets

    row = result.row
    if result.autograded:
        _write_inside(grader.course_root / "autograded" / sid / found.assignment, result.autograded, fresh=True)
    if result.scores:
        _record_scores(grader, found.assignment, sid, result.scores)
    dest = grader._feedback_dir(row)
    row.feedback = _write_inside(dest, result.feedback, fresh=bool(row.assignment))
    if result.scripts:
        install_assets(dest, grader.course_root / "feedback-static")
        if sid:      # nbgrader's own copy: an instructor's generate_feedback skips existing pages
            tree_copy = grader.course_root / "feedback" / sid / found.assignment
            _write_inside(tree_copy, result.feedback, fresh=True)
            install_assets(tree_copy, grader.course_root / "feedback-static")
    return row


def _write_inside(folder: Path, files: dict[str, bytes], fresh: bool) -> list[Path]:
    """Write ``files`` under ``folder`` (emptied first when ``fresh``), never outside it."""
    if fresh:
        shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, content in files.items():
        target = (folder / name).resolve()
        if folder.resolve() in target.parents:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(content)
            written.append(target)
    return written


def _record_scores(grader, assignment: str, sid: str, scores: dict[str, dict[str, float]]) -> None:
    from nbgrader.api import Gradebook

    with Gradebook(grader.tree.db_url) as gb:
        gb.update_or_create_student(sid)
        submission = gb.update_or_create_submission(assignment, sid)
        for notebook in submission.notebooks:
            for grade in notebook.grades:
                grade.auto_score = scores.get(notebook.name, {}).get(grade.name, 0.0)
                grade.needs_manual_grade = False
        gb.db.commit()
