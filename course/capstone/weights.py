"""Trained capstone models as files, so they can be evaluated again outside the notebook.

A checkpoint holds the task, the profile (and whether it was a dry run), the ``state_dict``
and the student's code: the source of the notebook's answer cells, read from the notebook
file on disk (the one being graded). ``course.capstone.evaluate`` runs that code in a fresh
process, rebuilds the model with the task's factory function, loads the weights and scores
them with the course's metrics.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

FACTORIES = {"lm": "build_lm", "g2p": "build_g2p", "cls": "build_classifier"}


def answer_sources(folder: Path) -> list[str]:
    """Sources of the set-up cell and the answer cells of the (single) notebook in ``folder``."""
    notebooks = sorted(p for p in Path(folder).glob("*.ipynb") if not p.name.startswith("."))
    sources = []
    for path in notebooks[:1]:      # plain JSON: nbformat costs seconds to import in the kernel
        for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
            meta = cell.get("metadata", {}).get("nbgrader", {})
            if meta.get("solution") or meta.get("grade_id") == "setup":
                source = cell.get("source", "")
                sources.append(source if isinstance(source, str) else "".join(source))
    return sources


def save_checkpoint(model: torch.nn.Module, task: str, profile: str, path: Path,
                    folder: Path | None = None, dry_run: bool = False) -> Path:
    """Write ``{task, profile, dry_run, state_dict, sources}`` to ``path``; returns it.
    ``dry_run``: scored in a dry run of ``profile`` (``course.capstone.profiles.dry_run``),
    so that a second scoring uses the same evaluation items."""
    if task not in FACTORIES:
        raise ValueError(f"task must be one of {', '.join(FACTORIES)}, not {task!r}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    torch.save({"task": task, "profile": profile, "dry_run": bool(dry_run), "state_dict": state,
                "sources": answer_sources(folder or Path.cwd())}, path)
    return path


def load_checkpoint(path: Path) -> dict:
    return torch.load(Path(path), map_location="cpu", weights_only=True)


def load_namespace(checkpoint: dict) -> dict:
    """Run the saved set-up and answer code in a fresh namespace; return the namespace."""
    namespace: dict = {"__name__": "course_capstone_checkpoint"}
    for source in checkpoint["sources"]:
        exec(compile(source, "<saved cell>", "exec"), namespace)
    return namespace


def rebuild(checkpoint: dict, vocab_sizes: dict[str, int], namespace: dict | None = None) -> torch.nn.Module:
    """Rebuild the model from the saved code with the task's factory, and load its weights."""
    from .profiles import PROFILES

    namespace = namespace if namespace is not None else load_namespace(checkpoint)
    factory = namespace.get(FACTORIES[checkpoint["task"]])
    if factory is None:
        raise KeyError(f"the saved code defines no {FACTORIES[checkpoint['task']]}()")
    profile = PROFILES[checkpoint["profile"]]
    model = factory(getattr(profile, checkpoint["task"]), **vocab_sizes)
    model.load_state_dict(checkpoint["state_dict"])
    return model.eval()
