"""exercises/ is exactly what `make exercises` generates from solutions/ (no hand edits)."""

from __future__ import annotations

import json

from autograder.generate import generate_exercises
from notebook_tools import ROOT


def _tree(folder):
    return {p.relative_to(folder).as_posix(): p for p in sorted(folder.rglob("*")) if p.is_file()}


def test_exercises_match_a_fresh_generation(tmp_path, monkeypatch):
    """Generated with no program on PATH (no bubblewrap): generating runs no student code."""
    monkeypatch.setenv("PATH", str(tmp_path / "no-programs"))
    generate_exercises(ROOT / "solutions", tmp_path / "exercises")
    committed, fresh = _tree(ROOT / "exercises"), _tree(tmp_path / "exercises")
    assert sorted(committed) == sorted(fresh), "run `make exercises` and commit exercises/"
    for name, path in fresh.items():
        if name.endswith(".ipynb"):
            assert json.loads(committed[name].read_text()) == json.loads(path.read_text()), \
                f"exercises/{name} differs from the generated version: run `make exercises`"
        else:
            assert committed[name].read_bytes() == path.read_bytes(), name


def test_every_solution_has_hidden_tests_and_stubs_in_its_exercise():
    for folder in sorted((ROOT / "solutions").iterdir()):
        for nb_path in folder.glob("*.ipynb"):
            source = nb_path.read_text()
            released = (ROOT / "exercises" / folder.name / nb_path.name).read_text()
            assert "BEGIN HIDDEN TESTS" in source and "BEGIN HIDDEN TESTS" not in released
            assert "BEGIN SOLUTION" in source and "BEGIN SOLUTION" not in released
            assert "raise NotImplementedError()" in released
