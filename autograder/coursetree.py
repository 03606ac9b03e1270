"""An nbgrader course folder built from the repository's ``solutions/``.

nbgrader wants ``source/``, ``release/``, ``submitted/``, ``autograded/``, ``feedback/`` and a
gradebook under one root. We build that tree fresh for each command, so that what is graded
is always what ``solutions/`` says now.
"""

from __future__ import annotations

import logging
import os
import shutil
import warnings
from pathlib import Path

from nbgrader import api as nbgrader_api
from nbgrader.apps import NbGraderAPI
from nbgrader.coursedir import CourseDirectory
from nbgrader.preprocessors import (AssignLatePenalties, CheckCellMetadata, GetGrades,
                                    IgnorePattern, LimitOutput, SaveAutoGrades)
from nbconvert.preprocessors import ClearMetadataPreprocessor
from sqlalchemy import event
from sqlalchemy.engine import Engine
from traitlets.config import Config

from . import contract, scratch
from .executor import CourseExecute
from .feedback import FeedbackExporter
from .preprocessors import HideHiddenTests, StderrIsNotFailure
from .runlog import write_atomic
from .sandbox import Limits, Sandbox, SandboxUnavailable, available, explain_unavailable
from .settings import COURSE_ID, GradingSettings

# nbgrader's gradebook code trips SQLAlchemy 2 autoflush warnings that say nothing to a user.
warnings.filterwarnings("ignore", message=r".*not in session.*")


def _alembic_head() -> str:
    """The gradebook schema's version, read in this process. nbgrader asks the ``alembic``
    command in a subprocess for it (seconds per new gradebook, on every grading run)."""
    import os

    import nbgrader
    from alembic.config import Config as AlembicConfig
    from alembic.script import ScriptDirectory

    config = AlembicConfig()
    config.set_main_option("script_location", os.path.join(os.path.dirname(nbgrader.__file__), "alembic"))
    return ScriptDirectory.from_config(config).get_current_head()


nbgrader_api.get_alembic_version = _alembic_head


def _gradebook_journal(connection, _record) -> None:
    """Each connection to a gradebook (nbgrader opens its own) writes ahead, so that parallel
    workers read it while one writes, and syncs the disk at checkpoints, not at each of the
    commits nbgrader makes, about one per cell as it generates and as it grades
    (benchmarks/gradebook_journal.py): a power cut may lose the last commits, never the
    file, and a rerun grades them again."""
    import sqlite3

    if isinstance(connection, sqlite3.Connection):
        try:
            connection.execute("PRAGMA journal_mode=WAL")
            connection.execute("PRAGMA synchronous=NORMAL")
        except sqlite3.OperationalError:        # a gradebook opened read-only is read as it is
            pass


event.listen(Engine, "connect", _gradebook_journal)

STUB = "# YOUR CODE HERE\nraise NotImplementedError()"
SECRET_FILE = "grading-secret"     # in the course tree; never in a sandbox


class NbGraderError(RuntimeError):
    """nbgrader reported a failure; the message carries its log."""


def nbgrader_config(root: Path, settings: GradingSettings) -> Config:
    c = Config()
    c.CourseDirectory.root = str(root)
    c.CourseDirectory.course_id = COURSE_ID
    c.ClearSolutions.code_stub = {"python": STUB}
    c.Execute.timeout = settings.cell_timeout
    c.CourseExecute.timeout = settings.cell_timeout
    c.CourseExecute.judge = True
    # Each notebook's kernel is started while the previous one is graded (benchmarks/grading.py
    # measures it against COURSE_COLD_KERNELS=1, which starts each when its notebook comes).
    c.CourseExecute.warm_kernels = os.environ.get("COURSE_COLD_KERNELS", "") != "1"
    c.OverwriteCells.add_missing_cells = True
    c.Autograde.autograde_preprocessors = [
        CourseExecute, StderrIsNotFailure, IgnorePattern, ClearMetadataPreprocessor,
        LimitOutput, SaveAutoGrades, AssignLatePenalties, CheckCellMetadata,
    ]
    c.GenerateFeedback.preprocessors = [HideHiddenTests, GetGrades]
    c.GenerateFeedback.exporter_class = FeedbackExporter
    c.FeedbackExporter.bundle_assets = False     # the grader links MathJax in (grade._write_feedback)
    return c


