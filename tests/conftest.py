import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

# The test suite grades the capstone in its smallest profile, on the CPU, whatever the shell says.
os.environ["COURSE_PROFILE"] = "smoke"
os.environ["COURSE_DEVICE"] = "cpu"


@pytest.hookimpl(trylast=True)      # after -m / -k have deselected what will not run
def pytest_collection_modifyitems(session, config, items):
    """The book's tests go last and its build starts now, beside the other tests."""
    book = [item for item in items if item.path.name == "test_book.py"]
    if book:
        from book_build import BookBuild

        items[:] = [item for item in items if item.path.name != "test_book.py"] + book
        config.book_build = BookBuild()


def pytest_unconfigure(config):
    build = getattr(config, "book_build", None)
    if build is not None:
        build.close()
