"""Checks for chapter 4: activations, the feed-forward network, SwiGLU, LayerNorm and RMSNorm,
Pre-LN and Post-LN blocks, parameter and activation-memory counts, and a top-k mixture of
experts with capacity and its load-balancing loss.

Oracles: ``F.gelu`` (both forms), ``F.silu``, ``F.layer_norm`` and ``F.rms_norm`` computed
here (never in the answers), blocks written out with those built-ins and weights copied into
the student's layers, hand-derived counts, and a slow per-token loop for the mixture of
experts. Properties: output statistics of the norms, parameter parity of SwiGLU, a mixture
with one expert and k = 1 equals the FFN, every routing choice either kept or dropped and no
expert over its capacity.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from ._core import call, earlier_answers, earlier_first, expect, expect_tensor, fail, forbid, generator
from ._core import one_thread as _one_thread, same as _same
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


def _calls(who: str, gelu=None, silu=None, LayerNorm=None, FeedForward=None) -> list:
    """(what, check) pairs for the earlier answers that ``who`` calls, deepest first: a failure
    that one of them explains is blamed on it (``earlier_first``)."""
    return earlier_answers(who, ("calls your gelu", 1, gelu, lambda f: _check_activations({"gelu": f}, False)),
                           ("calls your silu", 1, silu, lambda f: _check_activations({"silu": f}, False)),
                           ("uses your LayerNorm", 4, LayerNorm, check_layer_norm),
                           ("uses your FeedForward", 2, FeedForward, check_feed_forward))

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


def _swiglu_hidden_ref(d_model: int, multiple_of: int) -> int:
    h = int(8 * d_model / 3)
    return multiple_of * ((h + multiple_of - 1) // multiple_of)


def check_swiglu_hidden(swiglu_hidden, hidden: bool = False) -> None:
    cases = [(768, 64), (4096, 256), (12, 8)]
    if hidden:
        rng = hidden_rng("swiglu_hidden")
        cases += [(4096, 64), (96, 64), (3, 1), (1536, 128)]
        cases += [(rng.randrange(1, 9000), rng.choice([1, 8, 16, 32, 64, 128, 256])) for _ in range(8)]
    for d_model, m in cases:
        got = call(swiglu_hidden, d_model, m, name="swiglu_hidden")
        want = _swiglu_hidden_ref(d_model, m)
        expect(isinstance(got, int) and not isinstance(got, bool),
               f"swiglu_hidden({d_model}, {m}) returned {type(got).__name__}, expected an int.",
               "return a Python int (use // and int(...)), not a float or a tensor.")
        if got != want:
            raw = int(8 * d_model / 3)
            if got == raw:
                hint = (f"8 * d_model / 3 = {raw} was not rounded: round it up to a multiple of multiple_of "
                        "so that matrix shapes suit the hardware.")
            elif got == 4 * d_model:
                hint = "that is the width of the ungated FFN: SwiGLU has three matrices, so it uses 8/3 d_model."
            elif got == (raw // m) * m:
                hint = "the width was rounded down: round up to the next multiple (ceil), as Llama does."
            elif got == m * round(8 * d_model / 3 / m):
                hint = "the width was rounded to the nearest multiple: round up (ceil), as Llama does."
            else:
                hint = "hidden = int(8 * d_model / 3), then round up to a multiple of multiple_of."
            fail(f"swiglu_hidden({d_model}, {m}) returned {got}, expected {want}.", hint)


@_one_thread
def check_swiglu(SwiGLU, silu=None, hidden: bool = False) -> None:
    """silu, when given, is the exercise 1 answer that SwiGLU calls."""
    with earlier_first(*_calls("SwiGLU", silu=silu)):
        _check_swiglu(SwiGLU, hidden)


def _check_swiglu(SwiGLU, hidden: bool) -> None:
    configs = [(24, 16), (48, 64)]
    rng = hidden_rng("swiglu")
    if hidden:
        configs += [(rng.randrange(4, 60), rng.choice([1, 8, 32])) for _ in range(2)] + [(7, 1)]
    for i, (d_model, m) in enumerate(configs):
        torch.manual_seed(403 + i if not hidden else hidden_seed(f"swiglu/init{i}"))
        module = call(SwiGLU, d_model, multiple_of=m, name="SwiGLU(...)")
        h = _swiglu_hidden_ref(d_model, m)
        wg = _check_linear(module, "w_gate", d_model, h, False, "SwiGLU")
        wu = _check_linear(module, "w_up", d_model, h, False, "SwiGLU")
        wd = _check_linear(module, "w_down", h, d_model, False, "SwiGLU")
        n = sum(p.numel() for p in module.parameters())
        expect(n == 3 * d_model * h, f"SwiGLU({d_model}) has {n} parameters, expected 3 * d_model * hidden = "
               f"{3 * d_model * h}.", "SwiGLU holds exactly w_gate, w_up and w_down, without biases.")
        # Parameter parity with the ungated FFN, up to the rounding.
        ratio = n / (8 * d_model * d_model)
        expect(1 - 3 / (8 * d_model) - 1e-9 <= ratio <= 1 + 3 * m / (8 * d_model) + 1e-9,
               f"SwiGLU({d_model}) has {ratio:.3f} times the weights of a 4 * d_model FFN.",
               "the hidden width 8/3 d_model keeps 3 matrices as large as the FFN's 2.")
        g = generator(4030 + i) if not hidden else hidden_generator(f"swiglu/{i}")
        Wg = _fill(wg, g, 2.0)[0]
        Wu = _fill(wu, g, 2.0)[0]
        Wd = _fill(wd, g)[0]
        shape = (2, 3, d_model) if not hidden else (rng.randrange(1, 4), rng.randrange(1, 6), d_model)
        x = torch.randn(shape, generator=g)
        with forbid((F, "silu"), exercise="SwiGLU with your own silu"):
            got = _tensor_out(call(module, x, name="SwiGLU.forward"), shape, "SwiGLU output")
        want = F.linear(F.silu(F.linear(x, Wg)) * F.linear(x, Wu), Wd)
        if not _same(got, want, 1e-4, 1e-4):
            if _same(got, F.linear(F.silu(F.linear(x, Wu)) * F.linear(x, Wg), Wd), 1e-4, 1e-4):
                hint = "the gate and the up projection were swapped: silu goes on w_gate(x), w_up(x) stays linear."
            elif _same(got, F.linear(F.gelu(F.linear(x, Wg)) * F.linear(x, Wu), Wd), 1e-4, 1e-4):
                hint = "GELU was used as the gate activation: that is GeGLU; SwiGLU uses silu."
            elif _same(got, F.linear(torch.sigmoid(F.linear(x, Wg)) * F.linear(x, Wu), Wd), 1e-4, 1e-4):
                hint = "sigmoid(gate) * up is the original GLU: SwiGLU uses silu(gate) = gate * sigmoid(gate)."
            elif _same(got, F.linear(F.silu(F.linear(x, Wg) * F.linear(x, Wu)), Wd), 1e-4, 1e-4):
                hint = "silu was applied to the product: apply it to the gate only, then multiply by up."
            else:
                hint = "forward is w_down(silu(w_gate(x)) * w_up(x))."
            fail(f"SwiGLU output (d_model={d_model}) differs from w_down(silu(w_gate(x)) * w_up(x)).", hint)

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


def _affine_params(module: Any, d: int, cls: str, bias: bool) -> None:
    weight = getattr(module, "weight", None)
    expect(isinstance(weight, nn.Parameter), f"{cls} needs a learnable `weight` (an nn.Parameter).",
           "the affine scale: self.weight = nn.Parameter(torch.ones(d_model)).")
    w0 = weight.detach()
    expect(tuple(w0.shape) == (d,), f"{cls}.weight has shape {tuple(w0.shape)}, expected ({d},).",
           "one scale per feature: torch.ones(d_model).")
    expect(w0.dtype == torch.float32, f"{cls}.weight is {w0.dtype}, expected float32.",
           "keep the parameters in float32; only the output takes the input's dtype.")
    if not torch.equal(w0, torch.ones(d)):
        fail(f"{cls}.weight starts at {w0[:4].tolist()}..., expected ones.",
             "initialise weight to ones (torch.ones): zeros would make the output zero and cut the gradient."
             if torch.equal(w0, torch.zeros(d)) else "initialise weight to ones (torch.ones), so that the "
             "layer starts as a pure normalisation.")
    b = getattr(module, "bias", None)
    if bias:
        expect(isinstance(b, nn.Parameter), f"{cls} needs a learnable `bias` (an nn.Parameter).",
               "the affine shift: self.bias = nn.Parameter(torch.zeros(d_model)).")
        expect(tuple(b.detach().shape) == (d,) and torch.equal(b.detach(), torch.zeros(d)),
               f"{cls}.bias should start as zeros of shape ({d},).", "self.bias = nn.Parameter(torch.zeros(d_model)).")
    else:
        n = sum(p.numel() for p in module.parameters())
        expect(n == d, f"{cls}({d}) has {n} parameters, expected {d}.",
               "RMSNorm has a scale (weight) only: no bias, because it does not centre.")


def _norm_eps(module: Any, default: float, cls: str) -> float:
    eps = getattr(module, "eps", None)
    expect(isinstance(eps, float) and math.isclose(eps, default),
           f"{cls}.eps is {eps!r}, expected {default}.", f"store the eps argument as self.eps (default {default}).")
    return eps


@_one_thread
def check_layer_norm(LayerNorm, hidden: bool = False) -> None:
    rng = hidden_rng("layer_norm")
    sizes = [16, 5] if not hidden else [rng.randrange(2, 65), 3, 2]
    for i, d in enumerate(sizes):
        module = call(LayerNorm, d, name="LayerNorm(...)")
        expect(not any(isinstance(m, nn.LayerNorm) for m in module.modules()),
               "LayerNorm contains an nn.LayerNorm.", "write the normalisation yourself: nn.LayerNorm is the oracle.")
        _affine_params(module, d, "LayerNorm", bias=True)
        eps = _norm_eps(module, 1e-5, "LayerNorm")
        g = generator(404 + i) if not hidden else hidden_generator(f"layer_norm/{i}")
        w, b = torch.randn(d, generator=g) * 0.5 + 1, torch.randn(d, generator=g)
        # First with the initial parameters: the output has mean 0 and variance 1 per vector.
        x = torch.randn(3, 4, d, generator=g) * 5 + 2
        with forbid(*_NORMS, exercise="LayerNorm"):
            y = _tensor_out(call(module, x, name="LayerNorm.forward"), tuple(x.shape), "LayerNorm output")
        var = y.var(-1, unbiased=False)
        var_in = x.double().var(-1, unbiased=False)
        if not (_same(y.mean(-1), torch.zeros(3, 4), 1e-4, 0) and _same(var, var_in / (var_in + eps), 1e-3, 1e-3)):
            fail("with weight = 1 and bias = 0, LayerNorm outputs should have mean 0 and (biased) variance 1 per "
                 f"vector; got means up to {y.mean(-1).abs().max().item():.3g} and variances in "
                 f"[{var.min().item():.4g}, {var.max().item():.4g}].",
                 _diagnose_norm(y, x, _layer_norm_variants(x, torch.ones(d), torch.zeros(d), eps), x, "LayerNorm"))
        with torch.no_grad():
            module.weight.copy_(w)
            module.bias.copy_(b)
        for x, label in _norm_inputs(g, d, hidden, rng):
            with forbid(*_NORMS, exercise="LayerNorm"):
                got = _tensor_out(call(module, x.clone(), name="LayerNorm.forward"), tuple(x.shape),
                                  f"LayerNorm output ({label})")
            expect(got.dtype == x.dtype, f"LayerNorm returned {got.dtype} for a {x.dtype} input.",
                   "compute the statistics in float32, then cast the result back: .to(x.dtype).")
            want = F.layer_norm(x.double(), (d,), w.double(), b.double(), eps).to(x.dtype)
            low = x.dtype in (torch.bfloat16, torch.float16)
            tol = 2e-2 if low else 1e-4
            if not torch.isfinite(got).all() or not _same(got.float(), want.float(), tol, tol):
                fail(f"LayerNorm output ({label}, d_model={d}) differs from the reference.",
                     _diagnose_norm(got, x, _layer_norm_variants(x.float(), w, b, eps), want, "LayerNorm"))


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
                    "divide the sum of squares by d_model (the mean), not d_model - 1."))
    return out


@_one_thread
def check_rms_norm(RMSNorm, hidden: bool = False) -> None:
    rng = hidden_rng("rms_norm")
    sizes = [16, 6] if not hidden else [rng.randrange(2, 65), 3]
    for i, d in enumerate(sizes):
        module = call(RMSNorm, d, name="RMSNorm(...)")
        expect(not any(isinstance(m, (nn.RMSNorm, nn.LayerNorm)) for m in module.modules()),
               "RMSNorm contains an nn.RMSNorm or nn.LayerNorm.", "write the normalisation yourself: nn.RMSNorm "
               "is the oracle.")
        _affine_params(module, d, "RMSNorm", bias=False)
        eps = _norm_eps(module, 1e-6, "RMSNorm")
        g = generator(405 + i) if not hidden else hidden_generator(f"rms_norm/{i}")
        x = torch.randn(3, 4, d, generator=g) * 5 + 2
        with forbid(*_NORMS, exercise="RMSNorm"):
            y = _tensor_out(call(module, x, name="RMSNorm.forward"), tuple(x.shape), "RMSNorm output")
        rms = y.pow(2).mean(-1).sqrt()
        ms_in = x.double().pow(2).mean(-1)
        if not _same(rms, (ms_in / (ms_in + eps)).sqrt(), 1e-3, 1e-3):
            fail(f"with weight = 1, RMSNorm outputs should have root mean square 1 per vector; got values in "
                 f"[{rms.min().item():.4g}, {rms.max().item():.4g}].",
                 _diagnose_norm(y, x, _rms_norm_variants(x, torch.ones(d), eps), x, "RMSNorm"))
        w = torch.randn(d, generator=g) * 0.5 + 1
        with torch.no_grad():
            module.weight.copy_(w)
        for x, label in _norm_inputs(g, d, hidden, rng):
            with forbid(*_NORMS, exercise="RMSNorm"):
                got = _tensor_out(call(module, x.clone(), name="RMSNorm.forward"), tuple(x.shape),
                                  f"RMSNorm output ({label})")
            expect(got.dtype == x.dtype, f"RMSNorm returned {got.dtype} for a {x.dtype} input.",
                   "compute the statistics in float32, then cast the result back: .to(x.dtype).")
            want = F.rms_norm(x.double(), (d,), w.double(), eps).to(x.dtype)
            low = x.dtype in (torch.bfloat16, torch.float16)
            tol = 2e-2 if low else 1e-4
            if not torch.isfinite(got).all() or not _same(got.float(), want.float(), tol, tol):
                fail(f"RMSNorm output ({label}, d_model={d}) differs from the reference.",
                     _diagnose_norm(got, x, _rms_norm_variants(x.float(), w, eps), want, "RMSNorm"))

# ----------------------------------------------------------------------------- exercise 6


class MixingAttention(nn.Module):
    """A stand-in for attention used by the tests: causal running mean over positions, then a
    linear map. Its weights come from ``seed``, so the tests can rebuild it exactly."""

    def __init__(self, d_model: int, seed: int):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.proj = nn.Linear(d_model, d_model)
        with torch.no_grad():
            self.proj.weight.copy_(torch.randn(d_model, d_model, generator=g) / math.sqrt(d_model))
            self.proj.bias.copy_(torch.randn(d_model, generator=g) * 0.3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:   # (B, T, d_model) -> (B, T, d_model)
        steps = torch.arange(1, x.shape[1] + 1, dtype=x.dtype, device=x.device).view(1, -1, 1)
        return self.proj(x.cumsum(dim=1) / steps)


def _block_params(block: Any, d: int, d_ff: int, g: torch.Generator, cls: str) -> dict[str, torch.Tensor]:
    """Check a block's parts and copy fresh random values into its norms and FFN."""
    p = {}
    for ln in ("ln1", "ln2"):
        norm = getattr(block, ln, None)
        expect(norm is not None and isinstance(getattr(norm, "weight", None), nn.Parameter)
               and isinstance(getattr(norm, "bias", None), nn.Parameter),
               f"{cls} needs `{ln}`, a LayerNorm(d_model) with weight and bias.",
               f"create self.{ln} = LayerNorm(d_model) (your class from exercise 4) in __init__.")
        w, b = torch.randn(d, generator=g) * 0.3 + 1, torch.randn(d, generator=g) * 0.3
        with torch.no_grad():
            norm.weight.copy_(w)
            norm.bias.copy_(b)
        p[f"{ln}.w"], p[f"{ln}.b"] = w, b
    ffn = getattr(block, "ffn", None)
    expect(ffn is not None, f"{cls} needs `ffn`, a FeedForward(d_model, d_ff).",
           "create self.ffn = FeedForward(d_model, d_ff) (your class from exercise 2).")
    p["w1"], p["b1"] = _fill(_check_linear(ffn, "fc1", d, d_ff, True, "FeedForward"), g, 2.0)
    p["w2"], p["b2"] = _fill(_check_linear(ffn, "fc2", d_ff, d, True, "FeedForward"), g)
    return p