CONFIG_FILE = '''\
"""nbgrader's settings for this course tree, for an instructor's own nbgrader commands here.

Written by the course's grader (autograder/coursetree.py) with every grading run. Grade with
`python -m autograder grade`: it runs each kernel in a sandbox and judges the tests outside
it, which `nbgrader autograde` alone does not. `nbgrader generate_feedback` writes the
course's feedback page (autograder/feedback.py): hidden tests hidden, nothing from a
submission run, MathJax beside each page.
"""

c = get_config()  # noqa: F821 - nbgrader defines it when it reads this file
c.CourseDirectory.course_id = {course_id!r}
c.ClearSolutions.code_stub = {{"python": {stub!r}}}
c.GenerateFeedback.preprocessors = ["autograder.preprocessors.HideHiddenTests",
                                    "nbgrader.preprocessors.GetGrades"]
c.GenerateFeedback.exporter_class = "autograder.feedback.FeedbackExporter"
'''


def write_config_file(root: Path) -> Path:
    """``nbgrader_config.py`` in the course tree: without it every nbgrader command there
    warns, and ``nbgrader generate_feedback`` used nbgrader's page, hidden tests and all."""
    path = Path(root) / "nbgrader_config.py"
    text = CONFIG_FILE.format(course_id=COURSE_ID, stub=STUB)
    if not path.is_file() or path.read_text(encoding="utf-8") != text:   # parallel workers: write once
        write_atomic(path, text)
    return path


THREADS_ENV = "COURSE_KERNEL_THREADS"    # CPU threads per kernel, when the default is not wanted


def threads_from_environment() -> int | None:
    """``$COURSE_KERNEL_THREADS`` as a number of threads, or None when unset or not a positive
    number (for a machine shared with other work: several threads per kernel on too few
    free cores wait on each other's barriers)."""
    value = os.environ.get(THREADS_ENV, "").strip()
    return int(value) if value.isdigit() and int(value) > 0 else None


