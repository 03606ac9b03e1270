"""Grade a folder of submissions: nbgrader autograde, the gradebook, a CSV and feedback.

Layout of the submissions folder::

    <submissions>/<student>/<assignment>/<notebook>.ipynb

A folder laid out like ``solutions/`` or ``exercises/`` (``<assignment>/<notebook>.ipynb``)
is graded as one student named after the folder.

Every entry of the submissions folder gets a row in ``grades.csv``, with one of these
statuses (the reason is in ``notes``):

``graded``
    nbgrader ran the notebook; the score is what its tests gave. Notes explain anything the
    grader repaired (deleted or edited locked cells, a duplicated cell, a time-out, a dead
    kernel). Notes that start with ``review:`` are tamper evidence from a static scan of
    the student's code (see :mod:`autograder.tamper`): for a person to read. They change no
    score, but for one case: code that can switch off a rule the grader sets up in the kernel
    (a forbidden built-in, a recorded tensor size) fails the tests that rely on one, with the
    finding as the reason, until an instructor has looked.
``broken``
    a submission that could not be graded (notebook missing or unreadable, nbgrader
    failed, with its real error): zero for what could not be graded.
``refused``
    a symbolic link (to a notebook, an assignment folder or a student folder) or a
    notebook that is not a regular file: never followed or read, scored zero.
``skipped``
    a folder (or file) that is not a submission: an unknown or misspelt assignment folder
    (the closest known name is suggested), a hidden folder, a student folder without any
    assignment folder, a notebook outside its assignment folder. Score 0; max_score 0
    unless the assignment is known.

Only ``.ipynb_checkpoints``, ``__pycache__`` and ``__MACOSX`` folders and hidden files
(``.DS_Store``) are passed over without a row.

Any folder name works for a student: nbgrader globs student ids, so each student is graded
under a safe internal id (the name itself when it is plain, else a slug and a hash; the map
is in ``nbgrader/student_ids.json``), and the real name is used in the CSV and the feedback
path. ``grades.csv`` is written row by row, a second run on the same ``--out`` is refused
while one is going on, and a killed run resumes: see :mod:`autograder.runlog`.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import itertools
import json
import os
import re
import shutil
import traceback
from pathlib import Path

import nbformat
from nbgrader.api import Gradebook, MissingEntry
from tqdm.auto import tqdm

from . import contract, preflight
from .coursetree import CourseTree
from .feedback import NOTES_MARK, install_assets, notes_html, render_plain
from .preflight import GraderBroken, SetupFailed  # noqa: F401 - GraderBroken: part of the API
from .runlog import (CSV_COLUMNS, OutputLocked, RunLog, code_fingerprint, fingerprint, row_key,  # noqa: F401
                     write_atomic)
from .repairs import repair
from .settings import GradingSettings
from .submission import inspect_submission, read_release
from .result import WORK_DIR, GradeResult, collect, copy_tree, record
from .rows import Found, GradeRow  # noqa: F401 - Found: part of the API
from .tamper import REVIEW, scan_notebook
from .translation import translated_releases

IGNORED = {".ipynb_checkpoints", "__pycache__", "__MACOSX"}


def _is_dir(path: Path) -> bool:
    return not path.is_symlink() and path.is_dir()


def _suggest(name: str, assignments: list[str]) -> str:
    lowered = {a.lower(): a for a in assignments}
    match = difflib.get_close_matches(name.lower(), list(lowered), n=1, cutoff=0.6)
    return f"; did you mean {lowered[match[0]]}?" if match else ""


def _student_entries(student: str, folder: Path, assignments: list[str]) -> list[Found]:
    out: list[Found] = []
    entries = sorted(folder.iterdir(), key=lambda p: p.name)
    for entry in entries:
        name = entry.name
        if name in IGNORED:
            continue
        if entry.is_symlink():
            out.append(Found(student, name, status="refused",
                             reason=f"{name} is a symbolic link (to {_link_target(entry)}); links are not "
                                    f"followed, so it was not graded"))
        elif entry.is_dir():
            if name in assignments:
                out.append(Found(student, name, folder=entry))
            elif name.startswith("."):
                out.append(Found(student, name, status="skipped",
                                 reason=f"hidden folder {name} (its name starts with '.'), not graded"))
            else:
                out.append(Found(student, name, status="skipped",
                                 reason=f"unknown assignment folder {name!r}{_suggest(name, assignments)} "
                                        f"(assignments: {', '.join(assignments)}); not graded"))
        elif entry.suffix == ".ipynb" and entry.stem in assignments and not _is_dir(folder / entry.stem) \
                and not (folder / entry.stem).is_symlink():
            out.append(Found(student, entry.stem, status="skipped",
                             reason=f"{name} is not in its assignment folder (expected "
                                    f"{student}/{entry.stem}/{name}); not graded"))
    if not out:
        seen = [p.name for p in entries if p.name not in IGNORED and not p.name.startswith(".")]
        listing = f"; found: {', '.join(seen[:5])}{' ...' if len(seen) > 5 else ''}" if seen else "; it is empty"
        out.append(Found(student, "", status="skipped",
                         reason=f"no assignment folder (expected {student}/<assignment>/<notebook>.ipynb "
                                f"with an assignment among {', '.join(assignments)}){listing}"))
    return out


def find_submissions(folder: Path, assignments: list[str], exclude: Path | None = None) -> list[Found]:
    """Every entry under ``folder``: the submissions to grade and the rows to report as they are.

    ``exclude`` (the output folder, when it lies inside ``folder``) is passed over.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"No submissions folder at {folder}")
    if any((folder / a).is_dir() or (folder / a).is_symlink() for a in assignments):   # solutions/ or exercises/
        return _student_entries(folder.resolve().name, folder, assignments)
    found: list[Found] = []
    for entry in sorted(folder.iterdir(), key=lambda p: p.name):
        name = entry.name
        if name in IGNORED or (exclude is not None and _same(entry, exclude)):
            continue
        if entry.is_symlink():
            found.append(Found(name, "", status="refused",
                               reason=f"the student folder {name} is a symbolic link (to {_link_target(entry)}); "
                                      f"links are not followed, so it was not graded"))
        elif entry.is_dir():
            if name.startswith("."):
                found.append(Found(name, "", status="skipped",
                                   reason=f"hidden folder {name} (its name starts with '.'), not graded"))
            else:
                found.extend(_student_entries(name, entry, assignments))
        elif not name.startswith("."):
            found.append(Found(name, "", status="skipped",
                               reason="a file, not a student folder (expected "
                                      "<student>/<assignment>/<notebook>.ipynb); not graded"))
    return found