def _ln(x, p, name):
    return F.layer_norm(x, (x.shape[-1],), p[f"{name}.w"], p[f"{name}.b"], 1e-5)


def _ffn(x, p):
    return _ffn_ref(x, p["w1"], p["b1"], p["w2"], p["b2"])


def _pre_ln(x, attn, p):
    x = x + attn(_ln(x, p, "ln1"))
    return x + _ffn(_ln(x, p, "ln2"), p)


def _post_ln(x, attn, p):
    x = _ln(x + attn(x), p, "ln1")
    return _ln(x + _ffn(x, p), p, "ln2")


def _block_variants(x, attn, p, pre: bool) -> list[tuple[torch.Tensor, str]]:
    q = {**p, "ln2.w": p["ln1.w"], "ln2.b": p["ln1.b"]}
    out = [(_post_ln(x, attn, p) if pre else _pre_ln(x, attn, p),
            "x = LN(x + f(x)) is Post-LN; Pre-LN normalises the input of each sublayer and adds its output to the "
            "un-normalised x: x = x + f(LN(x))." if pre else
            "x = x + f(LN(x)) is Pre-LN; Post-LN adds first and normalises the sum: x = LN(x + f(x))."),
           ((_pre_ln if pre else _post_ln)(x, attn, q), "ln1 was used for both sublayers: the FFN uses ln2.")]
    if pre:
        h = attn(_ln(x, p, "ln1"))
        out.append((h + _ffn(_ln(h, p, "ln2"), p),
                    "the attention sublayer has no residual connection: x = x + attn(ln1(x))."))
        h1 = _ln(x, p, "ln1")
        x1 = h1 + attn(h1)
        h2 = _ln(x1, p, "ln2")
        out.append((h2 + _ffn(h2, p), "the residual carries the normalised x: keep the un-normalised x on the "
                                      "residual path (x = x + attn(ln1(x)), not x = ln1(x); x = x + attn(x))."))
        out.append((x + attn(_ln(x, p, "ln1")) + _ffn(_ln(x, p, "ln2"), p),
                    "both sublayers read the block's input: the FFN must see the output of the attention sublayer "
                    "(run them one after the other, updating x)."))
        out.append((_ln(_pre_ln(x, attn, p), p, "ln2"), "a Pre-LN block does not normalise its output: the final "
                                                        "norm belongs at the end of the stack, once."))
    else:
        x1 = _ln(attn(x), p, "ln1")
        out.append((_ln(x1 + _ffn(x1, p), p, "ln2"),
                    "the attention sublayer has no residual connection: x = ln1(x + attn(x))."))
    return out


