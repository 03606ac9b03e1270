"""Check helpers that the exercise notebooks' test cells call.

Test cells stay thin (``check_embedding(Embedding)``) so that the same checks can run in the
student's kernel under nbgrader or, later, in a separate trusted process on extracted code.
Every check compares with an independent oracle (a PyTorch built-in, a hand-derived value or
a mathematical property) and, when it fails, raises :class:`CheckFailed` with a sentence
that names the likely mistake. ``hidden=True`` runs the extra cases the autograder uses, on
inputs drawn from the grading seed that the grader sets when it runs (see ``_hidden``).
"""

from ._core import CheckFailed, ShortcutUsed

__all__ = ["CheckFailed", "ShortcutUsed"]
