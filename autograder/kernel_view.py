"""The ``course`` package as a sandboxed kernel sees it: everything a student's code may use,
and nothing that computes an answer.

The checks (``course/checks/chNN.py``, their oracles and reference answers) and the hidden
inputs' seeding (``_hidden.py``) run in the grading process only. In the kernel, each
chapter's checks module is a stand-in whose ``check_*`` functions do nothing (the set-up
cell imports it, and an answer cell that calls one must not fail), so an answer that
reaches for the course's reference code by any route (an import, ``pkgutil``, ``runpy``,
reading the source file) finds none. What the kernel needs of the checks stays: the
failure types and the blocking of built-ins (``_core``) and the recorders (``_recorders``),
which only measure. A learner's own Jupyter reads the real ``course/`` as before.

The view is a copy made once per grading process, read-only to the kernel, and put first
on the kernel's ``PYTHONPATH`` (the editable install's finder comes after it).
"""

from __future__ import annotations

import functools
import shutil
from pathlib import Path

from . import scratch

# Of course/checks, what the kernel keeps; every other module there becomes a stand-in.
KERNEL_SIDE_CHECKS = frozenset({"__init__.py", "_core.py", "_recorders.py"})
LEFT_OUT = frozenset({"_hidden.py"})

STAND_IN = '''"""Chapter checks, as a graded kernel sees them: they run in the grader, not here.

(In your own JupyterLab, ``course/checks/{name}`` is the real module: read it there.) A
``check_*`` does nothing here, a ``*_passes`` says no, and any other helper (a demo's
measurement) raises CheckFailed, which the demo cells catch.
"""

from ._core import CheckFailed, ShortcutUsed  # noqa: F401 - what notebooks catch


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)

    def judged_by_the_grader(*args, **kwargs):
        if name.endswith("_passes"):
            return False
        if not name.startswith("check_"):
            raise CheckFailed(f"checks.{{name}} runs in your own JupyterLab, not while grading")
        print(f"checks.{{name}}: while grading, the tests run in the grader, not in this kernel")

    judged_by_the_grader.__name__ = name
    return judged_by_the_grader
'''


@functools.cache
def public_data() -> dict[Path, Path]:
    """The files that hold the test splits -> what a kernel reads in their place (made once
    per grading process, beside the course's view): see :mod:`course.data.heldout`."""
    from course.data.heldout import public_files

    return public_files(kernel_course() / "public-data")


@functools.cache
def kernel_course() -> Path:
    """The folder to put on a sandboxed kernel's ``PYTHONPATH``: it holds ``course/``."""
    import course

    source = Path(course.__file__).resolve().parent
    root = scratch.folder("kernel-view-")     # removed with the process's scratch folder
    build(source, root / "course")
    for path in [root, *root.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return root


def build(source: Path, dest: Path) -> None:
    """Copy ``source`` (the course package) to ``dest`` as the kernel sees it."""
    shutil.copytree(source, dest, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    checks = dest / "checks"
    for module in sorted(checks.glob("*.py")):
        if module.name in LEFT_OUT:
            module.unlink()
        elif module.name not in KERNEL_SIDE_CHECKS:
            module.write_text(STAND_IN.format(name=module.name), encoding="utf-8")
