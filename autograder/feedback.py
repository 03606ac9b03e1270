"""The feedback page a student reads after grading, written from the autograded notebook.

At the top, a table of the exercises (title, points, each test's verdict) with links; then the
notebook by exercise: its text (hints as disclosures), the student's code and outputs, and in
place of each test cell its verdict and message. Hidden tests show neither code nor more than
the message their check wrote. Formulas are rendered by the MathJax the book vendors (npm's
``mathjax`` in ``node_modules/``), copied beside the page, so it reads offline and from a zip.

Nothing from a submission runs: its strings are escaped by the template, its HTML and Markdown
cleaned by :mod:`autograder.safe_html`, its scripts (``application/javascript`` outputs,
widgets) left out, and the page's Content-Security-Policy runs only the scripts shipped
beside it (MathJax and its settings).

:class:`FeedbackExporter` is how nbgrader writes it: ``nbgrader generate_feedback`` in the
course tree (see ``nbgrader_config.py`` there) and the grader give the same page.
"""

from __future__ import annotations

import base64
import functools
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from nbconvert.exporters import Exporter
from nbformat.notebooknode import NotebookNode
from traitlets import Bool, default

from . import contract, safe_html

HERE = Path(__file__).resolve().parent / "feedback_static"
MATHJAX = Path(__file__).resolve().parents[1] / "node_modules" / "mathjax" / "es5"
# What the page loads of MathJax: the TeX-to-HTML bundle, its fonts, the TeX extensions it loads
# on demand (\boldsymbol, \color, ...) and the safe extension the settings ask for.
MATHJAX_PARTS = ("tex-chtml.js", "output/chtml/fonts/woff-v2", "input/tex/extensions", "ui/safe.js")
STATIC = "_static"
CSP = ("default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
       "font-src 'self'; base-uri 'none'; form-action 'none'")
MAX_TEXT = 20_000            # characters of one output or message shown; the rest is counted
MAX_IMAGE = 2 << 20          # bytes of one image's base64 text
MAX_OUTPUTS = 8 << 20        # characters of all the outputs of a page
IMAGES = ("image/png", "image/jpeg", "image/gif", "image/svg+xml")
SCRIPTS = ("application/javascript", "application/vnd.jupyter.widget-view+json")
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
_BASE64 = re.compile(r"[A-Za-z0-9+/=\s]*")
_HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.+?)\s*#*\s*$")


@dataclass
class Graded:
    """One graded (test) cell: its verdict and what its check said."""

    grade_id: str
    label: str               # "Visible tests", "Hidden tests" or "Held-out evaluation"
    points: float
    score: float
    message: str = ""        # what failed, in the check's words; "" when it passed
    details: str = ""        # a traceback, when it says more than the message
    code: object = ""        # highlighted code of a visible test; never a hidden one's
    output: str = ""         # what it printed (an evaluation's measured values)

    @property
    def verdict(self) -> str:
        if self.score >= self.points:
            return "passed"
        return "partly" if self.score > 0 else "failed"

    @property
    def mark(self) -> str:
        return {"passed": "\u2713", "partly": "\u00bd", "failed": "\u2717"}[self.verdict]

    @property
    def verdict_text(self) -> str:
        return {"passed": "passed", "partly": "partly passed", "failed": "failed"}[self.verdict]


@dataclass
class Exercise:
    """The graded cells that share a grade-id prefix (``ex3_visible``, ``ex3_hidden``: ``ex3``)."""

    key: str
    title: str
    tests: list[Graded] = field(default_factory=list)

    @property
    def anchor(self) -> str:
        return "exercise-" + re.sub(r"[^A-Za-z0-9_-]", "-", self.key)

    @property
    def points(self) -> float:
        return sum(t.points for t in self.tests)

    @property
    def score(self) -> float:
        return sum(t.score for t in self.tests)

    @property
    def verdict(self) -> str:
        return Graded("", "", self.points, self.score).verdict