def _check_block(Block, pre: bool, hidden: bool) -> None:
    cls = "PreLNBlock" if pre else "PostLNBlock"
    rng = hidden_rng(f"block/{cls}")
    configs = [(8, 32, 5)] if not hidden else [(rng.randrange(2, 24), rng.randrange(4, 64), rng.randrange(1, 8)),
                                               (3, 5, 2)]
    for i, (d, d_ff, T) in enumerate(configs):
        seed = 406 + i if not hidden else hidden_seed(f"block/{cls}/attn{i}")
        attn = MixingAttention(d, seed)
        torch.manual_seed(4060 + i if not hidden else hidden_seed(f"block/{cls}/init{i}"))
        block = call(Block, d, d_ff, attn, name=f"{cls}(...)")
        expect(getattr(block, "attn", None) is attn, f"{cls}.attn is not the attention module it was given.",
               "store the given module as self.attn (do not build a new one).")
        g = generator(4061 + i) if not hidden else hidden_generator(f"block/{cls}/{i}")
        p = _block_params(block, d, d_ff, g, cls)
        n = sum(q.numel() for q in block.parameters())
        want_n = sum(q.numel() for q in attn.parameters()) + 2 * d * d_ff + d_ff + d + 4 * d
        expect(n == want_n, f"{cls} has {n} parameters, expected {want_n} (attention + FFN + two LayerNorms).",
               "a block holds attn, ln1, ln2 and ffn, nothing more.")
        x = torch.randn(2, T, d, generator=g) * 2 + 0.5
        with forbid(*_NORMS, exercise="LayerNorm"):
            got = _tensor_out(call(block, x, name=f"{cls}.forward"), (2, T, d), f"{cls} output")
        with torch.no_grad():
            want = (_pre_ln if pre else _post_ln)(x, attn, p)
            if not _same(got, want, 1e-4, 1e-4):
                for cand, hint in _block_variants(x, attn, p, pre):
                    if _same(got, cand, 1e-4, 1e-4):
                        break
                else:
                    hint = ("x = x + attn(ln1(x)); x = x + ffn(ln2(x))." if pre else
                            "x = ln1(x + attn(x)); x = ln2(x + ffn(x)).")
                fail(f"{cls} output differs from the reference ({'Pre' if pre else 'Post'}-LN with the same "
                     "attention, norms and FFN).", hint)


