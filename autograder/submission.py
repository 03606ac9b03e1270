"""Look at a submitted notebook before nbgrader does: is it readable, what was changed?

nbgrader restores deleted and edited test cells silently; we restore them too (through
nbgrader) but also write down what the student changed, so the grade can be explained.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
from nbformat.reader import NotJSONError

from .preprocessors import HIDDEN_PLACEHOLDER, strip_hidden_region


@dataclass
class Inspection:
    """What we learnt from a submitted notebook before grading it."""

    readable: bool = True
    problem: str = ""                                   # why it cannot be graded
    deleted_cells: list[str] = field(default_factory=list)
    edited_cells: list[str] = field(default_factory=list)

    def notes(self) -> list[str]:
        notes = []
        if self.deleted_cells:
            notes.append("locked cells deleted (restored from the original and graded): "
                         + ", ".join(self.deleted_cells))
        if self.edited_cells:
            notes.append("locked cells edited (restored from the original and graded): "
                         + ", ".join(self.edited_cells))
        return notes


def _locked_sources(nb: nbformat.NotebookNode) -> dict[str, str]:
    """grade_id -> source, for every cell the student must not change."""
    out = {}
    for cell in nb.cells:
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if meta.get("grade_id") and (meta.get("locked") or (meta.get("grade") and not meta.get("solution"))):
            out[meta["grade_id"]] = cell.source
    return out


def _comparable(source: str) -> str:
    """Source without hidden tests or surrounding blank lines: a solutions notebook
    (hidden tests present) and its release (hidden tests removed) compare equal."""
    return strip_hidden_region(source)[0].replace(HIDDEN_PLACEHOLDER, "").strip()


def inspect_submission(path: Path, release_path: Path) -> Inspection:
    """Compare a submitted notebook with the released one it started from."""
    try:
        with open(path, encoding="utf-8") as f:
            submitted = nbformat.read(f, as_version=4)
        nbformat.validate(submitted)
    except FileNotFoundError:
        return Inspection(readable=False, problem=f"notebook not submitted ({path.name} missing)")
    except (json.JSONDecodeError, UnicodeDecodeError, NotJSONError) as err:
        return Inspection(readable=False, problem=f"notebook is not valid JSON ({str(err)[:200]})")
    except Exception as err:  # nbformat raises several types for malformed notebooks
        return Inspection(readable=False, problem=f"notebook is not a valid notebook ({type(err).__name__}: "
                                                  f"{str(err).splitlines()[0][:200]})")
    with open(release_path, encoding="utf-8") as f:
        released = nbformat.read(f, as_version=4)
    expected = _locked_sources(released)
    present = {}
    for cell in submitted.cells:
        grade_id = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        if grade_id:
            present[grade_id] = cell.source
    found = Inspection()
    for grade_id, source in expected.items():
        if grade_id not in present:
            found.deleted_cells.append(grade_id)
        elif _comparable(present[grade_id]) != _comparable(source):
            found.edited_cells.append(grade_id)
    return found


def restore_deleted_cells(path: Path, release_path: Path, missing: list[str]) -> None:
    """Put deleted locked cells back, each after the nearest earlier cell that is still there.

    nbgrader's ``add_missing_cells`` restores only graded cells; a deleted set-up cell (the
    imports every test needs) would otherwise zero the whole notebook.
    """
    if not missing:
        return
    submitted = nbformat.read(path, as_version=4)
    released = nbformat.read(release_path, as_version=4)

    def gid(cell):
        return cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")

    for index, cell in enumerate(released.cells):
        if gid(cell) not in missing:
            continue
        position = 0
        for earlier in reversed(released.cells[:index]):
            ids = [gid(c) for c in submitted.cells]
            if gid(earlier) in ids:
                position = ids.index(gid(earlier)) + 1
                break
        submitted.cells.insert(position, cell)
    nbformat.write(submitted, path)
