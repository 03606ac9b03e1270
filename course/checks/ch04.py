"""Checks for chapter 4: activations, the feed-forward network, SwiGLU from a fused gate-and-up
matrix and its hidden width, LayerNorm over several trailing dimensions, RMSNorm along any
axis, a Llama-style decoder block (RMSNorm, RoPE, causal grouped-query attention, SwiGLU;
Pre-LN or Post-LN), the parameter count of a whole model and the FFN's activation memory, a
top-k mixture of experts with capacity and its load-balancing loss, and the FFNs' share of a
model's parameters (predicted, then measured).

Oracles: ``F.gelu`` (both forms), ``F.silu``, ``F.layer_norm`` and ``F.rms_norm`` computed
here (never in the answers), a decoder block written with ``F.scaled_dot_product_attention``
(``enable_gqa``) and a RoPE written as complex multiplication, models built from ``nn``
modules on the meta device and counted, hand-derived counts, and a slow per-token loop for
the mixture of experts. Properties: output statistics of the norms, causality of the block,
a mixture with one expert and k = 1 equals the FFN, every routing choice either kept or
dropped and no expert over its capacity.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from ._core import CheckFailed, call, earlier_answers, earlier_first, expect_tensor, forbid, judge_prediction
from ._core import meta_table, one_thread as _one_thread
from ._vocabulary import compare, diagnose, draw, expect, fail, matches, when
from .ch03 import _rope_complex

# ----------------------------------------------------------------------------- helpers

_ACTIVATIONS = ((F, "gelu"), (F, "silu"))
_NORMS = ((F, "layer_norm"), (F, "rms_norm"), (torch, "layer_norm"), (torch, "rms_norm"))
_LOW = (torch.bfloat16, torch.float16)


def _tensor_out(value: Any, shape: tuple[int, ...], what: str) -> torch.Tensor:
    """The student's output as a plain (detached) tensor of the expected shape."""
    expect_tensor(value, shape, what)
    return value.detach()


def _norm_tol(x: torch.Tensor) -> tuple[float, float] | None:
    """A float32 norm's output is exact to about 1e-4, not float32's 1e-5: the statistics are computed in
    float32 (the exercises), and x - mean cancels digits in rows with a large mean and a small spread."""
    return None if x.dtype in _LOW else (1e-4, 1e-4)


def _precision(x: torch.Tensor) -> torch.dtype:
    """The dtype whose rounding a norm's output carries: the input's for bfloat16 and float16,
    float32 otherwise (the exercises compute the statistics in float32, a float64 input too)."""
    return x.dtype if x.dtype in _LOW else torch.float32


def _fill(layer: Any, d, scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Copy weights (and bias) drawn from ``d`` into a student's nn.Linear; return them."""
    w = d.randn(*layer.weight.shape) * scale / math.sqrt(layer.weight.shape[1])
    b = d.randn(*layer.bias.shape) * 0.5 if layer.bias is not None else None
    with torch.no_grad():
        layer.weight.copy_(w)
        if b is not None:
            layer.bias.copy_(b)
    return w, b


def _check_linear(module: Any, attr: str, d_in: int, d_out: int, bias: bool, cls: str) -> Any:
    layer = getattr(module, attr, None)
    expect(isinstance(layer, nn.Linear), f"{cls} needs an nn.Linear attribute `{attr}`.",
           f"create self.{attr} = nn.Linear(...) in __init__ with exactly this name: the tests copy weights into it.")
    shape = tuple(layer.weight.shape)
    if shape != (d_out, d_in):
        hint = f"{attr} maps {d_in} features to {d_out}: nn.Linear({d_in}, {d_out})."
        if cls == "FeedForward" and attr == "fc1" and shape == (d_in, d_in):
            hint = "d_ff defaults to 4 * d_model (the hidden layer expands, then projects back), not d_model."
        fail(f"{cls}.{attr}.weight has shape {shape}, expected {(d_out, d_in)}.", hint)
    expect((layer.bias is not None) == bias, f"{cls}.{attr} should {'have' if bias else 'not have'} a bias.",
           "nn.Linear(..., bias=True) for the FFN of this chapter's FeedForward; the gated (SwiGLU) layers use "
           "bias=False, as in Llama." if cls == "FeedForward" else "the SwiGLU projections have no bias: bias=False.")
    return layer


def _n_params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())

# ----------------------------------------------------------------------------- exercise 1


_KEEP_DTYPE = ("keep the input's dtype: build constants with math (floats), not float32 tensors, and do not "
               "convert the input with .float() without converting the result back.")
_ACTIVATION_REFERENCES = {"gelu": lambda x: F.gelu(x), "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
                          "silu": F.silu}


