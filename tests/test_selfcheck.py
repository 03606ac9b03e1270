"""The student's self-check command runs the visible tests in a fresh kernel."""

from __future__ import annotations

import subprocess
import sys

import pytest

from notebook_tools import ROOT, solution_answers, student_notebook, write_notebook

pytestmark = pytest.mark.slow


def _check(path):
    return subprocess.run([sys.executable, "-m", "autograder", "check", str(path), "--timeout", "60"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_self_check_passes_a_complete_notebook_and_fails_the_stub(tmp_path):
    done = write_notebook(student_notebook("ch01_embeddings", solution_answers("ch01_embeddings")),
                          tmp_path / "done.ipynb")
    before = done.read_text()
    good = _check(done)
    assert good.returncode == 0, good.stdout + good.stderr
    assert "visible tests: 9 / 9 points" in good.stdout
    assert done.read_text() == before, "self-check must not change the student's notebook"

    stub = _check(ROOT / "exercises" / "ch01_embeddings" / "ch01_embeddings.ipynb")
    assert stub.returncode == 1
    assert "FAILED  NotImplementedError" in stub.stdout and "visible tests: 0 / 9 points" in stub.stdout


def test_self_check_names_a_missing_notebook(tmp_path):
    done = _check(tmp_path / "nope.ipynb")
    assert done.returncode == 2 and "No notebook at" in done.stderr