def thread_environment(threads: int | None) -> dict[str, str]:
    """Environment variables that cap a kernel's (or the judge's) CPU threads; with
    ``threads`` None, ``$COURSE_KERNEL_THREADS`` or else none (the library defaults: one
    per core)."""
    threads = threads or threads_from_environment()
    if not threads:
        return {}
    return {name: str(threads) for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")}


class CourseTree:
    """One nbgrader course folder at ``root``, with the assignments of ``solutions_dir``.

    ``worker`` (a parallel worker's number) and ``threads`` (CPU threads per kernel) are set
    by :mod:`autograder.workers`; a single grader leaves both None. ``grading=False`` is a tree
    that only generates the exercises: it runs no student code, so it needs no sandbox.
    """

    def __init__(self, root: Path, solutions_dir: Path, settings: GradingSettings,
                 worker: int | None = None, threads: int | None = None, grading: bool = True):
        self.root = Path(root)
        self.solutions_dir = Path(solutions_dir)
        self.settings = settings
        self.worker, self.threads = worker, threads
        settings.apply_to_environment()
        sandboxed = grading and not settings.unsandboxed
        if sandboxed and not available():
            raise SandboxUnavailable(
                f"cannot grade in a sandbox: {explain_unavailable()}. To grade without one (your own "
                "notebooks, never students'), pass --unsandboxed.")
        config = nbgrader_config(self.root, settings)
        self.root.mkdir(parents=True, exist_ok=True)
        write_config_file(self.root)
        config.CourseExecute.grading_seed = self.grading_seed()
        if sandboxed:
            config.CourseExecute.sandbox_factory = self.new_sandbox
        self.api = NbGraderAPI(coursedir=CourseDirectory(config=config), config=config)
        self.warm_kernels = config.CourseExecute.warm_kernels      # the grader turns it off for a last notebook
        # nbgrader logs every copied file at INFO; keep our own output readable.
        self.api.log.setLevel(logging.WARNING)

    def grading_seed(self) -> int:
        """The grading secret that every submission's hidden inputs are drawn from (with the
        submission's own answers, :func:`autograder.contract.submission_seed`): ``--seed``,
        else 256 random bits drawn once for this output folder and kept there (readable by
        the grader only), so a resumed run or an unchanged resubmission gets the same inputs.
        It never enters a kernel."""
        import secrets

        path = self.root / SECRET_FILE
        kept = path.read_text().strip() if path.is_file() else None
        if self.settings.seed is not None:
            seed = int(self.settings.seed)
        elif kept:
            seed = int(kept)
        else:
            seed = secrets.randbits(256)
        self.root.mkdir(parents=True, exist_ok=True)
        # Parallel workers open the tree at once: an unchanged secret is not rewritten, and a
        # new one replaces the file whole, so no worker ever reads it half-written.
        if kept != str(seed):
            write_atomic(path, f"{seed}\n")
            path.chmod(0o600)
        return seed

    def new_sandbox(self) -> Sandbox:
        """A fresh sandbox for one notebook (called by the executor for each kernel)."""
        from course.data import heldout

        from .kernel_view import kernel_course, public_data

        # The kernel reads the course as kernel_view makes it: no check, oracle or seed in it;
        # and the data without its test splits (the held-out scores are the grader's).
        view = kernel_course()
        limits = Limits(memory_bytes=int(self.settings.memory_gb * (1 << 30)))
        return Sandbox(scratch.folder("sandbox-"), view / "course", limits,
                       gpu=self.settings.device.startswith("cuda") or self.settings.device == "auto",
                       env={**self.settings.kernel_environment(), **thread_environment(self.threads),
                            "PYTHONPATH": str(view), heldout.ENV: "1"},
                       replaced=public_data())

    @property
    def db_url(self) -> str:
        return self.api.coursedir.db_url

    def assignments(self) -> list[str]:
        return sorted(p.name for p in self.solutions_dir.iterdir()
                      if p.is_dir() and any(p.glob("*.ipynb")))

    def notebooks(self, assignment: str) -> list[str]:
        """Notebook names (without ``.ipynb``) of one assignment."""
        return sorted(p.stem for p in (self.solutions_dir / assignment).glob("*.ipynb"))

    def release_path(self, assignment: str, notebook: str) -> Path:
        return self.root / "release" / assignment / f"{notebook}.ipynb"

    def generate(self, assignment: str) -> Path:
        """Copy the solution into ``source/`` and run nbgrader's generate_assignment."""
        source = self.root / "source" / assignment
        if source.exists():
            shutil.rmtree(source)
        shutil.copytree(self.solutions_dir / assignment, source,
                        ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__"))
        self._check(self.api.generate_assignment(assignment, force=True, create=True),
                    f"generate_assignment {assignment}")
        self._register_time_limits(assignment)
        return self.root / "release" / assignment

    def attach(self, assignment: str) -> None:
        """Grade an assignment that another process generated in this tree (a worker)."""
        self._register_time_limits(assignment)

    def declared_seconds(self, assignment: str) -> int:
        """The time limits an assignment's cells declare in this profile, added up: how long
        grading it may take beyond the default per cell (0 for an unknown assignment)."""
        limits = self.api.config.CourseExecute.get("release_limits", {})
        return sum(seconds for notebook in self.notebooks(assignment)
                   for key, seconds in limits.items() if key.startswith(f"{notebook}/"))

    def _register_time_limits(self, assignment: str) -> None:
        """Per-cell limits come from the released notebook, which students cannot change."""
        limits = dict(self.api.config.CourseExecute.get("release_limits", {}))
        for notebook in self.notebooks(assignment):
            released = contract.read(self.release_path(assignment, notebook))
            limits.update({f"{notebook}/{gid}": sec for gid, sec in
                           contract.time_limits(released, self.settings.profile).items()})
        self.api.config.CourseExecute.release_limits = limits

    @staticmethod
    def _check(result: dict, what: str) -> None:
        if not result.get("success"):
            raise NbGraderError(f"nbgrader {what} failed:\n{result.get('error') or result.get('log')}")
