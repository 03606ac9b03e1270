"""The record of one grading run in ``--out``: a lock, ``grades.csv`` row by row, resuming.

Files in ``--out`` (besides ``feedback/`` and ``nbgrader/``)::

    .grading.lock       locked (flock) while a run works here; holds that run's pid
    .grading-run.json   what the run grades: submissions folder, solutions fingerprint, settings
    grades.csv          the header at once, then each row as its submission finishes (flushed
                        and fsync'd), so a killed run loses at most the row it was working on;
                        rewritten sorted by (student, assignment) when the run finishes
    .grading-done.json  written last: the run finished and grades.csv is complete

A run on an ``--out`` that holds an unfinished run of the same submissions, solutions and
settings resumes it: the rows already in ``grades.csv`` are kept, the rest are graded. An
``--out`` that holds a finished run, nothing, or output without ``.grading-run.json`` starts
fresh. An unfinished run of something else is an error: nothing is deleted or mixed.
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
CSV_FILE = "grades.csv"


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


class RunLog:
    """Lock, resume decision and the row-by-row ``grades.csv`` of one ``--out``."""

    def __init__(self, out: Path):
        self.out = Path(out)
        self.csv_path = self.out / CSV_FILE
        self._lock = None
        self._csv = None
        self._writer = None

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
    def previous_rows(self, identity: dict) -> dict[tuple[str, str], dict] | None:
        """Rows of an unfinished run of the same ``identity`` to keep; None to start fresh."""
        run_file, done_file = self.out / RUN_FILE, self.out / DONE_FILE
        if done_file.exists() or not self.csv_path.exists() or not run_file.exists():
            return None
        try:
            previous = json.loads(run_file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        if previous != identity:
            differs = ", ".join(k for k in sorted(set(previous) | set(identity)) if previous.get(k) != identity.get(k))
            raise ValueError(
                f"{self.out} holds an unfinished grading run of other inputs ({differs} differ); rerun it with "
                f"the same submissions, solutions and settings to finish it, or pass another --out "
                f"(or delete {self.out})")
        kept: dict[tuple[str, str], dict] = {}
        with open(self.csv_path, newline="", encoding="utf-8", errors="replace") as f:
            for row in csv.DictReader(f):
                if _valid(row):       # a row cut short by a kill is graded again
                    kept[(row["student"], row["assignment"])] = {c: row[c] for c in CSV_COLUMNS}
        return kept

    def start(self, identity: dict, kept: dict[tuple[str, str], dict] | None) -> None:
        """Begin (or continue) the run: identity, the CSV with its header and kept rows."""
        (self.out / DONE_FILE).unlink(missing_ok=True)
        write_atomic(self.out / RUN_FILE, json.dumps(identity, indent=1, sort_keys=True) + "\n")
        write_atomic(self.csv_path, csv_text(list((kept or {}).values())))
        self._csv = open(self.csv_path, "a", newline="", encoding="utf-8", errors="backslashreplace")
        self._writer = csv.DictWriter(self._csv, fieldnames=CSV_COLUMNS, lineterminator="\r\n")

    def append(self, row: dict) -> None:
        """One finished row, on disk before this returns."""
        self._writer.writerow(row)
        self._csv.flush()
        os.fsync(self._csv.fileno())

    def close_csv(self) -> None:
        if self._csv is not None:
            self._csv.close()
            self._csv = self._writer = None

    def finish(self, rows: list[dict]) -> None:
        """The complete CSV, sorted by (student, assignment), then the mark of a finished run."""
        self.close_csv()
        rows = sorted(rows, key=lambda r: (r["student"], r["assignment"]))
        write_atomic(self.csv_path, csv_text(rows))
        write_atomic(self.out / DONE_FILE, json.dumps(
            {"finished": time.strftime("%Y-%m-%d %H:%M:%S"), "rows": len(rows),
             "statuses": {s: sum(r["status"] == s for r in rows) for s in STATUSES}}, indent=1) + "\n")
