"""Run a page of the book live: JupyterLab on this machine, the page opened as a notebook
(jupytext reads the book's MyST pages as notebooks), so that its widgets have a kernel.

    make live PAGE=book/ch03_attention/efficient-attention.md
    python book/_ext/live.py book/ch03_attention/efficient-attention.md [JupyterLab options]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SETTINGS = ROOT / "_build" / "live-settings"
# JupyterLab opens .md files in its text editor unless told that a MyST page is a notebook
VIEWERS = {"defaultViewers": {"markdown": "Jupytext Notebook", "myst": "Jupytext Notebook"}}


def main(argv: list[str]) -> int:
    page = Path(argv[0]) if argv else Path("book/intro.md")
    extra = argv[1:]        # passed to JupyterLab (the tests: --no-browser, a port, a token)
    if not (ROOT / page).is_file():
        print(f"no page {page}: give a path such as book/ch03_attention/efficient-attention.md")
        return 2
    plugin = SETTINGS / "@jupyterlab" / "docmanager-extension" / "plugin.jupyterlab-settings"
    plugin.parent.mkdir(parents=True, exist_ok=True)
    plugin.write_text(json.dumps(VIEWERS, indent=2))
    # its kernels draw figures as the book's build does (book/_ext/kernel_figures.py)
    env = {**os.environ, "JUPYTERLAB_SETTINGS_DIR": str(SETTINGS),
           "PYTHONSTARTUP": str(Path(__file__).with_name("kernel_figures.py"))}
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        extra = ["--allow-root", *extra]     # containers and CI run as root
    command = [sys.executable, "-m", "jupyterlab", f"--ServerApp.root_dir={ROOT}", *extra, str(page)]
    print("Starting JupyterLab on", page, "(Ctrl-C twice to stop)")
    # the page's own cells read files relative to its folder, as when the book is built
    if os.name == "posix":    # become JupyterLab: a signal to this process (Ctrl-C, terminate) reaches it
        os.chdir(ROOT)
        os.execve(sys.executable, command, env)
    return subprocess.call(command, env=env, cwd=ROOT)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
