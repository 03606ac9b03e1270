"""Chapter 5: common mistakes, each of which must lose points and get its own hint."""

from dataclasses import dataclass, replace

from notebook_tools import Mistake, TwoMistakes

BOTH = {k: (f"ex{k}_visible", f"ex{k}_hidden") for k in range(1, 14)}


@dataclass(frozen=True)
class Edits(Mistake):
    """A wrong answer of several edits: the first as a Mistake's, then each (cell, old, new) of ``more``."""

    more: tuple = ()

    def apply(self, answers: dict[str, str]) -> dict[str, str]:
        answers = super().apply(answers)
        for cell, old, new in self.more:
            answers = Mistake(self.name, cell, old, new, self.failing, self.hint).apply(answers)
        return answers

MISTAKES = [
    # ---- exercise 1: cross-entropy
    Mistake("ce_no_max_subtraction", "ex1_answer", "shifted = logits - top",
            "shifted = logits", BOTH[1], "subtract each row's maximum"),
    Mistake("ce_mean_over_all_positions", "ex1_answer", "return per_token.sum() / keep.sum()",
            "return per_token.sum() / len(targets)", BOTH[1], "not by all B*T positions"),
    Mistake("ce_ignored_positions_counted", "ex1_answer",
            "per_token = torch.where(keep, per_token, torch.zeros_like(per_token))\n    return per_token.sum() / keep.sum()",
            "return per_token.mean()", BOTH[1], "must not contribute at all"),
    Mistake("ce_smoothing_over_v_minus_1", "ex1_answer", "uniform = -log_probs.mean(dim=-1)",
            "uniform = (-log_probs.sum(dim=-1) - nll) / (V - 1)", BOTH[1], "the target included"),
    Mistake("ce_smoothing_on_ignored", "ex1_answer",
            "per_token = (1 - label_smoothing) * nll + label_smoothing * uniform + z_loss * log_z ** 2\n"
            "    per_token = torch.where(keep, per_token, torch.zeros_like(per_token))",
            "per_token = torch.where(keep, (1 - label_smoothing) * nll + z_loss * log_z ** 2, torch.zeros_like(nll))"
            " + label_smoothing * uniform",
            BOTH[1], "spread mass onto positions whose target is ignore_index"),
    # the z-loss (the exercise's transfer)
    Mistake("ce_z_of_shifted_logits", "ex1_answer", "log_z = (top + log_sum).squeeze(1)", "log_z = log_sum.squeeze(1)",
            BOTH[1], "add it back"),
    Mistake("ce_z_not_squared", "ex1_answer", "z_loss * log_z ** 2", "z_loss * log_z", BOTH[1],
            "square the log-partition"),
    Mistake("ce_z_over_all_positions", "ex1_answer",
            " + z_loss * log_z ** 2\n    per_token = torch.where(keep, per_token, torch.zeros_like(per_token))\n"
            "    return per_token.sum() / keep.sum()",
            "\n    per_token = torch.where(keep, per_token, torch.zeros_like(per_token))\n"
            "    return per_token.sum() / keep.sum() + z_loss * (log_z ** 2).mean()",
            BOTH[1], "the z-loss term, too, counts only kept positions"),
    Mistake("ce_smoothing_without_one_minus_eps", "ex1_answer", "(1 - label_smoothing) * nll", "nll",
            BOTH[1], "keeps weight (1 - label_smoothing)"),
    # ---- exercise 2: batches
    Mistake("batch_targets_rolled", "ex2_answer", "return tokens[idx], tokens[idx + 1]",
            "return tokens[idx], tokens[idx].roll(-1, dims=1)", BOTH[2], "wrapped around"),
    Mistake("batch_targets_not_shifted", "ex2_answer", "return tokens[idx], tokens[idx + 1]",
            "return tokens[idx], tokens[idx]", BOTH[2], "the targets are the inputs"),
    Mistake("batch_last_window_never_drawn", "ex2_answer", "torch.randint(0, len(tokens) - block_size, (batch_size,)",
            "torch.randint(0, len(tokens) - block_size - 1, (batch_size,)", BOTH[2], "the last window is never drawn"),
    Mistake("sequential_last_window_dropped", "ex2_answer", "torch.arange(0, len(tokens) - block_size, block_size)",
            "torch.arange(0, len(tokens) - block_size - 1, block_size)", BOTH[2], "the last full window was dropped"),
    Mistake("sequential_stride_block_plus_one", "ex2_answer", "torch.arange(0, len(tokens) - block_size, block_size)",
            "torch.arange(0, len(tokens) - block_size, block_size + 1)", BOTH[2], "skips a token"),
    Mistake("sequential_partial_batch_dropped", "ex2_answer", "for i in range(0, len(starts), batch_size):",
            "for i in range(0, len(starts) - batch_size + 1, batch_size):", BOTH[2], "the last, smaller batch was dropped"),
    # ---- exercise 3: AdamW
    Mistake("adamw_state_recreated_every_step", "ex3_answer", "if p not in self.state:", "if True:",
            BOTH[3], "re-created every step"),
    Mistake("adamw_no_bias_correction", "ex3_answer", "bias1, bias2 = 1 - beta1 ** t, 1 - beta2 ** t",
            "bias1, bias2 = 1.0, 1.0", BOTH[3], "bias correction is missing"),
    Mistake("adamw_l2_in_the_gradient", "ex3_answer", "p.mul_(1 - lr * wd)", "p.grad.add_(p, alpha=wd)",
            BOTH[3], "not AdamW's decoupled decay"),
    Mistake("adamw_decay_without_lr", "ex3_answer", "p.mul_(1 - lr * wd)", "p.mul_(1 - wd)",
            BOTH[3], "multiplied by the learning rate"),
    Mistake("adamw_eps_inside_sqrt", "ex3_answer",
            'denom = (state["exp_avg_sq"].sqrt() / math.sqrt(bias2)).add_(eps)',
            'denom = (state["exp_avg_sq"] / bias2 + eps).sqrt()', ("ex3_hidden",), "eps is added after the square root"),
    Mistake("adamw_group_settings_ignored", "ex3_answer", '{**defaults, **group, "params": list(group["params"])}',
            '{**group, **defaults, "params": list(group["params"])}', BOTH[3], "each param group's own settings"),
    Mistake("adamw_one_counter_for_all_parameters", "ex3_answer", 'state["step"] += 1\n                t = state["step"]',
            'self.t = getattr(self, "t", 0) + 1\n                t = self.t', BOTH[3],
            "a counter increased for every parameter update"),
    Mistake("adamw_decays_parameters_without_grad", "ex3_answer", "if p.grad is None:\n                    continue",
            "if p.grad is None:\n                    p.mul_(1 - lr * wd)\n                    continue", BOTH[3],
            "skipped entirely"),
    # ---- exercise 4: parameter groups
    Mistake("groups_by_ndim_decay_embeddings", "ex4_answer",
            "matrices = {id(m.weight) for m in model.modules() if isinstance(m, nn.Linear)} - embedded",
            "matrices = {id(p) for p in model.parameters() if p.ndim >= 2}", BOTH[4], "does not decay embeddings"),
    Mistake("groups_biases_and_norms_decayed", "ex4_answer",
            "matrices = {id(m.weight) for m in model.modules() if isinstance(m, nn.Linear)} - embedded",
            "matrices = {id(p) for m in model.modules() if not isinstance(m, nn.Embedding) "
            "for p in m.parameters(recurse=False)} - embedded", BOTH[4], "biases and norm gains are 1-D"),
    Mistake("groups_tied_weight_twice", "ex4_answer",
            "no_decay = [p for p in model.parameters() if id(p) not in matrices]",
            "no_decay = [p for m in model.modules() for p in m.parameters(recurse=False) if id(p) not in matrices]",
            BOTH[4], "a tied weight is one Parameter"),
    Mistake("groups_both_decayed", "ex4_answer", '{"params": no_decay, "weight_decay": 0.0}',
            '{"params": no_decay, "weight_decay": weight_decay}', BOTH[4], "the second 0.0"),
    # Every 2-D parameter outside nn.Embedding (the reference solution before issue 32): a bare position
    # table and attention's in_proj_weight get decayed.
    Mistake("groups_every_matrix_but_embeddings", "ex4_answer",
            "matrices = {id(m.weight) for m in model.modules() if isinstance(m, nn.Linear)} - embedded",
            "matrices = {id(p) for p in model.parameters() if p.ndim >= 2} - embedded", BOTH[4],
            "decide by the module, not by the shape"),
    Mistake("groups_exact_linear_type", "ex4_answer", "if isinstance(m, nn.Linear)}", "if type(m) is nn.Linear}",
            BOTH[4], "test with isinstance"),
    # ---- exercise 5: schedule
    Mistake("lr_peak_at_step_zero", "ex5_answer", "return max_lr * (step + 1) / warmup_steps", "return max_lr",
            BOTH[5], "at its peak at step 0"),
    Mistake("lr_warmup_from_zero", "ex5_answer", "return max_lr * (step + 1) / warmup_steps",
            "return max_lr * step / warmup_steps", BOTH[5], "counts from step + 1"),
    Mistake("lr_decays_to_zero", "ex5_answer",
            "return min_lr + 0.5 * (1 + math.cos(math.pi * progress)) * (max_lr - min_lr)",
            "return 0.5 * (1 + math.cos(math.pi * progress)) * max_lr", BOTH[5], "decays to min_lr, not to 0"),
    Mistake("lr_cosine_comes_back_up", "ex5_answer", "    if step >= max_steps:\n        return min_lr\n", "",
            BOTH[5], "must not come back up"),
    Mistake("lr_progress_ignores_warmup", "ex5_answer",
            "progress = (step - decay_start) / decay_steps", "progress = step / max_steps",
            BOTH[5], "progress starts after warm-up"),
    # the stable phase (the exercise's transfer)
    Mistake("lr_decay_steps_ignored", "ex5_answer",
            "    decay_start = max_steps - decay_steps\n    if step < decay_start:\n        return max_lr\n"
            "    progress = (step - decay_start) / decay_steps",
            "    progress = (step - warmup_steps) / (max_steps - warmup_steps)", BOTH[5], "decay_steps was ignored"),
    Mistake("lr_decay_steps_zero_as_default", "ex5_answer", "    if decay_steps is None:\n        decay_steps = max_steps - warmup_steps",
            "    decay_steps = decay_steps or max_steps - warmup_steps", BOTH[5], "0 means no decay"),
    Mistake("lr_decay_progress_from_warmup", "ex5_answer", "progress = (step - decay_start) / decay_steps",
            "progress = (step - warmup_steps) / (max_steps - warmup_steps)", BOTH[5],
            "must start where the decay starts"),
    # ---- exercise 6: clipping
    Mistake("clip_returns_norm_after_clipping", "ex6_answer",
            "return [None if g is None else g * scale for g in grads], total",
            "return [None if g is None else g * scale for g in grads], total * scale", BOTH[6], "before clipping"),
    Mistake("clip_each_tensor_alone", "ex6_answer", "return [None if g is None else g * scale for g in grads], total",
            "return [None if g is None else g * min(1.0, max_norm / (float(g.float().norm()) + 1e-6)) "
            "for g in grads], total", BOTH[6], "each tensor was clipped on its own"),
    Mistake("clip_scales_up", "ex6_answer", "scale = min(1.0, max_norm / (total + 1e-6))",
            "scale = max_norm / (total + 1e-6)", BOTH[6], "never scale up"),
    Mistake("clip_sum_of_norms", "ex6_answer",
            "total = math.sqrt(sum(float(g.float().pow(2).sum()) for g in present))",
            "total = sum(float(g.float().norm()) for g in present)", BOTH[6], "not the sum of the per-tensor norms"),
    # mixed dtypes and missing gradients (the exercise's transfer)
    Mistake("clip_norm_in_low_precision", "ex6_answer", "g.float().pow(2).sum()", "g.pow(2).sum()", BOTH[6],
            "computed in the gradients' own low precision"),
    Mistake("clip_returns_float32", "ex6_answer", "else g * scale for g in grads]", "else g.float() * scale for g in grads]",
            BOTH[6], "keeps its own dtype"),
    Mistake("clip_drops_none", "ex6_answer", "return [None if g is None else g * scale for g in grads], total",
            "return [g * scale for g in present], total", BOTH[6], "stays None in its place"),
    # ---- exercise 7: accumulation
    TwoMistakes("accum_mean_of_micro_batch_means", "ex7_answer", 'ignore_index=-100, reduction="sum")',
                'ignore_index=-100, reduction="mean")', BOTH[7], "weights a small micro-batch as much as a large one",
                cell2="ex7_answer", old2="total += int((y != -100).sum())", new2="total += 1"),
    Mistake("accum_grads_not_zeroed", "ex7_answer", "    model.zero_grad(set_to_none=True)\n", "", BOTH[7],
            "zero the gradients"),
    # All micro-batches' graphs held at once, one backward at the end: right gradients, no memory saved.
    Mistake("accum_one_backward_for_all", "ex7_answer",
            "        loss.backward()                                                   # adds into .grad\n"
            "        total += int((y != -100).sum())\n    for p in model.parameters():",
            "        held = loss if total == 0 else held + loss\n"
            "        total += int((y != -100).sum())\n    held.backward()\n    for p in model.parameters():",
            BOTH[7], "backward each micro-batch's loss before reading the next"),
    Mistake("accum_padding_counted", "ex7_answer", "total += int((y != -100).sum())",
            "total += y.numel()", BOTH[7], "padding targets (-100) do not count"),
    Mistake("accum_grad_left_summed", "ex7_answer",
            "    for p in model.parameters():\n        p.grad.div_(total)\n"
            "    return [p.grad.clone() for p in model.parameters()]",
            "    return [p.grad / total for p in model.parameters()]", BOTH[7], "the optimizer's step reads p.grad"),
    Mistake("accum_zero_grad_inside_loop", "ex7_answer", "    for x, y in micro_batches:\n        logits = model(x)",
            "    for x, y in micro_batches:\n        model.zero_grad()\n        logits = model(x)", BOTH[7],
            "only the last micro-batch"),
    # ---- exercise 8: loss scaling
    Mistake("scaler_never_grows_back", "ex8_answer", "self.scale *= self.growth_factor", "self.scale *= 1.0",
            BOTH[8], "did not grow on the growth_interval-th"),
    Mistake("scaler_overflow_keeps_count", "ex8_answer", "self.good_steps = 0\n            return None",
            "return None", BOTH[8], "an overflow resets the count"),
    Mistake("scaler_grows_every_step", "ex8_answer", "if self.good_steps == self.growth_interval:", "if True:",
            BOTH[8], "not after every step"),
    Mistake("scaler_misses_nan", "ex8_answer", "found_inf = any(not bool(torch.isfinite(g).all()) for g in unscaled)",
            "found_inf = any(bool(torch.isinf(g).any()) for g in unscaled)", BOTH[8], "NaN is not finite either"),
    Mistake("scaler_does_not_skip", "ex8_answer", "            return None\n", "            return unscaled\n",
            BOTH[8], "skip the step"),
    Mistake("scaler_multiplies_by_scale", "ex8_answer", "unscaled = [g.float() / self.scale for g in grads]",
            "unscaled = [g.float() * self.scale for g in grads]", BOTH[8], "dividing by the scale"),
    Mistake("scaler_unscales_in_fp16", "ex8_answer", "unscaled = [g.float() / self.scale for g in grads]",
            "unscaled = [(g / self.scale).float() for g in grads]", BOTH[8], "float32 before dividing"),
    # ---- exercise 9: exact resumption
    Mistake("resume_model_not_restored", "ex9_answer", 'model.load_state_dict(resume_from["model"])',
            "model.zero_grad()", BOTH[9], "weights were not restored"),
    Mistake("resume_optimizer_not_restored", "ex9_answer", 'zip(params, resume_from["optimizer"])',
            "zip(params, [])", BOTH[9], "optimizer's state was not restored"),
    Mistake("resume_rng_not_restored", "ex9_answer", 'torch.set_rng_state(resume_from["torch_rng"])',
            "torch.get_rng_state()", BOTH[9], "global RNG"),
    Mistake("resume_data_position_lost", "ex9_answer", 'generator.set_state(resume_from["generator"])',
            "generator.get_state()", BOTH[9], "data position was not restored"),
    Mistake("resume_schedule_restarts", "ex9_answer", "lr_at(step, max_lr, min_lr, warmup_steps, num_steps)",
            "lr_at(step - start, max_lr, min_lr, warmup_steps, num_steps)", BOTH[9], "the schedule restarted"),
    # ---------------------------------------------------------------- found by honest attempts
    Mistake("ce_uniform_skips_ignore_class", "ex1_answer", "    uniform = -log_probs.mean(dim=-1)",
            "    classes = torch.arange(V, device=logits.device) != ignore_index\n"
            "    uniform = -log_probs[:, classes].mean(dim=-1)",
            ("ex1_visible",), "ignore_index only decides which positions count"),
    TwoMistakes("adamw_step_counter_per_call", "ex3_answer", '                t = state["step"]',
                "                t = self.t", BOTH[3], "the step count t is per parameter (kept in its state)",
                cell2="ex3_answer", old2="        for group in self.param_groups:\n            lr, (beta1, beta2)",
                new2="        self.t = getattr(self, 't', 0) + 1\n        for group in self.param_groups:\n"
                     "            lr, (beta1, beta2)"),
    TwoMistakes("adamw_group_lr_ignored", "ex3_answer", 'lr, (beta1, beta2), eps, wd = group["lr"], group["betas"]',
                'lr, (beta1, beta2), eps, wd = self.lr, group["betas"]', BOTH[3], "each param group's own lr",
                cell2="ex3_answer", old2="        self.state: dict = {}", new2="        self.lr = lr\n        self.state: dict = {}"),
    Mistake("adamw_closure_without_grad", "ex3_answer",
            "            with torch.enable_grad():\n                loss = closure()", "            loss = closure()",
            ("ex3_visible",), "call the closure inside `with torch.enable_grad():`"),
    Mistake("scaler_grows_one_step_late", "ex8_answer", "if self.good_steps == self.growth_interval:",
            "if self.good_steps > self.growth_interval:", BOTH[8], "(==, not >)"),
    # The run is compared with the spec's loop built from PyTorch's parts, so a wrong earlier answer
    # underneath (or a setting of the loop's own) no longer passes exercise 9.
    Mistake("train_after_lr_warmup_from_zero", "ex5_answer", "return max_lr * (step + 1) / warmup_steps",
            "return max_lr * step / warmup_steps", BOTH[9], "train calls your lr_at, which fails exercise 5's tests"),
    Mistake("train_default_betas", "ex9_answer", "AdamW(param_groups(model, 0.1), lr=max_lr, betas=(0.9, 0.95))",
            "AdamW(param_groups(model, 0.1), lr=max_lr)", BOTH[9], "not AdamW's default (0.9, 0.999)"),
]


