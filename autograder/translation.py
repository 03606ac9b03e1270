"""The exercise notebooks in another language (issue 30): the Chinese release of each chapter.

``exercises/`` keeps English. The Chinese release of a notebook is its English release with
the messages of its Markdown cells replaced by their translations from
``locales/zh_CN/LC_MESSAGES/notebooks/<assignment>.po`` (an untranslated or fuzzy message
stays English); its code cells, cell ids and nbgrader metadata are the English release's, so
it grades exactly as the English one. ``make exercises`` writes it into ``exercises-zh/``
(:func:`write_translated_releases`), ``make locales`` extracts the messages with
:func:`markdown_messages`, and the grader accepts a locked Markdown cell whose text is the
translated release's (:func:`translated_releases`).

A Markdown cell is cut into messages line by line: a heading, a list item, a paragraph, a
block quote, a table cell and the text of a ``<summary>`` each make one message, their lines
joined by spaces, without their marker or indentation. Display maths (``$$ ... $$``),
indented code, lines of bare HTML tags and texts with no letter outside inline code and
formulas are not messages; they are copied as they are.
"""

from __future__ import annotations

import copy
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

# language -> the folder of its release, beside exercises/ (laid out the same way)
LANGUAGES = {"zh_CN": "exercises-zh"}
ENGLISH_FOLDER = "exercises"

_HEADING = re.compile(r"^(#{1,6}[ \t]+)(.*)$")
_ITEM = re.compile(r"^([ \t]*(?:[-*+]|\d{1,9}[.)])[ \t]+)(.*)$")
_QUOTE = re.compile(r"^([ \t]*>[ \t]?)(.*)$")
_SUMMARY = re.compile(r"^([ \t]*<details>[ \t]*<summary>)(.*?)(</summary>[ \t]*)$")
_TAGS = re.compile(r"^[ \t]*(?:</?[A-Za-z][^>]*>[ \t]*)+$")
_TABLE = re.compile(r"^[ \t]*\|")
_NOT_PROSE = re.compile(r"`[^`]*`|\$[^$]*\$|<[^>]*>")


@dataclass
class _Unit:
    """Lines ``start:end`` of a cell; ``kind`` "text" (one message), "row" (a table row: one
    message per cell), "summary" (one message) or "verbatim" (none)."""

    kind: str
    start: int
    end: int
    prefix: str = ""                 # written before the first line of the text
    indent: str = ""                 # written before each further line
    suffix: str = ""                 # written after the text (a </summary>)
    parts: list[str] = field(default_factory=list)

    @property
    def text(self) -> str:
        return " ".join(part.strip() for part in self.parts).strip()


def has_prose(text: str) -> bool:
    """Whether ``text`` has a letter outside inline code, formulas and HTML tags."""
    return any(ch.isalpha() for ch in _NOT_PROSE.sub(" ", text))


def _starts_unit(line: str) -> bool:
    stripped = line.strip()
    return (not stripped or stripped.startswith("$$") or bool(_TABLE.match(line) or _TAGS.match(line)
            or _SUMMARY.match(line) or _HEADING.match(line) or _ITEM.match(line) or _QUOTE.match(line)))


def _maths_end(lines: list[str], i: int) -> int:
    """One past the last line of the display formula that opens on line ``i``."""
    stripped = lines[i].strip()
    if len(stripped) > 2 and stripped.endswith("$$"):
        return i + 1
    return next((k + 1 for k in range(i + 1, len(lines)) if lines[k].strip().endswith("$$")), len(lines))


def _text_unit(lines: list[str], i: int) -> _Unit:
    """A paragraph, list item or block quote from line ``i``, with its continuation lines."""
    line = lines[i]
    quote, item = _QUOTE.match(line), _ITEM.match(line)
    found = quote or item
    prefix = found.group(1) if found else line[:len(line) - len(line.lstrip())]
    unit = _Unit("text", i, i + 1, prefix, indent=prefix if quote else " " * len(prefix),
                 parts=[found.group(2) if found else line.strip()])
    while unit.end < len(lines):
        following = lines[unit.end]
        if quote and _QUOTE.match(following) and following.strip():
            unit.parts.append(_QUOTE.match(following).group(2))
        elif not quote and not _starts_unit(following):
            unit.parts.append(following.strip())
        else:
            break
        unit.end += 1
    return unit


def _units(source: str) -> tuple[list[str], list[_Unit]]:
    lines = source.split("\n")
    units: list[_Unit] = []
    i, in_list, after_blank = 0, False, True
    while i < len(lines):
        line = lines[i]
        if not line.strip():
            unit = _Unit("verbatim", i, i + 1)
        elif line.strip().startswith("$$"):
            unit = _Unit("verbatim", i, _maths_end(lines, i))
        elif after_blank and not in_list and line.startswith("    "):      # indented code
            end = next((k for k in range(i, len(lines)) if not lines[k].strip()), len(lines))
            unit = _Unit("verbatim", i, end)
        elif _TABLE.match(line):
            unit = _Unit("row", i, i + 1, parts=[line])
        elif _SUMMARY.match(line):
            found = _SUMMARY.match(line)
            unit = _Unit("summary", i, i + 1, found.group(1), suffix=found.group(3), parts=[found.group(2)])
        elif _TAGS.match(line):
            unit = _Unit("verbatim", i, i + 1)
        elif _HEADING.match(line):
            found = _HEADING.match(line)
            unit = _Unit("text", i, i + 1, found.group(1), parts=[found.group(2)])
        else:
            unit = _text_unit(lines, i)
        if line.strip():
            in_list = bool(_ITEM.match(line)) or (in_list and line[:1] in (" ", "\t"))
        after_blank = not line.strip()
        units.append(unit)
        i = unit.end
    return lines, units


