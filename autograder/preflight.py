"""Before the first student: can a sandboxed kernel here run what every notebook starts with?

A grader whose kernels cannot import the course (issue 31: a second checkout graded with the
first checkout's environment; or a checkout that lacks part of ``course/``), read the
course's data, or use the device would give every student, correct solutions included, a
``graded`` row of zero. So before anything in ``--out`` is replaced, :func:`check` runs, in
one sandbox made exactly as for grading (:meth:`CourseTree.new_sandbox`), the set-up cell of
each assignment to grade (transformed by IPython's input transformers, as the kernel runs
it), then reads a little of each data set and computes on the device. Any failure stops the run with :class:`GraderBroken`.

The same failure can still happen in one student's kernel (a machine that changes during a
run); :func:`setup_failure` recognises it in an autograded notebook: the set-up cell failed
and no code of the student's ran before it.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from . import contract

MARK = "PREFLIGHT "

PROBE = r"""
import json, sys

found = {}
for name, source in json.loads(sys.argv[1]).items():     # Python, as IPython transformed it
    namespace = {"__name__": "__main__"}
    if "get_ipython" in source:                          # magics: IPython's shell (0.5 s more)
        from IPython.core.interactiveshell import InteractiveShell
        namespace["get_ipython"] = InteractiveShell.instance
    try:
        exec(compile(source, f"set-up cell of {name}", "exec"), namespace)
        found[name] = None
    except BaseException as error:
        found[name] = f"{type(error).__name__}: {error}"
try:
    import torch
    from course.data.cmudict import dict_path
    from course.data.shakespeare import plays_dir
    from course.device import get_device
    plays = sorted(plays_dir().glob("*/*.md"))
    assert plays, f"no play under {plays_dir()}"
    plays[0].read_bytes()
    dict_path().read_bytes()
    device = get_device()
    value = (torch.ones(8, device=device) * 2).sum().item()
    assert value == 16, f"2 * 8 ones summed to {value} on {device}"
    found["data and device"] = None
except BaseException as error:
    found["data and device"] = f"{type(error).__name__}: {error}"
print("PREFLIGHT " + json.dumps(found), flush=True)
import os
os._exit(0)     # all is said: skip tearing down an interpreter that loaded PyTorch (benchmarks/process_costs.py)
"""


class GraderBroken(ValueError):
    """The grader cannot grade here: nothing a student did. The command line prints the
    message (``error: ...``) and exits with status 2."""


class SetupFailed(BaseException):
    """A set-up cell failed in a student's kernel before any student code ran. Raised through
    every ``except Exception`` that turns one submission's failure into a row (the grader's
    own fault must stop the run, not grade it); :meth:`Grader.grade_all` turns it into
    :class:`GraderBroken`."""


def setup_cells(solutions_dir: Path, assignments: list[str]) -> dict[str, str]:
    """``{assignment/notebook: source}`` of the set-up cell of each notebook."""
    cells = {}
    for assignment in assignments:
        for path in sorted((Path(solutions_dir) / assignment).glob("*.ipynb")):
            for cell in contract.read(path).cells:
                if contract.role(cell) is contract.Role.SETUP:
                    cells[f"{assignment}/{path.stem}"] = cell.source
    return cells


def check(tree, assignments: list[str], timeout: float) -> None:
    """Run the set-up cells of ``assignments`` (and the data and device checks) in a sandbox
    of ``tree`` (a :class:`CourseTree`); raise :class:`GraderBroken` if any fails."""
    import sys

    from IPython.core.inputtransformer2 import TransformerManager

    cells = {name: TransformerManager().transform_cell(source)
             for name, source in setup_cells(tree.solutions_dir, assignments).items()}
    box = None if tree.settings.unsandboxed else tree.new_sandbox()    # --unsandboxed: as its kernels run
    try:
        done = subprocess.run([*(box.prefix() if box else []), sys.executable, "-c", PROBE, json.dumps(cells)],
                              capture_output=True, text=True, timeout=timeout, cwd=tree.root)
    except subprocess.TimeoutExpired:
        raise GraderBroken(f"the grader's preflight (the notebooks' set-up cells in a sandbox) gave no "
                           f"answer within {timeout:.0f} s; nothing was graded. {ADVICE}") from None
    finally:
        if box is not None:
            box.cleanup()
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith(MARK)]
    if not lines:
        last = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        raise GraderBroken(f"the grader's preflight could not run Python in a sandbox ({last[:300]}); nothing "
                           f"was graded. {ADVICE}")
    failed = {what: error for what, error in json.loads(lines[-1][len(MARK):]).items() if error}
    if failed:
        what, error = next(iter(failed.items()))
        raise GraderBroken(broken_message(f"in the grader's preflight, {_what(what)} failed in a sandboxed "
                                          f"kernel", error, len(failed)))


def _what(key: str) -> str:
    return "reading the course's data and using the device" if key == "data and device" else \
        f"the set-up cell of {key}"


ADVICE = "Check the grading environment with `python -m autograder doctor`, then grade again."
TIME_ADVICE = "The set-up cell needs more time than the cell time limit here: raise --timeout, then grade again."


def broken_message(where: str, error: str, count: int = 1) -> str:
    """One message for a grader that cannot grade: where, the error, and what to do."""
    more = f" (and {count - 1} more)" if count > 1 else ""
    import course

    advice = TIME_ADVICE if "time limit" in error else ADVICE
    return (f"the grader is broken, not the submissions: {where}{more}: {error[:300]}. The run stopped "
            f"instead of grading everyone zero. The kernels run the course at {Path(course.__file__).parent}. "
            f"{advice}")


def setup_failure(nb) -> str | None:
    """The error of the set-up cell of an autograded notebook when it failed before any code
    of the student's ran (it is the first code cell: nbgrader restored its source), else None."""
    from .contract import NOT_RUN

    code = [cell for cell in nb.cells if cell.get("cell_type") == "code"]
    if not code or contract.grade_id(code[0]) != contract.SETUP_ID:
        return None
    for output in code[0].get("outputs", []):
        if output.get("output_type") == "error" and output.get("ename") != NOT_RUN:
            return f"{output.get('ename')}: {output.get('evalue')}"
    return None