# The shared step counter, seen from the resumed run: the blame goes to exercise 3.
MISTAKES.append(replace(next(m for m in MISTAKES if m.name == "adamw_step_counter_per_call"),
                        name="resume_after_adamw_step_counter_per_call", failing=BOTH[9],
                        hint="train calls your AdamW, which fails exercise 3's tests"))

# ---- exercise 10: the tiny model of chapters 1 to 4
MISTAKES += [
    Mistake("tiny_no_sqrt_d_scale", "ex10_answer", "self.tok(ids) * math.sqrt(self.d_model)", "self.tok(ids)",
            BOTH[10], "multiplied by sqrt(d_model) before the positions"),
    Mistake("tiny_not_causal", "ex10_answer",
            '        scores = scores.masked_fill(~self.causal[:T, :T], float("-inf"))\n', "", BOTH[10],
            "position t saw later tokens"),
    Mistake("tiny_positions_in_halves", "ex10_answer",
            "pe[:, 0::2] = torch.sin(pos * freq)\n        pe[:, 1::2] = torch.cos(pos * freq)",
            "pe = torch.cat([torch.sin(pos * freq), torch.cos(pos * freq)], dim=-1)", BOTH[10], "the sinusoids interleave"),
    Mistake("tiny_no_attention_scale", "ex10_answer", "scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_model)",
            "scores = q @ k.transpose(-2, -1)", BOTH[10], "divide the attention scores by sqrt(d_model)"),
    TwoMistakes("tiny_post_ln", "ex10_answer", "q, k, v = self.qkv(self.ln1(x))", "q, k, v = self.qkv(x)", BOTH[10],
                "the block is Pre-LN", cell2="ex10_answer",
                old2="x = x + self.proj(scores.softmax(dim=-1) @ v)\n        x = x + self.down(F.gelu(self.up(self.ln2(x))))",
                new2="x = self.ln1(x + self.proj(scores.softmax(dim=-1) @ v))\n"
                     "        x = self.ln2(x + self.down(F.gelu(self.up(x))))"),
    TwoMistakes("tiny_untied_head", "ex10_answer", "self.drop = nn.Dropout(dropout)",
                "self.drop = nn.Dropout(dropout)\n        self.head = nn.Linear(d_model, vocab_size, bias=False)",
                BOTH[10], "the output layer is tied to the embedding", cell2="ex10_answer",
                old2="return self.ln_f(x) @ self.tok.weight.T", new2="return self.head(self.ln_f(x))"),
    Mistake("tiny_tanh_gelu", "ex10_answer", "self.down(F.gelu(self.up(self.ln2(x))))",
            "self.down(F.gelu(self.up(self.ln2(x)), approximate=\"tanh\"))", BOTH[10], "the exact one"),
    TwoMistakes("tiny_residual_from_norm", "ex10_answer",
                "q, k, v = self.qkv(self.ln1(x)).split(self.d_model, dim=-1)",
                "x = self.ln1(x)\n        q, k, v = self.qkv(x).split(self.d_model, dim=-1)", BOTH[10],
                "not to the normalised x", cell2="ex10_answer",
                old2="x = x + self.down(F.gelu(self.up(self.ln2(x))))",
                new2="x = self.ln2(x)\n        x = x + self.down(F.gelu(self.up(x)))"),
    Mistake("tiny_mask_hides_diagonal", "ex10_answer",
            "causal = torch.ones(block_size, block_size, dtype=torch.bool).tril()",
            "causal = torch.ones(block_size, block_size, dtype=torch.bool).tril(diagonal=-1)", BOTH[10],
            "itself included"),
    Mistake("tiny_default_embedding_init", "ex10_answer",
            "        nn.init.normal_(self.tok.weight, std=d_model ** -0.5)\n", "", BOTH[10],
            "std=d_model ** -0.5"),
]
# A wrong loop underneath: exercise 10 blames train (exercise 9), not the model.
MISTAKES.append(replace(next(m for m in MISTAKES if m.name == "train_default_betas"),
                        name="tiny_after_train_default_betas", failing=BOTH[10],
                        hint="calls your train, which fails exercise 9's tests"))

