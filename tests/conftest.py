import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

# The test suite grades the capstone in its smallest profile, on the CPU, whatever the shell says.
os.environ["COURSE_PROFILE"] = "smoke"
os.environ["COURSE_DEVICE"] = "cpu"


# Files whose tests run in this process on one core; the book's build (one kernel at a time,
# another core) runs beside them. The grading tests, which keep both cores busy, come after,
# and the book's own tests last, when the build is done.
ONE_CORE = ("test_checks_inprocess.py", "test_hidden_inputs.py", "test_tamper.py", "test_messages.py",
            "test_capstone_data.py", "test_data.py", "test_project_files.py", "test_settings.py",
            "test_exercises_generated.py")


@pytest.hookimpl(trylast=True)      # after -m / -k have deselected what will not run
def pytest_collection_modifyitems(session, config, items):
    def group(item) -> int:
        return 0 if item.path.name in ONE_CORE else 2 if item.path.name == "test_book.py" else 1

    items.sort(key=group)           # stable: the order within a group is kept
    if any(group(item) == 2 for item in items):
        from book_build import BookBuild

        config.book_build = BookBuild()


def pytest_unconfigure(config):
    build = getattr(config, "book_build", None)
    if build is not None:
        build.close()
