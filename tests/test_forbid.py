"""A forbidden built-in stays forbidden by every route: a reference saved before the test,
torch's operator registry, torch._C, a backward pass through autograd; and a student who
catches the error and answers otherwise still loses the test. Judged as ``grade`` judges,
through a kernel-less channel (the student's code runs under the kernel's copy of the block).
"""

from __future__ import annotations

import textwrap

import pytest
import torch

from autograder.remote import local_channel, run_judged
from course.checks import CheckFailed, ShortcutUsed

STUDENT = textwrap.dedent('''
    import torch
    import torch.nn.functional as F

    _saved_embedding = torch.embedding
    _saved_gelu = F.gelu
    _saved_grad = torch.autograd.grad

    def by_saved_reference(table, ids):
        return _saved_embedding(table, ids)

    def by_operator_registry(table, ids):
        return torch.ops.aten.embedding(table, ids)

    def by_private_binding(x):
        return torch._C._nn.gelu(x)

    def by_saved_gelu(x):
        return _saved_gelu(x)

    def by_saved_autograd(ids, grad_output, vocab_size):
        table = torch.zeros(vocab_size, grad_output.shape[-1], requires_grad=True)
        return _saved_grad(_saved_embedding(table, ids), table, grad_output)[0]

    def by_backward(ids, grad_output, vocab_size):
        table = torch.zeros(vocab_size, grad_output.shape[-1], requires_grad=True)
        (table[ids] * grad_output).sum().backward()
        return table.grad

    def swallowed(table, ids):
        try:
            return _saved_embedding(table, ids)
        except Exception:
            return table[ids]          # the honest answer, after the shortcut was refused

    def by_hand(table, ids):
        return table[ids]

    def gelu_by_hand(x):
        return 0.5 * x * (1 + torch.erf(x / 2 ** 0.5))

    # Sums over axis 1 of a (2, 3, 4) tensor; all but the last move the axis to the end and back.
    def sum_by_T(x):
        return x.T.sum(-2, keepdim=True).T

    def sum_by_mT(x):
        return x.mT.sum(-1, keepdim=True).mT

    def sum_by_operator_registry(x):
        moved = torch.ops.aten.permute(x, [0, 2, 1])
        return torch.ops.aten.permute(moved.sum(-1, keepdim=True), [0, 2, 1])

    def sum_by_einsum(x):
        return torch.einsum("abc->acb", x).sum(-1, keepdim=True).movedim(-1, 1)

    def sum_in_place(x):
        return x.sum(1, keepdim=True)
''')

CALL_EMBEDDING = """
    from course.checks._core import forbid
    import torch.nn.functional as F
    table, ids = torch.randn(5, 3, requires_grad=True), torch.tensor([1, 4, 1])
    with forbid((F, "embedding"), (torch, "embedding"), exercise="the lookup"):
        out = {name}(table, ids)
    out.sum().backward()                   # the grader's own backward pass, outside the block
    print(table.grad.sum(dim=1).tolist())
"""
CALL_GELU = """
    from course.checks._core import forbid
    import torch.nn.functional as F
    x = torch.linspace(-3, 3, 7)
    with forbid((F, "gelu"), exercise="gelu"):
        got = {name}(x)
    print(bool(torch.allclose(got, F.gelu(x), atol=1e-6)))
"""
CALL_BACKWARD = """
    from course.checks._core import forbid
    with forbid((torch.Tensor, "backward"), (torch.autograd, "grad"), (torch.autograd, "backward"),
                exercise="the backward pass of the lookup"):
        print({name}(torch.tensor([0, 2, 2]), torch.ones(3, 4), 3).sum().item())
"""

CALL_MOVES = """
    from course.checks import ch04
    from course.checks._core import forbid
    x = torch.arange(24.0).reshape(2, 3, 4)
    with forbid(*ch04._MOVES, exercise="a sum along axis 1 without moving it"):
        print({name}(x).flatten().tolist() == x.sum(1, keepdim=True).flatten().tolist())
"""


@pytest.fixture()
def judge(tmp_path):
    namespace: dict = {}
    exec(compile(STUDENT, "<answers>", "exec"), namespace)
    channel = local_channel(namespace, tmp_path)
    return lambda cell: run_judged(textwrap.dedent(cell), channel, "import torch", tmp_path)


@pytest.mark.parametrize("cell, name, caught", [
    (CALL_EMBEDDING, "by_saved_reference", "torch.embedding (reached as torch's embedding operator)"),
    (CALL_EMBEDDING, "by_operator_registry", "torch.embedding (reached as torch's embedding operator)"),
    (CALL_EMBEDDING, "swallowed", "torch.embedding (reached as torch's embedding operator)"),
    (CALL_GELU, "by_private_binding", "torch.nn.functional.gelu (reached as torch's gelu operator)"),
    (CALL_GELU, "by_saved_gelu", "torch.nn.functional.gelu (reached as torch's gelu operator)"),
    (CALL_BACKWARD, "by_saved_autograd", "autograd (a backward pass ran inside your function)"),
    (CALL_BACKWARD, "by_backward", "Tensor.backward was called"),
])
def test_every_route_to_a_forbidden_builtin_fails_with_the_shortcut_hint(judge, cell, name, caught):
    with pytest.raises(CheckFailed) as failure:
        judge(cell.format(name=name))
    message = str(failure.value)
    assert caught in message, message
    assert "Likely mistake: calling the built-in" in message and "is a built-in that does that work" in message
    assert isinstance(failure.value, ShortcutUsed)        # its kind survives the way back from the kernel