@dataclass
class Section:
    """A run of cells: before the first exercise (``exercise`` None), or one exercise's."""

    exercise: Exercise | None
    items: list[tuple[str, object]] = field(default_factory=list)   # ("html", markup) | ("test", Graded)


def exercise_key(grade_id: str) -> str:
    return grade_id.split("_", 1)[0]


def headings(source: str) -> list[str]:
    """The Markdown headings of a cell, outside fenced code."""
    found, fenced = [], False
    for line in source.splitlines():
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
        elif not fenced and (match := _HEADING.match(line)):
            found.append(match.group(2))
    return found


def exercise_titles(nb: NotebookNode, trusted_only: bool) -> dict[str, str]:
    """Exercise key -> the last heading above its first graded cell. With ``trusted_only`` (a
    submission rather than the released notebook), only locked cells' headings count: nbgrader
    restored those from the release, the others the student may have written."""
    titles: dict[str, str] = {}
    last = ""
    for cell in nb.cells:
        if cell.get("cell_type") == "markdown" and (not trusted_only or contract.is_locked(cell)):
            last = (headings(cell.source) or [last])[-1]
        gid = contract.grade_id(cell)
        if gid and contract.is_graded(cell):
            titles.setdefault(exercise_key(gid), last or gid)
    return titles


# ---------------------------------------------------------------------- cells and outputs
def _capped(text: str, limit: int = MAX_TEXT) -> str:
    if len(text) <= limit:
        return text
    return f"{text[:limit]}\n... ({len(text) - limit:,} more characters not shown)"


def _text(value) -> str:
    """An output field as one string (nbformat keeps some as lists of lines)."""
    return "".join(value) if isinstance(value, list) else str(value or "")


def _pre(text: str, kind: str) -> str:
    from markupsafe import escape

    return f'<pre class="fb-{kind}">{escape(_capped(_ANSI.sub("", text)))}</pre>'


@safe_html.remembered
def highlight(code: str) -> str:
    """Python source as escaped, highlighted HTML (Pygments escapes every character)."""
    from pygments import highlight as pygmentize
    from pygments.formatters import HtmlFormatter
    from pygments.lexers import PythonLexer

    return pygmentize(_capped(code), PythonLexer(), HtmlFormatter(cssclass="highlight fb-input"))


def _image(mime: str, data) -> str:
    text = _text(data)
    if mime == "image/svg+xml":     # as an image, never inline: an inline SVG may hold script
        text = base64.b64encode(text.encode("utf-8")).decode("ascii")
    if len(text) > MAX_IMAGE or not _BASE64.fullmatch(text):
        return f'<p class="fb-omitted">(an image of {len(text):,} characters, not shown)</p>'
    return f'<img alt="an output image" src="data:{mime};base64,{"".join(text.split())}">'


def render_output(output: NotebookNode) -> str:
    """One output as safe HTML: text escaped, HTML cleaned, images inline, scripts left out."""
    kind = output.get("output_type")
    if kind == "stream":
        return _pre(_text(output.get("text")), "stderr" if output.get("name") == "stderr" else "output")
    if kind == "error":
        lines = output.get("traceback") or [f"{output.get('ename')}: {output.get('evalue')}"]
        return _pre("\n".join(_text(line) for line in lines), "output")
    data = output.get("data") or {}
    if any(mime in data for mime in SCRIPTS):
        return '<p class="fb-omitted">(a script or widget output: scripts from a notebook do not run here)</p>'
    for mime in IMAGES:
        if mime in data:
            return _image(mime, data[mime])
    if "text/html" in data:
        return f'<div class="fb-html">{safe_html.clean(_capped(_text(data["text/html"])))}</div>'
    if "text/markdown" in data:
        return safe_html.markdown(_capped(_text(data["text/markdown"])))
    if "text/latex" in data:
        from markupsafe import escape

        return f'<div class="fb-latex">{escape(_capped(_text(data["text/latex"])))}</div>'
    if "text/plain" in data:
        return _pre(_text(data["text/plain"]), "output")
    return ""


