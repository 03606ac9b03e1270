"""Capstone: common mistakes in the parts. Each fails its unit test cells with its hint
in-process; the end-to-end grading run takes only those marked e2e, because every capstone
submission also trains three models (the grading path is the same for all of them)."""

from functools import partial

from notebook_tools import Mistake as _Mistake

Mistake = partial(_Mistake, e2e=False)

MISTAKES = [
    Mistake("lm_not_causal", "ex1_answer", "x = x + self.proj(self.attend(q, k, v, mask=pad_mask, causal=self.causal))",
            "x = x + self.proj(self.attend(q, k, v, mask=pad_mask, causal=False))",
            ("ex1_visible", "ex1_hidden"), "self-attention must be causal", e2e=True),
    Mistake("lm_untied_head", "ex1_answer", "        self.head.weight = self.tok.weight                      # weight tying\n",
            "", ("ex1_visible", "ex1_hidden"), "tie them"),
    Mistake("lm_no_positions", "ex1_answer", "x = self.tok(ids) + self.pos(torch.arange(T, device=ids.device))",
            "x = self.tok(ids)", ("ex1_visible", "ex1_hidden"), "no sense of order"),
    Mistake("warmup_from_zero", "ex2_answer", "return max_lr * (step + 1) / warmup_steps",
            "return max_lr * step / warmup_steps", ("ex2_visible", "ex2_hidden"), "warm-up counts from step + 1"),
    Mistake("decay_everything", "ex2_answer",
            "    return [{\"params\": [p for p in params if id(p) in decay], \"weight_decay\": weight_decay},",
            "    decay = {id(p) for p in params}\n    return [{\"params\": [p for p in params if id(p) in decay], \"weight_decay\": weight_decay},",
            ("ex2_visible", "ex2_hidden"), "are in the decayed group"),
    Mistake("no_grad_clipping", "ex2_answer", "        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)\n", "",
            ("ex2_visible", "ex2_hidden"), "gradients were not clipped"),
    Mistake("no_zero_grad", "ex2_answer", "        opt.zero_grad(set_to_none=True)\n", "",
            ("ex2_visible", "ex2_hidden"), "gradients accumulate"),
    Mistake("generate_no_crop", "ex3_answer", "model(ids[:, -block_size:])", "model(ids)",
            ("ex3_visible", "ex3_hidden"), "crop the context"),
    Mistake("temperature_after_softmax", "ex3_answer",
            "logits = model(ids[:, -block_size:])[:, -1, :].float() / temperature",
            "logits = model(ids[:, -block_size:])[:, -1, :].float().softmax(-1) / temperature",
            ("ex3_visible", "ex3_hidden"), "divide the logits by temperature"),
    Mistake("source_padding_unmasked", "ex4_answer", "mask = (src != PAD)[:, None, None, :]",
            "mask = None", ("ex4_visible", "ex4_hidden"), "mask PAD in the source"),
    Mistake("greedy_keeps_eos", "ex5_answer", "out.append(row[:row.index(EOS)] if EOS in row else row)",
            "out.append(row)", ("ex5_visible", "ex5_hidden"), "cut each row at its first EOS"),
    Mistake("beam_keeps_one", "ex5_answer", "for seq, score in candidates[:beam_size]:",
            "for seq, score in candidates[:1]:", ("ex5_visible", "ex5_hidden"), "keep beam_size candidates"),
    Mistake("classifier_mean_over_pad", "ex6_answer",
            "return self.head(x.sum(1) / real.sum(1, keepdim=True).clamp(min=1))",
            "return self.head(x.mean(1))", ("ex6_visible", "ex6_hidden"), "PAD must change nothing"),
]
