"""Small tools shared by the chapter checks: failures that teach, tolerances, shortcuts."""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable, Iterator

import torch

from ..i18n import composed

SHOW_TRACEBACK = "(The checker's own traceback is hidden: run %tb in a new cell to see it.)"


class CheckFailed(AssertionError):
    """A check failed; the message says what was expected and the likely mistake.

    In Jupyter the failure shows as the message alone (plus, when the student's code raised,
    the traceback of their code), not as a traceback through the checker: IPython calls
    ``_render_traceback_``. ``%tb`` (or ``%xmode Verbose``) shows the full traceback.

    Its parts are fields: ``what`` (the case and the numbers), ``hint`` (the likely mistake),
    ``blamed`` (the earlier exercise at fault, when it is not this one). Build one with
    :meth:`of`; its text is ``what``, then ``Likely mistake: hint`` on a line of its own."""

    HINT = "\nLikely mistake: "

    def __init__(self, message: Any = "", *args: Any) -> None:
        super().__init__(message, *args)
        # A failure made from its text (the kernel's own, sent back as text): split it once.
        what, _, hint = str(message).partition(self.HINT)
        self.what, self.hint, self.blamed = what, hint, None

    @classmethod
    def of(cls, what: str, hint: str, blamed: str | None = None) -> "CheckFailed":
        err = cls(f"{capped(what)}{cls.HINT}{capped(hint)}" if hint else capped(what))
        err.what, err.hint, err.blamed = capped(what), capped(hint), blamed
        return err

    def _render_traceback_(self) -> list[str]:
        if _full_traceback_wanted():
            import traceback

            return "".join(traceback.format_exception(type(self), self, self.__traceback__)).splitlines()
        lines = []
        cause = self.__cause__
        if cause is not None and not isinstance(cause, CheckFailed) and cause.__traceback__ is not None:
            lines += _student_traceback(cause)
        from ..i18n import error_text, translate

        lines += f"{type(self).__name__}: {error_text(self)}".splitlines()
        lines.append(translate(SHOW_TRACEBACK))
        return lines


def _full_traceback_wanted() -> bool:
    """True inside IPython's %tb magic or with %xmode Verbose."""
    import sys

    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "tb" and frame.f_globals.get("__name__", "").startswith("IPython.core.magics"):
            return True
        frame = frame.f_back
    shell = sys.modules.get("IPython")
    try:
        ip = shell.get_ipython() if shell is not None else None
        return ip is not None and str(ip.InteractiveTB.mode).lower() == "verbose"
    except Exception:  # noqa: BLE001 - no IPython: the short form
        return False


def _student_traceback(err: BaseException) -> list[str]:
    """The traceback of an error the student's code raised, without the checker's frames."""
    import traceback
    from pathlib import Path

    here = str(Path(__file__).resolve().parent)
    frames = [f for f in traceback.extract_tb(err.__traceback__) if not str(Path(f.filename).resolve()).startswith(here)]
    lines = ["Traceback of your code (most recent call last):"]
    lines += "".join(traceback.format_list(frames)).rstrip("\n").splitlines()
    lines += "".join(traceback.format_exception_only(type(err), err)).rstrip("\n").splitlines()
    return lines


class ShortcutUsed(CheckFailed):
    """The answer called a built-in that the exercise asks you to write yourself."""


class NotWrittenYet(NotImplementedError):
    """A stub's ``raise NotImplementedError()`` reached a check: the answer is not written yet.

    In Jupyter it shows as one line naming the function to write, not as a traceback through
    the checker (``%tb`` shows that). It is reported under the name NotImplementedError (a
    notebook's error output, the grader's results), as the stub raised."""

    @classmethod
    def of(cls, stub: NotImplementedError, label: str) -> "NotWrittenYet":
        """``label`` is what the check called (``Embedding(...)``); the stub's own frame, when
        it ran in this process, names the method more precisely (``Embedding.__init__``)."""
        import re

        frames = _student_traceback_frames(stub)
        where = frames[-1].f_code.co_qualname if frames else (re.match(r"[\w.]*", label).group() or label)
        return cls(f"{where} is not written yet: replace the `raise NotImplementedError()` "
                   f"in its answer cell with your code.")

    def _render_traceback_(self) -> list[str]:
        if _full_traceback_wanted():
            import traceback

            return "".join(traceback.format_exception(type(self), self, self.__traceback__)).splitlines()
        from ..i18n import translate

        return [translate(str(self))]


NotWrittenYet.__name__ = "NotImplementedError"   # the error's name in outputs; its qualname stays


