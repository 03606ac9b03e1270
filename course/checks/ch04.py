"""Checks for chapter 4: activations, the FFN, SwiGLU and its width, LayerNorm over trailing dimensions, RMSNorm
along any axis, a Llama-style decoder block (Pre-LN or Post-LN), a model's parameter count and the FFN's activation
memory, a top-k mixture of experts with capacity and its balancing loss, the FFNs' share of the parameters.

Oracles: F.gelu, F.silu, F.layer_norm, F.rms_norm (never in the answers), a block built on
F.scaled_dot_product_attention and chapter 3's complex RoPE, models of nn modules on the meta device, a slow
per-token mixture of experts. Properties: the block is causal, no expert exceeds its capacity, one expert is the FFN.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import math
from typing import Any, Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from . import ch02, ch03
from ._core import call, earlier_answers, earlier_first, expect_tensor, forbid, judge_prediction
from ._core import meta_table, one_thread as _one_thread
from ._vocabulary import call_on_copies, compare, draw, expect, expect_tensor_of, fail, judge_configured, matches
from ._vocabulary import check_pasted, passes, pasted_first, when
from .ch03 import _rope_complex


# ----------------------------------------------------------------------------- helpers

_ACTIVATIONS = ((F, "gelu"), (F, "silu"))
# group_norm with one group over a row is layer_norm under another name (issue 32)
_NORMS = ((F, "layer_norm"), (F, "rms_norm"), (torch, "layer_norm"), (torch, "rms_norm"), (torch, "native_layer_norm"),
          (F, "group_norm"), (torch, "group_norm"))
# RMSNorm's spec: the axis is normalised where it is, not moved to the end and back (two copies). By name:
# the Tensor methods and torch functions that move an axis; at torch's dispatcher, the permute and transpose
# operators (.T, .mT, torch.ops.aten.permute), named after Tensor.permute and Tensor.transpose, the last here.
_MOVES = tuple((owner, name) for owner in (torch, torch.Tensor)
               for name in ("movedim", "moveaxis", "swapaxes", "swapdims", "permute", "transpose"))
_LOW = (torch.bfloat16, torch.float16)
_IN_PLACE = ("build new tensors: x - mean, not x -= mean or x.sub_(mean) (and x.float() of a float32 x is x itself, "
             "not a copy): the caller reads its input again, as the residual connection of a block does.")

# The decoder block's hint; {then} is its residual wiring, a formula (a template: a translation keeps {then}).
_SUBLAYER_FIRST = ("test the attention sublayer alone: project, split into heads (B, heads, T, d_head), apply_rope to "
                   "q and k at positions 0 .. T-1, grouped_query_attention with the causal mask (True on and below "
                   "the diagonal), merge the heads, w_o; then {then}")


def _run(fn: Callable, x: torch.Tensor, name: str, dtype_hint: str | None = None, forbidden: tuple = (),
         exercise: str = "") -> Any:
    """``fn`` on a copy of ``x``, under ``forbid(*forbidden)``: the copy must come back unchanged (the spec: no
    input is changed) and, given ``dtype_hint``, the output must be a tensor of x's shape and dtype."""
    with forbid(*forbidden, exercise=exercise) if forbidden else contextlib.nullcontext():
        out = call_on_copies(fn, x, name=name, hint=_IN_PLACE)
    if dtype_hint is not None:
        expect_tensor_of(out, x.shape, x.dtype, name, dtype_hint)
    return out


def _precision(x: torch.Tensor) -> torch.dtype:
    """The dtype whose rounding a norm's output carries: a bfloat16 or float16 input's, else float32 (the statistics'
    dtype in the exercises, for a float64 input too)."""
    return x.dtype if x.dtype in _LOW else torch.float32


def _linear(module: Any, attr: str, d_in: int, d_out: int, bias: bool, cls: str, d, scale: float = 1.0) -> tuple:
    """``module.<attr>`` checked to be an nn.Linear(d_in, d_out, bias=bias), then filled with weights drawn from
    ``d``: (weight (d_out, d_in), bias (d_out,) or None)."""
    layer = getattr(module, attr, None)
    expect(isinstance(layer, nn.Linear), f"{cls} needs an nn.Linear attribute `{attr}`.",
           f"create self.{attr} = nn.Linear(...) in __init__ with exactly this name: the tests copy weights into it.")
    shape = tuple(layer.weight.shape)
    expect(shape == (d_out, d_in), f"{cls}.{attr}.weight has shape {shape}, expected {(d_out, d_in)}.",
           "d_ff defaults to 4 * d_model (the hidden layer expands, then projects back), not d_model."
           if (cls, attr, shape) == ("FeedForward", "fc1", (d_in, d_in)) else
           f"{attr} maps {d_in} features to {d_out}: nn.Linear({d_in}, {d_out}).")
    expect((layer.bias is not None) == bias,
           f"{cls}.{attr} should have a bias." if bias else f"{cls}.{attr} should not have a bias.",
           "nn.Linear(..., bias=True) for the FFN of this chapter's FeedForward; the gated (SwiGLU) layers use "
           "bias=False, as in Llama." if bias else f"the {cls} projections have no bias: bias=False.")
    w, b = d.randn(d_out, d_in) * scale / math.sqrt(d_in), d.randn(d_out) * 0.5 if bias else None
    with torch.no_grad():
        layer.weight.copy_(w)
        if bias:
            layer.bias.copy_(b)
    return w, b


def _ffn_weights(module: Any, d_model: int, width: int, d) -> tuple:
    """A FeedForward's fc1 and fc2, checked and filled: (w1, b1, w2, b2)."""
    return (*_linear(module, "fc1", d_model, width, True, "FeedForward", d, 2.0),
            *_linear(module, "fc2", width, d_model, True, "FeedForward", d))


def _swiglu_weights(module: Any, d_model: int, h: int, d) -> tuple:
    """A SwiGLU's w_gate_up and w_down, checked and filled: (w_gate_up (2h, d_model), w_down (d_model, h))."""
    return (_linear(module, "w_gate_up", d_model, 2 * h, False, "SwiGLU", d, 2.0)[0],
            _linear(module, "w_down", h, d_model, False, "SwiGLU", d)[0])


def _n_params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def _expect_params(module: Any, want: int, shown: str, hint: str) -> None:
    n = _n_params(module)
    expect(n == want, f"{shown} has {n} parameters, expected {want}.", hint)


def _shown(name: str, *args: Any, **kwargs: Any) -> str:
    """A call as it reads: ``name(1, 2, k=v)``."""
    return f"{name}({', '.join([*map(str, args), *(f'{k}={v!r}' for k, v in kwargs.items())])})"


# ----------------------------------------------------------------------------- exercise 1

_KEEP_DTYPE = ("keep the input's dtype: build constants with math (floats), not float32 tensors, and do not "
               "convert the input with .float() without converting the result back.")
_ACTIVATION_REFERENCES = {"gelu": lambda x: F.gelu(x), "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
                          "silu": F.silu}


def _activation_variants(x: torch.Tensor, name: str) -> list:
    """The usual wrong activations of ``x`` that can pass for ``name``, with their hints."""
    gelus, every = {"gelu", "gelu_tanh"}, {"gelu", "gelu_tanh", "silu"}
    variants = [
        (lambda: _ACTIVATION_REFERENCES[name](x.float()) if x.dtype == torch.float64 else None, every,
         "keep the input's dtype: this float64 input was computed in float32 (a float32 tensor or .float() in the "
         "formula)."),
        (lambda: F.gelu(x, approximate="tanh"), {"gelu"},
         "that is the tanh approximation of GELU; gelu asks for the exact form 0.5 * x * (1 + erf(x / sqrt(2)))."),
        (lambda: F.gelu(x), {"gelu_tanh"}, "that is the exact GELU (with erf); gelu_tanh asks for the tanh "
                                           "approximation 0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x**3)))."),
        (lambda: x * torch.sigmoid(1.702 * x), gelus,
         "x * sigmoid(1.702 x) is a cruder approximation of GELU; write the formula the exercise gives."),
        (lambda: torch.relu(x), every, "that is ReLU, max(0, x): it is not smooth around 0 and has no negative dip."),
        (lambda: torch.sigmoid(x), every, "sigmoid(x) alone is the gate: SiLU multiplies it by x (x * sigmoid(x))."),
        (lambda: 0.5 * x * (1 + torch.tanh(math.sqrt(2) / math.pi * (x + 0.044715 * x**3))), gelus,
         "the constant inside tanh is sqrt(2 / pi) (about 0.798), not sqrt(2) / pi (about 0.450)."),
        (lambda: 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * x)), gelus,
         "the tanh argument is sqrt(2 / pi) * (x + 0.044715 * x**3): the cubic term is missing."),
        (lambda: 0.5 * x * (1 + torch.erf(x / 2)), gelus, "the erf argument is x / sqrt(2), not x / 2."),
        (lambda: x * torch.sigmoid(x), gelus, "that is SiLU, x * sigmoid(x): GELU weights x by the normal CDF Phi(x)."),
        (lambda: F.gelu(x), {"silu"}, "that is GELU: SiLU is x * sigmoid(x)."),
        (when(lambda got: not torch.isfinite(got).all() and torch.isfinite(x).all()), every,
         "the output has inf or NaN for large |x|: write the formula so that no intermediate overflows "
         "(for example use torch.sigmoid(x) rather than 1 / (1 + exp(-x)) with a huge exp).")]
    return [(variant, hint) for variant, names, hint in variants if name in names]


