"""A measure of the work in each exercise, and the difficulty band it gives.

The difficulty dots of an exercise's label (``> **Core** · **Difficulty** ●●●○ · ...``) are
an author's promise. This module computes, from the repository alone, what the promise is
checked against (tests/test_labels.py):

* **new lines**: the lines of the reference solution between ``### BEGIN SOLUTION`` and
  ``### END SOLUTION``, without blank lines, comments and docstrings, less the lines a
  learner can copy: a line the book prints verbatim (any line of book/**/*.md, or of the
  notebook's own text and hints, or an inline code span of either, compared without
  whitespace), and a line already written in an earlier exercise's reference solution
  (this chapter's, or an earlier chapter's).
* **conditions**: the distinct hints of the wrong answers registered for the exercise in
  tests/mistakes/<chapter>.py, counting a wrong answer made in this exercise's own answer
  cell that fails this exercise's own test cells. Each is one behaviour of the spec that a
  test checks and names. The rule "write it yourself, not with the built-in" is left out:
  every exercise has it, so it says nothing about one's difficulty.

    measure = new lines + conditions

and the band is the first of ``BANDS`` that the measure stays under (●○○○ under 12,
●●○○ under 20, ●●●○ under 30, ●●●● from 30). A one-formula exercise (one to three lines
and a handful of conditions) lands in the first band; a layer with a cache, a masked and
batched loop, or an optimizer written from its equations (20-35 lines and ten or more
conditions) in the last.

For an author, the table per chapter (exercise, rung, dots, lines, printed, earlier,
conditions, measure, band; ``!`` where the dots and the band differ)::

    .venv/bin/python tests/exercise_measure.py               # the ladder chapters
    .venv/bin/python tests/exercise_measure.py ch04_ffn      # one chapter
"""

from __future__ import annotations

import importlib
import io
import re
import sys
import tokenize
from dataclasses import dataclass
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "tests") not in sys.path:
    sys.path.insert(0, str(ROOT / "tests"))

# The capstone (ch07) is one project: its labels name no rung, so it is not measured here.
CHAPTERS = ("ch01_embeddings", "ch02_positions", "ch03_attention", "ch04_ffn", "ch05_training",
            "ch06_inference")
# measure < BANDS[0] -> ●○○○, < BANDS[1] -> ●●○○, < BANDS[2] -> ●●●○, otherwise ●●●●
BANDS = (12, 20, 30)
LABEL = re.compile(r"^> \*\*([A-Za-z ,-]+)\*\* · \*\*Difficulty\*\* ([●○]{4})", flags=re.M)
# the hints of forbid(): a built-in used where the exercise asks for the learner's own code
WRITE_IT_YOURSELF = re.compile(r"built-in|yourself|asks you to write")
_SOLUTION = re.compile(r"^[ \t]*### BEGIN SOLUTION\n(.*?)^[ \t]*### END SOLUTION", flags=re.M | re.S)
_INLINE_CODE = re.compile(r"`([^`\n]+)`")


def band(measure: int) -> int:
    """The number of difficulty dots, 1 to 4, that ``measure`` earns."""
    return 1 + sum(measure >= threshold for threshold in BANDS)


def dots(n: int) -> str:
    return "●" * n + "○" * (4 - n)


def _squeeze(line: str) -> str:
    return re.sub(r"\s+", "", line)


def _docstring_lines(source: str) -> set[int]:
    """Line numbers (1-based) of strings that stand alone as a statement (docstrings)."""
    out, start_of_statement = set(), True
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return out
    for i, tok in enumerate(tokens):
        if tok.type == tokenize.STRING and start_of_statement:
            following = tokens[i + 1].type if i + 1 < len(tokens) else tokenize.ENDMARKER
            if following in (tokenize.NEWLINE, tokenize.ENDMARKER):
                out.update(range(tok.start[0], tok.end[0] + 1))
        if tok.type not in (tokenize.NL, tokenize.COMMENT):
            start_of_statement = tok.type in (tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT)
    return out


def solution_lines(source: str) -> list[str]:
    """The stripped code lines between the solution markers of one cell: no blank lines,
    comments or docstrings (a comment at the end of a line is dropped, the code kept)."""
    docstrings = _docstring_lines(source)
    out = []
    for block in _SOLUTION.finditer(source):
        first = source.count("\n", 0, block.start(1)) + 1
        for offset, line in enumerate(block.group(1).splitlines()):
            code = re.sub(r"\s+#.*$", "", line).strip()
            if code and not code.startswith("#") and first + offset not in docstrings:
                out.append(code)
    return out


def printed_text(texts: list[str]) -> set[str]:
    """Every line and every inline code span of ``texts``, without whitespace."""
    out = set()
    for text in texts:
        out.update(_squeeze(line) for line in text.splitlines())
        out.update(_squeeze(span) for span in _INLINE_CODE.findall(text))
    out.discard("")
    return out


def _book_texts() -> list[str]:
    return [path.read_text(encoding="utf-8") for path in sorted((ROOT / "book").rglob("*.md"))]


RUNGS = ("warm-up", "core", "predict, then measure", "synthesis")


