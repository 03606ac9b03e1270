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