def not_written(err: NotImplementedError, label: str) -> NotImplementedError:
    """What a check raises when the student's code raised ``err``: NotWrittenYet for a stub's
    bare ``raise NotImplementedError()``, ``err`` itself for any other (a message of its own,
    or already NotWrittenYet). For checks that call the student's code without :func:`call`."""
    if isinstance(err, NotWrittenYet) or str(err):   # a judged stub's comes back with an empty message
        return err
    short = NotWrittenYet.of(err, label)
    short.__cause__ = err
    return short


def _student_traceback_frames(err: BaseException) -> list:
    """The frames of ``err``'s traceback that ran the student's code: not the course's, the
    grader's or an installed package's (a stub judged from the grader has none here)."""
    import sys
    from pathlib import Path

    course = Path(__file__).resolve().parents[1]
    ours = (str(course), *RUNNER_PATHS, sys.prefix, sys.base_prefix)
    frames, tb = [], err.__traceback__
    while tb is not None:
        if not str(Path(tb.tb_frame.f_code.co_filename).resolve()).startswith(ours):
            frames.append(tb.tb_frame)
        tb = tb.tb_next
    return frames


# Told by whatever runs the checks against a kernel (the grader), so that the course needs to
# know nothing of it: the folders of its code (their frames are not the student's) and the
# types that stand for an object living in the student's kernel.
RUNNER_PATHS: list[str] = []
KERNEL_OBJECT_TYPES: tuple[type, ...] = ()


def register_runner(path: str, kernel_object_type: type) -> None:
    global KERNEL_OBJECT_TYPES
    if path not in RUNNER_PATHS:
        RUNNER_PATHS.append(path)
    if kernel_object_type not in KERNEL_OBJECT_TYPES:
        KERNEL_OBJECT_TYPES = (*KERNEL_OBJECT_TYPES, kernel_object_type)


QUOTE_LIMIT = 3000     # characters of a failure's text: what it quotes of an answer can be anything


def capped(text: str, limit: int = QUOTE_LIMIT) -> str:
    """``text``, cut at ``limit`` characters with a count of what was cut."""
    return text if len(text) <= limit else f"{text[:limit]} ... [{len(text) - limit:,} more characters]"


def fail(what: str, hint: str) -> None:
    raise CheckFailed.of(what, hint)


def expect(condition: bool, what: str, hint: str) -> None:
    if not condition:
        fail(what, hint)


def judge_prediction(name: str, value: Any, answer: float, *, unit_hint: str, asked: str, exact: float,
                     close: float, close_hint: str, guesses: list[tuple[float, str]], near: float,
                     fallback: str, relative: bool = False, shown: str = "g") -> None:
    """A "predict, then measure" answer against the value derived by hand. It passes within
    ``exact``; within ``close`` it is a rounded reading, not the arithmetic asked for; otherwise
    the hint is that of the first known slip within ``near`` of the value (a fraction of it
    when ``relative``), or ``fallback``. ``asked`` says what the question asked for."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        fail(f"{name}() returned {type(value).__name__}, expected a number.", unit_hint)
    if isinstance(value, bool):
        fail(f"{name}() returned a bool, expected a number.", unit_hint)
    if abs(number - answer) <= exact:
        return
    slip = next((h for v, h in guesses if abs(number - v) <= 1e-9 * max(abs(v), 1.0)), None)
    if slip is None and abs(number - answer) <= close:    # an exact slip near the answer is still that slip
        fail(f"{name}() is {value!r}: close, but not the exact value derived by hand.", close_hint)
    hint = slip or next((h for v, h in guesses if abs(number - v) <= near * (max(abs(v), 1.0) if relative else 1.0)),
                        fallback)
    fail(f"{name}() is {number:{shown}}, which is not {asked}.", hint)


def call(fn: Callable, *args: Any, name: str | None = None, **kwargs: Any) -> Any:
    """Call the student's function; a stub's bare NotImplementedError becomes NotWrittenYet,
    which names the function to write (any other NotImplementedError passes through)."""
    try:
        return fn(*args, **kwargs)
    except NotImplementedError as err:
        raise not_written(err, name or getattr(fn, "__name__", "your code"))
    except CheckFailed:
        raise
    except Exception as err:
        label = name or getattr(fn, "__name__", "your code")
        hint = error_hint(err)
        raise CheckFailed(f"{label} raised {type(err).__name__}: {err}\n"
                          f"It was called with {describe_inputs(args, kwargs)}.\n"
                          f"Likely mistake: {hint}") from err


def error_hint(err: BaseException) -> str:
    """The hint for an error the student's code raised: the known cause its words name, or
    the traceback."""
    message = str(err)
    return next((hint for words, hint in KNOWN_ERRORS if words in message), TRACEBACK_HINT)


TRACEBACK_HINT = "read the traceback above this message; the inputs were valid for the signature in the exercise."
# PyTorch's own words for an error whose cause they name -> the hint for it.
KNOWN_ERRORS = (
    ("view size is not compatible",
     "a .view() of a transposed or permuted tensor: its elements are no longer in row order; "
     "use .reshape(), or .contiguous() before .view()."),
)


def describe(value: Any) -> str:
    """A short description of one input: a tensor's shape and dtype, a short value as is."""
    try:
        return _describe(value)
    except Exception:  # noqa: BLE001 - a description must never hide the failure it describes
        return f"a {type(value).__name__}"


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):   # a tensor of the kernel's too: its values are here
        if value.numel() <= 6 and value.dim() <= 1:
            shown = f"the {value.dtype} tensor {value.tolist()}"
        else:
            shown = f"a {value.dtype} tensor of shape {tuple(value.shape)}"
        return shown if value.device.type == "cpu" else f"{shown} on the device {value.device}"
    if isinstance(value, KERNEL_OBJECT_TYPES):   # an object that lives in the student's kernel
        return "an object of your code"
    if isinstance(value, (list, tuple)) and len(value) > 6:
        return f"a {type(value).__name__} of {len(value)} items"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def describe_inputs(args: tuple, kwargs: dict) -> str:
    """The inputs of a call, for a message that names the case that broke."""
    parts = [describe(a) for a in args] + [f"{k}={describe(v)}" for k, v in kwargs.items()]
    return ", ".join(parts) if parts else "no arguments"


