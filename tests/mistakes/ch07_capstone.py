"""Capstone: common mistakes in the parts. Each fails its unit test cells with its hint
in-process; the end-to-end grading run takes only those marked e2e, because every capstone
submission also trains three models (the grading path is the same for all of them).

A wrong tool brought from chapters 5 and 6 (exercise 0) is registered twice: once for the
tools' own test cells, with its chapter's hint, and once for the exercise that calls it,
whose hint must name the tool and its chapter."""

from functools import partial

from notebook_tools import Mistake as _Mistake

Mistake = partial(_Mistake, e2e=False)
TOOLS = ("tools_visible", "tools_hidden")
EX2 = ("ex2_visible", "ex2_hidden")

_PRE_LN = """        q, k, v = self.qkv(self.ln_1(x)).chunk(3, dim=-1)
        x = x + self.proj(self.attend(q, k, v, mask=pad_mask, causal=self.causal))
        if self.cross:
            k, v = self.kv_x(memory).chunk(2, dim=-1)
            x = x + self.proj_x(self.attend(self.q_x(self.ln_x(x)), k, v, mask=memory_mask))
        return x + self.mlp(self.ln_2(x))"""
_POST_LN = """        q, k, v = self.qkv(x).chunk(3, dim=-1)
        x = self.ln_1(x + self.proj(self.attend(q, k, v, mask=pad_mask, causal=self.causal)))
        if self.cross:
            k, v = self.kv_x(memory).chunk(2, dim=-1)
            x = self.ln_x(x + self.proj_x(self.attend(self.q_x(x), k, v, mask=memory_mask)))
        return self.ln_2(x + self.mlp(x))"""
# from the end of Block.forward to the end of DecoderLM.forward: the blocks become Post-LN and
# the model loses its final LayerNorm
_LM_BETWEEN = '''

class DecoderLM(nn.Module):
    """Decoder-only language model: ids (B, T) -> logits (B, T, vocab_size)."""

    def __init__(self, cfg, vocab_size: int):
        super().__init__()
        self.block_size = cfg.block_size
        self.tok = nn.Embedding(vocab_size, cfg.d_model)
        self.pos = nn.Embedding(cfg.block_size, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg.d_model, cfg.n_heads, cfg.dropout) for _ in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, vocab_size, bias=False)
        self.head.weight = self.tok.weight                      # weight tying
        self.apply(init_weights)

    def forward(self, ids):
        T = ids.shape[1]
        x = self.tok(ids) + self.pos(torch.arange(T, device=ids.device))   # (B, T, d_model)
        for block in self.blocks:
            x = block(x)
        return '''
EX7 = ("ex7_visible", "ex7_hidden")
_BLOCKS = """    for mine, theirs in zip(classifier.blocks, g2p_model.encoder, strict=True):
        mine.load_state_dict(theirs.state_dict())
"""
_POSITIONS = "        classifier.pos.weight.copy_(g2p_model.pos.weight[:classifier.pos.num_embeddings])\n"
_NORM = "    classifier.ln_f.load_state_dict(g2p_model.ln_enc.state_dict())\n"
_CLIP = """        for p, g in zip(with_grad, clipped):
            p.grad = g
"""

