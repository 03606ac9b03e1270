"""Failure messages as students see them: in Jupyter, the message alone (the checker's own
traceback hidden behind %tb), the traceback of the student's own code when it raised, and
still an AssertionError; the same message as the self-check prints."""

from __future__ import annotations

import torch

from course.checks import CheckFailed
from course.checks._core import SHOW_TRACEBACK, call, describe_inputs, earlier_first, expect_close, fail, own_fault


def _raised(fn, *args):
    try:
        fn(*args)
    except CheckFailed as err:
        return err
    raise AssertionError("no CheckFailed")


def test_a_failure_renders_as_its_message_and_one_line_on_the_traceback():
    err = _raised(fail, "what broke", "the cause")
    assert isinstance(err, AssertionError)
    assert err._render_traceback_() == ["CheckFailed: what broke", "Likely mistake: the cause", SHOW_TRACEBACK]


def test_an_error_of_the_students_code_keeps_its_own_traceback_without_the_checkers():
    def student(x):
        return x.no_such_attribute

    err = _raised(call, student, torch.zeros(2, 3))
    shown = "\n".join(err._render_traceback_())
    assert "x.no_such_attribute" in shown and "AttributeError" in shown
    assert "_core.py" not in shown and "course/checks" not in shown
    assert shown.index("AttributeError") < shown.index("Likely mistake: read the traceback above")
    assert "a torch.float32 tensor of shape (2, 3)" in str(err), "the message names the inputs of the call"


def test_the_worst_entry_is_named_by_its_index():
    err = _raised(expect_close, torch.zeros(2, 3), torch.tensor([[0.0, 0, 0], [0, 0, 5]]), "out", "h")
    assert "at index [1, 2]" in str(err) and "expected 5" in str(err)


def test_inputs_are_described_briefly():
    text = describe_inputs((torch.arange(3), torch.zeros(4, 5, dtype=torch.float16), "x" * 100), {"base": 500.0})
    assert "the torch.int64 tensor [0, 1, 2]" in text and "float16 tensor of shape (4, 5)" in text
    assert "base=500.0" in text and len(text) < 200


def test_self_check_prints_what_the_notebook_shows():
    from nbformat.notebooknode import from_dict

    from autograder.selfcheck import failure_message

    err = _raised(fail, "what broke", "the cause")
    output = from_dict({"output_type": "error", "ename": "CheckFailed", "evalue": str(err),
                        "traceback": err._render_traceback_()})
    assert failure_message(output) == "CheckFailed: what broke\nLikely mistake: the cause"
    other = from_dict({"output_type": "error", "ename": "NameError", "evalue": "name 'f' is not defined",
                       "traceback": ["\x1b[31m...long coloured traceback...\x1b[0m"]})
    assert failure_message(other) == "NameError: name 'f' is not defined"


def _stub():
    raise NotImplementedError()


def _failing(hint):
    return lambda: fail("its own test failed", hint)


def _blamed(*earlier, own=False):
    def run():
        with earlier_first(*earlier):
            if own:
                with own_fault():
                    fail("the later exercise failed", "its own slip")
            fail("the later exercise failed", "its own slip")
    return str(_raised(run))


def test_an_earlier_answer_at_fault_is_named_with_its_own_hint_and_every_other_one_too():
    text = _blamed(("calls your a, which fails exercise 1's tests", _failing("a's slip")),
                   ("calls your b, which fails exercise 2's tests", lambda: None),
                   ("calls your c, which fails exercise 3's tests", _failing("c's slip")),
                   ("calls your d, which fails exercise 4's tests", _stub))
    assert text.startswith("the later exercise failed\nLikely mistake: calls your a, which fails exercise 1's tests")
    assert "a's slip" in text and "Besides, calls your c, which fails exercise 3's tests." in text
    assert "exercise 2" not in text and "exercise 4" not in text, "a passing answer or a stub is not blamed"


def test_a_failure_of_its_own_or_with_every_earlier_answer_right_is_its_own():
    assert "its own slip" in _blamed(("calls your a", lambda: None))
    assert "its own slip" in _blamed(("calls your a", _failing("a's slip")), own=True)