# ---- exercise 11: the loss at initialisation
MISTAKES += [
    Mistake("init_loss_measured", "ex11_answer", "return math.log(V) + z_loss * math.log(V) ** 2",
            "return float(cross_entropy(torch.zeros(1, V), torch.zeros(1, dtype=torch.long), "
            "label_smoothing=label_smoothing, z_loss=z_loss))",
            BOTH[11], "measuring instead of predicting", e2e=False),
    Mistake("ce_logsumexp_method", "ex1_answer", "log_sum = shifted.exp().sum(dim=-1, keepdim=True).log()",
            "log_sum = shifted.logsumexp(dim=-1, keepdim=True)", BOTH[1], "calling the built-in", e2e=False),
    Mistake("init_loss_without_z", "ex11_answer", "return math.log(V) + z_loss * math.log(V) ** 2",
            "return math.log(V)", BOTH[11], "the z-loss is not 0 at initialisation"),
    Mistake("init_loss_smoothing_scaled", "ex11_answer", "return math.log(V) + z_loss",
            "return (1 - label_smoothing) * math.log(V) + z_loss", BOTH[11], "label smoothing changes nothing here"),
    Mistake("init_loss_z_not_squared", "ex11_answer", "z_loss * math.log(V) ** 2", "z_loss * math.log(V)", BOTH[11],
            "the z-loss squares log Z"),
    Mistake("init_loss_in_bits", "ex11_answer", "return math.log(V) + z_loss * math.log(V) ** 2",
            "return math.log2(V) + z_loss * math.log2(V) ** 2", BOTH[11], "the loss is in nats"),
]

