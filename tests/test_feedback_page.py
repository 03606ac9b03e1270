"""The feedback page a student reads after grading (autograder/feedback.py), opened from disk in
headless Chromium with every outside request refused.

The page is written from chapter 1's released notebook, answered with one wrong exercise whose
test outputs are what the real check raised in this process, and with a submission's scripts in
every place a notebook can hold them (HTML, image and JavaScript outputs, a Markdown cell). The
grader's own route, through nbgrader and the sandbox, is checked by tests/test_adversarial.py.
"""

from __future__ import annotations

import html
import re
import shutil
import zipfile
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_markdown_cell, new_output

from autograder import contract, feedback, safe_html
from autograder.coursetree import write_config_file
from autograder.preprocessors import HideHiddenTests
from feedback_browser import Visit, chromium_or_skip, live_markup, visit_pages
from notebook_tools import ROOT, grade_id, solution_answers, student_notebook

ASSIGNMENT = "ch01_embeddings"
WRONG = ("counts[pair] = counts.get(pair, 0) + 1", "counts[pair] = 1")
PUSH = "(window.ran=window.ran||[]).push"
# Each route pushes its own name into window.ran if it ever runs.
HTML_ATTACKS = {
    "html-script": f"<script>{PUSH}('html-script')</script>",
    "html-img": f"<img src=x onerror=\"{PUSH}('html-img')\">",
    "html-svg": f"<svg onload=\"{PUSH}('html-svg')\"></svg>",
    "html-iframe": "<iframe srcdoc=\"<script>(parent.ran=parent.ran||[]).push('html-iframe')</script>\"></iframe>",
    "html-link": f"<a href=\"java&#x09;script:{PUSH}('html-link')\">click-me</a>",
    "html-style": "<style>body { display: none }</style><b style='position:fixed'>bold</b>",
}
MARKDOWN_ATTACK = (f"Mine: <script>{PUSH}('md-script')</script> <img src=x onerror=\"{PUSH}('md-img')\">\n\n"
                   f"[click-me](javascript:{PUSH}('md-link')) and the formula $x\\,\\Phi(x)$.")
LONG_LINE = "tokens " + "x" * 400 + " end"


def _failure(hidden: bool) -> dict:
    """What exercise 1's check raises for a wrong get_pair_counts, as a notebook error output."""
    import course.checks.ch01 as checks

    answer: dict = {}
    exec(solution_answers(ASSIGNMENT)["ex1_answer"].replace(*WRONG), answer)
    try:
        checks.check_get_pair_counts(answer["get_pair_counts"], hidden=hidden)
    except AssertionError as err:
        return new_output("error", ename=type(err).__name__, evalue=str(err), traceback=err._render_traceback_())
    raise AssertionError("the wrong answer passed exercise 1's check: update WRONG")


