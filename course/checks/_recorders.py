"""What a check records while the student's code runs, on both sides of trusted grading.

These run in the student's kernel too (the check in the grader declares them with
:func:`course.probe.kernel_context`), so this module holds no oracle and no verdict: it
only measures, and the grader decides from what it measured.
"""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


class LargestTensor(TorchDispatchMode):
    """Records the largest storage (bytes) of any tensor an operation returns inside the block."""

    def __init__(self) -> None:
        super().__init__()
        self.nbytes, self.op = 0, ""
        self._remote = None

    # Judged outside the kernel, the student's code runs in the kernel: record there too,
    # and take the kernel's record after each call.
    def __enter__(self):
        from .. import probe

        self._remote = probe.kernel_context("course.checks._recorders:LargestTensor", owner=self)
        self._remote.__enter__()
        return super().__enter__()

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            self._remote.__exit__(*exc)

    def remote_state(self) -> dict:
        return {"nbytes": self.nbytes, "op": self.op}

    def absorb(self, state: dict) -> None:
        if isinstance(state, dict) and int(state.get("nbytes", 0)) > self.nbytes:
            self.nbytes, self.op = int(state["nbytes"]), str(state.get("op", ""))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                n = t.untyped_storage().nbytes()
                if n > self.nbytes:
                    self.nbytes, self.op = n, str(func.overloadpacket.__name__)
        return out


class ForbiddenOperators(TorchDispatchMode):
    """Stops the operators a :class:`course.checks._core.Forbidden` block forbids, however
    the student's code reached them, and a backward pass when autograd is forbidden (the
    grader's own backward pass through the student's graph excepted)."""

    def __init__(self, block) -> None:
        super().__init__()
        self.block = block

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        from .. import probe

        name = func.overloadpacket.__name__
        if getattr(self.block, "every_operator", False):
            self.block.stop(f"a tensor operation (torch's {name} operator)")
        label = self.block.operators.get(name)
        if label is not None:
            self.block.stop(f"{label} (reached as torch's {name} operator)")
        if (self.block.backward and torch._C._current_graph_task_id() != -1
                and not probe.grader_backward_running()):
            self.block.stop(f"{self.block.backward} (a backward pass ran inside your function)")
        return func(*args, **(kwargs or {}))