def _source(cell: NotebookNode) -> str:
    """A cell's code without any hidden region (a second wall behind HideHiddenTests)."""
    return contract.strip_hidden_region(_text(cell.source))[0]


def render_cell(cell: NotebookNode, budget: list[int]) -> str:
    """A cell that is not a test: Markdown, or code with its outputs. ``budget`` ([characters
    left]) bounds the page: outputs past it are counted, not shown."""
    if cell.get("cell_type") == "markdown":
        return f'<div class="fb-cell fb-markdown">{safe_html.markdown(_capped(_text(cell.source)))}</div>'
    if cell.get("cell_type") != "code":
        return ""
    parts = [highlight(_source(cell))] if _source(cell).strip() else []
    outputs = cell.get("outputs", [])
    for i, output in enumerate(outputs):
        shown = render_output(output)
        if len(shown) > budget[0]:
            parts.append(f'<p class="fb-omitted">({len(outputs) - i} more outputs not shown: the page is full)</p>')
            break
        budget[0] -= len(shown)
        parts.append(shown)
    return f'<div class="fb-cell">{"".join(parts)}</div>'


def _hidden(cell: NotebookNode) -> bool:
    source = _text(cell.source)
    return contract.has_hidden_tests(source) or contract.HIDDEN_PLACEHOLDER in source


def _score(cell: NotebookNode) -> tuple[float, float]:
    """(score, points): what nbgrader's GetGrades wrote, else full points unless it failed."""
    meta = contract.nbgrader_meta(cell)
    points = contract.points(cell)
    if meta.get("score") is not None:
        return float(meta["score"]), points
    failed = any(o.get("output_type") == "error" for o in cell.get("outputs", []))
    return (0.0 if failed else points), points


def verdict_of(cell: NotebookNode) -> Graded:
    """The verdict of one graded cell and its message: the last error's value (a check's
    "what, then the likely mistake"), what it printed, and its traceback when that says more."""
    from markupsafe import Markup

    hidden = _hidden(cell)
    role = contract.role(cell)
    label = ("Hidden tests" if hidden else
             "Held-out evaluation" if role is contract.Role.EVALUATION else "Visible tests")
    score, points = _score(cell)
    outputs = cell.get("outputs", [])
    errors = [o for o in outputs if o.get("output_type") == "error"]
    message = ""
    if errors:
        last = errors[-1]
        evalue = _text(last.get("evalue"))
        plain = last.get("ename") in ("CheckFailed", "ShortcutUsed") and evalue
        message = _capped(evalue if plain else f"{last.get('ename')}: {evalue}")
    printed = "".join(_text(o.get("text")) for o in outputs if o.get("output_type") == "stream")
    details = "\n".join(filter(None, (_traceback_beyond(o) for o in errors)))
    printed_text = _capped(_ANSI.sub("", printed)) if printed.strip() else ""
    code = "" if hidden else Markup(highlight(_source(cell)))
    return Graded(contract.grade_id(cell) or "", label, points, score, message, _capped(details), code,
                printed_text)


def _traceback_beyond(error: NotebookNode) -> str:
    """An error's traceback when it holds more than its message (the student's frames)."""
    from course.checks._core import SHOW_TRACEBACK     # "run %tb": no use on a page

    lines = _ANSI.sub("", "\n".join(_text(x) for x in error.get("traceback", []))).splitlines()
    text = "\n".join(line for line in lines if line.strip() != SHOW_TRACEBACK)
    rest = text.replace(_text(error.get("evalue")), "").strip()
    return text if rest and not re.fullmatch(r"[\w.]*:?", rest) else ""


