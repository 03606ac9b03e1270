"""The notebook contract: what each cell of a course notebook is, and how long it may run.

This is the one place that reads nbgrader's cell metadata. Everything else asks here:

============  ===========================================================  ===============
role          how it is recognised                                         where it runs
============  ===========================================================  ===============
setup         ``grade_id == "setup"``: the imports every later cell needs  kernel
answer        ``nbgrader.solution``: the student's code                    kernel
visible       a graded test cell without hidden tests                      kernel (learning);
                                                                           trusted (score)
hidden        a graded test cell whose source holds hidden tests           trusted
evaluation    a graded cell with ``course.role == "evaluation"`` (capstone  trusted
              held-out scoring)
training      a locked cell with ``course.role == "training"``             kernel
other         prose, demos, plots                                          kernel
============  ===========================================================  ===============

"Trusted" means the grading process, never the student's kernel: the cell's code runs
there, and every call into the student's objects is forwarded to the sandboxed kernel
(:mod:`autograder.remote`). Time limits: ``course.timeout`` in a cell's metadata, either
seconds or ``{profile: seconds}``; other cells use the default limit. Limits are always
read from the released notebook, never from a submission.
"""

from __future__ import annotations

import ast
import enum
import hashlib
import re
from pathlib import Path
from typing import Iterable

import nbformat
from nbformat.notebooknode import NotebookNode

HIDDEN_BEGIN = "### BEGIN HIDDEN TESTS"
HIDDEN_END = "### END HIDDEN TESTS"
HIDDEN_PLACEHOLDER = "# (hidden tests: their code is not shown in feedback)"
SETUP_ID = "setup"


# What the executor writes as a cell's error when the cell did not finish on its own: the
# grader's notes read these names (they are also what a student sees in the feedback).
KERNEL_DIED = "KernelDied"          # the kernel died while the cell ran
NOT_RUN = "NotRun"                  # a later cell, not run after a death or a stop
TIMED_OUT = "CellTimeoutError"      # the cell ran past its time limit


class Role(str, enum.Enum):
    SETUP = "setup"
    ANSWER = "answer"
    VISIBLE = "visible"
    HIDDEN = "hidden"
    EVALUATION = "evaluation"
    TRAINING = "training"
    OTHER = "other"


#: Roles whose verdict (the points of the cell) is decided in the trusted process.
JUDGED = frozenset({Role.VISIBLE, Role.HIDDEN, Role.EVALUATION})


def nbgrader_meta(cell: NotebookNode) -> dict:
    """A cell's nbgrader metadata; {} when absent or not a mapping (a hand-edited notebook)."""
    meta = (cell.get("metadata") or {}).get("nbgrader") if isinstance(cell.get("metadata"), dict) else None
    return meta if isinstance(meta, dict) else {}


def course_meta(cell: NotebookNode) -> dict:
    meta = (cell.get("metadata") or {}).get("course") if isinstance(cell.get("metadata"), dict) else None
    return meta if isinstance(meta, dict) else {}


def grade_id(cell: NotebookNode) -> str | None:
    return nbgrader_meta(cell).get("grade_id")


def points(cell: NotebookNode) -> float:
    return float(nbgrader_meta(cell).get("points", 0) or 0)


def is_graded(cell: NotebookNode) -> bool:
    return bool(nbgrader_meta(cell).get("grade"))


def has_hidden_tests(source: str) -> bool:
    return HIDDEN_BEGIN in source


def role(cell: NotebookNode) -> Role:
    """The role of one cell (see the module docstring)."""
    if cell.get("cell_type") != "code":
        return Role.OTHER
    meta, declared = nbgrader_meta(cell), course_meta(cell).get("role")
    if meta.get("solution"):
        return Role.ANSWER
    if meta.get("grade_id") == SETUP_ID:
        return Role.SETUP
    if meta.get("grade"):
        if declared == Role.EVALUATION.value:
            return Role.EVALUATION
        return Role.HIDDEN if has_hidden_tests(cell.source) else Role.VISIBLE
    if declared == Role.TRAINING.value:
        return Role.TRAINING
    return Role.OTHER


def is_locked(cell: NotebookNode) -> bool:
    """Cells the student must not change: locked ones and graded tests."""
    meta = nbgrader_meta(cell)
    return bool(meta.get("grade_id")) and bool(meta.get("locked") or (meta.get("grade") and not meta.get("solution")))


def time_limit(cell: NotebookNode, profile: str, default: int) -> int:
    """Seconds this cell may run in ``profile``: its declared limit, else ``default``."""
    declared = course_meta(cell).get("timeout")
    seconds = declared.get(profile) if isinstance(declared, dict) else declared
    return int(seconds) if seconds else int(default)


def read(path: Path) -> NotebookNode:
    return nbformat.read(Path(path), as_version=4)


def cells_with_role(nb: NotebookNode, *roles: Role) -> Iterable[NotebookNode]:
    return (c for c in nb.cells if role(c) in roles)


def time_limits(nb: NotebookNode, profile: str) -> dict[str, int]:
    """grade_id -> declared limit in ``profile``, for the cells that declare one."""
    return {grade_id(c): time_limit(c, profile, 0) for c in nb.cells
            if grade_id(c) and course_meta(c).get("timeout") is not None and time_limit(c, profile, 0)}


def strip_hidden_region(source: str) -> tuple[str, bool]:
    """Remove the lines between the hidden-test markers; say whether any were removed."""
    pattern = re.compile(rf"^[ \t]*{re.escape(HIDDEN_BEGIN)}.*?^[ \t]*{re.escape(HIDDEN_END)}[^\n]*\n?",
                         re.MULTILINE | re.DOTALL)
    stripped, count = pattern.subn(HIDDEN_PLACEHOLDER + "\n", source)
    return stripped, count > 0


def submission_seed(secret: int, nb: NotebookNode) -> int:
    """The seed of one submission's hidden inputs: from the grader's secret and the
    submission's answers (their cells' ids and sources), so an unchanged submission is graded
    on the same inputs and a changed one on new inputs, and nothing learned about one
    submission's inputs applies to another."""
    digest = hashlib.sha256(f"{secret}".encode())
    for cell in nb.cells:
        if role(cell) is Role.ANSWER:
            digest.update(f"\x00{grade_id(cell)}\x00{cell.source}".encode("utf-8", "surrogatepass"))
    return int.from_bytes(digest.digest(), "big")


def setup_imports(nb: NotebookNode) -> str:
    """The import statements of the set-up cell: what the trusted side binds before it runs
    a test cell (``checks``, ``torch``, ...). Only imports: nothing else of the cell runs
    outside the kernel."""
    for cell in nb.cells:
        if role(cell) is Role.SETUP:
            tree = ast.parse(cell.source)
            imports = [node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))]
            return ast.unparse(ast.Module(body=imports, type_ignores=[]))
    return ""