def _with_hidden_tests(nb):
    """The test cells as nbgrader's autograde restores them from the source: hidden tests included."""
    source = nbformat.read(ROOT / "solutions" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb", as_version=4)
    tests = {grade_id(c): c.source for c in source.cells if contract.is_graded(c)}
    for cell in nb.cells:
        cell.source = tests.get(grade_id(cell), cell.source)
    return nb


def _attacked_notebook():
    """Chapter 1 as the grader leaves it for the feedback step: exercise 1 wrong, scripts in
    an answer's outputs and in a Markdown cell of the student's, hidden tests hidden."""
    nb = _with_hidden_tests(student_notebook(ASSIGNMENT, solution_answers(ASSIGNMENT)))
    for cell in nb.cells:
        if grade_id(cell) in ("ex1_visible", "ex1_hidden"):
            cell.outputs = [_failure(hidden=grade_id(cell) == "ex1_hidden")]
        elif grade_id(cell) == "ex1_answer":
            cell.outputs = [new_output("display_data", data={"text/html": html, "text/plain": "<HTML>"})
                            for html in HTML_ATTACKS.values()]
            cell.outputs += [
                new_output("display_data", data={"application/javascript": f"{PUSH}('js')", "text/plain": "<JS>"}),
                new_output("display_data", data={"text/markdown": f"<script>{PUSH}('output-md')</script>"}),
                new_output("stream", name="stdout", text=LONG_LINE + "\n"),
            ]
    at = next(i for i, c in enumerate(nb.cells) if grade_id(c) == "ex1_answer")
    nb.cells.insert(at, new_markdown_cell(MARKDOWN_ATTACK))
    return HideHiddenTests().preprocess(nb, {})[0]


@pytest.fixture(scope="module")
def page(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("feedback") / ASSIGNMENT
    folder.mkdir()
    release = nbformat.read(ROOT / "exercises" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb", as_version=4)
    path = folder / f"{ASSIGNMENT}.html"
    path.write_text(feedback.render_page(_attacked_notebook(), ASSIGNMENT, release), encoding="utf-8")
    feedback.install_assets(folder, tmp_path_factory.mktemp("store") / "static")
    return path


@pytest.fixture(scope="module")
def visits(page, tmp_path_factory) -> dict[str, Visit]:
    """One Chromium for three pages: the page, the page unzipped elsewhere, and a copy with a
    script injected after cleaning (the policy must stop it)."""
    folder = tmp_path_factory.mktemp("elsewhere")
    archive = shutil.make_archive(str(folder / "feedback"), "zip", page.parent)
    with zipfile.ZipFile(archive) as zipped:
        zipped.extractall(folder / "unzipped")
    shutil.copytree(page.parent, folder / "injected")
    injected = folder / "injected" / page.name
    injected.write_text(page.read_text(encoding="utf-8").replace(
        "</main>", f"<script>{PUSH}('inline')</script><img src=x onerror=\"{PUSH}('handler')\"></main>"))
    pages = {"page": page, "unzipped": folder / "unzipped" / page.name, "injected": injected}
    return dict(zip(pages, visit_pages(list(pages.values()), chromium_or_skip(), click="click-me")))


@pytest.fixture(scope="module")
def seen(visits) -> Visit:
    return visits["page"]


def _titles() -> list[str]:
    """The exercise headings of the released notebook, read here on their own."""
    text = (ROOT / "exercises" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb").read_text(encoding="utf-8")
    return re.findall(r'"## (Exercise \d+: [^"\\]*)', text)


# ---------------------------------------------------------------------- the markup
@pytest.mark.parametrize("name", list(HTML_ATTACKS))
def test_the_cleaner_leaves_nothing_that_runs(name):
    assert live_markup(safe_html.clean(HTML_ATTACKS[name])) == []


def test_markdown_keeps_hints_code_and_formulas_but_no_script():
    cleaned = safe_html.markdown("<details><summary>Hint 1</summary>\n\nUse `zip`.\n</details>\n\n"
                                 "$\\sqrt{d}$\n\n```python\nx = 1\n```\n\n" + MARKDOWN_ATTACK)
    assert "<details><summary>Hint 1</summary>" in cleaned and "<code>zip</code>" in cleaned
    assert "$\\sqrt{d}$" in cleaned and '<span class="n">x</span>' in cleaned
    assert live_markup(cleaned) == []
    assert "&lt;script&gt;" in cleaned      # shown as text: the student sees what the cell held


def test_a_worker_renders_a_released_cell_once_and_a_submissions_long_text_each_time():
    rendered = []
    render = safe_html.remembered(lambda text: rendered.append(text) or text.upper())
    assert render("short") == render("short") == "SHORT" and rendered == ["short"]
    long = "x" * 5_000
    assert render(long) == render(long) and rendered == ["short", long, long]
    # the page's own renderers remember: the same object comes back
    assert feedback.highlight("x = 1") is feedback.highlight("x = 1")
    assert safe_html.markdown("Use `zip`.") is safe_html.markdown("Use `zip`.")


def test_the_page_has_only_its_own_scripts_and_a_policy(page):
    text = page.read_text(encoding="utf-8")
    assert live_markup(text) == []
    policy = html.unescape(re.search(r'http-equiv="Content-Security-Policy" content="([^"]*)"', text).group(1))
    scripts = re.search(r"script-src ([^;]*)", policy).group(1)
    assert scripts.split() == ["'self'"] and "default-src 'none'" in policy


def test_nothing_of_the_hidden_tests(page):
    text = page.read_text(encoding="utf-8")
    for secret in (contract.HIDDEN_BEGIN, "hidden=True", "BEGIN SOLUTION"):
        assert secret not in text


# ---------------------------------------------------------------------- in the browser
def test_no_script_from_the_submission_runs(seen):
    assert seen.ran == [] and seen.title == f"Feedback: {ASSIGNMENT}"
    assert seen.errors == [] and seen.external == []


def test_what_the_student_wrote_is_shown_as_text(seen):
    assert "<script>" in seen.text and LONG_LINE[:40] in seen.text


def test_formulas_render_offline_titles_included(seen, page):
    assert seen.formulas >= 3       # the student's $x\,\Phi(x)$, exercise 5's title in the table and heading
    assert "\\Phi" not in seen.text and "\\sqrt" not in seen.text


def test_nothing_is_wider_than_the_window(seen):
    assert seen.overflow == {"page": 0, "elements": []}


def test_summary_links_each_exercise_by_name(seen, page):
    titles = _titles()
    assert len(titles) == 8
    # the link texts are the titles with their formulas rendered: compare "Exercise N"
    assert [t.split(":")[0] for t, _ in seen.summary_links] == [t.split(":")[0] for t in titles]
    assert seen.text.count(titles[0]) == 2          # the table and the section's heading, not again below
    text = page.read_text(encoding="utf-8")
    for _, href in seen.summary_links:
        assert href.startswith("#") and f'id="{href[1:]}"' in text


def test_the_failing_exercise_says_why(seen):
    message = _failure(hidden=False)["evalue"]
    assert seen.text.count(message.splitlines()[-1]) == 2            # visible and hidden tests
    assert "\u2717 Visible tests" in seen.text and "\u2713 Visible tests" in seen.text


def test_hints_are_disclosures(seen):
    closed, opened = seen.hints
    assert closed["display"] == "list-item" and not closed["open"]
    assert opened["open"] and opened["height"] > closed["height"]


def test_the_page_reads_from_a_zip(visits):
    seen = visits["unzipped"]
    assert seen.formulas >= 3 and seen.errors == [] and seen.external == []


def test_the_policy_stops_a_script_that_got_past_the_cleaner(visits):
    """The second wall: markup injected after cleaning still does not run."""
    seen = visits["injected"]
    assert seen.ran == [] and len(seen.blocked) >= 2 and seen.formulas >= 3


# ---------------------------------------------------------------------- nbgrader's route
def test_nbgrader_config_file_names_the_course_page(tmp_path):
    from traitlets.config.loader import PyFileConfigLoader

    path = write_config_file(tmp_path)
    config = PyFileConfigLoader(path.name, path=str(tmp_path)).load_config()
    assert config.GenerateFeedback.exporter_class == "autograder.feedback.FeedbackExporter"
    assert config.GenerateFeedback.preprocessors[0] == "autograder.preprocessors.HideHiddenTests"


def test_the_exporter_bundles_mathjax_for_an_instructor():
    exporter = feedback.FeedbackExporter()
    exporter.register_preprocessor(HideHiddenTests, enabled=True)
    nb = _with_hidden_tests(student_notebook(ASSIGNMENT, {}))
    assert any(contract.HIDDEN_BEGIN in c.source for c in nb.cells)
    page_html, resources = exporter.from_notebook_node(nb, {"nbgrader": {"notebook": ASSIGNMENT}})
    assert "_static/mathjax/tex-chtml.js" in resources["outputs"] and "_static/mathjax-config.js" in resources["outputs"]
    assert contract.HIDDEN_BEGIN not in page_html and "Exercise 8:" in page_html


def test_the_page_is_bounded_whatever_the_notebook_prints():
    nb = student_notebook(ASSIGNMENT, {})
    answer = next(c for c in nb.cells if grade_id(c) == "ex1_answer")
    answer.outputs = [new_output("display_data", data={"image/png": "A" * (3 << 19)}) for _ in range(20)]
    answer.outputs += [new_output("stream", name="stdout", text="y" * (1 << 20))]
    text = feedback.render_page(nb, ASSIGNMENT)
    assert len(text) < feedback.MAX_OUTPUTS + (1 << 20) and "more outputs not shown" in text


def test_hidden_tests_say_their_code_is_not_shown(seen):
    assert seen.text.count(contract.HIDDEN_PLACEHOLDER.lstrip("# ")) == 8     # one per exercise of chapter 1


def test_a_page_without_grades_escapes_the_notes_and_runs_nothing():
    text = feedback.render_plain("<b>ch01</b>", 0, 22, [f"<script>{PUSH}('note')</script> is not a notebook"])
    assert live_markup(text) == [] and "&lt;script&gt;" in text and "&lt;b&gt;ch01" in text
    assert "default-src 'none'" in html.unescape(text) and "<script" not in text