@_one_thread
def check_pre_ln_block(PreLNBlock, LayerNorm=None, FeedForward=None, gelu=None, hidden: bool = False) -> None:
    """LayerNorm, FeedForward and gelu, when given, are the earlier answers the block uses."""
    with earlier_first(*_calls("PreLNBlock", gelu=gelu, LayerNorm=LayerNorm, FeedForward=FeedForward)):
        _check_block(PreLNBlock, True, hidden)


@_one_thread
def check_post_ln_block(PostLNBlock, LayerNorm=None, FeedForward=None, gelu=None, hidden: bool = False) -> None:
    """LayerNorm, FeedForward and gelu, when given, are the earlier answers the block uses."""
    with earlier_first(*_calls("PostLNBlock", gelu=gelu, LayerNorm=LayerNorm, FeedForward=FeedForward)):
        _check_block(PostLNBlock, False, hidden)


@_one_thread
def check_transformer_stack(TransformerStack, LayerNorm=None, FeedForward=None, gelu=None,
                            hidden: bool = False) -> None:
    """LayerNorm, FeedForward and gelu, when given, are the earlier answers the stack's blocks use."""
    with earlier_first(*_calls("TransformerStack", gelu=gelu, LayerNorm=LayerNorm, FeedForward=FeedForward)):
        _check_transformer_stack(TransformerStack, hidden)