def _same(a: Path, b: Path) -> bool:
    try:
        return not a.is_symlink() and a.resolve() == Path(b).resolve()
    except OSError:
        return False


def _link_target(path: Path) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return "?"


_PLAIN_ID = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")


def internal_id(student: str) -> str:
    """A student id nbgrader can use: the name when it is plain, else a slug and a hash.

    nbgrader globs ids (``[``, ``*``, ``?`` would match other folders or nothing) and puts them
    in paths; a generated id contains ``+``, which no plain name does, so ids never collide.
    """
    if _PLAIN_ID.fullmatch(student):
        return student
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", student).strip("._-")[:40] or "student"
    return f"{slug}+{hashlib.sha256(student.encode('utf-8', 'surrogateescape')).hexdigest()[:10]}"


class Grader:
    """Grades submissions into ``out``: ``gradebook.db``, ``grades.csv``, ``feedback/``."""

    def __init__(self, solutions_dir: Path, out: Path, settings: GradingSettings, workers: int = 1,
                 force: bool = False, student: str | None = None, cluster: str | None = None):
        self.out = Path(out)
        self.solutions_dir = Path(solutions_dir)
        self.settings = settings
        self.workers = max(1, int(workers))
        self.force = force              # regrade everything, changed or not
        self.only_student = student     # regrade this student's submissions, keep the other rows
        self.cluster = cluster          # a Ray cluster's address: grade there (autograder.cluster)
        # whether this process grades another notebook after the current one: a kernel is
        # started ahead (autograder/executor.py) only for a notebook that will come
        self.follows = True
        self.course_root = self.out / "nbgrader"
        self.tree: CourseTree | None = None
        self.assignments = sorted(p.name for p in self.solutions_dir.iterdir()
                                  if p.is_dir() and any(p.glob("*.ipynb")))
        self._ids: dict[str, str] = {}
        self._max: dict[str, float] = {}
        self._releases: dict[tuple[str, str], nbformat.NotebookNode] = {}
        self._translations: dict[tuple[str, str], list[nbformat.NotebookNode]] = {}
        self._pool = None               # local workers started early (see _early_pool)

    # ------------------------------------------------------------------ setting up
    def _identity(self, submissions: Path) -> dict:
        """What a later run must share with this one to keep its rows (the submissions folder
        is recorded for reading, not compared: each row has its own digest)."""
        import autograder
        import course

        settings = json.loads(json.dumps(dataclasses.asdict(self.settings), default=str))
        code = code_fingerprint([Path(course.__file__).parent, Path(autograder.__file__).parent])
        return {"submissions": str(Path(submissions).resolve()), "solutions": fingerprint(self.solutions_dir),
                "code": code, "settings": settings}

    def _preflight(self, assignments: list[str]) -> None:
        """Build a throwaway course tree, so that what stops grading (no sandbox, ...) stops it
        before an earlier run's results in ``--out`` are replaced; then run the set-up cells of
        ``assignments`` in a sandbox of it (:mod:`autograder.preflight`): a grader whose kernels
        cannot import the course, read its data or use the device stops with
        :class:`GraderBroken` instead of grading everyone zero."""
        import tempfile

        with tempfile.TemporaryDirectory(prefix="course-preflight-") as tmp:
            tree = CourseTree(Path(tmp), self.solutions_dir, self.settings)
            if assignments:
                preflight.check(tree, assignments, timeout=max(120, self.settings.cell_timeout))

    def _start_fresh(self) -> None:
        for name in ("nbgrader", "feedback"):
            if (self.out / name).exists():
                shutil.rmtree(self.out / name)

    def attach_tree(self, assignments: list[str], source: Path, worker: int | None = None,
                    threads: int | None = None) -> None:
        """Grade in a copy of the course tree that the run's process generated at ``source`` (its
        ``nbgrader/`` folder): what nbgrader writes while grading stays in the copy, and comes
        back as data (:meth:`grade_submission`) for that process to record."""
        copy_tree(Path(source), self.course_root)
        self.tree = CourseTree(self.course_root, self.solutions_dir, self.settings, worker=worker, threads=threads)
        for assignment in assignments:
            self.tree.attach(assignment)

    def _open_tree(self, assignments: list[str]) -> None:
        """The nbgrader course tree, with the assignments this run grades generated (anew)."""
        self.course_root.mkdir(parents=True, exist_ok=True)
        self.tree = CourseTree(self.course_root, self.solutions_dir, self.settings)
        for assignment in assignments:
            self.tree.generate(assignment)
        ids_file = self.course_root / "student_ids.json"
        if ids_file.exists():
            try:
                self._ids = {v: k for k, v in json.loads(ids_file.read_text(encoding="utf-8")).items()}
            except ValueError:
                self._ids = {}

    def student_id(self, student: str) -> str:
        """The internal id of ``student``, recorded in ``nbgrader/student_ids.json``."""
        if student not in self._ids:
            self._ids[student] = internal_id(student)
            write_atomic(self.course_root / "student_ids.json",
                         json.dumps({v: _printable(k) for k, v in sorted(self._ids.items())}, indent=1,
                                    ensure_ascii=False))
        return self._ids[student]

    def _safe_max(self, assignment: str) -> float:
        try:
            return self.max_score(assignment)
        except Exception:
            return 0.0

    def max_score(self, assignment: str) -> float:
        if assignment not in self.assignments:
            return 0.0
        if assignment not in self._max:
            with Gradebook(self.tree.db_url) as gb:
                self._max[assignment] = float(gb.find_assignment(assignment).max_score)
        return self._max[assignment]

    def _release(self, assignment: str, notebook: str):
        """The released notebook (a NotebookNode), read once per run: the repairs copy what
        they take from it, nothing changes it."""
        key = (assignment, notebook)
        if key not in self._releases:
            self._releases[key] = read_release(self.tree.release_path(assignment, notebook))
        return self._releases[key]

    def _translated(self, assignment: str, notebook: str) -> list[nbformat.NotebookNode]:
        """The release in the other languages it is shipped in (exercises-zh/), made from the
        catalogs as `make exercises` makes it: a submission may start from any of them."""
        key = (assignment, notebook)
        if key not in self._translations:
            self._translations[key] = translated_releases(self._release(assignment, notebook),
                                                          self.solutions_dir.parent, assignment)
        return self._translations[key]

    # ------------------------------------------------------------------ the run
    def grade_all(self, submissions: Path, show_progress: bool = True) -> list[GradeRow]:
        log = RunLog(self.out)
        log.acquire()
        try:
            return self._grade_all(Path(submissions), log, show_progress)
        except SetupFailed as err:       # the grader's own fault, found in a student's kernel
            raise GraderBroken(str(err)) from None
        finally:
            shutil.rmtree(self.out / WORK_DIR, ignore_errors=True)
            log.release()

    def _grade_all(self, submissions: Path, log: RunLog, show_progress: bool) -> list[GradeRow]:
        todo = find_submissions(submissions, self.assignments, exclude=self.out)
        if not any(f.status != "skipped" for f in todo):
            found = "; ".join(_printable(f"{f.student}/{f.assignment}: {f.reason}").replace("/: ", ": ")
                              for f in todo[:5])
            raise FileNotFoundError(
                f"No submissions under {submissions}: expected <student>/<assignment>/<notebook>.ipynb "
                f"with assignments {', '.join(self.assignments)}" + (f" (found {found})" if found else ""))
        digests = {f.key: submission_digest(f) for f in todo}
        identity = self._identity(submissions)
        previous = None if self.force else log.previous(identity)
        kept, pending = self._plan(todo, digests, previous, log)
        self._pool = self._early_pool(pending)
        try:
            self._preflight(sorted({f.assignment for f in pending if not f.status}))
            if previous is None:
                self._start_fresh()
            self._drop_stale_feedback(previous, kept, digests)
            self._open_tree(sorted({f.assignment for f in pending if f.assignment in self.assignments}))
        except BaseException:
            if self._pool is not None:
                self._pool.shutdown(wait=False, cancel_futures=True)
            raise
        log.start(identity, kept, previous.digests if previous else {})
        rows = [GradeRow.from_csv(r) for r in kept.values()]
        bar = tqdm(total=len(pending), desc="grading", unit="submission", disable=not show_progress or not pending)
        if pending:        # a rerun that changes nothing has no table to show
            tqdm.write(f"{'student':<24} {'assignment':<22} {'score':>7} {'max':>5}  status")
        for found, row in self._graded(pending):
            bar.update(1)
            bar.set_postfix_str(_printable(f"{found.student}/{found.assignment}"))
            log.append(row.csv_row(), digests[found.key])
            rows.append(row)
            tqdm.write(_printable(f"{found.student:<24} {found.assignment:<22} {row.score:>7g} {row.max_score:>5g}  "
                                  f"{row.status}" + (f"  ({'; '.join(row.notes)})" if row.notes else "")))
        bar.close()
        rows.sort(key=lambda r: (r.student, r.assignment))
        log.finish([r.csv_row() for r in rows])
        return rows

    def _plan(self, todo: list[Found], digests: dict, previous, log: RunLog) -> tuple[dict, list[Found]]:
        """The rows kept from the last run, and the entries to grade now (with a line saying so)."""
        if self.only_student is not None:
            mine = [f for f in todo if f.student == self.only_student]
            if not mine:
                names = sorted({f.student for f in todo})
                close = difflib.get_close_matches(self.only_student, names, n=1)
                raise ValueError(f"no student {self.only_student!r} under the submissions folder"
                                 + (f"; did you mean {close[0]!r}?" if close else ""))
            if previous is None and (self.out / "grades.csv").exists() and not self.force:
                raise ValueError(f"--student keeps the other rows of the last run in {self.out}, but "
                                 f"{log.fresh_reason or 'that run cannot be read'}: grade everyone again "
                                 f"(without --student)")
            me = row_key(self.only_student, "")[0]          # rows are keyed by the stored name
            kept = {k: r for k, r in (previous.rows if previous else {}).items() if k[0] != me}
            tqdm.write(_printable(f"regrading {self.only_student}: {len(mine)} submission(s); "
                                  f"{len(kept)} other row(s) kept"))
            return kept, mine
        if previous is None:
            if log.fresh_reason:
                tqdm.write(f"{log.fresh_reason}: grading everything in {self.out} again")
            return {}, todo
        kept = previous.unchanged(digests)
        pending = [f for f in todo if f.key not in kept]
        if kept and not previous.finished:
            tqdm.write(f"resuming the unfinished run in {self.out}: {len(kept)} row(s) kept, {len(pending)} to grade")
        elif kept and not pending:
            tqdm.write(f"nothing to grade: no submission changed since the last run in {self.out}; its "
                       f"{len(kept)} row(s) are kept as they are (--force grades everything again)")
        elif kept:
            tqdm.write(f"{len(kept)} row(s) unchanged since the last run in {self.out}, {len(pending)} to grade "
                       f"(--force grades everything again)")
        return kept, pending

    def _drop_stale_feedback(self, previous, kept: dict, digests: dict) -> None:
        """Feedback of rows the last run had and this one drops (the submission is gone)."""
        if previous is None or self.only_student is not None:
            return
        for student, assignment in set(previous.rows) - set(kept) - set(digests):
            folder = self.out / "feedback" / student / assignment if assignment else None
            if folder is not None and folder.is_dir() and not folder.is_symlink():
                shutil.rmtree(folder)

    def _parallel(self, pending: list[Found]) -> bool:
        """Graded by local workers (not one process, not a cluster)."""
        return not self.cluster and self.workers > 1 and sum(1 for f in pending if not f.status) > 1

    def _early_pool(self, pending: list[Found]):
        """The local workers, started before the course tree is generated (they spend seconds
        importing PyTorch and nbgrader, on the other cores, meanwhile)."""
        if not self._parallel(pending):
            return None
        from .workers import start_pool

        return start_pool(self, self.workers, sum(1 for f in pending if not f.status))

    def _graded(self, pending: list[Found]):
        """``(found, row)`` for each pending entry: each is graded into a result in a course tree
        of its own (here, in local workers or on a cluster) and recorded into ``--out`` here."""
        tasks = [(f, None if f.status else self.student_id(f.student)) for f in self._longest_first(pending)]
        to_grade = [(f, sid) for f, sid in tasks if sid is not None]
        if to_grade and self.cluster:
            from .cluster import grade_on_cluster

            results = itertools.chain(self._here([t for t in tasks if t[1] is None]),
                                      grade_on_cluster(self, to_grade, self.cluster))
        elif self._parallel(pending):
            from .workers import grade_in_parallel

            pool, self._pool = self._pool, None
            results = grade_in_parallel(self, tasks, self.workers, pool)
        else:
            results = self._here(tasks)
        for found, sid, result in results:
            yield found, record(self, found, sid, result)

    def _here(self, tasks: list[tuple[Found, str | None]]):
        """``(found, sid, result)`` for each task, graded in this process in a tree of its own."""
        if not tasks:
            return
        workspace = type(self)(self.solutions_dir, self.out / WORK_DIR / "here", self.settings)
        workspace.attach_tree(sorted({f.assignment for f, _ in tasks if f.assignment in self.assignments}),
                              self.course_root)
        later = sum(1 for _, sid in tasks if sid is not None)
        for found, sid in tasks:
            later -= sid is not None
            workspace.follows = later > 0
            yield found, sid, workspace.grade_submission(found, sid)

    def _longest_first(self, found: list[Found]) -> list[Found]:
        """The submissions whose notebooks declare the most time first (the capstone's
        training), each assignment's in their own order: started last, one of them would keep a
        worker busy long after the others ran out of work. The CSV is sorted anyway."""
        declared = {a: self.tree.declared_seconds(a) for a in {f.assignment for f in found}}
        return sorted(found, key=lambda f: -declared[f.assignment])

    def grade_submission(self, found: Found, sid: str | None = None) -> GradeResult:
        """One entry of the submissions folder graded in this grader's own tree, as data (the
        tree keeps nothing of it): the one path from a submission to its result, whichever
        runner calls it."""
        return collect(self, found, sid, self.grade_entry(found, sid))

    def grade_entry(self, found: Found, sid: str | None = None) -> GradeRow:
        """The row of one entry; a failure of the grader itself makes a ``broken`` row."""
        try:
            return self._grade_entry(found, sid)
        finally:
            _log_peak_memory(found)

    def _grade_entry(self, found: Found, sid: str | None) -> GradeRow:
        try:
            if found.status:
                return self.report(found)
            return self.grade_one(found.student, found.assignment, found.folder, sid)
        except Exception as err:  # one submission must never stop the others
            traceback.print_exc()
            return GradeRow(found.student, found.assignment, 0.0, self._safe_max(found.assignment),
                            status="broken", notes=[f"the grader failed on this submission: "
                                                    f"{type(err).__name__}: {str(err)[:300]}"])

    def report(self, found: Found) -> GradeRow:
        """The row of an entry that is not graded (skipped or refused), with a feedback page."""
        row = GradeRow(found.student, found.assignment, 0.0, self.max_score(found.assignment),
                       status=found.status, notes=[found.reason])
        if not found.student.startswith(".") and not found.assignment.startswith("."):
            self._write_plain_feedback(row)
        return row

    def grade_one(self, student: str, assignment: str, folder: Path, sid: str | None = None) -> GradeRow:
        sid = sid or self.student_id(student)
        row = GradeRow(student, assignment, 0.0, self.max_score(assignment))
        if getattr(self.settings, "unsandboxed", False):
            row.notes.append("graded without the sandbox (--unsandboxed)")
        if getattr(self.settings, "dry_run", False):
            row.notes.append(f"dry run (--dry-run) of the {self.settings.profile} profile: its models, trained "
                             f"a few steps and scored on a few held-out items; not a grade")
        submitted = self.course_root / "submitted" / sid / assignment
        if submitted.exists():
            shutil.rmtree(submitted)
        submitted.mkdir(parents=True)
        notebooks = self.tree.notebooks(assignment)
        gradable, refused, review, doubts = [], False, [], []
        for notebook in notebooks:
            taken = self._take_notebook(row, Path(folder), assignment, notebook, submitted, review, doubts)
            refused = refused or taken == "refused"
            if taken == "taken":
                gradable.append(notebook)
        if not gradable:
            row.status = "refused" if refused else "broken"
            row.notes.extend(review)
            self._write_plain_feedback(row)
            return row

        self.tree.api.config.CourseExecute.warm_kernels = self.tree.warm_kernels and (
            self.follows or len(gradable) > 1)
        from .remote import doubt_kernel_rules     # PyTorch: a worker has it, the main process need not

        with doubt_kernel_rules(doubts):
            result = self.tree.api.autograde(assignment, sid, force=True, create=True)
        if not result.get("success"):
            row.status = "broken"
            row.notes.append("nbgrader could not grade it: " + nbgrader_error(result))
            row.notes.extend(review)
            self._write_plain_feedback(row)
            return row
        self._read_scores(row, sid)
        self._note_crashes(row, sid, gradable)
        if refused:
            row.status = "refused"
        elif len(gradable) < len(notebooks):
            row.status = "broken"
        row.notes.extend(review)
        self._write_feedback(row, sid)
        return row

    def _take_notebook(self, row: GradeRow, folder: Path, assignment: str, notebook: str, submitted: Path,
                       review: list[str], doubts: list[str]) -> str:
        """One submitted notebook read once, scanned, repaired and put where nbgrader grades it:
        "taken"; or "refused" (a link, not a file) or "unreadable", with the row's note why.
        The scan's findings go to ``review`` (and those that doubt a kernel rule to ``doubts``)."""
        source = folder / f"{notebook}.ipynb"
        release = self._release(assignment, notebook)
        count = len(self.tree.notebooks(assignment))
        if source.is_symlink():
            row.notes.append(f"{notebook}: {source.name} is a symbolic link (to {_link_target(source)}); links "
                             f"are not followed, so it was not graded")
            return "refused"
        if source.exists() and not source.is_file():
            row.notes.append(f"{notebook}: {source.name} is not a regular file; not graded")
            return "refused"
        found = inspect_submission(source, release, self._translated(assignment, notebook))
        if not found.readable:
            row.notes.append(f"{notebook}: {found.problem}" + _other_notebooks(source))
            return "unreadable"
        row.notes.extend(f"{notebook}: {n}" for n in found.notes())
        try:
            found_doubts: list[str] = []
            review += [_review_note(n, notebook, count) for n in scan_notebook(found.notebook, release, found_doubts)]
            doubts += [_review_note(n, notebook, count) for n in found_doubts]
        except Exception as err:  # the scan is evidence for a person; it must never stop grading
            review.append(f"{REVIEW} {notebook}: the tamper scan failed ({type(err).__name__}: {err})")
        repaired, repairs = repair(found.notebook, release)
        row.notes.extend(f"{notebook}: {n}" for n in repairs)
        nbformat.write(repaired, submitted / source.name)
        return "taken"

    def _read_scores(self, row: GradeRow, sid: str) -> None:
        with Gradebook(self.tree.db_url) as gb:
            try:
                submission = gb.find_submission(row.assignment, sid)
            except MissingEntry:
                return
            row.score = float(submission.score)

    def _note_crashes(self, row: GradeRow, sid: str, notebooks: list[str]) -> None:
        """Record every stop found in the autograded notebooks: kernel deaths, time-outs, and
        cells not run after the kernel was stopped (a lost judge connection included). A set-up
        cell that failed before any student code ran raises :class:`SetupFailed`."""
        for notebook in notebooks:
            path = self.course_root / "autograded" / sid / row.assignment / f"{notebook}.ipynb"
            if not path.exists():
                continue
            nb = nbformat.read(path, as_version=4)
            failure = preflight.setup_failure(nb)
            if failure:
                raise SetupFailed(preflight.broken_message(
                    f"the set-up cell of {row.assignment}/{notebook} failed in the sandboxed kernel of "
                    f"{_printable(row.student)} before any of the student's code ran", failure))
            died, not_run, last = set(), {}, "the start"
            for cell in nb.cells:
                for output in cell.get("outputs", []):
                    if output.get("output_type") != "error":
                        continue
                    if output.ename == contract.KERNEL_DIED:
                        died.add(output.evalue)
                        row.notes.append(f"{notebook}: {output.evalue}; later cells scored zero")
                    elif output.ename == contract.TIMED_OUT:
                        grade_id = contract.grade_id(cell) or "a cell"
                        row.notes.append(f"{notebook}: {grade_id} ran past the time limit and was stopped")
                    elif output.ename == contract.NOT_RUN:
                        reason = str(output.evalue).removeprefix("not run: ")
                        after, count = not_run.get(reason, (last, 0))
                        not_run[reason] = (after, count + 1)
                if cell.get("cell_type") == "code" and contract.grade_id(cell):
                    last = contract.grade_id(cell)
            row.notes.extend(f"{notebook}: {count} cell(s) after {after} not run because {reason}; they scored zero"
                             for reason, (after, count) in not_run.items() if reason not in died)

    def _feedback_dir(self, row: GradeRow) -> Path:
        dest = self.out / "feedback" / row.student
        return dest / row.assignment if row.assignment else dest

    def _write_feedback(self, row: GradeRow, sid: str) -> None:
        result = self.tree.api.generate_feedback(row.assignment, sid, force=True)
        src = self.course_root / "feedback" / sid / row.assignment
        dest = self._feedback_dir(row)
        if dest.exists():
            shutil.rmtree(dest)
        if not result.get("success") or not src.is_dir():
            row.notes.append("feedback could not be generated: " + nbgrader_error(result))
            self._write_plain_feedback(row)
            return
        shutil.copytree(src, dest)
        for folder in (src, dest):    # the tree's copy too: nbgrader's own commands skip existing pages
            install_assets(folder, self.course_root / "feedback-static")
        for page in sorted(dest.glob("*.html")):
            if row.notes:
                _insert_notes(page, row.notes)
            row.feedback.append(page)

    def _write_plain_feedback(self, row: GradeRow) -> None:
        dest = self._feedback_dir(row)
        if dest.exists() and row.assignment:
            shutil.rmtree(dest)
        dest.mkdir(parents=True, exist_ok=True)
        page = dest / "feedback.html"
        page.write_text(render_plain(row.assignment or row.student, row.score, row.max_score, row.notes),
                        encoding="utf-8", errors="backslashreplace")
        row.feedback.append(page)


