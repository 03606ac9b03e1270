"""Running the grading CLI from a test: one way, used by every end-to-end test."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

from notebook_tools import ROOT


def grade_command(submissions: Path, out: Path, *extra: str, workers: int | None = 2, timeout: int | None = 20,
                  profile: str | None = "smoke") -> list[str]:
    """``python -m autograder grade`` as an instructor types it; None leaves an option out."""
    command = [sys.executable, "-m", "autograder", "grade", str(submissions), "--out", str(out), "--no-progress"]
    for flag, value in (("--workers", workers), ("--timeout", timeout), ("--profile", profile)):
        if value is not None:
            command += [flag, str(value)]
    return command + list(extra)


def run_grade(submissions: Path, out: Path, *extra: str, returncode: int = 0, env: dict | None = None,
              **options) -> subprocess.CompletedProcess:
    """Grade, wait (30 minutes at most) and assert the exit status; stdout and stderr as text."""
    done = subprocess.run(grade_command(submissions, out, *extra, **options), cwd=ROOT, capture_output=True,
                          text=True, timeout=1800, env={**os.environ, **(env or {})})
    assert done.returncode == returncode, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def start_grade(submissions: Path, out: Path, *extra: str, env: dict | None = None, **options) -> subprocess.Popen:
    """Grade in the background (its own session, so that a test can kill it and its kernels)."""
    return subprocess.Popen(grade_command(submissions, out, *extra, **options), cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
                            env={**os.environ, **(env or {})})


def rows_of(out: Path) -> list[dict]:
    """The rows of ``out/grades.csv``."""
    with open(Path(out) / "grades.csv", newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))
