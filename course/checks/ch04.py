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

from ._core import CheckFailed, call, earlier_answers, earlier_first, expect, expect_tensor, fail, forbid, generator
from ._core import judge_prediction, meta_table, one_thread as _one_thread, same as _same
from .ch03 import _rope_complex
from ._hidden import hidden_generator, hidden_rng, hidden_seed

# ----------------------------------------------------------------------------- helpers






def _tensor_out(value: Any, shape: tuple[int, ...], what: str) -> torch.Tensor:
    """The student's output as a plain (detached) tensor of the expected shape."""
    expect_tensor(value, shape, what)
    return value.detach()


_ACTIVATIONS = ((F, "gelu"), (F, "silu"))
_NORMS = ((F, "layer_norm"), (F, "rms_norm"), (torch, "layer_norm"), (torch, "rms_norm"))


def _gelu_sigmoid(x: torch.Tensor) -> torch.Tensor:
    return x * torch.sigmoid(1.702 * x)


def _gelu_tanh_wrong_constant(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * (1 + torch.tanh(math.sqrt(2) / math.pi * (x + 0.044715 * x**3)))


def _gelu_tanh_no_cubic(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * x))


def _gelu_erf_half(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * (1 + torch.erf(x / 2))


def _diagnose_activation(got: torch.Tensor, x: torch.Tensor, name: str) -> str:
    every = {"gelu", "gelu_tanh", "silu"}
    candidates = [
        (F.gelu(x, approximate="tanh"), {"gelu"},
         "that is the tanh approximation of GELU; gelu asks for the exact form 0.5 * x * (1 + erf(x / sqrt(2)))."),
        (F.gelu(x), {"gelu_tanh"},
         "that is the exact GELU (with erf); gelu_tanh asks for the tanh approximation "
         "0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x**3)))."),
        (_gelu_sigmoid(x), {"gelu", "gelu_tanh"},
         "x * sigmoid(1.702 x) is a cruder approximation of GELU; write the formula the exercise gives."),
        (torch.relu(x), every, "that is ReLU, max(0, x): it is not smooth around 0 and has no negative dip."),
        (torch.sigmoid(x), every, "sigmoid(x) alone is the gate: SiLU multiplies it by x (x * sigmoid(x))."),
        (_gelu_tanh_wrong_constant(x), {"gelu", "gelu_tanh"},
         "the constant inside tanh is sqrt(2 / pi) (about 0.798), not sqrt(2) / pi (about 0.450)."),
        (_gelu_tanh_no_cubic(x), {"gelu", "gelu_tanh"},
         "the tanh argument is sqrt(2 / pi) * (x + 0.044715 * x**3): the cubic term is missing."),
        (_gelu_erf_half(x), {"gelu", "gelu_tanh"}, "the erf argument is x / sqrt(2), not x / 2."),
        (x * torch.sigmoid(x), {"gelu", "gelu_tanh"},
         "that is SiLU, x * sigmoid(x): GELU weights x by the normal CDF Phi(x)."),
        (F.gelu(x), {"silu"}, "that is GELU: SiLU is x * sigmoid(x)."),
    ]
    for want, names, hint in candidates:
        if name in names and _same(got, want, 1e-5, 1e-5):
            return hint
    if not torch.isfinite(got).all() and torch.isfinite(x).all():
        return ("the output has inf or NaN for large |x|: write the formula so that no intermediate overflows "
                "(for example use torch.sigmoid(x) rather than 1 / (1 + exp(-x)) with a huge exp).")
    return "compare your formula term by term with the one in the exercise."


def _activation_inputs(g: torch.Generator, hidden: bool) -> list[torch.Tensor]:
    xs = [torch.linspace(-6, 6, 241), torch.randn(3, 17, generator=g) * 3]
    if hidden:
        rng_n = int(torch.randint(5, 60, (1,), generator=g))
        xs += [torch.randn(2, rng_n, 3, generator=g) * 10,
               torch.tensor([0.0, -0.0, 1e-8, -1e-8, 30.0, -30.0, 80.0, -80.0, 1e4, -1e4]),
               torch.linspace(-3, 3, 7).to(torch.float64)]
    return xs

# ----------------------------------------------------------------------------- exercise 1


_KEEP_DTYPE = ("keep the input's dtype: build constants with math (floats), not float32 tensors, and do not "
               "convert the input with .float() without converting the result back.")
_ACTIVATION_REFERENCES = {"gelu": lambda x: F.gelu(x), "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
                          "silu": F.silu}


@_one_thread
def check_activations(gelu, gelu_tanh, silu, hidden: bool = False) -> None:
    _check_activations({"gelu": gelu, "gelu_tanh": gelu_tanh, "silu": silu}, hidden)


def _check_activations(functions: dict[str, Callable], hidden: bool) -> None:
    """Each of ``functions`` (named as in _ACTIVATION_REFERENCES) against PyTorch's, in float32
    and in reduced precision (bfloat16 visible; bfloat16 and float16 hidden)."""
    g = generator(401) if not hidden else hidden_generator("activations")
    for x in _activation_inputs(g, hidden):
        for name, fn in functions.items():
            with forbid(*_ACTIVATIONS, exercise=f"{name} from elementary operations"):
                got = call(fn, x.clone(), name=name)
            got = _tensor_out(got, tuple(x.shape), f"{name} output")
            expect(got.dtype == x.dtype, f"{name} returned {got.dtype} for a {x.dtype} input.", _KEEP_DTYPE)
            want = _ACTIVATION_REFERENCES[name](x)
            if not _same(got, want, 1e-5, 1e-5):
                fail(f"{name} differs from the reference on inputs in [{x.min().item():.3g}, {x.max().item():.3g}]: "
                     f"largest difference {(got.to(torch.float64) - want.to(torch.float64)).abs().nan_to_num(1e30).max().item():.3g}.",
                     _diagnose_activation(got, x, name))
    # Reduced precision: the dtype is kept and the values are those of the float32 formula, rounded.
    for dtype in (torch.bfloat16, torch.float16) if hidden else (torch.bfloat16,):
        x = (torch.randn(64 if hidden else 16, generator=g) * 4).to(dtype)
        for name, fn in functions.items():
            with forbid(*_ACTIVATIONS, exercise=f"{name} from elementary operations"):
                got = _tensor_out(call(fn, x.clone(), name=name), tuple(x.shape), f"{name} output")
            expect(got.dtype == dtype, f"{name} returned {got.dtype} for a {dtype} input.", _KEEP_DTYPE)
            want = _ACTIVATION_REFERENCES[name](x.float())
            if not _same(got.float(), want, 3e-2, 3e-2):
                fail(f"{name} on a {dtype} input differs from the reference.", _diagnose_activation(got.float(), x.float(), name))


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
    if (layer.bias is not None) != bias:
        fail(f"{cls}.{attr} should {'have' if bias else 'not have'} a bias.",
             "nn.Linear(..., bias=True) for the FFN of this chapter's FeedForward; the gated (SwiGLU) layers use "
             "bias=False, as in Llama." if cls == "FeedForward" else "the SwiGLU projections have no bias: bias=False.")
    return layer


def _fill(layer: Any, g: torch.Generator, scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Copy fresh random weights (and bias) into a student's nn.Linear; return them."""
    w = torch.randn(tuple(layer.weight.shape), generator=g) * scale / math.sqrt(layer.weight.shape[1])
    b = torch.randn(tuple(layer.bias.shape), generator=g) * 0.5 if layer.bias is not None else None
    with torch.no_grad():
        layer.weight.copy_(w)
        if b is not None:
            layer.bias.copy_(b)
    return w, b


def _ffn_ref(x: torch.Tensor, w1, b1, w2, b2, act: Callable = F.gelu) -> torch.Tensor:
    return F.linear(act(F.linear(x, w1, b1)), w2, b2)


def _diagnose_ffn(got: torch.Tensor, x: torch.Tensor, w1, b1, w2, b2) -> str:
    for act, hint in ((torch.relu, "ReLU was used where GELU is asked: apply your exact gelu between fc1 and fc2."),
                      (lambda h: F.gelu(h, approximate="tanh"),
                       "the tanh approximation was used: the FFN uses the exact gelu from exercise 1."),
                      (lambda h: h, "there is no activation between fc1 and fc2: two linear layers in a row are one "
                                    "linear layer."),
                      (F.silu, "SiLU was used where GELU is asked.")):
        if _same(got, _ffn_ref(x, w1, b1, w2, b2, act), 1e-4, 1e-4):
            return hint
    if _same(got, F.linear(F.gelu(F.linear(x, w1, b1)), w2, None), 1e-4, 1e-4):
        return "fc2's bias was not added: call self.fc2(...) rather than multiplying by its weight."
    return "forward is fc2(gelu(fc1(x))): expand, activate, project."


@_one_thread
def check_feed_forward(FeedForward, gelu=None, hidden: bool = False) -> None:
    """gelu, when given, is the exercise 1 answer that FeedForward calls."""
    with earlier_first(*_calls("FeedForward", gelu=gelu)):
        _check_feed_forward(FeedForward, hidden)


def _check_feed_forward(FeedForward, hidden: bool) -> None:
    configs = [(16, None), (12, 20)]
    rng = hidden_rng("feed_forward")
    if hidden:
        configs += [(1, None), (rng.randrange(2, 40), None), (rng.randrange(2, 40), rng.randrange(1, 70))]
    for i, (d_model, d_ff) in enumerate(configs):
        torch.manual_seed(402 + i if not hidden else hidden_seed(f"feed_forward/init{i}"))
        args = (d_model,) if d_ff is None else (d_model, d_ff)
        module = call(FeedForward, *args, name="FeedForward(...)")
        hidden_width = 4 * d_model if d_ff is None else d_ff
        fc1 = _check_linear(module, "fc1", d_model, hidden_width, True, "FeedForward")
        fc2 = _check_linear(module, "fc2", hidden_width, d_model, True, "FeedForward")
        n = sum(p.numel() for p in module.parameters())
        expect(n == 2 * d_model * hidden_width + hidden_width + d_model,
               f"FeedForward({', '.join(map(str, args))}) has {n} parameters, expected "
               f"{2 * d_model * hidden_width + hidden_width + d_model}.",
               "the FFN holds exactly fc1 and fc2 (weights and biases); nothing else learns.")
        g = generator(4020 + i) if not hidden else hidden_generator(f"feed_forward/{i}")
        w1, b1 = _fill(fc1, g, 2.0)
        w2, b2 = _fill(fc2, g)
        shape = (2, 5, d_model) if not hidden else (rng.randrange(1, 4), rng.randrange(1, 7), d_model)
        x = torch.randn(shape, generator=g)
        with forbid((F, "gelu"), exercise="the FFN with your own gelu"):
            got = _tensor_out(call(module, x, name="FeedForward.forward"), shape, "FeedForward output")
        want = _ffn_ref(x, w1, b1, w2, b2)
        if not _same(got, want, 1e-4, 1e-4):
            fail(f"FeedForward output (d_model={d_model}, d_ff={hidden_width}) differs from fc2(gelu(fc1(x))).",
                 _diagnose_ffn(got, x, w1, b1, w2, b2))
        if hidden:
            # Position-wise: each token is transformed on its own.
            row = _tensor_out(call(module, x[:, :1].clone(), name="FeedForward.forward"), (shape[0], 1, d_model),
                              "FeedForward output for one position")
            expect(_same(row, got[:, :1], 1e-4, 1e-4), "the FFN output at position 0 changed when the other "
                   "positions were removed.", "the FFN acts on each position on its own: no mixing along T.")

# ----------------------------------------------------------------------------- exercise 3


def _swiglu_hidden_ref(d_model: int, multiple_of: int, multiplier: float | None = None) -> int:
    h = int(2 * (4 * d_model) / 3)
    if multiplier is not None:
        h = int(multiplier * h)
    return multiple_of * ((h + multiple_of - 1) // multiple_of)


def check_swiglu_hidden(swiglu_hidden, hidden: bool = False) -> None:
    cases = [(768, 64, None), (4096, 256, None), (4096, 1024, 1.3), (12, 8, None), (96, 32, 1.5)]
    if hidden:
        rng = hidden_rng("swiglu_hidden")
        cases += [(4096, 64, None), (3, 1, None), (1536, 128, 2.0), (8192, 4096, 1.3), (5120, 256, 1.3)]
        cases += [(rng.randrange(1, 9000), rng.choice([1, 8, 16, 32, 64, 128, 256, 1024]),
                   rng.choice([None, 1.3, 1.5, 0.75, round(rng.uniform(0.5, 2.5), 3)])) for _ in range(10)]
    for d_model, m, mult in cases:
        args = (d_model, m) if mult is None else (d_model, m, mult)
        shown = ", ".join(map(str, args))
        got = call(swiglu_hidden, *args, name="swiglu_hidden")
        want = _swiglu_hidden_ref(d_model, m, mult)
        expect(isinstance(got, int) and not isinstance(got, bool),
               f"swiglu_hidden({shown}) returned {type(got).__name__}, expected an int.",
               "return a Python int (use // and int(...)), not a float or a tensor.")
        if got != want:
            raw = _swiglu_hidden_ref(d_model, 1, mult)
            if got == raw:
                hint = (f"the width {raw} was not rounded: round it up to a multiple of multiple_of "
                        "so that matrix shapes suit the hardware.")
            elif mult is not None and got == _swiglu_hidden_ref(d_model, m):
                hint = ("ffn_dim_multiplier was ignored: multiply the two-thirds width by it (then int) before "
                        "rounding.")
            elif mult is not None and got == int(mult * _swiglu_hidden_ref(d_model, m)):
                hint = ("the multiplier was applied after the rounding, so the result is no longer a multiple of "
                        "multiple_of: multiply first, round up last.")
            elif got == 4 * d_model or got == m * ((4 * d_model + m - 1) // m):
                hint = "that is the width of the ungated FFN: SwiGLU has three matrices, so it starts from 8/3 d_model."
            elif got == (raw // m) * m:
                hint = "the width was rounded down: round up to the next multiple (ceil), as Llama does."
            elif got == m * round(raw / m):
                hint = "the width was rounded to the nearest multiple: round up (ceil), as Llama does."
            else:
                hint = ("hidden = int(2 * 4 * d_model / 3), then int(ffn_dim_multiplier * hidden) when a multiplier is "
                        "given, then round up to a multiple of multiple_of.")
            fail(f"swiglu_hidden({shown}) returned {got}, expected {want}.", hint)


@_one_thread
def check_swiglu(SwiGLU, silu=None, hidden: bool = False) -> None:
    """silu, when given, is the exercise 1 answer that SwiGLU calls."""
    with earlier_first(*_calls("SwiGLU", silu=silu)):
        _check_swiglu(SwiGLU, hidden)


def _swiglu_variants(x, W, Wd, h) -> list[tuple[torch.Tensor, str]]:
    gate, up = W[:h], W[h:]
    f = lambda a, b, act=F.silu: F.linear(act(F.linear(x, a)) * F.linear(x, b), Wd)  # noqa: E731
    return [(f(up, gate), "the two halves were swapped: rows 0 .. d_hidden - 1 of w_gate_up are the gate (silu goes "
                          "on them), rows d_hidden .. 2 d_hidden - 1 the up projection."),
            (f(W[0::2], W[1::2]), "the halves were taken interleaved (even and odd outputs): the gate is the first "
                                  "contiguous half of w_gate_up's output, up the second (chunk(2, dim=-1))."),
            (f(W[1::2], W[0::2]), "the halves were taken interleaved: the gate is the first contiguous half of "
                                  "w_gate_up's output, up the second (chunk(2, dim=-1))."),
            (f(gate, up, F.gelu), "GELU was used as the gate activation: that is GeGLU; SwiGLU uses silu."),
            (f(gate, up, torch.sigmoid), "sigmoid(gate) * up is the original GLU: SwiGLU uses silu(gate) = "
                                         "gate * sigmoid(gate)."),
            (F.linear(F.silu(F.linear(x, gate) * F.linear(x, up)), Wd),
             "silu was applied to the product: apply it to the gate only, then multiply by up.")]


def _check_swiglu(SwiGLU, hidden: bool, given_width_only: bool = False) -> None:
    """``given_width_only``: only SwiGLU(d_model, d_hidden), the part that the decoder block calls."""
    configs = [(24, 16, None, None), (48, 64, None, None), (20, 8, 1.5, None), (10, 64, None, 12)]
    rng = hidden_rng("swiglu")
    if hidden:
        configs += [(rng.randrange(4, 60), rng.choice([1, 8, 32]), rng.choice([None, 1.3, 0.75]), None)
                    for _ in range(2)] + [(7, 1, None, None), (rng.randrange(2, 30), 64, None, rng.randrange(1, 40))]
    if given_width_only:
        configs = [(16, 64, None, 24), (10, 64, None, 12)]
    for i, (d_model, m, mult, d_hidden) in enumerate(configs):
        torch.manual_seed(403 + i if not hidden else hidden_seed(f"swiglu/init{i}"))
        kwargs = {"multiple_of": m} if d_hidden is None else {}
        if mult is not None:
            kwargs["ffn_dim_multiplier"] = mult
        args = (d_model,) if d_hidden is None else (d_model, d_hidden)
        shown = ", ".join([*map(str, args), *(f"{k}={v}" for k, v in kwargs.items())])
        module = call(SwiGLU, *args, name=f"SwiGLU({shown})", **kwargs)
        h = _swiglu_hidden_ref(d_model, m, mult) if d_hidden is None else d_hidden
        wgu = _check_linear(module, "w_gate_up", d_model, 2 * h, False, "SwiGLU")
        wd = _check_linear(module, "w_down", h, d_model, False, "SwiGLU")
        n = sum(p.numel() for p in module.parameters())
        expect(n == 3 * d_model * h, f"SwiGLU({shown}) has {n} parameters, expected 3 * d_model * d_hidden = "
               f"{3 * d_model * h}.", "SwiGLU holds exactly w_gate_up and w_down, without biases.")
        g = generator(4030 + i) if not hidden else hidden_generator(f"swiglu/{i}")
        W = _fill(wgu, g, 2.0)[0]
        Wd = _fill(wd, g)[0]
        dtypes = (torch.float32,) if not hidden or i % 2 else (torch.float32, torch.float64)
        for dtype in dtypes:
            module.to(dtype)
            shape = (2, 3, d_model) if not hidden else (rng.randrange(1, 4), rng.randrange(1, 6), d_model)
            x = torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)
            with forbid((F, "silu"), exercise="SwiGLU with your own silu"):
                got = _tensor_out(call(module, x, name="SwiGLU.forward"), shape, "SwiGLU output")
            expect(got.dtype == dtype, f"SwiGLU returned {got.dtype} for a {dtype} input.",
                   "build nothing in a fixed dtype: the layers follow the module's dtype.")
            Wt, Wdt = W.to(dtype), Wd.to(dtype)
            want = F.linear(F.silu(F.linear(x, Wt[:h])) * F.linear(x, Wt[h:]), Wdt)
            if not _same(got, want, 1e-4, 1e-4):
                hint = next((hint for cand, hint in _swiglu_variants(x, Wt, Wdt, h) if _same(got, cand, 1e-4, 1e-4)),
                            "forward is w_down(silu(gate) * up), with gate, up = the two halves of w_gate_up(x).")
                fail(f"SwiGLU output ({shown}, {str(dtype)[6:]}) differs from w_down(silu(gate) * up), with gate and "
                     "up the first and second halves of w_gate_up(x).", hint)
        module.float()

# ----------------------------------------------------------------------------- exercise 4 and 5


def _norm_inputs(g: torch.Generator, d: int, hidden: bool, rng) -> list[tuple[torch.Tensor, str]]:
    cases = [(torch.randn(2, 3, d, generator=g) * 2 + 1, "float32"),
             (torch.randn(4, d, generator=g) * 3 + 40, "float32 with a large mean"),
             ((torch.randn(2, 4, d, generator=g) + 300).to(torch.bfloat16), "bfloat16 with a large mean"),
             (torch.randn(2, 3, d, generator=g) * 1e-3, "float32 rows of about 1e-3, whose variance is below eps")]
    if hidden:
        T = rng.randrange(1, 7)
        tiny = torch.randn(2, T, d, generator=g) * 1e-3 + 0.05 * torch.randn(2, T, 1, generator=g)  # variance < eps
        cases += [(tiny, "float32 rows with a variance near eps"),
                  ((torch.randn(3, T, d, generator=g) * 2 + rng.choice([-700, 150, 1000])).to(torch.bfloat16),
                   "bfloat16 with a large mean"),
                  ((torch.randn(2, T, d, generator=g) * 2 + 0.5).to(torch.bfloat16), "bfloat16"),
                  ((torch.randn(2, T, d, generator=g) * 400).to(torch.float16), "float16 with large values"),
                  (torch.randn(rng.randrange(1, 4), T, d, generator=g).to(torch.float64), "float64")]
    return cases


def _layer_norm_variants(x32: torch.Tensor, w, b, eps: float) -> list[tuple[torch.Tensor, str]]:
    d = x32.shape[-1]
    mu = x32.mean(-1, keepdim=True)
    var = x32.var(-1, keepdim=True, unbiased=False)
    out = []
    if d > 1:
        out.append(((x32 - mu) / torch.sqrt(x32.var(-1, keepdim=True) + eps) * w + b,
                    "the variance is the biased one (divide by d_model, not d_model - 1): "
                    "x.var(-1, unbiased=False) or ((x - mean) ** 2).mean(-1)."))
    out += [((x32 - mu) / (torch.sqrt(var) + eps) * w + b,
             "eps goes inside the square root: (x - mean) / sqrt(var + eps)."),
            ((x32 - mu) / torch.sqrt(var + eps), "the affine parameters were not applied: multiply by weight "
                                                 "and add bias after normalising."),
            ((x32 - mu) / torch.sqrt(var + eps) * w, "the bias was not added after scaling by weight."),
            ((x32 - mu) / torch.sqrt(var + eps) + b, "the output was not multiplied by weight."),
            ((x32 - mu) / torch.sqrt(var) * w + b, "eps is missing: (x - mean) / sqrt(var + eps)."),
            (x32 / torch.sqrt(x32.pow(2).mean(-1, keepdim=True) + eps) * w + b,
             "the mean was not subtracted: that is RMSNorm; LayerNorm centres first.")]
    return out


def _diagnose_norm(got: torch.Tensor, x: torch.Tensor, variants: list, want: torch.Tensor, kind: str) -> str:
    low = x.dtype in (torch.bfloat16, torch.float16)
    for cand, hint in variants:
        if _same(got.float(), cand.to(x.dtype).float(), 2e-2 if low else 1e-4, 2e-2 if low else 1e-4):
            return hint
    if low:
        return (f"the statistics were computed in {str(x.dtype).replace('torch.', '')}: compute them in float32 "
                f"(x.float()), normalise, then cast the result back to the input's dtype.")
    if x.dim() > 1 and _same(got, (x - x.mean(0, keepdim=True)) / torch.sqrt(x.var(0, keepdim=True, unbiased=False) + 1e-5), 1e-3, 1e-3):
        return "the statistics were taken over the batch (dim 0): normalise over the last dimension, d_model."
    return f"{kind} normalises each vector over its last dimension (d_model), with keepdim=True."


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
    if not torch.equal(w0, torch.ones(shape)):
        fail(f"{cls}.weight starts at {w0.reshape(-1)[:4].tolist()}..., expected ones.",
             "initialise weight to ones (torch.ones): zeros would make the output zero and cut the gradient."
             if torch.equal(w0, torch.zeros(shape)) else "initialise weight to ones (torch.ones), so that the "
             "layer starts as a pure normalisation.")
    b = getattr(module, "bias", None)
    n_elements = math.prod(shape)
    if bias:
        expect(isinstance(b, nn.Parameter), f"{cls} needs a learnable `bias` (an nn.Parameter).",
               "the affine shift: self.bias = nn.Parameter(torch.zeros(normalized_shape)).")
        expect(tuple(b.detach().shape) == shape and torch.equal(b.detach(), torch.zeros(shape)),
               f"{cls}.bias should start as zeros of shape {shape}.",
               "self.bias = nn.Parameter(torch.zeros(normalized_shape)).")
    else:
        n = sum(p.numel() for p in module.parameters())
        expect(n == n_elements, f"{cls}({n_elements}) has {n} parameters, expected {n_elements}.",
               "RMSNorm has a scale (weight) only: no bias, because it does not centre.")


def _norm_eps(module: Any, default: float, cls: str) -> float:
    eps = getattr(module, "eps", None)
    expect(isinstance(eps, float) and math.isclose(eps, default),
           f"{cls}.eps is {eps!r}, expected {default}.", f"store the eps argument as self.eps (default {default}).")
    return eps


def _layer_norm_cases(hidden: bool, rng) -> list[tuple[Any, tuple[int, ...]]]:
    """(the argument given to LayerNorm, the normalised shape)."""
    cases = [(16, (16,)), ((3, 5), (3, 5)), ((4,), (4,))]
    if hidden:
        d = rng.randrange(2, 65)
        two = (rng.randrange(2, 7), rng.randrange(2, 9))
        three = (2, rng.randrange(2, 5), 3)
        cases = [(d, (d,)), (two, two), (list(three), three), (3, (3,)), ((1, 6), (1, 6))]
    return cases


def _last_dims_only(x32: torch.Tensor, w, b, eps: float, k: int) -> torch.Tensor:
    """LayerNorm over the last dimension only, with the affine parameters of shape (..., k dims)."""
    mu = x32.mean(-1, keepdim=True)
    var = x32.var(-1, keepdim=True, unbiased=False)
    return (x32 - mu) / torch.sqrt(var + eps) * w + b


@_one_thread
def check_layer_norm(LayerNorm, hidden: bool = False) -> None:
    rng = hidden_rng("layer_norm")
    for i, (arg, shape) in enumerate(_layer_norm_cases(hidden, rng)):
        module = call(LayerNorm, arg, name=f"LayerNorm({arg!r})")
        expect(not any(isinstance(m, nn.LayerNorm) for m in module.modules()),
               "LayerNorm contains an nn.LayerNorm.", "write the normalisation yourself: nn.LayerNorm is the oracle.")
        _affine_params(module, shape, "LayerNorm", bias=True)
        eps = _norm_eps(module, 1e-5, "LayerNorm")
        n = math.prod(shape)
        k = len(shape)
        g = generator(404 + i) if not hidden else hidden_generator(f"layer_norm/{i}")
        w, b = torch.randn(shape, generator=g) * 0.5 + 1, torch.randn(shape, generator=g)
        dims = tuple(range(-k, 0))
        # First with the initial parameters: the output has mean 0 and variance 1 per normalised block.
        x = torch.randn(3, 4, *shape, generator=g) * 5 + 2
        with forbid(*_NORMS, exercise="LayerNorm"):
            y = _tensor_out(call(module, x, name="LayerNorm.forward"), tuple(x.shape), "LayerNorm output")
        var = y.var(dims, unbiased=False)
        var_in = x.double().var(dims, unbiased=False)
        if not (_same(y.mean(dims), torch.zeros(3, 4), 1e-4, 0) and _same(var, var_in / (var_in + eps), 1e-3, 1e-3)):
            if k > 1 and _same(y, _last_dims_only(x, 1.0, 0.0, eps, k), 1e-4, 1e-4):
                hint = (f"the statistics were taken over the last dimension only: LayerNorm({arg!r}) normalises over "
                        f"the last {k} dimensions at once (mean and var accept a tuple of dims).")
            else:
                flat = x.reshape(3, 4, n)
                hint = _diagnose_norm(y.reshape(3, 4, n), flat, _layer_norm_variants(flat, torch.ones(n),
                                      torch.zeros(n), eps), flat, "LayerNorm")
            fail(f"LayerNorm({arg!r}) with weight = 1 and bias = 0: outputs should have mean 0 and (biased) variance "
                 f"1 over each block of shape {shape}; got means up to {y.mean(dims).abs().max().item():.3g} and "
                 f"variances in [{var.min().item():.4g}, {var.max().item():.4g}].", hint)
        with torch.no_grad():
            module.weight.copy_(w)
            module.bias.copy_(b)
        for x, label in _norm_inputs(g, n, hidden, rng):
            x = x.reshape(*x.shape[:-1], *shape)
            with forbid(*_NORMS, exercise="LayerNorm"):
                got = _tensor_out(call(module, x.clone(), name="LayerNorm.forward"), tuple(x.shape),
                                  f"LayerNorm output ({label})")
            expect(got.dtype == x.dtype, f"LayerNorm returned {got.dtype} for a {x.dtype} input.",
                   "compute the statistics in float32, then cast the result back: .to(x.dtype).")
            want = F.layer_norm(x.double(), shape, w.double(), b.double(), eps).to(x.dtype)
            low = x.dtype in (torch.bfloat16, torch.float16)
            tol = 2e-2 if low else 1e-4
            if not torch.isfinite(got).all() or not _same(got.float(), want.float(), tol, tol):
                if k > 1 and _same(got.float(), _last_dims_only(x.float(), w, b, eps, k).to(x.dtype).float(), tol, tol):
                    hint = (f"the statistics were taken over the last dimension only: LayerNorm({arg!r}) normalises "
                            f"over the last {k} dimensions at once (mean and var accept a tuple of dims).")
                else:
                    lead = tuple(x.shape[:x.dim() - k])
                    flat = x.reshape(*lead, n)
                    hint = _diagnose_norm(got.reshape(*lead, n), flat, _layer_norm_variants(
                        flat.float(), w.reshape(n), b.reshape(n), eps), want, "LayerNorm")
                fail(f"LayerNorm({arg!r}) output ({label}, input shape {tuple(x.shape)}) differs from the "
                     "reference.", hint)


def _rms_norm_variants(x32: torch.Tensor, w, eps: float) -> list[tuple[torch.Tensor, str]]:
    ms = x32.pow(2).mean(-1, keepdim=True)
    out = [((x32 - x32.mean(-1, keepdim=True)) / torch.sqrt(x32.var(-1, keepdim=True, unbiased=False) + eps) * w,
            "the mean was subtracted: that is LayerNorm; RMSNorm divides by the root mean square without centring."),
           (x32 / (torch.sqrt(ms) + eps) * w, "eps goes inside the square root: x / sqrt(mean(x**2) + eps)."),
           (x32 / torch.sqrt(ms + eps), "the output was not multiplied by weight."),
           (x32 / torch.sqrt(x32.pow(2).sum(-1, keepdim=True) + eps) * w,
            "that divides by the norm (sum of squares): RMSNorm uses the mean of the squares."),
           (x32 / torch.sqrt(x32.abs().mean(-1, keepdim=True) + eps) * w,
            "square the entries before averaging: mean(x ** 2)."),
           (x32 * torch.sqrt(ms + eps) * w, "multiply by the reciprocal (rsqrt) of the RMS, not by the RMS.")]
    if x32.shape[-1] > 1:
        d = x32.shape[-1]
        out.append((x32 / torch.sqrt(x32.pow(2).sum(-1, keepdim=True) / (d - 1) + eps) * w,
                    "divide the sum of squares by d (the mean), not d - 1."))
    return out


def _rms_cases(hidden: bool, rng) -> list[tuple[int, int | None, int]]:
    """(d, the dim argument or None for the default, the axis of d in the test inputs)."""
    cases = [(16, None, -1), (6, 1, 1), (5, -2, -2)]
    if hidden:
        cases = [(rng.randrange(2, 65), None, -1), (rng.randrange(2, 40), 1, 1), (3, 1, 1),
                 (rng.randrange(2, 12), -3, -3), (4, -1, -1)]
    return cases


def _rms_on_axis(x: torch.Tensor, w: torch.Tensor, eps: float, dim: int) -> torch.Tensor:
    """The oracle: F.rms_norm over axis ``dim`` (in float64)."""
    moved = x.double().movedim(dim, -1)
    return F.rms_norm(moved, (moved.shape[-1],), w.double(), eps).movedim(-1, dim)


def _rms_inputs(g: torch.Generator, d: int, axis: int, hidden: bool, rng) -> list[tuple[torch.Tensor, str]]:
    """The shared norm inputs, with d moved to ``axis`` (a 4-D image-like input for axis -3)."""
    out = []
    for x, label in _norm_inputs(g, d, hidden, rng):
        if axis == -3:                                          # (..., 2, 1, d) -> (..., d, 2, 1)
            x = torch.stack([x, x * 0.5 + 0.1], dim=-2).unsqueeze(-2)
        out.append((x.movedim(-1, axis).contiguous(), label))
    return out


@_one_thread
def check_rms_norm(RMSNorm, hidden: bool = False) -> None:
    _check_rms_norm(RMSNorm, hidden)


def _check_rms_norm(RMSNorm, hidden: bool, last_axis_only: bool = False) -> None:
    """``last_axis_only``: only the default dim = -1, the part that the decoder block calls."""
    rng = hidden_rng("rms_norm")
    cases = _rms_cases(hidden, rng)
    if last_axis_only:
        cases = [case for case in cases if case[1] is None]
    for i, (d, dim, axis) in enumerate(cases):
        shown = f"RMSNorm({d})" if dim is None else f"RMSNorm({d}, dim={dim})"
        module = call(RMSNorm, d, name=shown) if dim is None else call(RMSNorm, d, dim=dim, name=shown)
        expect(not any(isinstance(m, (nn.RMSNorm, nn.LayerNorm)) for m in module.modules()),
               "RMSNorm contains an nn.RMSNorm or nn.LayerNorm.", "write the normalisation yourself: nn.RMSNorm "
               "is the oracle.")
        _affine_params(module, (d,), "RMSNorm", bias=False)
        eps = _norm_eps(module, 1e-6, "RMSNorm")
        g = generator(405 + i) if not hidden else hidden_generator(f"rms_norm/{i}")
        x = (torch.randn(3, 4, d, generator=g) * 5 + 2).movedim(-1, axis).contiguous()
        with forbid(*_NORMS, exercise="RMSNorm"):
            y = _tensor_out(call(module, x, name=f"{shown}.forward"), tuple(x.shape), "RMSNorm output")
        w = torch.randn(d, generator=g) * 0.5 + 1
        first = [(x, "float32 with weight = 1", torch.ones(d), y)]
        with torch.no_grad():
            module.weight.copy_(w)
        for x, label, weight, got in first + [(x, label, w, None) for x, label in _rms_inputs(g, d, axis, hidden, rng)]:
            if got is None:
                with forbid(*_NORMS, exercise="RMSNorm"):
                    got = _tensor_out(call(module, x.clone(), name=f"{shown}.forward"), tuple(x.shape),
                                      f"RMSNorm output ({label})")
            expect(got.dtype == x.dtype, f"RMSNorm returned {got.dtype} for a {x.dtype} input.",
                   "compute the statistics in float32, then cast the result back: .to(x.dtype).")
            want = _rms_on_axis(x, weight, eps, axis).to(x.dtype)
            low = x.dtype in (torch.bfloat16, torch.float16)
            tol = 2e-2 if low else 1e-4
            if torch.isfinite(got).all() and _same(got.float(), want.float(), tol, tol):
                continue
            where = f"{shown}, input shape {tuple(x.shape)}, {label}"
            shape = [1] * x.dim()
            shape[axis] = -1
            x32 = x.float()
            last_only = (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps) * weight.view(shape)).to(x.dtype)
            if axis not in (-1, x.dim() - 1) and _same(got.float(), last_only.float(), tol, tol):
                hint = (f"the root mean square was taken over the last axis: this RMSNorm normalises along axis "
                        f"{axis} (self.dim), of size {d}: mean(dim=self.dim, keepdim=True).")
            else:
                hint = _diagnose_norm(got.movedim(axis, -1), x.movedim(axis, -1),
                                      _rms_norm_variants(x32.movedim(axis, -1), weight, eps),
                                      want.movedim(axis, -1), "RMSNorm")
                hint = hint.replace("over its last dimension (d_model)", f"along axis {axis} (of size {d})")
            fail(f"RMSNorm output ({where}) differs from the reference.", hint)

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


def _decoder_variants(x, p, H, H_kv, pre, base) -> list[tuple[torch.Tensor, str]]:
    dh = x.shape[-1] // H
    o = functools.partial(_decoder_oracle, x, p, H, H_kv, pre, base)
    out = [(o(layout="post" if pre else "pre"),
            "x = norm(x + f(x)) is Post-LN; Pre-LN normalises the input of each sublayer and adds its output to the "
            "un-normalised x: x = x + f(norm(x))." if pre else
            "x = x + f(norm(x)) is Pre-LN; Post-LN adds first and normalises the sum: x = norm(x + f(x))."),
           (o(rope="interleaved"), "RoPE paired neighbouring entries (2j, 2j + 1): this block uses the half-split "
                                   "pairing, entry j with entry j + d_head/2 (rotate_half)."),
           (o(rope="none"), "queries and keys were not rotated: apply RoPE to both, after splitting into heads."),
           (o(rope="q only"), "only the queries were rotated: RoPE rotates the keys too (never the values)."),
           (o(causal=False), "there is no causal mask: position t may see positions 0 .. t only."),
           (o(scale=1.0), f"the scores were not scaled: divide them by sqrt(d_head) = {math.sqrt(dh):.4g}."),
           (o(scale=1 / math.sqrt(x.shape[-1])), "the scores were scaled by 1/sqrt(d_model): the scale is "
                                                 "1/sqrt(d_head)."),
           (o(layout="one norm"), "norm1 was used for both sublayers: the FFN uses norm2.")]
    if H_kv not in (1, H):
        out.append((o(gqa="tile"), "query head h was given key/value head h % n_kv_heads (repeat tiles the "
                                   "heads): it uses head h // (n_heads // n_kv_heads) (repeat_interleave)."))
    if pre:
        out += [(o(layout="normalised residual"), "the residual carries the normalised x: keep the un-normalised x "
                                                  "on the residual path (x = x + attn(norm1(x)))."),
                (o(layout="parallel"), "both sublayers read the block's input: the FFN must see the output of the "
                                       "attention sublayer (run them one after the other, updating x).")]
    return out


def _decoder_cases(hidden: bool, rng) -> list[tuple]:
    """(d_model, n_heads, n_kv_heads, d_hidden, pre_ln, T, dtype)."""
    cases = [(16, 4, 2, 24, True, 5, torch.float32), (12, 2, 1, 16, False, 4, torch.float32)]
    if hidden:
        cases = []
        for pre in (True, False):
            H = rng.choice([2, 4, 6])
            H_kv = rng.choice([k for k in (1, 2, 3, 6) if H % k == 0 and k < H] or [1])
            dh = rng.choice([2, 4, 6, 8])
            cases.append((H * dh, H, H_kv, rng.randrange(4, 40), pre, rng.randrange(2, 9), torch.float32))
        cases += [(24, 6, 3, 20, True, rng.randrange(3, 8), torch.float64),
                  (16, 4, 4, 12, False, 3, torch.float64), (8, 2, 2, 8, True, 1, torch.float32)]
    return cases


@_one_thread
def check_decoder_block(DecoderBlock, RMSNorm=None, SwiGLU=None, silu=None, hidden: bool = False) -> None:
    """RMSNorm, SwiGLU and silu, when given, are the earlier answers the block uses."""
    with earlier_first(*_calls("DecoderBlock", silu=silu, RMSNorm=RMSNorm, SwiGLU=SwiGLU)):
        _check_decoder_block(DecoderBlock, hidden)


def _check_decoder_block(DecoderBlock, hidden: bool) -> None:
    rng = hidden_rng("decoder_block")
    cls = "DecoderBlock"
    for i, (d, H, H_kv, h, pre, T, dtype) in enumerate(_decoder_cases(hidden, rng)):
        base = 10000.0 if i % 2 == 0 else 500.0
        shown = f"DecoderBlock({d}, {H}, {H_kv}, {h}, pre_ln={pre}, base={base})"
        torch.manual_seed(406 + i if not hidden else hidden_seed(f"decoder_block/init{i}"))
        block = call(DecoderBlock, d, H, H_kv, h, pre_ln=pre, base=base, name=shown)
        g = generator(4060 + i) if not hidden else hidden_generator(f"decoder_block/{i}")
        dh = d // H
        p = {}
        for name, d_in, d_out in (("w_q", d, H * dh), ("w_k", d, H_kv * dh), ("w_v", d, H_kv * dh),
                                  ("w_o", H * dh, d)):
            p[name.replace("_", "")] = _fill(_check_linear(block, name, d_in, d_out, False, cls), g)[0]
        for name in ("norm1", "norm2"):
            norm = getattr(block, name, None)
            weight = getattr(norm, "weight", None)
            expect(isinstance(weight, nn.Parameter) and tuple(weight.shape) == (d,) and
                   sum(q.numel() for q in norm.parameters()) == d,
                   f"{cls} needs `{name}`, an RMSNorm(d_model) with a weight of shape ({d},) and nothing else.",
                   f"create self.{name} = RMSNorm(d_model) (your class from exercise 5) in __init__.")
            p["n" + name[-1]] = torch.randn(d, generator=g) * 0.3 + 1
            with torch.no_grad():
                weight.copy_(p["n" + name[-1]])
        ffn = getattr(block, "ffn", None)
        expect(ffn is not None, f"{cls} needs `ffn`, a SwiGLU(d_model, d_hidden).",
               "create self.ffn = SwiGLU(d_model, d_hidden) (your class from exercise 3).")
        p["wgu"] = _fill(_check_linear(ffn, "w_gate_up", d, 2 * h, False, "SwiGLU"), g, 2.0)[0]
        p["wd"] = _fill(_check_linear(ffn, "w_down", h, d, False, "SwiGLU"), g)[0]
        n = sum(q.numel() for q in block.parameters())
        want_n = 2 * d * H * dh + 2 * d * H_kv * dh + 3 * d * h + 2 * d
        expect(n == want_n, f"{shown} has {n} parameters, expected {want_n} (w_q, w_k, w_v, w_o, the SwiGLU and two "
               "RMSNorms).", "a block holds norm1, norm2, w_q, w_k, w_v, w_o and ffn, nothing more; no biases.")
        block.to(dtype)
        x = (torch.randn(2, T, d, generator=g, dtype=torch.float64) * 1.5 + 0.3).to(dtype)
        with forbid((F, "scaled_dot_product_attention"), *_NORMS, (F, "silu"),
                    exercise="the decoder block with your own attention, RMSNorm and silu"):
            got = _tensor_out(call(block, x.clone(), name=f"{shown}.forward"), (2, T, d), f"{cls} output")
        expect(got.dtype == dtype, f"{cls} returned {got.dtype} for a {dtype} input.",
               "build the angles and the mask on x's device, and cast cos and sin to x's dtype.")
        q = {k: v.to(dtype) for k, v in p.items()}
        with torch.no_grad():
            want = _decoder_oracle(x, q, H, H_kv, pre, base)
            if _same(got, want, 1e-4, 1e-4):
                pass
            else:
                hint = next((hint for cand, hint in _decoder_variants(x, q, H, H_kv, pre, base)
                             if _same(got, cand, 1e-4, 1e-4)), None)
                if hint is None:
                    hint = ("test the attention sublayer alone: project, split into heads (B, heads, T, d_head), "
                            "rotate q and k (half-split RoPE at positions 0 .. T-1), give query head h the key/value "
                            "head h // group, causal mask, scale 1/sqrt(d_head), merge the heads, w_o; then "
                            + ("x = x + attn(norm1(x)); x = x + ffn(norm2(x))." if pre else
                               "x = norm1(x + attn(x)); x = norm2(x + ffn(x))."))
                fail(f"{shown} output (input {tuple(x.shape)}, {str(dtype)[6:]}) differs from the reference built "
                     "from F.rms_norm, F.scaled_dot_product_attention and F.silu.", hint)
        block.float()
        if hidden and T > 1:
            # Causality: a change to the last token leaves the earlier outputs alone.
            x2 = x.clone()
            x2[:, -1] += 3.0
            with forbid((F, "scaled_dot_product_attention"), *_NORMS, (F, "silu"),
                        exercise="the decoder block with your own attention, RMSNorm and silu"):
                block.to(dtype)
                got2 = _tensor_out(call(block, x2, name=f"{shown}.forward"), (2, T, d), f"{cls} output")
                block.float()
            expect(_same(got2[:, :-1], got[:, :-1], 1e-5, 1e-5), f"{shown}: changing the last token changed the "
                   "outputs at earlier positions.", "position t may see positions 0 .. t only: mask the scores "
                                                    "above the diagonal with -inf before the softmax.")

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


def check_count_params(count_params, hidden: bool = False) -> None:
    cases = list(_COUNT_CASES)
    if hidden:
        rng = hidden_rng("count_params")
        for j in range(8):
            H = rng.choice([1, 2, 4, 8, 12, 16, 32, 64])
            H_kv = rng.choice([k for k in (1, 2, 4, 8, H) if H % k == 0])
            d = H * rng.choice([8, 16, 64, 128])
            flags = dict(gated=bool(j & 1), bias=bool(j & 2), norm="layer" if j & 4 else "rms",
                         tied=rng.random() < 0.5)
            cases.append(((rng.randrange(2, 200000), d, rng.randrange(1, 100), H, H_kv, rng.randrange(1, 30000)),
                          flags, "a drawn configuration"))
        cases.append(((256000, 3072, 28, 16, 16, 24576), dict(tied=True),
                      "a wide configuration with a large vocabulary"))
        cases.append(((10, 6, 0, 2, 1, 5), dict(norm="layer"), "no blocks at all"))
    for (V, d, L, H, H_kv, h), flags, what in cases:
        flags = {"gated": True, "bias": False, "norm": "rms", "tied": True, **flags}
        shown = (f"count_params({V}, {d}, {L}, {H}, {H_kv}, {h}, " +
                 ", ".join(f"{k}={v!r}" for k, v in flags.items()) + f") ({what})")
        got = call(count_params, V, d, L, H, H_kv, h, name="count_params", **flags)
        expect(isinstance(got, int) and not isinstance(got, bool), f"{shown} returned {type(got).__name__}, "
               "expected an int.", "count with integer arithmetic (no division with /, no tensors).")
        want = _count_oracle(V, d, L, H, H_kv, h, **flags)
        if got == want:
            continue
        dh = d // H
        one_norm = d if flags["norm"] == "rms" else 2 * d
        kv = 2 * d * H_kv * dh + (2 * H_kv * dh if flags["bias"] else 0)
        kv_full = 2 * d * H * dh + (2 * H * dh if flags["bias"] else 0)
        ffn_bias = ((2 * h + d) if flags["gated"] else (h + d)) if flags["bias"] else 0
        attn_bias = H * dh + 2 * H_kv * dh + d if flags["bias"] else 0
        guesses = [
            (want + V * d, "the output layer was counted although tied=True: it is the embedding matrix itself, "
                           "counted once." if flags["tied"] else
             "the embedding and the output layer are two vocab_size x d_model matrices when untied, no more."),
            (want - V * d, "untied (tied=False), the output layer is a vocab_size x d_model matrix of its own: count "
                           "it beside the embedding." if not flags["tied"] else
             "the token embedding (vocab_size x d_model) is missing."),
            (want + L * (kv_full - kv), "w_k and w_v were counted at full width: with grouped-query attention they "
                                        "map d_model to n_kv_heads * d_head features."),
            (want - one_norm, "the final norm after the last block is missing: a model has 2 * n_layers + 1 norms."),
            (want + L * (d * h + (h if flags["bias"] else 0)) * (-1 if flags["gated"] else 1),
             "the gated FFN has three matrices (w_gate, w_up, w_down), the ungated one two (fc1, fc2)."),
            (want - L * ffn_bias - L * attn_bias, "the biases were left out: with bias=True every linear layer of "
                                                  "the blocks has one (as wide as its output)."),
            (want - L * attn_bias, "the attention projections have biases too when bias=True."),
            (want - L * ffn_bias, "the FFN's layers have biases too when bias=True."),
            (want + (2 * L + 1) * d * (1 if flags["norm"] == "rms" else -1),
             "an RMSNorm has a weight of d_model only; a LayerNorm a weight and a bias, 2 * d_model."),
            (want - (2 * L + 1) * one_norm, "the norms were left out: each holds d_model (RMSNorm) or 2 * d_model "
                                            "(LayerNorm) parameters, two per block and one at the end."),
        ]
        if flags["bias"] and flags["gated"]:
            guesses.append((want + L * (h - d), "w_down's bias has d_model entries (its output width), not d_hidden."))
        hint = next((hint for value, hint in guesses if got == value and value != want),
                    "count piece by piece: embedding, per block (w_q, w_k, w_v, w_o, the FFN, two norms), the final "
                    "norm, and the output layer unless tied.")
        fail(f"{shown} returned {got:,}, expected {want:,}.", hint)


def _bytes_per(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def check_ffn_activation_bytes(ffn_activation_bytes, hidden: bool = False) -> None:
    cases = [(8, 1024, 3072, torch.float32, False), (8, 1024, 2048, torch.bfloat16, True)]
    if hidden:
        rng = hidden_rng("ffn_activation_bytes")
        cases += [(rng.randrange(1, 64), rng.randrange(1, 8193), rng.randrange(1, 20000),
                   rng.choice([torch.float32, torch.bfloat16, torch.float16]), gated) for gated in (False, True)]
        cases.append((1, 1, 1, torch.float64, True))
    for B, T, h, dtype, gated in cases:
        got = call(ffn_activation_bytes, B, T, h, dtype, gated=gated, name="ffn_activation_bytes")
        size = _bytes_per(dtype)
        want = (4 if gated else 2) * B * T * h * size
        if got != want:
            per = B * T * h * size
            if got == want * 8:
                hint = "that is bits: divide by 8 (or use element_size())."
            elif gated and got == 2 * per:
                hint = ("the gated FFN keeps four hidden tensors for the backward pass (gate, up, silu(gate) and the "
                        "product), not two.")
            elif got in (per, 3 * per) or (not gated and got == 4 * per):
                hint = ("count the hidden tensors saved for backward: 2 for the GELU FFN (fc1's output and the "
                        "activation), 4 for SwiGLU.")
            elif dtype != torch.float32 and got == want // size * 4:
                hint = f"{dtype} does not take 4 bytes per number: look the size up from the dtype."
            else:
                hint = "bytes = (2 or 4 tensors) * batch * seq_len * d_hidden * bytes per element."
            fail(f"ffn_activation_bytes({B}, {T}, {h}, {dtype}, gated={gated}) returned {got}, expected {want}.", hint)

# ----------------------------------------------------------------------------- exercise 8


def moe_reference(x: torch.Tensor, router_w: torch.Tensor, experts: list[tuple], k: int,
                  capacity_factor: float, capacity: int | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The slow per-token oracle: (y, aux_loss, kept), same conventions as the exercise."""
    B, T, d = x.shape
    E = router_w.shape[0]
    flat = x.reshape(-1, d)
    N = flat.shape[0]
    if capacity is None:
        capacity = math.ceil(capacity_factor * N * k / E)
    probs = torch.softmax(flat.double() @ router_w.double().T, dim=-1)
    choices = []
    for n in range(N):
        order = sorted(range(E), key=lambda e: -probs[n, e].item())[:k]
        choices.append(order)
    load = [0] * E
    kept = torch.zeros(N, k, dtype=torch.bool)
    for r in range(k):                 # all first choices, then all second choices, ...
        for n in range(N):
            e = choices[n][r]
            if load[e] < capacity:
                load[e] += 1
                kept[n, r] = True
    y = torch.zeros(N, d, dtype=torch.float64)
    for n in range(N):
        total = sum(probs[n, e].item() for e in choices[n])
        for r, e in enumerate(choices[n]):
            if kept[n, r]:
                w1, b1, w2, b2 = (t.double() for t in experts[e])
                y[n] += probs[n, e].item() / total * _ffn_ref(flat[n].double(), w1, b1, w2, b2)
    f = torch.zeros(E, dtype=torch.float64)
    for n in range(N):
        for e in choices[n]:
            f[e] += 1.0 / (N * k)
    aux = E * (f * probs.mean(0)).sum()
    return y.view(B, T, d), aux, kept.view(B, T, k)


def _moe_dropped_pass_x(x, y, kept):
    """y with the input added for every token whose choices were all dropped."""
    none = ~kept.any(-1, keepdim=True)
    return y + x.double() * none


def _diagnose_moe(y, aux, kept, x, router_w, experts, k, cf, want_y, want_aux, want_kept) -> str | None:
    E = router_w.shape[0]
    B, T, d = x.shape
    N = B * T
    if kept is not None and not torch.equal(kept, want_kept):
        if kept.all() and not want_kept.all():
            return ("capacity was never enforced: an expert takes at most capacity = ceil(capacity_factor * n_tokens "
                    "* k / n_experts) tokens; the others are dropped.")
        floor_cap = math.floor(cf * N * k / E)
        _, _, floor_kept = moe_reference(x, router_w, experts, k, cf, capacity=floor_cap)
        if torch.equal(kept, floor_kept):
            return "the capacity was rounded down: capacity = math.ceil(capacity_factor * n_tokens * k / n_experts)."
        if k > 1:
            _, _, without_k = moe_reference(x, router_w, experts, k, cf, capacity=math.ceil(cf * N / E))
            if torch.equal(kept, without_k):
                return ("the capacity counts all n_tokens * k choices: capacity = ceil(capacity_factor * n_tokens * "
                        "k / n_experts); without the factor k it is too small.")
        if k > 1:
            kt = _kept_token_order(x, router_w, k, cf)
            if torch.equal(kept, kt):
                return ("assignments were taken token by token (both choices of token 0, then token 1, ...): give "
                        "priority to all first choices, then all second choices, each in token order.")
        return ("an expert accepts assignments while it holds fewer than capacity of them, in the priority order: "
                "rank 0 (first choices) in token order, then rank 1, ...")
    if not _same(y, want_y, 1e-4, 1e-4):
        if _same(y, _moe_dropped_pass_x(x, want_y, want_kept), 1e-4, 1e-4):
            return ("a token whose choices were all dropped should get zero from the layer (the block's residual "
                    "carries it), not its own input: returning x adds it twice.")
        probs = torch.softmax(x.reshape(-1, d).double() @ router_w.double().T, dim=-1)
        top = probs.topk(k, dim=-1)
        raw = torch.zeros(N, d, dtype=torch.float64)
        eq = torch.zeros(N, d, dtype=torch.float64)
        flat = x.reshape(-1, d).double()
        for n in range(N):
            for r in range(k):
                if want_kept.view(N, k)[n, r]:
                    e = int(top.indices[n, r])
                    out = _ffn_ref(flat[n], *(t.double() for t in experts[e]))
                    raw[n] += top.values[n, r] * out
                    eq[n] += out / k
        if k > 1 and _same(y, raw.view(B, T, d), 1e-4, 1e-4):
            return ("the gates were not renormalised: divide the k chosen probabilities by their sum, so that "
                    "they add up to one.")
        if _same(y, eq.view(B, T, d), 1e-4, 1e-4):
            return "the expert outputs were averaged: weight each one by its gate (the renormalised probability)."
        return ("y[token] = sum over its kept choices of gate * expert(x[token]), with gate = the chosen probability "
                "divided by the sum of the k chosen probabilities.")
    if not _same(aux, want_aux, 1e-4, 1e-4):
        a, w = float(aux), float(want_aux)
        if math.isclose(a * E, w, rel_tol=1e-4):
            return ("the balancing loss is missing its factor n_experts: E * sum_e f_e * P_e equals 1 when the load "
                    "is uniform.")
        if math.isclose(a, w * N * k, rel_tol=1e-4) or math.isclose(a, w * N, rel_tol=1e-4):
            return "f_e is a fraction: divide the number of assignments to expert e by n_tokens * k."
        probs = torch.softmax(x.reshape(-1, d).double() @ router_w.double().T, dim=-1)
        if math.isclose(a, float(E * (probs.mean(0) ** 2).sum()), rel_tol=1e-4):
            return ("f_e must count the routing decisions (the fraction of top-k choices that went to expert e), "
                    "not the mean probability: the loss is E * sum_e f_e * P_e.")
        f_kept = torch.zeros(E, dtype=torch.float64)
        top = probs.topk(k, dim=-1).indices
        for n in range(N):
            for r in range(k):
                if want_kept.view(N, k)[n, r]:
                    f_kept[int(top[n, r])] += 1.0 / (N * k)
        if math.isclose(a, float(E * (f_kept * probs.mean(0)).sum()), rel_tol=1e-4):
            return ("f_e counts every routing choice, before the capacity drops some: compute it from the top-k "
                    "indices, not from the kept assignments.")
        return ("aux_loss = n_experts * sum_e f_e * P_e, with f_e the fraction of the n_tokens * k choices that went to "
                "e and P_e the mean router probability of e over all tokens.")
    return None


def _kept_token_order(x, router_w, k, cf) -> torch.Tensor:
    B, T, d = x.shape
    E = router_w.shape[0]
    N = B * T
    cap = math.ceil(cf * N * k / E)
    probs = torch.softmax(x.reshape(-1, d).double() @ router_w.double().T, dim=-1)
    top = probs.topk(k, dim=-1).indices
    load = [0] * E
    kept = torch.zeros(N, k, dtype=torch.bool)
    for n in range(N):
        for r in range(k):
            e = int(top[n, r])
            if load[e] < cap:
                load[e] += 1
                kept[n, r] = True
    return kept.view(B, T, k)


def _moe_case(MoE, d, d_ff, E, k, cf, B, T, g, label, x_scale=1.0):
    module = call(MoE, d, d_ff, E, k, capacity_factor=cf, name="MoE(...)")
    router = getattr(module, "router", None)
    expect(isinstance(router, nn.Linear) and tuple(router.weight.shape) == (E, d) and router.bias is None,
           "MoE needs `router`, an nn.Linear(d_model, n_experts, bias=False).",
           "the router scores each token for each expert: nn.Linear(d_model, n_experts, bias=False).")
    experts = getattr(module, "experts", None)
    expect(isinstance(experts, nn.ModuleList) and len(experts) == E,
           f"MoE needs `experts`, an nn.ModuleList of {E} FeedForward(d_model, d_ff).",
           "self.experts = nn.ModuleList([FeedForward(d_model, d_ff) for _ in range(n_experts)]).")
    router_w = torch.randn(E, d, generator=g) * 1.5 / math.sqrt(d)
    with torch.no_grad():
        router.weight.copy_(router_w)
    weights = []
    for e in range(E):
        ex = experts[e]
        w1, b1 = _fill(_check_linear(ex, "fc1", d, d_ff, True, "FeedForward"), g, 2.0)
        w2, b2 = _fill(_check_linear(ex, "fc2", d_ff, d, True, "FeedForward"), g)
        weights.append((w1, b1, w2, b2))
    x = torch.randn(B, T, d, generator=g) * x_scale
    result = call(module, x, name="MoE.forward")
    expect(isinstance(result, tuple) and len(result) == 3, "MoE.forward should return (y, aux_loss, kept).",
           "return the output, the load-balancing loss and the bool mask of kept choices as a tuple.")
    y_raw, aux_raw, kept_raw = result
    y = _tensor_out(y_raw, (B, T, d), "MoE output y")
    expect(isinstance(aux_raw, torch.Tensor) and aux_raw.dim() == 0, "aux_loss should be a scalar tensor.",
           "return the loss as a 0-dim tensor (it is added to the training loss and back-propagated).")
    expect(bool(aux_raw.requires_grad), "aux_loss carries no gradient.",
           "compute P_e from the router's softmax probabilities without detaching them: the loss trains the "
           "router to spread its choices.")
    aux = aux_raw.detach()
    kept = _tensor_out(kept_raw, (B, T, k), "MoE kept mask")
    expect(kept.dtype == torch.bool, f"kept should be a bool tensor, got {kept.dtype}.",
           "kept[b, t, r] is True when choice r of token (b, t) was processed by its expert.")
    want_y, want_aux, want_kept = moe_reference(x, router_w, weights, k, cf)
    # Property: no expert above capacity, every choice kept or dropped.
    cap = math.ceil(cf * B * T * k / E)
    probs = torch.softmax(x.reshape(-1, d).double() @ router_w.double().T, dim=-1)
    top = probs.topk(k, dim=-1).indices.view(B, T, k)
    load = torch.bincount(top[kept], minlength=E)
    if int(load.max()) > cap:
        fail(f"{label}: an expert processed {int(load.max())} choices, more than its capacity {cap} (counting the "
             "kept choices by the expert that top-k over softmax(router(x)) along the experts gives them).",
             "capacity was never enforced: an expert takes at most capacity = ceil(capacity_factor * n_tokens * k / "
             "n_experts) tokens; the others are dropped." if bool(kept.all()) else
             "an expert's count runs over the whole batch, all n_tokens * k choices routed to it, and the routing "
             "is top-k of the softmax over the experts (the last dimension), one distribution per token.")
    hint = _diagnose_moe(y, aux, kept, x, router_w, weights, k, cf, want_y, want_aux, want_kept)
    if hint is not None:
        shape = f"(d_model={d}, n_experts={E}, k={k}, capacity_factor={cf})"
        if not torch.equal(kept, want_kept):
            what = (f"the choices kept differ from a slow per-token loop's {shape}: {int(kept.sum())} kept, expected "
                    f"{int(want_kept.sum())}")
        elif not _same(y, want_y, 1e-4, 1e-4):
            what = f"MoE output {shape} differs from a slow per-token loop"
        else:
            what = (f"aux_loss {shape} is {float(aux):.6g}, expected {float(want_aux):.6g} (the output and the "
                    "kept choices are right)")
        fail(f"{label}: {what}.", hint)
    return module, aux_raw, router, x, router_w


@_one_thread
def check_moe(MoE, FeedForward=None, gelu=None, hidden: bool = False) -> None:
    """FeedForward and gelu, when given, are the earlier answers the experts are made of."""
    with earlier_first(*_calls("MoE", gelu=gelu, FeedForward=FeedForward)):
        _check_moe(MoE, hidden)


def _check_moe(MoE, hidden: bool) -> None:
    g = generator(408) if not hidden else hidden_generator("moe")
    rng = hidden_rng("moe")
    # n_experts is a power of two (or divides n_tokens * k) and capacity_factor a dyadic number, so
    # capacity_factor * n_tokens * k / n_experts is computed exactly in any order.
    cases = [(8, 16, 4, 2, 1.0, 2, 6, 1.0), (8, 16, 4, 1, 1.25, 1, 6, 1.0)]
    if hidden:
        E = rng.choice([2, 4, 8])
        cases = [(rng.randrange(2, 17), rng.randrange(2, 33), E, rng.choice([1, 2]), rng.choice([0.5, 0.75, 1.25]),
                  rng.randrange(1, 4), rng.randrange(2, 13), 1.0),
                 (6, 12, 4, 2, 0.5, 1, 8, 3.0),              # many drops, a peaked router
                 (6, 12, 8, 2, 4.0, 2, 4, 1.0),              # a capacity nothing reaches
                 (5, 9, 3, 3, 1.0, 1, 6, 1.0)]               # k = n_experts
    for i, (d, d_ff, E, k, cf, B, T, xs) in enumerate(cases):
        torch.manual_seed(4080 + i if not hidden else hidden_seed(f"moe/init{i}"))
        module, aux, router, x, router_w = _moe_case(MoE, d, d_ff, E, k, cf, B, T, g, f"case {i}", xs)
        if i == 0:
            module.zero_grad()
            aux.backward()
            grad = router.weight.grad
            rw = router_w.clone().requires_grad_(True)
            probs = torch.softmax(x.reshape(-1, d) @ rw.T, dim=-1)
            f = torch.bincount(probs.topk(k, dim=-1).indices.reshape(-1), minlength=E).float() / (B * T * k)
            (E * (f * probs.mean(0)).sum()).backward()
            expect(grad is not None and _same(grad.detach(), rw.grad, 1e-5, 1e-4),
                   "the gradient of aux_loss with respect to the router's weight is wrong.",
                   "compute P_e from the router's softmax probabilities without detaching them, and f_e from the "
                   "top-k indices (it has no gradient): the loss trains the router through P_e.")
    # One expert, k = 1: the mixture is the FFN (every token kept, gate 1).
    d = 6 if not hidden else rng.randrange(2, 12)
    torch.manual_seed(4089 if not hidden else hidden_seed("moe/one"))
    module = call(MoE, d, 3 * d, 1, 1, capacity_factor=1.0, name="MoE(...)")
    ex = module.experts[0]
    w1, b1 = _fill(ex.fc1, g, 2.0)
    w2, b2 = _fill(ex.fc2, g)
    x = torch.randn(2, 3, d, generator=g)
    y, aux, kept = call(module, x, name="MoE.forward")
    expect(_same(y.detach(), _ffn_ref(x, w1, b1, w2, b2), 1e-4, 1e-4) and bool(kept.detach().all()),
           "with one expert and k = 1 the MoE should equal that expert's FFN.",
           "with a single expert every token is kept with gate 1: check the capacity and the gate normalisation.")
    expect(math.isclose(float(aux.detach()), 1.0, rel_tol=1e-5), f"with one expert aux_loss is {float(aux.detach()):.4g}, expected 1.",
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
        close_hint="a rounded decimal (or a value read off a measurement) is not the prediction: return the "
                   "arithmetic that gives it, as a Python expression of the configuration's numbers, exact to float "
                   "precision.",
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


def _share_cases(g: torch.Generator, hidden: bool, rng) -> list[tuple[nn.Module, type, float, str]]:
    """(model, part, the share by hand, what the model is)."""
    torch.manual_seed(409 if not hidden else hidden_seed("param_share/init"))
    cases = []
    d = 4 if not hidden else rng.randrange(2, 9)
    # Two parts beside an embedding: 2 (d*d + d) of V*d + 2 (d*d + d).
    V = 10 if not hidden else rng.randrange(3, 40)
    m = nn.ModuleDict({"embed": nn.Embedding(V, d), "a": _Part(d), "b": _Part(d)})
    cases.append((m, _Part, 2 * (d * d + d) / (V * d + 2 * (d * d + d)), f"an embedding ({V}, {d}) and two parts"))
    # A part inside a part: each parameter once.
    m = nn.ModuleList([_Part(d, _Part(d)), nn.Linear(d, 3 * d)])
    total = 2 * (d * d + d) + 3 * d * d + 3 * d
    cases.append((m, _Part, 2 * (d * d + d) / total, "a part nested in another part"))
    # Tied weights: the head shares the embedding's matrix, counted once in the total.
    m = nn.ModuleDict({"embed": nn.Embedding(V, d), "part": _Part(d, bias=False), "head": nn.Linear(d, V, bias=False)})
    m["head"].weight = m["embed"].weight
    cases.append((m, nn.Linear, (d * d + V * d) / (V * d + d * d), "an embedding tied to the output layer"))
    # A subclass counts; the model itself may be the part.
    m = _Part(d, _SubPart(d))
    cases.append((m, _SubPart, 0.5, "the model is a part and holds a subclass of the part asked for"))
    cases.append((m, _Part, 1.0, "the model itself is the part"))
    m = nn.ModuleDict({"a": _Part(d), "b": _SubPart(d), "c": nn.Linear(d, d)})
    cases.append((m, _Part, 2 / 3, "a part, a subclass of it and a linear layer"))
    if hidden:
        big, V = rng.randrange(20, 120), rng.randrange(100, 2000)
        m = nn.ModuleDict({"embed": nn.Embedding(V, big), "ffn": nn.Sequential(_Part(big), _Part(big))})
        cases.append((m, _Part, 2 * (big * big + big) / (V * big + 2 * (big * big + big)),
                      f"an embedding ({V}, {big}) and two parts in a Sequential"))
        m = nn.Sequential(*[_Part(d) if j % 2 else nn.Linear(d, d) for j in range(rng.randrange(2, 7))])
        n_parts = sum(1 for j in range(len(m)) if j % 2)
        cases.append((m, _Part, n_parts * (d * d + d) / (len(m) * (d * d + d)), f"a stack of {len(m)} layers"))
    return cases


def _share_variants(model: nn.Module, part: type) -> list[tuple[float, str]]:
    """The shares that the usual wrong answers give, with their hints."""
    params = list(model.parameters())
    total = sum(p.numel() for p in params)
    all_with_dups = sum(p.numel() for _, p in model.named_parameters(remove_duplicate=False))
    matched = [m for m in model.modules() if isinstance(m, part)]
    once = {id(p) for m in matched for p in m.parameters()}
    part_once = sum(p.numel() for p in params if id(p) in once)
    children = {id(p) for m in model.children() if isinstance(m, part) for p in m.parameters()}
    out = [(sum(p.numel() for m in matched for p in m.parameters()) / total,
            "a parameter was counted more than once: a part nested in a part counts once. Collect the ids of the "
            "parameters in a set, then sum over model.parameters()."),
           (sum(p.numel() for p in params if id(p) in children) / total,
            "only the direct children were tested: search model.modules(), which includes the model itself and "
            "every level of nesting."),
           (part_once / all_with_dups, "the tied matrix was counted twice in the total: count each tensor once, as "
                                       "model.parameters() yields it."),
           (sum(1 for p in params if id(p) in once) / len(params),
            "that counts tensors: count their elements (p.numel()).")]
    exact = {id(p) for m in model.modules() if type(m) is part for p in m.parameters()}
    out.append((sum(p.numel() for p in params if id(p) in exact) / total,
                "subclasses of part count too: test with isinstance(m, part), not type(m) is part."))
    return [(v, h) for v, h in out if abs(v - part_once / total) > 1e-12]


@_one_thread
def check_ffn_share(predicted_ffn_share, param_share, hidden: bool = False) -> None:
    _check_ffn_share_prediction(predicted_ffn_share)
    rng = hidden_rng("param_share")
    g = generator(409) if not hidden else hidden_generator("param_share")
    for model, part, want, what in _share_cases(g, hidden, rng):
        got = call(param_share, model, part, name="param_share")
        label = f"param_share(model, {part.__name__}) on {what}"
        try:
            value = float(got)
        except (TypeError, ValueError):
            fail(f"{label} returned {type(got).__name__}, expected a float.", "return the share as a Python float.")
        if abs(value - want) <= 1e-9:
            continue
        hint = next((h for v, h in _share_variants(model, part) if abs(value - v) <= 1e-9),
                    "the share is (elements of the parameters inside modules of class part, each tensor once) / "
                    "(elements of model.parameters()).")
        fail(f"{label} returned {value:.6g}, expected {want:.6g}.", hint)
