"""End to end: the real autograder (nbgrader, real kernels, a real gradebook) on real
submissions, through the documented command ``python -m autograder grade``."""

from __future__ import annotations

import html as html_lib
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from grading_tools import rows_of, run_grade
from mistakes import assignments, e2e_mistakes, mistakes_for
from notebook_tools import ROOT, grade_id, solution_answers, student_notebook, write_notebook

pytestmark = pytest.mark.slow
ASSIGNMENT = "ch01_embeddings"
NOTEBOOK = f"{ASSIGNMENT}.ipynb"
CELL_TIMEOUT = 20


def grade(submissions: Path, out: Path, workers: int = 2) -> dict[tuple[str, str], dict]:
    """Run the grading CLI; return grades.csv rows keyed by (student, assignment)."""
    run_grade(submissions, out, workers=workers, timeout=CELL_TIMEOUT)
    return {(row["student"], row["assignment"]): row for row in rows_of(out)}


def autograded(out: Path, student: str, assignment: str = ASSIGNMENT):
    return nbformat.read(out / "nbgrader" / "autograded" / student / assignment / f"{assignment}.ipynb", as_version=4)


def feedback_html(out: Path, student: str, assignment: str = ASSIGNMENT) -> str:
    pages = sorted((out / "feedback" / student / assignment).glob("*.html"))
    assert pages, f"no feedback for {student}"
    return "\n".join(p.read_text(encoding="utf-8") for p in pages)


def cell_scores(out: Path, student: str, assignment: str = ASSIGNMENT) -> dict[str, float]:
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{out / 'nbgrader' / 'gradebook.db'}") as gb:
        sub = gb.find_submission_notebook(assignment, assignment, student)
        return {g.name: float(g.score) for g in sub.grades}


# ------------------------------------------------------------------ the reference trees

