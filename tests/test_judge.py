"""The judge on its own: test cells run in this process against a kernel-less probe, through
the same request and reply files as the socket to a sandboxed kernel (remote.local_channel).

What these pin down: everything a check compares is compared here, on values (a tensor
subclass's own operators never run); in-place changes to arguments come back, aliasing
kept; gradients flow through the student's graph and back as data; the kernel's RNG is
seeded per call, never with the grader's state; hostile replies are refused within bounds.
"""

from __future__ import annotations

import pickle
import textwrap
from pathlib import Path

import pytest
import torch

from autograder import remote
from autograder.remote import StudentCodeError, local_channel, run_judged
from course import probe

STUDENT = textwrap.dedent('''
    import torch
    import torch.nn as nn

    class Liar(torch.Tensor):
        def __eq__(self, other):
            return True

        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            return True

    def lying_zeros(shape):
        return torch.Tensor._make_subclass(Liar, torch.zeros(shape), True)

    class Proxy:
        def __eq__(self, other):
            return True

    def proxy():
        return Proxy()

    def bump(x, y):
        x += 1
        y.mul_(0)

    class Lin(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(2, 3))

        def forward(self, x):
            return x @ self.weight.T

    def noise():
        return torch.rand(4), torch.initial_seed(), torch.get_rng_state()

    def fails():
        raise ValueError("bad shape")

    def shared_refs(depth):
        value = ["x" * 5000]
        for _ in range(depth):
            value = [value, value]
        return value
''')


@pytest.fixture()
def judge(tmp_path):
    """``judge(cell) -> what it printed``, against the student code above."""
    namespace: dict = {}
    exec(compile(STUDENT, "<answers>", "exec"), namespace)
    channel = local_channel(namespace, tmp_path)

    def run(cell: str) -> str:
        return run_judged(textwrap.dedent(cell), channel, "import torch", tmp_path)

    run.channel = channel
    return run


def test_a_subclass_that_agrees_with_everything_is_compared_on_its_values(judge):
    printed = judge("""
        got = lying_zeros(3)
        print(type(got).__name__, torch.allclose(got, torch.ones(3)), bool((got == torch.ones(3)).all()),
              torch.equal(got, torch.ones(3)))
    """)
    assert printed.split() == ["RemoteTensor", "False", "False", "False"]


def test_a_proxy_never_passes_for_a_tensor_or_an_equal_value(judge):
    printed = judge("""
        got = proxy()
        print(isinstance(got, torch.Tensor), got == 3, got == got)
    """)
    assert printed.split() == ["False", "False", "True"]


def test_in_place_changes_come_back_with_their_aliasing(judge):
    printed = judge("""
        x = torch.zeros(3)
        base = torch.ones(6)
        bump(x, base[2:5])
        shared = torch.ones(6)
        bump(shared[:3], shared[1:4])     # two views of one tensor: the second sees the first's change
        print(x.tolist(), base.tolist(), shared.tolist())
    """)
    assert printed.strip() == "[1.0, 1.0, 1.0] [1.0, 1.0, 0.0, 0.0, 0.0, 1.0] [2.0, 0.0, 0.0, 0.0, 1.0, 1.0]"


def test_gradients_flow_through_the_students_graph_and_back_as_data(judge):
    printed = judge("""
        model = Lin()
        x = torch.arange(6.0).reshape(2, 3).requires_grad_()
        out = model(x)
        (out * torch.tensor([1.0, 2.0])).sum().backward()
        print(isinstance(model.weight, torch.nn.Parameter), model.weight.grad.tolist(), x.grad.tolist())
        with torch.no_grad():
            model.weight.copy_(torch.full((2, 3), 2.0))     # a check's write reaches the kernel's tensor
        print(model(torch.ones(1, 3)).tolist())
    """)
    first, second = printed.strip().splitlines()
    assert first == "True [[3.0, 5.0, 7.0], [6.0, 10.0, 14.0]] [[3.0, 3.0, 3.0], [3.0, 3.0, 3.0]]"
    assert second == "[[6.0, 6.0]]"


