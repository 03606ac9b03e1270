"""Per-cell time limits: a cell may declare its own limit per profile; others get the default."""

from __future__ import annotations

import nbformat
from nbformat.v4 import new_code_cell, new_notebook

from autograder.preprocessors import SurvivingExecute, cell_time_limits


def _cell(source: str, grade_id: str, limit=None):
    cell = new_code_cell(source)
    cell.metadata["nbgrader"] = {"grade_id": grade_id, "grade": False, "solution": False, "locked": True}
    if limit is not None:
        cell.metadata["course"] = {"timeout": limit}
    return cell


def test_cell_limits_are_read_per_profile(tmp_path):
    nb = new_notebook(cells=[_cell("pass", "train", {"smoke": 30, "cpu": 900}), _cell("pass", "other"),
                             _cell("pass", "flat", 45)])
    path = tmp_path / "nb.ipynb"
    nbformat.write(nb, path)
    assert cell_time_limits(path, "nb", "cpu") == {"nb/train": 900, "nb/flat": 45}
    assert cell_time_limits(path, "nb", "gpu") == {"nb/flat": 45}


def test_a_declared_limit_replaces_the_default_for_that_cell_only():
    nb = new_notebook(cells=[_cell("import time; time.sleep(2.5); print('long cell finished')", "train"),
                             _cell("import time; time.sleep(2.5); print('plain cell finished')", "plain")])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    executor = SurvivingExecute(timeout=1, cell_timeouts={"nb/train": 20}, kernel_name="python3")
    executor.preprocess(nb, {"nbgrader": {"notebook": "nb"}, "metadata": {"path": "."}})
    train, plain = nb.cells
    assert "long cell finished" in "".join(o.get("text", "") for o in train.outputs)
    assert any(o.output_type == "error" and "Timeout" in o.ename for o in plain.outputs), plain.outputs
    assert executor.timeout == 1, "the default must be restored after the special cell"
