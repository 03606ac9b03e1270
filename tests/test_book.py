"""The book builds with warnings as errors, and chapter 1 carries its figures and widgets."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from notebook_tools import ROOT

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def html(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("book")
    jb = Path(sys.executable).with_name("jupyter-book")
    done = subprocess.run([str(jb if jb.exists() else shutil.which("jupyter-book")), "build", str(ROOT), "-W",
                           "--keep-going", "--path-output", str(out)],
                          capture_output=True, text=True, timeout=1500)
    assert done.returncode == 0, (done.stdout + done.stderr)[-5000:]
    return out / "_build" / "html"


@pytest.mark.parametrize("page,figures,widgets", [("tokenization", 1, 1), ("embeddings", 3, 1), ("patches", 1, 1)])
def test_chapter_1_pages_have_figures_and_widgets(html, page, figures, widgets):
    text = (html / "book" / "ch01_embeddings" / f"{page}.html").read_text(encoding="utf-8")
    images = re.findall(r"<img [^>]*src=\"([^\"]+\.png)\"", text)
    assert len(images) >= figures, images
    for src in images:
        assert (html / "book" / "ch01_embeddings" / src).resolve().is_file(), src
    assert text.count("application/vnd.jupyter.widget-view+json") >= widgets


def test_every_page_of_the_toc_is_rendered(html):
    toc = (ROOT / "_toc.yml").read_text()
    for name in re.findall(r"file:\s*(\S+)", toc) + re.findall(r"root:\s*(\S+)", toc):
        assert (html / f"{name}.html").is_file(), name
    assert "Traceback" not in (html / "book" / "ch01_embeddings" / "embeddings.html").read_text()