def test_the_kernel_never_sees_the_graders_rng_and_each_call_gets_its_own(judge):
    printed = judge("""
        torch.manual_seed(1234)
        mine = torch.get_rng_state()
        a, seed_a, state_a = noise()
        b, seed_b, _ = noise()
        torch.manual_seed(1234)
        again, seed_again, _ = noise()
        print(seed_a != 1234, not torch.equal(state_a, mine), not torch.equal(a, b), torch.equal(a, again))
        with __import__("course.probe").probe.kernel_seed(77):
            _, pinned, _ = noise()
        print(pinned)
    """)
    assert printed.split() == ["True", "True", "True", "True", "77"]


def test_the_students_exception_comes_back_as_its_kind(judge):
    with pytest.raises(ValueError, match="bad shape"):
        judge("fails()")


def test_a_reply_of_shared_references_is_refused_within_bounds(judge):
    # What a kernel that writes its own replies can send: a few KB that decode to 2**17 lists.
    value = {"__list__": ["x" * 5000]}
    for _ in range(16):
        value = {"__list__": [value, value]}
    with pytest.raises(StudentCodeError, match="more than 1,000,000 parts"):
        judge.channel.decode(value)
    assert judge("print(len(shared_refs(3)))").strip() == "2"


def test_an_oversized_or_malformed_reply_is_refused_before_it_is_decoded(tmp_path, monkeypatch):
    reply = tmp_path / "reply.pt"
    torch.save({"value": list(range(2_000_000))}, reply)      # a large description, no tensor data
    with pytest.raises(StudentCodeError, match="description takes"):
        remote.read_reply(reply)
    assert not reply.exists()
    reply.write_bytes(pickle.dumps({"value": 1}))                # not the format torch.save writes
    with pytest.raises(StudentCodeError, match="format"):
        remote.read_reply(reply)
    monkeypatch.setattr(remote, "MAX_REPLY_BYTES", 3000)
    torch.save({"value": torch.zeros(1000)}, reply)
    with pytest.raises(StudentCodeError, match="bytes"):
        remote.read_reply(reply)
    torch.save({"value": 3}, reply)
    assert remote.read_reply(reply) == {"value": 3}


def test_a_reply_is_json_exactly_when_json_gives_its_values_back(tmp_path):
    from course import probe

    reply = tmp_path / "reply"
    plain = {"value": {"__dict__": [["a", 1], [2, {"__list__": [1.5, True, None, "x"]}]]}, "contexts": [[3, {"used": ""}]]}
    for value, as_json in ((plain, True), ({"value": (1, 2)}, False), ({"value": {1: 2}}, False),
                           ({"value": float("nan")}, False), ({"value": torch.arange(3)}, False)):
        probe.write_reply(value, str(reply))
        assert reply.read_bytes().startswith(probe.JSON_REPLY) == as_json, value
        got = remote.read_reply(reply)
        assert repr(got) == repr(value), (got, value)      # the same types: a tuple stays a tuple


def test_an_oversized_malformed_or_too_deep_json_reply_is_refused(tmp_path, monkeypatch):
    from course import probe

    reply = tmp_path / "reply"
    reply.write_bytes(probe.JSON_REPLY + b'{"value": [' + b"1," * (3 << 20) + b"1]}")
    with pytest.raises(StudentCodeError, match="description takes"):
        remote.read_reply(reply)
    assert not reply.exists()
    for text in (b'{"value": [1, 2', b"\xff\xfe", b"[" * 200_000 + b"]" * 200_000, b"[1, 2]"):
        reply.write_bytes(probe.JSON_REPLY + text)
        with pytest.raises(StudentCodeError, match="format"):
            remote.read_reply(reply)


def _same(got, want) -> bool:
    """Equal values of equal types; tensors with equal dtype, view, gradient flag and kind."""
    if isinstance(want, torch.Tensor):
        return (type(got) is type(want) and got.dtype == want.dtype and got.shape == want.shape
                and got.stride() == want.stride() and got.requires_grad == want.requires_grad
                and torch.equal(got.detach(), want.detach()))
    if type(want) in (list, tuple):
        return type(got) is type(want) and len(got) == len(want) and all(map(_same, got, want))
    if type(want) is dict:
        return type(got) is dict and list(got) == list(want) and all(_same(got[k], want[k]) for k in want)
    return type(got) is type(want) and (got == want or got != got and want != want)


