"""nbconvert preprocessors that plug into nbgrader's autograde and feedback steps."""

from __future__ import annotations

from nbformat.notebooknode import NotebookNode, from_dict
from nbgrader.preprocessors import NbGraderPreprocessor

from .contract import is_graded, strip_hidden_region


def _error_output(ename: str, evalue: str) -> NotebookNode:
    return from_dict({"output_type": "error", "ename": ename, "evalue": evalue,
                      "traceback": [f"{ename}: {evalue}"]})


class StderrIsNotFailure(NbGraderPreprocessor):
    """Turn stderr text in graded cells into stdout text, marked as such.

    nbgrader scores any graded cell with stderr output as failed, so a correct answer that
    triggers a PyTorch warning would lose its points. Exceptions remain ``error`` outputs
    and still fail the cell.
    """

    def preprocess_cell(self, cell, resources, cell_index):
        if cell.cell_type == "code" and is_graded(cell):
            for output in cell.outputs:
                if output.output_type == "stream" and output.name == "stderr":
                    output.name = "stdout"
                    output.text = "".join(f"[stderr] {line}" for line in output.text.splitlines(True))
        return cell, resources


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
