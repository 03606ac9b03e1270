"""The exercise notebooks in Chinese (issue 30, item 3): exercises-zh/ is the English release
with its Markdown through locales/zh_CN/LC_MESSAGES/notebooks/, code and nbgrader metadata
as released, and a Chinese notebook grades exactly as the English one."""

from __future__ import annotations

import copy
import json
import re
import shutil

import nbformat
import pytest
from nbgrader.api import Gradebook

from autograder.book_pages import write_linked_pages
from autograder.submission import inspect_submission
from autograder.translation import (LANGUAGES, catalog_path, catalog_translations, markdown_messages,
                                    translate_markdown, translated_releases, write_translated_releases)
from grading_tools import rows_of, run_grade
from notebook_tools import ROOT, grade_id, solution_answers, write_notebook

LANGUAGE = "zh_CN"
ZH = ROOT / LANGUAGES[LANGUAGE]
ASSIGNMENT = "ch01_embeddings"          # its catalog is translated whole
ASSIGNMENTS = sorted(p.name for p in (ROOT / "solutions").iterdir() if p.is_dir() and any(p.glob("*.ipynb")))


def _notebook(folder, assignment: str = ASSIGNMENT):
    return nbformat.read(folder / assignment / f"{assignment}.ipynb", as_version=4)


def _tree(folder):
    return {p.relative_to(folder).as_posix(): p for p in sorted(folder.rglob("*")) if p.is_file()}


# ------------------------------------------------------------------ the release

def test_chinese_release_is_what_make_exercises_writes(tmp_path):
    """exercises-zh/ is the committed English release through the committed catalogs (no hand
    edits, no stale translation: run `make exercises` after translating)."""
    fresh = tmp_path / "exercises-zh"
    write_translated_releases(ROOT, ROOT / "exercises", LANGUAGE, fresh, ASSIGNMENTS)
    write_linked_pages(ROOT / "solutions", fresh)
    committed, generated = _tree(ZH), _tree(fresh)
    assert sorted(committed) == sorted(generated), "run `make exercises` and commit exercises-zh/"
    for name, path in generated.items():
        assert json.loads(committed[name].read_text()) == json.loads(path.read_text()), \
            f"exercises-zh/{name} differs from the generated version: run `make exercises`"


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_chinese_release_has_the_english_code_and_metadata(assignment):
    english, chinese = _notebook(ROOT / "exercises", assignment), _notebook(ZH, assignment)
    assert len(english.cells) == len(chinese.cells)
    for en, zh in zip(english.cells, chinese.cells):
        assert (en.cell_type, en.get("id"), en.metadata) == (zh.cell_type, zh.get("id"), zh.metadata)
        if en.cell_type == "code":
            assert en == zh, f"code cell {grade_id(en)} differs from the English release"
    metadata = copy.deepcopy(chinese.metadata)
    assert metadata.pop("course") == {"language": LANGUAGE}
    assert metadata == english.metadata


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_release_is_chinese(assignment):
    """Every message of a chapter's Markdown is replaced by its translation (the catalogs are
    complete: tests/test_locales.py), and the self-check command names the Chinese notebook."""
    translations = catalog_translations(catalog_path(ROOT, assignment, LANGUAGE))
    assert translations, f"{assignment}: no translated message"
    english, chinese = _notebook(ROOT / "exercises", assignment), _notebook(ZH, assignment)
    for en, zh in zip(english.cells, chinese.cells):
        if en.cell_type != "markdown":
            continue
        for message in markdown_messages(en.source):
            first_line = translations[message].split("\n")[0].replace("NB=exercises/", f"NB={ZH.name}/")
            assert first_line in zh.source, (grade_id(en), message)
            prose = re.sub(r"`[^`]*`|\]\([^)]*\)", " ", zh.source)      # without code and link targets
            assert message not in prose or translations[message] == message, (grade_id(en), message)
    assert f"make check NB={ZH.name}/{assignment}/{assignment}.ipynb" in chinese.cells[0].source


MARKDOWN = """\
## Exercise 9: a title

> **Core** · **Difficulty** ●○○○

A paragraph that is wrapped
over two lines.

- `f(x)` returns a value,
  never a copy.
  1. a nested rule;

  `f(1) == 2`.

$$
y = f(x),
$$

    a * b   bytes,

| exercise | `code` | points |
| --- | --- | --- |
| 1 | first, with `x` | 2 |

<details><summary>Hint 1</summary>

One more line.
</details>"""

TRANSLATED = """\
## 练习 9：标题

> **核心** · **难度** ●○○○

一个段落，
分两行写。

- `f(x)` 返回一个值，
  而不是副本。
  1. 一条嵌套的规则；

  `f(1) == 2`.

$$
y = f(x),
$$

    a * b   bytes,

| 练习 | `code` | 分值 |
| --- | --- | --- |
| 1 | 第一个，含 `x` | 2 |

<details><summary>提示 1</summary>

还有一行。
</details>"""


def test_markdown_is_cut_into_messages_and_put_back_with_its_layout():
    messages = ["Exercise 9: a title", "**Core** · **Difficulty** ●○○○",
                "A paragraph that is wrapped over two lines.", "`f(x)` returns a value, never a copy.",
                "a nested rule;", "exercise", "points", "first, with `x`", "Hint 1", "One more line."]
    chinese = ["练习 9：标题", "**核心** · **难度** ●○○○", "一个段落，\n分两行写。",
               "`f(x)` 返回一个值，\n而不是副本。", "一条嵌套的规则；", "练习", "分值",
               "第一个，含 `x`", "提示 1", "还有一行。"]
    assert markdown_messages(MARKDOWN) == messages
    assert translate_markdown(MARKDOWN, dict(zip(messages, chinese))) == TRANSLATED
    assert translate_markdown(MARKDOWN, {}) == MARKDOWN


