"""The kernel's side of trusted grading: run the student's objects on the grader's inputs.

The grader judges test cells in its own process. Whenever a check there calls a student's
function, builds a student's class or reads an attribute of a student's object, the grader
writes a request file and asks the kernel to run :func:`serve` on it. The request
(trusted data, written by the grader) says what to do; the reply carries only plain data
(tensors, numbers, strings, containers of them), written as JSON when it holds nothing JSON
loses (no tensor, tuple or number key: most replies) and otherwise with ``torch.save``, which
the grader reads with ``torch.load(weights_only=True)`` (:func:`write_reply`). Anything else
stays in the kernel and is named by a reference number.

Nothing here decides a grade: a student who replaces this module only changes what the
grader receives, exactly as a different answer would.

Checks that must wrap the student's call in something that has to happen in the kernel
(blocking a built-in, recording tensor sizes) declare it with :func:`kernel_context`.
"""

from __future__ import annotations

import contextlib
import importlib
import itertools
import json
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


_PINNED_SEED: list[int] = []


@contextlib.contextmanager
def kernel_seed(seed: int) -> Iterator[None]:
    """Seed the global RNG with ``seed`` here and, for the calls forwarded while the block
    runs, in the kernel: for a check whose oracle replays the student's use of the global RNG
    (dropout masks in a training run) from the same seed. Other calls get a seed of their own."""
    torch.manual_seed(seed)
    _PINNED_SEED.append(int(seed))
    try:
        yield
    finally:
        _PINNED_SEED.pop()


def pinned_seed() -> int | None:
    return _PINNED_SEED[-1] if _PINNED_SEED else None


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
    if isinstance(obj, torch.Tensor):   # its values travel too: the grader compares them, not the kernel
        info["value"] = plain_copy(obj)
    return info


def plain_copy(tensor: torch.Tensor) -> torch.Tensor:
    """The values of a tensor as a plain ``torch.Tensor`` with no graph: a subclass's own
    operators (an ``__eq__`` that always agrees) are not called, and do not travel."""
    with torch._C.DisableTorchFunctionSubclass():
        return torch.Tensor.detach(tensor).clone()


def encode(value: Any, depth: int = 0) -> Any:
    """Plain data as itself (tensors detached); anything else as a reference."""
    if id(value) in _TWIN_PARTS:
        number, kind, name = _TWIN_PARTS[id(value)]
        return {"__twin__": number, "kind": kind, "path": name}
    if isinstance(value, torch.Tensor):
        if value.requires_grad:       # keeps its graph and its .grad in the kernel
            return _ref(value)
        # A subclass could carry its own comparison tricks: only its values travel.
        return plain_copy(value) if type(value) is not torch.Tensor else value
    if isinstance(value, PLAIN_SCALARS) or isinstance(value, (torch.dtype, torch.device, torch.Size)):
        return value
    if depth < 6 and isinstance(value, (list, tuple, dict, set, frozenset)):
        if isinstance(value, dict):
            if all(isinstance(k, PLAIN_SCALARS + (tuple,)) for k in value):
                return {"__dict__": [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in value.items()]}
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


def twin(number: int, module: torch.nn.Module | None) -> torch.nn.Module:
    """Unpickling hook for a grader's module handed to the student's code: the kernel keeps
    one copy (sent once: later requests send its number alone, ``module`` None); replies
    name its parts by path, and its state goes back when it changed, so the grader's own
    module sees what the student's code did to it."""
    if module is None:
        return _TWINS[number]
    if number not in _TWINS:
        _TWINS[number] = module
        _TWIN_PARTS[id(module)] = (number, "module", "")
        for name, sub in module.named_modules(remove_duplicate=False):
            _TWIN_PARTS.setdefault(id(sub), (number, "module", name))
        for name, p in module.named_parameters(remove_duplicate=False):
            _TWIN_PARTS.setdefault(id(p), (number, "parameter", name))
    return _TWINS[number]


_NAMESPACE: list[dict] = []     # set by a kernel-less channel (tests): the student's names


