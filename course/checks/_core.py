"""Small tools shared by the chapter checks: failures that teach, tolerances, shortcuts."""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

import torch


class CheckFailed(AssertionError):
    """A check failed; the message says what was expected and the likely mistake."""


class ShortcutUsed(CheckFailed):
    """The answer called a built-in that the exercise asks you to write yourself."""


def fail(what: str, hint: str) -> None:
    raise CheckFailed(f"{what}\nLikely mistake: {hint}")


def expect(condition: bool, what: str, hint: str) -> None:
    if not condition:
        fail(what, hint)


def call(fn: Callable, *args: Any, name: str | None = None, **kwargs: Any) -> Any:
    """Call the student's function; a stub's NotImplementedError passes through unchanged."""
    try:
        return fn(*args, **kwargs)
    except (NotImplementedError, CheckFailed):
        raise
    except Exception as err:
        label = name or getattr(fn, "__name__", "your code")
        raise CheckFailed(f"{label} raised {type(err).__name__}: {err}\n"
                          f"Likely mistake: read the traceback above this message; "
                          f"the inputs were valid for the signature in the exercise.") from err


def expect_tensor(value: Any, shape: tuple[int, ...], what: str) -> torch.Tensor:
    expect(isinstance(value, torch.Tensor), f"{what} should be a torch.Tensor, got {type(value).__name__}.",
           "return a tensor, not a list or a NumPy array.")
    expect(tuple(value.shape) == tuple(shape), f"{what} has shape {tuple(value.shape)}, expected {tuple(shape)}.",
           "check each reshape/view against the shapes in the docstring.")
    return value


def expect_close(actual: torch.Tensor, expected: torch.Tensor, what: str, hint: str,
                 atol: float = 1e-5, rtol: float = 1e-5) -> None:
    """Elementwise closeness with float32 tolerances; the message shows the worst entry."""
    actual = actual.detach().to(expected.dtype)
    if actual.shape != expected.shape:
        fail(f"{what} has shape {tuple(actual.shape)}, expected {tuple(expected.shape)}.", hint)
    if not torch.allclose(actual, expected, atol=atol, rtol=rtol):
        diff = (actual - expected).abs()
        worst = int(diff.argmax())
        fail(f"{what} differs from the expected values: largest difference {diff.max().item():.3g} "
             f"(got {actual.flatten()[worst].item():.6g}, expected {expected.flatten()[worst].item():.6g}).", hint)


@contextlib.contextmanager
def forbid(*targets: tuple[Any, str], exercise: str) -> Iterator[None]:
    """Within the block, calling any ``(module, attribute)`` in targets raises ShortcutUsed.

    When a test is judged outside the kernel, the student's code runs in the kernel, so
    the block is also set up there, around every call (see :mod:`course.probe`)."""
    from .. import probe

    names = [(_path_of(owner), attr) for owner, attr in targets]
    with probe.kernel_context("course.checks._core:forbid_names", names, exercise=exercise):
        with _forbid_here(*targets, exercise=exercise):
            yield


def _path_of(owner: Any) -> str:
    """``torch.nn.functional`` for a module, ``torch:Tensor`` for a class."""
    if isinstance(owner, type):
        return f"{owner.__module__}:{owner.__qualname__}"
    return owner.__name__


def _resolve_path(path: str) -> Any:
    import importlib

    module, _, qualname = path.partition(":")
    obj = importlib.import_module(module)
    for part in filter(None, qualname.split(".")):
        obj = getattr(obj, part)
    return obj


def forbid_names(names: list[tuple[str, str]], exercise: str) -> contextlib.AbstractContextManager:
    """:func:`forbid` for ``(module or class path, attribute)`` pairs: what the kernel receives."""
    return _forbid_here(*[(_resolve_path(p), a) for p, a in names], exercise=exercise)


@contextlib.contextmanager
def _forbid_here(*targets: tuple[Any, str], exercise: str) -> Iterator[None]:
    saved = []
    for owner, attr in targets:
        original = getattr(owner, attr)

        def blocked(*args: Any, __name=f"{getattr(owner, '__name__', owner)}.{attr}", **kwargs: Any):
            raise ShortcutUsed(f"{__name} was called, but this exercise asks you to write {exercise} yourself.\n"
                               f"Likely mistake: using the built-in instead of implementing it; "
                               f"it is the oracle the tests compare against.")

        saved.append((owner, attr, original))
        setattr(owner, attr, blocked)
    try:
        yield
    finally:
        for owner, attr, original in saved:
            setattr(owner, attr, original)


def one_thread(check: Callable) -> Callable:
    """Run a check on one CPU thread: its tensors are tiny, and extra threads only spin."""
    import functools

    @functools.wraps(check)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return check(*args, **kwargs)
        finally:
            torch.set_num_threads(threads)

    return wrapper


def same(a: torch.Tensor, b: torch.Tensor, atol: float = 1e-5, rtol: float = 1e-5) -> bool:
    """True when a matches b (shapes equal, values close, NaNs in the same places)."""
    a = a.detach()
    return (tuple(a.shape) == tuple(b.shape) and
            torch.allclose(a.to(torch.float64), b.to(torch.float64), atol=atol, rtol=rtol, equal_nan=True))


def generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@contextlib.contextmanager
def earlier_first(*earlier: tuple[str, Callable[[], None]]) -> Iterator[None]:
    """Blame an earlier exercise when this one fails because it calls a wrong earlier answer.

    ``earlier`` holds ``(what, run_check)`` pairs, for example ``("train_bpe calls your
    get_pair_counts and merge_pair, which fail exercise 1's tests", lambda: ...)``. When the
    block fails and one of these checks fails too, the hint says to fix that exercise first
    and quotes its own hint; a stub (NotImplementedError) of the earlier answer is ignored."""
    try:
        yield
    except CheckFailed as err:
        for what, run_check in earlier:
            try:
                run_check()
            except NotImplementedError:
                continue
            except CheckFailed as inner:
                found = str(err).split("\nLikely mistake: ", 1)[0]
                inner_hint = str(inner).split("\nLikely mistake: ", 1)[-1]
                raise CheckFailed(f"{found}\nLikely mistake: {what}: fix that exercise first. "
                                  f"Its test says: {inner_hint}") from err
        raise
