"""Graded points a learner can copy from printed text (issue 28): per exercise and per chapter.

    .venv/bin/python benchmarks/copyable_points.py                  # chapters 1-7
    .venv/bin/python benchmarks/copyable_points.py ch04_ffn -v      # one chapter, with the matches

The reference solution of each exercise is split into lines as tests/exercise_measure.py does
(the code between ``### BEGIN SOLUTION`` and ``### END SOLUTION``, without blank lines,
comments and docstrings). A line is **copyable** when the learner can take it from text they
are shown before they answer:

* **printed text**: every page of book/**/*.md, every notebook's Markdown (its hints too), and
  every notebook's code cells as the learner gets them (the solutions and hidden tests cut
  out: signatures, stub docstrings, demos, test cells);
* **verbatim**: the line, without whitespace, is a line or an inline code span of that text
  (exercise_measure's rule, reused from it);
* **after trivial renaming**: the line's statement (a statement over several lines is joined
  first) is equal, once normalised, to a statement of a printed code block (a fenced block or
  code cell of a page, a fenced block of a Markdown cell, a notebook code cell) or to an inline
  code span. *Normalised* means: comments dropped, and every local name (a variable, a
  parameter, a loop or lambda variable, the name a ``def`` or ``class`` defines) replaced by a
  placeholder numbered in order of appearance (``x = x + y`` and ``a = a + b`` are both
  ``_0 = _0 + _1``). Kept as written: keywords, built-ins, ``self``, names imported anywhere
  in the printed code or the notebooks (``torch``, ``F``, ``nn``, ``math``, ``Counter``...),
  attribute names (after a dot), keyword-argument names (``dim=``), a name that is called
  (``merge_pair(...)``), literals (a string by its value: ``'a'`` is ``"a"``) and operators. An assignment or a ``return`` also matches
  on its right-hand side alone (``y = <printed expression>``, ``return <printed
  expression>``), when that side holds an operator or a call: a side made of names,
  attributes, subscripts, brackets and commas alone (``self.embed.weight``, ``(n,)``,
  ``{}``) is wiring that the spec names, not a printed computation.

Earlier exercises' solutions do not count here: they are the learner's own work, not printed.

**Plumbing**: a line whose normalised statement is ``return``, ``return`` of names only
(``return _0``, ``return _0, _1``), ``pass``, ``break``, ``continue``, ``else:``, ``try:``,
``finally:`` or ``super().__init__()``. It carries no part of the idea, so the verdicts leave it
out:

* **copyable**: every line that is not plumbing is copyable (and there is at least one);
* **one-line transfer**: all but one of the lines that are not plumbing are copyable (and at
  least one is).

The exercise's **points** are the nbgrader points of its test cells. Cells where the learner
pastes earlier chapters' answers (grade ids with ``tools``) are left out of the exercises and
shown on a line of their own, as are graded runs (the capstone's trained models); the chapter's
points count them. The table per exercise
shows chapter, exercise, points, solution lines, copyable lines (verbatim + renamed) and the
verdict, with the printed block that covers the most of its lines (page or cell, and how many
lines it covers alone: a verdict that one block carries points at the text to change); then,
per chapter, the points, the points of copyable exercises and of one-line transfers.
``-v`` lists each copyable line with what it matched.
"""

from __future__ import annotations

import ast
import builtins
import keyword
import re
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import exercise_measure as em  # noqa: E402

CHAPTERS = em.CHAPTERS + ("ch07_capstone",)

_TOKEN = re.compile(r"""
    (?P<comment>\#[^\n]*)
  | (?P<string>(?:[rRbBuUfF]{1,2})?(?:'''[\s\S]*?'''|\"\"\"[\s\S]*?\"\"\"|'(?:\\.|[^'\\\n])*'|"(?:\\.|[^"\\\n])*"))
  | (?P<number>\d[\d_]*(?:\.\d*)?(?:[eE][-+]?\d+)?j?|\.\d+(?:[eE][-+]?\d+)?)
  | (?P<name>[^\W\d]\w*)
  | (?P<op>\*\*=?|//=?|>>=?|<<=?|->|:=|[-+*/%@&|^=<>!]=|\S)
""", re.X)
_KEEP = set(keyword.kwlist) | set(dir(builtins)) | {"self", "cls", "match", "case", "_"}
_IMPORT = re.compile(r"^\s*(?:from\s+[\w.]+\s+)?import\s+(.+)$", re.M)
_FENCE = re.compile(r"^(`{3,})[^\n]*\n(.*?)^\1[ \t]*$", re.M | re.S)
_DIRECTIVE_OPTION = re.compile(r"^(?::\w[\w-]*:.*|---)$")
_PLUMBING = re.compile(r"return(?: _\d+(?: , _\d+)*)?|pass|break|continue|else :|try :|finally :"
                       r"|super \( \) \. __init__ \( \)")
