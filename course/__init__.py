"""Helpers that the course's book pages and exercise notebooks import.

- ``course.data``: real text shipped by PyPI packages, normalised and split.
- ``course.device``: the one place that decides CPU or CUDA.
- ``course.checks``: the check helpers that test cells call; each failure names the
  likely mistake.
"""

__version__ = "0.1.0"
