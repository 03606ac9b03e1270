"""The Chinese edition's catalogs and build, from the English book (issue 30).

    python locales/catalogs.py update          # .pot from the book, then the .po kept in step
    python locales/catalogs.py build <_build>  # the Chinese book into <_build>/html/zh

`update` extracts the book's messages with Sphinx's gettext builder (one .pot per page,
its pages not executed: code cells and outputs never become messages) into
_build/gettext, then `sphinx-intl update` merges them into locales/zh_CN/LC_MESSAGES/:
a changed English paragraph turns its translation fuzzy, a new one comes untranslated.

The exercise notebooks' Markdown cells are messages too (`update` writes
_build/gettext/notebooks/<chapter>.pot from solutions/<chapter>/*.ipynb, cut as
autograder/translation.py cuts them; their catalogs are LC_MESSAGES/notebooks/<chapter>.po);
`make exercises` writes the Chinese release of each notebook from them into exercises-zh/.

`build` runs the same Sphinx configuration as `jupyter-book build` with `language =
"zh_CN"`, reading the English build's executed notebooks (<_build>/.jupyter_cache), so
no page is executed twice.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOCALES = ROOT / "locales"
LANGUAGE = "zh_CN"
SUBFOLDER = "zh"          # the Chinese book under _build/html/zh


def _build(output: Path, builder: str, overrides: dict, doctrees: Path, fresh: bool = False) -> int:
    """One Sphinx build of the book, configured from _config.yml as jupyter-book does."""
    from jupyter_book.sphinx import build_sphinx

    result = build_sphinx(
        ROOT, output, use_external_toc=True, noconfig=True, path_config=str(ROOT / "_config.yml"),
        confoverrides={"external_toc_path": (ROOT / "_toc.yml").as_posix(),
                       "latex_individualpages": False, **overrides},
        doctreedir=doctrees, builder=builder, warningiserror=True, keep_going=True, freshenv=fresh)
    return 1 if isinstance(result, Exception) else int(result)


def extract(build: Path) -> Path:
    """The book's messages as .pot files under <build>/gettext (pages not executed)."""
    pot = build / "gettext"
    # read afresh (seconds, nothing executed): Sphinx does not see changes to the extensions
    status = _build(pot, "gettext", {"nb_execution_mode": "off"}, build / ".doctrees-gettext", fresh=True)
    if status:
        sys.exit(f"extracting the book's messages failed (status {status}); see Sphinx's output above")
    extract_notebooks(pot / "notebooks")
    from messages import write_templates      # the checks' messages (locales/messages.py)

    write_templates(pot / "messages")
    return pot


def extract_notebooks(folder: Path) -> None:
    """One .pot per chapter: the messages of its solution notebooks' Markdown cells, each with
    the grade_id (or number) of its cell as a comment for the translator."""
    import nbformat
    from babel.messages.catalog import Catalog
    from babel.messages.pofile import write_po

    from autograder.translation import markdown_messages

    folder.mkdir(parents=True, exist_ok=True)
    for chapter in sorted(p for p in (ROOT / "solutions").iterdir() if any(p.glob("*.ipynb"))):
        catalog = Catalog(project="Transformers by Building Them", copyright_holder="the course authors")
        for path in sorted(chapter.glob("*.ipynb")):
            for number, cell in enumerate(nbformat.read(path, as_version=4).cells):
                if cell.cell_type != "markdown":
                    continue
                where = f"{path.stem}: {cell.metadata.get('nbgrader', {}).get('grade_id') or f'cell {number}'}"
                for message in markdown_messages(cell.source):
                    known = catalog.get(message)
                    if known is None:
                        catalog.add(message, auto_comments=[where])
                    elif where not in known.auto_comments:
                        known.auto_comments.append(where)
        with open(folder / f"{chapter.name}.pot", "wb") as handle:
            write_po(handle, catalog, width=0, omit_header=False)


def update(build: Path) -> None:
    """Extract, then merge into locales/zh_CN/LC_MESSAGES (new: untranslated, changed: fuzzy)."""
    pot = extract(build)
    sphinx_intl = Path(sys.executable).with_name("sphinx-intl")
    subprocess.run([str(sphinx_intl), "update", "-p", str(pot), "-d", str(LOCALES), "-l", LANGUAGE,
                    "-w", "0"], check=True)
    for path in sorted((LOCALES / LANGUAGE / "LC_MESSAGES").rglob("*.po")):
        _drop_untranslated_obsolete(path)


def _drop_untranslated_obsolete(path: Path) -> None:
    """sphinx-intl keeps a message the English no longer has (#~): worth it for a translation
    (it helps translate the changed text), noise for an empty one."""
    from babel.messages.pofile import read_po, write_po

    with open(path, "rb") as handle:
        catalog = read_po(handle)
    empty = [key for key, message in catalog.obsolete.items() if not message.string]
    if not empty:
        return
    for key in empty:
        del catalog.obsolete[key]
    with open(path, "wb") as handle:
        write_po(handle, catalog, width=0)


def build_zh(build: Path) -> int:
    """The Chinese book into <build>/html/zh, from the English build's executed pages."""
    overrides = {"language": LANGUAGE, "nb_execution_cache_path": str(build / ".jupyter_cache"),
                 # myst-nb's labels of folded cells are settings, not messages
                 "nb_code_prompt_show": "展开单元格", "nb_code_prompt_hide": "收起单元格"}
    status = _build(build / "html" / SUBFOLDER, "html", overrides, build / ".doctrees-zh")
    # book/_ext/offline_book.py stages its served files next to the output folder, which
    # here is inside the English book: the Chinese book has its own copy in zh/_static
    shutil.rmtree(build / "html" / ".offline-static", ignore_errors=True)
    return status


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("update", "build"):
        print(__doc__)
        return 2
    build = Path(argv[1]).resolve()
    if argv[0] == "update":
        update(build)
        return 0
    return build_zh(build)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