# Graded end to end through the real autograder (one kernel run per chapter): the live state_dict, whose check
# needs course/goes_on.py in the sandboxed kernel (the other wrong answers are judged in process).
E2E = {"resume_state_dict_not_cloned"}

# ---- state that outlives a call (issue 32): every call runs in the same kernel
MISTAKES += [
    # The optimizer's state in a module-level dict, only its key in the checkpoint.
    Edits("resume_optimizer_state_in_module_dict", "ex9_answer", "def train(model: nn.Module, tokens",
          "_OPTIMIZER_STATES = {}    # run -> optimizer state, kept between calls\n\n\n"
          "def train(model: nn.Module, tokens", BOTH[9], "state kept outside the checkpoint", more=(
              ("ex9_answer", 'zip(params, resume_from["optimizer"])',
               'zip(params, _OPTIMIZER_STATES[resume_from["optimizer"]])'),
              ("ex9_answer", "    checkpoint = {", "    key = len(_OPTIMIZER_STATES)\n"
               "    _OPTIMIZER_STATES[key] = [optimizer.state.get(p) for p in params]\n    checkpoint = {"),
              ("ex9_answer", '"optimizer": [optimizer.state.get(p) for p in params]', '"optimizer": key'))),
    # Everything in a function attribute, the last run's: no key at all.
    Edits("resume_everything_in_function_attribute", "ex9_answer",
          "        model.load_state_dict(resume_from[\"model\"])", "        resume_from = train.last", BOTH[9], "state kept outside the checkpoint", more=(
              ("ex9_answer", "    return losses, checkpoint\n", "    train.last = checkpoint\n"
               "    return losses, {\"step\": end}\n"),
              ("ex9_answer", "        for p, state in zip(", "        model.load_state_dict(resume_from[\"model\"])\n"
               "        for p, state in zip("))),
    # The loaded moments used in place: resuming changes the checkpoint it was given.
    Mistake("resume_moments_not_cloned_on_load", "ex9_answer",
            "optimizer.state[p] = {k: (v.clone() if torch.is_tensor(v) else v) for k, v in state.items()}",
            "optimizer.state[p] = state", BOTH[9], "clone what you load from the checkpoint"),
]

