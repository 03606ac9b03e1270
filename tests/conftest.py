import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.modules.setdefault("rfc3987_syntax", None)     # 2.5 s of grammar compiling under nbformat (autograder/__init__)

# The test suite grades the capstone in its smallest profile, on the CPU, whatever the shell says.
os.environ["COURSE_PROFILE"] = "smoke"
os.environ["COURSE_DEVICE"] = "cpu"


_BOOK_BUILD = None     # started at collection when a selected test needs the book


@pytest.fixture(scope="session")
def book_build():
    """The book, whose build started with the session and ran beside the other tests."""
    if _BOOK_BUILD is None:      # collected without the hook (should not happen)
        return _start_book_build()
    return _BOOK_BUILD


def _start_book_build():
    global _BOOK_BUILD
    from book_build import SHARED_ENV, BookBuild, BuiltBook, SharedBookBuild

    # COURSE_BOOK_HTML: test a book built before (e.g. by `make book`) instead of building one
    if os.environ.get("COURSE_BOOK_HTML"):
        _BOOK_BUILD = BuiltBook(os.environ["COURSE_BOOK_HTML"])
    elif os.environ.get(SHARED_ENV):      # a pytest-xdist worker: the controller builds it
        _BOOK_BUILD = SharedBookBuild(os.environ[SHARED_ENV])
    else:
        _BOOK_BUILD = BookBuild()
    return _BOOK_BUILD


ONE_THREAD = ("COURSE_KERNEL_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def _controls_workers(config) -> bool:
    """This process hands the tests out to pytest-xdist workers (``-n N``) and runs none."""
    return bool(getattr(config.option, "numprocesses", None)) and not hasattr(config, "workerinput")


def pytest_configure(config):
    """Under ``-n N``: the workers, started after this, run one torch thread each (as every
    process does while the book builds beside them) and learn where the book will be."""
    if _controls_workers(config) and not os.environ.get("COURSE_BOOK_HTML"):
        import tempfile

        from book_build import SHARED_ENV

        os.environ[SHARED_ENV] = tempfile.mkdtemp(prefix="course-book-shared-")
        os.environ.update({name: "1" for name in ONE_THREAD})


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids):
    """The controller starts the book's build as soon as a worker has collected a book test."""
    global _BOOK_BUILD
    from book_build import SHARED_ENV

    if _BOOK_BUILD is not None or not os.environ.get(SHARED_ENV) or not any("test_book" in i for i in ids):
        return
    import threading

    from book_build import BookBuild, watch_for_workers

    _BOOK_BUILD = BookBuild()
    threading.Thread(target=watch_for_workers, args=(_BOOK_BUILD, Path(os.environ[SHARED_ENV])),
                     daemon=True).start()


@pytest.hookimpl(trylast=True)      # after -m / -k have deselected what will not run
def pytest_collection_modifyitems(session, config, items):
    """The book's tests last; its build (minutes, one core) starts now and runs beside the rest.

    The build's kernels run one torch thread each (tests/book_build.py), and so does this
    process while they run: a second thread per process only made both sides wait on each
    other's barriers on 2 cores."""
    items.sort(key=lambda item: item.path.name.startswith("test_book"))   # stable
    if any("book_build" in item.fixturenames for item in items) and not config.option.collectonly:
        if _start_book_build().background:
            import torch

            torch.set_num_threads(1)
            # ... and so does every process the tests start (graders, kernels, evaluations).
            os.environ.update({name: "1" for name in ONE_THREAD})


def pytest_sessionfinish(session, exitstatus):
    if _BOOK_BUILD is not None:
        _BOOK_BUILD.close()
    from book_build import SHARED_ENV

    if _controls_workers(session.config) and os.environ.get(SHARED_ENV):
        import shutil

        shutil.rmtree(os.environ[SHARED_ENV], ignore_errors=True)
