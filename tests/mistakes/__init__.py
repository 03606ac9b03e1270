"""Realistic wrong answers, one module per assignment (named after it), each a list MISTAKES.

Every mistake must lose points and get the hint written for it: checked in-process
(tests/test_checks_inprocess.py) and through the real autograder (tests/test_grading_e2e.py).
"""

from __future__ import annotations

import importlib
from pathlib import Path

from notebook_tools import ROOT, Mistake


def assignments() -> list[str]:
    return sorted(p.name for p in (ROOT / "solutions").iterdir() if p.is_dir() and any(p.glob("*.ipynb")))


def mistakes_for(assignment: str) -> list[Mistake]:
    return list(importlib.import_module(f"mistakes.{assignment}").MISTAKES)


def all_mistakes() -> list[tuple[str, Mistake]]:
    """(assignment, mistake) for every assignment; an assignment without a module fails loudly."""
    out = []
    for assignment in assignments():
        if not (Path(__file__).parent / f"{assignment}.py").is_file():
            raise FileNotFoundError(f"tests/mistakes/{assignment}.py is missing: every assignment needs wrong answers")
        out += [(assignment, m) for m in mistakes_for(assignment)]
    return out


def e2e_mistakes() -> list[tuple[str, Mistake]]:
    """One mistake per assignment, also graded through the real autograder: the first of the
    module's set ``E2E`` (or the first with ``e2e=True``). End to end shows what only the real
    grader can (the trusted judge's path, the hint reaching the feedback); the in-process
    tests cover every mistake, and grading each one end to end would cost a kernel run."""
    out = []
    for assignment in assignments():
        chosen = getattr(importlib.import_module(f"mistakes.{assignment}"), "E2E", None)
        picked = [m for m in mistakes_for(assignment) if m.e2e and (chosen is None or m.name in chosen)]
        out += [(assignment, m) for m in picked[:1]]
    return out
