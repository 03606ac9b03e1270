"""Chapter 1 check helpers, run in-process (fast): the solution passes every test cell, each
common mistake fails the cells it should with the hint meant for it, and stubs fail with
NotImplementedError only."""

from __future__ import annotations

import nbformat
import pytest

from ch01_mistakes import MISTAKES
from notebook_tools import ROOT, grade_id, solution_answers

ASSIGNMENT = "ch01_embeddings"


def _cells():
    nb = nbformat.read(ROOT / "solutions" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb", as_version=4)
    return [c for c in nb.cells if c.cell_type == "code" and grade_id(c) != "ex2_demo"]


def run_tests(answers: dict[str, str]) -> dict[str, BaseException | None]:
    """Execute setup, answers and test cells in one namespace; test cell -> its exception."""
    namespace: dict = {}
    results = {}
    for cell in _cells():
        meta = cell.metadata.get("nbgrader", {})
        source = answers.get(grade_id(cell), cell.source)
        if meta.get("grade"):
            try:
                exec(compile(source, grade_id(cell), "exec"), namespace)
                results[grade_id(cell)] = None
            except Exception as err:  # noqa: BLE001 - we record what each test cell raised
                results[grade_id(cell)] = err
        else:
            exec(compile(source, grade_id(cell) or "cell", "exec"), namespace)
    return results


def test_solution_passes_every_test_cell():
    results = run_tests(solution_answers(ASSIGNMENT))
    assert results, "no test cells found"
    failed = {k: repr(v) for k, v in results.items() if v is not None}
    assert not failed


def test_stubs_fail_every_test_cell_with_not_implemented():
    nb = nbformat.read(ROOT / "exercises" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb", as_version=4)
    stubs = {grade_id(c): c.source for c in nb.cells if c.metadata.get("nbgrader", {}).get("solution")}
    results = run_tests(stubs)
    assert all(isinstance(err, NotImplementedError) for err in results.values()), results


@pytest.mark.parametrize("mistake", MISTAKES, ids=[m.name for m in MISTAKES])
def test_mistake_fails_with_its_hint(mistake):
    results = run_tests(mistake.apply(solution_answers(ASSIGNMENT)))
    for cell in mistake.failing:
        err = results[cell]
        assert err is not None, f"{cell} passed although the answer has the mistake {mistake.name!r}"
        assert mistake.hint in str(err), f"{cell} failed without the hint {mistake.hint!r}:\n{err}"