@_one_thread
def check_activations(gelu=None, gelu_tanh=None, silu=None, hidden: bool = False) -> None:
    """Each answer given against PyTorch's: float32 inputs (and float64 hidden), then reduced precision."""
    d = draw("activations", hidden)
    xs = [torch.linspace(-6, 6, 241), d.randn(3, 17) * 3]
    if hidden:
        xs += [d.randn(2, d.rng.randrange(5, 60), 3) * 10,
               torch.tensor([0.0, -0.0, 1e-8, -1e-8, 30.0, -30.0, 80.0, -80.0, 1e4, -1e4]),
               torch.linspace(-3, 3, 7).to(torch.float64)]
    xs += [(d.randn(64 if hidden else 16) * 4).to(dtype) for dtype in (_LOW if hidden else _LOW[:1])]
    answers = [(name, fn) for name, fn in (("gelu", gelu), ("gelu_tanh", gelu_tanh), ("silu", silu)) if fn is not None]
    for x, (name, fn) in itertools.product(xs, answers):
        got = _run(fn, x, name, _KEEP_DTYPE, _ACTIVATIONS, f"{name} from elementary operations")
        # In reduced precision each intermediate of the formula is rounded (1 + erf(x) cancels for negative x): the
        # values are those of the float32 formula within a few units of bfloat16.
        exact = x.float() if x.dtype in _LOW else x
        compare(got, _ACTIVATION_REFERENCES[name](exact),
                f"{name} on {str(x.dtype)[6:]} inputs in [{x.min().item():.3g}, {x.max().item():.3g}]",
                "compare your formula term by term with the one in the exercise.",
                variants=_activation_variants(exact, name), tol=(3e-2, 3e-2) if x.dtype in _LOW else None)


def _calls(who: str, gelu=None, silu=None, LayerNorm=None, FeedForward=None, RMSNorm=None, SwiGLU=None) -> list:
    """(what, check) pairs for the earlier answers that ``who`` calls, deepest first (``earlier_first``)."""
    return earlier_answers(who, ("calls your gelu", 1, gelu, lambda f: check_activations(gelu=f)),
                           ("calls your silu", 1, silu, lambda f: check_activations(silu=f)),
                           ("uses your LayerNorm", 4, LayerNorm, check_layer_norm),
                           ("uses your RMSNorm", 5, RMSNorm, lambda f: check_rms_norm(f, last_axis_only=True)),
                           ("uses your FeedForward", 2, FeedForward, check_feed_forward),
                           ("uses your SwiGLU", 3, SwiGLU, lambda f: check_swiglu(f, given_width_only=True)))


# ----------------------------------------------------------------------------- exercise 2

def _ffn_ref(x: torch.Tensor, w1, b1, w2, b2, act: Callable = F.gelu) -> torch.Tensor:
    return F.linear(act(F.linear(x, w1, b1)), w2, b2)


def _ffn_variants(x: torch.Tensor, w1, b1, w2, b2) -> list:
    wrong = functools.partial(_ffn_ref, x, w1, b1, w2)
    return [(lambda: wrong(b2, torch.relu), "ReLU was used where GELU is asked: apply your exact gelu between fc1 "
                                            "and fc2."),
            (lambda: wrong(b2, functools.partial(F.gelu, approximate="tanh")),
             "the tanh approximation was used: the FFN uses the exact gelu from exercise 1."),
            (lambda: wrong(b2, lambda h: h), "there is no activation between fc1 and fc2: two linear layers in a row "
                                             "are one linear layer."),
            (lambda: wrong(b2, F.silu), "SiLU was used where GELU is asked."),
            (lambda: wrong(None), "fc2's bias was not added: call self.fc2(...) rather than multiplying by its "
                                  "weight.")]


@_one_thread
def check_feed_forward(FeedForward, gelu=None, hidden: bool = False) -> None:
    """gelu, when given, is the exercise 1 answer that FeedForward calls."""
    d = draw("feed_forward", hidden)
    configs = [(16, None), (12, 20)]
    if hidden:
        configs += [(1, None), (d.rng.randrange(2, 40), None), (d.rng.randrange(2, 40), d.rng.randrange(1, 70))]
    with earlier_first(*_calls("FeedForward", gelu=gelu)):
        for d_model, d_ff in configs:
            args, width = (d_model,) if d_ff is None else (d_model, d_ff), d_ff or 4 * d_model
            module = call(FeedForward, *args, name="FeedForward(...)")
            weights = _ffn_weights(module, d_model, width, d)
            _expect_params(module, 2 * d_model * width + width + d_model, _shown("FeedForward", *args),
                           "the FFN holds exactly fc1 and fc2 (weights and biases); nothing else learns.")
            x = d.randn(*(2, 5, d_model) if not hidden else (d.rng.randrange(1, 4), d.rng.randrange(1, 7), d_model))
            got = _run(module, x, "FeedForward.forward", None, ((F, "gelu"),), "the FFN with your own gelu")
            compare(got, _ffn_ref(x, *weights), f"FeedForward output (d_model={d_model}, d_ff={width})",
                    "forward is fc2(gelu(fc1(x))): expand, activate, project.", variants=_ffn_variants(x, *weights))
            if hidden:   # position-wise: each token is transformed on its own
                compare(call(module, x[:, :1].clone(), name="FeedForward.forward"), got.detach()[:, :1],
                        "the FFN output at position 0, once the other positions were removed,",
                        "the FFN acts on each position on its own: no mixing along T.")


# ----------------------------------------------------------------------------- exercise 3

