"""The book's kernels log nothing in a successful build: they talk over IPC (no warning about
TCP without encryption) and are shut down without the SIGINT that made one of them log
``ERROR | KeyboardInterrupt caught in kernel`` (book/_ext/local_kernels.py)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from notebook_tools import ROOT

pytestmark = pytest.mark.slow   # real kernels, as the book's build starts them

# One page run as the book's build runs it (jupyter-cache hands it to nbclient). Its cell
# makes a SIGINT visible: ipykernel restores its own handler after each cell, so the cell
# puts one into the hook that does the restoring, and it prints to the kernel's stderr.
PAGE_RUN = textwrap.dedent('''
    import sys
    import nbformat
    sys.path.insert(0, "book/_ext")
    if sys.argv[1] == "local":
        import local_kernels
        local_kernels.install()
    from jupyter_cache.executors import utils

    cell = """
    import signal, sys
    kernel = get_ipython().kernel
    seen = lambda *_: print("SIGINT reached the kernel", file=sys.__stderr__, flush=True)
    kernel.post_handler_hook = lambda: signal.signal(signal.SIGINT, seen)
    from ipykernel.kernelapp import IPKernelApp
    print(IPKernelApp.instance().transport)
    """
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(cell)])
    result = utils.single_nb_execution(nb, cwd="book", timeout=120, allow_errors=False)
    assert result.err is None, result.exc_string
    print("transport:", nb.cells[0].outputs[0]["text"].strip())
''')


def _run_page(mode: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", PAGE_RUN, mode], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)


def test_a_book_page_runs_over_ipc_and_stops_without_an_interrupt():
    done = _run_page("local")
    assert done.returncode == 0, done.stderr
    assert "transport: ipc" in done.stdout, done.stdout
    assert done.stderr.strip() == "", done.stderr        # no warning, no ERROR, no SIGINT


def test_a_page_run_by_default_shows_both_noises():
    """The control: without the extension, the same page warns about TCP and its kernel
    receives the shutdown's SIGINT (which is what logs the ERROR when it lands in a handler)."""
    done = _run_page("default")
    assert done.returncode == 0, done.stderr
    assert "Kernel is running over TCP without encryption" in done.stderr
    assert "SIGINT reached the kernel" in done.stderr
