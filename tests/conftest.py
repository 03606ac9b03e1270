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
    from book_build import BookBuild, BuiltBook

    # COURSE_BOOK_HTML: test a book built before (e.g. by `make book`) instead of building one
    _BOOK_BUILD = BuiltBook(os.environ["COURSE_BOOK_HTML"]) if os.environ.get("COURSE_BOOK_HTML") else BookBuild()
    return _BOOK_BUILD


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
            os.environ.update({name: "1" for name in ("COURSE_KERNEL_THREADS", "OMP_NUM_THREADS",
                                                      "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")})


def pytest_sessionfinish(session, exitstatus):
    if _BOOK_BUILD is not None:
        _BOOK_BUILD.close()