def _tensor_replies() -> list[dict]:
    base = torch.arange(24, dtype=torch.float32).view(4, 6)
    return [
        {"value": {"__tuple__": [base, base[1:, ::2], base.T, torch.zeros(0, 3)]}, "changed": [[0, base]]},
        {"value": [torch.randn(3, dtype=torch.bfloat16), torch.tensor([True, False]), torch.arange(5) - 2,
                   torch.randn(2, dtype=torch.complex64), torch.tensor(7, dtype=torch.uint8)]},
        {"value": {"w": torch.nn.Parameter(torch.ones(2)), "g": torch.ones(2, requires_grad=True)},
         "grads": {3: torch.full((2,), 0.5), 4: None}},
        {"value": [float("nan"), float("-inf"), -0.0, 3 + 4j, b"\x00\xff", torch.Size([2, 3]), torch.float16,
                   torch.device("cpu"), {(1, "a"): "x"}, 2 ** 70, "\ud800"]},
    ]


def test_a_reply_with_tensors_reads_back_as_its_torch_save_would(tmp_path):
    packed, saved = tmp_path / "packed", tmp_path / "saved"
    for reply in _tensor_replies():
        probe.write_reply(reply, str(packed))
        assert packed.read_bytes().startswith(probe.TENSOR_REPLY), reply
        torch.save(reply, saved)
        got, want = remote.read_reply(packed), remote.read_reply(saved)
        assert _same(got, want) and _same(got, reply), (got, want)
    views, parameters = (_written_and_read(reply, packed)["value"] for reply in _tensor_replies()[:3:2])
    assert views["__tuple__"][1].untyped_storage() is views["__tuple__"][0].untyped_storage()   # as sent
    assert type(parameters["w"]) is torch.nn.Parameter


def _written_and_read(reply: dict, path: Path) -> dict:
    probe.write_reply(reply, str(path))
    return remote.read_reply(path)


def test_a_reply_the_packed_format_cannot_hold_goes_with_torch_save(tmp_path):
    from collections import OrderedDict

    reply = tmp_path / "reply"
    for value in (OrderedDict(a=torch.ones(1)), (torch.ones(2, 2) + 1j).conj()):
        probe.write_reply({"value": value}, str(reply))
        assert not reply.read_bytes().startswith((probe.TENSOR_REPLY, probe.JSON_REPLY))
        got = remote.read_reply(reply)["value"]
        assert type(got) is type(value) and repr(got) == repr(value)


def _packed(header: dict, data: bytes = b"") -> bytes:
    import json

    text = json.dumps(header).encode()
    return probe.TENSOR_REPLY + len(text).to_bytes(8, "little") + text + data


def test_a_malformed_tensor_reply_is_refused_before_a_tensor_is_made(tmp_path):
    reply = tmp_path / "reply"
    entry = [0, "float32", 0, [2], [1], False, False]
    malformed = [
        _packed({"value": {"T": 0}, "storages": [8], "tensors": [[0, "float32", 1, [2], [1], False, False]]}, bytes(8)),
        _packed({"value": {"T": 0}, "storages": [8], "tensors": [[0, "object", 0, [1], [1], False, False]]}, bytes(8)),
        _packed({"value": {"T": 0}, "storages": [8], "tensors": [[0, "int64", 0, [1], [1], True, False]]}, bytes(8)),
        _packed({"value": {"T": 1}, "storages": [8], "tensors": [entry]}, bytes(8)),
        _packed({"value": {"T": 0}, "storages": [9], "tensors": [entry]}, bytes(8)),
        _packed({"value": {"x": 1}, "storages": [], "tensors": []}),
        _packed({"value": {"t": [], "d": []}, "storages": [], "tensors": []}),
        _packed({"value": {"dv": "anywhere"}, "storages": [], "tensors": []}),
        _packed({"value": {"T": 0}, "storages": [8], "tensors": [[0, "float32", -1, [1], [1], False, False]]}, bytes(8)),
        probe.TENSOR_REPLY + (1 << 40).to_bytes(8, "little") + b"{}",
    ]
    for data in malformed:
        reply.write_bytes(data)
        with pytest.raises(StudentCodeError, match="format"):
            remote.read_reply(reply)


