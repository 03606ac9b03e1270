"""Train the capstone's reference solution and print a table: steps, wall time, throughput,
held-out metric, for one profile; for the language model, also a baseline built from
PyTorch's own nn.TransformerEncoderLayer blocks of the same size, trained the same way in
the same run, so that the reference model's speed is a ratio, not an absolute.

    .venv/bin/python benchmarks/capstone.py --profile cpu --seeds 0 1 2
    .venv/bin/python benchmarks/capstone.py --profile gpu --device cuda --seeds 0 1 2

With --write, the first seed's loss curves, samples, G2P examples and confusion matrix go to
benchmarks/results/capstone_<profile>.json, which the book's capstone chapter plots. With
--json PATH, every run's numbers (no curves) go to PATH (benchmarks/gpu_session.sh reads it).

    .venv/bin/python benchmarks/capstone.py --estimate --profile gpu

prints, without training anything, an ESTIMATE of each phase's time on a GPU (H200 by
default) for the profile: for every phase (training, and each part of the held-out
evaluation) it measures on this CPU, with the reference solution and the profile's models,
the floating-point operations (torch.utils.flop_counter), the PyTorch operators dispatched
(each one a kernel launch on a GPU) and the host-device synchronisations of one step or
call at a small batch, scales them to the profile's batch sizes and counts, and converts
them with stated assumptions (--assume-tflops sustained bf16 throughput, --assume-us-per-op
per operator, --assume-us-per-sync per synchronisation). The CPU time measured for the same
step, scaled the same way, is printed beside it. The estimate is compared with the cells'
time limits in the profile and the GPU workflow's timeout-minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


#: nanoGPT's CPU recipe for character-level Shakespeare (4 layers, 4 heads, width 128, block 64,
#: batch 12, 2,000 iterations, no dropout) trained on lm_ids("train") and scored on the same test
#: text, on 2 quiet cores (issue 15's table). Not rerun here: nanoGPT is not a dependency.
NANOGPT_PUBLISHED = {"loss": 1.909, "seconds": 107.0, "reference_same_size_seconds": 76.0}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", default="cpu", choices=["smoke", "cpu", "gpu"])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--tasks", nargs="+", default=["lm", "g2p", "cls"], choices=["lm", "g2p", "cls"])
    parser.add_argument("--variants", nargs="+", default=["reference", "nanogpt-size"],
                        help="models to train besides the reference: nanogpt-size (LM), torch-baseline (LM), "
                             "no-positions, no-causal-mask (LM: no mask; G2P: its decoder without one), "
                             "post-ln-no-final-norm (LM), bigram (LM), causal-encoder (G2P, cls), from-scratch "
                             "(cls: without the G2P start, at the rate the profile trained it with from scratch; "
                             "run on --seeds like the reference); a variant that does not apply to a task is "
                             "skipped. Default: reference nanogpt-size")
    parser.add_argument("--variant-seeds", type=int, nargs="+", default=None,
                        help="seeds for the variants other than the reference and from-scratch (default: the first of --seeds)")
    parser.add_argument("--no-baselines", action="store_true", help="skip the classifier's simple baselines")
    parser.add_argument("--write", action="store_true", help="write benchmarks/results/capstone_<profile>.json")
    parser.add_argument("--json", type=Path, metavar="PATH", help="write every run's numbers (no curves) to PATH")
    parser.add_argument("--estimate", action="store_true",
                        help="train nothing: print the estimated time of each phase of --profile on a GPU")
    parser.add_argument("--gpu-name", default=ESTIMATE_GPU,
                        help=f"the GPU the estimate is for (default {ESTIMATE_GPU})")
    parser.add_argument("--assume-tflops", type=float, default=ASSUMED_TFLOPS,
                        help=f"sustained bf16 TFLOP/s of these small models on that GPU (default {ASSUMED_TFLOPS:g})")
    parser.add_argument("--assume-us-per-op", type=float, default=ASSUMED_US_PER_OP,
                        help=f"microseconds per dispatched operator (default {ASSUMED_US_PER_OP:g})")
    parser.add_argument("--assume-us-per-sync", type=float, default=ASSUMED_US_PER_SYNC,
                        help=f"microseconds per host-device synchronisation (default {ASSUMED_US_PER_SYNC:g})")
    args = parser.parse_args()
    os.environ["COURSE_PROFILE"], os.environ["COURSE_DEVICE"] = args.profile, args.device
    os.environ["COURSE_DRY_RUN"] = "0"
    if args.estimate:
        return print_estimate(args)

    import torch

    from autograder.extract import solution_namespace
    from benchmarks.capstone_runs import CLS_VARIANTS, G2P_VARIANTS, LM_VARIANTS, run_task

    ns = solution_namespace(ROOT / "solutions" / "ch07_capstone" / "ch07_capstone.ipynb")
    device = torch.device(args.device)
    applies = {"lm": LM_VARIANTS, "g2p": G2P_VARIANTS, "cls": CLS_VARIANTS}
    rows, details = [], {}
    for task in args.tasks:
        for variant in [v for v in dict.fromkeys(["reference", *args.variants]) if v in applies[task]]:
            # from-scratch is the comparison the book draws with the reference: the same seeds
            seeds = args.seeds if variant in ("reference", "from-scratch") else (args.variant_seeds or args.seeds[:1])
            for seed in seeds:
                result = run_task(ns, task, variant, seed, device, baselines=not args.no_baselines)
                rows.append(result)
                if variant == "reference":
                    details.setdefault(task, result)
                print(f"  {task:<4} {variant:<22} seed {seed}: {result['metric_name']} {result['metric']:.4f}, "
                      + ", ".join(f"{k} {v:.1f} s" for k, v in result["phases"].items()), flush=True)

    print(f"\nprofile {args.profile}, device {args.device}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads; medians over seeds")
    header = f"{'task':<5}{'model':<23}{'steps':>6}{'train s':>9}{'items/s':>10}  metric (per seed)"
    print(header + "\n" + "-" * len(header))
    for (task, variant) in dict.fromkeys((r["task"], r["variant"]) for r in rows):
        group = [r for r in rows if r["task"] == task and r["variant"] == variant]
        speed = statistics.median(r["items_per_s"] for r in group)
        metrics = ", ".join(f"{r['metric']:.4f}" for r in group)
        print(f"{task:<5}{variant:<23}{group[0]['steps']:>6}{statistics.median(r['seconds'] for r in group):>9.1f}"
              f"{speed:>10.0f}  {group[0]['metric_name']}: {metrics}")
    print("items: characters (LM), words (G2P, classifier) per second of training.")
    print_phases(rows)
    print_lm_comparison(rows)
    print_classifier_baselines(rows)
    for task in args.tasks:
        group = [r for r in rows if r["task"] == task and r["variant"] == "reference"]
        worst = max(r["metric"] for r in group) if group[0]["lower_is_better"] else min(r["metric"] for r in group)
        extra = ""
        if task == "g2p":
            extra = f"; WER worst {max(r['wer'] for r in group):.4f}"
        print(f"worst {task} {group[0]['metric_name']} over {len(group)} seeds: {worst:.4f}{extra}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"profile": args.profile, "device": args.device, "torch": torch.__version__,
                                         "gpu": torch.cuda.get_device_name(0) if device.type == "cuda" else None,
                                         "runs": [{k: v for k, v in r.items() if k not in ("curve", "extras")}
                                                  for r in rows]}, indent=1))
        print(f"wrote {args.json}")
    if args.write:
        out = ROOT / "benchmarks" / "results" / f"capstone_{args.profile}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        summary = [{k: v for k, v in r.items() if k not in ("curve", "extras")} for r in rows]
        # Tasks not run this time keep their earlier results, so tasks can be measured one at a time.
        old = json.loads(out.read_text()) if out.exists() else {"runs": [], "details": {}}
        runs = [r for r in old["runs"] if r["task"] not in args.tasks] + summary
        kept = {t: d for t, d in old["details"].items() if t not in args.tasks}
        out.write_text(json.dumps({"profile": args.profile, "device": args.device, "torch": torch.__version__,
                                   "runs": runs, "details": {**kept, **{t: {"curve": d["curve"], **d["extras"]}
                                                                        for t, d in details.items()}}}, indent=1))
        print(f"wrote {out.relative_to(ROOT)}")
    return 0


def print_phases(rows: list[dict]) -> None:
    """Seconds per phase of the reference runs (median over seeds)."""
    print("\ntime per phase, reference solution (median over seeds, seconds):")
    for task in dict.fromkeys(r["task"] for r in rows):
        group = [r for r in rows if r["task"] == task and r["variant"] == "reference"]
        if group:
            names = list(group[0]["phases"])
            print(f"  {task:<4} " + "; ".join(f"{n} {statistics.median(r['phases'][n] for r in group):.1f}"
                                           for n in names)
                  + f"; total without the baselines "
                    f"{statistics.median(sum(v for k, v in r['phases'].items() if k != 'baselines') for r in group):.1f}")


def print_lm_comparison(rows: list[dict]) -> None:
    """The profile's language model beside nanoGPT's published CPU recipe, with the reference at
    nanoGPT's sizes trained in this run as the yardstick of this machine's speed."""
    ref = [r for r in rows if r["task"] == "lm" and r["variant"] == "reference"]
    same = [r for r in rows if r["task"] == "lm" and r["variant"] == "nanogpt-size"]
    if not ref or not same:
        return
    pub = NANOGPT_PUBLISHED
    # nanoGPT's wall time on this machine, scaled by the reference at its sizes measured here
    scale = statistics.median(r["seconds"] for r in same) / pub["reference_same_size_seconds"]
    print("\nlanguage model beside nanoGPT's CPU recipe (test loss over both test plays, metrics.lm_loss):")
    print(f"  {'model':<50}{'tokens':>8}{'wall s':>8}{'test loss':>11}")
    print(f"  {'nanoGPT recipe (issue 15, scaled to this machine)':<50}{1.54:>7.2f}M"
          f"{pub['seconds'] * scale:>8.0f}{pub['loss']:>11.3f}")
    for name, group in (("reference at nanoGPT's sizes (this run)", same), ("reference, profile (this run)", ref)):
        print(f"  {name:<50}{group[0]['tokens'] / 1e6:>7.2f}M{statistics.median(r['seconds'] for r in group):>8.0f}"
              f"{statistics.median(r['metric'] for r in group):>11.3f}")
    print(f"  nanoGPT's 107 s scaled by this run's reference at its sizes ({scale:.2f} x the 76 s of issue 15)")


def print_classifier_baselines(rows: list[dict]) -> None:
    runs = [r for r in rows if r["task"] == "cls" and r.get("baselines")]
    if runs:
        print("\nclassifier baselines on the same held-out words: "
              + ", ".join(f"{k.replace('_', ' ')} {v:.4f}" for k, v in runs[0]["baselines"].items()))


# ----------------------------------------------------------------------------- the GPU estimate

ESTIMATE_GPU = "H200"
# Assumptions of the estimate (stated in its output; none of them measured on a GPU yet):
# - sustained bf16 throughput of these small models (d_model 256-384, batches of 4k-16k
#   tokens): about a tenth of an H200's dense bf16 peak (989 TFLOP/s);
# - eager PyTorch costs about 10 us of host time per operator (Python, dispatch, launch),
#   during which a small model's GPU mostly waits;
# - a synchronisation (.item(), float(), a bool of a tensor) waits for the queue and costs
#   about 20 us more.
# Compute time and launch time are added, not overlapped: the estimate errs long.
ASSUMED_TFLOPS = 100.0
ASSUMED_US_PER_OP = 10.0
ASSUMED_US_PER_SYNC = 20.0
DECODE_MAX_LEN = 24          # greedy_decode's and beam_search's default max_len in the notebook
EVAL_BATCH = {"lm": 32, "g2p": 256, "cls": 256}   # metrics.lm_loss, g2p_predictions, classifier_predictions


def _counting_mode():
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    scalar = torch.ops.aten._local_scalar_dense.default

    class OpCounter(TorchDispatchMode):
        """Counts the operators dispatched (kernel launches on a GPU) and the reads of a
        tensor's value into Python (synchronisations on a GPU)."""

        def __init__(self):
            super().__init__()
            self.ops = self.syncs = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops += 1
            self.syncs += func is scalar
            return func(*args, **(kwargs or {}))

    return OpCounter()


