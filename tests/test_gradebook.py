"""The gradebook as the grader opens it: nbgrader's own connections, with the grader's journal."""

from __future__ import annotations

from nbgrader.api import Gradebook
from sqlalchemy import text

import autograder.coursetree  # noqa: F401 - sets the journal of every gradebook connection


def test_every_gradebook_connection_writes_ahead_and_syncs_the_disk_at_checkpoints(tmp_path):
    with Gradebook(f"sqlite:///{tmp_path / 'gradebook.db'}") as gb:
        gb.add_student("s1")
        journal = gb.db.execute(text("PRAGMA journal_mode")).scalar()
        sync = gb.db.execute(text("PRAGMA synchronous")).scalar()
    assert (journal, sync) == ("wal", 1)           # 1: NORMAL, sync at checkpoints (2, FULL: at each commit)
    with Gradebook(f"sqlite:///{tmp_path / 'gradebook.db'}") as gb:     # a second process reads what was kept
        assert [s.id for s in gb.students] == ["s1"]


def test_a_gradebook_opened_read_only_is_read_as_it_is(tmp_path):
    import sqlite3

    with Gradebook(f"sqlite:///{tmp_path / 'gradebook.db'}") as gb:
        gb.add_student("s1")
    with sqlite3.connect(tmp_path / "gradebook.db") as db:     # as nbgrader alone leaves it
        db.execute("PRAGMA journal_mode=DELETE")
    with Gradebook(f"sqlite:///file:{tmp_path / 'gradebook.db'}?mode=ro&uri=true") as gb:
        assert [s.id for s in gb.students] == ["s1"]
