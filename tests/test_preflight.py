"""A broken grader never grades (issue 31): before the first student, the notebooks' set-up
cells run in a real sandbox; when they fail there, or in a student's kernel before any of the
student's code ran, the run stops with one message and exit status 2, and no row is `graded`.

Both cases are real: a second checkout (graded with this environment) whose course lacks a
folder its set-up cells import, and a course whose set-up cell needs more time than the cell
limit."""

from __future__ import annotations

import csv
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from notebook_tools import ROOT, grade_id, solution_answers, student_notebook, write_notebook

A = "ch01_embeddings"
NB = f"{A}.ipynb"


def grade(submissions: Path, out: Path, cwd: Path, *extra: str, timeout: int = 20) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "autograder", *extra, "grade", str(submissions), "--out", str(out),
                           "--timeout", str(timeout), "--profile", "smoke", "--no-progress", "--workers", "1"],
                          cwd=cwd, capture_output=True, text=True, timeout=600)


def graded_rows(out: Path) -> list[dict]:
    if not (out / "grades.csv").exists():
        return []
    with open(out / "grades.csv", newline="", encoding="utf-8") as f:
        return [row for row in csv.DictReader(f) if row["status"] == "graded"]


def one_plain_submission(root: Path) -> Path:
    write_notebook(student_notebook(A, solution_answers(A)), root / "amy" / A / NB)
    return root


@pytest.mark.slow
def test_a_second_checkout_whose_course_lacks_a_folder_grades_nobody(tmp_path):
    """A second checkout, graded with this environment, whose ``course/`` lacks ``data/`` (a
    sparse checkout, a copy that missed a folder): the grader starts, its kernels cannot run
    the set-up cell, and an earlier run's results in --out are kept."""
    second = tmp_path / "second"
    skip = shutil.ignore_patterns("__pycache__", ".ipynb_checkpoints")
    for name in ("course", "autograder", "solutions"):
        shutil.copytree(ROOT / name, second / name, ignore=skip)
    shutil.rmtree(second / "course" / "data")
    shutil.copy(ROOT / "_config.yml", second / "_config.yml")
    out = tmp_path / "out"
    (out / "feedback" / "earlier").mkdir(parents=True)
    (out / "grades.csv").write_text("student,assignment,score,max_score,status,notes\r\n"
                                    "earlier,ch01_embeddings,22,22,graded,\r\n", encoding="utf-8")
    done = grade(one_plain_submission(tmp_path / "submissions"), out, second)
    assert done.returncode == 2, done.stdout + done.stderr
    message = done.stderr.strip()
    assert message.startswith("error: the grader is broken, not the submissions: in the grader's preflight, "
                              f"the set-up cell of {A}/{A} failed in a sandboxed kernel"), message
    assert "No module named 'course.data'" in message and len(message.splitlines()) == 1, message
    assert f"The kernels run the course at {second / 'course'}." in message, message
    assert [r["student"] for r in graded_rows(out)] == ["earlier"]      # nothing graded, nothing replaced
    assert (out / "feedback" / "earlier").is_dir()


@pytest.mark.slow
def test_a_set_up_cell_failing_in_a_students_kernel_stops_the_run(tmp_path):
    """The preflight passes (its limit is generous) but every kernel's set-up cell runs past the
    1 s cell limit: the first student's kernel shows it, and the run stops there."""
    course = tmp_path / "course"
    shutil.copytree(ROOT / "solutions" / A, course / "solutions" / A)
    shutil.copy(ROOT / "_config.yml", course / "_config.yml")
    path = course / "solutions" / A / NB
    nb = nbformat.read(path, as_version=4)
    setup = next(cell for cell in nb.cells if grade_id(cell) == "setup")
    setup.source = "import time\ntime.sleep(3)\n" + setup.source            # slower than the 1 s limit
    nbformat.write(nb, path)
    out = tmp_path / "out"
    done = grade(one_plain_submission(tmp_path / "submissions"), out, ROOT, "--root", str(course), timeout=1)
    assert done.returncode == 2, done.stdout + done.stderr
    message = done.stderr.strip()
    assert message.startswith(f"error: the grader is broken, not the submissions: the set-up cell of {A}/{A} "
                              f"failed in the sandboxed kernel of amy before any of the student's code ran"), message
    assert "CellTimeoutError" in message and "raise --timeout" in message, message
    assert graded_rows(out) == []