# ---------------------------------------------------------------------- the page
def sections(nb: NotebookNode, titles: dict[str, str]) -> list[Section]:
    """The notebook cut where each exercise's first cell is; test cells become verdicts."""
    from markupsafe import Markup

    out = [Section(None)]
    budget = [MAX_OUTPUTS]
    by_key: dict[str, Exercise] = {}
    for cell in nb.cells:
        gid = contract.grade_id(cell)
        key = exercise_key(gid) if gid else None
        if key in titles and key not in by_key:
            by_key[key] = Exercise(key, titles[key])
            out.append(Section(by_key[key]))
        if gid and contract.is_graded(cell) and cell.get("cell_type") == "code" and key in by_key:
            test = verdict_of(cell)
            by_key[key].tests.append(test)
            out[-1].items.append(("test", test))
        else:
            if out[-1].exercise is not None and cell.get("cell_type") == "markdown":
                cell = NotebookNode({**cell, "source": _without_heading(_text(cell.source), out[-1].exercise.title)})
            out[-1].items.append(("html", Markup(render_cell(cell, budget))))
    return [s for s in out if s.exercise is not None or s.items]


def _without_heading(source: str, title: str) -> str:
    """A Markdown cell without the heading that the section's own title repeats."""
    lines = source.splitlines(True)
    for i, line in enumerate(lines):
        match = _HEADING.match(line.rstrip("\n"))
        if match and match.group(2) == title:
            return "".join(lines[:i] + lines[i + 1:])
    return source


@functools.lru_cache(maxsize=1)
def _template():
    import jinja2
    from markupsafe import Markup

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(HERE)), autoescape=True,
                             undefined=jinja2.StrictUndefined)
    env.filters["points"] = lambda value: f"{value:g}"
    return env.get_template("page.html.j2"), Markup(_css())


def _css() -> str:
    from pygments.formatters import HtmlFormatter

    return (HERE / "feedback.css").read_text(encoding="utf-8") + HtmlFormatter().get_style_defs(".highlight")


def render_page(nb: NotebookNode, notebook: str, release: NotebookNode | None = None) -> str:
    """The page of one autograded notebook (hidden tests already hidden by
    :class:`autograder.preprocessors.HideHiddenTests`). ``release``: the released notebook,
    where the exercise titles are read; without it, the notebook's locked cells."""
    from course.i18n import ENGLISH, known_language, translate

    language = known_language(nb.metadata.get("course", {}).get("language"))
    if language != ENGLISH:
        nb, release = (_in_language(x, notebook, language) if x is not None else None for x in (nb, release))
    titles = exercise_titles(release, trusted_only=False) if release is not None else {}
    titles = {**exercise_titles(nb, trusted_only=True), **titles}
    parts = sections(nb, titles)
    exercises = [s.exercise for s in parts if s.exercise is not None]
    template, css = _template()
    return template.render(
        csp=CSP, css=css, static=STATIC, mathjax=mathjax_available(), notebook=notebook,
        hidden_note=contract.HIDDEN_PLACEHOLDER.lstrip("# "),
        score=sum(e.score for e in exercises), max_score=sum(e.points for e in exercises),
        exercises=exercises, sections=parts, lang=language.replace("_", "-"),
        t=functools.partial(translate, into=language))


def _in_language(nb: NotebookNode, assignment: str, language: str) -> NotebookNode:
    """``nb`` with its Markdown in ``language`` (a Chinese submission's feedback reads in
    Chinese although nbgrader put back the English release's locked cells)."""
    from .translation import catalog_path, catalog_translations, translated_notebook

    root = Path(__file__).resolve().parents[1]
    return translated_notebook(nb, catalog_translations(catalog_path(root, assignment, language)), language)


# ---------------------------------------------------------------------- MathJax beside the page
def mathjax_available() -> bool:
    return all((MATHJAX / part).exists() for part in MATHJAX_PARTS)