def use_namespace(namespace: dict | None) -> None:
    """Serve requests against ``namespace`` instead of IPython's (a kernel-less channel)."""
    _NAMESPACE[:] = [] if namespace is None else [namespace]


def _user_namespace() -> dict:
    if _NAMESPACE:
        return _NAMESPACE[0]
    try:
        return get_ipython().user_ns   # type: ignore[name-defined]  # noqa: F821
    except NameError:
        import __main__
        return vars(__main__)


def _assign(target: torch.Tensor, values: torch.Tensor) -> None:
    """The grader wrote into one of the kernel's tensors (new weights for a student's layer)."""
    with torch.no_grad(), torch._C.DisableTorchFunctionSubclass():
        if target.shape == values.shape and target.dtype == values.dtype:
            torch.Tensor.copy_(target, values)
        else:
            target.data = values


_AUTOGRAD_BACKWARD = torch.autograd.backward     # taken before any check blocks it for an exercise
_GRADER_BACKWARD: list[bool] = []


def grader_backward_running() -> bool:
    """True while the grader's own backward pass runs through the student's graph (a check
    that forbids autograd in the student's code must let it run)."""
    return bool(_GRADER_BACKWARD)


def _grader_backward(target: torch.Tensor, gradient: torch.Tensor) -> None:
    _GRADER_BACKWARD.append(True)
    try:
        _AUTOGRAD_BACKWARD([target], [gradient], retain_graph=True)
    finally:
        _GRADER_BACKWARD.pop()

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
    "value": lambda target, args, kwargs: target,
    "bases": lambda target, args, kwargs: _importable_bases(target),
    "items": lambda target, args, kwargs: list(itertools.islice(iter(target), 1_000_000)),
    "assign": lambda target, args, kwargs: _assign(target, args[0]),
    # The grader's backward pass reached one of the kernel's tensors: continue it through the
    # student's graph with the gradient the grader computed (plain data).
    "backward": lambda target, args, kwargs: _grader_backward(target, args[0]),
    "release": lambda target, args, kwargs: [d.clear() for d in (_OBJECTS, _NUMBERS, _MIRRORS, _TWINS, _TWIN_PARTS,
                                                                 _TWIN_SEEN)],
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
    """Run one request from the grader and write the reply. Called by the grader only.

    The request carries no RNG state: the student's code draws from a global RNG seeded
    with the request's ``seed`` (a number the grader drew for this call alone), inside a
    fork, so the kernel's own stream is left as it was."""
    import cloudpickle  # noqa: F401  (requests may hold closures pickled by cloudpickle)
    import pickle

    reply: dict[str, Any] = {}
    entered = []
    arguments: list[torch.Tensor] = []
    try:
        with open(request_path, "rb") as f:
            request = pickle.load(f)   # references and mirrors resolve while unpickling
        target, args, kwargs = request["target"], request["args"], request["kwargs"]
        arguments = tensor_leaves((args, kwargs))
        before = [(t._version, plain_copy(t)) for t in arguments]
        with contextlib.ExitStack() as stack:
            stack.enter_context(torch.random.fork_rng(devices=_rng_devices()))
            _seed_rngs(int(request["seed"]))
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
        reply["changed"] = _changed_arguments(arguments, before)
    except StopIteration:
        reply["stop"] = True
    except BaseException as err:  # noqa: BLE001 - everything the student's code raises goes back
        reply["error"] = {"type": type(err).__name__, "bases": [k.__name__ for k in type(err).__mro__],
                          "message": str(err)[:4000],
                          "traceback": "".join(traceback.format_exception(err))[-6000:]}
    reply["contexts"] = [[number, obj.remote_state()] for number, obj in entered if hasattr(obj, "remote_state")]
    reply["grads"] = _gradient_increments()
    reply["twins"] = _changed_twins()
    write_reply(reply, reply_path)


JSON_REPLY = b"course-reply-json\n"     # the first bytes of a reply written as JSON
TENSOR_REPLY = b"course-reply-tensors\n"     # ... as tagged JSON and the tensors' bytes


