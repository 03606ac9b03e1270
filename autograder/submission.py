"""Look at a submitted notebook before nbgrader does: is it readable, what was changed?

nbgrader restores deleted and edited test cells silently; we restore them too (through
nbgrader) but also write down what the student changed, so the grade can be explained.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
from nbformat.reader import NotJSONError

from . import contract
from .contract import HIDDEN_PLACEHOLDER, strip_hidden_region


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


_meta = contract.nbgrader_meta


def _locked_sources(nb: nbformat.NotebookNode) -> dict[str, str]:
    """grade_id -> source, for every cell the student must not change."""
    out = {}
    for cell in nb.cells:
        meta = _meta(cell)
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
        with open(path, encoding="utf-8") as f, warnings.catch_warnings():
            warnings.simplefilter("ignore")        # duplicated cell ids: normalize_cells renumbers them
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
    present: dict[str, list[str]] = {}
    for cell in submitted.cells:
        grade_id = _gid(cell)
        if grade_id:
            present.setdefault(grade_id, []).append(cell.source)
    found = Inspection()
    for grade_id, source in expected.items():
        if grade_id not in present:
            found.deleted_cells.append(grade_id)
        elif any(_comparable(copy) != _comparable(source) for copy in present[grade_id]):
            found.edited_cells.append(grade_id)
    return found


# nbgrader metadata that decides how a cell is graded; the student's copy must match the release.
GRADING_KEYS = ("grade", "solution", "locked", "points", "task")


def _gid(cell) -> str | None:
    grade_id = _meta(cell).get("grade_id")
    return grade_id if isinstance(grade_id, str) and grade_id else None


def normalize_cells(path: Path, release_path: Path) -> list[str]:
    """Make a submitted notebook (a copy we own) acceptable to nbgrader; return what was changed.

    nbgrader fails the whole notebook ("see the above traceback", a ``KeyError: 'grade_id'``)
    when two cells carry the same grade_id -- what copy-pasting a cell in Jupyter does -- or
    when a cell carries nbgrader metadata with an id it does not know. So, before grading:

    * a duplicated answer cell: the LAST copy keeps the id; the earlier copies lose their
      nbgrader metadata and stay in place as ordinary cells. Nothing the student wrote is
      dropped and the notebook runs top to bottom as "Restart & Run All" would: the code in
      effect when the tests run is the same either way, and the last copy is also the one
      nbgrader itself would keep (its ``DeduplicateIds`` keeps the last);
    * a duplicated locked cell (a test, the set-up): the copy that matches the release keeps
      the id (the last such copy if several do, the last copy if none does) and the other
      copies are removed: a test is graded once, from the released source;
    * a cell with an id the release does not have (or nbgrader metadata without an id)
      becomes an ordinary cell;
    * grading metadata changed by the student (``grade``, ``points``, ``locked``...) is put
      back as released;
    * duplicated Jupyter cell ids are renumbered (nbformat would warn on every read).
    """
    import uuid

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")              # duplicated cell ids: renumbered below
        submitted = nbformat.read(path, as_version=4)
        released = nbformat.read(release_path, as_version=4)
    release_meta = {_gid(c): (_meta(c), c.source) for c in released.cells if _gid(c)}
    notes: list[str] = []
    changed = False

    unknown = []
    for cell in submitted.cells:
        meta = cell.get("metadata", {})
        if "nbgrader" in meta and _gid(cell) not in release_meta:
            claimed = _meta(cell)
            if not isinstance(meta["nbgrader"], dict):
                unknown.append("(malformed metadata)")
            elif _gid(cell) or claimed.get("grade") or claimed.get("solution") or claimed.get("locked"):
                unknown.append(_gid(cell) or "(no id)")
            del meta["nbgrader"]
            changed = True
    if unknown:
        notes.append("cells with nbgrader ids the assignment does not have, run as ordinary cells: "
                     + ", ".join(sorted(set(unknown))))

    positions: dict[str, list[int]] = {}
    for index, cell in enumerate(submitted.cells):
        if _gid(cell):
            positions.setdefault(_gid(cell), []).append(index)
    drop: set[int] = set()
    for grade_id, where in positions.items():
        if len(where) < 2:
            continue
        changed = True
        meta, source = release_meta[grade_id]
        if meta.get("locked") and not meta.get("solution"):
            pristine = [i for i in where if _comparable(submitted.cells[i].source) == _comparable(source)]
            keep = (pristine or where)[-1]
            drop.update(i for i in where if i != keep)
            others = "the other copy" if len(where) == 2 else f"the {len(where) - 1} other copies"
            notes.append(f"duplicated cell {grade_id}: kept the released copy and removed {others}")
        else:
            for i in where[:-1]:
                del submitted.cells[i].metadata["nbgrader"]
            others = ("the earlier copy runs as an ordinary cell" if len(where) == 2
                      else f"the {len(where) - 1} earlier copies run as ordinary cells")
            notes.append(f"duplicated cell {grade_id}: kept the last copy as the answer ({others})")
    if drop:
        submitted.cells = [c for i, c in enumerate(submitted.cells) if i not in drop]

    restored = []
    for cell in submitted.cells:
        grade_id = _gid(cell)
        if not grade_id:
            continue
        meta = cell.metadata.nbgrader
        original = release_meta[grade_id][0]
        if any(meta.get(k) != original.get(k) for k in GRADING_KEYS):
            for key in GRADING_KEYS:
                if key in original:
                    meta[key] = original[key]
                else:
                    meta.pop(key, None)
            restored.append(grade_id)
            changed = True
    if restored:
        notes.append("nbgrader metadata edited (restored from the original): " + ", ".join(restored))

    seen_ids: set[str] = set()
    for cell in submitted.cells:
        if "id" in cell:
            if cell.id in seen_ids:
                cell.id = uuid.uuid4().hex[:8]
                changed = True
            seen_ids.add(cell.id)
    if changed:
        nbformat.write(submitted, path)
    return notes


def restore_deleted_cells(path: Path, release_path: Path, missing: list[str]) -> None:
    """Put deleted locked cells back, each after the nearest earlier cell that is still there.

    nbgrader's ``add_missing_cells`` restores only graded cells; a deleted set-up cell (the
    imports every test needs) would otherwise zero the whole notebook.
    """
    if not missing:
        return
    submitted = nbformat.read(path, as_version=4)
    released = nbformat.read(release_path, as_version=4)

    gid = _gid

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
