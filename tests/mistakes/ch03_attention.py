"""Chapter 3: common mistakes, each of which must lose points and get its own hint."""

from notebook_tools import Mistake

BOTH = {f"ex{k}": (f"ex{k}_visible", f"ex{k}_hidden") for k in range(1, 12)}
HIDDEN = {f"ex{k}": (f"ex{k}_hidden",) for k in range(1, 12)}

_FILL_AND_ZERO = ("scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)\n"
                  "    weights = torch.softmax(scores, dim=-1)\n"
                  "    if mask is not None:\n"
                  "        weights = weights.masked_fill(~mask, 0.0)")

# Queries grouped as h % n_kv_heads instead of h // group (exercise 5), and the newest queries
# placed at positions 0.. instead of after the cache (exercise 3): each graded on its own and
# again through exercise 10, which calls them.
_GQA_HEADS_TILED = (
    "    q = q.reshape(B, n_kv, group * T_q, d_head)                          # a group's queries share one key matrix\n"
    "    if mask is not None:\n"
    "        mask = mask.expand(B, n_heads, T_q, T_k).reshape(B, n_kv, group * T_q, T_k)\n"
    "    out, _ = scaled_dot_product_attention(q, k, v, mask)                  # (B, n_kv, group * T_q, d_v)\n"
    "    return out.reshape(B, n_heads, T_q, v.shape[-1])",
    "    q = q.view(B, group, n_kv, T_q, d_head).transpose(1, 2).reshape(B, n_kv, group * T_q, d_head)\n"
    "    if mask is not None:\n"
    "        mask = (mask.expand(B, n_heads, T_q, T_k).reshape(B, group, n_kv, T_q, T_k).transpose(1, 2)\n"
    "                .reshape(B, n_kv, group * T_q, T_k))\n"
    "    out, _ = scaled_dot_product_attention(q, k, v, mask)\n"
    "    return out.view(B, n_kv, group, T_q, -1).transpose(1, 2).reshape(B, n_heads, T_q, v.shape[-1])",
)
# Chapter 2's apply_rope with the interleaved layout of the angles (chapter 2's own mistake), pasted into
# exercise 10's first cell.
_ROPE_PAIRINGS_MIXED = ("angles = torch.cat((angles, angles), dim=-1)", "angles = angles.repeat_interleave(2, dim=-1)")
_QUERIES_AT_THE_TOP_LEFT = (
    "query_pos = torch.arange(k_len - q_len, k_len, device=key_is_real.device)[:, None]",
    "query_pos = torch.arange(q_len, device=key_is_real.device)[:, None]",
)

