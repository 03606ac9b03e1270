"""Device and time-limit settings: CLI beats environment beats defaults; errors are clear."""

from __future__ import annotations

import pytest
import torch

from autograder.contract import strip_hidden_region
from autograder.settings import GradingSettings
from course.device import get_device


def test_cli_beats_environment_beats_default(monkeypatch):
    monkeypatch.delenv("COURSE_DEVICE", raising=False)
    monkeypatch.delenv("COURSE_CELL_TIMEOUT", raising=False)
    monkeypatch.delenv("COURSE_PROFILE", raising=False)
    assert GradingSettings.from_env() == GradingSettings("cpu", 300, "cpu")
    monkeypatch.setenv("COURSE_DEVICE", "cuda")
    monkeypatch.setenv("COURSE_CELL_TIMEOUT", "42")
    monkeypatch.setenv("COURSE_PROFILE", "gpu")
    assert GradingSettings.from_env() == GradingSettings("cuda", 42, "gpu")
    assert GradingSettings.from_env(device="cpu", cell_timeout=7, profile="smoke") == GradingSettings("cpu", 7, "smoke")


@pytest.mark.parametrize("env,message", [({"COURSE_CELL_TIMEOUT": "soon"}, "whole number"),
                                         ({"COURSE_DEVICE": "tpu"}, "device must be"),
                                         ({"COURSE_PROFILE": "huge"}, "profile must be")])
def test_bad_settings_are_named(monkeypatch, env, message):
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(ValueError, match=message):
        GradingSettings.from_env()


def test_settings_reach_a_child_process_environment(monkeypatch):
    import os
    import subprocess
    import sys

    monkeypatch.setenv("PATH", os.environ["PATH"])
    GradingSettings("cpu", 11).apply_to_environment()
    out = subprocess.run([sys.executable, "-c", "from course.device import get_device; import os;"
                          "print(get_device(), os.environ['COURSE_CELL_TIMEOUT'])"],
                         capture_output=True, text=True, check=True).stdout.split()
    assert out == ["cpu", "11"]


def test_get_device(monkeypatch):
    monkeypatch.setenv("COURSE_DEVICE", "cpu")
    assert get_device() == torch.device("cpu")
    if not torch.cuda.is_available():
        monkeypatch.setenv("COURSE_DEVICE", "cuda")
        with pytest.raises(RuntimeError, match="asks for a GPU"):
            get_device()


def test_strip_hidden_region_keeps_visible_lines():
    source = "# visible\ncheck(a)\n### BEGIN HIDDEN TESTS\nsecret(a)\n### END HIDDEN TESTS\nafter()"
    stripped, found = strip_hidden_region(source)
    assert found and "secret" not in stripped and "check(a)" in stripped and "after()" in stripped
    assert strip_hidden_region("plain()") == ("plain()", False)


def test_kernel_threads_follow_the_environment_when_set(monkeypatch):
    from autograder.coursetree import THREADS_ENV, thread_environment
    from autograder.workers import cores, threads_per_worker

    monkeypatch.delenv(THREADS_ENV, raising=False)
    assert thread_environment(None) == {} and threads_per_worker(1) == cores()
    assert thread_environment(3)["OMP_NUM_THREADS"] == "3"
    monkeypatch.setenv(THREADS_ENV, "1")
    assert thread_environment(None) == {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    assert threads_per_worker(1) == 1
    for bad in ("0", "two", "-1", ""):
        monkeypatch.setenv(THREADS_ENV, bad)
        assert thread_environment(None) == {} and threads_per_worker(1) == cores()


def test_the_grading_secret_file_is_never_seen_half_written(tmp_path):
    """Parallel workers open the course tree at once: a worker that rewrote the seed file in
    place (truncate, then write) let another read an empty file (CI saw the first submission
    of a batch lose its row that way). An unchanged seed leaves the file alone; a new one
    replaces it whole."""
    import types

    from autograder.coursetree import CourseTree

    tree = types.SimpleNamespace(root=tmp_path, settings=types.SimpleNamespace(seed=None))
    seed = CourseTree.grading_seed(tree)
    path = tmp_path / "grading-secret"
    before = path.stat()
    assert seed.bit_length() > 200 and before.st_mode & 0o077 == 0     # 256 random bits, the grader's alone
    assert CourseTree.grading_seed(tree) == seed
    after = path.stat()
    assert (after.st_ino, after.st_mtime_ns, after.st_size) == (before.st_ino, before.st_mtime_ns, before.st_size)
    tree.settings.seed = seed + 1
    assert CourseTree.grading_seed(tree) == seed + 1
    assert path.stat().st_ino != before.st_ino and path.read_text() == f"{seed + 1}\n"
