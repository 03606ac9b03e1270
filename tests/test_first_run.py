"""A learner's first run: the released notebooks' test cells before any answer, the links and
the extensions of JupyterLab started as the README says, and `make check` on a failing check."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

import nbformat
import pytest

from mistakes import assignments
from notebook_tools import ROOT, grade_id, release_notebook

pytestmark = pytest.mark.slow   # real kernels and JupyterLab started as the README starts it

ANSI = re.compile(r"\x1b\[[0-9;]*m")
NOT_WRITTEN = re.compile(r"^([\w.]+) is not written yet: replace the `raise NotImplementedError\(\)` in its answer cell")


def _role(cell) -> str:
    meta = cell.metadata.get("nbgrader", {})
    return "answer" if meta.get("solution") else "test" if meta.get("grade") else "other"


def _has_code(source: str) -> bool:
    return any(line.strip() and not line.strip().startswith("#") for line in source.splitlines())


def _first_run() -> list[tuple[str, nbformat.NotebookNode, set[str]]]:
    """Every released notebook's code cells, stubs as released, run in order in one real
    kernel (a kernel start and torch's import for all seven), its namespace cleared between
    notebooks. Returns (assignment, test cell with its outputs, names the notebook's answer
    cells define)."""
    from nbclient import NotebookClient

    nb, tests = nbformat.v4.new_notebook(), []
    for assignment in assignments():
        nb.cells.append(nbformat.v4.new_code_cell("%reset -f"))
        defined: set[str] = set()
        for cell in release_notebook(assignment).cells:
            role = _role(cell) if cell.cell_type == "code" else ""
            if role:
                nb.cells.append(cell)
            if role == "answer":
                defined |= set(re.findall(r"^(?:def|class) (\w+)", cell.source, flags=re.M))
            if role == "test" and _has_code(cell.source):
                tests.append((assignment, cell, defined))
    NotebookClient(nb, timeout=300, kernel_name="python3", allow_errors=True,
                   resources={"metadata": {"path": str(ROOT)}}).execute()
    return tests


def test_first_run_shows_one_line_per_unanswered_exercise():
    """Each test cell run on the stubs fails with one line that names a function the
    notebook asks for (an evaluation cell of the capstone: what to finish first)."""
    tests = _first_run()
    assert len(tests) >= 60 and {a for a, _, _ in tests} == set(assignments())
    for assignment, cell, defined in tests:
        errors = [o for o in cell.outputs if o.output_type == "error"]
        assert len(errors) == 1, (assignment, grade_id(cell), cell.outputs)
        shown = [ANSI.sub("", line) for line in errors[0].traceback]
        where = f"{assignment}/{grade_id(cell)} shows {len(shown)} lines:\n" + "\n".join(shown)
        assert len(shown) == 1 and "\n" not in shown[0], where
        assert errors[0].ename == "NotImplementedError", where
        named = NOT_WRITTEN.match(shown[0])
        if named:
            assert named.group(1).split(".")[0] in defined, where
        else:
            assert shown[0].startswith("nothing was trained: finish exercises"), where


# ----------------------------------------------------------------------------- JupyterLab


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def learner_lab(tmp_path_factory):
    """JupyterLab as the README starts it (`.venv/bin/jupyter lab exercises/`), after `make`
    wrote the learner's configuration; yields a function that GETs a path of it."""
    home = tmp_path_factory.mktemp("home")
    made = subprocess.run(["make", "-o", ".venv/.installed", ".venv/.learner-jupyter"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, made.stdout + made.stderr
    port, token = _free_port(), "course-first-run"
    env = {**os.environ, "HOME": str(home), "JUPYTER_RUNTIME_DIR": str(home / "runtime"),
           "JUPYTERLAB_SETTINGS_DIR": str(home / "settings")}
    root_flag = ["--allow-root"] if hasattr(os, "geteuid") and os.geteuid() == 0 else []
    server = subprocess.Popen([str(ROOT / ".venv" / "bin" / "jupyter"), "lab", "exercises/", "--no-browser",
                               f"--ServerApp.port={port}", "--ServerApp.ip=127.0.0.1",
                               f"--IdentityProvider.token={token}", *root_flag],
                              cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)

    def get(path: str) -> tuple[int, bytes]:
        url = f"http://127.0.0.1:{port}/{path}{'&' if '?' in path else '?'}token={token}"
        try:
            with urllib.request.urlopen(url, timeout=10) as reply:
                return reply.status, reply.read()
        except urllib.error.HTTPError as err:
            return err.code, err.read()

    try:
        deadline = time.monotonic() + 90
        while True:
            assert server.poll() is None, server.stdout.read().decode()[-3000:]
            try:
                if get("api/status")[0] == 200:
                    break
            except OSError:
                assert time.monotonic() < deadline, "JupyterLab did not answer"
                time.sleep(0.5)
        yield get
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_learner_jupyterlab_has_no_nbgrader_panels(learner_lab):
    """The page JupyterLab serves lists nbgrader's front-end as disabled (so no Create
    Assignment, Formgrader or course list), and the server runs none of its handlers."""
    status, page = learner_lab("lab")
    assert status == 200
    found = re.search(rb'<script id="jupyter-config-data" type="application/json">(.*?)</script>', page, re.S)
    config = json.loads(found.group(1))
    names = {e["name"] for e in config["federated_extensions"]}
    assert "@jupyter/nbgrader" in names, "nbgrader's lab extension is installed: the test would prove nothing"
    assert "@jupyter/nbgrader" in config["disabledExtensions"], config["disabledExtensions"]
    for handler in ("formgrader", "assignments", "courses"):
        assert learner_lab(handler)[0] == 404, f"/{handler} is served"


def test_links_of_the_released_notebooks_open_in_jupyterlab(learner_lab):
    """Every relative link in a released notebook's Markdown, resolved from the notebook's
    folder as JupyterLab does, is a notebook that the server opens."""
    links = 0
    for assignment in assignments():
        for cell in release_notebook(assignment).cells:
            if cell.cell_type != "markdown":
                continue
            for target in re.findall(r"\]\(([^)\s]+)\)", cell.source):
                if re.match(r"[a-z]+:|#", target):
                    continue
                path = os.path.normpath(f"{assignment}/{target.split('#')[0]}")
                assert not path.startswith(".."), f"{assignment} links outside exercises/: {target}"
                status, body = learner_lab(f"api/contents/{urllib.parse.quote(path)}?content=1")
                assert status == 200, f"{assignment}: {target} -> {status}"
                assert json.loads(body)["type"] == "notebook", target
                links += 1
    assert links >= 14


# ----------------------------------------------------------------------------- make check


def _make_check(notebook) -> subprocess.CompletedProcess:
    return subprocess.run(["make", "-o", ".venv/.installed", "check", f"NB={notebook}"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


def test_make_check_ends_with_a_sentence_and_a_non_zero_status(tmp_path):
    """A failing check ends with what failed, not make's `*** [Makefile:..: check] Error 1`,
    and scripts still get a non-zero status; a check that could not run says so."""
    def cell(source: str, gid: str, test: bool):
        made = nbformat.v4.new_code_cell(source)
        made.metadata["nbgrader"] = {"grade": test, "grade_id": gid, "locked": test, "points": 1 if test else 0,
                                     "schema_version": 3, "solution": not test, "task": False}
        return made

    nb = nbformat.v4.new_notebook(cells=[cell("def f():\n    raise NotImplementedError()", "ex1_answer", False),
                                         cell("from course.checks._core import call\ncall(f)", "ex1_visible", True)])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, tmp_path / "stub.ipynb")
    failed = _make_check(tmp_path / "stub.ipynb")
    shown = failed.stdout + failed.stderr
    assert failed.returncode != 0, shown
    assert "f is not written yet" in failed.stdout and "visible tests: 0 / 1 points" in failed.stdout, shown
    assert "Some visible tests failed: the cells marked FAILED above say why" in failed.stderr, shown
    assert "Error 1" not in shown and "[Makefile" not in shown, shown

    missing = _make_check(tmp_path / "nope.ipynb")
    assert missing.returncode != 0 and "No notebook at" in missing.stderr, missing.stderr
    assert "The self-check could not run" in missing.stderr and "[Makefile" not in missing.stderr, missing.stderr
