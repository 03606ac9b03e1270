"""Grading at scale, end to end: parallel workers give the scores of one worker, a killed
worker loses no row, and a second run regrades only what changed (``--force`` everything,
``--student`` one student)."""

from __future__ import annotations

import html
import shutil
import time
from pathlib import Path

import pytest

from grading_tools import rows_of, run_grade
from mistakes import mistakes_for
from notebook_tools import solution_answers, student_notebook, write_notebook

pytestmark = pytest.mark.slow
A = "ch01_embeddings"
NB = f"{A}.ipynb"


def run(submissions: Path, out: Path, *extra: str, env: dict | None = None) -> str:
    done = run_grade(submissions, out, "--seed", "2026", *extra, env=env, workers=None, timeout=30)
    return done.stdout + done.stderr


def autograded_times(out: Path) -> dict[str, int]:
    folder = out / "nbgrader" / "autograded"
    return {p.relative_to(folder).parts[0]: p.stat().st_mtime_ns for p in folder.glob(f"*/{A}/{NB}")}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Four entries graded by one worker, then by two with a worker killed mid-run."""
    root = tmp_path_factory.mktemp("subs")
    answers = solution_answers(A)
    write_notebook(student_notebook(A, answers), root / "ann" / A / NB)
    wrong = mistakes_for(A)[0]
    write_notebook(student_notebook(A, wrong.apply(answers)), root / "bob" / A / NB)
    (root / "dee" / A).mkdir(parents=True)
    (root / "dee" / A / NB).write_text("{ not json", encoding="utf-8")
    (root / "eve" / "ch01_embedings").mkdir(parents=True)                       # skipped: a typo
    one, two = tmp_path_factory.mktemp("one-worker"), tmp_path_factory.mktemp("two-workers")
    pristine = tmp_path_factory.mktemp("pristine") / "subs"
    shutil.copytree(root, pristine)                   # the reruns below change bob's notebook
    run(root, one, "--workers", "1")
    output = run(root, two, "--workers", "2", env={"COURSE_GRADER_KILL_WORKER": f"bob/{A}"})
    return {"root": root, "pristine": pristine, "one": one, "two": two, "output": output, "wrong": wrong}


def test_two_workers_give_the_rows_of_one_even_when_a_worker_dies(runs):
    one, two = rows_of(runs["one"]), rows_of(runs["two"])
    assert one == two                                  # order, scores, statuses, notes
    assert [r["student"] for r in two] == ["ann", "bob", "dee", "eve"]
    by = {r["student"]: r for r in two}
    assert by["ann"]["score"] == by["ann"]["max_score"]
    assert float(by["bob"]["score"]) < float(by["bob"]["max_score"])   # the killed worker's student, regraded
    assert by["dee"]["status"] == "broken" and by["eve"]["status"] == "skipped"
    assert not (runs["two"] / ".grading-workers").exists()


def test_the_dead_workers_submission_got_its_hint(runs):
    pages = list((runs["two"] / "feedback" / "bob" / A).glob("*.html"))
    assert pages and runs["wrong"].hint in html.unescape(pages[0].read_text(encoding="utf-8"))


def cell_scores(out: Path, student: str) -> dict[str, float]:
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{out / 'nbgrader' / 'gradebook.db'}") as gb:
        return {g.name: float(g.score) for g in gb.find_submission_notebook(A, A, student).grades}


@pytest.fixture(scope="module")
def on_ray(runs, tmp_path_factory):
    """The same entries sent to a real local Ray cluster (two worker processes), one of
    whose workers dies on its first task."""
    from autograder.cluster import local_cluster

    out = tmp_path_factory.mktemp("ray-out")
    with local_cluster(tmp_path_factory.mktemp("ray"), workers=2) as address:
        output = run(runs["pristine"], out, "--cluster", address, env={"COURSE_GRADER_KILL_WORKER": f"bob/{A}"})
    return out, output


def test_a_ray_cluster_gives_the_rows_of_one_worker_even_when_a_worker_dies(runs, on_ray):
    out, _ = on_ray
    assert rows_of(out) == rows_of(runs["one"])
    for student in ("ann", "bob"):
        assert cell_scores(out, student) == cell_scores(runs["one"], student)
        pages = list((out / "feedback" / student / A).glob("*.html"))
        assert pages and "hidden tests: their code is not shown" in pages[0].read_text(encoding="utf-8")
        assert (out / "nbgrader" / "autograded" / student / A / NB).is_file()
    bob = html.unescape((out / "feedback" / "bob" / A / f"{A}.html").read_text(encoding="utf-8"))
    assert runs["wrong"].hint in bob


@pytest.fixture(scope="module")
def reruns(runs):
    """On the two-worker output: an unchanged rerun, one changed notebook, --student, --force."""
    root, out = runs["root"], runs["two"]
    steps = {"before": autograded_times(out)}
    steps["same_output"] = run(root, out, "--workers", "2")
    steps["same"] = autograded_times(out)
    time.sleep(0.05)
    write_notebook(student_notebook(A, solution_answers(A)), root / "bob" / A / NB)     # bob fixes his answer
    steps["changed_output"] = run(root, out, "--workers", "2")
    steps["changed"] = autograded_times(out)
    steps["changed_rows"] = rows_of(out)
    steps["student_output"] = run(root, out, "--student", "ann")
    steps["student"] = autograded_times(out)
    steps["force_output"] = run(root, out, "--force", "--workers", "2")
    steps["force"] = autograded_times(out)
    steps["force_rows"] = rows_of(out)
    return steps


def test_an_unchanged_rerun_grades_nothing_and_says_so(reruns):
    assert reruns["same"] == reruns["before"], reruns["same_output"]
    output = reruns["same_output"]
    assert "nothing to grade: no submission changed since the last run" in output and "its 4 row(s)" in output
    assert not any(line.startswith("student ") for line in output.splitlines()), output     # no empty table
    assert "graded " not in output and "4 submission(s)" in output, output


def test_a_changed_notebook_is_the_only_one_regraded(reruns):
    before, after = reruns["before"], reruns["changed"]
    assert [s for s in before if before[s] != after[s]] == ["bob"]
    assert "3 row(s) unchanged" in reruns["changed_output"] and "1 to grade" in reruns["changed_output"]
    bob = next(r for r in reruns["changed_rows"] if r["student"] == "bob")
    assert bob["score"] == bob["max_score"]                        # his new (right) answer was graded


def test_student_regrades_one_and_keeps_the_rest(reruns):
    before, after = reruns["changed"], reruns["student"]
    assert [s for s in before if before[s] != after[s]] == ["ann"]
    assert "regrading ann: 1 submission(s); 3 other row(s) kept" in reruns["student_output"]


def test_force_regrades_everything_with_the_same_scores(reruns):
    before, after = reruns["student"], reruns["force"]
    assert all(before[s] != after[s] for s in before)
    assert [(r["student"], r["score"], r["status"]) for r in reruns["force_rows"]] == \
        [(r["student"], r["score"], r["status"]) for r in reruns["changed_rows"]]
