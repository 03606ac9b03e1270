"""The record of one grading run in ``--out``: a lock, ``grades.csv`` row by row, resuming.

Files in ``--out`` (besides ``feedback/`` and ``nbgrader/``)::

    .grading.lock       locked (flock) while a run works here; holds that run's pid
    .grading-run.json   what the run grades with: fingerprints of solutions/ and of the
                        grader's code, and the settings (the submissions folder, for reading)
    grades.csv          the header at once, then each row as its submission finishes (flushed
                        and fsync'd), so a killed run loses at most the row it was working on;
                        rewritten sorted by (student, assignment) when the run finishes
    .grading-rows.jsonl after each row, a digest of what that row graded (the submission's
                        notebooks, or why it was not graded)
    .grading-done.json  written last: the run finished and grades.csv is complete

A run on an ``--out`` whose last run (finished or not) graded with the same solutions, code
and settings keeps every row whose submission is unchanged (same digest) and grades the
rest: a killed run resumes, and a second run regrades only what changed. Anything else (a
changed course or setting, ``--force``, no earlier run) starts fresh.
"""

from __future__ import annotations

import csv
import errno
import fcntl
import hashlib
import io
import json
import os
import time
from pathlib import Path

CSV_COLUMNS = ["student", "assignment", "score", "max_score", "status", "notes"]
STATUSES = ("graded", "broken", "refused", "skipped")
LOCK_FILE = ".grading.lock"
RUN_FILE = ".grading-run.json"
DONE_FILE = ".grading-done.json"
DIGEST_FILE = ".grading-rows.jsonl"
CSV_FILE = "grades.csv"


