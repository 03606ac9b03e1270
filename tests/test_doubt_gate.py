"""A submission whose code can switch the kernel's rules off (the scan's doubt): a test under a
rule cannot pass, yet one that fails on its own keeps its own verdict and hint, so a wrong
answer reads the same with or without the doubt. Judged through the kernel-less channel."""

from __future__ import annotations

import pytest

from autograder.remote import doubt_kernel_rules
from course.checks import CheckFailed, ShortcutUsed
from test_forbid import CALL_EMBEDDING, judge  # noqa: F401 - the fixture, shared

FINDING = "review: ex4_answer line 2 imports torch._C (a private part of torch)"


def test_a_test_under_doubt_that_fails_on_its_own_keeps_its_hint(judge):
    with doubt_kernel_rules([FINDING]):
        with pytest.raises(ShortcutUsed) as failure:
            judge(CALL_EMBEDDING.format(name="by_operator_registry"))
    assert "torch.embedding (reached as torch's embedding operator)" in str(failure.value)
    assert "can switch such rules off" not in str(failure.value)


def test_a_test_under_doubt_that_would_pass_fails_with_the_finding(judge):
    with doubt_kernel_rules([FINDING]):
        with pytest.raises(CheckFailed) as failure:
            judge(CALL_EMBEDDING.format(name="by_hand"))
    assert failure.value.hint.startswith("ex4_answer line 2 imports torch._C")
    assert "(a built-in it forbids)" in failure.value.what


def test_the_doubt_ends_with_its_submission(judge):
    with doubt_kernel_rules([FINDING]):
        with pytest.raises(CheckFailed):
            judge(CALL_EMBEDDING.format(name="by_hand"))
    assert judge(CALL_EMBEDDING.format(name="by_hand")).strip() == "[0.0, 6.0, 0.0, 0.0, 3.0]"
