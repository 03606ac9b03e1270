"""The first process inside a sandbox: it bounds the sandbox's disk, then becomes the
kernel's command.

bubblewrap mounts a fresh tmpfs at HOME and at /tmp, and can give a tmpfs a size
(``--size``, containers/bubblewrap#509, 2022) but not a number of files, while an empty
file uses about 1 KiB of the machine's kernel memory without counting towards the size
(2,000,000 empty files in a 64 MiB tmpfs: +2 GiB of kernel memory, measured on Linux 6.18).
So this step, still privileged in the sandbox's own mount namespace, sets both bounds on
each tmpfs (a remount), gives HOME and the work folder to the kernel's user id, and runs
the command (``setpriv``, which drops to that id with no capabilities). Only as root: in a
user namespace, bubblewrap's tmpfs cannot be remounted (EPERM, measured).

Run by the sandbox as ``python -I -S -c <this file's text> UID BYTES FILES HOME WORK -- CMD...``
(``BYTES`` and ``FILES`` per tmpfs; only the text travels: nothing is imported from the course).
"""

import ctypes
import os
import sys

MS_NOSUID, MS_NODEV, MS_REMOUNT = 2, 4, 32


def _bound(libc, target: str, size: int, files: int) -> None:
    options = f"size={size},nr_inodes={files}".encode()
    if libc.mount(b"tmpfs", target.encode(), b"tmpfs", MS_REMOUNT | MS_NOSUID | MS_NODEV, options) != 0:
        sys.exit(f"sandbox set-up: bounding the tmpfs at {target} failed: {os.strerror(ctypes.get_errno())}")


def main(argv: list[str]) -> None:
    uid, size, files, home, work = int(argv[0]), int(argv[1]), int(argv[2]), argv[3], argv[4]
    command = argv[argv.index("--") + 1:]
    libc = ctypes.CDLL(None, use_errno=True)
    for target in ("/tmp", home):
        _bound(libc, target, size, files)
    os.chmod("/tmp", 0o1777)
    for folder in (home, work):
        os.chown(folder, uid, uid)
        os.chmod(folder, 0o700)
    os.execv(command[0], command)


if __name__ == "__main__":
    main(sys.argv[1:])