def stored_name(text: str) -> str:
    """A name as ``grades.csv`` holds it: the undecodable bytes of a folder name (surrogate
    escapes) written as ``\\udcXX``, the rest as is."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def row_key(student: str, assignment: str) -> tuple[str, str]:
    """The key of a row, run after run: the names as stored, so that a folder whose name is
    not UTF-8 finds its row (and its digest) again instead of being graded on every run."""
    return (stored_name(student), stored_name(assignment))


class OutputLocked(ValueError):
    """Another ``grade`` run holds the lock on this ``--out``."""


def fingerprint(folder: Path) -> str:
    """sha256 of every notebook under ``folder`` (paths and bytes)."""
    digest = hashlib.sha256()
    for path in sorted(Path(folder).rglob("*.ipynb")):
        if ".ipynb_checkpoints" in path.parts:
            continue
        digest.update(str(path.relative_to(folder)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


GRADING_PACKAGES = ("torch", "nbgrader", "nbclient", "ipykernel")


def code_fingerprint(folders: list[Path], pattern: str = "*.py", packages: tuple[str, ...] = GRADING_PACKAGES) -> str:
    """sha256 of the files matching ``pattern`` under ``folders`` (compiled caches left out) and
    of the versions of ``packages``; by default, of what runs the grading: what, besides the
    solutions and the settings, can change a score."""
    from importlib import metadata

    digest = hashlib.sha256()
    for folder in folders:
        for path in sorted(Path(folder).rglob(pattern)):
            if path.is_file() and "__pycache__" not in path.parts:
                digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    for package in packages:
        try:
            digest.update(f"{package}=={metadata.version(package)}".encode())
        except metadata.PackageNotFoundError:
            pass
    return digest.hexdigest()


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so that a reader (or a crash) sees the old file or the new one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8", errors="backslashreplace", newline="") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def csv_text(rows: list[dict]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=CSV_COLUMNS, lineterminator="\r\n")
    writer.writeheader()
    for row in rows:
        writer.writerow(row)
    return buffer.getvalue()


def _valid(row: dict) -> bool:
    if any(row.get(c) is None for c in CSV_COLUMNS) or row.get("status") not in STATUSES:
        return False
    try:
        float(row["score"]), float(row["max_score"])
    except ValueError:
        return False
    return True


class Previous:
    """What an earlier run on the same ``--out`` left: its rows and their digests."""

    def __init__(self, rows: dict[tuple[str, str], dict], digests: dict[tuple[str, str], str], finished: bool):
        self.rows, self.digests, self.finished = rows, digests, finished

    def unchanged(self, digests: dict[tuple[str, str], str]) -> dict[tuple[str, str], dict]:
        """The rows whose submission has the same digest now (keys as :func:`row_key` makes them)."""
        digests = {row_key(*key): digest for key, digest in digests.items()}
        return {key: row for key, row in self.rows.items()
                if key in digests and self.digests.get(key) == digests[key]}


class RunLog:
    """Lock, resume decision and the row-by-row ``grades.csv`` of one ``--out``."""

    def __init__(self, out: Path):
        self.out = Path(out)
        self.csv_path = self.out / CSV_FILE
        self._lock = None
        self._csv = None
        self._writer = None
        self._digest_file = None
        self.fresh_reason = ""      # why previous() found nothing to keep

    # ------------------------------------------------------------------ the lock
    def acquire(self) -> None:
        """Take the lock on ``--out`` or raise :class:`OutputLocked` at once."""
        self.out.mkdir(parents=True, exist_ok=True)
        handle = open(self.out / LOCK_FILE, "a+", encoding="utf-8")
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            if err.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                handle.close()
                raise
            handle.seek(0)
            holder = handle.read().strip()
            handle.close()
            raise OutputLocked(
                f"{self.out} is in use by another grade run ({holder or 'pid unknown'}); wait for it to "
                f"finish, or pass another --out") from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()}, started {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
        handle.flush()
        self._lock = handle

    def release(self) -> None:
        self.close_csv()
        if self._lock is not None:
            fcntl.flock(self._lock.fileno(), fcntl.LOCK_UN)
            self._lock.close()
            self._lock = None

    # ------------------------------------------------------------------ resume or start fresh
    def previous(self, identity: dict) -> Previous | None:
        """The earlier run's rows when it graded with the same ``identity``; None otherwise
        (then :meth:`why_fresh` says why)."""
        self.fresh_reason = ""
        run_file = self.out / RUN_FILE
        if not self.csv_path.exists() or not run_file.exists():
            return None
        try:
            previous = json.loads(run_file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        differs = [k for k in sorted(set(previous) | set(identity)) if k != "submissions"
                   and previous.get(k) != identity.get(k)]
        if differs:
            self.fresh_reason = f"{', '.join(differs)} changed since the last run"
            return None
        rows: dict[tuple[str, str], dict] = {}
        with open(self.csv_path, newline="", encoding="utf-8", errors="replace") as f:
            for row in csv.DictReader(f):
                if _valid(row):       # a row cut short by a kill is graded again
                    rows[(row["student"], row["assignment"])] = {c: row[c] for c in CSV_COLUMNS}
        return Previous(rows, self._digests(), (self.out / DONE_FILE).exists())

    def _digests(self) -> dict[tuple[str, str], str]:
        digests = {}
        try:
            lines = (self.out / DIGEST_FILE).read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            return digests
        for line in lines:
            try:
                student, assignment, digest = json.loads(line)
            except (ValueError, TypeError):
                continue      # a line cut short by a kill: that row is graded again
            digests[row_key(student, assignment)] = digest
        return digests

    def start(self, identity: dict, kept: dict[tuple[str, str], dict] | None,
              digests: dict[tuple[str, str], str] | None = None) -> None:
        """Begin (or continue) the run: identity, the CSV with its header and kept rows."""
        kept, digests = kept or {}, digests or {}
        (self.out / DONE_FILE).unlink(missing_ok=True)
        write_atomic(self.out / RUN_FILE, json.dumps(identity, indent=1, sort_keys=True) + "\n")
        write_atomic(self.csv_path, csv_text(list(kept.values())))
        write_atomic(self.out / DIGEST_FILE, "".join(json.dumps([*key, digests[key]]) + "\n"
                                                     for key in kept if key in digests))
        self._csv = open(self.csv_path, "a", newline="", encoding="utf-8", errors="backslashreplace")
        self._writer = csv.DictWriter(self._csv, fieldnames=CSV_COLUMNS, lineterminator="\r\n")
        self._digest_file = open(self.out / DIGEST_FILE, "a", encoding="utf-8", errors="backslashreplace")

    def append(self, row: dict, digest: str | None = None) -> None:
        """One finished row (and the digest of what it graded), on disk before this returns."""
        self._writer.writerow(row)
        self._csv.flush()
        os.fsync(self._csv.fileno())
        if digest is not None:
            self._digest_file.write(json.dumps([row["student"], row["assignment"], digest]) + "\n")
            self._digest_file.flush()
            os.fsync(self._digest_file.fileno())

    def close_csv(self) -> None:
        if self._csv is not None:
            self._csv.close()
            self._csv = self._writer = None
        if self._digest_file is not None:
            self._digest_file.close()
            self._digest_file = None

    def finish(self, rows: list[dict]) -> None:
        """The complete CSV, sorted by (student, assignment), then the mark of a finished run."""
        self.close_csv()
        rows = sorted(rows, key=lambda r: (r["student"], r["assignment"]))
        write_atomic(self.csv_path, csv_text(rows))
        write_atomic(self.out / DONE_FILE, json.dumps(
            {"finished": time.strftime("%Y-%m-%d %H:%M:%S"), "rows": len(rows),
             "statuses": {s: sum(r["status"] == s for r in rows) for s in STATUSES}}, indent=1) + "\n")