def _row_cells(row: str) -> list[str]:
    """A table row split at its bars (not those inside inline code), bars removed."""
    cells, current, in_code = [], "", False
    for ch in row:
        if ch == "`":
            in_code = not in_code
        if ch == "|" and not in_code:
            cells.append(current)
            current = ""
        else:
            current += ch
    return cells + [current]


def _unit_messages(unit: _Unit) -> list[str]:
    if unit.kind == "row":
        texts = [cell.strip() for cell in _row_cells(unit.parts[0])]
    elif unit.kind in ("text", "summary"):
        texts = [unit.text]
    else:
        texts = []
    return [text for text in texts if text and has_prose(text)]


def markdown_messages(source: str) -> list[str]:
    """The messages of one Markdown cell, in order."""
    return [message for unit in _units(source)[1] for message in _unit_messages(unit)]


def _render(unit: _Unit, lines: list[str], translations: dict[str, str]) -> list[str]:
    """The unit's lines with its messages translated (its own lines when none is)."""
    original = lines[unit.start:unit.end]
    if unit.kind == "row":
        cells = _row_cells(original[0])
        changed = [cell.replace(cell.strip(), translations[cell.strip()], 1)
                   if cell.strip() in translations and has_prose(cell.strip()) else cell for cell in cells]
        return ["|".join(changed)]
    if unit.kind == "verbatim" or unit.text not in translations or not has_prose(unit.text):
        return original
    translated = translations[unit.text].split("\n")
    if unit.kind == "summary" or _HEADING.match(original[0]):       # one line
        return [unit.prefix + " ".join(t.strip() for t in translated) + unit.suffix]
    return [unit.prefix + translated[0]] + [unit.indent + line for line in translated[1:]]


def translate_markdown(source: str, translations: dict[str, str]) -> str:
    """``source`` with every message that ``translations`` holds replaced by its translation;
    the rest, and everything that is not a message, as it was."""
    lines, units = _units(source)
    return "\n".join(line for unit in units for line in _render(unit, lines, translations))


def catalog_path(root: Path, assignment: str, language: str) -> Path:
    return Path(root) / "locales" / language / "LC_MESSAGES" / "notebooks" / f"{assignment}.po"


def catalog_translations(path: Path) -> dict[str, str]:
    """msgid -> translation of a catalog's translated, not fuzzy messages ({} without one)."""
    if not Path(path).is_file():
        return {}
    from babel.messages.pofile import read_po

    with open(path, "rb") as handle:
        return {m.id: m.string for m in read_po(handle) if m.id and m.string and not m.fuzzy}


def translated_notebook(release: nbformat.NotebookNode, translations: dict[str, str],
                        language: str) -> nbformat.NotebookNode:
    """The release in ``language``: Markdown translated, a self-check command pointing at the
    language's folder, ``metadata.course.language`` set; every code cell as released."""
    nb = copy.deepcopy(release)
    folder = LANGUAGES[language]
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            text = translate_markdown(cell.source, translations)
            cell.source = text.replace(f"NB={ENGLISH_FOLDER}/", f"NB={folder}/")
    nb.metadata.setdefault("course", {})["language"] = language
    return nb


def translated_releases(release: nbformat.NotebookNode, root: Path, assignment: str) -> list:
    """The release in every language whose catalog for ``assignment`` has a translation."""
    out = []
    for language in LANGUAGES:
        translations = catalog_translations(catalog_path(root, assignment, language))
        if translations:
            out.append(translated_notebook(release, translations, language))
    return out


def write_translated_releases(root: Path, exercises_dir: Path, language: str, target: Path,
                              assignments: list[str]) -> None:
    """``target``/<assignment>/<notebook>.ipynb: each English release of ``exercises_dir`` in
    ``language`` (English where its catalog has no translation yet)."""
    target = Path(target)
    target.mkdir(parents=True, exist_ok=True)
    for stale in target.iterdir():
        if stale.is_dir() and stale.name not in assignments:
            shutil.rmtree(stale)
    for assignment in assignments:
        translations = catalog_translations(catalog_path(root, assignment, language))
        if (target / assignment).exists():
            shutil.rmtree(target / assignment)
        shutil.copytree(Path(exercises_dir) / assignment, target / assignment)
        for path in sorted((target / assignment).glob("*.ipynb")):
            release = nbformat.read(path, as_version=4)
            nbformat.write(translated_notebook(release, translations, language), path)
