"""The trusted side of grading: stand-ins for the student's objects that live in the kernel.

A judged test cell runs in the grading process. Names it does not import (the student's
``Embedding``, ``train``, a trained ``lm_model``) are :class:`RemoteObject` stand-ins:
calling one, reading an attribute or iterating it sends a request to the sandboxed kernel
(:mod:`course.probe`), which does it there and replies with plain data. Tensors that
need gradients keep their graph in the kernel, and come here as :class:`RemoteTensor`: a
copy of their values that every comparison runs on, here; a backward pass that reaches one
sends its gradient to the kernel, so a check's ``out.sum().backward()`` then
``weight.grad`` works as it would in one process. No function of a check's runs in the
kernel; the check helpers, their oracles and their verdicts never leave this process.

Requests are pickled (``cloudpickle``: the check's lambdas travel by value); replies are
JSON or read with ``torch.load(weights_only=True)`` (:func:`read_reply`), so a reply can
hold nothing but data.
"""

from __future__ import annotations

import builtins
import contextlib
import importlib
import io
import itertools
import json
import math
import os
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import cloudpickle
import torch

from course import probe
from course.checks import _core

# What the grader reads of one reply (the kernel writes it: hostile until read within these).
MAX_REPLY_BYTES = 192 << 20      # the whole file: tensors' bytes and the pickle
MAX_PICKLE_BYTES = 4 << 20       # the pickle alone: numbers, strings, lists; not tensor data
MAX_REPLY_PARTS = 1_000_000      # objects decoded (a shared one each time it occurs; long strings count more)
_NUMBERS = itertools.count(1)   # mirror and twin numbers, never reused within a grading process
_PICKLING = [0]   # while a request is pickled, stand-ins show their own class


# Requests that run none of the student's code (but for attribute reads, whose results are
# kept until the next request that may).
_READ_ONLY = frozenset({"getattr", "bases", "items", "len", "value", "repr"})


class KernelLost(RuntimeError):
    """The kernel died or stopped answering while a judged cell ran."""


class CellTimedOut(RuntimeError):
    """A judged cell ran past its time limit."""


class StudentCodeError(RuntimeError):
    """The student's code raised an exception of a type that only exists in the kernel."""


# Findings of the static scan that can switch off a rule the kernel enforces (set per
# submission by the grader: one submission at a time per grading process), and the rules the
# current test cell relied on while they were in doubt.
_DOUBTS: list[str] = []
_DOUBTED: set[str] = set()


@contextlib.contextmanager
def doubt_kernel_rules(notes: list[str]) -> Iterator[None]:
    """While the block grades a submission whose code can switch off the rules a check sets up
    in the kernel (``notes``: the scan's findings, see :mod:`autograder.tamper`), a test that
    relies on such a rule cannot pass: what the kernel reports of a forbidden built-in or a
    recorded size cannot be trusted. A test that fails on its own keeps its own verdict and
    hint (:func:`run_judged`); one that would pass fails with the first finding as its reason."""
    _DOUBTS[:] = list(notes)
    try:
        yield
    finally:
        _DOUBTS.clear()
        _DOUBTED.clear()


_RULES = {"course.checks._core:forbid_names": "a built-in it forbids",
          "course.checks._core:Unmeasured": "no tensor operation in a prediction",
          "course.checks._recorders:LargestTensor": "a record of the largest tensor your code makes",
          "course.checks._recorders:PairCountsRecord": "a count of the updates your code makes to pair_counts"}


def _note_doubted_rules(contexts: list) -> None:
    if contexts and _DOUBTS:
        _DOUBTED.update(_RULES.get(factory, factory) for _, factory, *_ in contexts)


def _refuse_a_pass_under_doubt() -> None:
    """Called when a test cell passed: it fails if it relied on a rule in doubt."""
    if not _DOUBTED:
        return
    from course.checks import CheckFailed

    finding = _DOUBTS[0].removeprefix("review:").strip()
    rules = ", ".join(sorted(_DOUBTED))
    _DOUBTED.clear()
    raise CheckFailed.of(f"This test relies on a rule the grader sets up in your kernel ({rules}), and your "
                         f"code can switch such rules off (below); it scores nothing until an instructor "
                         f"reviews it.",
                         f"{finding}. An answer needs only torch's public functions: take that out and this "
                         f"test counts again.")


