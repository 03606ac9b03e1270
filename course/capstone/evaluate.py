"""Score saved capstone checkpoints again, outside the notebook that trained them.

    python -m course.capstone.evaluate capstone_checkpoints/lm.pt [more.pt ...]

The checkpoint carries the student's answer code and weights (see ``weights``); this
process rebuilds the model from them and runs the course's metrics on the held-out data of
the profile the model was trained in (a dry run's few items for a dry run's checkpoint).
It prints one line per checkpoint.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

from . import data, metrics
from .profiles import checkpoint_profile
from .weights import load_checkpoint, load_namespace, rebuild


def evaluate(path: Path) -> dict[str, float]:
    ckpt = load_checkpoint(path)
    profile = checkpoint_profile(ckpt["profile"], bool(ckpt.get("dry_run", False)))
    device = torch.device("cpu")
    task = ckpt["task"]
    if task == "lm":
        model = rebuild(ckpt, {"vocab_size": data.char_tokenizer().vocab_size})
        return {"test_loss": metrics.lm_loss(model, data.lm_ids("test"), profile.lm.block_size,
                                             profile.lm.eval_tokens, device)}
    if task == "g2p":
        from ..data.cmudict import load_g2p

        namespace = load_namespace(ckpt)
        model = rebuild(ckpt, {"src_vocab": len(data.SRC_VOCAB), "tgt_vocab": len(data.TGT_VOCAB)}, namespace)
        test = load_g2p("test")
        words = data.g2p_eval_words(profile.g2p.eval_words)
        preds = {}
        namespace_greedy = namespace["greedy_decode"]
        for i in range(0, len(words), 256):
            chunk = words[i:i + 256]
            for w, ids in zip(chunk, namespace_greedy(model, data.pad([data.encode_word(w) for w in chunk]))):
                preds[w] = data.decode_phonemes(ids)
        per, wer = metrics.g2p_error_rates(preds, test)
        return {"per": per, "wer": wer}
    if task == "cls":
        model = rebuild(ckpt, {"vocab_size": len(data.SRC_VOCAB), "n_classes": len(data.PATTERNS)})
        ids, labels = data.classifier_eval_tensors(profile.cls.max_len, profile.cls.eval_words)
        with torch.no_grad():
            predicted = torch.cat([model(ids[i:i + 256]).argmax(-1) for i in range(0, len(ids), 256)])
        return {"accuracy": metrics.accuracy(predicted, labels)}
    raise ValueError(f"unknown task {task!r} in {path}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m course.capstone.evaluate", description=__doc__)
    parser.add_argument("checkpoints", nargs="+", type=Path)
    args = parser.parse_args(argv)
    status = 0
    for path in args.checkpoints:
        if not path.is_file():
            print(f"{path}: no such file", file=sys.stderr)
            status = 2
            continue
        scores = evaluate(path)
        print(f"{path}: " + ", ".join(f"{k} {v:.4f}" for k, v in scores.items()))
    return status


if __name__ == "__main__":
    os.environ.setdefault("COURSE_DEVICE", "cpu")
    raise SystemExit(main())