MEMORY_LOG_ENV = "COURSE_MEMORY_LOG"     # a file: each grading process's peak memory after each entry


def _log_peak_memory(found: Found) -> None:
    """For measuring what a submission costs the grader (tests, benchmarks): the peak
    resident memory of this grading process so far, one line per entry graded."""
    import resource

    path = os.environ.get(MEMORY_LOG_ENV)
    if path:
        peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        with open(path, "a", encoding="utf-8") as log:
            log.write(json.dumps({"pid": os.getpid(), "student": found.student, "peak_kib": peak_kib}) + "\n")


def submission_digest(found: Found) -> str:
    """What a row graded: the submission's notebooks (bytes, or what kind of entry each
    is), or why it was not graded. Equal digests, equal rows (for the same course)."""
    digest = hashlib.sha256(f"{found.status}\0{found.reason}\0".encode("utf-8", "surrogateescape"))
    if found.folder is not None:
        for path in sorted(Path(found.folder).iterdir(), key=lambda p: p.name):
            if path.suffix != ".ipynb":
                continue
            digest.update(path.name.encode("utf-8", "surrogateescape") + b"\0")
            if path.is_symlink():
                digest.update(b"link:" + os.readlink(path).encode("utf-8", "surrogateescape"))
            elif path.is_file():
                digest.update(hashlib.sha256(path.read_bytes()).digest())
            else:
                digest.update(b"not a file")
    return digest.hexdigest()


