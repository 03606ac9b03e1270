"""User ids for sandboxed kernels, each held by one live sandbox on the whole machine.

Linux counts ``RLIMIT_NPROC`` per real user id, across every process of that id on the
machine. When two sandboxes share an id, a student who forks up to the limit stops another
student's kernel from starting a thread, even in another grading run. So, as root, each
sandbox leases an id of its own for its lifetime:

- the ids come from a range no account uses (:data:`FIRST_ID`, :data:`ID_COUNT` of them),
  drawn at random, so that grading runs in separate containers on one kernel (which do not
  see each other's leases) are unlikely to draw the same one;
- a lease is an exclusive ``flock`` on ``<LEASE_DIR>/<id>``, held by the grading process
  (never by the kernel: the descriptor is not inherited) until :meth:`IdLease.release`, or
  until that process dies, when the kernel releases the lock by itself;
- an id that still has a live process (a kernel that outlived its grader) is never leased.
"""

from __future__ import annotations

import fcntl
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

FIRST_ID = 1_000_000_000        # above any account (Debian gives out up to 60,000, subuid ranges start at 100,000)
ID_COUNT = 1 << 24
LEASE_DIR = Path("/run/course-sandbox-ids") if Path("/run").is_dir() else Path("/tmp/course-sandbox-ids")
TRIES = 64


@dataclass
class IdLease:
    """One id, held until :meth:`release` (or until this process ends)."""

    uid: int
    path: Path
    fd: int | None

    def release(self) -> None:
        """Give the id back: the lock file goes first, then the lock, so that nobody takes
        a lock on a file about to vanish (see :func:`_lock`)."""
        if self.fd is None:
            return
        try:
            self.path.unlink(missing_ok=True)
        finally:
            os.close(self.fd)
            self.fd = None


def lease(directory: Path = LEASE_DIR) -> IdLease:
    """An id no other live sandbox on this machine holds and no process runs under."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    for _ in range(TRIES):
        uid = FIRST_ID + secrets.randbelow(ID_COUNT)
        path = directory / str(uid)
        fd = _lock(path)
        if fd is None:
            continue
        if uid in _live_ids():        # its last holder died, its kernel has not (yet)
            IdLease(uid, path, fd).release()
            continue
        return IdLease(uid, path, fd)
    raise RuntimeError(f"no free sandbox user id after {TRIES} tries in {directory}: are stale "
                       f"kernels still running? (`ps -eo uid,pid,cmd | awk '$1 >= {FIRST_ID}'`)")


def _lock(path: Path) -> int | None:
    """An exclusive lock on ``path``, or None when another process holds it. A lock taken on
    a file its holder has just removed is worth nothing, so the file must still be there."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if os.stat(path, follow_symlinks=False).st_ino == os.fstat(fd).st_ino:
            return fd
    except OSError:
        pass
    os.close(fd)
    return None


def _live_ids() -> set[int]:
    """The real user ids of the machine's processes (those of this PID namespace and below,
    which holds every sandbox this grader started)."""
    ids = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status", "rb") as status:
                for line in status:
                    if line.startswith(b"Uid:"):
                        ids.add(int(line.split()[1]))
                        break
        except (OSError, ValueError, IndexError):
            pass        # the process ended meanwhile
    return ids


def leased_ids(directory: Path = LEASE_DIR) -> list[int]:
    """The ids whose lock files exist now (held, or about to be removed)."""
    if not directory.is_dir():
        return []
    return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit())