# ---- exercise 3: the rules around the update, which the closure used to hide
MISTAKES += [
    Mistake("adamw_zero_grad_does_nothing", "ex3_answer", "                p.grad = None", "                pass",
            BOTH[3], "must set every parameter's .grad to None"),
    Mistake("adamw_zero_grad_zeros", "ex3_answer", "                p.grad = None",
            "                p.grad = None if p.grad is None else torch.zeros_like(p.grad)", BOTH[3],
            "not to zeros"),
    Mistake("adamw_always_calls_closure", "ex3_answer",
            "        if closure is not None:\n            with torch.enable_grad():\n                loss = closure()",
            "        with torch.enable_grad():\n            loss = closure()", BOTH[3],
            "call the closure only when one is given"),
    Mistake("adamw_step_returns_nothing", "ex3_answer", "        return loss\n", "        return None\n", BOTH[3],
            "step(closure) returns what the closure returns"),
]

# ---- exercise 10: dropout, which every test used to build at 0.0
MISTAKES += [
    Mistake("tiny_dropout_never_applied", "ex10_answer", "        x = self.drop(x)\n", "", BOTH[10],
            "dropout was never applied in train mode"),
    Mistake("tiny_dropout_left_on_in_eval", "ex10_answer", "x = self.drop(x)", "x = F.dropout(x, self.drop.p)",
            BOTH[10], "dropout stayed on in eval mode"),
]

