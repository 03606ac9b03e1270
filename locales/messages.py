"""The checks' messages as gettext templates (issue 30, item 4): one .pot per module group.

A message is a string in the checks' source that a learner may read: a string literal or an
f-string with at least a few words of text (docstrings are not messages). An f-string becomes
a template flagged ``python-brace-format`` whose placeholders are the source of its replaced
fields, so ``f"{label} returned {got!r}"`` is the msgid ``{label} returned {got!r}``; its
translation keeps every placeholder as written (course/i18n.py fills them from the English
message when it translates one). A literal that is test data rather than prose (an input
text, a case's description) is extracted too: its translation is the same text, or the
description in Chinese.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# catalog name -> the source files whose messages it holds
SOURCES = {
    "common": ["course/i18n.py", "course/checks/_core.py", "course/checks/_vocabulary.py",
               "course/checks/_recorders.py", "autograder/remote.py", "autograder/selfcheck.py"],
    "feedback": ["autograder/feedback_static/page.html.j2"],
    **{f"ch0{n}": [f"course/checks/ch0{n}.py"] for n in range(1, 8)},
}
_WORDS_PLAIN, _WORDS_TEMPLATE = 3, 2        # fewer words of text: a name or a format, not prose
_ALWAYS = {"Likely mistake: "}              # the hint's label is a message however short


def _placeholder(value: ast.FormattedValue) -> str:
    conversion = {-1: "", 115: "!s", 114: "!r", 97: "!a"}[value.conversion]
    spec = ""
    if value.format_spec is not None:
        spec = ":" + "".join(part.value if isinstance(part, ast.Constant) else _placeholder(part)
                             for part in value.format_spec.values)
    return "{" + ast.unparse(value.value) + conversion + spec + "}"


def _words(text: str) -> int:
    return sum(1 for word in text.split() if any(ch.isalpha() for ch in word))


def _not_messages(tree: ast.AST) -> set[int]:
    """Docstrings, and the parts of f-strings (only the whole f-string is a message)."""
    skip: set[int] = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)):
            skip.add(id(body[0].value))
        if isinstance(node, ast.JoinedStr):
            for value in ast.walk(node):
                if value is not node:
                    skip.add(id(value))
    return skip


_TEMPLATE_TEXT = re.compile(r"""\bt\("([^"]+)"\)""")     # t("...") in a Jinja template


def messages_of(path: Path) -> list[tuple[int, str, bool]]:
    """(line, msgid, is a template) of each message in the source file ``path``: a Python
    module, or a Jinja template whose messages are its t("...") calls."""
    if path.suffix == ".j2":
        text = path.read_text(encoding="utf-8")
        return [(text.count("\n", 0, m.start()) + 1, m.group(1), False) for m in _TEMPLATE_TEXT.finditer(text)]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip = _not_messages(tree)
    found = []
    for node in ast.walk(tree):
        # composed("{what}: {difference}", ...) and translate("passed"): messages however few their
        # words (course/i18n.py); a composed one is a template
        called = getattr(node.func, "id", getattr(node.func, "attr", "")) if isinstance(node, ast.Call) else ""
        if (called in ("composed", "translate") and node.args and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)):
            found.append((node.lineno, node.args[0].value, called == "composed"))
            skip.add(id(node.args[0]))
        if id(node) in skip:
            continue
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if _words(node.value) >= _WORDS_PLAIN or node.value in _ALWAYS:
                found.append((node.lineno, node.value, False))
        elif isinstance(node, ast.JoinedStr):
            text = "".join(_placeholder(v) if isinstance(v, ast.FormattedValue)
                           else v.value.replace("{", "{{").replace("}", "}}") for v in node.values)
            literal = "".join(v.value for v in node.values if isinstance(v, ast.Constant))
            fields = sum(isinstance(v, ast.FormattedValue) for v in node.values)
            # prose between fields: words, or a word set off by spaces ("{a} returned {b}"), or a
            # colon between two fields ("{what}: {difference}")
            if (_words(literal) >= _WORDS_TEMPLATE or (_words(literal) and " " in literal)
                    or (fields >= 2 and ": " in literal)):
                found.append((node.lineno, text, any(isinstance(v, ast.FormattedValue) for v in node.values)))
    return sorted(found)


def write_templates(folder: Path) -> list[Path]:
    """<folder>/<catalog>.pot for every catalog of :data:`SOURCES`."""
    from babel.messages.catalog import Catalog
    from babel.messages.pofile import write_po

    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, sources in SOURCES.items():
        catalog = Catalog(project="Transformers by Building Them", copyright_holder="the course authors")
        for source in sources:
            for line, text, template in messages_of(ROOT / source):
                flags = ["python-brace-format"] if template else []
                # the file, not the line: a catalog does not change when code moves
                known = catalog.get(text)
                if known is None:
                    # Babel drops the flag where its own parser fails ({'s' if n != 1 else ''}): set after
                    catalog.add(text, auto_comments=[source]).flags.update(flags)
                elif source not in known.auto_comments:
                    known.auto_comments.append(source)
        path = folder / f"{name}.pot"
        with open(path, "wb") as handle:
            write_po(handle, catalog, width=0, omit_header=False)
        written.append(path)
    return written
