"""The book's pages that the exercise notebooks link to, shipped beside them as notebooks.

A learner opens the exercises with ``jupyter lab exercises/`` (README): JupyterLab serves
nothing outside that folder, so a link to ``../../book/page.md`` is a 404 there, and a MyST
page would open as Markdown source anyway. Each linked page is therefore written into
``exercises/`` as ``book-<path>.ipynb`` (``book/ch06_inference/sampling.md`` becomes
``book-ch06_inference-sampling.ipynb``), read by jupytext and with MyST's directives turned
into Markdown that JupyterLab renders; its cells run in the learner's kernel. The notebooks
link to it as ``../book-<path>.ipynb``; ``make exercises`` writes it from the book's source.
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat

PREFIX = "book-"
LINK = re.compile(r"\]\(\.\./(" + re.escape(PREFIX) + r"[^)#\s]+)\.ipynb(?:#[^)]*)?\)")
_FENCE = re.compile(r"^(?P<fence>:{3,}|`{3,})\{(?P<name>[\w-]+)\}[ \t]*(?P<title>.*)$")
_ROLE = re.compile(r"\{[\w:-]+\}`([^`<]*?)\s*(?:<[^>]*>)?`")
_TITLES = {"note": "Note", "warning": "Warning", "important": "Important", "tip": "Tip", "dropdown": "Details"}


def shipped_name(page: Path, book: Path) -> str:
    """``book/ch06_inference/sampling.md`` -> ``book-ch06_inference-sampling``."""
    return PREFIX + "-".join(page.relative_to(book).with_suffix("").parts)


def linked_pages(solutions_dir: Path) -> list[str]:
    """The shipped names that the solution notebooks' Markdown cells link to."""
    names = set()
    for path in sorted(Path(solutions_dir).glob("*/*.ipynb")):
        for cell in nbformat.read(path, as_version=4).cells:
            if cell.cell_type == "markdown":
                names.update(LINK.findall(cell.source))
    return sorted(names)


def write_linked_pages(solutions_dir: Path, exercises_dir: Path) -> list[str]:
    """Write each linked page into ``exercises_dir``; a link to no page of the book is an error."""
    book = Path(solutions_dir).parent / "book"
    pages = {shipped_name(p, book): p for p in sorted(book.rglob("*.md"))
             if not any(part.startswith(("_", ".")) for part in p.relative_to(book).parts)}
    written = []
    for name in linked_pages(solutions_dir):
        if name not in pages:
            raise FileNotFoundError(f"a notebook links to ../{name}.ipynb, but no page of book/ is shipped under "
                                    f"that name (book/<folder>/<page>.md ships as {PREFIX}<folder>-<page>.ipynb)")
        target = Path(exercises_dir) / f"{name}.ipynb"
        target.write_text(nbformat.writes(page_notebook(pages[name], book.parent)) + "\n", encoding="utf-8")
        written.append(target.name)
    return written


def page_notebook(page: Path, root: Path) -> nbformat.NotebookNode:
    """The page as a notebook: its Markdown in JupyterLab's dialect, its code cells unrun."""
    import jupytext

    source = jupytext.read(page)
    title = next((line[2:].strip() for line in source.cells[0].source.splitlines() if line.startswith("# ")), page.stem)
    note = (f"*The book's page **{title}**, shipped beside the exercises as a notebook: run its cells to see "
            f"their output. Written from `{page.relative_to(root).as_posix()}` by `make exercises`.*")
    cells = [nbformat.v4.new_markdown_cell(note)]
    for cell in source.cells:
        if cell.cell_type == "markdown":
            cells.append(nbformat.v4.new_markdown_cell(plain_markdown(cell.source)))
        elif cell.cell_type == "code":
            cells.append(nbformat.v4.new_code_cell(cell.source))
    for number, cell in enumerate(cells):        # fixed ids: the generated tree is compared byte for byte
        cell.id = f"page-{number}"
    return nbformat.v4.new_notebook(cells=cells, metadata={"kernelspec": source.metadata.get("kernelspec", {})})


def plain_markdown(text: str) -> str:
    """MyST's directives and roles as Markdown that JupyterLab renders: a dropdown becomes a
    ``<details>`` disclosure, an admonition a quote under its bold title, a role its text."""
    out: list[str] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        found = _FENCE.match(lines[i])
        if not found:
            out.append(_ROLE.sub(r"\1", lines[i]))
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == found["fence"]), len(lines))
        body = [line for line in lines[i + 1:end] if not re.match(r"^:[\w-]+:", line)]
        body = plain_markdown("\n".join(body)).splitlines()
        name, title = found["name"], found["title"].strip() or _TITLES.get(found["name"], found["name"].title())
        if name == "dropdown":
            out += [f"<details><summary>{title}</summary>", "", *body, "", "</details>"]
        else:
            out += [f"> **{title}**", ">", *[f"> {line}".rstrip() for line in body]]
        i = end + 1
    return "\n".join(out)