# ---- exercise 1: the loss's dtype; exercise 5: the book's signature, without decay_steps
MISTAKES += [
    Mistake("ce_float64_loss", "ex1_answer", "logits, targets = logits.reshape(-1, V), targets.reshape(-1)",
            "logits, targets = logits.reshape(-1, V).double(), targets.reshape(-1)", BOTH[1],
            "return the loss in the logits' dtype"),
    TwoMistakes("lr_without_decay_steps", "ex5_answer", ",\n          decay_steps: int | None = None) -> float:",
                ") -> float:", BOTH[5], "exercise 5's signature is lr_at(step", cell2="ex5_answer",
                old2="    if decay_steps is None:\n        decay_steps = max_steps - warmup_steps\n",
                new2="    decay_steps = max_steps - warmup_steps\n"),
]

# The model's live tensors in the checkpoint: it changes as soon as training goes on.
MISTAKES.append(Mistake("resume_state_dict_not_cloned", "ex9_answer",
                        '"model": {k: v.clone() for k, v in model.state_dict().items()}',
                        '"model": model.state_dict()', BOTH[9], "clone them into the checkpoint"))

# ---- exercise 7: "do not update the model"
MISTAKES.append(Mistake("accum_steps_the_model", "ex7_answer", "        p.grad.div_(total)\n",
                        "        p.grad.div_(total)\n        p.data.add_(p.grad, alpha=-0.01)     # a step of SGD\n",
                        BOTH[7], "accumulate_gradients only fills .grad"))

