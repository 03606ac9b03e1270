"""The notebook contract and the one executor: roles, per-cell limits, surviving time-outs
and dead kernels (the self-check's path: no sandbox, nothing judged outside the kernel)."""

from __future__ import annotations

from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from autograder import contract
from autograder.contract import Role
from autograder.executor import KERNEL_DIED, NOT_RUN, CourseExecute
from notebook_tools import ROOT


def _cell(source: str, grade_id: str, limit=None, **nbgrader):
    cell = new_code_cell(source)
    cell.metadata["nbgrader"] = {"grade_id": grade_id, "grade": False, "solution": False, "locked": True, **nbgrader}
    if limit is not None:
        cell.metadata["course"] = {"timeout": limit}
    return cell


def _run(cells, timeout=1, limits=None):
    nb = new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    executor = CourseExecute(timeout=timeout, release_limits=limits or {}, kernel_name="python3")
    executor.preprocess(nb, {"nbgrader": {"notebook": "nb"}, "metadata": {"path": "."}})
    return nb, executor


def test_cell_limits_are_read_per_profile():
    nb = new_notebook(cells=[_cell("pass", "train", {"smoke": 30, "cpu": 900}), _cell("pass", "other"),
                             _cell("pass", "flat", 45)])
    assert contract.time_limits(nb, "cpu") == {"train": 900, "flat": 45}
    assert contract.time_limits(nb, "gpu") == {"flat": 45}
    assert contract.time_limit(nb.cells[1], "cpu", 300) == 300


def test_roles_of_every_course_notebook_cell():
    hidden = _cell("x = 1\n### BEGIN HIDDEN TESTS\ncheck(x)\n### END HIDDEN TESTS\n", "ex1_hidden", grade=True)
    cells = [new_markdown_cell("prose"), _cell("import torch", "setup"),
             _cell("def f(): ...", "ex1_answer", solution=True, locked=False),
             _cell("check(f)", "ex1_visible", grade=True), hidden, _cell("train()", "train"),
             _cell("score()", "ex_eval", grade=True)]
    cells[5].metadata["course"] = {"role": "training"}
    cells[6].metadata["course"] = {"role": "evaluation"}
    assert [contract.role(c) for c in cells] == [Role.OTHER, Role.SETUP, Role.ANSWER, Role.VISIBLE, Role.HIDDEN,
                                                 Role.TRAINING, Role.EVALUATION]
    assert {contract.role(c) for c in cells if contract.role(c) in contract.JUDGED} == \
        {Role.VISIBLE, Role.HIDDEN, Role.EVALUATION}


def test_every_capstone_training_and_scoring_cell_declares_its_role():
    nb = contract.read(ROOT / "solutions" / "ch07_capstone" / "ch07_capstone.ipynb")
    roles = {contract.grade_id(c): contract.role(c) for c in nb.cells}
    for gid in ("lm_train", "g2p_train", "cls_train"):
        assert roles[gid] is Role.TRAINING
    for gid in ("lm_eval", "g2p_eval", "cls_eval"):
        assert roles[gid] is Role.EVALUATION


def test_setup_imports_are_only_the_imports():
    nb = new_notebook(cells=[_cell("import math\nfrom course.checks import ch01 as checks\nseed_everything(0)\n"
                                   "x = 1", "setup")])
    assert contract.setup_imports(nb) == "import math\nfrom course.checks import ch01 as checks"


def test_a_declared_limit_replaces_the_default_for_that_cell_only():
    nb, executor = _run([_cell("import time; time.sleep(2.5); print('long cell finished')", "train"),
                         _cell("import time; time.sleep(2.5); print('plain cell finished')", "plain")],
                        limits={"nb/train": 20})
    train, plain = nb.cells
    assert "long cell finished" in "".join(o.get("text", "") for o in train.outputs)
    assert any(o.output_type == "error" and "Timeout" in o.ename for o in plain.outputs), plain.outputs
    assert executor.timeout == 1, "the default must be restored after the special cell"


def test_a_dead_kernel_keeps_earlier_outputs_and_marks_the_rest_not_run():
    nb, _ = _run([_cell("print('before')", "a"), _cell("import os; os._exit(3)", "b"), _cell("print('after')", "c")],
                 timeout=30)
    a, b, c = nb.cells
    assert "before" in a.outputs[0].text
    assert any(o.get("ename") == KERNEL_DIED for o in b.outputs), b.outputs
    assert c.outputs[0].ename == NOT_RUN and "kernel died while running b" in c.outputs[0].evalue


def test_output_beyond_the_limit_is_dropped_with_a_note():
    nb, _ = _run([_cell("for i in range(400):\n    print('y' * 20000)", "flood")], timeout=30)
    text = "".join(o.get("text", "") for o in nb.cells[0].outputs)
    assert len(text) < (2 << 20) + 100_000 and "output stopped here" in text


def test_workers_start_with_the_submissions_that_declare_the_most_time(tmp_path):
    """The capstone's training cells declare minutes; started last, one capstone kept a worker
    busy alone at the end of a batch (44 s of the end-to-end batch) while the other idled."""
    import dataclasses

    from autograder.coursetree import CourseTree
    from autograder.grade import Found, Grader
    from autograder.settings import GradingSettings

    settings = dataclasses.replace(GradingSettings.from_env(profile="smoke"), unsandboxed=True)
    tree = CourseTree(tmp_path / "course", ROOT / "solutions", settings)
    tree.api.config.CourseExecute.release_limits = {
        f"{a}/{gid}": sec for a in tree.assignments()
        for gid, sec in contract.time_limits(contract.read(ROOT / "solutions" / a / f"{a}.ipynb"), "smoke").items()}
    assert tree.declared_seconds("ch07_capstone") > 0 == tree.declared_seconds("ch01_embeddings")
    assert tree.declared_seconds("no_such_assignment") == 0
    grader = Grader(ROOT / "solutions", tmp_path / "out", settings)
    grader.tree = tree
    found = [Found(s, a) for s in ("ann", "bob") for a in ("ch01_embeddings", "ch07_capstone", "ch02_positions")]
    order = [(f.student, f.assignment) for f in grader._longest_first(found)]
    assert order == [("ann", "ch07_capstone"), ("bob", "ch07_capstone"), ("ann", "ch01_embeddings"),
                     ("ann", "ch02_positions"), ("bob", "ch01_embeddings"), ("bob", "ch02_positions")]
