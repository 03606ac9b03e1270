"""What a grading kernel imports before it is handed to a submission.

Every notebook's set-up cell pays for PyTorch (about 1.8 s) and the course's modules before
the first line a student wrote runs. The grader starts each notebook's kernel while the
previous notebook is still being graded, and that kernel calls :func:`warm` as it starts,
with the modules the previous notebook's set-up cell imported (the released cell: a
submission cannot change it), so that cost is paid in the meantime. Nothing here comes
from, or is kept for, any student: the modules are imported, no name is bound in the
kernel's namespace, and each such kernel serves one notebook and is then shut down.
"""

import importlib
import re

import torch  # noqa: F401 - every notebook's set-up cell imports it

import course.probe  # noqa: F401 - the judge's side of the kernel

MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


def warm(modules: str) -> None:
    """Import each of ``modules`` (dotted names, comma-separated); a name that is not a
    module (``from course.device import get_device``) or fails to import is left to the
    set-up cell, which reports it."""
    for name in filter(None, modules.split(",")):
        if MODULE.fullmatch(name):
            try:
                importlib.import_module(name)
            except Exception:  # noqa: BLE001 - the set-up cell imports it again and says why
                pass
