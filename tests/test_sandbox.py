"""The sandbox a submission's kernel runs in: what it can see, reach and use."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import course
from autograder.sandbox import Limits, Sandbox, available
from autograder.sandbox_ids import FIRST_ID
from grading_tools import rows_of, run_grade
from notebook_tools import ROOT

pytestmark = pytest.mark.skipif(not available(), reason="bubblewrap is not usable here")

PROBE = r"""
import json, os, socket, sys
found = {"uid": os.getuid(), "home": sorted(os.listdir(os.path.expanduser("~"))),
         "tmp": sorted(os.listdir("/tmp")), "env": sorted(os.environ),
         "solutions": os.path.exists(%(solutions)r), "repo_files": sorted(os.listdir(%(repo)r)),
         "pids": sorted(int(p) for p in os.listdir("/proc") if p.isdigit())}
try:
    socket.create_connection(("1.1.1.1", 53), timeout=2)
    found["network"] = True
except OSError:
    found["network"] = False
import course.probe, torch
try:
    torch.empty(3 << 30, dtype=torch.uint8).fill_(1)
    found["memory"] = "allocated"
except (RuntimeError, MemoryError) as err:
    found["memory"] = type(err).__name__
print(json.dumps(found))
"""


def _run_inside(tmp_path: Path, code: str, limits: Limits = Limits()) -> subprocess.CompletedProcess:
    sandbox = Sandbox(tmp_path / "sb", Path(course.__file__).parent, limits, env={"COURSE_DEVICE": "cpu"})
    try:
        return subprocess.run(sandbox.prefix() + [sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=120, env={**os.environ, "GRADER_SECRET": "s3cret"})
    finally:
        sandbox.cleanup()


def test_a_sandboxed_process_sees_only_what_it_needs(tmp_path):
    import json

    marker = Path("/tmp/course-host-marker")
    marker.write_text("host file")
    done = _run_inside(tmp_path, PROBE % {"solutions": str(ROOT / "solutions"), "repo": str(ROOT)},
                       Limits(memory_bytes=2 << 30))
    assert done.returncode == 0, done.stderr[-2000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["solutions"] is False
    assert set(found["repo_files"]) <= {"course", ".venv", "venv"}, found["repo_files"]
    assert found["network"] is False
    # Empty HOME and /tmp, but for the folders of the sandbox's own sockets and requests.
    assert found["home"] == ["work"] and marker.name not in found["tmp"], found
    assert "GRADER_SECRET" not in found["env"] and "COURSE_DEVICE" in found["env"]
    assert found["memory"] in ("RuntimeError", "MemoryError"), "3 GiB must not fit under a 2 GiB limit"
    assert max(found["pids"]) < 50, "its own PID namespace: the grader's processes are not there"
    if os.geteuid() == 0:
        assert found["uid"] >= FIRST_ID, "as root, the kernel must run under a leased unprivileged id"


def test_a_sandbox_leaves_nothing_behind(tmp_path):
    sandbox = Sandbox(tmp_path / "sb", Path(course.__file__).parent)
    sandbox.cleanup()
    assert not (tmp_path / "sb").exists()


def test_grading_refuses_without_a_sandbox_unless_asked(tmp_path):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for tool in ("python", "python3"):
        (bindir / tool).symlink_to(sys.executable)
    env = {**os.environ, "PATH": str(bindir)}   # no bwrap on PATH
    done = run_grade(ROOT / "exercises", tmp_path / "out", returncode=2, env=env, workers=None, timeout=None,
                     profile=None)
    assert "bubblewrap" in done.stderr and "--unsandboxed" in done.stderr


@pytest.mark.slow
def test_unsandboxed_grading_is_noted_in_every_row(tmp_path):
    subs = tmp_path / "subs" / "me" / "ch01_embeddings"
    subs.mkdir(parents=True)
    shutil.copy(ROOT / "exercises" / "ch01_embeddings" / "ch01_embeddings.ipynb", subs)
    run_grade(tmp_path / "subs", tmp_path / "out", "--unsandboxed", workers=None, timeout=30, profile=None)
    rows = rows_of(tmp_path / "out")
    assert rows and all("without the sandbox" in r["notes"] for r in rows), rows


HELD_OUT_PROBE = r"""
import json
from course.capstone import data
from course.data.cmudict import load_pronunciations, split_of
from course.data.shakespeare import load_shakespeare, plays_dir

found = {}
for name, load in [("lm", lambda: data.lm_ids("test")), ("g2p", lambda: data.g2p_pairs("test")),
                   ("classifier", lambda: data.classifier_tensors("test"))]:
    try:
        load()
        found[name] = "read"
    except PermissionError as err:
        found[name] = str(err)
found["test words"] = sum(1 for word in load_pronunciations() if split_of(word) == "test")
found["macbeth bytes"] = sum(len(p.read_bytes()) for p in plays_dir().glob("*/macbeth.md"))
found["train plays"] = len(load_shakespeare("train")) > 1_000_000
found["vocab"] = data.char_tokenizer().vocab_size
print(json.dumps(found))
"""


@pytest.mark.skipif(not available(), reason="bubblewrap cannot run here")
def test_a_graded_kernel_cannot_read_the_test_splits(tmp_path):
    """The capstone's held-out data, as the grader's sandbox shows it: the loaders refuse the
    test split with a clear message, the test plays' files are empty and the dictionary
    lacks the test words, so no route reads them; train and validation are all there."""
    import json

    from autograder.kernel_view import kernel_course, public_data
    from course.capstone import data
    from course.data.heldout import ENV

    view = kernel_course()
    sandbox = Sandbox(tmp_path / "sb", view / "course", env={"COURSE_DEVICE": "cpu", "PYTHONPATH": str(view),
                                                             ENV: "1"}, replaced=public_data())
    try:
        done = subprocess.run(sandbox.prefix() + [sys.executable, "-c", HELD_OUT_PROBE], capture_output=True,
                              text=True, timeout=300)
    finally:
        sandbox.cleanup()
    assert done.returncode == 0, done.stderr[-2000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    for name in ("lm", "g2p", "classifier"):
        assert "the test split is held out while grading" in found[name], found
    assert found["test words"] == 0 and found["macbeth bytes"] == 0, found
    assert found["train plays"] and found["vocab"] == data.char_tokenizer().vocab_size, found