def asset_files() -> dict[str, Path]:
    """Path under the page's folder -> the file to put there: MathJax and its settings."""
    files = {f"{STATIC}/mathjax-config.js": HERE / "mathjax-config.js"}
    if not mathjax_available():
        return files
    for part in MATHJAX_PARTS:
        source = MATHJAX / part
        for path in sorted(source.rglob("*")) if source.is_dir() else [source]:
            if path.is_file():
                files[f"{STATIC}/mathjax/{path.relative_to(MATHJAX)}"] = path
    return files


def install_assets(folder: Path, store: Path) -> None:
    """Put the page's scripts beside it in ``folder``, hard-linked from ``store`` (filled once,
    atomically, so parallel workers share it): a class's feedback holds one copy, and each
    folder still reads alone (zipped, or from a file:// URL)."""
    store = Path(store)
    if not store.is_dir():
        store.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".assets-", dir=store.parent))
        tmp.chmod(0o755)
        for name, source in asset_files().items():
            (tmp / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, tmp / name)
        try:
            os.rename(tmp, store)
        except OSError:              # another worker filled it first
            shutil.rmtree(tmp, ignore_errors=True)
    for path in sorted(store.rglob("*")):
        if path.is_file():
            target = Path(folder) / path.relative_to(store)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.unlink(missing_ok=True)
            try:
                os.link(path, target)
            except OSError:          # another file system
                shutil.copyfile(path, target)


# ---------------------------------------------------------------------- nbgrader's route
class FeedbackExporter(Exporter):
    """nbgrader's ``GenerateFeedback.exporter_class``: the page above for each notebook.

    With ``bundle_assets`` (the default, an instructor's ``nbgrader generate_feedback``) the
    MathJax files are written beside each page; the grader turns it off and links them in
    (:func:`install_assets`)."""

    output_mimetype = "text/html"
    bundle_assets = Bool(True, help="Write MathJax beside each page.").tag(config=True)

    @default("file_extension")
    def _file_extension_default(self) -> str:
        return ".html"

    def from_notebook_node(self, nb: NotebookNode, resources=None, **kw):
        nb, resources = super().from_notebook_node(nb, resources, **kw)
        info = resources.get("nbgrader") or {}
        page = render_page(nb, info.get("notebook") or resources.get("metadata", {}).get("name", "notebook"),
                           self._release(info))
        if self.bundle_assets:
            outputs = resources.setdefault("outputs", {})
            outputs.update({name: path.read_bytes() for name, path in asset_files().items()})
        return page, resources

    def _release(self, info: dict) -> NotebookNode | None:
        """The released notebook, where the titles of the exercises are read."""
        coursedir = getattr(self.parent, "coursedir", None)
        if coursedir is None or not info.get("assignment") or not info.get("notebook"):
            return None
        path = Path(coursedir.format_path(coursedir.release_directory, ".", info["assignment"]),
                    f"{info['notebook']}.ipynb")
        return contract.read(path) if path.is_file() else None


# ---------------------------------------------------------------------- the grader's notes
NOTES_MARK = "<!-- grader-notes -->"
PLAIN_CSP = "default-src 'none'; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'"


def notes_html(notes: list[str]) -> str:
    """The grader's notes on a row (repairs, time-outs, review evidence), escaped."""
    from markupsafe import escape

    items = "".join(f"<li>{escape(n)}</li>" for n in notes)
    return f'<div class="fb-notes"><strong>Notes from the grader</strong><ul>{items}</ul></div>'


def render_plain(title: str, score: float, max_score: float, notes: list[str]) -> str:
    """The page of a submission that was not graded: its score and why, and no script at all."""
    from markupsafe import escape

    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
            f'<meta http-equiv="Content-Security-Policy" content="{PLAIN_CSP}">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{escape(title)}</title><style>{_css()}</style></head><body><main class=\"fb-page\">"
            f"<h1>{escape(title)}: {score:g} / {max_score:g}</h1>"
            f"<p>This submission could not be graded, so it scored zero:</p>{notes_html(notes)}</main></body></html>")
