"""Chapter 2: common mistakes, each of which must lose points and get its own hint."""

from notebook_tools import Mistake, TwoMistakes

EX1 = ("ex1_visible", "ex1_hidden")
EX2 = ("ex2_visible", "ex2_hidden")
EX3 = ("ex3_visible", "ex3_hidden")
EX4 = ("ex4_visible", "ex4_hidden")
EX5 = ("ex5_visible", "ex5_hidden")
EX6 = ("ex6_visible", "ex6_hidden")
EX7 = ("ex7_visible", "ex7_hidden")
EX8 = ("ex8_visible", "ex8_hidden")
EX9 = ("ex9_visible", "ex9_hidden")
EX10 = ("ex10_visible", "ex10_hidden")

MISTAKES = [
    # 1: the equivariance test
    Mistake("invariance_not_equivariance", "ex1_answer",
            "torch.allclose(fn(x[:, perm]), fn(x)[:, perm], atol=atol)",
            "torch.allclose(fn(x[:, perm]), fn(x), atol=atol)",
            EX1, "tests invariance"),
    Mistake("inverse_permutation_on_output", "ex1_answer",
            "fn(x)[:, perm], atol=atol)",
            "fn(x)[:, torch.argsort(perm)], atol=atol)",
            EX1, "inverse permutation"),
    Mistake("exact_equality", "ex1_answer",
            "return torch.allclose(fn(x[:, perm]), fn(x)[:, perm], atol=atol)",
            "return torch.equal(fn(x[:, perm]), fn(x)[:, perm])",
            EX1, "exact equality fails on rounding"),
    Mistake("permute_batch_axis", "ex1_answer",
            "fn(x[:, perm]), fn(x)[:, perm]",
            "fn(x[perm]), fn(x)[perm]",
            EX1, "dimension 1 of x"),
    # 2: the sinusoidal table
    Mistake("sin_cos_swapped", "ex2_answer",
            "pe[:, 0::2] = torch.sin(pos * freq)\n    pe[:, 1::2] = torch.cos(pos * freq)",
            "pe[:, 0::2] = torch.cos(pos * freq)\n    pe[:, 1::2] = torch.sin(pos * freq)",
            EX2, "sin and cos are swapped"),
    Mistake("positions_from_one", "ex2_answer",
            "pos = torch.arange(seq_len, dtype=work)",
            "pos = torch.arange(1, seq_len + 1, dtype=work)",
            EX2, "positions start at 0"),
    Mistake("exponent_i_instead_of_2i", "ex2_answer",
            "freq = torch.exp(torch.arange(0, d_model, 2, dtype=work) * (-math.log(base) / d_model))",
            "freq = torch.exp(torch.arange(d_model // 2, dtype=work) * (-math.log(base) / d_model))",
            EX2, "is 2i/d_model"),
    Mistake("sines_then_cosines", "ex2_answer",
            "    pe = torch.zeros(seq_len, d_model, dtype=work)\n    pe[:, 0::2] = torch.sin(pos * freq)\n"
            "    pe[:, 1::2] = torch.cos(pos * freq)\n    return pe.to(dtype)",
            "    return torch.cat((torch.sin(pos * freq), torch.cos(pos * freq)), dim=-1).to(dtype)",
            EX2, "interleave the columns"),
    # A fallback names the input that broke: here a base other than the default.
    Mistake("sinusoidal_base_ignored", "ex2_answer",
            "* (-math.log(base) / d_model))", "* (-math.log(10000.0) / d_model))",
            EX2, "the answer matches base 10000", e2e=False),
    # The float64 cases (one visible) show it: computed in float32, then converted.
    Mistake("sinusoidal_float32_then_cast", "ex2_answer",
            "work = torch.float64", "work = torch.float32",
            EX2, "computed in float32 and then converted", e2e=False),
    # Everything in the dtype asked for: right in float32 and float64, far off in float16 (a
    # visible case) and bfloat16; the hint must say to compute in float64 and cast at the end.
    Mistake("sinusoidal_built_in_float16", "ex2_answer",
            "work = torch.float64", "work = dtype",
            EX2, "the table was computed in torch.float16", e2e=False),
    # 3: shifting encodings
    Mistake("shift_turns_wrong_way", "ex3_answer",
            "    new_s = s * cos_b + c * sin_b                                                      # sin(a + b)\n"
            "    new_c = c * cos_b - s * sin_b",
            "    new_s = s * cos_b - c * sin_b\n    new_c = c * cos_b + s * sin_b",
            EX3, "every pair turns the wrong way"),
    # The rotation is right (every k >= 0 passes); only negative offsets fail, and the hint must
    # say that the sign of k was lost, never blame the rotation.
    Mistake("shift_abs_k", "ex3_answer",
            "angle = k.to(pe.dtype)[..., None, None] * freq", "angle = k.to(pe.dtype).abs()[..., None, None] * freq",
            EX3, "the rotation itself is right; keep the sign of k"),
    Mistake("shift_written_back_as_halves", "ex3_answer",
            "return torch.stack((new_s, new_c), dim=-1).flatten(-2)", "return torch.cat((new_s, new_c), dim=-1)",
            EX3, "written back as all sines then all cosines"),
    Mistake("shift_angles_in_float32", "ex3_answer",
            "    angle = k.to(pe.dtype)[..., None, None] * freq",
            "    angle = (k.float()[..., None, None] * freq.float()).to(pe.dtype)",
            EX3, "computed the angles in float32", e2e=False),
    # One offset per sequence with a single trailing axis: its sequence axis meets pe's T axis (an
    # error on most shapes); the message must say so, not only show the broadcasting error.
    Mistake("shift_offset_one_trailing_axis", "ex3_answer",
            "angle = k.to(pe.dtype)[..., None, None] * freq", "angle = k.to(pe.dtype)[..., None] * freq",
            EX3, "with one trailing axis (k[..., None])", e2e=False),
    # k indexed as a batch of offsets, k[:, None, None]: right for one batch axis, raises IndexError on a 0-d k
    # (pe of shape (T, d_model), a visible case); the message must say that k may be 0-d.
    Mistake("shift_k_indexed_with_colon", "ex3_answer",
            "angle = k.to(pe.dtype)[..., None, None] * freq", "angle = k.to(pe.dtype)[:, None, None] * freq",
            EX3, "k may be 0-d", e2e=False),
    Mistake("shift_base_ignored", "ex3_answer",
            "* (-math.log(base) / d_model))", "* (-math.log(10000.0) / d_model))",
            EX3, "the answer matches base 10000", e2e=False),
    # 4: learned positions after a cache
    Mistake("learned_offset_ignored", "ex4_answer",
            "return x + self.weight[offset:offset + T]", "return x + self.weight[:T]",
            EX4, "the offset was ignored"),
    Mistake("length_check_without_offset", "ex4_answer", "if offset + T > self.max_len:", "if T > self.max_len:",
            EX4, "the length check must include the offset"),
    Mistake("length_check_off_by_one", "ex4_answer", "if offset + T > self.max_len:", "if offset + T >= self.max_len:",
            EX4, "raise only when offset + T > max_len"),
    Mistake("no_length_check", "ex4_answer",
            "        if offset + T > self.max_len:\n"
            "            raise ValueError(f\"positions up to {offset + T} exceed max_len {self.max_len}\")\n",
            "",
            EX4, "check the length yourself"),
    Mistake("length_error_without_numbers", "ex4_answer",
            'raise ValueError(f"positions up to {offset + T} exceed max_len {self.max_len}")',
            'raise ValueError("sequence too long")',
            EX4, "name both numbers"),
    Mistake("learned_positions_detached", "ex4_answer",
            "        return x + self.weight[offset:offset + T]", "        return x + self.weight[offset:offset + T].detach()",
            EX4, "do not detach or copy the table in forward", e2e=False),
    # 5: RoPE on (B, n_heads, T, d_head)
    Mistake("rope_positions_rows_meet_heads", "ex5_answer",
            "    if angles.dim() == 3:\n        angles = angles[:, None]                                                  # (B, 1, T, d_head)\n",
            "",
            EX5, "row b rotated head b"),
    # Both dtype policies are taught by a visible case (bfloat16 at positions 1500+, float64).
    Mistake("rope_angles_in_bfloat16", "ex5_answer",
            "    work = torch.float64 if x.dtype == torch.float64 else torch.float32",
            "    work = x.dtype",
            EX5, "the angles were computed in bfloat16"),
    Mistake("rope_angles_always_float32", "ex5_answer",
            "    work = torch.float64 if x.dtype == torch.float64 else torch.float32",
            "    work = torch.float32",
            EX5, "compute the frequencies and angles in float64", e2e=False),
    # Only the hidden tests use fractional positions; the hint must say that they were rounded.
    Mistake("rope_positions_rounded", "ex5_answer",
            "angles = positions.to(device=x.device, dtype=work)[..., None]",
            "angles = positions.long().to(device=x.device, dtype=work)[..., None]",
            ("ex5_hidden",), "the positions here are fractional", e2e=False),
    Mistake("rope_pairings_mixed", "ex5_answer",
            "angles = torch.cat((angles, angles), dim=-1)",
            "angles = angles.repeat_interleave(2, dim=-1)",
            EX5, "pairings are mixed"),
    Mistake("rotate_half_wrong_sign", "ex5_answer",
            "return torch.cat((-x2, x1), dim=-1)",
            "return torch.cat((x2, -x1), dim=-1)",
            EX5, "cat(-x2, x1)"),
    Mistake("rope_exponent_j_over_d", "ex5_answer",
            "return torch.exp(torch.arange(0, d_head, 2, dtype=dtype) * (-math.log(base) / d_head))",
            "return torch.exp(torch.arange(d_head // 2, dtype=dtype) * (-math.log(base) / d_head))",
            EX5, "is 2j/d_head"),
    Mistake("rope_frequencies_ignore_dtype", "ex5_answer",
            "return torch.exp(torch.arange(0, d_head, 2, dtype=dtype) * (-math.log(base) / d_head))",
            "return torch.exp(torch.arange(0, d_head, 2, dtype=torch.float32) * (-math.log(base) / d_head)).to(dtype)",
            ("ex5_hidden",), "computed in float32 and converted", e2e=False),
    # 6: the fused grouped-query conversion
    Mistake("conversion_opposite_direction", "ex6_answer",
            "pairs = block.reshape(n, 2, d_head // 2, *rest)                 # (head, member, pair, ...)",
            "pairs = block.reshape(n, d_head // 2, 2, *rest)",
            EX6, "that is the opposite conversion"),
    Mistake("conversion_values_permuted", "ex6_answer",
            "to_interleaved(k, n_kv_heads), v.clone()), dim=0)",
            "to_interleaved(k, n_kv_heads), to_interleaved(v, n_kv_heads)), dim=0)",
            EX6, "values are never rotated"),
    Mistake("conversion_keys_untouched", "ex6_answer",
            "to_interleaved(k, n_kv_heads), v.clone()), dim=0)",
            "k.clone(), v.clone()), dim=0)",
            EX6, "keys are rotated as well"),
    # Right for multi-head weights, raises on grouped-query ones: the message must name d_head.
    Mistake("conversion_d_head_as_if_all_query_heads", "ex6_answer",
            "d_head = rows // (n_heads + 2 * n_kv_heads)", "d_head = rows // (3 * n_heads)",
            EX6, "as if the key and value blocks had n_heads heads", e2e=False),
    Mistake("conversion_mixes_heads", "ex6_answer",
            "pairs = block.reshape(n, 2, d_head // 2, *rest)                 # (head, member, pair, ...)\n"
            "        return pairs.transpose(1, 2).reshape(block.shape)",
            "pairs = block.reshape(2, -1, *rest)\n        return pairs.transpose(0, 1).reshape(block.shape)",
            EX6, "mixing the heads"),
    # The q and k rows taken together and converted as if they were one head of (n_heads + n_kv_heads) * d_head
    # rows: pairs cross heads and blocks; the message must name that, not give the generic recipe.
    Mistake("conversion_q_and_k_as_one_head", "ex6_answer",
            "    return torch.cat((to_interleaved(q, n_heads), to_interleaved(k, n_kv_heads), v.clone()), dim=0)",
            "    qk = torch.cat((q, k), dim=0)\n"
            "    qk = qk.reshape(2, qk.shape[0] // 2, *rest).transpose(0, 1).reshape(qk.shape)\n"
            "    return torch.cat((qk, v.clone()), dim=0)",
            EX6, "as if they were one head", e2e=False),
    # 7: ALiBi
    Mistake("alibi_power_of_two_formula_for_any_count", "ex7_answer",
            "n = 2 ** math.floor(math.log2(n_heads))", "n = n_heads",
            EX7, "is not a power of two"),
    Mistake("alibi_odd_slopes_of_next_power", "ex7_answer",
            "alibi_slopes(2 * n)[0::2]", "alibi_slopes(2 * n)[1::2]",
            EX7, "starting with the first"),
    Mistake("alibi_slopes_from_zero", "ex7_answer",
            "torch.arange(1, n + 1) / n", "torch.arange(n) / n",
            EX7, "h runs from 1 to n"),
    Mistake("alibi_queries_from_zero", "ex7_answer",
            "query_pos = key_pos[k_len - q_len:]", "query_pos = key_pos[:q_len]",
            EX7, "the queries were placed at positions 0"),
    Mistake("alibi_bias_positive", "ex7_answer",
            "bias = -slopes[:, None, None] * distance", "bias = slopes[:, None, None] * distance",
            EX7, "must be a penalty"),
    Mistake("alibi_finite_mask", "ex7_answer",
            'return bias.masked_fill(distance < 0, float("-inf"))', "return bias.masked_fill(distance < 0, -1e9)",
            EX7, "must be exactly -inf"),
    Mistake("alibi_no_mask", "ex7_answer",
            'return bias.masked_fill(distance < 0, float("-inf"))', "return bias",
            EX7, "were not masked"),
    # 8: NTK-by-parts
    Mistake("by_parts_ramp_reversed", "ex8_answer",
            "return ramp * theta + (1 - ramp) * theta / scale", "return (1 - ramp) * theta + ramp * theta / scale",
            EX8, "the ramp is reversed"),
    Mistake("by_parts_turns_without_two_pi", "ex8_answer",
            "turns = train_len * theta / (2 * math.pi)", "turns = train_len * theta",
            EX8, "r_j counts turns of 2 pi radians"),
    Mistake("by_parts_no_clamp", "ex8_answer",
            "ramp = ((turns - alpha) / (beta - alpha)).clamp(0.0, 1.0)", "ramp = (turns - alpha) / (beta - alpha)",
            EX8, "clamp the ramp to [0, 1]"),
    Mistake("by_parts_times_scale", "ex8_answer",
            "(1 - ramp) * theta / scale", "(1 - ramp) * theta * scale",
            EX8, "not theta_j * scale"),
    # "the number of full turns" read as a whole number: the ramp moves in steps.
    Mistake("by_parts_turns_floored", "ex8_answer",
            "turns = train_len * theta / (2 * math.pi)", "turns = torch.floor(train_len * theta / (2 * math.pi))",
            EX8, "the number of turns is not rounded", e2e=False),
    # 9: predict, then measure
    Mistake("reach_predicted_rounded_down", "ex9_answer", "return math.floor(math.log(1 / threshold) / slope) + 1",
            "return math.floor(math.log(1 / threshold) / slope)", EX9, "that rounds down"),
    Mistake("reach_predicted_with_log10", "ex9_answer", "math.floor(math.log(1 / threshold) / slope) + 1",
            "math.floor(math.log10(1 / threshold) / slope) + 1", EX9, "use the natural logarithm"),
    # ln(1/t)/m is where the weight crosses the threshold; the keys sit at whole distances.
    Mistake("reach_predicted_not_whole", "ex9_answer", "return math.floor(math.log(1 / threshold) / slope) + 1",
            "return math.log(1 / threshold) / slope", EX9, "a distance is a whole number of tokens", e2e=False),
    # The loophole of issue 32: the number read off the notebook's measurement (slope 1/8, 1%), whatever the
    # configuration; and the prediction measured with the student's own alibi_reach.
    Mistake("reach_predicted_constant_from_measurement", "ex9_answer",
            "return math.floor(math.log(1 / threshold) / slope) + 1", "return 37",
            EX9, "the same number for every configuration is a value read off one case"),
    Mistake("reach_predicted_by_measuring", "ex9_answer", "return math.floor(math.log(1 / threshold) / slope) + 1",
            "return int(alibi_reach(torch.tensor([float(slope)]), threshold, 100000).item())",
            EX9, "measuring instead of predicting", e2e=False),
    # "Below" is strict: the hidden tests hold a tie (threshold 1, where weight[0] is exactly on it).
    Mistake("reach_below_or_equal", "ex9_answer", "below = weights < threshold * weights[:, :1]",
            "below = weights <= threshold * weights[:, :1]", ("ex9_hidden",), "below means strictly below"),
    Mistake("reach_absolute_threshold", "ex9_answer",
            "below = weights < threshold * weights[:, :1]", "below = weights < threshold",
            EX9, "the threshold is relative"),
    Mistake("reach_counted_from_one", "ex9_answer",
            "first = below.long().argmax(dim=-1)  ", "first = below.long().argmax(dim=-1) + 1  ",
            EX9, "distances start at 0"),
    # argmax of a row with no key below the threshold is 0: the hint must be about -1, never blame
    # the threshold, which is right.
    Mistake("reach_no_key_as_zero", "ex9_answer",
            "return torch.where(below.any(dim=-1), first, torch.full_like(first, -1))", "return first",
            EX9, "such a head must give -1", e2e=False),
    Mistake("reach_none_as_n_keys", "ex9_answer",
            "torch.full_like(first, -1)", "torch.full_like(first, n_keys)",
            EX9, "return -1 for them"),
    # 10: RoPE inside attention with a cache
    Mistake("cache_positions_from_zero", "ex10_answer",
            "positions = torch.arange(T_past, T_past + T_new, device=q.device)",
            "positions = torch.arange(T_new, device=q.device)",
            EX10, "rotate new token t by its absolute position"),
    # The pitfall the book lists: keys at their absolute positions, the queries from 0.
    Mistake("cache_query_at_position_zero", "ex10_answer",
            "q, k = apply_rope(q, positions, base), apply_rope(k, positions, base)",
            "q, k = apply_rope(q, torch.arange(T_new, device=q.device), base), apply_rope(k, positions, base)",
            EX10, "the queries were rotated as position", e2e=False),
    Mistake("cache_mask_top_left", "ex10_answer",
            "future = torch.arange(T_past + T_new, device=q.device)[None, :] > positions[:, None]",
            "future = torch.arange(T_past + T_new, device=q.device)[None, :] > torch.arange(T_new)[:, None]",
            EX10, "aligned to the top left"),
    Mistake("cache_keys_rotated_twice", "ex10_answer",
            "k_cache, v_cache = torch.cat((k_cache, k), dim=-2)",
            "k_cache, v_cache = torch.cat((apply_rope(k_cache, torch.arange(T_past), base), k), dim=-2)",
            EX10, "the cached keys were rotated again"),
    # ">=" for ">": the new query cannot see its own key (a NaN row when it has no earlier key).
    Mistake("cache_mask_hides_diagonal", "ex10_answer",
            "future = torch.arange(T_past + T_new, device=q.device)[None, :] > positions[:, None]",
            "future = torch.arange(T_past + T_new, device=q.device)[None, :] >= positions[:, None]",
            EX10, "query t must see its own key (j = T_past + t)", e2e=False),
    # The new keys appended unrotated and the whole cache rotated at attention time: the output of a first step
    # is right, but the returned cache is not in the form of the cached keys.
    Mistake("cache_keys_stored_unrotated", "ex10_answer",
            "    q, k = apply_rope(q, positions, base), apply_rope(k, positions, base)\n"
            "    k_cache, v_cache = torch.cat((k_cache, k), dim=-2), torch.cat((v_cache, v), dim=-2)   # (B, H, T_all, d)\n"
            "    scores = q @ k_cache.transpose(-2, -1) / math.sqrt(d_head)",
            "    q = apply_rope(q, positions, base)\n"
            "    k_cache, v_cache = torch.cat((k_cache, k), dim=-2), torch.cat((v_cache, v), dim=-2)\n"
            "    keys = apply_rope(k_cache, torch.arange(T_past + T_new, device=q.device), base)\n"
            "    scores = q @ keys.transpose(-2, -1) / math.sqrt(d_head)",
            EX10, "in the same form as the cached ones", e2e=False),
    Mistake("cache_values_rotated", "ex10_answer",
            "q, k = apply_rope(q, positions, base), apply_rope(k, positions, base)",
            "q, k, v = apply_rope(q, positions, base), apply_rope(k, positions, base), apply_rope(v, positions, base)",
            EX10, "the values were rotated"),
    Mistake("cache_no_scale", "ex10_answer",
            "scores = q @ k_cache.transpose(-2, -1) / math.sqrt(d_head)", "scores = q @ k_cache.transpose(-2, -1)",
            EX10, "divide the scores by sqrt(d_head)"),
    Mistake("cache_no_mask", "ex10_answer",
            'weights = scores.masked_fill(future, float("-inf")).softmax(dim=-1)', "weights = scores.softmax(dim=-1)",
            EX10, "saw later new tokens"),
    # ex5 computes its angles in the dtype of x (wrong for bfloat16 only) and ex10 forgets the
    # scale: ex10's float32 and float64 cases do not depend on that ex5 bug, so the hint must name
    # ex10's own cause first, then mention exercise 5.
    TwoMistakes("cache_no_scale_while_rope_fails_bfloat16", "ex10_answer",
                "scores = q @ k_cache.transpose(-2, -1) / math.sqrt(d_head)", "scores = q @ k_cache.transpose(-2, -1)",
                EX10, "divide the scores by sqrt(d_head)", e2e=False, cell2="ex5_answer",
                old2="    work = torch.float64 if x.dtype == torch.float64 else torch.float32",
                new2="    work = x.dtype"),
    # A wrong exercise 5 answer also breaks exercise 10, which calls it: the hint must say so.
    Mistake("attention_step_after_rope_pairings_mixed", "ex5_answer",
            "angles = torch.cat((angles, angles), dim=-1)", "angles = angles.repeat_interleave(2, dim=-1)",
            EX10, "calls your apply_rope, which fails exercise 5's tests", e2e=False),
]


# Graded end to end as well: the first of these in MISTAKES order (e2e_mistakes takes one per
# assignment). The known bug: its hint must say that the sign of k was lost, never blame
# the rotation, also through the trusted judge. All mistakes are checked in-process.
E2E = {"shift_abs_k"}
