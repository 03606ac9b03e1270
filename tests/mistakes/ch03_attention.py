"""Chapter 3: common mistakes, each of which must lose points and get its own hint."""

from notebook_tools import Mistake

BOTH = {f"ex{k}": (f"ex{k}_visible", f"ex{k}_hidden") for k in range(1, 10)}

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
    # ---------------------------------------------------------------- 2: scaled dot-product attention
    Mistake("attention_no_scale", "ex2_answer",
            "scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])", "scores = q @ k.transpose(-2, -1)",
            BOTH["ex2"], "the scores were not scaled"),
    Mistake("attention_scaled_by_d_k", "ex2_answer",
            "/ math.sqrt(q.shape[-1])", "/ q.shape[-1]",
            BOTH["ex2"], "divided by d_k; divide by sqrt(d_k)"),
    Mistake("attention_softmax_wrong_axis", "ex2_answer",
            "weights = torch.softmax(scores, dim=-1)", "weights = torch.softmax(scores, dim=-2)",
            BOTH["ex2"], "the softmax ran over the queries"),
    Mistake("attention_mask_inverted", "ex2_answer",
            "scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)\n"
            "    weights = torch.softmax(scores, dim=-1)\n"
            "    if mask is not None:\n"
            "        weights = weights.masked_fill(~mask, 0.0)",
            "scores = scores.masked_fill(mask, torch.finfo(scores.dtype).min)\n"
            "    weights = torch.softmax(scores, dim=-1)\n"
            "    if mask is not None:\n"
            "        weights = weights.masked_fill(mask, 0.0)",
            BOTH["ex2"], "the mask is inverted"),
    Mistake("attention_fully_masked_row_nan", "ex2_answer",
            "scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)\n"
            "    weights = torch.softmax(scores, dim=-1)\n"
            "    if mask is not None:\n"
            "        weights = weights.masked_fill(~mask, 0.0)",
            "scores = scores.masked_fill(~mask, float(\"-inf\"))\n"
            "    weights = torch.softmax(scores, dim=-1)",
            BOTH["ex2"], "a fully masked row gives NaN"),
    Mistake("attention_fill_minus_1e9_no_guard", "ex2_answer",
            "scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)\n"
            "    weights = torch.softmax(scores, dim=-1)\n"
            "    if mask is not None:\n"
            "        weights = weights.masked_fill(~mask, 0.0)",
            "scores = scores.masked_fill(~mask, -1e9)\n"
            "    weights = torch.softmax(scores, dim=-1)",
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
    # ---------------------------------------------------------------- 3: masks
    Mistake("causal_mask_triu", "ex3_answer", ".tril().view(1, 1, seq_len, seq_len)",
            ".triu().view(1, 1, seq_len, seq_len)",
            BOTH["ex3"], "tril, not triu"),
    Mistake("causal_mask_no_diagonal", "ex3_answer", ".tril().view(1, 1, seq_len, seq_len)",
            ".tril(-1).view(1, 1, seq_len, seq_len)",
            BOTH["ex3"], "the diagonal is missing"),
    Mistake("padding_mask_masks_queries", "ex3_answer", "(ids != pad_id)[:, None, None, :]",
            "(ids != pad_id)[:, None, :, None]",
            BOTH["ex3"], "this masks queries, not keys"),
    # ---------------------------------------------------------------- 4: multi-head attention
    Mistake("mha_split_heads_without_transpose", "ex4_answer",
            "        q = self.q_proj(x_q).view(B, T_q, self.n_heads, self.d_head).transpose(1, 2)",
            "        q = self.q_proj(x_q).view(B, self.n_heads, T_q, self.d_head)",
            BOTH["ex4"], "the heads were split in the wrong order"),
    Mistake("mha_split_all_heads_without_transpose", "ex4_answer",
            "        q = self.q_proj(x_q).view(B, T_q, self.n_heads, self.d_head).transpose(1, 2)     # (B, n_heads, T_q, d_head)\n"
            "        k = self.k_proj(x_kv).view(B, T_kv, self.n_heads, self.d_head).transpose(1, 2)   # (B, n_heads, T_kv, d_head)\n"
            "        v = self.v_proj(x_kv).view(B, T_kv, self.n_heads, self.d_head).transpose(1, 2)",
            "        q = self.q_proj(x_q).view(B, self.n_heads, T_q, self.d_head)\n"
            "        k = self.k_proj(x_kv).view(B, self.n_heads, T_kv, self.d_head)\n"
            "        v = self.v_proj(x_kv).view(B, self.n_heads, T_kv, self.d_head)",
            BOTH["ex4"], "the heads were split in the wrong order"),
    Mistake("mha_merge_without_transpose", "ex4_answer",
            "out = out.transpose(1, 2).reshape(B, T_q, d_model)", "out = out.reshape(B, T_q, d_model)",
            BOTH["ex4"], "the heads were merged in the wrong order"),
    Mistake("mha_scaled_by_d_model", "ex4_answer",
            "        out, _ = scaled_dot_product_attention(q, k, v, mask)",
            "        scores = q @ k.transpose(-2, -1) / math.sqrt(d_model)\n"
            "        if mask is not None:\n"
            "            scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)\n"
            "        out = torch.softmax(scores, dim=-1) @ v",
            BOTH["ex4"], "divided by sqrt(d_model)"),
    Mistake("mha_cross_attention_keys_from_x_q", "ex4_answer",
            "        k = self.k_proj(x_kv).view(B, T_kv, self.n_heads, self.d_head).transpose(1, 2)   # (B, n_heads, T_kv, d_head)\n"
            "        v = self.v_proj(x_kv).view(B, T_kv, self.n_heads, self.d_head).transpose(1, 2)",
            "        k = self.k_proj(x_q).view(B, T_q, self.n_heads, self.d_head).transpose(1, 2)\n"
            "        v = self.v_proj(x_q).view(B, T_q, self.n_heads, self.d_head).transpose(1, 2)",
            BOTH["ex4"], "keys and values must come from x_kv"),
    Mistake("mha_ignores_mask", "ex4_answer",
            "out, _ = scaled_dot_product_attention(q, k, v, mask)", "out, _ = scaled_dot_product_attention(q, k, v)",
            BOTH["ex4"], "the mask was ignored"),
    # Everything but the attention is right: the hint must name the fully masked row, not the
    # head split or out_proj (the visible tests hold such a row).
    Mistake("mha_inline_softmax_masked_row_uniform", "ex4_answer",
            "        out, _ = scaled_dot_product_attention(q, k, v, mask)",
            "        scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_head)\n"
            "        if mask is not None:\n"
            "            scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)\n"
            "        out = torch.softmax(scores, dim=-1) @ v",
            BOTH["ex4"], "must get a zero output from that head"),
    Mistake("mha_shortcut_sdpa", "ex4_answer",
            "        out, _ = scaled_dot_product_attention(q, k, v, mask)",
            "        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)",
            BOTH["ex4"], "asks you to write MultiHeadAttention yourself"),
    # ---------------------------------------------------------------- 5: grouped-query attention
    Mistake("gqa_repeat_instead_of_repeat_interleave", "ex5_answer",
            "        k = k.repeat_interleave(group, dim=1)                                          # (B, n_heads, T, d_head)\n"
            "        v = v.repeat_interleave(group, dim=1)",
            "        k = k.repeat(1, group, 1, 1)\n"
            "        v = v.repeat(1, group, 1, 1)",
            BOTH["ex5"], "use repeat_interleave(group, dim=1)"),
    Mistake("gqa_no_divisibility_check", "ex5_answer",
            "if d_model % n_heads or n_heads % n_kv_heads:", "if d_model % n_heads:",
            BOTH["ex5"], "n_heads is not a multiple of n_kv_heads"),
    # ---------------------------------------------------------------- 6: sliding window
    Mistake("window_off_by_one", "ex6_answer", "(i - j < window)", "(i - j <= window)",
            BOTH["ex6"], "off by one"),
    Mistake("window_not_causal", "ex6_answer",
            "allowed = (j <= i) & ((i - j < window) | (j < n_global))",
            "allowed = ((i - j).abs() < window) | (j < n_global)",
            BOTH["ex6"], "the window looks back only"),
    Mistake("window_ignores_global_tokens", "ex6_answer",
            "allowed = (j <= i) & ((i - j < window) | (j < n_global))", "allowed = (j <= i) & (i - j < window)",
            BOTH["ex6"], "the first n_global keys are global"),
    # ---------------------------------------------------------------- 7: linear attention
    Mistake("linear_causal_without_prefix_sums", "ex7_answer",
            "    S = (k.unsqueeze(-1) * v.unsqueeze(-2)).cumsum(dim=-3)              # (..., T, d_k, d_v): prefix sums\n"
            "    z = k.cumsum(dim=-2)",
            "    S = (k.unsqueeze(-1) * v.unsqueeze(-2)).sum(dim=-3, keepdim=True)\n"
            "    z = k.sum(dim=-2, keepdim=True)",
            BOTH["ex7"], "keep prefix sums"),
    Mistake("linear_elu_without_plus_one", "ex7_answer",
            "q, k = F.elu(q) + 1, F.elu(k) + 1", "q, k = F.elu(q), F.elu(k)",
            BOTH["ex7"], "not elu(x)"),
    Mistake("linear_no_normaliser", "ex7_answer",
            "        return (q @ S) / (q * z).sum(dim=-1, keepdim=True)", "        return q @ S",
            BOTH["ex7"], "the normaliser is missing"),
    Mistake("linear_quadratic_matrix", "ex7_answer",
            "    if not causal:\n",
            "    a = q @ k.transpose(-2, -1)\n"
            "    if causal:\n"
            "        a = a * torch.ones(a.shape[-2:], dtype=torch.bool).tril()\n"
            "    return a @ v / a.sum(dim=-1, keepdim=True)\n"
            "    if not causal:\n",
            BOTH["ex7"], "never forms the (T, T) matrix"),
    # ---------------------------------------------------------------- 8: tiled attention
    Mistake("tiled_returns_float32_for_half_inputs", "ex8_answer",
            "    return acc / l\n", "    return acc.float() / l.float()\n",
            BOTH["ex8"], "cast the result back with .to(q.dtype)", e2e=False),
    Mistake("tiled_running_sum_not_rescaled", "ex8_answer",
            "l = l * correction + p.sum(dim=-1, keepdim=True)", "l = l + p.sum(dim=-1, keepdim=True)",
            BOTH["ex8"], "online softmax without rescaling the running sum"),
    Mistake("tiled_accumulator_not_rescaled", "ex8_answer",
            "acc = acc * correction + p @ v", "acc = acc + p @ v",
            BOTH["ex8"], "the accumulator was not rescaled"),
    Mistake("tiled_no_running_max", "ex8_answer",
            "        p = torch.exp(s - m_new)\n        correction = torch.exp(m - m_new)",
            "        p = torch.exp(s)\n        correction = torch.ones_like(m)",
            BOTH["ex8"], "subtract the running maximum"),
    Mistake("tiled_block_maximum_instead_of_running_maximum", "ex8_answer",
            "m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))", "m_new = s.amax(dim=-1, keepdim=True)",
            BOTH["ex8"], "only the current block's maximum"),
    Mistake("tiled_full_score_matrix", "ex8_answer",
            "    scale = 1 / math.sqrt(q.shape[-1])\n",
            "    scale = 1 / math.sqrt(q.shape[-1])\n"
            "    s = q @ k.transpose(-2, -1) * scale\n"
            "    p = torch.exp(s - s.amax(dim=-1, keepdim=True))\n"
            "    return (p / p.sum(dim=-1, keepdim=True)) @ v\n",
            BOTH["ex8"], "never to hold all T_q x T_k scores"),
    Mistake("tiled_shortcut_sdpa", "ex8_answer",
            "    scale = 1 / math.sqrt(q.shape[-1])\n",
            "    return F.scaled_dot_product_attention(q, k, v)\n",
            BOTH["ex8"], "asks you to write tiled attention"),
    # ---------------------------------------------------------------- 9: KV cache
    Mistake("kv_cache_keys_only", "ex9_answer", "return 2 * n_layers", "return n_layers",
            BOTH["ex9"], "keys and values: two tensors per layer"),
    Mistake("kv_cache_in_bits", "ex9_answer", "torch.empty((), dtype=dtype).element_size()",
            "torch.finfo(dtype).bits",
            BOTH["ex9"], "that is bits"),
    Mistake("kv_cache_fixed_two_bytes", "ex9_answer", "torch.empty((), dtype=dtype).element_size()", "2",
            BOTH["ex9"], "does not take 2 bytes per number"),
    # ---------------------------------------------------------------- found by review (issue 14)
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
    # A wrong exercise 2 answer also breaks the layers that call it: their hints must say so.
    Mistake("mha_after_attention_no_scale", "ex2_answer",
            "scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])", "scores = q @ k.transpose(-2, -1)",
            BOTH["ex4"] + BOTH["ex5"], "may call your scaled_dot_product_attention, which fails exercise 2's tests",
            e2e=False),
]


# Graded end to end as well (the mistakes the issue names); all are checked in-process.
E2E = {
    "attention_no_scale",
    "attention_scaled_by_d_k",
    "mha_scaled_by_d_model",
    "attention_softmax_wrong_axis",
    "attention_mask_inverted",
    "attention_fully_masked_row_nan",
    "mha_split_heads_without_transpose",
    "gqa_repeat_instead_of_repeat_interleave",
    "tiled_running_sum_not_rescaled",
    "attention_shortcut",
    "tiled_shortcut_sdpa",
}
