"""The repairs a submitted notebook gets before nbgrader grades it, as nbgrader preprocessors.

nbgrader fails a whole notebook ("see the above traceback", a ``KeyError: 'grade_id'``) when
two cells carry the same grade_id -- what copy-pasting a cell in Jupyter does -- or when a
cell carries nbgrader metadata with an id it does not know; and its ``add_missing_cells``
puts back only graded cells, so a deleted set-up cell (the imports every test needs) would
zero the notebook. Each preprocessor here takes the released notebook from
``resources["release"]`` and appends what it changed, in words for the student's row, to
``resources["repairs"]``. The grader runs them on the notebook it read once
(:func:`repair`); tests run them on fixture notebooks, as nbgrader's own are tested.
"""

from __future__ import annotations

import copy
import uuid

from nbformat import NotebookNode
from nbgrader.preprocessors import NbGraderPreprocessor

from .contract import HIDDEN_PLACEHOLDER, nbgrader_meta, strip_hidden_region

# nbgrader metadata that decides how a cell is graded; the student's copy must match the release.
GRADING_KEYS = ("grade", "solution", "locked", "points", "task")


def gid(cell) -> str | None:
    grade_id = nbgrader_meta(cell).get("grade_id")
    return grade_id if isinstance(grade_id, str) and grade_id else None


def comparable(source: str) -> str:
    """Source without hidden tests or surrounding blank lines: a solutions notebook
    (hidden tests present) and its release (hidden tests removed) compare equal."""
    return strip_hidden_region(source)[0].replace(HIDDEN_PLACEHOLDER, "").strip()


def locked_sources(nb: NotebookNode) -> dict[str, str]:
    """grade_id -> source, for every cell the student must not change."""
    out = {}
    for cell in nb.cells:
        meta = nbgrader_meta(cell)
        if meta.get("grade_id") and (meta.get("locked") or (meta.get("grade") and not meta.get("solution"))):
            out[meta["grade_id"]] = cell.source
    return out


class _Repair(NbGraderPreprocessor):
    @staticmethod
    def _released(resources: dict) -> dict[str, tuple[dict, str]]:
        """grade_id -> (nbgrader metadata, source) of the released notebook's cells."""
        return {gid(c): (nbgrader_meta(c), c.source) for c in resources["release"].cells if gid(c)}

    @staticmethod
    def _note(resources: dict, note: str) -> None:
        resources.setdefault("repairs", []).append(note)


class UnknownIdsAsOrdinaryCells(_Repair):
    """A cell with nbgrader metadata whose id the release does not have (or none, or metadata
    that is not a mapping) becomes an ordinary cell: it runs, and grades nothing."""

    def preprocess(self, nb, resources):
        released = self._released(resources)
        unknown = []
        for cell in nb.cells:
            meta = cell.get("metadata", {})
            if "nbgrader" not in meta or gid(cell) in released:
                continue
            claimed = nbgrader_meta(cell)
            if not isinstance(meta["nbgrader"], dict):
                unknown.append("(malformed metadata)")
            elif gid(cell) or claimed.get("grade") or claimed.get("solution") or claimed.get("locked"):
                unknown.append(gid(cell) or "(no id)")
            del meta["nbgrader"]
        if unknown:
            self._note(resources, "cells with nbgrader ids the assignment does not have, run as ordinary "
                                  "cells: " + ", ".join(sorted(set(unknown))))
        return nb, resources


class OneCellPerId(_Repair):
    """Duplicated cells, one kept per grade_id.

    * an answer cell: the LAST copy keeps the id; the earlier copies lose their nbgrader
      metadata and stay in place as ordinary cells, so nothing the student wrote is dropped and
      the code in effect when the tests run is what "Restart & Run All" would give (nbgrader's
      own ``DeduplicateIds`` also keeps the last);
    * a locked cell (a test, the set-up): the copy that matches the release keeps the id (the
      last such copy if several do, the last copy if none does), the others are removed: a test
      is graded once, from the released source.
    """

    def preprocess(self, nb, resources):
        released = self._released(resources)
        positions: dict[str, list[int]] = {}
        for index, cell in enumerate(nb.cells):
            if gid(cell):
                positions.setdefault(gid(cell), []).append(index)
        drop: set[int] = set()
        for grade_id, where in positions.items():
            if len(where) < 2:
                continue
            meta, source = released[grade_id]
            if meta.get("locked") and not meta.get("solution"):
                pristine = [i for i in where if comparable(nb.cells[i].source) == comparable(source)]
                keep = (pristine or where)[-1]
                drop.update(i for i in where if i != keep)
                others = "the other copy" if len(where) == 2 else f"the {len(where) - 1} other copies"
                self._note(resources, f"duplicated cell {grade_id}: kept the released copy and removed {others}")
            else:
                for i in where[:-1]:
                    del nb.cells[i].metadata["nbgrader"]
                others = ("the earlier copy runs as an ordinary cell" if len(where) == 2
                          else f"the {len(where) - 1} earlier copies run as ordinary cells")
                self._note(resources, f"duplicated cell {grade_id}: kept the last copy as the answer ({others})")
        nb.cells = [c for i, c in enumerate(nb.cells) if i not in drop]
        return nb, resources


class GradingMetadataAsReleased(_Repair):
    """Grading metadata the student changed (``grade``, ``points``, ``locked``...) put back."""

    def preprocess(self, nb, resources):
        released = self._released(resources)
        restored = []
        for cell in nb.cells:
            if not gid(cell):
                continue
            meta, original = cell.metadata.nbgrader, released[gid(cell)][0]
            if any(meta.get(k) != original.get(k) for k in GRADING_KEYS):
                for key in GRADING_KEYS:
                    if key in original:
                        meta[key] = original[key]
                    else:
                        meta.pop(key, None)
                restored.append(gid(cell))
        if restored:
            self._note(resources, "nbgrader metadata edited (restored from the original): " + ", ".join(restored))
        return nb, resources


class DeletedLockedCellsBack(_Repair):
    """Every deleted locked cell put back, each after the nearest earlier released cell that is
    still there (the set-up cell included, which nbgrader would not restore)."""

    def preprocess(self, nb, resources):
        release = resources["release"]
        present = {gid(c) for c in nb.cells}
        missing = [g for g in locked_sources(release) if g not in present]
        for index, cell in enumerate(release.cells):
            if gid(cell) not in missing:
                continue
            position = 0
            for earlier in reversed(release.cells[:index]):
                ids = [gid(c) for c in nb.cells]
                if gid(earlier) in ids:
                    position = ids.index(gid(earlier)) + 1
                    break
            nb.cells.insert(position, copy.deepcopy(cell))
        return nb, resources


class UniqueCellIds(_Repair):
    """Duplicated Jupyter cell ids renumbered (nbformat would warn on every read)."""

    def preprocess(self, nb, resources):
        seen: set[str] = set()
        for cell in nb.cells:
            if "id" in cell:
                if cell.id in seen:
                    cell.id = uuid.uuid4().hex[:8]
                seen.add(cell.id)
        return nb, resources


REPAIRS = (UnknownIdsAsOrdinaryCells, OneCellPerId, GradingMetadataAsReleased, DeletedLockedCellsBack,
           UniqueCellIds)


def repair(submitted: NotebookNode, released: NotebookNode) -> tuple[NotebookNode, list[str]]:
    """``submitted`` (changed in place) made gradable by nbgrader, and what was changed, in words."""
    resources: dict = {"release": released, "repairs": []}
    for step in REPAIRS:
        submitted, resources = step().preprocess(submitted, resources)
    return submitted, resources["repairs"]