# ---- exercise 12: perplexity and bits per byte, measured and predicted
MISTAKES += [
    Mistake("ppl_exp_of_sum", "ex12_answer", "math.exp(token_losses.double().mean().item())",
            "math.exp(token_losses.double().sum().item())", BOTH[12], "not of the sum"),
    Mistake("ppl_base_two", "ex12_answer", "math.exp(token_losses.double().mean().item())",
            "2 ** token_losses.double().mean().item()", BOTH[12], "not 2 ** mean"),
    Mistake("ppl_mean_of_exp", "ex12_answer", "math.exp(token_losses.double().mean().item())",
            "token_losses.double().exp().mean().item()", BOTH[12], "Jensen's inequality", e2e=False),
    Mistake("bpb_characters_not_bytes", "ex12_answer", 'n_bytes = len(text.encode("utf-8"))', "n_bytes = len(text)",
            BOTH[12], "len(text) counts characters"),
    Mistake("bpb_in_nats", "ex12_answer", "token_losses.double().sum().item() / math.log(2) / n_bytes",
            "token_losses.double().sum().item() / n_bytes", BOTH[12], "that is nats per byte"),
    Mistake("bpb_per_token", "ex12_answer", "token_losses.double().sum().item() / math.log(2) / n_bytes",
            "token_losses.double().mean().item() / math.log(2)", BOTH[12], "that is bits per token"),
    Mistake("uniform_bpb_in_nats", "ex12_answer", "return n_tokens * math.log2(vocab_size) / n_bytes",
            "return n_tokens * math.log(vocab_size) / n_bytes", BOTH[12], "bits use log2", e2e=False),
    Mistake("uniform_bpb_per_token", "ex12_answer", "return n_tokens * math.log2(vocab_size) / n_bytes",
            "return math.log2(vocab_size)", BOTH[12], "that is bits per *token*", e2e=False),
    Mistake("uniform_bpb_constant_from_one_case", "ex12_answer", "return n_tokens * math.log2(vocab_size) / n_bytes",
            "return 1000 * math.log2(50257) / 4200", BOTH[12], "the same number for every configuration is a value read off one case",
            e2e=False),
    Mistake("uniform_bpb_by_measuring", "ex12_answer", "return n_tokens * math.log2(vocab_size) / n_bytes",
            "return bits_per_byte(torch.full((n_tokens,), math.log(vocab_size)), 'x' * n_bytes)", BOTH[12],
            "measuring instead of predicting", e2e=False),
]