def write_reply(reply: dict, path: str) -> None:
    """The reply as JSON when JSON gives back exactly these values; else, when it holds only
    plain values and CPU tensors, as tagged JSON followed by the tensors' storages
    (:func:`pack_reply`); else with ``torch.save``.

    Most replies hold no tensor (an attribute read, a reference, a number), and such a reply
    costs a quarter to a third of the CPU as JSON, written and read, that it costs with
    torch.save; one with tensors, packed, a quarter to a third too (benchmarks/reply_formats.py),
    for a check that makes thousands of calls."""
    try:
        text = json.dumps(reply, allow_nan=False, separators=(",", ":"))
        exact = json.loads(text) == reply       # no tuple, number key or tensor was turned into something else
    except (TypeError, ValueError, RecursionError):
        exact = False
    if exact:
        with open(path, "wb") as f:
            f.write(JSON_REPLY + text.encode("utf-8"))
        return
    try:
        packed = pack_reply(reply)
    except (_NotPackable, RecursionError):
        torch.save(reply, path)
        return
    with open(path, "wb") as f:
        f.write(packed)


# ------------------------------------------------------------------ tensors as their bytes (both ways)
# A tensor travels as its storage's bytes and its view of them (dtype, offset, sizes, strides):
# what torch.save keeps, without its archive and per-tensor pickling (about 1 ms a request).

TENSOR_DTYPES = frozenset(name for name in (
    "float64", "float32", "float16", "bfloat16", "complex128", "complex64", "int64", "int32", "int16", "int8",
    "uint8", "uint16", "uint32", "uint64", "bool", "float8_e4m3fn", "float8_e5m2")
    if isinstance(getattr(torch, name, None), torch.dtype))


def packable(tensor: torch.Tensor) -> bool:
    """A tensor its bytes describe whole: a plain tensor or parameter on the CPU, strided,
    with nothing attached (hooks, attributes, a lazy conjugate) that bytes lose."""
    return (type(tensor) in (torch.Tensor, torch.nn.Parameter) and tensor.layout is torch.strided
            and tensor.device.type == "cpu" and str(tensor.dtype)[6:] in TENSOR_DTYPES
            and not (tensor.is_conj() or tensor.is_neg() or tensor._backward_hooks
                     or tensor.__dict__))


def storage_bytes(storage: torch.UntypedStorage) -> bytes:
    return torch.empty(0, dtype=torch.uint8).set_(storage).numpy().tobytes()


def storage_from_bytes(data: bytes) -> torch.UntypedStorage:
    """Unpickling hook: a storage that requests' tensors share, as its bytes."""
    return torch.UntypedStorage.from_buffer(data, dtype=torch.uint8)


def tensor_from_parts(storage: torch.UntypedStorage, dtype: torch.dtype, offset: int, size: tuple, stride: tuple,
                      requires_grad: bool) -> torch.Tensor:
    """Unpickling hook: a tensor as a view of ``storage``, as it was where it was pickled."""
    return torch.empty(0, dtype=dtype).set_(storage, offset, size, stride).requires_grad_(requires_grad)


class _NotPackable(Exception):
    """A reply value that :func:`pack_reply` does not write (it goes with torch.save)."""


