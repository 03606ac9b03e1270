"""The four words every check is written in: draw, compare, diagnose, fail.

- :func:`draw` gives a check its inputs: a ``random.Random`` and a ``torch.Generator`` for
  one tag, seeded from the tag alone for the visible tests and from the grading seed for the
  hidden ones. Nothing else seeds anything: no check touches the global RNG except through
  :meth:`Draw.seeded`, which forks it.
- :func:`compare` holds a result against its oracle: one rule for tensors (shape, then values
  within the tolerance of the expected dtype, :data:`TOLERANCE`), numbers, and plain values;
  on a mismatch it fails with the worst entry and the hint :func:`diagnose` picks.
- :func:`diagnose` names the mistake: the hint of the first wrong variant (a value the
  mistake would have produced) that the result matches.
- :func:`fail` raises :class:`CheckFailed` with its parts as fields (``what``, ``hint``,
  ``blamed``): nothing reads a failure back from its text.
- :func:`judge_configured` judges a "predict" function: run on configurations with no tensor
  operation allowed, each value judged, a number repeated for every configuration named.

Example, a check of ``double(x)``::

    def check_double(double, hidden=False):
        d = draw("double", hidden)
        for n in d.sizes([3, 7], hidden_extra=4, low=1, high=50):
            x = d.randn(n)
            got = call(double, x.clone())
            compare(got, 2 * x, f"double of {n} numbers", "multiply by 2, once.",
                    variants=[(x, "the input came back unchanged: return 2 * x."),
                              (4 * x, "x was doubled twice.")])
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import math
import random
from typing import Any, Callable, Iterable, Iterator, NoReturn

import torch

from ..i18n import composed
from ._core import CheckFailed, call, capped, unmeasured

# (atol, rtol) by the dtype of the expected value: what rounding in that dtype allows.
TOLERANCE = {
    torch.float64: (1e-10, 1e-8),
    torch.float32: (1e-5, 1e-5),
    torch.float16: (1e-3, 1e-3),
    torch.bfloat16: (1e-2, 1e-2),
}
EXACT = (0.0, 0.0)


# ----------------------------------------------------------------------------- fail

def fail(what: str, hint: str, blamed: str | None = None) -> NoReturn:
    """Fail the check: ``what`` went wrong (the case and the numbers), ``hint`` names the
    likely mistake, ``blamed`` the earlier exercise at fault when it is not this one's."""
    raise CheckFailed.of(what, hint, blamed)


def expect(condition: Any, what: str, hint: str) -> None:
    if not condition:
        fail(what, hint)


def earlier_chapter(name: str, chapter: int, exercise: int, check: Callable[[], None]) -> None:
    """Hold ``name``, an earlier chapter's answer pasted into this notebook, to that chapter's own
    ``check`` (exercise ``exercise`` of chapter ``chapter``); its failure is reported as that
    answer's, with that check's hint."""
    try:
        check()
    except CheckFailed as err:
        fail(f"{name} (chapter {chapter}, exercise {exercise}) fails its chapter's test: {err.what}",
             f"in {name}: {err.hint}")


# Earlier chapters' answers pasted into a notebook, as the chapter that owns their checks lists
# them: name -> (chapter, exercise, that chapter's check on the pasted answers (tools, hidden)).
Pasted = dict[str, tuple[int, int, Callable[[dict, bool], None]]]


def check_pasted(table: Pasted, tools: dict, hidden: bool) -> None:
    """Each answer of ``tools`` held to its own chapter's check (:func:`earlier_chapter`)."""
    for name in tools:
        _check_one_pasted(table, name, tools, hidden)


def _check_one_pasted(table: Pasted, name: str, tools: dict, hidden: bool) -> None:
    chapter, exercise, check = table[name]
    earlier_chapter(name, chapter, exercise, lambda: check(tools, hidden))


