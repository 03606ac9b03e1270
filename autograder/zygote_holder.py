"""A zygote-started kernel's sandbox: its first process after the set-up, which holds the
sandbox open until the kernel forked into it has ended.

bubblewrap ends the sandbox (and every process in it) when this process ends, as it does
when a cold kernel ends; the grader sees the kernel die as before. Run as
``python -I -S -c <this file's text> course-kernel-holder MARKER`` under the kernel's id:
it waits (two minutes at most) for a process whose command line holds ``MARKER`` (the
zygote's), then for that process's end.
"""

import os
import select
import sys
import time


def _kernel(marker: bytes) -> int | None:
    """The kernel: a process whose command line is the zygote's (``python -s -c TEXT FD
    MARKER``), not one that only names it (the set-up steps before this process)."""
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) not in (1, me):
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    argv = f.read().split(b"\0")[:-1]
            except OSError:
                continue
            if len(argv) == 6 and argv[1:3] == [b"-s", b"-c"] and argv[5] == marker:
                return int(entry)
    return None


def main(marker: bytes) -> None:
    deadline = time.monotonic() + 120
    pid = _kernel(marker)
    while pid is None and time.monotonic() < deadline:
        time.sleep(0.01)
        pid = _kernel(marker)
    if pid is None:
        sys.exit("no kernel came")
    try:
        select.select([os.pidfd_open(pid)], [], [])     # readable when the kernel has ended
    except ProcessLookupError:
        pass
    except OSError:                                     # no pidfd (Linux before 5.3): look
        while os.path.exists(f"/proc/{pid}"):
            time.sleep(0.05)


if __name__ == "__main__":
    main(sys.argv[2].encode())
