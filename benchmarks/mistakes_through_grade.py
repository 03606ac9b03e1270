"""Every registered wrong answer graded through the real grader, against what the in-process
tests say of it, in the same run.

The suite grades a sample of the wrong answers end to end (tests/test_grading_e2e.py, one
per assignment) and all of them in process, through the kernel-less channel. This script
grades the whole set (or the chapters named) through ``python -m autograder grade`` (the
sandbox, the kernel, the judge) and prints, per assignment: how many wrong answers there
are, how many lose points in process and through ``grade``, how many lose them in exactly
the same test cells, and how many show their hint in the feedback page. Rows where the
two disagree are listed after the table.

    .venv/bin/python benchmarks/mistakes_through_grade.py                  # chapters 1-6
    .venv/bin/python benchmarks/mistakes_through_grade.py ch01_embeddings --workers 2
    .venv/bin/python benchmarks/mistakes_through_grade.py --since f0acbea     # added since a commit
"""

from __future__ import annotations

import argparse
import csv
import html
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

CHAPTERS = ["ch01_embeddings", "ch02_positions", "ch03_attention", "ch04_ffn", "ch05_training", "ch06_inference"]


def names_at(commit: str, assignment: str) -> set[str]:
    """The wrong answers of ``assignment`` registered at ``commit`` (their names, read from git)."""
    import re

    shown = subprocess.run(["git", "show", f"{commit}:tests/mistakes/{assignment}.py"], cwd=ROOT,
                           capture_output=True, text=True)
    return set(re.findall(r'Mistake\(\s*"([^"]+)"', shown.stdout)) if shown.returncode == 0 else set()


def write_submissions(root: Path, assignments: list[str], since: str | None = None) -> dict[str, tuple[str, object]]:
    """One student per wrong answer (only those registered after commit ``since``, when given);
    returns student -> (assignment, mistake)."""
    from mistakes import mistakes_for
    from notebook_tools import solution_answers, student_notebook, write_notebook

    students = {}
    for assignment in assignments:
        known = names_at(since, assignment) if since else set()
        for mistake in mistakes_for(assignment):
            if mistake.name in known:
                continue
            student = f"{assignment}__{mistake.name}"
            nb = student_notebook(assignment, mistake.apply(solution_answers(assignment)))
            write_notebook(nb, root / student / assignment / f"{assignment}.ipynb")
            students[student] = (assignment, mistake)
    return students


def in_process(assignment: str, mistake) -> set[str]:
    """The test cells the wrong answer fails in process (judged through the local channel)."""
    from notebook_tools import solution_answers
    from test_checks_inprocess import run_tests

    results = run_tests(assignment, mistake.apply(solution_answers(assignment)), only=mistake.failing)
    return {cell for cell, err in results.items() if err is not None and cell in mistake.failing}


def graded_cells(out: Path, student: str, assignment: str) -> set[str]:
    """The test cells that scored zero through ``grade`` (under the student's gradebook id)."""
    from nbgrader.api import Gradebook

    from autograder.grade import internal_id

    with Gradebook(f"sqlite:///{out / 'nbgrader' / 'gradebook.db'}") as gb:
        sub = gb.find_submission_notebook(assignment, assignment, internal_id(student))
        return {g.name for g in sub.grades if float(g.score) == 0}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("assignments", nargs="*", default=CHAPTERS)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--since", metavar="COMMIT",
                        help="only the wrong answers registered after COMMIT (not in its tests/mistakes)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="mistakes-") as tmp:
        root, out = Path(tmp) / "submissions", Path(tmp) / "out"
        students = write_submissions(root, args.assignments, args.since)
        start = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "autograder", "grade", str(root), "--out", str(out),
                               "--profile", "smoke", "--no-progress", "--workers", str(args.workers)],
                              cwd=ROOT, capture_output=True, text=True)
        seconds = time.monotonic() - start
        if done.returncode != 0:
            print(done.stdout[-3000:], done.stderr[-3000:])
            return done.returncode
        with open(out / "grades.csv", newline="") as f:
            rows = {r["student"]: r for r in csv.DictReader(f)}
        table, disagreements = {}, []
        for student, (assignment, mistake) in students.items():
            row = rows[student]
            lost = float(row["score"]) < float(row["max_score"])
            zero = graded_cells(out, student, assignment) & set(mistake.failing) if lost else set()
            local = in_process(assignment, mistake)
            pages = (out / "feedback" / student / assignment).glob("*.html")
            hinted = any(mistake.hint in html.unescape(p.read_text(errors="replace")) for p in pages)
            counts = table.setdefault(assignment, [0, 0, 0, 0, 0])
            for i, ok in enumerate((True, bool(local), lost, zero == local == set(mistake.failing), hinted)):
                counts[i] += ok
            if not (lost and hinted and zero == local == set(mistake.failing)):
                disagreements.append(f"{student}: in process {sorted(local)}, grade zero in {sorted(zero)} "
                                     f"(status {row['status']}, score {row['score']}/{row['max_score']}), "
                                     f"hint shown: {hinted}")
    print(f"graded {len(students)} wrong answers in {seconds:.0f} s with {args.workers} workers\n")
    print(f"| {'assignment':<16} | wrong answers | lose points in process | through grade | same cells | hint shown |")
    print("| --- | --- | --- | --- | --- | --- |")
    for assignment, (n, local, lost, same, hinted) in table.items():
        print(f"| {assignment:<16} | {n} | {local} | {lost} | {same} | {hinted} |")
    total = [sum(c[i] for c in table.values()) for i in range(5)]
    print(f"| {'all':<16} | {' | '.join(map(str, total))} |")
    for line in disagreements:
        print("-", line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