def expect_tensor(value: Any, shape: tuple[int, ...], what: str) -> torch.Tensor:
    expect(isinstance(value, torch.Tensor),
           composed("{what} should be a torch.Tensor, got {kind}.", what=what, kind=type(value).__name__),
           "return a tensor, not a list or a NumPy array.")
    expect(tuple(value.shape) == tuple(shape),
           composed("{what} has shape {got}, expected {want}.", what=what, got=tuple(value.shape), want=tuple(shape)),
           "check each reshape/view against the shapes in the docstring.")
    return value


def expect_close(actual: torch.Tensor, expected: torch.Tensor, what: str, hint: str,
                 atol: float = 1e-5, rtol: float = 1e-5) -> None:
    """Elementwise closeness with float32 tolerances; the message shows the worst entry."""
    actual = actual.detach().to(expected.dtype)
    if actual.shape != expected.shape:
        fail(composed("{what} has shape {got}, expected {want}.", what=what, got=tuple(actual.shape),
                      want=tuple(expected.shape)), hint)
    if not torch.allclose(actual, expected, atol=atol, rtol=rtol):
        diff = (actual - expected).abs().nan_to_num(float("inf"))
        worst = int(diff.argmax())
        at = tuple(int(i) for i in torch.unravel_index(torch.tensor(worst), diff.shape)) if diff.dim() else ()
        largest = (f"largest difference {diff.max().item():.3g} at index {at[0] if len(at) == 1 else list(at)}"
                   if at else f"largest difference {diff.max().item():.3g}")
        fail(composed("{what} differs from the expected values: {largest} (got {got}, expected {want}).", what=what,
                      largest=largest, got=f"{actual.flatten()[worst].item():.6g}",
                      want=f"{expected.flatten()[worst].item():.6g}"), hint)


@contextlib.contextmanager
def forbid(*targets: tuple[Any, str], exercise: str) -> Iterator[None]:
    """Within the block, calling any ``(module, attribute)`` in targets raises ShortcutUsed,
    by its name and by any other route to the same operator (a reference saved earlier,
    ``torch.ops.aten``, ``torch._C``): see :class:`Forbidden`.

    When a test is judged outside the kernel, the student's code runs in the kernel, so
    the block is also set up there, around every call (see :mod:`course.probe`); what it
    caught there comes back, even when the student's code swallowed the error."""
    from .. import probe

    names = [(_path_of(owner), attr) for owner, attr in targets]
    here = Forbidden(targets, exercise)
    with probe.kernel_context("course.checks._core:forbid_names", names, exercise=exercise, owner=here):
        with here:
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


