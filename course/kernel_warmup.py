"""What a grading kernel imports and loads before it is handed to a submission.

Every notebook's set-up cell pays for PyTorch (about 1.8 s), matplotlib and the plays (about
0.7 s) before the first line a student wrote runs. The grader starts each notebook's kernel
while the previous notebook is still being graded, and the kernel imports this module as it
starts, so that cost is paid in the meantime. Nothing here comes from, or is kept for, any
student: each such kernel serves one notebook and is then shut down.
"""

import matplotlib.pyplot  # noqa: F401 - its font cache is built once per sandbox
import torch  # noqa: F401
import torch.nn.functional  # noqa: F401

import course.checks  # noqa: F401
import course.device  # noqa: F401
import course.probe  # noqa: F401
from course.data.shakespeare import load_plays

load_plays()    # cached for the notebook (lru_cache)
