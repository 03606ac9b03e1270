"""Code cells of a solution notebook as plain Python, markers removed.

Used by the benchmarks (to train the reference solution outside a notebook) and by the
tests (to build student submissions from the solution).
"""

from __future__ import annotations

import re
from pathlib import Path

from . import contract
from .contract import Role

_MARKER = re.compile(r"^[ \t]*### (BEGIN|END) SOLUTION[^\n]*\n", re.MULTILINE)


def strip_markers(source: str) -> str:
    return _MARKER.sub("", source)


def solution_namespace(notebook: Path, cell_ids: set[str] | None = None) -> dict:
    """Execute the set-up cell and the answer cells (or ``cell_ids``) in a fresh namespace."""
    namespace: dict = {"__name__": "__main__"}
    for cell in contract.read(Path(notebook)).cells:
        gid = contract.grade_id(cell)
        wanted = gid in cell_ids if cell_ids else contract.role(cell) in (Role.ANSWER, Role.SETUP)
        if cell.cell_type == "code" and wanted:
            exec(compile(strip_markers(cell.source), gid or "cell", "exec"), namespace)
    return namespace
