"""The kernel's side of trusted grading: run the student's objects on the grader's inputs.

The grader judges test cells in its own process. Whenever a check there calls a student's
function, builds a student's class or reads an attribute of a student's object, the grader
writes a request file and asks the kernel to run :func:`serve` on it. The request
(trusted data, written by the grader) says what to do; the reply carries only plain data
(tensors, numbers, strings, containers of them), which the grader reads with
``torch.load(weights_only=True)``. Anything else stays in the kernel and is named by a
reference number.

Nothing here decides a grade: a student who replaces this module only changes what the
grader receives, exactly as a different answer would.

Checks that must wrap the student's call in something that has to happen in the kernel
(blocking a built-in, recording tensor sizes) declare it with :func:`kernel_context`.
"""

from __future__ import annotations

import contextlib
import importlib
import itertools
import operator
import traceback
import warnings
from typing import Any, Iterator

import torch

# ------------------------------------------------------------------ contexts (both sides)

_ACTIVE: list[tuple[int, str, tuple, dict, Any]] = []   # (id, factory path, args, kwargs, local object)


@contextlib.contextmanager
def kernel_context(factory: str, *args: Any, owner: Any = None, **kwargs: Any) -> Iterator[None]:
    """While the block runs, every forwarded call runs inside ``factory(*args, **kwargs)``
    in the kernel. ``factory`` is ``"module:attribute"``. If ``owner`` has a method
    ``absorb(state)``, it receives the kernel-side object's ``remote_state()`` after each
    call. Outside trusted grading this does nothing."""
    entry = (id(owner) if owner is not None else len(_ACTIVE), factory, args, kwargs, owner)
    _ACTIVE.append(entry)
    try:
        yield
    finally:
        _ACTIVE.remove(entry)


def active_contexts() -> list[tuple[int, str, tuple, dict, Any]]:
    return list(_ACTIVE)


def _resolve_factory(path: str) -> Any:
    module, _, attr = path.partition(":")
    obj = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj

# ------------------------------------------------------------------ kernel side

_OBJECTS: dict[int, Any] = {}      # reference number -> object kept in the kernel
_MIRRORS: dict[int, torch.Tensor] = {}   # grader's leaf tensors that need gradients
_next_ref = [0]

PLAIN_SCALARS = (bool, int, float, complex, str, bytes, type(None))


_NUMBERS: dict[int, int] = {}     # id(object) -> its reference number: one object, one number


def _keep(obj: Any) -> int:
    if id(obj) in _NUMBERS:
        return _NUMBERS[id(obj)]
    _next_ref[0] += 1
    _OBJECTS[_next_ref[0]] = obj
    _NUMBERS[id(obj)] = _next_ref[0]
    return _next_ref[0]


def _importable_bases(obj: Any) -> list[str]:
    out = []
    for klass in type(obj).__mro__:
        module = getattr(klass, "__module__", "")
        if module and module != "__main__" and not module.startswith("__"):
            out.append(f"{module}:{klass.__qualname__}")
    return out


def _ref(obj: Any) -> dict:
    info = {"__ref__": _keep(obj), "type": type(obj).__qualname__, "bases": _importable_bases(obj),
            "callable": callable(obj), "tensor": isinstance(obj, torch.Tensor)}
    if isinstance(obj, torch.Tensor):   # read often by checks: sent along, saves a round trip each
        info.update(shape=tuple(obj.shape), dtype=obj.dtype, device=str(obj.device))
    return info


def encode(value: Any, depth: int = 0) -> Any:
    """Plain data as itself (tensors detached); anything else as a reference."""
    if id(value) in _TWIN_PARTS:
        number, kind, name = _TWIN_PARTS[id(value)]
        return {"__twin__": number, "kind": kind, "path": name}
    if isinstance(value, torch.Tensor):
        if value.requires_grad:       # keeps its graph and its .grad in the kernel
            return _ref(value)
        # A subclass could carry its own comparison tricks: only its values travel.
        return value.detach().as_subclass(torch.Tensor).clone() if type(value) is not torch.Tensor else value
    if isinstance(value, PLAIN_SCALARS) or isinstance(value, (torch.dtype, torch.device, torch.Size)):
        return value
    if depth < 6 and isinstance(value, (list, tuple, dict, set, frozenset)):
        if isinstance(value, dict):
            if all(isinstance(k, PLAIN_SCALARS + (tuple,)) for k in value):
                return {"__dict__": [(encode(k, depth + 1), encode(v, depth + 1)) for k, v in value.items()]}
            return _ref(value)
        items = [encode(v, depth + 1) for v in value]
        kind = next(k for k in (list, tuple, set, frozenset) if isinstance(value, k)).__name__
        return {f"__{kind}__": items}
    return _ref(value)


def resolve(number: int, name: str = "") -> Any:
    """Unpickling hook for a reference: a kept object by number, or a name the student's
    code defined (number 0)."""
    return _OBJECTS[number] if number > 0 else _user_namespace()[name]


