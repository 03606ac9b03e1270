"""The book's page kernels forked from the build's kernel server (book/_ext/forked_kernels.py):
each page gets a fresh kernel that already holds PyTorch, in its own folder, with the
build's environment, sharing nothing with the page before; cold when asked."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from notebook_tools import ROOT

pytestmark = pytest.mark.slow   # real kernels, as the book's build starts them

# Two pages run one after the other as the build runs them; each reports what its kernel saw.
PAGES_RUN = textwrap.dedent('''
    import json, os, sys, time
    import nbformat
    sys.path.insert(0, "book/_ext")
    import local_kernels
    local_kernels.install()
    from jupyter_cache.executors import utils

    cell = """
    import json, os, sys
    seen = {"torch_before": "torch" in sys.modules, "cwd": os.getcwd(), "mark": os.environ.get("PAGE_MARK"),
            "left": globals().get("left_by_a_page"), "pid": os.getpid(), "session": os.getsid(0) == os.getpid()}
    left_by_a_page = "page one"
    print(json.dumps(seen))
    """
    for page, folder in enumerate(("book", "book/ch01_embeddings")):
        os.environ["PAGE_MARK"] = f"page {page}"
        nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(cell)])
        result = utils.single_nb_execution(nb, cwd=folder, timeout=120, allow_errors=False)
        assert result.err is None, result.exc_string
        seen = json.loads(nb.cells[0].outputs[0]["text"])
        for _ in range(50):                    # the kernel ends with its page, not with the build
            if not os.path.exists(f"/proc/{seen['pid']}"):
                break
            time.sleep(0.1)
        seen["ended"] = not os.path.exists(f"/proc/{seen['pid']}")
        print(json.dumps(seen), flush=True)
    import forked_kernels
    if forked_kernels._SERVER:          # it ends by itself once the build hangs up (not killed)
        forked_kernels._SERVER[0].close()
        print(json.dumps({"server_status": forked_kernels._SERVER[0].process.returncode}), flush=True)
''')


def _run_pages(**env: str) -> list[dict]:
    done = subprocess.run([sys.executable, "-c", PAGES_RUN], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, **env})
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip() == "", done.stderr        # no banner, warning or error from a kernel
    return [json.loads(line) for line in done.stdout.splitlines()]


def test_each_page_gets_a_fresh_forked_kernel_in_its_folder_with_the_builds_environment():
    first, second, server = _run_pages()
    assert server == {"server_status": 0}
    assert first["torch_before"] and second["torch_before"]          # forked: PyTorch already imported
    assert (first["cwd"], second["cwd"]) == (str(ROOT / "book"), str(ROOT / "book" / "ch01_embeddings"))
    assert (first["mark"], second["mark"]) == ("page 0", "page 1")
    assert first["left"] is None and second["left"] is None         # nothing of the page before
    assert first["pid"] != second["pid"] and first["session"] and second["session"]
    assert first["ended"] and second["ended"]


def test_cold_kernels_when_asked():
    first, second = _run_pages(COURSE_COLD_KERNELS="1")
    assert not first["torch_before"] and not second["torch_before"]
    assert (first["mark"], second["mark"]) == ("page 0", "page 1")


@pytest.mark.parametrize("pidfd", [True, False], ids=["pidfd", "no pidfd (Linux before 5.3)"])
def test_the_holder_ends_with_its_kernel(pidfd):
    sys.path.insert(0, str(ROOT / "book" / "_ext"))
    import forked_kernels

    holder = forked_kernels.HOLDER if pidfd else \
        forked_kernels.HOLDER.replace("waited = os.pidfd_open(kernel)", "raise OSError(38, 'no pidfd_open')")
    assert pidfd or holder != forked_kernels.HOLDER
    kernel = subprocess.Popen(["sleep", "30"])
    watching = subprocess.Popen([sys.executable, "-S", "-c", holder, str(kernel.pid)])
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            watching.wait(timeout=1)                 # the kernel still runs: so does its holder
        kernel.kill()
        kernel.wait()
        assert watching.wait(timeout=10) == 0
    finally:
        kernel.kill()
        watching.kill()