_HIDDEN = re.compile(r"^[ \t]*### BEGIN HIDDEN TESTS\n.*?^[ \t]*### END HIDDEN TESTS[^\n]*\n?", re.M | re.S)
_SOLUTION_BLOCK = re.compile(r"^[ \t]*### BEGIN SOLUTION\n.*?^[ \t]*### END SOLUTION[^\n]*\n?", re.M | re.S)


def imported_names(texts) -> set[str]:
    """Names bound by ``import`` statements in ``texts`` (aliases and imported names)."""
    out = set()
    for text in texts:
        for match in _IMPORT.finditer(text):
            for part in match.group(1).strip("() \\").split(","):
                words = part.split()
                if words:
                    out.add(words[-1].split(".")[0] if len(words) == 1 else words[-1])
    return out


def tokens(code: str) -> list[tuple[str, str]]:
    """[(kind, text)] of a piece of Python, comments dropped (kind: string, number, name, op)."""
    return [(m.lastgroup, m.group()) for m in _TOKEN.finditer(code) if m.lastgroup != "comment"]


def normalise(code: str, keep: set[str]) -> str:
    """``code`` with its local names replaced by placeholders in order of appearance."""
    toks, out, names, depth = tokens(code), [], {}, 0
    defines = bool(toks) and toks[0][1] in ("def", "class", "lambda")
    for i, (kind, text) in enumerate(toks):
        before = toks[i - 1][1] if i else ""
        after = toks[i + 1][1] if i + 1 < len(toks) else ""
        depth += text in "([{" and kind == "op"
        depth -= text in ")]}" and kind == "op" and depth > 0
        local = (kind == "name" and text not in keep and before != "."
                 and not (after == "(" and before not in ("def", "class"))
                 and not (after == "=" and depth and not defines and before in ("(", ",")))
        out.append(names.setdefault(text, f"_{len(names)}") if local else _literal(kind, text))
    return " ".join(out)


def _literal(kind: str, text: str) -> str:
    """A string literal written one way (``'a'`` and ``"a"`` alike); other tokens unchanged."""
    if kind == "string" and not re.match(r"[fF]|[rRbB][fF]", text):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")           # printed "\s" and the like: still a literal
            try:
                return repr(ast.literal_eval(text))
            except (ValueError, SyntaxError):
                pass
    return text


def statements(lines: list[str]) -> list[list[int]]:
    """Indices of ``lines`` grouped into statements (brackets left open, or a trailing
    backslash, continue a statement on the next line)."""
    groups, depth = [], 0
    for i, line in enumerate(lines):
        if depth == 0 and not (groups and groups[-1][-1] == i - 1 and lines[i - 1].rstrip().endswith("\\")):
            groups.append([])
        groups[-1].append(i)
        for kind, text in tokens(line):
            if kind == "op":
                depth += text in "([{"
                depth = max(0, depth - (text in ")]}"))
    return groups


def forms(code: str, keep: set[str]) -> set[str]:
    """The normalised statement, and its right-hand side (of ``=``, ``return``) when that
    holds an operator or a call (not only names, attributes, subscripts, brackets, commas)."""
    whole = normalise(code, keep)
    out = {whole} if whole else set()
    toks, depth = tokens(code), 0
    for i, (kind, text) in enumerate(toks):
        depth += kind == "op" and text in "([{"
        depth -= kind == "op" and text in ")]}"
        if depth == 0 and ((kind == "op" and text in ("=", "+=", "-=", "*=", "/=", "@="))
                           or (i == 0 and text in ("return", "yield"))):
            rhs = toks[i + 1:]
            if any(k == "op" and t not in ".,:()[]{}" or (k == "name" and j + 1 < len(rhs) and rhs[j + 1][1] == "(")
                   for j, (k, t) in enumerate(rhs)):
                out.add(normalise(" ".join(t for _, t in rhs), keep))
            break
    return out


@dataclass
class Block:
    """A printed piece of code and where it is."""
    where: str
    forms: set[str] = field(default_factory=set)


def code_blocks(text: str, where: str, keep: set[str], whole_code: bool = False) -> list[Block]:
    """The blocks of ``text``: its fenced blocks (or all of it, a code cell), statement by
    statement, and one block of its inline code spans."""
    bodies = [text] if whole_code else [m.group(2) for m in _FENCE.finditer(text)]
    out = []
    for body in bodies:
        lines = [ln for ln in body.splitlines() if ln.strip() and not _DIRECTIVE_OPTION.match(ln.strip())]
        block = Block(where)
        for group in statements(lines):
            block.forms |= forms(" ".join(lines[i].strip() for i in group), keep)
        out.append(block)
    spans = Block(f"{where} (inline code)")
    for span in em._INLINE_CODE.findall(text):
        spans.forms |= forms(span, keep)
    return out + [spans]


