"""The repairs a submission gets before nbgrader grades it (autograder/repairs.py), each run on
fixture notebooks (tests/fixtures/repairs: a four-cell release and what students do to it)."""

from __future__ import annotations

import warnings
from pathlib import Path

import nbformat
import pytest

from autograder import repairs

FIXTURES = Path(__file__).parent / "fixtures" / "repairs"


def read(name: str) -> nbformat.NotebookNode:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")      # cell_ids_repeated.ipynb repeats an id on purpose
        return nbformat.read(FIXTURES / f"{name}.ipynb", as_version=4)


def run(step, name: str) -> tuple[nbformat.NotebookNode, list[str]]:
    nb, resources = step().preprocess(read(name), {"release": read("release")})
    return nb, resources.get("repairs", [])


def ids(nb) -> list[str | None]:
    return [repairs.gid(c) for c in nb.cells]


def test_a_deleted_setup_cell_comes_back_in_its_place():
    nb, notes = run(repairs.DeletedLockedCellsBack, "setup_deleted")
    assert ids(nb) == [None, "setup", "ex1_answer", "ex1_test"]
    assert nb.cells[1].source == "import math" and notes == []


def test_an_answer_pasted_twice_keeps_the_last_copy_and_runs_the_first():
    nb, notes = run(repairs.OneCellPerId, "answer_pasted_twice")
    assert ids(nb) == [None, "setup", None, "ex1_answer", "ex1_test"]
    assert nb.cells[2].source.endswith("return 0") and "nbgrader" not in nb.cells[2].metadata
    assert nb.cells[3].source.endswith("math.pi * r * r")
    assert notes == ["duplicated cell ex1_answer: kept the last copy as the answer "
                     "(the earlier copy runs as an ordinary cell)"]


def test_a_test_pasted_and_edited_keeps_the_released_copy_only():
    nb, notes = run(repairs.OneCellPerId, "test_pasted_and_edited")
    assert ids(nb) == [None, "setup", "ex1_answer", "ex1_test"]
    assert "my own test" not in nb.cells[3].source
    assert notes == ["duplicated cell ex1_test: kept the released copy and removed the other copy"]


def test_edited_points_and_roles_are_put_back():
    nb, notes = run(repairs.GradingMetadataAsReleased, "points_edited")
    assert nb.cells[3].metadata.nbgrader["points"] == 2 and nb.cells[2].metadata.nbgrader["grade"] is False
    assert notes == ["nbgrader metadata edited (restored from the original): ex1_answer, ex1_test"]


def test_cells_with_ids_the_release_lacks_run_as_ordinary_cells():
    nb, notes = run(repairs.UnknownIdsAsOrdinaryCells, "unknown_ids")
    assert [c.source for c in nb.cells][-2:] == ["bonus = 1", "z = 3"]
    assert all("nbgrader" not in c.metadata for c in nb.cells[-2:])
    assert notes == ["cells with nbgrader ids the assignment does not have, run as ordinary cells: "
                     "(malformed metadata), ex9_bonus"]


def test_repeated_cell_ids_are_renumbered():
    nb, _ = run(repairs.UniqueCellIds, "cell_ids_repeated")
    assert len({c.id for c in nb.cells}) == len(nb.cells) and nb.cells[1].id == "setup"


@pytest.mark.parametrize("name", ["setup_deleted", "answer_pasted_twice", "test_pasted_and_edited",
                                  "points_edited", "unknown_ids", "cell_ids_repeated"])
def test_after_every_repair_the_notebook_is_valid_and_graded_as_released(name):
    release = read("release")
    nb, _ = repairs.repair(read(name), release)
    nbformat.validate(nb)
    graded = {repairs.gid(c): (c.source, c.metadata.nbgrader) for c in nb.cells if repairs.gid(c)}
    for cell in release.cells:
        if repairs.gid(cell) in ("setup", "ex1_test"):
            assert graded[repairs.gid(cell)] == (cell.source, cell.metadata.nbgrader), name
    assert list(graded) == ["setup", "ex1_answer", "ex1_test"]
    assert release == read("release")          # the release, read once per run, is never changed