def _activation_variants(x: torch.Tensor, name: str) -> list:
    """The usual wrong activations of ``x`` that can pass for ``name``, with their hints."""
    gelus = {"gelu", "gelu_tanh"}
    every = gelus | {"silu"}
    variants = [
        (lambda: _ACTIVATION_REFERENCES[name](x.float()) if x.dtype == torch.float64 else None, every,
         "keep the input's dtype: this float64 input was computed in float32 (a float32 tensor or .float() in the "
         "formula)."),
        (lambda: F.gelu(x, approximate="tanh"), {"gelu"},
         "that is the tanh approximation of GELU; gelu asks for the exact form 0.5 * x * (1 + erf(x / sqrt(2)))."),
        (lambda: F.gelu(x), {"gelu_tanh"},
         "that is the exact GELU (with erf); gelu_tanh asks for the tanh approximation "
         "0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x**3)))."),
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


def _activation_inputs(d) -> list[torch.Tensor]:
    """Float32 inputs (and float64 hidden), then reduced precision: bfloat16 (and float16 hidden)."""
    xs = [torch.linspace(-6, 6, 241), d.randn(3, 17) * 3]
    if d.hidden:
        xs += [d.randn(2, d.rng.randrange(5, 60), 3) * 10,
               torch.tensor([0.0, -0.0, 1e-8, -1e-8, 30.0, -30.0, 80.0, -80.0, 1e4, -1e4]),
               torch.linspace(-3, 3, 7).to(torch.float64)]
    return xs + [(d.randn(64 if d.hidden else 16) * 4).to(dtype) for dtype in (_LOW if d.hidden else _LOW[:1])]


@_one_thread
def check_activations(gelu, gelu_tanh, silu, hidden: bool = False) -> None:
    _check_activations({"gelu": gelu, "gelu_tanh": gelu_tanh, "silu": silu}, hidden)


def _check_activations(functions: dict[str, Callable], hidden: bool) -> None:
    """Each of ``functions`` (named as in _ACTIVATION_REFERENCES) against PyTorch's."""
    for x in _activation_inputs(draw("activations", hidden)):
        low = x.dtype in _LOW
        for name, fn in functions.items():
            with forbid(*_ACTIVATIONS, exercise=f"{name} from elementary operations"):
                got = _tensor_out(call(fn, x.clone(), name=name), tuple(x.shape), f"{name} output")
            expect(got.dtype == x.dtype, f"{name} returned {got.dtype} for a {x.dtype} input.", _KEEP_DTYPE)
            # In reduced precision each intermediate of the formula is rounded (1 + erf(x) cancels for
            # negative x): the values are those of the float32 formula within a few units of bfloat16.
            exact = x.float() if low else x
            compare(got, _ACTIVATION_REFERENCES[name](exact),
                    f"{name} on {str(x.dtype)[6:]} inputs in [{x.min().item():.3g}, {x.max().item():.3g}]",
                    "compare your formula term by term with the one in the exercise.",
                    variants=_activation_variants(exact, name), tol=(3e-2, 3e-2) if low else None)


def _calls(who: str, gelu=None, silu=None, LayerNorm=None, FeedForward=None, RMSNorm=None, SwiGLU=None) -> list:
    """(what, check) pairs for the earlier answers that ``who`` calls, deepest first: a failure
    that one of them explains is blamed on it (``earlier_first``)."""
    return earlier_answers(who, ("calls your gelu", 1, gelu, lambda f: _check_activations({"gelu": f}, False)),
                           ("calls your silu", 1, silu, lambda f: _check_activations({"silu": f}, False)),
                           ("uses your LayerNorm", 4, LayerNorm, check_layer_norm),
                           ("uses your RMSNorm", 5, RMSNorm, lambda f: _check_rms_norm(f, False, last_axis_only=True)),
                           ("uses your FeedForward", 2, FeedForward, check_feed_forward),
                           ("uses your SwiGLU", 3, SwiGLU, lambda f: _check_swiglu(f, False, given_width_only=True)))

# ----------------------------------------------------------------------------- exercise 2


def _ffn_ref(x: torch.Tensor, w1, b1, w2, b2, act: Callable = F.gelu) -> torch.Tensor:
    return F.linear(act(F.linear(x, w1, b1)), w2, b2)


def _ffn_variants(x: torch.Tensor, w1, b1, w2, b2) -> list:
    wrong = functools.partial(_ffn_ref, x, w1, b1, w2, b2)
    return [(functools.partial(wrong, act=torch.relu), "ReLU was used where GELU is asked: apply your exact gelu "
                                                       "between fc1 and fc2."),
            (functools.partial(wrong, act=lambda h: F.gelu(h, approximate="tanh")),
             "the tanh approximation was used: the FFN uses the exact gelu from exercise 1."),
            (functools.partial(wrong, act=lambda h: h), "there is no activation between fc1 and fc2: two linear "
                                                        "layers in a row are one linear layer."),
            (functools.partial(wrong, act=F.silu), "SiLU was used where GELU is asked."),
            (functools.partial(_ffn_ref, x, w1, b1, w2, None),
             "fc2's bias was not added: call self.fc2(...) rather than multiplying by its weight.")]


@_one_thread
def check_feed_forward(FeedForward, gelu=None, hidden: bool = False) -> None:
    """gelu, when given, is the exercise 1 answer that FeedForward calls."""
    with earlier_first(*_calls("FeedForward", gelu=gelu)):
        _check_feed_forward(FeedForward, hidden)


def _check_feed_forward(FeedForward, hidden: bool) -> None:
    d = draw("feed_forward", hidden)
    configs = [(16, None), (12, 20)]
    if hidden:
        configs += [(1, None), (d.rng.randrange(2, 40), None), (d.rng.randrange(2, 40), d.rng.randrange(1, 70))]
    for d_model, d_ff in configs:
        args = (d_model,) if d_ff is None else (d_model, d_ff)
        module = call(FeedForward, *args, name="FeedForward(...)")
        width = 4 * d_model if d_ff is None else d_ff
        w1, b1 = _fill(_check_linear(module, "fc1", d_model, width, True, "FeedForward"), d, 2.0)
        w2, b2 = _fill(_check_linear(module, "fc2", width, d_model, True, "FeedForward"), d)
        want_n = 2 * d_model * width + width + d_model
        expect(_n_params(module) == want_n, f"FeedForward({', '.join(map(str, args))}) has {_n_params(module)} "
               f"parameters, expected {want_n}.", "the FFN holds exactly fc1 and fc2 (weights and biases); nothing "
               "else learns.")
        shape = (2, 5, d_model) if not hidden else (d.rng.randrange(1, 4), d.rng.randrange(1, 7), d_model)
        x = d.randn(*shape)
        with forbid((F, "gelu"), exercise="the FFN with your own gelu"):
            got = _tensor_out(call(module, x.clone(), name="FeedForward.forward"), shape, "FeedForward output")
        compare(got, _ffn_ref(x, w1, b1, w2, b2), f"FeedForward output (d_model={d_model}, d_ff={width})",
                "forward is fc2(gelu(fc1(x))): expand, activate, project.", variants=_ffn_variants(x, w1, b1, w2, b2))
        if hidden:   # position-wise: each token is transformed on its own
            row = _tensor_out(call(module, x[:, :1].clone(), name="FeedForward.forward"), (shape[0], 1, d_model),
                              "FeedForward output for one position")
            compare(row, got[:, :1], "the FFN output at position 0, once the other positions were removed,",
                    "the FFN acts on each position on its own: no mixing along T.")

# ----------------------------------------------------------------------------- exercise 3


def _swiglu_hidden_ref(d_model: int, multiple_of: int, multiplier: float | None = None) -> int:
    h = int(2 * (4 * d_model) / 3)
    if multiplier is not None:
        h = int(multiplier * h)
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
        shown = ", ".join(map(str, args))
        got = call(swiglu_hidden, *args, name="swiglu_hidden")
        expect(isinstance(got, int) and not isinstance(got, bool),
               f"swiglu_hidden({shown}) returned {type(got).__name__}, expected an int.",
               "return a Python int (use // and int(...)), not a float or a tensor.")
        compare(got, _swiglu_hidden_ref(d_model, m, mult), f"swiglu_hidden({shown})",
                "hidden = int(2 * 4 * d_model / 3), then int(ffn_dim_multiplier * hidden) when a multiplier is "
                "given, then round up to a multiple of multiple_of.", variants=_swiglu_hidden_variants(d_model, m, mult))


@_one_thread
def check_swiglu(SwiGLU, silu=None, hidden: bool = False) -> None:
    """silu, when given, is the exercise 1 answer that SwiGLU calls."""
    with earlier_first(*_calls("SwiGLU", silu=silu)):
        _check_swiglu(SwiGLU, hidden)


def _swiglu_variants(x, W, Wd, h) -> list:
    gate, up = W[:h], W[h:]
    f = lambda a, b, act=F.silu: F.linear(act(F.linear(x, a)) * F.linear(x, b), Wd)  # noqa: E731
    return [(lambda: f(up, gate), "the two halves were swapped: rows 0 .. d_hidden - 1 of w_gate_up are the gate "
                                  "(silu goes on them), rows d_hidden .. 2 d_hidden - 1 the up projection."),
            (lambda: f(W[0::2], W[1::2]), "the halves were taken interleaved (even and odd outputs): the gate is the "
                                          "first contiguous half of w_gate_up's output, up the second (chunk(2, "
                                          "dim=-1))."),
            (lambda: f(W[1::2], W[0::2]), "the halves were taken interleaved: the gate is the first contiguous half "
                                          "of w_gate_up's output, up the second (chunk(2, dim=-1))."),
            (lambda: f(gate, up, F.gelu), "GELU was used as the gate activation: that is GeGLU; SwiGLU uses silu."),
            (lambda: f(gate, up, torch.sigmoid), "sigmoid(gate) * up is the original GLU: SwiGLU uses silu(gate) = "
                                                 "gate * sigmoid(gate)."),
            (lambda: F.linear(F.silu(F.linear(x, gate) * F.linear(x, up)), Wd),
             "silu was applied to the product: apply it to the gate only, then multiply by up.")]


def _swiglu_configs(d, given_width_only: bool) -> list[tuple]:
    """(d_model, multiple_of, ffn_dim_multiplier, d_hidden or None for the computed width)."""
    if given_width_only:
        return [(16, 64, None, 24), (10, 64, None, 12)]
    configs = [(24, 16, None, None), (48, 64, None, None), (20, 8, 1.5, None), (10, 64, None, 12)]
    if d.hidden:
        configs += [(d.rng.randrange(4, 60), d.rng.choice([1, 8, 32]), d.rng.choice([None, 1.3, 0.75]), None)
                    for _ in range(2)] + [(7, 1, None, None), (d.rng.randrange(2, 30), 64, None, d.rng.randrange(1, 40))]
    return configs


def _check_swiglu(SwiGLU, hidden: bool, given_width_only: bool = False) -> None:
    """``given_width_only``: only SwiGLU(d_model, d_hidden), the part that the decoder block calls."""
    d = draw("swiglu", hidden)
    for i, (d_model, m, mult, d_hidden) in enumerate(_swiglu_configs(d, given_width_only)):
        kwargs = {"multiple_of": m} if d_hidden is None else {}
        if mult is not None:
            kwargs["ffn_dim_multiplier"] = mult
        args = (d_model,) if d_hidden is None else (d_model, d_hidden)
        shown = ", ".join([*map(str, args), *(f"{k}={v}" for k, v in kwargs.items())])
        module = call(SwiGLU, *args, name=f"SwiGLU({shown})", **kwargs)
        h = _swiglu_hidden_ref(d_model, m, mult) if d_hidden is None else d_hidden
        W = _fill(_check_linear(module, "w_gate_up", d_model, 2 * h, False, "SwiGLU"), d, 2.0)[0]
        Wd = _fill(_check_linear(module, "w_down", h, d_model, False, "SwiGLU"), d)[0]
        expect(_n_params(module) == 3 * d_model * h, f"SwiGLU({shown}) has {_n_params(module)} parameters, expected "
               f"3 * d_model * d_hidden = {3 * d_model * h}.", "SwiGLU holds exactly w_gate_up and w_down, without "
               "biases.")
        for dtype in (torch.float32,) if not hidden or i % 2 else (torch.float32, torch.float64):
            module.to(dtype)
            shape = (2, 3, d_model) if not hidden else (d.rng.randrange(1, 4), d.rng.randrange(1, 6), d_model)
            x = d.randn(*shape, dtype=torch.float64).to(dtype)
            with forbid((F, "silu"), exercise="SwiGLU with your own silu"):
                got = _tensor_out(call(module, x.clone(), name="SwiGLU.forward"), shape, "SwiGLU output")
            expect(got.dtype == dtype, f"SwiGLU returned {got.dtype} for a {dtype} input.",
                   "build nothing in a fixed dtype: the layers follow the module's dtype.")
            Wt, Wdt = W.to(dtype), Wd.to(dtype)
            compare(got, F.linear(F.silu(F.linear(x, Wt[:h])) * F.linear(x, Wt[h:]), Wdt),
                    f"SwiGLU output ({shown}, {str(dtype)[6:]}), against w_down(silu(gate) * up) with gate and up "
                    "the first and second halves of w_gate_up(x)",
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


def _norm_fallback(x: torch.Tensor, kind: str, along: str = "over its last dimension (d_model)") -> str:
    if x.dtype in _LOW:
        return (f"the statistics were computed in {str(x.dtype)[6:]}: compute them in float32 (x.float()), "
                "normalise, then cast the result back to the input's dtype.")
    return f"{kind} normalises each vector {along}, with keepdim=True."


def _layer_norm_variants(x: torch.Tensor, w, b, eps: float, shape: tuple[int, ...]) -> list:
    """The usual wrong LayerNorms of ``x`` (normalised over its trailing ``shape``), with their hints."""
    k, n = len(shape), math.prod(shape)
    x32 = x.float().reshape(*x.shape[:x.dim() - k], n)       # the normalised block flattened
    w, b = w.reshape(n), b.reshape(n)
    mu, var = x32.mean(-1, keepdim=True), x32.var(-1, keepdim=True, unbiased=False)
    last = x.float().mean(-1, keepdim=True), x.float().var(-1, keepdim=True, unbiased=False)
    out = [((x.float() - last[0]) / torch.sqrt(last[1] + eps) * w.reshape(shape) + b.reshape(shape) if k > 1 else None,
            f"the statistics were taken over the last dimension only: LayerNorm({shape}) normalises over the last "
            f"{k} dimensions at once (mean and var accept a tuple of dims)."),
           ((x32 - mu) / torch.sqrt(x32.var(-1, keepdim=True) + eps) * w + b if n > 1 else None,
            "the variance is the biased one (divide by d_model, not d_model - 1): "
            "x.var(-1, unbiased=False) or ((x - mean) ** 2).mean(-1)."),
           ((x32 - mu) / (torch.sqrt(var) + eps) * w + b, "eps goes inside the square root: (x - mean) / sqrt(var + "
                                                          "eps)."),
           ((x32 - mu) / torch.sqrt(var + eps), "the affine parameters were not applied: multiply by weight and add "
                                                "bias after normalising."),
           ((x32 - mu) / torch.sqrt(var + eps) * w, "the bias was not added after scaling by weight."),
           ((x32 - mu) / torch.sqrt(var + eps) + b, "the output was not multiplied by weight."),
           ((x32 - mu) / torch.sqrt(var) * w + b, "eps is missing: (x - mean) / sqrt(var + eps)."),
           (x32 / torch.sqrt(x32.pow(2).mean(-1, keepdim=True) + eps) * w + b,
            "the mean was not subtracted: that is RMSNorm; LayerNorm centres first."),
           ((x32 - x32.mean(0, keepdim=True)) / torch.sqrt(x32.var(0, keepdim=True, unbiased=False) + eps) * w + b
            if x.dim() > k and x.dtype not in _LOW else None,
            "the statistics were taken over the batch (dim 0): normalise over the last dimension, d_model.")]
    return [(None if v is None else v.reshape(x.shape).to(_precision(x)), hint) for v, hint in out]


def _affine_params(module: Any, shape: tuple[int, ...], cls: str, bias: bool) -> None:
    weight = getattr(module, "weight", None)
    expect(isinstance(weight, nn.Parameter), f"{cls} needs a learnable `weight` (an nn.Parameter).",
           "the affine scale: self.weight = nn.Parameter(torch.ones(...)).")
    w0 = weight.detach()
    expect(tuple(w0.shape) == shape, f"{cls}.weight has shape {tuple(w0.shape)}, expected {shape}.",
           "one scale per normalised element: torch.ones(normalized_shape)." if cls == "LayerNorm" else
           "one scale per feature: torch.ones(d).")
    expect(w0.dtype == torch.float32, f"{cls}.weight is {w0.dtype}, expected float32.",
           "keep the parameters in float32; only the output takes the input's dtype.")
    expect(torch.equal(w0, torch.ones(shape)), f"{cls}.weight starts at {w0.reshape(-1)[:4].tolist()}..., expected "
           "ones.", "initialise weight to ones (torch.ones): zeros would make the output zero and cut the gradient."
           if torch.equal(w0, torch.zeros(shape)) else "initialise weight to ones (torch.ones), so that the layer "
           "starts as a pure normalisation.")
    if bias:
        b = getattr(module, "bias", None)
        expect(isinstance(b, nn.Parameter), f"{cls} needs a learnable `bias` (an nn.Parameter).",
               "the affine shift: self.bias = nn.Parameter(torch.zeros(normalized_shape)).")
        expect(tuple(b.detach().shape) == shape and torch.equal(b.detach(), torch.zeros(shape)),
               f"{cls}.bias should start as zeros of shape {shape}.",
               "self.bias = nn.Parameter(torch.zeros(normalized_shape)).")
    else:
        expect(_n_params(module) == math.prod(shape), f"{cls}({math.prod(shape)}) has {_n_params(module)} "
               f"parameters, expected {math.prod(shape)}.", "RMSNorm has a scale (weight) only: no bias, because it "
               "does not centre.")


def _norm_eps(module: Any, default: float, cls: str) -> float:
    eps = getattr(module, "eps", None)
    expect(isinstance(eps, float) and math.isclose(eps, default),
           f"{cls}.eps is {eps!r}, expected {default}.", f"store the eps argument as self.eps (default {default}).")
    return eps


def _layer_norm_cases(d) -> list[tuple[Any, tuple[int, ...]]]:
    """(the argument given to LayerNorm, the normalised shape)."""
    if not d.hidden:
        return [(16, (16,)), ((3, 5), (3, 5)), ((4,), (4,))]
    n = d.rng.randrange(2, 65)
    two = (d.rng.randrange(2, 7), d.rng.randrange(2, 9))
    three = (2, d.rng.randrange(2, 5), 3)
    return [(n, (n,)), (two, two), (list(three), three), (3, (3,)), ((1, 6), (1, 6))]


def _run_norm(module: Any, x: torch.Tensor, cls: str, label: str) -> torch.Tensor:
    with forbid(*_NORMS, exercise=cls):
        got = _tensor_out(call(module, x.clone(), name=f"{cls}.forward"), tuple(x.shape), f"{cls} output ({label})")
    expect(got.dtype == x.dtype, f"{cls} returned {got.dtype} for a {x.dtype} input.",
           "compute the statistics in float32, then cast the result back: .to(x.dtype).")
    return got


@_one_thread
def check_layer_norm(LayerNorm, hidden: bool = False) -> None:
    d = draw("layer_norm", hidden)
    for arg, shape in _layer_norm_cases(d):
        module = call(LayerNorm, arg, name=f"LayerNorm({arg!r})")
        expect(not any(isinstance(m, nn.LayerNorm) for m in module.modules()),
               "LayerNorm contains an nn.LayerNorm.", "write the normalisation yourself: nn.LayerNorm is the oracle.")
        _affine_params(module, shape, "LayerNorm", bias=True)
        eps = _norm_eps(module, 1e-5, "LayerNorm")
        _layer_norm_statistics(module, arg, shape, eps, d)
        w, b = d.randn(*shape) * 0.5 + 1, d.randn(*shape)
        with torch.no_grad():
            module.weight.copy_(w)
            module.bias.copy_(b)
        for x, label in _norm_inputs(d, math.prod(shape)):
            x = x.reshape(*x.shape[:-1], *shape)
            got = _run_norm(module, x, "LayerNorm", label)
            want = F.layer_norm(x.double(), shape, w.double(), b.double(), eps).to(_precision(x))
            compare(got, want, f"LayerNorm({arg!r}) output ({label}, input shape {tuple(x.shape)})",
                    _norm_fallback(x, "LayerNorm"), variants=_layer_norm_variants(x, w, b, eps, shape), tol=_norm_tol(x))


def _layer_norm_statistics(module: Any, arg: Any, shape: tuple[int, ...], eps: float, d) -> None:
    """With its initial parameters, the output has mean 0 and variance var / (var + eps) per block."""
    dims = tuple(range(-len(shape), 0))
    x = d.randn(3, 4, *shape) * 5 + 2
    y = _run_norm(module, x, "LayerNorm", "float32")
    mean, var = y.mean(dims), y.var(dims, unbiased=False)
    var_in = x.double().var(dims, unbiased=False)
    if not (matches(mean, torch.zeros(3, 4)) and matches(var, (var_in / (var_in + eps)).float())):
        fail(f"LayerNorm({arg!r}) with weight = 1 and bias = 0: outputs should have mean 0 and (biased) variance "
             f"1 over each block of shape {shape}; got means up to {mean.abs().max().item():.3g} and variances in "
             f"[{var.min().item():.4g}, {var.max().item():.4g}].",
             diagnose(y, _layer_norm_variants(x, torch.ones(shape), torch.zeros(shape), eps, shape),
                      _norm_fallback(x, "LayerNorm")))


def _rms_norm_variants(x: torch.Tensor, w, eps: float, axis: int) -> list:
    """The usual wrong RMSNorms of ``x`` along ``axis``, with their hints."""
    x32 = x.float().movedim(axis, -1)
    ms = x32.pow(2).mean(-1, keepdim=True)
    n = x32.shape[-1]
    out = [((x32 - x32.mean(-1, keepdim=True)) / torch.sqrt(x32.var(-1, keepdim=True, unbiased=False) + eps) * w,
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
    out = [(None if v is None else v.movedim(-1, axis), hint) for v, hint in out]
    if axis not in (-1, x.dim() - 1):
        shape = [1] * x.dim()
        shape[axis] = -1
        last = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps) * w.view(shape)
        out.insert(0, (last, f"the root mean square was taken over the last axis: this RMSNorm normalises along "
                             f"axis {axis} (self.dim), of size {n}: mean(dim=self.dim, keepdim=True)."))
    return [(None if v is None else v.to(_precision(x)), hint) for v, hint in out]


def _rms_cases(d) -> list[tuple[int, int | None, int]]:
    """(d, the dim argument or None for the default, the axis of d in the test inputs)."""
    if not d.hidden:
        return [(16, None, -1), (6, 1, 1), (5, -2, -2)]
    return [(d.rng.randrange(2, 65), None, -1), (d.rng.randrange(2, 40), 1, 1), (3, 1, 1),
            (d.rng.randrange(2, 12), -3, -3), (4, -1, -1)]


def _rms_inputs(d, n: int, axis: int) -> list[tuple[torch.Tensor, str]]:
    """The shared norm inputs, with n moved to ``axis`` (a 4-D image-like input for axis -3)."""
    out = []
    for x, label in _norm_inputs(d, n):
        if axis == -3:                                          # (..., 2, 1, n) -> (..., n, 2, 1)
            x = torch.stack([x, x * 0.5 + 0.1], dim=-2).unsqueeze(-2)
        out.append((x.movedim(-1, axis).contiguous(), label))
    return out


@_one_thread
def check_rms_norm(RMSNorm, hidden: bool = False) -> None:
    _check_rms_norm(RMSNorm, hidden)


def _check_rms_norm(RMSNorm, hidden: bool, last_axis_only: bool = False) -> None:
    """``last_axis_only``: only the default dim = -1, the part that the decoder block calls."""
    d = draw("rms_norm", hidden)
    for n, dim, axis in [case for case in _rms_cases(d) if case[1] is None or not last_axis_only]:
        shown = f"RMSNorm({n})" if dim is None else f"RMSNorm({n}, dim={dim})"
        module = call(RMSNorm, n, name=shown) if dim is None else call(RMSNorm, n, dim=dim, name=shown)
        expect(not any(isinstance(m, (nn.RMSNorm, nn.LayerNorm)) for m in module.modules()),
               "RMSNorm contains an nn.RMSNorm or nn.LayerNorm.", "write the normalisation yourself: nn.RMSNorm "
               "is the oracle.")
        _affine_params(module, (n,), "RMSNorm", bias=False)
        eps = _norm_eps(module, 1e-6, "RMSNorm")
        first = ((d.randn(3, 4, n) * 5 + 2).movedim(-1, axis).contiguous(), "float32 with weight = 1")
        inputs = [(*first, torch.ones(n), _run_norm(module, first[0], "RMSNorm", first[1]))]
        w = d.randn(n) * 0.5 + 1
        with torch.no_grad():
            module.weight.copy_(w)
        inputs += [(x, label, w, None) for x, label in _rms_inputs(d, n, axis)]
        for x, label, weight, got in inputs:
            got = _run_norm(module, x, "RMSNorm", label) if got is None else got
            moved = x.double().movedim(axis, -1)
            want = F.rms_norm(moved, (n,), weight.double(), eps).movedim(-1, axis).to(_precision(x))
            compare(got, want, f"RMSNorm output ({shown}, input shape {tuple(x.shape)}, {label})",
                    _norm_fallback(x, "RMSNorm", f"along axis {axis} (of size {n})"),
                    variants=_rms_norm_variants(x, weight, eps, axis), tol=_norm_tol(x))

# ----------------------------------------------------------------------------- exercise 6


def _rope_oracle(x: torch.Tensor, base: float, interleaved: bool = False) -> torch.Tensor:
    """RoPE at positions 0 .. T-1 as complex multiplication (chapter 3's oracle), in x's dtype."""
    positions = torch.arange(x.shape[-2])
    return _rope_complex(x, positions, base, "interleaved" if interleaved else "half").to(x.dtype)


def _decoder_oracle(x: torch.Tensor, p: dict, H: int, H_kv: int, pre: bool, base: float, *, rope: str = "half",
                    gqa: str = "interleave", causal: bool = True, scale: float | None = None,
                    layout: str | None = None) -> torch.Tensor:
    """The block written with built-ins; the keyword arguments make the tests' wrong variants."""
    B, T, d = x.shape
    dh = d // H

    def norm(h, w):
        return F.rms_norm(h, (d,), w.to(h.dtype), 1e-6)

    def attn(h):
        q = F.linear(h, p["wq"]).view(B, T, H, dh).transpose(1, 2)
        k = F.linear(h, p["wk"]).view(B, T, H_kv, dh).transpose(1, 2)
        v = F.linear(h, p["wv"]).view(B, T, H_kv, dh).transpose(1, 2)
        if rope != "none":
            q = _rope_oracle(q, base, interleaved=rope == "interleaved")
            k = _rope_oracle(k, base, interleaved=rope == "interleaved") if rope != "q only" else k
        if gqa == "tile":
            k, v = k.repeat(1, H // H_kv, 1, 1), v.repeat(1, H // H_kv, 1, 1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale, enable_gqa=gqa != "tile")
        return F.linear(y.transpose(1, 2).reshape(B, T, H * dh), p["wo"])

    def ffn(h):
        gate, up = F.linear(h, p["wgu"]).chunk(2, dim=-1)
        return F.linear(F.silu(gate) * up, p["wd"])

    layout = layout or ("pre" if pre else "post")
    if layout == "pre":
        x = x + attn(norm(x, p["n1"]))
        return x + ffn(norm(x, p["n2"]))
    if layout == "post":
        x = norm(x + attn(x), p["n1"])
        return norm(x + ffn(x), p["n2"])
    if layout == "normalised residual":
        x = norm(x, p["n1"])
        x = x + attn(x)
        x = norm(x, p["n2"])
        return x + ffn(x)
    if layout == "one norm":
        return _decoder_oracle(x, {**p, "n2": p["n1"]}, H, H_kv, pre, base, rope=rope, gqa=gqa, causal=causal,
                               scale=scale)
    if layout == "parallel":
        return x + attn(norm(x, p["n1"])) + ffn(norm(x, p["n2"]))
    raise ValueError(layout)


def _decoder_variants(x, p, H, H_kv, pre, base) -> list:
    """The usual wrong blocks (computed only when the output is wrong), in the output's precision."""
    dh = x.shape[-1] // H
    o = lambda **wrong: _decoder_oracle(x, p, H, H_kv, pre, base, **wrong).to(_precision(x))  # noqa: E731
    out = [(lambda: o(layout="post" if pre else "pre"),
            "x = norm(x + f(x)) is Post-LN; Pre-LN normalises the input of each sublayer and adds its output to the "
            "un-normalised x: x = x + f(norm(x))." if pre else
            "x = x + f(norm(x)) is Pre-LN; Post-LN adds first and normalises the sum: x = norm(x + f(x))."),
           (lambda: o(rope="interleaved"), "RoPE paired neighbouring entries (2j, 2j + 1): this block uses the "
                                           "half-split pairing, entry j with entry j + d_head/2 (rotate_half)."),
           (lambda: o(rope="none"), "queries and keys were not rotated: apply RoPE to both, after splitting into "
                                    "heads."),
           (lambda: o(rope="q only"), "only the queries were rotated: RoPE rotates the keys too (never the values)."),
           (lambda: o(causal=False), "there is no causal mask: position t may see positions 0 .. t only."),
           (lambda: o(scale=1.0), f"the scores were not scaled: divide them by sqrt(d_head) = {math.sqrt(dh):.4g}."),
           (lambda: o(scale=1 / math.sqrt(x.shape[-1])), "the scores were scaled by 1/sqrt(d_model): the scale is "
                                                         "1/sqrt(d_head)."),
           (lambda: o(layout="one norm"), "norm1 was used for both sublayers: the FFN uses norm2."),
           (lambda: o(gqa="tile") if H_kv not in (1, H) else None,
            "query head h was given key/value head h % n_kv_heads (repeat tiles the heads): it uses head "
            "h // (n_heads // n_kv_heads) (repeat_interleave).")]
    if pre:
        out += [(lambda: o(layout="normalised residual"), "the residual carries the normalised x: keep the "
                                                          "un-normalised x on the residual path (x = x + "
                                                          "attn(norm1(x)))."),
                (lambda: o(layout="parallel"), "both sublayers read the block's input: the FFN must see the output "
                                               "of the attention sublayer (run them one after the other, updating x).")]
    return out


def _decoder_cases(d) -> list[tuple]:
    """(d_model, n_heads, n_kv_heads, d_hidden, pre_ln, T, dtype)."""
    if not d.hidden:
        return [(16, 4, 2, 24, True, 5, torch.float32), (12, 2, 1, 16, False, 4, torch.float32)]
    cases = []
    for pre in (True, False):
        H = d.rng.choice([2, 4, 6])
        H_kv = d.rng.choice([k for k in (1, 2, 3, 6) if H % k == 0 and k < H] or [1])
        dh = d.rng.choice([2, 4, 6, 8])
        cases.append((H * dh, H, H_kv, d.rng.randrange(4, 40), pre, d.rng.randrange(2, 9), torch.float32))
    return cases + [(24, 6, 3, 20, True, d.rng.randrange(3, 8), torch.float64),
                    (16, 4, 4, 12, False, 3, torch.float64), (8, 2, 2, 8, True, 1, torch.float32)]


def _decoder_weights(block: Any, width: int, H: int, H_kv: int, h: int, d) -> dict[str, torch.Tensor]:
    """Check the block's layers and fill them with weights drawn from ``d``; the weights, by oracle name."""
    cls, dh = "DecoderBlock", width // H
    p = {}
    for name, d_in, d_out in (("w_q", width, H * dh), ("w_k", width, H_kv * dh), ("w_v", width, H_kv * dh),
                              ("w_o", H * dh, width)):
        p[name.replace("_", "")] = _fill(_check_linear(block, name, d_in, d_out, False, cls), d)[0]
    for name in ("norm1", "norm2"):
        norm = getattr(block, name, None)
        weight = getattr(norm, "weight", None)
        expect(isinstance(weight, nn.Parameter) and tuple(weight.shape) == (width,) and _n_params(norm) == width,
               f"{cls} needs `{name}`, an RMSNorm(d_model) with a weight of shape ({width},) and nothing else.",
               f"create self.{name} = RMSNorm(d_model) (your class from exercise 5) in __init__.")
        p["n" + name[-1]] = d.randn(width) * 0.3 + 1
        with torch.no_grad():
            weight.copy_(p["n" + name[-1]])
    ffn = getattr(block, "ffn", None)
    expect(ffn is not None, f"{cls} needs `ffn`, a SwiGLU(d_model, d_hidden).",
           "create self.ffn = SwiGLU(d_model, d_hidden) (your class from exercise 3).")
    p["wgu"] = _fill(_check_linear(ffn, "w_gate_up", width, 2 * h, False, "SwiGLU"), d, 2.0)[0]
    p["wd"] = _fill(_check_linear(ffn, "w_down", h, width, False, "SwiGLU"), d)[0]
    want_n = 2 * width * H * dh + 2 * width * H_kv * dh + 3 * width * h + 2 * width
    expect(_n_params(block) == want_n, f"the block has {_n_params(block)} parameters, expected {want_n} (w_q, w_k, "
           "w_v, w_o, the SwiGLU and two RMSNorms).", "a block holds norm1, norm2, w_q, w_k, w_v, w_o and ffn, "
           "nothing more; no biases.")
    return p


def _run_block(block: Any, x: torch.Tensor, shown: str) -> torch.Tensor:
    with forbid((F, "scaled_dot_product_attention"), *_NORMS, (F, "silu"),
                exercise="the decoder block with your own attention, RMSNorm and silu"):
        got = _tensor_out(call(block, x.clone(), name=f"{shown}.forward"), tuple(x.shape), "DecoderBlock output")
    expect(got.dtype == x.dtype, f"DecoderBlock returned {got.dtype} for a {x.dtype} input.",
           "build the angles and the mask on x's device, and cast cos and sin to x's dtype.")
    return got


@_one_thread
def check_decoder_block(DecoderBlock, RMSNorm=None, SwiGLU=None, silu=None, hidden: bool = False) -> None:
    """RMSNorm, SwiGLU and silu, when given, are the earlier answers the block uses."""
    with earlier_first(*_calls("DecoderBlock", silu=silu, RMSNorm=RMSNorm, SwiGLU=SwiGLU)):
        _check_decoder_block(DecoderBlock, hidden)


def _check_decoder_block(DecoderBlock, hidden: bool) -> None:
    d = draw("decoder_block", hidden)
    for i, (width, H, H_kv, h, pre, T, dtype) in enumerate(_decoder_cases(d)):
        base = 10000.0 if i % 2 == 0 else 500.0
        shown = f"DecoderBlock({width}, {H}, {H_kv}, {h}, pre_ln={pre}, base={base})"
        block = call(DecoderBlock, width, H, H_kv, h, pre_ln=pre, base=base, name=shown)
        p = {k: v.to(dtype) for k, v in _decoder_weights(block, width, H, H_kv, h, d).items()}
        block.to(dtype)
        x = (d.randn(2, T, width, dtype=torch.float64) * 1.5 + 0.3).to(dtype)
        got = _run_block(block, x, shown)
        with torch.no_grad():
            compare(got, _decoder_oracle(x, p, H, H_kv, pre, base).to(_precision(x)),
                    f"{shown} output (input {tuple(x.shape)}, {str(dtype)[6:]}), against a block built from "
                    "F.rms_norm, F.scaled_dot_product_attention and F.silu",
                    "test the attention sublayer alone: project, split into heads (B, heads, T, d_head), rotate q "
                    "and k (half-split RoPE at positions 0 .. T-1), give query head h the key/value head h // group, "
                    "causal mask, scale 1/sqrt(d_head), merge the heads, w_o; then " +
                    ("x = x + attn(norm1(x)); x = x + ffn(norm2(x))." if pre else
                     "x = norm1(x + attn(x)); x = norm2(x + ffn(x))."),
                    variants=_decoder_variants(x, p, H, H_kv, pre, base))
        if hidden and T > 1:   # causality: a change to the last token leaves the earlier outputs alone
            x2 = x.clone()
            x2[:, -1] += 3.0
            compare(_run_block(block, x2, shown)[:, :-1], got[:, :-1].to(_precision(x)),
                    f"{shown}: the outputs at earlier positions after a change to the last token",
                    "position t may see positions 0 .. t only: mask the scores above the diagonal with -inf before "
                    "the softmax.")
        block.float()

# ----------------------------------------------------------------------------- exercise 7


def _count_oracle(V: int, d: int, L: int, H: int, H_kv: int, h: int, gated: bool, bias: bool, norm: str,
                  tied: bool) -> int:
    """Build the model from nn modules on the meta device (shapes only) and count its parameters
    (``device=`` on each layer and the table given its empty weight: initialising an embedding
    on the meta device imports TorchDynamo, 2 s)."""
    dh = d // H
    m = {"device": "meta"}
    Norm = nn.RMSNorm if norm == "rms" else nn.LayerNorm
    model = nn.ModuleDict({"embed": meta_table(V, d), "norm": Norm(d, **m)})
    blocks = nn.ModuleList()
    for _ in range(L):
        ffn = ([nn.Linear(d, h, bias=bias, **m), nn.Linear(d, h, bias=bias, **m)] if gated else
               [nn.Linear(d, h, bias=bias, **m)]) + [nn.Linear(h, d, bias=bias, **m)]
        blocks.append(nn.ModuleList([nn.Linear(d, H * dh, bias=bias, **m), nn.Linear(d, H_kv * dh, bias=bias, **m),
                                     nn.Linear(d, H_kv * dh, bias=bias, **m), nn.Linear(H * dh, d, bias=bias, **m),
                                     *ffn, Norm(d, **m), Norm(d, **m)]))
        if L > 2:   # every block has the same size: count one, multiply
            break
    model["blocks"] = blocks
    head = nn.Linear(d, V, bias=False, **m)
    if tied:
        head.weight = model["embed"].weight
    model["head"] = head
    one_block = sum(p.numel() for p in blocks[0].parameters()) if L else 0
    rest = sum(p.numel() for p in model.parameters()) - sum(p.numel() for p in blocks.parameters())
    return rest + L * one_block


_COUNT_CASES = [
    ((128256, 4096, 32, 32, 8, 14336), dict(gated=True, bias=False, norm="rms", tied=False), "Llama 3 8B"),
    ((50257, 768, 12, 12, 12, 3072), dict(gated=False, bias=True, norm="layer", tied=True),
     "GPT-2 small without its position table"),
    ((32000, 64, 2, 4, 2, 176), {}, "a small model with the defaults"),
    ((1000, 48, 3, 6, 2, 128), dict(gated=True, bias=True, norm="layer", tied=False), "gated, with biases"),
]


def _count_variants(want: int, V: int, d: int, L: int, H: int, H_kv: int, h: int, gated: bool, bias: bool,
                    norm: str, tied: bool) -> list[tuple[int, str]]:
    """The counts that the usual slips give, with their hints."""
    dh = d // H
    one_norm = d if norm == "rms" else 2 * d
    kv, kv_full = 2 * d * H_kv * dh + (2 * H_kv * dh if bias else 0), 2 * d * H * dh + (2 * H * dh if bias else 0)
    ffn_bias = ((2 * h + d) if gated else (h + d)) if bias else 0
    attn_bias = H * dh + 2 * H_kv * dh + d if bias else 0
    return [
        (want + V * d, "the output layer was counted although tied=True: it is the embedding matrix itself, counted "
                       "once." if tied else
         "the embedding and the output layer are two vocab_size x d_model matrices when untied, no more."),
        (want - V * d, "untied (tied=False), the output layer is a vocab_size x d_model matrix of its own: count it "
                       "beside the embedding." if not tied else "the token embedding (vocab_size x d_model) is "
                                                                "missing."),
        (want + L * (kv_full - kv), "w_k and w_v were counted at full width: with grouped-query attention they map "
                                    "d_model to n_kv_heads * d_head features."),
        (want - one_norm, "the final norm after the last block is missing: a model has 2 * n_layers + 1 norms."),
        (want + L * (d * h + (h if bias else 0)) * (-1 if gated else 1),
         "the gated FFN has three matrices (w_gate, w_up, w_down), the ungated one two (fc1, fc2)."),
        (want - L * ffn_bias - L * attn_bias, "the biases were left out: with bias=True every linear layer of the "
                                              "blocks has one (as wide as its output)."),
        (want - L * attn_bias, "the attention projections have biases too when bias=True."),
        (want - L * ffn_bias, "the FFN's layers have biases too when bias=True."),
        (want + (2 * L + 1) * d * (1 if norm == "rms" else -1),
         "an RMSNorm has a weight of d_model only; a LayerNorm a weight and a bias, 2 * d_model."),
        (want - (2 * L + 1) * one_norm, "the norms were left out: each holds d_model (RMSNorm) or 2 * d_model "
                                        "(LayerNorm) parameters, two per block and one at the end."),
        (want + L * (h - d) if bias and gated else None,
         "w_down's bias has d_model entries (its output width), not d_hidden.")]


def _drawn_count_case(d, j: int) -> tuple:
    H = d.rng.choice([1, 2, 4, 8, 12, 16, 32, 64])
    H_kv = d.rng.choice([k for k in (1, 2, 4, 8, H) if H % k == 0])
    width = H * d.rng.choice([8, 16, 64, 128])
    flags = dict(gated=bool(j & 1), bias=bool(j & 2), norm="layer" if j & 4 else "rms", tied=d.rng.random() < 0.5)
    return (d.rng.randrange(2, 200000), width, d.rng.randrange(1, 100), H, H_kv, d.rng.randrange(1, 30000)), flags


def check_count_params(count_params, hidden: bool = False) -> None:
    cases = list(_COUNT_CASES)
    if hidden:
        d = draw("count_params", hidden)
        cases += [(*_drawn_count_case(d, j), "a drawn configuration") for j in range(8)]
        cases += [((256000, 3072, 28, 16, 16, 24576), dict(tied=True), "a wide configuration with a large vocabulary"),
                  ((10, 6, 0, 2, 1, 5), dict(norm="layer"), "no blocks at all")]
    for (V, width, L, H, H_kv, h), flags, what in cases:
        flags = {"gated": True, "bias": False, "norm": "rms", "tied": True, **flags}
        shown = (f"count_params({V}, {width}, {L}, {H}, {H_kv}, {h}, " +
                 ", ".join(f"{k}={v!r}" for k, v in flags.items()) + f") ({what})")
        got = call(count_params, V, width, L, H, H_kv, h, name="count_params", **flags)
        expect(isinstance(got, int) and not isinstance(got, bool), f"{shown} returned {type(got).__name__}, "
               "expected an int.", "count with integer arithmetic (no division with /, no tensors).")
        want = _count_oracle(V, width, L, H, H_kv, h, **flags)
        compare(got, want, shown, "count piece by piece: embedding, per block (w_q, w_k, w_v, w_o, the FFN, two "
                "norms), the final norm, and the output layer unless tied.",
                variants=_count_variants(want, V, width, L, H, H_kv, h, **flags))


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
                f"ffn_activation_bytes({B}, {T}, {h}, {dtype}, gated={gated})",
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


def moe_reference(x: torch.Tensor, router_w: torch.Tensor, experts: list[tuple], k: int,
                  capacity_factor: float, capacity: int | None = None, *, token_major: bool = False,
                  gates: str = "renormalised", f_kept: bool = False, over_tokens: bool = False
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The slow per-token oracle: (y, aux_loss, kept), same conventions as the exercise. The keyword
    arguments make the tests' wrong variants: another ``capacity``, the choices placed token by token,
    ``gates`` "raw" (not renormalised) or "mean" (1/k), f_e counted over the kept choices only, the
    router's softmax taken over the tokens."""
    B, T, d = x.shape
    E = router_w.shape[0]
    flat = x.reshape(-1, d)
    N = flat.shape[0]
    if capacity is None:
        capacity = math.ceil(capacity_factor * N * k / E)
    probs = torch.softmax(flat.double() @ router_w.double().T, dim=0 if over_tokens else -1)
    choices = [sorted(range(E), key=lambda e: -probs[n, e].item())[:k] for n in range(N)]
    load = [0] * E
    kept = torch.zeros(N, k, dtype=torch.bool)
    # All first choices in token order, then all second choices, ... (or token by token).
    for n, r in [(n, r) for n in range(N) for r in range(k)] if token_major else [(n, r) for r in range(k) for n in range(N)]:
        if load[choices[n][r]] < capacity:
            load[choices[n][r]] += 1
            kept[n, r] = True
    y = torch.zeros(N, d, dtype=torch.float64)
    f = torch.zeros(E, dtype=torch.float64)
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


def _routing(x: torch.Tensor, router_w: torch.Tensor, k: int) -> tuple[torch.Tensor, Any]:
    """The router's probabilities (N, E), in float64, and their top k (values and indices, (N, k))."""
    probs = torch.softmax(x.reshape(-1, x.shape[-1]).double() @ router_w.double().T, dim=-1)
    return probs, probs.topk(k, dim=-1)


def _moe_module(MoE, width, d_ff, E, k, cf, d) -> tuple[Any, torch.Tensor, list[tuple]]:
    """A student's MoE with its router and experts checked and filled from ``d``: (module, router weight, the
    experts' (w1, b1, w2, b2))."""
    module = call(MoE, width, d_ff, E, k, capacity_factor=cf, name="MoE(...)")
    router = getattr(module, "router", None)
    expect(isinstance(router, nn.Linear) and tuple(router.weight.shape) == (E, width) and router.bias is None,
           "MoE needs `router`, an nn.Linear(d_model, n_experts, bias=False).",
           "the router scores each token for each expert: nn.Linear(d_model, n_experts, bias=False).")
    experts = getattr(module, "experts", None)
    expect(isinstance(experts, nn.ModuleList) and len(experts) == E,
           f"MoE needs `experts`, an nn.ModuleList of {E} FeedForward(d_model, d_ff).",
           "self.experts = nn.ModuleList([FeedForward(d_model, d_ff) for _ in range(n_experts)]).")
    router_w = d.randn(E, width) * 1.5 / math.sqrt(width)
    with torch.no_grad():
        router.weight.copy_(router_w)
    weights = [(*_fill(_check_linear(ex, "fc1", width, d_ff, True, "FeedForward"), d, 2.0),
                *_fill(_check_linear(ex, "fc2", d_ff, width, True, "FeedForward"), d)) for ex in experts]
    return module, router_w, weights


def _moe_outputs(result: Any, B: int, T: int, width: int, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(y, aux_loss with its graph, kept) from what MoE.forward returned, each checked for its type and shape."""
    expect(isinstance(result, tuple) and len(result) == 3, "MoE.forward should return (y, aux_loss, kept).",
           "return the output, the load-balancing loss and the bool mask of kept choices as a tuple.")
    y, aux, kept = result
    y = _tensor_out(y, (B, T, width), "MoE output y")
    expect(isinstance(aux, torch.Tensor) and aux.dim() == 0, "aux_loss should be a scalar tensor.",
           "return the loss as a 0-dim tensor (it is added to the training loss and back-propagated).")
    expect(bool(aux.requires_grad), "aux_loss carries no gradient.",
           "compute P_e from the router's softmax probabilities without detaching them: the loss trains the "
           "router to spread its choices.")
    kept = _tensor_out(kept, (B, T, k), "MoE kept mask")
    expect(kept.dtype == torch.bool, f"kept should be a bool tensor, got {kept.dtype}.",
           "kept[b, t, r] is True when choice r of token (b, t) was processed by its expert.")
    return y, aux, kept


def _moe_within_capacity(kept: torch.Tensor, x, router_w, k: int, cf: float, label: str) -> None:
    """Property: no expert processes more choices than its capacity."""
    E, n_choices = router_w.shape[0], kept.numel()
    cap = math.ceil(cf * n_choices / E)
    load = torch.bincount(_routing(x, router_w, k)[1].indices.view(kept.shape)[kept], minlength=E)
    expect(int(load.max()) <= cap,
           f"{label}: an expert processed {int(load.max())} choices, more than its capacity {cap} (counting the kept "
           "choices by the expert that top-k over softmax(router(x)) along the experts gives them).",
           "capacity was never enforced: an expert takes at most capacity = ceil(capacity_factor * n_tokens * k / "
           "n_experts) tokens; the others are dropped." if bool(kept.all()) else
           "an expert's count runs over the whole batch, all n_tokens * k choices routed to it, and the routing is "
           "top-k of the softmax over the experts (the last dimension), one distribution per token.")


def _moe_compare(y, aux, kept, x, router_w, weights, k: int, cf: float, label: str) -> None:
    """The kept choices, the output and aux_loss against the slow loop's, each with its usual slips."""
    E, N = router_w.shape[0], x.shape[0] * x.shape[1]
    want_y, want_aux, want_kept = moe_reference(x, router_w, weights, k, cf)
    wrong = functools.partial(moe_reference, x, router_w, weights, k, cf)
    over_tokens = ("the routing is top-k of the softmax over the experts (the last dimension), one distribution per "
                   "token: softmax(router(x), dim=-1).")
    shape = f"(d_model={x.shape[-1]}, n_experts={E}, k={k}, capacity_factor={cf})"
    compare(kept, want_kept, f"{label}: the choices kept differ from a slow per-token loop's {shape}: "
            f"{int(kept.sum())} kept, expected {int(want_kept.sum())}",
            "an expert accepts assignments while it holds fewer than capacity of them, in the priority order: rank 0 "
            "(first choices) in token order, then rank 1, ...", variants=[
                (when(lambda got: bool(got.all()) and not bool(want_kept.all())),
                 "capacity was never enforced: an expert takes at most capacity = ceil(capacity_factor * n_tokens * "
                 "k / n_experts) tokens; the others are dropped."),
                (lambda: wrong(capacity=math.floor(cf * N * k / E))[2],
                 "the capacity was rounded down: capacity = math.ceil(capacity_factor * n_tokens * k / n_experts)."),
                (lambda: wrong(capacity=math.ceil(cf * N / E))[2] if k > 1
                 else None, "the capacity counts all n_tokens * k choices: capacity = ceil(capacity_factor * "
                            "n_tokens * k / n_experts); without the factor k it is too small."),
                (lambda: wrong(token_major=True)[2] if k > 1 else None,
                 "assignments were taken token by token (both choices of token 0, then token 1, ...): give priority "
                 "to all first choices, then all second choices, each in token order."),
                (lambda: wrong(over_tokens=True)[2], over_tokens)])
    compare(y, want_y.float(), f"{label}: MoE output {shape}, against a slow per-token loop",
            "y[token] = sum over its kept choices of gate * expert(x[token]), with gate = the chosen probability "
            "divided by the sum of the k chosen probabilities.", variants=[
                (lambda: (want_y + x.double() * ~want_kept.any(-1, keepdim=True)).float(),
                 "a token whose choices were all dropped should get zero from the layer (the block's residual "
                 "carries it), not its own input: returning x adds it twice."),
                (lambda: wrong(over_tokens=True)[0].float(), over_tokens),
                (lambda: wrong(gates="raw")[0].float() if k > 1 else None,
                 "the gates were not renormalised: divide the k chosen probabilities by their sum, so that they add "
                 "up to one."),
                (lambda: wrong(gates="mean")[0].float(),
                 "the expert outputs were averaged: weight each one by its gate (the renormalised probability).")])
    fraction = "f_e is a fraction: divide the number of assignments to expert e by n_tokens * k."
    compare(aux, want_aux.float(), f"{label}: aux_loss {shape} (the output and the kept choices are right)",
            "aux_loss = n_experts * sum_e f_e * P_e, with f_e the fraction of the n_tokens * k choices that went to e "
            "and P_e the mean router probability of e over all tokens.", variants=[
                ((want_aux / E).float(), "the balancing loss is missing its factor n_experts: E * sum_e f_e * P_e "
                                         "equals 1 when the load is uniform."),
                ((want_aux * N * k).float(), fraction), ((want_aux * N).float(), fraction),
                (lambda: (E * (_routing(x, router_w, k)[0].mean(0) ** 2).sum()).float(),
                 "f_e must count the routing decisions (the fraction of top-k choices that went to expert e), not "
                 "the mean probability: the loss is E * sum_e f_e * P_e."),
                (lambda: wrong(f_kept=True)[1].float(),
                 "f_e counts every routing choice, before the capacity drops some: compute it from the top-k "
                 "indices, not from the kept assignments.")])


def _moe_case(MoE, case: tuple, d, label: str) -> tuple[Any, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One configuration checked against the slow loop; (module, aux_loss with its graph, x, router weight)."""
    width, d_ff, E, k, cf, B, T, x_scale = case
    module, router_w, weights = _moe_module(MoE, width, d_ff, E, k, cf, d)
    x = d.randn(B, T, width) * x_scale
    y, aux, kept = _moe_outputs(call(module, x.clone(), name="MoE.forward"), B, T, width, k)
    _moe_within_capacity(kept, x, router_w, k, cf, label)
    _moe_compare(y, aux.detach(), kept, x, router_w, weights, k, cf, label)
    return module, aux, x, router_w


def _moe_router_gradient(module: Any, aux: torch.Tensor, x: torch.Tensor, router_w: torch.Tensor, k: int) -> None:
    """aux_loss trains the router through P_e: its gradient is that of E * sum_e f_e * P_e."""
    module.zero_grad()
    aux.backward()
    grad = module.router.weight.grad
    rw = router_w.clone().requires_grad_(True)
    probs = torch.softmax(x.reshape(-1, x.shape[-1]) @ rw.T, dim=-1)
    E = rw.shape[0]
    f = torch.bincount(probs.topk(k, dim=-1).indices.reshape(-1), minlength=E).float() / probs.shape[0] / k
    (E * (f * probs.mean(0)).sum()).backward()
    hint = ("compute P_e from the router's softmax probabilities without detaching them, and f_e from the top-k "
            "indices (it has no gradient): the loss trains the router through P_e.")
    expect(grad is not None, "aux_loss gives the router's weight no gradient.", hint)
    compare(grad.detach(), rw.grad, "the gradient of aux_loss with respect to the router's weight", hint)


def _moe_cases(d) -> list[tuple]:
    """(d_model, d_ff, n_experts, k, capacity_factor, B, T, the scale of x). n_experts is a power of two (or
    divides n_tokens * k) and capacity_factor a dyadic number, so that capacity_factor * n_tokens * k / n_experts
    is computed exactly in any order."""
    if not d.hidden:
        # Case 1 gives each expert a capacity of 1 for 6 tokens: at least two tokens lose their only choice.
        return [(8, 16, 4, 2, 1.0, 2, 6, 1.0), (8, 16, 4, 1, 0.5, 1, 6, 1.0)]
    E = d.rng.choice([2, 4, 8])
    return [(d.rng.randrange(2, 17), d.rng.randrange(2, 33), E, d.rng.choice([1, 2]), d.rng.choice([0.5, 0.75, 1.25]),
             d.rng.randrange(1, 4), d.rng.randrange(2, 13), 1.0),
            (6, 12, 4, 2, 0.5, 1, 8, 3.0),              # many drops, a peaked router
            (6, 12, 8, 2, 4.0, 2, 4, 1.0),              # a capacity nothing reaches
            (5, 9, 3, 3, 1.0, 1, 6, 1.0)]               # k = n_experts


@_one_thread
def check_moe(MoE, FeedForward=None, gelu=None, hidden: bool = False) -> None:
    """FeedForward and gelu, when given, are the earlier answers the experts are made of."""
    with earlier_first(*_calls("MoE", gelu=gelu, FeedForward=FeedForward)):
        _check_moe(MoE, hidden)


def _check_moe(MoE, hidden: bool) -> None:
    d = draw("moe", hidden)
    for i, case in enumerate(_moe_cases(d)):
        module, aux, x, router_w = _moe_case(MoE, case, d, f"case {i}")
        if i == 0:
            _moe_router_gradient(module, aux, x, router_w, case[3])
    # One expert, k = 1: the mixture is the FFN (every token kept, gate 1).
    width = 6 if not hidden else d.rng.randrange(2, 12)
    module = call(MoE, width, 3 * width, 1, 1, capacity_factor=1.0, name="MoE(...)")
    w1, b1 = _fill(module.experts[0].fc1, d, 2.0)
    w2, b2 = _fill(module.experts[0].fc2, d)
    x = d.randn(2, 3, width)
    y, aux, kept = _moe_outputs(call(module, x.clone(), name="MoE.forward"), 2, 3, width, 1)
    hint = "with a single expert every token is kept with gate 1: check the capacity and the gate normalisation."
    compare(y, _ffn_ref(x, w1, b1, w2, b2), "with one expert and k = 1, the MoE output (that expert's FFN)", hint)
    expect(bool(kept.all()), "with one expert and k = 1 the MoE should keep every token.", hint)
    compare(aux.detach(), torch.tensor(1.0), "with one expert aux_loss",
            "aux_loss = n_experts * sum_e f_e * P_e, which is 1 when the load is uniform.")

# ----------------------------------------------------------------------------- exercise 9


def _llama3_8b_ffn_share() -> float:
    d, V, L, h, kv = 4096, 128256, 32, 14336, 8 * 128
    ffn = 3 * d * h
    total = 2 * V * d + L * (2 * d * d + 2 * d * kv + ffn + 2 * d) + d
    return L * ffn / total


FFN_SHARE_ANSWER = _llama3_8b_ffn_share()


def ffn_share_prediction_passes(predicted_ffn_share) -> bool:
    """For the exercise's demo, which shows the measurement only once the prediction passes its test."""
    try:
        _check_ffn_share_prediction(predicted_ffn_share)
    except CheckFailed:
        return False
    return True


def _check_ffn_share_prediction(predicted_ffn_share) -> None:
    d, V, L, h = 4096, 128256, 32, 14336
    ffn = L * 3 * d * h
    layers = L * (2 * d * d + 2 * d * 1024 + 3 * d * h + 2 * d)
    guesses = [
        (ffn / layers, "that is the share of the blocks' parameters only: the question asks for all of them, with "
                       "the embedding and the output layer (2 x 128256 x 4096) in the total."),
        (ffn / (layers + V * d + d), "Llama 3 8B's embeddings are untied: the output layer is a second 128256 x 4096 "
                                     "matrix."),
        (ffn / (2 * V * d + L * (4 * d * d + 3 * d * h + 2 * d) + d),
         "w_k and w_v were counted at full width: with 8 key/value heads of 128 features they map 4096 to 1024."),
        (L * 2 * d * h / (2 * V * d + L * (2 * d * d + 2 * d * 1024 + 2 * d * h + 2 * d) + d),
         "SwiGLU has three matrices per layer (gate, up, down), not two."),
        (100 * FFN_SHARE_ANSWER, "return a fraction between 0 and 1, not a percentage."),
    ]
    judge_prediction(
        "predicted_ffn_share", call(predicted_ffn_share, name="predicted_ffn_share"), FFN_SHARE_ANSWER,
        unit_hint="return your prediction as a fraction between 0 and 1.",
        asked="the FFNs' share of Llama 3 8B's parameters", exact=1e-9, close=2e-3,
        close_hint="a rounded decimal (or a value read off a measurement) is not the prediction: return the arithmetic "
                   "that gives it, as a Python expression of the configuration's numbers, exact to float precision.",
        guesses=guesses, near=1e-6, shown=".6g",
        fallback="per layer the FFN holds 3 * 4096 * 14336 weights; the total adds attention (w_q and w_o of 4096 x "
                 "4096, w_k and w_v of 4096 x 1024), two norms per layer, the final norm, the embedding and the "
                 "output layer.")


class _Part(nn.Module):
    """A module class for param_share's tests; it may hold another _Part."""

    def __init__(self, d: int, inner: nn.Module | None = None, bias: bool = True):
        super().__init__()
        self.proj = nn.Linear(d, d, bias=bias)
        self.inner = inner


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
            cases += _drawn_share_cases(d, width)
    return cases


def _drawn_share_cases(d, width: int) -> list[tuple[nn.Module, type, float, str]]:
    big, V = d.rng.randrange(20, 120), d.rng.randrange(100, 2000)
    m = nn.ModuleDict({"embed": nn.Embedding(V, big), "ffn": nn.Sequential(_Part(big), _Part(big))})
    cases = [(m, _Part, 2 * (big * big + big) / (V * big + 2 * (big * big + big)),
              f"an embedding ({V}, {big}) and two parts in a Sequential")]
    m = nn.Sequential(*[_Part(width) if j % 2 else nn.Linear(width, width) for j in range(d.rng.randrange(2, 7))])
    return cases + [(m, _Part, (len(m) // 2) / len(m), f"a stack of {len(m)} layers")]


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
    _check_ffn_share_prediction(predicted_ffn_share)
    for model, part, want, what in _share_cases(draw("param_share", hidden)):
        got = call(param_share, model, part, name="param_share")
        label = f"param_share(model, {part.__name__}) on {what}"
        try:
            value = float(got)
        except (TypeError, ValueError):
            fail(f"{label} returned {type(got).__name__}, expected a float.", "return the share as a Python float.")
        compare(value, want, label, "the share is (elements of the parameters inside modules of class part, each "
                "tensor once) / (elements of model.parameters()).", variants=_share_variants(model, part))
