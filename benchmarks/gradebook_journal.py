"""What nbgrader's gradebook commits cost, with SQLite's default journal and with the grader's.

nbgrader commits to the gradebook about once per cell as it generates an assignment and as
it grades a notebook. With SQLite's defaults each commit waits for the disk; the grader's
connections write ahead and sync at checkpoints (``autograder/coursetree.py``). This
generates the given assignments into a fresh course tree, ``--repeats`` times in each
journal, each in its own process, and prints the median wall and CPU seconds per
assignment, the commits counted, and the ratio, in the same run. The disk decides the
gap: a RAM disk has none. Nothing here asserts a time.

    .venv/bin/python benchmarks/gradebook_journal.py --repeats 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ASSIGNMENTS = ["ch01_embeddings", "ch02_positions", "ch03_attention"]

# One process: the grader's course tree, with or without its journal, generating each assignment.
GENERATE = r"""
import json, sys, tempfile, time
from pathlib import Path
from sqlalchemy import event
from sqlalchemy.engine import Engine
from autograder import coursetree
from autograder.settings import GradingSettings

default, root, assignments = sys.argv[1] == "default", Path(sys.argv[2]), sys.argv[3:]
if default:
    event.remove(Engine, "connect", coursetree._gradebook_journal)
commits = []
event.listen(Engine, "commit", lambda _connection: commits.append(1))
with tempfile.TemporaryDirectory(prefix="gradebook-journal-") as folder:
    tree = coursetree.CourseTree(Path(folder), root / "solutions", GradingSettings(profile="smoke"))
    wall, cpu = time.perf_counter(), time.process_time()
    for assignment in assignments:
        tree.generate(assignment)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
print(json.dumps({"wall": wall, "cpu": cpu, "commits": len(commits)}))
"""


def generate(journal: str, assignments: list[str]) -> dict:
    done = subprocess.run([sys.executable, "-c", GENERATE, journal, str(ROOT), *assignments], cwd=ROOT,
                          check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--assignments", nargs="+", default=ASSIGNMENTS)
    args = parser.parse_args()
    runs: dict[str, list[dict]] = {"default": [], "grader": []}
    for _ in range(args.repeats):
        for journal in runs:
            runs[journal].append(generate(journal, args.assignments))
    n = len(args.assignments)
    median = {j: {k: statistics.median(r[k] for r in rs) for k in ("wall", "cpu", "commits")} for j, rs in runs.items()}
    print(f"\n{n} assignments generated, median of {args.repeats} run(s) in each journal\n")
    print("| journal | wall s per assignment | CPU s per assignment | commits per assignment |")
    print("|---|---|---|---|")
    for journal, label in (("default", "SQLite's default (sync at each commit)"),
                           ("grader", "the grader's (write-ahead, sync at checkpoints)")):
        m = median[journal]
        print(f"| {label} | {m['wall'] / n:.2f} | {m['cpu'] / n:.2f} | {m['commits'] / n:.0f} |")
    print(f"\nwall: {median['default']['wall'] / median['grader']['wall']:.2f}x faster with the grader's journal")


if __name__ == "__main__":
    main()
