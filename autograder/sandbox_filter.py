"""The system calls a sandboxed kernel may not make: a seccomp program for bubblewrap.

Two sandboxes read the same files (the Python installation, ``course/``, ``/usr``,
``/dev/null``) through binds, and such a file still carries locks and change notifications
that every other user of it sees: a one-bit channel between two students' kernels. The
program below answers, instead of running them:

- ``flock`` and ``fcntl``'s commands that take or drop a lock: success, with nothing
  locked. A kernel is one program (its threads lock in memory); what does lock files in it,
  IPython's SQLite history, then runs as alone, instead of waiting 15 s on refused locks at
  every start (measured with ENOLCK);
- ``fcntl``'s lock queries: ENOLCK ("no locks available"); its leases and directory
  notifications, ``inotify`` and ``fanotify``: EPERM;
- ``unshare``, ``setns`` and a ``clone`` that makes namespaces: EPERM. In a user namespace
  of its own a process may mount a tmpfs of any size, past the sandbox's disk bound;
  ``clone3`` (whose flags a filter cannot read) answers ENOSYS, and the C library then
  starts its threads with ``clone``.

Every other call, and every call of another ABI (32-bit on x86-64), is allowed or refused
as listed. :func:`program` returns the compiled program (``struct sock_filter`` records,
the format ``bwrap --seccomp FD`` reads), or None on a machine it has no numbers for.
"""

from __future__ import annotations

import platform
import struct

# struct seccomp_data: nr (u32), arch (u32), instruction_pointer (u64), args[6] (u64 each);
# the low half of a little-endian argument is at its start.
NR, ARCH, ARG0, ARG1 = 0, 4, 16, 24

ALLOW, ERRNO = 0x7FFF0000, 0x00050000
ENOLCK, EPERM, ENOSYS = 37, 1, 38
DONE = ERRNO | 0            # the call is skipped and returns 0
X32_BIT = 0x40000000        # x86-64's x32 ABI: the same calls under other numbers

# fcntl commands: F_SETLK, F_SETLKW, F_OFD_SETLK, F_OFD_SETLKW; F_GETLK, F_OFD_GETLK;
# F_SETLEASE, F_NOTIFY.
LOCKING, LOCK_QUERIES, NOTICES = (6, 7, 37, 38), (5, 36), (1024, 1026)
# CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUTS, CLONE_NEWIPC, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET.
CLONE_NAMESPACES = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000

#: Per machine: its AUDIT_ARCH value and the numbers of the calls above (Linux's
#: arch/x86/entry/syscalls/syscall_64.tbl and include/uapi/asm-generic/unistd.h).
SYSCALLS = {
    "x86_64": (0xC000003E, {"fcntl": 72, "flock": 73, "clone": 56, "unshare": 272, "setns": 308,
                            "clone3": 435, "inotify_init": 253, "inotify_add_watch": 254,
                            "inotify_init1": 294, "fanotify_init": 300, "fanotify_mark": 301}),
    "aarch64": (0xC00000B7, {"fcntl": 25, "flock": 32, "clone": 220, "unshare": 97, "setns": 268,
                             "clone3": 435, "inotify_init1": 26, "inotify_add_watch": 27,
                             "fanotify_init": 262, "fanotify_mark": 263}),
}

# Classic BPF opcodes: load a word of seccomp_data, return, jump if equal / if at least / if
# any bit set.
LD, RET, JEQ, JGE, JSET = 0x20, 0x06, 0x15, 0x35, 0x45


def _op(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("<HBBI", code, jt, jf, k)


def _answer(numbers: list[int], answer: int) -> list[bytes]:
    """For the call number in the accumulator: return ``answer`` when it is one of
    ``numbers``, else fall through (one comparison and one return per number)."""
    out = []
    for nr in numbers:
        out += [_op(JEQ, nr, 0, 1), _op(RET, answer)]
    return out


def _answer_by_argument(nr: int, offset: int, answers: dict[int, int], mask: int = 0, answer: int = 0) -> list[bytes]:
    """For call ``nr``: return ``answers[value]`` when the argument at ``offset`` is one of
    its keys, ``answer`` when it has a bit of ``mask`` set; otherwise reload the call number."""
    checks = [_op(LD, offset)]
    for value, given in answers.items():
        checks += [_op(JEQ, value, 0, 1), _op(RET, given)]
    if mask:
        checks += [_op(JSET, mask, 0, 1), _op(RET, answer)]
    checks += [_op(LD, NR)]
    return [_op(JEQ, nr, 0, len(checks)), *checks]


def program(machine: str | None = None) -> bytes | None:
    """The compiled filter for ``machine`` (default: this one), or None if unknown."""
    known = SYSCALLS.get(machine or platform.machine())
    if known is None:
        return None
    arch, nr = known
    code = [_op(LD, ARCH), _op(JEQ, arch, 1, 0), _op(RET, ERRNO | ENOSYS), _op(LD, NR),
            _op(JGE, X32_BIT, 0, 1), _op(RET, ERRNO | ENOSYS)]
    code += _answer([nr["flock"]], DONE)
    code += _answer([nr[name] for name in ("inotify_init", "inotify_init1", "inotify_add_watch",
                                           "fanotify_init", "fanotify_mark", "unshare", "setns")
                     if name in nr], ERRNO | EPERM)
    code += _answer([nr["clone3"]], ERRNO | ENOSYS)
    fcntl = {**dict.fromkeys(LOCKING, DONE), **dict.fromkeys(LOCK_QUERIES, ERRNO | ENOLCK),
             **dict.fromkeys(NOTICES, ERRNO | EPERM)}
    code += _answer_by_argument(nr["fcntl"], ARG1, fcntl)
    code += _answer_by_argument(nr["clone"], ARG0, {}, CLONE_NAMESPACES, ERRNO | EPERM)
    return b"".join(code + [_op(RET, ALLOW)])