def test_a_tensor_that_repeats_a_few_bytes_past_what_a_test_reads_is_refused_in_either_format(tmp_path):
    reply = tmp_path / "reply"
    reply.write_bytes(_packed({"value": {"T": 0}, "storages": [4], "tensors": [[0, "float32", 0, [1 << 40], [0],
                                                                               False, False]]}, bytes(4)))
    with pytest.raises(StudentCodeError, match="elements"):
        remote.read_reply(reply)
    torch.save({"value": torch.zeros(1).expand(1 << 40)}, reply)
    with pytest.raises(StudentCodeError, match="elements"):
        remote.read_reply(reply)


def test_a_request_keeps_views_strides_gradient_flags_and_parameters():
    base = torch.arange(12.0).view(3, 4)
    request = {"args": (base, base[:, 1:].t(), torch.nn.Parameter(torch.ones(2)), torch.ones(1, requires_grad=True))}
    whole, view, parameter, leaf = pickle.loads(remote.dumps(request))["args"]
    assert _same(whole, base) and _same(view, base[:, 1:].t()) and _same(leaf, request["args"][3])
    assert type(parameter) is torch.nn.Parameter and parameter.requires_grad
    whole[0, 1] = -1.0
    assert view[0, 0].item() == -1.0      # still a view of the same storage


def test_a_failure_quotes_at_most_its_limit():
    from course.checks._core import QUOTE_LIMIT, CheckFailed, fail

    with pytest.raises(CheckFailed) as caught:
        fail("got " + repr(["y" * 5000] * 2000), "x" * 10)
    assert len(str(caught.value)) < QUOTE_LIMIT + 200 and "more characters" in str(caught.value)


def test_hidden_inputs_depend_on_the_secret_and_the_answers_only():
    import nbformat

    from autograder.contract import submission_seed
    from notebook_tools import ROOT, grade_id

    nb = nbformat.read(ROOT / "solutions" / "ch01_embeddings" / "ch01_embeddings.ipynb", as_version=4)
    seed = submission_seed(7, nb)
    assert submission_seed(7, nb) == seed and submission_seed(8, nb) != seed
    nb.cells[0].source += "\n# a comment in the set-up cell"          # not an answer: same inputs
    assert submission_seed(7, nb) == seed
    answer = next(c for c in nb.cells if grade_id(c) == "ex1_answer")
    answer.source += "\n# a changed answer"
    assert submission_seed(7, nb) != seed
    assert probe.pinned_seed() is None


def test_what_a_check_defines_reaches_a_kernel_that_has_no_checks(tmp_path):
    """A test model of a chapter's checks, sent to a kernel that reads the course as the
    sandbox shows it (no chapter checks to import it from), arrives whole."""
    import subprocess
    import sys

    from autograder.kernel_view import build
    from course.checks import ch05

    build(Path(ch05.__file__).resolve().parents[1], tmp_path / "view" / "course")
    request = tmp_path / "request.pkl"
    request.write_bytes(remote.dumps({"args": (ch05._GroupsModel(),)}))
    done = subprocess.run([sys.executable, "-c", (
        "import pickle, sys, course.checks.ch05 as c\n"
        "assert not hasattr(c, '__file__') or 'view' in c.__file__, c.__file__\n"
        f"model = pickle.load(open({str(request)!r}, 'rb'))['args'][0]\n"
        "print(type(model).__name__, sum(p.numel() for p in model.parameters()) > 0)")],
        capture_output=True, text=True, cwd=tmp_path, env={"PYTHONPATH": str(tmp_path / "view"), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0 and done.stdout.split() == ["_GroupsModel", "True"], done.stderr[-2000:]
