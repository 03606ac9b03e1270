"""Look at a submitted notebook before nbgrader does: is it readable, what was changed?

nbgrader restores deleted and edited test cells silently; we restore them too (through
nbgrader, and :mod:`autograder.repairs`) but also write down what the student changed, so
the grade can be explained. Each submitted notebook is read here once.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
from nbformat.reader import NotJSONError

from .repairs import comparable, gid, locked_sources


@dataclass
class Inspection:
    """What we learnt from a submitted notebook before grading it."""

    readable: bool = True
    problem: str = ""                                   # why it cannot be graded
    deleted_cells: list[str] = field(default_factory=list)
    edited_cells: list[str] = field(default_factory=list)
    notebook: nbformat.NotebookNode | None = None       # the submission as read, when readable

    def notes(self) -> list[str]:
        notes = []
        if self.deleted_cells:
            notes.append("locked cells deleted (restored from the original and graded): "
                         + ", ".join(self.deleted_cells))
        if self.edited_cells:
            notes.append("locked cells edited (restored from the original and graded): "
                         + ", ".join(self.edited_cells))
        return notes


def read_release(path: Path) -> nbformat.NotebookNode:
    """A released notebook (the grader's own file)."""
    with open(path, encoding="utf-8") as f:
        return nbformat.read(f, as_version=4)


def inspect_submission(path: Path, released: nbformat.NotebookNode,
                       translated: list[nbformat.NotebookNode] | tuple = ()) -> Inspection:
    """Read a submitted notebook, once, and compare it with the released one it started from;
    the notebook read is ``Inspection.notebook`` (the scan and the repairs work on it).
    ``translated``: the same release in other languages (:mod:`autograder.translation`), whose
    Markdown is translated and code the same: a locked cell as one of them has it is unedited."""
    try:
        with open(path, encoding="utf-8") as f, warnings.catch_warnings():
            warnings.simplefilter("ignore")        # duplicated cell ids: the repairs renumber them
            submitted = nbformat.read(f, as_version=4)
            nbformat.validate(submitted)
    except FileNotFoundError:
        return Inspection(readable=False, problem=f"notebook not submitted ({path.name} missing)")
    except (json.JSONDecodeError, UnicodeDecodeError, NotJSONError) as err:
        return Inspection(readable=False, problem=f"notebook is not valid JSON ({str(err)[:200]})")
    except Exception as err:  # nbformat raises several types for malformed notebooks
        return Inspection(readable=False, problem=f"notebook is not a valid notebook ({type(err).__name__}: "
                                                  f"{str(err).splitlines()[0][:200]})")
    present: dict[str, list[str]] = {}
    for cell in submitted.cells:
        grade_id = gid(cell)
        if grade_id:
            present.setdefault(grade_id, []).append(cell.source)
    found = Inspection(notebook=submitted)
    as_released: dict[str, set[str]] = {}
    for release in (released, *translated):
        for grade_id, source in locked_sources(release).items():
            as_released.setdefault(grade_id, set()).add(comparable(source))
    for grade_id in locked_sources(released):
        if grade_id not in present:
            found.deleted_cells.append(grade_id)
        elif any(comparable(copy) not in as_released[grade_id] for copy in present[grade_id]):
            found.edited_cells.append(grade_id)
    return found
