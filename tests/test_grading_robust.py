"""The grader loses nothing and hides nothing: odd folders each get a row with a reason, odd
names grade like any other, duplicated cells are repaired, a second run on the same output is
refused at once, and a killed run resumes without regrading what it finished.

Also unit tests (fast) of the pieces: nbgrader's real error, internal ids, the lock, the CSV."""

from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import nbformat
import pytest

from grading_tools import grade_command, rows_of, start_grade
from notebook_tools import ROOT, grade_id, solution_answers, student_notebook, write_notebook

A = "ch01_embeddings"
NB = f"{A}.ipynb"
FULL = 22.0        # ch01's max score; checked against max_score in the rows


def command(submissions: Path, out: Path) -> list[str]:
    """One worker: these tests kill the grader after its first row, so the order matters."""
    return grade_command(submissions, out, workers=1)


def start(submissions: Path, out: Path) -> subprocess.Popen:
    return start_grade(submissions, out, workers=1)


def finish(proc: subprocess.Popen, timeout: float = 900) -> str:
    output, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, output
    return output




def by_key(rows: list[dict]) -> dict[tuple[str, str], dict]:
    return {(r["student"], r["assignment"]): r for r in rows}


def wait_for(predicate, timeout: float, what: str, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the grader ended before {what}: {proc.stdout.read()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def answers() -> dict[str, str]:
    return solution_answers(A)


# ============================================================================ unit tests (fast)

def test_real_nbgrader_error_not_its_summary():
    from autograder.grade import nbgrader_error

    result = {"success": False,
              "log": "[WARNING] Cell with id 'ex3_answer' exists multiple times!\n"
                     "[ERROR] There was an error processing assignment: /x/submitted/s/ch01\n"
                     "[ERROR] Traceback (most recent call last):\n      File \"x.py\", line 1, in f\n"
                     "    KeyError: 'grade_id'\n    \n"
                     "[ERROR] There was an error processing assignment 'ch01' for student 's'\n"
                     "[ERROR] Please see the the above traceback for details on the specific errors on the above failures.",
              "error": "Traceback (most recent call last):\n  File \"base.py\", line 468\n"
                       "nbgrader.converters.base.NbGraderException: Please see the the above traceback for details on "
                       "the specific errors on the above failures.\n"}
    assert nbgrader_error(result) == "KeyError: 'grade_id'"
    unresponsive = {"success": False, "log": "[ERROR] While processing assignment x, the kernel became unresponsive\n"
                                             "[ERROR] Please see the the above traceback for details."}
    assert nbgrader_error(unresponsive).startswith("While processing assignment x, the kernel became unresponsive")


def test_internal_ids_are_safe_distinct_and_stable():
    from autograder.grade import internal_id

    assert internal_id("alice") == "alice" and internal_id("bob_2.x-y") == "bob_2.x-y"
    odd = ["n2 glob[1]", "n2 glob[2]", "Zoë *?", "?", "*", "a b", "a_b+0123456789", "é" * 80]
    ids = [internal_id(n) for n in odd]
    assert len(set(ids)) == len(ids)
    assert all(not set(i) & set("[]*? /\\") and i.isascii() for i in ids), ids
    assert internal_id("n2 glob[1]") == ids[0]


def test_second_lock_on_the_same_out_fails_at_once(tmp_path):
    from autograder.runlog import OutputLocked, RunLog

    first, second = RunLog(tmp_path), RunLog(tmp_path)
    first.acquire()
    try:
        with pytest.raises(OutputLocked, match=f"pid {os.getpid()}"):
            second.acquire()
        assert issubclass(OutputLocked, ValueError)           # the CLI turns it into "error: ..." and exit 2
    finally:
        first.release()
    second.acquire()                                          # free again once released
    second.release()


def test_rows_are_on_disk_as_they_finish_and_sorted_at_the_end(tmp_path):
    from autograder.runlog import DONE_FILE, RunLog

    log = RunLog(tmp_path)
    log.acquire()
    identity = {"submissions": "x", "solutions": "s"}
    assert log.previous(identity) is None
    log.start(identity, None)
    row = {"student": "zed", "assignment": A, "score": "1", "max_score": "2", "status": "graded", "notes": ""}
    log.append(row, "d-zed")
    assert rows_of(tmp_path) == [row]                         # readable before the run ends
    log.release()
    log.acquire()
    with open(tmp_path / "grades.csv", "a", encoding="utf-8") as f:
        f.write("amy,ch01_embeddings,3")                    # a row cut short by a kill
    previous = log.previous(identity)
    assert previous.rows == {("zed", A): row} and not previous.finished
    assert previous.unchanged({("zed", A): "d-zed", ("amy", A): "d-amy"}) == {("zed", A): row}
    assert previous.unchanged({("zed", A): "changed"}) == {}          # its notebook changed: graded again
    assert log.previous({**identity, "solutions": "t"}) is None and "solutions" in log.fresh_reason
    assert log.previous({**identity, "submissions": "y"}) is not None   # each row has its own digest
    log.start(identity, {("zed", A): row}, previous.digests)
    log.append({**row, "student": "amy"}, "d-amy")
    log.finish(rows_of(tmp_path))
    assert [r["student"] for r in rows_of(tmp_path)] == ["amy", "zed"]
    previous = log.previous(identity)
    assert (tmp_path / DONE_FILE).exists() and previous.finished
    assert set(previous.unchanged({("zed", A): "d-zed", ("amy", A): "d-amy"})) == {("zed", A), ("amy", A)}
    log.release()


def test_undecodable_folder_names_do_not_stop_the_run(tmp_path):
    from autograder.grade import internal_id
    from autograder.runlog import RunLog

    name = b"caf\xe9".decode("utf-8", "surrogateescape")     # a Latin-1 name on a UTF-8 system
    assert internal_id(name).isascii()
    log = RunLog(tmp_path)
    log.acquire()
    log.start({}, None)
    row = {"student": name, "assignment": A, "score": "0", "max_score": "22", "status": "broken", "notes": name}
    log.append(row)
    log.finish([row])
    log.release()
    assert rows_of(tmp_path)[0]["student"] == "caf\\udce9"


def test_undecodable_folder_names_keep_their_rows(tmp_path):
    """A folder name with non-UTF-8 bytes finds its row (and digest) again on the next run."""
    from autograder.grade import Found
    from autograder.runlog import RunLog

    name = b"caf\xe9".decode("utf-8", "surrogateescape")
    key = Found(name, A).key
    log = RunLog(tmp_path)
    log.acquire()
    log.start({}, None)
    row = {"student": name, "assignment": A, "score": "0", "max_score": "22", "status": "broken", "notes": ""}
    log.append(row, "d-cafe")
    log.release()
    log.acquire()
    kept = log.previous({}).unchanged({key: "d-cafe"})
    log.release()
    assert list(kept) == [key] and kept[key]["student"] == "caf\\udce9"


def test_regrading_a_non_utf8_student_replaces_its_row(tmp_path):
    from autograder.grade import Found, Grader
    from autograder.runlog import Previous, RunLog
    from autograder.settings import GradingSettings

    name = b"caf\xe9".decode("utf-8", "surrogateescape")
    stored = {"student": "caf\\udce9", "assignment": A, "score": "0", "max_score": "22", "status": "broken",
              "notes": ""}
    other = {**stored, "student": "bob"}
    previous = Previous({("caf\\udce9", A): stored, ("bob", A): other}, {}, True)
    grader = Grader(ROOT / "solutions", tmp_path / "out", GradingSettings(), student=name)
    kept, pending = grader._plan([Found(name, A), Found("bob", A)], {}, previous, RunLog(tmp_path / "out"))
    assert list(kept) == [("bob", A)] and [f.student for f in pending] == [name]


def test_printed_names_are_escaped():
    from autograder.grade import _printable

    forged = "x\nmallory    ch01_embeddings    22    22  graded\x1b[2K\u202e" + "caf\udce9"
    assert _printable(forged) == "x\\nmallory    ch01_embeddings    22    22  graded\\x1b[2K\\u202ecaf\\udce9"
    assert _printable("Zoë *? n2 glob[1]") == "Zoë *? n2 glob[1]"


def test_duplicated_cells_are_repaired(tmp_path):
    from autograder.repairs import repair

    nb = student_notebook(A, answers())
    at = {grade_id(c): i for i, c in enumerate(nb.cells)}
    early = copy.deepcopy(nb.cells[at["ex3_answer"]])
    early.source = "def encode(text, merges, special_tokens=None):\n    return []"
    edited_test = copy.deepcopy(nb.cells[at["ex2_visible"]])
    edited_test.source = "pass  # my own test"
    early.id, edited_test.id = "copy0001", "copy0002"      # Jupyter gives a pasted cell a new id
    nb.cells.insert(at["ex3_answer"], early)
    nb.cells.insert(at["ex2_visible"] + 1, edited_test)                # a copy after the released one
    unknown = nbformat.v4.new_code_cell("y = 2", metadata={"nbgrader": {"grade_id": "ex99", "grade": True, "points": 50}})
    nb.cells.append(unknown)
    for cell in nb.cells:
        if grade_id(cell) == "ex1_visible":
            cell.metadata.nbgrader["points"] = 100
    nb.cells.append(nbformat.v4.new_code_cell("z = 3", metadata={"nbgrader": "hand-edited"}))
    fixed, notes = repair(nb, nbformat.read(ROOT / "exercises" / A / NB, as_version=4))
    assert notes == [
        "cells with nbgrader ids the assignment does not have, run as ordinary cells: (malformed metadata), ex99",
        "duplicated cell ex2_visible: kept the released copy and removed the other copy",
        "duplicated cell ex3_answer: kept the last copy as the answer (the earlier copy runs as an ordinary cell)",
        "nbgrader metadata edited (restored from the original): ex1_visible",
    ]
    ids = [grade_id(c) for c in fixed.cells if grade_id(c)]
    assert len(ids) == len(set(ids)) and "ex99" not in ids
    sources = [c.source for c in fixed.cells]
    assert early.source in sources and "pass  # my own test" not in sources
    answer = next(c for c in fixed.cells if grade_id(c) == "ex3_answer")
    assert answer.source == answers()["ex3_answer"]
    assert len({c.id for c in fixed.cells}) == len(fixed.cells)


def test_folders_are_classified(tmp_path):
    from autograder.grade import find_submissions

    assignments = ["ch01_embeddings", "ch02_positions"]
    for folder in ["ok/ch01_embeddings", "typo/Ch01_Embedings", ".hidden/ch01_embeddings", "empty",
                   "ok/.ipynb_checkpoints", "__MACOSX", "loose"]:
        (tmp_path / folder).mkdir(parents=True)
    (tmp_path / "loose" / "ch02_positions.ipynb").write_text("{}")
    (tmp_path / "stray.txt").write_text("")
    (tmp_path / "linked").symlink_to(tmp_path / "ok")
    found = {(f.student, f.assignment): f for f in find_submissions(tmp_path, assignments)}
    assert set(found) == {("ok", A), ("typo", "Ch01_Embedings"), (".hidden", ""), ("empty", ""),
                          ("loose", "ch02_positions"), ("stray.txt", ""), ("linked", "")}
    assert found[("ok", A)].status == "" and found[("linked", "")].status == "refused"
    assert "did you mean ch01_embeddings?" in found[("typo", "Ch01_Embedings")].reason
    assert all(f.status == "skipped" for k, f in found.items() if k[0] not in ("ok", "linked"))
    assert "not in its assignment folder" in found[("loose", "ch02_positions")].reason


# ============================================================================ end to end (slow)

# The plain import of the reference code on a line IPython runs as code (the ? is inside a
# string); the scan used to take the line for a help request and skip it.
HIDDEN_BY_HELP = 'x = """?\n"""; from course.checks.ch01 import _merge_oracle; y = """?\n"""\n#"""'
FORGED = "x\nmallory                  ch01_embeddings              22    22  graded\x1b[2K.ipynb"
# Hangs up on the grader (the probe's socket) and blocks: the kernel is stopped, later cells not run.
HANG_UP = """import gc, socket, time


def _hang_up_and_block():
    for obj in gc.get_objects():
        if isinstance(obj, socket.socket) and obj.family == socket.AF_UNIX:
            try:
                if obj.getpeername():
                    obj.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
    time.sleep(10**6)


"""


def _odd_submissions(root: Path) -> None:
    ans = answers()          # a plain right submission is the solo run's (odd_batch)
    dup = student_notebook(A, ans)                          # an early wrong attempt, pasted above the answer
    at = next(i for i, c in enumerate(dup.cells) if grade_id(c) == "ex3_answer")
    early = copy.deepcopy(dup.cells[at])
    early.source = "def encode(text, merges, special_tokens=None):\n    return []"
    early.id = "copy0001"
    dup.cells.insert(at, early)
    write_notebook(dup, root / "n2 glob[1]" / A / NB)

    odd = student_notebook(A, {**ans, "ex4_answer": "torch.allclose = torch.allclose\n" + ans["ex4_answer"]})
    at = next(i for i, c in enumerate(odd.cells) if grade_id(c) == "ex2_visible")
    pasted = copy.deepcopy(odd.cells[at])                   # a test cell pasted twice
    pasted.id = "copy0002"
    odd.cells.insert(at + 1, pasted)
    odd.cells.append(nbformat.v4.new_code_cell("import subprocess\n!ls"))
    odd.cells.append(nbformat.v4.new_code_cell(HIDDEN_BY_HELP))
    write_notebook(odd, root / "Zoë *?" / A / NB)

    (root / "forger" / A).mkdir(parents=True)             # its note names this file: a forged table row
    (root / "forger" / A / FORGED).write_text("{}", encoding="utf-8")
    hang = HANG_UP + ans["ex1_answer"].replace("    counts: dict", "    _hang_up_and_block()\n    counts: dict", 1)
    write_notebook(student_notebook(A, {**ans, "ex1_answer": hang}), root / "hangup" / A / NB)

    write_notebook(student_notebook(A, ans), root / "typo" / "ch01_embedings" / NB)
    write_notebook(student_notebook(A, ans), root / ".hidden" / A / NB)
    (root / "empty").mkdir()
    (root / "symlink_nb" / A).mkdir(parents=True)
    (root / "symlink_nb" / A / NB).symlink_to(ROOT / "solutions" / A / NB)
    (root / "symlink_dir").mkdir()
    (root / "symlink_dir" / A).symlink_to(ROOT / "solutions" / A)
    (root / "symlink_student").symlink_to(ROOT / "solutions")


@pytest.fixture(scope="module")
def odd_batch(tmp_path_factory):
    """One grading run over every odd case; meanwhile a second run on the same --out (refused)
    and a third on another --out (must not interfere)."""
    base = tmp_path_factory.mktemp("odd")
    root, out = base / "submissions", base / "out"
    _odd_submissions(root)
    solo, solo_out = base / "solo", base / "solo-out"
    write_notebook(student_notebook(A, answers()), solo / "only" / A / NB)

    main = start(root, out)
    other = start(solo, solo_out)
    wait_for(lambda: "pid" in _read(out / ".grading.lock"), 120, "the first run to take its lock", main)
    t0 = time.monotonic()
    second = subprocess.run(command(root, out), cwd=ROOT, capture_output=True, text=True, timeout=120)
    locked = (second.returncode, second.stderr, time.monotonic() - t0, main.poll())
    output = finish(main)
    other_output = finish(other)
    return {"rows": rows_of(out), "out": out, "output": output, "locked": locked,
            "other": (rows_of(solo_out), other_output)}


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


@pytest.mark.slow
def test_every_folder_gets_a_row_with_a_reason(odd_batch):
    rows = by_key(odd_batch["rows"])
    assert set(rows) == {("n2 glob[1]", A), ("Zoë *?", A), ("typo", "ch01_embedings"), (".hidden", ""),
                         ("empty", ""), ("symlink_nb", A), ("symlink_dir", A), ("symlink_student", ""),
                         ("forger", A), ("hangup", A)}
    assert [(r["student"], r["assignment"]) for r in odd_batch["rows"]] == sorted(rows)

    def check(key, status, score, *words):
        row = rows[key]
        assert (row["status"], float(row["score"])) == (status, score), row
        for word in words:
            assert word in row["notes"], (word, row)

    assert all(float(rows[(s, A)]["max_score"]) == FULL for s in ("n2 glob[1]", "Zoë *?"))
    check(("typo", "ch01_embedings"), "skipped", 0, "unknown assignment folder", "did you mean ch01_embeddings?")
    check((".hidden", ""), "skipped", 0, "hidden folder")
    check(("empty", ""), "skipped", 0, "no assignment folder")
    check(("symlink_nb", A), "refused", 0, "symbolic link", "not followed")
    check(("symlink_dir", A), "refused", 0, "symbolic link", "not followed")
    check(("symlink_student", ""), "refused", 0, "symbolic link")
    assert float(rows[("symlink_nb", A)]["max_score"]) == FULL
    feedback = odd_batch["out"] / "feedback"
    assert "did you mean" in (feedback / "typo" / "ch01_embedings" / "feedback.html").read_text(encoding="utf-8")
    assert "symbolic link" in (feedback / "symlink_nb" / A / "feedback.html").read_text(encoding="utf-8")


def held_for_review(out: Path, student: str) -> tuple[int, list[str]]:
    """(test cells held because the code can switch kernel-side rules off, other failures)."""
    ids = json.loads((out / "nbgrader" / "student_ids.json").read_text(encoding="utf-8"))
    sid = next(key for key, name in ids.items() if name == student)     # graded under a safe id
    nb = nbformat.read(out / "nbgrader" / "autograded" / sid / A / NB, as_version=4)
    held, other = 0, []
    for cell in nb.cells:
        errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
        if grade_id(cell) and errors:
            if all("can switch such rules off" in o.get("evalue", "") for o in errors):
                held += 1
            else:
                other.append(grade_id(cell))
    return held, other


@pytest.mark.slow
def test_odd_names_grade_like_any_other(odd_batch):
    rows = by_key(odd_batch["rows"])
    for student in ("n2 glob[1]", "Zoë *?"):
        pages = list((odd_batch["out"] / "feedback" / student / A).glob("*.html"))
        assert pages, f"no feedback under the real name {student!r}"
    assert float(rows[("n2 glob[1]", A)]["score"]) == FULL, rows[("n2 glob[1]", A)]
    # Zoë's answers are right, but a patch of torch puts the kernel's rules in doubt: only the
    # tests that rely on one are held (each says why); every other test scores.
    held, other = held_for_review(odd_batch["out"], "Zoë *?")
    assert held > 0 and other == [], (held, other)
    assert 0 < float(rows[("Zoë *?", A)]["score"]) < FULL
    ids = json.loads((odd_batch["out"] / "nbgrader" / "student_ids.json").read_text(encoding="utf-8"))
    assert sorted(ids.values()) == sorted(["n2 glob[1]", "Zoë *?", "symlink_nb", "forger", "hangup"])


@pytest.mark.slow
def test_duplicated_cells_are_graded_with_a_note(odd_batch):
    rows = by_key(odd_batch["rows"])
    assert "duplicated cell ex3_answer: kept the last copy" in rows[("n2 glob[1]", A)]["notes"]
    assert "see the above traceback" not in rows[("n2 glob[1]", A)]["notes"]
    assert "duplicated cell ex2_visible: kept the released copy" in rows[("Zoë *?", A)]["notes"]


@pytest.mark.slow
def test_review_notes_reach_csv_and_feedback(odd_batch):
    row = by_key(odd_batch["rows"])[("Zoë *?", A)]
    assert "review: ex4_answer line 1 patches torch.allclose" in row["notes"]
    assert "imports subprocess" in row["notes"] and "runs a shell command (!ls)" in row["notes"]
    page = next((odd_batch["out"] / "feedback" / "Zoë *?" / A).glob("*.html")).read_text(encoding="utf-8")
    assert "review: ex4_answer line 1 patches torch.allclose" in page
    assert "(added) line 2 imports course.checks.ch01._merge_oracle" in row["notes"]


@pytest.mark.slow
def test_a_name_with_control_characters_cannot_forge_a_printed_row(odd_batch):
    row = by_key(odd_batch["rows"])[("forger", A)]
    assert row["status"] == "broken" and FORGED in row["notes"]           # the CSV keeps the real name
    lines = odd_batch["output"].splitlines()
    assert not any(line.startswith("mallory") for line in lines), odd_batch["output"]
    assert "x\\nmallory" in odd_batch["output"] and "\x1b" not in odd_batch["output"]


@pytest.mark.slow
def test_a_kernel_that_hangs_up_on_the_grader_gets_a_note(odd_batch):
    row = by_key(odd_batch["rows"])[("hangup", A)]
    assert (row["status"], float(row["score"])) == ("graded", 0.0), row
    codes = [grade_id(c) for c in student_notebook(A, answers()).cells if c.cell_type == "code"]
    later = len(codes) - codes.index("ex1_visible") - 1
    assert f"{A}: {later} cell(s) after ex1_visible not run because" in row["notes"], row


@pytest.mark.slow
def test_second_run_on_the_same_out_is_refused_at_once(odd_batch):
    returncode, stderr, seconds, first_still_running = odd_batch["locked"]
    assert returncode == 2, stderr
    assert "error: " in stderr and "in use by another grade run" in stderr, stderr
    assert first_still_running is None and seconds < 60


@pytest.mark.slow
def test_runs_on_different_outs_do_not_interfere(odd_batch):
    rows, output = odd_batch["other"]
    assert [(r["student"], r["status"], float(r["score"]), r["notes"]) for r in rows] == [("only", "graded", FULL, "")]


@pytest.fixture(scope="module")
def killed_run(tmp_path_factory):
    """Four submissions; the grader is SIGKILLed once the first row is in grades.csv, then rerun.
    The last one's folder name is not UTF-8 (Latin-1 bytes): it must keep its row too."""
    base = tmp_path_factory.mktemp("killed")
    root, out = base / "submissions", base / "out"
    for student in ("a", "b"):
        write_notebook(student_notebook(A, answers()), root / student / A / NB)
    for student in (b"c", b"caf\xe9"):
        folder = os.fsencode(root) + b"/" + student + b"/" + A.encode()
        os.makedirs(folder)
        with open(folder + b"/" + NB.encode(), "w", encoding="utf-8") as f:
            f.write("{ not json")
    proc = start(root, out)
    # the row and its digest (written just after it): a kill between the two loses the row's digest
    wait_for(lambda: len(_csv_lines(out)) >= 2 and _read(out / ".grading-rows.jsonl").strip(), 600,
             "the first row", proc)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    after_kill = rows_of(out)
    first = out / "nbgrader" / "autograded" / "a" / A / NB
    mtime = first.stat().st_mtime_ns
    output = finish(start(root, out))
    return {"root": root, "out": out, "after_kill": after_kill, "first_mtime": mtime, "output": output}


def _csv_lines(out: Path) -> list[str]:
    return [ln for ln in _read(out / "grades.csv").splitlines() if ln.strip()]


@pytest.mark.slow
def test_killed_run_keeps_its_rows_and_resumes(killed_run):
    out = killed_run["out"]
    assert [r["student"] for r in killed_run["after_kill"]] == ["a"]          # on disk before the kill
    assert float(killed_run["after_kill"][0]["score"]) == FULL
    assert "resuming the unfinished run" in killed_run["output"] and "1 row(s) kept, 3 to grade" in killed_run["output"]
    rows = rows_of(out)
    assert [(r["student"], r["status"]) for r in rows] == [("a", "graded"), ("b", "graded"), ("c", "broken"),
                                                           ("caf\\udce9", "broken")]
    assert float(rows[1]["score"]) == FULL
    assert (out / "nbgrader" / "autograded" / "a" / A / NB).stat().st_mtime_ns == killed_run["first_mtime"]
    assert (out / ".grading-done.json").exists()


@pytest.mark.slow
def test_resume_regrades_only_the_missing_row(killed_run):
    out = killed_run["out"]
    (out / ".grading-done.json").unlink()                                      # as if killed before finishing
    lines = (out / "grades.csv").read_text(encoding="utf-8").splitlines(True)
    (out / "grades.csv").write_text("".join(ln for ln in lines if not ln.startswith("c,")), encoding="utf-8")
    autograded = {s: (out / "nbgrader" / "autograded" / s / A / NB).stat().st_mtime_ns for s in ("a", "b")}
    page = out / "feedback" / "c" / A / "feedback.html"
    before = page.stat().st_mtime_ns
    time.sleep(0.05)
    output = finish(start(killed_run["root"], out))
    assert "3 row(s) kept, 1 to grade" in output          # the non-UTF-8 name's row is kept
    assert {s: (out / "nbgrader" / "autograded" / s / A / NB).stat().st_mtime_ns for s in ("a", "b")} == autograded
    assert page.stat().st_mtime_ns > before
    rows = rows_of(out)
    assert [(r["student"], r["status"]) for r in rows] == [("a", "graded"), ("b", "graded"), ("c", "broken"),
                                                           ("caf\\udce9", "broken")]
    assert "not valid JSON" in rows[2]["notes"]


@pytest.mark.slow
def test_a_kernel_is_started_ahead_only_for_a_notebook_that_will_come(tmp_path, monkeypatch):
    """Each notebook's kernel starts while the one before it is graded; after the last, none
    does (a spare started for no notebook cost a core seconds of start-up in every run)."""
    from autograder import executor
    from autograder.grade import Grader
    from autograder.settings import GradingSettings

    for student in ("ann", "bob"):
        write_notebook(student_notebook(A, {}), tmp_path / "subs" / student / A / NB)
    spares_after = []
    grade_submission = Grader.grade_submission

    def recorded(self, found, sid=None):
        result = grade_submission(self, found, sid)
        spares_after.append(len(executor._SPARE))
        return result

    monkeypatch.setattr(Grader, "grade_submission", recorded)
    rows = Grader(ROOT / "solutions", tmp_path / "out", GradingSettings.from_env(profile="smoke")).grade_all(
        tmp_path / "subs", show_progress=False)
    assert [(r.student, r.score, r.status) for r in rows] == [("ann", 0, "graded"), ("bob", 0, "graded")]
    assert spares_after == [1, 0]
