"""Lines of code and printed output in the book that are wider than its text column.

A page of the book shows code cells, their printed output and the code blocks of its prose
in ``<pre>`` blocks; a line longer than the column scrolls sideways and, for printed
results, reads as cut mid-word. Two ways to look for such lines:

* in the built book (what the learner sees)::

      .venv/bin/python tests/book_lines.py _build/html

* on one page, without building the book: the page is converted with jupytext, executed
  with nbclient in its own folder (as jupyter-book does), and the sources of its code
  cells, the code blocks of its prose and the outputs that the book would print are
  checked (seconds instead of the whole book's minutes)::

      .venv/bin/python tests/book_lines.py --page book/ch01_embeddings/tokenization.md
      .venv/bin/python tests/book_lines.py --page PAGE.md --save /tmp/page.ipynb
      .venv/bin/python tests/book_lines.py --executed /tmp/page.ipynb   # no new run
      .venv/bin/python tests/book_lines.py --static book/*/*.md          # sources only

Both also report stray reprs: an output such as ``<torch._C.Generator at 0x...>`` that a
cell shows only because its last line returns an object. Exit status 1 when anything is
found.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import textwrap
from html.parser import HTMLParser
from pathlib import Path

WIDTH = 80

_VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta",
         "param", "source", "track", "wbr"}
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# What a cell shows when its last line returns an object nobody meant to print.
_STRAY = re.compile(r"<[\w.]+(?: object)? at 0x[0-9a-f]+>|<Figure size [^>]*>|^Text\(|"
                    r"^\[<matplotlib\.|^<matplotlib\.")


def _too_wide(text: str, width: int) -> list[str]:
    lines = []
    for line in text.splitlines():
        line = line.expandtabs(8).rstrip()
        if len(line) > width:
            lines.append(line)
    return lines


class _PreBlocks(HTMLParser):
    """The text of every ``<pre>``, with the kind of block that holds it."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)     # entities are unescaped
        self.open: list[tuple[str, set[str]]] = []
        self.blocks: list[tuple[str, str]] = []
        self._text: list[str] | None = None

    def _kind(self) -> str:
        classes = set().union(*(c for _, c in self.open))
        if "cell_input" in classes:
            return "code"
        if "cell_output" in classes:
            return "output"
        return "literal"

    def handle_starttag(self, tag, attrs):
        if tag == "br" and self._text is not None:
            self._text.append("\n")
        if tag in _VOID:
            return
        self.open.append((tag, set((dict(attrs).get("class") or "").split())))
        if tag == "pre" and self._text is None:
            self._text = []

    def handle_endtag(self, tag):
        if all(t != tag for t, _ in self.open):
            return                                      # a stray end tag
        while self.open:
            open_tag, _ = self.open[-1]
            if open_tag == "pre" and sum(t == "pre" for t, _ in self.open) == 1:
                self.blocks.append((self._kind(), "".join(self._text or [])))
                self._text = None
            self.open.pop()
            if open_tag == tag:
                break

    def handle_data(self, data):                        # tags inside <pre> are dropped
        if self._text is not None:
            self._text.append(data)


def pre_blocks(page: Path) -> list[tuple[str, str]]:
    """(kind, text) of every ``<pre>`` block of one HTML page: kind is "code" (a code
    cell's source), "output" (what a cell printed or returned) or "literal" (a code
    block in the prose)."""
    parser = _PreBlocks()
    parser.feed(Path(page).read_text(encoding="utf-8"))
    parser.close()
    return parser.blocks


def _pages(html_folder: Path):
    for page in sorted(html_folder.rglob("*.html")):
        relative = page.relative_to(html_folder)
        if relative.parts[0].startswith("_") or relative.name in {"genindex.html",
                                                                   "search.html"}:
            continue                                    # Sphinx's own pages, sources
        yield relative.with_suffix("").as_posix(), page


def wide_lines(html_folder, width: int = WIDTH) -> list[tuple[str, str, str]]:
    """(page, block_kind, line) for every line over ``width`` characters in a built book.

    ``block_kind`` is "code", "output" or "literal" (see ``pre_blocks``); pages are named
    by their path under ``html_folder`` without ".html", e.g. "book/ch01_embeddings/
    tokenization".
    """
    found = []
    for name, page in _pages(Path(html_folder)):
        for kind, text in pre_blocks(page):
            found += [(name, kind, line) for line in _too_wide(text, width)]
    return found


def stray_reprs(html_folder) -> list[tuple[str, str]]:
    """(page, output) for every output that is only the repr of a returned object."""
    found = []
    for name, page in _pages(Path(html_folder)):
        for kind, text in pre_blocks(page):
            if kind == "output" and _STRAY.search(text.strip()):
                found.append((name, text.strip()))
    return found


# --- One page, from its source -----------------------------------------------------------

# The order in which myst-nb picks the one representation of an output that the page shows.
_PRIORITY = ["application/vnd.jupyter.widget-view+json", "application/javascript",
             "text/html", "image/svg+xml", "image/png", "image/jpeg", "text/markdown",
             "text/latex", "text/plain"]
_FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})(.*)$")


def _literal_blocks(markdown: str) -> list[str]:
    """The code blocks of a markdown cell, dedented; a directive (```{note}) is not one,
    but a code block inside it is."""
    blocks, fences, current = [], [], None
    for line in markdown.splitlines():
        match = _FENCE.match(line)
        closes = bool(match and fences and match.group(2).startswith(fences[-1])
                      and not match.group(3).strip())
        if current is not None:
            if closes:
                blocks.append(textwrap.dedent("\n".join(current)))
                current = None
                fences.pop()
            else:
                current.append(line)
        elif closes:
            fences.pop()                                # the end of a directive
        elif match:
            fences.append(match.group(2))
            if not match.group(3).strip().startswith("{"):
                current = []
    return blocks