def measure(fn) -> dict:
    """FLOPs, operators and synchronisations of one call of ``fn`` (counted), and its CPU
    seconds (timed in a second call, without counting)."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = _counting_mode()
    with FlopCounterMode(display=False) as flops, counter:
        fn()
    start = time.perf_counter()
    fn()
    return {"flops": flops.get_total_flops(), "ops": counter.ops, "syncs": counter.syncs,
            "cpu_s": time.perf_counter() - start}


def _counting_calls(obj, name: str) -> list[int]:
    """Count the calls of ``obj.name`` (an instance attribute wrapping the method)."""
    calls = [0]
    method = getattr(obj, name)

    def wrapped(*args, **kwargs):
        calls[0] += 1
        return method(*args, **kwargs)

    setattr(obj, name, wrapped)
    return calls


def estimate_phases(profile_name: str) -> list[dict]:
    """Each phase of the capstone in ``profile_name``: what one unit costs (measured on this
    CPU at a small size), the scale to the profile's size, and how many units there are.
    No assumption about the GPU is made here (see :func:`gpu_seconds`)."""
    import math

    import torch
    import torch.nn.functional as F

    from autograder.extract import solution_namespace
    from course.capstone import data, metrics
    from course.capstone.profiles import PROFILES
    from course.checks.ch07 import classifier_predictions

    profile = PROFILES[profile_name]
    ns = solution_namespace(ROOT / "solutions" / "ch07_capstone" / "ch07_capstone.ipynb")
    cpu = torch.device("cpu")
    torch.manual_seed(0)
    rng = torch.Generator().manual_seed(0)
    phases = []

    def train_phase(task, cfg, model, get, loss_fn, small_batch):
        steps = 2        # the first step also builds AdamW's state: the mean of two is per step
        m = measure(lambda: ns["train"](model, get, loss_fn, steps, cfg.lr, cfg.min_lr, 1, cpu,
                                        use_bf16=profile.use_bf16, progress=False))
        phases.append({"task": task, "phase": "train", "cell": f"{task}_train", "units": cfg.steps,
                       "unit": "step", "scale": cfg.batch_size / small_batch,
                       **{k: v / steps for k, v in m.items()}})

    # ---- language model
    cfg, tok = profile.lm, data.char_tokenizer()
    ids = data.lm_ids("train")
    lm = ns["build_lm"](cfg, tok.vocab_size)
    train_phase("lm", cfg, lm, lambda s: data.lm_batch(ids, 2, cfg.block_size, rng),
                lambda m, x, y: F.cross_entropy(m(x).flatten(0, 1).float(), y.flatten()), 2)
    test_ids = data.lm_ids("test")
    lm.eval()
    with torch.no_grad():
        m = measure(lambda: metrics.lm_loss(lm, test_ids, cfg.block_size, 2 * cfg.block_size, cpu, batch_size=2))
    windows = max(1, min(cfg.eval_tokens, len(test_ids) - 1) // cfg.block_size)
    # per window for FLOPs and CPU time; per batch of 32 windows for operators
    phases.append({"task": "lm", "phase": "eval: held-out loss", "cell": "lm_eval", "unit": "window",
                   "units": windows, "scale": 1, "flops": m["flops"] / 2, "cpu_s": m["cpu_s"] / 2,
                   "ops": m["ops"] * math.ceil(windows / EVAL_BATCH["lm"]) / windows,
                   "syncs": m["syncs"] * math.ceil(windows / EVAL_BATCH["lm"]) / windows})
    new_tokens = 4
    prompt = torch.tensor([tok.encode("ROMEO:\n")])
    m = measure(lambda: ns["generate"](lm, prompt, new_tokens, cfg.block_size, 0.8, 20,
                                       torch.Generator().manual_seed(0)))
    phases.append({"task": "lm", "phase": "eval: sample", "cell": "lm_eval", "unit": "char",
                   "units": cfg.sample_chars, "scale": 1, **{k: v / new_tokens for k, v in m.items()}})

    # ---- G2P
    cfg = profile.g2p
    pairs = data.g2p_pairs("train")
    g2p = ns["build_g2p"](cfg, len(data.SRC_VOCAB), len(data.TGT_VOCAB))

    def g2p_loss(model, src, tgt_in, tgt_out):
        return F.cross_entropy(model(src, tgt_in).flatten(0, 1).float(), tgt_out.flatten(), ignore_index=data.PAD)

    train_phase("g2p", cfg, g2p, lambda s: data.g2p_batch(pairs, 16, rng), g2p_loss, 16)
    g2p.eval()
    words = data.g2p_eval_words(max(cfg.eval_words, 16))
    src = data.pad([data.encode_word(w) for w in words[:16]])
    calls = _counting_calls(g2p, "decode")
    m = measure(lambda: ns["greedy_decode"](g2p, src))
    per_call = {k: v / max(1, calls[0] // 2) for k, v in m.items()}   # measure() ran it twice
    chunks = math.ceil(cfg.eval_words / EVAL_BATCH["g2p"])
    phases.append({"task": "g2p", "phase": "eval: greedy", "cell": "g2p_eval", "unit": "decode step",
                   "units": chunks * DECODE_MAX_LEN, "scale": EVAL_BATCH["g2p"] / 16, **per_call})
    calls[0] = 0
    one = torch.tensor([data.encode_word(words[0])])
    m = measure(lambda: ns["beam_search"](g2p, one, cfg.beam_size))
    per_call = {k: v / max(1, calls[0] // 2) for k, v in m.items()}
    phases.append({"task": "g2p", "phase": f"eval: beam ({cfg.beam_size})", "cell": "g2p_eval",
                   "unit": "beam step", "units": cfg.beam_words * DECODE_MAX_LEN, "scale": 1, **per_call})

    # ---- classifier
    cfg = profile.cls
    x_all, y_all = data.classifier_tensors("train", cfg.max_len)
    cls = ns["build_classifier"](cfg, len(data.SRC_VOCAB), len(data.PATTERNS))

    def cls_batch(step):
        pick = torch.randint(0, len(x_all), (8,), generator=rng)
        return x_all[pick], y_all[pick]

    train_phase("cls", cfg, cls, cls_batch, lambda m, x, y: F.cross_entropy(m(x).float(), y), 8)
    test_x, _ = data.classifier_eval_tensors(cfg.max_len, cfg.eval_words)
    m = measure(lambda: classifier_predictions(cls, test_x[:16], cpu))
    n = len(test_x)
    phases.append({"task": "cls", "phase": "eval: accuracy", "cell": "cls_eval", "unit": "word", "units": n,
                   "scale": 1, "flops": m["flops"] / 16, "cpu_s": m["cpu_s"] / 16,
                   "ops": m["ops"] * math.ceil(n / EVAL_BATCH["cls"]) / n,
                   "syncs": m["syncs"] * math.ceil(n / EVAL_BATCH["cls"]) / n})
    return phases


def gpu_seconds(phase: dict, tflops: float, us_per_op: float, us_per_sync: float) -> float:
    """The estimated GPU time of a whole phase: per unit, the scaled FLOPs at ``tflops``
    plus its operators and synchronisations at their assumed costs (added, not overlapped)."""
    per_unit = (phase["flops"] * phase["scale"] / (tflops * 1e12) + phase["ops"] * us_per_op * 1e-6
                + phase["syncs"] * us_per_sync * 1e-6)
    return per_unit * phase["units"]


def workflow_timeout_minutes() -> int | None:
    """``timeout-minutes`` of the GPU grading workflow."""
    import re

    path = ROOT / ".github" / "workflows" / "grade-gpu.yml"
    found = re.search(r"timeout-minutes:\s*(\d+)", path.read_text()) if path.is_file() else None
    return int(found.group(1)) if found else None


def print_estimate(args) -> int:
    import torch

    from autograder import contract

    released = contract.read(ROOT / "solutions" / "ch07_capstone" / "ch07_capstone.ipynb")
    limits = contract.time_limits(released, args.profile)
    phases = estimate_phases(args.profile)
    print(f"ESTIMATE (not a measurement) of the {args.profile} profile's capstone on one {args.gpu_name}, "
          f"from counts measured on this CPU ({torch.get_num_threads()} threads, torch {torch.__version__}).")
    print(f"Assumed: {args.assume_tflops:g} TFLOP/s sustained bf16, {args.assume_us_per_op:g} us per operator, "
          f"{args.assume_us_per_sync:g} us per synchronisation; compute and launches added, not overlapped.")
    header = (f"{'task':<4} {'phase':<20} {'units':>8} {'GFLOP/unit':>11} {'ops/unit':>9} {'syncs':>6} "
              f"{'CPU s (scaled)':>15} {'GPU s (est.)':>13}")
    print(header + "\n" + "-" * len(header))
    per_cell: dict[str, float] = {}
    for p in phases:
        gpu = gpu_seconds(p, args.assume_tflops, args.assume_us_per_op, args.assume_us_per_sync)
        p["gpu_s"] = gpu
        per_cell[p["cell"]] = per_cell.get(p["cell"], 0.0) + gpu
        cpu = p["cpu_s"] * p["scale"] * p["units"]
        print(f"{p['task']:<4} {p['phase']:<20} {p['units']:>8} {p['flops'] * p['scale'] / 1e9:>11.3f} "
              f"{p['ops']:>9.0f} {p['syncs']:>6.1f} {cpu:>15.0f} {gpu:>13.1f}")
    print("units: training steps at the profile's batch size; evaluation windows, characters, decode steps "
          f"(at most {DECODE_MAX_LEN} per batch or word) or passages. CPU s: this CPU's measured time for one "
          "unit at a small batch, times the batch ratio (linear: an upper bound where the small batch is "
          "overhead-bound), times the units.")
    total = sum(per_cell.values())
    print(f"\n{'cell':<10} {'GPU s (est.)':>13} {'limit s':>8}  fits")
    for cell, seconds in per_cell.items():
        limit = limits.get(cell)
        fits = "yes" if limit and seconds <= 0.5 * limit else ("tight" if limit and seconds <= limit else "NO")
        print(f"{cell:<10} {seconds:>13.1f} {limit or '-':>8}  {fits}")
    print(f"three trainings and three evaluations: {total:.0f} s (about {total / 60:.1f} minutes) per capstone "
          f"submission, before kernel start-up and the unit checks (about a minute on a CPU).")
    minutes = workflow_timeout_minutes()
    if minutes:
        per_submission = total + 90
        print(f"grade-gpu.yml allows {minutes} minutes: about {int(minutes * 60 // per_submission)} capstone "
              f"submissions graded one after another on one GPU, at {per_submission:.0f} s each (the phases above "
              f"and 90 s of kernel start-up and unit checks; the job's set-up and the chapter notebooks not counted).")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"profile": args.profile, "gpu": args.gpu_name, "estimate": True,
                                         "assumptions": {"tflops": args.assume_tflops,
                                                         "us_per_op": args.assume_us_per_op,
                                                         "us_per_sync": args.assume_us_per_sync},
                                         "phases": phases, "cells": per_cell}, indent=1))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
