"""What happens to a model after a call returns: the caller goes on using it.

A check that asks a student's function for a checkpoint must know that the checkpoint does not
hold the model's live tensors (``state_dict()`` returns them, uncloned), which change as soon as
training goes on. When grading happens outside the kernel, the checkpoint is copied when the call
returns, so the change must happen in the kernel before that copy: :class:`GoesOn` is entered
there around the call (``course.probe.kernel_context``), and when the call returns it negates, in
place, the parameters of every grader's module (see ``course.probe.twin``) that the call changed.
The grader's copy of the module comes back negated with the reply; the check negates it back.

This module only changes the models the grader handed over; it decides nothing.
"""

from __future__ import annotations

from typing import Any

import torch

from . import probe


def _versions(module: torch.nn.Module) -> tuple:
    return tuple((id(p), p._version) for p in module.parameters())


def negate(module: torch.nn.Module) -> None:
    """Every parameter of ``module`` times -1, in place (exact, and undone by itself)."""
    with torch.no_grad():
        for p in module.parameters():
            p.neg_()


class GoesOn:
    """Around one call in the kernel: the grader's modules that the call trained are negated
    when it returns without error, before its value is sent back."""

    def __init__(self) -> None:
        self.touched = 0
        self._before: dict[int, tuple] = {}

    def __enter__(self) -> "GoesOn":
        self._before = {n: _versions(m) for n, m in probe._TWINS.items()}
        return self

    def __exit__(self, kind: Any, *exc: Any) -> bool:
        if kind is None:
            for number, module in probe._TWINS.items():
                if _versions(module) != self._before.get(number):
                    negate(module)
                    self.touched += 1
        return False

    def remote_state(self) -> dict:
        return {"touched": self.touched}