def _swiglu_hidden_ref(d_model: int, multiple_of: int, multiplier: float | None = None) -> int:
    h = int(2 * (4 * d_model) / 3)
    h = h if multiplier is None else int(multiplier * h)
    return multiple_of * ((h + multiple_of - 1) // multiple_of)


def _swiglu_hidden_variants(d_model: int, m: int, mult: float | None) -> list:
    raw = _swiglu_hidden_ref(d_model, 1, mult)
    return [(raw, f"the width {raw} was not rounded: round it up to a multiple of multiple_of so that matrix shapes "
                  "suit the hardware."),
            (_swiglu_hidden_ref(d_model, m) if mult is not None else None,
             "ffn_dim_multiplier was ignored: multiply the two-thirds width by it (then int) before rounding."),
            (int(mult * _swiglu_hidden_ref(d_model, m)) if mult is not None else None,
             "the multiplier was applied after the rounding, so the result is no longer a multiple of multiple_of: "
             "multiply first, round up last."),
            (when(lambda got: got in (4 * d_model, m * ((4 * d_model + m - 1) // m))),
             "that is the width of the ungated FFN: SwiGLU has three matrices, so it starts from 8/3 d_model."),
            ((raw // m) * m, "the width was rounded down: round up to the next multiple (ceil), as Llama does."),
            (m * round(raw / m), "the width was rounded to the nearest multiple: round up (ceil), as Llama does.")]


def check_swiglu_hidden(swiglu_hidden, hidden: bool = False) -> None:
    def drawn(d):
        return (d.rng.randrange(1, 9000), d.rng.choice([1, 8, 16, 32, 64, 128, 256, 1024]),
                d.rng.choice([None, 1.3, 1.5, 0.75, round(d.rng.uniform(0.5, 2.5), 3)]))

    visible = [(768, 64, None), (4096, 256, None), (4096, 1024, 1.3), (12, 8, None), (96, 32, 1.5)]
    fixed = [(4096, 64, None), (3, 1, None), (1536, 128, 2.0), (8192, 4096, 1.3), (5120, 256, 1.3)]
    for d_model, m, mult in draw("swiglu_hidden", hidden).cases(visible + (fixed if hidden else []), drawn, 10):
        args = (d_model, m) if mult is None else (d_model, m, mult)
        got = call(swiglu_hidden, *args, name="swiglu_hidden")
        expect(isinstance(got, int) and not isinstance(got, bool), f"{_shown('swiglu_hidden', *args)} returned "
               f"{type(got).__name__}, expected an int.", "return a Python int (use // and int(...)), not a float or "
               "a tensor.")
        compare(got, _swiglu_hidden_ref(d_model, m, mult), _shown("swiglu_hidden", *args),
                "hidden = int(2 * 4 * d_model / 3), then int(ffn_dim_multiplier * hidden) when a multiplier is "
                "given, then round up to a multiple of multiple_of.",
                variants=_swiglu_hidden_variants(d_model, m, mult))


def _swiglu_ref(x: torch.Tensor, gate, up, down, act: Callable = F.silu) -> torch.Tensor:
    """w_down(act(gate x) * up x), the weights of gate and up given apart."""
    return F.linear(act(F.linear(x, gate)) * F.linear(x, up), down)


def _swiglu_variants(x, W, Wd, h) -> list:
    gate, up = W[:h], W[h:]
    interleaved = ("the halves were taken interleaved (even and odd outputs): the gate is the first contiguous half "
                   "of w_gate_up's output, up the second (chunk(2, dim=-1)).")
    return [(lambda: _swiglu_ref(x, up, gate, Wd), "the two halves were swapped: rows 0 .. d_hidden - 1 of w_gate_up "
             "are the gate (silu goes on them), rows d_hidden .. 2 d_hidden - 1 the up projection."),
            (lambda: _swiglu_ref(x, W[0::2], W[1::2], Wd), interleaved),
            (lambda: _swiglu_ref(x, W[1::2], W[0::2], Wd), interleaved),
            (lambda: _swiglu_ref(x, gate, up, Wd, F.gelu), "GELU was used as the gate activation: that is GeGLU; "
                                                           "SwiGLU uses silu."),
            (lambda: _swiglu_ref(x, gate, up, Wd, torch.sigmoid), "sigmoid(gate) * up is the original GLU: SwiGLU "
                                                                  "uses silu(gate) = gate * sigmoid(gate)."),
            (lambda: F.linear(F.silu(F.linear(x, gate) * F.linear(x, up)), Wd),
             "silu was applied to the product: apply it to the gate only, then multiply by up.")]


@_one_thread
def check_swiglu(SwiGLU, silu=None, hidden: bool = False, given_width_only: bool = False) -> None:
    """silu, when given, is the exercise 1 answer that SwiGLU calls. ``given_width_only``: only
    SwiGLU(d_model, d_hidden), the part that the decoder block calls."""
    d = draw("swiglu", hidden)
    # (d_model, multiple_of, ffn_dim_multiplier, d_hidden or None for the computed width)
    configs = [(24, 16, None, None), (48, 64, None, None), (20, 8, 1.5, None), (10, 64, None, 12)]
    if given_width_only:
        configs = [(16, 64, None, 24), (10, 64, None, 12)]
    elif hidden:
        configs += [(d.rng.randrange(4, 60), d.rng.choice([1, 8, 32]), d.rng.choice([None, 1.3, 0.75]), None)
                    for _ in range(2)]
        configs += [(7, 1, None, None), (d.rng.randrange(2, 30), 64, None, d.rng.randrange(1, 40))]
    with earlier_first(*_calls("SwiGLU", silu=silu)):
        for i, (d_model, m, mult, d_hidden) in enumerate(configs):
            args = (d_model, d_hidden) if d_hidden else (d_model,)
            kwargs = {} if d_hidden else {"multiple_of": m, **({"ffn_dim_multiplier": mult} if mult else {})}
            shown = _shown("SwiGLU", *args, **kwargs)
            h = d_hidden or _swiglu_hidden_ref(d_model, m, mult)
            module = call(SwiGLU, *args, name=shown, **kwargs)
            W, Wd = _swiglu_weights(module, d_model, h, d)
            _expect_params(module, 3 * d_model * h, shown, "SwiGLU holds exactly w_gate_up and w_down, without "
                           "biases: 3 * d_model * d_hidden parameters.")
            for dtype in (torch.float32,) if not hidden or i % 2 else (torch.float32, torch.float64):
                shape = (2, 3, d_model) if not hidden else (d.rng.randrange(1, 4), d.rng.randrange(1, 6), d_model)
                x = d.randn(*shape, dtype=torch.float64).to(dtype)
                got = _run(module.to(dtype), x, "SwiGLU.forward", "build nothing in a fixed dtype: the layers follow "
                           "the module's dtype.", ((F, "silu"),), "SwiGLU with your own silu")
                Wt, Wdt = W.to(dtype), Wd.to(dtype)
                compare(got, _swiglu_ref(x, Wt[:h], Wt[h:], Wdt), f"SwiGLU output ({shown}, {str(dtype)[6:]}), "
                        "against w_down(silu(gate) * up) with gate and up the first and second halves of w_gate_up(x)",
                        "forward is w_down(silu(gate) * up), with gate, up = the two halves of w_gate_up(x).",
                        variants=_swiglu_variants(x, Wt, Wdt, h))
            module.float()


# ----------------------------------------------------------------------------- exercise 4 and 5

def _norm_inputs(d, n: int) -> list[tuple[torch.Tensor, str]]:
    """Rows of ``n`` features: float32 ones, large means, low precision, variances below eps."""
    cases = [(d.randn(2, 3, n) * 2 + 1, "float32"), (d.randn(4, n) * 3 + 40, "float32 with a large mean"),
             ((d.randn(2, 4, n) + 300).to(torch.bfloat16), "bfloat16 with a large mean"),
             (d.randn(2, 3, n) * 1e-3, "float32 rows of about 1e-3, whose variance is below eps")]
    if d.hidden:
        T = d.rng.randrange(1, 7)
        tiny = d.randn(2, T, n) * 1e-3 + 0.05 * d.randn(2, T, 1)   # variance < eps
        cases += [(tiny, "float32 rows with a variance near eps"),
                  ((d.randn(3, T, n) * 2 + d.rng.choice([-700, 150, 1000])).to(torch.bfloat16),
                   "bfloat16 with a large mean"),
                  ((d.randn(2, T, n) * 2 + 0.5).to(torch.bfloat16), "bfloat16"),
                  ((d.randn(2, T, n) * 400).to(torch.float16), "float16 with large values"),
                  (d.randn(d.rng.randrange(1, 4), T, n).to(torch.float64), "float64")]
    return cases


def _layer_norm_variants(x: torch.Tensor, w, b, eps: float, shape: tuple[int, ...]) -> list:
    """The usual wrong LayerNorms of ``x`` (normalised over its trailing ``shape``), with their hints."""
    k, n = len(shape), math.prod(shape)
    x32 = x.float().reshape(*x.shape[:x.dim() - k], n)       # the normalised block flattened
    w, b = w.reshape(n), b.reshape(n)
    mu, var = x32.mean(-1, keepdim=True), x32.var(-1, keepdim=True, unbiased=False)
    z = (x32 - mu) / torch.sqrt(var + eps)                   # normalised right, before the affine map
    last = x.float().mean(-1, keepdim=True), x.float().var(-1, keepdim=True, unbiased=False)
    out = [((x.float() - last[0]) / torch.sqrt(last[1] + eps) * w.reshape(shape) + b.reshape(shape) if k > 1 else None,
            f"the statistics were taken over the last dimension only: LayerNorm({shape}) normalises over the last "
            f"{k} dimensions at once (mean and var accept a tuple of dims)."),
           ((x32 - mu) / torch.sqrt(x32.var(-1, keepdim=True) + eps) * w + b if n > 1 else None,
            "the variance is the biased one (divide by d_model, not d_model - 1): x.var(-1, unbiased=False) or "
            "((x - mean) ** 2).mean(-1)."),
           ((x32 - mu) / (torch.sqrt(var) + eps) * w + b, "eps goes inside the square root: (x - mean) / sqrt(var + "
                                                          "eps)."),
           (z, "the affine parameters were not applied: multiply by weight and add bias after normalising."),
           (z * w, "the bias was not added after scaling by weight."),
           (z + b, "the output was not multiplied by weight."),
           ((x32 - mu) / torch.sqrt(var) * w + b, "eps is missing: (x - mean) / sqrt(var + eps)."),
           (x32 / torch.sqrt(x32.pow(2).mean(-1, keepdim=True) + eps) * w + b,
            "the mean was not subtracted: that is RMSNorm; LayerNorm centres first."),
           ((x32 - x32.mean(0, keepdim=True)) / torch.sqrt(x32.var(0, keepdim=True, unbiased=False) + eps) * w + b
            if x.dim() > k and x.dtype not in _LOW else None,
            "the statistics were taken over the batch (dim 0): normalise over the last dimension, d_model.")]
    return [(None if v is None else v.reshape(x.shape).to(_precision(x)), hint) for v, hint in out]


def _rms_norm_variants(x: torch.Tensor, w, eps: float, axis: int) -> list:
    """The usual wrong RMSNorms of ``x`` along ``axis``, with their hints."""
    x32 = x.float().movedim(axis, -1)
    ms, n = x32.pow(2).mean(-1, keepdim=True), x32.shape[-1]
    shape = [1] * x.dim()
    shape[axis] = -1
    last = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps) * w.view(shape)
    out = [(last.movedim(axis, -1) if axis not in (-1, x.dim() - 1) else None,
            f"the root mean square was taken over the last axis: this RMSNorm normalises along axis {axis} "
            f"(self.dim), of size {n}: mean(dim=self.dim, keepdim=True)."),
           ((x32 - x32.mean(-1, keepdim=True)) / torch.sqrt(x32.var(-1, keepdim=True, unbiased=False) + eps) * w,
            "the mean was subtracted: that is LayerNorm; RMSNorm divides by the root mean square without centring."),
           (x32 / (torch.sqrt(ms) + eps) * w, "eps goes inside the square root: x / sqrt(mean(x**2) + eps)."),
           (x32 / torch.sqrt(ms + eps), "the output was not multiplied by weight."),
           (x32 / torch.sqrt(x32.pow(2).sum(-1, keepdim=True) + eps) * w,
            "that divides by the norm (sum of squares): RMSNorm uses the mean of the squares."),
           (x32 / torch.sqrt(x32.abs().mean(-1, keepdim=True) + eps) * w,
            "square the entries before averaging: mean(x ** 2)."),
           (x32 * torch.sqrt(ms + eps) * w, "multiply by the reciprocal (rsqrt) of the RMS, not by the RMS."),
           (x32 / torch.sqrt(x32.pow(2).sum(-1, keepdim=True) / (n - 1) + eps) * w if n > 1 else None,
            "divide the sum of squares by d (the mean), not d - 1.")]
    return [(None if v is None else v.movedim(-1, axis).to(_precision(x)), hint) for v, hint in out]


def _norm_module(module: Any, cls: str, shape: tuple[int, ...], default_eps: float) -> float:
    """Check a student's norm as built: no built-in inside, weight ones (and LayerNorm's bias zeros) in
    float32, nothing else that learns; its eps."""
    builtins = (nn.LayerNorm,) if cls == "LayerNorm" else (nn.RMSNorm, nn.LayerNorm)
    expect(not any(isinstance(m, builtins) for m in module.modules()), f"{cls} contains an "
           f"{' or '.join(f'nn.{b.__name__}' for b in builtins)}.", f"write the normalisation yourself: nn.{cls} "
           "is the oracle.")
    w0 = getattr(module, "weight", None)
    expect(isinstance(w0, nn.Parameter), f"{cls} needs a learnable `weight` (an nn.Parameter).",
           "the affine scale: self.weight = nn.Parameter(torch.ones(...)).")
    w0 = w0.detach()
    expect(tuple(w0.shape) == shape, f"{cls}.weight has shape {tuple(w0.shape)}, expected {shape}.",
           "one scale per normalised element: torch.ones(normalized_shape)." if cls == "LayerNorm" else
           "one scale per feature: torch.ones(d).")
    expect(w0.dtype == torch.float32, f"{cls}.weight is {w0.dtype}, expected float32.",
           "keep the parameters in float32; only the output takes the input's dtype.")
    expect(torch.equal(w0, torch.ones(shape)), f"{cls}.weight starts at {w0.reshape(-1)[:4].tolist()}..., expected "
           "ones.", "initialise weight to ones (torch.ones): zeros would make the output zero and cut the gradient."
           if torch.equal(w0, torch.zeros(shape)) else "initialise weight to ones (torch.ones), so that the layer "
           "starts as a pure normalisation.")
    if cls == "LayerNorm":
        b = getattr(module, "bias", None)
        expect(isinstance(b, nn.Parameter), f"{cls} needs a learnable `bias` (an nn.Parameter).",
               "the affine shift: self.bias = nn.Parameter(torch.zeros(normalized_shape)).")
        expect(tuple(b.shape) == shape and torch.equal(b.detach(), torch.zeros(shape)), f"{cls}.bias should start "
               f"as zeros of shape {shape}.", "self.bias = nn.Parameter(torch.zeros(normalized_shape)).")
    else:
        _expect_params(module, shape[0], f"{cls}({shape[0]})", "RMSNorm has a scale (weight) only: no bias, because "
                       "it does not centre.")
    eps = getattr(module, "eps", None)
    expect(isinstance(eps, float) and math.isclose(eps, default_eps), f"{cls}.eps is {eps!r}, expected "
           f"{default_eps}.", f"store the eps argument as self.eps (default {default_eps}).")
    return eps


def _norm_outputs(module: Any, cls: str, shown: str, params: dict, inputs: list, oracle: Callable,
                  variants: Callable, along: str = "over its last dimension (d_model)", forbidden: tuple = (),
                  exercise: str = "") -> None:
    """``params`` (weight, and LayerNorm's bias) copied into a student's norm, then each of ``inputs`` ((x, label))
    through it against ``oracle(x)`` (in float64); ``forbidden`` adds what ``exercise`` rules out besides norms."""
    with torch.no_grad():
        for name, value in params.items():
            getattr(module, name).copy_(value)
    for x, label in inputs:
        got = _run(module, x, f"{cls}.forward", "compute the statistics in float32, then cast the result back: "
                   ".to(x.dtype).", _NORMS + forbidden, exercise or cls)
        fallback = (f"the statistics were computed in {str(x.dtype)[6:]}: compute them in float32 (x.float()), "
                    "normalise, then cast the result back to the input's dtype." if x.dtype in _LOW else
                    f"{cls} normalises each vector {along}, with keepdim=True.")
        # The statistics are computed in float32 (the exercises), where x - mean cancels digits in rows with a large
        # mean and a small spread: a float32 output is exact to about 1e-4, not to float32's 1e-5.
        compare(got, oracle(x).to(_precision(x)), f"{shown} output ({label}, input shape {tuple(x.shape)})", fallback,
                variants=variants(x), tol=None if x.dtype in _LOW else (1e-4, 1e-4))


@_one_thread
def check_layer_norm(LayerNorm, hidden: bool = False) -> None:
    d = draw("layer_norm", hidden)
    cases = [(16, (16,)), ((3, 5), (3, 5)), ((4,), (4,))]     # (the argument, the normalised shape)
    if hidden:
        n, two = d.rng.randrange(2, 65), (d.rng.randrange(2, 7), d.rng.randrange(2, 9))
        three = (2, d.rng.randrange(2, 5), 3)
        cases = [(n, (n,)), (two, two), (list(three), three), (3, (3,)), ((1, 6), (1, 6))]
    for arg, shape in cases:
        module = call(LayerNorm, arg, name=(shown := f"LayerNorm({arg!r})"))
        eps = _norm_module(module, "LayerNorm", shape, 1e-5)
        first = [(d.randn(3, 4, math.prod(shape)) * 5 + 2, "float32, weight = 1 and bias = 0")]
        for w, b, inputs in ((torch.ones(shape), torch.zeros(shape), first),
                             (d.randn(*shape) * 0.5 + 1, d.randn(*shape), _norm_inputs(d, math.prod(shape)))):
            _norm_outputs(module, "LayerNorm", shown, {"weight": w, "bias": b},
                          [(x.reshape(*x.shape[:-1], *shape), lab) for x, lab in inputs],
                          lambda x: F.layer_norm(x.double(), shape, w.double(), b.double(), eps),
                          lambda x: _layer_norm_variants(x, w, b, eps, shape))


@_one_thread
def check_rms_norm(RMSNorm, hidden: bool = False, last_axis_only: bool = False) -> None:
    """``last_axis_only``: only the default dim = -1, the part that the decoder block calls."""
    d = draw("rms_norm", hidden)
    cases = [(16, None, -1), (6, 1, 1), (5, -2, -2)]       # (d, the dim argument, the axis of d in the inputs)
    if hidden:
        cases = [(d.rng.randrange(2, 65), None, -1), (d.rng.randrange(2, 40), 1, 1), (3, 1, 1),
                 (d.rng.randrange(2, 12), -3, -3), (4, -1, -1)]
    for n, dim, axis in [case for case in cases if case[1] is None or not last_axis_only]:
        kwargs = {} if dim is None else {"dim": dim}
        module = call(RMSNorm, n, name=(shown := _shown("RMSNorm", n, **kwargs)), **kwargs)
        eps = _norm_module(module, "RMSNorm", (n,), 1e-6)
        first = [(d.randn(3, 4, n) * 5 + 2, "float32 with weight = 1")]
        for w, inputs in ((torch.ones(n), first), (d.randn(n) * 0.5 + 1, _norm_inputs(d, n))):
            if axis == -3:       # a 4-D image-like input: (..., 2, 1, n) -> (..., n, 2, 1)
                inputs = [(torch.stack([x, x * 0.5 + 0.1], dim=-2).unsqueeze(-2), label) for x, label in inputs]
            _norm_outputs(module, "RMSNorm", shown, {"weight": w}, [(x.movedim(-1, axis).contiguous(), lab)
                                                                    for x, lab in inputs],
                          lambda x: F.rms_norm(x.double().movedim(axis, -1), (n,), w.double(), eps).movedim(-1, axis),
                          lambda x: _rms_norm_variants(x, w, eps, axis), f"along axis {axis} (of size {n})",
                          _MOVES, "RMSNorm along its axis without moving it (no movedim, transpose or permute)")


# ----------------------------------------------------------------------------- exercise 6
# The block's RoPE and attention are chapter 2's and chapter 3's answers, pasted into the notebook above it:
# those chapters' own checks run on them (check_block_tools), and a failure of the block that one of them also
# has is blamed on it first. Oracle: the block written with built-ins (F.rms_norm, F.scaled_dot_product_attention
# with enable_gqa, F.silu) and chapter 3's complex RoPE.

_BLOCK_TOOLS = {**ch02.PASTED_ROPE, **ch03.PASTED_ATTENTION}


def check_block_tools(apply_rope, scaled_dot_product_attention, grouped_query_attention,
                      hidden: bool = False) -> None:
    """Chapter 2's own check (exercise 5) and chapter 3's (exercises 2 and 5) on the RoPE and the attention
    brought into this notebook."""
    check_pasted(_BLOCK_TOOLS, {"apply_rope": apply_rope, "scaled_dot_product_attention": scaled_dot_product_attention,
                                "grouped_query_attention": grouped_query_attention}, hidden)


def _attend(q, k, v, mask: str, scale: float, tile: bool) -> torch.Tensor:
    """Causal GQA by F.scaled_dot_product_attention; the wrong masks (none, or the upper triangle taken for the
    allowed keys) and the tiled heads of the variants written out, a row that sees no key giving zeros."""
    T, group = q.shape[-2], q.shape[1] // k.shape[1]
    if tile:
        k, v = k.repeat(1, group, 1, 1), v.repeat(1, group, 1, 1)
    if mask != "upper":
        return F.scaled_dot_product_attention(q, k, v, is_causal=mask == "causal", scale=scale, enable_gqa=True)
    allowed = torch.ones(T, T, dtype=torch.bool).triu(1)
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scores = (q.double() @ k.double().transpose(-2, -1) * scale).masked_fill(~allowed, float("-inf"))
    return (scores.softmax(-1).nan_to_num(0.0) @ v.double()).to(q.dtype)


def _decoder_oracle(x: torch.Tensor, p: dict, H: int, H_kv: int, pre: bool, base: float, *, rope: str = "heads",
                    tile: bool = False, mask: str = "causal", scale: float | None = None, split: str = "transpose",
                    layout: str | None = None, n2: str = "n2") -> torch.Tensor:
    """The block written with built-ins (RoPE as chapter 3's complex multiplication); the keyword arguments
    make the tests' wrong variants."""
    B, T, d = x.shape
    dh = d // H

    def heads(h, w, n, rotate):    # (B, T, d) -> (B, n, T, dh), rotated at positions 0 .. T-1
        h = F.linear(h, w)
        if rotate and rope == "before split":    # the whole projection rotated as one head
            h = _rope_complex(h, torch.arange(T), base).to(h.dtype)
        h = h.view(B, T, n, dh).transpose(1, 2) if split == "transpose" else h.view(B, n, T, dh)
        return _rope_complex(h, torch.arange(T), base).to(h.dtype) if rotate and rope in ("heads", "q only") else h

    def attn(h):
        q, k, v = heads(h, p["wq"], H, rope != "none"), heads(h, p["wk"], H_kv, rope not in ("none", "q only")), \
            heads(h, p["wv"], H_kv, False)
        y = _attend(q, k, v, mask, scale or 1 / math.sqrt(dh), tile)
        return F.linear(y.transpose(1, 2).reshape(B, T, H * dh), p["wo"])

    def norm(h, name):
        return F.rms_norm(h, (d,), p[name].to(h.dtype), 1e-6)

    def ffn(h):
        return _swiglu_ref(h, *p["wgu"].chunk(2), p["wd"])

    layout = layout or ("pre" if pre else "post")
    if layout == "post":
        x = norm(x + attn(x), "n1")
        return norm(x + ffn(x), n2)
    if layout == "parallel":
        return x + attn(norm(x, "n1")) + ffn(norm(x, n2))
    if layout == "normalised residual":
        x = norm(x, "n1")
        x = norm(x + attn(x), n2)
        return x + ffn(x)
    x = x + attn(norm(x, "n1"))
    return x + ffn(norm(x, n2))


def _decoder_variants(x, p, H, H_kv, pre, base) -> list:
    """The usual wrong blocks (each computed only when the output is wrong), in the output's precision."""
    dh = x.shape[-1] // H
    table = [
        (dict(layout="post" if pre else "pre"),
         "x = norm(x + f(x)) is Post-LN; Pre-LN normalises the input of each sublayer and adds its output to the "
         "un-normalised x: x = x + f(norm(x))." if pre else
         "x = x + f(norm(x)) is Pre-LN; Post-LN adds first and normalises the sum: x = norm(x + f(x))."),
        (dict(rope="none"), "queries and keys were not rotated: call apply_rope on both, after splitting into heads."),
        (dict(rope="q only"), "only the queries were rotated: RoPE rotates the keys too (never the values)."),
        (dict(rope="before split") if H > 1 else None,
         "RoPE was applied to the whole projection before splitting it into heads: it rotates each head's d_head "
         "features on their own, so split first, (B, heads, T, d_head), then call apply_rope."),
        (dict(split="view") if H > 1 and x.shape[1] > 1 else None,
         "the heads were split with view(B, heads, T, d_head), which mixes positions and heads: view(B, T, heads, "
         "d_head) first (feature h * d_head + i is feature i of head h), then swap the T and head axes."),
        (dict(mask="none"), "there is no causal mask: position t may see positions 0 .. t only; pass "
                            "grouped_query_attention a (T, T) mask."),
        (dict(mask="upper"), "the mask marks the keys a query may NOT see: grouped_query_attention reads True as "
                             "may attend, so the causal mask is the lower triangle (tril), diagonal included."),
        (dict(scale=1 / dh) if dh > 1 else None,
         "the scores were scaled twice: your attention already divides them by sqrt(d_head); do not scale q (or k) "
         "in the block."),
        (dict(n2="n1"), "norm1 was used for both sublayers: the FFN uses norm2."),
        (dict(tile=True) if H_kv not in (1, H) else None,
         "query head h was given key/value head h % n_kv_heads: k and v were copied to n_heads heads with repeat, "
         "which tiles them. Pass them as they are, n_kv_heads heads: grouped_query_attention groups the heads."),
        (dict(layout="normalised residual") if pre else None,
         "the residual carries the normalised x: keep the un-normalised x on the residual path (x = x + "
         "attn(norm1(x)))."),
        (dict(layout="parallel") if pre else None,
         "both sublayers read the block's input: the FFN must see the output of the attention sublayer (run them "
         "one after the other, updating x).")]
    wrong = functools.partial(_decoder_oracle, x, p, H, H_kv, pre, base)
    return [(lambda kw=kw: wrong(**kw).to(_precision(x)), hint) for kw, hint in table if kw is not None]


def _decoder_weights(block: Any, width: int, H: int, H_kv: int, h: int, d) -> dict[str, torch.Tensor]:
    """Check the block's layers and fill them with weights drawn from ``d``; the weights, by oracle name."""
    dh = width // H
    p = {name.replace("_", ""): _linear(block, name, d_in, d_out, False, "DecoderBlock", d)[0] for name, d_in, d_out
         in (("w_q", width, H * dh), ("w_k", width, H_kv * dh), ("w_v", width, H_kv * dh), ("w_o", H * dh, width))}
    for name in ("norm1", "norm2"):
        norm = getattr(block, name, None)
        weight = getattr(norm, "weight", None)
        expect(isinstance(weight, nn.Parameter) and tuple(weight.shape) == (width,) and _n_params(norm) == width,
               f"DecoderBlock needs `{name}`, an RMSNorm(d_model) with a weight of shape ({width},) and nothing else.",
               f"create self.{name} = RMSNorm(d_model) (your class from exercise 5) in __init__.")
        with torch.no_grad():
            p["n" + name[-1]] = weight.copy_(d.randn(width) * 0.3 + 1).detach().clone()
    expect((ffn := getattr(block, "ffn", None)) is not None, "DecoderBlock needs `ffn`, a SwiGLU(d_model, d_hidden).",
           "create self.ffn = SwiGLU(d_model, d_hidden) (your class from exercise 3).")
    p["wgu"], p["wd"] = _swiglu_weights(ffn, width, h, d)
    _expect_params(block, 2 * width * H * dh + 2 * width * H_kv * dh + 3 * width * h + 2 * width, "the block",
                   "a block holds norm1, norm2, w_q, w_k, w_v, w_o and ffn (the SwiGLU), nothing more; no biases.")
    return p


def _run_block(block: Any, x: torch.Tensor, shown: str) -> torch.Tensor:
    return _run(block, x, f"{shown}.forward", "build the positions and the mask on x's device, and nothing in a fixed "
                "dtype: the layers follow the module's dtype.", ((F, "scaled_dot_product_attention"), *_NORMS,
                                                                 (F, "silu")),
                "the decoder block with your own attention, RMSNorm and silu")


def _block_cases(d) -> list[tuple]:
    """(d_model, n_heads, n_kv_heads, d_hidden, pre_ln, T, dtype): two visible; hidden, float64 ones, a single
    token, and two drawn."""
    if not d.hidden:
        return [(16, 4, 2, 24, True, 5, torch.float32), (12, 2, 1, 16, False, 4, torch.float32)]
    cases = [(24, 6, 3, 20, True, d.rng.randrange(3, 8), torch.float64), (16, 4, 4, 12, False, 3, torch.float64),
             (8, 2, 2, 8, True, 1, torch.float32)]
    for pre in (False, True):
        H, dh = d.rng.choice([2, 4, 6]), d.rng.choice([2, 4, 6, 8])
        H_kv = d.rng.choice([k for k in (1, 2, 3, 6) if H % k == 0 and k < H] or [1])
        cases.insert(0, (H * dh, H, H_kv, d.rng.randrange(4, 40), pre, d.rng.randrange(2, 9), torch.float32))
    return cases


@_one_thread
def check_decoder_block(DecoderBlock, RMSNorm=None, SwiGLU=None, silu=None, apply_rope=None,
                        grouped_query_attention=None, scaled_dot_product_attention=None, hidden: bool = False) -> None:
    """RMSNorm, SwiGLU and silu, when given, are the earlier answers the block uses; apply_rope (chapter 2),
    grouped_query_attention and scaled_dot_product_attention (chapter 3) those pasted above it."""
    d = draw("decoder_block", hidden)
    pasted = pasted_first("DecoderBlock", _BLOCK_TOOLS, {
        "apply_rope": apply_rope, "scaled_dot_product_attention": scaled_dot_product_attention,
        "grouped_query_attention": grouped_query_attention}, hidden)
    with earlier_first(*_calls("DecoderBlock", silu=silu, RMSNorm=RMSNorm, SwiGLU=SwiGLU), *pasted):
        for i, (width, H, H_kv, h, pre, T, dtype) in enumerate(_block_cases(d)):
            base = 10000.0 if i % 2 == 0 else 500.0
            shown = _shown("DecoderBlock", width, H, H_kv, h, pre_ln=pre, base=base)
            block = call(DecoderBlock, width, H, H_kv, h, pre_ln=pre, base=base, name=shown)
            p = {k: v.to(dtype) for k, v in _decoder_weights(block, width, H, H_kv, h, d).items()}
            x = (d.randn(2, T, width, dtype=torch.float64) * 1.5 + 0.3).to(dtype)
            got = _run_block(block.to(dtype), x, shown)
            with torch.no_grad():
                compare(got, _decoder_oracle(x, p, H, H_kv, pre, base).to(_precision(x)),
                        f"{shown} output (input {tuple(x.shape)}, {str(dtype)[6:]}), against a block built from "
                        "F.rms_norm, F.scaled_dot_product_attention and F.silu",
                        _SUBLAYER_FIRST.format(then="x = x + attn(norm1(x)); x = x + ffn(norm2(x))." if pre else
                                               "x = norm1(x + attn(x)); x = norm2(x + ffn(x))."),
                        variants=_decoder_variants(x, p, H, H_kv, pre, base))
            if hidden and T > 1:   # causality: a change to the last token leaves the earlier outputs alone
                compare(_run_block(block, x + 3.0 * (torch.arange(T) == T - 1)[:, None], shown)[:, :-1],
                        got[:, :-1].to(_precision(x)), f"{shown}: the outputs at earlier positions after a change "
                        "to the last token", "position t may see positions 0 .. t only: pass grouped_query_attention "
                        "a (T, T) mask, True on and below the diagonal.")
            block.float()


# ----------------------------------------------------------------------------- exercise 7

def _count_oracle(V: int, d: int, L: int, H: int, H_kv: int, h: int, gated: bool, bias: bool, norm: str,
                  tied: bool) -> int:
    """Build the model's parts from nn modules on the meta device (shapes only) and count them: the embedding,
    final norm and head once (each tensor once: a tied head adds nothing), one block n_layers times."""
    Norm, dh = nn.RMSNorm if norm == "rms" else nn.LayerNorm, d // H
    linear = functools.partial(nn.Linear, bias=bias, device="meta")
    block = nn.ModuleList([linear(d, H * dh), linear(d, H_kv * dh), linear(d, H_kv * dh), linear(H * dh, d),
                           *(linear(d, h) for _ in range(2 if gated else 1)), linear(h, d),
                           Norm(d, device="meta"), Norm(d, device="meta")])
    ends = nn.ModuleList([meta_table(V, d), Norm(d, device="meta"), nn.Linear(d, V, bias=False, device="meta")])
    if tied:
        ends[2].weight = ends[0].weight
    return _n_params(ends) + L * _n_params(block)


def _drawn_config(rng) -> tuple[int, ...]:
    """(vocab_size, d_model, n_layers, n_heads, n_kv_heads, d_hidden) drawn from ``rng``."""
    H = rng.choice([1, 2, 4, 8, 12, 16, 32, 64])
    return (rng.randrange(2, 200_000), H * rng.choice([8, 16, 64, 128]), rng.randrange(1, 100), H,
            rng.choice([k for k in (1, 2, 4, 8, H) if H % k == 0]), rng.randrange(1, 30_000))


def _count_variants(want: int, V: int, d: int, L: int, H: int, H_kv: int, h: int, gated: bool, bias: bool,
                    norm: str, tied: bool) -> list:
    """The counts that the usual slips give (a changed flag: the count of that model), with their hints."""
    config = dict(V=V, d=d, L=L, H=H, H_kv=H_kv, h=h, gated=gated, bias=bias, norm=norm, tied=tied)
    count = lambda **changed: lambda: _count_oracle(**{**config, **changed})  # noqa: E731
    one_norm, dh = d if norm == "rms" else 2 * d, d // H
    attn_bias, ffn_bias = (H * dh + 2 * H_kv * dh + d, (2 * h + d) if gated else (h + d)) if bias else (0, 0)
    return [
        (want + V * d, "the output layer was counted although tied=True: it is the embedding matrix itself, counted "
                       "once." if tied else
         "the embedding and the output layer are two vocab_size x d_model matrices when untied, no more."),
        (want - V * d, "untied (tied=False), the output layer is a vocab_size x d_model matrix of its own: count it "
                       "beside the embedding." if not tied else "the token embedding (vocab_size x d_model) is "
                                                                "missing."),
        (count(H_kv=H), "w_k and w_v were counted at full width: with grouped-query attention they map d_model to "
                        "n_kv_heads * d_head features."),
        (want - one_norm, "the final norm after the last block is missing: a model has 2 * n_layers + 1 norms."),
        (count(gated=not gated), "the gated FFN has three matrices (w_gate, w_up, w_down), the ungated one two (fc1, "
                                 "fc2)."),
        (count(bias=False), "the biases were left out: with bias=True every linear layer of the blocks has one (as "
                            "wide as its output)."),
        (want - L * attn_bias, "the attention projections have biases too when bias=True."),
        (want - L * ffn_bias, "the FFN's layers have biases too when bias=True."),
        (count(norm="layer" if norm == "rms" else "rms"),
         "an RMSNorm has a weight of d_model only; a LayerNorm a weight and a bias, 2 * d_model."),
        (want - (2 * L + 1) * one_norm, "the norms were left out: each holds d_model (RMSNorm) or 2 * d_model "
                                        "(LayerNorm) parameters, two per block and one at the end."),
        (want + L * (h - d) if bias and gated else None,
         "w_down's bias has d_model entries (its output width), not d_hidden.")]


def check_count_params(count_params, hidden: bool = False) -> None:
    cases = [((128256, 4096, 32, 32, 8, 14336), dict(gated=True, bias=False, norm="rms", tied=False), "Llama 3 8B"),
             ((50257, 768, 12, 12, 12, 3072), dict(gated=False, bias=True, norm="layer", tied=True),
              "GPT-2 small without its position table"),
             ((32000, 64, 2, 4, 2, 176), {}, "a small model with the defaults"),
             ((1000, 48, 3, 6, 2, 128), dict(gated=True, bias=True, norm="layer", tied=False), "gated, with biases")]
    if hidden:
        rng = draw("count_params", hidden).rng
        cases += [(_drawn_config(rng), dict(gated=bool(j & 1), bias=bool(j & 2), norm="layer" if j & 4 else "rms",
                                            tied=rng.random() < 0.5), "a drawn configuration") for j in range(8)]
        cases += [((256000, 3072, 28, 16, 16, 24576), dict(tied=True), "a wide configuration with a large vocabulary"),
                  ((10, 6, 0, 2, 1, 5), dict(norm="layer"), "no blocks at all")]
    for config, flags, what in cases:
        flags = {"gated": True, "bias": False, "norm": "rms", "tied": True, **flags}
        shown = f"{_shown('count_params', *config, **flags)} ({what})"
        got = call(count_params, *config, name="count_params", **flags)
        expect(isinstance(got, int) and not isinstance(got, bool), f"{shown} returned {type(got).__name__}, "
               "expected an int.", "count with integer arithmetic (no division with /, no tensors).")
        want = _count_oracle(*config, **flags)
        compare(got, want, shown, "count piece by piece: embedding, per block (w_q, w_k, w_v, w_o, the FFN, two "
                "norms), the final norm, and the output layer unless tied.",
                variants=_count_variants(want, *config, **flags))


def check_ffn_activation_bytes(ffn_activation_bytes, hidden: bool = False) -> None:
    cases = [(8, 1024, 3072, torch.float32, False), (8, 1024, 2048, torch.bfloat16, True)]
    if hidden:
        rng = draw("ffn_activation_bytes", hidden).rng
        cases += [(rng.randrange(1, 64), rng.randrange(1, 8193), rng.randrange(1, 20000),
                   rng.choice([torch.float32, torch.bfloat16, torch.float16]), gated) for gated in (False, True)]
        cases.append((1, 1, 1, torch.float64, True))
    for B, T, h, dtype, gated in cases:
        size = torch.empty((), dtype=dtype).element_size()
        per, want = B * T * h * size, (4 if gated else 2) * B * T * h * size
        compare(call(ffn_activation_bytes, B, T, h, dtype, gated=gated, name="ffn_activation_bytes"), want,
                _shown("ffn_activation_bytes", B, T, h, dtype, gated=gated),
                "bytes = (2 or 4 tensors) * batch * seq_len * d_hidden * bytes per element.", variants=[
                    (want * 8, "that is bits: divide by 8 (or use element_size())."),
                    (2 * per if gated else None, "the gated FFN keeps four hidden tensors for the backward pass "
                                                 "(gate, up, silu(gate) and the product), not two."),
                    (when(lambda got: got in (per, 3 * per) or (not gated and got == 4 * per)),
                     "count the hidden tensors saved for backward: 2 for the GELU FFN (fc1's output and the "
                     "activation), 4 for SwiGLU."),
                    (want // size * 4 if dtype != torch.float32 else None,
                     f"{dtype} does not take 4 bytes per number: look the size up from the dtype.")])


# ----------------------------------------------------------------------------- exercise 8

_NEVER_ENFORCED = ("capacity was never enforced: an expert takes at most capacity = ceil(capacity_factor * n_tokens "
                   "* k / n_experts) choices; the others are dropped.")
_OVER_TOKENS = ("the routing is top-k of the softmax over the experts (the last dimension), one distribution per "
                "token: softmax(router(x), dim=-1).")
_COUNT_OVER_BATCH = ("an expert's count runs over the whole batch, all n_tokens * k choices routed to it, and the "
                     "routing is top-k of the softmax over the experts (the last dimension), one distribution per "
                     "token: softmax(router(x), dim=-1).")


def moe_reference(x: torch.Tensor, router_w: torch.Tensor, experts: list[tuple], k: int,
                  capacity_factor: float, capacity: int | None = None, *, token_major: bool = False,
                  gates: str = "renormalised", f_kept: bool = False, over_tokens: bool = False
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The slow per-token oracle: (y, aux_loss, kept), same conventions as the exercise. The keyword
    arguments make the tests' wrong variants: another ``capacity``, the choices placed token by token,
    ``gates`` "raw" (not renormalised) or "mean" (1/k), f_e counted over the kept choices only, the
    router's softmax taken over the tokens."""
    (B, T, d), E = x.shape, router_w.shape[0]
    flat = x.reshape(-1, d)
    N = flat.shape[0]
    capacity = math.ceil(capacity_factor * N * k / E) if capacity is None else capacity
    probs = torch.softmax(flat.double() @ router_w.double().T, dim=0 if over_tokens else -1)
    choices = [sorted(range(E), key=lambda e: -probs[n, e].item())[:k] for n in range(N)]
    load, kept = [0] * E, torch.zeros(N, k, dtype=torch.bool)
    order = [(n, r) for n in range(N) for r in range(k)]     # token by token: a wrong variant
    for n, r in order if token_major else sorted(order, key=lambda nr: nr[1]):   # all first choices, then ...
        if load[choices[n][r]] < capacity:
            load[choices[n][r]] += 1
            kept[n, r] = True
    y, f = torch.zeros(N, d, dtype=torch.float64), torch.zeros(E, dtype=torch.float64)
    for n in range(N):
        total = sum(probs[n, e].item() for e in choices[n])
        for r, e in enumerate(choices[n]):
            gate = {"renormalised": probs[n, e].item() / total, "raw": probs[n, e].item(), "mean": 1 / k}[gates]
            if kept[n, r]:
                y[n] += gate * _ffn_ref(flat[n].double(), *(t.double() for t in experts[e]))
            if kept[n, r] or not f_kept:
                f[e] += 1.0 / (N * k)
    aux = E * (f * probs.mean(0)).sum()
    return y.view(B, T, d), aux, kept.view(B, T, k)


def _router_probs(x: torch.Tensor, router_w: torch.Tensor) -> torch.Tensor:
    """The router's probabilities, softmax over the experts in float64: (n_tokens, n_experts)."""
    return torch.softmax(x.reshape(-1, x.shape[-1]).double() @ router_w.double().T, dim=-1)


def _balance(probs: torch.Tensor, k: int, mean_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """aux_loss from the router's probabilities (n_tokens, n_experts): E * sum_e f_e * P_e, f_e from their top k."""
    N, E = probs.shape
    f = torch.bincount(probs.topk(k, dim=-1).indices.reshape(-1), minlength=E).float() / (N * k)
    return E * (f * probs.to(mean_dtype).mean(0)).sum()


def _moe_module(MoE, width, d_ff, E, k, cf, d) -> tuple[Any, torch.Tensor, list[tuple]]:
    """A student's MoE with its router and experts checked and filled from ``d``: (module, router weight, the
    experts' (w1, b1, w2, b2))."""
    module = call(MoE, width, d_ff, E, k, capacity_factor=cf, name="MoE(...)")
    router_w = _linear(module, "router", width, E, False, "MoE", d, 1.5)[0]
    experts = getattr(module, "experts", None)
    expect(isinstance(experts, nn.ModuleList) and len(experts) == E,
           f"MoE needs `experts`, an nn.ModuleList of {E} FeedForward(d_model, d_ff).",
           "self.experts = nn.ModuleList([FeedForward(d_model, d_ff) for _ in range(n_experts)]).")
    return module, router_w, [_ffn_weights(expert, width, d_ff, d) for expert in experts]


def _moe_outputs(result: Any, B: int, T: int, width: int, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(y, aux_loss with its graph, kept) from what MoE.forward returned, each checked for its type and shape."""
    expect(isinstance(result, tuple) and len(result) == 3, "MoE.forward should return (y, aux_loss, kept).",
           "return the output, the load-balancing loss and the bool mask of kept choices as a tuple.")
    y, aux, kept = result
    expect_tensor(y, (B, T, width), "MoE output y")
    expect(isinstance(aux, torch.Tensor) and aux.dim() == 0, "aux_loss should be a scalar tensor.",
           "return the loss as a 0-dim tensor (it is added to the training loss and back-propagated).")
    expect(bool(aux.requires_grad), "aux_loss carries no gradient.",
           "compute P_e from the router's softmax probabilities without detaching them: the loss trains the "
           "router to spread its choices.")
    expect_tensor_of(kept, (B, T, k), torch.bool, "MoE kept mask",
                     "kept[b, t, r] is True when choice r of token (b, t) was processed by its expert.")
    return y, aux, kept


def _moe_compare(y, aux, kept, x, router_w, weights, k: int, cf: float, label: str) -> None:
    """The kept choices, the output and aux_loss against the slow loop's, each with its usual slips."""
    E, N = router_w.shape[0], x.shape[0] * x.shape[1]
    want_y, want_aux, want_kept = moe_reference(x, router_w, weights, k, cf)

    def wrong(i: int, **slip) -> Callable:    # output i of the slow loop with a slip, in float32
        return lambda: moe_reference(x, router_w, weights, k, cf, **slip)[i].float()

    shape = f"(d_model={x.shape[-1]}, n_experts={E}, k={k}, capacity_factor={cf})"
    compare(kept, want_kept, f"{label}: the choices kept differ from a slow per-token loop's {shape}: "
            f"{int(kept.sum())} kept, expected {int(want_kept.sum())}",
            "an expert accepts assignments while it holds fewer than capacity of them, in the priority order: rank 0 "
            "(first choices) in token order, then rank 1, ...", variants=[
                (when(lambda got: bool(got.all()) and not bool(want_kept.all())), _NEVER_ENFORCED),
                (wrong(2, capacity=math.floor(cf * N * k / E)),
                 "the capacity was rounded down: capacity = math.ceil(capacity_factor * n_tokens * k / n_experts)."),
                (wrong(2, capacity=math.ceil(cf * N / E)) if k > 1 else None, "the capacity counts all n_tokens * k "
                 "choices: capacity = ceil(capacity_factor * n_tokens * k / n_experts); without the factor k it is "
                 "too small."),
                (wrong(2, token_major=True) if k > 1 else None, "assignments were taken token by token (both choices "
                 "of token 0, then token 1, ...): give priority to all first choices, then all second choices, each "
                 "in token order."),
                (wrong(2, over_tokens=True), _OVER_TOKENS)])
    compare(y, want_y.float(), f"{label}: MoE output {shape}, against a slow per-token loop",
            "y[token] = sum over its kept choices of gate * expert(x[token]), with gate = the chosen probability "
            "divided by the sum of the k chosen probabilities.", variants=[
                (lambda: (want_y + x.double() * ~want_kept.any(-1, keepdim=True)).float(),
                 "a token whose choices were all dropped should get zero from the layer (the block's residual "
                 "carries it), not its own input: returning x adds it twice."),
                (wrong(0, over_tokens=True), _OVER_TOKENS),
                (wrong(0, gates="raw") if k > 1 else None, "the gates were not renormalised: divide the k chosen "
                 "probabilities by their sum, so that they add up to one."),
                (wrong(0, gates="mean"), "the expert outputs were averaged: weight each one by its gate (the "
                 "renormalised probability).")])
    fraction = "f_e is a fraction: divide the number of assignments to expert e by n_tokens * k."
    compare(aux, want_aux.float(), f"{label}: aux_loss {shape} (the output and the kept choices are right)",
            "aux_loss = n_experts * sum_e f_e * P_e, with f_e the fraction of the n_tokens * k choices that went to e "
            "and P_e the mean router probability of e over all tokens.", variants=[
                ((want_aux / E).float(), "the balancing loss is missing its factor n_experts: E * sum_e f_e * P_e "
                                         "equals 1 when the load is uniform."),
                ((want_aux * N * k).float(), fraction), ((want_aux * N).float(), fraction),
                (lambda: (E * (_router_probs(x, router_w).mean(0) ** 2).sum()).float(),
                 "f_e must count the routing decisions (the fraction of top-k choices that went to expert e), not "
                 "the mean probability: the loss is E * sum_e f_e * P_e."),
                (wrong(1, f_kept=True), "f_e counts every routing choice, before the capacity drops some: compute it "
                 "from the top-k indices, not from the kept assignments.")])


def _moe_router_gradient(module: Any, aux: torch.Tensor, x: torch.Tensor, router_w: torch.Tensor, k: int) -> None:
    """aux_loss trains the router through P_e: its gradient is that of E * sum_e f_e * P_e."""
    module.zero_grad()
    aux.backward()
    grad = module.router.weight.grad
    rw = router_w.clone().requires_grad_(True)
    _balance(torch.softmax(x.reshape(-1, x.shape[-1]) @ rw.T, dim=-1), k).backward()
    hint = ("compute P_e from the router's softmax probabilities without detaching them, and f_e from the top-k "
            "indices (it has no gradient): the loss trains the router through P_e.")
    expect(grad is not None, "aux_loss gives the router's weight no gradient.", hint)
    compare(grad.detach(), rw.grad, "the gradient of aux_loss with respect to the router's weight", hint)


@_one_thread
def check_moe(MoE, FeedForward=None, gelu=None, hidden: bool = False) -> None:
    """FeedForward and gelu, when given, are the earlier answers the experts are made of."""
    d = draw("moe", hidden)
    # (d_model, d_ff, n_experts, k, capacity_factor, B, T, the scale of x). n_experts is a power of two (or divides
    # n_tokens * k) and capacity_factor a dyadic number: capacity_factor * n_tokens * k / n_experts is exact in any
    # order. Case 1 gives each expert a capacity of 1 for 6 tokens: at least two tokens lose their only choice.
    cases = [(8, 16, 4, 2, 1.0, 2, 6, 1.0), (8, 16, 4, 1, 0.5, 1, 6, 1.0)]
    if hidden:
        E = d.rng.choice([2, 4, 8])
        cases = [(d.rng.randrange(2, 17), d.rng.randrange(2, 33), E, d.rng.choice([1, 2]),
                  d.rng.choice([0.5, 0.75, 1.25]), d.rng.randrange(1, 4), d.rng.randrange(2, 13), 1.0),
                 (6, 12, 4, 2, 0.5, 1, 8, 3.0),              # many drops, a peaked router
                 (6, 12, 8, 2, 4.0, 2, 4, 1.0),              # a capacity nothing reaches
                 (5, 9, 3, 3, 1.0, 1, 6, 1.0)]               # k = n_experts
    with earlier_first(*_calls("MoE", gelu=gelu, FeedForward=FeedForward)):
        for i, (width, d_ff, E, k, cf, B, T, x_scale) in enumerate(cases):
            module, router_w, weights = _moe_module(MoE, width, d_ff, E, k, cf, d)
            x = d.randn(B, T, width) * x_scale
            y, aux, kept = _moe_outputs(_run(module, x, "MoE.forward"), B, T, width, k)
            # Property: no expert processes more choices than its capacity.
            cap = math.ceil(cf * B * T * k / E)
            chosen = _router_probs(x, router_w).topk(k, dim=-1).indices.view(kept.shape)
            load = torch.bincount(chosen[kept], minlength=E)
            expect(int(load.max()) <= cap, f"case {i}: an expert processed {int(load.max())} choices, more than its "
                   f"capacity {cap} (counting the kept choices by the expert that top-k over softmax(router(x)) along "
                   "the experts gives them).", _NEVER_ENFORCED if bool(kept.all()) else _COUNT_OVER_BATCH)
            _moe_compare(y, aux.detach(), kept, x, router_w, weights, k, cf, f"case {i}")
            if i == 0:
                _moe_router_gradient(module, aux, x, router_w, k)
        _moe_one_expert(MoE, d)
        _moe_router_in_float32(MoE, d)


def _moe_one_expert(MoE, d) -> None:
    """One expert, k = 1: the mixture is the FFN (every token kept, gate 1)."""
    width = 6 if not d.hidden else d.rng.randrange(2, 12)
    module = call(MoE, width, 3 * width, 1, 1, capacity_factor=1.0, name="MoE(...)")
    weights = _ffn_weights(module.experts[0], width, 3 * width, d)
    x = d.randn(2, 3, width)
    y, aux, kept = _moe_outputs(_run(module, x, "MoE.forward"), 2, 3, width, 1)
    hint = "with a single expert every token is kept with gate 1: check the capacity and the gate normalisation."
    compare(y, _ffn_ref(x, *weights), "with one expert and k = 1, the MoE output (that expert's FFN)", hint)
    expect(bool(kept.all()), "with one expert and k = 1 the MoE should keep every token.", hint)
    compare(aux.detach(), torch.tensor(1.0), "with one expert aux_loss",
            "aux_loss = n_experts * sum_e f_e * P_e, which is 1 when the load is uniform.")


def _moe_router_in_float32(MoE, d) -> None:
    """A bfloat16 MoE: the spec takes the router's softmax in float32, so aux_loss (from those probabilities) is
    float32 and exact to float32's rounding of the bfloat16 logits. The input is redrawn until a softmax in
    bfloat16 moves aux_loss by at least 5e-4 (50 times the tolerance): rounding errors can cancel in the mean."""
    width, E, k, N = 8, 4, 2, 10
    module, router_w, _ = _moe_module(MoE, width, 16, E, k, 2.0, d)
    for _ in range(50):
        x = d.randn(2, N // 2, width).to(torch.bfloat16)
        logits = F.linear(x.reshape(-1, width), router_w.to(torch.bfloat16))          # (N, E), as nn.Linear
        want = _balance(torch.softmax(logits.float(), dim=-1), k)
        in_bf16 = [_balance(torch.softmax(logits, dim=-1), k, m) for m in (torch.float32, torch.bfloat16)]
        if all(abs(float(want - wrong)) > 5e-4 for wrong in in_bf16):
            break
    _, aux, _ = _moe_outputs(_run(module.to(torch.bfloat16), x, "MoE.forward"), 2, N // 2, width, k)
    hint = ("the router's softmax ran in bfloat16: the spec computes probs = softmax(router(x)) in float32 (convert "
            "the logits with .float() before the softmax), so that the gates and aux_loss keep float32's precision.")
    expect(aux.dtype == torch.float32, f"for a bfloat16 MoE, aux_loss is {aux.dtype}, expected float32.", hint)
    compare(aux.detach(), want, "for a bfloat16 MoE, aux_loss (from the router's float32 probabilities)",
            "aux_loss = n_experts * sum_e f_e * P_e from probs = softmax(router(x).float()).",
            variants=[*((v, hint) for v in in_bf16), (when(lambda got: matches(got, want, (1e-2, 1e-2))), hint)])
    module.float()


# ----------------------------------------------------------------------------- exercise 9

# Llama 3 8B, the case the notebook measures: (vocab_size, d_model, n_layers, n_heads, n_kv_heads, d_hidden).
SHARE_CASE = (128256, 4096, 32, 32, 8, 14336)


def _gated_count(config: tuple, **slip: Any) -> int:
    """The parameters of a gated decoder without biases, with RMSNorm and untied embeddings (``slip``: another)."""
    model = dict(zip(("V", "d", "L", "H", "H_kv", "h"), config), gated=True, bias=False, norm="rms", tied=False)
    return _count_oracle(**{**model, **slip})


def ffn_share_answer(V: int, d: int, L: int, H: int, H_kv: int, h: int) -> float:
    """The FFNs' share of all the parameters of a gated decoder without biases, RMSNorm, untied embeddings."""
    return L * 3 * d * h / _gated_count((V, d, L, H, H_kv, h))


def ffn_share_prediction_passes(predicted_ffn_share) -> bool:
    """For the exercise's demo, which shows the measurement only once the prediction passes its visible test."""
    return passes(_check_ffn_share_prediction, predicted_ffn_share)


def _share_judge(config: tuple, value: Any) -> None:
    V, d, L, H, H_kv, h = config
    ffn, total = L * 3 * d * h, _gated_count(config)
    guesses = [
        (ffn / (total - 2 * V * d - d), "that is the share of the blocks' parameters only: the question asks for all "
         "of them, with the embedding and the output layer (two vocab_size x d_model matrices) in the total."),
        (ffn / _gated_count(config, tied=True), "the embeddings are untied: the output layer is a second vocab_size x "
                                                "d_model matrix."),
        (ffn / _gated_count(config, H_kv=H), f"w_k and w_v were counted at full width: with {H_kv} key/value heads "
         f"of {d // H} features they map {d} to {H_kv * (d // H)}."),
        (L * 2 * d * h / _gated_count(config, gated=False), "SwiGLU has three matrices per layer (gate, up, down), "
                                                            "not two."),
        (100 * ffn / total, "return a fraction between 0 and 1, not a percentage.")]
    judge_prediction(
        "predicted_ffn_share", value, ffn / total, unit_hint="return your prediction as a fraction between 0 and 1.",
        asked="the FFNs' share of the parameters of this configuration", exact=1e-9, close=2e-3,
        close_hint="a rounded decimal (or a value read off a measurement) is not the prediction: return the arithmetic "
                   "that gives it, from the configuration's numbers, exact to float precision.",
        guesses=guesses, near=1e-6, shown=".6g",
        fallback="per layer the FFN holds 3 * d_model * d_hidden weights; the total adds attention (w_q and w_o of "
                 "d_model x n_heads * d_head, w_k and w_v of d_model x n_kv_heads * d_head), two norms per layer, the "
                 "final norm, the embedding and the output layer.")


def _check_ffn_share_prediction(predicted_ffn_share, hidden: bool = False) -> None:
    """Llama 3 8B and Llama 2 7B (MHA, a smaller vocabulary); hidden, configurations drawn at grading time."""
    configs = draw("predicted_ffn_share", hidden).cases([SHARE_CASE, (32000, 4096, 32, 32, 32, 11008)],
                                                        lambda d: _drawn_config(d.rng), 4)
    judge_configured("predicted_ffn_share", predicted_ffn_share, configs, ffn_share_answer, _share_judge,
                     shown=lambda c: "vocab_size={}, d_model={}, n_layers={}, n_heads={}, n_kv_heads={}, "
                                     "d_hidden={}".format(*c))


class _Part(nn.Module):
    """A module class for param_share's tests; it may hold another _Part."""

    def __init__(self, d: int, inner: nn.Module | None = None, bias: bool = True):
        super().__init__()
        self.proj, self.inner = nn.Linear(d, d, bias=bias), inner


class _SubPart(_Part):
    pass


def _share_cases(d) -> list[tuple[nn.Module, type, float, str]]:
    """(model, part, the share by hand, what the model is)."""
    width = 4 if not d.hidden else d.rng.randrange(2, 9)
    V = 10 if not d.hidden else d.rng.randrange(3, 40)
    unit = width * width + width        # one _Part
    cases = []
    with d.sub("init").seeded():        # the models are arguments: their weights must follow the draw
        # Two parts beside an embedding; a part inside a part (each parameter once); a head tied to the embedding.
        m = nn.ModuleDict({"embed": nn.Embedding(V, width), "a": _Part(width), "b": _Part(width)})
        cases.append((m, _Part, 2 * unit / (V * width + 2 * unit), f"an embedding ({V}, {width}) and two parts"))
        m = nn.ModuleList([_Part(width, _Part(width)), nn.Linear(width, 3 * width)])
        cases.append((m, _Part, 2 * unit / (2 * unit + 3 * width * width + 3 * width), "a part nested in another part"))
        m = nn.ModuleDict({"embed": nn.Embedding(V, width), "part": _Part(width, bias=False),
                           "head": nn.Linear(width, V, bias=False)})
        m["head"].weight = m["embed"].weight
        cases.append((m, nn.Linear, (width * width + V * width) / (V * width + width * width),
                      "an embedding tied to the output layer"))
        # A subclass counts; the model itself may be the part.
        m = _Part(width, _SubPart(width))
        cases += [(m, _SubPart, 0.5, "the model is a part and holds a subclass of the part asked for"),
                  (m, _Part, 1.0, "the model itself is the part")]
        m = nn.ModuleDict({"a": _Part(width), "b": _SubPart(width), "c": nn.Linear(width, width)})
        cases.append((m, _Part, 2 / 3, "a part, a subclass of it and a linear layer"))
        if d.hidden:
            big, V = d.rng.randrange(20, 120), d.rng.randrange(100, 2000)
            m = nn.ModuleDict({"embed": nn.Embedding(V, big), "ffn": nn.Sequential(_Part(big), _Part(big))})
            cases.append((m, _Part, 2 * (big * big + big) / (V * big + 2 * (big * big + big)),
                          f"an embedding ({V}, {big}) and two parts in a Sequential"))
            m = nn.Sequential(*[_Part(width) if j % 2 else nn.Linear(width, width)
                                for j in range(d.rng.randrange(2, 7))])
            cases.append((m, _Part, (len(m) // 2) / len(m), f"a stack of {len(m)} layers"))
    return cases


def _share_variants(model: nn.Module, part: type) -> list[tuple[float, str]]:
    """The shares that the usual wrong answers give, with their hints."""
    params = list(model.parameters())
    total = sum(p.numel() for p in params)
    matched = [m for m in model.modules() if isinstance(m, part)]
    once = {id(p) for m in matched for p in m.parameters()}
    children = {id(p) for m in model.children() if isinstance(m, part) for p in m.parameters()}
    exact = {id(p) for m in model.modules() if type(m) is part for p in m.parameters()}
    return [(sum(p.numel() for m in matched for p in m.parameters()) / total,
             "a parameter was counted more than once: a part nested in a part counts once. Collect the ids of the "
             "parameters in a set, then sum over model.parameters()."),
            (sum(p.numel() for p in params if id(p) in children) / total,
             "only the direct children were tested: search model.modules(), which includes the model itself and "
             "every level of nesting."),
            (sum(p.numel() for p in params if id(p) in once) /
             sum(p.numel() for _, p in model.named_parameters(remove_duplicate=False)),
             "the tied matrix was counted twice in the total: count each tensor once, as model.parameters() yields "
             "it."),
            (sum(1 for p in params if id(p) in once) / len(params),
             "that counts tensors: count their elements (p.numel())."),
            (sum(p.numel() for p in params if id(p) in exact) / total,
             "subclasses of part count too: test with isinstance(m, part), not type(m) is part.")]


@_one_thread
def check_ffn_share(predicted_ffn_share, param_share, hidden: bool = False) -> None:
    _check_ffn_share_prediction(predicted_ffn_share, hidden)
    for model, part, want, what in _share_cases(draw("param_share", hidden)):
        got = call(param_share, model, part, name="param_share")
        label = f"param_share(model, {part.__name__}) on {what}"
        try:
            value = float(got)
        except (TypeError, ValueError):
            fail(f"{label} returned {type(got).__name__}, expected a float.", "return the share as a Python float.")
        compare(value, want, label, "the share is (elements of the parameters inside modules of class part, each "
                "tensor once) / (elements of model.parameters()).", variants=_share_variants(model, part))