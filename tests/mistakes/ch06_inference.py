"""Chapter 6: common mistakes, each of which must lose points and get its own hint."""

from notebook_tools import Mistake, TwoMistakes

_COPY_ON_WRITE = (
    "        if start % self.block_size and self.ref_counts[table[-1]] > 1:       # a shared, partly filled last block\n"
    "            old = table[-1]\n"
    "            table[-1] = self.allocate()                                       # copy-on-write\n"
    "            self.k_pool[table[-1]] = self.k_pool[old]\n"
    "            self.v_pool[table[-1]] = self.v_pool[old]\n"
    "            self.ref_counts[old] -= 1\n")
_QUERY_POSITIONS = "queries = lengths[:, None] - T_q + torch.arange(T_q, device=q.device)"
_NO_FINAL_NORM = ("n_layers * (attention + ffn + 2 * one_norm) + one_norm + head",
                  "n_layers * (attention + ffn + 2 * one_norm) + head")
# The pasted grouped_query_attention splits the query heads as (group, n_kv_heads): chapter 3's own mistake.
from mistakes.ch03_attention import _GQA_HEADS_TILED  # noqa: E402

# The rolling cache (exercise 3): its RoPE lines, the position of each slot, and attend-then-write.
EX3 = ("ex3_visible", "ex3_hidden")
_ROPE = ("        q = apply_rope(q, new, self.rope_base)\n"
         "        k = apply_rope(k, new, self.rope_base)                              # kept after RoPE\n")
_HELD = "held = self.seen - 1 - (self.seen - 1 - slots) % W"
_WRITES = ("        kept = new[-W:]                                                     # the last min(T, W) positions\n"
           "        self.k[:, :, kept % W] = k[:, :, -W:]                               # attended first, written after\n"
           "        self.v[:, :, kept % W] = v[:, :, -W:]\n")
_ATTEND_THEN_WRITE = (
    "        keys = torch.cat((held, new))                                       # (W + T,) the positions of [ring ; new]\n"
    "        mask = (keys >= 0) & (keys <= new[:, None]) & (keys > new[:, None] - W)    # (T, W + T)\n"
    "        out = grouped_query_attention(q, torch.cat((self.k, k), dim=2), torch.cat((self.v, v), dim=2),\n"
    "                                      mask[None, None])\n"
    + _WRITES)

# Continuous batching: the retire loop, and the line that remembers who was running before the step.
_RETIRE = ("    for s, tokens in list(running.items()):\n"
           "        if tokens[-1] == eos_id or len(tokens) == max_new_tokens:\n"
           "            finished[s] = running.pop(s)\n"
           "            cache.free(s)\n")
_DECODING = "    decoding = list(running)                                           # those running before this step\n"

_TOP_P_BEFORE_T = ("        probs = torch.softmax(x, dim=-1)\n",
                   "        probs = torch.softmax(x * temperature, dim=-1)\n")

