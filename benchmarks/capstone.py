"""Train the capstone's reference solution and print a table: steps, wall time, throughput,
held-out metric, for one profile; for the language model, also a baseline built from
PyTorch's own nn.TransformerEncoderLayer blocks of the same size, trained the same way in
the same run, so that the reference model's speed is a ratio, not an absolute.

    .venv/bin/python benchmarks/capstone.py --profile cpu --seeds 0 1 2
    .venv/bin/python benchmarks/capstone.py --profile gpu --device cuda --seeds 0 1 2

With --write, the first seed's loss curves, samples, G2P examples and confusion matrix go to
benchmarks/results/capstone_<profile>.json, which the book's capstone chapter plots.
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", default="cpu", choices=["smoke", "cpu", "gpu"])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--tasks", nargs="+", default=["lm", "g2p", "cls"], choices=["lm", "g2p", "cls"])
    parser.add_argument("--no-baseline", action="store_true", help="skip the nn.TransformerEncoderLayer LM baseline")
    parser.add_argument("--write", action="store_true", help="write benchmarks/results/capstone_<profile>.json")
    args = parser.parse_args()
    os.environ["COURSE_PROFILE"], os.environ["COURSE_DEVICE"] = args.profile, args.device

    import torch

    from autograder.extract import solution_namespace
    from benchmarks.capstone_runs import run_task

    ns = solution_namespace(ROOT / "solutions" / "ch07_capstone" / "ch07_capstone.ipynb")
    device = torch.device(args.device)
    rows, details = [], {}
    for task in args.tasks:
        variants = ["reference"] + (["torch-baseline"] if task == "lm" and not args.no_baseline else [])
        for variant in variants:
            for seed in args.seeds:
                result = run_task(ns, task, variant, seed, device)
                rows.append(result)
                if variant == "reference":
                    details.setdefault(task, result)
                print(f"  {task:<4} {variant:<15} seed {seed}: {result['metric_name']} {result['metric']:.4f} "
                      f"in {result['seconds']:.1f} s", flush=True)

    print(f"\nprofile {args.profile}, device {args.device}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads; medians over seeds {args.seeds}")
    header = f"{'task':<5}{'model':<16}{'steps':>6}{'wall s':>9}{'items/s':>10}{'ratio':>7}  metric (per seed)"
    print(header + "\n" + "-" * len(header))
    medians = {}
    for (task, variant) in dict.fromkeys((r["task"], r["variant"]) for r in rows):
        group = [r for r in rows if r["task"] == task and r["variant"] == variant]
        speed = statistics.median(r["items_per_s"] for r in group)
        medians[(task, variant)] = speed
        ratio = ""
        if variant == "torch-baseline" and (task, "reference") in medians:
            ratio = f"{medians[(task, 'reference')] / speed:.2f}"
        metrics = ", ".join(f"{r['metric']:.4f}" for r in group)
        print(f"{task:<5}{variant:<16}{group[0]['steps']:>6}{statistics.median(r['seconds'] for r in group):>9.1f}"
              f"{speed:>10.0f}{ratio:>7}  {group[0]['metric_name']}: {metrics}")
    print("ratio = reference items/s divided by the baseline's, measured in this run (higher is faster).")
    for task in args.tasks:
        group = [r for r in rows if r["task"] == task and r["variant"] == "reference"]
        worst = max(r["metric"] for r in group) if group[0]["lower_is_better"] else min(r["metric"] for r in group)
        extra = ""
        if task == "g2p":
            extra = f"; WER worst {max(r['wer'] for r in group):.4f}"
        print(f"worst {task} {group[0]['metric_name']} over {len(group)} seeds: {worst:.4f}{extra}")
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


if __name__ == "__main__":
    raise SystemExit(main())