@pytest.fixture(scope="module")
def graded_all(tmp_path_factory):
    """One grading run (two workers) over everything this module checks: the solutions and
    the untouched exercises as two students, one mistake per assignment, and the bad
    submissions."""
    import shutil

    root = tmp_path_factory.mktemp("submissions")
    for tree in ("solutions", "exercises"):
        shutil.copytree(ROOT / tree, root / tree, ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__"))
    for assignment, mistake in ALL_MISTAKES:
        nb = student_notebook(assignment, mistake.apply(solution_answers(assignment)))
        write_notebook(nb, root / _student(assignment, mistake) / assignment / f"{assignment}.ipynb")
    _bad_submissions(root, solution_answers(ASSIGNMENT))
    out = tmp_path_factory.mktemp("graded")
    return grade(root, out), out


@pytest.fixture(scope="module")
def reference_grades(graded_all):
    rows, out = graded_all
    return {"solutions": (rows, out), "exercises": (rows, out)}


@pytest.mark.parametrize("assignment", assignments())
def test_solutions_score_full_marks(reference_grades, assignment):
    rows, out = reference_grades["solutions"]
    row = rows[("solutions", assignment)]
    assert float(row["score"]) == float(row["max_score"]) > 0, row
    assert row["notes"] == "", row


@pytest.mark.parametrize("assignment", assignments())
def test_untouched_exercises_score_zero_failing_only_with_not_implemented(reference_grades, assignment):
    rows, out = reference_grades["exercises"]
    assert float(rows[("exercises", assignment)]["score"]) == 0
    nb = autograded(out, "exercises", assignment)
    graded = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade")]
    assert graded
    for cell in graded:
        errors = [o for o in cell.outputs if o.output_type == "error"]
        assert errors and all(o.ename == "NotImplementedError" for o in errors), (grade_id(cell), errors)


@pytest.mark.parametrize("assignment", assignments())
def test_feedback_never_shows_hidden_tests(reference_grades, assignment):
    for name in ("solutions", "exercises"):
        html = feedback_html(reference_grades[name][1], name, assignment)
        assert "BEGIN HIDDEN TESTS" not in html and "hidden=True" not in html
        assert "hidden tests: their code is not shown" in html


# ------------------------------------------------------------------ mistakes and bad submissions

def _bad_submissions(root: Path, answers: dict[str, str]) -> None:
    """A right submission that prints a warning, and five ways a submission goes wrong that the
    grader must survive and explain."""
    warns = {**answers, "ex4_answer": answers["ex4_answer"].replace(
        "        return self.weight[ids]",
        "        import warnings\n        warnings.warn('a harmless warning printed to stderr')\n"
        "        return self.weight[ids]")}
    assert warns != answers
    write_notebook(student_notebook(ASSIGNMENT, warns), root / "good" / ASSIGNMENT / NOTEBOOK)

    (root / "corrupt_json" / ASSIGNMENT).mkdir(parents=True)
    (root / "corrupt_json" / ASSIGNMENT / NOTEBOOK).write_text('{"cells": [ this is not json', encoding="utf-8")

    looping = {**answers, "ex5_answer": "while True:\n    pass\n" + answers["ex5_answer"]}
    write_notebook(student_notebook(ASSIGNMENT, looping), root / "infinite_loop" / ASSIGNMENT / NOTEBOOK)

    killed = {**answers, "ex6_answer": "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n" + answers["ex6_answer"]}
    write_notebook(student_notebook(ASSIGNMENT, killed), root / "kernel_killed" / ASSIGNMENT / NOTEBOOK)

    deleted = student_notebook(ASSIGNMENT, answers)
    deleted.cells = [c for c in deleted.cells if grade_id(c) not in ("ex4_visible", "setup")]
    write_notebook(deleted, root / "deleted_cells" / ASSIGNMENT / NOTEBOOK)

    edited = student_notebook(ASSIGNMENT, MISTAKES_BY_NAME["embedding_std_one"].apply(answers))
    for cell in edited.cells:
        if grade_id(cell) == "ex4_visible":
            cell.source = "# tests removed by the student\npass"
    write_notebook(edited, root / "edited_locked" / ASSIGNMENT / NOTEBOOK)



MISTAKES_BY_NAME = {m.name: m for m in mistakes_for(ASSIGNMENT)}
ALL_MISTAKES = e2e_mistakes()


def _student(assignment: str, mistake) -> str:
    return f"{assignment}__{mistake.name}"


@pytest.fixture(scope="module")
def batch(graded_all):
    return graded_all


@pytest.mark.parametrize("assignment,mistake", ALL_MISTAKES, ids=[f"{a}-{m.name}" for a, m in ALL_MISTAKES])
def test_mistake_loses_points_and_gets_its_hint(batch, assignment, mistake):
    rows, out = batch
    student = _student(assignment, mistake)
    row = rows[(student, assignment)]
    assert row["status"] == "graded", row     # graded, not lost to the grader: its notes say why
    assert float(row["score"]) < float(row["max_score"]), row
    scores = cell_scores(out, student, assignment)
    for cell in mistake.failing:
        assert scores[cell] == 0, (cell, scores)
    html = html_lib.unescape(feedback_html(out, student, assignment))
    assert mistake.hint in html


def test_good_submission_full_marks(batch):
    row = batch[0][("good", ASSIGNMENT)]
    assert float(row["score"]) == float(row["max_score"]) and row["notes"] == "", row


def test_corrupt_notebook_scores_zero_with_reason_and_others_still_graded(batch):
    rows, out = batch
    row = rows[("corrupt_json", ASSIGNMENT)]
    assert float(row["score"]) == 0 and row["status"] == "broken"
    assert "not valid JSON" in row["notes"]
    assert "not valid JSON" in feedback_html(out, "corrupt_json")
    assert len(rows) == len(ALL_MISTAKES) + 6 + 2 * len(assignments())


def test_infinite_loop_is_stopped_and_earlier_exercises_keep_their_points(batch):
    rows, out = batch
    row = rows[("infinite_loop", ASSIGNMENT)]
    assert "ex5_answer ran past the time limit" in row["notes"], row
    assert "later cells scored zero" in row["notes"], row   # the sandboxed kernel is stopped
    scores = cell_scores(out, "infinite_loop")
    assert scores["ex5_visible"] == 0 and scores["ex5_hidden"] == 0
    assert scores["ex4_hidden"] > 0 and scores["ex1_hidden"] > 0


def test_killed_kernel_keeps_earlier_points_and_zeroes_the_rest(batch):
    rows, out = batch
    row = rows[("kernel_killed", ASSIGNMENT)]
    assert "kernel died while running ex6_answer" in row["notes"], row
    scores = cell_scores(out, "kernel_killed")
    assert all(scores[f"ex{i}_{kind}"] > 0 for i in range(1, 6) for kind in ("visible", "hidden")), scores
    assert all(scores[f"ex{i}_{kind}"] == 0 for i in range(6, 9) for kind in ("visible", "hidden")), scores
    assert "kernel died" in feedback_html(out, "kernel_killed")


def test_deleted_cells_are_restored_graded_and_recorded(batch):
    row = batch[0][("deleted_cells", ASSIGNMENT)]
    assert float(row["score"]) == float(row["max_score"]), row
    assert "deleted" in row["notes"] and "ex4_visible" in row["notes"] and "setup" in row["notes"]


def test_edited_locked_cell_is_restored_and_recorded(batch):
    rows, out = batch
    row = rows[("edited_locked", ASSIGNMENT)]
    assert "locked cells edited" in row["notes"] and "ex4_visible" in row["notes"], row
    assert cell_scores(out, "edited_locked")["ex4_visible"] == 0
    assert "locked cells edited" in feedback_html(out, "edited_locked")


def test_stderr_warning_in_a_correct_answer_costs_nothing(batch):
    rows, out = batch
    row = rows[("good", ASSIGNMENT)]
    assert float(row["score"]) == float(row["max_score"]), row
    text = "".join(o.get("text", "") for c in autograded(out, "good").cells for o in c.get("outputs", []))
    assert "[stderr]" in text and "harmless warning" in text


# ------------------------------------------------------------------ the capstone

CAPSTONE = "ch07_capstone"


def test_capstone_runs_in_the_profile_the_grader_chose(reference_grades):
    nb = autograded(reference_grades["solutions"][1], "solutions", CAPSTONE)
    setup = next(c for c in nb.cells if grade_id(c) == "setup")
    assert "profile smoke" in "".join(o.get("text", "") for o in setup.outputs)


@pytest.mark.parametrize("task,metric", [("lm", "test_loss"), ("g2p", "per"), ("cls", "accuracy")])
def test_capstone_checkpoints_are_rescored_outside_the_notebook(reference_grades, task, metric):
    from course.capstone.profiles import PROFILES

    folder = reference_grades["solutions"][1] / "nbgrader" / "autograded" / "solutions" / CAPSTONE
    checkpoint = folder / "capstone_checkpoints" / f"{task}.pt"
    assert checkpoint.is_file()
    done = subprocess.run([sys.executable, "-m", "course.capstone.evaluate", str(checkpoint)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**__import__("os").environ, "COURSE_DEVICE": "cpu"})
    assert done.returncode == 0, done.stderr
    value = float(done.stdout.split(metric)[1].split(",")[0])
    limits = PROFILES["smoke"].thresholds
    bound = {"test_loss": limits.lm_max_val_loss, "per": limits.g2p_max_per}.get(metric)
    assert (value <= bound) if bound else (value >= limits.cls_min_accuracy), done.stdout
