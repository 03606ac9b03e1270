"""nbconvert preprocessors that plug into nbgrader's autograde and feedback steps."""

from __future__ import annotations

import re

from nbclient.exceptions import DeadKernelError
from nbformat.notebooknode import NotebookNode, from_dict
from nbgrader.preprocessors import Execute, NbGraderPreprocessor
from traitlets import Dict, Unicode

HIDDEN_BEGIN = "### BEGIN HIDDEN TESTS"
HIDDEN_END = "### END HIDDEN TESTS"
HIDDEN_PLACEHOLDER = "# (hidden tests: their code is not shown in feedback)"
KERNEL_DIED = "KernelDied"
NOT_RUN = "NotRun"


def _error_output(ename: str, evalue: str) -> NotebookNode:
    return from_dict({"output_type": "error", "ename": ename, "evalue": evalue,
                      "traceback": [f"{ename}: {evalue}"]})


def _is_graded(cell: NotebookNode) -> bool:
    return bool(cell.get("metadata", {}).get("nbgrader", {}).get("grade", False))


class SurvivingExecute(Execute):
    """Execute that survives a dying kernel.

    nbclient raises ``DeadKernelError`` when the kernel process dies (killed for memory,
    ``os._exit``, a segfault) and nbgrader then records nothing for the whole notebook.
    Here the cell that was running gets an error output, every later code cell gets a
    "not run" error, and grading goes on: points earned before the crash are kept.
    """

    death_reason = Unicode("")
    cell_timeouts = Dict({}, help="'notebook/grade_id' -> seconds: per-cell limits from the released "
                                  "notebook (a training cell needs minutes); others use `timeout`.").tag(config=True)

    def preprocess(self, nb, resources=None, km=None):
        self.death_reason = ""
        return super().preprocess(nb, resources, km)

    def _limit_for(self, cell, resources) -> int | None:
        notebook = (resources or {}).get("nbgrader", {}).get("notebook", "")
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        return self.cell_timeouts.get(f"{notebook}/{grade_id}") if grade_id else None

    def preprocess_cell(self, cell, resources, index):
        if cell.cell_type != "code":
            return cell, resources
        if self.death_reason:
            cell.outputs = [_error_output(NOT_RUN, f"not run: {self.death_reason}")]
            return cell, resources
        default, special = self.timeout, self._limit_for(cell, resources)
        try:
            if special:
                self.timeout = int(special)
            return super().preprocess_cell(cell, resources, index)
        except DeadKernelError as err:
            grade_id = cell.metadata.get("nbgrader", {}).get("grade_id", f"cell {index}")
            self.death_reason = f"the kernel died while running {grade_id} ({err})"
            self.log.warning("Kernel died in %s; later cells are not run", grade_id)
            cell.outputs.append(_error_output(KERNEL_DIED, self.death_reason))
            return cell, resources
        finally:
            self.timeout = default


class StderrIsNotFailure(NbGraderPreprocessor):
    """Turn stderr text in graded cells into stdout text, marked as such.

    nbgrader scores any graded cell with stderr output as failed, so a correct answer that
    triggers a PyTorch warning would lose its points. Exceptions remain ``error`` outputs
    and still fail the cell.
    """

    def preprocess_cell(self, cell, resources, cell_index):
        if cell.cell_type == "code" and _is_graded(cell):
            for output in cell.outputs:
                if output.output_type == "stream" and output.name == "stderr":
                    output.name = "stdout"
                    output.text = "".join(f"[stderr] {line}" for line in output.text.splitlines(True))
        return cell, resources


def strip_hidden_region(source: str) -> tuple[str, bool]:
    """Remove the lines between the hidden-test markers; say whether any were removed."""
    pattern = re.compile(rf"^[ \t]*{re.escape(HIDDEN_BEGIN)}.*?^[ \t]*{re.escape(HIDDEN_END)}[^\n]*\n?",
                         re.MULTILINE | re.DOTALL)
    stripped, count = pattern.subn(HIDDEN_PLACEHOLDER + "\n", source)
    return stripped, count > 0


class HideHiddenTests(NbGraderPreprocessor):
    """Keep hidden tests out of feedback: their code and their tracebacks.

    A cell with a hidden region keeps its visible lines; the hidden lines are replaced by
    a placeholder, and each error output is cut to its last line (the exception and the
    hint the check helper wrote), so the student learns what is wrong but not the test.
    """

    def preprocess_cell(self, cell, resources, cell_index):
        if cell.cell_type != "code":
            return cell, resources
        cell.source, had_hidden = strip_hidden_region(cell.source)
        if had_hidden:
            kept = []
            for output in cell.outputs:
                if output.output_type == "error":
                    kept.append(_error_output(output.ename, output.evalue))
            cell.outputs = kept
        return cell, resources


def cell_time_limits(notebook_path, notebook_name: str, profile: str) -> dict[str, int]:
    """Per-cell limits declared in a released notebook's metadata for one profile.

    A cell declares ``{"course": {"timeout": {"smoke": 120, "cpu": 900, "gpu": 900}}}`` or a
    plain number of seconds for every profile.
    """
    import nbformat

    limits = {}
    for cell in nbformat.read(notebook_path, as_version=4).cells:
        grade_id = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        declared = cell.get("metadata", {}).get("course", {}).get("timeout")
        if grade_id and declared is not None:
            seconds = declared.get(profile) if isinstance(declared, dict) else declared
            if seconds:
                limits[f"{notebook_name}/{grade_id}"] = int(seconds)
    return limits