# ---- exercise 13: the FLOPs of a training token, predicted; MFU
_FWD = "forward = 2 * weights + 2 * attention"
_ATT = "attention = n_layers * 2 * seq_len * d_model"
_WEIGHTS = "weights = n_layers * block + d_model * vocab_size"
_BLOCK = "block = qkv + d_model * d_model + 2 * d_model * d_ff"
_MFU = "return tokens_per_second * flops_per_token / peak_flops"
MISTAKES += [
    Mistake("flops_forward_only", "ex13_answer", "return 3 * forward", "return forward", BOTH[13],
            "that is the forward pass alone"),
    Mistake("flops_backward_equal_to_forward", "ex13_answer", "return 3 * forward", "return 2 * forward", BOTH[13],
            "three forward passes, not two"),
    Mistake("flops_multiply_adds", "ex13_answer", _FWD, "forward = weights + attention", BOTH[13],
            "a multiply-add is 2 FLOPs"),
    Mistake("flops_6n_without_attention", "ex13_answer", _FWD, "forward = 2 * weights", BOTH[13],
            "the attention matmuls are missing"),
    Mistake("flops_attention_forward_only", "ex13_answer", "return 3 * forward",
            "return 3 * 2 * weights + 2 * attention", BOTH[13], "the attention matmuls have a backward pass too"),
    Mistake("flops_attention_causal_half", "ex13_answer", _ATT, "attention = n_layers * seq_len * d_model", BOTH[13],
            "the attention term is half what the model computes"),
    Mistake("flops_attention_per_sequence", "ex13_answer", _ATT,
            "attention = n_layers * 2 * seq_len * seq_len * d_model", BOTH[13], "counted per sequence, not per token"),
    Mistake("flops_attention_shrunk_by_gqa", "ex13_answer", _ATT,
            "attention = n_layers * 2 * seq_len * n_kv_heads * d_head", BOTH[13],
            "n_kv_heads does not shrink the attention matmuls"),
    Mistake("flops_gqa_ignored", "ex13_answer", "qkv = d_model * (n_heads + 2 * n_kv_heads) * d_head",
            "qkv = 3 * d_model * d_model", BOTH[13], "the K and V projections are smaller"),
    Mistake("flops_d_ff_assumed_4d", "ex13_answer", _BLOCK, "block = qkv + d_model * d_model + 8 * d_model * d_model",
            BOTH[13], "need not be 4 * d_model"),
    Edits("flops_one_layer", "ex13_answer", _WEIGHTS, "weights = block + d_model * vocab_size", BOTH[13],
          "count every one of the n_layers blocks", more=(("ex13_answer", _ATT, "attention = 2 * seq_len * d_model"),)),
    Mistake("flops_no_output_layer", "ex13_answer", _WEIGHTS, "weights = n_layers * block", BOTH[13],
            "the output layer is missing"),
    Mistake("flops_tied_table_twice", "ex13_answer", _WEIGHTS, "weights = n_layers * block + 2 * d_model * vocab_size",
            BOTH[13], "the table is counted once, not twice"),
    Mistake("flops_embedding_as_matmul", "ex13_answer", _WEIGHTS,
            "weights = n_layers * block + d_model * vocab_size * (1 if tied else 2)", BOTH[13],
            "the embedding lookup is a gather, not a matmul"),
    Edits("flops_every_parameter", "ex13_answer", _BLOCK,
          f"{_BLOCK} + (n_heads + 2 * n_kv_heads) * d_head + 2 * d_model + d_ff + 4 * d_model", BOTH[13],
          "only matmuls count", more=(("ex13_answer", _WEIGHTS, f"{_WEIGHTS} + 2 * d_model"),)),
    Mistake("flops_measured", "ex13_answer", "    d_head = d_model // n_heads\n",
            "    from torch.utils.flop_counter import FlopCounterMode\n    counter = FlopCounterMode(display=False)\n"
            "    with counter:\n        TinyCausalLM(vocab_size, d_model, seq_len)(torch.zeros(1, seq_len, "
            "dtype=torch.long)).sum().backward()\n    return counter.get_total_flops() / seq_len\n", BOTH[13],
            "measuring instead of predicting", e2e=False),
    Mistake("flops_read_off_the_demo", "ex13_answer", "return 3 * forward", "return 203040", BOTH[13],
            "the same number for every configuration is a value read off one case", e2e=False),
    Mistake("mfu_percent", "ex13_answer", _MFU, "return 100 * tokens_per_second * flops_per_token / peak_flops",
            BOTH[13], "that is a percentage"),
    Mistake("mfu_upside_down", "ex13_answer", _MFU, "return peak_flops / (tokens_per_second * flops_per_token)",
            BOTH[13], "the ratio is upside down"),
    Mistake("mfu_backward_counted_again", "ex13_answer", _MFU,
            "return 3 * tokens_per_second * flops_per_token / peak_flops", BOTH[13], "do not multiply it by 3 again",
            e2e=False),
]