def rung_table(text: str) -> dict[int, tuple[str, int, int | None]]:
    """{exercise: (rung, points, dots or None)} from the rows of a markdown table in ``text``
    that start with an exercise number, name a rung and end with the points; dots only
    where a cell shows them (●●○○)."""
    out = {}
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")] if line.startswith("|") else []
        rung = [cell for cell in cells if cell in RUNGS]
        if len(cells) >= 3 and cells[0].isdigit() and rung and cells[-1].isdigit():
            shown = [cell.count("●") for cell in cells if re.fullmatch(r"[●○]{4}", cell)]
            out[int(cells[0])] = (rung[0], int(cells[-1]), shown[0] if shown else None)
    return out


def notebook(chapter: str):
    return nbformat.read(ROOT / "solutions" / chapter / f"{chapter}.ipynb", as_version=4)


def _grade_id(cell) -> str:
    return cell.get("metadata", {}).get("nbgrader", {}).get("grade_id") or ""


def _exercise_of(grade_id: str) -> int | None:
    match = re.match(r"ex(\d+)_", grade_id)
    return int(match.group(1)) if match else None


def labels(nb) -> dict[int, tuple[str, int]]:
    """{exercise: (rung named in its label, number of difficulty dots)}."""
    out, exercise = {}, None
    for cell in nb.cells:
        if cell.cell_type != "markdown":
            continue
        heading = re.match(r"## Exercise (\d+)", cell.source)
        exercise = int(heading.group(1)) if heading else exercise
        label = LABEL.search(cell.source)
        if label and exercise is not None:
            out[exercise] = (label.group(1), label.group(2).count("●"))
    return out


def conditions(chapter: str) -> dict[int, set[str]]:
    """{exercise: distinct hints of its own wrong answers that fail its own tests}."""
    out: dict[int, set[str]] = {}
    for mistake in importlib.import_module(f"mistakes.{chapter}").MISTAKES:
        own = _exercise_of(mistake.cell)
        failing = {_exercise_of(cell) for cell in mistake.failing}
        if own in failing and not WRITE_IT_YOURSELF.search(mistake.hint):
            out.setdefault(own, set()).add(mistake.hint)
    return out


@dataclass(frozen=True)
class Exercise:
    chapter: str
    number: int
    rung: str
    dots: int          # the label's difficulty dots
    lines: int         # solution lines (no blanks, comments, docstrings)
    printed: int       # of those, printed verbatim in the book or the notebook's text
    earlier: int       # of the rest, already in an earlier exercise's solution
    conditions: int    # distinct hints of the exercise's own wrong answers

    @property
    def measure(self) -> int:
        return self.lines - self.printed - self.earlier + self.conditions

    @property
    def band(self) -> int:
        return band(self.measure)


def _answers(nb) -> list[tuple[int, list[str]]]:
    """[(exercise, solution lines)] of the notebook's answer cells, in order."""
    return [(_exercise_of(_grade_id(cell)), solution_lines(cell.source)) for cell in nb.cells
            if cell.cell_type == "code" and _grade_id(cell).endswith("_answer")
            and _exercise_of(_grade_id(cell)) is not None]


def measure_chapters(chapters=CHAPTERS) -> dict[str, list[Exercise]]:
    """{chapter: its exercises, measured}; earlier chapters' solutions count as written."""
    book, written, out = _book_texts(), set(), {}
    for chapter in CHAPTERS:
        nb = notebook(chapter)
        printed = printed_text(book + [c.source for c in nb.cells if c.cell_type == "markdown"])
        rungs, hints, rows = labels(nb), conditions(chapter), {}
        for number, lines in _answers(nb):
            squeezed = [_squeeze(line) for line in lines]
            n_printed = sum(line in printed for line in squeezed)
            n_earlier = sum(line not in printed and line in written for line in squeezed)
            old = rows.get(number, (0, 0, 0))
            rows[number] = (old[0] + len(lines), old[1] + n_printed, old[2] + n_earlier)
            written.update(squeezed)
        if chapter in chapters:
            out[chapter] = [Exercise(chapter, n, *rungs.get(n, ("?", 0)), *rows[n], len(hints.get(n, ())))
                            for n in sorted(rows)]
    return out


def table(exercises: list[Exercise]) -> str:
    """The measure of a chapter's exercises as a text table, ``!`` where label and band differ."""
    head = f"{'ex':>3}  {'rung':<22} {'label':<5} {'lines':>5} {'printed':>7} {'earlier':>7} " \
           f"{'conds':>5} {'measure':>7}  band"
    rows = [f"{e.number:>3}  {e.rung:<22} {dots(e.dots):<5} {e.lines:>5} {e.printed:>7} {e.earlier:>7} "
            f"{e.conditions:>5} {e.measure:>7}  {dots(e.band)}{'  !' if e.band != e.dots else ''}"
            for e in exercises]
    return "\n".join([head, *rows])


def main(argv: list[str]) -> int:
    chapters = tuple(argv) or CHAPTERS
    unknown = set(chapters) - set(CHAPTERS)
    if unknown:
        print(f"unknown chapter(s) {sorted(unknown)}; choose from {', '.join(CHAPTERS)}")
        return 2
    print(f"measure = lines - printed - earlier + conditions; bands: ●○○○ < {BANDS[0]} <= ●●○○ "
          f"< {BANDS[1]} <= ●●●○ < {BANDS[2]} <= ●●●●\n")
    for chapter, exercises in measure_chapters(chapters).items():
        print(chapter)
        print(table(exercises), end="\n\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
