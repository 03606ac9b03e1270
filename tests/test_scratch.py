"""A grading process's folder in the temporary directory (autograder/scratch.py): gone when the
process ends, however it ends, and never taken from a process that is still running."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from notebook_tools import ROOT

MAKE_AND_WAIT = """
import sys, time
from autograder import scratch
folder = scratch.folder("kernel-view-")
print(folder.parent, flush=True)
if sys.argv[1] == "wait":
    time.sleep(60)
"""

IN_A_POOL_WORKER = """
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from autograder import scratch

def made(_):
    return str(scratch.folder("sandbox-").parent)

if __name__ == "__main__":
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("forkserver")) as pool:   # as workers.py
        print(pool.submit(made, 0).result(), flush=True)
"""


def start(tmp_path: Path, program: str, *args: str) -> tuple[subprocess.Popen, Path]:
    env = {**os.environ, "TMPDIR": str(tmp_path), "PYTHONPATH": str(ROOT)}
    script = tmp_path / f"program-{len(list(tmp_path.glob('program-*')))}.py"    # a pool pickles by module
    script.write_text(program, encoding="utf-8")
    process = subprocess.Popen([sys.executable, str(script), *args], stdout=subprocess.PIPE, text=True,
                               env=env, cwd=tmp_path)
    return process, Path(process.stdout.readline().strip())


def test_a_folder_is_removed_when_its_process_ends(tmp_path):
    process, folder = start(tmp_path, MAKE_AND_WAIT, "end")
    assert folder.parent == tmp_path and folder.name.startswith("course-scratch-")
    assert process.wait(timeout=60) == 0
    assert not folder.exists()


def test_a_pool_workers_folder_is_removed_when_the_pool_shuts_down(tmp_path):
    process, folder = start(tmp_path, IN_A_POOL_WORKER)
    assert folder.name.startswith("course-scratch-")
    assert process.wait(timeout=60) == 0
    assert not folder.exists()


def test_a_killed_process_folder_is_swept_by_the_next_and_a_living_one_is_kept(tmp_path):
    from autograder import scratch

    killed, left = start(tmp_path, MAKE_AND_WAIT, "wait")
    living, kept = start(tmp_path, MAKE_AND_WAIT, "wait")
    try:
        killed.send_signal(signal.SIGKILL)
        killed.wait(timeout=30)
        assert any(left.glob("kernel-view-*"))      # nothing of it ran at its exit
        assert scratch.sweep(tmp_path) == [left]
        assert not left.exists() and kept.is_dir()
    finally:
        living.kill()
        living.wait(timeout=30)
    assert scratch.sweep(tmp_path) == [kept]