def mirror(number: int, tensor: torch.Tensor) -> torch.Tensor:
    """Unpickling hook for a grader's leaf tensor that needs its gradient: the kernel keeps
    one copy of it and reports its ``.grad`` after every request."""
    if number not in _MIRRORS:
        _MIRRORS[number] = tensor.detach().clone().requires_grad_(True)
    return _MIRRORS[number]


_TWINS: dict[int, torch.nn.Module] = {}          # the grader's modules, as copies here
_TWIN_PARTS: dict[int, tuple[int, str, str]] = {}   # id(part) -> (twin number, kind, dotted name)


def twin(number: int, module: torch.nn.Module) -> torch.nn.Module:
    """Unpickling hook for a grader's module handed to the student's code: the kernel keeps
    one copy; replies name its parts by path, and its state goes back after each request,
    so the grader's own module sees what the student's code did to it."""
    if number not in _TWINS:
        _TWINS[number] = module
        _TWIN_PARTS[id(module)] = (number, "module", "")
        for name, sub in module.named_modules(remove_duplicate=False):
            _TWIN_PARTS.setdefault(id(sub), (number, "module", name))
        for name, p in module.named_parameters(remove_duplicate=False):
            _TWIN_PARTS.setdefault(id(p), (number, "parameter", name))
    return _TWINS[number]


def _user_namespace() -> dict:
    try:
        return get_ipython().user_ns   # type: ignore[name-defined]  # noqa: F821
    except NameError:
        import __main__
        return vars(__main__)


_OPS = {
    "call": lambda target, args, kwargs: target(*args, **kwargs),
    "getattr": lambda target, args, kwargs: getattr(target, args[0]),
    "setattr": lambda target, args, kwargs: setattr(target, args[0], args[1]),
    "getitem": lambda target, args, kwargs: target[args[0]],
    "setitem": lambda target, args, kwargs: operator.setitem(target, args[0], args[1]),
    "len": lambda target, args, kwargs: len(target),
    "iter": lambda target, args, kwargs: iter(target),
    "next": lambda target, args, kwargs: next(target),
    "bool": lambda target, args, kwargs: bool(target),
    "repr": lambda target, args, kwargs: repr(target)[:2000],
    "function": lambda target, args, kwargs: target(*args, **kwargs),   # target: a torch function
    "value": lambda target, args, kwargs: target,
    "bases": lambda target, args, kwargs: _importable_bases(target),
    "items": lambda target, args, kwargs: list(itertools.islice(iter(target), 1_000_000)),
    "detach": lambda target, args, kwargs: target.detach(),
    "release": lambda target, args, kwargs: [d.clear() for d in (_OBJECTS, _NUMBERS, _MIRRORS, _TWINS, _TWIN_PARTS)],
}


def serve_loop(address: str) -> None:
    """Serve the grader's requests for one test cell, over the Unix socket at ``address``:
    each line names a request file and a reply file; "ok" answers when the reply is written.
    Returns when the grader hangs up. Called by the grader only (one kernel request per
    test cell instead of one per call: the calls are many and each request costs a few ms)."""
    import socket

    link = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    link.connect(address)
    try:
        for line in link.makefile("rb"):
            request_path, _, reply_path = line.decode("utf-8").rstrip("\n").partition("\t")
            serve(request_path, reply_path)
            link.sendall(b"ok\n")
    finally:
        link.close()


def serve(request_path: str, reply_path: str) -> None:
    """Run one request from the grader and write the reply. Called by the grader only."""
    import cloudpickle  # noqa: F401  (requests may hold closures pickled by cloudpickle)
    import pickle

    reply: dict[str, Any] = {}
    entered = []
    try:
        with open(request_path, "rb") as f:
            request = pickle.load(f)   # references and mirrors resolve while unpickling
        torch.set_rng_state(request["rng"])
        target, args, kwargs = request["target"], request["args"], request["kwargs"]
        with contextlib.ExitStack() as stack:
            # Each call shows its warnings afresh (as a kernel request of its own would), so
            # that a warning is shown under the visible test that caused it.
            stack.enter_context(warnings.catch_warnings())
            for number, factory, c_args, c_kwargs in request["contexts"]:
                obj = _resolve_factory(factory)(*c_args, **c_kwargs)
                stack.enter_context(obj)
                entered.append((number, obj))
            stack.enter_context(torch.set_grad_enabled(request["grad"]))
            value = _OPS[request["op"]](target, args, kwargs)
        reply["value"] = encode(value)
    except StopIteration:
        reply["stop"] = True
    except BaseException as err:  # noqa: BLE001 - everything the student's code raises goes back
        reply["error"] = {"type": type(err).__name__, "bases": [k.__name__ for k in type(err).__mro__],
                          "message": str(err)[:4000],
                          "traceback": "".join(traceback.format_exception(err))[-6000:]}
    reply["rng"] = torch.get_rng_state()
    reply["contexts"] = {number: obj.remote_state() for number, obj in entered if hasattr(obj, "remote_state")}
    reply["grads"] = {n: (t.grad.detach().clone() if t.grad is not None else None) for n, t in _MIRRORS.items()}
    reply["twins"] = {n: {k: v.detach().clone() for k, v in m.state_dict().items()} for n, m in _TWINS.items()}
    torch.save(reply, reply_path)
