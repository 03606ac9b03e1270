"""Chapter 1: common mistakes, each of which must lose points and get its own hint."""

from dataclasses import replace

from notebook_tools import Mistake, TwoMistakes

# Exercise 2's pre-tokeniser, as the solution writes it: each slip of it replaces this line.
PATTERN = '    pattern = re.compile(r"\'(?:[sdmt]|ll|ve|re)| ?[^\\W\\d_]+| ?\\d+| ?(?:[^\\s\\w]|_)+|\\s+(?!\\S)|\\s+")'

MISTAKES = [
    Mistake("merge_overlapping", "ex1_answer",
            "            covered.update((i, i + 1))\n            i += 2",
            "            covered.update((i, i + 1))\n            i += 1",
            ("ex1_visible", "ex1_hidden"), "move past both tokens of the pair"),
    Mistake("pair_counts_skip_overlaps", "ex1_answer",
            "    for pair in zip(ids, ids[1:]):\n        counts[pair] = counts.get(pair, 0) + 1",
            "    for pair in zip(ids[::2], ids[1::2]):\n        counts[pair] = counts.get(pair, 0) + 1",
            ("ex1_visible", "ex1_hidden"), "pairs may overlap when counting"),
    Mistake("decode_per_token", "ex3_answer",
            'return b"".join(vocab[i] for i in ids).decode("utf-8", errors="replace")',
            'return "".join(vocab[i].decode("utf-8", errors="replace") for i in ids)',
            ("ex3_visible", "ex3_hidden"), "join the bytes of all tokens first"),
    Mistake("embedding_std_one", "ex4_answer", "nn.init.normal_(self.weight, mean=0.0, std=0.02)",
            "nn.init.normal_(self.weight, mean=0.0, std=1.0)",
            ("ex4_visible", "ex4_hidden"), "torch.randn has std 1"),
    Mistake("embedding_shortcut", "ex4_answer", "return self.weight[ids]",
            "return nn.functional.embedding(ids, self.weight)",
            ("ex4_visible", "ex4_hidden"), "asks you to write"),
    Mistake("scale_by_d_model", "ex5_answer", "math.sqrt(self.weight.shape[1])", "self.weight.shape[1]",
            ("ex5_visible", "ex5_hidden"), "not d_model: use math.sqrt"),
    Mistake("scale_divides", "ex5_answer", "* math.sqrt(self.weight.shape[1])", "/ math.sqrt(self.weight.shape[1])",
            ("ex5_visible", "ex5_hidden"), "dividing shrinks"),
    Mistake("tie_by_copy", "ex6_answer", "self.head.weight = self.embed.weight",
            "self.head.weight = nn.Parameter(self.embed.weight.detach().clone())",
            ("ex6_visible", "ex6_hidden"), "holds a copy"),
    Mistake("gpt2_no_position_table", "ex7_answer",
            "vocab_size * d + n_positions * d + n_layers", "vocab_size * d + n_layers",
            ("ex7_visible", "ex7_hidden"), "learned position table"),
    Mistake("gpt2_tied_head_counted", "ex7_answer",
            "return total if tied else total + vocab_size * d", "return total + vocab_size * d",
            ("ex7_visible", "ex7_hidden"), "count it once"),
    Mistake("gpt2_no_final_norm", "ex7_answer",
            "n_layers * block + layer_norm", "n_layers * block",
            ("ex7_visible", "ex7_hidden"), "the final LayerNorm", e2e=False),
    Mistake("gpt2_linear_without_bias", "ex7_answer",
            "             + d * 3 * d + 3 * d                                   # attention input projection\n"
            "             + d * d + d                                           # attention output projection\n"
            "             + d * 4 * d + 4 * d                                   # MLP up\n"
            "             + 4 * d * d + d)                                      # MLP down",
            "             + d * 3 * d + d * d + d * 4 * d + 4 * d * d)",
            ("ex7_visible", "ex7_hidden"), "every Linear in a block has a bias", e2e=False),
    Mistake("memory_in_bits", "ex7_answer", "torch.empty((), dtype=dtype).element_size()",
            "torch.empty((), dtype=dtype).element_size() * 8",
            ("ex7_visible", "ex7_hidden"), "that is bits"),
    Mistake("patchify_plain_reshape", "ex8_answer",
            "    x = images.view(B, C, H // p, p, W // p, p)           # (B, C, gh, p, gw, p)\n    x = x.permute(0, 2, 4, 1, 3, 5)                        # (B, gh, gw, C, p, p)\n    return x.reshape(",
            "    return images.reshape(",
            ("ex8_visible", "ex8_hidden"), "a plain reshape mixes pixels"),
    Mistake("patch_channel_last", "ex8_answer", "x.permute(0, 2, 4, 1, 3, 5)", "x.permute(0, 2, 4, 3, 5, 1)",
            ("ex8_visible", "ex8_hidden"), "(channel, row, col) order"),
    # ---------------------------------------------------------------- found by review (issue 14)
    Mistake("special_pieces_left_as_bytes", "ex3_answer",
            "                out.extend(encode(piece, merges))",
            "                out.extend(piece.encode(\"utf-8\"))",
            ("ex3_visible", "ex3_hidden"), "left as raw bytes"),
    Mistake("special_only_the_first", "ex3_answer",
            "        for piece in re.split(pattern, text):",
            "        for piece in re.split(pattern, text, maxsplit=1):",
            ("ex3_visible", "ex3_hidden"), "each occurrence", e2e=False),
    Mistake("pair_counts_sorted", "ex1_answer", "    return counts\n", "    return dict(sorted(counts.items()))\n",
            ("ex1_visible", "ex1_hidden"), "order of first appearance", e2e=False),
    # A wrong exercise 1 answer also breaks train_bpe and encode: those hints must say so.
    Mistake("encode_after_merge_overlapping", "ex1_answer",
            "            covered.update((i, i + 1))\n            i += 2",
            "            covered.update((i, i + 1))\n            i += 1",
            ("ex2_visible", "ex3_visible", "ex3_hidden"), "calls your merge_pair, which fails exercise 1's tests",
            e2e=False),
    Mistake("scaled_after_embedding_shortcut", "ex4_answer", "return self.weight[ids]",
            "return nn.functional.embedding(ids, self.weight)",
            ("ex5_visible", "ex5_hidden"), "ScaledEmbedding extends your Embedding, whose lookup fails exercise 4's tests",
            e2e=False),
    Mistake("embedding_backward_assigns", "ex4_answer",
            "    grad.index_add_(0, ids.reshape(-1), grad_output.reshape(-1, d_model))",
            "    grad[ids.reshape(-1)] = grad_output.reshape(-1, d_model)",
            ("ex4_visible", "ex4_hidden"), "assignment (table[ids] = grad) keeps only one"),
    Mistake("embedding_backward_float32", "ex4_answer",
            "    grad = grad_output.new_zeros(vocab_size, d_model)",
            "    grad = torch.zeros(vocab_size, d_model)",
            ("ex4_visible", "ex4_hidden"), "with grad_output's dtype", e2e=False),
    Mistake("embedding_backward_by_autograd", "ex4_answer",
            "    grad = grad_output.new_zeros(vocab_size, d_model)\n"
            "    grad.index_add_(0, ids.reshape(-1), grad_output.reshape(-1, d_model))\n",
            "    table = grad_output.new_zeros(vocab_size, d_model, requires_grad=True)\n"
            "    table[ids].backward(grad_output)\n    grad = table.grad\n",
            ("ex4_visible", "ex4_hidden"), "this exercise asks you to write the backward pass"),
    Mistake("patchify_by_unfold", "ex8_answer",
            "    x = images.view(B, C, H // p, p, W // p, p)           # (B, C, gh, p, gw, p)\n"
            "    x = x.permute(0, 2, 4, 1, 3, 5)                        # (B, gh, gw, C, p, p)\n"
            "    return x.reshape(B, (H // p) * (W // p), C * p * p)    # (B, N, C*p*p)",
            "    return nn.functional.unfold(images, kernel_size=p, stride=p).transpose(1, 2)",
            ("ex8_visible", "ex8_hidden"), "asks you to write patchify with view and permute"),
    Mistake("counts_recounted", "ex1_answer",
            "    for i in range(len(ids) - 1):                 # pairs that overlap a merge disappear",
            "    counts = get_pair_counts(out)\n    return out, counts\n"
            "    for i in range(len(ids) - 1):                 # pairs that overlap a merge disappear",
            ("ex1_visible", "ex1_hidden"), "counts was rebuilt instead of updated"),
    Mistake("counts_keep_zeros", "ex1_answer",
            "            if counts[old] == 0:\n                del counts[old]\n", "",
            ("ex1_visible", "ex1_hidden"), "when its count falls to 0", e2e=False),
    Mistake("counts_subtract_per_occurrence", "ex1_answer",
            "    for i in range(len(ids) - 1):                 # pairs that overlap a merge disappear\n"
            "        if i in covered or i + 1 in covered:\n"
            "            old = (ids[i], ids[i + 1])\n"
            "            counts[old] -= 1\n"
            "            if counts[old] == 0:\n"
            "                del counts[old]\n",
            "    for i in sorted(covered)[::2]:                # each occurrence: left, itself, right\n"
            "        left = [(ids[i - 1], ids[i])] if i > 0 else []\n"
            "        right = [(ids[i + 1], ids[i + 2])] if i + 2 < len(ids) else []\n"
            "        for old in left + [pair] + right:\n"
            "            counts[old] = counts.get(old, 0) - 1\n"
            "            if counts[old] == 0:\n"
            "                del counts[old]\n",
            ("ex1_visible", "ex1_hidden"), "two merged occurrences can be neighbours", e2e=False),
    Mistake("counts_merged_pair_kept", "ex1_answer",
            "        if i in covered or i + 1 in covered:",
            "        if (i in covered or i + 1 in covered) and (ids[i], ids[i + 1]) != pair:",
            ("ex1_visible", "ex1_hidden"), "the merged pair itself disappears", e2e=False),
    Mistake("encode_retrains_on_its_input", "ex3_answer",
            "        for pair, new_id in merges.items():",
            "        for pair, new_id in train_bpe(text, len(merges)).items():",
            ("ex3_visible", "ex3_hidden"), "it worked on the training text but not on this one", e2e=False),
    Mistake("embedding_detached", "ex4_answer", "return self.weight[ids]", "return self.weight.detach()[ids]",
            ("ex4_visible", "ex4_hidden"), "do not detach or copy the table in forward", e2e=False),
    # A wrong earlier answer must not take the blame for a bug of this exercise's own.
    # merge_pair also keeps pairs of count 0 in its counts (exercise 1 fails), yet encode's tokens are
    # right (merge_pair without counts is), so decode's own bug is the one to name.
    TwoMistakes("decode_per_token_while_merge_pair_keeps_zero_counts", "ex3_answer",
                'return b"".join(vocab[i] for i in ids).decode("utf-8", errors="replace")',
                'return "".join(vocab[i].decode("utf-8", errors="replace") for i in ids)',
                ("ex3_visible", "ex3_hidden"), "join the bytes of all tokens first", e2e=False,
                cell2="ex1_answer", old2="            if counts[old] == 0:\n                del counts[old]\n", new2=""),
    TwoMistakes("scale_by_vocab_while_embedding_std_one", "ex5_answer", "math.sqrt(self.weight.shape[1])",
                "math.sqrt(self.weight.shape[0])", ("ex5_visible", "ex5_hidden"), "not sqrt(vocab_size)",
                e2e=False, cell2="ex4_answer", old2="nn.init.normal_(self.weight, mean=0.0, std=0.02)",
                new2="nn.init.normal_(self.weight, mean=0.0, std=1.0)"),
    Mistake("gpt2_untied_head_with_bias", "ex7_answer",
            "return total if tied else total + vocab_size * d",
            "return total if tied else total + vocab_size * d + vocab_size",
            ("ex7_visible", "ex7_hidden"), "the untied output layer has no bias", e2e=False),
    Mistake("patchify_column_major", "ex8_answer", "x.permute(0, 2, 4, 1, 3, 5)", "x.permute(0, 4, 2, 1, 3, 5)",
            ("ex8_visible", "ex8_hidden"), "the patches come column by column", e2e=False),
    # ---------------------------------------------------------------- issue 28: GPT-2's pre-tokeniser,
    # training with updated counts under a bound on the updates, a padding row, the scale's initialisation
    Mistake("pretokenize_no_contractions", "ex2_answer", PATTERN, PATTERN.replace("'(?:[sdmt]|ll|ve|re)|", ""),
            ("ex2_visible", "ex2_hidden"), "split off the contractions"),
    Mistake("pretokenize_no_lookahead", "ex2_answer", PATTERN, PATTERN.replace(r"\s+(?!\S)|", ""),
            ("ex2_visible", "ex2_hidden"), "leaves its last space to the word", e2e=False),
    Mistake("pretokenize_ascii_letters", "ex2_answer", PATTERN,
            PATTERN.replace(r"[^\W\d_]", "[A-Za-z]").replace(r"(?:[^\s\w]|_)", r"[^\sA-Za-z\d]"),
            ("ex2_visible", "ex2_hidden"), "letters of every alphabet", e2e=False),
    Mistake("pretokenize_space_not_attached", "ex2_answer", PATTERN,
            PATTERN.replace(" ?", "").replace(r"\s+(?!\S)|", ""),
            ("ex2_visible", "ex2_hidden"), "takes the one space before it", e2e=False),
    Mistake("pretokenize_digits_in_words", "ex2_answer", PATTERN,
            PATTERN.replace(r" ?[^\W\d_]+| ?\d+|", r" ?[^\W_]+|"),
            ("ex2_visible", "ex2_hidden"), "letters and digits are separate runs", e2e=False),
    Mistake("pretokenize_book_pattern", "ex2_answer", PATTERN,
            '    pattern = re.compile(r" ?[A-Za-z]+| ?[0-9]+| ?[^\\sA-Za-z0-9]+|\\s+")',
            ("ex2_visible", "ex2_hidden"), "the book page's simpler pattern", e2e=False),
    Mistake("train_ties_to_the_largest", "ex2_answer", "key=lambda p: (pair_counts[p], -p[0], -p[1])",
            "key=lambda p: (pair_counts[p], p)", ("ex2_visible", "ex2_hidden"), "ties go to the smallest pair"),
    Mistake("train_ids_from_255", "ex2_answer",
            "        merges[best] = 256 + step\n        for k in sorted(where.pop(best, ())):\n"
            "            old, chunks[k] = chunks[k], merge_pair(chunks[k], best, 256 + step)",
            "        merges[best] = 255 + step\n        for k in sorted(where.pop(best, ())):\n"
            "            old, chunks[k] = chunks[k], merge_pair(chunks[k], best, 255 + step)",
            ("ex2_visible", "ex2_hidden"), "the first new token is 256", e2e=False),
    Mistake("train_across_chunks", "ex2_answer", "chunk_counts = Counter(pretokenize(text))",
            "chunk_counts = Counter([text])", ("ex2_visible", "ex2_hidden"), "merges never cross a chunk boundary",
            e2e=False),
    Mistake("train_chunks_unweighted", "ex2_answer", "weights = list(chunk_counts.values())",
            "weights = [1] * len(chunk_counts)", ("ex2_visible", "ex2_hidden"), "weight the pairs of each distinct chunk",
            e2e=False),
    Mistake("train_recounts_after_each_merge", "ex2_answer",
            "        for k in sorted(where.pop(best, ())):\n",
            "        chunks = [merge_pair(ids, best, 256 + step) for ids in chunks]\n"
            "        pair_counts.clear()\n"
            "        for k, ids in enumerate(chunks):\n"
            "            for pair in zip(ids, ids[1:]):\n"
            "                pair_counts[pair] = pair_counts.get(pair, 0) + weights[k]\n"
            "        continue\n"
            "        for k in sorted(where.pop(best, ())):\n",
            ("ex2_visible", "ex2_hidden"), "pair_counts was rebuilt after every merge"),
    Mistake("train_keeps_zero_counts", "ex2_answer",
            "                if count:\n                    pair_counts[pair] = count\n"
            "                else:\n                    del pair_counts[pair]\n",
            "                pair_counts[pair] = count\n",
            ("ex2_visible", "ex2_hidden"), "when its count falls to 0", e2e=False),
    Mistake("train_counts_in_a_dict_of_its_own", "ex2_answer",
            "pair_counts = {} if pair_counts is None else pair_counts", "pair_counts = {}",
            ("ex2_visible", "ex2_hidden"), "pair_counts was left empty", e2e=False),
    Mistake("encode_after_pretokenize_no_contractions", "ex2_answer", PATTERN,
            PATTERN.replace("'(?:[sdmt]|ll|ve|re)|", ""), ("ex3_visible", "ex3_hidden"),
            "encode cuts the text with your pretokenize, which fails its test", e2e=False),
    Mistake("encode_after_ties_to_the_largest", "ex2_answer", "key=lambda p: (pair_counts[p], -p[0], -p[1])",
            "key=lambda p: (pair_counts[p], p)", ("ex3_visible", "ex3_hidden"),
            "the merges come from your train_bpe, which fails exercise 2's tests", e2e=False),
    Mistake("encode_across_chunks", "ex3_answer", "    for chunk in pretokenize(text):", "    for chunk in [text]:",
            ("ex3_visible", "ex3_hidden"), "cut the text with pretokenize first", e2e=False),
    Mistake("encode_special_shortest_first", "ex3_answer", "sorted(special_tokens, key=len, reverse=True)",
            "sorted(special_tokens, key=len)", ("ex3_visible", "ex3_hidden"), "the longest one that matches wins",
            e2e=False),
    Mistake("embedding_padding_row_not_zero", "ex4_answer",
            "            with torch.no_grad():\n                self.weight[padding_idx].zero_()\n",
            "            pass\n", ("ex4_visible", "ex4_hidden"), "set the row padding_idx to zero", e2e=False),
    Mistake("embedding_padding_row_trained", "ex4_answer",
            "            return torch.where(is_pad, self.weight.detach()[ids], self.weight[ids])",
            "            return self.weight[ids]",
            ("ex4_visible", "ex4_hidden"), "the padding row, received a gradient", e2e=False),
    Mistake("embedding_backward_padding_ignored", "ex4_answer",
            "    if padding_idx is not None:\n        grad[padding_idx] = 0\n", "",
            ("ex4_visible", "ex4_hidden"), "is the padding row", e2e=False),
    Mistake("scaled_keeps_std_002", "ex5_answer",
            "        nn.init.normal_(self.weight, mean=0.0, std=1 / math.sqrt(d_model))\n", "        pass\n",
            ("ex5_visible", "ex5_hidden"), "kept Embedding's std 0.02", e2e=False),
    Mistake("scaled_std_one", "ex5_answer", "std=1 / math.sqrt(d_model)", "std=1.0",
            ("ex5_visible", "ex5_hidden"), "a table of std 1 scaled", e2e=False),
    # ---------------------------------------------------------------- a forged record (issue 32)
    # Recounts after every merge, into the dict the tests' mapping kept as an attribute (writes nobody counted,
    # before pair_counts became a recorder whose counts live out of the student's reach).
    Mistake("pair_counts_forged", "ex2_answer",
            "    pair_counts = {} if pair_counts is None else pair_counts\n",
            "    pair_counts = {} if pair_counts is None else pair_counts\n"
            "    store = getattr(pair_counts, 'data', pair_counts)     # the mapping's own dict: uncounted writes\n"
            "    chunk_counts = Counter(pretokenize(text))\n"
            "    chunks = [list(chunk.encode('utf-8')) for chunk in chunk_counts]\n"
            "    weights = list(chunk_counts.values())\n"
            "    merges = {}\n"
            "    for step in range(num_merges + 1):\n"
            "        counts = Counter()\n"
            "        for ids, weight in zip(chunks, weights):\n"
            "            for pair in zip(ids, ids[1:]):\n"
            "                counts[pair] += weight\n"
            "        store.clear()\n"
            "        store.update(counts)\n"
            "        if step == num_merges or not counts:\n"
            "            return merges\n"
            "        best = max(counts, key=lambda p: (counts[p], -p[0], -p[1]))\n"
            "        merges[best] = 256 + step\n"
            "        chunks = [merge_pair(ids, best, 256 + step) for ids in chunks]\n",
            ("ex2_visible", "ex2_hidden"), "pair_counts was rebuilt after every merge"),
]

# Graded end to end: the forged record, whose verdict rests on what the kernel reports (the trusted path).
E2E = {"pair_counts_forged"}

_BY_NAME = {m.name: m for m in MISTAKES}
# Found by an honest attempt: pruning at <= 0 hides the double subtraction unless the pair between
# two neighbouring occurrences also occurs elsewhere.
_PER_OCCURRENCE = _BY_NAME["counts_subtract_per_occurrence"]
MISTAKES.append(replace(_PER_OCCURRENCE, name="counts_subtract_per_occurrence_pruned",
                        new=_PER_OCCURRENCE.new.replace("if counts[old] == 0:", "if counts[old] <= 0:")))