def forbid_names(names: list[tuple[str, str]], exercise: str) -> "Forbidden":
    """:func:`forbid` for ``(module or class path, attribute)`` pairs: what the kernel receives."""
    return Forbidden([(_resolve_path(p), a) for p, a in names], exercise)


# The operators (``torch.ops.aten`` names) that each forbidden built-in runs: the block stops
# them however they are reached. Built-ins made of other operators (one_hot, rms_norm on CPU,
# an optimizer) are blocked by name only.
OPERATORS = {
    "embedding": ("embedding",), "unfold": ("im2col",), "conv2d": ("convolution", "_convolution"),
    "softmax": ("_softmax",), "log_softmax": ("_log_softmax",), "logsumexp": ("logsumexp",),
    "scaled_dot_product_attention": ("_scaled_dot_product_flash_attention_for_cpu",
                                     "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
                                     "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_attention_math"),
    "gelu": ("gelu",), "silu": ("silu",), "layer_norm": ("native_layer_norm",), "rms_norm": ("_fused_rms_norm",),
    "native_layer_norm": ("native_layer_norm",),
    "group_norm": ("native_group_norm",), "cross_entropy": ("nll_loss_forward", "nll_loss2d_forward"),
    "nll_loss": ("nll_loss_forward", "nll_loss2d_forward"),
    # Moving an axis: .T, einsum("abc->cba") and torch.ops.aten.permute run permute; .mT, .H, .t() run transpose or t.
    **dict.fromkeys(("permute", "movedim", "moveaxis"), ("permute", "permute_copy")),
    **dict.fromkeys(("transpose", "swapaxes", "swapdims"), ("transpose", "transpose_", "transpose_copy", "t", "t_")),
}
# Blocked routes that are not a built-in doing the exercise's work: they move an axis.
MOVES_AN_AXIS = {"permute", "movedim", "moveaxis", "transpose", "swapaxes", "swapdims"}
# Forbidding any of these forbids running a backward pass inside the block.
AUTOGRAD = {("torch:Tensor", "backward"), ("torch.autograd", "grad"), ("torch.autograd", "backward")}


class Forbidden:
    """The context of :func:`forbid`: patches each target to raise ShortcutUsed and, for the
    operators the targets run (:data:`OPERATORS`) or a backward pass, records and stops them
    at dispatch (:class:`course.checks._recorders.ForbiddenOperators`)."""

    def __init__(self, targets, exercise: str) -> None:
        self.targets, self.exercise = list(targets), exercise
        self.labels = {(_path_of(o), a): f"{getattr(o, '__name__', o)}.{a}" for o, a in self.targets}
        # The last target that runs an operator names it.
        self.operators = {op: label for (_, attr), label in self.labels.items() for op in OPERATORS.get(attr, ())}
        self.backward = "autograd" if AUTOGRAD & set(self.labels) else None
        self.used = ""
        self._saved: list = []
        self._mode = None

    def message(self, label: str) -> str:
        """``label`` names the built-in, and the route when it was not called by its name."""
        return (f"{label} was called, but this exercise asks you to write {self.exercise} yourself.\n"
                f"Likely mistake: calling the built-in {label}; this exercise asks you to write "
                f"{self.exercise} yourself, and {self.why(label)}")

    def why(self, label: str) -> str:
        """What is true of the route ``label`` names (``Tensor.movedim (reached as ...)``): a sentence."""
        name = label.split(" (")[0]
        attr = next((a for (_, a), shown in self.labels.items() if shown == name), "")
        if attr in MOVES_AN_AXIS:
            return (f"{name} moves an axis, and the spec asks for the work done along the axis where it is "
                    "(reductions with dim=..., keepdim=True; a weight viewed to broadcast along that axis), not on "
                    "a copy moved to the end and back.")
        return f"{name} is a built-in that does that work for you."

    def stop(self, label: str) -> None:
        """Record the first built-in used (the grader reads it even if the error is swallowed)."""
        self.used = self.used or label
        raise ShortcutUsed(self.message(label))

    def __enter__(self) -> "Forbidden":
        from ._recorders import ForbiddenOperators

        for owner, attr in self.targets:
            self._saved.append((owner, attr, getattr(owner, attr)))
            setattr(owner, attr, self._blocked(f"{getattr(owner, '__name__', owner)}.{attr}"))
        if self.operators or self.backward or getattr(self, "every_operator", False):
            self._mode = ForbiddenOperators(self)
            self._mode.__enter__()
        return self

    def _blocked(self, label: str) -> Callable:
        def blocked(*args: Any, **kwargs: Any):
            self.stop(label)
        return blocked

    def __exit__(self, *exc: Any) -> None:
        try:
            if self._mode is not None:
                self._mode.__exit__(*exc)
        finally:
            for owner, attr, original in reversed(self._saved):
                setattr(owner, attr, original)
            self._saved.clear()

    # Judged outside the kernel: what the kernel's block caught comes back after each call.
    def remote_state(self) -> dict:
        return {"used": self.used}

    def absorb(self, state: dict) -> None:
        used = state.get("used") if isinstance(state, dict) else None
        if isinstance(used, str) and used:
            self.used = used[:300]
            raise ShortcutUsed(self.message(self.used))