def learner_code(source: str) -> str:
    """A notebook code cell as the learner gets it: solutions and hidden tests cut out."""
    return _SOLUTION_BLOCK.sub("", _HIDDEN.sub("", source))


@dataclass
class Printed:
    verbatim: set[str]
    blocks: list[Block]
    keep: set[str]
    texts: dict[str, str]             # where -> text, to say where a verbatim line is printed

    def verbatim_where(self, line: str) -> str:
        for where, text in self.texts.items():
            if em._squeeze(line) in em.printed_text([text]):
                return where
        return ""

    def matches(self, code: str) -> list[str]:
        """Where the statement ``code`` is printed after renaming (block descriptions)."""
        mine = forms(code, self.keep)
        return [b.where for b in self.blocks if mine & b.forms]


def printed(chapters=CHAPTERS) -> Printed:
    """Everything printed: book pages, and every notebook's Markdown and learner code cells."""
    pages = {str(p.relative_to(ROOT)): p.read_text(encoding="utf-8") for p in sorted((ROOT / "book").rglob("*.md"))}
    cells = []   # (where, text, is code)
    for chapter in chapters:
        for cell in em.notebook(chapter).cells:
            where = f"{chapter} {em._grade_id(cell) or 'cell'}"
            if cell.cell_type == "markdown":
                cells.append((where, cell.source, False))
            elif cell.cell_type == "code":
                cells.append((where, learner_code(cell.source), True))
    return printed_from(pages, cells)


def printed_from(pages: dict[str, str], cells: list[tuple[str, str, bool]]) -> Printed:
    """What ``pages`` ({where: Markdown}) and notebook ``cells`` ([(where, text, is code)]) print."""
    texts = list(pages.values()) + [text for _, text, _ in cells]
    keep = _KEEP | imported_names(texts)
    blocks = []
    for where, text in pages.items():
        blocks += code_blocks(text, where, keep)
    for where, text, is_code in cells:
        blocks += code_blocks(text, where, keep, whole_code=is_code)
    named = dict(pages) | {w: t for w, t, _ in cells}
    return Printed(em.printed_text(texts), [b for b in blocks if b.forms], keep, named)


@dataclass
class Row:
    chapter: str
    number: int
    points: int
    lines: list[str]
    verbatim: list[bool]
    renamed: list[list[str]]          # per line: the blocks its statement matches after renaming
    plumbing: list[bool]
    units: list[str]                  # per line: the function (or class) whose solution it is in

    @property
    def copyable(self) -> list[bool]:
        return [v or bool(r) for v, r in zip(self.verbatim, self.renamed)]

    @property
    def verdict(self) -> str:
        return verdict(self.copyable, self.plumbing)

    def unit_verdicts(self) -> dict[str, str]:
        """{function: its verdict} for the functions of a multi-function exercise that have one."""
        names = list(dict.fromkeys(self.units))
        out = {}
        for name in names if len(names) > 1 else ():
            mine = [i for i, u in enumerate(self.units) if u == name]
            found = verdict([self.copyable[i] for i in mine], [self.plumbing[i] for i in mine])
            if found:
                out[name] = found
        return out

    def best_block(self) -> tuple[str, int]:
        counts: dict[str, int] = {}
        for blocks in self.renamed:
            for where in sorted(set(blocks)):
                counts[where] = counts.get(where, 0) + 1
        return max(counts.items(), key=lambda kv: kv[1], default=("", 0))


def verdict(copyable: list[bool], plumbing: list[bool]) -> str:
    """"copyable", "one-line transfer" or "" (the rule of the module's docstring)."""
    substantive = sum(not p for p in plumbing)
    missing = sum(not c and not p for c, p in zip(copyable, plumbing))
    if substantive == 0 or missing == substantive:
        return ""
    return {0: "copyable", 1: "one-line transfer"}.get(missing, "")


_DEFINES = re.compile(r"^[ \t]*(?:async\s+)?(?:def|class)\s+(\w+)", re.M)


def _units(source: str) -> list[str]:
    """The name of the function or class each solution block of a cell is in."""
    out = []
    for block in em._SOLUTION.finditer(source):
        names = _DEFINES.findall(source, 0, block.start())
        out.append(names[-1] if names else "?")
    return out


