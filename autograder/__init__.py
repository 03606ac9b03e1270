"""The course's grading system: a thin, careful layer around nbgrader.

nbgrader does the heavy lifting (generating exercises, checksums, the gradebook, the
feedback); this package fixes what its defaults get wrong for a course like ours and adds
a batch grader with a CSV export:

- a warning printed to stderr by a correct answer does not cost the points;
- a deleted test cell is put back and graded, and the deletion is recorded;
- an edited locked cell is restored, and the edit is recorded;
- a corrupt notebook gets a zero with the reason, and the others are still graded;
- a kernel that dies keeps the points of the cells that ran; the rest score zero, with
  the reason;
- hidden tests never appear in the feedback: only their verdict and hint do.
"""

__version__ = "0.1.0"

import sys as _sys

# jsonschema (under nbformat) imports rfc3987_syntax when it is installed (an optional extra of
# Jupyter's packages), which compiles some 40 grammars at import: 2.5 s in every process that
# reads a notebook, for the IRI formats that no notebook schema checks. Marked missing, it is
# skipped the way jsonschema skips any optional format checker.
_sys.modules.setdefault("rfc3987_syntax", None)