def test_untranslated_markdown_is_kept_as_it_is():
    for assignment in ASSIGNMENTS:
        for cell in _notebook(ROOT / "solutions", assignment).cells:
            if cell.cell_type == "markdown":
                assert translate_markdown(cell.source, {}) == cell.source


# ------------------------------------------------------------------ grading

def _with(nb, **sources):
    """A copy of ``nb`` whose cells named in ``sources`` (by grade_id) hold the given source."""
    nb = copy.deepcopy(nb)
    for cell in nb.cells:
        if grade_id(cell) in sources:
            cell.source = sources[grade_id(cell)]
    return nb


def test_a_chinese_submission_is_not_an_edited_one_and_edits_are_still_found(tmp_path):
    release = _notebook(ROOT / "exercises")
    translated = translated_releases(release, ROOT, ASSIGNMENT)
    assert len(translated) == 1
    stub = _notebook(ZH)

    def edited(nb, *alternatives):
        return inspect_submission(write_notebook(nb, tmp_path / "nb.ipynb"), release, alternatives).edited_cells

    assert edited(stub, *translated) == []
    assert "intro" in edited(stub)                      # the English release alone: Chinese prose is an edit
    assert edited(_with(stub, ex1_text="## Exercise 1\n\nAnything."), *translated) == ["ex1_text"]
    tampered = next(c.source for c in stub.cells if grade_id(c) == "ex1_visible") + "\nprint('edited')"
    assert edited(_with(stub, ex1_visible=tampered), *translated) == ["ex1_visible"]
    english_intro = next(c.source for c in release.cells if grade_id(c) == "intro")
    assert edited(_with(stub, intro=english_intro), *translated) == []


def _scores(out, student: str) -> dict[str, tuple[float, float]]:
    """grade_id -> (score, max score) of each graded cell of ``student``'s chapter 1."""
    with Gradebook(f"sqlite:///{out / 'nbgrader' / 'gradebook.db'}") as gb:
        graded = gb.find_submission_notebook(ASSIGNMENT, ASSIGNMENT, student).grades
        return {g.name: (float(g.score), float(g.max_score)) for g in graded}


def _message_catalog(name: str) -> dict[str, str]:
    path = ROOT / "locales" / LANGUAGE / "LC_MESSAGES" / "messages" / f"{name}.po"
    return catalog_translations(path)


def _feedback(out, student: str) -> str:
    import html

    pages = sorted((out / "feedback" / student / ASSIGNMENT).glob("*.html"))
    assert pages, f"no feedback for {student}"
    return html.unescape(pages[0].read_text(encoding="utf-8"))


@pytest.mark.slow
def test_chinese_notebook_grades_as_the_english_one(tmp_path):
    """Through the real grader, in one run: the Chinese release answered with the solution's
    answers gets full marks and the untouched Chinese stub zero, each with no note; their
    feedback pages read in Chinese, and a wrong answer's hint comes in Chinese."""
    from mistakes.ch01_embeddings import MISTAKES

    answers = solution_answers(ASSIGNMENT)
    root = tmp_path / "submissions"
    write_notebook(_with(_notebook(ZH), **answers), root / "zh_solution" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb")
    shutil.copytree(ZH / ASSIGNMENT, root / "zh_stub" / ASSIGNMENT)
    mistake = next(m for m in MISTAKES if m.name == "embedding_std_one")
    write_notebook(_with(_notebook(ZH), **mistake.apply(answers)), root / "zh_wrong" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb")
    out = tmp_path / "out"
    run_grade(root, out, workers=2, timeout=20)
    _feedback_reads_in_chinese(out, mistake)
    rows = {row["student"]: row for row in rows_of(out)}
    solved, stub = rows["zh_solution"], rows["zh_stub"]
    assert 0 < float(rows["zh_wrong"]["score"]) < float(solved["score"])
    assert float(solved["score"]) == float(solved["max_score"]) > 0 and solved["notes"] == "", solved
    assert float(stub["score"]) == 0 and stub["notes"] == "" and stub["max_score"] == solved["max_score"], stub
    solved_cells, stub_cells = _scores(out, "zh_solution"), _scores(out, "zh_stub")
    assert solved_cells.keys() == stub_cells.keys() and len(solved_cells) == 16
    assert all(score == top > 0 for score, top in solved_cells.values()), solved_cells
    assert all(score == 0 for score, _ in stub_cells.values()), stub_cells


def _feedback_reads_in_chinese(out, mistake) -> None:
    """The pages of a Chinese submission: the page's own words, the notebook's prose and the
    checks' hints in Chinese, from the catalogs."""
    notebook_zh = catalog_translations(catalog_path(ROOT, ASSIGNMENT, LANGUAGE))
    feedback_zh, checks_zh = _message_catalog("feedback"), _message_catalog("ch01")
    for student in ("zh_solution", "zh_stub", "zh_wrong"):
        page = _feedback(out, student)
        assert '<html lang="zh-CN">' in page and feedback_zh["Score:"] in page, student
        assert notebook_zh["Chapter 1 exercises: tokens and embeddings"] in page, student
        assert feedback_zh["(hidden tests: their code is not shown in feedback)"] in page, student
    hints = [zh for en, zh in checks_zh.items() if mistake.hint in en]
    assert hints, f"no translated message of ch01 holds {mistake.hint!r}"
    wrong = _feedback(out, "zh_wrong")
    assert any(zh in wrong for zh in hints) and mistake.hint not in wrong
    assert _message_catalog("common")["Likely mistake: "] in wrong