@contextlib.contextmanager
def unmeasured(prediction: str) -> Iterator[None]:
    """Within the block, the student's code may run no tensor operation at all: ``prediction``
    (``"predicted_kv_cache_bytes"``) is to be computed from the configuration by arithmetic,
    not read off a measurement (a model run, the student's own functions applied to data).
    Set up in the kernel too, around every call, like :func:`forbid`."""
    from .. import probe

    here = Unmeasured(prediction)
    with probe.kernel_context("course.checks._core:Unmeasured", prediction, owner=here):
        with here:
            yield


class Unmeasured(Forbidden):
    """:func:`unmeasured`'s context: every operator at torch's dispatcher stops the call."""

    def __init__(self, prediction: str) -> None:
        super().__init__([], prediction)
        self.every_operator = True

    def message(self, label: str) -> str:
        return (f"{self.exercise} ran {label}, but it is a prediction: it is computed from the configuration, "
                f"not measured.\nLikely mistake: measuring instead of predicting ({label}); derive the number "
                f"from the sizes it is given with plain arithmetic (math, not tensors), as the exercise asks.")


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


def meta_table(rows: int, dim: int) -> torch.nn.Embedding:
    """An embedding table of shape (rows, dim) on the meta device (shapes only), left
    uninitialised: initialising one there imports TorchDynamo (2 s), a cost paid per grader."""
    return torch.nn.Embedding(rows, dim, _weight=torch.empty(rows, dim, device="meta"))


def generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@contextlib.contextmanager
def earlier_first(*earlier: tuple[str, Callable[[], None]]) -> Iterator[None]:
    """Blame an earlier exercise when this one fails because it calls a wrong earlier answer.

    ``earlier`` holds ``(what, run_check)`` pairs, for example ``("train_bpe calls your
    get_pair_counts and merge_pair, which fail exercise 1's tests", lambda: ...)``. When the
    block fails and one of these checks fails too, the hint says to fix that exercise first
    and quotes its own hint, and names every other earlier answer that fails as well; a stub
    (NotImplementedError) of an earlier answer is ignored, and so is a failure marked with
    ``own_fault`` (one no earlier answer can have caused)."""
    try:
        yield
    except CheckFailed as err:
        if getattr(err, "own", False):
            raise
        failing = []            # every earlier answer at fault, so that one round of fixes is enough
        for what, run_check in earlier:
            try:
                run_check()
            except NotImplementedError:
                continue
            except CheckFailed as inner:
                failing.append((what, inner.hint or inner.what))
        if not failing:
            raise
        (what, inner_hint), others = failing[0], [w for w, _ in failing[1:]]
        hint = (composed("{what}: fix that exercise first. Its test says: {hint} Besides, {others}.", what=what,
                         hint=inner_hint, others="; ".join(others))
                if others else composed("{what}: fix that exercise first. Its test says: {hint}", what=what,
                                        hint=inner_hint))
        raise CheckFailed.of(err.what, hint, blamed=what) from err


def earlier_answers(who: str, *answers: tuple[str, int, Any, Callable[[Any], None]]) -> list:
    """``earlier_first``'s pairs for the earlier answers that ``who`` calls. Each ``(phrase,
    exercise, answer, check)``, for example ``("calls your gelu", 1, gelu, check)``, gives "<who>
    calls your gelu, which fails exercise 1's tests" and ``check(answer)``; an answer that was not
    given (None) is left out."""
    return [(f"{who} {phrase}, which fails exercise {exercise}'s tests", functools.partial(check, answer))
            for phrase, exercise, answer, check in answers if answer is not None]


@contextlib.contextmanager
def own_fault() -> Iterator[None]:
    """Mark failures in this block as the exercise's own: its inputs were checked before it
    (or it calls no earlier answer), so ``earlier_first`` must not blame an earlier exercise."""
    try:
        yield
    except CheckFailed as err:
        err.own = True
        raise