MISTAKES = [
    # ---------------------------------------------------------------- 1: processing logits
    Mistake("top_p_before_temperature", "ex1_answer", *_TOP_P_BEFORE_T,
            ("ex1_visible", "ex1_hidden"), "apply the temperature before top-p"),
    Mistake("top_p_drops_crossing_token", "ex1_answer", "remove_sorted = before >= top_p",
            "remove_sorted = sorted_p.cumsum(dim=-1) > top_p",
            ("ex1_visible", "ex1_hidden"), "the token that crosses top_p"),
    Mistake("top_p_softmax_overflows", "ex1_answer", "probs = torch.softmax(x, dim=-1)",
            "probs = x.exp() / x.exp().sum(dim=-1, keepdim=True)", ("ex1_visible", "ex1_hidden"), "Subtract each row's maximum"),
    Mistake("top_k_keeps_k_minus_one", "ex1_answer", "x.masked_fill(x < kth,", "x.masked_fill(x <= kth,",
            ("ex1_visible", "ex1_hidden"), "keep k tokens"),
    Mistake("penalty_always_divides", "ex1_answer",
            "torch.where(v > 0, v / repetition_penalty, v * repetition_penalty)", "v / repetition_penalty",
            ("ex1_visible", "ex1_hidden"), "dividing a negative logit"),
    Mistake("penalty_per_occurrence", "ex1_answer",
            "            seen = prev_tokens[b].unique()                        # each distinct token once\n"
            "            v = x[b, seen]\n"
            "            x[b, seen] = torch.where(v > 0, v / repetition_penalty, v * repetition_penalty)",
            "            for t in prev_tokens[b].tolist():\n"
            "                v = x[b, t]\n"
            "                x[b, t] = v / repetition_penalty if v > 0 else v * repetition_penalty",
            ("ex1_visible", "ex1_hidden"), "once, not once per occurrence"),
    # ---------------------------------------------------------------- 2: sampling
    Mistake("global_rng", "ex2_answer", "torch.multinomial(probs[b], 1, generator=g)",
            "torch.multinomial(probs[b], 1)", ("ex2_visible", "ex2_hidden"), "draw with the generator you are given"),
    # One generator for the whole batch: a request's token depends on the rows drawn before it.
    Mistake("one_generator_for_the_batch", "ex2_answer",
            "    draws = [torch.multinomial(probs[b], 1, generator=g) for b, g in enumerate(gens)]   # (1,) each\n"
            "    return torch.cat(draws)",
            "    return torch.multinomial(probs, 1, generator=gens[0]).squeeze(-1)",
            ("ex2_visible", "ex2_hidden"), "each row draws with its own"),
    Mistake("one_generator_row_by_row", "ex2_answer", "generator=g) for b, g in enumerate(gens)]",
            "generator=gens[0]) for b in range(len(probs))]", ("ex2_visible", "ex2_hidden"),
            "each row draws with its own"),
    Mistake("greedy_ignores_penalty", "ex2_answer",
            "x = process_logits(logits, 1.0, None, None, repetition_penalty, prev_tokens)\n        return",
            "x = logits\n        return", ("ex2_visible", "ex2_hidden"), "apply the repetition penalty before the argmax"),
    # ---------------------------------------------------------------- 3: a rolling KV cache (issue 28)
    # Chapter 3's attention pasted wrong: its own test names it, and the rolling cache's blames it.
    Mistake("pasted_gqa_heads_tiled", "ex3_tools_answer", *_GQA_HEADS_TILED, ("ex3_tools_visible",),
            "grouped as h % n_kv_heads"),
    Mistake("rolling_after_pasted_gqa_tiled", "ex3_tools_answer", *_GQA_HEADS_TILED, EX3,
            "RollingKVCache.step calls your grouped_query_attention from chapter 3", e2e=False),
    Mistake("rolling_window_one_wide", "ex3_answer", "(keys > new[:, None] - W)", "(keys >= new[:, None] - W)", EX3,
            "the window is (p - window, p]"),
    Mistake("rolling_own_key_hidden", "ex3_answer", "(keys <= new[:, None])", "(keys < new[:, None])", EX3,
            "a query sees its own key too"),
    Mistake("rolling_writes_before_attending", "ex3_answer", _ATTEND_THEN_WRITE,
            "        kept = new[-W:]\n"
            "        self.k[:, :, kept % W] = k[:, :, -W:]\n"
            "        self.v[:, :, kept % W] = v[:, :, -W:]\n"
            "        held = self.seen + T - 1 - (self.seen + T - 1 - slots) % W\n"
            "        mask = (held >= 0) & (held <= new[:, None]) & (held > new[:, None] - W)\n"
            "        out = grouped_query_attention(q, self.k, self.v, mask[None, None])\n", EX3,
            "attend before you write"),
    Mistake("rolling_rope_within_the_chunk", "ex3_answer", _ROPE,
            "        q = apply_rope(q, torch.arange(T, device=q.device), self.rope_base)\n"
            "        k = apply_rope(k, torch.arange(T, device=q.device), self.rope_base)\n", EX3,
            "not at 0, 1, ... within the chunk"),
    Mistake("rolling_rope_at_slots", "ex3_answer", _ROPE,
            "        q = apply_rope(q, new % W, self.rope_base)\n"
            "        k = apply_rope(k, new % W, self.rope_base)\n", EX3, "not its slot p % window"),
    Mistake("rolling_attends_empty_slots", "ex3_answer", "mask = (keys >= 0) & (keys <= new[:, None])",
            "mask = (keys <= new[:, None])", EX3, "hold no token yet"),
    Mistake("rolling_ring_taken_in_order", "ex3_answer", _HELD, "held = self.seen - W + slots", EX3,
            "the ring is not in the order of positions"),
    Mistake("rolling_keeps_first_keys", "ex3_answer", _WRITES,
            "        kept = new[:W]\n"
            "        self.k[:, :, kept % W] = k[:, :, :W]\n"
            "        self.v[:, :, kept % W] = v[:, :, :W]\n", EX3, "its last window keys"),
    Mistake("rolling_values_from_keys", "ex3_answer", "self.v[:, :, kept % W] = v[:, :, -W:]",
            "self.v[:, :, kept % W] = k[:, :, -W:]", EX3, "filled with the chunk's values v"),
    TwoMistakes("rolling_stores_keys_before_rope", "ex3_answer", "        k = apply_rope(k, new, self.rope_base)",
                "        k_rot = apply_rope(k, new, self.rope_base)", EX3, "store the keys after RoPE",
                cell2="ex3_answer", old2="torch.cat((self.k, k), dim=2)", new2="torch.cat((self.k, k_rot), dim=2)"),
    Mistake("rolling_chunk_sees_its_future", "ex3_answer", "(keys >= 0) & (keys <= new[:, None]) & ",
            "(keys >= 0) & ", EX3, "causal among themselves"),
    Mistake("rolling_mask_inverted", "ex3_answer", "mask[None, None])", "~mask[None, None])", EX3,
            "this one was inverted"),
    Mistake("rolling_slot_p", "ex3_answer", _WRITES,
            "        kept = new[-W:]\n"
            "        self.k[:, :, kept] = k[:, :, -W:]\n"
            "        self.v[:, :, kept] = v[:, :, -W:]\n", EX3, "goes to slot p % window"),
    Mistake("rolling_unbounded_cache", "ex3_answer", _WRITES,
            "        self.k = torch.cat((self.k, k), dim=2)\n"
            "        self.v = torch.cat((self.v, v), dim=2)\n", EX3, "never a longer tensor"),
    TwoMistakes("rolling_window_shifted", "ex3_answer", _WRITES,
                "        self.k = torch.cat((self.k, k), dim=2)[:, :, -W:]\n"
                "        self.v = torch.cat((self.v, v), dim=2)[:, :, -W:]\n", EX3, "not shifted",
                cell2="ex3_answer", old2=_HELD, new2="held = self.seen - W + slots"),
    Mistake("rolling_seen_counts_kept", "ex3_answer", "self.seen += T", "self.seen += min(T, W)", EX3,
            "not only those the ring keeps"),
    # ---------------------------------------------------------------- 4: batched generation
    Mistake("right_padding", "ex4_answer",
            "        ids[b, T0 - len(p):] = p                                                # left padding\n"
            "        mask[b, T0 - len(p):] = True\n",
            "        ids[b, :len(p)] = p\n        mask[b, :len(p)] = True\n",
            ("ex4_visible", "ex4_hidden"), "pad on the LEFT"),
    Mistake("pads_not_masked", "ex4_answer", "        mask[b, T0 - len(p):] = True\n",
            "        mask[b, :] = True\n", ("ex4_visible", "ex4_hidden"), "no token attends to a pad"),
    Mistake("positions_from_padded_column", "ex4_answer",
            "positions = (mask.long().cumsum(-1) - 1).clamp(min=0)",
            "positions = torch.arange(T0, device=device).expand(B, T0)",
            ("ex4_visible", "ex4_hidden"), "count from the first column of the padded batch"),
    Mistake("decode_positions_from_padded_length", "ex4_answer",
            "positions = (lengths + step)[:, None]",
            "positions = torch.full((B, 1), T0 + step, device=device)",
            ("ex4_visible", "ex4_hidden"), "not from the padded batch's first column"),
    Mistake("decode_positions_not_advanced", "ex4_answer",
            "positions = (lengths + step)[:, None]", "positions = lengths[:, None]",
            ("ex4_visible", "ex4_hidden"), "advance by one at every decode step"),
    Mistake("no_pad_after_eos", "ex4_answer",
            "        token = torch.where(done, torch.full_like(token, pad_id), token)          # finished rows: pad\n",
            "", ("ex4_visible", "ex4_hidden"), "write pad_id in its later places"),
    Mistake("never_stops_early", "ex4_answer", "        if bool(done.all()):\n            break\n", "",
            ("ex4_visible", "ex4_hidden"), "stop as soon as every row has produced eos_id"),
    Mistake("first_position_logits", "ex4_answer", "token = logits[:, -1].argmax(dim=-1)",
            "token = logits[:, 0].argmax(dim=-1)", ("ex4_visible", "ex4_hidden"), "logits at the LAST position"),
    Mistake("whole_sequence_with_cache", "ex4_answer", "        ids = token[:, None]                                                     # (B, 1)\n",
            "        ids = torch.cat((ids, token[:, None]), dim=1)\n", ("ex4_visible", "ex4_hidden"),
            "feed only the token each row just chose"),
    # ---------------------------------------------------------------- 5: beam search
    Mistake("beam_no_length_norm", "ex5_answer", "score / (len(tokens) - 1) ** length_penalty", "score",
            ("ex5_visible", "ex5_hidden"), "no length normalisation"),
    Mistake("beam_length_counts_bos", "ex5_answer", "score / (len(tokens) - 1) ** length_penalty",
            "score / len(tokens) ** length_penalty", ("ex5_visible", "ex5_hidden"), "not the bos token"),
    Mistake("beam_expands_finished", "ex5_answer", "(finished if token == eos_id else new_alive).append(hyp)",
            "new_alive.append(hyp)", ("ex5_visible", "ex5_hidden"), "move it out of the beam"),
    Mistake("beam_forgets_parent_score", "ex5_answer",
            "scores = torch.tensor([s for _, s in alive], dtype=torch.float64)[:, None] + logp", "scores = logp",
            ("ex5_visible", "ex5_hidden"), "its parent's score plus"),
    Mistake("beam_drops_alive_at_max_len", "ex5_answer",
            "    finished += alive                                             # reached max_len without eos\n", "",
            ("ex5_visible", "ex5_hidden"), "still alive count as finished"),
    # Conditions of the spec no case exercised before (issue 32, item 6).
    Mistake("beam_refills_after_eos", "ex5_answer",
            "        for score, index in zip(top.values.tolist(), top.indices.tolist()):\n",
            "        top = scores.flatten().topk(scores.numel())                # topped up past finished ones\n"
            "        for score, index in zip(top.values.tolist(), top.indices.tolist()):\n"
            "            if len(new_alive) == beam_size:\n"
            "                break\n",
            ("ex5_visible", "ex5_hidden"), "the beam shrinks, it is not topped up"),
    Mistake("beam_scores_each_hypothesis_alone", "ex5_answer",
            "logp = step_fn(torch.tensor([tokens for tokens, _ in alive])).double()      # (N, V)",
            "logp = torch.cat([step_fn(torch.tensor([tokens])) for tokens, _ in alive]).double()",
            ("ex5_visible", "ex5_hidden"), "in one call of step_fn"),
    Mistake("beam_never_stops_early", "ex5_answer", "        if not alive:\n            break\n", "",
            ("ex5_visible", "ex5_hidden"), "stop as soon as no hypothesis is alive"),
    # ---------------------------------------------------------------- 6: int8, per group
    Mistake("one_scale_per_tensor", "ex6_answer", "amax = wg.abs().amax(dim=-1)", "amax = wg.abs().amax()",
            ("ex6_visible", "ex6_hidden"), "not one for the whole tensor"),
    Mistake("one_scale_per_row", "ex6_answer", "amax = wg.abs().amax(dim=-1)",
            "amax = wg.abs().amax(dim=(1, 2))[:, None]", ("ex6_visible", "ex6_hidden"), "not one per row"),
    Mistake("groups_strided", "ex6_answer",
            "wg = w.float().reshape(out_features, in_features // group_size, group_size)",
            "wg = w.float().reshape(out_features, group_size, in_features // group_size).transpose(1, 2)",
            ("ex6_visible", "ex6_hidden"), "a group is group_size CONSECUTIVE columns"),
    Mistake("zero_group_zero_scale", "ex6_answer", "torch.where(amax > 0, amax / 127, torch.ones_like(amax))",
            "amax / 127", ("ex6_visible", "ex6_hidden"), "all-zero group gave a zero scale"),
    Mistake("scale_over_128", "ex6_answer", "torch.where(amax > 0, amax / 127,", "torch.where(amax > 0, amax / 128,",
            ("ex6_visible", "ex6_hidden"), "not 128"),
    Mistake("truncate_not_round", "ex6_answer", "q = torch.round(wg / scale[..., None])", "q = (wg / scale[..., None])",
            ("ex6_visible", "ex6_hidden"), "truncates toward zero"),
    Mistake("dequantize_tiles_scales", "ex6_answer", "scale.repeat_interleave(group_size, dim=1)",
            "scale.repeat(1, group_size)", ("ex6_visible", "ex6_hidden"), "repeat_interleave each scale, not repeat"),
    Mistake("int8_linear_ignores_group_size", "ex6_answer",
            "q, scale = quantize_int8(linear.weight.detach(), group_size)",
            "q, scale = quantize_int8(linear.weight.detach(), linear.weight.shape[1])",
            ("ex6_visible", "ex6_hidden"), "quantise with the layer's group_size"),
    Mistake("int8_linear_keeps_float_weight", "ex6_answer",
            '        self.register_buffer("scale", scale)',
            '        self.register_buffer("scale", scale)\n        self.weight = linear.weight',
            ("ex6_visible", "ex6_hidden"), "not the float weight as well"),
    # A float copy as a plain attribute is not in state_dict, but it is in memory (issue 32, item 3).
    Mistake("int8_linear_keeps_dequantised_copy", "ex6_answer",
            "        w = dequantize_int8(self.weight_int8, self.scale)          # (out, in) float32\n",
            "        if not hasattr(self, \"w_float\"):                          # dequantised once, then reused\n"
            "            self.w_float = dequantize_int8(self.weight_int8, self.scale)\n"
            "        w = self.w_float\n",
            ("ex6_visible", "ex6_hidden"), "found w_float (a plain attribute"),
    Mistake("int8_linear_float_attribute_in_init", "ex6_answer",
            '        self.register_buffer("scale", scale)                       # (out, in // group_size) float32\n',
            '        self.register_buffer("scale", scale)                       # (out, in // group_size) float32\n'
            '        self.cache = {"w": dequantize_int8(q, scale)}\n',
            ("ex6_visible", "ex6_hidden"), "found cache.w (a plain attribute"),
    # The bias kept as the float layer's own tensor: changing that layer later changes this one (issue 32).
    Mistake("int8_linear_bias_aliases_float_layer", "ex6_answer", "linear.bias.detach().clone())",
            "linear.bias.detach())", ("ex6_visible", "ex6_hidden"), "the bias is the float layer's own tensor"),
    Mistake("int8_linear_drops_bias", "ex6_answer", "return F.linear(x, w, self.bias)", "return F.linear(x, w)",
            ("ex6_visible", "ex6_hidden"), "add the layer's bias"),
    # ---------------------------------------------------------------- 7: memory
    Mistake("kv_prediction_measured", "ex7_answer", "return numbers * bytes_per_number",
            "k = torch.empty(batch_size, config[\"n_kv_heads\"], seq_len, d_head, device=\"meta\")\n"
            "    return 2 * config[\"n_layers\"] * k.numel() * bytes_per_number",
            ("ex7_visible", "ex7_hidden"), "measuring instead of predicting", e2e=False),
    # The number the notebook's measurement prints, returned whatever the configuration (issue 32).
    Mistake("kv_prediction_constant", "ex7_answer", "return numbers * bytes_per_number", "return 15_032_385_536",
            ("ex7_visible", "ex7_hidden"), "the case the notebook measures"),
    Mistake("kv_prediction_fixed_two_bytes", "ex7_answer", "return numbers * bytes_per_number",
            "return numbers * 2", ("ex7_visible", "ex7_hidden"), "use the argument, not a fixed 2"),
    Mistake("kv_projections_full_width", "ex7_answer", 'c["n_heads"], c["n_kv_heads"], c["d_ff"]',
            'c["n_heads"], c["n_heads"], c["d_ff"]', ("ex7_visible", "ex7_hidden"),
            "grouped-query attention shrinks them"),
    # Chapter 4's counter defaults to tied=True: a configuration's untied head is then left out.
    Mistake("head_counted_when_tied", "ex7_answer", ', tied=c["tie_embeddings"])', ")",
            ("ex7_visible", "ex7_hidden"), "count it once"),
    Mistake("mlp_two_matrices", "ex7_answer", "gated=True, bias=False", "gated=False, bias=False",
            ("ex7_visible", "ex7_hidden"), "three matrices"),
    Mistake("qkv_biases_forgotten", "ex7_answer",
            '    if c["qkv_bias"]:                                # Qwen2: biases on q_proj, k_proj and v_proj only\n',
            "    if False:\n", ("ex7_visible", "ex7_hidden"), "add those three biases in every layer"),
    Mistake("qkv_biases_full_width", "ex7_answer", '(c["d_model"] + 2 * c["n_kv_heads"] * d_head)',
            '3 * c["d_model"]', ("ex7_visible", "ex7_hidden"), "grouped-query attention shrinks them too"),
    TwoMistakes("qkv_biases_from_chapter_4_bias", "ex7_answer", 'gated=True, bias=False,',
                'gated=True, bias=c["qkv_bias"],', ("ex7_visible", "ex7_hidden"),
                "chapter 4's bias=True puts one on every linear layer", cell2="ex7_answer",
                old2='    if c["qkv_bias"]:', new2='    if False:'),
    # The pasted chapter 4 counter forgets the final norm: chapter 4's test says so, and exercise 7 sends the
    # learner back to it.
    Mistake("norms_forgotten", "ex7_tools_answer", *_NO_FINAL_NORM, ("ex7_tools_visible",),
            "the final norm after the last block is missing"),
    Mistake("config_count_after_pasted_counter_wrong", "ex7_tools_answer", *_NO_FINAL_NORM, ("ex7_visible",),
            "count_config_params calls your count_params from chapter 4, which fails that chapter's tests "
            "(exercise 7): fix that exercise first", e2e=False),
    Mistake("kv_cache_keys_only", "ex7_answer", 'per_token = 2 * config["n_layers"]', 'per_token = config["n_layers"]',
            ("ex7_visible", "ex7_hidden"), "keys and values"),
    Mistake("kv_cache_all_heads", "ex7_answer", 'config["n_kv_heads"] * d_head * torch.empty',
            'config["n_heads"] * d_head * torch.empty', ("ex7_visible", "ex7_hidden"), "not n_heads"),
    Mistake("kv_dtype_ignored", "ex7_answer", "kv_dtype = weight_dtype if kv_dtype is None else kv_dtype",
            "kv_dtype = weight_dtype", ("ex7_visible", "ex7_hidden"), "uses kv_dtype"),
    Mistake("kv_cache_one_sequence", "ex7_answer", "per_token * seq_len * batch_size", "per_token * seq_len",
            ("ex7_visible", "ex7_hidden"), "multiply the KV part by batch_size"),
    Mistake("kv_prediction_query_heads", "ex7_answer", 'config["n_kv_heads"] * d_head * seq_len',
            'config["n_heads"] * d_head * seq_len', ("ex7_visible", "ex7_hidden"), "not the n_heads query heads"),
    Mistake("kv_prediction_keys_only", "ex7_answer", 'numbers = 2 * config["n_layers"]',
            'numbers = config["n_layers"]', ("ex7_visible", "ex7_hidden"), "a key AND a value"),
    Mistake("kv_prediction_one_sequence", "ex7_answer", "* seq_len * batch_size   # keys and values",
            "* seq_len", ("ex7_visible", "ex7_hidden"), "multiply by the batch size"),
    Mistake("kv_prediction_in_gib", "ex7_answer", "return numbers * bytes_per_number",
            "return numbers * bytes_per_number / 2**30", ("ex7_visible", "ex7_hidden"), "in bytes, not GiB"),
    # ---------------------------------------------------------------- 8: speculative decoding
    Mistake("acceptance_ratio_inverted", "ex8_answer",
            "ratio = target_probs[rows, j, x] / draft_probs[rows, j, x]",
            "ratio = draft_probs[rows, j, x] / target_probs[rows, j, x]",
            ("ex8_visible", "ex8_hidden"), "ratio is inverted"),
    Mistake("accept_only_when_target_higher", "ex8_answer", "accepting & (u < ratio)", "accepting & (ratio >= 1)",
            ("ex8_visible", "ex8_hidden"), "do not accept only when"),
    Mistake("residual_is_target", "ex8_answer", "probs = residual / residual.sum(dim=-1, keepdim=True)",
            "probs = target_probs[rows, n_accepted]", ("ex8_visible", "ex8_hidden"),
            "sample the replacement from max(0, p_j - q_j)"),
    Mistake("bonus_from_last_draft_position", "ex8_answer",
            "residual = (target_probs[rows, n_accepted] - q_padded[rows, n_accepted]).clamp(min=0)",
            "last = n_accepted.clamp(max=k - 1)\n"
            "    residual = (target_probs[rows, last] - q_padded[rows, n_accepted]).clamp(min=0)",
            ("ex8_visible", "ex8_hidden"), "target_probs[:, k]"),
    Mistake("speculative_global_rng", "ex8_answer", "u = torch.rand(B, generator=generator)", "u = torch.rand(B)",
            ("ex8_visible", "ex8_hidden"), "draw every uniform and every sample from the generator"),
    # Inputs the function must not change (issue 32, item 6): a residual computed in place.
    Mistake("speculative_residual_in_place", "ex8_answer",
            "residual = (target_probs[rows, n_accepted] - q_padded[rows, n_accepted]).clamp(min=0)",
            "target_probs[rows, n_accepted] = (target_probs[rows, n_accepted]"
            " - q_padded[rows, n_accepted]).clamp(min=0)\n"
            "    residual = target_probs[rows, n_accepted]",
            ("ex8_visible", "ex8_hidden"), "leave the inputs as they are"),
    Mistake("expected_tokens_off_by_one", "ex8_answer", "(1 - alpha ** (k + 1))", "(1 - alpha ** k)",
            ("ex8_visible", "ex8_hidden"), "numerator is 1 - a^(k+1)"),
    # ---------------------------------------------------------------- 9: a paged KV cache (issue 28)
    # Chapter 3's attention (pasted in exercise 3) wrong: paged_attention's test blames it.
    Mistake("paged_attention_after_pasted_gqa_tiled", "ex3_tools_answer", *_GQA_HEADS_TILED,
            ("ex9_visible", "ex9_hidden"), "paged_attention calls your grouped_query_attention from chapter 3",
            e2e=False),
    Mistake("paged_block_at_boundary", "ex9_answer", "while len(table) * self.block_size < start + len(k):",
            "while len(table) * self.block_size <= start + len(k):", ("ex9_visible", "ex9_hidden"),
            "off by one in allocation"),
    Mistake("paged_new_block_per_append", "ex9_answer",
            "        while len(table) * self.block_size < start + len(k):\n"
            "            table.append(self.allocate())\n",
            "        table += [self.allocate() for _ in range(-(-len(k) // self.block_size))]\n",
            ("ex9_visible", "ex9_hidden"), "fills the free slots of the sequence's last block"),
    Mistake("paged_no_copy_on_write", "ex9_answer", _COPY_ON_WRITE, "", ("ex9_visible", "ex9_hidden"),
            "copy-on-write: before an append writes into a last block"),
    Mistake("paged_copy_keeps_old_count", "ex9_answer", "            self.ref_counts[old] -= 1\n", "",
            ("ex9_visible", "ex9_hidden"), "no longer holds the old one"),
    Mistake("paged_copy_forgets_values", "ex9_answer", "            self.v_pool[table[-1]] = self.v_pool[old]\n", "",
            ("ex9_visible", "ex9_hidden"), "the keys are right but not the values"),
    Mistake("paged_free_ignores_count", "ex9_answer",
            "        for block in self.block_tables.pop(seq_id):\n"
            "            self.ref_counts[block] -= 1\n"
            "            if self.ref_counts[block] == 0:\n"
            "                self.free_blocks.append(block)\n",
            "        self.free_blocks += self.block_tables.pop(seq_id)\n",
            ("ex9_visible", "ex9_hidden"), "free gives a block back to the pool only when no other sequence"),
    Mistake("paged_fork_copies_blocks", "ex9_answer",
            "        self.block_tables[child_id] = list(self.block_tables[parent_id])\n"
            "        for block in self.block_tables[child_id]:\n"
            "            self.ref_counts[block] += 1\n",
            "        self.block_tables[child_id] = []\n"
            "        for block in self.block_tables[parent_id]:\n"
            "            new = self.allocate()\n"
            "            self.k_pool[new], self.v_pool[new] = self.k_pool[block], self.v_pool[block]\n"
            "            self.block_tables[child_id].append(new)\n",
            ("ex9_visible", "ex9_hidden"), "fork shares the parent's blocks"),
    Mistake("paged_fork_aliases_table", "ex9_answer",
            "self.block_tables[child_id] = list(self.block_tables[parent_id])",
            "self.block_tables[child_id] = self.block_tables[parent_id]",
            ("ex9_visible", "ex9_hidden"), "a list of its own"),
    Mistake("paged_no_runtime_error", "ex9_answer",
            "        if not self.free_blocks:\n            raise RuntimeError(\"the pool has no free block\")\n", "",
            ("ex9_visible", "ex9_hidden"), "when no block is free, append raises RuntimeError"),
    Mistake("paged_blocks_in_id_order", "ex9_answer", "    k = k_pool[block_tables].flatten(1, 2)",
            "    block_tables = block_tables.sort(dim=-1).values\n    k = k_pool[block_tables].flatten(1, 2)",
            ("ex9_visible", "ex9_hidden"), "in the order of its table row"),
    Mistake("paged_heads_reshaped", "ex9_answer",
            "    k = k_pool[block_tables].flatten(1, 2).transpose(1, 2)           # (B, n_kv_heads, max_blocks * block_size, d_head)\n"
            "    v = v_pool[block_tables].flatten(1, 2).transpose(1, 2)\n",
            "    k = k_pool[block_tables].reshape(B, k_pool.shape[2], -1, k_pool.shape[3])\n"
            "    v = v_pool[block_tables].reshape(B, v_pool.shape[2], -1, v_pool.shape[3])\n",
            ("ex9_visible", "ex9_hidden"), "heads and positions got mixed"),
    Mistake("paged_attends_past_length", "ex9_answer", _QUERY_POSITIONS,
            "queries = (k.shape[2] - T_q + torch.arange(T_q, device=q.device)).expand(B, T_q)",
            ("ex9_visible", "ex9_hidden"), "the keys past lengths[b] were attended"),
    Mistake("paged_lengths_without_new_tokens", "ex9_answer", _QUERY_POSITIONS,
            "queries = lengths[:, None] + torch.arange(T_q, device=q.device)",
            ("ex9_visible", "ex9_hidden"), "lengths[b] counts the new tokens too"),
    Mistake("paged_mask_strict", "ex9_answer", "mask = keys[None, None, :] <= queries[:, :, None]",
            "mask = keys[None, None, :] < queries[:, :, None]", ("ex9_visible", "ex9_hidden"),
            "a query sees its own key"),
    Mistake("paged_values_from_key_pool", "ex9_answer", "    v = v_pool[block_tables]", "    v = k_pool[block_tables]",
            ("ex9_visible", "ex9_hidden"), "the values come from v_pool"),
    Mistake("paged_new_queries_see_each_other", "ex9_answer", "mask = keys[None, None, :] <= queries[:, :, None]",
            "mask = (keys[None, :] < lengths[:, None])[:, None, :].expand(B, T_q, -1)",
            ("ex9_visible", "ex9_hidden"), "causal among themselves"),
    Mistake("paged_mask_top_left", "ex9_answer", _QUERY_POSITIONS,
            "queries = torch.arange(T_q, device=q.device).expand(B, T_q)", ("ex9_visible", "ex9_hidden"),
            "aligned top-left"),
    # ---------------------------------------------------------------- 10: continuous batching
    TwoMistakes("batching_lifo", "ex10_answer", "        seq_id, prompt = waiting[0]\n",
                "        seq_id, prompt = waiting[-1]\n", ("ex10_visible", "ex10_hidden"),
                "first come, first served: admit from the front",
                cell2="ex10_answer", old2="        waiting.pop(0)\n", new2="        waiting.pop()\n"),
    TwoMistakes("batching_later_request_overtakes", "ex10_answer",
                "    while waiting and len(running) < max_batch:\n        seq_id, prompt = waiting[0]\n",
                "    for seq_id, prompt in list(waiting):\n        if len(running) == max_batch:\n            break\n",
                ("ex10_visible", "ex10_hidden"), "does not overtake", cell2="ex10_answer",
                old2="            break                                                      # first come, first served: "
                     "the rest wait\n        waiting.pop(0)\n",
                new2="            continue                                                   # a later one may fit\n"
                     "        waiting = [w for w in waiting if w[0] != seq_id]\n"),
    Mistake("batching_no_blocks_promised", "ex10_answer", "> cache.num_free_blocks() - promised:",
            "> cache.num_free_blocks():", ("ex10_visible", "ex10_hidden"), "promised to it"),
    Mistake("batching_promised_counts_held_blocks", "ex10_answer", " - len(cache.block_tables[s])\n", "\n",
            ("ex10_visible", "ex10_hidden"), "holds already"),
    Mistake("batching_reserves_the_last_token", "ex10_answer", "blocks(len(prompt) + max_new_tokens - 1)",
            "blocks(len(prompt) + max_new_tokens)", ("ex10_visible", "ex10_hidden"), "never fed back"),
    Mistake("batching_never_frees", "ex10_answer", "            cache.free(s)\n", "", ("ex10_visible", "ex10_hidden"),
            "gives its blocks back"),
    # Retires what ended in the last step at the start of the next one.
    TwoMistakes("batching_retires_a_step_late", "ex10_answer", _DECODING, _RETIRE + _DECODING,
                ("ex10_visible", "ex10_hidden"), "leaves in the same step",
                cell2="ex10_answer", old2=_RETIRE + "    return", new2="    return"),
    Mistake("batching_drops_eos", "ex10_answer", "finished[s] = running.pop(s)\n",
            "finished[s] = running.pop(s)[:-1] if tokens[-1] == eos_id else running.pop(s)\n",
            ("ex10_visible", "ex10_hidden"), "the end token is part of the output"),
    Mistake("batching_emits_after_eos", "ex10_answer", "if tokens[-1] == eos_id or len(tokens) == max_new_tokens:",
            "if len(tokens) == max_new_tokens:", ("ex10_visible", "ex10_hidden"), "stops at eos_id"),
    Mistake("batching_one_over_max_batch", "ex10_answer", "while waiting and len(running) < max_batch:",
            "while waiting and len(running) <= max_batch:", ("ex10_visible", "ex10_hidden"), "at most max_batch"),
    Mistake("batching_finished_stay_running", "ex10_answer", "            finished[s] = running.pop(s)\n",
            "            finished[s] = tokens\n", ("ex10_visible", "ex10_hidden"), "leaves running"),
    Mistake("batching_one_decode_call_per_sequence", "ex10_answer",
            "        for s, token in zip(decoding, forward(decoding, last).argmax(dim=-1).tolist()):\n"
            "            running[s].append(token)\n",
            "        for b, s in enumerate(decoding):\n"
            "            running[s].append(int(forward([s], last[b:b + 1]).argmax()))\n",
            ("ex10_visible", "ex10_hidden"), "one batched call"),
    TwoMistakes("batching_decodes_the_admitted", "ex10_answer", _DECODING, "", ("ex10_visible", "ex10_hidden"),
                "from its prefill already", cell2="ex10_answer", old2="    if decoding:\n",
                new2="    decoding = list(running)\n    if decoding:\n"),
    Mistake("batching_frees_before_the_last_token", "ex10_answer", "    if decoding:\n        last",
            "    for s in decoding:\n"
            "        if len(running[s]) + 1 == max_new_tokens:                      # its blocks are not needed\n"
            "            cache.free(s)\n"
            "    if decoding:\n        last", ("ex10_visible", "ex10_hidden"), "fed at position 0"),
    Mistake("batching_position_one_past", "ex10_answer", "[cache.lengths.get(s, 0) for s in seq_ids]",
            "[cache.lengths[s] + 1 if s in cache.lengths else 0 for s in seq_ids]", ("ex10_visible", "ex10_hidden"),
            "sits at position cache.lengths[s]"),
    TwoMistakes("batching_table_rows_sorted", "ex10_answer", "for s in seq_ids],\n                              device",
                "for s in sorted(seq_ids)],\n                              device", ("ex10_visible", "ex10_hidden"),
                "row b of block_tables", cell2="ex10_answer",
                old2="lengths = torch.tensor([cache.lengths[s] for s in seq_ids]",
                new2="lengths = torch.tensor([cache.lengths[s] for s in sorted(seq_ids)]"),
    Mistake("batching_prefill_under_slot_number", "ex10_answer", "forward([seq_id], prompt[None]",
            "forward([len(running)], prompt[None]", ("ex10_visible", "ex10_hidden"), "under its own seq_id"),
    # Exercise 9's attention is wrong: the scheduler's tokens differ, and the hint sends the learner back there.
    Mistake("batching_after_paged_mask_strict", "ex9_answer", "mask = keys[None, None, :] <= queries[:, :, None]",
            "mask = keys[None, None, :] < queries[:, :, None]", ("ex10_visible",),
            "batch_step calls your paged_attention (exercise 9), which fails its tests: fix that exercise first. "
            "Its test says: off by one: a query sees its own key", e2e=False),
    # ---------------------------------------------------------------- found by honest attempts
    Mistake("sampling_after_process_logits_in_place", "ex1_answer", "x = logits.clone()", "x = logits",
            ("ex2_visible",), "sample_next_token calls your process_logits, which fails exercise 1's tests"),
    Mistake("kv_bytes_fixed_at_two", "ex7_answer", "d_head * torch.empty((), dtype=kv_dtype).element_size()",
            "d_head * 2", ("ex7_visible", "ex7_hidden"), "not a fixed 2"),
    Mistake("speculative_one_uniform_per_row", "ex8_answer",
            "    for j in range(k):\n        x = draft_tokens[:, j]                                # (B,)\n"
            "        ratio = target_probs[rows, j, x] / draft_probs[rows, j, x]\n"
            "        u = torch.rand(B, generator=generator)\n",
            "    u = torch.rand(B, generator=generator)\n"
            "    for j in range(k):\n        x = draft_tokens[:, j]                                # (B,)\n"
            "        ratio = target_probs[rows, j, x] / draft_probs[rows, j, x]\n",
            ("ex8_visible", "ex8_hidden"), "draw a fresh uniform for each position"),
    Mistake("speculative_counts_every_acceptance", "ex8_answer", "accepting = accepting & (u < ratio)",
            "accepting = u < ratio", ("ex8_visible", "ex8_hidden"), "stop at the first rejection"),
    Mistake("speculative_always_first_draft", "ex8_answer", "x = draft_tokens[:, j]", "x = draft_tokens[:, 0]",
            ("ex8_visible", "ex8_hidden"), "every position has its own test"),
    Mistake("int8_scale_plain_attribute", "ex6_answer", 'self.register_buffer("scale", scale)',
            "self.scale = scale", ("ex6_visible", "ex6_hidden"), "a buffer moves with .to(device)"),
    Mistake("quantize_in_the_weight_dtype", "ex6_answer", "wg = w.float().reshape(", "wg = w.reshape(",
            ("ex6_visible", "ex6_hidden"), "compute in float32 (w.float())"),
    Mistake("generated_tokens_int32", "ex4_answer",
            "out = torch.full((B, max_new_tokens), pad_id, dtype=torch.long, device=device)",
            "out = torch.full((B, max_new_tokens), pad_id, dtype=torch.int32, device=device)",
            ("ex4_visible", "ex4_hidden"), "token ids are int64, like the prompts"),
    Mistake("top_k_breaks_ties", "ex1_answer",
            "        kth = x.topk(top_k, dim=-1).values[:, -1:]                # (B, 1): the k-th largest\n"
            "        x = x.masked_fill(x < kth, float(\"-inf\"))",
            "        idx = x.topk(top_k, dim=-1).indices\n"
            "        drop = torch.ones_like(x, dtype=torch.bool).scatter(-1, idx, False)\n"
            "        x = x.masked_fill(drop, float(\"-inf\"))",
            ("ex1_visible",), "tokens tied with the k-th largest logit stay"),
]

# Graded end to end through the real autograder (each costs a kernel run in CI; the first in MISTAKES order is the
# one graded): the float copy kept as a plain attribute, whose check runs a hook of the grader's in the kernel.
E2E = {"int8_linear_keeps_dequantised_copy"}
