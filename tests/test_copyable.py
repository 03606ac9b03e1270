"""The measure of graded points a learner can copy from printed text (issue 28,
benchmarks/copyable_points.py): a solution that is a printed block with its names changed is
flagged, a different computation is not."""

from __future__ import annotations

import sys

from exercise_measure import ROOT

sys.path.insert(0, str(ROOT))

from benchmarks import copyable_points as cp  # noqa: E402

PAGE = '''# A page

```{code-cell} ipython3
import torch


def attend(q, k, v, allowed):
    scores = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
    weights = scores.masked_fill(~allowed, float("-inf")).softmax(dim=-1)
    return weights @ v
```

The rate is `peak_lr * step / warmup`.
'''


def _row(body: str, page: str = PAGE) -> cp.Row:
    text = cp.printed_from({"book/page.md": page}, [])
    cell = f"def f(query, key, value, mask):\n    ### BEGIN SOLUTION\n{body}    ### END SOLUTION\n"
    return cp.measure_cell(cp.Row("ch", 1, 2, [], [], [], [], []), cell, text)


def test_a_printed_block_with_renamed_variables_is_copyable():
    row = _row("    s = query @ key.transpose(-2, -1) / query.shape[-1] ** 0.5\n"
               "    w = s.masked_fill(~mask, float('-inf')).softmax(dim=-1)\n"
               "    out = w @ value\n"
               "    return out\n")
    assert row.copyable == [True, True, True, False]      # `return out`: plumbing, printed or not
    assert row.plumbing == [False, False, False, True]
    assert row.verdict == "copyable"
    assert row.best_block() == ("book/page.md", 3)


def test_a_printed_expression_returned_or_assigned_is_copyable():
    row = _row("    return query * mask / key\n")           # `peak_lr * step / warmup`, renamed
    assert row.verdict == "copyable"
    assert _row("    y = key\n    return y\n").verdict == ""   # a bare name is no printed computation


def test_a_different_computation_is_not_copyable():
    row = _row("    s = query @ key.transpose(-2, -1) / query.shape[-1] ** 0.5\n"
               "    w = s.masked_fill(~mask, torch.finfo(s.dtype).min).softmax(dim=-1)\n"
               "    w = w * mask\n"
               "    return w @ value\n")
    assert row.copyable == [True, False, False, True]     # the last line is printed, renamed
    assert row.verdict == ""
    # one line of transfer left
    row = _row("    s = query @ key.transpose(-2, -1) / query.shape[-1] ** 0.5\n"
               "    w = s.masked_fill(~mask, float('-inf')).softmax(dim=-1)\n"
               "    return w.sum(dim=-1)\n")
    assert row.verdict == "one-line transfer"


def test_api_names_attributes_and_keywords_are_not_renamed():
    keep = cp._KEEP | {"torch"}
    assert cp.normalise("a = torch.softmax(b, dim=-1)", keep) == "_0 = torch . softmax ( _1 , dim = - 1 )"
    assert cp.normalise("a = torch.log_softmax(b, dim=-1)", keep) != cp.normalise("x = torch.softmax(y, dim=-1)", keep)
    assert cp.normalise("x = x + y.weight", keep) == cp.normalise("h = h + g.weight", keep)
    assert cp.normalise("x = x + y.weight", keep) != cp.normalise("h = h + g.bias", keep)
    assert cp.normalise("def f(x, eps=1e-5):", keep) == cp.normalise("def g(y, tol=1e-5):", keep)


def test_the_repository_measure_runs_and_counts_every_point():
    out = cp.report(("ch01_embeddings",))
    assert "ch01_embeddings      22" in out