def _printable(text: str) -> str:
    """``text`` safe to print: control and format characters (a newline in a file name forged a
    row of the grader's table; an escape sequence moves the cursor) and the undecodable bytes
    of a folder name, written as Python escapes (``\\n``, ``\\x1b``, ``\\udce9``)."""
    return "".join(ch if ch.isprintable() or ch == " " else ascii(ch)[1:-1] for ch in text)


def _other_notebooks(source: Path) -> str:
    """For a missing notebook: the notebooks that are in its folder instead."""
    if source.exists() or not _is_dir(source.parent):
        return ""
    others = sorted(p.name for p in source.parent.glob("*.ipynb"))
    return f"; the folder has {', '.join(others[:5])}" if others else ""


def _review_note(note: str, notebook: str, n_notebooks: int) -> str:
    """Name the notebook in a review note when the assignment has several."""
    if n_notebooks > 1 and note.startswith(REVIEW):
        return f"{REVIEW} {notebook}:{note[len(REVIEW):]}"
    return note


_EXCEPTION_LINE = re.compile(
    r"^(?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception|Exit|Interrupt|Died|Timeout|Failure|Warning)\b(?::.*)?$")
_GENERIC = ("see the the above traceback", "see the above traceback", "see the error log",
            "there was an error processing assignment")