def _group(grade_id: str):
    """The exercise number a graded cell belongs to; "paste" for a cell where the learner
    pastes an earlier chapter's answers; the grade id for a graded run (the capstone's
    trained models)."""
    if "tools" in grade_id:
        return "paste"
    number = em._exercise_of(grade_id)
    return grade_id if number is None else number


def _points(nb) -> dict:
    out: dict = {}
    for cell in nb.cells:
        points = int(cell.get("metadata", {}).get("nbgrader", {}).get("points") or 0)
        if points:
            key = _group(em._grade_id(cell))
            out[key] = out.get(key, 0) + points
    return out


def measure(chapter: str, text: Printed) -> tuple[list[Row], dict]:
    """The chapter's exercises, measured, and the points of its other graded cells (pasted
    earlier answers, graded runs): {what: points}."""
    nb, rows = em.notebook(chapter), {}
    points = _points(nb)
    for cell in nb.cells:
        number = _group(em._grade_id(cell))
        if cell.cell_type == "code" and isinstance(number, int) and em._grade_id(cell).endswith("_answer"):
            row = rows.setdefault(number, Row(chapter, number, points.get(number, 0), [], [], [], [], []))
            measure_cell(row, cell.source, text)
    return [rows[n] for n in sorted(rows)], {k: v for k, v in points.items() if not isinstance(k, int)}


def measure_cell(row: Row, source: str, text: Printed) -> Row:
    """Add the solution lines of one answer cell to ``row``, each with what prints it."""
    for unit, block in zip(_units(source), em._SOLUTION.finditer(source)):
        _measure_block(row, unit, source, block, text)
    return row


def _measure_block(row: Row, unit: str, source: str, block, text: Printed) -> None:
    """Add one solution block's lines to ``row``."""
    start = source.rfind("\n", 0, block.start()) + 1
    lines = em.solution_lines(source[start:block.end()])
    if lines:
        for group in statements(lines):
            code = " ".join(lines[i] for i in group)
            where = text.matches(code)
            whole_verbatim = em._squeeze(code) in text.verbatim
            plumbing = bool(_PLUMBING.fullmatch(normalise(code, text.keep)))
            for i in group:
                row.lines.append(lines[i])
                row.verbatim.append(whole_verbatim or em._squeeze(lines[i]) in text.verbatim)
                row.renamed.append(where)
                row.plumbing.append(plumbing)
                row.units.append(unit)


def report(chapters, verbose: bool = False) -> str:
    text = printed()
    out = [f"{'chapter':<16} {'ex':>3} {'points':>6} {'lines':>5} {'copyable':>8}  {'verdict':<18} "
           f"best printed block (lines it covers)"]
    totals = []
    for chapter in chapters:
        rows, others = measure(chapter, text)
        for r in rows:
            where, n = r.best_block()
            units = "; ".join(f"{u}: {v}" for u, v in r.unit_verdicts().items())
            out.append(f"{chapter:<16} {r.number:>3} {r.points:>6} {len(r.lines):>5} {sum(r.copyable):>8}  "
                       f"{r.verdict:<18} {where + f' ({n})' if n else ''}" + (f"  [{units}]" if units else ""))
            if verbose:
                for line, v, w, p in zip(r.lines, r.verbatim, r.renamed, r.plumbing):
                    mark = "V" if v else ("R" if w else " ")
                    src = text.verbatim_where(line) if v else (w[0] if w else "")
                    out.append(f"      {mark}{'p' if p else ' '} {line[:90]}" + (f"    <- {src}" if src else ""))
        for what, points in others.items():
            why = "earlier chapters' answers, pasted" if what == "paste" else "a graded training run"
            out.append(f"{chapter:<16} {'-':>3} {points:>6} {'':>5} {'':>8}  {'':<18} {what}: {why}")
        totals.append((chapter, sum(r.points for r in rows) + sum(others.values()),
                       sum(r.points for r in rows if r.verdict == "copyable"),
                       sum(r.points for r in rows if r.verdict == "one-line transfer")))
    out += ["", f"{'chapter':<16} {'points':>6} {'copyable':>8} {'one-line transfer':>17}"]
    out += [f"{c:<16} {p:>6} {cp:>8} {one:>17}" for c, p, cp, one in totals]
    out.append(f"{'total':<16} {sum(t[1] for t in totals):>6} {sum(t[2] for t in totals):>8} "
               f"{sum(t[3] for t in totals):>17}")
    return "\n".join(out)


def main(argv: list[str]) -> int:
    verbose = "-v" in argv
    chapters = tuple(a for a in argv if a != "-v") or CHAPTERS
    unknown = set(chapters) - set(CHAPTERS)
    if unknown:
        print(f"unknown chapter(s) {sorted(unknown)}; choose from {', '.join(CHAPTERS)}")
        return 2
    print(report(chapters, verbose))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
