"""Check helpers run in-process (fast), judged through the same protocol as ``grade``, for
every assignment: the solution passes every test cell, each common mistake fails the cells
it should with the hint meant for it, and the untouched stubs fail with
NotImplementedError only."""

from __future__ import annotations

import functools

import nbformat
import pytest

from mistakes import all_mistakes, assignments
from notebook_tools import ROOT, grade_id, solution_answers, solution_notebook

ALL_MISTAKES = all_mistakes()


def _code_cells(assignment: str):
    return [c for c in solution_notebook(assignment).cells if c.cell_type == "code"]


def _timed(cell) -> bool:
    """Cells with their own time limit train or score whole models (the capstone)."""
    return "timeout" in cell.metadata.get("course", {})


def run_tests(assignment: str, answers: dict[str, str], with_timed: bool = False,
              only: tuple[str, ...] | None = None) -> dict[str, BaseException | None]:
    """Run the notebook as ``grade`` does, in this process: answer, set-up and demo cells in
    one namespace (the kernel's), and each test cell judged against it through the
    kernel-less channel, whose requests and replies are serialised exactly as over the
    socket to a sandboxed kernel. Returns test cell -> its exception.

    Training and scoring cells run only when ``with_timed``: a wrong part is caught by its
    unit tests, and training three models per mistake would take minutes."""
    import tempfile
    from pathlib import Path

    from autograder.contract import setup_imports
    from autograder.remote import local_channel, run_judged

    imports = setup_imports(solution_notebook(assignment))
    namespace: dict = {"__name__": "__main__"}
    results = {}
    with tempfile.TemporaryDirectory(prefix="judge-io-") as io_dir:
        for cell in _code_cells(assignment):
            if _timed(cell) and not with_timed:
                continue
            meta = cell.metadata.get("nbgrader", {})
            if only is not None and not meta.get("solution") and grade_id(cell) != "setup" and grade_id(cell) not in only:
                continue  # a mistake needs the answers and its own failing test cells, nothing else
            source = answers.get(grade_id(cell), cell.source)
            try:
                if meta.get("grade"):    # a channel per cell, released after it, as the executor does
                    channel = local_channel(namespace, Path(io_dir))
                    try:
                        run_judged(source, channel, imports, ROOT)
                    finally:
                        channel.request("release", None)
                else:
                    exec(compile(source, grade_id(cell) or "cell", "exec"), namespace)
                error = None
            except Exception as err:  # noqa: BLE001 - we record what each cell raised
                error = err
            if meta.get("grade"):
                results[grade_id(cell)] = error
            elif error is not None and not meta.get("solution"):
                raise error  # set-up and demo cells must run even with stubs
    return results


@pytest.mark.parametrize("assignment", assignments())
def test_solution_passes_every_test_cell(assignment):
    # Training and scoring cells are run by the end-to-end grading tests.
    results = run_tests(assignment, solution_answers(assignment))
    assert results, "no test cells found"
    assert not {k: repr(v) for k, v in results.items() if v is not None}


@pytest.mark.parametrize("assignment", assignments())
def test_stubs_fail_every_test_cell_with_not_implemented(assignment):
    nb = nbformat.read(ROOT / "exercises" / assignment / f"{assignment}.ipynb", as_version=4)
    stubs = {grade_id(c): c.source for c in nb.cells if c.metadata.get("nbgrader", {}).get("solution")}
    results = run_tests(assignment, stubs)
    assert all(isinstance(err, NotImplementedError) for err in results.values()), results


@pytest.mark.parametrize("assignment,mistake", ALL_MISTAKES, ids=[f"{a}-{m.name}" for a, m in ALL_MISTAKES])
def test_mistake_fails_with_its_hint(assignment, mistake):
    results = run_tests(assignment, mistake.apply(solution_answers(assignment)), only=mistake.failing)
    for cell in mistake.failing:
        err = results[cell]
        assert err is not None, f"{cell} passed although the answer has the mistake {mistake.name!r}"
        assert mistake.hint in str(err), f"{cell} failed without the hint {mistake.hint!r}:\n{err}"
        assert mistake.hint in leading_hint(err), (
            f"{cell} names the hint {mistake.hint!r}, but not as the likely mistake it leads with:\n{err}")
        if _messages_translated(assignment):
            assert_hint_in_chinese(err)


CHINESE = "zh_CN"


@functools.cache
def _messages_translated(assignment: str) -> bool:
    """Whether the chapter's messages catalog is translated (then it is whole: test_locales)."""
    from autograder.translation import catalog_translations

    return bool(catalog_translations(ROOT / "locales" / CHINESE / "LC_MESSAGES" / "messages" / f"{assignment[:4]}.po"))


def assert_hint_in_chinese(err: BaseException) -> None:
    """The failure, as a Chinese notebook's feedback shows it, gives its likely mistake in
    Chinese: the hint is a message of the catalogs (a plain one, or an f-string's template)."""
    import re

    from course.i18n import LIKELY_MISTAKE, error_text, translate

    if not getattr(err, "hint", ""):
        return
    shown = error_text(err, CHINESE)
    hint = shown.split(translate(LIKELY_MISTAKE, CHINESE), 1)[-1]
    assert re.search(r"[\u4e00-\u9fff]", hint), f"the hint has no Chinese translation:\n{err.hint}"


def leading_hint(err: BaseException) -> str:
    """What a failure message gives as the likely mistake: the text after its first
    "Likely mistake:" (the whole message for a failure without one, e.g. a length error
    that the exercise itself raises)."""
    text = str(err)
    return text.split("Likely mistake:", 1)[1] if "Likely mistake:" in text else text


@pytest.mark.parametrize("assignment", assignments())
def test_each_exercise_has_a_mistake_and_enough_of_them(assignment):
    from mistakes import mistakes_for

    found = mistakes_for(assignment)
    assert len(found) >= 8
    answer_cells = {grade_id(c) for c in _code_cells(assignment) if c.metadata.get("nbgrader", {}).get("solution")}
    assert answer_cells <= {m.cell for m in found}, answer_cells - {m.cell for m in found}
