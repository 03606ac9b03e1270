"""Grading throughput: plain nbgrader against the course's grader, in the same run.

A realistic submission set (--copies copies of: the solutions of chapters 1-3, and three
wrong answers from tests/mistakes) is graded

- by plain ``nbgrader autograde`` + ``nbgrader generate_feedback`` (one process, no sandbox,
  the test cells run inside the student's kernel: nbgrader's own way, the baseline);
- by ``python -m autograder grade --workers 1`` (sandbox per notebook, trusted judge), with
  each notebook's kernel started when the notebook comes (``COURSE_COLD_KERNELS=1``), started
  while the previous notebook is graded but importing PyTorch itself (``COURSE_NO_ZYGOTE=1``),
  and as the grader does it: started ahead and forked from a zygote that imported PyTorch
  once (as root; :mod:`autograder.zygote`);
- by ``python -m autograder grade --workers N`` for each N of --workers;
- with --ray, by ``grade --cluster`` against a local Ray cluster started here.

Each is run --repeats times on a fresh output folder; the table shows the median wall time,
submissions (notebooks) per minute, and the ratio of throughput to plain nbgrader's measured
in the same run. Nothing here asserts a time.

    .venv/bin/python benchmarks/grading.py                      # 2 copies, 3 repeats
    .venv/bin/python benchmarks/grading.py --copies 1 --repeats 1 --workers 2
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

CHAPTERS = ["ch01_embeddings", "ch02_positions", "ch03_attention"]


def build_submissions(folder: Path, copies: int) -> int:
    """``copies`` x (three solutions, three wrong answers); the number of notebooks."""
    from mistakes import mistakes_for
    from notebook_tools import solution_answers, student_notebook, write_notebook

    count = 0
    for copy in range(copies):
        for assignment in CHAPTERS:
            answers = solution_answers(assignment)
            write_notebook(student_notebook(assignment, answers),
                           folder / f"right{copy}" / assignment / f"{assignment}.ipynb")
            wrong = mistakes_for(assignment)[0]
            write_notebook(student_notebook(assignment, wrong.apply(answers)),
                           folder / f"wrong{copy}" / assignment / f"{assignment}.ipynb")
            count += 2
    return count


def plain_nbgrader(submissions: Path, work: Path) -> float:
    """nbgrader's own CLI on a course folder of the same notebooks; seconds."""
    course = work / "course"
    for assignment in CHAPTERS:
        shutil.copytree(ROOT / "solutions" / assignment, course / "source" / assignment)
    for student in sorted(p.name for p in submissions.iterdir()):
        shutil.copytree(submissions / student, course / "submitted" / student)
    base = [sys.executable, "-m", "nbgrader"]
    flags = [f"--CourseDirectory.root={course}", "--Execute.timeout=300", "--log-level=WARN"]
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "COURSE_PROFILE": "smoke"}
    started = time.perf_counter()
    for assignment in CHAPTERS:   # generated in the timed part, as the course's grader does
        subprocess.run(base + ["generate_assignment", assignment, "--force", *flags], check=True, env=env,
                       capture_output=True)
        subprocess.run(base + ["autograde", assignment, "--force", "--create", *flags], check=True, env=env,
                       capture_output=True)
        subprocess.run(base + ["generate_feedback", assignment, "--force", *flags], check=True, env=env,
                       capture_output=True)
    return time.perf_counter() - started


def course_grader(submissions: Path, work: Path, workers: int, extra: list[str] | None = None,
                  cold: bool = False, zygote: bool = True) -> float:
    """``grade`` from the command line, everything included (it generates the assignments too).
    ``cold``: each notebook's kernel is started when its notebook comes, not ahead;
    ``zygote`` False: each kernel imports PyTorch itself instead of being forked from a zygote."""
    started = time.perf_counter()
    env = {**os.environ, "COURSE_COLD_KERNELS": "1" if cold else "0", "COURSE_NO_ZYGOTE": "0" if zygote else "1"}
    subprocess.run([sys.executable, "-m", "autograder", "grade", str(submissions), "--out", str(work / "out"),
                    "--profile", "smoke", "--no-progress", "--workers", str(workers), *(extra or [])],
                   cwd=ROOT, check=True, capture_output=True, env=env)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--copies", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", type=int, nargs="+", default=[2])
    parser.add_argument("--ray", action="store_true", help="also grade through a local Ray cluster")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="grading-bench-") as tmp:
        submissions = Path(tmp) / "submissions"
        n = build_submissions(submissions, args.copies)
        modes: list[tuple[str, object]] = [("plain nbgrader (no sandbox)", lambda w: plain_nbgrader(submissions, w)),
                                           ("grade --workers 1, cold kernels",
                                            lambda w: course_grader(submissions, w, 1, cold=True)),
                                           ("grade --workers 1, kernels ahead, no zygote",
                                            lambda w: course_grader(submissions, w, 1, zygote=False)),
                                           ("grade --workers 1", lambda w: course_grader(submissions, w, 1))]
        for workers in [w for w in dict.fromkeys(args.workers) if w != 1]:      # workers 1 is always run
            modes.append((f"grade --workers {workers}", lambda w, k=workers: course_grader(submissions, w, k)))
        cluster = None
        if args.ray:
            from autograder.cluster import local_cluster

            cluster = local_cluster(Path(tmp) / "ray", workers=max(args.workers))
            address = cluster.__enter__()
            modes.append(("grade --cluster (local Ray)",
                          lambda w: course_grader(submissions, w, 1, ["--cluster", address])))
        times: dict[str, list[float]] = {name: [] for name, _ in modes}
        try:
            for repeat in range(args.repeats):
                for name, run in modes:
                    work = Path(tmp) / f"run-{repeat}-{len(times[name])}-{abs(hash(name))}"
                    work.mkdir()
                    times[name].append(run(work))
                    print(f"  {name}: {times[name][-1]:.1f} s", file=sys.stderr)
                    shutil.rmtree(work, ignore_errors=True)
        finally:
            if cluster is not None:
                cluster.__exit__(None, None, None)

    baseline = n / statistics.median(times[modes[0][0]]) * 60
    print(f"\n{n} notebooks (chapters 1-3: {args.copies} x 3 solutions + 3 wrong answers), "
          f"median of {args.repeats} run(s), {os.cpu_count()} CPU cores\n")
    width = max(len(name) for name, _ in modes)
    print(f"| {'how':<{width}} | {'median s':>8} | {'notebooks/min':>13} | {'vs nbgrader':>11} |")
    print(f"| {'-' * width} | {'-' * 8} | {'-' * 13} | {'-' * 11} |")
    for name, _ in modes:
        seconds = statistics.median(times[name])
        rate = n / seconds * 60
        print(f"| {name:<{width}} | {seconds:>8.1f} | {rate:>13.1f} | {rate / baseline:>10.2f}x |")


if __name__ == "__main__":
    main()
