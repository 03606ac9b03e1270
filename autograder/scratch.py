"""One folder in the temporary directory per grading process, for what it makes there: the
kernels' view of the course, each kernel's sandbox, a Ray worker's course tree.

The process removes its folder when it ends normally. A process that is killed (SIGKILL, a
pool worker that its pool terminates, an instructor's Ctrl-C twice) cannot, so each folder
holds a lock file that its process keeps locked (``flock``) for as long as it lives: the
kernel drops the lock however the process ends. The next grading process to start removes
every folder whose lock it can take, so a machine that grades all term does not fill its
``/tmp`` with the copies of killed runs.

A folder is made under a name the sweep does not look at, locked, and only then renamed to
its final name, so no sweep ever sees a folder whose process has not locked it yet.
"""

from __future__ import annotations

import atexit
import fcntl
import multiprocessing.util
import os
import shutil
import tempfile
from pathlib import Path

PREFIX = "course-scratch-"
LOCK = "owner.lock"
_MAKING = ".making-" + PREFIX

_own: dict[int, Path] = {}     # pid -> its folder (a forked child makes its own)


def scratch() -> Path:
    """This process's folder; made, and the folders of dead processes removed, on first use."""
    pid = os.getpid()
    if pid not in _own:
        sweep()
        _own[pid] = _make()
        atexit.register(_remove, _own[pid])
        # a multiprocessing worker leaves with os._exit (no atexit) after running these
        multiprocessing.util.Finalize(None, _remove, args=(_own[pid],), exitpriority=0)
    return _own[pid]


def folder(prefix: str) -> Path:
    """A new folder inside this process's scratch folder (as ``tempfile.mkdtemp``)."""
    return Path(tempfile.mkdtemp(prefix=prefix, dir=scratch()))


def _make() -> Path:
    making = Path(tempfile.mkdtemp(prefix=_MAKING))
    lock = os.open(making / LOCK, os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o600)
    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)     # kept open: released when we die
    final = making.with_name(PREFIX + making.name[len(_MAKING):])
    making.rename(final)
    return final


def sweep(parent: Path | None = None) -> list[Path]:
    """Remove the folders of grading processes that are gone; returns what was removed."""
    removed = []
    for candidate in Path(parent or tempfile.gettempdir()).glob(PREFIX + "*"):
        try:
            if candidate.is_symlink() or candidate.stat().st_uid != os.geteuid():
                continue
            lock = os.open(candidate / LOCK, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(lock)
            continue       # its process is alive
        try:
            shutil.rmtree(candidate, ignore_errors=True)
            removed.append(candidate)
        finally:
            os.close(lock)
    return removed


def _remove(path: Path) -> None:
    if os.getpid() in _own and _own[os.getpid()] == path:
        shutil.rmtree(path, ignore_errors=True)
