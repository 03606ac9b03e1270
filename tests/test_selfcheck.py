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
    assert "FAILED\n    NotImplementedError" in stub.stdout and "visible tests: 0 / 9 points" in stub.stdout


def test_self_check_shows_the_full_message_and_no_kernel_chatter(tmp_path):
    """The terminal shows what the notebook shows: the whole message with its likely mistake,
    not its first line; the kernel's own start-up warnings stay out of the terminal."""
    from mistakes import mistakes_for

    mistake = mistakes_for("ch01_embeddings")[0]
    wrong = write_notebook(student_notebook("ch01_embeddings", mistake.apply(solution_answers("ch01_embeddings"))),
                           tmp_path / "wrong.ipynb")
    done = _check(wrong)
    assert done.returncode == 1, done.stdout + done.stderr
    failed = done.stdout.split("FAILED\n", 1)[1]
    assert "\n    Likely mistake: " in failed and mistake.hint in failed, done.stdout
    assert "%tb" not in done.stdout, "the line on showing the checker's traceback is for Jupyter only"
    assert "IPKernelApp" not in done.stdout + done.stderr and "WARNING" not in done.stderr, done.stderr


def test_self_check_names_a_missing_notebook(tmp_path):
    done = _check(tmp_path / "nope.ipynb")
    assert done.returncode == 2 and "No notebook at" in done.stderr


def test_self_check_of_a_chinese_notebook_speaks_chinese(tmp_path):
    """The Chinese release self-checks in Chinese with no setting made: the kernel's checks give
    the likely mistake through the catalogs, the report's own words too; `%tb`'s line stays out."""
    import copy

    import nbformat

    from course.i18n import LIKELY_MISTAKE, translate
    from mistakes import mistakes_for
    from notebook_tools import grade_id

    mistake = next(m for m in mistakes_for("ch01_embeddings") if m.name == "embedding_std_one")
    answers = mistake.apply(solution_answers("ch01_embeddings"))
    nb = copy.deepcopy(nbformat.read(ROOT / "exercises-zh" / "ch01_embeddings" / "ch01_embeddings.ipynb", 4))
    for cell in nb.cells:
        if grade_id(cell) in answers:
            cell.source = answers[grade_id(cell)]
    path = tmp_path / "wrong.ipynb"
    nbformat.write(nb, path)
    done = subprocess.run([sys.executable, "-m", "autograder", "check", str(path), "--timeout", "60"], cwd=ROOT,
                          capture_output=True, text=True, timeout=600, env={**__import__("os").environ,
                                                                            "COURSE_LANGUAGE": ""})
    assert done.returncode == 1, done.stdout + done.stderr
    failed = done.stdout.split(translate("FAILED", "zh_CN") + "\n", 1)[1]
    assert translate(LIKELY_MISTAKE, "zh_CN") in failed and mistake.hint not in failed, done.stdout
    assert translate("passed", "zh_CN") in done.stdout and "%tb" not in done.stdout, done.stdout