def nbgrader_error(result: dict) -> str:
    """The real error of a failed nbgrader call: the exception line of its log, not its summary."""
    text = "\n".join([result.get("log") or "", result.get("error") or ""])
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]

    def generic(line: str) -> bool:
        return any(g in line.lower() for g in _GENERIC)

    exceptions = [ln for ln in lines if _EXCEPTION_LINE.match(ln) and not generic(ln)]
    if exceptions:
        return exceptions[-1][:300]
    errors = [ln[len("[ERROR]"):].strip() for ln in lines if ln.startswith("[ERROR]") and not generic(ln)]
    errors = [e for e in errors if e and not e.startswith("Traceback")]
    if errors:
        return errors[-1][:300]
    return _last_line(result.get("error") or result.get("log"))


def _last_line(text: str | None) -> str:
    lines = [ln.strip() for ln in (text or "").strip().splitlines() if ln.strip()]
    return lines[-1][:300] if lines else "no details"


def _insert_notes(page: Path, notes: list[str]) -> None:
    """Put the grader's notes (escaped) at the top of a feedback page, under its score."""
    text = page.read_text(encoding="utf-8")
    at = text.find(NOTES_MARK)
    if at < 0:
        at = text.find("<body")
        at = text.find(">", at) + 1 if at >= 0 else 0
    page.write_text(text[:at] + notes_html(notes) + text[at:], encoding="utf-8", errors="backslashreplace")


def grade_folder(submissions: Path, out: Path, solutions_dir: Path, settings: GradingSettings,
                 show_progress: bool = True, workers: int = 1, force: bool = False,
                 student: str | None = None, cluster: str | None = None) -> list[GradeRow]:
    """Grade every submission under ``submissions``; write ``out/grades.csv`` and feedback.

    ``workers`` submissions are graded at once (:mod:`autograder.workers`). A second run on
    the same ``out`` regrades only what changed (:mod:`autograder.runlog`); ``force``
    regrades everything, ``student`` only that student's submissions. ``cluster`` (a Ray
    address) sends each submission to a Ray cluster instead (:mod:`autograder.cluster`).
    Raises :class:`OutputLocked` (a ``ValueError``) at once when another run holds ``out``.
    """
    grader = Grader(solutions_dir, out, settings, workers=workers, force=force, student=student, cluster=cluster)
    return grader.grade_all(submissions, show_progress=show_progress)