def _check_transformer_stack(TransformerStack, hidden: bool) -> None:
    rng = hidden_rng("transformer_stack")
    configs = [(8, 16, 3, True), (8, 16, 2, False)]
    if hidden:
        configs = [(rng.randrange(2, 17), rng.randrange(4, 33), rng.randrange(1, 5), pre) for pre in (True, False)]
    for i, (d, d_ff, n_layers, pre) in enumerate(configs):
        base = 407 * 100 + 10 * i if not hidden else hidden_seed(f"transformer_stack/attn{i}") % 10**9
        make_attn = functools.partial(_make_mixing, d, base)
        torch.manual_seed(4070 + i if not hidden else hidden_seed(f"transformer_stack/init{i}"))
        stack = call(TransformerStack, d, d_ff, n_layers, make_attn, pre_ln=pre, name="TransformerStack(...)")
        blocks = getattr(stack, "blocks", None)
        expect(isinstance(blocks, nn.ModuleList) and len(blocks) == n_layers,
               f"TransformerStack(..., n_layers={n_layers}) needs `blocks`, an nn.ModuleList of {n_layers} blocks.",
               "self.blocks = nn.ModuleList([...]) with one block per layer, each with make_attn(layer_index).")
        g = generator(4071 + i) if not hidden else hidden_generator(f"transformer_stack/{i}")
        params = [_block_params(blocks[j], d, d_ff, g, "each block") for j in range(n_layers)]
        attns = [MixingAttention(d, base + j) for j in range(n_layers)]
        ln_f = getattr(stack, "ln_f", "missing")
        if pre:
            expect(ln_f is not None and not isinstance(ln_f, str) and isinstance(getattr(ln_f, "weight", None), nn.Parameter),
                   "a Pre-LN TransformerStack needs `ln_f`, a final LayerNorm(d_model).",
                   "a Pre-LN stack never normalises its residual stream inside the blocks: add the final norm "
                   "self.ln_f = LayerNorm(d_model) and apply it after the last block.")
            wf, bf = torch.randn(d, generator=g) * 0.3 + 1, torch.randn(d, generator=g) * 0.3
            with torch.no_grad():
                ln_f.weight.copy_(wf)
                ln_f.bias.copy_(bf)
        else:
            expect(ln_f is None, "a Post-LN TransformerStack should have ln_f = None.",
                   "each Post-LN block already ends with a LayerNorm: a final norm would normalise twice.")
        T = 4 if not hidden else rng.randrange(1, 7)
        x = torch.randn(2, T, d, generator=g) * 2
        with forbid(*_NORMS, exercise="LayerNorm"):
            got = _tensor_out(call(stack, x, name="TransformerStack.forward"), (2, T, d), "TransformerStack output")
        with torch.no_grad():
            h = x
            for attn, p in zip(attns, params):
                h = (_pre_ln if pre else _post_ln)(h, attn, p)
            want = F.layer_norm(h, (d,), wf, bf, 1e-5) if pre else h
            if not _same(got, want, 1e-4, 1e-4):
                if pre and _same(got, h, 1e-4, 1e-4):
                    hint = "ln_f was not applied: a Pre-LN stack ends with the final norm after the last block."
                elif _same(got, _post_stack(x, attns, params) if pre else _pre_stack(x, attns, params), 1e-4, 1e-4):
                    hint = ("the blocks are of the other kind: pre_ln=True uses PreLNBlock (x = x + f(LN(x))), "
                            "pre_ln=False PostLNBlock (x = LN(x + f(x))).")
                else:
                    hint = ("run the blocks in order, block i built with make_attn(i), then ln_f for Pre-LN.")
                fail(f"TransformerStack output ({'Pre' if pre else 'Post'}-LN, {n_layers} layers) differs from the "
                     "reference.", hint)