def pack_reply(reply: dict) -> bytes:
    """``TENSOR_REPLY``, the length of the header (8 bytes, little-endian), the header (JSON:
    ``value``, ``storages`` (byte counts), ``tensors`` ([storage, dtype, offset, sizes,
    strides, requires_grad, is_parameter] each)), then the storages' bytes. In ``value`` a
    JSON object is always a tag with one key: ``t`` a tuple, ``d`` a dict (as key-value
    pairs), ``T`` a tensor by number, ``f`` a float JSON lacks, ``c`` complex, ``b`` bytes
    (base64), ``S`` a torch.Size, ``dt`` a dtype, ``dv`` a device."""
    import base64
    import math

    storages: dict[int, int] = {}       # storage's _cdata -> its number
    blobs: list[bytes] = []
    tensors: dict[int, int] = {}        # id(tensor) -> its number (one object, one tensor)
    entries: list[list] = []

    def tensor_number(tensor: torch.Tensor) -> int:
        if id(tensor) not in tensors:
            storage = tensor.untyped_storage()
            if storage._cdata not in storages:
                storages[storage._cdata] = len(blobs)
                blobs.append(storage_bytes(storage))
            tensors[id(tensor)] = len(entries)
            entries.append([storages[storage._cdata], str(tensor.dtype)[6:], tensor.storage_offset(),
                            list(tensor.shape), list(tensor.stride()), tensor.requires_grad,
                            type(tensor) is torch.nn.Parameter])
        return tensors[id(tensor)]

    def pack(value: Any) -> Any:
        kind = type(value)
        if value is None or kind in (bool, int, str):
            return value
        if kind is float:
            return value if math.isfinite(value) else {"f": repr(value)}
        if kind is list:
            return [pack(v) for v in value]
        if kind is tuple:
            return {"t": [pack(v) for v in value]}
        if kind is dict:
            return {"d": [[pack(k), pack(v)] for k, v in value.items()]}
        if kind in (torch.Tensor, torch.nn.Parameter) and packable(value):
            return {"T": tensor_number(value)}
        if kind is complex:
            return {"c": [pack(value.real), pack(value.imag)]}
        if kind is bytes:
            return {"b": base64.b64encode(value).decode("ascii")}
        if kind is torch.Size:
            return {"S": list(value)}
        if kind is torch.dtype and str(value)[6:] in TENSOR_DTYPES:
            return {"dt": str(value)[6:]}
        if kind is torch.device:
            return {"dv": str(value)}
        raise _NotPackable(kind.__name__)

    header = json.dumps({"value": pack(reply), "storages": [len(b) for b in blobs], "tensors": entries},
                        separators=(",", ":")).encode("utf-8")
    return b"".join([TENSOR_REPLY, len(header).to_bytes(8, "little"), header, *blobs])


def tensor_leaves(value: Any) -> list[torch.Tensor]:
    """The tensors among a call's arguments, in one fixed order (lists, tuples and dicts
    walked as the grader walks them), so both sides number them alike."""
    if isinstance(value, torch.Tensor):
        return [value]
    if type(value) in (list, tuple):
        return [t for v in value for t in tensor_leaves(v)]
    if type(value) is dict:
        return [t for v in value.values() for t in tensor_leaves(v)]
    return []


def _changed_arguments(arguments: list[torch.Tensor], before: list) -> list[tuple[int, torch.Tensor]]:
    """The arguments the student's code changed in place, by position, with their values now:
    the grader applies them to its own objects, as a call in its own process would."""
    changed = []
    for index, (tensor, (version, values)) in enumerate(zip(arguments, before)):
        now = plain_copy(tensor)
        if tensor._version != version or now.shape != values.shape or not torch.equal(now, values):
            changed.append((index, now))
    return changed


def _gradient_increments() -> dict[int, torch.Tensor | None]:
    """What the grader's leaf tensors gained in ``.grad`` since the last reply (then cleared
    here, so the grader adds each increment once to its own ``.grad``)."""
    out = {}
    for number, tensor in _MIRRORS.items():
        if tensor.grad is not None:
            out[number] = plain_copy(tensor.grad)
            tensor.grad = None
    return out


_TWIN_SEEN: dict[int, tuple] = {}     # twin number -> the versions of its state last sent


def _changed_twins() -> dict[int, dict[str, torch.Tensor]]:
    """The state of each grader's module whose tensors changed since it was last sent (in
    place or replaced), so that the grader's own module sees what the student's code did."""
    out = {}
    for number, module in _TWINS.items():
        state = module.state_dict(keep_vars=True)
        versions = tuple((k, id(v), v._version) for k, v in state.items())
        if _TWIN_SEEN.get(number) != versions:
            _TWIN_SEEN[number] = versions
            out[number] = {k: plain_copy(v) for k, v in state.items()}
    return out


def _seed_rngs(seed: int) -> None:
    """``torch.manual_seed`` without its wrappers (a few ms each, for thousands of calls)."""
    torch.default_generator.manual_seed(seed)
    if _rng_devices():
        torch.cuda.manual_seed_all(seed)


def _rng_devices() -> list[int]:
    return list(range(torch.cuda.device_count())) if torch.cuda.is_available() and torch.cuda.is_initialized() else []
