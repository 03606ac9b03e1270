"""What a check records while the student's code runs, on both sides of trusted grading.

These run in the student's kernel too (the check in the grader declares them with
:func:`course.probe.kernel_context`), so this module holds no oracle and no verdict: it
only measures, and the grader decides from what it measured.
"""

from __future__ import annotations

import uuid
import weakref
from collections.abc import MutableMapping

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


class _Mode(TorchDispatchMode):
    """A dispatch mode that never runs under torch.compile. TorchDispatchMode otherwise wraps
    ``__torch_dispatch__`` to switch Dynamo off, and the wrapper imports torch._dynamo on the
    first operation it sees: 1-2 s of every graded kernel that uses a recorder."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False


class LargestTensor(_Mode):
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


class ForbiddenOperators(_Mode):
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


class PairCounts(MutableMapping):
    """The ``pair_counts`` mapping handed to chapter 1's train_bpe: it counts its updates (a
    key set or deleted) and stops the caller past ``budget`` of them.

    It holds nothing of its own to write to: its counts, its count of updates and its budget
    live in this module's table (by the mapping's id), and only ``__setitem__`` and
    ``__delitem__`` (and the mixins built on them) change them, each counted. Judged outside
    the kernel, the grader's mapping travels as a token: the kernel makes its own
    (:func:`pair_counts_in_kernel`), and what comes back is what :class:`PairCountsRecord`
    reads of that table, not anything the student's code hands over."""

    __slots__ = ("__weakref__",)
    __hash__ = object.__hash__        # Mapping sets it to None; one mapping is one key

    def __init__(self, budget: int | None = None, token: str | None = None) -> None:
        if id(self) in _TALLIES:
            raise TypeError("pair_counts is already set up: its counts cannot be reset")
        _TALLIES[id(self)] = {"data": {}, "updates": 0, "budget": budget, "token": token or uuid.uuid4().hex}
        weakref.finalize(self, _TALLIES.pop, id(self), None)

    def __getitem__(self, key):
        return _TALLIES[id(self)]["data"][key]

    def __setitem__(self, key, value) -> None:
        _tally_update(id(self))["data"][key] = value

    def __delitem__(self, key) -> None:
        tally = _TALLIES[id(self)]
        if key not in tally["data"]:
            raise KeyError(key)
        del _tally_update(id(self))["data"][key]

    def __iter__(self):
        return iter(list(_TALLIES[id(self)]["data"]))

    def __len__(self) -> int:
        return len(_TALLIES[id(self)]["data"])

    def __contains__(self, key) -> bool:
        return key in _TALLIES[id(self)]["data"]

    def get(self, key, default=None):
        return _TALLIES[id(self)]["data"].get(key, default)

    def __repr__(self) -> str:
        text = repr(_TALLIES[id(self)]["data"])
        return f"PairCounts({text if len(text) <= 200 else text[:200] + ' ...'})"

    def __reduce__(self):
        """Sent to the kernel: the kernel's own mapping for this token (its table is the kernel's)."""
        tally = _TALLIES[id(self)]
        return (pair_counts_in_kernel, (tally["token"], tally["budget"]))


_TALLIES: dict[int, dict] = {}          # id(PairCounts) -> its counts, updates, budget and token
_IN_KERNEL: dict[str, PairCounts] = {}  # token -> the kernel's mapping (the last few: one per call of a check)


def _tally_update(number: int) -> dict:
    tally = _TALLIES[number]
    tally["updates"] += 1
    if tally["budget"] is not None and tally["updates"] > tally["budget"]:
        raise RuntimeError(f"pair_counts: more than {tally['budget']:,} updates, the most this test allows")
    return tally


def pair_counts_in_kernel(token: str, budget: int | None) -> PairCounts:
    """Unpickling hook: the kernel's mapping for the grader's ``token``, made on first use."""
    if token not in _IN_KERNEL:
        while len(_IN_KERNEL) >= 16:
            _IN_KERNEL.pop(next(iter(_IN_KERNEL)))
        _IN_KERNEL[token] = PairCounts(budget, token)
    return _IN_KERNEL[token]


class PairCountsRecord:
    """What a :class:`PairCounts` holds after the student's code ran: ``updates``, ``data``
    (int pairs to int counts) and ``odd`` (entries that are not). In the grader it is the
    check's context around the call (``with record: train_bpe(..., record.mapping)``); in the
    kernel (made by name, :func:`course.probe.kernel_context`) it reports the kernel's mapping
    of the same token after each call, and the grader takes that report only from the record
    it declared."""

    def __init__(self, budget: int | None = None, token: str | None = None) -> None:
        self.kernel_side = token is not None
        self.mapping = pair_counts_in_kernel(token, budget) if self.kernel_side else PairCounts(budget)
        self.token, self.budget = _TALLIES[id(self.mapping)]["token"], budget
        self._remote: dict | None = None
        self._context = None

    def __enter__(self) -> "PairCountsRecord":
        if not self.kernel_side:
            from .. import probe

            self._context = probe.kernel_context("course.checks._recorders:PairCountsRecord", self.budget,
                                                 self.token, owner=self)
            self._context.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self._context is not None:
            self._context.__exit__(*exc)
            self._context = None

    def remote_state(self) -> dict:
        tally = _TALLIES[id(self.mapping)]
        data = tally["data"]
        rows = [(k[0], k[1], v) for k, v in data.items() if isinstance(k, tuple) and len(k) == 2
                and all(type(x) is int for x in (*k, v)) and all(abs(x) < 2**62 for x in (*k, v))]
        return {"updates": tally["updates"], "odd": len(data) - len(rows),
                "rows": torch.tensor(rows, dtype=torch.int64).reshape(-1, 3)}

    def absorb(self, state: dict) -> None:
        """The kernel's report, read as data: an int count, an int, and (a, b, count) rows."""
        rows = state.get("rows") if isinstance(state, dict) else None
        if not (isinstance(rows, torch.Tensor) and rows.dtype == torch.int64 and rows.dim() == 2
                and rows.shape[-1] == 3 and type(state.get("updates")) is int and type(state.get("odd")) is int):
            raise RuntimeError("the kernel's record of pair_counts was not in the format the grader reads")
        self._remote = {"updates": state["updates"], "odd": state["odd"],
                        "data": {(a, b): c for a, b, c in rows.tolist()}}

    def _state(self) -> dict:
        if self._remote is not None:
            return self._remote
        local = self.remote_state()
        return {"updates": local["updates"], "odd": local["odd"],
                "data": {(a, b): c for a, b, c in local["rows"].tolist()}}

    @property
    def updates(self) -> int:
        return self._state()["updates"]

    @property
    def odd(self) -> int:
        return self._state()["odd"]

    @property
    def data(self) -> dict:
        return self._state()["data"]