MISTAKES = [
    # ---------------------------------------------------------------- 1: softmax
    Mistake("softmax_no_max", "ex1_answer",
            "e = torch.exp(x - x.max(dim=dim, keepdim=True).values)", "e = torch.exp(x)",
            BOTH["ex1"], "subtract the maximum along dim"),
    Mistake("softmax_global_max", "ex1_answer",
            "e = torch.exp(x - x.max(dim=dim, keepdim=True).values)", "e = torch.exp(x - x.max())",
            BOTH["ex1"], "not over the whole tensor"),
    Mistake("softmax_shortcut", "ex1_answer",
            "e = torch.exp(x - x.max(dim=dim, keepdim=True).values)\n    return e / e.sum(dim=dim, keepdim=True)",
            "return torch.softmax(x, dim=dim)",
            BOTH["ex1"], "asks you to write the softmax yourself"),
    # ---------------------------------------------------------------- 2: attention with a bias and a mask
    Mistake("attention_no_scale", "ex2_answer",
            "scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])", "scores = q @ k.transpose(-2, -1)",
            BOTH["ex2"], "the scores were not scaled"),
    Mistake("attention_scaled_by_d_k", "ex2_answer",
            "/ math.sqrt(q.shape[-1])", "/ q.shape[-1]",
            BOTH["ex2"], "divided by d_k; divide by sqrt(d_k)"),
    Mistake("attention_softmax_wrong_axis", "ex2_answer",
            "weights = torch.softmax(scores, dim=-1)", "weights = torch.softmax(scores, dim=-2)",
            BOTH["ex2"], "the softmax ran over the queries"),
    Mistake("attention_mask_inverted", "ex2_answer", _FILL_AND_ZERO,
            _FILL_AND_ZERO.replace("~mask", "mask"),
            BOTH["ex2"], "the mask is inverted"),
    Mistake("attention_fully_masked_row_nan", "ex2_answer", _FILL_AND_ZERO,
            "scores = scores.masked_fill(~mask, float(\"-inf\"))\n    weights = torch.softmax(scores, dim=-1)",
            BOTH["ex2"], "a fully masked row gives NaN"),
    Mistake("attention_fill_minus_1e9_no_guard", "ex2_answer", _FILL_AND_ZERO,
            "scores = scores.masked_fill(~mask, -1e9)\n    weights = torch.softmax(scores, dim=-1)",
            BOTH["ex2"], "must get all-zero weights and a zero output"),
    Mistake("attention_additive_inf_mask_nan_gradient", "ex2_answer",
            "scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)",
            "scores = scores + torch.zeros_like(scores).masked_fill(~mask, float(\"-inf\"))",
            BOTH["ex2"], "flows back into q and k"),
    Mistake("attention_mask_only_after_softmax", "ex2_answer",
            "    if mask is not None:\n        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)\n", "",
            BOTH["ex2"], "the mask was applied only after the softmax"),
    Mistake("attention_shortcut", "ex2_answer",
            "return weights @ v, weights",
            "return F.scaled_dot_product_attention(q, k, v, attn_mask=mask), weights",
            BOTH["ex2"], "asks you to write scaled dot-product attention yourself"),
    Mistake("attention_fill_minus_1e9_guarded", "ex2_answer",
            "scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)",
            "scores = scores.masked_fill(~mask, -1e9)",
            BOTH["ex2"], "does not exist in torch.float16"),
    Mistake("attention_fill_minus_1e4_guarded", "ex2_answer",
            "scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)",
            "scores = scores.masked_fill(~mask, -1e4)",
            BOTH["ex2"], "the fill value is not below every real score"),
    Mistake("attention_additive_float32_mask_promotes", "ex2_answer",
            "scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)",
            "scores = scores + torch.zeros(mask.shape).masked_fill(~mask, torch.finfo(torch.float32).min)",
            BOTH["ex2"], "keep the input dtype"),
    Mistake("attention_bias_ignored", "ex2_answer",
            "        scores = scores + bias\n", "        pass\n",
            BOTH["ex2"], "the bias was ignored"),
    Mistake("attention_bias_scaled_with_scores", "ex2_answer",
            "    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])          # (..., T_q, T_k)\n"
            "    if bias is not None:\n"
            "        scores = scores + bias\n",
            "    scores = q @ k.transpose(-2, -1)\n"
            "    if bias is not None:\n"
            "        scores = scores + bias\n"
            "    scores = scores / math.sqrt(q.shape[-1])\n",
            BOTH["ex2"], "the bias was divided by sqrt(d_k)"),
    Mistake("attention_bias_subtracted", "ex2_answer",
            "scores = scores + bias", "scores = scores - bias",
            BOTH["ex2"], "the bias was subtracted"),
    # ---------------------------------------------------------------- 3: decoder mask
    Mistake("decoder_mask_top_left", "ex3_answer",
            *_QUERIES_AT_THE_TOP_LEFT,
            BOTH["ex3"], "aligned to the top left"),
    Mistake("decoder_mask_no_diagonal", "ex3_answer",
            "causal = key_pos <= query_pos", "causal = key_pos < query_pos",
            BOTH["ex3"], "the diagonal is missing"),
    Mistake("decoder_mask_ignores_padding", "ex3_answer",
            "return causal[None, None] & key_is_real[:, None, None, :]",
            "return causal[None, None].expand(B, 1, q_len, k_len)",
            BOTH["ex3"], "the padding was ignored"),
    Mistake("decoder_mask_masks_padding_queries", "ex3_answer",
            "return causal[None, None] & key_is_real[:, None, None, :]",
            "return causal[None, None] & key_is_real[:, None, None, :] & key_is_real[:, None, k_len - q_len:, None]",
            HIDDEN["ex3"], "padding queries were masked too"),   # left padding cannot tell: only keys before it
    Mistake("decoder_mask_no_head_axis", "ex3_answer",
            "return causal[None, None] & key_is_real[:, None, None, :]",
            "return causal[None] & key_is_real[:, None, :]",
            BOTH["ex3"], "needs a head axis of size 1"),
    # ---------------------------------------------------------------- 4: fused multi-head attention
    Mistake("mha_fused_split_in_chunks", "ex4_answer",
            "        qkv = self.qkv(x).view(B, T, self.n_heads, 3, self.d_head)          # per head: its q, k, v\n"
            "        q, k, v = (t.transpose(1, 2) for t in qkv.unbind(3))",
            "        q, k, v = (t.view(B, T, self.n_heads, self.d_head).transpose(1, 2)\n"
            "                   for t in self.qkv(x).split(d_model, dim=-1))",
            BOTH["ex4"], "split as [all queries | all keys | all values]"),
    Mistake("mha_fused_interleaved", "ex4_answer",
            "view(B, T, self.n_heads, 3, self.d_head)          # per head: its q, k, v\n"
            "        q, k, v = (t.transpose(1, 2) for t in qkv.unbind(3))",
            "view(B, T, self.n_heads, self.d_head, 3)\n"
            "        q, k, v = (t.transpose(1, 2) for t in qkv.unbind(4))",
            BOTH["ex4"], "feature by feature"),
    Mistake("mha_split_heads_without_transpose", "ex4_answer",
            "q, k, v = (t.transpose(1, 2) for t in qkv.unbind(3))",
            "q, k, v = (t.reshape(B, self.n_heads, T, self.d_head) for t in qkv.unbind(3))",
            BOTH["ex4"], "the heads were split in the wrong order"),
    Mistake("mha_merge_without_transpose", "ex4_answer",
            "return self.out_proj(out.transpose(1, 2).reshape(B, T, d_model))",
            "return self.out_proj(out.reshape(B, T, d_model))",
            BOTH["ex4"], "the heads were merged in the wrong order"),
    Mistake("mha_scaled_by_d_model", "ex4_answer",
            "        out, _ = scaled_dot_product_attention(q, k, v, mask)",
            "        out, _ = scaled_dot_product_attention(q * math.sqrt(self.d_head / d_model), k, v, mask)",
            BOTH["ex4"], "divided by sqrt(d_model)"),
    Mistake("mha_ignores_mask", "ex4_answer",
            "out, _ = scaled_dot_product_attention(q, k, v, mask)", "out, _ = scaled_dot_product_attention(q, k, v)",
            BOTH["ex4"], "the mask was ignored"),
    Mistake("mha_no_out_proj", "ex4_answer",
            "return self.out_proj(out.transpose(1, 2).reshape(B, T, d_model))",
            "return out.transpose(1, 2).reshape(B, T, d_model)",
            BOTH["ex4"], "out_proj was not applied"),
    # Everything but the attention is right: the hint must name the query that sees no key, never
    # the head split or out_proj (the visible tests hold such a row).
    Mistake("mha_inline_softmax_masked_row_uniform", "ex4_answer",
            "        out, _ = scaled_dot_product_attention(q, k, v, mask)",
            "        scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_head)\n"
            "        if mask is not None:\n"
            "            scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)\n"
            "        out = torch.softmax(scores, dim=-1) @ v",
            BOTH["ex4"], "The head split, the merge and out_proj are right"),
    Mistake("mha_shortcut_sdpa", "ex4_answer",
            "        out, _ = scaled_dot_product_attention(q, k, v, mask)",
            "        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)",
            BOTH["ex4"], "asks you to write MultiHeadAttention yourself"),
    # ---------------------------------------------------------------- 5: grouped-query attention
    Mistake("gqa_repeat_interleave_copies", "ex5_answer",
            "    q = q.reshape(B, n_kv, group * T_q, d_head)                          # a group's queries share one key matrix\n"
            "    if mask is not None:\n"
            "        mask = mask.expand(B, n_heads, T_q, T_k).reshape(B, n_kv, group * T_q, T_k)\n"
            "    out, _ = scaled_dot_product_attention(q, k, v, mask)                  # (B, n_kv, group * T_q, d_v)\n",
            "    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)\n"
            "    out, _ = scaled_dot_product_attention(q, k, v, mask)\n",
            BOTH["ex5"], "expanding the keys and values to n_heads copies them"),
    Mistake("gqa_broadcasting_matmul_copies", "ex5_answer",
            "    q = q.reshape(B, n_kv, group * T_q, d_head)                          # a group's queries share one key matrix\n"
            "    if mask is not None:\n"
            "        mask = mask.expand(B, n_heads, T_q, T_k).reshape(B, n_kv, group * T_q, T_k)\n"
            "    out, _ = scaled_dot_product_attention(q, k, v, mask)                  # (B, n_kv, group * T_q, d_v)\n",
            "    q = q.reshape(B, n_kv, group, T_q, d_head)\n"
            "    if mask is not None:\n"
            "        mask = mask.expand(B, n_heads, T_q, T_k).reshape(B, n_kv, group, T_q, T_k)\n"
            "    out, _ = scaled_dot_product_attention(q, k.unsqueeze(2), v.unsqueeze(2), mask)\n",
            BOTH["ex5"], "expands it internally"),
    Mistake("gqa_heads_tiled", "ex5_answer",
            *_GQA_HEADS_TILED,
            BOTH["ex5"], "grouped as h % n_kv_heads"),
    Mistake("gqa_mask_grouped_wrong", "ex5_answer",
            "        mask = mask.expand(B, n_heads, T_q, T_k).reshape(B, n_kv, group * T_q, T_k)",
            "        mask = (mask.expand(B, n_heads, T_q, T_k).reshape(B, group, n_kv, T_q, T_k).transpose(1, 2)\n"
            "                .reshape(B, n_kv, group * T_q, T_k))",
            BOTH["ex5"], "the per-head mask is not"),
    Mistake("gqa_ignores_mask", "ex5_answer",
            "out, _ = scaled_dot_product_attention(q, k, v, mask)                  # (B, n_kv, group * T_q, d_v)",
            "out, _ = scaled_dot_product_attention(q, k, v)",
            BOTH["ex5"], "the mask was ignored"),
    # ---------------------------------------------------------------- sizes that do not divide (issue 32)
    Mistake("mha_no_divisibility_check", "ex4_answer",
            '        if d_model % n_heads:\n'
            '            raise ValueError(f"d_model {d_model} is not divisible by n_heads {n_heads}")\n', "",
            BOTH["ex4"], "check d_model % n_heads == 0 in __init__"),
    Mistake("mha_value_error_without_sizes", "ex4_answer",
            'raise ValueError(f"d_model {d_model} is not divisible by n_heads {n_heads}")',
            'raise ValueError("d_model must be divisible by n_heads")',
            BOTH["ex4"], "say which sizes do not divide", e2e=False),
    # ---------------------------------------------------------------- inputs that must not change (issue 32)
    Mistake("attention_scales_query_in_place", "ex2_answer",
            "scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])",
            "scores = q.div_(math.sqrt(q.shape[-1])) @ k.transpose(-2, -1)",
            BOTH["ex2"], "the caller reads its tensors again"),
    Mistake("linear_attention_feature_map_in_place", "ex8_answer",
            "q, k = F.elu(q) + 1, F.elu(k) + 1", "q, k = F.elu_(q).add_(1), F.elu_(k).add_(1)",
            BOTH["ex8"], "the caller reads its tensors again", e2e=False),
    # ---------------------------------------------------------------- 6: entropy, predicted and measured
    Mistake("entropy_prediction_ignores_causal_mask", "ex6_answer",
            "return math.log(position + 1)", "return math.log(seq_len)",
            BOTH["ex6"], "the causal mask leaves"),
    Mistake("entropy_prediction_in_bits", "ex6_answer",
            "return math.log(position + 1)", "return math.log2(position + 1)",
            BOTH["ex6"], "ln, not log2"),
    # Within 0.01 of the answer on the notebook's case, yet a slip of its own (the query's own key), not a rounding.
    Mistake("entropy_prediction_forgets_own_key", "ex6_answer",
            "return math.log(position + 1)", "return math.log(max(position, 1))",
            BOTH["ex6"], "the query sees itself too", e2e=False),
    # The right derivation rounded to the demo's four decimals: within 0.01, but the arithmetic is asked for.
    Mistake("entropy_prediction_rounded_decimal", "ex6_answer",
            "return math.log(position + 1)", "return round(math.log(position + 1), 4)",
            BOTH["ex6"], "return the arithmetic that gives it, as a Python expression", e2e=False),
    # The loophole of issue 32: the exact value of the notebook's case, whatever the configuration; and the
    # prediction measured with the student's own attention_entropy.
    Mistake("entropy_prediction_constant_from_measurement", "ex6_answer",
            "return math.log(position + 1)", "return math.log(512)",
            BOTH["ex6"], "the same number for every configuration is a value read off one case"),
    Mistake("entropy_prediction_by_measuring", "ex6_answer",
            "return math.log(position + 1)",
            "return attention_entropy(torch.zeros(1, seq_len), torch.arange(seq_len) <= position).item()",
            BOTH["ex6"], "measuring instead of predicting", e2e=False),
    Mistake("entropy_zero_times_log_zero", "ex6_answer",
            "    terms = torch.where(p > 0, -p * log_p, torch.zeros_like(p))           # 0 * log 0 counts as 0\n"
            "    return terms.sum(dim=-1).nan_to_num(0.0)",
            "    return (-p * log_p).sum(dim=-1)",
            BOTH["ex6"], "0 * log(0) = 0 * -inf = NaN"),
    Mistake("entropy_finite_fill_uniform_empty_row", "ex6_answer",
            "s = s.masked_fill(~mask, float(\"-inf\"))", "s = s.masked_fill(~mask, -1e9)",
            BOTH["ex6"], "a row with no allowed key has entropy 0"),
    Mistake("entropy_normalised_by_uniform", "ex6_answer",
            "return terms.sum(dim=-1).nan_to_num(0.0)",
            "return terms.sum(dim=-1).nan_to_num(0.0) / math.log(scores.shape[-1])",
            BOTH["ex6"], "divided by its largest value ln(n)"),
    Mistake("entropy_in_bits", "ex6_answer",
            "return terms.sum(dim=-1).nan_to_num(0.0)", "return terms.sum(dim=-1).nan_to_num(0.0) / math.log(2)",
            BOTH["ex6"], "that is in bits"),
    Mistake("entropy_temperature_multiplied", "ex6_answer",
            "s = scores / temperature", "s = scores * temperature",
            BOTH["ex6"], "it was multiplied"),
    # ---------------------------------------------------------------- 7: sliding-window attention
    Mistake("window_padding_not_masked", "ex7_answer",
            "out, _ = scaled_dot_product_attention(q.unsqueeze(-2), k_win, v_win, mask)",
            "out, _ = scaled_dot_product_attention(q.unsqueeze(-2), k_win, v_win)",
            BOTH["ex7"], "the padding positions you added before the sequence must be masked"),
    Mistake("window_one_key_too_many", "ex7_answer",
            "    pad = (0, 0, window - 1, 0)                                           # window - 1 positions before the sequence\n"
            "    k_win = F.pad(k, pad).unfold(-2, window, 1).transpose(-2, -1)         # (..., T, window, d_k), a view\n"
            "    v_win = F.pad(v, pad).unfold(-2, window, 1).transpose(-2, -1)         # (..., T, window, d_v)\n"
            "    key_pos = (torch.arange(T, device=q.device)[:, None] - window + 1\n"
            "               + torch.arange(window, device=q.device)[None, :])",
            "    window = window + 1\n"
            "    pad = (0, 0, window - 1, 0)\n"
            "    k_win = F.pad(k, pad).unfold(-2, window, 1).transpose(-2, -1)\n"
            "    v_win = F.pad(v, pad).unfold(-2, window, 1).transpose(-2, -1)\n"
            "    key_pos = (torch.arange(T, device=q.device)[:, None] - window + 1\n"
            "               + torch.arange(window, device=q.device)[None, :])",
            BOTH["ex7"], "not window + 1"),
    Mistake("window_full_matrix", "ex7_answer",
            "    T = q.shape[-2]\n",
            "    T = q.shape[-2]\n"
            "    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]\n"
            "    return scaled_dot_product_attention(q, k, v, (j <= i) & (i - j < window))[0]\n",
            BOTH["ex7"], "needs only (T, window)"),
    Mistake("window_no_scale", "ex7_answer",
            "out, _ = scaled_dot_product_attention(q.unsqueeze(-2), k_win, v_win, mask)",
            "out, _ = scaled_dot_product_attention(q.unsqueeze(-2) * math.sqrt(q.shape[-1]), k_win, v_win, mask)",
            BOTH["ex7"], "the scores were not scaled"),
    # ---------------------------------------------------------------- 8: chunked linear attention
    Mistake("chunked_no_mask_inside_chunk", "ex8_answer",
            "a = (qc @ kc.transpose(-2, -1)).tril()", "a = qc @ kc.transpose(-2, -1)",
            BOTH["ex8"], "inside a chunk every query saw the whole chunk"),
    Mistake("chunked_state_updated_first", "ex8_answer",
            "        a = (qc @ kc.transpose(-2, -1)).tril()                            # (..., C, C), causal inside the chunk\n"
            "        num = qc @ S + a @ vc                                             # (..., C, d_v)\n"
            "        den = (qc * z).sum(dim=-1, keepdim=True) + a.sum(dim=-1, keepdim=True)\n"
            "        outs.append(num / den)\n"
            "        S = S + kc.transpose(-2, -1) @ vc                                 # only now: the chunk joins the state\n"
            "        z = z + kc.sum(dim=-2, keepdim=True)\n",
            "        S = S + kc.transpose(-2, -1) @ vc\n"
            "        z = z + kc.sum(dim=-2, keepdim=True)\n"
            "        outs.append((qc @ S) / (qc * z).sum(dim=-1, keepdim=True))\n",
            BOTH["ex8"], "updated only after the chunk's outputs"),
    Mistake("chunked_diagonal_missing", "ex8_answer",
            "a = (qc @ kc.transpose(-2, -1)).tril()", "a = (qc @ kc.transpose(-2, -1)).tril(-1)",
            BOTH["ex8"], "the diagonal is missing inside the chunks"),
    Mistake("chunked_no_normaliser", "ex8_answer",
            "outs.append(num / den)", "outs.append(num)",
            BOTH["ex8"], "the normaliser is missing"),
    Mistake("chunked_elu_without_plus_one", "ex8_answer",
            "q, k = F.elu(q) + 1, F.elu(k) + 1", "q, k = F.elu(q), F.elu(k)",
            BOTH["ex8"], "not elu(x)"),
    Mistake("chunked_prefix_sums_of_every_position", "ex8_answer",
            "    q, k = F.elu(q) + 1, F.elu(k) + 1                                     # phi(q), phi(k)\n",
            "    q, k = F.elu(q) + 1, F.elu(k) + 1\n"
            "    S = (k.unsqueeze(-1) * v.unsqueeze(-2)).cumsum(dim=-3)\n"
            "    return (q.unsqueeze(-2) @ S).squeeze(-2) / (q * k.cumsum(dim=-2)).sum(dim=-1, keepdim=True)\n",
            BOTH["ex8"], "not one per position"),
    # ---------------------------------------------------------------- 9: tiled attention
    Mistake("flash_causal_top_left", "ex9_answer",
            "offset = T_k - T_q ", "offset = 0 ",
            BOTH["ex9"], "aligned to the top left"),
    Mistake("flash_causal_diagonal_masked", "ex9_answer",
            "s = s.masked_fill(k_pos > q_pos, float(\"-inf\"))", "s = s.masked_fill(k_pos >= q_pos, float(\"-inf\"))",
            BOTH["ex9"], "the diagonal is masked"),
    Mistake("flash_skips_tiles_too_early", "ex9_answer",
            "if causal and ks > offset + qs + n - 1:", "if causal and ks > offset + qs:",
            BOTH["ex9"], "tiles were skipped too early"),
    Mistake("flash_running_sum_not_rescaled", "ex9_answer",
            "l = l * correction + p.sum(dim=-1, keepdim=True)", "l = l + p.sum(dim=-1, keepdim=True)",
            BOTH["ex9"], "the running sum l was not rescaled"),
    Mistake("flash_accumulator_not_rescaled", "ex9_answer",
            "acc = acc * correction + p @ v", "acc = acc + p @ v",
            BOTH["ex9"], "the accumulator was not rescaled"),
    Mistake("flash_lse_without_max", "ex9_answer",
            "lses.append((m + l.log()).squeeze(-1))", "lses.append(l.log().squeeze(-1))",
            BOTH["ex9"], "log(l) alone is relative to the running maximum"),
    Mistake("flash_queries_not_tiled", "ex9_answer",
            "for qs in range(0, T_q, q_block):\n        qb = q[..., qs:qs + q_block, :]",
            "for qs in range(0, T_q, T_q):\n        qb = q[..., qs:qs + T_q, :]",
            BOTH["ex9"], "the queries were not tiled"),
    Mistake("flash_returns_float32", "ex9_answer",
            "return torch.cat(outs, dim=-2), torch.cat(lses, dim=-1)",
            "return torch.cat(outs, dim=-2).float(), torch.cat(lses, dim=-1).float()",
            BOTH["ex9"], "return the dtype of the inputs", e2e=False),
    Mistake("flash_shortcut_sdpa", "ex9_answer",
            "    scale = 1 / math.sqrt(q.shape[-1])\n",
            "    return F.scaled_dot_product_attention(q, k, v, is_causal=causal), None\n",
            BOTH["ex9"], "asks you to write tiled attention"),
    # ---------------------------------------------------------------- 10: the decoder step
    # Chapter 2's apply_rope pasted wrong: chapter 2's test under the paste names the cause, and the step's tests
    # send the learner back to it first.
    Mistake("pasted_rope_pairings_mixed", "ex10_tools_answer", *_ROPE_PAIRINGS_MIXED, ("ex10_tools_visible",),
            "pairings are mixed"),
    Mistake("step_after_pasted_rope_pairings_mixed", "ex10_tools_answer", *_ROPE_PAIRINGS_MIXED, BOTH["ex10"],
            "decoder_attention_step calls your apply_rope from chapter 2, which fails that chapter's tests"),
    # Angles in x's dtype: right for the step's float32 and float64, wrong in chapter 2's bfloat16 case, which the
    # paste's own test (and the hidden cell, which runs it again) catches.
    Mistake("pasted_rope_angles_in_bfloat16", "ex10_tools_answer",
            "    work = torch.float64 if x.dtype == torch.float64 else torch.float32", "    work = x.dtype",
            ("ex10_tools_visible", "ex10_hidden"), "the angles were computed in bfloat16"),
    Mistake("step_rope_without_offset", "ex10_answer",
            "positions = torch.arange(T_past, T_past + T_new, device=ids.device)",
            "positions = torch.arange(T_new, device=ids.device)",
            BOTH["ex10"], "rotate new token t by its absolute position"),
    Mistake("step_cache_rotated_again", "ex10_answer",
            "k_cache, v_cache = torch.cat((k_cache, k), dim=-2), torch.cat((v_cache, v), dim=-2)",
            "k_cache = apply_rope(k_cache, torch.arange(T_past, device=ids.device), base)\n"
            "    k_cache, v_cache = torch.cat((k_cache, k), dim=-2), torch.cat((v_cache, v), dim=-2)",
            BOTH["ex10"], "the cached keys were rotated again"),
    # The whole grown cache rotated at T_past .. after the concatenation (positions of the new tokens only).
    Mistake("step_rotates_after_appending", "ex10_answer",
            "    q, k = apply_rope(q, positions, base), apply_rope(k, positions, base)\n"
            "    k_cache, v_cache = torch.cat((k_cache, k), dim=-2), torch.cat((v_cache, v), dim=-2)\n",
            "    k_cache, v_cache = torch.cat((k_cache, k), dim=-2), torch.cat((v_cache, v), dim=-2)\n"
            "    q = apply_rope(q, positions, base)\n"
            "    k_cache = apply_rope(k_cache, torch.arange(T_past + T_new, device=ids.device), base)\n",
            BOTH["ex10"], "the cached keys were rotated again"),
    Mistake("step_values_rotated", "ex10_answer",
            "q, k = apply_rope(q, positions, base), apply_rope(k, positions, base)",
            "q, k, v = apply_rope(q, positions, base), apply_rope(k, positions, base), apply_rope(v, positions, base)",
            BOTH["ex10"], "the values were rotated"),
    Mistake("step_mask_top_left", "ex10_answer",
            "    mask = decoder_mask(torch.ones(B, T_past + T_new, dtype=torch.bool, device=ids.device), T_new)",
            "    mask = torch.ones(T_new, T_past + T_new, dtype=torch.bool, device=ids.device).tril()",
            BOTH["ex10"], "aligned to the top left"),
    # the grown values kept under another name, the cache given back as it came (the output is right)
    Mistake("step_v_cache_not_returned", "ex10_answer",
            "k_cache, v_cache = torch.cat((k_cache, k), dim=-2), torch.cat((v_cache, v), dim=-2)\n"
            "    mask = decoder_mask(torch.ones(B, T_past + T_new, dtype=torch.bool, device=ids.device), T_new)\n"
            "    out = grouped_query_attention(q, k_cache, v_cache, mask)",
            "k_cache, values = torch.cat((k_cache, k), dim=-2), torch.cat((v_cache, v), dim=-2)\n"
            "    mask = decoder_mask(torch.ones(B, T_past + T_new, dtype=torch.bool, device=ids.device), T_new)\n"
            "    out = grouped_query_attention(q, k_cache, values, mask)",
            BOTH["ex10"], "the v_cache came back as it was given"),
    Mistake("step_w_o_not_transposed", "ex10_answer",
            "reshape(B, T_new, n_heads * d_head) @ w_o.T", "reshape(B, T_new, n_heads * d_head) @ w_o",
            BOTH["ex10"], "apply it as out @ w_o.T"),
    # ---------------------------------------------------------------- blame the earlier exercise
    # A wrong exercise 2 answer also breaks the layers that call it: their hints must say so.
    Mistake("layers_after_attention_no_scale", "ex2_answer",
            "scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])", "scores = q @ k.transpose(-2, -1)",
            BOTH["ex4"] + BOTH["ex5"] + BOTH["ex7"],
            "may call your scaled_dot_product_attention, which fails exercise 2's tests", e2e=False),
    Mistake("step_after_decoder_mask_top_left", "ex3_answer",
            *_QUERIES_AT_THE_TOP_LEFT,
            BOTH["ex10"], "may call your decoder_mask, which fails exercise 3's tests", e2e=False),
    Mistake("step_after_gqa_heads_tiled", "ex5_answer",
            *_GQA_HEADS_TILED,
            BOTH["ex10"], "may call your grouped_query_attention, which fails exercise 5's tests", e2e=False),
    # ---------------------------------------------------------------- 11: bytes moved, predicted
    Mistake("io_standard_forgets_write_of_p", "ex11_answer",
            "4 * seq_len * seq_len + 4", "3 * seq_len * seq_len + 4",
            BOTH["ex11"], "the softmax writes P back to slow memory"),
    Mistake("io_tiled_reads_kv_once", "ex11_answer",
            "(2 + 2 * query_tiles)", "4",
            BOTH["ex11"], "K and V are read once per query tile"),
    Mistake("io_ignores_bytes_per_number", "ex11_answer",
            "return bytes_per_number * seq_len * head_dim", "return seq_len * head_dim",
            BOTH["ex11"], "that is a count of numbers"),
    Mistake("io_tiles_by_integer_division", "ex11_answer",
            "query_tiles = math.ceil(seq_len / q_tile)", "query_tiles = seq_len // q_tile",
            BOTH["ex11"], "the last, shorter tile is read too"),
    # Visible cases divide (1024 / 128) and do not (1000 / 96): the +1 shows on the first.
    Mistake("io_tiles_one_too_many", "ex11_answer",
            "query_tiles = math.ceil(seq_len / q_tile)", "query_tiles = seq_len // q_tile + 1",
            BOTH["ex11"], "ceil(seq_len / q_tile), not seq_len // q_tile + 1", e2e=False),
    Mistake("io_tiles_counted_by_key_tiles", "ex11_answer",
            "query_tiles = math.ceil(seq_len / q_tile)", "query_tiles = math.ceil(seq_len / k_tile)",
            BOTH["ex11"], "not that of key tiles", e2e=False),
    Mistake("io_tiled_rereads_q_per_key_tile", "ex11_answer",
            "return bytes_per_number * seq_len * head_dim * (2 + 2 * query_tiles)",
            "return bytes_per_number * seq_len * head_dim * (1 + math.ceil(seq_len / k_tile) + 2 * query_tiles)",
            BOTH["ex11"], "Q is read once in all", e2e=False),
    Mistake("io_standard_constant_from_measurement", "ex11_answer",
            "return bytes_per_number * (4 * seq_len * seq_len + 4 * seq_len * head_dim)", "return 8912896",
            BOTH["ex11"], "the same number for every configuration is a value read off one case", e2e=False),
    # The tiles counted on a tensor (split gives the ragged last one): a measurement, which a prediction may not run.
    Mistake("io_tiles_counted_on_a_tensor", "ex11_answer",
            "query_tiles = math.ceil(seq_len / q_tile)", "query_tiles = len(torch.zeros(seq_len).split(q_tile))",
            BOTH["ex11"], "measuring instead of predicting", e2e=False),
]


# Graded end to end as well (the mistakes the issue names); all are checked in-process.
E2E = {
    "attention_fill_minus_1e9_guarded",
    "mha_inline_softmax_masked_row_uniform",
    "decoder_mask_top_left",
    "gqa_repeat_interleave_copies",
    "flash_running_sum_not_rescaled",
    "step_rope_without_offset",
    "step_after_pasted_rope_pairings_mixed",
    "pasted_rope_angles_in_bfloat16",
    "attention_shortcut",
}
