"""The checks' vocabulary (course/checks/_vocabulary.py): draw, compare, diagnose, fail."""

from __future__ import annotations

import pytest
import torch

from course.checks import CheckFailed
from course.checks._core import earlier_first
from course.checks._hidden import set_grading_seed
from course.checks._vocabulary import (call_on_copies, compare, diagnose, draw, expect_number, expect_tensor_of,
                                      expect_tuple, fail, matches, passes, variants_of)


def test_a_failure_carries_its_parts_as_fields_and_reads_as_before():
    with pytest.raises(CheckFailed) as caught:
        fail("f(3) returned 5, expected 6.", "add one more.")
    err = caught.value
    assert (err.what, err.hint, err.blamed) == ("f(3) returned 5, expected 6.", "add one more.", None)
    assert str(err) == "f(3) returned 5, expected 6.\nLikely mistake: add one more."


def test_a_failure_quotes_at_most_the_cap_of_an_answer():
    with pytest.raises(CheckFailed) as caught:
        fail("got " + "x" * 10_000, "y" * 10_000)
    assert len(str(caught.value)) < 6_200 and "more characters" in caught.value.what


def test_visible_draws_repeat_and_hidden_draws_follow_the_grading_seed():
    assert torch.equal(draw("t", False).randn(4), draw("t", False).randn(4))
    assert not torch.equal(draw("t", False).randn(4), draw("u", False).randn(4))
    try:
        set_grading_seed(1)
        first = draw("t", True).randn(4)
        set_grading_seed(2)
        second = draw("t", True).randn(4)
    finally:
        set_grading_seed(None)
    assert not torch.equal(first, second)
    assert not torch.equal(first, draw("t", False).randn(4))


def test_cases_adds_drawn_cases_only_when_hidden():
    pick = lambda d: d.rng.randrange(100)   # noqa: E731
    assert draw("c", False).cases([1, 2], pick, 5) == [1, 2]
    hidden = draw("c", True).cases([1, 2], pick, 5)
    assert hidden[:2] == [1, 2] and len(hidden) == 7


def test_seeded_forks_the_global_rng():
    torch.manual_seed(5)
    expected_next = torch.rand(1)
    torch.manual_seed(5)
    with draw("s", False).seeded():
        inside = torch.rand(1)
    with draw("s", False).seeded():
        again = torch.rand(1)
    assert torch.equal(inside, again)
    assert torch.equal(torch.rand(1), expected_next)    # the global stream is where it was


@pytest.mark.parametrize("got, want, same", [
    (torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.0 + 1e-7]), True),
    (torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.001]), False),
    (torch.tensor([1.0, 2.0]), torch.tensor([[1.0, 2.0]]), False),
    (torch.tensor([1.0, 2.0], dtype=torch.float64), torch.tensor([1.0, 2.0 + 1e-7], dtype=torch.float64), False),
    (torch.tensor([1.0, 2.0], dtype=torch.bfloat16), torch.tensor([1.0, 2.01], dtype=torch.bfloat16), True),
    (torch.tensor([float("nan")]), torch.tensor([float("nan")]), True),
    ([1, 2], torch.tensor([1, 2]), False),
    (3, 3, True), (True, 1, False), (1, True, False), (0.1 + 0.2, 0.3, True), ({"a": 1}, {"a": 1}, True),
])
def test_matches_is_one_rule_with_the_tolerance_of_the_expected_dtype(got, want, same):
    assert matches(got, want) is same


def test_compare_names_the_worst_entry_and_the_diagnosed_mistake():
    want = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    got = torch.tensor([[1.0, 2.0], [3.0, 8.0]])
    with pytest.raises(CheckFailed) as caught:
        compare(got, want, "double(x)", "multiply by 2.", variants=[(want * 0, "zeros."), (lambda: got.clone(), "x4.")])
    assert "largest difference 4 at index [1, 1] (got 8, expected 4)" in caught.value.what
    assert caught.value.hint == "x4."
    with pytest.raises(CheckFailed) as caught:
        compare(torch.ones(3), want, "double(x)", "multiply by 2.")
    assert "got shape (3,), expected (2, 2)" in caught.value.what and caught.value.hint == "multiply by 2."
    compare(want.clone(), want, "double(x)", "never used")


def test_diagnose_skips_a_variant_that_cannot_be_built():
    def broken():
        raise ValueError("no such variant here")

    assert diagnose(3, [(broken, "a"), (3, "b")], "c") == "b"
    assert diagnose(4, [(broken, "a"), (3, "b")], "c") == "c"


