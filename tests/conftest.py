import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

# The test suite grades the capstone in its smallest profile, on the CPU, whatever the shell says.
os.environ["COURSE_PROFILE"] = "smoke"
os.environ["COURSE_DEVICE"] = "cpu"


@pytest.fixture(scope="session")
def book_build():
    """The book, built once, when its tests (which run last) first need it."""
    from book_build import BookBuild, BuiltBook

    # COURSE_BOOK_HTML: test a book built before (e.g. by `make book`) instead of building one
    build = BuiltBook(os.environ["COURSE_BOOK_HTML"]) if os.environ.get("COURSE_BOOK_HTML") else BookBuild()
    yield build
    build.close()


@pytest.hookimpl(trylast=True)      # after -m / -k have deselected what will not run
def pytest_collection_modifyitems(session, config, items):
    """The book's tests last: they wait minutes for its build."""
    items.sort(key=lambda item: item.path.name.startswith("test_book"))   # stable