@pytest.mark.parametrize("name, caught", [
    ("sum_by_T", "Tensor.permute (reached as torch's permute operator)"),
    ("sum_by_mT", "Tensor.transpose (reached as torch's transpose operator)"),
    ("sum_by_operator_registry", "Tensor.permute (reached as torch's permute operator)"),
    ("sum_by_einsum", "Tensor.permute (reached as torch's permute operator)"),
])
def test_an_axis_move_is_stopped_by_every_route_with_a_reason_true_of_it(judge, name, caught):
    """Moving an axis is forbidden for what it does (a copy), not because it is an oracle: the
    message says so, and names the operator that ran."""
    with pytest.raises(ShortcutUsed) as failure:
        judge(CALL_MOVES.format(name=name))
    message = str(failure.value)
    assert caught in message, message
    assert "moves an axis" in message and "oracle" not in message, message


@pytest.mark.parametrize("cell, name, printed", [
    (CALL_EMBEDDING, "by_hand", "[0.0, 6.0, 0.0, 0.0, 3.0]"),
    (CALL_GELU, "gelu_by_hand", "True"),
    (CALL_MOVES, "sum_in_place", "True"),
])
def test_an_answer_by_hand_passes_and_the_graders_backward_still_runs(judge, cell, name, printed):
    assert judge(cell.format(name=name)).strip() == printed


def test_in_this_process_a_saved_reference_is_stopped_as_well():
    """A learner's own kernel (no grader): the same block, the same failure."""
    import torch.nn.functional as F

    from course.checks._core import ShortcutUsed, forbid

    saved = F.gelu
    with pytest.raises(ShortcutUsed, match="gelu operator"):
        with forbid((F, "gelu"), exercise="gelu"):
            saved(torch.ones(2))
    assert torch.equal(F.gelu(torch.zeros(1)), torch.zeros(1))      # put back after the block


def test_code_that_can_switch_rules_off_fails_the_tests_that_rely_on_one(judge):
    """The scan found a route around the kernel's rules: a test under a rule fails with that
    finding; a test under none still counts."""
    from autograder.remote import doubt_kernel_rules

    finding = "review: ex4_answer line 2 imports torch.utils._python_dispatch (a private part of torch)"
    with doubt_kernel_rules([finding]):
        with pytest.raises(CheckFailed) as failure:
            judge(CALL_EMBEDDING.format(name="by_hand"))
        assert judge("print(by_hand(torch.eye(2), torch.tensor([1])).tolist())").strip() == "[[0.0, 1.0]]"
    message = str(failure.value)
    assert "(a built-in it forbids)" in message and "imports torch.utils._python_dispatch" in message
    assert "\nLikely mistake: ex4_answer line 2 imports" in message
    assert judge(CALL_EMBEDDING.format(name="by_hand")).strip() == "[0.0, 6.0, 0.0, 0.0, 3.0]"   # after the block


PREDICTIONS = textwrap.dedent('''
    import math
    import torch

    def predicted_bytes(layers, heads, head_dim, tokens, bytes_per_number):
        return 2 * layers * heads * head_dim * tokens * bytes_per_number

    def measured_bytes(layers, heads, head_dim, tokens, bytes_per_number):
        cache = [torch.zeros(2, heads, tokens, head_dim) for _ in range(layers)]
        return sum(t.numel() for t in cache) * bytes_per_number

    def swallowed_measurement(layers, heads, head_dim, tokens, bytes_per_number):
        try:
            return measured_bytes(layers, heads, head_dim, tokens, bytes_per_number)
        except Exception:
            return predicted_bytes(layers, heads, head_dim, tokens, bytes_per_number)
''')


@pytest.mark.parametrize("name, passes", [("predicted_bytes", True), ("measured_bytes", False),
                                          ("swallowed_measurement", False)])
def test_a_prediction_runs_no_tensor_operation(tmp_path, name, passes):
    namespace: dict = {}
    exec(compile(PREDICTIONS, "<answers>", "exec"), namespace)
    channel = local_channel(namespace, tmp_path)
    cell = f"""
        from course.checks._core import unmeasured
        with unmeasured("{name}"):
            print({name}(2, 4, 8, 16, 2))
    """
    if passes:
        assert run_judged(textwrap.dedent(cell), channel, "import torch", tmp_path).strip() == "4096"
        return
    with pytest.raises(CheckFailed) as failure:
        run_judged(textwrap.dedent(cell), channel, "import torch", tmp_path)
    assert "it is a prediction" in str(failure.value) and "torch's zeros operator" in str(failure.value)