def test_an_earlier_answer_at_fault_is_blamed_by_field():
    def earlier_check():
        fail("get_pair_counts([1, 1]) returned {}.", "count every pair.")

    with pytest.raises(CheckFailed) as caught:
        with earlier_first(("train_bpe calls your get_pair_counts, which fails exercise 1's tests", earlier_check)):
            fail("train_bpe learned the wrong merges.", "merge the most frequent pair.")
    err = caught.value
    assert err.what == "train_bpe learned the wrong merges."
    assert err.blamed == "train_bpe calls your get_pair_counts, which fails exercise 1's tests"
    assert err.hint.endswith("fix that exercise first. Its test says: count every pair.")


def test_compare_reports_the_worst_entry_past_equal_infinities():
    want = torch.tensor([float("-inf"), 1.0, float("inf")])
    with pytest.raises(CheckFailed) as caught:
        compare(torch.tensor([float("-inf"), 3.0, float("inf")]), want, "mask", "hint")
    assert "largest difference 2 at index 1" in caught.value.what


def _judge_square(config, value):
    compare(value, float(config[0] ** 2), f"square({config[0]})", "multiply the side by itself.")


@pytest.mark.parametrize("predict, hint", [
    (lambda side: float(side * side), None),
    (lambda side: 9.0, "the same number for every configuration is a value read off one case"),
    (lambda side: float(torch.tensor(float(side)).square()), "it is a prediction"),
    (lambda side: float(side * 2), "multiply the side by itself."),
])
def test_judge_configured_runs_a_prediction_unmeasured_and_names_a_constant(predict, hint):
    """A prediction is judged on every configuration; one number for all of them (the notebook's
    measurement) gets its own hint, a tensor operation stops it."""
    from course.checks._vocabulary import judge_configured

    run = lambda: judge_configured("square", predict, [(3,), (4,), (7,)], lambda side: float(side ** 2),  # noqa: E731
                                   _judge_square, lambda config: f"side {config[0]}")
    if hint is None:
        run()
        return
    with pytest.raises(CheckFailed) as caught:
        run()
    assert hint in str(caught.value), str(caught.value)


def test_call_on_copies_hands_copies_and_fails_an_answer_that_changes_one():
    x, nan = torch.arange(3.0), torch.tensor([float("nan"), 1.0])
    assert torch.equal(call_on_copies(lambda t, k: t * k, x, 2, name="double"), 2 * x)
    call_on_copies(lambda t: t + 1, nan, name="f")              # NaN in an input is no change
    with pytest.raises(CheckFailed) as caught:
        call_on_copies(lambda t, scale=None: scale.mul_(2), x, scale=x, name="double", hint="build a new tensor.")
    assert torch.equal(x, torch.arange(3.0)) and caught.value.hint == "build a new tensor."
    assert caught.value.what == "double changed one of its input tensors in place."


def test_expect_tensor_of_names_a_wrong_dtype_with_its_hint_and_passes_tells_whether_a_check_does():
    expect_tensor_of(torch.zeros(2, 3), (2, 3), torch.float32, "f(x)", "keep the dtype.")
    with pytest.raises(CheckFailed) as caught:
        expect_tensor_of(torch.zeros(2, 3, dtype=torch.float64), (2, 3), torch.float32, "f(x)", "keep the dtype.")
    assert caught.value.hint == "keep the dtype." and "float64" in caught.value.what
    assert passes(lambda x: None, 1) and not passes(lambda x: fail("no", "because."), 1)


def test_variants_of_a_table_are_computed_when_asked_and_plain_results_are_checked():
    asked = []
    table = [(2, "doubled."), (3, "tripled.")]
    variants = variants_of(lambda k: asked.append(k) or 5 * k, table)
    assert asked == [] and diagnose(15, variants, "other.") == "tripled." and asked == [2, 3]
    assert expect_number(3, "f()", "a number.") == 3.0 and expect_tuple([1, 2], "x, y", "g()", "a pair.") == (1, 2)
    for bad in (True, torch.tensor(1.0), None):
        with pytest.raises(CheckFailed) as caught:
            expect_number(bad, "f()", "a number.")
        assert caught.value.hint == "a number." and type(bad).__name__ in caught.value.what
    with pytest.raises(CheckFailed) as caught:
        expect_tuple((1, 2, 3), "x, y", "g()", "a pair.")
    assert caught.value.what == "g() returned tuple of 3 items, expected a tuple (x, y)."
