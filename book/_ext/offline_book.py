"""The book reads offline: MathJax, RequireJS and the widget manager (with its fonts) are
served by the build itself, from the pinned npm packages of package.json (`make vendor`
installs them into node_modules/), never from a CDN.

Also: MathJax is on every page (formulas in the sidebar appear on pages without maths of
their own), and sphinx-thebe's scripts are left out (the book's live route is `make live`,
and those scripts declared `THEBE_JS_URL` twice and would fetch thebe from unpkg).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from docutils import nodes
from sphinx.application import Sphinx
from sphinx.errors import ExtensionError

ROOT = Path(__file__).resolve().parents[2]
NODE_MODULES = ROOT / "node_modules"

# package folder in node_modules -> (folder under _static/vendor, files or folders to serve)
VENDORED = {
    "mathjax/es5": ("mathjax", ["tex-chtml.js", "input", "output/chtml/fonts/woff-v2", "ui", "a11y", "sre"]),
    "requirejs": ("requirejs", ["require.js"]),
    # embed-amd.js finds its font files (Font Awesome) next to itself
    "@jupyter-widgets/html-manager/dist": ("html-manager", ["embed-amd.js", "*.woff2", "*.woff", "*.ttf",
                                                             "*.eot", "*.svg"]),
}
MATHJAX = "vendor/mathjax/tex-chtml.js"
WIDGET_SCRIPTS = {
    "vendor/requirejs/require.js": {},
    "vendor/offline-widgets.js": {},
    # a widget module that is not built in would be looked up here, in the build, not on a CDN
    "vendor/html-manager/embed-amd.js": {"data-jupyter-widgets-cdn": "_static/vendor/widget-modules/"},
}
THEBE_MARKERS = ("sphinx-thebe", "THEBE_JS_URL", "unpkg.com/thebe")


def _stage(outdir: Path) -> Path:
    """Copy the served files into a folder that Sphinx then copies into _static/."""
    missing = [name for name in VENDORED if not (NODE_MODULES / name).is_dir()]
    if missing:
        raise ExtensionError(
            "the book serves MathJax and the widget manager itself, from npm packages that are "
            f"not installed ({', '.join(missing)} missing in {NODE_MODULES}): run `make vendor` "
            "(it needs Node.js and npm)")
    stage = outdir.parent / ".offline-static"
    shutil.rmtree(stage, ignore_errors=True)
    for package, (target, patterns) in VENDORED.items():
        source = NODE_MODULES / package
        for pattern in patterns:
            for path in sorted(source.glob(pattern)):
                destination = stage / "vendor" / target / path.relative_to(source)
                destination.parent.mkdir(parents=True, exist_ok=True)
                if path.is_dir():
                    shutil.copytree(path, destination)
                else:
                    shutil.copy2(path, destination)
    shutil.copy2(Path(__file__).with_name("offline-widgets.js"), stage / "vendor")
    return stage


def _configure(app: Sphinx, config) -> None:
    stage = _stage(Path(app.outdir))
    config.html_static_path = list(config.html_static_path) + [str(stage)]
    config.mathjax_path = MATHJAX
    # without an icon of its own, every page asks the server for /favicon.ico (a 404)
    if not config.html_favicon:
        config.html_favicon = str(Path(__file__).with_name("favicon.svg"))
    config.nb_ipywidgets_js = WIDGET_SCRIPTS
    # pydata's theme logs an error on every first visit unless a colour mode is named
    config.html_context = {**config.html_context, "default_mode": "auto"}


def _without_thebe(app: Sphinx, pagename: str, templatename: str, context: dict, doctree) -> None:
    scripts = context.get("script_files", [])
    kept = []
    for script in scripts:
        text = " ".join(str(part) for part in (getattr(script, "filename", script),
                                               getattr(script, "attributes", {}).get("body", "")))
        if not any(marker in text for marker in THEBE_MARKERS):
            kept.append(script)
    context["script_files"] = kept


def _delimited(title: nodes.Element) -> str:
    """A heading's text with its formulas as \\(...\\), which MathJax renders."""
    parts = []
    for node in title.children:
        if node.tagname == "math":
            parts.append(f"\\({node.astext()}\\)")
        else:
            parts.append(node.astext())
    return "".join(parts)


def _toc_with_maths(app: Sphinx, doctree: nodes.document) -> None:
    """Sphinx writes a heading into the tables of contents (the sidebars) as its plain text,
    so a formula appeared there as raw LaTeX; write it with delimiters instead."""
    by_text = {}
    for title in doctree.findall(nodes.title):
        if any(child.tagname == "math" for child in title.children):
            by_text[title.astext()] = _delimited(title)
    toc = app.env.tocs.get(app.env.docname)
    if not by_text or toc is None:
        return
    for reference in toc.findall(nodes.reference):
        if reference.astext() in by_text:
            reference.children = [nodes.Text(by_text[reference.astext()])]


def setup(app: Sphinx) -> dict:
    app.connect("config-inited", _configure)
    app.connect("html-page-context", _without_thebe)
    app.connect("doctree-read", _toc_with_maths, priority=900)
    app.set_html_assets_policy("always")
    return {"parallel_read_safe": True, "parallel_write_safe": True}
