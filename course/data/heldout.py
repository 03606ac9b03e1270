"""The test splits, held out from a graded kernel.

The capstone's held-out scores are computed by the grader on the test splits (two plays,
a tenth of CMUdict's words). A student's training code runs in the kernel, so while
grading the kernel must not be able to read them: the grader hides the test plays' files
and shows the kernel a copy of the dictionary without the test words (see
:func:`public_files`), and sets :data:`ENV` so that the loaders say so clearly instead of
failing on a missing file. On a learner's own machine nothing is hidden.
"""

from __future__ import annotations

import os
from pathlib import Path

ENV = "COURSE_HELD_OUT"       # "1" in a graded kernel: the test splits are not there


class HeldOut(PermissionError):
    """The test split was asked for where it is held out (a graded kernel)."""


def held_out() -> bool:
    return os.environ.get(ENV) == "1"


def refuse(what: str) -> None:
    """Raise :class:`HeldOut` for ``what`` (``load_shakespeare("test")``) in a graded kernel."""
    if held_out():
        raise HeldOut(f"{what}: the test split is held out while grading. Train and tune on the train and "
                      f"validation splits; the grader scores your model on the test split after training.")


def public_files(folder: Path) -> dict[Path, Path]:
    """What a graded kernel sees instead of the files that hold test data: each test play's
    file -> an empty file, and the dictionary -> a copy without the test words, written
    under ``folder``. The grader binds each value over its key in the sandbox."""
    from .cmudict import dict_path, split_of
    from .shakespeare import SPLITS, plays_dir

    folder.mkdir(parents=True, exist_ok=True)
    empty = folder / "held-out"
    empty.write_text("")
    hidden = {path: empty for path in sorted(plays_dir().glob("*/*.md")) if path.stem in SPLITS["test"]}
    public = folder / "cmudict.dict"
    lines = []
    for line in dict_path().read_text(encoding="utf-8").splitlines(keepends=True):
        head = line.split("#", 1)[0].split(maxsplit=1)[:1]
        word = head[0].split("(", 1)[0] if head else ""
        if not word or split_of(word) != "test":
            lines.append(line)
    public.write_text("".join(lines), encoding="utf-8")
    hidden[dict_path()] = public
    return hidden