def _make_mixing(d_model: int, base: int, layer: int) -> nn.Module:
    return MixingAttention(d_model, base + layer)


def _pre_stack(x, attns, params):
    for attn, p in zip(attns, params):
        x = _pre_ln(x, attn, p)
    return x


def _post_stack(x, attns, params):
    for attn, p in zip(attns, params):
        x = _post_ln(x, attn, p)
    return x

# ----------------------------------------------------------------------------- exercise 7


def _ffn_params_ref(d_model: int, d_hidden: int, gated: bool, bias: bool) -> int:
    if gated:
        return 3 * d_model * d_hidden + ((2 * d_hidden + d_model) if bias else 0)
    return 2 * d_model * d_hidden + ((d_hidden + d_model) if bias else 0)


def check_ffn_params(ffn_params, hidden: bool = False) -> None:
    cases = [(768, 3072, False, True, 4_722_432), (768, 3072, False, False, 4_718_592), (4096, 11008, True, False, None),
             (1024, 2816, True, True, None)]
    if hidden:
        rng = hidden_rng("ffn_params")
        cases += [(rng.randrange(1, 9000), rng.randrange(1, 30000), gated, bias, None)
                  for gated in (False, True) for bias in (True, False)]
    for d, h, gated, bias, _ in cases:
        got = call(ffn_params, d, h, gated=gated, bias=bias, name="ffn_params")
        want = _ffn_params_ref(d, h, gated, bias)
        if got != want:
            if got == _ffn_params_ref(d, h, gated, not bias):
                hint = ("the biases were counted although bias=False." if not bias else
                        "the biases were left out: fc1 has d_hidden of them, fc2 d_model" +
                        (", and for the gated form w_gate and w_up have d_hidden each." if gated else "."))
            elif gated and got == _ffn_params_ref(d, h, False, bias):
                hint = "the gated FFN has three matrices (w_gate, w_up, w_down), not two."
            elif bias and got == 2 * d * h + 2 * h:
                hint = "fc2's bias has d_model entries (its output width), not d_hidden."
            elif gated and bias and got == 3 * d * h + 3 * h:
                hint = "w_down's bias has d_model entries (its output width), not d_hidden; w_gate and w_up have d_hidden each."
            else:
                hint = "ungated: 2 * d_model * d_hidden (+ d_hidden + d_model biases); gated: 3 * d_model * d_hidden."
            fail(f"ffn_params({d}, {h}, gated={gated}, bias={bias}) returned {got}, expected {want}.", hint)