MISTAKES = [
    # ---- exercise 0: the tools, and the exercises that call them
    Mistake("tool_warmup_from_zero", "tools_answer", "return max_lr * (step + 1) / warmup_steps",
            "return max_lr * step / warmup_steps", TOOLS + EX2, "warm-up counts from step + 1"),
    Mistake("train_blames_lr_at", "tools_answer", "return max_lr * (step + 1) / warmup_steps",
            "return max_lr * step / warmup_steps", EX2, "train calls your lr_at from chapter 5"),
    # A slip only a long warm-up shows (the drawn schedules of the hidden look, not chapter 5's own cases): the
    # capstone's lr_at has no decay_steps, so the hint is the schedule's, not "add decay_steps" (issue 32).
    Mistake("tool_lr_at_long_warmup_slip", "tools_answer",
            "    progress = (step - warmup_steps) / (max_steps - warmup_steps)\n",
            "    progress = (step - warmup_steps) / (max_steps - warmup_steps)\n"
            "    progress = progress * 0.9 if warmup_steps > 10 else progress\n",
            ("tools_hidden",), "p = (step - warmup_steps) / (max_steps - warmup_steps)"),
    Mistake("tool_cosine_to_zero", "tools_answer",
            "return min_lr + 0.5 * (1 + math.cos(math.pi * progress)) * (max_lr - min_lr)",
            "return 0.5 * (1 + math.cos(math.pi * progress)) * max_lr", TOOLS + EX2, "the cosine decays to min_lr"),
    Mistake("tool_decay_embeddings", "tools_answer", "matrices = {id(m.weight) for m in model.modules() if isinstance(m, nn.Linear)} - embedded",
            "matrices = {id(p) for p in model.parameters() if p.ndim >= 2}", TOOLS, "this course does not decay embeddings"),
    Mistake("train_blames_param_groups", "tools_answer", "matrices = {id(m.weight) for m in model.modules() if isinstance(m, nn.Linear)} - embedded",
            "matrices = {id(p) for p in model.parameters() if p.ndim >= 2}", EX2, "train calls your param_groups from chapter 5"),
    Mistake("tool_clip_per_tensor", "tools_answer", "return [None if g is None else g * scale for g in grads], total",
            "return [None if g is None else g * min(1.0, max_norm / (float(g.float().norm()) + 1e-6)) for g in grads], total", TOOLS,
            "each tensor was clipped on its own"),
    Mistake("train_blames_clip_grad_norm", "tools_answer", "return [None if g is None else g * scale for g in grads], total",
            "return [None if g is None else g * min(1.0, max_norm / (float(g.float().norm()) + 1e-6)) for g in grads], total", EX2,
            "train calls your clip_grad_norm from chapter 5"),
    # train uses only the clipped gradients, so a wrong returned norm costs the tools' points alone
    Mistake("tool_clip_norm_after", "tools_answer", "return [None if g is None else g * scale for g in grads], total",
            "return [None if g is None else g * scale for g in grads], min(total, max_norm)", TOOLS, "measured before clipping"),
    Mistake("tool_sampler_global_rng", "tools_answer", "torch.multinomial(probs, 1, generator=generator)",
            "torch.multinomial(probs, 1)", TOOLS, "draw with the generator you are given"),
    Mistake("generate_blames_sampler", "tools_answer", "torch.multinomial(probs, 1, generator=generator)",
            "torch.multinomial(probs, 1)", ("ex3_visible", "ex3_hidden"),
            "generate calls your sample_next_token from chapter 6"),
    Mistake("tool_no_temperature", "tools_answer", "    x = x / temperature\n", "",
            TOOLS + ("ex3_visible", "ex3_hidden"), "temperature"),
    Mistake("generate_blames_process_logits", "tools_answer", "    x = x / temperature\n", "",
            ("ex3_visible", "ex3_hidden"), "generate calls your process_logits from chapter 6"),
    Mistake("tool_beam_no_norm", "tools_answer",
            "score / (len(tokens) - 1) ** length_penalty) for tokens, score in finished]",
            "score) for tokens, score in finished]", TOOLS, "no length normalisation was applied"),
    Mistake("beam_blames_core", "tools_answer",
            "score / (len(tokens) - 1) ** length_penalty) for tokens, score in finished]",
            "score) for tokens, score in finished]", ("ex5_visible", "ex5_hidden"),
            "beam_search calls your beam_search_core from chapter 6"),
    # ---- exercise 1
    Mistake("lm_not_causal", "ex1_answer", "x = x + self.proj(self.attend(q, k, v, mask=pad_mask, causal=self.causal))",
            "x = x + self.proj(self.attend(q, k, v, mask=pad_mask, causal=False))",
            ("ex1_visible", "ex1_hidden"), "self-attention must be causal", e2e=True),
    Mistake("lm_untied_head", "ex1_answer", "        self.head.weight = self.tok.weight                      # weight tying\n",
            "", ("ex1_visible", "ex1_hidden"), "tie them"),
    Mistake("lm_no_positions", "ex1_answer", "x = self.tok(ids) + self.pos(torch.arange(T, device=ids.device))",
            "x = self.tok(ids)", ("ex1_visible", "ex1_hidden"), "no sense of order"),
    Mistake("lm_post_ln_no_final_ln", "ex1_answer",
            _PRE_LN + "\n" + _LM_BETWEEN + "self.head(self.ln_f(x))", _POST_LN + "\n" + _LM_BETWEEN + "self.head(x)",
            ("ex1_visible", "ex1_hidden"), "is Post-LN"),
    # the encoder-decoder and the classifier are built from Block: their tests blame exercise 1
    Mistake("post_ln_blames_block_in_seq2seq", "ex1_answer", _PRE_LN, _POST_LN, ("ex4_visible", "ex4_hidden"),
            "Seq2Seq is built from your Block of exercise 1"),
    Mistake("post_ln_blames_block_in_classifier", "ex1_answer", _PRE_LN, _POST_LN, ("ex6_visible", "ex6_hidden"),
            "EncoderClassifier is built from your Block of exercise 1"),
    Mistake("lm_no_final_ln", "ex1_answer", "return self.head(self.ln_f(x))", "return self.head(x)",
            ("ex1_visible", "ex1_hidden"), "final LayerNorm before the output projection"),
    Mistake("block_pad_drops_causal", "ex1_answer", "mask = tri if mask is None else mask & tri",
            "mask = tri if mask is None else mask", ("ex1_visible", "ex1_hidden"),
            "stopped being causal when a pad_mask was given"),
    Mistake("block_causal_ignores_pad", "ex1_answer", "mask = tri if mask is None else mask & tri",
            "mask = tri", ("ex1_visible", "ex1_hidden"), "PAD keys must be hidden while the block is causal"),
    # the block against the reference block, its weights loaded through the spec's names
    Mistake("block_relu_mlp", "ex1_answer", "nn.GELU()", "nn.ReLU()", ("ex1_visible", "ex1_hidden"), "not ReLU"),
    Mistake("relu_blames_block_in_seq2seq", "ex1_answer", "nn.GELU()", "nn.ReLU()", ("ex4_visible", "ex4_hidden"),
            "Seq2Seq is built from your Block of exercise 1"),
    Mistake("relu_blames_block_in_classifier", "ex1_answer", "nn.GELU()", "nn.ReLU()", ("ex6_visible", "ex6_hidden"),
            "EncoderClassifier is built from your Block of exercise 1"),
    Mistake("block_mlp_width_2d", "ex1_answer",
            "nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model)",
            "nn.Linear(d_model, 2 * d_model), nn.GELU(), nn.Linear(2 * d_model, d_model)",
            ("ex1_visible", "ex1_hidden", "ex4_visible", "ex6_visible"), "the MLP is Linear(d_model, 4 * d_model)"),
    # .view on the transposed heads: fine while PyTorch's fused attention returns them in row order,
    # an error once dropout is on (training mode): the checks' dropout runs raise it
    Mistake("block_view_after_transpose", "ex1_answer", "return out.transpose(1, 2).reshape(B, Tq, C)",
            "return out.transpose(1, 2).view(B, Tq, C)", ("ex1_visible", "ex1_hidden", "ex4_visible", "ex6_visible"),
            "a .view() of a transposed or permuted tensor"),
    Mistake("block_no_output_projection", "ex1_answer", "self.proj = nn.Linear(d_model, d_model)",
            "self.proj = nn.Identity()", ("ex1_visible", "ex1_hidden"), "ends with an output projection"),
    Mistake("block_one_layernorm_twice", "ex1_answer", "return x + self.mlp(self.ln_2(x))",
            "return x + self.mlp(self.ln_1(x))", ("ex1_visible", "ex1_hidden"), "the MLP read ln_1's output"),
    Mistake("block_layernorm_shared", "ex1_answer", "self.ln_2 = nn.LayerNorm(d_model)", "self.ln_2 = self.ln_1",
            ("ex1_visible", "ex1_hidden"), "make a new nn.LayerNorm for each"),
    Mistake("block_cross_query_unnormalised", "ex1_answer", "self.q_x(self.ln_x(x))", "self.q_x(x)",
            ("ex1_visible", "ex1_hidden"), "queries come from ln_x(x)"),
    Mistake("block_kv_swapped", "ex1_answer", "k, v = self.kv_x(memory).chunk(2, dim=-1)",
            "v, k = self.kv_x(memory).chunk(2, dim=-1)", ("ex1_visible", "ex1_hidden"),
            "k, v of kv_x's"),
    Mistake("block_cross_ignores_memory_mask", "ex1_answer", "k, v, mask=memory_mask)", "k, v, mask=None)",
            ("ex1_visible", "ex1_hidden"), "attended to the memory's PAD positions"),
    # dropout: only in training mode, in both sub-layers, and passed on by every model
    Mistake("block_dropout_in_eval", "ex1_answer", "dropout_p=self.dropout if self.training else 0.0",
            "dropout_p=self.dropout", ("ex1_visible", "ex1_hidden"), "dropout acts only while training"),
    Mistake("block_attention_never_dropped", "ex1_answer", "dropout_p=self.dropout if self.training else 0.0",
            "dropout_p=0.0", ("ex1_visible", "ex1_hidden"), "attention sub-layer was never dropped out"),
    Mistake("block_mlp_never_dropped", "ex1_answer",
            "nn.Linear(4 * d_model, d_model),\n                                 nn.Dropout(dropout))",
            "nn.Linear(4 * d_model, d_model))", ("ex1_visible", "ex1_hidden"), "the MLP's output was never dropped"),
    Mistake("lm_ignores_dropout", "ex1_answer", "Block(cfg.d_model, cfg.n_heads, cfg.dropout) for _",
            "Block(cfg.d_model, cfg.n_heads) for _", ("ex1_visible", "ex1_hidden"),
            "pass cfg.dropout on to every Block that DecoderLM builds"),
    Mistake("seq2seq_ignores_dropout", "ex4_answer", "Block(d, cfg.n_heads, cfg.dropout, causal=False)",
            "Block(d, cfg.n_heads, 0.0, causal=False)", ("ex4_visible", "ex4_hidden"),
            "pass cfg.dropout on to every Block that Seq2Seq builds"),
    Mistake("classifier_ignores_dropout", "ex6_answer", "Block(cfg.d_model, cfg.n_heads, cfg.dropout, causal=False)",
            "Block(cfg.d_model, cfg.n_heads, causal=False)", ("ex6_visible", "ex6_hidden"),
            "pass cfg.dropout on to every Block that EncoderClassifier builds"),
    # the parameter count: cfg.n_layers blocks, nothing more
    Mistake("lm_fixed_depth", "ex1_answer", "Block(cfg.d_model, cfg.n_heads, cfg.dropout) for _ in range(cfg.n_layers)",
            "Block(cfg.d_model, cfg.n_heads, cfg.dropout) for _ in range(2)", ("ex1_visible", "ex1_hidden"),
            "build cfg.n_layers blocks"),
    Mistake("lm_head_bias", "ex1_answer", "self.head = nn.Linear(cfg.d_model, vocab_size, bias=False)",
            "self.head = nn.Linear(cfg.d_model, vocab_size)", ("ex1_visible", "ex1_hidden"), "(it has no bias)"),
    Mistake("seq2seq_fixed_depth", "ex4_answer", "for _ in range(cfg.n_layers))", "for _ in range(2))",
            ("ex4_visible", "ex4_hidden"), "build cfg.n_layers blocks"),
    Mistake("classifier_fixed_depth", "ex6_answer", "for _ in range(cfg.n_layers))", "for _ in range(2))",
            ("ex6_visible", "ex6_hidden"), "build cfg.n_layers blocks"),
    # ---- exercise 2
    Mistake("no_grad_clipping", "ex2_answer", _CLIP, "", EX2, "gradients were not clipped"),
    Mistake("train_torch_clip", "ex2_answer",
            "        with_grad = [p for p in params if p.grad is not None]\n"
            "        clipped, _ = clip_grad_norm([p.grad for p in with_grad], clip)\n" + _CLIP,
            "        torch.nn.utils.clip_grad_norm_(params, clip)\n", EX2, "must clip with your clip_grad_norm"),
    Mistake("no_zero_grad", "ex2_answer", "        opt.zero_grad(set_to_none=True)\n", "",
            EX2, "gradients accumulate"),
    Mistake("train_no_floor", "ex2_answer", "lr_at(step, lr, min_lr, warmup_steps, steps)",
            "lr_at(step, lr, 0.0, warmup_steps, steps)", EX2, "the cosine decayed to 0"),
    Mistake("train_fixed_weight_decay", "ex2_answer", "param_groups(model, weight_decay)", "param_groups(model, 0.1)",
            ("ex2_hidden",), "not the weight_decay passed in"),
    Mistake("train_bf16_only_on_cuda", "ex2_answer",
            "torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=use_bf16)",
            'torch.autocast("cuda", dtype=torch.bfloat16, enabled=use_bf16 and torch.device(device).type == "cuda")',
            EX2, "use_bf16=True changed nothing"),
    Mistake("train_autocast_float16", "ex2_answer",
            "torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=use_bf16)",
            "torch.autocast(torch.device(device).type, dtype=torch.float16, enabled=use_bf16)",
            EX2, "the autocast dtype was float16"),
    # ---- exercise 3
    Mistake("generate_last_token_only", "ex3_answer", "model(ids[:, -block_size:])", "model(ids[:, -1:])",
            ("ex3_visible", "ex3_hidden"), "generate gave the model only the last id"),
    Mistake("generate_context_one_short", "ex3_answer", "model(ids[:, -block_size:])",
            "model(ids[:, -block_size + 1:])", ("ex3_visible", "ex3_hidden"), "one id fewer than block_size"),
    Mistake("generate_no_crop", "ex3_answer", "model(ids[:, -block_size:])", "model(ids)",
            ("ex3_visible", "ex3_hidden"), "crop the context"),
    Mistake("generate_drops_generator", "ex3_answer", "sample_next_token(logits, generator, temperature, top_k)",
            "sample_next_token(logits, None, temperature, top_k)", ("ex3_visible", "ex3_hidden"),
            "pass the generator on"),
    Mistake("generate_drops_top_k", "ex3_answer", "sample_next_token(logits, generator, temperature, top_k)",
            "sample_next_token(logits, generator, temperature)", ("ex3_visible", "ex3_hidden"), "top_k passed on"),
    # ---- exercise 4
    Mistake("source_padding_unmasked", "ex4_answer", "mask = (src != PAD)[:, None, None, :]",
            "mask = None", ("ex4_visible", "ex4_hidden"), "mask PAD in the source"),
    Mistake("encoder_causal", "ex4_answer", "Block(d, cfg.n_heads, cfg.dropout, causal=False)",
            "Block(d, cfg.n_heads, cfg.dropout, causal=True)", ("ex4_visible", "ex4_hidden"),
            "the encoder reads the whole word"),
    Mistake("encoder_no_final_ln", "ex4_answer", "return self.ln_enc(x), mask", "return x, mask",
            ("ex4_visible", "ex4_hidden"), "return ln_enc(x), mask"),
    Mistake("decoder_no_final_ln", "ex4_answer", "return self.head(self.ln_dec(x))", "return self.head(x)",
            ("ex4_visible", "ex4_hidden"), "head(ln_dec(x))"),
    Mistake("seq2seq_untied_head", "ex4_answer", "        self.head.weight = self.tgt_tok.weight\n", "",
            ("ex4_visible", "ex4_hidden"), "tie them"),
    # ---- exercise 5
    Mistake("greedy_keeps_eos", "ex5_answer", "out.append(row[:row.index(EOS)] if EOS in row else row)",
            "out.append(row)", ("ex5_visible", "ex5_hidden"), "cut each row at its first EOS"),
    # rows of one batch end at different steps only in the hidden test's scripted model
    Mistake("greedy_stops_at_first_eos", "ex5_answer", "if (ys == EOS).any(dim=1).all():",
            "if (ys == EOS).any(dim=1).any():", ("ex5_hidden",), "stopped before its own EOS"),
    Mistake("beam_no_length_norm", "ex5_answer", "length_penalty=1.0)[0]", "length_penalty=0.0)[0]",
            ("ex5_visible", "ex5_hidden"), "ranked by their summed log-probability"),
    Mistake("greedy_ignores_max_len", "ex5_answer", "    for _ in range(max_len):\n        nxt", "    for _ in range(24):\n        nxt",
            ("ex5_visible", "ex5_hidden"), "stop after max_len steps"),
    Mistake("beam_ignores_max_len", "ex5_answer", "beam_search_core(step_fn, BOS, EOS, beam_size, max_len,",
            "beam_search_core(step_fn, BOS, EOS, beam_size, 24,", ("ex5_visible", "ex5_hidden"),
            "stop after max_len steps"),
    Mistake("beam_step_raw_logits", "ex5_answer", "return torch.log_softmax(logits[:, -1].float(), dim=-1).cpu()",
            "return logits[:, -1].float().cpu()", ("ex5_visible", "ex5_hidden"),
            "the decoder's logits are scores, not log-probabilities"),
    # ---- exercise 6
    Mistake("classifier_mean_over_pad", "ex6_answer",
            "return self.head(x.sum(1) / real.sum(1, keepdim=True).clamp(min=1))",
            "return self.head(x.mean(1))", ("ex6_visible", "ex6_hidden"), "PAD must change nothing"),
    Mistake("classifier_first_token", "ex6_answer",
            "return self.head(x.sum(1) / real.sum(1, keepdim=True).clamp(min=1))",
            "return self.head(x[:, 0])", ("ex6_visible", "ex6_hidden"), "read from the first position only"),
    Mistake("classifier_sum_pool", "ex6_answer",
            "return self.head(x.sum(1) / real.sum(1, keepdim=True).clamp(min=1))",
            "return self.head(x.sum(1))", ("ex6_visible", "ex6_hidden"), "summed, not averaged"),
    Mistake("classifier_causal", "ex6_answer", "Block(cfg.d_model, cfg.n_heads, cfg.dropout, causal=False)",
            "Block(cfg.d_model, cfg.n_heads, cfg.dropout)", ("ex6_visible", "ex6_hidden"),
            "must not be causal"),
    Mistake("classifier_no_final_ln", "ex6_answer", "x = self.ln_f(x) * real[..., None]", "x = x * real[..., None]",
            ("ex6_visible", "ex6_hidden"), "apply the final LayerNorm"),
    # ---- exercise 7: each wrong copy trains without an error; the classifier then starts from
    # something other than the G2P encoder
    Mistake("transfer_shares_blocks", "ex7_answer", _BLOCKS, "    classifier.blocks = g2p_model.encoder\n", EX7,
            "shares memory"),
    Mistake("transfer_positions_as_view", "ex7_answer", _POSITIONS,
            "        classifier.pos.weight = nn.Parameter(g2p_model.pos.weight[:classifier.pos.num_embeddings])\n",
            EX7, "shares memory"),
    Mistake("transfer_decoder_norm", "ex7_answer", "g2p_model.ln_enc.state_dict()", "g2p_model.ln_dec.state_dict()",
            EX7, "those are the decoder's"),
    Mistake("transfer_last_positions", "ex7_answer", "g2p_model.pos.weight[:classifier.pos.num_embeddings]",
            "g2p_model.pos.weight[-classifier.pos.num_embeddings:]", EX7, "not the last ones"),
    Mistake("transfer_phoneme_table", "ex7_answer", "classifier.tok.weight.copy_(g2p_model.src_tok.weight)",
            "classifier.tok.weight.copy_(g2p_model.tgt_tok.weight[:classifier.tok.num_embeddings])", EX7,
            "not the decoder's phoneme table"),
    Mistake("transfer_no_final_norm", "ex7_answer", _NORM, "", EX7, "the final LayerNorm was not copied"),
    Mistake("transfer_first_block_only", "ex7_answer", _BLOCKS,
            "    classifier.blocks[0].load_state_dict(g2p_model.encoder[0].state_dict())\n", EX7,
            "copy every encoder block"),
    Mistake("transfer_tables_only", "ex7_answer", _BLOCKS, "", EX7, "copy every encoder block"),
    Mistake("transfer_decoder_blocks", "ex7_answer", _BLOCKS,
            "    for mine, theirs in zip(classifier.blocks, g2p_model.decoder, strict=True):\n"
            "        mine.load_state_dict(theirs.state_dict(), strict=False)\n", EX7, "those are the decoder's"),
    Mistake("transfer_resets_head", "ex7_answer", _NORM, _NORM + "    classifier.head.reset_parameters()\n", EX7,
            "leave the head as build_classifier made it"),
    Mistake("transfer_copies_into_g2p", "ex7_answer", _NORM,
            "    g2p_model.ln_enc.load_state_dict(classifier.ln_f.state_dict())\n", EX7, "never the other way"),
    Mistake("transfer_copy_with_grad", "ex7_answer",
            "    with torch.no_grad():\n"
            "        classifier.tok.weight.copy_(g2p_model.src_tok.weight)\n" + _POSITIONS,
            "    classifier.tok.weight.copy_(g2p_model.src_tok.weight)\n" + _POSITIONS[4:], EX7,
            "inside with torch.no_grad()"),
    # load_encoder is right; the models it copies between are not
    Mistake("transfer_blames_seq2seq", "ex4_answer", "return self.ln_enc(x), mask", "return x, mask", EX7,
            "load_encoder copies from your Seq2Seq of exercise 4"),
    Mistake("transfer_blames_classifier", "ex6_answer",
            "return self.head(x.sum(1) / real.sum(1, keepdim=True).clamp(min=1))",
            "return self.head(x.mean(1))", EX7, "load_encoder copies into your EncoderClassifier of exercise 6"),
]
