"""The grading seed: where the hidden tests' inputs come from.

Hidden tests draw their extra inputs (values and sizes) at grading time, from a seed that
the trusted grader sets with :func:`set_grading_seed` and that is written nowhere in the
course, so code fitted to the inputs it could read in ``course/checks/`` cannot pass them.
Each check draws from its own stream, derived from (grading seed, tag) with SHA-256 (never
Python's ``hash()``, which is salted per process), so the same seed reproduces a grade
exactly and another seed gives other inputs. Without a seed (a self-check, the test suite)
the seed is 0, so in-process runs are deterministic.
"""

from __future__ import annotations

import hashlib
import random

import torch

_seed = 0


def set_grading_seed(seed: int | None) -> None:
    """Set the seed of this grading run; None restores the default, 0."""
    global _seed
    _seed = 0 if seed is None else int(seed)


def grading_seed() -> int:
    return _seed


def hidden_seed(tag: str) -> int:
    """A 63-bit seed for the check named by ``tag``, fixed by (grading seed, tag)."""
    digest = hashlib.sha256(f"{_seed}\x00{tag}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def hidden_rng(tag: str) -> random.Random:
    return random.Random(hidden_seed(tag))


def hidden_generator(tag: str) -> torch.Generator:
    return torch.Generator().manual_seed(hidden_seed(tag))