def check_block_params(block_params, hidden: bool = False) -> None:
    cases = [(768, 3072), (512, 2048)]
    if hidden:
        rng = hidden_rng("block_params")
        cases += [(rng.randrange(1, 5000), rng.randrange(1, 20000)) for _ in range(4)]
    for d, d_ff in cases:
        got = call(block_params, d, d_ff, name="block_params")
        attn, ffn, norms = 4 * d * d + 4 * d, 2 * d * d_ff + d_ff + d, 4 * d
        want = attn + ffn + norms
        if got != want:
            if got == attn + ffn + 2 * d:
                hint = "each LayerNorm has a weight and a bias (2 * d_model), and a block has two of them."
            elif got == attn + ffn:
                hint = "the two LayerNorms were left out: 2 * 2 * d_model parameters."
            elif got == 4 * d * d + ffn + norms:
                hint = "the attention projections have biases too: 4 * d_model of them."
            elif got == 3 * d * d + 3 * d + ffn + norms:
                hint = "attention has four projections (q, k, v and the output), not three."
            else:
                hint = "attention 4 d^2 + 4 d, FFN 2 d d_ff + d_ff + d, two LayerNorms 4 d."
            fail(f"block_params({d}, {d_ff}) returned {got}, expected {want}.", hint)


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
