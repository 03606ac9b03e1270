"""Every demo of the book either works in the static page (figures precomputed by
course/book_demo.py) or says, next to it, how to run its page live; and `make live`'s
JupyterLab really opens a page of the book as a notebook with a kernel behind it."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from notebook_tools import ROOT

pytestmark = pytest.mark.slow   # JupyterLab started as `make live` starts it

LIVE = ROOT / "book" / "_ext" / "live.py"


def _demo_cells(text: str) -> list[str]:
    cells = re.findall(r"```\{code-cell\}[^\n]*\n(.*?)```", text, flags=re.S)
    return [c for c in cells if "widgets.interactive(" in c or "frames(" in c]


def test_every_demo_works_in_the_page_or_says_how_to_run_it_live():
    demos = precomputed = 0
    for page in sorted((ROOT / "book").rglob("*.md")):
        text = page.read_text(encoding="utf-8")
        for cell in _demo_cells(text):
            demos += 1
            if "widgets.interactive(" in cell:
                before = text[:text.index(cell)][-600:]
                command = f"make live PAGE={page.relative_to(ROOT).as_posix()}"
                assert "Live in JupyterLab" in before and command in before, (page, cell[:80])
            else:
                precomputed += 1
    assert demos >= 19 and precomputed >= 5, (demos, precomputed)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_make_live_opens_a_book_page_as_a_notebook(tmp_path):
    port, token, page = _free_port(), "course-live-test", "book/ch04_ffn/activations.md"
    env = {**os.environ, "HOME": str(tmp_path), "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime")}
    server = subprocess.Popen(
        [sys.executable, str(LIVE), page, "--no-browser", f"--ServerApp.port={port}",
         "--ServerApp.ip=127.0.0.1", f"--IdentityProvider.token={token}"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/api/contents/{page}?type=notebook&content=1&token={token}"
    try:
        deadline, reply = time.monotonic() + 90, None
        while time.monotonic() < deadline and reply is None:
            assert server.poll() is None, server.stdout.read().decode()[-3000:]
            try:
                with urllib.request.urlopen(url, timeout=5) as response:
                    reply = json.loads(response.read())
            except OSError:
                time.sleep(0.5)
        assert reply is not None, "JupyterLab did not answer"
        code = [c for c in reply["content"]["cells"] if c["cell_type"] == "code"]
        assert reply["type"] == "notebook" and any("widgets.interactive(" in c["source"] for c in code)
        settings = ROOT / "_build" / "live-settings" / "@jupyterlab" / "docmanager-extension"
        viewers = json.loads((settings / "plugin.jupyterlab-settings").read_text())["defaultViewers"]
        assert viewers["markdown"] == "Jupytext Notebook"
    finally:
        server.terminate()
        server.wait(timeout=30)
    try:      # stopping `make live` stops JupyterLab: no server is left behind
        urllib.request.urlopen(url, timeout=5).close()
    except OSError:
        pass
    else:
        pytest.fail("JupyterLab still answers after `make live` was stopped")