def pasted_first(who: str, table: Pasted, tools: dict, hidden: bool) -> list:
    """``earlier_first``'s pairs for the pasted answers that ``who`` calls (those given): a
    failure that one of them also has is blamed on it."""
    pairs = []
    for name, (chapter, exercise, _) in table.items():
        if tools.get(name) is not None:
            pairs.append((f"{who} calls your {name} from chapter {chapter}, which fails that chapter's tests "
                          f"(exercise {exercise})", functools.partial(_check_one_pasted, table, name, tools, hidden)))
    return pairs


# ----------------------------------------------------------------------------- draw

class Draw:
    """The inputs of one check. ``rng`` (sizes, choices) and ``gen`` (tensor values) are
    seeded from ``tag``: visible tests always get the same inputs, hidden tests get inputs
    fixed by the grading seed, unknown until grading runs."""

    def __init__(self, tag: str, hidden: bool) -> None:
        from ._hidden import hidden_seed

        self.tag, self.hidden = tag, hidden
        self.seed = hidden_seed(tag) if hidden else _visible_seed(tag)
        self.rng = random.Random(self.seed)
        self.gen = torch.Generator().manual_seed(self.seed)

    def randn(self, *shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.randn(*shape, generator=self.gen, dtype=dtype)

    def randint(self, low: int, high: int, shape: tuple[int, ...]) -> torch.Tensor:
        return torch.randint(low, high, shape, generator=self.gen)

    def uniform(self, low: float, high: float, *shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return low + (high - low) * torch.rand(*shape, generator=self.gen, dtype=dtype)

    def cases(self, visible: list, hidden: Callable[["Draw"], Any], count: int) -> list:
        """``visible``, plus ``count`` cases drawn by ``hidden(self)`` when the tests are hidden."""
        return list(visible) + ([hidden(self) for _ in range(count)] if self.hidden else [])

    def sub(self, name: str) -> "Draw":
        """Another stream of the same check (``draw("embedding", hidden).sub("ids")``)."""
        return Draw(f"{self.tag}/{name}", self.hidden)

    @contextlib.contextmanager
    def seeded(self) -> Iterator[None]:
        """Seed the global RNG (here, and in the kernel for the calls made in the block) from
        this draw, inside a fork: for a module whose initial weights the check must know."""
        from .. import probe

        with torch.random.fork_rng(devices=[]), probe.kernel_seed(self.seed):
            yield


def draw(tag: str, hidden: bool) -> Draw:
    """The inputs of the check named ``tag``; see :class:`Draw`."""
    return Draw(tag, hidden)


def _visible_seed(tag: str) -> int:
    return int.from_bytes(hashlib.sha256(f"visible\x00{tag}".encode()).digest()[:8], "big") >> 1


# ----------------------------------------------------------------------------- compare

def tolerance(want: Any, tol: tuple[float, float] | None = None) -> tuple[float, float]:
    if tol is not None:
        return tol
    if isinstance(want, torch.Tensor):
        return TOLERANCE.get(want.dtype, EXACT)
    return TOLERANCE[torch.float64] if isinstance(want, float) else EXACT


def matches(got: Any, want: Any, tol: tuple[float, float] | None = None) -> bool:
    """Whether ``got`` is ``want``: tensors of the same shape, close within the tolerance of
    ``want``'s dtype (NaN where ``want`` has NaN); numbers within it; anything else equal."""
    try:
        if isinstance(want, torch.Tensor):
            if not isinstance(got, torch.Tensor) or tuple(got.shape) != tuple(want.shape):
                return False
            atol, rtol = tolerance(want, tol)
            a, b = got.detach().to(torch.float64), want.detach().to(torch.float64)
            return bool(torch.allclose(a, b, atol=atol, rtol=rtol, equal_nan=True))
        if isinstance(want, float) and isinstance(got, (int, float)) and not isinstance(got, bool):
            atol, rtol = tolerance(want, tol)
            return math.isclose(float(got), want, rel_tol=rtol, abs_tol=atol) or (math.isnan(got) and math.isnan(want))
        return type(got) is not bool and got == want if not isinstance(want, bool) else got is want
    except Exception:  # noqa: BLE001 - a value that cannot be compared does not match
        return False


class when:  # noqa: N801 - reads as a word in a list of variants
    """A variant given by a property of the result rather than its value:
    ``(when(lambda got: got.sum() == 0), "the table stayed zero.")``."""

    def __init__(self, test: Callable[[Any], Any]) -> None:
        self.test = test


def diagnose(got: Any, variants: Iterable[tuple[Any, str]], otherwise: str,
             tol: tuple[float, float] | None = None) -> str:
    """The hint of the first variant ``got`` matches, else ``otherwise``. A variant is the
    value a mistake produces, a function of no arguments computing it, or a :class:`when`;
    one that raises names no mistake."""
    for variant, hint in variants:
        try:
            if isinstance(variant, when):
                found = bool(variant.test(got))
            else:
                found = matches(got, variant() if callable(variant) else variant, tol)
        except Exception:  # noqa: BLE001 - a variant that cannot be built names no mistake
            continue
        if found:
            return hint
    return otherwise


def compare(got: Any, want: Any, what: str, hint: str, variants: Iterable[tuple[Any, str]] = (),
            tol: tuple[float, float] | None = None) -> None:
    """Fail unless ``got`` matches ``want`` (see :func:`matches`). The message names ``what``
    and, for tensors, the first wrong shape or the worst entry; the hint is the diagnosed
    variant's, else ``hint``."""
    if matches(got, want, tol):
        return
    why = diagnose(got, variants, hint, tol)
    if isinstance(want, torch.Tensor):
        fail(composed("{what}: {difference}", what=what, difference=_tensor_difference(got, want)), why)
    if isinstance(want, dict) and isinstance(got, dict) and len(want) > 3:
        wrong = {k: (got.get(k), want.get(k)) for k in [*want, *got] if got.get(k) != want.get(k)}
        shown = ", ".join(f"{k!r}: got {g!r}, expected {w!r}" for k, (g, w) in list(wrong.items())[:3])
        fail(composed("{what} is wrong for {count} key(s), e.g. {shown}.", what=what, count=len(wrong),
                      shown=capped(shown, 600)), why)
    fail(composed("{what} is {got}, expected {want}.", what=what, got=capped(repr(got), 300),
                  want=capped(repr(want), 300)), why)


def _tensor_difference(got: Any, want: torch.Tensor) -> str:
    if not isinstance(got, torch.Tensor):
        return f"got {type(got).__name__}, expected a tensor of shape {tuple(want.shape)}."
    if tuple(got.shape) != tuple(want.shape):
        return f"got shape {tuple(got.shape)}, expected {tuple(want.shape)}."
    a, b = got.detach().to(torch.float64), want.detach().to(torch.float64)
    diff = (a - b).abs().nan_to_num(float("inf"))
    diff[(a.isnan() & b.isnan()) | (a == b)] = 0      # equal infinities too: inf - inf is NaN
    if diff.dim() == 0:
        return f"got {a.item():.6g}, expected {b.item():.6g}."
    worst = int(diff.argmax())
    at = [int(i) for i in torch.unravel_index(torch.tensor(worst), diff.shape)]
    where = at[0] if len(at) == 1 else at
    return (f"largest difference {diff.max().item():.3g} at index {where} "
            f"(got {a.flatten()[worst].item():.6g}, expected {b.flatten()[worst].item():.6g}).")


# ----------------------------------------------------------------------------- predictions

def judge_configured(name: str, predict: Callable, configs: list[tuple], answer: Callable[..., float],
                     judge: Callable[[tuple, Any], None], shown: Callable[[tuple], str]) -> None:
    """A prediction computed from its configuration: ``predict(*config)`` for each config, under
    :func:`unmeasured`, then ``judge(config, value)``. An answer that gives one value for configurations
    whose answers differ is a number read off one case (the notebook's measurement): that is its hint."""
    values = []
    for config in configs:
        with unmeasured(name):
            values.append(call(predict, *config, name=f"{name}({shown(config)})"))
    for config, value in zip(configs, values):
        try:
            judge(config, value)
        except CheckFailed:
            number = isinstance(values[0], (int, float)) and not isinstance(values[0], bool)
            same = number and all(repr(v) == repr(values[0]) for v in values)   # not a wrong type or None
            if not same or len({answer(*c) for c in configs}) < 2:
                raise
            cases = "; ".join(f"{shown(c)} (expected {answer(*c):.6g})" for c in configs[:3])
            if len(configs) > 3:
                cases = f"{cases} and {len(configs) - 3} more"
            fail(f"{name} returned {values[0]!r} for every configuration it was given: {cases}.",
                 "the same number for every configuration is a value read off one case (the notebook's "
                 f"measurement, or the worked example), not a prediction: compute it from the arguments {name} "
                 "receives, with plain arithmetic.")


# ----------------------------------------------------------------------------- inputs left as drawn

def call_on_copies(fn: Callable, *args: Any, name: str | None = None,
                   hint: str = "build new tensors: the spec says no input is changed in place.", **kwargs: Any) -> Any:
    """``call(fn, *args, **kwargs)`` with copies of the tensors among the arguments (top level), so that the
    oracle and the variants see the inputs as drawn; fails with ``hint`` when the answer changed a copy."""
    copy = lambda a: a.clone() if isinstance(a, torch.Tensor) else a  # noqa: E731
    given, given_kwargs = [copy(a) for a in args], {k: copy(v) for k, v in kwargs.items()}
    out = call(fn, *given, name=name, **given_kwargs)
    pairs = [*zip(args, given), *((kwargs[k], given_kwargs[k]) for k in kwargs)]
    expect(all(not isinstance(a, torch.Tensor) or torch.equal(a, g) or matches(g, a, EXACT) for a, g in pairs),
           f"{name or getattr(fn, '__name__', 'your code')} changed one of its input tensors in place.", hint)
    return out


def expect_tensor_of(got: Any, shape: tuple[int, ...], dtype: torch.dtype, label: str, hint: str) -> None:
    """Fail unless ``got`` is a tensor of this shape and dtype; ``hint`` names the likely cause of a wrong dtype."""
    from ._core import expect_tensor

    expect_tensor(got, tuple(shape), label)
    expect(got.dtype == dtype, composed("{label} returned dtype {got}, expected {want}.", label=label, got=got.dtype,
                                        want=dtype), hint)


def passes(check: Callable, *answers: Any) -> bool:
    """Whether ``check(*answers)`` passes (its visible test): for a demo that shows a measurement only once the
    prediction before it passes."""
    try:
        check(*answers)
    except CheckFailed:
        return False
    return True


# ----------------------------------------------------------------------------- tables and plain results

def variants_of(make: Callable[[Any], Any], table: Iterable[tuple[Any, str]]) -> list[tuple[Callable[[], Any], str]]:
    """:func:`diagnose`'s variants for a table of ``(mistake, hint)``: ``make(mistake)`` computes the value
    that mistake gives, only when a wrong result asks for it."""
    return [(lambda mistake=mistake: make(mistake), hint) for mistake, hint in table]


def expect_number(got: Any, label: str, hint: str) -> float:
    """``got`` as a float; fails with ``hint`` unless it is a Python number (a bool is not one)."""
    expect(isinstance(got, (int, float)) and not isinstance(got, bool),
           composed("{label} returned {kind}, expected a number.", label=label, kind=type(got).__name__), hint)
    return float(got)


def expect_tuple(got: Any, names: str, label: str, hint: str) -> tuple:
    """``got`` as a tuple of as many items as ``names`` (``"x, y"``) names; fails with ``hint`` unless it is a
    tuple or list of that length."""
    n = len(names.split(","))
    kind = f"{type(got).__name__} of {len(got)} items" if isinstance(got, (tuple, list)) else type(got).__name__
    expect(isinstance(got, (tuple, list)) and len(got) == n,
           composed("{label} returned {kind}, expected a tuple ({names}).", label=label, kind=kind, names=names), hint)
    return tuple(got)
