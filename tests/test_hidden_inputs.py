"""Hidden tests draw fresh inputs from the grading seed.

Every hidden call in the solution notebooks is run in-process on the reference answers under
several grading seeds: it must pass for each, call the answer on at least one input that the
visible test never uses, and call it on other inputs under another seed. A recorder wraps
each answer the check receives (functions: their arguments; classes: their constructor's
arguments; modules they return: the inputs of their forward passes) and fingerprints what it
was called with. The last tests show that the recorder catches a hidden branch that repeats
the visible inputs, or that draws them from a seed written in the code.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import hashlib
import inspect
import re
from typing import Any, Callable

import nbformat
import pytest
import torch
import torch.nn as nn

from autograder.extract import solution_namespace
from course.checks import _hidden, ch01, ch02, ch03, ch04, ch05, ch06, ch07
from notebook_tools import ROOT

MODULES = {"ch01_embeddings": ch01, "ch02_positions": ch02, "ch03_attention": ch03, "ch04_ffn": ch04,
           "ch05_training": ch05, "ch06_inference": ch06, "ch07_capstone": ch07}
SEEDS = (1, 2, 3)
_HIDDEN = re.compile(r"### BEGIN HIDDEN TESTS\n(.*?)### END HIDDEN TESTS", re.S)


def hidden_calls(assignment: str) -> list[str]:
    """The statements of the notebook's hidden regions, one check call each."""
    nb = nbformat.read(ROOT / "solutions" / assignment / f"{assignment}.ipynb", as_version=4)
    calls = []
    for cell in nb.cells:
        for region in _HIDDEN.findall(cell.source):
            calls += [ast.unparse(node) for node in ast.parse(region).body]
    return calls


CALLS = [(a, call) for a in MODULES for call in hidden_calls(a)]


def _check_name(call: str) -> str:
    return ast.parse(call).body[0].value.func.attr


@functools.lru_cache(maxsize=None)
def namespace(assignment: str) -> dict:
    return solution_namespace(ROOT / "solutions" / assignment / f"{assignment}.ipynb")

# ----------------------------------------------------------------------------- the recorder


def fingerprint(value: Any) -> Any:
    """A hashable summary of an argument: tensors by dtype, shape and a digest of their bytes."""
    if isinstance(value, torch.Tensor):
        t = value.detach().cpu().contiguous().reshape(-1)
        return ("tensor", str(value.dtype), tuple(value.shape), hashlib.sha1(t.view(torch.uint8).numpy().tobytes()).hexdigest())
    if isinstance(value, nn.Module):
        return ("module", repr(value), tuple((k, fingerprint(v)) for k, v in value.state_dict().items()))
    if isinstance(value, torch.Generator):
        return ("generator", value.initial_seed())
    if isinstance(value, dict):
        return ("dict", tuple(sorted(((fingerprint(k), fingerprint(v)) for k, v in value.items()), key=repr)))
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(fingerprint(v) for v in value))
    if callable(value) and not dataclasses.is_dataclass(value):
        return ("callable", getattr(value, "__qualname__", type(value).__name__))
    return (type(value).__name__, repr(value))


class Recorder:
    """Wraps answers so that every call to them is fingerprinted into ``self.calls``."""

    def __init__(self) -> None:
        self.calls: set = set()

    def note(self, name: str, args: tuple, kwargs: dict) -> None:
        self.calls.add((name, fingerprint(args), fingerprint(kwargs)))

    def watch(self, name: str, result: Any) -> Any:
        if isinstance(result, nn.Module):
            def hook(module, args, kwargs):
                self.note(f"{name}.forward", args, kwargs)
            result.register_forward_pre_hook(hook, with_kwargs=True)
        return result

    def wrap(self, name: str, obj: Callable) -> Callable:
        @functools.wraps(obj)
        def wrapper(*args, **kwargs):
            self.note(name, args, kwargs)
            return self.watch(name, obj(*args, **kwargs))
        return wrapper


def record(check: Callable, answers: dict[str, Callable], hidden: bool, seed: int | None = None,
           **kwargs: Any) -> tuple[frozenset, BaseException | None]:
    """Run check(*answers, hidden=hidden, **kwargs) under a grading seed; what the answers saw, and the error."""
    recorder = Recorder()
    wrapped = [recorder.wrap(name, obj) for name, obj in answers.items()]
    _hidden.set_grading_seed(seed)
    try:
        check(*wrapped, hidden=hidden, **kwargs)
        error = None
    except Exception as err:  # noqa: BLE001 - the tests report it
        error = err
    finally:
        _hidden.set_grading_seed(None)
    return frozenset(recorder.calls), error


def assert_fresh(visible: frozenset, hidden_a: frozenset, hidden_b: frozenset) -> None:
    """The hidden run uses an input the visible one never did, and another seed other inputs."""
    assert hidden_a - visible, "the hidden run never called the answer on an input that the visible run did not use"
    assert hidden_a != hidden_b, "two grading seeds gave the same inputs: the hidden inputs ignore the grading seed"


