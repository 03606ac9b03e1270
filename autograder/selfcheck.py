"""Self-check: run one exercise notebook in a fresh kernel and report its visible tests.

This is what a student runs before submitting. It executes a copy (the notebook on disk is
not changed), so it also catches code that only worked because of cells run out of order.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from . import contract
from .contract import Role
from .executor import CourseExecute, SandboxedKernelManager
from .settings import GradingSettings


@dataclass
class CellResult:
    grade_id: str
    points: float
    passed: bool
    message: str


class QuietKernelManager(SandboxedKernelManager):
    """The self-check's kernel: its own start-up log (for example ipykernel's warning about
    TCP without encryption) is not the student's business, so it does not reach the
    terminal. What the notebook's code prints still reaches the notebook's outputs."""

    async def _async_launch_kernel(self, kernel_cmd, **kw):
        kw.setdefault("stdout", subprocess.DEVNULL)
        kw.setdefault("stderr", subprocess.DEVNULL)
        return await super()._async_launch_kernel(kernel_cmd, **kw)


def failure_message(error) -> str:
    """A failed cell's message as the notebook shows it: for the course's checks, what
    Jupyter prints (the message with its likely mistake, after the traceback of the
    student's own code when that raised), without the line on showing the checker's
    traceback; for any other error, its type and message."""
    from course.checks._core import SHOW_TRACEBACK
    from course.i18n import every_form

    shown = [str(line) for line in error.get("traceback", [])]
    if shown and shown[-1] in every_form(SHOW_TRACEBACK):
        return "\n".join(shown[:-1])
    return f"{error.ename}: {error.evalue}"


def check_language(path: Path) -> str:
    """The self-check's language: the learner's (course/i18n.py), else the notebook's (a Chinese
    release self-checks in Chinese)."""
    from course.i18n import language

    return _language_of(contract.read(path)) if Path(path).is_file() else language()


def _language_of(nb) -> str:
    """The learner's language, else the notebook's."""
    from course.i18n import ENGLISH, known_language, language

    chosen = language()
    return chosen if chosen != ENGLISH else known_language(nb.metadata.get("course", {}).get("language"))


@contextlib.contextmanager
def _kernel_language(nb) -> Iterator[None]:
    """The kernel's checks speak the language of this self-check (the kernel reads it from the
    environment), the notebook's when the learner chose none."""
    from course.i18n import ENGLISH

    ours = _language_of(nb)
    if ours == ENGLISH or os.environ.get("COURSE_LANGUAGE"):
        yield
        return
    os.environ["COURSE_LANGUAGE"] = ours
    try:
        yield
    finally:
        del os.environ["COURSE_LANGUAGE"]


def _has_code(source: str) -> bool:
    return any(line.strip() and not line.strip().startswith("#") for line in source.splitlines())


def run_visible_tests(path: Path, settings: GradingSettings) -> list[CellResult]:
    """Run the notebook with the grading executor (no sandbox: it is your own code) and
    report its visible test cells. A time-out or a dead kernel becomes a failed cell."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"No notebook at {path}")
    settings.apply_to_environment()
    nb = contract.read(path)
    limits = {f"{path.stem}/{gid}": sec for gid, sec in contract.time_limits(nb, settings.profile).items()}
    executor = CourseExecute(timeout=settings.cell_timeout, release_limits=limits,
                             judge=False, kernel_name="python3",
                             kernel_manager_class=QuietKernelManager)
    with _kernel_language(nb):
        executor.preprocess(nb, {"metadata": {"path": str(path.parent)}, "nbgrader": {"notebook": path.stem}})
    results = []
    for cell in contract.cells_with_role(nb, Role.VISIBLE, Role.HIDDEN, Role.EVALUATION):
        if not _has_code(cell.source):  # a hidden-test placeholder: only the autograder fills it
            continue
        errors = [o for o in cell.outputs if o.output_type == "error"]
        message = failure_message(errors[0]) if errors else ""
        results.append(CellResult(contract.grade_id(cell) or "?", contract.points(cell), not errors, message))
    return results


def format_report(results: list[CellResult]) -> str:
    """One row per test cell; under a failed one, its full message, as the notebook shows it.
    In the learner's language (course/i18n.py), as the messages are."""
    from course.i18n import composed, translate

    lines = [f"{translate('test cell'):<32} {translate('points'):>6}  {translate('result')}"]
    for r in results:
        lines.append(f"{r.grade_id:<32} {r.points:>6g}  {translate('passed') if r.passed else translate('FAILED')}")
        if not r.passed:
            lines += ["    " + line for line in (r.message or translate("(no message)")).splitlines()]
    earned = sum(r.points for r in results if r.passed)
    total = sum(r.points for r in results)
    lines.append(translate(composed("visible tests: {earned} / {total} points (hidden tests are run by the autograder "
                                    "on fresh inputs)", earned=f"{earned:g}", total=f"{total:g}")))
    return "\n".join(lines)
