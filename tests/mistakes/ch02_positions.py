"""Chapter 2: common mistakes, each of which must lose points and get its own hint."""

from notebook_tools import Mistake

EX1 = ("ex1_visible", "ex1_hidden")
EX2 = ("ex2_visible", "ex2_hidden")
EX3 = ("ex3_visible", "ex3_hidden")
EX4 = ("ex4_visible", "ex4_hidden")
EX5 = ("ex5_visible", "ex5_hidden")
EX6 = ("ex6_visible", "ex6_hidden")
EX7 = ("ex7_visible", "ex7_hidden")
EX8 = ("ex8_visible", "ex8_hidden")

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
            "pos = torch.arange(seq_len, dtype=torch.float32)",
            "pos = torch.arange(1, seq_len + 1, dtype=torch.float32)",
            EX2, "positions start at 0"),
    Mistake("exponent_i_instead_of_2i", "ex2_answer",
            "freq = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(base) / d_model))",
            "freq = torch.exp(torch.arange(d_model // 2, dtype=torch.float32) * (-math.log(base) / d_model))",
            EX2, "is 2i/d_model"),
    Mistake("sines_then_cosines", "ex2_answer",
            "    pe = torch.zeros(seq_len, d_model)\n    pe[:, 0::2] = torch.sin(pos * freq)\n"
            "    pe[:, 1::2] = torch.cos(pos * freq)\n    return pe",
            "    return torch.cat((torch.sin(pos * freq), torch.cos(pos * freq)), dim=-1)",
            EX2, "interleave the columns"),
    # A fallback names the input that broke: here a base other than the default.
    Mistake("sinusoidal_base_ignored", "ex2_answer",
            "* (-math.log(base) / d_model))", "* (-math.log(10000.0) / d_model))",
            EX2, "the answer matches base 10000", e2e=False),
    # 3: the shift matrix
    Mistake("shift_block_transposed", "ex3_answer",
            "M[idx, idx + 1] = -torch.sin(angle)\n    M[idx + 1, idx] = torch.sin(angle)",
            "M[idx, idx + 1] = torch.sin(angle)\n    M[idx + 1, idx] = -torch.sin(angle)",
            EX3, "shifts by -k"),
    # The block is right (every k >= 0 passes); only a negative k fails, and the hint must
    # say that the sign of k was lost, not blame the block.
    Mistake("shift_abs_k", "ex3_answer",
            "angle = k * torch.exp(", "angle = abs(k) * torch.exp(",
            ("ex3_hidden",), "keep the sign of k"),
    # 4: learned positions
    Mistake("length_check_off_by_one", "ex4_answer", "if T > self.max_len:", "if T >= self.max_len:",
            EX4, "exactly max_len positions fits"),
    Mistake("no_length_check", "ex4_answer",
            "        if T > self.max_len:\n            raise ValueError(f\"sequence length {T} exceeds max_len {self.max_len}\")\n",
            "",
            EX4, "check the length yourself"),
    Mistake("length_error_without_numbers", "ex4_answer",
            'raise ValueError(f"sequence length {T} exceeds max_len {self.max_len}")',
            'raise ValueError("sequence too long")',
            EX4, "name both lengths"),
    # 5: RoPE, half-split
    # Only the hidden tests use fractional positions; the hint must say that they were rounded.
    Mistake("rope_positions_rounded", "ex5_answer",
            "angles = positions.float()[:, None]", "angles = positions.long().float()[:, None]",
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
            "return torch.exp(torch.arange(0, d_head, 2, dtype=torch.float32) * (-math.log(base) / d_head))",
            "return torch.exp(torch.arange(d_head // 2, dtype=torch.float32) * (-math.log(base) / d_head))",
            EX5, "is 2j/d_head"),
    # 6: RoPE, interleaved, and the conversion
    Mistake("interleaved_written_back_as_halves", "ex6_answer",
            "return torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2)",
            "return torch.cat((a * cos - b * sin, a * sin + b * cos), dim=-1)",
            ("ex6_visible", "ex6_hidden"), "written back in half-split order"),
    Mistake("interleaved_uses_half_pairing", "ex6_answer",
            "a, b = x[..., 0::2], x[..., 1::2]",
            "a, b = x.chunk(2, dim=-1)",
            EX6, "this is the half-split pairing"),
    Mistake("conversion_inverse_permutation", "ex6_answer",
            "w = weight.view(n_heads, d_out // n_heads // 2, 2, d_model)",
            "w = weight.view(n_heads, 2, d_out // n_heads // 2, d_model)",
            EX6, "inverse permutation"),
    Mistake("conversion_mixes_heads", "ex6_answer",
            "    w = weight.view(n_heads, d_out // n_heads // 2, 2, d_model)   # (n_heads, pair, member, d_model)\n"
            "    return w.transpose(1, 2).reshape(d_out, d_model)",
            "    w = weight.view(d_out // 2, 2, d_model)\n    return w.transpose(0, 1).reshape(d_out, d_model)",
            EX6, "mixing the heads"),
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
    Mistake("alibi_signed_distance", "ex7_answer",
            "distance = (pos[:, None] - pos[None, :]).abs()", "distance = pos[:, None] - pos[None, :]",
            EX7, "use the distance |i - j|"),
    Mistake("alibi_bias_positive", "ex7_answer",
            "return -slopes[:, None, None] * distance", "return slopes[:, None, None] * distance",
            EX7, "must be a penalty"),
    # 8: extrapolation
    Mistake("interpolation_inverted", "ex8_answer",
            "return positions.float() / scale", "return positions.float() * scale",
            EX8, "the scale is inverted"),
    Mistake("interpolation_integer_division", "ex8_answer",
            "return positions.float() / scale", "return positions // scale",
            EX8, "keep the fractional positions"),
    Mistake("ntk_without_exponent", "ex8_answer",
            "return base * scale ** (d_head / (d_head - 2))", "return base * scale",
            EX8, "d_head / (d_head - 2)"),
    Mistake("learned_positions_detached", "ex4_answer",
            "        return x + self.weight[:T]", "        return x + self.weight[:T].detach()",
            ("ex4_visible", "ex4_hidden"), "do not detach or copy the table in forward", e2e=False),
    # A wrong exercise 5 answer also breaks exercise 6, which calls it: the hint must say so.
    Mistake("interleaved_after_frequencies_from_d_model_pairs", "ex5_answer",
            "(-math.log(base) / d_head)", "(-math.log(base) / (d_head // 2))",
            ("ex6_visible", "ex6_hidden"), "may call your rope_frequencies, which fails exercise 5's tests", e2e=False),
]


# Graded end to end as well (the mistakes the issue names); all are checked in-process.
E2E = {
    "sin_cos_swapped",
    "rope_pairings_mixed",
    "positions_from_one",
    "exponent_i_instead_of_2i",
    "alibi_power_of_two_formula_for_any_count",
    "interpolation_inverted",
    "no_length_check",
    "invariance_not_equivariance",
}
