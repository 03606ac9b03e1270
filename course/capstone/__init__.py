"""The capstone: three full transformers trained on real data, graded on held-out data.

- ``profiles``: the budgets (model sizes, steps) and pass thresholds of each profile
  (``smoke`` for CI, ``cpu`` for laptops, ``gpu`` for GPU runners), chosen by
  ``COURSE_PROFILE``, never by the student's code.
- ``data``: tokenisers and batches for the three tasks, built from the course's loaders.
- ``metrics``: the evaluation the test cells run (the course's code, not the student's).
- ``evaluate``: re-evaluate saved weights outside the notebook.
"""