def _shown_text(output) -> str:
    """The text the page prints for one output ("" for figures, HTML and widgets)."""
    kind = output.get("output_type")
    if kind == "stream":
        return _ANSI.sub("", output.get("text", ""))
    if kind == "error":
        return _ANSI.sub("", "\n".join(output.get("traceback", [])))
    data = output.get("data", {})
    for mime in _PRIORITY:
        if mime in data:
            return data[mime] if mime == "text/plain" else ""
    return ""


def _shown_outputs(cell):
    tags = cell.get("metadata", {}).get("tags", [])
    if "remove-output" in tags or "remove-cell" in tags:
        return
    for output in cell.get("outputs", []):
        if output.get("output_type") == "stream" and output.get("name") == "stderr" \
                and "remove-stderr" in tags:
            continue
        yield output


def notebook_wide_lines(nb, width: int = WIDTH) -> list[tuple[int, str, str]]:
    """(cell index, block_kind, line) for every wide line of a page read by jupytext
    (outputs only where it was executed)."""
    found = []
    for index, cell in enumerate(nb.cells):
        if cell.cell_type == "markdown":
            for block in _literal_blocks(cell.source):
                found += [(index, "literal", line) for line in _too_wide(block, width)]
        elif cell.cell_type == "code":
            tags = cell.get("metadata", {}).get("tags", [])
            if "remove-input" not in tags and "remove-cell" not in tags:
                found += [(index, "code", line) for line in _too_wide(cell.source, width)]
            for output in _shown_outputs(cell):
                found += [(index, "output", line)
                          for line in _too_wide(_shown_text(output), width)]
    return found


def notebook_stray_reprs(nb) -> list[tuple[int, str]]:
    """(cell index, output) for every output that is only the repr of a returned object."""
    return [(index, _shown_text(output).strip())
            for index, cell in enumerate(nb.cells) if cell.cell_type == "code"
            for output in _shown_outputs(cell)
            if output.get("output_type") == "execute_result"
            and _STRAY.search(_shown_text(output).strip())]


def read_page(page):
    """A book page as a notebook (MyST: only ``{code-cell}`` blocks are code)."""
    import jupytext

    return jupytext.read(page, fmt="md:myst")


def execute_page(page, timeout: int = 600):
    """The page executed in its own folder, as the book does (on the CPU unless
    COURSE_DEVICE says otherwise)."""
    from nbclient import NotebookClient

    page = Path(page).resolve()
    nb = read_page(page)
    if any(cell.cell_type == "code" for cell in nb.cells):
        os.environ.setdefault("COURSE_DEVICE", "cpu")
        NotebookClient(nb, timeout=timeout, kernel_name="python3",
                       resources={"metadata": {"path": str(page.parent)}}).execute()
    return nb


def _summary(name, rows, strays, width) -> str:
    kinds = [kind for _, kind, _ in rows]
    counts = ", ".join(f"{kinds.count(k)} {k}" for k in ("code", "output", "literal")
                       if k in kinds)
    return (f"# {name}: {len(rows)} lines over {width} characters"
            + (f" ({counts})" if counts else "")
            + (f", {len(strays)} stray reprs" if strays else ""))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("html_folder", nargs="?", help="a built book's HTML folder")
    parser.add_argument("--page", help="a book page (MyST .md) to execute and check")
    parser.add_argument("--save", help="with --page: write the executed notebook here")
    parser.add_argument("--executed", help="an executed notebook to check (no new run)")
    parser.add_argument("--static", nargs="+", metavar="PAGE",
                        help="pages whose code and code blocks to check, without running")
    parser.add_argument("--width", type=int, default=WIDTH)
    args = parser.parse_args(argv)

    if args.html_folder:
        rows, strays = wide_lines(args.html_folder, args.width), stray_reprs(args.html_folder)
        for page, kind, line in rows:
            print(f"{page} [{kind}, {len(line)}] {line}")
        for page, text in strays:
            print(f"{page} [stray repr] {text}")
        for page in sorted({p for p, _, _ in rows} | {p for p, _ in strays}):
            print(_summary(page, [r for r in rows if r[0] == page],
                           [s for s in strays if s[0] == page], args.width))
        print(f"# {len(rows)} lines over {args.width} characters, {len(strays)} stray reprs")
        return 1 if rows or strays else 0

    import nbformat

    if args.static:
        notebooks = [(page, read_page(page)) for page in args.static]
    elif args.page:
        nb = execute_page(args.page)
        if args.save:
            nbformat.write(nb, args.save)
        notebooks = [(args.page, nb)]
    elif args.executed:
        notebooks = [(args.executed, nbformat.read(args.executed, as_version=4))]
    else:
        parser.error("give a built HTML folder, --page, --executed or --static")
    found = False
    for name, nb in notebooks:
        rows, strays = notebook_wide_lines(nb, args.width), notebook_stray_reprs(nb)
        for index, kind, line in rows:
            print(f"{name} cell {index} [{kind}, {len(line)}] {line}")
        for index, text in strays:
            print(f"{name} cell {index} [stray repr] {text}")
        print(_summary(name, rows, strays, args.width))
        found = found or bool(rows or strays)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