class Channel:
    """Requests to one kernel. ``serve(request_path, reply_path, timeout)`` has the kernel's
    probe answer one request file with a reply file and returns the error text, or None; it
    raises :class:`KernelLost` or :class:`CellTimedOut`."""

    def __init__(self, serve: Callable[[Path, Path, float], str | None], io_dir: Path, deadline: float) -> None:
        self.serve, self.io_dir, self.deadline = serve, Path(io_dir), deadline
        self.count = 0
        self.mirrors: dict[int, torch.Tensor] = {}    # our leaf tensors, by mirror number
        self.objects: dict[int, RemoteObject] = {}    # one stand-in per kernel object: `is` works
        self._mirror_numbers: dict[int, int] = {}
        self.twins: dict[int, torch.nn.Module] = {}   # our modules handed to the student's code
        self._twin_numbers: dict[int, int] = {}
        self._twins_delivered: set[int] = set()     # twins the kernel holds a copy of
        self._attributes: dict[tuple[int, str], Any] = {}   # read since the student's code last ran
        self.generation = 0          # how many times the student's code may have run
        self._parts = 0
        self.in_backward = False

    def request(self, op: str, target: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        from torch.utils._python_dispatch import _disable_current_modes

        key = (target._number, args[0]) if op == "getattr" and isinstance(target, RemoteObject) else None
        if key is not None and key in self._attributes:
            return self._attributes[key]
        if op not in _READ_ONLY:   # the student's code may run: what we read before may change
            self._attributes.clear()
            self.generation += 1
        with _disable_current_modes():   # a check's recording mode must not see our own tensors
            value = self._request(op, target, args, kwargs)
        if key is not None and key[0] > 0:
            self._attributes[key] = value
        return value

    def _request(self, op: str, target: Any, args: tuple, kwargs: dict | None) -> Any:
        self.count += 1
        request_path = self.io_dir / f"request-{self.count}.pkl"
        reply_path = self.io_dir / f"reply-{self.count}.pt"
        contexts = probe.active_contexts()
        _note_doubted_rules(contexts)
        kwargs = kwargs or {}
        originals = probe.tensor_leaves((args, kwargs))
        payload = {"op": op, "target": target, "args": self._mirrored(args), "kwargs": self._mirrored(kwargs),
                   "grad": torch.is_grad_enabled(), "seed": self._call_seed(),
                   "contexts": [(n, factory, a, k) for n, factory, a, k, _ in contexts]}
        _PICKLING[0] += 1
        try:
            request_path.write_bytes(dumps(payload))
        finally:
            _PICKLING[0] -= 1
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            raise CellTimedOut("ran past the time limit")
        error = self.serve(request_path, reply_path, remaining)
        request_path.unlink(missing_ok=True)
        if error is not None or not reply_path.is_file():
            raise StudentCodeError("the kernel could not run the student's code for the grader "
                                   f"({(error or 'no reply').strip().splitlines()[-1][:300]}); "
                                   "was something of the course's code replaced?")
        reply = read_reply(reply_path)
        if "error" not in reply:
            self._twins_delivered.update(self.twins)
        self._absorb(reply, contexts)
        self._apply_changes(originals, reply.get("changed"))
        if reply.get("stop"):
            raise StopIteration
        if "error" in reply:
            raise _rebuild_error(reply["error"])
        return self.decode(reply.get("value"))

    @staticmethod
    def _call_seed() -> int:
        """The seed of the kernel's RNG for one call: drawn from this process's global RNG,
        so that a check that seeds it gets the same randomness in the student's code twice,
        and two calls in a row get different streams. The kernel sees only this number, not
        the state or the seed it was drawn from. Inside :func:`course.probe.kernel_seed`, the
        check's own seed."""
        pinned = probe.pinned_seed()
        return pinned if pinned is not None else int(torch.randint(0, 2**62, (1,)).item())

    def _apply_changes(self, originals: list, changed: Any) -> None:
        """Arguments the student's code changed in place: the same change to ours, as a call
        in this process would have made it."""
        for item in changed if isinstance(changed, list) else []:
            if not (isinstance(item, (tuple, list)) and len(item) == 2 and isinstance(item[1], torch.Tensor)):
                continue
            index, value = item
            if isinstance(index, int) and 0 <= index < len(originals):
                ours = originals[index]
                with torch.no_grad():
                    if ours.shape == value.shape:
                        ours.copy_(value.to(ours.dtype))
                    else:
                        ours.data = value.to(ours.dtype)

    def _absorb(self, reply: dict, contexts: list) -> None:
        pairs = reply.get("contexts")
        states = {p[0]: p[1] for p in pairs if isinstance(p, list) and len(p) == 2 and type(p[0]) is int} \
            if isinstance(pairs, list) else {}
        for number, _, _, _, owner in contexts:
            if owner is not None and number in states and hasattr(owner, "absorb"):
                owner.absorb(states[number])
        for number, state in (reply.get("twins") or {}).items():
            if number in self.twins and isinstance(state, dict):
                with torch.no_grad():
                    self.twins[number].load_state_dict(state, strict=False)
        increments = {n: g for n, g in (reply.get("grads") or {}).items()
                      if n in self.mirrors and isinstance(g, torch.Tensor) and g.shape == self.mirrors[n].shape}
        if increments and self.in_backward:   # after this process's own backward pass has finished
            torch.autograd.Variable._execution_engine.queue_callback(lambda: self._add_grads(increments))
        else:
            self._add_grads(increments)

    def _add_grads(self, increments: dict[int, torch.Tensor]) -> None:
        for number, grad in increments.items():
            mirror = self.mirrors[number]
            mirror.grad = grad.to(mirror.dtype) if mirror.grad is None else mirror.grad + grad

    def backward(self, tensor: "RemoteTensor", grad: torch.Tensor) -> None:
        """This process's backward pass reached a tensor of the kernel's: the kernel continues
        it through the student's graph (hook of :class:`RemoteTensor`)."""
        self.in_backward = True
        try:
            self.request("backward", tensor, (grad.detach(),))
        finally:
            self.in_backward = False

    def _mirrored(self, value: Any) -> Any:
        """Leaf tensors that need gradients travel as mirrors (their .grad comes back);
        our modules as twins (their state comes back)."""
        if isinstance(value, (RemoteObject, RemoteTensor)):    # before any isinstance that asks its __class__
            return value
        if isinstance(value, torch.Tensor):
            if value.requires_grad and value.is_leaf:
                number = self._mirror_numbers.setdefault(id(value), next(_NUMBERS))
                self.mirrors[number] = value      # kept alive, so its id stays its own
                return _MirrorToken(number, value.detach())
            # a tensor computed here from the kernel's: its values (its graph stays here)
            return value.detach() if value.requires_grad else value
        if isinstance(value, torch.nn.Module):
            number = self._twin_numbers.setdefault(id(value), next(_NUMBERS))
            self.twins[number] = value
            # Once the kernel holds its copy, the number alone: a module (its class by value)
            # pickled into every request cost more than the student's code it ran.
            return _TwinToken(number, None if number in self._twins_delivered else value)
        if type(value) in (list, tuple):
            return type(value)(self._mirrored(v) for v in value)
        if type(value) is dict:
            return {k: self._mirrored(v) for k, v in value.items()}
        return value

    def decode(self, value: Any) -> Any:
        """A reply's value with the kernel's objects as stand-ins, within :data:`MAX_REPLY_PARTS`."""
        self._parts = 0
        return self._decode(value)

    def _decode(self, value: Any) -> Any:
        # Shared references decode as often as they occur: a few KB could expand without bound.
        self._parts += 1 + (len(value) >> 6 if isinstance(value, (str, bytes)) else 0)
        if self._parts > MAX_REPLY_PARTS:
            raise StudentCodeError(f"the student's code returned a value of more than {MAX_REPLY_PARTS:,} parts "
                                   "(counting shared ones each time), more than a test reads")
        if isinstance(value, dict):
            if "__twin__" in value and int(value["__twin__"]) in self.twins:
                module, path = self.twins[int(value["__twin__"])], str(value.get("path", ""))
                return module.get_parameter(path) if value.get("kind") == "parameter" else module.get_submodule(path)
            if "__ref__" in value:
                return self._reference(int(value["__ref__"]), value)
            if "__dict__" in value:
                return {self._key(self._decode(k)): self._decode(v) for k, v in value["__dict__"]}
            for name, kind in (("__list__", list), ("__tuple__", tuple), ("__set__", set), ("__frozenset__", frozenset)):
                if name in value:
                    items = [self._decode(v) for v in value[name]]
                    return kind(self._key(i) for i in items) if kind in (set, frozenset) else kind(items)
            return {k: self._decode(v) for k, v in value.items()}
        return value

    def _reference(self, number: int, info: dict) -> Any:
        """The stand-in of kernel object ``number``: one per object, so ``is`` works; a tensor's
        values, sent with every reference to it, refresh its stand-in."""
        values = info.get("value")
        if info.get("tensor") and isinstance(values, torch.Tensor) and (values.is_floating_point() or values.is_complex()):
            known = self.objects.get(number)
            if isinstance(known, RemoteTensor):
                known._refresh_with(values, self.generation)
                return known
            bases = [str(b) for b in info.get("bases") or []]
            kind = RemoteParameter if "torch.nn.parameter:Parameter" in bases else RemoteTensor
            self.objects[number] = kind(values, self, number)
            return self.objects[number]
        if number not in self.objects:
            self.objects[number] = RemoteObject(self, number, "", info.get("bases") or [], str(info.get("type", "")))
        return self.objects[number]

    @staticmethod
    def _key(value: Any) -> Any:
        return tuple(value) if isinstance(value, list) else value


def dumps(payload: Any) -> bytes:
    """A request as bytes. What the checks define (a test model, a closure) travels by value:
    the kernel has no chapter checks to import it from (:mod:`autograder.kernel_view`)."""
    import sys

    from .kernel_view import KERNEL_SIDE_CHECKS

    seen = (len(sys.modules), next(reversed(sys.modules)))
    if seen != _MODULES_SEEN[0]:       # a module imported since: look again (a scan of
        _MODULES_SEEN[0] = seen         # sys.modules on every request cost ~5 ms)
        kept = {f"course.checks.{name[:-3]}" for name in KERNEL_SIDE_CHECKS if name != "__init__.py"}
        for name, module in list(sys.modules.items()):
            if name.startswith("course.checks.") and name not in kept and name not in _BY_VALUE:
                cloudpickle.register_pickle_by_value(module)
                _BY_VALUE.add(name)
    buffer = io.BytesIO()
    _RequestPickler(buffer).dump(payload)
    return buffer.getvalue()


class _RequestPickler(cloudpickle.CloudPickler):
    """cloudpickle, with a CPU tensor sent as its storage's bytes and its view of them
    (:func:`course.probe.tensor_from_parts`): pickling a tensor by default saves and loads
    its storage with torch.save, about ten times the CPU on both sides. Views of one storage
    stay views of one storage (the storage object is pickled once, then by reference)."""

    def reducer_override(self, obj: Any) -> Any:
        kind = type(obj)
        if kind is torch.Tensor and probe.packable(obj):
            return probe.tensor_from_parts, (obj.untyped_storage(), obj.dtype, obj.storage_offset(),
                                             tuple(obj.shape), obj.stride(), obj.requires_grad)
        if kind is torch.UntypedStorage and obj.device.type == "cpu":
            return probe.storage_from_bytes, (probe.storage_bytes(obj),)
        return super().reducer_override(obj)


_BY_VALUE: set[str] = set()
_MODULES_SEEN: list[tuple] = [()]


def read_reply(path: Path) -> dict:
    """A reply file: JSON (:func:`course.probe.write_reply`), or else read with
    ``torch.load(weights_only=True)``, once its sizes are known to be within bounds: neither
    decoder has a limit of its own on time or memory."""
    try:
        size = path.stat().st_size
        if size > MAX_REPLY_BYTES:
            raise StudentCodeError(f"the student's code returned {size:,} bytes, more than a test reads "
                                   f"({MAX_REPLY_BYTES:,})")
        data = path.read_bytes()
    finally:
        path.unlink(missing_ok=True)
    if data.startswith(probe.JSON_REPLY):
        reply = _json_reply(data)
    elif data.startswith(probe.TENSOR_REPLY):
        reply = _tensor_reply(data)
    else:
        reply = _saved_reply(data)
    if not isinstance(reply, dict):
        raise _not_the_format()
    return reply


def _json_reply(data: bytes) -> Any:
    text = memoryview(data)[len(probe.JSON_REPLY):]
    _bound_description(len(text))
    try:
        return json.loads(bytes(text).decode("utf-8"))
    except (ValueError, RecursionError):     # not JSON, or nested past the parser's depth
        raise _not_the_format() from None


def _saved_reply(data: bytes) -> Any:
    import zipfile

    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            entries = archive.infolist()
    except zipfile.BadZipFile:
        raise _not_the_format() from None
    _bound_description(sum(e.file_size for e in entries if e.filename.endswith(".pkl")),
                       sum(e.file_size for e in entries))
    reply = torch.load(io.BytesIO(data), weights_only=True)
    _bound_tensors(reply)
    return reply


def _bound_tensors(value: Any, depth: int = 0) -> None:
    """Refuse a tensor of more elements than a test reads (a view that repeats a few bytes,
    with zero strides, could stand for terabytes)."""
    if isinstance(value, torch.Tensor):
        _bound_elements(value.numel(), value.element_size())
    elif isinstance(value, (list, tuple)) and depth < 64:
        for item in value:
            _bound_tensors(item, depth + 1)
    elif isinstance(value, dict) and depth < 64:
        for item in value.values():
            _bound_tensors(item, depth + 1)


def _bound_elements(numel: int, itemsize: int) -> None:
    if numel * itemsize > MAX_REPLY_BYTES:
        raise StudentCodeError(f"the student's code returned a tensor of {numel:,} elements, more than a test "
                               f"reads ({MAX_REPLY_BYTES:,} bytes)")


def _tensor_reply(data: bytes) -> Any:
    """A reply written by :func:`course.probe.pack_reply`, read strictly: every tag, number and
    view is checked before a tensor is made, and nothing else is made."""
    body = memoryview(data)[len(probe.TENSOR_REPLY):]
    length = int.from_bytes(body[:8], "little") if len(body) >= 8 else -1
    if not 0 <= length <= len(body) - 8:
        raise _not_the_format()
    _bound_description(length)
    try:
        header = json.loads(bytes(body[8:8 + length]).decode("utf-8"))
        storages = _storages(header["storages"], body[8 + length:])
        tensors = [_tensor(entry, storages) for entry in header["tensors"]]
        return _unpacked(header["value"], tensors)
    except (ValueError, TypeError, KeyError, IndexError, AttributeError, RecursionError):
        raise _not_the_format() from None


def _storages(sizes: list, data: memoryview) -> list[torch.UntypedStorage]:
    if type(sizes) is not list or not all(type(n) is int and n >= 0 for n in sizes) or sum(sizes) != len(data):
        raise ValueError
    starts = list(itertools.accumulate(sizes, initial=0))
    return [torch.UntypedStorage.from_buffer(data[a:b], dtype=torch.uint8) for a, b in zip(starts, starts[1:])]


def _tensor(entry: list, storages: list[torch.UntypedStorage]) -> torch.Tensor:
    number, dtype, offset, size, stride, requires_grad, parameter = entry
    counts = [number, offset, *size, *stride]
    if (dtype not in probe.TENSOR_DTYPES or type(size) is not list or type(stride) is not list
            or len(size) != len(stride) or len(size) > 64 or not all(type(n) is int and n >= 0 for n in counts)
            or type(requires_grad) is not bool or type(parameter) is not bool):
        raise ValueError
    dtype, numel = getattr(torch, dtype), math.prod(size)
    _bound_elements(numel, dtype.itemsize)
    last = offset + sum((n - 1) * s for n, s in zip(size, stride)) if numel else offset - 1
    if (last + 1) * dtype.itemsize > storages[number].nbytes():
        raise ValueError
    try:
        tensor = torch.empty(0, dtype=dtype).set_(storages[number], offset, size, stride)
        return torch.nn.Parameter(tensor, requires_grad) if parameter else tensor.requires_grad_(requires_grad)
    except RuntimeError:        # requires_grad on integers
        raise ValueError from None


def _unpacked(value: Any, tensors: list[torch.Tensor]) -> Any:
    if value is None or type(value) in (bool, int, float, str):
        return value
    if type(value) is list:
        return [_unpacked(v, tensors) for v in value]
    (tag, inner), = value.items()       # a tag: one key (anything else is not the format)
    if tag == "t" and type(inner) is list:
        return tuple(_unpacked(v, tensors) for v in inner)
    if tag == "d" and type(inner) is list:
        return {_unpacked(k, tensors): _unpacked(v, tensors) for k, v in inner}
    if tag == "T" and type(inner) is int and inner >= 0:
        return tensors[inner]
    if tag == "f" and inner in ("nan", "inf", "-inf"):
        return float(inner)
    if tag == "c" and type(inner) is list:
        parts = [_unpacked(v, tensors) for v in inner]
        if all(type(v) is float for v in parts):
            return complex(*parts)
    if tag == "b" and type(inner) is str:
        import base64
        return base64.b64decode(inner, validate=True)
    if tag == "S" and type(inner) is list and all(type(n) is int and n >= 0 for n in inner):
        return torch.Size(inner)
    if tag == "dt" and inner in probe.TENSOR_DTYPES:
        return getattr(torch, inner)
    if tag == "dv" and type(inner) is str and inner.startswith(("cpu", "cuda", "mps", "meta")):
        try:
            return torch.device(inner)
        except RuntimeError:
            raise ValueError from None
    raise ValueError


def _bound_description(pickled: int, unpacked: int = 0) -> None:
    """Refuse a reply whose description (the pickle or the JSON text, not tensor data) or
    unpacked size is over what a test reads."""
    if pickled > MAX_PICKLE_BYTES or unpacked > MAX_REPLY_BYTES:
        raise StudentCodeError(f"the student's code returned a value whose description takes {pickled:,} bytes, "
                               f"more than a test reads ({MAX_PICKLE_BYTES:,})")


def _not_the_format() -> StudentCodeError:
    return StudentCodeError("the kernel's reply was not in the format the grader reads")


class _MirrorToken:
    def __init__(self, number: int, tensor: torch.Tensor) -> None:
        self.number, self.tensor = number, tensor

    def __reduce__(self):
        return (probe.mirror, (self.number, self.tensor))


class _TwinToken:
    def __init__(self, number: int, module: torch.nn.Module) -> None:
        self.number, self.module = number, module

    def __reduce__(self):
        return (probe.twin, (self.number, self.module))


def _rebuild_error(info: dict) -> BaseException:
    """The student's exception, as an exception of the same kind here. Only built-in types
    are rebuilt; the course's own failures come back as CheckFailed (ShortcutUsed for a
    forbidden built-in) with their message."""
    from course.checks import CheckFailed, ShortcutUsed

    name, message = str(info.get("type", "Exception")), str(info.get("message", ""))
    bases = [str(b) for b in info.get("bases", [])]
    if "CheckFailed" in bases:   # a kernel-side rule's failure (a forbidden built-in): its kind kept
        return ShortcutUsed(message) if "ShortcutUsed" in bases else CheckFailed(message)
    if "KeyboardInterrupt" in bases:
        return CellTimedOut("ran past the time limit")
    for base in [name] + bases:
        kind = getattr(builtins, base, None)
        if isinstance(kind, type) and issubclass(kind, Exception) and kind not in (StopIteration,):
            try:
                return kind(message) if kind is not Exception or base == name else StudentCodeError(f"{name}: {message}")
            except TypeError:
                break
    return StudentCodeError(f"{name}: {message}")


def _local_class(bases: list[str]) -> type:
    for path in bases:
        module, _, qualname = path.partition(":")
        if module.startswith(("course", "torch", "collections", "builtins", "typing")):
            try:
                obj: Any = importlib.import_module(module)
                for part in qualname.split("."):
                    obj = getattr(obj, part)
                if isinstance(obj, type) and not issubclass(obj, torch.Tensor):   # tensors come as data
                    return obj
            except Exception:  # noqa: BLE001 - an unknown base is simply not used
                continue
    return object


_PASSED_THROUGH = frozenset({"__name__", "__qualname__", "__doc__", "__wrapped__"})


class RemoteObject:
    """An object in the kernel: the student's function, class, model or anything they return."""

    __slots__ = ("_channel", "_number", "_name", "_bases", "_type", "_meta")

    def __init__(self, channel: Channel, number: int, name: str = "", bases: list[str] | None = None,
                 type_name: str = "") -> None:
        object.__setattr__(self, "_channel", channel)
        object.__setattr__(self, "_number", number)
        object.__setattr__(self, "_name", name)
        object.__setattr__(self, "_bases", bases or [])
        object.__setattr__(self, "_type", type_name)
        object.__setattr__(self, "_meta", {})

    def __reduce__(self):
        return (probe.resolve, (self._number, self._name))

    def _do(self, op: str, *args: Any, **kwargs: Any) -> Any:
        return self._channel.request(op, self, args, kwargs)

    @property
    def __class__(self):  # isinstance(model, nn.Module) answers as it would in the kernel
        if _PICKLING[0]:
            return type(self)
        if not self._bases:
            names = self._do("bases")
            object.__setattr__(self, "_bases", [str(n) for n in names] if isinstance(names, list) else [])
        return _local_class(self._bases)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__") and name not in _PASSED_THROUGH:
            raise AttributeError(name)
        return self._do("getattr", name)

    def __setattr__(self, name: str, value: Any) -> None:
        self._do("setattr", name, value)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._channel.request("call", self, args, kwargs)

    def __getitem__(self, key: Any) -> Any:
        return self._do("getitem", key)

    def __setitem__(self, key: Any, value: Any) -> None:
        self._do("setitem", key, value)

    def __len__(self) -> int:
        return int(self._do("len"))

    def __iter__(self):
        # One round trip for the whole iteration (parameters, modules, a returned list).
        items = self._do("items")
        return iter(items if isinstance(items, list) else [])

    def __next__(self):
        return self._do("next")

    def __bool__(self) -> bool:
        return bool(self._do("bool"))

    def __repr__(self) -> str:
        try:
            return str(self._do("repr"))
        except Exception:  # noqa: BLE001 - a broken __repr__ of the student's must not hide the verdict
            return f"<{self._type or self._name or 'object'} in the kernel>"

    __str__ = __repr__

    def __hash__(self) -> int:
        return object.__hash__(self)

    def __eq__(self, other: Any) -> Any:
        return self is other


class RemoteTensor(torch.Tensor):
    """A tensor of the student's that carries a gradient graph in the kernel.

    Here it is a leaf holding a copy of its values: every operation a check applies to it
    (a comparison, arithmetic, ``allclose``) runs in this process, on those values; nothing
    is asked of the kernel but the values themselves. When this process's backward pass
    reaches it, its gradient (plain data) goes to the kernel, which continues the pass
    through the student's graph; ``.grad`` and ``data_ptr()`` are read from the kernel's
    tensor. Its values are fetched again when the student's code has run since."""

    @staticmethod
    def __new__(cls, values: torch.Tensor, channel: Channel, number: int) -> "RemoteTensor":
        self = torch.Tensor._make_subclass(cls, values, True)
        self._channel, self._number, self._generation = channel, number, channel.generation
        self.register_hook(self._to_kernel)
        return self

    def _to_kernel(self, grad: torch.Tensor) -> None:
        self._channel.backward(self, grad)

    def __reduce_ex__(self, protocol: int):
        return (probe.resolve, (self._number, ""))

    def _refresh_with(self, values: torch.Tensor, generation: int) -> None:
        with torch._C.DisableTorchFunctionSubclass(), torch.no_grad():
            if values.shape == self.shape and values.dtype == self.dtype:
                torch.Tensor.copy_(self, values)
            else:
                self.data = values
        self._generation = generation

    def _fresh(self) -> None:
        if self._generation != self._channel.generation:    # the student's code ran since
            self._generation = self._channel.generation
            self._channel.request("value", self)             # the reply refreshes us (decode)

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        ours = [t for t in probe.tensor_leaves((args, kwargs)) if isinstance(t, RemoteTensor)]
        with torch._C.DisableTorchFunctionSubclass():
            for tensor in ours:
                tensor._fresh()
            before = [(t._version, torch.Tensor.data_ptr(t)) for t in ours]
            result = func(*args, **kwargs)
            # A check that writes into the student's tensor (``layer.weight.copy_(w)`` under
            # no_grad) writes the kernel's too: the new values travel, as data.
            for tensor, (version, pointer) in zip(ours, before):
                if tensor._version != version or torch.Tensor.data_ptr(tensor) != pointer:
                    tensor._push()
        return result

    def _push(self) -> None:
        self._channel.request("assign", self, (torch.Tensor.detach(self).clone(),))
        self._generation = self._channel.generation

    @property
    def grad(self) -> Any:
        return self._channel.request("getattr", self, ("grad",))

    @grad.setter
    def grad(self, value: Any) -> None:
        self._channel.request("setattr", self, ("grad", value))

    def data_ptr(self) -> int:
        return int(self._channel.request("call", self._channel.request("getattr", self, ("data_ptr",))))

    def __float__(self) -> float:
        return float(self.detach())

    def __int__(self) -> int:
        return int(self.detach())

    def __repr__(self, *args: Any, **kwargs: Any) -> str:
        return repr(self.detach())


class RemoteParameter(RemoteTensor, torch.nn.Parameter):
    """A :class:`RemoteTensor` whose kernel object is an ``nn.Parameter``."""



# The checks describe a RemoteObject as "an object of your code" and skip this folder's frames
# when they show a student's traceback: told here, so that the course knows nothing of the grader.
_core.register_runner(str(Path(__file__).resolve().parent), RemoteObject)


class TrustedNamespace(dict):
    """Globals of a judged cell: the set-up cell's imports, done here; every other name is
    the student's object of that name, in the kernel."""

    def __init__(self, channel: Channel, imports: str) -> None:
        super().__init__({"__builtins__": builtins, "__name__": "__course_judge__"})
        exec(compile(imports, "<set-up imports>", "exec"), self)  # noqa: S102 - course code, not the student's
        self.channel = channel

    def __missing__(self, name: str) -> RemoteObject:
        if hasattr(builtins, name):
            return getattr(builtins, name)
        try:   # plain values (None for a model never trained) come back as themselves
            return self.channel.request("value", RemoteObject(self.channel, 0, name))
        except KeyError:
            raise NameError(f"name {name!r} is not defined") from None


def local_channel(namespace: dict, io_dir: Path, timeout: float = 600) -> Channel:
    """A channel to a kernel-less probe in this process, with ``namespace`` as the student's
    names: each request and reply is written and read as over the socket (pickled request
    file, JSON or ``torch.load(weights_only=True)`` reply), so a check run through it behaves as it
    does under ``grade``: a copy of each argument, values back, the kernel's RNG its own."""

    def serve(request_path: Path, reply_path: Path, remaining: float) -> str | None:
        probe.use_namespace(namespace)
        try:
            probe.serve(str(request_path), str(reply_path))
        finally:
            probe.use_namespace(None)
        return None

    return Channel(serve, io_dir, time.monotonic() + timeout)


def run_judged(source: str, channel: Channel, imports: str, cwd: Path) -> str:
    """Run a test cell's code here, against the kernel's objects; returns what it printed.
    Raises what the checks raise (CheckFailed with a hint, NotImplementedError, ...)."""
    import contextlib

    namespace = TrustedNamespace(channel, imports)
    printed = io.StringIO()
    previous = os.getcwd()
    _DOUBTED.clear()
    try:
        os.chdir(cwd)
        with contextlib.redirect_stdout(printed):
            code = compile(source, "<test cell>", "exec")
            exec(code, {"__builtins__": builtins}, namespace)  # noqa: S102 - the course's test code
        _refuse_a_pass_under_doubt()
    finally:
        os.chdir(previous)
        _DOUBTED.clear()
    return printed.getvalue()