@functools.lru_cache(maxsize=None)
def run(assignment: str, call: str, hidden: bool, seed: int | None) -> tuple[frozenset, BaseException | None]:
    """One hidden call of the notebook (or its visible twice), on the reference answers."""
    node = ast.parse(call).body[0].value
    ns = namespace(assignment)
    check = getattr(MODULES[assignment], node.func.attr)
    answers = {arg.id: ns[arg.id] for arg in node.args}
    kwargs = {k.arg: eval(compile(ast.Expression(k.value), "<hidden>", "eval"), ns) for k in node.keywords
              if k.arg != "hidden"}
    return record(check, answers, hidden, seed, **kwargs)

# ----------------------------------------------------------------------------- the checks


@pytest.mark.parametrize("assignment", MODULES)
def test_every_check_has_a_hidden_call(assignment):
    checks = {name for name, f in inspect.getmembers(MODULES[assignment], inspect.isfunction)
              if name.startswith("check_") and f.__module__ == MODULES[assignment].__name__}
    called = {_check_name(c) for a, c in CALLS if a == assignment}
    assert checks == called
    assert all("hidden=True" in c for a, c in CALLS if a == assignment)


@pytest.mark.parametrize("assignment,call", CALLS, ids=[f"{a}-{_check_name(c)}" for a, c in CALLS])
def test_hidden_check_passes_under_every_seed(assignment, call):
    for seed in SEEDS:
        _, error = run(assignment, call, True, seed)
        assert error is None, f"grading seed {seed}: {error!r}"


@pytest.mark.parametrize("assignment,call", CALLS, ids=[f"{a}-{_check_name(c)}" for a, c in CALLS])
def test_hidden_check_draws_fresh_inputs(assignment, call):
    visible, error = run(assignment, call, False, None)
    assert error is None, repr(error)
    assert visible, "the recorder saw no call to the answers"
    assert_fresh(visible, run(assignment, call, True, SEEDS[0])[0], run(assignment, call, True, SEEDS[1])[0])


def test_the_same_seed_gives_the_same_inputs():
    assignment, call = next((a, c) for a, c in CALLS if "check_multi_head_attention" in c)
    first = run(assignment, call, True, SEEDS[0])[0]
    assert record(MODULES[assignment].check_multi_head_attention,
                  {"MultiHeadAttention": namespace(assignment)["MultiHeadAttention"]}, True, SEEDS[0])[0] == first


def test_hidden_streams_are_stable_and_separate():
    _hidden.set_grading_seed(7)
    try:
        a = [_hidden.hidden_seed("x"), _hidden.hidden_seed("y"), _hidden.hidden_rng("x").random()]
        assert a[0] != a[1] and a[0] == _hidden.hidden_seed("x")
        assert torch.equal(torch.rand(3, generator=_hidden.hidden_generator("x")),
                           torch.rand(3, generator=_hidden.hidden_generator("x")))
        _hidden.set_grading_seed(8)
        assert _hidden.hidden_seed("x") != a[0]
    finally:
        _hidden.set_grading_seed(None)
    assert _hidden.grading_seed() == 0
    # SHA-256 of "0\x00x": the same in every process, unlike hash().
    assert _hidden.hidden_seed("x") == int(hashlib.sha256(b"0\x00x").hexdigest()[:16], 16) >> 1

# ----------------------------------------------------------------------------- the recorder can fail


def _double(x):
    return 2 * x


def _toy_repeats_visible(double, hidden: bool = False) -> None:
    cases = [torch.arange(3), torch.ones(2, 2)]
    if hidden:
        cases += [torch.ones(2, 2), torch.arange(3)]          # "more" cases, all seen before
    for x in cases:
        assert torch.equal(double(x), 2 * x)


def _toy_literal_seed(double, hidden: bool = False) -> None:
    cases = [torch.arange(3)]
    if hidden:
        cases.append(torch.randn(4, generator=torch.Generator().manual_seed(1234)))   # readable in the code
    for x in cases:
        assert torch.equal(double(x), 2 * x)


def _toy_drawn(double, hidden: bool = False) -> None:
    cases = [torch.arange(3)]
    if hidden:
        rng = _hidden.hidden_rng("toy")
        cases.append(torch.randn(rng.randrange(1, 9), generator=_hidden.hidden_generator("toy")))
    for x in cases:
        assert torch.equal(double(x), 2 * x)


def _fresh(check) -> None:
    visible, error = record(check, {"double": _double}, False)
    assert error is None
    assert_fresh(visible, record(check, {"double": _double}, True, 1)[0], record(check, {"double": _double}, True, 2)[0])


def test_recorder_catches_hidden_inputs_that_repeat_the_visible_ones():
    with pytest.raises(AssertionError, match="never called the answer on an input"):
        _fresh(_toy_repeats_visible)


def test_recorder_catches_hidden_inputs_from_a_literal_seed():
    with pytest.raises(AssertionError, match="ignore the grading seed"):
        _fresh(_toy_literal_seed)


def test_recorder_accepts_inputs_drawn_from_the_grading_seed():
    _fresh(_toy_drawn)


def test_recorder_sees_constructor_and_forward_inputs():
    recorder = Recorder()
    linear = recorder.wrap("Linear", nn.Linear)(3, 2)
    linear(torch.ones(1, 3))
    names = {name for name, _, _ in recorder.calls}
    assert names == {"Linear", "Linear.forward"}
